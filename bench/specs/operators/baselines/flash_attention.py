"""Expert baseline for flash_attention_causal: JAX's Pallas TPU FlashAttention, unchanged.

Wraps `jax.experimental.pallas.ops.tpu.flash_attention.flash_attention` from JAX 0.10.2
(forward kernel: grid (batch, head, q block, kv major block), online softmax in f32 VMEM
scratch, causal blocks above the diagonal skipped and their DMA redirected). Tuned
parameters: BlockSizes(block_q=2048, block_k_major=2048, block_k=1024, block_b=1), the
published v6e flash/splash setting (block_q 2048, block_kv 2048, block_kv_compute 1024; see
/work/shared/notes/pallas-tpu.md, "Hand-tuned kernels"); the library default is 128 for all.
The backward-pass block sizes are left unset: the benchmark times the forward only.

Adaptation: sm_scale = 1/sqrt(head_dim) is passed to the kernel (it scales q@k^T inside).
The library requires block_k_major and block_k to divide the kv length; at reduced test
sizes each block shrinks to the largest aligned divisor of the actual length.
"""

import math

from jax.experimental.pallas.ops.tpu import flash_attention as fa

BLOCK_Q, BLOCK_K_MAJOR, BLOCK_K, BLOCK_B = 2048, 2048, 1024, 1


def _block(target: int, dim: int, align: int) -> int:
    """The largest multiple of align <= target dividing dim; dim itself when none does."""
    b = min(target, dim) // align * align
    while b >= align:
        if dim % b == 0:
            return b
        b -= align
    return dim


def workload(q, k, v):
    # q, k, v: [batch, heads, seq, head_dim], the library's own layout
    batch, _, q_len, head_dim = q.shape
    kv_len = k.shape[2]
    block_k_major = _block(BLOCK_K_MAJOR, kv_len, 128)
    block_sizes = fa.BlockSizes(
        block_q=_block(BLOCK_Q, q_len, 8),
        block_k_major=block_k_major,
        block_k=_block(BLOCK_K, block_k_major, 128),
        block_b=min(BLOCK_B, batch),
    )
    return fa.flash_attention(q, k, v, causal=True, sm_scale=1.0 / math.sqrt(head_dim),
                              block_sizes=block_sizes)
