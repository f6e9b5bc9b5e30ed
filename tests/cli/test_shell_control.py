"""An operator controls a running search from `maxkernel shell` on a loopback cluster (real
supervisor and node processes): `pause` lets the candidates in flight finish and starts
nothing new until `resume`; `budget` changes the cap the search ends on; `stop` ends it after
its in-flight candidates with its outputs kept (stop reason "operator"). Controls of a task
that does not run, and malformed ones, are refused with a message and exit code 1."""
import json
import re
import time

import pytest

from test_cluster import BIN, SPEC, Cluster, shell, wait_for  # noqa: F401 (fixtures below)
from test_cluster import token  # noqa: F401

pytestmark = [pytest.mark.skipif(not BIN.exists(), reason="maxkernel is not built"),
              pytest.mark.slow]


@pytest.fixture
def cluster(tmp_path, token):  # noqa: F811
    c = Cluster(tmp_path, token)
    yield c
    c.close()


def control(cluster, command):
    r = shell(cluster, command, json_out=True)
    assert r.returncode == 0, (command, r.stdout, r.stderr)
    return json.loads(r.stdout.strip().splitlines()[-1])


def task_state(cluster, task_id):
    tasks = json.loads(shell(cluster, "tasks", json_out=True).stdout)
    return next(t for t in tasks if t["id"] == task_id)


def submit(cluster, *options):
    sub = shell(cluster, f"submit {SPEC} " + " ".join(options))
    assert sub.returncode == 0, sub.stderr
    return re.search(r"submitted (\S+)", sub.stdout).group(1)


def wait_running(cluster, task_id, probe):
    # The search's controller exists once the reference is analysed and the supervisor runs.
    def started():
        r = shell(cluster, probe, json_out=True)
        return r.returncode == 0 and json.loads(r.stdout.strip().splitlines()[-1])
    return wait_for(started, 300, "the search to start")


def test_pause_budget_resume_and_stop_from_the_shell(cluster, tmp_path):
    cluster.start_supervisor()
    node = cluster.start_node(devices=2)
    wait_for(lambda: cluster.joined(node), 120, "the node to join")

    task = submit(cluster, "--mode graph --beam-width 1 --branching 2 --budget-evals 40 --seed 5")
    paused = wait_running(cluster, task, f"pause {task}")
    assert paused["paused"] is True and paused["budget_evals"] == 40
    # In-flight candidates finish; then nothing moves while it is paused.
    settled = wait_for(lambda: (p := control(cluster, f"pause {task}"))["in_flight"] == 0 and p,
                       300, "the in-flight candidates to finish")
    time.sleep(4)
    again = control(cluster, f"pause {task}")
    assert again["evaluations"] == settled["evaluations"] and again["in_flight"] == 0
    assert task_state(cluster, task)["state"] == "running"

    done = settled["evaluations"]
    lowered = control(cluster, f"budget {task} {done + 1}")
    assert lowered["budget_evals"] == done + 1 and "budget" in lowered["message"]
    resumed = control(cluster, f"resume {task}")
    assert resumed["paused"] is False
    wait_for(lambda: task_state(cluster, task)["state"] == "finished", 600, "the task to end")
    exported = tmp_path / "first"
    assert shell(cluster, f"export {task} {exported}").returncode == 0
    result = json.loads((exported / "result.json").read_text())
    assert result["stop_reason"] == "budget"
    assert result["candidates_evaluated"] == done + 1

    # A stop ends a running search after its in-flight candidates; its outputs are kept.
    second = submit(cluster, "--mode auto --budget-evals 40 --seed 6")
    running = wait_running(cluster, second, f"budget {second} 40")
    assert running["paused"] is False
    stopped = control(cluster, f"stop {second} seen enough")
    assert "seen enough" in stopped["message"]
    wait_for(lambda: task_state(cluster, second)["state"] == "finished", 600, "the stop")
    exported = tmp_path / "second"
    assert shell(cluster, f"export {second} {exported}").returncode == 0
    result = json.loads((exported / "result.json").read_text())
    assert result["stop_reason"] == "operator"
    assert result["candidates_evaluated"] < 40

    # Nothing to control in a finished task; malformed controls are told.
    bad = shell(cluster, f"pause {task}", f"budget {second} lots", f"resume {second} now",
                "stop nosuchtask")
    assert bad.returncode == 1
    assert "no search of it runs here" in bad.stderr
    assert "usage: budget TASK N" in bad.stderr and "usage: resume TASK" in bad.stderr
    assert "no task 'nosuchtask'" in bad.stderr
