"""JAXBench and MaxKernel task directories: load_task_dir and the resulting Tasks."""
import json
import os

import jax
import numpy as np
import pytest

from maxkernel_worker.errors import WorkerError
from maxkernel_worker.task import load_task_dir, open_task

TASKS = os.path.join(os.path.dirname(__file__), "tasks")
GiB = 1 << 30


def load(name, limit=GiB):
    return load_task_dir(os.path.join(TASKS, name), limit)


def test_jaxbench_matmul_spec():
    spec = load("jb_matmul")
    assert spec["format"] == "jaxbench" and spec["name"] == "small_matmul"
    (config,) = spec["configurations"]
    assert [i["type"]["shape"] for i in config["inputs"]] == [[256, 128], [128, 256]]
    assert [i["name"] for i in config["inputs"]] == ["A", "B"]
    assert config["outputs"] == [{"shape": [256, 256], "dtype": "float32"}]
    assert spec["tolerances"] == [{"output": -1, "atol": 2e-2, "rtol": 2e-2}]   # CONFIG's
    assert spec["flops"] == 2 * 256 * 128 * 256
    assert json.loads(spec["configJson"])["M"] == 256
    assert spec["baselinePath"].endswith("jb_matmul/optimized.py")
    assert spec["degenerate"] is False


def test_jaxbench_seeds_matter_and_seed0_is_the_published_input():
    task = open_task(load("jb_matmul"))
    a0, a0b, a1 = task.make_args(0, 0), task.make_args(0, 0), task.make_args(0, 1)
    assert all(np.array_equal(x, y) for x, y in zip(a0, a0b))
    assert not np.array_equal(a0[0], a1[0]) and not np.array_equal(a0[1], a1[1])
    key = jax.random.split(jax.random.PRNGKey(42), 2)[0]
    assert np.array_equal(a0[0], jax.random.normal(key, (256, 128)))
    out = task.reference(0)(*a1)
    np.testing.assert_allclose(out, np.asarray(a1[0]) @ np.asarray(a1[1]), atol=1e-3, rtol=1e-3)


def test_baseline_kernel_runs_like_the_reference():
    from jax.experimental.pallas import tpu as pltpu
    spec = load("jb_matmul")
    ns = {}
    exec(compile(open(spec["baselinePath"]).read(), spec["baselinePath"], "exec"), ns)
    task = open_task(spec)
    args = task.make_args(0, 2)
    with pltpu.force_tpu_interpret_mode(pltpu.InterpretParams()):
        got = ns["workload"](*args)
    np.testing.assert_allclose(got, task.reference(0)(*args), *task.tolerance(0)[::-1])


def test_hardcoded_shapes_and_static_scalar():
    spec = load("jb_hardcoded")
    inputs = spec["configurations"][0]["inputs"]
    assert inputs[2]["isStatic"] and json.loads(inputs[2]["staticValue"]) == 0.5
    assert spec["tolerances"] == [{"output": -1, "atol": 1e-2, "rtol": 1e-2}]   # JAXBench default
    task = open_task(spec)
    assert task.static_argnums(0) == (2,)
    assert task.abstract_args(0)[2] == 0.5
    a, b = task.make_args(0, 0), task.make_args(0, 9)
    assert a[2] == 0.5 and not np.array_equal(a[0], b[0])


def test_grouped_structural_input_and_data_dependent_reference():
    spec = load("jb_grouped")
    inputs = spec["configurations"][0]["inputs"]
    assert [i["structural"] for i in inputs] == [False, False, True]
    assert spec["configurations"][0]["outputs"][0]["shape"] == [1024, 256]
    task = open_task(spec)
    args = task.make_args(0, 4)
    assert int(np.asarray(args[2]).sum()) == 1024


def test_degenerate_task_is_flagged():
    assert load("jb_degenerate")["degenerate"] is True
    task = open_task(load("jb_degenerate"))
    a = task.make_args(0, 1, redraw_normal=True)
    assert np.asarray(a[1]).std() > 0.5      # weights redrawn from N(0,1)


