"""`maxkernel check` reports time: the modeled kernel and reference times, the speedup, the
roofline and the profile, through a tpu_node with the model backend and the evaluation store.
The built binary, the real worker, real JAX."""
import json
import math
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


def check(*args, timeout=600):
    return subprocess.run([str(BIN), "check", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


def check_json(*args, code=0):
    run = check(*args, "--json", "-")
    assert run.returncode == code, run.stderr
    return json.loads(run.stdout)


def phase(result, name):
    return next(p for p in result["phases"] if p["phase"] == name)


def spec_with_dims(tmp_path, size):
    """examples/matmul/spec.yaml with M = K = N = size."""
    text = SPEC.read_text()
    old = "dims: {M: 1024, K: 1024, N: 1024}"
    assert old in text
    spec = tmp_path / f"matmul_{size}.yaml"
    spec.write_text(text.replace(old, f"dims: {{M: {size}, K: {size}, N: {size}}}"))
    return spec


@pytest.fixture(scope="module")
def v6e_result():
    return check_json(SPEC, KERNEL, "--chip", "v6e", "--no-store")


def test_check_reports_modeled_kernel_and_reference_times(v6e_result):
    r = v6e_result
    assert r["correct"] is True
    assert r["backend"] == "model"
    assert r["timing"] == "modeled"
    assert r["kernel_time_us"] > 0
    assert r["reference_time_us"] > 0
    assert r["speedup_vs_reference"] == pytest.approx(r["reference_time_us"] / r["kernel_time_us"],
                                                      rel=1e-9)
    assert r["reference_error"] is None
    assert r["evaluations"] == 2  # the kernel and the reference
    assert r["cache_hits"] == 0
    assert r["failures"] == {}
    assert phase(r, "profile")["status"] == "ok"


def test_profile_agrees_with_the_top_level_figures(v6e_result):
    r = v6e_result
    p = r["profile"]
    assert p["timing"] == "modeled" and p["backend"] == "model" and p["chip"] == "v6e"
    assert p["time_us"] == r["kernel_time_us"]
    assert p["roofline_us"] == r["roofline_time_us"]
    assert 0 < p["roofline_us"] <= p["time_us"]
    assert r["roofline_fraction"] == pytest.approx(p["roofline_us"] / p["time_us"], rel=1e-9)
    assert 0 < r["roofline_fraction"] <= 1
    assert p["bound"] in {"compute", "memory", "overhead", "latency"}
    # 2*M*N*K flops of the 1024^3 matmul.
    assert 2 * 1024**3 <= p["flops"] <= 1.01 * 2 * 1024**3  # plus the accumulator adds (VPU)
    assert p["hbm_bytes"] > 0
    assert 0 < p["mxu_utilization"] <= 1
    assert p["vmem_limit_bytes"] == 32 * 1024 * 1024  # v6e's default scoped VMEM
    assert 0 < p["vmem_peak_bytes"] <= p["vmem_limit_bytes"]
    ref = r["reference_profile"]
    assert ref["time_us"] == r["reference_time_us"]
    assert ref["timing"] == "modeled"


def test_profile_calls_follow_the_grid_on_a_single_core_chip(v6e_result):
    r = v6e_result
    calls = r["profile"]["calls"]
    assert len(calls) == len(r["pallas_calls"]) == 1
    grid = r["pallas_calls"][0]["grid"]
    assert grid == [2, 2, 4]  # (1024/512, 1024/512, 1024/256) in examples/matmul/kernel.py
    call = calls[0]
    assert call["steps_per_core"] == math.prod(grid)  # v6e: one TensorCore, nothing to split
    assert call["cores_used"] == 1
    assert call["bound"] in {"compute", "memory", "overhead", "latency"}
    assert 0 < call["time_us"] <= r["kernel_time_us"]
    assert call["flops"] == r["profile"]["flops"]  # one call, nothing outside it
    assert call["vmem_bytes"] == r["profile"]["vmem_peak_bytes"]
    # Traffic per operand, by hand: along the grid (i, j, kk) x's block index (i, kk) and y's
    # (kk, j) change at every step (kk is innermost), so each is fetched 16 times; the output's
    # (i, j) changes 4 times and each block is written back once.
    traffic = {(t["role"], t["index"]): t for t in call["traffic"]}
    assert set(traffic) == {("input", 0), ("input", 1), ("output", 0)}
    for key, copies, block in [(("input", 0), 16, 512 * 256), (("input", 1), 16, 256 * 512),
                               (("output", 0), 4, 512 * 512)]:
        assert traffic[key]["copies"] == copies, key
        assert traffic[key]["bytes"] == copies * block * 2, key  # bf16
    assert call["hbm_bytes"] == sum(t["bytes"] for t in call["traffic"])


def test_bigger_blocks_are_modeled_faster_than_tiny_blocks():
    small = check_json(SPEC, KERNELS / "matmul_blocks_128.py", "--no-store")
    big = check_json(SPEC, KERNELS / "matmul_blocks_512.py", "--no-store")
    assert small["pallas_calls"][0]["grid"] == [8, 8, 8]
    assert big["pallas_calls"][0]["grid"] == [2, 2, 2]
    assert big["kernel_time_us"] < small["kernel_time_us"]
    s, b = small["profile"]["calls"][0], big["profile"]["calls"][0]
    assert b["steps_per_core"] < s["steps_per_core"]
    assert b["hbm_bytes"] < s["hbm_bytes"]  # each fetched block serves four times the steps
    # The same computation: the reference does not depend on the blocks; both do the 2*M*N*K
    # matmul flops, plus accumulator adds (VPU) that grow with the number of k steps.
    assert big["reference_time_us"] == small["reference_time_us"]
    for call in (s, b):
        assert 2 * 1024**3 <= call["flops"] <= 1.01 * 2 * 1024**3
    assert s["flops"] > b["flops"]
    assert big["speedup_vs_reference"] > small["speedup_vs_reference"]


def _chip_rate(name):
    import yaml
    chip = yaml.safe_load((ROOT / "config" / "chips" / f"{name}.yaml").read_text())
    # float(): PyYAML reads 9.2e14 (no exponent sign) as a string.
    return float(chip["bf16_flops"]) * float(chip["efficiency"]["mxu"])


def test_chip_changes_the_modeled_time_of_a_compute_bound_kernel():
    v5e = check_json(SPEC, KERNEL, "--chip", "v5e", "--no-store")
    v6e = check_json(SPEC, KERNEL, "--chip", "v6e", "--no-store")
    assert v5e["chip"] == v5e["profile"]["chip"] == "v5e"
    assert v6e["chip"] == v6e["profile"]["chip"] == "v6e"
    assert v5e["profile"]["bound"] == "compute"
    assert v5e["kernel_time_us"] > v6e["kernel_time_us"]
    # MXU time scales with the chips' bf16 peak (v6e ~4.7x v5e) times the model's efficiency.
    ratio = v5e["profile"]["compute_us"] / v6e["profile"]["compute_us"]
    assert ratio == pytest.approx(_chip_rate("v6e") / _chip_rate("v5e"), rel=0.1)
    assert v5e["reference_time_us"] > v6e["reference_time_us"]
    assert v5e["profile"]["vmem_limit_bytes"] == 16 * 1024 * 1024


def test_vmem_oom_fails_lower_and_a_raised_vmem_limit_lets_it_lower(tmp_path):
    spec = spec_with_dims(tmp_path, 2048)
    run = check(spec, KERNELS / "matmul_blocks_2048.py", "--chip", "v6e", "--no-store",
                "--json", "-")
    assert run.returncode == 1, run.stderr
    r = json.loads(run.stdout)
    assert r["correct"] is False
    lower = phase(r, "lower")
    assert lower["status"] == "failed"
    assert lower["error_class"] == "vmemOom"
    assert "VMEM OOM: needs" in lower["message"] and "MiB" in lower["message"]
    assert "limit 32.00 MiB" in lower["message"]
    assert r["failures"] == {"vmemOom": 1}
    assert r["kernel_time_us"] is None and r["speedup_vs_reference"] is None
    assert "VMEM OOM" in run.stderr

    raised = check_json(spec, KERNELS / "matmul_blocks_2048_vmem_limit.py", "--chip", "v6e",
                        "--no-store")
    assert phase(raised, "lower")["status"] == "ok"
    assert raised["correct"] is True
    assert raised["profile"]["vmem_limit_bytes"] == 100 * 1024 * 1024
    assert 32 * 1024 * 1024 < raised["profile"]["vmem_peak_bytes"] <= 100 * 1024 * 1024


def test_second_identical_run_is_answered_from_the_store(tmp_path):
    state = tmp_path / "state"
    first = check_json(SPEC, KERNEL, "--state-dir", state)
    assert first["evaluations"] == 2 and first["cache_hits"] == 0
    assert any(state.iterdir()), "the store wrote nothing in --state-dir"
    second = check_json(SPEC, KERNEL, "--state-dir", state)
    assert second["evaluations"] == 2 and second["cache_hits"] == 2
    assert second["kernel_time_us"] == first["kernel_time_us"]
    assert second["reference_time_us"] == first["reference_time_us"]
    assert second["correct"] is True
    # --no-store neither answers from the store nor needs it.
    bypass = check_json(SPEC, KERNEL, "--state-dir", state, "--no-store")
    assert bypass["evaluations"] == 2 and bypass["cache_hits"] == 0
    assert bypass["kernel_time_us"] == first["kernel_time_us"]


def test_reference_only_is_answered_from_a_checks_reference(tmp_path):
    state = tmp_path / "state"
    check_json(SPEC, KERNEL, "--state-dir", state)
    r = check_json(SPEC, "--reference-only", "--state-dir", state)
    assert r["evaluations"] == 1 and r["cache_hits"] == 1


def test_another_chip_is_not_answered_from_the_store(tmp_path):
    state = tmp_path / "state"
    check_json(SPEC, KERNEL, "--state-dir", state, "--chip", "v6e")
    other = check_json(SPEC, KERNEL, "--state-dir", state, "--chip", "v5e")
    assert other["cache_hits"] == 0


def test_reference_only_models_the_reference_alone():
    run = check(SPEC, "--reference-only", "--no-store", "--json", "-")
    assert run.returncode == 0, run.stderr
    r = json.loads(run.stdout)
    assert r["mode"] == "reference"
    assert r["kernel"] == "reference"
    assert r["kernel_time_us"] is None
    assert r["speedup_vs_reference"] is None
    assert r["reference_time_us"] > 0
    assert r["timing"] == "modeled"
    assert r["profile"]["time_us"] == r["reference_time_us"]
    assert r["evaluations"] == 1
    assert "REFERENCE TIMED" in run.stderr


def test_reference_only_matches_the_reference_time_of_a_check(v6e_result):
    r = check_json(SPEC, "--reference-only", "--chip", "v6e", "--no-store")
    assert r["reference_time_us"] == v6e_result["reference_time_us"]


@pytest.mark.parametrize("extra", [[KERNEL], ["--baseline"]])
def test_reference_only_with_a_kernel_or_baseline_is_refused(extra):
    run = check(SPEC, "--reference-only", *extra)
    assert run.returncode == 2
    assert "--reference-only" in run.stderr
    assert "Traceback" not in run.stderr


def test_the_profiler_reads_the_profile_and_points_at_what_to_change():
    """check carries the profiler's diagnosis: a 128-block matmul spends its time on per-step
    overhead, and the profiler says to take fewer, larger steps along a grid axis."""
    small = check_json(SPEC, KERNELS / "matmul_blocks_128.py", "--chip", "v6e", "--no-store")
    d = small["diagnosis"]
    assert d["bound"] == small["profile"]["bound"]
    assert d["headroom"] == pytest.approx(small["profile"]["roofline_us"]
                                          / small["profile"]["time_us"])
    assert small["profile"]["bound"] == "overhead"
    kinds = [s["kind"] for s in d["suggestions"]]
    assert kinds and kinds[0] in ("reduceSteps", "growBlock")
    first = d["suggestions"][0]
    grid = small["pallas_calls"][0]["grid"]
    assert 0 <= first["axis"] < len(grid) and first["factor"] > 1
    steps = 1
    for g in grid:
        steps *= g
    assert f"{steps} grid steps" in first["rationale"]  # the rationale carries its numbers
    # The reference alone has no kernel to diagnose.
    ref = check_json(SPEC, "--reference-only", "--chip", "v6e", "--no-store")
    assert ref["diagnosis"] is None
