"""Dense @ dense matmul with a block-sparse lower-triangular output mask (scalar prefetch).

Reproduces the kernel of the Pallas "Scalar Prefetch and Block-Sparse Computation" guide,
section "Example: Dense @ Dense Matrix Multiplication with a Block-Sparse Output Mask", as
it was timed on TPU v5e (M = N = K = 16384, blocks 512 x 512 x 1024, mask = tril(ones)):
grid (M/bm, N/bn, K/bk); four scalar-prefetch tables (block mask, next mask type, next row
block, next column block) steer the index maps so that skipped output blocks fetch no new
x / y blocks; every output block is zeroed at k == 0 and computed blocks are masked and
stored at the last k step. No compiler_params, as in the guide (all axes "arbitrary").

The guide built the tables with its sparsify_mask() before timing; here they are computed
with numpy from the static shapes at trace time (the mask is tril(ones) by the spec), which
gives the same tables and passes them to the same pallas_call as arguments.
"""
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BM, BN, BK = 512, 512, 1024


def _sparsify_tril(m: int, n: int, bm: int, bn: int):
    """The guide's sparsify_mask() for mask = tril(ones((m, n), int32)), in numpy."""
    mask = np.tril(np.ones((m, n), np.int32))
    nbm, nbn = m // bm, n // bn
    block_mask = np.zeros((nbm, nbn), np.int32)
    prefetch_mask = np.zeros((nbm, nbn), np.int32)
    prefetch_i = np.zeros((nbm, nbn), np.int32)
    prefetch_j = np.zeros((nbm, nbn), np.int32)
    types: list = []
    next_type, next_i, next_j = 0, nbm - 1, nbn - 1
    # Walk backwards so that a skipped block points at the next computed block.
    for i in range(nbm - 1, -1, -1):
        for j in range(nbn - 1, -1, -1):
            block = mask[i * bm:(i + 1) * bm, j * bn:(j + 1) * bn]
            nonzero = bool(block.any())
            if nonzero:
                found = [t for t, b in enumerate(types) if np.array_equal(b, block)]
                if found:
                    next_type = found[0]
                else:
                    next_type = len(types)
                    types.append(block)
                next_i, next_j = i, j
            block_mask[i, j] = nonzero
            prefetch_mask[i, j] = next_type
            prefetch_i[i, j] = next_i
            prefetch_j[i, j] = next_j
    return block_mask, prefetch_mask, prefetch_i, prefetch_j, np.stack(types)


def _kernel(block_mask_ref, prefetch_mask_ref, prefetch_i_ref, prefetch_j_ref,
            x_ref, y_ref, mask_ref, o_ref, acc_ref):
    del prefetch_mask_ref, prefetch_i_ref, prefetch_j_ref
    i, j, k = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    should_compute = block_mask_ref[i, j] != 0

    @pl.when(k == 0)
    def _init():
        o_ref[...] = jnp.zeros_like(o_ref)
        acc_ref[...] = jnp.zeros_like(acc_ref)

    @pl.when(should_compute)
    def _compute():
        acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

        @pl.when(k == pl.num_programs(2) - 1)
        def _store():
            o_ref[...] = (mask_ref[0, ...] * acc_ref[...]).astype(o_ref.dtype)


def _x_map(i, j, k, block_mask, prefetch_mask, prefetch_i, prefetch_j):
    # A skipped block keeps k at 0 so that the inner loop fetches nothing new.
    k_fetch = (block_mask[i, j] != 0) * k
    return (prefetch_i[i, j], k_fetch)


def _y_map(i, j, k, block_mask, prefetch_mask, prefetch_i, prefetch_j):
    k_fetch = (block_mask[i, j] != 0) * k
    return (k_fetch, prefetch_j[i, j])


def _mask_map(i, j, k, block_mask, prefetch_mask, prefetch_i, prefetch_j):
    return (prefetch_mask[i, j], 0, 0)


def _o_map(i, j, k, *_):
    return (i, j)


@jax.jit
def workload(x, y):
    m, k = x.shape
    n = y.shape[1]
    bm, bn, bk = min(BM, m), min(BN, n), min(BK, k)
    block_mask, prefetch_mask, prefetch_i, prefetch_j, mask_data = _sparsify_tril(m, n, bm, bn)
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=4,
        grid=(m // bm, n // bn, k // bk),
        in_specs=[pl.BlockSpec((bm, bk), _x_map),
                  pl.BlockSpec((bk, bn), _y_map),
                  pl.BlockSpec((1, bm, bn), _mask_map)],
        out_specs=pl.BlockSpec((bm, bn), _o_map),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
    )
    return pl.pallas_call(
        _kernel,
        grid_spec=grid_spec,
        out_shape=jax.ShapeDtypeStruct((m, n), jnp.bfloat16),
    )(jnp.asarray(block_mask), jnp.asarray(prefetch_mask), jnp.asarray(prefetch_i),
      jnp.asarray(prefetch_j), x, y, jnp.asarray(mask_data))
