# paged_attention template (maxkernel expert brain)
# matched: {{summary}}
# params: {{params}}
"""Attention over a paged KV cache without gathering it: grid (kv rows..., row block, key
block); the page tables (and lengths) are scalar-prefetched into SMEM; each step copies its
block of pages from HBM into one of two VMEM slots by DMA while the previous block's copies
are consumed (double buffering along the key axis), for each of the block's heads (BLOCK_H
kv heads per step: batched dots, fewer grid steps); online softmax in f32 VMEM scratch; key
blocks the mask kills (past a sequence's length) are neither copied nor computed. The score
function and the mask are the reference's own, generated from its jaxpr."""

import math

import numpy as np
import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

PAGES_PER_BLOCK = {{pages_per_block}}   # pages copied and attended per grid step
BLOCK_H = {{block_h}}                   # kv heads per grid step
BLOCK_Q = {{block_q}}                   # query rows per block
PV_DTYPE = "{{pv_dtype}}"               # dtype of the P @ V matmul operands (f32 accumulation)
VMEM_LIMIT_BYTES = {{vmem_limit_bytes}}
ROW_SEMANTICS = "{{row_semantics}}"     # of the kv-row and row-block grid axes

{{helpers}}

def _pool_index(desc, ids, page, head_axis=-1, head=None):
    idx = []
    for ax in desc:
        if ax[0] == "c":
            idx.append(head if ax[1] == head_axis else ids[ax[1]])
        elif ax[0] == "page":
            idx.append(page)
        else:
            idx.append(0)
    return tuple(idx)


