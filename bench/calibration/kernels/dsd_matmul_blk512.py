"""Block-sparse @ dense matmul (DSD) driven by scalar-prefetched block indices.

Reproduces the kernel of the Pallas "Scalar Prefetch and Block-Sparse Computation" guide,
section "Example: Sparse @ Dense Matrix Multiplication", as it was timed on TPU v5e
(M = N = K = 16384, 512 x 512 blocks, 86 non-zero lhs blocks): grid (N/bn, num_blocks), the
outer axis over output column blocks, the inner axis over the non-zero lhs blocks grouped by
row; x block b meets the y block of its k index and accumulates into the output block of
its row index in a float32 VMEM scratch, zeroed when the row changes and stored when the
next block starts another row. A zeros array aliased to the output (input_output_aliases)
keeps never-visited output blocks at zero. No compiler_params, as in the guide.

One change from the guide: its lookahead reads indices_i[min(b + 1, num_blocks)], one entry
past the end at the last step (the value is unused there because that step always stores);
here the index is clamped to num_blocks - 1 so the read stays in bounds.
"""
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def _kernel(idxs_i_ref, idxs_k_ref, x_ref, y_ref, _, o_ref, acc_ref, *, num_blocks):
    del idxs_k_ref
    b = pl.program_id(1)
    is_start = b == 0
    changed = idxs_i_ref[b] != idxs_i_ref[jnp.maximum(b - 1, 0)]

    @pl.when(is_start | changed)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += jnp.dot(x_ref[0, :, :], y_ref[...], preferred_element_type=jnp.float32)

    next_changes = idxs_i_ref[b] != idxs_i_ref[jnp.minimum(b + 1, num_blocks - 1)]
    is_end = b == num_blocks - 1

    @pl.when(is_end | next_changes)
    def _store():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def _x_map(j, b, idxs_i, idxs_k):
    return (b, 0, 0)


def _y_map(j, b, idxs_i, idxs_k):
    return (idxs_k[b], j)


def _o_map(j, b, idxs_i, idxs_k):
    return (idxs_i[b], j)


@jax.jit
def workload(indices_i, indices_k, x_blocks, y, zeros):
    num_blocks, blk_m, blk_k = x_blocks.shape
    n = y.shape[1]
    blk_n = blk_m
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=2,
        grid=(n // blk_n, num_blocks),
        in_specs=[pl.BlockSpec((1, blk_m, blk_k), _x_map),
                  pl.BlockSpec((blk_k, blk_n), _y_map),
                  # the zeros array aliased to the output
                  pl.BlockSpec((blk_m, blk_n), _o_map)],
        out_specs=pl.BlockSpec((blk_m, blk_n), _o_map),
        scratch_shapes=[pltpu.VMEM((blk_m, blk_n), jnp.float32)],
    )
    return pl.pallas_call(
        functools.partial(_kernel, num_blocks=num_blocks),
        grid_spec=grid_spec,
        out_shape=jax.ShapeDtypeStruct(zeros.shape, jnp.bfloat16),
        input_output_aliases={4: 0},
    )(indices_i, indices_k, x_blocks, y, zeros)
