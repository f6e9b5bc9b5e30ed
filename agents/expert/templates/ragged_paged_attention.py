# ragged_paged_attention template (maxkernel expert brain)
# matched: {{summary}}
# params: {{params}}
"""Ragged paged attention (a mixed batch of prefill chunks and decodes over a paged KV cache)
without gathering the cache. The page table, the kv lengths, the query bounds (cu_q_lens) and
the schedule are scalar-prefetched into SMEM. A token block visits only the sequences whose
tokens it holds; for each one its KV pages are copied from HBM into VMEM by DMA,
PAGES_PER_BLOCK pages at a time, up to the last key the block's causal rows can see; online
softmax per query row in f32 VMEM scratch, rows of other sequences masked. Tokens of no
active sequence are zero. SCHEDULE "grid": the (token block, sequence) pairs and the kv blocks
are grid axes (static work per step); "loop": a grid of token blocks with loops over the
sequences and kv blocks inside (the next kv block's copies overlap the current one)."""

import numpy as np
import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BLOCK_Q = {{block_q}}                   # query tokens per block
PAGES_PER_BLOCK = {{pages_per_block}}   # pages copied and attended per step
PV_DTYPE = "{{pv_dtype}}"               # dtype of the P @ V matmul operands (f32 accumulation)
SCHEDULE = "{{schedule}}"               # "grid": (token block, sequence) pairs and kv blocks as
                                        # grid axes; "loop": loops over them inside a block
VMEM_LIMIT_BYTES = {{vmem_limit_bytes}}


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


def _ragged_paged(q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs, **kw):
    if SCHEDULE == "grid":
        return _ragged_grid(q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs, **kw)
    return _ragged_loop(q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs, **kw)


