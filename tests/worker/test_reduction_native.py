"""Native specs reduce by dim NAME: equal sizes shrink independently, unblocked dims shrink,
divisibility survives, the reduction is validated against the reference, and scalar-prefetch
extraction draws only the integer inputs."""
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from maxkernel_worker.extract import extract
from maxkernel_worker.reduction import reduced_sizes
from maxkernel_worker.task import open_task

GQA = """
import jax, jax.numpy as jnp
def reference(q, k, v):
    b, hq, s, d = q.shape
    hkv = k.shape[1]
    qg = q.reshape(b, hkv, hq // hkv, s, d)
    p = jax.nn.softmax(jnp.einsum("bngqd,bnkd->bngqk", qg, k), axis=-1)
    return jnp.einsum("bngqk,bnkd->bngqd", p, v).reshape(q.shape)
"""


def inp(name, names, sizes, dtype="float32", **extra):
    return dict({"name": name, "type": {"shape": sizes, "dtype": dtype}, "dimNames": names,
                 "generator": {"normal": {"mean": 0.0, "std": 1.0}}}, **extra)


def gqa_spec(reference=GQA, name="gqa_named"):
    dims = {"B": 4, "HQ": 8, "HKV": 2, "S": 2048, "D": 128}
    shape = lambda names: [dims[n] for n in names]
    ins = [inp("q", ["B", "HQ", "S", "D"], shape(["B", "HQ", "S", "D"])),
           inp("k", ["B", "HKV", "S", "D"], shape(["B", "HKV", "S", "D"])),
           inp("v", ["B", "HKV", "S", "D"], shape(["B", "HKV", "S", "D"]))]
    return {"name": name, "format": "native", "reference": reference,
            "dims": [{"name": n, "size": s} for n, s in dims.items()],
            "configurations": [{"inputs": ins}]}


def test_names_shrink_independently_of_equal_sizes_and_keep_divisibility():
    task = open_task(gqa_spec())
    # a kernel tiling S by 512 on q (block (1, 1, 512, 128): D is a full last-dim block)
    blocks = [((4, 8, 2048, 128), (None, None, 512, 128)), ((4, 2, 2048, 128), (None, None, 512, 128))]
    sizes = reduced_sizes(task, 0, blocks)
    assert sizes["S"] == 1024 and "D" not in sizes            # two steps of 512; D frozen
    hq, hkv = sizes.get("HQ", 8), sizes.get("HKV", 2)
    assert hq % hkv == 0 and hq // hkv >= 2 and hq <= 8
    assert sizes.get("B", 4) <= 4
    args = task.make_args(0, 1, sizes)
    assert [a.shape for a in args] == [(sizes.get("B", 4), hq, 1024, 128), (sizes.get("B", 4), hkv, 1024, 128),
                                       (sizes.get("B", 4), hkv, 1024, 128)]
    assert task.reference(0)(*args).shape == args[0].shape


def test_equal_sized_dims_are_not_frozen_together():
    spec = gqa_spec(name="gqa_equal")
    spec["dims"][1]["size"] = 128                               # HQ = D = 128
    for i in (0,):
        spec["configurations"][0]["inputs"][i]["type"]["shape"][1] = 128
    task = open_task(spec)
    blocks = [((4, 128, 2048, 128), (None, None, 512, 128))]   # D frozen (full last-dim block)
    sizes = reduced_sizes(task, 0, blocks)
    assert "D" not in sizes and sizes["HQ"] < 128 and sizes["HQ"] % sizes.get("HKV", 2) == 0


def test_unblocked_dims_shrink_without_a_kernel():
    task = open_task(gqa_spec(name="gqa_free"))
    sizes = reduced_sizes(task, 0, [])
    assert sizes["S"] <= 16 and "D" not in sizes                # D=128 is within the last-axis cap
    args = task.make_args(0, 0, sizes)
    assert args[0].shape[2] == sizes["S"] and args[1].shape[2] == sizes["S"]


def test_reduction_is_validated_and_falls_back():
    # a reference that only works on at least 64 tokens: the first plan (16) fails, the
    # gentler one (x4 = 64) passes
    picky = GQA + "\n_inner = reference\ndef reference(q, k, v):\n    assert q.shape[2] >= 64\n    return _inner(q, k, v)\n"
    sizes = reduced_sizes(open_task(gqa_spec(picky, "gqa_picky")), 0, [])
    assert sizes["S"] == 64
    # one that needs the full size gets none
    strict = GQA + "\n_inner = reference\ndef reference(q, k, v):\n    assert q.shape[2] == 2048\n    return _inner(q, k, v)\n"
    sizes = reduced_sizes(open_task(gqa_spec(strict, "gqa_strict")), 0, [])
    assert "S" not in sizes


