"""`maxkernel bench --cluster` and `maxkernel workload --cluster`: the suite's tasks submitted to
a real supervisor with two node processes on loopback (the helpers of test_cluster.py), each
task an optimize submission, the report built by the same code as the embedded run.

What is checked: every task is a row in suite order, with the same keys as the embedded run's
rows of the same suite (and the run the same keys as the embedded run's); a malformed spec is a
failed row with its reason and exit code 2, never dropped; --out receives each task's outputs
from the cluster; the exit code says not every task is correct; `workload --cluster` reports
its one task with the step times."""
import json
import shutil
import subprocess

import pytest

from test_cluster import BIN, ROOT, Cluster, token, wait_for  # noqa: F401 (token: a fixture)
from test_workload import TINY

pytestmark = [pytest.mark.skipif(not BIN.exists(), reason="maxkernel is not built"),
              pytest.mark.slow]


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    root = tmp_path_factory.mktemp("suite")
    (root / "native").mkdir()
    shutil.copy(ROOT / "examples" / "matmul" / "spec.yaml", root / "native" / "matmul.yaml")
    (root / "native" / "broken.yaml").write_text("name: broken\ndims: {M: 8}\ninputs: [\n")
    shutil.copytree(ROOT / "tests" / "worker" / "tasks" / "mk_multi", root / "mk_norm")
    return root


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, token):  # noqa: F811
    c = Cluster(tmp_path_factory.mktemp("cluster"), token)
    c.start_supervisor()
    nodes = [c.start_node(devices=1), c.start_node(devices=1)]
    wait_for(lambda: all(c.joined(n) for n in nodes), 120, "two nodes joining")
    yield c
    c.close()


def run(*args, timeout=1500):
    return subprocess.run(["nice", "-n", "5", str(BIN), *map(str, args)], capture_output=True,
                          text=True, timeout=timeout)


def on_cluster(cluster):
    return ["--cluster", f"127.0.0.1:{cluster.client_port}", "--token-file", str(cluster.token)]


@pytest.fixture(scope="module")
def cluster_run(suite, cluster, tmp_path_factory):
    work = tmp_path_factory.mktemp("bench_cluster")
    proc = run("bench", suite, *on_cluster(cluster), "--budget-evals", 2, "--json",
               work / "bench.json", "--html", work / "bench.html", "--out", work / "out")
    assert (work / "bench.json").exists(), proc.stderr
    return proc, json.loads((work / "bench.json").read_text()), work


@pytest.fixture(scope="module")
def embedded_run(suite, tmp_path_factory):
    work = tmp_path_factory.mktemp("bench_embedded")
    proc = run("bench", suite, "--budget-evals", 2, "--nodes", 2, "--jobs", 2, "--state-dir",
               work / "state", "--json", work / "bench.json")
    assert (work / "bench.json").exists(), proc.stderr
    return json.loads((work / "bench.json").read_text())


def test_every_task_is_a_row_in_suite_order(cluster_run):
    proc, b, _ = cluster_run
    assert [t["relative"] for t in b["tasks"]] == ["mk_norm", "native/broken",
                                                   "native/matmul"], proc.stderr
    assert b["tasks_total"] == 3 and b["cluster"].startswith("127.0.0.1:")
    assert b["backend"] == "model" and b["timing"] == "modeled"
    # Not every task has a correct kernel (the malformed one): exit 1, as embedded.
    assert proc.returncode == 1, proc.stderr


def test_the_searched_rows_have_the_embedded_runs_fields(cluster_run, embedded_run):
    _, b, _ = cluster_run
    ours = {t["relative"]: t for t in b["tasks"]}
    theirs = {t["relative"]: t for t in embedded_run["tasks"]}
    for name in ("mk_norm", "native/matmul"):
        t = ours[name]
        assert t["error"] is None and t["evaluations"] >= 1, t
        assert t["family"] != "unmatched" and t["compiled"] is True, t
        # The search's cost and the best kernel's profile came back from the supervisor.
        assert t["worker_seconds"] > 0 and t["device_seconds"] > 0, t
        assert t["correct"] and t["profile"] and t["profile"]["bound"], t
        # The cluster's result.json adds its counts; the rest is the embedded row's keys.
        assert set(t) - {"nodes_lost", "redispatched"} == set(theirs[name]), name
        assert t["nodes_lost"] == 0
    assert set(b) - {"cluster", "store_scope"} == set(embedded_run)


