"""`maxkernel optimize SPEC`: the auto and graph supervisors end to end, with the built binary,
the real worker and real JAX, on examples/matmul/spec.yaml with small budgets.

What is checked: result.json's contract fields and their consistency with graph.json,
search.sqlite and kernel.py (auto: a chain; graph: rounds whose children are fixed, the beam
policy's choice of parent); the same spec, seed and budget give the same graph with 1 and 4
nodes in both modes; `--resume` continues a finished search with a larger budget and a search
killed by SIGKILL without dispatching what had finished; bad command lines exit 2 before
writing anything; `--json -` keeps stdout for the JSON alone.

Every run has its own state directory under pytest's tmp_path, so no run is answered from
another's evaluation store. The runs are module fixtures shared by the tests: about 20 candidates
in all, 4 to 6 minutes on two busy cores (load 9 to 10)."""
import json
import os
import pathlib
import re
import signal
import sqlite3
import subprocess
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = pathlib.Path(os.environ.get("MAXKERNEL_BIN", ROOT / "build" / "cli" / "maxkernel"))
SPEC = ROOT / "examples" / "matmul" / "spec.yaml"

pytestmark = pytest.mark.skipif(not BIN.exists(), reason="maxkernel is not built")

CONTRACT_FIELDS = (
    "schema", "task", "mode", "chip", "backend", "timing", "correct", "fallback_to_reference",
    "kernel_time_us", "reference_time_us", "baseline_time_us", "speedup_vs_reference",
    "speedup_vs_baseline", "roofline_time_us", "roofline_fraction", "evaluations",
    "cache_hits", "failures", "wall_seconds", "tokens", "cost_usd", "seed", "jax_version",
    "maxkernel_version")
OUTPUTS = ("kernel.py", "result.json", "search.sqlite", "graph.json", "graph.dot", "report.html")
# Graph runs: one first candidate, then two children of the single best vertex per round.
GRAPH = ("--mode", "graph", "--beam-width", "1", "--branching", "2")
ROUND_OUT = re.compile(r"round (\d+): (\d+) candidate\(s\) out")


def command(*args, state, spec=SPEC):
    return ["nice", "-n", "5", str(BIN), "optimize", str(spec), *map(str, args),
            "--state-dir", str(state)]


def optimize(*args, state, spec=SPEC, timeout=1200):
    return subprocess.run(command(*args, state=state, spec=spec), capture_output=True, text=True,
                          timeout=timeout)


class Run:
    """One finished `maxkernel optimize` with --out: its exit, streams and output files."""

    def __init__(self, proc, out, state):
        self.proc, self.out, self.state = proc, out, state
        assert proc.returncode in (0, 1), proc.stderr
        self.result = json.loads((out / "result.json").read_text())
        self.graph = json.loads((out / "graph.json").read_text())
        self.vertices = self.graph["vertices"]

    def rounds_out(self):
        """The (round, candidates) of every 'round R: K candidate(s) out' progress line."""
        return [(int(r), int(k)) for r, k in ROUND_OUT.findall(self.proc.stderr)]


def run(tmp_path_factory, name, *args):
    base = tmp_path_factory.mktemp(name)
    out, state = base / "out", base / "state"
    return Run(optimize(*args, "--out", out, state=state), out, state)


def identity(v):
    """What must not depend on node count, arrival order or a resume (which candidates got the
    tester's cases included: the bar is fixed when a step starts)."""
    return (v["index"], v["parent"], v["strategy"], v["round"], v["candidate_id"], v["correct"],
            v["time_us"], "the tester's cases skipped" in v.get("verdict", ""))


@pytest.fixture(scope="module")
def auto1(tmp_path_factory):
    return run(tmp_path_factory, "auto1", "--mode", "auto", "--nodes", "1", "--budget-evals", "3",
               "--seed", "7")


@pytest.fixture(scope="module")
def auto4(tmp_path_factory):
    # Also the `--json -` run: the JSON on stdout, everything else on stderr.
    return run(tmp_path_factory, "auto4", "--mode", "auto", "--nodes", "4", "--budget-evals", "3",
               "--seed", "7", "--json", "-")


@pytest.fixture(scope="module")
def graph1(tmp_path_factory):
    return run(tmp_path_factory, "graph1", *GRAPH, "--nodes", "1", "--budget-evals", "3")


@pytest.fixture(scope="module")
def graph4(tmp_path_factory):
    return run(tmp_path_factory, "graph4", *GRAPH, "--nodes", "4", "--budget-evals", "3")


@pytest.fixture(scope="module")
def graph_resumed(graph1):
    """graph1's search continued in its state directory with a budget of 6."""
    out = graph1.out.parent / "resumed"
    proc = optimize(*GRAPH, "--nodes", "1", "--budget-evals", "6", "--resume", "--out", out,
                    state=graph1.state)
    return Run(proc, out, graph1.state)


