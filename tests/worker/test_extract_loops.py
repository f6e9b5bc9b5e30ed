"""extract(): a loop in a kernel body whose trip count follows from program ids, grid sizes,
constants and scalar-prefetch tables (a fori_loop with dynamic bounds, as paged attention runs
over a sequence's blocks) weighs its body by the mean trip count over the grid, conditioned on
the enclosing branches and loops; a loop bounded by data counts once and is named. Expected
values are derived from the tables given to the kernels."""

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tpu_nodes" / "worker"))

from maxkernel_worker.extract import (COND_UNKNOWN, MAX_WHEN_POINTS, WHILE_UNKNOWN,  # noqa: E402
                                      extract)

S = jax.ShapeDtypeStruct
F32, BF16 = jnp.float32, jnp.bfloat16
ROWS, LANES = 8, 128                 # one (8, 128) f32 tile copied and multiplied per trip
TILE_BYTES = ROWS * LANES * 4


def only_call(structure):
    (call,) = structure["pallasCalls"]
    return call


def looped(lower, upper, grid, n_tables, when=None, when_in_body=None):
    """A pallas_call over `grid` with n_tables scalar-prefetch tables whose body runs
    fori_loop(lower(ids, tables), upper(ids, tables)); each trip DMAs one tile of x from HBM
    and multiplies it by w. when(ids) guards the loop, when_in_body(ids) the matmul."""
    def kernel(*refs):
        tables = refs[:n_tables]
        x_hbm, w_ref, o_ref, buf, sem = refs[n_tables:]
        ids = tuple(pl.program_id(a) for a in range(len(grid)))

        def body(t, acc):
            c = pltpu.make_async_copy(x_hbm.at[pl.ds(t * ROWS, ROWS)], buf, sem)
            c.start()
            c.wait()
            if when_in_body is None:
                return acc + jnp.dot(buf[...], w_ref[...], preferred_element_type=F32)

            def product():
                return acc + jnp.dot(buf[...], w_ref[...], preferred_element_type=F32)
            return jax.lax.cond(when_in_body(ids), product, lambda: acc)

        def run():
            zero = jnp.zeros((ROWS, LANES), F32)
            o_ref[...] = jax.lax.fori_loop(lower(ids, tables), upper(ids, tables), body, zero)

        if when is None:
            run()
        else:
            pl.when(when(ids))(run)

    def f(*args):
        *tables, x, w = args
        nd = len(grid)
        return pl.pallas_call(
            kernel,
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=n_tables, grid=grid,
                in_specs=[pl.BlockSpec(memory_space=pl.ANY),
                          pl.BlockSpec((LANES, LANES), lambda *a: (0, 0))],
                out_specs=pl.BlockSpec((None,) * nd + (ROWS, LANES),
                                       lambda *a: tuple(a[:nd]) + (0, 0)),
                scratch_shapes=[pltpu.VMEM((ROWS, LANES), F32), pltpu.SemaphoreType.DMA]),
            out_shape=S(tuple(grid) + (ROWS, LANES), F32))(*tables, x, w)
    return f


def run_extract(f, tables, max_trips, blind=False):
    x_shape, w_shape = (max(max_trips, 1) * ROWS, LANES), (LANES, LANES)
    args = [S(t.shape, t.dtype) for t in tables] + [S(x_shape, F32), S(w_shape, F32)]
    if blind:
        return only_call(extract(f, args, ()))

    def concrete():
        return list(tables) + [np.zeros(x_shape, np.float32), np.zeros(w_shape, np.float32)]
    return only_call(extract(f, args, (), concrete))


def assert_trips(call, mean_trips):
    (dot,) = call["stepDots"]
    assert (dot["m"], dot["n"], dot["k"]) == (ROWS, LANES, LANES)
    assert dot["count"] == pytest.approx(mean_trips)
    assert call["stepDmaBytes"] == pytest.approx(mean_trips * TILE_BYTES)


# ----------------------------------------------------------------------------- computable bounds

