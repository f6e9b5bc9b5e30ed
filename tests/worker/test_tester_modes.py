"""The tester's choices in EvalOptions (agents/tester, docs/agents.md): valueMode "large",
"zeros", "sparse" with valueScale, and shapeMode "ragged". A kernel wrong only on large
magnitudes or only on partial last blocks passes the default case and is caught by its mode;
inputs the reference does not allow (non-finite or degenerate output) skip the case, they
never fail it. Most tests drive the tester in process; the last ones go through the worker."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import candidate, matmul_spec, phase
from maxkernel_worker import generators, tester
from maxkernel_worker.candidate import load_candidate
from maxkernel_worker.errors import WorkerError
from maxkernel_worker.reduction import ragged_sizes, reduced_sizes
from maxkernel_worker.task import load_task_dir, open_task

SOFTMAX = """\
import jax
def reference(x):
    return jax.nn.softmax(x, axis=-1)
"""

ROW_NORMALIZE = """\
import jax.numpy as jnp
def reference(x):
    return x / jnp.sqrt(jnp.sum(x * x, axis=-1, keepdims=True))
"""

CAPPED = """\
import jax.numpy as jnp
def reference(x):
    return jnp.minimum(x, 4.0)
"""

# Row-wise kernels for the references above, written like softmax_rows.py (cdiv grid).
ROWWISE = """\
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

def _kernel(x_ref, o_ref):
    x = x_ref[...].astype(jnp.float32)
    o_ref[...] = ({body}).astype(o_ref.dtype)

