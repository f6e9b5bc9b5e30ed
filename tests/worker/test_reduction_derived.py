"""Derived dims (NamedDim.expression, e.g. SEQ_BOUNDS = MAX_SEQS + 1): the restricted evaluator,
how a NativeTask recomputes them from (reduced) dims, and how the by-name reduction keeps them
derived instead of shrinking them on their own."""
import os

import jax.numpy as jnp
import numpy as np
import pytest

from maxkernel_worker import dim_expression
from maxkernel_worker.errors import WorkerError
from maxkernel_worker.reduction import reduced_sizes
from maxkernel_worker.schema import load_schemas
from maxkernel_worker.task import open_task

SCHEMA = os.path.join(os.path.dirname(__file__), "..", "..", "messages", "schema")
ks = load_schemas(SCHEMA)   # loaded as test_task_native.py does (one way per process)


@pytest.mark.parametrize("text,value", [
    ("MAX_SEQS + 1", 65), ("D // 2", 64), ("2 + 3 * 4", 14), ("(2 + 3) * 4", 20),
    ("10 - 4 - 3", 3), ("100 // 10 // 3", 3), ("(1 - 8) // 2", -4), ("7 // (1 - 3)", -4),
    ("  ((MAX_SEQS))  ", 64)])
def test_the_grammar_evaluates_as_python_integers(text, value):
    tree = dim_expression.parse(text, "X")
    assert dim_expression.evaluate(tree, {"MAX_SEQS": 64, "D": 128}, "X") == value


@pytest.mark.parametrize("text,part", [
    ("M / 2", "Div"), ("M ** 2", "Pow"), ("M % 2", "Mod"), ("-M", "UnaryOp"),
    ("__import__('os').system('true')", "Call"), ("M.bit_length", "Attribute"),
    ("M[0]", "Subscript"), ("M if M else 1", "IfExp"), ("M and 1", "BoolOp"),
    ("M < 2", "Compare"), ("1.5", "decimal integer"), ("0x10", "decimal integer"),
    ("1_000", "decimal integer"), ("True", "decimal integer"), ("'8'", "decimal integer"),
    ("M +", "not an expression"), ("x = 1", "not an expression"), ("", "not an expression"),
    ("1" * 1001, "the limit is 1000")])
def test_everything_else_is_refused_without_evaluating_it(text, part):
    with pytest.raises(WorkerError) as e:
        dim_expression.parse(text, "X")
    assert e.value.error_class == "badInput" and part in e.value.message


def test_division_by_zero_and_int64_overflow_are_errors():
    with pytest.raises(WorkerError, match=r"division by zero \(128 // 0\)"):
        dim_expression.evaluate(dim_expression.parse("D // (K - 4)"), {"D": 128, "K": 4}, "X")
    with pytest.raises(WorkerError, match="does not fit in 64 bits"):
        dim_expression.evaluate(dim_expression.parse("M * M"), {"M": 1 << 32}, "X")


def test_long_chains_evaluate_without_deep_recursion():
    tree = dim_expression.parse("+".join(["1"] * 500))   # 999 characters
    assert dim_expression.evaluate(tree, {}) == 500


# --------------------------------------------------------------------------- native tasks

RAGGED_REFERENCE = """
import jax.numpy as jnp
def reference(q, lens, cu):
    # cu holds one bound more than there are sequences (cu_q_lens of ragged paged attention)
    assert cu.shape[0] == lens.shape[0] + 1, (cu.shape, lens.shape)
    seq = jnp.searchsorted(cu[1:], jnp.arange(q.shape[0]), side="right")
    seq = jnp.minimum(seq, lens.shape[0] - 1)
    return q * lens[seq][:, None].astype(q.dtype)
"""

CU = """
import numpy as np
def generate(rng, shape, dtype, dims):
    assert shape[0] == dims["MAX_SEQS"] + 1
    cuts = np.sort(rng.choice(np.arange(1, dims["T"]), dims["MAX_SEQS"] - 1, replace=False))
    return np.concatenate([[0], cuts, [dims["T"]]])
"""


