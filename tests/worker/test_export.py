"""maxkernel_worker.export: a kernel written in the JAXBench convention (CONFIG, create_inputs,
workload), for native specs (CONFIG from the dims, create_inputs drawing as the worker does),
JAXBench task directories (CONFIG and create_inputs copied from baseline.py with what they need)
and MaxKernel task directories (get_inputs wrapped), with name clashes, the eval_shape check and
the command line's exit codes. Real JAX on the CPU."""

import os
import subprocess
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import PACKAGE_DIR, ROOT, SCHEMA_DIR
from maxkernel_worker import export
from maxkernel_worker.task import NativeTask
from maxkernel_worker.task_dir import load_task_dir

JAXBENCH_MATMUL = os.path.join(ROOT, "examples", "jaxbench_matmul")
MK_MULTI = os.path.join(ROOT, "tests", "worker", "tasks", "mk_multi")

RMSNORM_REFERENCE = """\
import jax
import jax.numpy as jnp

def reference(x, weight, eps):
    x32 = x.astype(jnp.float32)
    mean_square = jnp.mean(x32 * x32, axis=-1, keepdims=True)
    return (x32 * jax.lax.rsqrt(mean_square + eps) * weight.astype(jnp.float32)).astype(x.dtype)
"""

# A kernel for the rmsnorm specs: not a copy of the reference (blocked over rows), same math.
RMSNORM_KERNEL = """\
import jax
import jax.numpy as jnp


def _row_block(x, weight, eps):
    x32 = x.astype(jnp.float32)
    inv = jax.lax.rsqrt(jnp.sum(x32 * x32, axis=-1, keepdims=True) / x.shape[-1] + eps)
    return (x32 * inv * weight.astype(jnp.float32)).astype(x.dtype)


def workload(x, weight, eps):
    rows = x.reshape(-1, x.shape[-1])
    out = jnp.concatenate([_row_block(rows[i:i + 8], weight, eps)
                           for i in range(0, rows.shape[0], 8)])
    return out.reshape(x.shape)
"""


def tensor(name, dims, sizes, dtype, generator):
    return {"name": name, "type": {"shape": [sizes[d] for d in dims], "dtype": dtype},
            "generator": generator, "dimNames": list(dims)}


def rmsnorm_spec(b=8, s=4096, e=8192) -> dict:
    """bench/specs/operators/rmsnorm.yaml as config/ loads it (dims B, S, E; static eps)."""
    sizes = {"B": b, "S": s, "E": e}
    return {
        "schemaVersion": 1, "name": "rmsnorm", "format": "native",
        "sourcePath": os.path.join(ROOT, "bench", "specs", "operators", "rmsnorm.yaml"),
        "dims": [{"name": k, "size": v} for k, v in sizes.items()],
        "configurations": [{"name": "default", "inputs": [
            tensor("x", "BSE", sizes, "bfloat16", {"normal": {"mean": 0.0, "std": 1.0}}),
            tensor("weight", "E", sizes, "bfloat16", {"normal": {"mean": 1.0, "std": 0.1}}),
            {"name": "eps", "type": {"shape": [], "dtype": ""}, "generator": {"zeros": None},
             "isStatic": True, "staticValue": "1e-05", "dimNames": []},
        ], "outputs": []}],
        "reference": RMSNORM_REFERENCE, "referenceEntry": "reference",
        "tolerances": [{"output": -1, "atol": 0.01, "rtol": 0.01}],
    }


def load(path) -> types.ModuleType:
    module = types.ModuleType("exported_" + os.path.basename(str(path)).replace(".", "_"))
    module.__file__ = str(path)
    sys.modules[module.__name__] = module
    exec(compile(open(path).read(), str(path), "exec"), module.__dict__)
    return module


def do_export(spec, kernel_source, path):
    notes = export.export(spec, kernel_source, str(path))
    return load(path), notes


def top_level_defs(path, name) -> int:
    import ast
    tree = ast.parse(open(path).read())
    return sum(1 for s in tree.body if isinstance(s, ast.FunctionDef) and s.name == name)


# ---------------------------------------------------------------- native specs

