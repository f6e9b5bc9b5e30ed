"""The sandbox applied in a fresh process (it cannot be undone), probed from inside."""

import errno
import json
import os
import subprocess
import sys
import textwrap

import pytest

from conftest import PACKAGE_DIR
from maxkernel_worker import sandbox

PROBE = textwrap.dedent("""
    import ctypes, json, os, resource, socket, sys, threading, time
    from maxkernel_worker import sandbox
    workdir, outside, hidden, hidden_file = sys.argv[1:5]
    out = {"in_force": sandbox.apply(workdir, 3 << 30, socket_dir=workdir,
                                     hide=[hidden, hidden_file], disk_limit=DISK_LIMIT,
                                     max_processes=MAX_PROCESSES)}
    private = sandbox.private_dir(workdir)

    def attempt(name, fn):
        try:
            fn()
            out[name] = "ok"
        except OSError as e:
            out[name] = e.errno

    def write(path):
        with open(path, "w") as f:
            f.write("x")

    def connect():
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.settimeout(2)
        s.connect(("127.0.0.1", 9))

    def bind():
        socket.socket(socket.AF_INET, socket.SOCK_STREAM).bind(("127.0.0.1", 0))

    def fill():
        for i in range(DISK_LIMIT // (1 << 20) + 2):
            with open(os.path.join(private, f"fill-{i}"), "wb") as f:
                f.write(bytes(1 << 20))

    def threads():
        stop, started = threading.Event(), []
        try:
            while len(started) < 4 * MAX_PROCESSES:
                t = threading.Thread(target=stop.wait)
                t.start()
                started.append(t)
        finally:
            out["threads_started"] = len(started)
            stop.set()
            for t in started:
                t.join()

    libc = ctypes.CDLL(None, use_errno=True)
    def raw_fork():
        if os.uname().machine == "x86_64" and libc.syscall(57) < 0:
            raise OSError(ctypes.get_errno(), "fork")

    attempt("write_workdir", lambda: write(os.path.join(private, "ok.txt")))
    attempt("mkdir_workdir", lambda: os.mkdir(os.path.join(private, "sub")))
    attempt("write_beside_private", lambda: write(os.path.join(workdir, "beside.txt")))
    attempt("read_hidden", lambda: open(os.path.join(hidden, "secret")).read())
    attempt("list_hidden", lambda: os.listdir(hidden))
    attempt("read_hidden_file", lambda: open(hidden_file).read())
    attempt("read_parent_environ", lambda: open(f"/proc/{os.getppid()}/environ").read())
    attempt("fill", fill)
    out["private_mount"] = [l.split()[2] for l in open("/proc/self/mounts")
                            if l.split()[1] == private]
    attempt("fork", os.fork)
    attempt("raw_fork", raw_fork)
    attempt("exec", lambda: os.execv("/bin/true", ["true"]))
    try:
        threads()
        out["threads"] = "ok"
    except RuntimeError as e:
        out["threads"] = str(e)
    out["cpu_limit"] = resource.getrlimit(resource.RLIMIT_CPU)
    try:
        with sandbox.cpu_budget(1):
            while True:
                pass
    except sandbox.CpuLimitExceeded as e:
        out["cpu_budget"] = str(e)
    out["cpu_limit_after"] = resource.getrlimit(resource.RLIMIT_CPU)
    attempt("write_outside", lambda: write(outside))
    attempt("write_dev_null", lambda: write("/dev/null"))
    attempt("read_outside", lambda: open("/etc/hostname").read())
    attempt("connect", connect)
    attempt("bind", bind)
    out["env"] = dict(os.environ)
    out["cwd"] = os.getcwd()
    out["data_limit"] = resource.getrlimit(resource.RLIMIT_DATA)[0]
    out["core_limit"] = resource.getrlimit(resource.RLIMIT_CORE)[0]
    out["cap_eff"] = [l.split()[1] for l in open("/proc/self/status") if l.startswith("CapEff")][0]
    import jax.numpy as jnp
    out["jax"] = float(jnp.arange(4.0).sum())
    print(json.dumps(out))
""")
DISK_LIMIT = 16 << 20
MAX_PROCESSES = 128
PROBE = f"DISK_LIMIT = {DISK_LIMIT}\nMAX_PROCESSES = {MAX_PROCESSES}\n" + PROBE


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("sandboxed")
    outside = tmp_path_factory.mktemp("outside") / "escaped.txt"
    hidden = tmp_path_factory.mktemp("hidden")
    (hidden / "secret").write_text("credentials")
    hidden_file = tmp_path_factory.mktemp("token") / "token"
    hidden_file.write_text("token")
    hidden_file.chmod(0o600)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": PACKAGE_DIR, "AWS_SECRET_ACCESS_KEY": "x",
           "JAX_PLATFORMS": "cpu"}
    run = subprocess.run([sys.executable, "-c", PROBE, str(workdir), str(outside), str(hidden),
                          str(hidden_file)], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout.strip().splitlines()[-1])
    result["outside_exists"] = outside.exists()
    result["workdir"] = str(workdir)
    return result