def _prefetch_kernel(x, idx):
    # scalar prefetch: row block i of x is read at idx[i]
    def body(idx_ref, x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2

    spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1, grid=(idx.shape[0],),
        in_specs=[pl.BlockSpec((8, 128), lambda i, idx_ref: (idx_ref[i], 0))],
        out_specs=pl.BlockSpec((8, 128), lambda i, idx_ref: (i, 0)))
    return pl.pallas_call(body, grid_spec=spec,
                          out_shape=jax.ShapeDtypeStruct((idx.shape[0] * 8, 128), x.dtype))(idx, x)


def test_prefetch_args_draw_integers_and_leave_floats_unallocated():
    spec = {"name": "prefetch_big", "format": "native",
            "reference": "def reference(x, idx):\n    return x[:idx.shape[0] * 8]\n",
            "dims": [{"name": "R", "size": 1 << 22}, {"name": "N", "size": 4}],
            "configurations": [{"inputs": [
                inp("x", ["R", ""], [1 << 22, 128], "float32"),          # 2 GiB at full size
                inp("idx", ["N"], [4], "int32", generator={"randint": {"low": 0, "high": 7}},
                    structural=True)]}]}
    task = open_task(spec)
    args = task.prefetch_args(0, 3)
    x, idx = args
    assert x.shape == (1 << 22, 128) and x.dtype == np.float32
    assert x.strides == (0, 0)                                   # a view of one zero: no memory
    assert np.array_equal(np.asarray(idx), np.asarray(task.placeholder_args(0, 3, None, 0)[1]))
    assert np.asarray(idx).min() >= 0 and np.asarray(idx).max() < 7
    structure = extract(_prefetch_kernel, task.abstract_args(0), task.static_argnums(0),
                        concrete_args=lambda: task.prefetch_args(0, 3))
    assert structure["pallasCalls"], "the kernel's call was found"


def test_count_dims_shrink_further_when_blocked_dims_keep_the_reference_large():
    # Attention scores at S=4096 stay large when the kernel tiles S by 2048 (two steps needed):
    # batch and heads then go as low as the HQ/HKV relation allows.
    reference = """
import jax, jax.numpy as jnp
def reference(q, k):
    rep = q.shape[1] // k.shape[1]
    k = jnp.repeat(k, rep, axis=1)
    s = jnp.einsum("bhqd,bhkd->bhqk", q.astype(jnp.float32), k.astype(jnp.float32))
    return jax.nn.softmax(s, axis=-1).sum(-1)
"""
    dims = {"B": 4, "HQ": 32, "HKV": 8, "S": 4096, "D": 128}
    spec = {
        "schemaVersion": 1, "name": "scores", "format": "native", "sourcePath": "/x/scores.yaml",
        "dims": [{"name": n, "size": v} for n, v in dims.items()],
        "configurations": [{"name": "default", "inputs": [
            {"name": "q", "type": {"shape": [4, 32, 4096, 128], "dtype": "bfloat16"},
             "generator": {"normal": {"mean": 0.0, "std": 1.0}}, "dimNames": ["B", "HQ", "S", "D"]},
            {"name": "k", "type": {"shape": [4, 8, 4096, 128], "dtype": "bfloat16"},
             "generator": {"normal": {"mean": 0.0, "std": 1.0}}, "dimNames": ["B", "HKV", "S", "D"]},
        ], "outputs": []}],
        "reference": reference, "referenceEntry": "reference",
        "tolerances": [{"output": -1, "atol": 1e-2, "rtol": 1e-2}],
    }
    task = open_task(spec)
    blocks = [((4, 32, 4096, 128), (None, None, 2048, 128)), ((4, 8, 4096, 128), (None, None, 2048, 128))]
    sizes = reduced_sizes(task, 0, blocks)
    assert "S" not in sizes                       # two steps of 2048 keep it at 4096
    # B and the heads are squeezed blocks (size 1): two grid steps each at the least
    assert sizes["B"] == 2
    assert sizes["HQ"] % sizes["HKV"] == 0 and sizes["HQ"] >= 2 * sizes["HKV"]
    # without the second plan, B stays 4 (under its cap of 8) and HQ 16: 4 GiB of scores
    assert sizes["B"] * sizes["HQ"] < 4 * 16
