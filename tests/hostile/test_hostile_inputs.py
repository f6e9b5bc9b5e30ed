"""Hostile and malformed input (issue 9): every file of tests/hostile/corpus/, handed to the
command that reads it, gets a clear error and exit code 2, and nothing is written.

manifest.yaml lists each corpus entry with the command (`run`, one of RUNS below) and what the
message must name besides the file: `at` (LINE:COLUMN right after the path) and `names` (the
field or construct). The commands run once per session, a few at a time (task directories
start a JAX worker each: running them side by side keeps the suite near a minute), and each
test asserts on one entry's outcome."""
import concurrent.futures
import json
import os
import pathlib
import shutil
import subprocess
import tempfile

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
HERE = pathlib.Path(__file__).resolve().parent
BIN = pathlib.Path(os.environ.get("MAXKERNEL_BIN", ROOT / "build" / "cli" / "maxkernel"))
SPEC = ROOT / "examples" / "matmul" / "spec.yaml"
KERNEL = ROOT / "examples" / "matmul" / "kernel.py"
MANIFEST = yaml.safe_load((HERE / "manifest.yaml").read_text())

pytestmark = pytest.mark.skipif(not BIN.exists(), reason="maxkernel is not built")

# {f}: the corpus file; {o}: an empty directory that must stay empty. Every command is given
# somewhere to write, so that "nothing half-written" is checked for each.
RUNS = {
    "spec": ["spec", "{f}", "--out", "{o}/spec.bin", "--json", "{o}/spec.json"],
    "check": ["check", "{f}", str(KERNEL), "--no-store", "--json", "{o}/check.json"],
    "check_hang": ["check", "{f}", str(KERNEL), "--no-store", "--json", "{o}/check.json",
                   "--deadline", "4"],
    "template": ["template", "{f}", "--out", "{o}/kernel.py", "--json", "{o}/t.json"],
    "optimize": ["optimize", "{f}", "--out", "{o}/run", "--json", "{o}/r.json", "--no-store",
                 "--budget-evals", "1", "--workers", "1"],
    "propose": ["propose", "{f}", "--out", "{o}/run", "--json", "{o}/p.json", "--no-store"],
    "bench": ["bench", "{f}", "--out", "{o}/bench", "--json", "{o}/b.json", "--html", "{o}/b.html",
              "--no-store", "--budget-evals", "1", "--workers", "1"],
    "kernel": ["check", str(SPEC), "{f}", "--no-store", "--json", "{o}/check.json"],
    "brains": ["optimize", str(SPEC), "--brains", "{f}", "--out", "{o}/run", "--json", "{o}/r.json",
               "--no-store", "--budget-evals", "1", "--workers", "1"],
    "supervisor": ["supervisor", "--config", "{f}", "--state-dir", "{o}/state"],
    "node": ["node", "--config", "{f}", "--state-dir", "{o}/state"],
    "token": ["supervisor", "--token-file", "{f}", "--listen", "127.0.0.1:0", "--shell-listen",
              "127.0.0.1:0", "--state-dir", "{o}/state"],
    "workload": ["workload", "{f}", "--out", "{o}/run", "--json", "{o}/w.json", "--no-store",
                 "--budget-evals", "1", "--workers", "1"],
    "calibrate": ["calibrate", "{f}", "--chip", "v5e", "--out", "{o}/v5e.yaml", "--json", "{o}/c.json"],
    # task directories: the worker reads them (its own code runs)
    "task": ["check", "{f}", str(KERNEL), "--no-store", "--json", "{o}/check.json", "--deadline", "60"],
    "task_hang": ["check", "{f}", str(KERNEL), "--no-store", "--json", "{o}/check.json",
                  "--deadline", "4"],
}
TIMEOUT = 90
CRASH_SIGNS = ("Traceback (most recent call last)", "terminate called", "Segmentation fault",
               "core dumped", "AddressSanitizer", "std::bad_alloc", "Assertion")


def run_entry(entry, scratch):
    path = HERE / entry["file"]
    out = pathlib.Path(tempfile.mkdtemp(prefix="out-", dir=scratch))
    args = [a.format(f=path, o=out) for a in RUNS[entry["run"]]]
    try:
        proc = subprocess.run([str(BIN), *args], capture_output=True, timeout=TIMEOUT,
                              cwd=scratch, stdin=subprocess.DEVNULL)
        result = {"code": proc.returncode, "stderr": proc.stderr.decode("utf-8", "replace"),
                  "stdout": proc.stdout.decode("utf-8", "replace")}
    except subprocess.TimeoutExpired:
        result = {"code": "timeout", "stderr": "", "stdout": ""}
    result["left"] = sorted(str(p.relative_to(out)) for p in out.rglob("*"))
    result["path"] = str(path)
    return result


