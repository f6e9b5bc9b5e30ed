"""A cluster on loopback, with real processes: `maxkernel supervisor`, `maxkernel node` and
`maxkernel optimize --cluster`, started and stopped by the tests, with the credentials of
`maxkernel cluster init` (mutual TLS on the node port, CURVE on the client port).

What is checked: a graph search through a supervisor and three node processes; a node killed
(SIGKILL) or frozen (SIGSTOP) mid-search: the search finishes, every candidate has one result,
and the search graph equals the fault-free run's with the same seed; a node that joins
mid-search gets work; the supervisor killed mid-search and restarted with --resume finishes the
search for the waiting client without dispatching what had finished; another cluster's node
and client are refused ("authentication failed", exit 3) and get no work.

Every cluster has its own state directory, so no run is answered from another's store. Small
graph searches of examples/matmul (6 candidates); a few minutes on two busy cores."""
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
SEARCH = ("--mode", "graph", "--beam-width", "1", "--branching", "2", "--budget-evals", "6",
          "--seed", "5")
READY = re.compile(r"supervisor: nodes join at ([\d.]+):(\d+); clients at tcp://([\d.]+):(\d+)")

pytestmark = [pytest.mark.skipif(not BIN.exists(), reason="maxkernel is not built"),
              pytest.mark.slow]


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


