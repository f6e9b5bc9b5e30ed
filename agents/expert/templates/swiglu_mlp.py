# maxkernel expert template: swiglu_mlp
# matched: {{summary}}
# params: {{params}}
# Fused gated MLP (SwiGLU / GeGLU / any gate): the gate and up projections of a row block are
# accumulated together over the contraction (f32 VMEM scratch), the gate is applied when the
# last contraction block is in, and with FUSE_DOWN the down projection of that hidden block
# is accumulated into the row block's output over the hidden dim, so the hidden activations
# never go to HBM. Without FUSE_DOWN they do, and a tiled matmul kernel does the down
# projection. Work the reference does around the MLP is replayed from its graph as XLA ops.
import functools

import numpy as np
import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BLOCK_M = {{block_m}}
BLOCK_F = {{block_f}}
BLOCK_K = {{block_k}}
BLOCK_N = {{block_n}}
FUSE_DOWN = {{fuse_down}}
F_SEMANTICS = "{{f_semantics}}"
VMEM_LIMIT_BYTES = {{vmem_limit_bytes}}


def _block(want, dim, align):
    """The largest multiple of align <= want dividing dim, else dim itself (always legal)."""
    if want >= dim:
        return dim
    b = want // align * align
    while b >= align:
        if dim % b == 0:
            return b
        b -= align
    return dim


