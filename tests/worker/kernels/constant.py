# Wrong: a Pallas kernel whose output ignores its inputs (all zeros).
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def _kernel(a_ref, b_ref, o_ref):
    o_ref[...] = jnp.zeros_like(o_ref)


def workload(a, b):
    m, n = a.shape[0], b.shape[1]
    return pl.pallas_call(
        _kernel,
        grid=(m // 128, n // 128),
        in_specs=[pl.BlockSpec((128, a.shape[1]), lambda i, j: (i, 0)),
                  pl.BlockSpec((b.shape[0], 128), lambda i, j: (0, j))],
        out_specs=pl.BlockSpec((128, 128), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), a.dtype),
    )(a, b)