def test_maxkernel_several_configurations_and_per_output_tolerances():
    spec = load("mk_multi")
    assert spec["format"] == "maxkernel" and spec["name"] == "small_norm_and_sum"
    assert len(spec["configurations"]) == 2
    assert [c["inputs"][0]["type"]["shape"] for c in spec["configurations"]] == [[256, 256], [128, 512]]
    assert spec["configurations"][1]["outputs"] == [{"shape": [128, 512], "dtype": "float32"},
                                                    {"shape": [128], "dtype": "float32"}]
    task = open_task(spec)
    assert task.num_configurations == 2
    assert task.tolerance(0) == (1e-3, 1e-3) and task.tolerance(1) == (5e-2, 1e-3)
    a, b = task.make_args(1, 0), task.make_args(1, 1)
    assert a[0].shape == (128, 512) and a[1] == 1e-6 and task.static_argnums(1) == (1,)
    assert not np.array_equal(a[0], b[0])
    normed, sums = task.reference(1)(*a)
    np.testing.assert_allclose(sums, np.asarray(a[0]).sum(-1), rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("name, error_class, fragments", [
    ("bad_syntax", "badInput", ["baseline.py:6:", "syntax"]),
    ("bad_no_create", "badInput", ["baseline.py", "create_inputs()"]),
    ("bad_get_inputs_type", "badInput", ["kernel_task.yaml", "get_inputs()", "array"]),
    ("bad_huge", "tooLarge", ["'big'", "256.0 GiB"]),
    ("bad_no_reference", "badInput", ["reference.py", "not found"]),
    ("bad_no_computation", "badInput", ["reference.py", "computation()"]),
])
def test_bad_inputs(name, error_class, fragments):
    with pytest.raises(WorkerError) as e:
        load(name)
    assert e.value.error_class == error_class
    for f in fragments:
        assert f in e.value.message


def test_errors_in_task_code_name_the_line(tmp_path):
    (tmp_path / "kernel_task.yaml").write_text(
        "task_id: raising\ninput_gen_code: |-\n  def get_inputs():\n      x = jnp.ones((8, 128))\n"
        "      return [x], [undefined_name]\n")
    (tmp_path / "reference.py").write_text("def computation(x):\n    return x\n")
    with pytest.raises(WorkerError) as e:
        load_task_dir(str(tmp_path), GiB)
    assert e.value.error_class == "badInput"
    assert "kernel_task.yaml:5:" in e.value.message and "undefined_name" in e.value.message


def test_not_a_task_directory(tmp_path):
    with pytest.raises(WorkerError) as e:
        load_task_dir(str(tmp_path), GiB)
    assert e.value.error_class == "badInput" and "baseline.py" in e.value.message


def test_unseeded_task_values_are_redrawn_per_seed(tmp_path):
    (tmp_path / "baseline.py").write_text(
        "import jax.numpy as jnp\nCONFIG = {'name': 'unseeded'}\n"
        "def create_inputs(dtype=jnp.float32):\n"
        "    x = jnp.linspace(-1.0, 1.0, 8 * 128, dtype=dtype).reshape(8, 128)\n"
        "    idx = jnp.arange(8, dtype=jnp.int32)\n"
        "    return x, idx\n"
        "def workload(x, idx):\n    return x[idx] * 2\n")
    t = open_task(load_task_dir(str(tmp_path), GiB))
    a0, a1, a1b = t.make_args(0, 0), t.make_args(0, 1), t.make_args(0, 1)
    assert np.array_equal(a0[0], jax.numpy.linspace(-1.0, 1.0, 1024, dtype=np.float32).reshape(8, 128))
    assert not np.array_equal(a0[0], a1[0]) and np.array_equal(a1[0], a1b[0])
    assert np.array_equal(a0[1], a1[1])                    # integers stay as the task made them
    assert abs(float(np.asarray(a1[0]).std()) - float(np.asarray(a0[0]).std())) < 0.1
