"""The interpret-mode tester, in process: comparison rule, wrong kernels, reward hacks,
degenerate references, reduced sizes, several configurations."""

import copy

import numpy as np
import pytest

from conftest import candidate, kernel_source, matmul_spec
from maxkernel_worker import tester
from maxkernel_worker.candidate import forget, load_candidate
from maxkernel_worker.errors import WorkerError
from maxkernel_worker.task import open_task


def _run(kernel: str, spec: dict, tmp_path, options=None, source=None):
    cand = load_candidate(candidate(kernel, source), str(tmp_path))
    return tester.run_tests(cand, open_task(spec), spec, options or {})


# ---------------------------------------------------------------- the comparison rule

def _tol(atol=1e-2, rtol=1e-2):
    return lambda output: (atol, rtol)


def test_compare_uses_the_allclose_rule_and_reports_the_worst_element():
    expected = np.array([[1.0, 2.0], [100.0, -4.0]], np.float32)
    got = expected.copy()
    got[1, 0] = 100.9           # within atol + rtol * 100 = 1.01
    case, error = tester.compare([got], [expected], _tol())
    assert error is None and case["passed"]
    assert case["maxAbsErr"] == pytest.approx(0.9, rel=1e-3)
    got[0, 1] = 2.05            # beyond 0.01 + 0.02
    case, error = tester.compare([got], [expected], _tol())
    assert error == "mismatch" and case["worstIndex"] == [0, 1]
    assert "1 of 4 elements" in case["message"]
    assert case["maxRelErr"] == pytest.approx(0.025, rel=1e-3)


def test_compare_classifies_non_finite_and_structure():
    expected = np.ones((4, 4), np.float32)
    got = expected.copy()
    got[2, 3] = np.nan
    case, error = tester.compare([got], [expected], _tol())
    assert error == "nonFinite" and case["worstIndex"] == [2, 3]
    assert tester.compare([expected[:2]], [expected], _tol())[1] == "wrongOutput"
    assert tester.compare([expected.astype(np.float16)], [expected], _tol())[1] == "wrongOutput"
    assert tester.compare([expected, expected], [expected], _tol())[1] == "wrongOutput"
    # Where the reference is NaN or Inf, the candidate must be too.
    ref = expected.copy()
    ref[0, 0] = np.inf
    assert tester.compare([expected], [ref], _tol())[1] == "mismatch"
    assert tester.compare([ref.copy()], [ref], _tol())[1] is None


def test_compare_casts_bfloat16_to_float32():
    import ml_dtypes
    expected = np.array([1.0, 2.0, 3.0], ml_dtypes.bfloat16)
    case, error = tester.compare([expected.copy()], [expected], _tol(0, 0))
    assert error is None and case["maxAbsErr"] == 0.0


# ---------------------------------------------------------------- kernels

def test_correct_matmul_passes_on_the_requested_seeds(tmp_path):
    report, failure = _run("matmul.py", matmul_spec(), tmp_path, {"seeds": [7, 8]})
    assert failure is None, failure
    assert [c["seed"] for c in report["cases"]] == [7, 8]
    assert all(c["passed"] and c["kind"] == "fresh" for c in report["cases"])
    assert not report["degenerateReference"]


@pytest.mark.parametrize("kernel, error_class", [
    ("matmul_off_by_one.py", "mismatch"),
    ("matmul_no_accumulation.py", "mismatch"),
    ("constant.py", "mismatch"),
    ("replay.py", "rewardHack"),
    ("calls_reference.py", "rewardHack"),
    ("heap_walk.py", "rewardHack"),
    ("network.py", "sandboxViolation"),   # the guard's audit hook; the sandbox: test_server
])
def test_wrong_kernels_fail_with_their_class(kernel, error_class, tmp_path):
    report, failure = _run(kernel, matmul_spec(), tmp_path)
    assert failure is not None and failure.error_class == error_class, (failure, report)
    if error_class == "mismatch":
        case = report["cases"][-1]
        assert not case["passed"] and case["maxAbsErr"] > 0.1 and len(case["worstIndex"]) == 2


def test_replay_passes_once_then_is_caught(tmp_path):
    report, failure = _run("replay.py", matmul_spec(), tmp_path)
    assert [c["passed"] for c in report["cases"]] == [True, False]
    assert "replays the answer of case 0" in failure.message