def _paged(q, k, v, tiles, scalars, *, c_sizes, rows, keys, page, out_shape, out_axes,
           out_dtype, dot_dtype, s_dtype, score, kill, kill_static, kill_c, kill_rows,
           row_align, head_axis):
    q_array, q_axes, q_pre = q
    k_pool, k_desc, k_table, k_table_c, k_pre = k
    v_pool, v_desc, v_table, v_table_c, v_pre = v
    nc = len(c_sizes)
    slots = keys // page                       # page slots per sequence
    ppb = _fit(PAGES_PER_BLOCK, slots, 1)
    bk = ppb * page
    bq = _fit(BLOCK_Q, rows, row_align)
    nq, nk = rows // bq, keys // bk
    bh = _fit(BLOCK_H, c_sizes[head_axis], 1) if head_axis >= 0 else 1
    lead = (bh,) if bh > 1 else ()       # a block's leading head dimension
    nd = len(lead)
    batch = ((0,), (0,)) if lead else ((), ())
    scalar_arrays = [s for s, _ in scalars]
    scalar_c = [c for _, c in scalars]
    tables = None
    if kill is not None:
        cells = _prod(c_sizes[i] for i in kill_c) * (nq if kill_rows else 1) * nk
        if cells <= (1 << 17):
            tables = _block_tables(kill, kill_static, kill_c, kill_rows, c_sizes, rows, keys,
                                   bq, bk, scalar_arrays, scalar_c)
    prefetch = [k_table, v_table]
    if tables is not None:
        ids_table, counts_table, n_row_tables, nj = tables
        prefetch += [ids_table, counts_table]
    else:
        nj = nk
    n_fixed = len(prefetch)
    prefetch += scalar_arrays

    def cell(ids):
        flat = 0
        for i in kill_c:
            flat = flat * c_sizes[i] + ids[i]
        return flat * n_row_tables + (ids[nc] if kill_rows else 0)

    def table_row(ids, table_c):
        flat = 0
        for i in table_c:
            flat = flat * c_sizes[i] + ids[i]
        return flat * slots

    def no_key_block(ids, refs):
        return 0

    def row_block(ids, refs):
        return ids[nc]

    def key_block(ids, refs):
        if tables is None:
            return ids[nc + 1]
        return refs[2][cell(ids) * nk + ids[nc + 1]]

    q_spec = pl.BlockSpec(_block_shape(q_array, q_axes, c_sizes, bq, bk, head_axis, bh),
                          _index_map(q_axes, c_sizes, nc + 2, row_block, no_key_block))
    tile_specs = [pl.BlockSpec(_block_shape(t, t_axes, c_sizes, bq, bk, head_axis, bh),
                               _index_map(t_axes, c_sizes, nc + 2, row_block, key_block))
                  for t, t_axes in tiles]
    out_struct = jax.ShapeDtypeStruct(out_shape, jnp.dtype(out_dtype))
    out_block = _block_shape(out_struct, out_axes, c_sizes, bq, bk, head_axis, bh)
    dv = out_block[-1]
    d = k_pool.shape[-1]
    n_tiles = len(tiles)

    def kernel(*refs):
        pf = refs[:len(prefetch)]
        refs = refs[len(prefetch):]
        q_ref, k_hbm, v_hbm = refs[:3]
        tile_refs = refs[3:3 + n_tiles]
        o_ref, k_buf, v_buf, sem, m_ref, l_ref, acc_ref = refs[3 + n_tiles:]
        ids = [pl.program_id(i) for i in range(nc + 2)]
        j = ids[nc + 1]
        count = pf[3][cell(ids)] if tables is not None else nk

        def block_id(jj):
            return pf[2][cell(ids) * nk + jj] if tables is not None else jj

        def copies(jj, slot):
            blk = block_id(jj)
            out = []
            k_row, v_row = table_row(ids, k_table_c), table_row(ids, v_table_c)
            for h in range(bh):
                head = ids[head_axis] * bh + h if head_axis >= 0 else None
                at = (slot, h) if lead else (slot,)
                for i in range(ppb):
                    k_page = pf[0][k_row + blk * ppb + i]
                    v_page = pf[1][v_row + blk * ppb + i]
                    out.append(pltpu.make_async_copy(
                        k_hbm.at[_pool_index(k_desc, ids, k_page, head_axis, head)],
                        k_buf.at[at + (pl.ds(i * page, page),)], sem.at[0, slot]))
                    out.append(pltpu.make_async_copy(
                        v_hbm.at[_pool_index(v_desc, ids, v_page, head_axis, head)],
                        v_buf.at[at + (pl.ds(i * page, page),)], sem.at[1, slot]))
            return out

        @pl.when(j == 0)
        def _init():
            m_ref[...] = jnp.full(m_ref.shape, -jnp.inf, jnp.float32)
            l_ref[...] = jnp.zeros(l_ref.shape, jnp.float32)
            acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

        @pl.when((j == 0) & (count > 0))
        def _first():
            for c in copies(0, 0):
                c.start()

        slot = j % 2

        @pl.when(j + 1 < count)
        def _prefetch_next():
            for c in copies(j + 1, 1 - slot):
                c.start()

        @pl.when(j < count)
        def _step():
            for c in copies(j, slot):
                c.wait()
            qv = q_pre(q_ref[...], _JaxOps).astype(jnp.dtype(dot_dtype))
            kv = k_pre(k_buf[slot], _JaxOps).astype(jnp.dtype(dot_dtype))
            st = jax.lax.dot_general(qv, kv, (((nd + 1,), (nd + 1,)), batch),
                                     preferred_element_type=jnp.float32)
            ix = _TileIx(ids, ids[nc] * bq, block_id(j) * bk, bq, bk, c_sizes, tile_refs,
                         pf[n_fixed:], scalar_c)
            s = score([st.astype(jnp.dtype(s_dtype))], ix, _JaxOps)
            s = jnp.broadcast_to(jnp.asarray(s).astype(jnp.float32), lead + (bq, bk))
            m_prev = m_ref[...]
            m_next = jnp.maximum(m_prev, jnp.max(s, axis=-1, keepdims=True))
            m_safe = jnp.where(m_next == -jnp.inf, 0.0, m_next)
            p = jnp.exp(s - _lanes(m_safe, bk))
            alpha = jnp.exp(m_prev - m_safe)
            l_ref[...] = alpha * l_ref[...] + jnp.sum(p, axis=-1, keepdims=True)
            m_ref[...] = m_next
            vv = v_pre(v_buf[slot], _JaxOps).astype(jnp.dtype(PV_DTYPE))
            pv = jax.lax.dot_general(p.astype(jnp.dtype(PV_DTYPE)), vv,
                                     (((nd + 1,), (nd,)), batch),
                                     preferred_element_type=jnp.float32)
            acc_ref[...] = _lanes(alpha, dv) * acc_ref[...] + pv

        @pl.when(j == nj - 1)
        def _finish():
            o_ref[...] = (acc_ref[...] / _lanes(l_ref[...], dv)).astype(o_ref.dtype)

    grid = tuple(c // bh if i == head_axis else c for i, c in enumerate(c_sizes)) + (nq, nj)
    semantics = (ROW_SEMANTICS,) * (nc + 1) + ("arbitrary",)
    return pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=len(prefetch),
            grid=grid,
            in_specs=[q_spec, pl.BlockSpec(memory_space=pl.ANY),
                      pl.BlockSpec(memory_space=pl.ANY)] + tile_specs,
            out_specs=pl.BlockSpec(out_block, _index_map(out_axes, c_sizes, nc + 2, row_block,
                                                         no_key_block)),
            scratch_shapes=[pltpu.VMEM((2,) + lead + (bk, d), k_pool.dtype),
                            pltpu.VMEM((2,) + lead + (bk, v_pool.shape[-1]), v_pool.dtype),
                            pltpu.SemaphoreType.DMA((2, 2)),
                            pltpu.VMEM(lead + (bq, 128), jnp.float32),
                            pltpu.VMEM(lead + (bq, 128), jnp.float32),
                            pltpu.VMEM(lead + (bq, dv), jnp.float32)],
        ),
        out_shape=out_struct,
        compiler_params=pltpu.CompilerParams(dimension_semantics=semantics,
                                             vmem_limit_bytes=VMEM_LIMIT_BYTES),
    )(*prefetch, q_array, k_pool, v_pool, *[t for t, _ in tiles])


# ---- generated from the reference's graph ----
{{generated}}
