import os
os._exit(0)
import jax
import jax.numpy as jnp

CONFIG = {"name": "hostile", "n": 64}


def create_inputs(dtype=jnp.float32):
    return (jnp.ones((CONFIG['n'], CONFIG['n']), dtype),)


def workload(x):
    return x * 2
