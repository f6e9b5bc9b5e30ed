"""extract(): the structure of Pallas kernels, ours and the ones shipped with the pinned JAX."""

import json
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

from maxkernel_worker.errors import WorkerError  # noqa: E402
from maxkernel_worker.extract import blocks_of, extract  # noqa: E402
from maxkernel_worker.schema import load_schemas  # noqa: E402

S = jax.ShapeDtypeStruct
F32 = jnp.float32


@pytest.fixture(scope="module")
def schema():
    return load_schemas(str(ROOT / "messages" / "schema"))


def check_schema(schema, structure):
    msg = schema.KernelStructure.new_message(**structure)
    back = msg.to_dict()
    assert len(back.get("pallasCalls", [])) == len(structure["pallasCalls"])
    for call, got in zip(structure["pallasCalls"], back.get("pallasCalls", [])):
        assert list(got["grid"]) == call["grid"]
        assert len(got["operands"]) == len(call["operands"])


def dep(operand, axis):
    return next(d for d in operand["dependence"] if d["axis"] == axis)


def operand(call, role, index):
    return next(o for o in call["operands"] if o["role"] == role and o["index"] == index)


# ----------------------------------------------------------------------------- our own kernels

def tiled_matmul(x, y, bm, bn, bk):
    m, k = x.shape
    n = y.shape[1]

    def kernel(x_ref, y_ref, o_ref, acc_ref):
        @pl.when(pl.program_id(2) == 0)
        def _():
            acc_ref[...] = jnp.zeros_like(acc_ref)

        acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

        @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
        def _():
            o_ref[...] = acc_ref[...].astype(o_ref.dtype)

    return pl.pallas_call(
        kernel,
        grid=(m // bm, n // bn, k // bk),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
                  pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")),
    )(x, y)


def test_tiled_matmul(schema):
    m, n, k, bm, bn, bk = 128, 96, 256, 32, 48, 64
    # x arrives transposed: the transpose is work outside the kernel.
    st = extract(lambda xt, y: tiled_matmul(xt.T, y, bm, bn, bk),
                 [S((k, m), jnp.bfloat16), S((k, n), jnp.bfloat16)], ())
    assert st["schemaVersion"] == 1
    (call,) = st["pallasCalls"]
    assert call["grid"] == [m // bm, n // bn, k // bk]
    assert call["dimensionSemantics"] == ["parallel", "parallel", "arbitrary"]
    assert call["numScalarPrefetch"] == 0 and call["count"] == 1
    assert call["name"] == "kernel"

    x, y, out = operand(call, "input", 0), operand(call, "input", 1), operand(call, "output", 0)
    assert x["type"] == {"shape": [m, k], "dtype": "bfloat16"}
    assert x["blockShape"] == [bm, bk] and x["blockBytes"] == bm * bk * 2
    assert x["memorySpace"] == "vmem" and x["buffering"] == 2
    # x moves with axes 0 and 2, not 1; y with 1 and 2; the output with 0 and 1.
    assert [dep(x, a)["kind"] for a in range(3)] == ["affine", "none", "affine"]
    assert dep(x, 0)["deltas"] == [1, 0] and dep(x, 2)["deltas"] == [0, 1]
    assert [dep(y, a)["kind"] for a in range(3)] == ["none", "affine", "affine"]
    assert dep(y, 1)["deltas"] == [0, 1] and dep(y, 2)["deltas"] == [1, 0]
    assert [dep(out, a)["kind"] for a in range(3)] == ["affine", "affine", "none"]
    assert [dep(out, a)["changeFraction"] for a in range(3)] == [1.0, 1.0, 0.0]
    assert dep(x, 1)["changeFraction"] == 0.0

    # Per step: the block matmul, plus the accumulator add, the cast of the pl.when finalize
    # branch (a cond counts its most expensive branch) and a few scalar ops.
    dot = 2 * bm * bn * bk
    assert dot <= call["stepFlops"] <= dot + 2 * bm * bn + 16
    assert call["stepTranscendentals"] == 0
    assert "dot_general" in call["bodyPrimitives"]
    assert call["scratch"] == [{"type": {"shape": [bm, bn], "dtype": "float32"},
                                "memorySpace": "vmem", "bytes": bm * bn * 4}]
    assert call["costFlops"] == 0  # this kernel gives no CostEstimate

    outside = st["outside"]
    prims = [nd["primitive"] for nd in outside["nodes"]]
    assert prims == ["transpose", "pallas_call"]
    assert json.loads(outside["nodes"][1]["params"])["pallasCall"] == 0
    assert outside["nodes"][1]["operandIds"] == [0, -1]
    assert outside["nodes"][0]["bytes"] == 2 * (2 * m * k)

    assert blocks_of(st) == [((m, k), (bm, bk)), ((k, n), (bk, bn)), ((m, n), (bm, bn))]
    check_schema(schema, st)


def test_untiled_k_step_flops_are_exact():
    m, n, k, bm, bn = 64, 64, 32, 16, 32

    def mm(x, y):
        return pl.pallas_call(
            lambda x_ref, y_ref, o_ref: o_ref.__setitem__(
                ..., jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)),
            grid=(m // bm, n // bn),
            in_specs=[pl.BlockSpec((bm, k), lambda i, j: (i, 0)),
                      pl.BlockSpec((k, bn), lambda i, j: (0, j))],
            out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
            out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32))(x, y)

    (call,) = extract(mm, [S((m, k), F32), S((k, n), F32)], ())["pallasCalls"]
    assert call["stepFlops"] == 2 * bm * bn * k
    # Per step the body loads both blocks and stores one output block.
    assert call["stepBytes"] == 4 * (bm * k + k * bn + bm * bn)
    assert call["dimensionSemantics"] == ["arbitrary", "arbitrary"]


def test_squeezed_dims_buffering_and_aliases():
    b, r, c = 4, 16, 128

    def f(x):
        return pl.pallas_call(
            lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...] * 2.0),
            grid=(b, r // 8),
            in_specs=[pl.BlockSpec((None, 8, c), lambda i, j: (i, j, 0),
                                   pipeline_mode=pl.Buffered(1))],
            out_specs=pl.BlockSpec((None, 8, c), lambda i, j: (i, j, 0)),
            out_shape=jax.ShapeDtypeStruct((b, r, c), F32),
            input_output_aliases={0: 0},
            compiler_params=pltpu.CompilerParams(vmem_limit_bytes=48 * 2 ** 20))(x)

    st = extract(f, [S((b, r, c), F32)], ())
    (call,) = st["pallasCalls"]
    x = operand(call, "input", 0)
    assert x["blockShape"] == [-1, 8, c] and x["blockBytes"] == 8 * c * 4
    assert x["buffering"] == 1 and operand(call, "output", 0)["buffering"] == 2
    assert dep(x, 0)["deltas"] == [1, 0, 0] and dep(x, 1)["deltas"] == [0, 1, 0]
    assert call["inputOutputAliases"] == [0, 0]
    assert call["vmemLimitBytes"] == 48 * 2 ** 20
    assert call["stepFlops"] == 8 * c
    assert blocks_of(st)[0] == ((b, r, c), (-1, 8, c))