def _sublanes(dtype):
    # rows per packed (8, 128) tile: f32 8, bf16 16, int8 / fp8 32
    return 8 * max(1, 4 // jnp.dtype(dtype).itemsize)


{{replay_prelude}}

{{glu}}


{{out_epilogue}}


def _dims(transposed):
    # x (m, k) . w: w (k, n), or w (n, k) when transposed
    return (((1,), (1,)), ((), ())) if transposed else (((1,), (0,)), ((), ()))


def _gate_up_kernel(x_ref, wg_ref, wu_ref, *refs, ng, dg, du, precision, cd, bm, bf, s, m, f):
    ge_refs, o_ref, (acc_g, acc_u) = refs[:ng], refs[ng], refs[ng + 1:]
    row0 = pl.program_id(0) * s + pl.program_id(1) * bm
    j = pl.program_id(2)
    kk = pl.program_id(3)

    @pl.when(kk == 0)
    def _init():
        acc_g[...] = jnp.zeros_like(acc_g)
        acc_u[...] = jnp.zeros_like(acc_u)

    x = x_ref[...].astype(cd)
    acc_g[...] += lax.dot_general(x, wg_ref[...].astype(cd), dg,
                                  preferred_element_type=jnp.float32, precision=precision)
    acc_u[...] += lax.dot_general(x, wu_ref[...].astype(cd), du,
                                  preferred_element_type=jnp.float32, precision=precision)

    @pl.when(kk == pl.num_programs(3) - 1)
    def _store():
        h = _glu([acc_g[...], acc_u[...]], [e[...] for e in ge_refs], (row0, j * bf), (m, f))
        o_ref[...] = h.astype(o_ref.dtype)


def _mlp_kernel(x_ref, wg_ref, wu_ref, wd_ref, *refs, ng, no, dg, du, dd, precision, cd, h_dtype,
                bm, bf, s, m, f, n):
    ge_refs, oe_refs = refs[:ng], refs[ng:ng + no]
    o_ref, (acc_g, acc_u, acc_o) = refs[ng + no], refs[ng + no + 1:]
    row0 = pl.program_id(0) * s + pl.program_id(1) * bm
    j = pl.program_id(2)
    kk = pl.program_id(3)
    nk = pl.num_programs(3)

    @pl.when((j == 0) & (kk == 0))
    def _init_out():
        acc_o[...] = jnp.zeros_like(acc_o)

    @pl.when(kk == 0)
    def _init():
        acc_g[...] = jnp.zeros_like(acc_g)
        acc_u[...] = jnp.zeros_like(acc_u)

    x = x_ref[...].astype(cd)
    acc_g[...] += lax.dot_general(x, wg_ref[...].astype(cd), dg,
                                  preferred_element_type=jnp.float32, precision=precision)
    acc_u[...] += lax.dot_general(x, wu_ref[...].astype(cd), du,
                                  preferred_element_type=jnp.float32, precision=precision)

    @pl.when(kk == nk - 1)
    def _down():
        h = _glu([acc_g[...], acc_u[...]], [e[...] for e in ge_refs], (row0, j * bf), (m, f))
        wd = wd_ref[...]
        hd = jnp.promote_types(h_dtype, wd.dtype)
        acc_o[...] += lax.dot_general(h.astype(h_dtype).astype(hd), wd.astype(hd), dd,
                                      preferred_element_type=jnp.float32, precision=precision)

    @pl.when((j == pl.num_programs(2) - 1) & (kk == nk - 1))
    def _store():
        y = _out_epilogue([acc_o[...]], [e[...] for e in oe_refs], (row0, 0), (m, n))
        o_ref[...] = y.astype(o_ref.dtype)


def _matmul_kernel(h_ref, w_ref, *refs, no, dd, precision, bm, bn, s, m, n):
    oe_refs, o_ref, acc = refs[:no], refs[no], refs[no + 1]
    row0 = pl.program_id(0) * s + pl.program_id(1) * bm
    j = pl.program_id(2)
    kk = pl.program_id(3)

    @pl.when(kk == 0)
    def _init():
        acc[...] = jnp.zeros_like(acc)

    h = h_ref[...]
    w = w_ref[...]
    cd = jnp.promote_types(h.dtype, w.dtype)
    acc[...] += lax.dot_general(h.astype(cd), w.astype(cd), dd,
                                preferred_element_type=jnp.float32, precision=precision)

    @pl.when(kk == pl.num_programs(3) - 1)
    def _store():
        y = _out_epilogue([acc[...]], [e[...] for e in oe_refs], (row0, j * bn), (m, n))
        o_ref[...] = y.astype(o_ref.dtype)


def _w_spec(transposed, bk, bn, offset_blocks):
    """BlockSpec of a (k, n) weight (or (n, k) transposed) over the grid (l, i, j, kk)."""
    if transposed:
        return pl.BlockSpec((bn, bk), lambda l, i, j, kk: (j + offset_blocks, kk))
    return pl.BlockSpec((bk, bn), lambda l, i, j, kk: (kk, j + offset_blocks))


def _extra_specs(extras, m, s, bm, cols, bc, col_index):
    """BlockSpecs of epilogue operands in (rows or 1, cols or 1) form (rows: all leading
    dims merged, l * s + row)."""
    specs = []
    for e in extras:
        rows, full = e.shape[0] != 1 or m == 1, e.shape[1] != 1 or cols == 1
        specs.append(pl.BlockSpec(
            (bm if rows else 1, bc if full else 1),
            lambda l, i, j, kk, rows=rows, full=full:
            (l * (s // bm) + i if rows else 0, col_index(j) if full else 0)))
    return specs


def _swiglu(x, gate, up, down, *, f, h_dtype, out_dtype, glu_extras=(), out_extras=()):
    """glu(x @ gate, x @ up) [@ down] over the last dim of x. gate / up: (w, transposed,
    column offset) with f hidden columns starting at the offset; down: (w, transposed) or
    None. glu_extras: (rows or 1, f or 1) operands of the glu; out_extras: (rows or 1, n or 1)
    operands of the epilogue after the down projection. x is viewed as (l, s, k): the grid
    runs over l and blocks of s (the input's own last two dims, so blocks name its dims)."""
    lead = x.shape[:-1]
    x = x.reshape((-1,) + x.shape[-2:]) if x.ndim >= 3 else x[None]
    l, s, k = x.shape
    m = l * s
    (wg, tg, og), (wu, tu, ou) = gate, up
    cd = jnp.promote_types(jnp.promote_types(x.dtype, wg.dtype), wu.dtype)
    precision = lax.Precision.HIGHEST if cd == jnp.float32 else None
    bm = _block(BLOCK_M, s, _sublanes(x.dtype))
    bk = _block(BLOCK_K, k, 128)
    bf = _block(BLOCK_F, int(np.gcd.reduce([f, og or f, ou or f])), 128)
    in_specs = [pl.BlockSpec((None, bm, bk), lambda l, i, j, kk: (l, i, kk)),
                _w_spec(tg, bk, bf, og // bf), _w_spec(tu, bk, bf, ou // bf)]
    in_specs += _extra_specs(glu_extras, m, s, bm, f, bf, lambda j: j)
    dg, du = _dims(tg), _dims(tu)
    itemsize = x.dtype.itemsize
    gu_bytes = (x.size * itemsize * (1 if bk == k else f // bf)
                + 2 * k * f * wg.dtype.itemsize * (m // bm))
    if down is not None and FUSE_DOWN:
        wd, td = down
        n = wd.shape[0] if td else wd.shape[1]
        wd_spec = (pl.BlockSpec((n, bf), lambda l, i, j, kk: (0, j)) if td
                   else pl.BlockSpec((bf, n), lambda l, i, j, kk: (j, 0)))
        out = pl.pallas_call(
            functools.partial(_mlp_kernel, ng=len(glu_extras), no=len(out_extras), dg=dg, du=du,
                              dd=_dims(td), precision=precision, cd=cd, h_dtype=h_dtype, bm=bm,
                              bf=bf, s=s, m=m, f=f, n=n),
            grid=(l, s // bm, f // bf, k // bk),
            in_specs=in_specs[:3] + [wd_spec] + in_specs[3:]
            + _extra_specs(out_extras, m, s, bm, n, n, lambda j: 0),
            out_specs=pl.BlockSpec((None, bm, n), lambda l, i, j, kk: (l, i, 0)),
            out_shape=jax.ShapeDtypeStruct((l, s, n), out_dtype),
            scratch_shapes=[pltpu.VMEM((bm, bf), jnp.float32), pltpu.VMEM((bm, bf), jnp.float32),
                            pltpu.VMEM((bm, n), jnp.float32)],
            compiler_params=pltpu.CompilerParams(
                dimension_semantics=("parallel", "parallel", "arbitrary", "arbitrary"),
                vmem_limit_bytes=VMEM_LIMIT_BYTES),
            cost_estimate=pl.CostEstimate(
                flops=4 * m * k * f + 2 * m * f * n, transcendentals=m * f,
                bytes_accessed=gu_bytes + f * n * wd.dtype.itemsize * (m // bm)
                + m * n * jnp.dtype(out_dtype).itemsize),
        )(x, wg, wu, wd, *glu_extras, *out_extras)
        return out.reshape(lead + (n,))
    hidden_dtype = h_dtype if down is not None else out_dtype
    h = pl.pallas_call(
        functools.partial(_gate_up_kernel, ng=len(glu_extras), dg=dg, du=du, precision=precision,
                          cd=cd, bm=bm, bf=bf, s=s, m=m, f=f),
        grid=(l, s // bm, f // bf, k // bk),
        in_specs=in_specs,
        out_specs=pl.BlockSpec((None, bm, bf), lambda l, i, j, kk: (l, i, j)),
        out_shape=jax.ShapeDtypeStruct((l, s, f), hidden_dtype),
        scratch_shapes=[pltpu.VMEM((bm, bf), jnp.float32), pltpu.VMEM((bm, bf), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", F_SEMANTICS, "arbitrary"),
            vmem_limit_bytes=VMEM_LIMIT_BYTES),
        cost_estimate=pl.CostEstimate(
            flops=4 * m * k * f, transcendentals=m * f,
            bytes_accessed=gu_bytes + m * f * jnp.dtype(hidden_dtype).itemsize),
    )(x, wg, wu, *glu_extras)
    if down is None:
        return h.reshape(lead + (f,))
    wd, td = down
    n = wd.shape[0] if td else wd.shape[1]
    bn = _block(BLOCK_N, n, 128)
    bh = _block(BLOCK_F, f, 128)
    out = pl.pallas_call(
        functools.partial(_matmul_kernel, no=len(out_extras), dd=_dims(td), precision=precision,
                          bm=bm, bn=bn, s=s, m=m, n=n),
        grid=(l, s // bm, n // bn, f // bh),
        in_specs=[pl.BlockSpec((None, bm, bh), lambda l, i, j, kk: (l, i, kk)),
                  _w_spec(td, bh, bn, 0)]
        + _extra_specs(out_extras, m, s, bm, n, bn, lambda j: j),
        out_specs=pl.BlockSpec((None, bm, bn), lambda l, i, j, kk: (l, i, j)),
        out_shape=jax.ShapeDtypeStruct((l, s, n), out_dtype),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", F_SEMANTICS, "arbitrary"),
            vmem_limit_bytes=VMEM_LIMIT_BYTES),
        cost_estimate=pl.CostEstimate(
            flops=2 * m * f * n, transcendentals=0,
            bytes_accessed=h.size * h.dtype.itemsize * (n // bn)
            + f * n * wd.dtype.itemsize * (m // bm) + m * n * jnp.dtype(out_dtype).itemsize),
    )(h, wd, *out_extras)
    return out.reshape(lead + (n,))


@jax.jit
def _run({{graph_inputs}}):
{{body}}


def workload({{signature}}):
    return _run({{graph_inputs}})
