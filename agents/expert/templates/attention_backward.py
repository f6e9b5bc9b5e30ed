{{header}}
# Flash-attention backward in three pallas_calls over [batch*heads, seq, head_dim]:
#  1. statistics: the forward recomputed with an online softmax, keeping per query row only
#     lse = max + log(sum) and delta = rowsum(dO * O) (never the [S, S] probabilities);
#  2. dK, dV: grid (bh, key blocks, query blocks), query axis last ("arbitrary"): P is
#     recomputed from Q, K and lse; dV += P^T dO, dS = P * (dO V^T - delta), dK += dS^T Q;
#  3. dQ: grid (bh, query blocks, key blocks), key axis last: dQ += dS K.
# Causal: blocks above the diagonal are skipped and their copies avoided by clamping the
# index maps to the last block that is needed; the mask is computed only on the blocks the
# diagonal cuts (those below it are whole). PARAMS["block_b"] rows of batch*heads per grid
# step (batched dots, one step's overhead for all of them); at 1 the blocks are 2-D.
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

PARAMS = {{params}}
SCALE = {{scale}}          # softmax(SCALE * q . k)
CAUSAL = {{causal}}
PERM = {{perm}}            # input dims -> (batch dims..., seq, head_dim)
MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)


def _block(extent, want, align):
    if want >= extent:
        return extent
    b = (want // align) * align
    while b >= align:
        if extent % b == 0:
            return b
        b -= align
    return extent


def _dot(a, b, ca, cb):
    """a . b contracting a's minor dim ca (0 or 1 of the last two) with b's cb, batched over
    the leading dim when the blocks hold several rows of batch*heads."""
    n = a.ndim - 2
    batch = ((0,), (0,)) if n else ((), ())
    return jax.lax.dot_general(a, b, (((n + ca,), (n + cb,)), batch),
                               preferred_element_type=jnp.float32)


def _nt(a, b):   # a @ b.T
    return _dot(a, b, 1, 1)


def _tn(a, b):   # a.T @ b
    return _dot(a, b, 0, 0)


def _nn(a, b):
    return _dot(a, b, 1, 0)


def _get(ref):   # a block without its unit batch*heads dim
    return ref[0] if ref.shape[0] == 1 else ref[...]


def _put(ref, v):
    if ref.shape[0] == 1:
        ref[0] = v
    else:
        ref[...] = v


def _scores(q, k, qi, ki, bq, bk, masked):
    s = _nt(q, k) * SCALE
    if masked:
        rows = qi * bq + jax.lax.broadcasted_iota(jnp.int32, s.shape, s.ndim - 2)
        cols = ki * bk + jax.lax.broadcasted_iota(jnp.int32, s.shape, s.ndim - 1)
        s = jnp.where(rows >= cols, s, MASK_VALUE)
    return s


def _causal_steps(qi, ki, bq, bk, step):
    """step(masked) on the (query block, key block) pairs the mask leaves alive: with the mask
    where the diagonal cuts the block, without it where the block lies wholly below."""
    if not CAUSAL:
        step(False)
        return
    live = ki * bk <= qi * bq + bq - 1
    whole = ki * bk + bk - 1 <= qi * bq
    pl.when(live & jnp.logical_not(whole))(lambda: step(True))
    pl.when(whole)(lambda: step(False))


def _stats_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, m_sc, l_sc, acc_sc, *,
                  bq, bk, mxu):
    qi, ki = pl.program_id(1), pl.program_id(2)

    @pl.when(ki == 0)
    def _init():
        m_sc[...] = jnp.full(m_sc.shape, MASK_VALUE, jnp.float32)
        l_sc[...] = jnp.zeros(l_sc.shape, jnp.float32)
        acc_sc[...] = jnp.zeros(acc_sc.shape, jnp.float32)

    def _step(masked):
        s = _scores(_get(q_ref).astype(mxu), _get(k_ref).astype(mxu), qi, ki, bq, bk, masked)
        m_prev = m_sc[...]
        m_new = jnp.maximum(m_prev, jnp.max(s, axis=-1, keepdims=True))
        p = jnp.exp(s - m_new)
        alpha = jnp.exp(m_prev - m_new)
        l_sc[...] = alpha * l_sc[...] + jnp.sum(p, axis=-1, keepdims=True)
        acc_sc[...] = alpha * acc_sc[...] + _nn(p.astype(mxu), _get(v_ref).astype(mxu))
        m_sc[...] = m_new

    _causal_steps(qi, ki, bq, bk, _step)

    @pl.when(ki == pl.num_programs(2) - 1)
    def _final():
        l = l_sc[...]
        o = acc_sc[...] / l
        _put(lse_ref, m_sc[...] + jnp.log(l))
        _put(delta_ref, jnp.sum(o * _get(do_ref).astype(jnp.float32), axis=-1, keepdims=True))