def test_reading_the_task_file_is_a_reward_hack(tmp_path):
    spec_file = tmp_path / "matmul.yaml"
    spec_file.write_text("name: matmul\n")
    spec = matmul_spec()
    spec["sourcePath"] = str(spec_file)
    source = (f"def workload(a, b):\n    open({str(spec_file)!r}).read()\n    return a @ b\n")
    report, failure = _run("reads_spec.py", spec, tmp_path, {"full": True}, source=source)
    assert failure.error_class == "rewardHack" and "matmul.yaml" in failure.message


def test_patching_jax_at_load_is_caught_and_undone(tmp_path):
    import jax.numpy as jnp
    original = jnp.dot
    source = "import jax.numpy as jnp\njnp.dot = lambda *a, **k: 0\ndef workload(a, b):\n    return a\n"
    cand = candidate("patch.py", source)
    with pytest.raises(WorkerError) as info:
        with tester.guard():
            load_candidate(cand, str(tmp_path))
    forget(cand["id"])
    assert info.value.error_class == "rewardHack" and "jax.numpy.dot" in info.value.message
    assert jnp.dot is original


def test_a_kernel_written_for_one_configuration_fails_the_next(tmp_path):
    # Two configurations: every one must pass. A grid hard-coded for 256 leaves part of the
    # 384 output unwritten, which the NaN-poisoned output buffer exposes.
    spec = matmul_spec()
    bigger = copy.deepcopy(spec["configurations"][0])
    bigger["name"] = "384"
    for inp in bigger["inputs"]:
        inp["type"]["shape"] = [384, 384]
        inp["dimNames"] = ["", ""]
    bigger["outputs"] = [{"shape": [384, 384], "dtype": "bfloat16"}]
    spec["configurations"].append(bigger)
    source = kernel_source("matmul.py").replace("grid=(m // BM, n // BN, k // BK)", "grid=(2, 2, 2)")
    report, failure = _run("fixed_grid.py", spec, tmp_path, {"seeds": [0], "full": True}, source)
    assert [c["configuration"] for c in report["cases"]] == [0, 1]
    assert report["cases"][0]["passed"] and not report["cases"][1]["passed"]
    assert failure.error_class == "nonFinite"


def test_degenerate_reference_adds_redrawn_inputs(tmp_path):
    # b is all zeros in the task, so the reference is 0 whatever a is: a constant-zero kernel
    # passes the task's own inputs and must fail on inputs redrawn from N(0,1).
    spec = matmul_spec(b_generator={"zeros": None})
    report, failure = _run("constant.py", spec, tmp_path, {"seeds": [0, 1]})
    assert report["degenerateReference"]
    assert any("barely change" in n for n in report["notes"])
    kinds = [(c["kind"], c["passed"]) for c in report["cases"]]
    assert kinds == [("fresh", True), ("fresh", True), ("redrawn-normal", False)]
    assert failure.error_class == "mismatch"


def test_reduced_sizes_from_the_candidates_blocks(tmp_path):
    spec = matmul_spec(m=512)
    report, failure = _run("matmul.py", spec, tmp_path, {"seeds": [0]})
    assert failure is None, failure
    (case,) = report["cases"]
    assert case["reduced"] and case["inputShapes"] == "(256,256) bfloat16, (256,256) bfloat16"
    assert any("reduced sizes M 512->256" in n for n in report["notes"])


@pytest.mark.parametrize("text", [
    # XLA's CPU runtime past the data segment limit, as interpret mode's callbacks wrap it
    "INTERNAL: Error dispatching computation: Error dispatching computation: Out of memory "
    "allocating 1207959552 bytes.",
    "RESOURCE_EXHAUSTED: Out of memory allocating 2147483648 bytes.",
])
def test_an_allocation_past_the_memory_limit_is_a_resource_limit(text):
    err = tester.classify_candidate_exception(RuntimeError(text), None, "runtimeError")
    assert err.error_class == "resourceLimit"
    assert "Out of memory allocating" in str(err)


def test_other_runtime_errors_keep_the_default_class():
    err = tester.classify_candidate_exception(RuntimeError("INTERNAL: Mosaic failed"), None,
                                              "runtimeError")
    assert err.error_class == "runtimeError"
