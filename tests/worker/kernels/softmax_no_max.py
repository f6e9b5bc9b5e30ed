# Wrong only on large magnitudes: exp(x) without subtracting the row max overflows to inf
# once x passes ~88 (float32), and inf / inf is NaN. Fine on N(0, 1) inputs.
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

BM = 128


def _kernel(x_ref, o_ref):
    e = jnp.exp(x_ref[...].astype(jnp.float32))
    o_ref[...] = (e / jnp.sum(e, axis=-1, keepdims=True)).astype(o_ref.dtype)


def workload(x):
    m, n = x.shape
    return pl.pallas_call(
        _kernel,
        grid=(pl.cdiv(m, BM),),
        in_specs=[pl.BlockSpec((BM, n), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((BM, n), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
    )(x)