ROOT = os.geteuid() == 0


def test_every_protection_is_in_force_here(probe):
    # This machine: root (a writable pids cgroup), Landlock ABI >= 6, seccomp.
    expected = ["netns", "mountns", "disk", "hide", "pids" if ROOT else "nproc", "cleanenv",
                "rlimits", "landlock", "landlock-net", "landlock-scope", "noprocs", "nocaps"]
    assert probe["in_force"] == expected


def test_writes_only_beneath_the_private_dir(probe):
    assert probe["write_workdir"] == "ok" and probe["mkdir_workdir"] == "ok"
    assert probe["write_dev_null"] == "ok"
    assert probe["write_outside"] == errno.EACCES and not probe["outside_exists"]
    assert probe["write_beside_private"] == errno.EACCES   # the workdir itself is the host's disk
    assert probe["read_outside"] == "ok"   # reads stay open: jax, the venv, task directories


def test_the_private_dir_is_a_bounded_tmpfs(probe):
    assert probe["private_mount"] == ["tmpfs"]
    assert probe["fill"] in (errno.ENOSPC, errno.EFBIG)
    # The mount lived in the probe's namespace only: nothing reached the host's disk.
    assert os.listdir(os.path.join(probe["workdir"], "private")) == []


def test_hidden_paths_and_privileged_proc_files_are_refused(probe):
    assert probe["read_hidden"] == errno.EACCES
    assert probe["list_hidden"] == errno.EACCES
    assert probe["read_hidden_file"] == errno.EACCES
    assert probe["read_parent_environ"] == errno.EACCES


def test_no_process_can_be_started_but_threads_can(probe):
    assert probe["fork"] == errno.EPERM and probe["exec"] == errno.EPERM
    if probe["raw_fork"] != "ok":   # x86_64: fork(2) by number, past every audit hook
        assert probe["raw_fork"] == errno.EPERM
    # The pids cgroup (or RLIMIT_NPROC) bounds threads as well.
    assert probe["threads"] == "can't start new thread"
    assert 0 < probe["threads_started"] < MAX_PROCESSES


def test_cpu_budget_raises_and_restores_the_limit(probe):
    assert "1 CPU seconds" in probe["cpu_budget"]
    assert probe["cpu_limit_after"] == probe["cpu_limit"]


def test_no_network(probe):
    assert probe["connect"] in (errno.EACCES, errno.ENETUNREACH)
    assert probe["bind"] in (errno.EACCES, errno.EADDRNOTAVAIL)


def test_clean_environment_limits_and_capabilities(probe):
    assert "AWS_SECRET_ACCESS_KEY" not in probe["env"]
    private = os.path.join(probe["workdir"], "private")
    assert probe["env"]["HOME"] == probe["env"]["TMPDIR"] == private
    assert probe["cwd"] == private
    assert probe["data_limit"] == 3 << 30 and probe["core_limit"] == 0
    assert int(probe["cap_eff"], 16) == 0


def test_jax_runs_inside_the_sandbox(probe):
    assert probe["jax"] == 6.0


def test_denial_message_recognises_sandbox_refusals():
    denied = PermissionError(errno.EACCES, "Permission denied", "/etc/passwd")
    assert "/etc/passwd" in sandbox.denial_message(denied)
    wrapped = RuntimeError("wrapped")
    wrapped.__cause__ = OSError(errno.ENETUNREACH, "Network is unreachable")
    assert sandbox.denial_message(wrapped)
    assert sandbox.denial_message(ValueError("shapes")) is None


def test_landlock_abi_is_reported():
    assert sandbox.landlock_abi() >= 1