def workload(x):
    m, n = x.shape
    return pl.pallas_call(
        _kernel, grid=(pl.cdiv(m, 128),),
        in_specs=[pl.BlockSpec((128, n), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((128, n), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype))(x)
"""


def rows_spec(reference=SOFTMAX, m=512, n=256, dtype="float32", tolerance=1e-4, name="rows",
              generator=None):
    return {
        "schemaVersion": 1, "name": name, "format": "native",
        "sourcePath": f"/nonexistent/specs/{name}.yaml",
        "dims": [{"name": "M", "size": m}, {"name": "N", "size": n}],
        "configurations": [{
            "name": "default",
            "inputs": [{"name": "x", "type": {"shape": [m, n], "dtype": dtype},
                        "generator": generator or {"normal": {"mean": 0.0, "std": 1.0}},
                        "dimNames": ["M", "N"]}],
            "outputs": [{"shape": [m, n], "dtype": dtype}],
        }],
        "reference": reference, "referenceEntry": "reference",
        "tolerances": [{"output": -1, "atol": tolerance, "rtol": tolerance}],
        "chip": "v5e",
    }


def _run(kernel, spec, tmp_path, options=None, source=None):
    cand = load_candidate(candidate(kernel, source), str(tmp_path))
    return tester.run_tests(cand, open_task(spec), spec, options or {})


def _rowwise(body):
    return ROWWISE.format(body=body)


# ---------------------------------------------------------------- value modes on inputs

def test_value_modes_touch_only_float_non_structural_arrays():
    x = np.arange(1, 9, dtype=np.float32).reshape(2, 4)
    ids = np.arange(8, dtype=np.int32)
    table = np.ones(4, np.float32)
    args = [x, ids, table, 0.5]
    structural = [False, True, True, False]
    large = generators.apply_value_mode(args, "large", 10.0, 0, structural)
    np.testing.assert_array_equal(np.asarray(large[0]), x * 10)
    assert large[1] is ids and large[2] is table and large[3] == 0.5
    assert np.asarray(generators.apply_value_mode(args, "large", 0.0, 0, structural)[0])[0, 0] \
        == generators.DEFAULT_LARGE_SCALE
    zeros = generators.apply_value_mode(args, "zeros", 0.0, 0, structural)
    assert not np.asarray(zeros[0]).any() and zeros[1] is ids
    assert generators.apply_value_mode(args, "", 0.0, 0, structural) == args


def test_sparse_zeroes_about_half_deterministically_per_seed():
    x = np.ones((64, 128), np.float32)
    a = np.asarray(generators.apply_value_mode([x], "sparse", 0.0, 3, [False])[0])
    b = np.asarray(generators.apply_value_mode([x], "sparse", 0.0, 3, [False])[0])
    c = np.asarray(generators.apply_value_mode([x], "sparse", 0.0, 4, [False])[0])
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert 0.4 < float((a == 0).mean()) < 0.6 and set(np.unique(a)) == {0.0, 1.0}


def test_large_values_past_the_dtype_range_become_inf():
    x = np.full((2, 2), 100.0, np.float16)
    out = np.asarray(generators.apply_value_mode([x], "large", 1000.0, 0, [False])[0])
    assert out.dtype == np.float16 and np.isinf(out).all()


# ---------------------------------------------------------------- the modes catch their kernels

def test_kernel_wrong_on_large_magnitudes_passes_default_and_fails_large(tmp_path):
    spec = rows_spec()
    report, failure = _run("softmax_no_max.py", spec, tmp_path, {"seeds": [0, 1]})
    assert failure is None, failure
    assert [c["kind"] for c in report["cases"]] == ["fresh", "fresh"]
    report, failure = _run("softmax_no_max.py", spec, tmp_path,
                           {"seeds": [0], "valueMode": "large", "valueScale": 1000.0})
    assert failure is not None and failure.error_class == "nonFinite", (failure, report)
    (case,) = report["cases"]
    assert case["kind"] == "large" and not case["passed"]
    assert "(large" in failure.message


def test_correct_softmax_passes_every_mode(tmp_path):
    spec = rows_spec()
    for options in ({"valueMode": "large"}, {"valueMode": "zeros"}, {"valueMode": "sparse"},
                    {"shapeMode": "ragged"}, {"shapeMode": "ragged", "valueMode": "large"}):
        report, failure = _run("softmax_rows.py", spec, tmp_path, dict(options, seeds=[5]))
        assert failure is None, (options, failure, report["notes"])
        kind = "+".join(m for m in (options.get("shapeMode"), options.get("valueMode")) if m)
        assert [c["kind"] for c in report["cases"]] == [kind]
        assert report["cases"][0]["passed"]


def test_f16_accumulator_overflows_only_on_large_inputs(tmp_path):
    spec = matmul_spec()
    report, failure = _run("matmul_f16_accumulator.py", spec, tmp_path, {"seeds": [0]})
    assert failure is None, failure
    report, failure = _run("matmul_f16_accumulator.py", spec, tmp_path,
                           {"seeds": [0], "valueMode": "large"})
    assert failure is not None and failure.error_class == "nonFinite", (failure, report)
    # the correct kernel accumulates in float32 and passes the same case
    report, failure = _run("matmul.py", spec, tmp_path, {"seeds": [0], "valueMode": "large"})
    assert failure is None, failure


def test_kernel_wrong_on_ragged_rows_passes_default_and_fails_ragged(tmp_path):
    spec = rows_spec()
    report, failure = _run("softmax_floor_grid.py", spec, tmp_path, {"seeds": [0]})
    assert failure is None, failure
    assert report["cases"][0]["inputShapes"] == "(256,256) float32"   # 2 full blocks of 128
    report, failure = _run("softmax_floor_grid.py", spec, tmp_path,
                           {"seeds": [0], "shapeMode": "ragged"})
    assert failure is not None and failure.error_class == "nonFinite", (failure, report)
    (case,) = report["cases"]
    # M: one full block of 128 and a partial one of 65; N is a full-size block: frozen
    assert case["kind"] == "ragged" and case["reduced"]
    assert case["inputShapes"] == "(193,256) float32"
    assert any("partial last blocks: M 193 (1 blocks of 128 + 65)" in n for n in report["notes"])


# ---------------------------------------------------------------- skips where the reference disallows

def test_zeros_skip_when_the_reference_is_not_finite(tmp_path):
    # x / ||x|| is 0/0 on zero rows: the case judges nothing, so it is skipped, not failed,
    # even though this kernel (no epsilon either) returns NaN too.
    spec = rows_spec(ROW_NORMALIZE, name="normalize")
    source = _rowwise("x / jnp.sqrt(jnp.sum(x * x, axis=-1, keepdims=True))")
    report, failure = _run("normalize.py", spec, tmp_path, {"seeds": [0]}, source)
    assert failure is None, failure
    report, failure = _run("normalize.py", spec, tmp_path,
                           {"seeds": [0], "valueMode": "zeros"}, source)
    assert isinstance(failure, tester.Skipped), failure
    assert report["cases"] == []
    assert "not finite on zeros inputs" in failure.message
    assert any("skipped" in n and "seed 0 (zeros)" in n for n in report["notes"])


def test_zeros_still_judge_a_finite_reference(tmp_path):
    # softmax of zeros is uniform: a kernel must return 1/N there
    spec = rows_spec()
    source = _rowwise("jnp.exp(x) / jnp.sum(jnp.exp(x), axis=-1, keepdims=True) * "
                      "jnp.where(jnp.all(x == 0), 0.0, 1.0)")
    report, failure = _run("zero_rows_wrong.py", spec, tmp_path, {"seeds": [0]}, source)
    assert failure is None, failure
    report, failure = _run("zero_rows_wrong.py", spec, tmp_path,
                           {"seeds": [0], "valueMode": "zeros"}, source)
    assert failure is not None and failure.error_class == "mismatch", failure


def test_large_skips_a_degenerate_reference(tmp_path):
    # min(x, 4) on x in [1, 2) scaled by 1000 is 4.0 everywhere: a constant kernel would
    # match it, so the case checks nothing
    spec = rows_spec(CAPPED, name="capped", generator={"uniform": {"low": 1.0, "high": 2.0}})
    source = _rowwise("jnp.minimum(x, 4.0)")
    report, failure = _run("capped.py", spec, tmp_path, {"seeds": [0]}, source)
    assert failure is None, failure
    report, failure = _run("capped.py", spec, tmp_path,
                           {"seeds": [0, 1], "valueMode": "large"}, source)
    assert isinstance(failure, tester.Skipped), failure
    assert "degenerate on large inputs (every element is 4.0)" in failure.message
    assert "and 1 more" in failure.message
    # sparse inputs are not degenerate there (zeros stay below the cap): judged
    report, failure = _run("capped.py", spec, tmp_path, {"seeds": [0], "valueMode": "sparse"},
                           source)
    assert failure is None and report["cases"][0]["kind"] == "sparse", failure


def test_a_failing_kernel_on_disallowed_inputs_is_skipped_not_failed(tmp_path):
    spec = rows_spec(ROW_NORMALIZE, name="normalize")
    source = _rowwise("x[0, 0] + jnp.ones_like(x)[(None,) * 3]")   # raises: too many indices
    report, failure = _run("raises.py", spec, tmp_path, {"seeds": [0], "valueMode": "zeros"},
                           source)
    assert isinstance(failure, tester.Skipped), failure
    report, failure = _run("raises.py", spec, tmp_path, {"seeds": [0]}, source)
    assert failure is not None and failure.error_class != "none"


def test_ragged_is_skipped_when_every_dim_is_a_full_block(tmp_path):
    # one block covering the whole (256, 256) array: both dims are frozen by the (8,128) rule
    spec = rows_spec(m=256, n=256)
    source = ROWWISE.replace("pl.cdiv(m, 128)", "1").replace("(128, n)", "(m, n)") \
        .format(body="jnp.exp(x - jnp.max(x, axis=-1, keepdims=True)) / "
                     "jnp.sum(jnp.exp(x - jnp.max(x, axis=-1, keepdims=True)), axis=-1, keepdims=True)")
    report, failure = _run("one_block.py", spec, tmp_path, {"seeds": [0], "shapeMode": "ragged"},
                           source)
    assert isinstance(failure, tester.Skipped), failure
    assert "no dim is free to take a ragged size" in failure.message


def test_bad_modes_are_bad_input(tmp_path):
    for options, fragment in (({"valueMode": "huge"}, "valueMode 'huge'"),
                              ({"shapeMode": "odd"}, "shapeMode 'odd'"),
                              ({"valueMode": "large", "valueScale": -1.0}, "valueScale"),
                              ({"shapeMode": "ragged", "full": True}, "full")):
        with pytest.raises(WorkerError) as e:
            _run("softmax_rows.py", rows_spec(), tmp_path, options)
        assert e.value.error_class == "badInput" and fragment in e.value.message


# ---------------------------------------------------------------- ragged sizes

def _task_with(dims, inputs, reference, name):
    return open_task({"name": name, "format": "native", "reference": reference,
                      "dims": dims, "configurations": [{"inputs": inputs}]})


def _inp(name, names, shape, dtype="float32", **extra):
    return dict({"name": name, "type": {"shape": shape, "dtype": dtype}, "dimNames": names,
                 "generator": {"normal": {}}}, **extra)


def test_ragged_sizes_leave_partial_blocks_and_recompute_derived_dims():
    # B (count) and its derived bound B1 = B + 1; S blocked by 256; D a full-size block
    reference = ("import jax.numpy as jnp\n"
                 "def reference(x, bounds):\n    return x * 2.0, bounds[1:] - bounds[:-1]\n")
    dims = [{"name": "B", "size": 4}, {"name": "B1", "size": 5, "expression": "B + 1"},
            {"name": "S", "size": 2048}, {"name": "D", "size": 128}]
    task = _task_with(dims, [_inp("x", ["B", "S", "D"], [4, 2048, 128]),
                             _inp("bounds", ["B1"], [5], "int32", structural=True,
                                  generator={"randint": {"low": 0, "high": 9}})],
                      reference, "ragged_derived")
    blocks = [((4, 2048, 128), (None, 256, 128)), ((4, 2048, 128), (None, 256, 128))]
    normal = reduced_sizes(task, 0, blocks)
    sizes, ragged, reason = ragged_sizes(task, 0, blocks)
    assert reason == "" and len(ragged) == 1 and ragged[0].startswith("S ")
    s = sizes["S"]
    assert s % 256 != 0 and s % 8 != 0 and 256 < s < 2048   # >= 2 steps, the last partial
    assert "D" not in sizes                                  # frozen by its full block
    assert sizes.get("B", 4) == normal.get("B", 4)           # a count without blocks: as reduced
    b = sizes.get("B", 4)
    assert sizes.get("B1", 5) == b + 1                       # derived: recomputed
    x, bounds = task.make_args(0, 1, sizes)
    assert x.shape == (b, s, 128) and bounds.shape == (b + 1,)


def test_ragged_keeps_a_static_divisor():
    # a static group count must keep dividing C (GroupNorm-like)
    reference = ("import jax.numpy as jnp\n"
                 "def reference(x, groups):\n"
                 "    n, c = x.shape\n    return x.reshape(n, groups, c // groups).sum(-1)\n")
    dims = [{"name": "N", "size": 512}, {"name": "C", "size": 384}]

    def task(groups):
        return _task_with(dims, [_inp("x", ["N", "C"], [512, 384]),
                                 {"name": "groups", "isStatic": True, "staticValue": str(groups)}],
                          reference, f"ragged_groups_{groups}")
    sizes, ragged, reason = ragged_sizes(task(3), 0, [((512, 384), (128, 384))])
    assert reason == "", reason   # N (blocked rows) is ragged; C is a full-size block
    assert sizes["N"] == 128 + 65 and "C" not in sizes and ragged == ["N 193 (1 blocks of 128 + 65)"]
    # C blocked by 128: 2 blocks + 65 = 321 is ragged and still a multiple of 3
    sizes, ragged, reason = ragged_sizes(task(3), 0, [((512, 384), (512, 128))])
    assert sizes == {"C": 321} and ragged == ["C 321 (2 blocks of 128 + 65)"]
    # 128 groups: no ragged C is a multiple of 128
    sizes, ragged, reason = ragged_sizes(task(128), 0, [((512, 384), (512, 128))])
    assert ragged == [] and "C 193" in reason and "divisibility" in reason


def test_ragged_by_value_for_a_jaxbench_task():
    import os
    task = open_task(load_task_dir(os.path.join(os.path.dirname(__file__), "tasks", "jb_matmul"),
                                   1 << 30))
    blocks = [((256, 128), (128, 128)), ((128, 256), (128, 128)), ((256, 256), (128, 128))]
    sizes, ragged, reason = ragged_sizes(task, 0, blocks)
    assert reason == "" and sizes == {256: 193}, (sizes, reason)
    a, b = task.make_args(0, 2, sizes)
    assert a.shape == (193, 128) and b.shape == (128, 193)
    assert task.reference(0)(a, b).shape == (193, 193)


# ---------------------------------------------------------------- through the worker process

def test_modes_through_the_worker(worker):
    spec, wrong = rows_spec(), candidate("softmax_floor_grid.py")
    default = worker.evaluate("test", spec, wrong, {"seeds": [0]})
    assert phase(default, "test")["status"] == "ok" and default["correct"] is True
    ragged = worker.evaluate("test", spec, wrong, {"seeds": [0], "shapeMode": "ragged"})
    test = phase(ragged, "test")
    assert test["status"] == "failed" and test["errorClass"] == "nonFinite", test
    assert ragged["test"]["cases"][0]["kind"] == "ragged" and ragged["correct"] is False

    overflow = candidate("softmax_no_max.py")
    large = worker.evaluate("test", spec, overflow,
                            {"seeds": [0], "valueMode": "large", "valueScale": 500.0})
    assert phase(large, "test")["errorClass"] == "nonFinite"
    assert large["test"]["cases"][0]["kind"] == "large"


def test_a_skipped_case_is_a_skipped_phase_through_the_worker(worker):
    spec = rows_spec(ROW_NORMALIZE, name="normalize")
    source = _rowwise("x / jnp.sqrt(jnp.sum(x * x, axis=-1, keepdims=True))")
    result = worker.evaluate("test", spec, candidate("normalize.py", source),
                             {"seeds": [0], "valueMode": "zeros"})
    test = phase(result, "test")
    assert test["status"] == "skipped" and test["errorClass"] == "none"
    assert "not finite on zeros inputs" in test["message"]
    assert result["correct"] is False    # nothing was checked: correctness is not claimed


# ------------------------------------------- mismatches re-judged against a float64 truth


class RejudgeTask:
    """The part of a task the re-judge reads: its reference and one tolerance for every
    output."""

    def __init__(self, reference, atol, rtol):
        self._reference, self._tolerance = reference, (atol, rtol)

    def reference(self, configuration):
        return self._reference

    def tolerance(self, k):
        return self._tolerance


# Cancellation on the rare elements past 2.7 sigma (about 0.7%): in float32 they come back
# with an error of ~0.01, in float64 exactly x.
CANCELLING = """\
import jax.numpy as jnp
def reference(x):
    lossy = (x * 1e-2 + 3000.0 - 3000.0) * 100.0
    return jnp.where(jnp.abs(x) > 2.7, lossy, x)
"""


def test_kernel_more_exact_than_the_reference_passes_against_float64(tmp_path):
    spec = rows_spec(CANCELLING, tolerance=1e-3)
    report, failure = _run("exact.py", spec, tmp_path, {"seeds": [0, 1]},
                           source=_rowwise("x"))
    assert failure is None, (failure, report["notes"])
    assert all(c["passed"] for c in report["cases"])
    assert any("float64 evaluation" in n for n in report["notes"]), report["notes"]


def test_kernel_wrong_where_the_reference_rounds_still_fails(tmp_path):
    spec = rows_spec(CANCELLING, tolerance=1e-3)
    report, failure = _run("off.py", spec, tmp_path, {"seeds": [0]},
                           source=_rowwise("jnp.where(jnp.abs(x) > 2.7, x + 0.1, x)"))
    assert failure is not None and failure.error_class == "mismatch", (failure, report)
    assert not any("float64" in n for n in report["notes"])


def test_kernel_off_everywhere_is_not_rejudged(tmp_path):
    spec = rows_spec(CANCELLING, tolerance=1e-3)
    report, failure = _run("scaled.py", spec, tmp_path, {"seeds": [0]},
                           source=_rowwise("x * 1.01"))
    assert failure is not None and failure.error_class == "mismatch"
    assert "elements beyond atol" in failure.message


def test_within_reference_error_allowance():
    tol = lambda k: (1e-3, 1e-3)
    truth = [np.linspace(1.0, 2.0, 100)]
    ref = [truth[0].astype(np.float32)]
    ref[0][50] += 0.05   # the reference's one rounding error, RMS 0.005 over the output
    got = ref[0].copy()
    got[50] = truth[0][50] + 0.09   # within 1e-3 + 1.5e-3 + 2 * 0.05 of the truth
    ok, rescued = tester.within_reference_error([got], ref, truth, tol)
    assert ok and rescued == 1
    got[50] = truth[0][50] + 0.2
    assert not tester.within_reference_error([got], ref, truth, tol)[0]
    # where the reference is exact, only the RMS floor: 0.02 > 1e-3 + 1e-3*x + 2 * 0.005
    got = ref[0].copy()
    got[10] += 0.02
    assert not tester.within_reference_error([got], ref, truth, tol)[0]
    # an output noisy everywhere (ill-conditioned) allows the noise where the reference
    # happens to be exact
    noisy = [(truth[0] + np.where(np.arange(100) % 2, 0.05, -0.05)).astype(np.float32)]
    noisy[0][10] = truth[0][10]
    got = noisy[0].copy()
    got[10] += 0.06
    assert tester.within_reference_error([got], noisy, truth, tol)[0]
    # none for NaN, none for integer outputs
    got = ref[0].copy()
    got[50] = np.nan
    assert not tester.within_reference_error([got], ref, truth, tol)[0]
    ok, _ = tester.within_reference_error([np.array([1, 2, 4], np.int32)],
                                          [np.array([1, 2, 3], np.int32)],
                                          [np.array([1, 2, 4], np.int64)], tol)
    assert not ok


def test_rejudging_allows_the_references_spread_under_input_rounding():
    # Softmax over logits ~1e4 with rare near-ties (channels 0 and 1, one row in 128): a
    # float32 kernel summing the contraction in blocks of 16 lands elsewhere than the
    # reference on a couple of near-tie elements where the reference is exact by chance.
    # Its own error does not cover that; its spread when its float32 inputs move by one ulp
    # does. A kernel 0.3 off there still fails.
    def reference(x, w, shift):
        return jax.nn.softmax(x @ w + shift, axis=-1)

    task = RejudgeTask(reference, 1e-4, 5e-3)

    rng = np.random.default_rng(2)
    n, k = 2048, 432
    x = (rng.normal(size=(n, k)) * 300.0).astype(np.float32)
    w0 = rng.normal(size=(k,)) * 10
    w = np.stack([w0, w0 + rng.normal(size=(k,)) * 0.01, -w0, -w0], axis=1).astype(np.float32)
    shift = np.zeros((n, 4), np.float32)
    shift[:, 1] = np.where(np.arange(n) % 128 == 0, 0.0, -1e9)
    shift[:, 2:] = -1e9
    args = [x, w, shift]
    expected = [np.asarray(reference(*args))]
    blocked = sum(x[:, i:i + 16] @ w[i:i + 16] for i in range(0, k, 16))
    got = [np.asarray(jax.nn.softmax(blocked + shift, axis=-1))]
    bad = np.abs(got[0] - expected[0]) > 1e-4 + 5e-3 * np.abs(expected[0])
    assert 0 < bad.sum() <= 0.01 * bad.size
    truth = tester._reference_in_float64(task, 0, args, expected)
    note = tester._rejudge_in_float64(task, 0, args, got, expected)
    # Where the reference's own error already covers the blocked sum (it depends on how this
    # CPU's XLA orders the reference's float32 contraction: on some machines it does), the
    # first allowance accepts it; otherwise only the one-ulp spread may, and must.
    if tester.within_reference_error(got, expected, truth, task.tolerance)[0]:
        assert "own error" in note, note
    else:
        assert "move by one ulp" in note, note
    spread = tester._rounding_spread(task, 0, args, truth)
    assert tester.within_reference_error(got, expected, truth, task.tolerance, spread)[0]
    wrong = [expected[0].copy()]
    wrong[0][bad] += 0.3
    assert tester._rejudge_in_float64(task, 0, args, wrong, expected) == ""


def test_rejudging_out_of_memory_frees_and_retries_then_says_so():
    # The same float64 re-judge must not pass in one run and fail in another because the
    # worker held more memory at the time: XLA's out-of-memory error is retried once after
    # freeing, and a second one is a MemoryError (the verdict says the re-judge did not fit),
    # never a silent "the reference cannot say".
    calls = {"n": 0}

    def reference(x):
        if str(x.dtype) == "float64":   # the re-judge's widened inputs
            calls["n"] += 1
            if calls["n"] <= fails:
                raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 1234 bytes.")
        lossy = (x * 1e-2 + 3000.0 - 3000.0) * 100.0
        return jnp.where(jnp.abs(x) > 2.7, lossy, x)

    task = RejudgeTask(reference, 1e-3, 1e-3)

    x = np.random.default_rng(0).normal(size=(256, 256)).astype(np.float32)
    expected = [np.asarray(reference(x))]
    got = [x.copy()]   # exact where the reference cancels: a small mismatch
    fails = 1
    note = tester._rejudge_in_float64(task, 0, [x], got, expected)
    assert "float64 evaluation" in note and calls["n"] == 2, (note, calls)
    calls["n"], fails = 0, 9
    with pytest.raises(MemoryError):
        tester._rejudge_in_float64(task, 0, [x], got, expected)
    assert calls["n"] == 2
    # A reference that cannot run in float64 for another reason: no truth, no retry.
    calls["n"], fails = 0, 0

    def refuses(x):
        if str(x.dtype) == "float64":
            calls["n"] += 1
            raise TypeError("only float32")
        return reference(x)

    assert tester._rejudge_in_float64(RejudgeTask(refuses, 1e-3, 1e-3), 0, [x], got,
                                      expected) == ""
    assert calls["n"] == 1


def test_bfloat16_inputs_are_rejudged_in_float32_when_float64_does_not_fit(monkeypatch):
    # A reference that computes in its inputs' dtype: in bfloat16, 300 + x/100 loses x
    # entirely (bf16 spacing at 300 is 2), so the rare elements past 2.7 sigma come back as
    # 0; a kernel returning x exactly mismatches there. float64 never fits (a MoE's widened
    # expert weights); float32 does, and is a fine truth for bfloat16 inputs.
    widths = []
    oom = {"float64"}

    def reference(x):
        widths.append(str(x.dtype))
        if str(x.dtype) in oom:
            raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 1234 bytes.")
        lossy = (x * 1e-2 + 300.0 - 300.0) * 100.0
        return jnp.where(jnp.abs(x) > 2.7, lossy, x)

    task = RejudgeTask(reference, 1e-2, 1e-2)

    x = np.random.default_rng(0).normal(size=(256, 256)).astype(jnp.bfloat16)
    expected = [np.asarray(reference(x))]
    got = [x.copy()]
    bad = np.abs(got[0].astype(np.float32) - expected[0].astype(np.float32)) > 0.05
    assert 0 < bad.sum() <= 0.01 * bad.size
    widths.clear()
    note = tester._rejudge_in_float64(task, 0, [x], got, expected)
    assert "float32 evaluation" in note, (note, widths)
    assert widths[:3] == ["float64", "float64", "float32"], widths   # float64 retried once
    # A kernel far off there (beyond twice the reference's own error, ~3) still fails.
    wrong = [x.copy()]
    wrong[0][bad] = (wrong[0][bad].astype(np.float32) + 20.0).astype(jnp.bfloat16)
    assert tester._rejudge_in_float64(task, 0, [x], wrong, expected) == ""
    # A data limit below three float64 copies of the inputs (3 x 512 KiB here): float64 is
    # not even tried.
    limit = tester.resource.getrlimit(tester.resource.RLIMIT_DATA)
    monkeypatch.setattr(tester.resource, "getrlimit", lambda which: (1 << 20, limit[1]))
    widths.clear()
    oom.clear()
    assert "float32 evaluation" in tester._rejudge_in_float64(task, 0, [x], got, expected)
    assert widths == ["float32"], widths
    # Below three float32 copies (3 x 256 KiB) neither is tried.
    monkeypatch.setattr(tester.resource, "getrlimit", lambda which: (512 << 10, limit[1]))
    widths.clear()
    with pytest.raises(tester.RejudgeUnfit) as unfit:
        tester._rejudge_in_float64(task, 0, [x], got, expected)
    assert unfit.value.widths == "float64 and float32" and widths == [], widths
    monkeypatch.undo()
    oom.add("float64")
    # Neither fits: the verdict names both.
    oom.add("float32")
    with pytest.raises(tester.RejudgeUnfit) as unfit:
        tester._rejudge_in_float64(task, 0, [x], got, expected)
    assert unfit.value.widths == "float64 and float32"
    # float32 inputs: a float32 evaluation is no finer than the reference, not tried.
    widths.clear()
    x32 = x.astype(np.float32)
    expected32 = [np.where(np.abs(x32) > 2.7, 0.0, x32).astype(np.float32)]
    with pytest.raises(tester.RejudgeUnfit) as unfit:
        tester._rejudge_in_float64(task, 0, [x32], [x32.copy()], expected32)
    assert unfit.value.widths == "float64" and widths == ["float64", "float64"], widths
