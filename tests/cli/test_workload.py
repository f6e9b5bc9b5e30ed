"""`maxkernel workload MODEL.yaml`: a tiny two-layer model written here, expanded into its
decode step's tasks and searched end to end with the built binary, the real worker and real
JAX, at a budget of 1 candidate per task.

What is checked: the step's tasks are written as specs and each is a row of the report with
its occurrences (2 layers x the per-layer kernels, plus the head); the step time before is the
occurrence-weighted sum of the reference times and after uses the best kernel's where one
beats the reference, labelled modeled; bad workloads and filters exit 2 before any search."""
import json
import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = pathlib.Path(os.environ.get("MAXKERNEL_BIN", ROOT / "build" / "cli" / "maxkernel"))

pytestmark = pytest.mark.skipif(not BIN.exists(), reason="maxkernel is not built")

TINY = """\
name: tiny
layers: 2
hidden_size: 128
num_heads: 4
num_kv_heads: 2
head_dim: 32
intermediate_size: 256
vocab_size: 512
batch: 2
seq_len: 64
decode_batch: 4
kv_len: 128
"""


def workload(*args, timeout=600):
    cmd = ["nice", "-n", "5", str(BIN), "workload", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def decode_run(tmp_path_factory):
    work = tmp_path_factory.mktemp("workload")
    model = work / "tiny.yaml"
    model.write_text(TINY)
    proc = workload(model, "--phase", "decode", "--budget-evals", "1", "--nodes", "2",
                    "--state-dir", work / "state", "--out", work / "out",
                    "--json", work / "report.json")
    assert proc.returncode in (0, 1), proc.stderr
    return proc, json.loads((work / "report.json").read_text()), work


def test_every_kernel_of_the_step_is_a_task_with_its_occurrences(decode_run):
    _, report, work = decode_run
    occurrences = {t["task"]: t["occurrences"] for t in report["tasks"]}
    # 2 norms per layer + the final one share a shape; qkv, attention, o and the MLP once per
    # layer; the logits once per step
    assert occurrences == {"rmsnorm": 5, "qkv_projection": 2, "attention": 2,
                           "o_projection": 2, "mlp": 2, "logits": 1}
    assert report["kernel_runs_per_step"] == 2 * 6 + 2
    by_name = {t["task"]: t for t in report["tasks"]}
    assert by_name["rmsnorm"]["roles"] == ["rmsnorm", "final_norm"]
    assert by_name["qkv_projection"]["dims"] == {"M": 4, "K": 128, "N": (4 + 2 * 2) * 32}
    assert by_name["attention"]["kind"] == "decode_attention"
    assert by_name["attention"]["dims"]["L"] == 128
    for name in occurrences:
        assert (work / "out" / "specs" / "decode" / f"{name}.yaml").is_file()
        assert (work / "out" / "graph" / name / "result.json").is_file()


def test_step_times_are_weighted_by_occurrence(decode_run):
    proc, report, _ = decode_run
    assert report["timing"] == "modeled"
    assert report["phase"] == "decode" and report["workload"] == "tiny"
    assert report["untimed_tasks"] == []
    before = after = 0.0
    for t in report["tasks"]:
        ref = t["reference_time_us"]
        assert ref > 0
        best = t["best_time_us"]
        if t["correct"] and not t["fallback_to_reference"]:
            assert best < ref
            assert t["speedup_vs_reference"] == pytest.approx(ref / best, rel=1e-6)
        else:
            assert best == ref
        assert t["step_time_before_us"] == pytest.approx(t["occurrences"] * ref)
        before += t["occurrences"] * ref
        after += t["occurrences"] * best
    assert report["step_time_before_us"] == pytest.approx(before)
    assert report["step_time_after_us"] == pytest.approx(after)
    assert report["step_speedup"] == pytest.approx(before / after)
    assert "modeled step time:" in proc.stdout
    # the bench's own rows come along
    assert {t["relative"] for t in report["bench"]["tasks"]} == {t["task"] for t in report["tasks"]}


@pytest.mark.parametrize("text,args,message", [
    (TINY.replace("layers: 2", "layers: 0"), [], "tiny.yaml:2:9: layers:"),
    (TINY.replace("num_kv_heads: 2", "num_kv_heads: 3"), [], "num_kv_heads: num_heads 4"),
    (TINY + "moe: {num_experts: 4, top_k: 8, expert_intermediate_size: 64}\n", [],
     "moe.top_k: top_k 8 exceeds num_experts 4"),
    (TINY, ["--tasks", "nothing*"], "no task of tiny (prefill) matches"),
])
def test_bad_workloads_exit_2_before_any_search(tmp_path, text, args, message):
    model = tmp_path / "tiny.yaml"
    model.write_text(text)
    proc = workload(model, "--state-dir", tmp_path / "state", "--json", tmp_path / "r.json",
                    *args, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert not (tmp_path / "r.json").exists()
    assert not (tmp_path / "state" / "workloads").exists()
