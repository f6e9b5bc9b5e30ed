"""Expert baseline for splash_attention_local_global: JAX's Pallas TPU splash attention.

Wraps `jax.experimental.pallas.ops.tpu.splash_attention` from JAX 0.10.2:
`make_splash_mha_single_device` over a `MultiHeadMask` (one mask per query head). The
multi-head kernel takes k/v with fewer heads than q and serves q_heads // kv_heads query
heads from each kv head (grouped-query attention without repeating k/v). Splash skips the
blocks the mask leaves empty and computes the partial ones' mask in-kernel.

Mask: causal & (q - k < S/4 | k < S/32), the spec's sliding window plus global "sink"
tokens. Splash's own LocalMask covers only the window, and or-ing it with a NumpyMask would
make the mask non-computable, so the kernel would DMA a bool block of block_q x block_kv
(4 MiB at the tuned sizes) for every partial block. The mask is therefore written as a
computable mask (a subclass of splash's `_ComputableMask`, the base of its CausalMask /
LocalMask / ChunkedCausalMask), the extension point splash provides: its mask_function runs
in numpy to classify blocks and in-kernel on the partial blocks.

Tuned parameters: BlockSizes(block_q=2048, block_kv=2048, block_kv_compute=1024), the
published v6e splash setting (see /work/shared/notes/pallas-tpu.md, "Hand-tuned kernels");
the library default is 128 for all. (At S 4096 these blocks leave one of the four blocks
per head empty; smaller blocks would skip more of this sparse mask, but the baseline keeps
the published tuning.) Backward block sizes unset: the benchmark times the forward only.

Adaptations: splash applies no softmax scale, so q is multiplied by 1/sqrt(head_dim) first
(f32, rounded to q's dtype), as MaxText does. Splash works on one batch element; MaxText
vmaps it over the batch, but JAX 0.10.2's TPU interpret mode cannot run a vmapped
pallas_call that sets dimension_semantics (the vmapped grid axis is missing from its
semantics: safe_zip length error), so the batch is folded into the heads instead:
q [B*Hq, S, D], k/v [B*Hkv, S, D] (free reshapes); query head b*Hq + h then reads kv head
b*Hkv + h // (Hq/Hkv), the same pairing, with the grid vmap would give. Block sizes shrink
to the largest 128-multiple dividing the sequence at reduced test sizes.
"""

import math

import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as mask_lib

BLOCK_Q, BLOCK_KV, BLOCK_KV_COMPUTE = 2048, 2048, 1024


class LocalGlobalMask(mask_lib._ComputableMask):
    """causal & (q - k < window | k < num_global), computable in numpy and in-kernel."""

    def __init__(self, shape: tuple[int, int], window: int, num_global: int):
        self.window, self.num_global = window, num_global

        def local_global(q_ids, kv_ids):
            return (kv_ids <= q_ids) & ((q_ids - kv_ids < window) | (kv_ids < num_global))

        super().__init__(shape=shape, mask_function=local_global)

    def __eq__(self, other):
        if not isinstance(other, type(self)):
            return NotImplemented
        return (self.shape == other.shape and self.window == other.window
                and self.num_global == other.num_global
                and np.array_equal(self.q_sequence, other.q_sequence))

    def __hash__(self):
        return hash((type(self), self.shape, self.window, self.num_global,
                     self.q_sequence.tobytes()))


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
    batch, q_heads, seq_len, head_dim = q.shape
    kv_heads = k.shape[1]
    block_kv = _block(BLOCK_KV, seq_len, 128)
    block_sizes = splash.BlockSizes(
        block_q=_block(BLOCK_Q, seq_len, 128),
        block_kv=block_kv,
        block_kv_compute=_block(BLOCK_KV_COMPUTE, block_kv, 128),
    )
    head_mask = LocalGlobalMask((seq_len, seq_len), window=seq_len // 4, num_global=seq_len // 32)
    mask = mask_lib.MultiHeadMask([head_mask] * (batch * q_heads))
    kernel = splash.make_splash_mha_single_device(mask, block_sizes=block_sizes)
    scaled_q = (q.astype(jnp.float32) * (1.0 / math.sqrt(head_dim))).astype(q.dtype)
    out = kernel(scaled_q.reshape(batch * q_heads, seq_len, head_dim),
                 k.reshape(batch * kv_heads, seq_len, head_dim),
                 v.reshape(batch * kv_heads, seq_len, v.shape[-1]))
    return out.reshape(batch, q_heads, seq_len, out.shape[-1])