@pytest.fixture(scope="session")
def outcomes(tmp_path_factory):
    scratch = tmp_path_factory.mktemp("hostile")
    jobs = int(os.environ.get("MAXKERNEL_HOSTILE_JOBS", "3"))
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        # the slow ones (a worker each) first, so the quick ones fill the gaps
        order = sorted(MANIFEST, key=lambda e: not (e["run"].startswith("task") or "hang" in e["run"]))
        futures = {e["file"]: pool.submit(run_entry, e, scratch) for e in order}
        results = {k: f.result() for k, f in futures.items()}
    shutil.rmtree(scratch, ignore_errors=True)
    return results


def test_corpus_has_at_least_100_entries():
    assert len(MANIFEST) >= 100
    assert len({e["file"] for e in MANIFEST}) == len(MANIFEST)
    for e in MANIFEST:
        assert e["run"] in RUNS, e
        assert (HERE / e["file"]).exists() or (HERE / e["file"]).is_symlink() \
            or "does_not_exist" in e["file"] or "missing" in e["file"], e


def check_refusal(entry, r):
    err = r["stderr"]
    shown = f"[{entry['run']}] exit {r['code']}\nstderr:\n{err[-3000:]}\nstdout:\n{r['stdout'][-1000:]}"
    assert r["code"] == 2, shown
    assert not any(sign in err for sign in CRASH_SIGNS), shown
    assert r["path"] in err, shown                                 # the file is named
    if "at" in entry:
        assert f"{r['path']}:{entry['at']}" in err, shown           # with its line and column
    for name in entry.get("names", []):
        assert name in err, f"{name!r} missing\n{shown}"
    assert len(err) < 4000, shown                                  # a message, not a dump
    assert r["left"] == [], f"half-written: {r['left']}\n{shown}"


@pytest.mark.parametrize("entry", MANIFEST, ids=[e["file"].removeprefix("corpus/") for e in MANIFEST])
def test_hostile_input_is_refused_cleanly(entry, outcomes):
    r = outcomes[entry["file"]]
    if "xfail" not in entry:
        check_refusal(entry, r)
        return
    try:   # a known gap, to be fixed where `xfail` says: once it passes, drop the mark
        check_refusal(entry, r)
    except AssertionError:
        pytest.xfail(entry["xfail"])
    pytest.fail(f"{entry['file']} passes now: remove its xfail from manifest.yaml")


# Files git cannot hold: FIFOs (a reader that opens one blocks forever) and oversized files,
# made here for each command that reads a file. (run, file name, how to make it, what to name)
SPECIAL = [
    ("spec", "fifo.yaml", "fifo", "regular file"),
    ("spec", "big.yaml", "big", "1 MiB"),
    ("brains", "fifo.yaml", "fifo", "regular file"),
    ("calibrate", "fifo.csv", "fifo", "measurements"),
    ("kernel", "fifo.py", "fifo", "kernel"),
    ("kernel", "big.py", "big", "1 MiB"),
    ("workload", "fifo.yaml", "fifo", "regular file"),
    ("task", "task/baseline.py", "fifo", "regular file"),
    ("task", "task/reference.py", "big", "MiB"),
]


@pytest.mark.parametrize("run,name,kind,says", SPECIAL, ids=[f"{r}-{n}" for r, n, _, _ in SPECIAL])
def test_fifos_and_oversized_files_are_refused(tmp_path, run, name, kind, says):
    target = tmp_path / name
    target.parent.mkdir(exist_ok=True)
    if kind == "fifo":
        os.mkfifo(target)
    else:
        target.write_text("# padding\n" * 500_000)   # 5 MB of comment lines
    if name.startswith("task/") and name != "task/baseline.py":   # a MaxKernel task around it
        (target.parent / "kernel_task.yaml").write_text(
            "task_id: t\ninput_gen_code: |\n  def get_inputs():\n"
            "      return ([jnp.ones((8, 8))], [])\n")
    entry = {"file": str(target.parent if name.startswith("task/") else target), "run": run,
             "names": [says]}
    r = run_entry(entry, tmp_path)   # an absolute file: HERE / file is the file itself
    check_refusal(entry, r)


def test_strict_tolerances_still_read_yaml11_scientific_notation(tmp_path):
    """The NaN/negative refusal must not refuse `atol: 1e-3`, which PyYAML reads as text."""
    task = tmp_path / "sci"
    task.mkdir()
    (task / "kernel_task.yaml").write_text(
        "task_id: sci\natol: 1e-3\nrtol: [2e-3]\ninput_gen_code: |\n  def get_inputs():\n"
        "      return ([jnp.ones((8, 8), jnp.float32)], [])\n")
    (task / "reference.py").write_text("def computation(x):\n    return x * 2\n")
    run = subprocess.run([str(BIN), "spec", str(task), "--json", "-"], capture_output=True,
                         text=True, timeout=TIMEOUT)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["tolerances"] == [{"output": 0, "atol": 0.001, "rtol": 0.002}]
