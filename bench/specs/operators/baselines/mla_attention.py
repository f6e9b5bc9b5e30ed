"""Expert baseline for mla_attention: DeepSeek-V3 MLA prefill with splash attention as its core.

JAX 0.10.2 ships no MLA kernel. The public TPU implementations (MaxText's MLA layer) keep
the low-rank projections, RMSNorms and RoPE in XLA and run the attention core through the
Pallas flash/splash kernel over the concatenated [nope | rope] query/key head dim, the
shared RoPE key broadcast to every head. This file does the same with the library kernel
itself rather than a rewrite: `jax.experimental.pallas.ops.tpu.splash_attention`
(`make_splash_mha_single_device`, a `MultiHeadMask` of `CausalMask`s), which accepts a v
head dim (128) different from the q/k head dim (128 + 64 = 192), so no padding of v is needed.

Tuned parameters: BlockSizes(block_q=2048, block_kv=2048, block_kv_compute=1024), the
published v6e splash setting (see /work/shared/notes/pallas-tpu.md, "Hand-tuned kernels");
at S 2048 one q block spans the sequence and the causal kv loop stops at the diagonal.
Backward block sizes unset: the benchmark times the forward only.

Adaptations: the projections, norms and RoPE are the spec's own XLA code (same math, same
dtypes). Splash applies no softmax scale, so q is multiplied by 1/sqrt(nope + rope) first
(f32, rounded to bf16), as MaxText does. Splash works on one batch element; MaxText vmaps
it, but JAX 0.10.2's TPU interpret mode cannot run a vmapped pallas_call that sets
dimension_semantics (safe_zip length error), so batch and heads are folded into one head
axis [B*H, S, D], the grid vmap would give. The layout changes around the kernel
([B, S, H, D] <-> [B*H, S, D], the k_pe broadcast, the nope|rope concatenation) are XLA
copies and are priced. Block sizes shrink to the largest 128-multiple dividing the sequence
at reduced test sizes.
"""

import math

import jax
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


def _rms_norm(x, weight, eps=1e-6):
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (y * weight.astype(jnp.float32)).astype(x.dtype)


def _rotary(x, theta=10000.0):
    """Rotate-half RoPE over positions 0..S-1; x is [batch, seq, ..., rope_dim]."""
    seq_len, dim = x.shape[1], x.shape[-1]
    inv_freq = 1.0 / theta ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim)
    angles = jnp.arange(seq_len, dtype=jnp.float32)[:, None] * inv_freq[None, :]
    angles = jnp.concatenate([angles, angles], axis=-1)
    shape = (1, seq_len) + (1,) * (x.ndim - 3) + (dim,)
    cos, sin = jnp.cos(angles).reshape(shape), jnp.sin(angles).reshape(shape)
    x32 = x.astype(jnp.float32)
    x1, x2 = jnp.split(x32, 2, axis=-1)
    return (x32 * cos + jnp.concatenate([-x2, x1], axis=-1) * sin).astype(x.dtype)


def _attention(q, k, v):
    """Causal splash attention; q, k [B, S, H, Dqk], v [B, S, H, Dv] -> [B, S, H, Dv]."""
    batch, seq_len, heads, head_dim = q.shape
    block_kv = _block(BLOCK_KV, seq_len, 128)
    block_sizes = splash.BlockSizes(
        block_q=_block(BLOCK_Q, seq_len, 128),
        block_kv=block_kv,
        block_kv_compute=_block(BLOCK_KV_COMPUTE, block_kv, 128),
    )
    mask = mask_lib.MultiHeadMask([mask_lib.CausalMask((seq_len, seq_len))] * (batch * heads))
    kernel = splash.make_splash_mha_single_device(mask, block_sizes=block_sizes)

    def heads_major(t):   # [B, S, H, D] -> [B*H, S, D]
        return t.transpose(0, 2, 1, 3).reshape(batch * heads, seq_len, t.shape[-1])

    q = (q.astype(jnp.float32) * (1.0 / math.sqrt(head_dim))).astype(q.dtype)
    out = kernel(heads_major(q), heads_major(k), heads_major(v))
    return out.reshape(batch, heads, seq_len, -1).transpose(0, 2, 1, 3)


def workload(x, w_dq, q_norm, w_uq, w_qr, w_dkv, kv_norm, w_kr, w_uk, w_uv, w_o):
    heads = w_uq.shape[1]
    # queries: down-projection, norm, up-projection into no-RoPE and RoPE parts
    c_q = _rms_norm(x @ w_dq, q_norm)
    q_nope = jnp.einsum("bsc,chd->bshd", c_q, w_uq)
    q_pe = _rotary(jnp.einsum("bsc,chr->bshr", c_q, w_qr))
    # keys/values: a compressed latent per token plus one RoPE key shared by all heads
    c_kv = _rms_norm(x @ w_dkv, kv_norm)
    k_pe = _rotary(x @ w_kr)
    k_nope = jnp.einsum("bsc,chd->bshd", c_kv, w_uk)
    v = jnp.einsum("bsc,chd->bshd", c_kv, w_uv)
    q = jnp.concatenate([q_nope, q_pe], axis=-1)
    k_pe = jnp.broadcast_to(k_pe[:, :, None, :], k_pe.shape[:2] + (heads, k_pe.shape[-1]))
    k = jnp.concatenate([k_nope, k_pe], axis=-1)
    out = _attention(q, k, v)
    return jnp.einsum("bqhd,hde->bqe", out, w_o)
