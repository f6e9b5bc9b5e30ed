"""The worker process end to end: ZeroMQ + Cap'n Proto requests to a real sandboxed worker."""

import os

import pytest

from conftest import candidate, matmul_spec, phase


def test_ping_reports_jax_and_sandbox(worker):
    pong = worker.ping()
    assert pong["pid"] == worker.proc.pid
    assert pong["jaxVersion"].startswith("0.")
    assert pong["platform"] == "cpu" and pong["devices"] >= 1
    # Landlock ABI >= 4 and root (or user namespaces) are available on this machine.
    assert {"cleanenv", "netns", "landlock", "landlock-net", "rlimits"} <= set(pong["sandbox"])


def test_bad_bytes_get_an_error_reply_and_the_worker_keeps_serving(worker):
    reply = worker.send_bytes(b"definitely not capnp")
    assert reply["error"]["errorClass"] == "badInput"
    assert "not a WorkerRequest" in reply["error"]["message"]
    assert worker.ping()["pid"] == worker.proc.pid


def test_bad_spec_is_a_request_error(worker):
    spec = matmul_spec()
    spec["configurations"] = []
    reply = worker.request(test={"spec": spec, "candidate": candidate("matmul.py")})
    assert reply["error"]["errorClass"] == "badInput"
    assert "configurations" in reply["error"]["message"]


def test_correct_matmul_lowers_and_passes(worker):
    spec, cand = matmul_spec(), candidate("matmul.py")
    lowered = worker.evaluate("lower", spec, cand)
    assert [(p["phase"], p["status"]) for p in lowered["phases"]] == [("load", "ok"), ("lower", "ok")]
    tested = worker.evaluate("test", spec, cand)
    assert phase(tested, "test")["status"] == "ok", tested
    assert tested["correct"] is True
    cases = tested["test"]["cases"]
    assert len(cases) == 3 and len({c["seed"] for c in cases}) == 3
    assert all(c["passed"] and c["maxAbsErr"] < 1.0 for c in cases)
    assert cases[0]["inputShapes"] == "(256,256) bfloat16, (256,256) bfloat16"


def test_block_8x100_is_refused_at_lowering_with_mosaics_message(worker):
    result = worker.evaluate("lower", matmul_spec(), candidate("matmul_block_8x100.py"))
    lower = phase(result, "lower")
    assert lower["status"] == "failed" and lower["errorClass"] == "lowerBlockShape"
    assert "divisible by 8 and 128" in lower["message"]


def test_extract_returns_the_structure(worker):
    result = worker.evaluate("extract", matmul_spec(), candidate("matmul.py"))
    assert result["hasStructure"], result
    (call,) = result["structure"]["pallasCalls"]
    assert call["grid"] == [2, 2, 2]


def test_time_without_tpu_is_a_failed_profile_phase(worker):
    result = worker.evaluate("time", matmul_spec(), candidate("matmul.py"))
    profile = phase(result, "profile")
    assert profile["status"] == "failed" and "no TPU" in profile["message"]
    assert not result["hasProfile"]


def test_candidate_cannot_write_outside_its_workdir(worker):
    result = worker.evaluate("test", matmul_spec(), candidate("write_outside.py"))
    test = phase(result, "test")
    assert test["errorClass"] == "sandboxViolation", test
    assert "/tmp/maxkernel_candidate_was_here" in test["message"]
    assert not os.path.exists("/tmp/maxkernel_candidate_was_here")


def test_candidate_cannot_open_a_connection(worker):
    result = worker.evaluate("test", matmul_spec(), candidate("network.py"))
    assert phase(result, "test")["errorClass"] == "sandboxViolation"


def test_candidate_does_not_see_the_callers_environment(worker):
    source = ("import os\nimport jax.numpy as jnp\n"
              "def workload(a, b):\n"
              "    assert 'SECRET_TOKEN' not in os.environ, 'leaked'\n"
              "    assert os.environ['HOME'] == os.getcwd(), 'home'\n"
              "    return jnp.dot(a, b, preferred_element_type=jnp.float32).astype(a.dtype)\n")
    result = worker.evaluate("test", matmul_spec(), candidate("env.py", source))
    assert phase(result, "test")["status"] == "ok", result["phases"]


def test_hanging_kernel_times_out_and_a_restarted_worker_serves(worker):
    # The worker has no deadline of its own: the C++ client kills it; here the test does.
    with pytest.raises(TimeoutError):
        worker.evaluate("test", matmul_spec(), candidate("hang.py"), timeout=5)
    worker.restart()
    assert worker.ping()["pid"] == worker.proc.pid


@pytest.mark.parametrize("kernel", ["crash_exit.py", "crash_segfault.py"])
def test_crashing_kernel_kills_only_that_worker(worker, kernel):
    with pytest.raises(TimeoutError, match="died"):
        worker.evaluate("test", matmul_spec(), candidate(kernel), timeout=60)
    worker.restart()
    result = worker.evaluate("lower", matmul_spec(), candidate("matmul.py"))
    assert phase(result, "lower")["status"] == "ok"


TASKS_DIR = os.path.join(os.path.dirname(__file__), "tasks")


def test_load_and_analyze_a_jaxbench_directory(worker):
    path = os.path.join(TASKS_DIR, "jb_matmul")
    spec = worker.request(load={"path": path})["spec"]
    assert spec["format"] == "jaxbench" and spec["sourcePath"] == path
    graph = worker.request(analyze={"spec": spec, "configuration": 0})["graph"]
    assert any(n["primitive"] == "dot_general" for n in graph["nodes"])
    assert graph["flops"] == pytest.approx(2 * 256 * 128 * 256, rel=0.01)


def test_importing_the_task_file_is_a_reward_hack(worker):
    path = os.path.join(TASKS_DIR, "jb_matmul")
    spec = worker.request(load={"path": path})["spec"]
    source = f"import sys\nsys.path.insert(0, {path!r})\nfrom baseline import workload\n"
    result = worker.evaluate("test", spec, candidate("imports_baseline.py", source))
    load = phase(result, "load")
    assert load["errorClass"] == "rewardHack" and "jb_matmul" in load["message"], load


def test_load_of_a_missing_directory_is_bad_input(worker):
    reply = worker.request(load={"path": "/nonexistent/task"})
    assert reply["error"]["errorClass"] == "badInput"
    assert "/nonexistent/task" in reply["error"]["message"]


def test_sys_exit_in_a_kernel_is_a_failed_phase(worker):
    pid = worker.proc.pid
    lowered = phase(worker.evaluate("lower", matmul_spec(), candidate("exits.py")), "lower")
    assert lowered["errorClass"] == "traceError" and "SystemExit" in lowered["message"]
    tested = phase(worker.evaluate("test", matmul_spec(), candidate("exits.py")), "test")
    assert tested["errorClass"] == "runtimeError"
    assert worker.ping()["pid"] == pid


@pytest.mark.parametrize("kernel, error_class, text", [
    ("syntax_error.py", "loadError", ":2: SyntaxError"),
    ("no_workload.py", "noWorkload", "does not define workload"),
])
def test_candidates_that_do_not_load(worker, kernel, error_class, text):
    result = worker.evaluate("lower", matmul_spec(), candidate(kernel))
    assert [p["phase"] for p in result["phases"]] == ["load"]
    load = phase(result, "load")
    assert load["errorClass"] == error_class and text in load["message"], load
