{{header}}
# Chunked scan of a selective state-space model (Mamba-2's SSD), per batch and head h:
#   state_t = exp(a_t) state_{t-1} + B_t^T (dt_t x_t),   a_t = A_h dt_t
#   y_t     = C_t state_t + D_h x_t
# Grid (batch, head blocks, chunks): the chunk axis is last ("arbitrary") and the [N, P]
# state of each head of the block is carried across chunks in VMEM scratch. Within a chunk
# of length L the outputs are two MXU matmuls: the decay-masked (C B^T) [L, L] times x, plus
# C times the state the chunk starts from; the state then moves to the chunk's end with one
# more matmul, B^T (w x). C B^T is shared by every head of the block (one B/C group).
# The within-chunk cumulative decays (O(B T H) work) are prepared outside the kernel.
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

PARAMS = {{params}}
X_PERM = {{x_perm}}        # x's dims -> (batch, seq, heads, head_dim)
DT_PERM = {{dt_perm}}      # dt's dims -> (batch, seq, heads)
BC_PERM = {{bc_perm}}      # B's and C's dims -> (batch, seq, state)
HAS_D = {{has_d}}
OUT_DTYPE = jnp.dtype("{{out_dtype}}")


def _block(extent, want, align):
    if want >= extent:
        return extent
    b = (want // align) * align
    while b >= align:
        if extent % b == 0:
            return b
        b -= align
    return extent


def _divisor(extent, want):
    b = max(1, min(want, extent))
    while extent % b:
        b -= 1
    return b


def _permute(x, perm):
    return x if list(perm) == list(range(x.ndim)) else jnp.transpose(x, perm)


def _ssd_kernel(d_ref, x_ref, b_ref, c_ref, cum_row_ref, cum_col_ref, dt_row_ref, w_col_ref,
                y_ref, state_ref, *, block_h, chunk, num_heads, mxu):
    hb, ci = pl.program_id(1), pl.program_id(2)

    @pl.when(ci == 0)
    def _init():
        state_ref[...] = jnp.zeros(state_ref.shape, jnp.float32)

    bmat = b_ref[0]
    cmat = c_ref[0]
    # C B^T, shared by the heads of the block: [L, L], exact in the inputs' dtype.
    cb = jax.lax.dot_general(cmat, bmat, (((1,), (1,)), ((), ())),
                             preferred_element_type=jnp.float32)
    rows = jax.lax.broadcasted_iota(jnp.int32, (chunk, chunk), 0)
    cols = jax.lax.broadcasted_iota(jnp.int32, (chunk, chunk), 1)
    causal = rows >= cols
    cmat_m = cmat.astype(mxu)
    bmat_m = bmat.astype(mxu)
    for i in range(block_h):
        cum_row = cum_row_ref[0, i]        # [1, L]
        cum_col = cum_col_ref[0, i]        # [L, 1]
        decay = jnp.exp(jnp.where(causal, cum_col - cum_row, -jnp.inf))
        m = cb * decay * dt_row_ref[0, i]
        x = x_ref[0, i]                    # [L, P]
        xm = x.astype(mxu)
        state = state_ref[i]               # [N, P]
        y = jax.lax.dot_general(m.astype(mxu), xm, (((1,), (0,)), ((), ())),
                                preferred_element_type=jnp.float32)
        y += jnp.exp(cum_col) * jax.lax.dot_general(
            cmat_m, state.astype(mxu), (((1,), (0,)), ((), ())),
            preferred_element_type=jnp.float32)
        if HAS_D:
            y += d_ref[hb * block_h + i] * x.astype(jnp.float32)
        y_ref[0, i] = y.astype(y_ref.dtype)
        # the state at the chunk's end: decayed over the chunk plus this chunk's inputs
        total = cum_row[:, chunk - 1:chunk]     # [1, 1]
        xw = (x.astype(jnp.float32) * w_col_ref[0, i]).astype(mxu)
        state_ref[i] = jnp.exp(total) * state + jax.lax.dot_general(
            bmat_m, xw, (((0,), (0,)), ((), ())), preferred_element_type=jnp.float32)


def _ssd(x, dt, a_vec, bm, cm, d_vec):
    x4 = _permute(x, X_PERM)                       # [b, t, h, p]
    dt3 = _permute(dt, DT_PERM).astype(jnp.float32)  # [b, t, h]
    bm3 = _permute(bm, BC_PERM)                    # [b, t, n]
    cm3 = _permute(cm, BC_PERM)
    batch, seq, heads, hd = x4.shape
    state = bm3.shape[-1]
    chunk = _block(seq, PARAMS["block_t"], 128)
    block_h = _divisor(heads, PARAMS["block_h"])
    nc = seq // chunk
    mxu = jnp.dtype(PARAMS["mxu_dtype"])
    # Within-chunk cumulative log-decay and the weights that carry each step to its chunk's end.
    a = (dt3 * a_vec.astype(jnp.float32)[None, None, :]).transpose(0, 2, 1)   # [b, h, t]
    cum = jnp.cumsum(a.reshape(batch, heads, nc, chunk), axis=-1)
    w = jnp.exp(cum[..., -1:] - cum) * dt3.transpose(0, 2, 1).reshape(batch, heads, nc, chunk)
    cum = cum.reshape(batch, heads, seq)
    w = w.reshape(batch, heads, seq)
    dt_bht = dt3.transpose(0, 2, 1)
    xc = x4.transpose(0, 2, 1, 3)                   # [b, h, t, p]
    d_arr = (d_vec.astype(jnp.float32) if HAS_D else jnp.zeros((heads,), jnp.float32))

    head_rows = lambda b, h, c: (b, h, 0, c)
    head_cols = lambda b, h, c: (b, h, c, 0)
    y = pl.pallas_call(
        functools.partial(_ssd_kernel, block_h=block_h, chunk=chunk, num_heads=heads, mxu=mxu),
        grid=(batch, heads // block_h, nc),
        in_specs=[
            pl.BlockSpec(memory_space=pltpu.SMEM),
            pl.BlockSpec((1, block_h, chunk, hd), lambda b, h, c: (b, h, c, 0)),
            pl.BlockSpec((1, chunk, state), lambda b, h, c: (b, c, 0)),
            pl.BlockSpec((1, chunk, state), lambda b, h, c: (b, c, 0)),
            pl.BlockSpec((1, block_h, 1, chunk), head_rows),
            pl.BlockSpec((1, block_h, chunk, 1), head_cols),
            pl.BlockSpec((1, block_h, 1, chunk), head_rows),
            pl.BlockSpec((1, block_h, chunk, 1), head_cols),
        ],
        out_specs=pl.BlockSpec((1, block_h, chunk, hd), lambda b, h, c: (b, h, c, 0)),
        out_shape=jax.ShapeDtypeStruct((batch, heads, seq, hd), OUT_DTYPE),
        scratch_shapes=[pltpu.VMEM((block_h, state, hd), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=tuple(PARAMS["dimension_semantics"]) + ("arbitrary",),
            vmem_limit_bytes=int(PARAMS["vmem_limit_bytes"])),
        cost_estimate=pl.CostEstimate(
            flops=2 * batch * seq * (heads // block_h) * chunk * state
            + 2 * batch * heads * seq * (chunk * hd + 2 * state * hd),
            transcendentals=batch * heads * seq * (chunk + 2),
            bytes_accessed=2 * x.size * x.dtype.itemsize + 2 * bm.size * bm.dtype.itemsize
            + 4 * batch * heads * seq * 4),
    )(d_arr, xc, bm3, cm3, cum.reshape(batch, heads, 1, seq), cum.reshape(batch, heads, seq, 1),
      dt_bht.reshape(batch, heads, 1, seq), w.reshape(batch, heads, seq, 1))
    y = y.transpose(0, 2, 1, 3)                     # [b, t, h, p]
    inv = [0] * 4
    for i, p in enumerate(X_PERM):
        inv[p] = i
    return _permute(y, inv)


def workload({{args}}):
    return _ssd({{x}}, {{dt}}, {{a}}, {{b}}, {{c}}, {{d}})
