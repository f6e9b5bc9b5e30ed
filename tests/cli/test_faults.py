"""Faults survived (issue 9), with real processes on loopback (the cluster of test_cluster.py:
`cluster init` credentials, a supervisor, node processes, `optimize --cluster`):

- nodes SIGKILLed (and replaced) and SIGSTOPped (and thawed seconds later, after the
  supervisor took them as lost) at random moments, several times during one graph search:
  the search completes, every candidate has exactly one result, and the search graph and the
  best kernel equal the fault-free run's with the same seed;
- the supervisor SIGKILLed at random moments several times and started again with --resume:
  after every kill the SQLite files of its state directory (the evaluation store and the
  search graphs) pass `PRAGMA integrity_check`; the search completes with the fault-free
  graph, and the dispatchers of all the supervisor's lives together sent no more evaluations
  than the fault-free run did (nothing finished was evaluated again);
- the workers of one node SIGKILLed or SIGSTOPped over and over for a while: the node restarts
  them (its log says so), stays in the cluster, and the search completes, the other nodes
  doing the work;
- the disk filling up under a search's state directory (a small tmpfs; root only): the run
  ends with exit code != 0 and a message naming the lack of space, not a crash; the SQLite
  state passes integrity_check, and once space is freed --resume finishes the search.

The random moments come from a seed printed in every failure message (set
MAXKERNEL_FAULT_SEED to replay one)."""
import os
import random
import re
import shutil
import signal
import sqlite3
import subprocess
import threading
import time

import pytest

from test_cluster import (BIN, ROOT, SEARCH, SPEC, Cluster, Result, check_complete,  # noqa: F401
                          dispatcher_completed, finish, identity, start_search_on_three_nodes,
                          wait_for)
from test_cluster import stored_evaluations as stored_rows
from test_cluster import cluster, fault_free, token  # noqa: F401  (fixtures)

pytestmark = [pytest.mark.skipif(not BIN.exists(), reason="maxkernel is not built"),
              pytest.mark.slow]


def stored_evaluations(state):
    """Rows of the evaluation store (0 before it exists)."""
    if not (state / "evaluations.sqlite").exists():
        return 0
    try:
        return stored_rows(state)
    except sqlite3.Error:
        return 0


def fault_seed():
    return int(os.environ.get("MAXKERNEL_FAULT_SEED", random.randrange(1 << 30)))


def explained(what, check, *args):
    """Runs `check(*args)`; an assertion it raises names `what` (the seed and the faults)."""
    try:
        check(*args)
    except AssertionError as e:
        raise AssertionError(f"{what}: {e}") from e


def signal_group(pid, sig):
    """Signals a process group that may have gone meanwhile."""
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass


def same_as_fault_free(r, fault_free):
    check_complete(r)
    assert [identity(v) for v in r.vertices] == [identity(v) for v in fault_free.vertices]
    assert r.result["kernel_time_us"] == fault_free.result["kernel_time_us"]


def integrity(path):
    db = sqlite3.connect(str(path))
    try:
        return db.execute("PRAGMA integrity_check").fetchone()[0]
    finally:
        db.close()


def test_nodes_killed_and_frozen_several_times_lose_nothing(cluster, fault_free):
    seed = fault_seed()
    rng = random.Random(seed)
    nodes, out, proc = start_search_on_three_nodes(cluster)
    live, faults, frozen = list(nodes), [], []
    stored = 0
    while proc.poll() is None and len(faults) < 4:
        # A random moment once one more evaluation was stored: every fault lands while the
        # search still has work, however fast or slow this machine is.
        target = stored + 1
        wait_for(lambda: stored_evaluations(cluster.state) >= target or proc.poll() is not None,
                 600, f"a stored evaluation (seed {seed})")
        time.sleep(rng.uniform(0.0, 1.0))
        if proc.poll() is not None:
            break
        stored = stored_evaluations(cluster.state)
        victim = rng.randrange(len(live))
        node = live[victim]
        if rng.random() < 0.5:
            os.killpg(node.pid, signal.SIGKILL)
            live[victim] = cluster.start_node()
            faults.append(f"SIGKILL node pid {node.pid} at {stored} stored")
        else:
            # Longer than the supervisor's connection timeout (5 s, config/cluster_config.hpp):
            # taken as lost, then back. Thawed by a timer: the search goes on meanwhile.
            seconds = rng.uniform(6.0, 9.0)
            os.killpg(node.pid, signal.SIGSTOP)
            thaw = threading.Timer(seconds, signal_group, (node.pid, signal.SIGCONT))
            thaw.start()
            frozen.append(thaw)
            faults.append(f"SIGSTOP node pid {node.pid} for {seconds:.1f} s at {stored} stored")
    r = Result(finish(proc), out)
    for thaw in frozen:
        thaw.join()
    what = f"seed {seed}, faults {faults}"
    assert len(faults) >= 2, f"{what}: the search ended before the second fault"
    explained(what, same_as_fault_free, r, fault_free)
    assert r.result["nodes_lost"] >= 1, what


