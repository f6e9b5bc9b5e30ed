"""extract(): what the TPU performance model prices per grid step: the body's matmuls
(stepDots), its non-matmul flops (stepVpuFlops), its manual DMAs (stepDmaBytes) and the
primitives nothing prices (unknownPrimitives). Expected values are derived from the shapes."""

import importlib.util
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

from maxkernel_worker.extract import extract  # noqa: E402
from maxkernel_worker.schema import load_schemas  # noqa: E402

S = jax.ShapeDtypeStruct
F32, BF16 = jnp.float32, jnp.bfloat16


@pytest.fixture(scope="module")
def schema():
    return load_schemas(str(ROOT / "messages" / "schema"))


def round_trip(schema, structure) -> dict:
    """The structure as the C++ side reads it: through the capnp schema."""
    return schema.KernelStructure.new_message(**structure).to_dict()


def dot_sizes(dot):
    return dot["batch"], dot["m"], dot["n"], dot["k"]


def dot_flops(dots):
    return sum(2 * d["batch"] * d["m"] * d["n"] * d["k"] * d["count"] for d in dots)


def load_module(path: Path):
    spec = importlib.util.spec_from_file_location(f"mk_test_{path.parent.name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ----------------------------------------------------------------------------- matmul

def test_example_tiled_matmul_has_one_dot_per_step(schema):
    example = load_module(ROOT / "examples" / "matmul" / "kernel.py")
    m, k, n, bm, bn, bk = 128, 512, 256, 32, 64, 128
    st = extract(lambda x, y: example.workload(x, y, bm=bm, bn=bn, bk=bk),
                 [S((m, k), BF16), S((k, n), BF16)], ())
    (call,) = st["pallasCalls"]
    assert call["grid"] == [m // bm, n // bn, k // bk]
    (dot,) = call["stepDots"]
    assert dot_sizes(dot) == (1, bm, bn, bk)
    assert (dot["lhsDtype"], dot["rhsDtype"], dot["outDtype"]) == ("bfloat16", "bfloat16",
                                                                   "float32")
    assert dot["count"] == 1
    mxu = 2 * bm * bn * bk
    # The accumulator add every step, the final cast on the last k step only (its pl.when
    # branch is weighted by the share of steps taking it) and a few scalar ops: small next to
    # the matmul.
    vpu = bm * bn + bm * bn / (k // bk)
    assert vpu <= call["stepVpuFlops"] <= vpu + 8
    assert call["stepVpuFlops"] < 0.05 * mxu
    assert call["stepFlops"] == mxu + call["stepVpuFlops"]
    assert call["stepTranscendentals"] == 0 and call["stepDmaBytes"] == 0
    assert call["unknownPrimitives"] == []

    back = round_trip(schema, st)["pallasCalls"][0]
    assert dot_sizes(back["stepDots"][0]) == (1, bm, bn, bk)
    assert back["stepVpuFlops"] == call["stepVpuFlops"]


def test_outside_graph_dots_are_described():
    m, k, n, bm = 64, 32, 128, 16

    def f(x, w1, w2):
        h = x @ w1  # outside the kernel
        return pl.pallas_call(
            lambda h_ref, w_ref, o_ref: o_ref.__setitem__(
                ..., jnp.dot(h_ref[...], w_ref[...], preferred_element_type=F32)),
            grid=(m // bm,),
            in_specs=[pl.BlockSpec((bm, n), lambda i: (i, 0)),
                      pl.BlockSpec((n, n), lambda i: (0, 0))],
            out_specs=pl.BlockSpec((bm, n), lambda i: (i, 0)),
            out_shape=S((m, n), F32))(h, w2)

    st = extract(f, [S((m, k), F32), S((k, n), F32), S((n, n), F32)], ())
    (outside,) = [nd for nd in st["outside"]["nodes"] if nd["primitive"] == "dot_general"]
    assert outside["hasDot"] and dot_sizes(outside["dot"]) == (1, m, n, k)
    assert not [nd for nd in st["outside"]["nodes"] if nd["primitive"] == "pallas_call"
                and nd["hasDot"]]
    (dot,) = st["pallasCalls"][0]["stepDots"]
    assert dot_sizes(dot) == (1, bm, n, n)
    assert st["pallasCalls"][0]["stepVpuFlops"] == 0  # the body is the matmul alone


# ----------------------------------------------------------------------------- attention

def flash_like(q, k, v, bq, bk):
    """Online-softmax attention for one head: f32 running max, sum and accumulator."""
    s, d = q.shape

    def kernel(q_ref, k_ref, v_ref, o_ref, m_ref, l_ref, acc_ref):
        j = pl.program_id(1)

        @pl.when(j == 0)
        def _():
            m_ref[...] = jnp.full_like(m_ref, -jnp.inf)
            l_ref[...] = jnp.zeros_like(l_ref)
            acc_ref[...] = jnp.zeros_like(acc_ref)

        scores = jax.lax.dot_general(q_ref[...], k_ref[...], (((1,), (1,)), ((), ())),
                                     preferred_element_type=F32)          # (bq, bk)
        m_prev = m_ref[...]                                                 # (bq, 1)
        m_new = jnp.maximum(m_prev, scores.max(axis=1, keepdims=True))
        p = jnp.exp(scores - m_new)                                         # bq*bk exp
        alpha = jnp.exp(m_prev - m_new)                                     # bq exp
        l_ref[...] = alpha * l_ref[...] + p.sum(axis=1, keepdims=True)
        acc_ref[...] = alpha * acc_ref[...] + jnp.dot(p.astype(v_ref.dtype), v_ref[...],
                                                      preferred_element_type=F32)
        m_ref[...] = m_new

        @pl.when(j == pl.num_programs(1) - 1)
        def _():
            o_ref[...] = (acc_ref[...] / l_ref[...]).astype(o_ref.dtype)

    return pl.pallas_call(
        kernel,
        grid=(s // bq, s // bk),
        in_specs=[pl.BlockSpec((bq, d), lambda i, j: (i, 0)),
                  pl.BlockSpec((bk, d), lambda i, j: (j, 0)),
                  pl.BlockSpec((bk, d), lambda i, j: (j, 0))],
        out_specs=pl.BlockSpec((bq, d), lambda i, j: (i, 0)),
        out_shape=S((s, d), q.dtype),
        scratch_shapes=[pltpu.VMEM((bq, 1), F32), pltpu.VMEM((bq, 1), F32),
                        pltpu.VMEM((bq, d), F32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
    )(q, k, v)


def test_flash_like_attention_has_two_dots_and_exps(schema):
    s, d, bq, bk = 256, 128, 64, 32
    st = extract(lambda q, k, v: flash_like(q, k, v, bq, bk), [S((s, d), BF16)] * 3, ())
    (call,) = st["pallasCalls"]
    dots = call["stepDots"]
    assert [dot_sizes(x) for x in dots] == [(1, bq, bk, d), (1, bq, d, bk)]
    assert [(x["lhsDtype"], x["rhsDtype"], x["outDtype"]) for x in dots] == [
        ("bfloat16", "bfloat16", "float32"), ("bfloat16", "bfloat16", "float32")]
    assert [x["count"] for x in dots] == [1, 1]
    assert call["stepTranscendentals"] == bq * bk + bq
    # VPU work per step: on the score block the row max, the subtract, the row sum and the
    # cast of p; per row max, subtract, multiply, add; on the accumulator a multiply and an
    # add; the finalize branch's divide and cast on the last kv step only (a pl.when is
    # weighted by the share of steps taking it); scalar ops.
    vpu = 4 * bq * bk + 4 * bq + 2 * bq * d + 2 * bq * d / (s // bk)
    assert vpu <= call["stepVpuFlops"] <= vpu + 8
    assert call["stepFlops"] == pytest.approx(dot_flops(dots) + call["stepVpuFlops"])
    assert call["unknownPrimitives"] == []
    back = round_trip(schema, st)["pallasCalls"][0]
    assert [dot_sizes(x) for x in back["stepDots"]] == [(1, bq, bk, d), (1, bq, d, bk)]


def test_flash_like_attention_is_correct_in_interpret_mode():
    # The kernel above is a real attention kernel, not just a shape exercise.
    s, d, bq, bk = 64, 128, 16, 32
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    q, k, v = (jax.random.normal(key, (s, d), F32) for key in keys)
    with pltpu.force_tpu_interpret_mode():
        got = flash_like(q, k, v, bq, bk)
    want = jax.nn.softmax(q @ k.T, axis=-1) @ v
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-4, rtol=1e-4)


# ----------------------------------------------------------------------------- manual DMAs

def paged_like(q, k_pages, v_pages, page_table, ppb):
    """Per sequence b and block of ppb pages: DMA the pages its table names from HBM, then
    attend (no softmax: scores times values, summed over the blocks)."""
    batch, heads, d = q.shape
    _, page_size, _ = k_pages.shape
    pages_per_seq = page_table.shape[1]

    def kernel(table_ref, q_ref, k_hbm, v_hbm, o_ref, k_buf, v_buf, sems):
        b, blk = pl.program_id(0), pl.program_id(1)

        def copies(p):
            page = table_ref[b, blk * ppb + p]
            return (pltpu.make_async_copy(k_hbm.at[page], k_buf.at[p], sems.at[0]),
                    pltpu.make_async_copy(v_hbm.at[page], v_buf.at[p], sems.at[1]))

        def start(p, carry):
            for c in copies(p):
                c.start()
            return carry

        def wait(p, carry):
            for c in copies(p):
                c.wait()
            return carry

        jax.lax.fori_loop(0, ppb, start, 0)
        jax.lax.fori_loop(0, ppb, wait, 0)

        @pl.when(blk == 0)
        def _():
            o_ref[...] = jnp.zeros_like(o_ref)

        def attend(p, acc):
            scores = jax.lax.dot_general(q_ref[...], k_buf[p], (((1,), (1,)), ((), ())),
                                         preferred_element_type=F32)   # (heads, page_size)
            return acc + jnp.dot(scores, v_buf[p], preferred_element_type=F32)

        o_ref[...] += jax.lax.fori_loop(0, ppb, attend, jnp.zeros((heads, d), F32))

    return pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(batch, pages_per_seq // ppb),
            in_specs=[pl.BlockSpec((None, heads, d), lambda b, blk, t: (b, 0, 0)),
                      pl.BlockSpec(memory_space=pl.ANY),
                      pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec((None, heads, d), lambda b, blk, t: (b, 0, 0)),
            scratch_shapes=[pltpu.VMEM((ppb, page_size, d), k_pages.dtype),
                            pltpu.VMEM((ppb, page_size, d), v_pages.dtype),
                            pltpu.SemaphoreType.DMA((2,))]),
        out_shape=S((batch, heads, d), F32),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
    )(page_table, q, k_pages, v_pages)


def test_paged_like_attention_dma_bytes_are_the_copied_pages(schema):
    batch, heads, d, pages, page_size, pages_per_seq, ppb = 2, 8, 128, 16, 16, 4, 2
    st = extract(lambda q, k, v, t: paged_like(q, k, v, t, ppb),
                 [S((batch, heads, d), F32), S((pages, page_size, d), BF16),
                  S((pages, page_size, d), BF16), S((batch, pages_per_seq), jnp.int32)], ())
    (call,) = st["pallasCalls"]
    k_op = [o for o in call["operands"] if o["role"] == "input" and o["index"] == 1][0]
    assert k_op["memorySpace"] == "any"
    # Per step: ppb pages of k and ppb pages of v, one page = page_size * d bf16 values.
    page_bytes = page_size * d * 2
    assert call["stepDmaBytes"] == 2 * ppb * page_bytes
    # Both matmuls run once per page, inside a fori_loop of ppb trips.
    dots = call["stepDots"]
    assert [dot_sizes(x) for x in dots] == [(1, heads, page_size, d), (1, heads, d, page_size)]
    assert [x["count"] for x in dots] == [ppb, ppb]
    assert [x["rhsDtype"] for x in dots] == ["bfloat16", "bfloat16"]
    assert call["unknownPrimitives"] == []
    assert round_trip(schema, st)["pallasCalls"][0]["stepDmaBytes"] == 2 * ppb * page_bytes


def test_paged_like_attention_is_correct_in_interpret_mode():
    batch, heads, d, pages, page_size, pages_per_seq, ppb = 2, 8, 128, 8, 8, 4, 2
    keys = jax.random.split(jax.random.PRNGKey(1), 3)
    q = jax.random.normal(keys[0], (batch, heads, d), F32)
    k = jax.random.normal(keys[1], (pages, page_size, d), F32)
    v = jax.random.normal(keys[2], (pages, page_size, d), F32)
    table = jnp.asarray(np.random.default_rng(0).permutation(pages)
                        .reshape(batch, pages_per_seq).astype(np.int32))
    with pltpu.force_tpu_interpret_mode():
        got = paged_like(q, k, v, table, ppb)
    ks, vs = k[table].reshape(batch, -1, d), v[table].reshape(batch, -1, d)
    want = jnp.einsum("bhs,bsd->bhd", jnp.einsum("bhd,bsd->bhs", q, ks), vs)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-3)


def test_strided_dma_slice_and_run_scoped_scratch():
    # One (8, 128) f32 row block copied from HBM per step into a scratch scoped by run_scoped.
    rows, cols, br = 64, 256, 8

    def kernel(x_hbm, o_ref):
        i = pl.program_id(0)

        def body(buf, sem):
            c = pltpu.make_async_copy(x_hbm.at[pl.ds(i * br, br), pl.ds(128, 128)], buf, sem)
            c.start()
            c.wait()
            o_ref[...] = buf[...] * 2.0

        pl.run_scoped(body, pltpu.VMEM((br, 128), F32), pltpu.SemaphoreType.DMA)

    def f(x):
        return pl.pallas_call(kernel, grid=(rows // br,),
                              in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                              out_specs=pl.BlockSpec((br, 128), lambda i: (i, 0)),
                              out_shape=S((rows, 128), F32))(x)

    (call,) = extract(f, [S((rows, cols), F32)], ())["pallasCalls"]
    assert call["stepDmaBytes"] == br * 128 * 4
    # The body inside run_scoped is walked: its multiply is counted.
    assert call["stepVpuFlops"] >= br * 128
    assert call["unknownPrimitives"] == []


# ----------------------------------------------------------------------------- what is not seen

def test_unpriced_primitives_and_unknown_trip_counts_are_named():
    def kernel(x_ref, o_ref):
        pltpu.prng_seed(0)
        bits = pltpu.prng_random_bits((8, 128))
        n = x_ref[0, 0].astype(jnp.int32)  # a trip count only the data knows
        acc = jax.lax.fori_loop(0, n, lambda i, c: c + 1.0, x_ref[...])
        o_ref[...] = acc + bits.astype(F32)

    (call,) = extract(lambda x: pl.pallas_call(kernel, out_shape=S((8, 128), F32))(x),
                      [S((8, 128), F32)], ())["pallasCalls"]
    unknown = call["unknownPrimitives"]
    assert "prng_random_bits" in unknown
    assert any(u.startswith("while") for u in unknown)
    # Priced primitives are not listed.
    assert not {"add", "convert_element_type", "get", "swap", "prng_seed"} & set(unknown)


def test_static_loops_in_the_body_multiply_dot_counts():
    trips, unrolled, n = 3, 2, 128

    def kernel(x_ref, w_ref, o_ref):
        def step(i, c):
            return jnp.dot(c, w_ref[...], preferred_element_type=F32)
        y = jax.lax.fori_loop(0, trips, step, x_ref[...])
        for _ in range(unrolled):  # a Python loop: separate equations, identical sizes
            y = jnp.dot(y, w_ref[...], preferred_element_type=F32)
        o_ref[...] = y

    st = extract(lambda x, w: pl.pallas_call(kernel, out_shape=S((8, n), F32))(x, w),
                 [S((8, n), F32), S((n, n), F32)], ())
    (dot,) = st["pallasCalls"][0]["stepDots"]  # identical matmuls merge into one entry
    assert dot_sizes(dot) == (1, 8, n, n) and dot["count"] == trips + unrolled
    assert st["pallasCalls"][0]["stepVpuFlops"] == 0
