"""Ctrl-C during `maxkernel optimize` (the built binary, the real worker): the first SIGINT
once the search runs stops it as an operator's `stop` would: the candidates in flight finish
and the outputs are written with the best so far (stop reason "operator"); before the search
starts, SIGINT ends the process as it always did, leaving no output directory behind."""
import json
import signal
import subprocess
import time

import pytest

from test_optimize import BIN, OUTPUTS, SPEC, finished_vertices

pytestmark = pytest.mark.skipif(not BIN.exists(), reason="maxkernel is not built")


def default_sigint():
    # The child starts with SIGINT at its default even when this test runs with it ignored
    # (a shell's background job inherits SIG_IGN, and so do its children).
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def evaluated_vertices(db_path):
    return sum(1 for state, _, _ in finished_vertices(db_path).values() if state == "evaluated")


def sigint_once_evaluating(proc, state, what):
    """SIGINT to `proc` once its search has evaluated a vertex; waits for its end. Its
    stderr (when piped), or None."""
    try:
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline and proc.poll() is None:
            if evaluated_vertices(state / "evaluations.sqlite") >= 1:
                break
            time.sleep(0.2)
        assert proc.poll() is None, f"the search ended before {what}"
        proc.send_signal(signal.SIGINT)
        return proc.communicate(timeout=900)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


@pytest.mark.slow
def test_the_first_ctrl_c_stops_the_search_and_keeps_its_outputs(tmp_path):
    state, out = tmp_path / "state", tmp_path / "out"
    err = (tmp_path / "stderr.txt").open("w")
    proc = subprocess.Popen([str(BIN), "optimize", str(SPEC), "--mode", "auto", "--budget-evals",
                             "30", "--seed", "3", "--state-dir", str(state), "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=err, text=True,
                            start_new_session=True, preexec_fn=default_sigint)
    try:
        sigint_once_evaluating(proc, state, "it could be interrupted")
    finally:
        err.close()
    stderr = (tmp_path / "stderr.txt").read_text()
    assert proc.returncode in (0, 1), stderr
    assert "interrupted: the search ends after its candidates in flight" in stderr
    result = json.loads((out / "result.json").read_text())
    assert result["stop_reason"] == "operator"
    assert 1 <= result["candidates_evaluated"] < 30
    for name in OUTPUTS:
        assert (out / name).exists(), name


def test_ctrl_c_before_the_search_quits_at_once_and_writes_nothing(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.Popen([str(BIN), "optimize", str(SPEC), "--mode", "auto", "--budget-evals",
                             "3", "--state-dir", str(tmp_path / "state"), "--out", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=default_sigint)
    time.sleep(1.0)  # reading the task or analysing its reference: no search yet
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGINT, stderr
    assert not (out / "result.json").exists()


@pytest.mark.slow
def test_a_search_started_with_sigint_ignored_keeps_ignoring_it(tmp_path):
    # A script's background job (`maxkernel optimize ... &`) starts with SIGINT ignored so
    # that the terminal's Ctrl-C spares it: the search goes on to its budget.
    state, out = tmp_path / "state", tmp_path / "out"
    proc = subprocess.Popen([str(BIN), "optimize", str(SPEC), "--mode", "auto", "--budget-evals",
                             "4", "--state-dir", str(state), "--out", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    stderr = sigint_once_evaluating(proc, state, "the signal")
    assert proc.returncode in (0, 1), stderr
    assert "interrupted" not in stderr
    assert json.loads((out / "result.json").read_text())["stop_reason"] == "budget"