class Cluster:
    """A supervisor (restartable) and its node processes, all killed at the end."""

    def __init__(self, base, token):
        self.base, self.token = base, token
        self.state = base / "state"
        self.procs, self.nodes = [], []
        self.node_port = self.client_port = None
        self.supervisor = None

    def start_supervisor(self, *extra):
        ports = []
        if self.node_port:  # a restart listens where the nodes and the client expect it
            ports = ["--listen", f"127.0.0.1:{self.node_port}",
                     "--shell-listen", f"127.0.0.1:{self.client_port}"]
        else:
            ports = ["--listen", "127.0.0.1:0", "--shell-listen", "127.0.0.1:0"]
        log = self.base / f"supervisor{len(self.procs)}.log"
        proc = subprocess.Popen([str(BIN), "supervisor", *ports, "--state-dir", str(self.state),
                                 "--token-file", str(self.token), *extra],
                                stdout=subprocess.DEVNULL, stderr=log.open("w"),
                                start_new_session=True)
        self.procs.append(proc)
        self.supervisor = proc
        m = wait_for(lambda: READY.search(log.read_text()), 30, "the supervisor's ports")
        self.node_port, self.client_port = int(m.group(2)), int(m.group(4))
        return proc

    def start_node(self, devices=1, token=None):
        log = self.base / f"node{len(self.nodes)}.log"
        proc = subprocess.Popen([str(BIN), "node", "--join", f"127.0.0.1:{self.node_port}",
                                 "--token-file", str(token or self.token), "--devices",
                                 str(devices), "--workers", "1"],
                                stdout=subprocess.DEVNULL, stderr=log.open("w"),
                                start_new_session=True)
        proc.log = log
        self.procs.append(proc)
        self.nodes.append(proc)
        return proc

    def joined(self, node):
        return "node: joined" in node.log.read_text()

    def optimize(self, out, *extra, token=None):
        return subprocess.Popen([str(BIN), "optimize", str(SPEC), *SEARCH, "--cluster",
                                 f"127.0.0.1:{self.client_port}", "--token-file",
                                 str(token or self.token), "--out", str(out), *extra],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def status(self):
        proc = subprocess.run([str(BIN), "cluster", "status", "--cluster",
                               f"127.0.0.1:{self.client_port}", "--token-file", str(self.token)],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGCONT)
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait(timeout=30)


@pytest.fixture(scope="module")
def token(tmp_path_factory):
    d = tmp_path_factory.mktemp("creds") / "cluster"
    proc = subprocess.run([str(BIN), "cluster", "init", str(d)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return d / "token"


@pytest.fixture
def cluster(tmp_path, token):
    c = Cluster(tmp_path, token)
    yield c
    c.close()


def finish(proc, timeout=900):
    out, err = proc.communicate(timeout=timeout)
    proc.stdout_text, proc.stderr_text = out, err
    return proc


class Result:
    def __init__(self, proc, out):
        assert proc.returncode in (0, 1), proc.stderr_text
        self.proc = proc
        self.result = json.loads((out / "result.json").read_text())
        self.vertices = json.loads((out / "graph.json").read_text())["vertices"]


def identity(v):
    return (v["index"], v["parent"], v["strategy"], v["round"], v["candidate_id"], v["correct"],
            v["time_us"])


def check_complete(r):
    """Every candidate of the budget has exactly one result."""
    assert r.result["stop_reason"] == "budget"
    assert r.result["candidates_evaluated"] == 6 == len(r.vertices)
    assert [v["index"] for v in r.vertices] == list(range(6))
    assert all(v["state"] != "pending" for v in r.vertices), r.vertices
    assert len({v["candidate_id"] for v in r.vertices}) == 6


@pytest.fixture(scope="module")
def fault_free(tmp_path_factory, token):
    c = Cluster(tmp_path_factory.mktemp("fault_free"), token)
    try:
        c.start_supervisor()
        nodes = [c.start_node() for _ in range(3)]
        wait_for(lambda: all(c.joined(n) for n in nodes), 120, "three nodes to join")
        out = c.base / "out"
        r = Result(finish(c.optimize(out)), out)
        r.status = c.status()
        return r
    finally:
        c.close()


def test_a_graph_search_runs_on_three_node_processes(fault_free):
    check_complete(fault_free)
    j = fault_free.result
    assert j["nodes"] == 3 and j["nodes_lost"] == 0 and j["redispatched"] == 0
    assert j["mode"] == "graph" and j["backend"] == "model" and j["seed"] == 5
    assert "wrote " in fault_free.proc.stdout_text
    # Every node process took work from the dispatcher.
    done = [int(m) for m in re.findall(r"alive, \d+ in flight, (\d+) done", fault_free.status)]
    assert len(done) == 3 and all(d > 0 for d in done), fault_free.status


def start_search_on_three_nodes(cluster):
    """A supervisor, three node processes joined, and the search submitted to them."""
    cluster.start_supervisor()
    nodes = [cluster.start_node() for _ in range(3)]
    wait_for(lambda: all(cluster.joined(n) for n in nodes), 120, "three nodes to join")
    out = cluster.base / "out"
    return nodes, out, cluster.optimize(out)


def run_with_fault(cluster, fault):
    """Three nodes; `fault(node)` is done to the second once the search's first round is out."""
    nodes, out, proc = start_search_on_three_nodes(cluster)
    # The reference and the first candidate are back: the search's rounds are under way.
    wait_for(lambda: dispatcher_completed(cluster.status()) >= 2, 300, "two evaluations")
    fault(nodes[1])
    return Result(finish(proc), out)


def test_a_node_killed_mid_search_loses_nothing(cluster, fault_free):
    r = run_with_fault(cluster, lambda node: os.killpg(node.pid, signal.SIGKILL))
    check_complete(r)
    assert r.result["nodes_lost"] >= 1
    assert [identity(v) for v in r.vertices] == [identity(v) for v in fault_free.vertices]
    assert r.result["kernel_time_us"] == fault_free.result["kernel_time_us"]
    assert "lost" in cluster.status()


def test_a_frozen_node_is_noticed_and_its_work_moves_on(cluster, fault_free):
    r = run_with_fault(cluster, lambda node: os.killpg(node.pid, signal.SIGSTOP))
    check_complete(r)
    assert r.result["nodes_lost"] >= 1
    assert [identity(v) for v in r.vertices] == [identity(v) for v in fault_free.vertices]


def test_a_node_joining_mid_search_gets_work(cluster):
    cluster.start_supervisor()
    first = cluster.start_node()
    wait_for(lambda: cluster.joined(first), 120, "the first node to join")
    out = cluster.base / "out"
    proc = cluster.optimize(out)
    wait_for(lambda: " 1 done" in cluster.status() or " 2 done" in cluster.status(), 300,
             "the first evaluation")
    late = cluster.start_node(devices=2)
    r = Result(finish(proc), out)
    check_complete(r)
    assert cluster.joined(late)
    lines = [l for l in cluster.status().splitlines() if l.startswith("node ")]
    assert len(lines) == 3, lines
    late_done = [int(re.search(r"(\d+) done", l).group(1)) for l in lines[1:]]
    assert sum(late_done) > 0, lines


def stored_evaluations(state):
    db = sqlite3.connect(f"file:{state / 'evaluations.sqlite'}?mode=ro", uri=True)
    try:
        return db.execute("SELECT count(*) FROM evaluations").fetchone()[0]
    except sqlite3.OperationalError:
        return 0
    finally:
        db.close()


def dispatcher_completed(status):
    return int(re.search(r"(\d+) completed", status).group(1))


def test_ctrl_c_at_the_client_stops_the_search_on_the_supervisor(cluster):
    """As embedded: the first SIGINT stops the search (the shell's `stop`), its outputs come
    back with the best so far; the submission ends on the supervisor too."""
    cluster.start_supervisor()
    node = cluster.start_node()
    wait_for(lambda: cluster.joined(node), 120, "the node to join")
    out = cluster.base / "out"
    proc = subprocess.Popen([str(BIN), "optimize", str(SPEC), "--mode", "auto", "--budget-evals",
                             "30", "--seed", "3", "--cluster", f"127.0.0.1:{cluster.client_port}",
                             "--token-file", str(cluster.token), "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True,
                            # SIGINT at its default even when the tests run with it ignored
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    wait_for(lambda: stored_evaluations(cluster.state) >= 2 or proc.poll() is not None, 600,
             "the first candidate's evaluation")
    assert proc.poll() is None, "the search ended before it could be interrupted"
    proc.send_signal(signal.SIGINT)
    finish(proc)
    assert proc.returncode in (0, 1), proc.stderr_text
    assert "interrupted: the search ends after its candidates in flight" in proc.stderr_text
    result = json.loads((out / "result.json").read_text())
    assert result["stop_reason"] == "operator", result
    assert 1 <= result["candidates_evaluated"] < 30
    assert (out / "kernel.py").exists()
    # The supervisor's record of the submission: finished, not running on.
    codes = list((cluster.state / "submissions").glob("*/exit_code"))
    assert len(codes) == 1 and codes[0].read_text().strip() == str(proc.returncode)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_a_killed_supervisor_resumes_without_redoing_finished_work(cluster, fault_free, sig):
    """SIGKILL, or SIGTERM (the supervisor's own stop: at once, its run left as a kill leaves
    it, and its client told so), then --resume."""
    nodes, out, proc = start_search_on_three_nodes(cluster)
    wait_for(lambda: stored_evaluations(cluster.state) >= 3, 600, "three stored evaluations")
    first = cluster.supervisor
    os.killpg(first.pid, sig)
    first.wait(timeout=30)  # not the rest of the search
    if sig == signal.SIGTERM:
        assert first.returncode == 0
        log = (cluster.base / "supervisor0.log").read_text()
        assert "stopped with 1 run(s) unfinished" in log and "--resume" in log, log
    done_before = stored_evaluations(cluster.state)
    cluster.start_supervisor("--resume")
    r = Result(finish(proc), out)
    if sig == signal.SIGTERM:
        assert "stopped with this run unfinished" in proc.stderr_text, proc.stderr_text
    check_complete(r)
    assert r.result["resumed"] is True
    assert [identity(v) for v in r.vertices] == [identity(v) for v in fault_free.vertices]
    # Evaluations the first supervisor had stored were answered from the store, not sent to a
    # node again: the restarted dispatcher did at most what the fault-free one did minus them.
    redone = dispatcher_completed(cluster.status())
    assert redone <= dispatcher_completed(fault_free.status) - done_before, (redone, done_before)
    integrity = sqlite3.connect(str(cluster.state / "evaluations.sqlite"))
    assert integrity.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    integrity.close()


def test_another_clusters_node_and_client_are_refused(cluster, tmp_path):
    other = tmp_path / "other"
    subprocess.run([str(BIN), "cluster", "init", str(other)], check=True, capture_output=True)
    cluster.start_supervisor()
    node = cluster.start_node(token=other / "token")
    assert node.wait(timeout=180) == 3
    assert "authentication failed" in node.log.read_text()
    status = cluster.status()
    assert "0 of 0 node(s) alive" in status, status
    client = finish(cluster.optimize(tmp_path / "out", token=other / "token"), timeout=120)
    assert client.returncode == 3
    assert "authentication failed" in client.stderr_text
    assert not (tmp_path / "out" / "result.json").exists()
    assert not (cluster.state / "submissions").exists()


def test_a_scripted_console_drives_a_hitl_search_on_the_cluster(cluster, tmp_path):
    """optimize --cluster --mode hitl --console: the supervisor's gateway (CURVE, the cluster's
    credentials) takes this terminal's decisions; the search ends by them."""
    cluster.start_supervisor()
    node = cluster.start_node(devices=2)
    wait_for(lambda: cluster.joined(node), 120, "the node to join")
    out = tmp_path / "out"
    proc = subprocess.run(
        [str(BIN), "optimize", str(SPEC), "--mode", "hitl", "--console", "--budget-evals", "2",
         "--seed", "5", "--cluster", f"127.0.0.1:{cluster.client_port}", "--token-file",
         str(cluster.token), "--out", str(out)],
        input="approve\nstop\n", capture_output=True, text=True, timeout=900)
    assert proc.returncode in (0, 1), proc.stderr
    assert re.search(r"^proposal #1: vertex 0 ", proc.stdout, re.M), proc.stdout
    assert "decided #1: approve by " in proc.stdout, proc.stdout
    result = json.loads((out / "result.json").read_text())
    assert result["mode"] == "hitl"
    assert result["candidates_evaluated"] >= 1
    # The gateway took nobody without the cluster's credentials.
    gateway = re.search(r"operator gateway: (tcp://\S+)", proc.stderr).group(1)
    assert gateway.startswith("tcp://127.0.0.1:")


def shell(cluster, *commands, json_out=False, input=None, token=None):
    args = [str(BIN), "shell", "--attach", f"127.0.0.1:{cluster.client_port}", "--token-file",
            str(token or cluster.token), "-c", "; ".join(commands)]
    if json_out:
        args.append("--json")
    return subprocess.run(args, capture_output=True, text=True, timeout=600, input=input)


def test_the_shell_submits_inspects_exports_and_drains(cluster, tmp_path):
    cluster.start_supervisor()
    node = cluster.start_node(devices=2)
    wait_for(lambda: cluster.joined(node), 120, "the node to join")
    sub = shell(cluster, f"submit {SPEC} --mode graph --budget-evals 2 --seed 5")
    assert sub.returncode == 0, sub.stderr
    task_id = re.search(r"submitted (\S+)", sub.stdout).group(1)

    def finished():
        tasks = json.loads(shell(cluster, "tasks", json_out=True).stdout)
        return [t for t in tasks if t["id"] == task_id and t["state"] == "finished"]
    wait_for(finished, 600, "the submitted task to finish")

    r = shell(cluster, f"show {task_id}", f"graph {task_id}",
              f"best {task_id}", f"log {task_id} 2", f"export {task_id} {tmp_path / 'exp'}",
              f"diff {task_id} {task_id}", "drain 1", "nodes", "scale 4")
    assert r.returncode == 0, r.stderr
    result = json.loads((tmp_path / "exp" / "result.json").read_text())
    assert result["mode"] == "graph" and result["candidates_evaluated"] == 2
    assert (tmp_path / "exp" / "kernel.py").read_text() in r.stdout  # `best` printed it
    assert "the best path" in r.stdout and "v0 " in r.stdout
    assert "the best kernels are the same" in r.stdout
    assert "node 1 drains" in r.stdout and "alive draining" in r.stdout
    assert f"maxkernel node --join 127.0.0.1:{cluster.node_port} --token-file TOKEN --devices 4" \
        in r.stdout

    # A drained node gets no more work: a second task runs on node 0 alone.
    before = re.search(r"node 1 \S+: alive draining, \d+ in flight, (\d+) done", r.stdout).group(1)
    sub2 = shell(cluster, f"submit {SPEC} --mode auto --budget-evals 1 --seed 6")
    task2 = re.search(r"submitted (\S+)", sub2.stdout).group(1)
    wait_for(lambda: [t for t in json.loads(shell(cluster, "tasks", json_out=True).stdout)
                      if t["id"] == task2 and t["state"] == "finished"], 600, "the second task")
    after = re.search(r"node 1 \S+: alive draining, \d+ in flight, (\d+) done",
                      shell(cluster, "nodes").stdout).group(1)
    assert after == before

    # Mistakes are told and leave the shell's exit code 1; nothing is sent for a bad submit.
    bad = shell(cluster, "frob", "show nosuchtask", "submit /no/such/spec.yaml",
                f"submit {SPEC} --mode annealing")
    assert bad.returncode == 1
    assert "unknown command 'frob'" in bad.stderr and "no task 'nosuchtask'" in bad.stderr
    assert "no such file" in bad.stderr and "--mode" in bad.stderr
    assert len(json.loads(shell(cluster, "tasks", json_out=True).stdout)) == 2
    # Another cluster's shell is refused before any command runs.
    other = tmp_path / "other"
    subprocess.run([str(BIN), "cluster", "init", str(other)], check=True, capture_output=True)
    refused = shell(cluster, "tasks", token=other / "token")
    assert refused.returncode == 3 and "authentication failed" in refused.stderr


def test_a_scripted_shell_drives_a_hitl_search_to_its_end(cluster):
    cluster.start_supervisor()
    node = cluster.start_node(devices=2)
    wait_for(lambda: cluster.joined(node), 120, "the node to join")
    sub = shell(cluster, f"submit {SPEC} --mode hitl --budget-evals 3 --seed 5")
    assert sub.returncode == 0, sub.stderr
    task_id = re.search(r"submitted (\S+)", sub.stdout).group(1)
    wait_for(lambda: "operator gateway" in shell(cluster, f"log {task_id} 50").stdout, 300,
             "the task's operator gateway")
    decided = shell(cluster, f"attach {task_id}", input="approve\nhint try larger blocks\nstop\n")
    assert decided.returncode == 0, decided.stderr
    assert "decided #1: approve by " in decided.stdout, decided.stdout
    wait_for(lambda: [t for t in json.loads(shell(cluster, "tasks", json_out=True).stdout)
                      if t["id"] == task_id and t["state"] == "finished"], 300, "the end")
    show = json.loads(shell(cluster, f"show {task_id}", json_out=True).stdout)
    assert show["mode"] == "hitl" and show["stop_reason"] in ("operator", "budget"), show
