"""extract(): per-step figures are averages over the grid. A cond (pl.when) whose predicate
follows from program ids, grid sizes, constants and scalar-prefetch tables weights its branches
by the share of grid steps taking them; a predicate on data counts every step and is named.
Expected values are derived from the shapes and from the kernels' own tables."""

import importlib.util
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tpu_nodes" / "worker"))

from maxkernel_worker.extract import COND_UNKNOWN, MAX_WHEN_POINTS, extract  # noqa: E402
from maxkernel_worker.schema import load_schemas  # noqa: E402

S = jax.ShapeDtypeStruct
F32, BF16 = jnp.float32, jnp.bfloat16


@pytest.fixture(scope="module")
def schema():
    return load_schemas(str(ROOT / "messages" / "schema"))


def load_module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def dot_sizes(dot):
    return dot["batch"], dot["m"], dot["n"], dot["k"]


def only_call(structure):
    (call,) = structure["pallasCalls"]
    return call


# ----------------------------------------------------------------------------- tiled matmul

def test_matmul_init_and_store_run_once_per_output_block(schema):
    example = load_module(ROOT / "examples" / "matmul" / "kernel.py", "mk_when_matmul")
    m, k, n, bm, bn, bk = 128, 512, 256, 32, 64, 128
    nk = k // bk
    st = extract(lambda x, y: example.workload(x, y, bm=bm, bn=bn, bk=bk),
                 [S((m, k), BF16), S((k, n), BF16)], ())
    call = only_call(st)
    assert call["grid"] == [m // bm, n // bn, nk]
    (dot,) = call["stepDots"]
    assert dot_sizes(dot) == (1, bm, bn, bk) and dot["count"] == 1
    # Every step adds the block product into the accumulator; the cast of the store branch
    # runs on one step in nk; zeroing costs no flops. Plus the predicates' scalar ops.
    vpu = bm * bn + bm * bn / nk
    assert vpu <= call["stepVpuFlops"] <= vpu + 8
    assert call["stepFlops"] == pytest.approx(2 * bm * bn * bk + call["stepVpuFlops"])
    # VMEM bytes: every step reads x, y and the accumulator and writes the accumulator; the
    # init branch writes the accumulator and the store branch reads it and writes the output,
    # each on one step in nk.
    every = 2 * bm * bk + 2 * bk * bn + 4 * bm * bn + 4 * bm * bn
    once = 4 * bm * bn + (4 * bm * bn + 2 * bm * bn)
    assert call["stepBytes"] == pytest.approx(every + once / nk)
    assert call["unknownPrimitives"] == []
    back = schema.KernelStructure.new_message(**st).to_dict()["pallasCalls"][0]
    assert back["stepVpuFlops"] == pytest.approx(call["stepVpuFlops"])


def test_vmapped_grid_axes_are_not_what_program_id_counts():
    # jax.vmap prepends a grid axis; program_id(2) still names the user's k axis.
    example = load_module(ROOT / "examples" / "matmul" / "kernel.py", "mk_when_matmul_vmap")
    batch, m, k, n, bm, bn, bk = 3, 64, 512, 512, 32, 64, 128
    nk = k // bk
    f = jax.vmap(lambda x, y: example.workload(x, y, bm=bm, bn=bn, bk=bk))
    call = only_call(extract(f, [S((batch, m, k), BF16), S((batch, k, n), BF16)], ()))
    assert call["grid"] == [batch, m // bm, n // bn, nk]
    vpu = bm * bn + bm * bn / nk
    assert vpu <= call["stepVpuFlops"] <= vpu + 8


def test_big_grids_are_sampled_and_stay_fast():
    # 4e6 steps: `k == 0` reads one axis (enumerated: exact); `(i + j) % 3 == 0` reads two
    # axes of 1000 (1e6 points) and is estimated on a fixed sample.
    gi, gj, gk = 1000, 1000, 4
    block = 8 * 128

    def kernel(x_ref, o_ref):
        i, j, k = pl.program_id(0), pl.program_id(1), pl.program_id(2)
        o_ref[...] = x_ref[...]

        @pl.when(k == 0)
        def _():
            o_ref[...] = jnp.exp(o_ref[...])          # block transcendentals

        @pl.when((i + j) % 3 == 0)
        def _():
            o_ref[...] = o_ref[...] * 2.0            # block flops

    def f(x):
        return pl.pallas_call(kernel, grid=(gi, gj, gk),
                              in_specs=[pl.BlockSpec((8, 128), lambda i, j, k: (i, j))],
                              out_specs=pl.BlockSpec((8, 128), lambda i, j, k: (i, j)),
                              out_shape=S((8 * gi, 128 * gj), F32))(x)

    args = [S((8 * gi, 128 * gj), F32)]
    start = time.perf_counter()
    call = only_call(extract(f, args, ()))
    assert time.perf_counter() - start < 20
    assert call["grid"] == [gi, gj, gk]
    assert call["stepTranscendentals"] == block / gk
    ii, jj = np.meshgrid(np.arange(gi), np.arange(gj), indexing="ij")
    share = float(np.mean((ii + jj) % 3 == 0))
    # A uniform sample of MAX_WHEN_POINTS: within a few standard deviations of the truth;
    # the predicates' scalar ops add a few flops.
    sigma = np.sqrt(share * (1 - share) / MAX_WHEN_POINTS)
    assert abs(call["stepVpuFlops"] / block - share) < 4 * sigma + 8 / block
    assert only_call(extract(f, args, ()))["stepVpuFlops"] == call["stepVpuFlops"]  # fixed seed


# ----------------------------------------------------------------------------- causal attention

def causal_flash(q, k, v, blk):
    """Causal online-softmax attention for one head with square blocks; kv blocks above the
    diagonal are skipped, the diagonal block is masked. Also returns the log-sum-exp."""
    s, d = q.shape
    n = s // blk

    def kernel(q_ref, k_ref, v_ref, o_ref, lse_ref, m_ref, l_ref, acc_ref):
        qi, kv = pl.program_id(0), pl.program_id(1)

        @pl.when(kv == 0)
        def _():
            m_ref[...] = jnp.full_like(m_ref, -jnp.inf)
            l_ref[...] = jnp.zeros_like(l_ref)
            acc_ref[...] = jnp.zeros_like(acc_ref)

        @pl.when(kv <= qi)
        def _():
            scores = jax.lax.dot_general(q_ref[...], k_ref[...], (((1,), (1,)), ((), ())),
                                         preferred_element_type=F32)
            rows = qi * blk + jax.lax.broadcasted_iota(jnp.int32, (blk, blk), 0)
            cols = kv * blk + jax.lax.broadcasted_iota(jnp.int32, (blk, blk), 1)
            scores = jnp.where(cols <= rows, scores, -jnp.inf)
            m_prev = m_ref[...]
            m_new = jnp.maximum(m_prev, scores.max(axis=1, keepdims=True))
            p = jnp.exp(scores - m_new)                                  # blk * blk exp
            alpha = jnp.exp(m_prev - m_new)                              # blk exp
            l_ref[...] = alpha * l_ref[...] + p.sum(axis=1, keepdims=True)
            acc_ref[...] = alpha * acc_ref[...] + jnp.dot(p.astype(v_ref.dtype), v_ref[...],
                                                          preferred_element_type=F32)
            m_ref[...] = m_new

            @pl.when(kv == qi)  # the last block this row needs: nested, on the diagonal
            def _():
                o_ref[...] = (acc_ref[...] / l_ref[...]).astype(o_ref.dtype)
                lse_ref[...] = m_ref[...] + jnp.log(l_ref[...])           # blk log

    return pl.pallas_call(
        kernel,
        grid=(n, n),
        in_specs=[pl.BlockSpec((blk, d), lambda i, j: (i, 0)),
                  pl.BlockSpec((blk, d), lambda i, j: (j, 0)),
                  pl.BlockSpec((blk, d), lambda i, j: (j, 0))],
        out_specs=[pl.BlockSpec((blk, d), lambda i, j: (i, 0)),
                   pl.BlockSpec((blk, 1), lambda i, j: (i, 0))],
        out_shape=[S((s, d), q.dtype), S((s, 1), F32)],
        scratch_shapes=[pltpu.VMEM((blk, 1), F32), pltpu.VMEM((blk, 1), F32),
                        pltpu.VMEM((blk, d), F32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
    )(q, k, v)


def test_causal_attention_counts_the_blocks_on_and_below_the_diagonal():
    s, d, blk = 512, 128, 64
    n = s // blk
    call = only_call(extract(lambda q, k, v: causal_flash(q, k, v, blk), [S((s, d), BF16)] * 3,
                             ()))
    assert call["grid"] == [n, n]
    below = n * (n + 1) / 2 / n ** 2
    # QK^T and PV, each on the steps that run.
    dots = call["stepDots"]
    assert [dot_sizes(x) for x in dots] == [(1, blk, blk, d), (1, blk, d, blk)]
    assert [x["count"] for x in dots] == pytest.approx([below, below])
    # exp on the skipped blocks' complement; the nested finalize (kv == qi) runs on n of the
    # n^2 steps: its share inside the causal branch times the branch's share.
    assert call["stepTranscendentals"] == pytest.approx(below * (blk * blk + blk) + blk / n)
    assert call["unknownPrimitives"] == []


def test_causal_attention_is_correct_in_interpret_mode():
    s, d, blk = 64, 128, 16
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    q, k, v = (jax.random.normal(key, (s, d), F32) for key in keys)
    with pltpu.force_tpu_interpret_mode():
        out, lse = causal_flash(q, k, v, blk)
    scores = jnp.where(jnp.tril(jnp.ones((s, s), bool)), q @ k.T, -jnp.inf)
    np.testing.assert_allclose(np.asarray(out), np.asarray(jax.nn.softmax(scores) @ v),
                               atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(np.asarray(lse[:, 0]),
                               np.asarray(jax.nn.logsumexp(scores, axis=-1)), rtol=1e-5)


# ----------------------------------------------------------------------------- scalar prefetch

def spec_dims(name: str) -> dict:
    with open(ROOT / "bench" / "calibration" / "specs" / name) as f:
        return yaml.safe_load(f)["dims"]


def test_tril_masked_matmul_dot_runs_on_blocks_on_or_below_the_diagonal():
    # The guide's block-sparse kernel at its calibration spec's sizes: the predicate reads a
    # scalar-prefetch table (block_mask[i, j]), the store branch is nested in the compute one.
    kern = load_module(ROOT / "bench" / "calibration" / "kernels"
                       / "tril_masked_matmul_bm512_bn512_bk1024.py", "mk_when_tril")
    dims = spec_dims("tril_masked_matmul_16384.yaml")
    m, k, n = dims["M"], dims["K"], dims["N"]
    bm, bn, bk = kern.BM, kern.BN, kern.BK
    nk = k // bk
    tables = []   # the tables the workload builds and passes to its pallas_call
    sparsify = kern._sparsify_tril
    kern._sparsify_tril = lambda *a: tables.append(sparsify(*a)) or tables[-1]
    call = only_call(extract(kern.workload, [S((m, k), BF16), S((k, n), BF16)], ()))
    assert call["grid"] == [m // bm, n // bn, nk]
    block_mask = tables[0][0]
    computed = float(np.mean(block_mask != 0))
    assert 0 < computed < 1
    (dot,) = call["stepDots"]
    assert dot_sizes(dot) == (1, bm, bn, bk)
    assert dot["count"] == pytest.approx(computed)
    # Every step: the mask's two predicates; on k == 0 (one step in nk) the zeroing; on the
    # computed blocks the accumulate (bm * bn adds) and, at their last k step, the masked
    # store (convert, multiply, cast).
    vpu = computed * (bm * bn + 3 * bm * bn / nk)
    assert vpu <= call["stepVpuFlops"] <= vpu + 16
    assert call["unknownPrimitives"] == []


def test_prefetch_tables_from_the_task_inputs_weight_init_and_store():
    # The DSD kernel: its tables are task inputs (concrete_args), read by the init / store
    # predicates; the matmul runs on every step.
    kern = load_module(ROOT / "bench" / "calibration" / "kernels" / "dsd_matmul_blk512.py",
                       "mk_when_dsd")
    rows = np.array([0, 0, 1, 3, 3, 3, 4, 6], np.int32)
    cols = np.array([1, 2, 0, 0, 2, 3, 1, 3], np.int32)
    blk, nb, mb, n = 128, len(rows), 8, 256   # block-size tiles, 8 x 4 lhs blocks
    args = [S((nb,), jnp.int32), S((nb,), jnp.int32), S((nb, blk, blk), BF16),
            S((4 * blk, n), BF16), S((mb * blk, n), BF16)]
    calls = []

    def concrete():
        calls.append(1)
        return [rows, cols, np.zeros((nb, blk, blk), jnp.bfloat16),
                np.zeros((4 * blk, n), jnp.bfloat16), np.zeros((mb * blk, n), jnp.bfloat16)]

    call = only_call(extract(kern.workload, args, (), concrete))
    assert calls  # the tables were needed
    assert call["grid"] == [n // blk, nb]
    (dot,) = call["stepDots"]
    assert dot_sizes(dot) == (1, blk, blk, blk) and dot["count"] == 1
    starts = np.mean(np.r_[True, rows[1:] != rows[:-1]])     # init: a new output row block
    ends = np.mean(np.r_[rows[:-1] != rows[1:], True])       # store: the row block ends
    # The accumulate every step, the store's cast on `ends` of the steps, scalar ops.
    vpu = blk * blk + ends * blk * blk
    assert vpu <= call["stepVpuFlops"] <= vpu + 24
    # VMEM / SMEM bytes: every step reads the x and y blocks, reads and writes the
    # accumulator and reads four table entries; init writes the accumulator, store reads it
    # and writes the output block.
    every = 2 * blk * blk * 2 + 2 * 4 * blk * blk + 4 * 4
    assert call["stepBytes"] == pytest.approx(every + starts * 4 * blk * blk
                                              + ends * (4 + 2) * blk * blk)
    assert call["unknownPrimitives"] == []

    # Without the task's values the predicates cannot be evaluated: every step, and named.
    blind = only_call(extract(kern.workload, args, ()))
    assert COND_UNKNOWN in blind["unknownPrimitives"]
    assert blind["stepVpuFlops"] >= 2 * blk * blk


# ----------------------------------------------------------------------------- data predicates

def test_predicate_on_vmem_data_counts_every_step_and_is_named():
    gi, blk = 8, 128

    def kernel(flag_ref, x_ref, w_ref, o_ref):
        o_ref[...] = x_ref[...]

        @pl.when(flag_ref[0, 0] > 0)   # a value in VMEM: only the data knows
        def _():
            o_ref[...] = jnp.dot(x_ref[...], w_ref[...], preferred_element_type=F32)

        @pl.when(pl.program_id(0) == 0)   # computable: still weighted
        def _():
            o_ref[...] = jnp.exp(o_ref[...])

    def f(flag, x, w):
        return pl.pallas_call(
            kernel, grid=(gi,),
            in_specs=[pl.BlockSpec((8, 128), lambda i: (0, 0)),
                      pl.BlockSpec((blk, blk), lambda i: (i, 0)),
                      pl.BlockSpec((blk, blk), lambda i: (0, 0))],
            out_specs=pl.BlockSpec((blk, blk), lambda i: (i, 0)),
            out_shape=S((gi * blk, blk), F32))(flag, x, w)

    call = only_call(extract(f, [S((8, 128), F32), S((gi * blk, blk), F32),
                                 S((blk, blk), F32)], ()))
    (dot,) = call["stepDots"]
    assert dot["count"] == 1   # counted on every step: an upper bound
    assert COND_UNKNOWN in call["unknownPrimitives"]
    assert call["stepTranscendentals"] == pytest.approx(blk * blk / gi)


def test_predicate_on_a_loop_index_is_not_taken_for_its_initial_value():
    # Inside fori_loop(0, trips) the index is bound to its initial literal 0, yet `i == 1`
    # holds on one trip, not never. The cond counts its branch on every trip and is named.
    trips, blk = 4, 128

    def kernel(x_ref, w_ref, o_ref):
        o_ref[...] = x_ref[...]

        def body(i, carry):
            @pl.when(i == 1)
            def _():
                o_ref[...] = jnp.dot(o_ref[...], w_ref[...], preferred_element_type=F32)
            return carry

        jax.lax.fori_loop(0, trips, body, 0)

    def f(x, w):
        return pl.pallas_call(kernel, grid=(2,),
                              in_specs=[pl.BlockSpec((blk, blk), lambda i: (i, 0)),
                                        pl.BlockSpec((blk, blk), lambda i: (0, 0))],
                              out_specs=pl.BlockSpec((blk, blk), lambda i: (i, 0)),
                              out_shape=S((2 * blk, blk), F32))(x, w)

    call = only_call(extract(f, [S((2 * blk, blk), F32), S((blk, blk), F32)], ()))
    (dot,) = call["stepDots"]
    assert dot["count"] == trips
    assert COND_UNKNOWN in call["unknownPrimitives"]
