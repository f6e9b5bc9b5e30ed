"""`maxkernel check` end to end: the built binary, the real worker, real JAX."""
import json
import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = pathlib.Path(os.environ.get("MAXKERNEL_BIN", ROOT / "build" / "cli" / "maxkernel"))
HERE = pathlib.Path(__file__).resolve().parent
SPEC = ROOT / "examples" / "matmul" / "spec.yaml"
KERNEL = ROOT / "examples" / "matmul" / "kernel.py"

pytestmark = pytest.mark.skipif(not BIN.exists(), reason="maxkernel is not built")


def check(*args, timeout=600):
    return subprocess.run([str(BIN), "check", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


def test_correct_kernel_exits_0_and_json_on_stdout_only():
    run = check(SPEC, KERNEL, "--json", "-")
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)  # stdout holds nothing but the JSON
    assert result["correct"] is True
    assert result["schema"] == 1
    assert result["task"]
    assert result["chip"] == "v6e"
    assert [p["phase"] for p in result["phases"]] == ["load", "lower", "test", "profile"]
    assert all(p["status"] == "ok" for p in result["phases"])
    cases = result["test"]["cases"]
    assert len(cases) >= 2 and all(c["passed"] for c in cases)
    assert len({c["seed"] for c in cases}) == len(cases)
    assert result["pallas_calls"][0]["grid"]
    assert result["jax_version"] == "0.10.2"
    assert "CORRECT" in run.stderr


def test_chip_flag_wins_and_json_file_is_written(tmp_path):
    out = tmp_path / "result.json"
    run = check(SPEC, KERNEL, "--chip", "v5e", "--json", out)
    assert run.returncode == 0, run.stderr
    assert json.loads(out.read_text())["chip"] == "v5e"
    assert not (tmp_path / "result.json.tmp").exists()


def test_wrong_kernel_exits_1_with_mismatch():
    run = check(SPEC, HERE / "kernels" / "matmul_no_accumulation.py", "--json", "-")
    assert run.returncode == 1, run.stderr
    result = json.loads(run.stdout)
    assert result["correct"] is False
    test_phase = [p for p in result["phases"] if p["phase"] == "test"][0]
    assert test_phase["status"] == "failed"
    assert test_phase["error_class"] == "mismatch"
    assert result["failures"] == {"mismatch": 1}


def test_block_rule_violation_exits_1_classified():
    run = check(SPEC, HERE / "kernels" / "matmul_block_8x100.py", "--json", "-")
    assert run.returncode == 1, run.stderr
    result = json.loads(run.stdout)
    lower = [p for p in result["phases"] if p["phase"] == "lower"][0]
    assert lower["error_class"] == "lowerBlockShape"
    assert "divisible by 8 and 128" in lower["message"]


def test_a_failure_in_the_kernel_names_the_users_file_and_line(tmp_path):
    kernel = tmp_path / "broken_kernel.py"
    kernel.write_text("import jax.numpy as jnp\n\n\ndef workload(x, y):\n"
                      "    return jnp.dot(x, y) * not_defined\n")
    run = check(SPEC, kernel, "--json", "-")
    assert run.returncode == 1, run.stderr
    result = json.loads(run.stdout)
    failed = [p for p in result["phases"] if p["status"] == "failed"][0]
    assert f"{kernel}:5" in failed["message"], failed
    assert "maxkernel_candidate_" not in run.stdout + run.stderr
    assert f"{kernel}:5" in run.stderr  # the readable summary too


@pytest.mark.parametrize("args, needle", [
    (["/nonexistent/spec.yaml", KERNEL], "no such file"),
    ([SPEC, "/nonexistent/kernel.py"], "no such kernel file"),
    ([SPEC, KERNEL, "--chip", "v9"], "--chip"),
    ([HERE, KERNEL], "baseline.py"),
])
def test_bad_input_exits_2_with_a_clear_message(args, needle):
    run = check(*args)
    assert run.returncode == 2
    assert needle in run.stderr
    assert "Traceback" not in run.stderr


def test_bad_spec_names_file_line_and_field(tmp_path):
    spec = tmp_path / "bad.yaml"
    text = SPEC.read_text().replace("dtype: bfloat16", "dtype: bfloat17", 1)
    spec.write_text(text)
    run = check(spec, KERNEL)
    assert run.returncode == 2
    assert str(spec) in run.stderr
    assert "dtype" in run.stderr
    line = next(i for i, l in enumerate(text.splitlines(), 1) if "bfloat17" in l)
    assert f":{line}:" in run.stderr


def test_baseline_of_a_jaxbench_task_passes():
    task = ROOT / "examples" / "jaxbench_matmul"
    run = check(task, "--baseline", "--json", "-")
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert result["spec_format"] == "jaxbench"
    assert result["kernel"].endswith("optimized.py")
    assert result["correct"] is True


def test_baseline_flag_without_a_baseline_is_bad_input():
    run = check(SPEC, "--baseline")
    assert run.returncode == 2
    assert "no baseline" in run.stderr


def test_kernel_and_baseline_together_are_refused():
    run = check(SPEC, KERNEL, "--baseline")
    assert run.returncode == 2


def _children(pid):
    kids = []
    for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            kids.append(int(stat.parent.name))
    return kids


def test_killing_check_takes_its_worker_along():
    import signal
    import time
    proc = subprocess.Popen([str(BIN), "check", str(SPEC), str(KERNEL)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    workers = []
    while time.time() < deadline and not workers:
        workers = _children(proc.pid)
        time.sleep(0.1)
    assert workers, "check did not start a worker"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.time() + 10
    while time.time() < deadline and any(pathlib.Path(f"/proc/{w}").exists() for w in workers):
        time.sleep(0.1)
    assert not any(pathlib.Path(f"/proc/{w}").exists() for w in workers)


def test_maxkernel_task_with_two_configurations():
    task = ROOT / "tests" / "worker" / "tasks" / "mk_multi"
    run = check(task, HERE / "kernels" / "rms_norm_and_sum.py", "--json", "-")
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert result["spec_format"] == "maxkernel"
    assert {c["configuration"] for c in result["test"]["cases"]} == {0, 1}


def test_a_kernel_must_pass_every_configuration():
    task = ROOT / "tests" / "worker" / "tasks" / "mk_multi"
    run = check(task, HERE / "kernels" / "rms_norm_first_config_only.py", "--json", "-")
    assert run.returncode == 1, run.stderr
    result = json.loads(run.stdout)
    assert result["correct"] is False


def test_kernel_that_is_not_utf8_is_bad_input_naming_the_line(tmp_path):
    kernel = tmp_path / "kernel.py"
    kernel.write_bytes(b"def workload(x, y):\n    return x  # \xff\xfe\n")
    run = check(SPEC, kernel)
    assert run.returncode == 2
    assert f"{kernel}:2:" in run.stderr and "UTF-8" in run.stderr
    assert "Traceback" not in run.stderr


def test_a_hanging_kernel_is_its_own_timeout_not_an_environment_error():
    # The reference finishes: the kernel's timeout is its failure (exit 1, class timeout),
    # reported with the JSON like any other failure.
    run = check(SPEC, HERE / "kernels" / "hangs.py", "--deadline", "10", "--no-store",
                "--json", "-")
    assert run.returncode == 1, run.stderr
    result = json.loads(run.stdout)
    assert result["correct"] is False
    assert result["failures"] == {"timeout": 1}