def ragged_spec(seq_bounds, name):
    """MAX_SEQS sequences over T tokens, cu [SEQ_BOUNDS]; seq_bounds is an expression or a size."""
    derived = isinstance(seq_bounds, str)
    dims = [{"name": "T", "size": 4096}, {"name": "D", "size": 128}, {"name": "MAX_SEQS", "size": 64},
            {"name": "SEQ_BOUNDS", "size": 65, "expression": seq_bounds if derived else ""}]
    full = {d["name"]: d["size"] for d in dims}

    def inp(n, names, dtype, generator, **extra):
        return dict({"name": n, "type": {"shape": [full[x] for x in names], "dtype": dtype},
                     "dimNames": names, "generator": generator}, **extra)
    inputs = [inp("q", ["T", "D"], "float32", {"normal": {"mean": 0.0, "std": 1.0}}),
              inp("lens", ["MAX_SEQS"], "int32", {"randint": {"low": 1, "high": 9}}, structural=True),
              inp("cu", ["SEQ_BOUNDS"], "int32", {"code": CU}, structural=True)]
    return {"name": name, "format": "native", "reference": RAGGED_REFERENCE,
            "referenceEntry": "reference", "dims": dims,
            "configurations": [{"name": "default", "inputs": inputs, "outputs": []}]}


def test_the_expression_travels_in_the_kernel_spec_message():
    m = ks.KernelSpec.new_message(name="t", format="native")
    dims = m.init("dims", 2)
    dims[0].name, dims[0].size = "MAX_SEQS", 64
    dims[1].name, dims[1].size, dims[1].expression = "SEQ_BOUNDS", 65, "MAX_SEQS + 1"
    c = m.init("configurations", 1)[0]
    i = c.init("inputs", 1)[0]
    i.name, i.type.shape, i.type.dtype, i.dimNames = "cu", [65], "int32", ["SEQ_BOUNDS"]
    i.generator.init("randint").high = 4
    task = open_task(m)
    assert task.dims == {"MAX_SEQS": 64, "SEQ_BOUNDS": 65}
    assert task.reduced_dims({"MAX_SEQS": 8}) == {"MAX_SEQS": 8, "SEQ_BOUNDS": 9}
    assert task.make_args(0, 0, {"MAX_SEQS": 8})[0].shape == (9,)


def test_derived_dims_are_recomputed_from_the_dims_they_read():
    task = open_task(ragged_spec("MAX_SEQS + 1", "ragged_derived_dims"))
    assert task.dims["SEQ_BOUNDS"] == 65
    assert task.reduced_dims({"MAX_SEQS": 16})["SEQ_BOUNDS"] == 17
    # a key by size applies to the dims that are not derived only
    assert task.reduced_dims({65: 8, 64: 4}) == {"T": 4096, "D": 128, "MAX_SEQS": 4, "SEQ_BOUNDS": 5}
    assert task.reduced_dims({"MAX_SEQS": 16, "SEQ_BOUNDS": 17})["SEQ_BOUNDS"] == 17
    with pytest.raises(WorkerError, match="derived dim SEQ_BOUNDS = 8"):
        task.reduced_dims({"MAX_SEQS": 16, "SEQ_BOUNDS": 8})


@pytest.mark.parametrize("dims,part", [
    ([{"name": "A", "size": 4}, {"name": "B", "size": 5, "expression": "A + 2"}], "has size 5, but A + 2 = 6"),
    ([{"name": "A", "size": 4}, {"name": "B", "size": 0, "expression": "C + 1"}], "unknown dim 'C'"),
    ([{"name": "A", "size": 0, "expression": "B // 2"}, {"name": "B", "size": 0, "expression": "A * 2"}],
     "cycle: A -> B -> A"),
    ([{"name": "A", "size": 4}, {"name": "B", "size": 0, "expression": "A - 4"}], "'A - 4' is 0 with A = 4"),
    ([{"name": "A", "size": 4}, {"name": "B", "size": 0, "expression": "open('x')"}], "Call is not allowed")])
