"""`maxkernel bench SUITE`: a mixed suite (a native spec, a JAXBench task directory, a MaxKernel
task directory and a malformed spec) run end to end with the built binary, the real worker and
real JAX, at a budget of 2 candidates per task.

What is checked: every task is a row in suite order, the malformed one a failure with its
file, line and exit code 2 (never dropped); the aggregates agree with the rows (rates are
shares of all tasks, fast_p is strict, a task without a correct kernel counts 1.0 in the
geomean); the exit code says not every task is correct; the HTML report names every task;
`--tasks` filters; `--modes auto,hitl-hint` runs each mode on its own store and states a rule;
bad command lines exit 2 before writing anything."""
import json
import math
import os
import pathlib
import re
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = pathlib.Path(os.environ.get("MAXKERNEL_BIN", ROOT / "build" / "cli" / "maxkernel"))

pytestmark = pytest.mark.skipif(not BIN.exists(), reason="maxkernel is not built")

AGGREGATES = ("tasks", "compile_rate", "correct_rate", "fast_1", "fast_1_5", "fast_2",
              "geomean_speedup_vs_reference", "geomean_speedup_vs_baseline", "evaluations",
              "wall_seconds")


def bench(*args, state, budget=2, timeout=1500):
    cmd = ["nice", "-n", "5", str(BIN), "bench", *map(str, args), "--state-dir", str(state),
           "--budget-evals", str(budget), "--nodes", "2"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    root = tmp_path_factory.mktemp("suite")
    (root / "native").mkdir()
    shutil.copy(ROOT / "examples" / "matmul" / "spec.yaml", root / "native" / "matmul.yaml")
    (root / "native" / "broken.yaml").write_text("name: broken\ndims: {M: 8}\ninputs: [\n")
    shutil.copytree(ROOT / "examples" / "jaxbench_matmul", root / "jb_matmul")
    shutil.copytree(ROOT / "tests" / "worker" / "tasks" / "mk_multi", root / "mk_norm")
    return root


@pytest.fixture(scope="module")
def graph_run(suite, tmp_path_factory):
    work = tmp_path_factory.mktemp("graph")
    proc = bench(suite, "--json", work / "bench.json", "--html", work / "bench.html",
                 "--jobs", "2", state=work / "state")
    return proc, json.loads((work / "bench.json").read_text()), work


def test_every_task_is_a_row_in_suite_order(graph_run):
    proc, b, _ = graph_run
    assert [t["relative"] for t in b["tasks"]] == [
        "jb_matmul", "mk_norm", "native/broken", "native/matmul"], proc.stderr
    assert b["mode"] == "graph" and b["timing"] == "modeled" and b["tasks_total"] == 4
    for key in AGGREGATES[1:]:
        assert key in b, key


def test_a_malformed_spec_is_a_failed_row_with_its_reason(graph_run):
    proc, b, _ = graph_run
    broken = b["tasks"][2]
    assert broken["exit_code"] == 2
    assert broken["correct"] is False and broken["compiled"] is False
    assert broken["speedup_vs_reference"] == 1.0
    assert re.search(r"broken\.yaml:\d+", broken["error"]), broken["error"]
    assert "native/broken: failed" in proc.stderr
    # Not every task has a correct kernel: exit 1.
    assert proc.returncode == 1, proc.stderr


def test_the_searched_tasks_carry_result_json_and_bench_fields(graph_run):
    _, b, _ = graph_run
    for t in (b["tasks"][0], b["tasks"][1], b["tasks"][3]):
        assert t["error"] is None, t
        assert t["mode"] == "graph" and t["chip"] == "v6e" and t["timing"] == "modeled"
        assert t["reference_time_us"] > 0
        assert 1 <= len(t["best_speedup_per_candidate"]) <= 2
        assert t["worker_seconds"] > 0
        if t["correct"]:
            assert t["compiled"] and t["profile"] is not None
            assert t["family"] != "unmatched"
            assert t["kernel_time_us"] > 0
    # The JAXBench task's optimized.py is its baseline; the other tasks have none.
    assert [t["baseline_time_us"] is not None for t in b["tasks"]] == [True, False, False, False]
    assert b["baseline_tasks"] == 1
    assert b["geomean_speedup_vs_baseline"] == pytest.approx(b["tasks"][0]["speedup_vs_baseline"])


def test_the_aggregates_agree_with_the_rows(graph_run):
    _, b, _ = graph_run
    tasks = b["tasks"]
    n = len(tasks)
    speedups = [t["speedup_vs_reference"] if t["correct"] else 1.0 for t in tasks]
    assert b["correct_rate"] == pytest.approx(sum(t["correct"] for t in tasks) / n)
    assert b["compile_rate"] == pytest.approx(sum(t["compiled"] for t in tasks) / n)
    for p, key in ((1.0, "fast_1"), (1.5, "fast_1_5"), (2.0, "fast_2")):
        assert b[key] == pytest.approx(
            sum(1 for t, s in zip(tasks, speedups) if t["correct"] and s > p) / n)
    assert b["geomean_speedup_vs_reference"] == pytest.approx(
        math.exp(sum(math.log(s) for s in speedups) / n))
    assert b["evaluations"] == sum(t["evaluations"] for t in tasks)
    assert sum(f["tasks"] for f in b["families"].values()) == n
    assert b["correct_rate"] >= 0.5  # the matmul tasks are in the expert brain's reach


def test_the_report_names_every_task(graph_run):
    _, b, work = graph_run
    page = (work / "bench.html").read_text()
    assert "<script" not in page
    for t in b["tasks"]:
        assert t["task"] in page


def test_modes_run_on_their_own_stores_and_state_a_rule(suite, tmp_path):
    proc = bench(suite, "--modes", "auto,hitl-hint", "--tasks", "native/matmul", "--json", "-",
                 state=tmp_path / "state")
    assert proc.returncode == 0, proc.stderr
    b = json.loads(proc.stdout)
    assert [r["mode"] for r in b["modes"]] == ["auto", "hitl-hint"]
    for r in b["modes"]:
        assert [t["task"] for t in r["tasks"]] == ["matmul_bf16"]
        assert r["tasks"][0]["correct"] is True
    assert (tmp_path / "state" / "bench-auto").is_dir()
    assert (tmp_path / "state" / "bench-hitl-hint").is_dir()
    rows = b["comparison"]["rows"]
    assert {(r["mode"], r["family"]) for r in rows} >= {("auto", "all"), ("hitl-hint", "all")}
    assert b["comparison"]["rule"].startswith("all: ")
    # The second mode was not answered from the first one's evaluations.
    assert b["modes"][1]["tasks"][0]["cache_hits"] < b["modes"][1]["tasks"][0]["evaluations"]


@pytest.mark.parametrize("args,budget,message", [
    (("--modes", "auto,quick"), 2, "not one of auto, graph, hitl-hint"),
    (("--modes", "auto,auto"), 2, "given twice"),
    (("--tasks", "nothing*"), 2, "no task matches"),
    ((), 0, "has no end"),
])
def test_bad_command_lines_exit_2_and_write_nothing(suite, tmp_path, args, budget, message):
    out = tmp_path / "b.json"
    proc = bench(suite, *args, "--json", out, state=tmp_path / "state", budget=budget)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert not out.exists()


def test_a_directory_without_tasks_exits_2(tmp_path):
    (tmp_path / "empty").mkdir()
    proc = bench(tmp_path / "empty", state=tmp_path / "state")
    assert proc.returncode == 2 and "no tasks" in proc.stderr
