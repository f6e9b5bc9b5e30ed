import jax
import jax.numpy as jnp

CONFIG = [1, 2]


def create_inputs(dtype=jnp.float32):
    return (jnp.ones((64, 64), dtype),)


def workload(x):
    return x * 2
