import jax.numpy as jnp


def reference(x):
    return x