def _probs_and_ds(q, k, v, do, lse, delta, qi, ki, bq, bk, masked):
    s = _scores(q, k, qi, ki, bq, bk, masked)
    p = jnp.exp(s - lse)
    dp = _nt(do, v)
    ds = p * (dp - delta)
    return p, ds


def _dkv_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dk_ref, dv_ref, dk_sc, dv_sc,
                *, bq, bk, mxu):
    ki, qi = pl.program_id(1), pl.program_id(2)

    @pl.when(qi == 0)
    def _init():
        dk_sc[...] = jnp.zeros(dk_sc.shape, jnp.float32)
        dv_sc[...] = jnp.zeros(dv_sc.shape, jnp.float32)

    def _step(masked):
        q = _get(q_ref).astype(mxu)
        do = _get(do_ref).astype(mxu)
        p, ds = _probs_and_ds(q, _get(k_ref).astype(mxu), _get(v_ref).astype(mxu), do,
                              _get(lse_ref), _get(delta_ref), qi, ki, bq, bk, masked)
        dv_sc[...] += _tn(p.astype(mxu), do)
        dk_sc[...] += _tn(ds.astype(mxu), q)

    _causal_steps(qi, ki, bq, bk, _step)

    @pl.when(qi == pl.num_programs(2) - 1)
    def _final():
        _put(dk_ref, (dk_sc[...] * SCALE).astype(dk_ref.dtype))
        _put(dv_ref, dv_sc[...].astype(dv_ref.dtype))


def _dq_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dq_ref, dq_sc, *, bq, bk, mxu):
    qi, ki = pl.program_id(1), pl.program_id(2)

    @pl.when(ki == 0)
    def _init():
        dq_sc[...] = jnp.zeros(dq_sc.shape, jnp.float32)

    def _step(masked):
        k = _get(k_ref).astype(mxu)
        _, ds = _probs_and_ds(_get(q_ref).astype(mxu), k, _get(v_ref).astype(mxu),
                              _get(do_ref).astype(mxu), _get(lse_ref), _get(delta_ref), qi, ki,
                              bq, bk, masked)
        dq_sc[...] += _nn(ds.astype(mxu), k)

    _causal_steps(qi, ki, bq, bk, _step)

    @pl.when(ki == pl.num_programs(2) - 1)
    def _final():
        _put(dq_ref, (dq_sc[...] * SCALE).astype(dq_ref.dtype))


def _canonical(x):
    if list(PERM) != list(range(x.ndim)):
        x = jnp.transpose(x, PERM)
    return x.reshape((-1,) + x.shape[-2:])


def _restore(x, like):
    t = tuple(like.shape[p] for p in PERM)
    x = x.reshape(t)
    if list(PERM) != list(range(like.ndim)):
        inv = [0] * len(PERM)
        for i, p in enumerate(PERM):
            inv[p] = i
        x = jnp.transpose(x, inv)
    return x