def _ragged_grid(q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs, *, scale, stride,
                 k_slot, v_slot, dot_dtype, out_dtype):
    """Grid (kv head, work item, kv block): a work item is one (token block, sequence) pair
    of a schedule built outside (sorted by block, so an output block is revisited only on
    consecutive steps; blocks without an active sequence get one empty item that writes
    zeros); kv blocks past what the item's causal rows see are skipped (copies included).
    Every step's work is static, so its cost is visible."""
    tokens, heads, d = q.shape
    _, page, combined, _ = kv_pages.shape
    kv_heads = combined // stride
    group = heads // kv_heads
    max_seqs, pages_per_seq = page_indices.shape
    row_align = 8 * max(1, 4 // jnp.dtype(q.dtype).itemsize)
    bq = _fit(BLOCK_Q, tokens, row_align)
    ppb = max(1, min(PAGES_PER_BLOCK, pages_per_seq))
    bk = ppb * page
    capacity = pages_per_seq * page
    n_kv = -(-pages_per_seq // ppb)
    n_blocks = tokens // bq
    n_items = n_blocks + max_seqs
    kv = kv_pages.reshape(kv_pages.shape[0], page, kv_heads, stride * d)
    q2 = q.reshape(tokens, heads * d)
    pv_dtype = jnp.dtype(PV_DTYPE)

    # the schedule: per token block, the active sequences holding its tokens
    cu = cu_q_lens.reshape(-1).astype(jnp.int32)
    n_seqs = jnp.clip(num_seqs.reshape(-1)[0].astype(jnp.int32), 0, max_seqs)
    starts = jnp.arange(n_blocks, dtype=jnp.int32) * bq
    first = jnp.searchsorted(cu[1:max_seqs + 1], starts, side="right").astype(jnp.int32)
    last = (jnp.searchsorted(cu[:max_seqs], starts + bq, side="left") - 1).astype(jnp.int32)
    last = jnp.minimum(last, n_seqs - 1)
    count = jnp.maximum(last - first + 1, 0)
    slots = jnp.maximum(count, 1)                  # an empty block still writes its zeros
    ends = jnp.cumsum(slots)
    item = jnp.arange(n_items, dtype=jnp.int32)
    blk = jnp.minimum(jnp.searchsorted(ends, item, side="right"), n_blocks - 1).astype(jnp.int32)
    offset = item - (ends[blk] - slots[blk])
    real = item < ends[-1]
    seq = jnp.where(real & (offset < count[blk]), first[blk] + offset, -1).astype(jnp.int32)
    is_first = (real & (offset == 0)).astype(jnp.int32)
    is_last = (real & (offset == slots[blk] - 1)).astype(jnp.int32)

    def kernel(lens_ref, table_ref, cu_ref, blk_ref, seq_ref, first_ref, last_ref, q_ref,
               kv_hbm, o_ref, kv_buf, sem, m_ref, l_ref, acc_ref):
        g = pl.program_id(0)
        it = pl.program_id(1)
        b = pl.program_id(2)
        s = seq_ref[it]
        blk_start = blk_ref[it] * bq
        rows = blk_start + lax.broadcasted_iota(jnp.int32, (bq, 1), 0)

        @pl.when((first_ref[it] == 1) & (b == 0))
        def _init():
            m_ref[...] = jnp.full(m_ref.shape, -jnp.inf, jnp.float32)
            l_ref[...] = jnp.zeros(l_ref.shape, jnp.float32)
            acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

        sc_ = jnp.maximum(s, 0)
        q_start = cu_ref[sc_]
        q_end = cu_ref[sc_ + 1]
        kv_len = lens_ref[sc_]
        first_pos = kv_len - (q_end - q_start)
        last_row = jnp.minimum(q_end, blk_start + bq) - 1
        need = jnp.clip(first_pos + (last_row - q_start) + 1, 0, capacity)

        @pl.when((s >= 0) & (b * bk < need))
        def _step():
            copies = []
            for p in range(ppb):
                idx = jnp.minimum(b * ppb + p, pages_per_seq - 1)
                pg = table_ref[sc_ * pages_per_seq + idx]
                copies.append(pltpu.make_async_copy(kv_hbm.at[pg, :, g],
                                                    kv_buf.at[pl.ds(p * page, page)], sem.at[0]))
            for c in copies:
                c.start()
            for c in copies:
                c.wait()
            buf = kv_buf[...]
            k = buf[:, k_slot * d:(k_slot + 1) * d].astype(jnp.dtype(dot_dtype))
            v = buf[:, v_slot * d:(v_slot + 1) * d].astype(pv_dtype)
            row_pos = first_pos + (rows - q_start)
            row_in = (rows >= q_start) & (rows < q_end)
            kv_pos = b * bk + lax.broadcasted_iota(jnp.int32, (1, bk), 1)
            mask = row_in & (kv_pos <= row_pos)
            for h in range(group):
                qh = q_ref[:, h * d:(h + 1) * d].astype(jnp.dtype(dot_dtype))
                sc = lax.dot_general(qh, k, (((1,), (1,)), ((), ())),
                                     preferred_element_type=jnp.float32) * scale
                sc = jnp.where(mask, sc, -jnp.inf)
                m_prev = m_ref[h]
                m_next = jnp.maximum(m_prev, jnp.max(sc, axis=1, keepdims=True))
                m_safe = jnp.where(m_next == -jnp.inf, 0.0, m_next)
                pr = jnp.exp(sc - m_safe)
                alpha = jnp.exp(m_prev - m_safe)
                l_ref[h] = alpha * l_ref[h] + jnp.sum(pr, axis=1, keepdims=True)
                m_ref[h] = m_next
                pv = lax.dot_general(pr.astype(pv_dtype), v, (((1,), (0,)), ((), ())),
                                     preferred_element_type=jnp.float32)
                acc_ref[h] = alpha * acc_ref[h] + pv

        @pl.when((last_ref[it] == 1) & (b == n_kv - 1))
        def _finish():
            for h in range(group):
                l = l_ref[h]
                o = jnp.where(l > 0, acc_ref[h] / jnp.where(l > 0, l, 1.0), 0.0)
                o_ref[:, h * d:(h + 1) * d] = o.astype(o_ref.dtype)

    out = pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=7,
            grid=(kv_heads, n_items, n_kv),
            in_specs=[pl.BlockSpec((bq, group * d), lambda g, i, b, *pf: (pf[3][i], g)),
                      pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec((bq, group * d), lambda g, i, b, *pf: (pf[3][i], g)),
            scratch_shapes=[pltpu.VMEM((bk, stride * d), kv.dtype),
                            pltpu.SemaphoreType.DMA((1,)),
                            pltpu.VMEM((group, bq, 1), jnp.float32),
                            pltpu.VMEM((group, bq, 1), jnp.float32),
                            pltpu.VMEM((group, bq, d), jnp.float32)],
        ),
        out_shape=jax.ShapeDtypeStruct((tokens, heads * d), jnp.dtype(out_dtype)),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "arbitrary", "arbitrary"),
            vmem_limit_bytes=VMEM_LIMIT_BYTES),
    )(kv_lens.reshape(-1).astype(jnp.int32), page_indices.reshape(-1).astype(jnp.int32), cu,
      blk, seq, is_first, is_last, q2, kv)
    return out.reshape(tokens, heads, d)


