{{header}}
# Decay-weighted linear attention (RetNet retention, parallel form) as a chunked pass over
# the keys: grid (batch dims..., query chunks, key chunks) with the key axis last
# ("arbitrary"). Each step computes the scores q k^T of one [bq, bk] tile on the MXU, turns
# them into weights with code generated from the reference (decay from indices, scaling,
# masks), and accumulates weights @ v in VMEM scratch; row statistics the reference
# normalises by (sum |w| ...) are streamed in scratch as well and applied once at the end.
# The decay is never materialised in HBM: only its row reductions, if the reference has
# any, are computed outside the kernel (one fused XLA reduction). Causal: key chunks past
# the diagonal hold zero weights and are skipped, their copies avoided.
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

PARAMS = {{params}}
NB = {{num_batch}}                # batch axes of the score tile (squeezed in the kernel)
Q_PERM = {{q_perm}}               # q's dims -> (batch..., seq, head_dim)
K_PERM = {{k_perm}}
V_PERM = {{v_perm}}
OUT_PERM = {{out_perm}}           # kernel output (batch..., seq, dv) dims -> reference dims
ROW_SCALE = {{row_scale}}         # None, "mul" or "div": how the row statistic is applied
CAUSAL_SKIP = {{causal_skip}}
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


def _permute(x, perm):
    return x if list(perm) == list(range(x.ndim)) else jnp.transpose(x, perm)


# ---- replayed from the reference: index-only row reductions (outside the kernel) ----
{{seed_code}}

# ---- generated from the reference: the weights of one tile ----
{{weights_code}}

# ---- generated from the reference: the streamed row statistic ----
{{stat_code}}


