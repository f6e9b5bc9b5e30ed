"""Native KernelSpecs (built with pycapnp) materialized by open_task."""
import json
import os

import jax
import numpy as np
import pytest

from maxkernel_worker.errors import WorkerError
from maxkernel_worker.reduction import reduced_sizes
from maxkernel_worker.schema import load_schemas
from maxkernel_worker.task import open_task

SCHEMA = os.path.join(os.path.dirname(__file__), "..", "..", "messages", "schema")
# One way of loading the schemas in the whole test process: two loads of c++.capnp from
# different paths abort the interpreter.
ks = load_schemas(SCHEMA)

REFERENCE = """
def reference(x, w, labels, offsets, scale):
    return (x @ w) * scale, jnp.take(w[0], labels), offsets[-1]
"""

OFFSETS = """
def generate(rng, shape, dtype, dims):
    # group offsets that end exactly at M: structure drawn from the (reduced) dims
    cuts = np.sort(rng.choice(np.arange(1, dims['M']), shape[0] - 1, replace=False))
    return np.concatenate([[0], cuts[:-1], [dims['M']]]).astype(dtype) if shape[0] > 1 else np.array([dims['M']])
"""


def native_spec():
    m = ks.KernelSpec.new_message(name="native_mix", format="native", reference=REFERENCE,
                                  referenceEntry="reference")
    dims = m.init("dims", 2)
    dims[0].name, dims[0].size = "M", 2048
    dims[1].name, dims[1].size = "N", 256
    c = m.init("configurations", 1)[0]
    ins = c.init("inputs", 5)
    ins[0].name = "x"; ins[0].type.shape = [2048, 256]; ins[0].type.dtype = "float32"; ins[0].dimNames = ["M", "N"]
    g = ins[0].generator.init("normal"); g.mean, g.std = 1.0, 0.5
    ins[1].name = "w"; ins[1].type.shape = [256, 256]; ins[1].type.dtype = "bfloat16"; ins[1].dimNames = ["N", "N"]
    g = ins[1].generator.init("uniform"); g.low, g.high = -1.0, 1.0
    ins[2].name = "labels"; ins[2].type.shape = [2048]; ins[2].type.dtype = "int32"; ins[2].dimNames = ["M"]
    g = ins[2].generator.init("randint"); g.low, g.high = 0, 256
    ins[2].structural = True
    ins[3].name = "offsets"; ins[3].type.shape = [5]; ins[3].type.dtype = "int32"; ins[3].dimNames = [""]
    ins[3].generator.code = OFFSETS; ins[3].structural = True
    ins[4].name = "scale"; ins[4].isStatic = True; ins[4].staticValue = "0.25"
    t = m.init("tolerances", 1)[0]
    t.output, t.atol, t.rtol = 1, 0.0, 0.0
    return m.as_reader() if hasattr(m, "as_reader") else m


def test_native_materializes_deterministically_and_differs_across_seeds():
    task = open_task(native_spec())
    assert task.num_configurations == 1
    a = task.make_args(0, seed=5)
    b = task.make_args(0, seed=5)
    c = task.make_args(0, seed=6)
    assert [x.shape for x in a[:4]] == [(2048, 256), (256, 256), (2048,), (5,)]
    assert a[1].dtype == jax.numpy.bfloat16 and a[2].dtype == np.int32
    assert a[4] == 0.25 and task.static_argnums(0) == (4,)
    for x, y, z in zip(a[:4], b[:4], c[:4]):
        assert np.array_equal(np.asarray(x, np.float32), np.asarray(y, np.float32))
        assert not np.array_equal(np.asarray(x, np.float32), np.asarray(z, np.float32))
    x = np.asarray(a[0])
    assert abs(x.mean() - 1.0) < 0.02 and abs(x.std() - 0.5) < 0.02
    assert np.asarray(a[1], np.float32).min() >= -1 and np.asarray(a[1], np.float32).max() <= 1
    assert 0 <= np.asarray(a[2]).min() and np.asarray(a[2]).max() < 256
    assert int(a[3][-1]) == 2048
    out = task.reference(0)(*a)
    assert out[0].shape == (2048, 256) and int(out[2]) == 2048


def test_native_abstract_args_and_tolerances():
    task = open_task(native_spec())
    abstract = task.abstract_args(0)
    assert abstract[0] == jax.ShapeDtypeStruct((2048, 256), np.float32)
    assert abstract[4] == 0.25
    assert task.tolerance(1) == (0.0, 0.0)
    assert task.tolerance(0) == (1e-2, 1e-2)


def test_native_reduction_shrinks_named_dims_and_keeps_structure():
    task = open_task(native_spec())
    blocks = [((2048, 256), (128, 256)), ((2048, 256), (128, 256))]
    sizes = reduced_sizes(task, 0, blocks)
    assert sizes == {"M": 256}           # 2 steps of 128; N=256 is a full last-dim block
    args = task.make_args(0, seed=1, sizes=sizes)
    assert args[0].shape == (256, 256) and args[2].shape == (256,)
    assert int(args[3][-1]) == 256       # the code generator saw the reduced M
    assert args[1].shape == (256, 256)


def test_native_redraw_normal_keeps_structural_inputs():
    task = open_task(native_spec())
    plain = task.make_args(0, seed=2)
    redrawn = task.make_args(0, seed=2, redraw_normal=True)
    assert abs(float(np.asarray(redrawn[0]).mean())) < 0.05      # N(0,1), not the spec's mean 1
    assert np.array_equal(np.asarray(plain[2]), np.asarray(redrawn[2]))
    assert np.array_equal(np.asarray(plain[3]), np.asarray(redrawn[3]))


def test_native_bad_reference_and_static_value():
    d = native_spec().to_dict()
    d["reference"] = "def something_else(x):\n    return x\n"
    with pytest.raises(WorkerError) as e:
        open_task(d).reference(0)
    assert e.value.error_class == "badInput" and "reference()" in e.value.message
    d = native_spec().to_dict()
    d["configurations"][0]["inputs"][4]["staticValue"] = "not json"
    with pytest.raises(WorkerError) as e:
        open_task(d).abstract_args(0)
    assert "scale" in e.value.message and "staticValue" in e.value.message


def test_native_zeros_ones():
    d = native_spec().to_dict()
    d["configurations"][0]["inputs"][0]["generator"] = {"zeros": None}
    d["configurations"][0]["inputs"][1]["generator"] = {"ones": None}
    args = open_task(d).make_args(0, seed=0)
    assert not np.asarray(args[0]).any() and (np.asarray(args[1], np.float32) == 1).all()
