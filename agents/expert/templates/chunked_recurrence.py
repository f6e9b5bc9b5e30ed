{{header}}
# Chunked scan of a selective state-space model (Mamba-2's SSD), per batch and head h:
#   state_t = exp(a_t) state_{t-1} + B_t^T (dt_t x_t),   a_t = A_h dt_t
#   y_t     = C_t state_t + D_h x_t
# Grid (batch, head blocks, chunks): the chunk axis is last ("arbitrary") and the [N, P]
# states of the block's heads are carried across chunks in VMEM scratch, side by side
# ([N, heads * P]). Within a chunk of length L the outputs are the decay-masked (C B^T)
# [L, L] times x per head, plus C times the states the chunk starts from; the states then
# move to the chunk's end with B^T (w x). C B^T, C and B are shared by every head of the
# block (one B/C group), so the two state dots are one each for the whole block.
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


def _parts(v):
    """v as bf16 pieces that sum to it within ~2^-16: itself when it is bf16, else its bf16
    rounding and the rounding's error."""
    if v.dtype == jnp.bfloat16:
        return [v]
    hi = v.astype(jnp.bfloat16)
    return [hi, (v.astype(jnp.float32) - hi.astype(jnp.float32)).astype(jnp.bfloat16)]


def _dot(a, b, dims, mxu):
    """a . b accumulated in f32 with the MXU fed `mxu` operands; split_bf16: each f32
    operand as two bf16 pieces, the products of pieces kept where their error is above
    ~2^-16 (2 passes against a bf16 operand where an f32 dot takes 3)."""
    if mxu != "split_bf16":
        dt = jnp.dtype(mxu)
        return jax.lax.dot_general(a.astype(dt), b.astype(dt), (dims, ((), ())),
                                   preferred_element_type=jnp.float32)
    out = None
    for i, pa in enumerate(_parts(a)):
        for j, pb in enumerate(_parts(b)):
            if i + j < 2:
                t = jax.lax.dot_general(pa, pb, (dims, ((), ())),
                                        preferred_element_type=jnp.float32)
                out = t if out is None else out + t
    return out