def _ragged_loop(q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs, *, scale, stride,
                 k_slot, v_slot, dot_dtype, out_dtype):
    """q [T, H, D]; kv_pages [pages, page, kv_heads * stride, D] with a head's K at combined
    index stride * g + k_slot and V at stride * g + v_slot; query head h reads kv head
    h // (H / kv_heads)."""
    tokens, heads, d = q.shape
    _, page, combined, _ = kv_pages.shape
    kv_heads = combined // stride
    group = heads // kv_heads
    max_seqs, pages_per_seq = page_indices.shape
    row_align = 8 * max(1, 4 // jnp.dtype(q.dtype).itemsize)
    bq = _fit(BLOCK_Q, tokens, row_align)
    ppb = max(1, min(PAGES_PER_BLOCK, pages_per_seq))
    bk = ppb * page
    capacity = pages_per_seq * page
    # a head's K and V side by side in lanes: a free reshape of the combined-head axis
    kv = kv_pages.reshape(kv_pages.shape[0], page, kv_heads, stride * d)
    q2 = q.reshape(tokens, heads * d)
    pv_dtype = jnp.dtype(PV_DTYPE)

    def kernel(lens_ref, table_ref, cu_ref, ns_ref, q_ref, kv_hbm, o_ref, kv_buf, sem, m_ref,
               l_ref, acc_ref):
        g = pl.program_id(0)
        blk_start = pl.program_id(1) * bq
        blk_end = blk_start + bq
        m_ref[...] = jnp.full(m_ref.shape, -jnp.inf, jnp.float32)
        l_ref[...] = jnp.zeros(l_ref.shape, jnp.float32)
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)
        n_seqs = jnp.clip(ns_ref[0], 0, max_seqs)
        rows = blk_start + lax.broadcasted_iota(jnp.int32, (bq, 1), 0)

        # sequences that end before this block (cu_q_lens is non-decreasing)
        s0 = lax.fori_loop(0, n_seqs,
                           lambda s, c: c + (cu_ref[s + 1] <= blk_start).astype(jnp.int32),
                           jnp.int32(0))

        def copies(s, b, slot):
            out = []
            for p in range(ppb):
                idx = jnp.minimum(b * ppb + p, pages_per_seq - 1)
                pg = table_ref[s * pages_per_seq + idx]
                out.append(pltpu.make_async_copy(kv_hbm.at[pg, :, g],
                                                 kv_buf.at[slot, pl.ds(p * page, page)],
                                                 sem.at[slot]))
            return out

        def seq_cond(s):
            return (s < n_seqs) & (cu_ref[s] < blk_end)

        def seq_body(s):
            q_start = cu_ref[s]
            q_end = cu_ref[s + 1]
            kv_len = lens_ref[s]
            first = kv_len - (q_end - q_start)        # cache position of the first new token
            row_pos = first + (rows - q_start)
            row_in = (rows >= q_start) & (rows < q_end)
            last = jnp.minimum(q_end, blk_end) - 1
            need = jnp.clip(first + (last - q_start) + 1, 0, capacity)
            nblk = (need + bk - 1) // bk

            @pl.when(nblk > 0)
            def _first():
                for c in copies(s, 0, 0):
                    c.start()

            def kv_body(b, carry):
                slot = b % 2

                @pl.when(b + 1 < nblk)
                def _next():
                    for c in copies(s, b + 1, 1 - slot):
                        c.start()

                for c in copies(s, b, slot):
                    c.wait()
                buf = kv_buf[slot]
                k = buf[:, k_slot * d:(k_slot + 1) * d].astype(jnp.dtype(dot_dtype))
                v = buf[:, v_slot * d:(v_slot + 1) * d].astype(pv_dtype)
                kv_pos = b * bk + lax.broadcasted_iota(jnp.int32, (1, bk), 1)
                mask = row_in & (kv_pos <= row_pos)
                for h in range(group):
                    qh = q_ref[:, h * d:(h + 1) * d].astype(jnp.dtype(dot_dtype))
                    sc = lax.dot_general(qh, k, (((1,), (1,)), ((), ())),
                                         preferred_element_type=jnp.float32) * scale
                    sc = jnp.where(mask, sc, -jnp.inf)
                    m_prev = m_ref[h]
                    m_next = jnp.maximum(m_prev, jnp.max(sc, axis=1, keepdims=True))
                    m_safe = jnp.where(m_next == -jnp.inf, 0.0, m_next)
                    p = jnp.exp(sc - m_safe)
                    alpha = jnp.exp(m_prev - m_safe)
                    l_ref[h] = alpha * l_ref[h] + jnp.sum(p, axis=1, keepdims=True)
                    m_ref[h] = m_next
                    pv = lax.dot_general(p.astype(pv_dtype), v, (((1,), (0,)), ((), ())),
                                         preferred_element_type=jnp.float32)
                    acc_ref[h] = alpha * acc_ref[h] + pv
                return carry

            lax.fori_loop(0, nblk, kv_body, 0)
            return s + 1

        lax.while_loop(seq_cond, seq_body, s0)
        for h in range(group):
            l = l_ref[h]
            o = jnp.where(l > 0, acc_ref[h] / jnp.where(l > 0, l, 1.0), 0.0)
            o_ref[:, h * d:(h + 1) * d] = o.astype(o_ref.dtype)

    grid = (kv_heads, tokens // bq)
    out = pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=4,
            grid=grid,
            in_specs=[pl.BlockSpec((bq, group * d), lambda g, i, *_: (i, g)),
                      pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec((bq, group * d), lambda g, i, *_: (i, g)),
            scratch_shapes=[pltpu.VMEM((2, bk, stride * d), kv.dtype),
                            pltpu.SemaphoreType.DMA((2,)),
                            pltpu.VMEM((group, bq, 1), jnp.float32),
                            pltpu.VMEM((group, bq, 1), jnp.float32),
                            pltpu.VMEM((group, bq, d), jnp.float32)],
        ),
        out_shape=jax.ShapeDtypeStruct((tokens, heads * d), jnp.dtype(out_dtype)),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel"),
                                             vmem_limit_bytes=VMEM_LIMIT_BYTES),
    )(kv_lens.reshape(-1).astype(jnp.int32), page_indices.reshape(-1).astype(jnp.int32),
      cu_q_lens.reshape(-1).astype(jnp.int32), num_seqs.reshape(-1).astype(jnp.int32), q2, kv)
    return out.reshape(tokens, heads, d)


# ---- generated from the reference's graph ----
{{generated}}