def _kernel(*refs, num_seeds, num_extras, num_accs, bq, bk, extents, qk, pv):
    q_ref, k_ref, v_ref = refs[:3]
    seed_refs = refs[3:3 + num_seeds]
    extra_refs = refs[3 + num_seeds:3 + num_seeds + num_extras]
    o_ref = refs[3 + num_seeds + num_extras]
    acc_ref = refs[4 + num_seeds + num_extras]
    acc_stat_refs = refs[5 + num_seeds + num_extras:]
    ids = [pl.program_id(i) for i in range(NB + 2)]
    qi, ki = ids[NB], ids[NB + 1]
    offsets = tuple(ids[:NB]) + (qi * bq, ki * bk)
    row_shape = (bq, 1)

    @pl.when(ki == 0)
    def _init():
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)
        if ROW_SCALE is not None:
            for r, a in zip(acc_stat_refs, row_stat_init(row_shape)):
                r[...] = a

    def _step():
        s = jax.lax.dot_general(q_ref[...].astype(qk), k_ref[...].astype(qk),
                                (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
        if PARAMS["qk_scale"] != 1.0:   # factors the reference puts on q or k
            s = s * PARAMS["qk_scale"]
        seeds = [s] + [r[...] for r in seed_refs]
        extras = [r[...] for r in extra_refs]
        w = weights(seeds, extras, offsets, extents)[0]
        acc_ref[...] += jax.lax.dot_general(
            w.astype(pv), v_ref[...].astype(pv), (((1,), (0,)), ((), ())),
            preferred_element_type=jnp.float32)
        if ROW_SCALE is not None:
            accs = row_stat_step([r[...] for r in acc_stat_refs], seeds, extras, offsets, extents)
            for r, a in zip(acc_stat_refs, accs):
                r[...] = a

    if CAUSAL_SKIP:
        pl.when(ki * bk <= qi * bq + bq - 1)(_step)
    else:
        _step()

    @pl.when(ki == pl.num_programs(NB + 1) - 1)
    def _final():
        out = acc_ref[...]
        if ROW_SCALE is not None:
            extras = [r[...] for r in extra_refs]
            stat = row_stat_final([r[...] for r in acc_stat_refs], extras, offsets, extents,
                                  row_shape)[0]
            out = out / stat if ROW_SCALE == "div" else out * stat
        if PARAMS["out_scale"] != 1.0:
            out = out * PARAMS["out_scale"]
        o_ref[...] = out.astype(o_ref.dtype)


def _retention({{args}}):
    q = _permute({{q}}, Q_PERM)
    k = _permute({{k}}, K_PERM)
    v = _permute({{v}}, V_PERM)
    batch = q.shape[:NB]
    sq, d = q.shape[NB], q.shape[NB + 1]
    sk, dv = k.shape[NB], v.shape[NB + 1]
    bq = _block(sq, PARAMS["block_q"], 128)
    bk = _block(sk, PARAMS["block_k"], 128)
    nq, nk = sq // bq, sk // bk
    qk = jnp.dtype(PARAMS["qk_dtype"])
    pv = jnp.dtype(PARAMS["pv_dtype"])
    extents = tuple(batch) + (sq, sk)
    grid = tuple(batch) + (nq, nk)
    squeezed = (None,) * NB

    def batch_ids(ids):
        return tuple(ids[:NB])

    if CAUSAL_SKIP:
        def key_block(i, j):
            return jnp.minimum(j, (i * bq + bq - 1) // bk)
    else:
        def key_block(i, j):
            return j

    in_specs = [
        pl.BlockSpec(squeezed + (bq, d), lambda *ids: batch_ids(ids) + (ids[NB], 0)),
        pl.BlockSpec(squeezed + (bk, d),
                     lambda *ids: batch_ids(ids) + (key_block(ids[NB], ids[NB + 1]), 0)),
        pl.BlockSpec(squeezed + (bk, dv),
                     lambda *ids: batch_ids(ids) + (key_block(ids[NB], ids[NB + 1]), 0)),
    ]
    operands = [q, k, v]
    # Row seeds: index-only reductions computed once at full size (XLA fuses them).
    seeds = row_seeds(q, k, v)
    for arr, present in zip(seeds, SEED_PRESENT):
        operands.append(arr)
        in_specs.append(_space_spec(present, bq, bk, key_block))
    extras = [{{extras}}]
    for arr, (shape_fn, present) in zip(extras, EXTRA_LAYOUT):
        operands.append(arr.reshape(shape_fn(q, k, v)))
        in_specs.append(_space_spec(present, bq, bk, key_block))
    num_accs = len(ACC_DTYPES) if ROW_SCALE is not None else 0
    scratch = [pltpu.VMEM((bq, dv), jnp.float32)]
    scratch += [pltpu.VMEM((bq, 1), jnp.dtype(t)) for t in (ACC_DTYPES if num_accs else [])]
    pairs = 1
    for b in batch:
        pairs *= b
    pairs *= sq * sk // (2 if CAUSAL_SKIP else 1)
    out = pl.pallas_call(
        functools.partial(_kernel, num_seeds=len(seeds), num_extras=len(extras),
                          num_accs=num_accs, bq=bq, bk=bk, extents=extents, qk=qk, pv=pv),
        grid=grid,
        in_specs=in_specs,
        out_specs=pl.BlockSpec(squeezed + (bq, dv), lambda *ids: batch_ids(ids) + (ids[NB], 0)),
        out_shape=jax.ShapeDtypeStruct(tuple(batch) + (sq, dv), OUT_DTYPE),
        scratch_shapes=scratch,
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=tuple(PARAMS["dimension_semantics"])[:1] * NB
            + tuple(PARAMS["dimension_semantics"])[1:] + ("arbitrary",),
            vmem_limit_bytes=int(PARAMS["vmem_limit_bytes"])),
        cost_estimate=pl.CostEstimate(
            flops=2 * pairs * (d + dv), transcendentals=pairs,
            bytes_accessed=q.size * q.dtype.itemsize * (1 + nk) + v.size * v.dtype.itemsize * nq),
    )(*operands)
    return _permute(out, OUT_PERM)


def _space_spec(present, bq, bk, key_block):
    """BlockSpec of an array in space form (batch axes..., rows, cols)."""
    block = tuple(None for _ in range(NB)) + ((bq if present[NB] else 1),
                                              (bk if present[NB + 1] else 1))

    def index(*ids):
        b = tuple(ids[a] if present[a] else 0 for a in range(NB))
        i = ids[NB] if present[NB] else 0
        j = key_block(ids[NB], ids[NB + 1]) if present[NB + 1] else 0
        return b + (i, j)

    return pl.BlockSpec(block, index)


SEED_PRESENT = {{seed_present}}
EXTRA_LAYOUT = {{extra_layout}}
ACC_DTYPES = {{acc_dtypes}}


def workload({{args}}):
    return _retention({{args}})
