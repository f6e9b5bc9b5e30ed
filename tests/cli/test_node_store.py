"""`maxkernel node --state-dir DIR`: a node process's host-local evaluation store (without the
flag a node keeps none: the supervisor keeps the cluster's). A store that does not open is bad
input (exit 2, naming the flag), told apart from a worker that does not start (exit 3). That
repeats are answered from it is measured by scripts/bench-cluster (docs/performance.md,
"Cluster": every evaluation after the first comes back cached with no supervisor store)."""
import os
import pathlib
import signal
import socket
import subprocess
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = pathlib.Path(os.environ.get("MAXKERNEL_BIN", ROOT / "build" / "cli" / "maxkernel"))

pytestmark = pytest.mark.skipif(not BIN.exists(), reason="maxkernel is not built")


def free_port():
    # A port nobody listens on: the node keeps waiting for its supervisor there.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_state_dir_that_cannot_be_created_is_bad_input(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    r = subprocess.run([str(BIN), "node", "--join", f"127.0.0.1:{free_port()}", "--devices", "1",
                        "--workers", "1", "--state-dir", str(blocker / "state")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "--state-dir" in r.stderr


def test_a_node_with_a_state_dir_opens_its_store_there(tmp_path):
    state = tmp_path / "state"
    p = subprocess.Popen([str(BIN), "node", "--join", f"127.0.0.1:{free_port()}", "--devices",
                          "2", "--workers", "1", "--state-dir", str(state), "--retry", "0.2"],
                         stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            line = p.stderr.readline()
            if not line:
                break
            lines.append(line)
            if "waiting for the supervisor" in line:
                break
        text = "".join(lines)
        assert "host-local store" in text, text
        assert str(state) in text, text
        assert list(state.glob("*.sqlite")), list(state.iterdir())
    finally:
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=30) == 0