def _ssd_kernel(d_ref, x_ref, b_ref, c_ref, cum_row_ref, cum_col_ref, dt_row_ref, w_col_ref,
                y_ref, state_ref, *, block_h, chunk, num_heads, mxu, head_dim, in_place):
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

    def weighted(i):
        """Head i's decay-masked C B^T with its steps: [L, L]."""
        cum_row = cum_row_ref[0, i]        # [1, L]
        cum_col = cum_col_ref[0, i]        # [L, 1]
        return cb * jnp.exp(jnp.where(causal, cum_col - cum_row, -jnp.inf)) * dt_row_ref[0, i]

    def chunk_decay(i):
        return jnp.exp(cum_row_ref[0, i][:, chunk - 1:chunk])     # [1, 1]

    if not in_place:
        # x and y blocks [1, block_h, L, P] of head-major copies; a state [N, P] per head
        for i in range(block_h):
            x = x_ref[0, i]                    # [L, P]
            state = state_ref[i]               # [N, P]
            y = _dot(weighted(i), x, ((1,), (0,)), mxu)
            y += jnp.exp(cum_col_ref[0, i]) * _dot(cmat, state, ((1,), (0,)), mxu)
            if HAS_D:
                y += d_ref[hb * block_h + i] * x.astype(jnp.float32)
            y_ref[0, i] = y.astype(y_ref.dtype)
            xw = x.astype(jnp.float32) * w_col_ref[0, i]
            state_ref[i] = chunk_decay(i) * state + _dot(bmat, xw, ((0,), (0,)), mxu)
        return

    # In place: x and y blocks [1, L, block_h * P] of the token-major arrays, read and written
    # a lane group at a time (128 lanes, or one head when P is wider): every slice is
    # lane-aligned. Head j of a group is its lanes [j P, (j + 1) P): its product with the
    # group's x masked to them lands on them alone. The block's states side by side
    # ([N, block_h * P]): B and C are shared by its heads, so what the states contribute
    # (C . state) and receive (B^T . (w x)) are one dot each, as wide as the block.
    lanes = block_h * head_dim
    group = min(max(128, head_dim), lanes)
    per_group = group // head_dim
    lane_head = jax.lax.broadcasted_iota(jnp.int32, (1, group), 1) // head_dim

    def spread(vals):
        """One [R, 1] value per head of a group over its lanes: [R, group]."""
        out = jnp.broadcast_to(vals[0], (vals[0].shape[0], group))
        for j in range(1, per_group):
            out = jnp.where(lane_head == j, vals[j], out)
        return out

    state = state_ref[...]                                # [N, lanes]
    off = _dot(cmat, state, ((1,), (0,)), mxu)            # [L, lanes]
    xws, decays = [], []
    for g in range(lanes // group):
        cols_g = slice(g * group, (g + 1) * group)
        x = x_ref[0, :, cols_g]                           # [L, group]
        heads = [g * per_group + j for j in range(per_group)]
        y = None
        for j, i in enumerate(heads):
            xj = x if per_group == 1 else jnp.where(lane_head == j, x, jnp.zeros_like(x))
            t = _dot(weighted(i), xj, ((1,), (0,)), mxu)
            y = t if y is None else y + t
        y += spread([jnp.exp(cum_col_ref[0, i]) for i in heads]) * off[:, cols_g]
        if HAS_D:
            d = spread([jnp.full((1, 1), d_ref[hb * block_h + i], jnp.float32) for i in heads])
            y += d * x.astype(jnp.float32)
        y_ref[0, :, cols_g] = y.astype(y_ref.dtype)
        xws.append(x.astype(jnp.float32) * spread([w_col_ref[0, i] for i in heads]))
        decays.append(spread([chunk_decay(i) for i in heads]))
    # the states at the chunk's end: decayed over the chunk plus this chunk's inputs
    xw = xws[0] if len(xws) == 1 else jnp.concatenate(xws, axis=-1)          # [L, lanes]
    decay = decays[0] if len(decays) == 1 else jnp.concatenate(decays, axis=-1)
    state_ref[...] = decay * state + _dot(bmat, xw, ((0,), (0,)), mxu)


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
    mxu = PARAMS["mxu_dtype"]
    # Within-chunk cumulative log-decay and the weights that carry each step to its chunk's end.
    a = (dt3 * a_vec.astype(jnp.float32)[None, None, :]).transpose(0, 2, 1)   # [b, h, t]
    cum = jnp.cumsum(a.reshape(batch, heads, nc, chunk), axis=-1)
    w = jnp.exp(cum[..., -1:] - cum) * dt3.transpose(0, 2, 1).reshape(batch, heads, nc, chunk)
    cum = cum.reshape(batch, heads, seq)
    w = w.reshape(batch, heads, seq)
    dt_bht = dt3.transpose(0, 2, 1)
    # x read where it lies ([b, t, h * p], a free reshape) when a block's heads span whole
    # lane tiles; else a head-major copy, and the output transposed back after the kernel
    # (lane groups: heads of P dividing 128 share one, wider heads span whole ones)
    in_place = (list(X_PERM) == [0, 1, 2, 3] and PARAMS.get("x_layout", "in_place") == "in_place"
                and (hd % 128 == 0 or 128 % hd == 0)
                and ((block_h * hd) % 128 == 0 or block_h == heads))
    if in_place:
        xc = x4.reshape(batch, seq, heads * hd)
        x_spec = pl.BlockSpec((1, chunk, block_h * hd), lambda b, h, c: (b, c, h))
        y_shape = (batch, seq, heads * hd)
    else:
        xc = x4.transpose(0, 2, 1, 3)               # [b, h, t, p]
        x_spec = pl.BlockSpec((1, block_h, chunk, hd), lambda b, h, c: (b, h, c, 0))
        y_shape = (batch, heads, seq, hd)
    d_arr = (d_vec.astype(jnp.float32) if HAS_D else jnp.zeros((heads,), jnp.float32))

    head_rows = lambda b, h, c: (b, h, 0, c)
    head_cols = lambda b, h, c: (b, h, c, 0)
    y = pl.pallas_call(
        functools.partial(_ssd_kernel, block_h=block_h, chunk=chunk, num_heads=heads, mxu=mxu,
                          head_dim=hd, in_place=in_place),
        grid=(batch, heads // block_h, nc),
        in_specs=[
            pl.BlockSpec(memory_space=pltpu.SMEM),
            x_spec,
            pl.BlockSpec((1, chunk, state), lambda b, h, c: (b, c, 0)),
            pl.BlockSpec((1, chunk, state), lambda b, h, c: (b, c, 0)),
            pl.BlockSpec((1, block_h, 1, chunk), head_rows),
            pl.BlockSpec((1, block_h, chunk, 1), head_cols),
            pl.BlockSpec((1, block_h, 1, chunk), head_rows),
            pl.BlockSpec((1, block_h, chunk, 1), head_cols),
        ],
        out_specs=x_spec,
        out_shape=jax.ShapeDtypeStruct(y_shape, OUT_DTYPE),
        scratch_shapes=[pltpu.VMEM((state, block_h * hd) if in_place else (block_h, state, hd),
                                   jnp.float32)],
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
    if in_place:
        return y.reshape(batch, seq, heads, hd)
    y = y.transpose(0, 2, 1, 3)                     # [b, t, h, p]
    inv = [0] * 4
    for i, p in enumerate(X_PERM):
        inv[p] = i
    return _permute(y, inv)


def workload({{args}}):
    return _ssd({{x}}, {{dt}}, {{a}}, {{b}}, {{c}}, {{d}})
