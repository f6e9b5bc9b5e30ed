"""A task directory submitted to a cluster whose node is on "another host": the node process
runs in a mount namespace of its own (`unshare -m`) where an empty tmpfs covers the
supervisor's state directory, so the supervisor's copy of the task (STATE/submissions/ID/task)
does not exist for it, as on a pod where every TPU host is a different machine. The task's
files travel with the load and with every evaluation (docs/cluster.md); the search must
finish with a correct kernel. Skipped where mount namespaces cannot be made (not root, or a
container that forbids them)."""
import json
import os
import re
import subprocess

import pytest

from test_cluster import BIN, ROOT, finish, wait_for
from test_cluster import cluster, token  # noqa: F401  (fixtures)

TASK = ROOT / "examples" / "jaxbench_matmul"

pytestmark = [pytest.mark.skipif(not BIN.exists(), reason="maxkernel is not built"),
              pytest.mark.slow]

# Covers $1 with an empty tmpfs in this mount namespace, then runs the rest.
HIDE_AND_RUN = 'mount -t tmpfs -o mode=000 maxkernel-other-host "$1" && shift && exec "$@"'


def isolation_unavailable(tmp_path):
    """Why a node cannot be given its own view of the files here ("" when it can)."""
    probe = tmp_path / "probe"
    probe.mkdir()
    (probe / "marker").write_text("x")
    try:
        proc = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                               HIDE_AND_RUN + ' && test ! -e "$0/marker"', str(probe), str(probe),
                               "true"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unshare cannot run: {e}"
    if proc.returncode != 0:
        return f"cannot mount a tmpfs in a new mount namespace: {proc.stderr.strip()[:200]}"
    return ""


def start_node_on_another_host(cluster, node_tmp):
    """A node process that cannot see the supervisor's state directory."""
    log = cluster.base / f"node{len(cluster.nodes)}.log"
    env = dict(os.environ, TMPDIR=str(node_tmp))
    proc = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", "-c", HIDE_AND_RUN,
                             "sh", str(cluster.state), str(BIN), "node", "--join",
                             f"127.0.0.1:{cluster.node_port}", "--token-file", str(cluster.token),
                             "--devices", "1", "--workers", "1"],
                            stdout=subprocess.DEVNULL, stderr=log.open("w"), env=env,
                            start_new_session=True)
    proc.log = log
    cluster.procs.append(proc)
    cluster.nodes.append(proc)
    return proc


def test_a_task_directory_reaches_a_node_that_cannot_see_the_supervisors_disk(cluster, tmp_path):
    why = isolation_unavailable(tmp_path)
    if why:
        pytest.skip(why)
    cluster.start_supervisor()
    node_tmp = tmp_path / "node-tmp"
    node_tmp.mkdir()
    node = start_node_on_another_host(cluster, node_tmp)
    wait_for(lambda: cluster.joined(node) or node.poll() is not None, 240, "the node to join")
    assert node.poll() is None, node.log.read_text()

    out = tmp_path / "out"
    proc = finish(subprocess.Popen(
        [str(BIN), "optimize", str(TASK), "--budget-evals", "2", "--seed", "3", "--cluster",
         f"127.0.0.1:{cluster.client_port}", "--token-file", str(cluster.token), "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    logs = f"{proc.stderr_text}\n--- node:\n{node.log.read_text()}"
    assert proc.returncode == 0, logs
    result = json.loads((out / "result.json").read_text())
    assert result["correct"] is True, logs
    assert result["evaluations"] >= 1, result

    # The supervisor's copy exists on its disk, and not for the node.
    submissions = list((cluster.state / "submissions").iterdir())
    assert len(submissions) == 1
    copy = submissions[0] / "task" / TASK.name
    assert (copy / "baseline.py").is_file()
    assert os.listdir(f"/proc/{node.pid}/root{cluster.state}") == []
    assert not os.path.exists(f"/proc/{node.pid}/root{copy}")

    # The node read the files it was sent, written once into its own temporary directory.
    written = [p for p in node_tmp.glob("maxkernel-tasks-*/*/" + TASK.name)]
    assert len(written) == 1, list(node_tmp.rglob("*"))
    assert (written[0] / "baseline.py").read_bytes() == (TASK / "baseline.py").read_bytes()
    # The node announced its chip and backend when it joined (chip-aware dispatch).
    assert re.search(r"node 0 \S+: alive, \d+ in flight, \d+ done, v6e model", cluster.status())

    # What comes back names no path of the node's.
    assert "maxkernel-tasks-" not in (out / "kernel.py").read_text()


def test_a_native_specs_baseline_beside_it_travels_with_the_submission(cluster, tmp_path):
    # `baseline: baselines/k.py` is read relative to the spec: the client ships the file
    # with the spec (the supervisor refused such a spec before: "does not exist").
    task = tmp_path / "task"
    (task / "baselines").mkdir(parents=True)
    spec = task / "matmul_with_baseline.yaml"
    spec.write_text((ROOT / "examples" / "matmul" / "spec.yaml").read_text()
                    + "baseline: baselines/k.py\n")
    (task / "baselines" / "k.py").write_text((ROOT / "examples" / "matmul" / "kernel.py").read_text())
    cluster.start_supervisor()
    node = cluster.start_node()
    wait_for(lambda: cluster.joined(node) or node.poll() is not None, 240, "the node to join")

    def submit(out):
        proc = finish(subprocess.Popen(
            [str(BIN), "optimize", str(spec), "--budget-evals", "1", "--cluster",
             f"127.0.0.1:{cluster.client_port}", "--token-file", str(cluster.token),
             "--out", str(out)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        assert proc.returncode in (0, 1), proc.stderr_text
        return json.loads((out / "result.json").read_text())

    result = submit(tmp_path / "out")
    assert result["baseline_time_us"] > 0, result
    submissions = list((cluster.state / "submissions").iterdir())
    assert (submissions[0] / "task" / "baselines" / "k.py").is_file()
    # The same spec again: its copy lives in another submission directory, and every
    # evaluation is answered from the supervisor's store (the spec's paths are not part of
    # its hash; they were, and a resubmitted task was evaluated again).
    second = submit(tmp_path / "again")
    assert len(list((cluster.state / "submissions").iterdir())) == 2
    assert second["evaluations"] == result["evaluations"], (result, second)
    assert second["cache_hits"] == second["evaluations"], second
    assert second["kernel_time_us"] == result["kernel_time_us"]