def test_a_bad_derived_dim_is_bad_input(dims, part):
    spec = {"name": "bad_" + str(abs(hash(part))), "format": "native",
            "reference": "def reference(x):\n    return x\n", "dims": dims,
            "configurations": [{"inputs": [{"name": "x", "type": {"shape": [4], "dtype": "float32"},
                                            "dimNames": ["A"]}]}]}
    with pytest.raises(WorkerError) as e:
        open_task(spec)
    assert e.value.error_class == "badInput" and part in e.value.message


def test_reduction_keeps_seq_bounds_one_above_max_seqs():
    task = open_task(ragged_spec("MAX_SEQS + 1", "ragged_reduced"))
    sizes = reduced_sizes(task, 0, [])
    assert 1 < sizes["MAX_SEQS"] < 64 and sizes["T"] < 4096
    assert sizes["SEQ_BOUNDS"] == sizes["MAX_SEQS"] + 1        # reported, and recomputed
    for seed in (0, 1):
        q, lens, cu = task.make_args(0, seed, sizes)
        assert lens.shape == (sizes["MAX_SEQS"],) and cu.shape == (sizes["MAX_SEQS"] + 1,)
        assert int(np.asarray(cu)[-1]) == sizes["T"]
        out = task.reference(0)(q, lens, cu)
        assert out.shape == (sizes["T"], 128) and bool(jnp.isfinite(out).all())


def test_without_the_expression_the_two_dims_cannot_shrink_together():
    # the same task with SEQ_BOUNDS a literal 65: each plan shrinks it on its own, the reference
    # refuses every one of them, and MAX_SEQS is left at its full size
    task = open_task(ragged_spec(65, "ragged_literal"))
    sizes = reduced_sizes(task, 0, [])
    assert "MAX_SEQS" not in sizes and "SEQ_BOUNDS" not in sizes


def test_a_derived_dim_frozen_by_a_full_block_pins_what_it_reads():
    # W = 2 * N is the last axis of x; a kernel block spanning all of W freezes it, so N
    # (last axis of y, otherwise shrunk to 128) must stay whole too.
    dims = [{"name": "M", "size": 2048}, {"name": "N", "size": 512},
            {"name": "W", "size": 1024, "expression": "2 * N"}]
    spec = {"name": "frozen_derived", "format": "native",
            "reference": "def reference(x, y):\n    return x[:, :y.shape[1]] + y\n", "dims": dims,
            "configurations": [{"inputs": [
                {"name": "x", "type": {"shape": [2048, 1024], "dtype": "float32"}, "dimNames": ["M", "W"]},
                {"name": "y", "type": {"shape": [2048, 512], "dtype": "float32"}, "dimNames": ["M", "N"]}]}]}
    task = open_task(spec)
    assert reduced_sizes(task, 0, [])["W"] == 2 * reduced_sizes(task, 0, [])["N"]  # unfrozen: both shrink
    sizes = reduced_sizes(task, 0, [((2048, 1024), (256, 1024))])
    assert "W" not in sizes and "N" not in sizes
    assert sizes["M"] < 2048 and sizes["M"] % 256 == 0 and sizes["M"] >= 512


def test_a_derived_dim_that_would_vanish_pins_what_it_reads():
    # TAIL = T - 8 is 0 once T shrinks to its cap of 8: T is kept whole, so TAIL stays legal
    dims = [{"name": "T", "size": 4096}, {"name": "B", "size": 64},
            {"name": "TAIL", "size": 0, "expression": "T - 8"}]
    spec = {"name": "vanishing_derived", "format": "native",
            "reference": "def reference(a, b, c):\n    return a.sum() + b.sum() + c.sum()\n", "dims": dims,
            "configurations": [{"inputs": [
                {"name": "a", "type": {"shape": [4096], "dtype": "float32"}, "dimNames": ["T"]},
                {"name": "b", "type": {"shape": [64], "dtype": "float32"}, "dimNames": ["B"]},
                {"name": "c", "type": {"shape": [4088], "dtype": "float32"}, "dimNames": ["TAIL"]}]}]}
    task = open_task(spec)
    assert task.dims["TAIL"] == 4088
    sizes = reduced_sizes(task, 0, [])
    assert sizes == {"B": 8}