def test_large_grid_is_sampled_along_axes():
    # 2**20 grid steps: index maps are evaluated along each axis, never over the grid.
    g0, g1 = 2 ** 13, 2 ** 7

    def f(x):
        return pl.pallas_call(
            lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...] + 1.0),
            grid=(g0, g1),
            in_specs=[pl.BlockSpec((8, 128), lambda i, j: (i // 2, j))],
            out_specs=pl.BlockSpec((8, 128), lambda i, j: (i, 3 * j)),
            out_shape=jax.ShapeDtypeStruct((g0 * 8, 3 * g1 * 128), F32))(x)

    (call,) = extract(f, [S((g0 * 4, g1 * 128), F32)], ())["pallasCalls"]
    x, out = operand(call, "input", 0), operand(call, "output", 0)
    # i // 2 changes on every other step: not affine, about half the steps.
    assert dep(x, 0)["kind"] == "irregular"
    assert 0.4 < dep(x, 0)["changeFraction"] < 0.6
    assert dep(x, 1)["kind"] == "affine" and dep(x, 1)["deltas"] == [0, 1]
    assert dep(out, 1)["deltas"] == [0, 3] and dep(out, 0)["deltas"] == [1, 0]


def test_pallas_call_in_scan_is_counted():
    n, steps = 128, 5

    def add_one(x):
        return pl.pallas_call(lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...] + 1.0),
                              out_shape=jax.ShapeDtypeStruct((8, n), F32))(x)

    def f(x):
        return jax.lax.scan(lambda c, _: (add_one(c) * 2.0, None), x, None, length=steps)[0]

    st = extract(f, [S((8, n), F32)], ())
    (call,) = st["pallasCalls"]
    assert call["count"] == steps and call["grid"] == []
    (mul,) = [nd for nd in st["outside"]["nodes"] if nd["primitive"] == "mul"]
    assert mul["count"] == steps and st["outside"]["flops"] == steps * 8 * n