def _attention_backward(q, k, v, do):
    q3, k3, v3, do3 = (_canonical(x) for x in (q, k, v, do))
    bh, s, d = q3.shape
    mxu = jnp.dtype(PARAMS["mxu_dtype"])
    bq = _block(s, PARAMS["block_q"], 128)
    bk = _block(s, PARAMS["block_k"], 128)
    bb = _block(bh, PARAMS.get("block_b", 1), 1)
    nq, nk = s // bq, s // bk
    sem = tuple(PARAMS["dimension_semantics"])
    limit = int(PARAMS["vmem_limit_bytes"])
    itemsize = q3.dtype.itemsize

    if CAUSAL:   # the last key block a query block needs / the first query block a key block needs
        def kv_of(qi, ki):
            return jnp.minimum(ki, (qi * bq + bq - 1) // bk)

        def q_of(ki, qi):
            return jnp.maximum(qi, (ki * bk) // bq)
    else:
        def kv_of(qi, ki):
            return ki

        def q_of(ki, qi):
            return qi

    def sc(*shape):   # f32 scratch, with the batch*heads rows when a block holds several
        return pltpu.VMEM(shape if bb == 1 else (bb,) + shape, jnp.float32)

    row_q = pl.BlockSpec((bb, bq, d), lambda b, i, j: (b, i, 0))
    row_k = pl.BlockSpec((bb, bk, d), lambda b, i, j: (b, kv_of(i, j), 0))
    stat_q = pl.BlockSpec((bb, bq, 1), lambda b, i, j: (b, i, 0))
    stat_shape = jax.ShapeDtypeStruct((bh, s, 1), jnp.float32)
    pairs = bh * s * s // (2 if CAUSAL else 1)

    lse, delta = pl.pallas_call(
        functools.partial(_stats_kernel, bq=bq, bk=bk, mxu=mxu),
        grid=(bh // bb, nq, nk),
        in_specs=[row_q, row_k, row_k, row_q],
        out_specs=[stat_q, stat_q],
        out_shape=[stat_shape, stat_shape],
        scratch_shapes=[sc(bq, 1), sc(bq, 1), sc(bq, d)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=sem + ("arbitrary",),
                                             vmem_limit_bytes=limit),
        cost_estimate=pl.CostEstimate(flops=4 * pairs * d, transcendentals=pairs,
                                      bytes_accessed=4 * bh * s * d * itemsize),
    )(q3, k3, v3, do3)

    # dK, dV: the key block stays, query blocks stream (clamped below the diagonal).
    kv_row = pl.BlockSpec((bb, bk, d), lambda b, j, i: (b, j, 0))
    q_row = pl.BlockSpec((bb, bq, d), lambda b, j, i: (b, q_of(j, i), 0))
    q_stat = pl.BlockSpec((bb, bq, 1), lambda b, j, i: (b, q_of(j, i), 0))
    dk, dv = pl.pallas_call(
        functools.partial(_dkv_kernel, bq=bq, bk=bk, mxu=mxu),
        grid=(bh // bb, nk, nq),
        in_specs=[q_row, kv_row, kv_row, q_row, q_stat, q_stat],
        out_specs=[kv_row, kv_row],
        out_shape=[jax.ShapeDtypeStruct(k3.shape, jnp.dtype(PARAMS["dk_dtype"])),
                   jax.ShapeDtypeStruct(v3.shape, jnp.dtype(PARAMS["dv_dtype"]))],
        scratch_shapes=[sc(bk, d), sc(bk, d)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=sem + ("arbitrary",),
                                             vmem_limit_bytes=limit),
        cost_estimate=pl.CostEstimate(flops=8 * pairs * d, transcendentals=pairs,
                                      bytes_accessed=6 * bh * s * d * itemsize),
    )(q3, k3, v3, do3, lse, delta)

    dq = pl.pallas_call(
        functools.partial(_dq_kernel, bq=bq, bk=bk, mxu=mxu),
        grid=(bh // bb, nq, nk),
        in_specs=[row_q, row_k, row_k, row_q, stat_q, stat_q],
        out_specs=row_q,
        out_shape=jax.ShapeDtypeStruct(q3.shape, jnp.dtype(PARAMS["dq_dtype"])),
        scratch_shapes=[sc(bq, d)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=sem + ("arbitrary",),
                                             vmem_limit_bytes=limit),
        cost_estimate=pl.CostEstimate(flops=6 * pairs * d, transcendentals=pairs,
                                      bytes_accessed=5 * bh * s * d * itemsize),
    )(q3, k3, v3, do3, lse, delta)
    return _restore(dq, q), _restore(dk, k), _restore(dv, v)


def workload({{args}}):
    dq, dk, dv = _attention_backward({{q}}, {{k}}, {{v}}, {{do}})
    grads = {"dq": dq, "dk": dk, "dv": dv}
    return {{returns}}
