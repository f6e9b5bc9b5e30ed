import jax
import jax.numpy as jnp

CONFIG = {'name': 'huge', 'M': 1 << 20, 'K': 1 << 16}


def create_inputs(dtype=jnp.float32):
    key = jax.random.PRNGKey(0)
    big = jax.random.normal(key, (CONFIG['M'], CONFIG['K']), dtype=dtype)
    small = jnp.ones((CONFIG['K'],), dtype=dtype)
    return big, small


def workload(big, small):
    return big @ small