def test_trip_count_from_a_prefetch_table_is_averaged_over_the_grid():
    lengths = np.array([0, 5, 13, 32, 7, 4, 31, 20], np.int32)
    trips = lengths // 4
    f = looped(lambda ids, t: 0, lambda ids, t: t[0][ids[0]] // 4, (len(lengths),), 1)
    call = run_extract(f, [lengths], trips.max())
    assert_trips(call, trips.mean())
    assert call["unknownPrimitives"] == []


def test_kernel_is_correct_in_interpret_mode():
    # The kernel the trip counts are read from does what the tests assume it does.
    lengths = np.array([0, 5, 13, 9], np.int32)
    trips = lengths // 4
    f = looped(lambda ids, t: 0, lambda ids, t: t[0][ids[0]] // 4, (len(lengths),), 1)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((trips.max() * ROWS, LANES)).astype(np.float32)
    w = rng.standard_normal((LANES, LANES)).astype(np.float32)
    with pltpu.force_tpu_interpret_mode():
        out = np.asarray(f(jnp.asarray(lengths), jnp.asarray(x), jnp.asarray(w)))
    tiles = x.reshape(-1, ROWS, LANES) @ w
    for g, n in enumerate(trips):
        np.testing.assert_allclose(out[g], tiles[:n].sum(axis=0), rtol=1e-4, atol=1e-3)


def test_dynamic_lower_and_upper_bounds_and_empty_loops():
    starts = np.array([0, 3, 5, 2, 6, 1], np.int32)
    ends = np.array([4, 3, 9, 1, 8, 7], np.int32)   # two loops run no trip (3..3, 2..1)
    trips = np.maximum(ends - starts, 0)
    f = looped(lambda ids, t: t[0][ids[0]], lambda ids, t: t[1][ids[0]], (len(starts),), 2)
    call = run_extract(f, [starts, ends], ends.max())
    assert_trips(call, trips.mean())
    assert call["unknownPrimitives"] == []


def test_bounds_from_program_ids_on_a_two_axis_grid():
    # A triangular loop: step (i, j) runs i + j + 1 trips.
    gi, gj = 4, 6
    f = looped(lambda ids, t: 0, lambda ids, t: ids[0] + ids[1] + t[0][0], (gi, gj), 1)
    ii, jj = np.meshgrid(np.arange(gi), np.arange(gj), indexing="ij")
    call = run_extract(f, [np.array([1], np.int32)], gi + gj)
    assert_trips(call, np.mean(ii + jj + 1))
    assert call["unknownPrimitives"] == []


def test_loop_inside_a_branch_counts_where_the_branch_runs():
    # Runs on even steps only; the trip count is conditioned on them (odd steps have the
    # long loops): mean over the grid of [even] * trips.
    lengths = np.array([8, 40, 4, 36, 12, 28, 0, 44], np.int32)
    trips = lengths // 4
    even = np.arange(len(lengths)) % 2 == 0
    f = looped(lambda ids, t: 0, lambda ids, t: t[0][ids[0]] // 4, (len(lengths),), 1,
               when=lambda ids: ids[0] % 2 == 0)
    call = run_extract(f, [lengths], trips.max())
    assert_trips(call, np.mean(even * trips))
    assert call["unknownPrimitives"] == []


def test_branch_inside_a_loop_weighs_its_steps_by_their_trips():
    # The matmul runs on the steps of the second half, which have the long loops: its count
    # is mean(trips * [i >= half]), not mean(trips) * share of the steps.
    lengths = np.array([4, 8, 4, 0, 40, 36, 44, 32], np.int32)
    trips = lengths // 4
    late = np.arange(len(lengths)) >= len(lengths) // 2
    f = looped(lambda ids, t: 0, lambda ids, t: t[0][ids[0]] // 4, (len(lengths),), 1,
               when_in_body=lambda ids: ids[0] >= len(lengths) // 2)
    call = run_extract(f, [lengths], trips.max())
    (dot,) = call["stepDots"]
    assert dot["count"] == pytest.approx(np.mean(trips * late))
    assert call["stepDmaBytes"] == pytest.approx(trips.mean() * TILE_BYTES)
    assert call["unknownPrimitives"] == []


def test_big_grids_are_sampled():
    # 128 x 64 steps read by the bound: more than MAX_WHEN_POINTS, estimated on a sample.
    gi, gj = 128, 64
    f = looped(lambda ids, t: 0, lambda ids, t: (ids[0] * 7 + ids[1] * 3) % 11, (gi, gj), 1)
    ii, jj = np.meshgrid(np.arange(gi), np.arange(gj), indexing="ij")
    trips = (ii * 7 + jj * 3) % 11
    call = run_extract(f, [np.array([0], np.int32)], 10)
    (dot,) = call["stepDots"]
    sigma = trips.std() / np.sqrt(MAX_WHEN_POINTS)
    assert abs(dot["count"] - trips.mean()) < 4 * sigma
    assert call["unknownPrimitives"] == []


# ----------------------------------------------------------------------------- unknown bounds

def test_bound_read_from_vmem_data_counts_once_and_is_named():
    def kernel(n_ref, x_ref, w_ref, o_ref):
        n = n_ref[0, 0].astype(jnp.int32)   # only the data knows the trip count

        def body(t, acc):
            return acc + jnp.dot(x_ref[...], w_ref[...], preferred_element_type=F32)
        o_ref[...] = jax.lax.fori_loop(0, n, body, jnp.zeros((ROWS, LANES), F32))

    def f(n, x, w):
        return pl.pallas_call(
            kernel, grid=(4,),
            in_specs=[pl.BlockSpec((ROWS, LANES), lambda i: (0, 0)),
                      pl.BlockSpec((ROWS, LANES), lambda i: (i, 0)),
                      pl.BlockSpec((LANES, LANES), lambda i: (0, 0))],
            out_specs=pl.BlockSpec((ROWS, LANES), lambda i: (i, 0)),
            out_shape=S((4 * ROWS, LANES), F32))(n, x, w)

    call = only_call(extract(f, [S((ROWS, LANES), F32), S((4 * ROWS, LANES), F32),
                                 S((LANES, LANES), F32)], ()))
    (dot,) = call["stepDots"]
    assert dot["count"] == 1
    assert WHILE_UNKNOWN in call["unknownPrimitives"]


def test_bound_on_an_outer_loop_counter_counts_once_and_is_named():
    # The inner loop's bound is the outer loop's counter: not a grid value.
    lengths = np.array([8, 12], np.int32)

    def kernel(len_ref, x_ref, w_ref, o_ref):
        def outer(t, acc):
            def inner(u, a):
                return a + jnp.dot(x_ref[...], w_ref[...], preferred_element_type=F32)
            return jax.lax.fori_loop(0, t, inner, acc)
        o_ref[...] = jax.lax.fori_loop(0, len_ref[pl.program_id(0)] // 4, outer,
                                       jnp.zeros((ROWS, LANES), F32))

    def f(ln, x, w):
        return pl.pallas_call(
            kernel,
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=1, grid=(2,),
                in_specs=[pl.BlockSpec((ROWS, LANES), lambda i, *_: (i, 0)),
                          pl.BlockSpec((LANES, LANES), lambda i, *_: (0, 0))],
                out_specs=pl.BlockSpec((ROWS, LANES), lambda i, *_: (i, 0))),
            out_shape=S((2 * ROWS, LANES), F32))(ln, x, w)

    args = [S((2,), jnp.int32), S((2 * ROWS, LANES), F32), S((LANES, LANES), F32)]
    call = only_call(extract(f, args, (), lambda: [lengths, np.zeros((2 * ROWS, LANES),
                                                                     np.float32),
                                                   np.zeros((LANES, LANES), np.float32)]))
    (dot,) = call["stepDots"]
    assert dot["count"] == pytest.approx(np.mean(lengths // 4))   # outer trips, inner once
    assert WHILE_UNKNOWN in call["unknownPrimitives"]


def test_without_the_task_tables_the_trip_count_is_unknown():
    lengths = np.array([0, 5, 13, 32], np.int32)
    f = looped(lambda ids, t: 0, lambda ids, t: t[0][ids[0]] // 4, (len(lengths),), 1)
    call = run_extract(f, [lengths], 8, blind=True)
    assert_trips(call, 1.0)
    assert WHILE_UNKNOWN in call["unknownPrimitives"]


# ----------------------------------------------------------------------------- written tables

def flag_kernel_call(write, grid=8):
    """A pallas_call whose body reads cell 0 of a scalar-prefetch table, lets write(ref, value)
    update the table, and multiplies on the steps where the value read is nonzero."""
    def kernel(flag_ref, x_ref, w_ref, o_ref):
        flag = flag_ref[0]
        write(flag_ref, flag)
        o_ref[...] = x_ref[...]

        @pl.when(flag != 0)
        def _():
            o_ref[...] = jnp.dot(x_ref[...], w_ref[...], preferred_element_type=F32)

    def f(flag, x, w):
        return pl.pallas_call(
            kernel,
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=1, grid=(grid,),
                in_specs=[pl.BlockSpec((ROWS, LANES), lambda i, *_: (i, 0)),
                          pl.BlockSpec((LANES, LANES), lambda i, *_: (0, 0))],
                out_specs=pl.BlockSpec((ROWS, LANES), lambda i, *_: (i, 0))),
            out_shape=S((grid * ROWS, LANES), F32))(flag, x, w)

    args = [S((1,), jnp.int32), S((grid * ROWS, LANES), F32), S((LANES, LANES), F32)]

    def concrete():
        return [np.ones((1,), np.int32), np.zeros((grid * ROWS, LANES), np.float32),
                np.zeros((LANES, LANES), np.float32)]
    return only_call(extract(f, args, (), concrete))


def test_a_flag_the_body_clears_after_reading_it_is_set_on_the_first_step_only():
    # init_flag as paged attention uses it: 1 in the table, cleared by the first step.
    grid = 8

    def clear(ref, flag):
        ref[0] = 0
    call = flag_kernel_call(clear, grid)
    (dot,) = call["stepDots"]
    assert dot["count"] == pytest.approx(1 / grid)
    assert call["unknownPrimitives"] == []


def test_a_table_the_body_writes_a_computed_value_to_is_data():
    def bump(ref, flag):
        ref[0] = flag + 1
    call = flag_kernel_call(bump)
    (dot,) = call["stepDots"]
    assert dot["count"] == 1   # every step: an upper bound
    assert COND_UNKNOWN in call["unknownPrimitives"]


def test_a_flag_cleared_in_another_block_is_data():
    # Cleared on the last step only: the read sees 1 on every step but that is not known.
    def clear_at_the_end(ref, flag):
        @pl.when(pl.program_id(0) == pl.num_programs(0) - 1)
        def _():
            ref[0] = 0
    call = flag_kernel_call(clear_at_the_end)
    (dot,) = call["stepDots"]
    assert dot["count"] == 1
    assert COND_UNKNOWN in call["unknownPrimitives"]


# ----------------------------------------------------------------------------- paged attention

@pytest.mark.parametrize("inline_seq_dim", [True, False])
def test_jax_paged_attention_copies_each_sequence_block_once(inline_seq_dim):
    from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention

    batch, heads, kv_heads, d, page_size, pages_per_seq, ppb = 4, 8, 2, 128, 16, 8, 2
    pages = batch * pages_per_seq
    lengths = np.array([0, 40, 128, 77], np.int32)    # an empty, a partial and a full sequence
    table = np.random.default_rng(0).permutation(pages).reshape(batch, pages_per_seq)
    args = [S((batch, heads, d), BF16), S((kv_heads, pages, page_size, d), BF16),
            S((kv_heads, pages, page_size, d), BF16), S((batch,), jnp.int32),
            S((batch, pages_per_seq), jnp.int32)]

    def concrete():
        return [np.zeros(a.shape, a.dtype) for a in args[:3]] + [lengths,
                                                                 table.astype(np.int32)]

    def f(q, k, v, ln, pi):
        return paged_attention(q, k, v, ln, pi, pages_per_compute_block=ppb,
                               inline_seq_dim=inline_seq_dim)

    call = only_call(extract(f, args, (), concrete))
    # The kernel's compute blocks: ppb pages of bk tokens; sequence b has ceil(len / bk) of
    # them, each of whose K and V pages is DMAed once: the first block of the whole kernel
    # behind init_flag, every other one by the step before it (prefetch_next_block).
    bk = ppb * page_size
    trips = (lengths + bk - 1) // bk
    pair = 2 * ppb * page_size * d * 2   # K and V pages of one block, bf16
    steps = int(np.prod(call["grid"]))
    assert steps == batch * kv_heads * (1 if inline_seq_dim else pages_per_seq // ppb)
    copied = trips.sum() * kv_heads * pair
    # Extract counts prefetch_next_block on every block, the last included (its predicate
    # reads the block indices compute_block_indices derives from the loop counter): one pair
    # more per kernel than copied.
    assert call["stepDmaBytes"] == pytest.approx((copied + pair) / steps)
    # QK^T and PV once per block.
    for dot in call["stepDots"]:
        assert dot["count"] == pytest.approx(trips.sum() * kv_heads / steps)
    assert WHILE_UNKNOWN not in call["unknownPrimitives"]
