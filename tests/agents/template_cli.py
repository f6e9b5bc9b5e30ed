"""Shared by the expert-template tests: small native spec files written into a test's tmp
directory, and the built `maxkernel template` / `check` run on them."""
import json
import os
import pathlib
import subprocess
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = pathlib.Path(os.environ.get("MAXKERNEL_BIN", ROOT / "build" / "cli" / "maxkernel"))

needs_binary = pytest.mark.skipif(not BIN.exists(), reason="maxkernel is not built")


def write_spec(tmp_path, name, dims, inputs, reference, tolerance="{atol: 2.0e-2, rtol: 2.0e-2}"):
    lines = [f"name: {name}", f"dims: {dims}", "inputs:"]
    lines += [f"  - {i}" for i in inputs]
    lines.append("reference: |")
    lines += ["  " + l for l in textwrap.dedent(reference).strip("\n").splitlines()]
    lines.append(f"tolerance: {tolerance}")
    path = tmp_path / f"{name}.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def run(*args, timeout=600):
    return subprocess.run([str(BIN), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


def matches(spec):
    t = run("template", spec, "--json", "-")
    assert t.returncode in (0, 2), t.stderr
    return [m["template"] for m in json.loads(t.stdout)["matches"]]


def check(spec, kernel):
    """`maxkernel check` at seed 0: (exit code, result JSON)."""
    c = run("check", spec, kernel, "--seed", "0", "--json", "-")
    return c.returncode, json.loads(c.stdout)


def template_and_check(tmp_path, spec, family, params=None, by_name=True):
    """Renders `family`'s kernel for spec (chosen by name, or by the expert brain's ranking
    when by_name is false) and checks it: (template JSON, check JSON, source)."""
    kernel = tmp_path / f"{spec.stem}.py"
    args = ["template", spec, "--out", kernel, "--json", "-"]
    if by_name:
        args += ["--name", family]
    if params:
        args += ["--params", json.dumps(params)]
    t = run(*args)
    assert t.returncode == 0, t.stdout + t.stderr
    matched = json.loads(t.stdout)
    assert matched["template"] == family, matched
    source = kernel.read_text()
    assert family in source.splitlines()[0], source.splitlines()[0]
    code, result = check(spec, kernel)
    assert code == 0, ({p["phase"]: p for p in result.get("phases", [])}, source)
    assert result["correct"] is True
    assert result["pallas_calls"], result
    return matched, result, source
