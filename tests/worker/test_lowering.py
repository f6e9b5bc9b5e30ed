"""Lowering for TPU on the CPU, and the classification of what Mosaic refuses."""

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl

from conftest import KERNELS_DIR, candidate
from maxkernel_worker import lowering
from maxkernel_worker.candidate import load_candidate
from maxkernel_worker.errors import WorkerError

MATMUL_ARGS = [jax.ShapeDtypeStruct((256, 256), jnp.bfloat16)] * 2


def _workload(name, tmp_path):
    return load_candidate(candidate(name), str(tmp_path)).workload


def _lower_error(fn, args, chip="v5e") -> WorkerError:
    with pytest.raises(WorkerError) as info:
        lowering.lower(fn, args, (), chip)
    return info.value


def test_correct_matmul_lowers_for_tpu(tmp_path):
    out = lowering.lower(_workload("matmul.py", tmp_path), MATMUL_ARGS, ())
    assert out["mlirBytes"] > 1000


def test_block_8x100_is_lower_block_shape_with_mosaics_message(tmp_path):
    err = _lower_error(_workload("matmul_block_8x100.py", tmp_path), MATMUL_ARGS)
    assert err.error_class == "lowerBlockShape"
    assert err.message.startswith("The Pallas TPU lowering currently requires that the last two "
                                  "dimensions of your block shape are divisible by 8 and 128")
    assert "100" in err.message


def test_primitive_without_tpu_lowering_is_lower_unsupported():
    def kernel(x_ref, o_ref):
        o_ref[...] = jnp.sort(x_ref[...], axis=-1)

    def workload(x):
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)
    err = _lower_error(workload, [jax.ShapeDtypeStruct((8, 128), jnp.float32)])
    assert err.error_class == "lowerUnsupported"
    assert "sort" in err.message


def test_python_error_while_tracing_is_trace_error(tmp_path):
    err = _lower_error(_workload("trace_error.py", tmp_path), MATMUL_ARGS)
    assert err.error_class == "traceError"


def test_shape_error_in_plain_jax_is_trace_error():
    err = _lower_error(lambda a, b: a @ b, [jax.ShapeDtypeStruct((8, 128), jnp.float32)] * 2)
    assert err.error_class == "traceError" and "dot_general" in err.message


def test_rank_one_blocks_need_and_get_a_tpu_device_kind():
    # The rank-1 block rule asks tpu_info for the chip; the abstract TPU mesh answers on CPU.
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2

    def workload(x, block=1024):
        return pl.pallas_call(kernel, grid=(2,), in_specs=[pl.BlockSpec((block,), lambda i: (i,))],
                              out_specs=pl.BlockSpec((block,), lambda i: (i,)),
                              out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)
    for chip in lowering.CHIPS:
        assert lowering.lower(workload, [jax.ShapeDtypeStruct((2048,), jnp.float32)], (), chip)
    bad = _lower_error(lambda x: workload(x, 100), [jax.ShapeDtypeStruct((2048,), jnp.float32)])
    assert bad.error_class == "lowerBlockShape" and "rank 1 block" in bad.message


def test_static_arguments_are_passed_as_values():
    def workload(x, scale):
        assert isinstance(scale, int)
        return x * scale
    assert lowering.lower(workload, [jax.ShapeDtypeStruct((8, 128), jnp.float32), 3], (1,))


def test_xla_ops_outside_pallas_lower_too():
    # ragged_dot has no explicit-sharding rule in the pinned JAX: the abstract mesh must not
    # make lowering of such references and of kernels that use them fail.
    def workload(x, w, groups):
        return jax.lax.ragged_dot(x, w, groups)

    args = [jax.ShapeDtypeStruct((256, 128), jnp.bfloat16),
            jax.ShapeDtypeStruct((4, 128, 256), jnp.bfloat16),
            jax.ShapeDtypeStruct((4,), jnp.int32)]
    assert lowering.lower(workload, args, (), "v6e")["mlirBytes"] > 0
