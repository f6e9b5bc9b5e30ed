"""Small JAXBench-style matmul: C = A @ B (CONFIG drives the shapes)."""
import jax
import jax.numpy as jnp

CONFIG = {
    'name': 'small_matmul',
    'M': 256,
    'K': 128,
    'N': 256,
    'atol': 2e-2,
    'rtol': 2e-2,
}


def create_inputs(dtype=jnp.float32):
    key = jax.random.PRNGKey(42)
    k1, k2 = jax.random.split(key, 2)
    M, K, N = CONFIG['M'], CONFIG['K'], CONFIG['N']
    A = jax.random.normal(k1, (M, K), dtype=dtype)
    B = jax.random.normal(k2, (K, N), dtype=dtype) * 0.02
    return A, B


def workload(A, B):
    return jnp.dot(A, B)


def get_flops():
    return 2 * CONFIG['M'] * CONFIG['K'] * CONFIG['N']