def test_native_full_size_config_and_shapes_without_drawing(tmp_path):
    spec = rmsnorm_spec()
    out = tmp_path / "kernel.py"
    module, notes = do_export(spec, RMSNORM_KERNEL, out)
    assert module.CONFIG == {"name": "rmsnorm", "B": 8, "S": 4096, "E": 8192,
                             "atol": 0.01, "rtol": 0.01}
    # 512 MiB of inputs: create_inputs is not run by the exporter, and says so
    assert any("not run" in n for n in notes)
    # its shapes and dtypes, under eval_shape (the static eps is a Python float)
    assert top_level_defs(out, "workload") == 1 and top_level_defs(out, "create_inputs") == 1
    text = out.read_text()
    assert "rng(0).normal(0.0, 1.0, (dims['B'], dims['S'], dims['E']))" in text
    assert "rng(1).normal(1.0, 0.1, (dims['E'],))" in text
    assert text.rstrip().endswith("return (x, weight, 1e-05)")


def test_native_matmul_full_size_create_inputs_match_the_spec(tmp_path):
    sizes = {"M": 1024, "K": 1024, "N": 1024}
    spec = {
        "schemaVersion": 1, "name": "matmul_bf16", "format": "native",
        "dims": [{"name": k, "size": v} for k, v in sizes.items()],
        "configurations": [{"name": "default", "inputs": [
            tensor("x", "MK", sizes, "bfloat16", {"normal": {"mean": 0.0, "std": 1.0}}),
            tensor("y", "KN", sizes, "bfloat16", {"normal": {"mean": 0.0, "std": 1.0}})]}],
        "reference": open(os.path.join(ROOT, "examples", "matmul", "spec.yaml")).read()
                     .split("reference: |\n")[1].split("# A tiled")[0].replace("\n  ", "\n").strip() + "\n",
        "referenceEntry": "reference",
        "tolerances": [{"output": -1, "atol": 0.01, "rtol": 0.01}],
    }
    kernel = open(os.path.join(ROOT, "examples", "matmul", "kernel.py")).read()
    module, notes = do_export(spec, kernel, tmp_path / "kernel.py")
    assert notes == []
    assert {k: module.CONFIG[k] for k in "MKN"} == sizes
    x, y = module.create_inputs()
    assert (x.shape, x.dtype, y.shape, y.dtype) == ((1024, 1024), jnp.bfloat16, (1024, 1024), jnp.bfloat16)
    # the worker's own seed-0 draw, value for value
    wx, wy = NativeTask(spec).make_args(0, 0)
    assert np.array_equal(np.asarray(x), np.asarray(wx)) and np.array_equal(np.asarray(y), np.asarray(wy))
    out = jax.eval_shape(module.workload, x, y)
    assert (out.shape, out.dtype) == ((1024, 1024), jnp.bfloat16)


GROUPS_CODE = """\
def generate(rng, shape, dtype, dims):
    return np.full(shape, dims["ROWS"] // shape[0]) + _offset(shape)

def _offset(shape):
    return np.zeros(shape, np.int64)
"""


def tiny_spec() -> dict:
    """Every generator kind, a derived dim (ROWS = B * S), a static argument."""
    sizes = {"B": 2, "S": 8, "E": 128, "ROWS": 16, "G": 4}
    spec = rmsnorm_spec(2, 8, 128)
    spec["dims"] = [{"name": "B", "size": 2}, {"name": "S", "size": 8}, {"name": "E", "size": 128},
                    {"name": "ROWS", "size": 16, "expression": "B * S"}, {"name": "G", "size": 4}]
    inputs = spec["configurations"][0]["inputs"]
    inputs[1]["generator"] = {"uniform": {"low": 0.5, "high": 1.5}}
    inputs += [tensor("labels", ["ROWS"], sizes, "int32", {"randint": {"low": 0, "high": 10}}),
               tensor("bias", "E", sizes, "float32", {"zeros": None}),
               tensor("scale", "E", sizes, "float32", {"ones": None}),
               dict(tensor("groups", ["G"], sizes, "int32", {"code": GROUPS_CODE}), structural=True)]
    spec["reference"] = RMSNORM_REFERENCE.replace(
        "def reference(x, weight, eps):",
        "def reference(x, weight, eps, labels, bias, scale, groups):").replace(
        "    return (x32", "    return labels.sum() + groups.sum(), bias + scale, (x32")
    return spec


TINY_KERNEL = RMSNORM_KERNEL.replace(
    "def workload(x, weight, eps):", "def workload(x, weight, eps, labels, bias, scale, groups):").replace(
    "    return out.reshape(x.shape)", "    return jnp.sum(labels) + jnp.sum(groups), scale + bias, out.reshape(x.shape)")


