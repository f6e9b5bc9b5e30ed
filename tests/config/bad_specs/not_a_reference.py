import jax.numpy as jnp


def helper(x):
    return x
