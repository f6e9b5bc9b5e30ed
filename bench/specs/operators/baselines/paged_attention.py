"""Expert baseline for paged_attention_decode: JAX's Pallas TPU paged attention, unchanged.

Wraps `jax.experimental.pallas.ops.tpu.paged_attention.paged_attention` from JAX 0.10.2
(one decode query per sequence, grouped-query heads served per kv head; K/V pages gathered
from HBM by manual double-buffered DMAs driven by the scalar-prefetched page table).
Tuned parameters: pages_per_compute_block = 128, the published v6e setting (see
/work/shared/notes/pallas-tpu.md, "Hand-tuned kernels"); megacore_mode None (v6e has one
TensorCore per chip); inline_seq_dim True (the library default).

Adaptation: the kernel applies no softmax scale, so q is multiplied by 1/sqrt(head_dim)
before the call (in f32, rounded back to q's dtype), as the library's own callers do.
pages_per_compute_block must divide pages_per_sequence: at reduced test sizes it shrinks
to the largest divisor of the actual page count.
"""

import math

import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention

PAGES_PER_COMPUTE_BLOCK = 128


def _divisor(target: int, dim: int) -> int:
    """The largest divisor of dim that is <= target."""
    b = min(target, dim)
    while dim % b:
        b -= 1
    return b


def workload(q, k_pages, v_pages, lengths, page_indices):
    # q [seqs, q_heads, head_dim]; k_pages, v_pages [kv_heads, total_pages, page_size, head_dim];
    # lengths i32[seqs]; page_indices i32[seqs, pages_per_seq]
    head_dim = q.shape[-1]
    scaled_q = (q.astype(jnp.float32) * (1.0 / math.sqrt(head_dim))).astype(q.dtype)
    return paged_attention(
        scaled_q, k_pages, v_pages, lengths, page_indices,
        pages_per_compute_block=_divisor(PAGES_PER_COMPUTE_BLOCK, page_indices.shape[1]),
    )