def test_native_tiny_spec_runs_and_equals_the_reference(tmp_path):
    spec = tiny_spec()
    module, notes = do_export(spec, TINY_KERNEL, tmp_path / "kernel.py")
    assert notes == []
    assert module.CONFIG["ROWS"] == 16 and module.CONFIG["B"] == 2
    inputs = module.create_inputs()
    worker = NativeTask(spec).make_args(0, 0)
    assert len(inputs) == len(worker) == 7
    for a, b in zip(inputs, worker):
        if hasattr(b, "shape"):
            assert (a.shape, a.dtype) == (b.shape, b.dtype)
            assert np.array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
        else:
            assert a == b == 1e-5
    assert list(np.asarray(inputs[6])) == [4, 4, 4, 4]     # dims["ROWS"] // 4 from the code generator
    got = module.workload(*inputs)
    want = NativeTask(spec).reference(0)(*inputs)
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        assert g.shape == w.shape and g.dtype == w.dtype
        assert np.allclose(np.asarray(g, np.float32), np.asarray(w, np.float32), atol=1e-2, rtol=1e-2)
    # another seed draws other values; the derived dim follows CONFIG's other dims
    assert not np.array_equal(np.asarray(module.create_inputs(seed=1)[0], np.float32),
                              np.asarray(inputs[0], np.float32))
    module.CONFIG["S"] = 4
    assert module.create_inputs()[3].shape == (8,)


def test_native_wrong_output_shape_is_refused(tmp_path):
    wrong = RMSNORM_KERNEL.replace("return out.reshape(x.shape)", "return out")
    with pytest.raises(export.ExportError) as e:
        export.export(rmsnorm_spec(2, 8, 128), wrong, str(tmp_path / "kernel.py"))
    assert e.value.code == 1
    assert "[16, 128] bfloat16" in e.value.message and "[2, 8, 128] bfloat16" in e.value.message


def test_the_reference_as_fallback_kernel_gets_its_imports(tmp_path):
    # the worker runs native references with jax, jnp and np already bound: the export imports them
    reference = "def reference(x, weight, eps):\n    return (x * weight).astype(jnp.bfloat16)\n"
    spec = rmsnorm_spec(2, 8, 128)
    spec["reference"] = reference
    module, _ = do_export(spec, reference + "\n\nworkload = reference\n", tmp_path / "kernel.py")
    assert module.workload is module.reference
    assert module.workload(*module.create_inputs()).shape == (2, 8, 128)


# ---------------------------------------------------------------- task directories

def test_jaxbench_task_copies_config_and_create_inputs(tmp_path):
    spec = load_task_dir(JAXBENCH_MATMUL, 0)
    kernel = open(os.path.join(JAXBENCH_MATMUL, "optimized.py")).read()
    out = tmp_path / "optimized.py"
    module, _ = do_export(spec, kernel, out)
    assert module.CONFIG["name"] == "matmul_1024_bf16" and module.CONFIG["atol"] == 2e-2
    assert top_level_defs(out, "workload") == 1           # the kernel's, not baseline.py's
    assert top_level_defs(out, "get_flops") == 0
    assert module.workload.__code__.co_filename == str(out)
    assert "pallas_matmul" in module.workload.__code__.co_names
    x, y = module.create_inputs()
    baseline = load(os.path.join(JAXBENCH_MATMUL, "baseline.py"))
    bx, by = baseline.create_inputs()
    assert np.array_equal(np.asarray(x, np.float32), np.asarray(bx, np.float32))
    assert (y.shape, y.dtype) == ((1024, 1024), jnp.bfloat16)


CLASH_BASELINE = '''\
"""A task whose input helper clashes with the kernel's names."""
import jax
import jax.numpy as jnp

SCALE = 0.5
CONFIG = {"name": "clash", "rows": 16, "cols": 128}


def _make(key, shape):
    return jax.random.normal(key, shape, jnp.float32) * SCALE


def _shift(x, SCALE=3.0):
    return x + SCALE      # its own SCALE: a parameter, not the module's


def create_inputs():
    x = _make(jax.random.PRNGKey(0), (CONFIG["rows"], CONFIG["cols"]))
    return (_shift(x),)


def workload(x):
    return x * 2.0
'''

CLASH_KERNEL = '''\
import jax.numpy as jnp

SCALE = 4.0


def _make(x):
    return x * SCALE


def workload(x):
    return _make(x) / 2.0
'''


