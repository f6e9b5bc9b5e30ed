{{header}}
# Each output is one GEMM of two inputs, out = scale * A @ B, where A (rows) and B (columns)
# are inputs read in their stored layout (K-major or not), so the backward pass of a dense
# layer (dX = dY W^T, dW = X^T dY) needs no transpose in HBM. One operand may carry leading
# group dims the other is shared by (out[d] = X @ W[d], the all-gather matmul). One
# pallas_call per output, grid (groups, rows, cols, K) with K last ("arbitrary") and an f32
# accumulator in VMEM scratch.
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

PARAMS = {{params}}

# Per output (reference order): the two inputs, whether each is stored K-major, how many
# leading dims of each are its free (M or N) dims, the scale, the MXU and output dtypes.
PRODUCTS = {{products}}
# Per output: its shape from the inputs' shapes (merged dims multiplied back).
OUT_SHAPES = {{out_shapes}}


def _block(extent, want, align):
    """The largest multiple of align dividing extent and <= want, else the whole extent."""
    if want >= extent:
        return extent
    b = (want // align) * align
    while b >= align:
        if extent % b == 0:
            return b
        b -= align
    return extent


def _kernel(a_ref, b_ref, o_ref, acc_ref, *, a_kmajor, b_kmajor, scale, mxu_dtype, k_axis):
    k = pl.program_id(k_axis)

    @pl.when(k == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    a = a_ref[...].astype(mxu_dtype)
    b = b_ref[...].astype(mxu_dtype)
    dims = (((0 if a_kmajor else 1,), (0 if b_kmajor else 1,)), ((), ()))
    acc_ref[...] += jax.lax.dot_general(a, b, dims, preferred_element_type=jnp.float32)

    @pl.when(k == pl.num_programs(k_axis) - 1)
    def _store():
        acc = acc_ref[...]
        if scale != 1.0:
            acc = acc * scale
        o_ref[...] = acc.astype(o_ref.dtype)


def _as_matrix(x, n_group, free_first, n_free):
    """x as [groups, free, contracted] or [groups, contracted, free] (stored order kept):
    its leading group dims, its free dims and its contracted dims each merged."""
    shape = x.shape
    group, rest = shape[:n_group], shape[n_group:]
    if free_first:
        free, contr = rest[:n_free], rest[n_free:]
    else:
        contr, free = rest[:len(rest) - n_free], rest[len(rest) - n_free:]
    g, f, c = 1, 1, 1
    for d in group:
        g *= d
    for d in free:
        f *= d
    for d in contr:
        c *= d
    return (x.reshape(g, f, c) if free_first else x.reshape(g, c, f)), tuple(group), tuple(free)


def _gemm(j, a, b, prod, out_shape):
    a_kmajor, b_kmajor = prod["a_kmajor"], prod["b_kmajor"]
    a3, a_group, a_free = _as_matrix(a, prod["a_group"], not a_kmajor, prod["a_free"])
    b3, b_group, b_free = _as_matrix(b, prod["b_group"], not b_kmajor, prod["b_free"])
    # one operand at most carries group dims (a batch the other operand is shared by)
    groups = max(a3.shape[0], b3.shape[0])
    ga = (lambda g: g) if a3.shape[0] > 1 else (lambda g: 0)
    gb = (lambda g: g) if b3.shape[0] > 1 else (lambda g: 0)
    m = a3.shape[2] if a_kmajor else a3.shape[1]
    kk = a3.shape[1] if a_kmajor else a3.shape[2]
    n = b3.shape[2] if b_kmajor else b3.shape[1]
    # Lane dims (the last of each stored block) want multiples of 128; the rest 8 (16 for
    # packed 16-bit, 32 for 8-bit dtypes), so any request becomes a legal block.
    sub = {1: 32, 2: 16}.get(jnp.dtype(a.dtype).itemsize, 8)
    sub_b = {1: 32, 2: 16}.get(jnp.dtype(b.dtype).itemsize, 8)
    bm = _block(m, PARAMS[f"bm{j}"], 128 if a_kmajor else max(sub, 8))
    bn = _block(n, PARAMS[f"bn{j}"], 128)
    bk = _block(kk, PARAMS[f"bk{j}"], max(sub, sub_b) if (a_kmajor and b_kmajor) else 128)
    if PARAMS.get(f"order{j}", "mn") == "nm":
        grid = (groups, n // bn, m // bm, kk // bk)
        im, jn = (lambda p, q: q), (lambda p, q: p)
    else:
        grid = (groups, m // bm, n // bn, kk // bk)
        im, jn = (lambda p, q: p), (lambda p, q: q)
    if a_kmajor:
        a_spec = pl.BlockSpec((None, bk, bm), lambda g, p, q, k: (ga(g), k, im(p, q)))
    else:
        a_spec = pl.BlockSpec((None, bm, bk), lambda g, p, q, k: (ga(g), im(p, q), k))
    if b_kmajor:
        b_spec = pl.BlockSpec((None, bk, bn), lambda g, p, q, k: (gb(g), k, jn(p, q)))
    else:
        b_spec = pl.BlockSpec((None, bn, bk), lambda g, p, q, k: (gb(g), jn(p, q), k))
    o_spec = pl.BlockSpec((None, bm, bn), lambda g, p, q, k: (g, im(p, q), jn(p, q)))
    kernel = functools.partial(_kernel, a_kmajor=a_kmajor, b_kmajor=b_kmajor,
                               scale=prod["scale"], mxu_dtype=jnp.dtype(prod["mxu_dtype"]),
                               k_axis=3)
    out = pl.pallas_call(
        kernel,
        grid=grid,
        in_specs=[a_spec, b_spec],
        out_specs=o_spec,
        out_shape=jax.ShapeDtypeStruct((groups, m, n), jnp.dtype(prod["out_dtype"])),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel",) + tuple(PARAMS["dimension_semantics"])
            + ("arbitrary",),
            vmem_limit_bytes=int(PARAMS["vmem_limit_bytes"])),
        cost_estimate=pl.CostEstimate(
            flops=2 * groups * m * n * kk, transcendentals=0,
            bytes_accessed=a3.size * a3.dtype.itemsize * (n // bn if a3.shape[0] == 1 else 1)
            + b3.size * b3.dtype.itemsize + groups * m * n * jnp.dtype(prod["out_dtype"]).itemsize),
    )(a3, b3)
    return out.reshape(out_shape)


def workload({{args}}):
    inputs = ({{args}},)
    outs = []
    for j, prod in enumerate(PRODUCTS):
        outs.append(_gemm(j, inputs[prod["a"]], inputs[prod["b"]], prod, OUT_SHAPES[j](inputs)))
    return {{returns}}
