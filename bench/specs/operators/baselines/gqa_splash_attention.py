"""Expert baseline for gqa_attention: JAX's Pallas TPU splash attention, unchanged.

Wraps `jax.experimental.pallas.ops.tpu.splash_attention` from JAX 0.10.2:
`make_splash_mha_single_device` with a `MultiHeadMask` of `CausalMask`s (one per query
head). Splash's multi-head kernel takes k/v with fewer heads than q and serves
q_heads // kv_heads query heads from each kv head, which is grouped-query attention
without repeating k/v. The causal mask is block-sparse: blocks above the diagonal are
skipped, the diagonal blocks compute the mask in-kernel (CausalMask is computable).
Tuned parameters: BlockSizes(block_q=2048, block_kv=2048, block_kv_compute=1024), the
published v6e splash setting (see /work/shared/notes/pallas-tpu.md, "Hand-tuned kernels");
the library default is 128 for all. Backward block sizes unset: the benchmark times the
forward only.

Adaptations: splash applies no softmax scale, so q is multiplied by 1/sqrt(head_dim) first
(f32, rounded to q's dtype), as MaxText does. Splash works on one batch element
([heads, seq, head_dim]); MaxText vmaps it over the batch, but JAX 0.10.2's TPU interpret
mode cannot run a vmapped pallas_call that sets dimension_semantics (the vmapped grid axis
is missing from its semantics: safe_zip length error), so the batch is folded into the
heads instead: q [B*Hq, S, D], k/v [B*Hkv, S, D] (free reshapes). Query head b*Hq + h then
reads kv head (b*Hq + h) // (Hq/Hkv) = b*Hkv + h // (Hq/Hkv), the same pairing, and the grid
is the one vmap would give (B*Hq, q blocks, kv blocks). Block sizes shrink to the largest
128-multiple dividing the sequence at reduced test sizes.
"""

import math

import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as mask_lib

BLOCK_Q, BLOCK_KV, BLOCK_KV_COMPUTE = 2048, 2048, 1024


def _block(target: int, dim: int, align: int) -> int:
    """The largest multiple of align <= target dividing dim; dim itself when none does."""
    b = min(target, dim) // align * align
    while b >= align:
        if dim % b == 0:
            return b
        b -= align
    return dim


def workload(q, k, v):
    # q [batch, q_heads, seq, head_dim]; k, v [batch, kv_heads, seq, head_dim]
    batch, q_heads, q_len, head_dim = q.shape
    kv_heads, kv_len = k.shape[1], k.shape[2]
    block_kv = _block(BLOCK_KV, kv_len, 128)
    block_sizes = splash.BlockSizes(
        block_q=_block(BLOCK_Q, q_len, 128),
        block_kv=block_kv,
        block_kv_compute=_block(BLOCK_KV_COMPUTE, block_kv, 128),
    )
    mask = mask_lib.MultiHeadMask([mask_lib.CausalMask((q_len, kv_len))] * (batch * q_heads))
    kernel = splash.make_splash_mha_single_device(mask, block_sizes=block_sizes)
    scaled_q = (q.astype(jnp.float32) * (1.0 / math.sqrt(head_dim))).astype(q.dtype)
    out = kernel(scaled_q.reshape(batch * q_heads, q_len, head_dim),
                 k.reshape(batch * kv_heads, kv_len, head_dim),
                 v.reshape(batch * kv_heads, kv_len, v.shape[-1]))
    return out.reshape(batch, q_heads, q_len, out.shape[-1])