def test_jaxbench_name_clash_renames_the_reference_helpers(tmp_path):
    task = tmp_path / "clash"
    task.mkdir()
    (task / "baseline.py").write_text(CLASH_BASELINE)
    spec = load_task_dir(str(task), 0)
    out = tmp_path / "optimized.py"
    module, _ = do_export(spec, CLASH_KERNEL, out)
    text = out.read_text()
    assert module.SCALE == 4.0 and module._reference_SCALE == 0.5
    assert "def _reference__make(key, shape)" in text
    assert "def _shift(x, SCALE=3.0):" in text and "return x + SCALE" in text
    assert top_level_defs(out, "workload") == 1
    (x,) = module.create_inputs()
    (bx,) = load(task / "baseline.py").create_inputs()
    assert np.allclose(np.asarray(x), np.asarray(bx))      # the reference's meaning is kept
    assert np.allclose(np.asarray(module.workload(x)), np.asarray(x) * 2.0)  # and the kernel's


def test_maxkernel_task_wraps_get_inputs(tmp_path):
    spec = load_task_dir(MK_MULTI, 0)
    kernel = ("import jax\nimport jax.numpy as jnp\n\n\ndef workload(x, eps):\n"
              "    inv = jax.lax.rsqrt((x * x).mean(axis=-1, keepdims=True) + eps)\n"
              "    return x * inv, x.sum(axis=-1)\n")
    module, _ = do_export(spec, kernel, tmp_path / "kernel.py")
    assert module.CONFIG == {"name": "small_norm_and_sum", "atol": [1e-3, 5e-2], "rtol": [1e-3, 1e-3]}
    x, eps = module.create_inputs()
    assert x.shape == (256, 256) and eps == 1e-6             # the first configuration
    normed, sums = module.workload(x, eps)
    assert normed.shape == (256, 256) and sums.shape == (256,)


# ---------------------------------------------------------------- the command line

def run_cli(tmp_path, spec: dict, kernel: str, schemas):
    spec_file, kernel_file, out = tmp_path / "spec.bin", tmp_path / "k.py", tmp_path / "out.py"
    spec_file.write_bytes(schemas.KernelSpec.new_message(**spec).to_bytes())
    kernel_file.write_text(kernel)
    env = dict(os.environ, PYTHONPATH=PACKAGE_DIR, JAX_PLATFORMS="cpu")
    run = subprocess.run([sys.executable, "-m", "maxkernel_worker.export", "--spec", str(spec_file),
                          "--kernel", str(kernel_file), "--out", str(out), "--schema-dir", SCHEMA_DIR],
                         capture_output=True, text=True, env=env, timeout=300)
    return run, out


def test_cli_writes_the_module_from_spec_bytes(tmp_path, schemas):
    run, out = run_cli(tmp_path, tiny_spec(), TINY_KERNEL, schemas)
    assert run.returncode == 0, run.stderr
    module = load(out)
    assert module.CONFIG["E"] == 128 and len(module.create_inputs()) == 7


def test_cli_bad_generator_exits_2(tmp_path, schemas):
    spec = rmsnorm_spec(2, 8, 128)
    spec["configurations"][0]["inputs"][1]["generator"] = {"task": None}
    run, out = run_cli(tmp_path, spec, RMSNORM_KERNEL, schemas)
    assert run.returncode == 2
    assert "input weight: generator kind 'task' cannot be written as source" in run.stderr
    assert not out.exists()


def test_cli_mismatch_exits_1_and_writes_nothing(tmp_path, schemas):
    run, out = run_cli(tmp_path, rmsnorm_spec(2, 8, 128), RMSNORM_KERNEL.replace(
        "return out.reshape(x.shape)", "return out.astype(jnp.float32).reshape(x.shape)"), schemas)
    assert run.returncode == 1
    assert "workload returns [2, 8, 128] float32; the reference returns [2, 8, 128] bfloat16" in run.stderr
    assert not out.exists()


def test_jaxbench_reference_as_kernel_is_kept_whole(tmp_path):
    # the fallback: baseline.py itself is the kernel; nothing is added, and its data-dependent
    # workload is checked with the integer inputs concrete
    spec = load_task_dir(os.path.join(ROOT, "tests", "worker", "tasks", "jb_grouped"), 0)
    source = spec["reference"]
    assert export.export_source(spec, source).rstrip("\n") == source.rstrip("\n")
    module, _ = do_export(spec, source, tmp_path / "kernel.py")
    lhs, rhs, groups = module.create_inputs()
    assert module.workload(lhs, rhs, groups).shape == (1024, 256)