# --- result.json, kernel.py, report.html, search.sqlite ----------------------------------------

def check_outputs(r, mode, budget):
    j, vertices = r.result, r.vertices
    for name in OUTPUTS:
        assert (r.out / name).is_file(), name
    for key in CONTRACT_FIELDS:
        assert key in j, key
    assert j["schema"] == 1 and j["task"] == "matmul_bf16" and j["mode"] == mode
    assert j["chip"] == "v6e" and j["backend"] == "model" and j["timing"] == "modeled"
    assert j["tokens"] == {"prompt": 0, "completion": 0} and j["cost_usd"] is None
    assert j["baseline_time_us"] is None and j["speedup_vs_baseline"] is None
    assert j["jax_version"] and j["maxkernel_version"] and j["wall_seconds"] > 0
    assert isinstance(j["failures"], dict)

    # The budget is the number of vertices, all of them finished.
    assert j["stop_reason"] == "budget", j["stop_reason"]
    assert j["candidates_evaluated"] == budget == len(vertices)
    assert [v["index"] for v in vertices] == list(range(len(vertices)))
    assert all(v["state"] in ("evaluated", "failed") for v in vertices)
    # Each vertex's tests and profile are evaluations; the reference's timing adds more.
    assert all(v["evaluations"] >= 1 for v in vertices)
    assert j["evaluations"] >= sum(v["evaluations"] for v in vertices)
    failed = sum(1 for v in vertices if not v["correct"])
    assert sum(j["failures"].values()) >= failed

    # The best vertex: the fastest correct one (the lower index on ties).
    timed = [v for v in vertices if v["correct"] and v["time_us"]]
    assert timed, "no correct candidate in the graph"
    best = min(timed, key=lambda v: (v["time_us"], v["index"]))
    assert r.graph["best"] == best["index"]
    assert j["correct"] is True and r.proc.returncode == 0, r.proc.stderr
    assert j["best_candidate"]["vertex"] == best["index"]
    assert j["best_candidate"]["id"] == best["candidate_id"]
    assert j["best_candidate"]["time_us"] == pytest.approx(best["time_us"], rel=1e-9)
    # The search's cost: device time of the timing runs (13 per timed candidate), the
    # workers' phase seconds, and the best kernel's profile.
    assert j["compiled"] is True and j["worker_seconds"] > 0
    assert j["device_seconds"] == pytest.approx(
        sum(v["time_us"] for v in vertices if v["time_us"]) * 13 / 1e6, rel=1e-9)
    assert j["profile"]["time_us"] == pytest.approx(best["time_us"], rel=1e-6), j["profile"]

    # The curve of the best speedup per candidate ends at the best vertex's speedup.
    ref = j["reference_time_us"]
    assert ref > 0
    curve = j["best_speedup_per_candidate"]
    assert len(curve) == len(vertices)
    reached = [s for s in curve if s is not None]
    assert reached == sorted(reached)
    assert curve[-1] == pytest.approx(ref / best["time_us"], rel=1e-9)

    beats = best["time_us"] < ref
    assert j["fallback_to_reference"] is (not beats)
    kernel = (r.out / "kernel.py").read_text()
    header = kernel.split("\n", 1)[0]
    assert header.startswith(f"# maxkernel optimize ({mode} mode): task matmul_bf16, chip v6e")
    assert f"JAX {j['jax_version']}" in kernel
    if j["fallback_to_reference"]:
        # The honest answer: the reference, no claim of a speedup.
        assert j["kernel_time_us"] == pytest.approx(ref, rel=1e-12)
        assert j["speedup_vs_reference"] == 1.0
        assert "fallback" in header
        reference = SPEC.read_text().split("reference: |\n", 1)[1].split("\n#", 1)[0]
        for line in reference.splitlines():
            assert line.strip() in kernel, line
        assert "workload = reference" in kernel
        assert "pallas_call" not in kernel
    else:
        assert j["kernel_time_us"] == pytest.approx(best["time_us"], rel=1e-9)
        assert j["speedup_vs_reference"] == pytest.approx(ref / j["kernel_time_us"], rel=1e-9)
        assert j["speedup_vs_reference"] > 1
        assert f"vertex {best['index']} of {len(vertices)}" in kernel
        assert "pallas_call" in kernel and "def workload" in kernel
        assert "CONFIG" in kernel and "def create_inputs" in kernel
    if j["roofline_time_us"] is not None:
        assert j["roofline_fraction"] == pytest.approx(
            j["roofline_time_us"] / j["kernel_time_us"], rel=1e-9)
        assert 0 < j["roofline_fraction"] <= 1

    report = (r.out / "report.html").read_text()
    assert "<svg" in report and "matmul_bf16" in report

    # search.sqlite: this search alone, one file, the same vertices as graph.json.
    assert not (r.out / "search.sqlite-wal").exists()
    db = sqlite3.connect(r.out / "search.sqlite")
    try:
        tables = {t for (t,) in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert tables == {"meta", "searches", "vertices", "edges", "transcript"}, tables
        assert db.execute("PRAGMA journal_mode").fetchone()[0] != "wal"
        searches = db.execute("SELECT key, task, mode, chip FROM searches").fetchall()
        assert len(searches) == 1 and searches[0][1:] == ("matmul_bf16", mode, "v6e"), searches
        rows = db.execute("SELECT idx, parent, candidate_id, state, correct, time_us "
                          "FROM vertices ORDER BY idx").fetchall()
        assert [(i, p, c, s, bool(ok), t) for i, p, c, s, ok, t in rows] == [
            (v["index"], v["parent"], v["candidate_id"], v["state"], v["correct"], v["time_us"])
            for v in vertices]
        edges = db.execute("SELECT parent, child FROM edges ORDER BY child").fetchall()
        assert edges == [(v["parent"], v["index"]) for v in vertices if v["parent"] >= 0]
    finally:
        db.close()


@pytest.mark.slow
def test_auto_mode_writes_a_consistent_result(auto1):
    check_outputs(auto1, "auto", 3)
    assert auto1.result["seed"] == 7 and auto1.result["resumed"] is False
    # One trajectory: a chain, each step from a correct earlier vertex, one vertex per step.
    vertices = auto1.vertices
    assert vertices[0]["parent"] == -1
    for v in vertices[1:]:
        assert 0 <= v["parent"] < v["index"], v
        assert vertices[v["parent"]]["correct"], v
    rounds = [v["round"] for v in vertices]
    assert rounds == sorted(set(rounds)), rounds
    # The planner moves from the best correct candidate so far.
    for v in vertices[1:]:
        earlier = [u for u in vertices[:v["index"]] if u["correct"] and u["time_us"]]
        assert v["parent"] == min(earlier, key=lambda u: (u["time_us"], u["index"]))["index"]


@pytest.mark.slow
def test_graph_mode_expands_rounds_of_fixed_children(graph1, graph_resumed):
    check_outputs(graph1, "graph", 3)
    check_outputs(graph_resumed, "graph", 6)
    for r in (graph1, graph_resumed):
        vertices = r.vertices
        rounds = [v["round"] for v in vertices]
        assert rounds == sorted(rounds), rounds
        assert rounds[0] == 0
        by_round = {}
        for v in vertices:
            by_round.setdefault(v["round"], []).append(v)
        assert sorted(by_round) == list(range(len(by_round))), rounds
        assert r.result["rounds"] == len(by_round)
        for rnd, members in by_round.items():
            if rnd == 0:
                assert all(v["parent"] == -1 for v in members)
                continue
            # Children of a round come from vertices of earlier rounds only (fixed before
            # dispatch), at most --branching per parent, one parent (--beam-width 1): the
            # fastest correct vertex so far, lower index on ties (the beam policy).
            parents = {v["parent"] for v in members}
            assert len(parents) == 1, members
            (parent,) = parents
            assert vertices[parent]["round"] < rnd
            assert len(members) <= 2
            earlier = [u for u in vertices if u["round"] < rnd and u["correct"] and u["time_us"]]
            best = min(earlier, key=lambda u: (u["time_us"], u["index"]))
            assert parent == best["index"]
            # A dive (the default): after a round that made the best vertex, one child of it.
            if best["round"] == rnd - 1:
                assert len(members) == 1, members
    # The progress line announced each round with exactly its vertices.
    assert graph1.rounds_out() == [(rnd, sum(1 for v in graph1.vertices if v["round"] == rnd))
                                   for rnd in sorted({v["round"] for v in graph1.vertices})]


# --- determinism ------------------------------------------------------------------------------

@pytest.mark.slow
def test_auto_mode_gives_the_same_graph_on_1_and_4_nodes(auto1, auto4):
    assert [identity(v) for v in auto1.vertices] == [identity(v) for v in auto4.vertices]
    assert auto4.result["nodes"] == 4 and auto1.result["nodes"] == 1
    for key in ("kernel_time_us", "speedup_vs_reference", "fallback_to_reference", "correct"):
        assert auto1.result[key] == auto4.result[key], key


@pytest.mark.slow
def test_graph_mode_gives_the_same_graph_on_1_and_4_nodes(graph1, graph4):
    check_outputs(graph4, "graph", 3)
    assert [identity(v) for v in graph1.vertices] == [identity(v) for v in graph4.vertices]
    assert graph4.result["nodes"] == 4
    for key in ("kernel_time_us", "speedup_vs_reference", "fallback_to_reference", "correct"):
        assert graph1.result[key] == graph4.result[key], key


# --- resume -----------------------------------------------------------------------------------

@pytest.mark.slow
def test_resume_with_a_larger_budget_keeps_the_finished_vertices(graph1, graph_resumed):
    j = graph_resumed.result
    assert graph_resumed.proc.returncode == 0, graph_resumed.proc.stderr
    assert j["resumed"] is True and graph1.result["resumed"] is False
    assert j["candidates_evaluated"] == 6 == len(graph_resumed.vertices)
    assert [identity(v) for v in graph_resumed.vertices[:3]] == \
        [identity(v) for v in graph1.vertices]
    # Only the three new candidates went out.
    assert sum(k for _, k in graph_resumed.rounds_out()) == 3, graph_resumed.proc.stderr


def finished_vertices(db_path):
    """(idx -> (state, candidate_id, time_us)) of the state directory's search, {} before the
    tables exist."""
    if not db_path.exists():
        return {}
    db = sqlite3.connect(db_path, timeout=15)
    try:
        rows = db.execute("SELECT idx, state, candidate_id, time_us FROM vertices").fetchall()
    except sqlite3.OperationalError:
        return {}
    finally:
        db.close()
    return {i: (s, c, t) for i, s, c, t in rows}


@pytest.mark.slow
def test_resume_after_sigkill_dispatches_only_what_had_not_finished(tmp_path, graph1):
    state, out = tmp_path / "state", tmp_path / "out"
    args = (*GRAPH, "--nodes", "2", "--budget-evals", "3")
    db_path = state / "evaluations.sqlite"
    log = (tmp_path / "killed.stderr").open("w")
    proc = subprocess.Popen(command(*args, state=state), stdout=subprocess.DEVNULL, stderr=log,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline and proc.poll() is None:
            if any(s == "evaluated" for s, _, _ in finished_vertices(db_path).values()):
                break
            time.sleep(0.2)
        assert proc.poll() is None, "the search ended before it could be killed"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        try:  # its workers die with it (PR_SET_PDEATHSIG); make sure of it
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        log.close()
    assert proc.returncode == -signal.SIGKILL
    before = finished_vertices(db_path)
    done = {i: v for i, v in before.items() if v[0] != "pending"}
    pending = sorted(i for i, v in before.items() if v[0] == "pending")
    assert done, before

    r = Run(optimize(*args, "--resume", "--out", out, state=state), out, state)
    check_outputs(r, "graph", 3)
    assert r.result["resumed"] is True
    after = {v["index"]: (v["state"], v["candidate_id"], v["time_us"]) for v in r.vertices}
    for i, v in done.items():
        assert after[i] == v, (i, v, after[i])
    # Nothing that had finished went out again: the pending vertices first, then new rounds.
    sent = r.rounds_out()
    assert sum(k for _, k in sent) == len(r.vertices) - len(done), r.proc.stderr
    if pending:
        assert sent[0][1] == len(pending), r.proc.stderr
    # And the search is the one an uninterrupted run makes (graph1: the same settings and
    # budget on one node), round numbers too.
    assert [identity(v) for v in r.vertices] == [identity(v) for v in graph1.vertices]


# --- bad input --------------------------------------------------------------------------------

@pytest.mark.parametrize("args, spec, message", [
    (("--mode", "annealing"), SPEC, "--mode"),
    (("--budget-evals", "0"), SPEC, "no end"),
    (("--policy", "nonsense"), SPEC, "--policy"),
    (("--nodes", "0"), SPEC, "--nodes"),
    (("--target-roofline", "2"), SPEC, "--target-roofline"),
    ((), ROOT / "examples" / "matmul" / "no_such_spec.yaml", "no_such_spec.yaml"),
], ids=["mode-unknown", "no-end", "policy", "nodes-0", "roofline-2", "no-spec"])
def test_bad_input_exits_2_and_writes_nothing(tmp_path, args, spec, message):
    out, state = tmp_path / "out", tmp_path / "state"
    r = optimize(*args, "--out", out, "--json", tmp_path / "result.json", state=state, spec=spec,
                 timeout=120)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert message in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""
    assert not out.exists() or not any(out.iterdir())
    assert not (tmp_path / "result.json").exists()


# --- --json - ---------------------------------------------------------------------------------

@pytest.mark.slow
def test_json_dash_puts_only_the_json_on_stdout(auto4):
    j = json.loads(auto4.proc.stdout)
    assert j == auto4.result
    check_outputs(auto4, "auto", 3)
    # Progress and the summary went to stderr.
    assert "evaluated" in auto4.proc.stderr and "stopped: budget" in auto4.proc.stderr
    assert "matmul_bf16:" in auto4.proc.stderr and "wrote" in auto4.proc.stderr
