"""`maxkernel model SPEC KERNEL --chip a,b,c`: the modeled kernel and reference times on several
chips side by side. The built binary, the real worker, real JAX."""
import json
import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = pathlib.Path(os.environ.get("MAXKERNEL_BIN", ROOT / "build" / "cli" / "maxkernel"))
HERE = pathlib.Path(__file__).resolve().parent
KERNELS = HERE / "kernels"
SPEC = ROOT / "examples" / "matmul" / "spec.yaml"
KERNEL = ROOT / "examples" / "matmul" / "kernel.py"

pytestmark = pytest.mark.skipif(not BIN.exists(), reason="maxkernel is not built")


def run(command, *args, timeout=600, env=None):
    return subprocess.run([str(BIN), command, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env)


def model_json(*args, code=0, env=None):
    r = run("model", *args, "--json", "-", env=env)
    assert r.returncode == code, r.stderr
    return json.loads(r.stdout), r.stderr


@pytest.fixture(scope="module")
def three_chips():
    return model_json(SPEC, KERNEL, "--chip", "v5e,v6e,v7x", "--no-store")


def test_one_row_per_chip_in_the_order_given(three_chips):
    j, _ = three_chips
    assert j["command"] == "model"
    assert j["backend"] == "model"
    assert [c["chip"] for c in j["chips"]] == ["v5e", "v6e", "v7x"]
    assert j["evaluations"] == 6  # kernel and reference per chip
    assert j["cache_hits"] == 0
    assert j["jax_version"] == "0.10.2"


def test_every_chip_is_modeled_with_its_own_profile(three_chips):
    j, _ = three_chips
    for c in j["chips"]:
        assert c["correct"] is True
        assert c["timing"] == "modeled"
        p = c["profile"]
        assert p["timing"] == "modeled" and p["chip"] == c["chip"]
        assert p["time_us"] == c["kernel_time_us"] > 0
        assert 0 < p["roofline_us"] <= p["time_us"]
        assert c["reference_time_us"] > 0
        assert c["speedup_vs_reference"] == pytest.approx(
            c["reference_time_us"] / c["kernel_time_us"], rel=1e-9)


def test_times_differ_per_chip(three_chips):
    j, stderr = three_chips
    times = {c["chip"]: c["kernel_time_us"] for c in j["chips"]}
    refs = {c["chip"]: c["reference_time_us"] for c in j["chips"]}
    assert len(set(times.values())) == 3
    assert len(set(refs.values())) == 3
    # v5e has the lowest bf16 peak and HBM bandwidth of the three.
    assert times["v5e"] > times["v6e"] and times["v5e"] > times["v7x"]
    assert refs["v5e"] > refs["v6e"] > refs["v7x"]
    limits = {c["chip"]: c["profile"]["vmem_limit_bytes"] for c in j["chips"]}
    assert limits == {"v5e": 16 << 20, "v6e": 32 << 20, "v7x": 32 << 20}
    for chip in times:
        assert chip in stderr  # the readable table goes to stderr with --json -


def test_model_agrees_with_check_on_one_chip(three_chips):
    j, _ = three_chips
    r = run("check", SPEC, KERNEL, "--chip", "v5e", "--no-store", "--json", "-")
    assert r.returncode == 0, r.stderr
    check = json.loads(r.stdout)
    v5e = j["chips"][0]
    assert check["kernel_time_us"] == v5e["kernel_time_us"]
    assert check["reference_time_us"] == v5e["reference_time_us"]


def test_default_chip_is_the_specs(tmp_path):
    out = tmp_path / "model.json"
    r = run("model", SPEC, KERNEL, "--no-store", "--json", out)
    assert r.returncode == 0, r.stderr
    j = json.loads(out.read_text())
    assert [c["chip"] for c in j["chips"]] == ["v6e"]  # examples/matmul/spec.yaml: chip v6e
    assert "v6e" in r.stdout  # the readable table on stdout when the JSON goes to a file


def test_a_kernel_can_fail_on_one_chip_and_lower_on_another(tmp_path):
    # 2048 blocks over 1280^3 arrays shrink to the arrays: x, y and the output double-buffered
    # (3 x 2 x 3.125 MiB) and the f32 accumulator (6.25 MiB), 25 MiB: over v5e's 16 MiB default
    # scoped VMEM, under v6e's 32 MiB.
    text = SPEC.read_text()
    old = "dims: {M: 1024, K: 1024, N: 1024}"
    assert old in text
    spec = tmp_path / "matmul_1280.yaml"
    spec.write_text(text.replace(old, "dims: {M: 1280, K: 1280, N: 1280}"))
    j, human = model_json(spec, KERNELS / "matmul_blocks_2048.py", "--chip", "v5e,v6e",
                          "--no-store", code=1)
    v5e, v6e = j["chips"]
    # the table names the phase that failed, the whole message follows it
    row = next(l for l in human.splitlines() if l.strip().startswith("v5e "))
    assert "failed [" in row, human
    assert any(l.strip().startswith("v5e:") and v5e["error"] in l for l in human.splitlines()), human
    assert v5e["correct"] is False
    assert v5e["kernel_time_us"] is None and v5e["timing"] is None and v5e["profile"] is None
    assert "VMEM OOM" in v5e["error"] and "limit 16.00 MiB" in v5e["error"]
    assert v6e["correct"] is True
    assert v6e["kernel_time_us"] > 0 and v6e["timing"] == "modeled"
    assert 16 << 20 < v6e["profile"]["vmem_peak_bytes"] <= 32 << 20


def test_second_run_is_answered_from_the_store(tmp_path):
    state = tmp_path / "state"
    first, _ = model_json(SPEC, KERNEL, "--chip", "v5e,v6e", "--state-dir", state)
    assert first["evaluations"] == 4 and first["cache_hits"] == 0
    second, _ = model_json(SPEC, KERNEL, "--chip", "v5e,v6e", "--state-dir", state)
    assert second["evaluations"] == 4 and second["cache_hits"] == 4
    assert [c["kernel_time_us"] for c in second["chips"]] == \
        [c["kernel_time_us"] for c in first["chips"]]


def test_a_recalibrated_chip_is_not_answered_with_its_old_times(tmp_path):
    """The chip file is part of every modeled result's key: after `maxkernel calibrate`
    rewrites it, the store does not answer with times of the old constants."""
    state = tmp_path / "state"
    first, _ = model_json(SPEC, KERNEL, "--chip", "v5e,v6e", "--state-dir", state)
    chips = tmp_path / "chips"
    chips.mkdir()
    for f in (ROOT / "config" / "chips").glob("*.yaml"):
        (chips / f.name).write_text(f.read_text())
    v6e = (chips / "v6e.yaml").read_text()
    assert "step_overhead_us: 0.3365" in v6e
    (chips / "v6e.yaml").write_text(v6e.replace("step_overhead_us: 0.3365",
                                                "step_overhead_us: 3.365"))
    env = dict(os.environ, MAXKERNEL_CHIPS_DIR=str(chips))
    second, _ = model_json(SPEC, KERNEL, "--chip", "v5e,v6e", "--state-dir", state, env=env)
    assert second["cache_hits"] == 2  # v5e's kernel and reference; v6e's modeled afresh
    times = {c["chip"]: c["kernel_time_us"] for c in second["chips"]}
    before = {c["chip"]: c["kernel_time_us"] for c in first["chips"]}
    assert times["v5e"] == before["v5e"]
    assert times["v6e"] > before["v6e"]  # ten times the per-step overhead
    # The old constants again: their stored results answer.
    third, _ = model_json(SPEC, KERNEL, "--chip", "v5e,v6e", "--state-dir", state)
    assert third["cache_hits"] == 4
    assert {c["chip"]: c["kernel_time_us"] for c in third["chips"]} == before


@pytest.mark.parametrize("chips", ["v5e,v9", "v9", "V6E"])
def test_unknown_chip_exits_2(chips):
    r = run("model", SPEC, KERNEL, "--chip", chips)
    assert r.returncode == 2
    assert "--chip" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("args, needle", [
    ([SPEC, "/nonexistent/kernel.py"], "no such kernel file"),
    (["/nonexistent/spec.yaml", KERNEL], "no such file"),
    ([SPEC], "KERNEL"),
])
def test_bad_input_exits_2(args, needle):
    r = run("model", *args)
    assert r.returncode == 2
    assert needle in r.stderr


def test_model_is_answered_from_what_check_recorded(tmp_path):
    # The evaluation store is the one cache: the same kernel, spec and chip is the same
    # evaluation whichever command asks.
    state = tmp_path / "state"
    r = run("check", SPEC, KERNEL, "--chip", "v6e", "--state-dir", state, "--json", "-")
    assert r.returncode == 0, r.stderr
    j, _ = model_json(SPEC, KERNEL, "--chip", "v6e,v5e", "--state-dir", state)
    assert j["evaluations"] == 4 and j["cache_hits"] == 2  # v6e from check, v5e new
    assert j["chips"][0]["kernel_time_us"] == json.loads(r.stdout)["kernel_time_us"]


def test_correctness_is_tested_once_and_further_chips_are_profiled_only(tmp_path):
    """The test does not depend on the chip: the first chip's evaluation tests the kernel, the
    others only lower, extract and price it, and say so in their test phase."""
    state = tmp_path / "state"
    run = subprocess.run([str(BIN), "model", str(SPEC), str(KERNEL), "--chip", "v5e,v6e",
                          "--state-dir", str(state), "--json", "-"],
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr
    rows = json.loads(run.stdout)["chips"]
    assert [r["correct"] for r in rows] == [True, True]
    # A check on v6e afterwards is not answered by the profile-only evaluation: it tests.
    check = subprocess.run([str(BIN), "check", str(SPEC), str(KERNEL), "--chip", "v6e",
                            "--state-dir", str(state), "--json", "-"],
                           capture_output=True, text=True, timeout=900)
    assert check.returncode == 0, check.stderr
    result = json.loads(check.stdout)
    test_phase = [p for p in result["phases"] if p["phase"] == "test"][0]
    assert test_phase["status"] == "ok"
    assert result["test"]["cases"]
    assert result["kernel_time_us"] == pytest.approx(rows[1]["kernel_time_us"])
