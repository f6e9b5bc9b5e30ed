"""`maxkernel spec`: how a spec is read, as text, JSON and binary Cap'n Proto."""
import json
import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = pathlib.Path(os.environ.get("MAXKERNEL_BIN", ROOT / "build" / "cli" / "maxkernel"))
SPEC = ROOT / "examples" / "matmul" / "spec.yaml"

pytestmark = pytest.mark.skipif(not BIN.exists(), reason="maxkernel is not built")


def spec(*args):
    return subprocess.run([str(BIN), "spec", *map(str, args)], capture_output=True, text=True,
                          timeout=120)


def test_summary_shows_dims_inputs_and_tolerance():
    run = spec(SPEC)
    assert run.returncode == 0, run.stderr
    assert "dims M=1024 K=1024 N=1024" in run.stdout
    assert "x" in run.stdout and "(M=1024, K=1024) bfloat16 normal(mean 0, std 1)" in run.stdout
    assert "atol 0.01 rtol 0.01" in run.stdout


def test_json_on_stdout_is_the_spec_with_the_chip_override():
    run = spec(SPEC, "--chip", "v7x", "--json", "-")
    assert run.returncode == 0, run.stderr
    data = json.loads(run.stdout)
    assert data["name"] == "matmul_bf16"
    assert data["chip"] == "v7x"
    assert [i["name"] for i in data["configurations"][0]["inputs"]] == ["x", "y"]


def test_binary_output_is_a_kernel_spec(tmp_path):
    out = tmp_path / "spec.bin"
    assert spec(SPEC, "--out", out).returncode == 0
    data = out.read_bytes()
    assert len(data) % 8 == 0 and len(data) > 64
    assert b"matmul_bf16" in data


def test_bad_spec_and_bad_output_directory_exit_2(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ninputs: 3\n")
    run = spec(bad)
    assert run.returncode == 2
    assert f"{bad}:2:" in run.stderr and "inputs" in run.stderr
    assert spec(SPEC, "--out", tmp_path / "missing" / "x.bin").returncode == 2
