"""`maxkernel optimize --out D`: D/kernel.py is in the JAXBench convention (CONFIG,
create_inputs, workload) whether the search found a faster kernel or fell back to the
reference, and it runs on its own in the venv's python: imported from its path, its
create_inputs gives the spec's inputs and workload's abstract output is the reference's.
One small run (2 evaluations on 2 nodes) on examples/matmul/spec.yaml with the built binary,
the real worker and real JAX."""
import json
import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = pathlib.Path(os.environ.get("MAXKERNEL_BIN", ROOT / "build" / "cli" / "maxkernel"))
PYTHON = pathlib.Path(os.environ.get("MAXKERNEL_PYTHON", ROOT / ".venv" / "bin" / "python"))
SPEC = ROOT / "examples" / "matmul" / "spec.yaml"

pytestmark = pytest.mark.skipif(not BIN.exists(), reason="maxkernel is not built")

# Run in a fresh venv python, as a JAXBench harness would: nothing of maxkernel on the path.
PROBE = """
import importlib.util, json, sys
import jax
spec = importlib.util.spec_from_file_location("optimized", sys.argv[1])
m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
inputs = m.create_inputs()
out = jax.eval_shape(m.workload, *inputs)
print(json.dumps({
    "config": m.CONFIG,
    "inputs": [[list(a.shape), str(a.dtype)] for a in inputs],
    "output": [list(out.shape), str(out.dtype)],
}))
"""


def test_optimize_writes_a_kernel_in_the_jaxbench_convention(tmp_path):
    out = tmp_path / "out"
    run = subprocess.run(["nice", "-n", "5", str(BIN), "optimize", str(SPEC), "--budget-evals", "2",
                          "--nodes", "2", "--out", str(out), "--state-dir", str(tmp_path / "state")],
                         capture_output=True, text=True, timeout=1200)
    assert run.returncode in (0, 1), run.stderr
    result = json.loads((out / "result.json").read_text())
    kernel = (out / "kernel.py").read_text()
    assert kernel.startswith("# maxkernel optimize")
    assert "# not in the JAXBench convention" not in kernel, kernel[:2000]
    assert ("fallback" in kernel.split("\n", 1)[0]) is result["fallback_to_reference"]

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["JAX_PLATFORMS"] = "cpu"
    probe = subprocess.run([str(PYTHON), "-c", PROBE, str(out / "kernel.py")], capture_output=True,
                           text=True, timeout=600, env=env, cwd=tmp_path)
    assert probe.returncode == 0, probe.stderr
    got = json.loads(probe.stdout)
    assert {k: got["config"][k] for k in ("name", "M", "K", "N", "atol", "rtol")} == {
        "name": "matmul_bf16", "M": 1024, "K": 1024, "N": 1024, "atol": 0.01, "rtol": 0.01}
    assert got["inputs"] == [[[1024, 1024], "bfloat16"], [[1024, 1024], "bfloat16"]]
    assert got["output"] == [[1024, 1024], "bfloat16"]
