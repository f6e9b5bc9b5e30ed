# rope_projection template (maxkernel expert brain)
# matched: {{summary}}
# params: {{params}}
"""Projections followed by rotary position embedding (rotate-half layout), the rotation fused
as the GEMM's epilogue: per projection one pallas_call over (row blocks, column blocks of
whole heads, K blocks) accumulating x @ W in f32 VMEM scratch; on the last K step every head
of the tile is rotated in place, y * cos + swap_halves(y) * (sign * sin), with the per-row
cos / sin tables (the reference's own angle computation, replayed outside the kernel, small:
rows x head_dim) as blocked operands. The projection is never written to HBM unrotated."""

import numpy as np
import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BLOCK_M = {{block_m}}                  # rows (tokens) per block
BLOCK_N = {{block_n}}                  # output columns per block (whole heads)
BLOCK_K = {{block_k}}                  # contraction per step
VMEM_LIMIT_BYTES = {{vmem_limit_bytes}}


def _table_div(a, b):
    a, b = jnp.asarray(a), jnp.asarray(b)
    if jnp.issubdtype(a.dtype, jnp.floating):
        return a / b
    return lax.div(*jnp.broadcast_arrays(a, b))


def _table_expand(x, axes, rank):
    """broadcast_in_dim without the broadcast: unit dims where the reference broadcasts."""
    x = jnp.asarray(x)
    return x if x.ndim == rank else jnp.expand_dims(x, axes)


def _table_concat(xs, axis):
    xs = [jnp.asarray(x) for x in xs]
    rank = xs[0].ndim
    target = [max(x.shape[a] for x in xs) for a in range(rank)]
    return jnp.concatenate([jnp.broadcast_to(x, tuple(x.shape[a] if a == axis else target[a]
                                                       for a in range(rank))) for x in xs],
                           axis=axis)


def _fit(request, dim, align):
    """The largest multiple of `align` dividing `dim` that is <= request; dim when none is."""
    request = max(1, int(request))
    if dim <= request:
        return dim
    b = request // align * align
    while b >= align:
        if dim % b == 0:
            return b
        b -= align
    return dim


def _rope_mm(x, w, cos_t, sin_t, *, signs, dot_dtype, acc_round, out_dtype):
    """x [rows..., E] @ w [E, heads..., D], then per head y * cos + swap_halves(y) * signs * sin;
    cos_t / sin_t broadcast to [rows..., 1..., D]."""
    rows_shape = x.shape[:-1]
    e = x.shape[-1]
    d = w.shape[-1]
    half = d // 2
    m = int(np.prod(rows_shape))
    n = int(np.prod(w.shape[1:]))
    x2 = x.reshape(m, e)
    w2 = w.reshape(e, n)
    tshape = tuple(rows_shape) + (1,) * (w.ndim - 2) + (d,)
    sign = jnp.concatenate([jnp.full((half,), signs[0], jnp.float32),
                            jnp.full((d - half,), signs[1], jnp.float32)])
    c2 = jnp.broadcast_to(cos_t, tshape).astype(jnp.float32).reshape(m, d)
    s2 = (jnp.broadcast_to(sin_t, tshape).astype(jnp.float32) * sign).reshape(m, d)
    row_align = 8 * max(1, 4 // jnp.dtype(x.dtype).itemsize)
    bm = _fit(BLOCK_M, m, row_align)
    lane = d * 128 // int(np.gcd(d, 128))
    bn = _fit(BLOCK_N, n, lane)
    if bn % d:
        bn = n
    bk = _fit(BLOCK_K, e, 128)
    nk = e // bk
    heads = bn // d
    aligned = d % 128 == 0

    def kernel(x_ref, w_ref, c_ref, s_ref, o_ref, acc_ref):
        k = pl.program_id(2)

        @pl.when(k == 0)
        def _zero():
            acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

        acc_ref[...] += lax.dot_general(x_ref[...].astype(jnp.dtype(dot_dtype)),
                                        w_ref[...].astype(jnp.dtype(dot_dtype)),
                                        (((1,), (0,)), ((), ())),
                                        preferred_element_type=jnp.float32)

        @pl.when(k == nk - 1)
        def _rotate():
            c = c_ref[...]
            s = s_ref[...]
            for h in range(heads):
                y = acc_ref[:, h * d:(h + 1) * d]
                if acc_round:   # the reference's projection is rounded before the rotation
                    y = y.astype(jnp.dtype(acc_round)).astype(jnp.float32)
                if aligned:
                    swapped = pltpu.roll(y, half, 1)
                else:
                    swapped = jnp.concatenate([y[:, half:], y[:, :half]], axis=1)
                o_ref[:, h * d:(h + 1) * d] = (y * c + swapped * s).astype(o_ref.dtype)

    out = pl.pallas_call(
        kernel,
        grid=(m // bm, n // bn, nk),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j, k: (i, k)),
                  pl.BlockSpec((bk, bn), lambda i, j, k: (k, j)),
                  pl.BlockSpec((bm, d), lambda i, j, k: (i, 0)),
                  pl.BlockSpec((bm, d), lambda i, j, k: (i, 0))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, k: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), jnp.dtype(out_dtype)),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary"),
            vmem_limit_bytes=VMEM_LIMIT_BYTES),
    )(x2, w2, c2, s2)
    return out.reshape(tuple(rows_shape) + tuple(w.shape[1:]))


# ---- generated from the reference's graph ----
{{generated}}
