"""Expert baseline for gemm_llama70b_ffn: JAX's own Pallas TPU matmul, unchanged.

Wraps `jax.experimental.pallas.ops.tpu.matmul.matmul` from JAX 0.10.2 (the kernel of the
Pallas TPU matmul guide: (bm, bk) x (bk, bn) tiles, f32 VMEM accumulator, k innermost and
"arbitrary"). Tuned parameters: block_shape (bm, bn) = (1024, 2048), block_k = 1024, the
published v6e setting for the 8192 x 8192 x 28672 Llama-70B FFN GEMM (see
/work/shared/notes/pallas-tpu.md, "Hand-tuned kernels"); the library default is block_k 256
with no default block_shape.

Adaptation: none; x [M, K] @ w [K, N] -> [M, N] in the inputs' dtype, as the library computes
it. The library needs every block to divide its dimension, so at reduced test sizes each
block shrinks to the largest aligned divisor of the actual dimension (full size: unchanged).
"""

from jax.experimental.pallas.ops.tpu import matmul as pallas_matmul

BLOCK_M, BLOCK_N, BLOCK_K = 1024, 2048, 1024


def _block(target: int, dim: int, align: int) -> int:
    """The largest multiple of align <= target dividing dim; dim itself when none does."""
    b = min(target, dim) // align * align
    while b >= align:
        if dim % b == 0:
            return b
        b -= align
    return dim


def workload(x, w):
    m, k = x.shape
    n = w.shape[1]
    return pallas_matmul.matmul(
        x, w,
        block_shape=(_block(BLOCK_M, m, 8), _block(BLOCK_N, n, 128)),
        block_k=_block(BLOCK_K, k, 128),
    )
