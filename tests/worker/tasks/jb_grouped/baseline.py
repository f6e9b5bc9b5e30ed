"""Grouped matmul: group_sizes must sum to the token dimension (data-dependent reference)."""
import jax
import jax.numpy as jnp

CONFIG = {'name': 'small_gmm', 'num_groups': 4, 'tokens': 1024, 'emb': 128, 'mlp': 256}


def create_inputs(dtype=jnp.float32):
    key = jax.random.PRNGKey(7)
    k1, k2 = jax.random.split(key)
    G, M, K, N = CONFIG['num_groups'], CONFIG['tokens'], CONFIG['emb'], CONFIG['mlp']
    lhs = jax.random.normal(k1, (M, K), dtype=dtype)
    rhs = jax.random.normal(k2, (G, K, N), dtype=dtype) * 0.05
    group_sizes = jnp.full((G,), M // G, dtype=jnp.int32)
    return lhs, rhs, group_sizes


def workload(lhs, rhs, group_sizes):
    # Python loop over concrete sizes: not traceable with abstract group_sizes
    start = 0
    out = []
    for i, size in enumerate(group_sizes):
        out.append(lhs[start:start + size] @ rhs[i])
        start += group_sizes[i]
    return jnp.concatenate(out, axis=0)