def test_no_pallas_call_and_trace_errors():
    st = extract(lambda x: jnp.exp(x).sum(), [S((4, 8), F32)], ())
    assert st["pallasCalls"] == []
    assert st["outside"]["transcendentals"] == 32
    with pytest.raises(WorkerError) as e:
        extract(lambda x: x.reshape(7), [S((4, 8), F32)], ())
    assert e.value.error_class == "traceError"


# ----------------------------------------------------------------------------- JAX's own kernels

def test_jax_ops_matmul(schema):
    from jax.experimental.pallas.ops.tpu.matmul import matmul

    m, k, n, l, r, bk = 256, 512, 384, 128, 128, 256
    st = extract(lambda x, y: matmul(x, y, block_shape=(l, r), block_k=bk),
                 [S((m, k), F32), S((k, n), F32)], ())
    (call,) = st["pallasCalls"]
    assert call["grid"] == [m // l, n // r, k // bk]
    x, y = operand(call, "input", 0), operand(call, "input", 1)
    assert [dep(x, a)["kind"] for a in range(3)] == ["affine", "none", "affine"]
    assert [dep(y, a)["kind"] for a in range(3)] == ["none", "affine", "affine"]
    assert 2 * l * r * bk <= call["stepFlops"] <= 2 * l * r * bk + 2 * l * r + 16
    check_schema(schema, st)


@pytest.mark.parametrize("causal", [False, True])
def test_jax_ops_flash_attention(schema, causal):
    from jax.experimental.pallas.ops.tpu.flash_attention import BlockSizes, flash_attention

    b, h, s, d, blk = 1, 2, 256, 128, 128
    sizes = BlockSizes(block_q=blk, block_k_major=blk, block_k=blk, block_b=1)
    st = extract(lambda q, k, v: flash_attention(q, k, v, causal=causal, block_sizes=sizes),
                 [S((b, h, s, d), F32)] * 3, ())
    (call,) = st["pallasCalls"]
    assert call["grid"] == [b, h, s // blk, s // blk]
    assert call["dimensionSemantics"][-1] == "arbitrary"
    assert call["costFlops"] > 0 and call["costTranscendentals"] > 0  # its own CostEstimate
    assert call["stepTranscendentals"] >= blk * blk  # exp of one score block
    # QK^T and PV of one block, on the share of steps that run them: causal skips the blocks
    # above the diagonal (pl.when weighted by the grid), n(n+1)/2 of n^2 with n blocks per side.
    n = s // blk
    share = n * (n + 1) / 2 / n ** 2 if causal else 1.0
    assert call["stepFlops"] >= share * 2 * (2 * blk * blk * d)
    k_op = operand(call, "input", 1)
    q_op = operand(call, "input", 0)
    assert dep(q_op, 3)["kind"] == "none"  # q stays put while kv blocks stream
    if causal:
        # Blocks above the diagonal are skipped by clamping the kv index: not affine.
        assert dep(k_op, 3)["kind"] == "irregular"
        assert 0.0 < dep(k_op, 3)["changeFraction"] < 1.0
    else:
        assert dep(k_op, 3)["kind"] == "affine" and dep(k_op, 3)["deltas"] == [0, 0, 1, 0]
    check_schema(schema, st)


def test_jax_ops_paged_attention(schema):
    from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention

    batch, heads, kv_heads, d, pages, page_size, pages_per_seq = 2, 4, 2, 128, 16, 16, 4
    args = [S((batch, heads, d), F32), S((kv_heads, pages, page_size, d), F32),
            S((kv_heads, pages, page_size, d), F32), S((batch,), jnp.int32),
            S((batch, pages_per_seq), jnp.int32)]
    calls = []

    def concrete():
        calls.append(1)
        rng = np.random.default_rng(0)
        return [jnp.ones(a.shape, a.dtype) for a in args[:3]] + [
            jnp.array([40, 64], jnp.int32),
            jnp.asarray(rng.permutation(pages)[:batch * pages_per_seq]
                        .reshape(batch, pages_per_seq).astype(np.int32))]

    st = extract(lambda q, k, v, ln, pi: paged_attention(q, k, v, ln, pi,
                                                          pages_per_compute_block=2),
                 args, (), concrete)
    (call,) = st["pallasCalls"]
    # Lengths, the flattened page table and two pipeline counters go through scalar prefetch.
    assert call["numScalarPrefetch"] == 4
    prefetch = [o for o in call["operands"] if o["role"] == "scalarPrefetch"]
    assert {"shape": [batch * pages_per_seq], "dtype": "int32"} in [o["type"] for o in prefetch]
    assert all(o["memorySpace"] == "smem" for o in prefetch)
    # The kv pages stay in HBM: the kernel DMAs the pages its page table names by hand.
    k_pages = operand(call, "input", 1)
    assert k_pages["memorySpace"] == "any" and k_pages["buffering"] == 0
    assert "dma_start" in call["bodyPrimitives"]
    # No index map reads the tables; the kernel's pl.when predicates read the lengths table,
    # so the concrete args are computed at most once.
    assert len(calls) <= 1
    assert any(nd["primitive"] == "reshape" for nd in st["outside"]["nodes"])
    check_schema(schema, st)


def test_jax_ops_megablox_gmm(schema):
    gmm_mod = pytest.importorskip("jax.experimental.pallas.ops.tpu.megablox")
    m, k, n, groups, tm = 512, 256, 256, 4, 128
    sizes = [100, 0, 300, 112]
    args = [S((m, k), F32), S((groups, k, n), F32), S((groups,), jnp.int32)]

    def f(lhs, rhs, group_sizes):
        return gmm_mod.gmm(lhs, rhs, group_sizes, tiling=(tm, 128, 128))

    def concrete():
        return [jnp.ones((m, k), F32), jnp.ones((groups, k, n), F32),
                jnp.array(sizes, jnp.int32)]

    # The row tiles each non-empty group touches, in visiting order.
    tile_ids, start = [], 0
    for size in sizes:
        if size:
            tile_ids += list(range(start // tm, (start + size - 1) // tm + 1))
        start += size
    changes = sum(a != b for a, b in zip(tile_ids, tile_ids[1:])) / (len(tile_ids) - 1)

    st = extract(f, args, (), concrete)
    (call,) = st["pallasCalls"]
    assert call["numScalarPrefetch"] > 0
    assert call["grid"] == [n // 128, len(tile_ids), k // 128]  # dynamic size evaluated
    lhs = operand(call, "input", 0)
    assert dep(lhs, 1)["kind"] == "irregular"  # row tile looked up in a group table
    assert dep(lhs, 1)["changeFraction"] == pytest.approx(changes)
    assert dep(lhs, 2)["kind"] == "affine" and dep(lhs, 2)["deltas"] == [0, 1]
    assert call["costFlops"] > 0
    check_schema(schema, st)

    # Without the task's values the dynamic axis and the table lookups stay unknown.
    (blind,) = extract(f, args, ())["pallasCalls"]
    assert blind["grid"][1] == -1
    assert dep(operand(blind, "input", 0), 1) == {"axis": 1, "kind": "irregular", "deltas": [],
                                                    "changeFraction": 1.0}


def test_prefetch_tables_from_task_values_and_bad_task_inputs():
    # A gather by block: block i of the output reads block table[i] of x.
    n_blocks, rows = 6, 8
    table = [3, 3, 0, 5, 1, 1]

    def gather(tbl, x):
        return pl.pallas_call(
            lambda t_ref, x_ref, o_ref: o_ref.__setitem__(..., x_ref[...]),
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=1, grid=(n_blocks,),
                in_specs=[pl.BlockSpec((rows, 128), lambda i, t: (t[i], 0))],
                out_specs=pl.BlockSpec((rows, 128), lambda i, t: (i, 0))),
            out_shape=jax.ShapeDtypeStruct((n_blocks * rows, 128), F32))(tbl, x)

    def f(tbl, x):
        return gather(tbl * 1, x)  # the table is computed outside the kernel

    args = [S((n_blocks,), jnp.int32), S((n_blocks * rows, 128), F32)]
    st = extract(f, args, (), lambda: [jnp.array(table, jnp.int32),
                                       jnp.zeros((n_blocks * rows, 128), F32)])
    (call,) = st["pallasCalls"]
    x_dep = dep(operand(call, "input", 0), 0)
    changes = sum(a != b for a, b in zip(table, table[1:])) / (len(table) - 1)
    assert x_dep["kind"] == "irregular"
    assert x_dep["changeFraction"] == pytest.approx(changes)
    assert dep(operand(call, "output", 0), 0)["deltas"] == [1, 0]

    with pytest.raises(WorkerError) as e:
        extract(f, args, (), lambda: [jnp.array(table, jnp.int32), jnp.zeros((4, 128), F32)])
    assert e.value.error_class == "badInput" and "input array 1" in e.value.message


def test_jax_ops_splash_attention_tables_are_trace_constants(schema):
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

    heads, seq, d, blk = 2, 512, 128, 128
    mask = sm.MultiHeadMask([sm.CausalMask((seq, seq)) for _ in range(heads)])
    kernel = sk.make_splash_mha(mask, head_shards=1, q_seq_shards=1,
                                block_sizes=sk.BlockSizes(block_q=blk, block_kv=blk,
                                                          block_kv_compute=blk))
    # The block-sparsity tables are numpy constants of the trace: no task values needed.
    st = extract(lambda q, k, v: kernel(q, k, v), [S((heads, seq, d), jnp.bfloat16)] * 3, ())
    (call,) = st["pallasCalls"]
    assert call["grid"] == [heads, seq // blk, seq // blk]
    assert call["numScalarPrefetch"] > 0
    k_dep = dep(operand(call, "input", 1), 2)
    # Causal: the kv block advances only below the diagonal, looked up in the tables.
    assert k_dep["kind"] == "irregular" and 0.0 < k_dep["changeFraction"] < 1.0
    check_schema(schema, st)


def test_vmapped_kernel_gets_a_parallel_axis():
    def exp_kernel(x):
        return pl.pallas_call(
            lambda x_ref, o_ref: o_ref.__setitem__(..., jnp.exp(x_ref[...])),
            grid=(2,),
            in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
            out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
            out_shape=jax.ShapeDtypeStruct((16, 128), F32),
            compiler_params=pltpu.CompilerParams(dimension_semantics=(pltpu.ARBITRARY,)))(x)

    (call,) = extract(jax.vmap(exp_kernel), [S((3, 16, 128), F32)], ())["pallasCalls"]
    assert call["grid"] == [3, 2]
    assert call["dimensionSemantics"] == ["parallel", "arbitrary"]
    assert call["stepTranscendentals"] == 8 * 128
    x = operand(call, "input", 0)
    assert x["blockShape"] == [-1, 8, 128]
    assert dep(x, 0)["deltas"] == [1, 0, 0] and dep(x, 1)["deltas"] == [0, 1, 0]


def test_numpy_index_map_evaluator_agrees_with_jax():
    # extract() evaluates index maps with numpy for speed; JAX's own evaluation is the truth.
    from maxkernel_worker.extract import _eval_index_map, _jax_eval

    def f(tbl, x):
        return pl.pallas_call(
            lambda t_ref, x_ref, o_ref: o_ref.__setitem__(..., x_ref[...]),
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=1, grid=(7, 5),
                in_specs=[pl.BlockSpec((8, 128), lambda i, j, t: (
                    jnp.minimum(i, 3) // 2 + t[j] % 3,
                    jnp.where(j % 3 == 0, j, jnp.maximum(2 * j - 7, 0) // 3)))],
                out_specs=pl.BlockSpec((8, 128), lambda i, j, t: (i, (j - 6) // 4 + 2))),
            out_shape=jax.ShapeDtypeStruct((56, 640), F32))(tbl, x)

    closed = jax.make_jaxpr(f)(S((5,), jnp.int32), S((64, 1024), F32))
    (eqn,) = [e for e in closed.jaxpr.eqns if e.primitive.name == "pallas_call"]
    ii, jj = np.meshgrid(np.arange(7), np.arange(5), indexing="ij")
    points = [ii.reshape(-1), jj.reshape(-1)]
    table = np.array([4, -1, 7, 2, 9], np.int32)
    for bm in eqn.params["grid_mapping"].block_mappings:
        fast = _eval_index_map(bm.index_map_jaxpr, points, [table])
        slow = _jax_eval(bm.index_map_jaxpr, [p.astype(np.int64) for p in points] + [table], 2)
        assert fast.tolist() == np.stack([np.asarray(r).reshape(-1) for r in slow], 1).tolist()
