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
    import json, os, resource, socket, sys
    from maxkernel_worker import sandbox
    workdir, outside = sys.argv[1], sys.argv[2]
    out = {"in_force": sandbox.apply(workdir, 3 << 30, socket_dir=workdir)}

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

    attempt("write_workdir", lambda: write(os.path.join(workdir, "ok.txt")))
    attempt("mkdir_workdir", lambda: os.mkdir(os.path.join(workdir, "sub")))
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


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("sandboxed")
    outside = tmp_path_factory.mktemp("outside") / "escaped.txt"
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": PACKAGE_DIR, "AWS_SECRET_ACCESS_KEY": "x",
           "JAX_PLATFORMS": "cpu"}
    run = subprocess.run([sys.executable, "-c", PROBE, str(workdir), str(outside)], env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout.strip().splitlines()[-1])
    result["outside_exists"] = outside.exists()
    result["workdir"] = str(workdir)
    return result


def test_every_protection_is_in_force_here(probe):
    assert probe["in_force"] == ["cleanenv", "netns", "rlimits", "landlock", "landlock-net",
                                 "landlock-scope", "nocaps"]


def test_writes_only_beneath_the_workdir(probe):
    assert probe["write_workdir"] == "ok" and probe["mkdir_workdir"] == "ok"
    assert probe["write_dev_null"] == "ok"
    assert probe["write_outside"] == errno.EACCES and not probe["outside_exists"]
    assert probe["read_outside"] == "ok"   # reads stay open: jax, the venv, task directories


def test_no_network(probe):
    assert probe["connect"] in (errno.EACCES, errno.ENETUNREACH)
    assert probe["bind"] in (errno.EACCES, errno.EADDRNOTAVAIL)


def test_clean_environment_limits_and_capabilities(probe):
    assert "AWS_SECRET_ACCESS_KEY" not in probe["env"]
    assert probe["env"]["HOME"] == probe["env"]["TMPDIR"] == probe["workdir"]
    assert probe["cwd"] == probe["workdir"]
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