def test_a_malformed_spec_is_a_failed_row_with_its_reason(cluster_run):
    _, b, _ = cluster_run
    t = next(t for t in b["tasks"] if t["relative"] == "native/broken")
    assert t["exit_code"] == 2 and t["correct"] is False, t
    assert "broken.yaml" in t["error"], t


def test_out_receives_each_tasks_outputs(cluster_run):
    _, b, work = cluster_run
    for name in ("mk_norm", "native/matmul"):
        d = work / "out" / "graph" / name
        assert (d / "kernel.py").exists() and (d / "graph.json").exists(), name
        assert json.loads((d / "result.json").read_text())["task"] == \
            next(t for t in b["tasks"] if t["relative"] == name)["task"]
    page = (work / "bench.html").read_text()
    for t in b["tasks"]:
        assert t["task"] in page


def test_bad_cluster_options_exit_2(suite, cluster, tmp_path):
    proc = run("bench", suite, *on_cluster(cluster), "--modes", "graph,hitl-hint",
               "--budget-evals", 2, "--json", tmp_path / "b.json")
    assert proc.returncode == 2 and "hitl-hint needs a local operator" in proc.stderr
    assert not (tmp_path / "b.json").exists()
    proc = run("bench", suite, *on_cluster(cluster), "--store-scope", "a b",
               "--budget-evals", 2, "--json", tmp_path / "b.json")
    assert proc.returncode == 2 and "--store-scope a b" in proc.stderr
    assert not (tmp_path / "b.json").exists()


def test_several_modes_each_answered_only_from_its_own_evaluations(cluster_run, suite, cluster,
                                                                   tmp_path):
    # cluster_run stored this task's evaluations (graph mode, no scope) in the supervisor's
    # store; the same search under a mode's scope must evaluate everything again, as on a
    # fresh store, and the second run of the same modes is answered from each mode's own.
    _, unscoped, _ = cluster_run
    fresh = next(t for t in unscoped["tasks"] if t["relative"] == "native/matmul")

    def modes_run(name):
        proc = run("bench", suite, *on_cluster(cluster), "--tasks", "native/matmul",
                   "--modes", "auto,graph", "--budget-evals", 2, "--json", tmp_path / name)
        assert proc.returncode == 0, proc.stderr
        b = json.loads((tmp_path / name).read_text())
        assert [r["mode"] for r in b["modes"]] == ["auto", "graph"]
        assert [r["store_scope"] for r in b["modes"]] == ["bench-auto", "bench-graph"]
        assert b["comparison"]["rule"], b["comparison"]
        return {r["mode"]: r["tasks"][0] for r in b["modes"]}

    first = modes_run("first.json")
    graph = first["graph"]
    assert graph["evaluations"] == fresh["evaluations"], (graph, fresh)
    assert graph["cache_hits"] == fresh["cache_hits"], (graph, fresh)
    assert graph["speedup_vs_reference"] == fresh["speedup_vs_reference"]
    # auto ran first and its reference and first candidate are graph's too: no hit either.
    assert first["auto"]["cache_hits"] == 0, first["auto"]
    again = modes_run("again.json")
    for mode, row in again.items():
        assert row["evaluations"] == first[mode]["evaluations"], mode
        assert row["cache_hits"] == row["evaluations"] > 0, (mode, row)


def test_workload_on_the_cluster_reports_its_task(cluster, tmp_path):
    model = tmp_path / "tiny.yaml"
    model.write_text(TINY)
    proc = run("workload", model, "--phase", "decode", "--budget-evals", 1, "--tasks", "rmsnorm",
               "--json", tmp_path / "w.json", *on_cluster(cluster), "--out", tmp_path / "out")
    assert proc.returncode in (0, 1), proc.stderr
    report = json.loads((tmp_path / "w.json").read_text())
    rows = report["bench"]["tasks"]
    assert [r["relative"] for r in rows] == ["rmsnorm"], rows
    assert rows[0]["error"] is None and rows[0]["evaluations"] >= 1, rows
    assert report["bench"]["cluster"].startswith("127.0.0.1:")
    assert (tmp_path / "out" / "graph" / "rmsnorm" / "result.json").exists()


def test_an_unreachable_cluster_is_an_environment_error(suite, tmp_path, token):  # noqa: F811
    proc = run("bench", suite, "--cluster", "127.0.0.1:1", "--token-file", token,
               "--budget-evals", 2, "--json", tmp_path / "b.json", timeout=120)
    assert proc.returncode == 3, proc.stderr
    assert not (tmp_path / "b.json").exists()
