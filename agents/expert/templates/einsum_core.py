{{header}}
# The reference's dominant contraction (a batched einsum of computed operands: the
# triangle multiplication's x_ij = sum_k a_ik b_jk per channel) as a Pallas kernel, grid
# (batch blocks, rows, cols, K) with K last ("arbitrary") and an f32 accumulator in VMEM
# scratch, several batch entries (channels) per step to keep the step count low;
# its operands are fed batch-major ([batch, rows, K], [batch, cols, K]) so every grid step
# is one MXU matmul. The ops before and after it (norms, projections, gates) are replayed
# from the reference's graph as jnp, which XLA fuses around the kernel (a producer's
# transpose into the batch-major layout included).
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

PARAMS = {{params}}
LHS_PERM = {{lhs_perm}}     # lhs dims -> (batch..., free..., contracted...)
RHS_PERM = {{rhs_perm}}
NB, NLF, NRF = {{num_batch}}, {{num_lhs_free}}, {{num_rhs_free}}
OUT_DTYPE = jnp.dtype("{{out_dtype}}")


def _divisor(extent, want):
    b = max(1, min(want, extent))
    while extent % b:
        b -= 1
    return b


def _block(extent, want, align):
    if want >= extent:
        return extent
    b = (want // align) * align
    while b >= align:
        if extent % b == 0:
            return b
        b -= align
    return extent


def _kernel(a_ref, b_ref, o_ref, acc_ref):
    k = pl.program_id(3)

    @pl.when(k == 0)
    def _init():
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

    acc_ref[...] += jax.lax.dot_general(a_ref[...], b_ref[...], (((2,), (2,)), ((0,), (0,))),
                                        preferred_element_type=jnp.float32)

    @pl.when(k == pl.num_programs(3) - 1)
    def _store():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def _contract(lhs, rhs):
    lt = jnp.transpose(lhs, LHS_PERM)
    rt = jnp.transpose(rhs, RHS_PERM)
    batch = lt.shape[:NB]
    lfree = lt.shape[NB:NB + NLF]
    rfree = rt.shape[NB:NB + NRF]
    nb, m, n, kk = 1, 1, 1, 1
    for d in batch:
        nb *= d
    for d in lfree:
        m *= d
    for d in rfree:
        n *= d
    for d in lt.shape[NB + NLF:]:
        kk *= d
    mxu = jnp.promote_types(lhs.dtype, rhs.dtype)
    a3 = lt.reshape(nb, m, kk).astype(mxu)
    b3 = rt.reshape(nb, n, kk).astype(mxu)
    sub = {1: 32, 2: 16}.get(jnp.dtype(mxu).itemsize, 8)
    bm = _block(m, PARAMS["block_m"], sub)
    bn = _block(n, PARAMS["block_n"], 128)
    bk = _block(kk, PARAMS["block_k"], 128)
    bb = _divisor(nb, PARAMS["block_b"])
    out = pl.pallas_call(
        _kernel,
        grid=(nb // bb, m // bm, n // bn, kk // bk),
        in_specs=[pl.BlockSpec((bb, bm, bk), lambda g, i, j, k: (g, i, k)),
                  pl.BlockSpec((bb, bn, bk), lambda g, i, j, k: (g, j, k))],
        out_specs=pl.BlockSpec((bb, bm, bn), lambda g, i, j, k: (g, i, j)),
        out_shape=jax.ShapeDtypeStruct((nb, m, n), OUT_DTYPE),
        scratch_shapes=[pltpu.VMEM((bb, bm, bn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=tuple(PARAMS["dimension_semantics"]) + ("arbitrary",),
            vmem_limit_bytes=int(PARAMS["vmem_limit_bytes"])),
        cost_estimate=pl.CostEstimate(
            flops=2 * nb * m * n * kk, transcendentals=0,
            bytes_accessed=(a3.size * (n // bn) + b3.size * (m // bm)) * a3.dtype.itemsize
            + nb * m * n * OUT_DTYPE.itemsize),
    )(a3, b3)
    return out.reshape(tuple(batch) + tuple(lfree) + tuple(rfree))


def workload({{args}}):
    # ---- replayed from the reference: the operands of the contraction ----
{{prologue}}
    core = _contract({{lhs}}, {{rhs}})
    # ---- replayed from the reference: what follows it ----
{{epilogue}}
    return {{returns}}
