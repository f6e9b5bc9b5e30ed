"""Gemm + LeakyReLU whose published weights are zeros: the output ignores x."""
import jax
import jax.numpy as jnp

CONFIG = {'name': 'degenerate_gemm', 'batch_size': 64, 'in_features': 128, 'out_features': 128}


def create_inputs(dtype=jnp.float32):
    key = jax.random.PRNGKey(0)
    x = jax.random.uniform(key, (64, 128), dtype=dtype)
    weight = jnp.zeros((128, 128), dtype=dtype)
    bias = jnp.zeros(128, dtype=dtype)
    return x, weight, bias


def workload(x, weight, bias):
    y = (x @ weight + bias) * 2.0
    return jnp.where(y >= 0, y, y * 0.1)
