"""Hostile candidates against a real sandboxed worker (python -m maxkernel_worker): each fails
as sandboxViolation or resourceLimit, and the SAME worker then evaluates a good candidate
correctly. The worker runs with small limits so that each test is quick: hidden directories
(the cluster token's, made by `maxkernel cluster init`, and another), a few CPU seconds per
request, a small private directory, a small data segment and a bounded number of tasks."""

import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import pytest

from conftest import PACKAGE_DIR, SCHEMA_DIR, WorkerProcess, candidate, kernel_source, \
    matmul_spec, phase

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = pathlib.Path(os.environ.get("MAXKERNEL_BIN", ROOT / "build" / "cli" / "maxkernel"))

MEMORY_LIMIT = 3 << 29    # the data segment (1.5 GiB); the worker starts at ~0.35 GiB
DISK_LIMIT = 32 << 20     # the private directory's tmpfs
CPU_LIMIT = 8             # CPU seconds per evaluation request (a good one needs ~2)
MAX_PROCESSES = 256       # tasks, threads included


class LimitedWorker(WorkerProcess):
    """conftest's worker with extra command-line options (its start() takes none)."""

    def __init__(self, schemas, workdir, extra):
        super().__init__(schemas, workdir)
        self.extra = extra

    def start(self):
        args = [sys.executable, "-m", "maxkernel_worker", "--endpoint", self.endpoint,
                "--schema-dir", SCHEMA_DIR, "--workdir", self.workdir, *self.extra]
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": self.workdir,
               "TMPDIR": self.workdir, "PYTHONPATH": PACKAGE_DIR, "PYTHONDONTWRITEBYTECODE": "1",
               "PYTHONUNBUFFERED": "1", "JAX_PLATFORMS": "cpu"}
        self.log = open(os.path.join(self.workdir, "worker.log"), "ab")
        self.proc = subprocess.Popen(args, env=env, cwd=self.workdir, stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        self._connect()
        self.ping(timeout=60)

    def kill(self):
        pid = self.proc.pid if self.proc is not None else None
        super().kill()
        # What worker_process.cpp does for the node: the worker's pids cgroup goes with it.
        if pid is not None:
            group = _cgroup_dir(pid)
            for _ in range(100):
                if group is None or not os.path.isdir(group):
                    break
                with open(os.path.join(group, "cgroup.procs")) as f:
                    for p in f.read().split():
                        os.kill(int(p), signal.SIGKILL)
                try:
                    os.rmdir(group)
                except OSError:
                    time.sleep(0.02)


def _cgroup_dir(pid):
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            if "pids" in controllers.split(","):
                return os.path.join("/sys/fs/cgroup/pids", path.lstrip("/"),
                                    f"maxkernel-worker-{pid}")
    return None


@pytest.fixture(scope="module")
def secrets(tmp_path_factory):
    """A cluster token (0600, by `maxkernel cluster init`) and a file in another hidden dir."""
    creds = tmp_path_factory.mktemp("creds") / "cluster"
    if BIN.exists():
        run = subprocess.run([str(BIN), "cluster", "init", str(creds)], capture_output=True,
                             text=True, timeout=60)
        assert run.returncode == 0, run.stderr
    else:   # without the C++ build: a token file like the one it writes
        creds.mkdir()
        (creds / "token").write_text("secret-token\n")
        (creds / "token").chmod(0o600)
    token = creds / "token"
    assert token.stat().st_mode & 0o077 == 0
    state = tmp_path_factory.mktemp("node_state")
    (state / "store.sqlite").write_text("the node's evaluations")
    return {"token": token, "state_file": state / "store.sqlite", "hide": [creds, state]}


@pytest.fixture(scope="module")
def hostile(schemas, tmp_path_factory, secrets):
    extra = ["--memory-limit", str(MEMORY_LIMIT), "--disk-limit", str(DISK_LIMIT),
             "--cpu-limit", str(CPU_LIMIT), "--max-processes", str(MAX_PROCESSES)]
    for d in secrets["hide"]:
        extra += ["--hide", str(d)]
    w = LimitedWorker(schemas, str(tmp_path_factory.mktemp("hostile_worker")), extra)
    w.start()
    yield w
    w.kill()


SMALL = dict(m=128, k=128, n=128)


def assert_still_serves(worker, pid):
    """The same worker process (pid) evaluates a correct candidate correctly."""
    assert worker.proc.poll() is None and worker.ping()["pid"] == pid
    result = worker.evaluate("test", matmul_spec(**SMALL), candidate("matmul.py"),
                             timeout=HOSTILE_TIMEOUT)
    assert phase(result, "test")["status"] == "ok", result["phases"]
    assert result["correct"] is True


# Generous: the CPU budget counts CPU seconds, and a loaded machine gives few per second.
HOSTILE_TIMEOUT = 600


def evaluate_hostile(worker, name, source=None, timeout=HOSTILE_TIMEOUT):
    pid = worker.ping()["pid"]
    result = worker.evaluate("test", matmul_spec(**SMALL), candidate(name, source),
                             timeout=timeout)
    failed = [p for p in result["phases"] if p["status"] == "failed"]
    assert failed and not result["correct"], result["phases"]
    assert_still_serves(worker, pid)
    return failed[0]


def test_the_worker_reports_each_protection(hostile):
    in_force = set(hostile.ping()["sandbox"])
    assert {"netns", "mountns", "disk", "hide", "cleanenv", "rlimits", "landlock",
            "nocaps"} <= in_force
    assert {"pids", "nproc"} & in_force   # a pids cgroup, else RLIMIT_NPROC (not root)


@pytest.mark.parametrize("what", ["token", "state_file"])
def test_reading_credentials_or_hidden_files_is_a_sandbox_violation(hostile, secrets, what):
    target = str(secrets[what])
    source = kernel_source("read_credentials.py").replace("/nonexistent/token", target)
    failed = evaluate_hostile(hostile, f"read_{what}.py", source)
    assert failed["errorClass"] == "sandboxViolation", failed
    assert target in failed["message"]


def test_reading_the_parents_proc_files_is_a_sandbox_violation(hostile):
    failed = evaluate_hostile(hostile, "read_parent_environ.py")
    assert failed["errorClass"] == "sandboxViolation", failed
    assert "/environ" in failed["message"]


@pytest.mark.parametrize("kernel", ["fork_bomb_os.py", "fork_bomb_ctypes.py",
                                    "fork_bomb_syscall.py"])
def test_a_fork_bomb_is_stopped_and_leaves_no_process(hostile, kernel):
    failed = evaluate_hostile(hostile, kernel)
    if kernel == "fork_bomb_syscall.py":
        # No audit event sees it: seccomp refuses each fork (EPERM), the loop spins until the
        # CPU budget ends it.
        assert failed["errorClass"] == "resourceLimit", failed
        assert "CPU seconds" in failed["message"]
    else:
        assert failed["errorClass"] == "sandboxViolation", failed
        assert "tried to start a process" in failed["message"], failed
    children = subprocess.run(["pgrep", "-P", str(hostile.proc.pid)], capture_output=True,
                              text=True).stdout.split()
    assert children == []


def test_filling_the_disk_is_a_resource_limit_and_the_host_disk_is_untouched(hostile):
    failed = evaluate_hostile(hostile, "fill_disk.py")
    assert failed["errorClass"] == "resourceLimit", failed
    assert re.search(r"No space left|File too large", failed["message"]), failed
    # Nothing reached the host's disk: the private directory is a tmpfs of DISK_LIMIT bytes,
    # mounted in the worker's own namespace, and emptied after the request.
    assert not any(n.startswith("fill-") for n in os.listdir(hostile.workdir))
    private = os.path.join(hostile.workdir, "private")
    assert not any(n.startswith("fill-") for n in os.listdir(private))


def test_exhausting_memory_is_a_resource_limit(hostile):
    failed = evaluate_hostile(hostile, "exhaust_memory.py")
    assert failed["errorClass"] == "resourceLimit", failed
    assert "MemoryError" in failed["message"]


def test_spinning_on_the_cpu_is_a_resource_limit(hostile):
    failed = evaluate_hostile(hostile, "spin.py")
    assert failed["errorClass"] == "resourceLimit", failed
    assert f"{CPU_LIMIT} CPU seconds" in failed["message"]


def test_the_worker_cgroup_goes_with_the_worker(schemas, tmp_path):
    w = LimitedWorker(schemas, str(tmp_path), ["--max-processes", str(MAX_PROCESSES)])
    w.start()
    group = _cgroup_dir(w.proc.pid)
    if "pids" not in w.ping()["sandbox"]:
        w.kill()
        pytest.skip("no writable pids cgroup here")
    with open(os.path.join(group, "pids.max")) as f:
        assert f.read().strip() == str(MAX_PROCESSES)
    w.kill()
    assert not os.path.exists(group)


def test_a_node_hides_its_token_and_state_from_its_workers(tmp_path, secrets):
    """`maxkernel node` gives its workers --hide for the token file, its directory and the
    node's state directory (cli/node_command.cpp), the worker has them hidden, and the
    node removes the worker's pids cgroup when it stops."""
    if not BIN.exists():
        pytest.skip(f"no {BIN}")
    token, state = secrets["token"], tmp_path / "node_state"
    log = tmp_path / "node.log"
    node = subprocess.Popen([str(BIN), "node", "--join", "127.0.0.1:9", "--token-file",
                             str(token), "--state-dir", str(state), "--devices", "1",
                             "--workers", "1"], stdout=subprocess.DEVNULL,
                            stderr=log.open("w"), start_new_session=True)
    try:
        deadline = time.monotonic() + HOSTILE_TIMEOUT
        worker_pid = None
        while worker_pid is None and time.monotonic() < deadline:
            assert node.poll() is None, log.read_text()
            if "node: " in log.read_text():   # started: its worker answered
                children = subprocess.run(["pgrep", "-P", str(node.pid)], capture_output=True,
                                          text=True).stdout.split()
                worker_pid = next((int(p) for p in children if "maxkernel_worker" in
                                   pathlib.Path(f"/proc/{p}/cmdline").read_text()), None)
            time.sleep(0.2)
        assert worker_pid, log.read_text()
        args = pathlib.Path(f"/proc/{worker_pid}/cmdline").read_text().split("\0")
        hidden = {args[i + 1] for i, a in enumerate(args) if a == "--hide"}
        assert {str(token), str(token.parent), str(state)} <= hidden
        workdir = args[args.index("--workdir") + 1]
        worker_log = (pathlib.Path(workdir) / "worker.log").read_text()
        assert "hide" in worker_log
        # A node that stops removes its worker's pids cgroup (worker_process.cpp).
        group = _cgroup_dir(worker_pid)
        assert ("pids" in worker_log) == os.path.isdir(group)
        node.send_signal(signal.SIGTERM)
        assert node.wait(timeout=120) == 0, log.read_text()
        assert not os.path.exists(group)
    finally:
        if node.poll() is None:
            os.killpg(node.pid, signal.SIGKILL)
            node.wait(timeout=30)
