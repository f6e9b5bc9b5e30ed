"""Refused at lowering: a (8, 100) block breaks Mosaic's (8, 128) rule."""
import jax
from jax.experimental import pallas as pl


def _kernel(x_ref, y_ref, o_ref):
    o_ref[...] = x_ref[...]


def workload(x, y):
    m, k = x.shape
    return pl.pallas_call(
        _kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        grid=(m // 8, k // 100),
        in_specs=[pl.BlockSpec((8, 100), lambda i, j: (i, j)),
                  pl.BlockSpec((8, 100), lambda i, j: (i, j))],
        out_specs=pl.BlockSpec((8, 100), lambda i, j: (i, j)),
    )(x, y)
