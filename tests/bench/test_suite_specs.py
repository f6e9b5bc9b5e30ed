"""The benchmark suite (bench/specs): every spec loads through the real loader, and no task's
reference is degenerate (its outputs change when its inputs do; published suites shipped
tasks whose weights were zeros)."""
import os
import pathlib
import subprocess

import jax
import numpy as np
import pytest

from maxkernel_worker.reduction import reduced_sizes
from maxkernel_worker.schema import load_schemas
from maxkernel_worker.task import open_task

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = pathlib.Path(os.environ.get("MAXKERNEL_BIN", ROOT / "build" / "cli" / "maxkernel"))
SPECS = sorted((ROOT / "bench" / "specs").rglob("*.yaml"))
SCHEMAS = load_schemas(str(ROOT / "messages" / "schema"))

pytestmark = pytest.mark.skipif(not BIN.exists(), reason="maxkernel is not built")


def test_the_suite_has_at_least_58_tasks_with_unique_names():
    names = [p.stem for p in SPECS]
    assert len(names) >= 58
    assert len(set(names)) == len(names)


def load(path, tmp_path):
    out = tmp_path / "spec.bin"
    run = subprocess.run([str(BIN), "spec", str(path), "--out", str(out)], capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    with SCHEMAS.KernelSpec.from_bytes(out.read_bytes(), traversal_limit_in_words=1 << 26) as spec:
        return SCHEMAS.KernelSpec.new_message(**spec.to_dict())


def outputs(task, seed, sizes):
    args = task.make_args(0, seed, sizes)
    return [np.asarray(o, dtype=np.float32) for o in jax.tree.leaves(task.reference(0)(*args))]


@pytest.mark.parametrize("path", SPECS, ids=[p.stem for p in SPECS])
def test_spec_loads_and_its_reference_is_not_degenerate(path, tmp_path):
    spec = load(path, tmp_path)
    assert spec.name == path.stem
    task = open_task(spec)
    # The tester's own reduction without a kernel: the size at which kernels are checked.
    sizes = reduced_sizes(task, 0, [])
    first, second = outputs(task, 0, sizes), outputs(task, 1, sizes)
    assert len(first) == len(second) > 0
    for a, b in zip(first, second):
        assert np.isfinite(a).all(), "the reference produces non-finite values"
    changed = [not np.array_equal(a, b) for a, b in zip(first, second)]
    assert any(changed), "the reference's outputs do not change when its inputs do"
    float_outputs = [i for i, a in enumerate(first) if a.size > 1]
    assert all(np.ptp(first[i]) > 0 for i in float_outputs), "an output is constant"
