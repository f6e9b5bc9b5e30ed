# flash_attention template (maxkernel expert brain)
# matched: {{summary}}
# params: {{params}}
"""Flash attention forward: grid (kv rows..., row block, key block), the key axis last and
"arbitrary"; the running max m, sum l and output accumulator in f32 VMEM scratch (online
softmax); the score function is the reference's own, generated from its jaxpr. Key blocks a
mask kills entirely are skipped: under a static mask (causal, local, global) the grid runs
over the live (row block, key block) pairs only (a schedule in SMEM by scalar prefetch), and
the mask is computed only on the blocks it cuts (elsewhere `_score_live`: the scores with the
mask's selects on the branch they take there); under a mask that reads the inputs (lengths)
the dead blocks are neither copied nor computed. BLOCK_H heads of a head axis per block: the
Q K^T and P V dots batched over them (a key or value shared by the heads: one product over
the heads' rows)."""

import math

import numpy as np
import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BLOCK_Q = {{block_q}}            # rows (query positions x heads of a group) per block
BLOCK_K = {{block_k}}            # keys per block
BLOCK_H = {{block_h}}            # heads (cells of the head axis) per block: batched dots
PV_DTYPE = "{{pv_dtype}}"        # dtype of the P @ V matmul operands (f32 accumulation)
QK_DTYPE = "{{qk_dtype}}"        # of the Q K^T operands: "auto" keeps the reference's
VMEM_LIMIT_BYTES = {{vmem_limit_bytes}}
ROW_SEMANTICS = "{{row_semantics}}"  # of the kv-row and row-block grid axes

{{helpers}}

