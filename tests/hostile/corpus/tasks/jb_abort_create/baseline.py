import os
import jax
import jax.numpy as jnp

CONFIG = {"name": "hostile", "n": 64}


def create_inputs(dtype=jnp.float32):
    os.abort()


def workload(x):
    return x * 2
