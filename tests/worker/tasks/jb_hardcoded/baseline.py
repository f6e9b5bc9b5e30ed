"""Scaled matmul with hard-coded shapes and a static scalar argument."""
import jax
import jax.numpy as jnp

CONFIG = {'name': 'hardcoded_scale', 'batch_size': 2048, 'features': 256}


def create_inputs(dtype=jnp.float32):
    key = jax.random.key(0)
    k1, k2 = jax.random.split(key)
    x = jax.random.uniform(k1, (2048, 256), dtype=dtype)
    w = jax.random.normal(k2, (256, 256), dtype=dtype) * 0.05
    return x, w, 0.5


def workload(x, w, scale):
    return jnp.tanh(x @ w) * scale
