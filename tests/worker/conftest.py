"""Fixtures for the worker tests: the schemas, native KernelSpecs built with pycapnp, test
kernels, and one real sandboxed worker subprocess per session, spoken to over ZeroMQ."""

import hashlib
import os
import signal
import subprocess
import sys
import time

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
PACKAGE_DIR = os.path.join(ROOT, "tpu_nodes", "worker")
SCHEMA_DIR = os.path.join(ROOT, "messages", "schema")
KERNELS_DIR = os.path.join(os.path.dirname(__file__), "kernels")

if PACKAGE_DIR not in sys.path:
    sys.path.insert(0, PACKAGE_DIR)

import zmq  # noqa: E402

from maxkernel_worker.schema import load_schemas  # noqa: E402

START_TIMEOUT = 60.0
REQUEST_TIMEOUT = 120.0

MATMUL_REFERENCE = """\
import jax.numpy as jnp

def reference(a, b):
    return jnp.dot(a, b, preferred_element_type=jnp.float32).astype(a.dtype)
"""


def kernel_source(name: str) -> str:
    with open(os.path.join(KERNELS_DIR, name)) as f:
        return f.read()


def candidate(name: str, source: str | None = None) -> dict:
    """A Candidate dict for a kernel of tests/worker/kernels (id: content hash, as C++ does)."""
    source = kernel_source(name) if source is None else source
    return {"schemaVersion": 1, "id": hashlib.sha256(source.encode()).hexdigest(),
            "source": source, "origin": name}


def matmul_spec(m: int = 256, k: int = 256, n: int = 256, dtype: str = "bfloat16",
                reference: str = MATMUL_REFERENCE, b_generator=None, tolerance=2e-2) -> dict:
    """A native KernelSpec dict as config/'s loader produces it: named dims, normal inputs,
    the reference's Python source."""
    def tensor(name, dims, generator):
        return {"name": name, "type": {"shape": [sizes[d] for d in dims], "dtype": dtype},
                "generator": generator, "dimNames": list(dims)}
    sizes = {"M": m, "K": k, "N": n}
    return {
        "schemaVersion": 1, "name": "matmul", "format": "native",
        "sourcePath": "/nonexistent/specs/matmul.yaml",
        "dims": [{"name": d, "size": s} for d, s in sizes.items()],
        "configurations": [{
            "name": "default",
            "inputs": [tensor("a", "MK", {"normal": {"mean": 0.0, "std": 1.0}}),
                       tensor("b", "KN", b_generator or {"normal": {"mean": 0.0, "std": 1.0}})],
            "outputs": [{"shape": [m, n], "dtype": dtype}],
        }],
        "reference": reference, "referenceEntry": "reference",
        "tolerances": [{"output": -1, "atol": tolerance, "rtol": tolerance}],
        "chip": "v5e",
    }


@pytest.fixture(scope="session")
def schemas():
    return load_schemas(SCHEMA_DIR)


class WorkerProcess:
    """A real `python -m maxkernel_worker` with a clean environment and a private workdir."""

    def __init__(self, schemas, workdir: str, sandbox: bool = True):
        self.s = schemas
        self.workdir = workdir
        self.sandbox = sandbox
        self.endpoint = f"ipc://{workdir}/worker.sock"
        self.context = zmq.Context.instance()
        self.proc = None
        self.sock = None
        self.next_id = 1

    def start(self):
        args = [sys.executable, "-m", "maxkernel_worker", "--endpoint", self.endpoint,
                "--schema-dir", SCHEMA_DIR, "--workdir", self.workdir]
        if not self.sandbox:
            args.append("--no-sandbox")
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": self.workdir,
               "TMPDIR": self.workdir, "PYTHONPATH": PACKAGE_DIR, "PYTHONDONTWRITEBYTECODE": "1",
               "PYTHONUNBUFFERED": "1", "JAX_PLATFORMS": "cpu",
               "SECRET_TOKEN": "must-not-reach-candidates"}
        self.log = open(os.path.join(self.workdir, "worker.log"), "ab")
        self.proc = subprocess.Popen(args, env=env, cwd=self.workdir, stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        self._connect()
        self.ping(timeout=START_TIMEOUT)

    def _connect(self):
        if self.sock is not None:
            self.sock.close(linger=0)
        self.sock = self.context.socket(zmq.REQ)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(self.endpoint)

    def kill(self):
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        if self.sock is not None:
            self.sock.close(linger=0)
            self.sock = None

    def restart(self):
        self.kill()
        self.start()

    def send_bytes(self, data: bytes, timeout: float = REQUEST_TIMEOUT):
        """The reply as a dict; raises TimeoutError when none comes (hang or death)."""
        self.sock.send(data)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.sock.poll(200):
                with self.s.WorkerReply.from_bytes(self.sock.recv()) as reply:
                    return reply.to_dict()
            if self.proc.poll() is not None:
                raise TimeoutError(f"the worker died (exit status {self.proc.returncode})")
        raise TimeoutError(f"no reply within {timeout} s")

    def request(self, timeout: float = REQUEST_TIMEOUT, **union) -> dict:
        request_id = self.next_id
        self.next_id += 1
        msg = self.s.WorkerRequest.new_message(id=request_id, **union)
        reply = self.send_bytes(msg.to_bytes(), timeout)
        assert reply["id"] == request_id
        return reply

    def ping(self, timeout: float = REQUEST_TIMEOUT) -> dict:
        return self.request(timeout, ping=None)["pong"]

    def evaluate(self, kind: str, spec: dict, cand: dict, options: dict | None = None,
                 timeout: float = REQUEST_TIMEOUT) -> dict:
        body = {"schemaVersion": 1, "spec": spec, "candidate": cand, "options": options or {}}
        reply = self.request(timeout, **{kind: body})
        assert "eval" in reply, reply
        return reply["eval"]


@pytest.fixture(scope="session")
def worker(schemas, tmp_path_factory):
    w = WorkerProcess(schemas, str(tmp_path_factory.mktemp("worker")))
    w.start()
    yield w
    w.kill()


def phase(result: dict, name: str) -> dict:
    for p in result["phases"]:
        if p["phase"] == name:
            return p
    raise AssertionError(f"no {name} phase in {result['phases']}")