def _flash(terms, v, tiles, scalars, *, c_sizes, rows, keys, out_shape, out_axes, out_dtype,
           score, score_live, kill, kill_static, kill_c, kill_rows, row_align, head_axis):
    nc = len(c_sizes)
    bq = _fit(BLOCK_Q, rows, row_align)
    bk = _fit(BLOCK_K, keys, 128)
    bh = _fit(BLOCK_H, c_sizes[head_axis], 1) if head_axis >= 0 else 1
    lead = (bh,) if bh > 1 else ()       # a block's leading head dimension
    c_grid = tuple(c // bh if i == head_axis else c for i, c in enumerate(c_sizes))
    nq, nk = rows // bq, keys // bk
    scalar_arrays = [s for s, _ in scalars]
    scalar_c = [c for _, c in scalars]
    n_cells = _prod(c_sizes[i] for i in kill_c)
    tables = None
    # Blocks the mask leaves whole run score_live: the scores without computing the mask.
    cut = score_live is not None and kill_static and kill_rows
    if kill is not None and n_cells * (nq if kill_rows else 1) * nk <= (1 << 17):
        tables = _block_tables(kill, kill_static, kill_c, kill_rows, c_sizes, rows, keys,
                               bq, bk, scalar_arrays, scalar_c, cut=cut)

    def cell(ids):
        flat = 0
        for i in kill_c:
            flat = flat * c_sizes[i] + ids[i]
        return flat

    # The schedule. A static mask that depends on the rows (causal, local windows): one grid
    # axis over the (row block, key block) pairs it leaves alive, so fully masked blocks
    # cost no grid step. A mask that reads the inputs (lengths): the key axis runs over every
    # block, and the dead ones are neither copied (the index map repeats the last live
    # block) nor computed. No mask: every block.
    pairs = tables is not None and kill_static and kill_rows
    if pairs:
        ids_table, counts_table, _, _ = tables[:4]
        s_rows, s_keys, s_flags, n_steps = _pair_schedule(ids_table, counts_table, n_cells,
                                                          nq, nk, tables[4] if cut else None)
        prefetch = [s_rows, s_keys, s_flags]
        grid = c_grid + (n_steps,)

        def pos(ids):
            return cell(ids) * n_steps + ids[nc]

        def row_block(ids, refs):
            return refs[0][pos(ids)]

        def key_block(ids, refs):
            return refs[1][pos(ids)]
    elif tables is not None:
        ids_table, counts_table, n_row_tables, nj = tables[:4]
        prefetch = [ids_table, counts_table]
        grid = c_grid + (nq, nj)

        def row_cell(ids):
            return cell(ids) * n_row_tables + (ids[nc] if kill_rows else 0)

        def row_block(ids, refs):
            return ids[nc]

        def key_block(ids, refs):
            return refs[0][row_cell(ids) * nk + ids[nc + 1]]
    else:
        prefetch = []
        grid = c_grid + (nq, nk)

        def row_block(ids, refs):
            return ids[nc]

        def key_block(ids, refs):
            return ids[nc + 1]
    ngrid = len(grid)
    n_tables = len(prefetch)
    prefetch = prefetch + scalar_arrays

    def spec(array, axes):
        return pl.BlockSpec(_block_shape(array, axes, c_sizes, bq, bk, head_axis, bh),
                            _index_map(axes, c_sizes, ngrid, row_block, key_block))

    operands, in_specs = [], []
    for q, q_axes, _, k, k_axes, _, _, _ in terms:
        operands.append(q)
        in_specs.append(spec(q, q_axes))
    for q, q_axes, _, k, k_axes, _, _, _ in terms:
        operands.append(k)
        in_specs.append(spec(k, k_axes))
    v_array, v_axes, v_pre, v_share = v    # v_share: the term whose K tile is also V
    if v_share < 0:
        operands.append(v_array)
        in_specs.append(spec(v_array, v_axes))
    for t, t_axes in tiles:
        operands.append(t)
        in_specs.append(spec(t, t_axes))
    out_struct = jax.ShapeDtypeStruct(out_shape, jnp.dtype(out_dtype))
    out_block = _block_shape(out_struct, out_axes, c_sizes, bq, bk, head_axis, bh)
    dv = out_block[-1]
    n_terms, n_tiles = len(terms), len(tiles)

    def kernel(*refs):
        pf = refs[:len(prefetch)]
        refs = refs[len(prefetch):]
        q_refs = refs[:n_terms]
        k_refs = refs[n_terms:2 * n_terms]
        n_v = 1 if v_share < 0 else 0
        v_ref = refs[2 * n_terms] if v_share < 0 else k_refs[v_share]
        tile_refs = refs[2 * n_terms + n_v:2 * n_terms + n_v + n_tiles]
        o_ref, m_ref, l_ref, acc_ref = refs[2 * n_terms + n_v + n_tiles:]
        ids = [pl.program_id(i) for i in range(ngrid)]
        whole = None
        if pairs:
            flags = pf[2][pos(ids)]
            first, last, run = (flags & 1) != 0, (flags & 2) != 0, (flags & 4) != 0
            if cut:
                whole = (flags & 8) == 0
        else:
            j = ids[nc + 1]
            first, last = j == 0, j == grid[-1] - 1
            run = j < pf[1][row_cell(ids)] if tables is not None else None

        @pl.when(first)
        def _init():
            m_ref[...] = jnp.full(m_ref.shape, -jnp.inf, jnp.float32)
            l_ref[...] = jnp.zeros(l_ref.shape, jnp.float32)
            acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

        qb, kb = row_block(ids, pf), key_block(ids, pf)

        # Q K^T and P V per head of the block: a batch dimension when it holds several.
        batch = ((0,), (0,)) if lead else ((), ())
        nd = len(lead)

        def step(score):
            s_terms = []
            for t, (_, _, q_pre, _, _, k_pre, dot_dtype, s_dtype) in enumerate(terms):
                dot_dtype = dot_dtype if QK_DTYPE == "auto" else QK_DTYPE
                qv = q_pre(q_refs[t][...], _JaxOps).astype(jnp.dtype(dot_dtype))
                kv = k_pre(k_refs[t][...], _JaxOps).astype(jnp.dtype(dot_dtype))
                if nd and kv.ndim == 2:   # a key shared by the block's heads: one product
                    st = jax.lax.dot_general(qv.reshape(bh * bq, qv.shape[-1]), kv,
                                             (((1,), (1,)), ((), ())),
                                             preferred_element_type=jnp.float32)
                    st = st.reshape(lead + (bq, bk))
                else:
                    st = jax.lax.dot_general(qv, kv, (((nd + 1,), (nd + 1,)), batch),
                                             preferred_element_type=jnp.float32)
                s_terms.append(st.astype(jnp.dtype(s_dtype)))
            ix = _TileIx(ids, qb * bq, kb * bk, bq, bk, c_sizes, tile_refs,
                         pf[n_tables:], scalar_c)
            s = score(s_terms, ix, _JaxOps)
            s = jnp.broadcast_to(jnp.asarray(s).astype(jnp.float32), lead + (bq, bk))
            m_prev = m_ref[...]
            m_next = jnp.maximum(m_prev, jnp.max(s, axis=-1, keepdims=True))
            m_safe = jnp.where(m_next == -jnp.inf, 0.0, m_next)
            p = jnp.exp(s - _lanes(m_safe, bk))
            alpha = jnp.exp(m_prev - m_safe)
            l_ref[...] = alpha * l_ref[...] + jnp.sum(p, axis=-1, keepdims=True)
            m_ref[...] = m_next
            vv = v_pre(v_ref[...], _JaxOps).astype(jnp.dtype(PV_DTYPE))
            if nd and vv.ndim == 2:       # values shared by the block's heads
                pv = jax.lax.dot_general(p.reshape(bh * bq, bk).astype(jnp.dtype(PV_DTYPE)),
                                         vv, (((1,), (0,)), ((), ())),
                                         preferred_element_type=jnp.float32)
                pv = pv.reshape(lead + (bq, dv))
            else:
                pv = jax.lax.dot_general(p.astype(jnp.dtype(PV_DTYPE)), vv,
                                         (((nd + 1,), (nd,)), batch),
                                         preferred_element_type=jnp.float32)
            acc_ref[...] = _lanes(alpha, dv) * acc_ref[...] + pv

        if whole is not None:
            pl.when(run & ~whole)(lambda: step(score))
            pl.when(run & whole)(lambda: step(score_live))
        elif run is None:
            step(score)
        else:
            pl.when(run)(lambda: step(score))

        @pl.when(last)
        def _finish():
            o_ref[...] = (acc_ref[...] / _lanes(l_ref[...], dv)).astype(o_ref.dtype)

    semantics = (ROW_SEMANTICS,) * (ngrid - 1) + ("arbitrary",)
    return pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=len(prefetch),
            grid=grid,
            in_specs=in_specs,
            out_specs=pl.BlockSpec(out_block, _index_map(out_axes, c_sizes, ngrid, row_block,
                                                         key_block)),
            scratch_shapes=[pltpu.VMEM(lead + (bq, 128), jnp.float32),
                            pltpu.VMEM(lead + (bq, 128), jnp.float32),
                            pltpu.VMEM(lead + (bq, dv), jnp.float32)],
        ),
        out_shape=out_struct,
        compiler_params=pltpu.CompilerParams(dimension_semantics=semantics,
                                             vmem_limit_bytes=VMEM_LIMIT_BYTES),
    )(*prefetch, *operands)


# ---- generated from the reference's graph ----
{{generated}}
