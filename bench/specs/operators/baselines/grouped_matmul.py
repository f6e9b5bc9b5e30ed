"""Expert baseline for grouped_matmul_qwen3: megablox grouped matmul (gmm), unchanged.

Wraps `jax.experimental.pallas.ops.tpu.megablox.gmm` (module megablox/ops.py over
megablox/gmm.py) from JAX 0.10.2: rows of lhs sorted by group, group metadata built from
group_sizes and scalar-prefetched so that each m tile is visited once per group it
overlaps, rhs[group] tiles chosen by the index map, f32 VMEM accumulator, partial tiles
masked on store. Tuned parameters: tiling (tm, tk, tn) = (256, 1024, 1024), the published
v6e megablox setting (see /work/shared/notes/pallas-tpu.md, "Hand-tuned kernels"); the
library default is (128, 128, 128). tn 1024 does not divide Qwen3's N = 1536: gmm accepts a
ragged last n tile but computes it whole, so tn is taken as the largest 128-multiple <= 1024
dividing N (768 at full size), which wastes no MXU work. Every tile likewise shrinks to the
largest aligned divisor of its dimension at reduced test sizes.

Adaptation: preferred_element_type is the input dtype, so the output has the reference's
dtype (gmm accumulates in f32 either way).
"""

from jax.experimental.pallas.ops.tpu import megablox

TILE_M, TILE_K, TILE_N = 256, 1024, 1024


def _block(target: int, dim: int, align: int) -> int:
    """The largest multiple of align <= target dividing dim; dim itself when none does."""
    b = min(target, dim) // align * align
    while b >= align:
        if dim % b == 0:
            return b
        b -= align
    return dim


def workload(lhs, rhs, group_sizes):
    # lhs [M, K] rows sorted by expert; rhs [E, K, N]; group_sizes i32[E] summing to M
    m, k = lhs.shape
    n = rhs.shape[2]
    tiling = (_block(TILE_M, m, 8), _block(TILE_K, k, 128), _block(TILE_N, n, 128))
    return megablox.gmm(lhs, rhs, group_sizes, lhs.dtype, tiling)
