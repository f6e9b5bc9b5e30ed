"""Expert baseline for ragged_paged_attention: JAX's Pallas TPU ragged paged attention.

Wraps `jax.experimental.pallas.ops.tpu.ragged_paged_attention.ragged_paged_attention`
(module ragged_paged_attention/kernel.py) from JAX 0.10.2, unchanged: mixed decode and
chunked-prefill queries packed along one token axis, K/V pages DMA'd from HBM by the
scalar-prefetched page table, double-buffered, causal within each sequence.

Tuned parameters: num_kv_pages_per_block = 64, num_queries_per_block = 64, the published
v6e setting (see /work/shared/notes/pallas-tpu.md, "Hand-tuned kernels"). They are passed
explicitly: left unset, the library looks them up with get_tuned_block_sizes, which asks
jax.devices() for the TPU generation (a CPU here: it raises). Its v6e table has no entry for
this geometry (64 query / 8 kv heads per block), where it would fall back to (128, 32).
vmem_limit_bytes is left at the library default (the blocks need about 16 MiB of VMEM).

Adaptations: sm_scale = 1/sqrt(head_dim) is passed to the kernel. At reduced test sizes the
blocks are clamped to the page table width and the token count.
"""

import math

from jax.experimental.pallas.ops.tpu.ragged_paged_attention import kernel as rpa

KV_PAGES_PER_BLOCK, QUERIES_PER_BLOCK = 64, 64


def workload(q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs):
    # q [tokens, q_heads, head_dim]; kv_pages [pages, page_size, 2*kv_heads, head_dim] (K even,
    # V odd); kv_lens, cu_q_lens, page_indices, num_seqs: i32 tables as in the library
    return rpa.ragged_paged_attention(
        q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs,
        sm_scale=1.0 / math.sqrt(q.shape[-1]),
        num_kv_pages_per_block=min(KV_PAGES_PER_BLOCK, page_indices.shape[1]),
        num_queries_per_block=min(QUERIES_PER_BLOCK, q.shape[0]),
    )