def test_the_supervisor_killed_several_times_resumes_without_redoing_work(cluster, fault_free):
    seed = fault_seed()
    rng = random.Random(seed)
    nodes, out, proc = start_search_on_three_nodes(cluster)
    dispatched, kills = 0, []
    for _ in range(3):
        # A random moment once one or two more evaluations were stored.
        target = stored_evaluations(cluster.state) + rng.randint(1, 2)
        wait_for(lambda: stored_evaluations(cluster.state) >= target or proc.poll() is not None
                 or any(n.poll() is not None for n in nodes),
                 600, f"stored evaluations (seed {seed}, kills {kills})")
        # A node reconnecting to the supervisor's dying or starting port keeps trying.
        for n in nodes:
            assert n.poll() is None, f"seed {seed}, kills {kills}: {n.log.read_text()}"
        time.sleep(rng.uniform(0.0, 2.0))
        if proc.poll() is not None:
            break
        # What this life's dispatcher sent (read before the kill: what finishes between the
        # two is left out, which only makes the bound below stricter).
        dispatched += dispatcher_completed(cluster.status())
        os.killpg(cluster.supervisor.pid, signal.SIGKILL)
        cluster.supervisor.wait(timeout=30)
        kills.append(stored_evaluations(cluster.state))
        for db in cluster.state.rglob("*.sqlite"):
            assert integrity(db) == "ok", f"seed {seed}, kills {kills}: {db}"
        cluster.start_supervisor("--resume")
    r = Result(finish(proc), out)
    dispatched += dispatcher_completed(cluster.status())
    what = f"seed {seed}, killed at {kills} stored evaluations"
    assert len(kills) >= 2, f"{what}: the search ended before the second kill"
    explained(what, same_as_fault_free, r, fault_free)
    assert r.result["resumed"] is True, what
    assert dispatched <= dispatcher_completed(fault_free.status), (what, dispatched)
    for db in [*cluster.state.rglob("*.sqlite"), out / "search.sqlite"]:
        assert integrity(db) == "ok", (what, db)


def worker_pids(node_pid):
    """The maxkernel_worker processes below a node (they run in sessions of their own)."""
    children = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        children.setdefault(int(stat[stat.rfind(")") + 2:].split()[1]), []).append(int(d))
    out, todo = [], [node_pid]
    while todo:
        for c in children.get(todo.pop(), []):
            todo.append(c)
            try:
                with open(f"/proc/{c}/cmdline", "rb") as f:
                    if b"maxkernel_worker" in f.read():
                        out.append(c)
            except OSError:
                pass
    return out


def test_a_nodes_failing_workers_are_restarted_and_the_search_goes_on(cluster):
    seed = fault_seed()
    rng = random.Random(seed)
    nodes, out, proc = start_search_on_three_nodes(cluster)
    victim = nodes[0]
    wait_for(lambda: worker_pids(victim.pid), 60, "the victim's worker")
    hits, stopped = 0, []
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline and proc.poll() is None:
        for pid in worker_pids(victim.pid):
            try:
                if rng.random() < 0.7:
                    os.kill(pid, signal.SIGKILL)   # crashes
                else:
                    os.kill(pid, signal.SIGSTOP)   # hangs: its deadline passes
                    stopped.append(pid)
                hits += 1
            except ProcessLookupError:
                pass
        time.sleep(rng.uniform(0.3, 1.5))
    for pid in stopped:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
    r = Result(finish(proc), out)
    what = f"seed {seed}, {hits} worker faults"
    assert hits >= 2, what
    assert r.result["candidates_evaluated"] == 6 == len(r.vertices), what
    assert all(v["state"] != "pending" for v in r.vertices), (what, r.vertices)
    log = victim.log.read_text()
    assert re.search(r"worker \d+ (restarted|is down)", log), (what, log[-2000:])
    assert victim.poll() is None, f"{what}: the node died with its workers"
    # The node is still in the cluster and the others did the search's work.
    lines = [l for l in cluster.status().splitlines() if l.startswith("node ")]
    done = [int(re.search(r"(\d+) done", l).group(1)) for l in lines]
    assert "alive" in lines[0] and sum(done[1:]) > 0, (what, lines)


def run_optimize(out, state, *extra, timeout=900):
    return subprocess.run([str(BIN), "optimize", str(SPEC), *SEARCH, "--nodes", "2",
                           "--workers", "1", "--state-dir", str(state), "--out", str(out),
                           *extra], capture_output=True, text=True, timeout=timeout)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_a_full_disk_while_persisting_is_a_clear_error_and_resume_works(tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    mount = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)],
                           capture_output=True, text=True)
    if mount.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {mount.stderr.strip()}")
    try:
        state, out = mnt / "state", tmp_path / "out"
        proc = subprocess.Popen([str(BIN), "optimize", str(SPEC), *SEARCH, "--nodes", "2",
                                 "--workers", "1", "--state-dir", str(state), "--out", str(out)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        # Once the first evaluations are stored, the disk fills up.
        wait_for(lambda: stored_evaluations(state) >= 2 or proc.poll() is not None, 600,
                 "two stored evaluations")
        filler = mnt / "filler"
        with open(filler, "wb") as f:
            try:
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()
            except OSError:
                pass
        stdout, stderr = proc.communicate(timeout=900)
        assert proc.returncode not in (0, 1), (proc.returncode, stderr[-2000:])
        assert proc.returncode > 0, f"killed by signal {-proc.returncode}: {stderr[-2000:]}"
        assert re.search(r"(?i)no space|disk.*full|database or disk is full", stderr), \
            stderr[-2000:]
        print("the full disk's message:", stderr.strip().splitlines()[-1])
        for db in state.rglob("*.sqlite"):
            assert integrity(db) == "ok", db
        before = stored_evaluations(state)
        filler.unlink()
        resumed = run_optimize(out, state, "--resume")
        assert resumed.returncode in (0, 1), resumed.stderr[-2000:]
        r = Result(finish_now(resumed), out)
        check_complete(r)
        assert stored_evaluations(state) >= before
        for db in state.rglob("*.sqlite"):
            assert integrity(db) == "ok", db
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def finish_now(completed):
    completed.stdout_text, completed.stderr_text = completed.stdout, completed.stderr
    return completed
