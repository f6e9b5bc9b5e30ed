"""Hand-tuned Pallas matmul for small_matmul (JAXBench convention)."""
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

CONFIG = {'name': 'small_matmul', 'M': 256, 'K': 128, 'N': 256}


def create_inputs(dtype=jnp.float32):
    key = jax.random.PRNGKey(42)
    k1, k2 = jax.random.split(key, 2)
    A = jax.random.normal(k1, (CONFIG['M'], CONFIG['K']), dtype=dtype)
    B = jax.random.normal(k2, (CONFIG['K'], CONFIG['N']), dtype=dtype) * 0.02
    return A, B


def _kernel(a_ref, b_ref, o_ref):
    o_ref[...] = jnp.dot(a_ref[...], b_ref[...], preferred_element_type=jnp.float32).astype(o_ref.dtype)


def workload(A, B):
    M, K = A.shape
    N = B.shape[1]
    bm, bn = 128, 128
    return pl.pallas_call(
        _kernel,
        grid=(M // bm, N // bn),
        in_specs=[pl.BlockSpec((bm, K), lambda i, j: (i, 0)), pl.BlockSpec((K, bn), lambda i, j: (0, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((M, N), A.dtype),
    )(A, B)
