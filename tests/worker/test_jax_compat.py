"""TPU interpret mode on the pinned JAX, with the worker's shims (maxkernel_worker/jax_compat.py):
reads through reshaped and bitcast refs, and masked stores into refs of rank >= 2.

The classic interpreter (`interpret=True`) is no fallback for these kernels: on JAX 0.10.2 it
fails on ragged_paged_attention too (primitives._swap_discharge_rule: 'TypedInt' object has no
attribute 'shape'), and it checks neither out-of-bounds reads nor DMA semantics. So the worker
keeps TPU interpret mode and fixes the two interpreter bugs the library kernels meet.

In process, the shims are applied here as the worker applies them at start (once, for the
session: they only change paths that raised before). The pristine behaviour is checked in a
subprocess, so that a JAX that fixes the bugs shows up here.
"""

import json
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from maxkernel_worker import jax_compat

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = pathlib.Path(os.environ.get("MAXKERNEL_BIN", ROOT / "build" / "cli" / "maxkernel"))
PARAMS = pltpu.InterpretParams(uninitialized_memory="nan", out_of_bounds_reads="raise")

pytestmark = pytest.mark.skipif(jax.__version__ != jax_compat.PINNED_JAX,
                                reason=f"the shims are for JAX {jax_compat.PINNED_JAX}")


@pytest.fixture(scope="module", autouse=True)
def shims():
    assert jax_compat.apply()
    assert jax_compat.apply()   # idempotent


def _interpret(fn, *args):
    try:
        with pltpu.force_tpu_interpret_mode(PARAMS):
            return np.asarray(jax.block_until_ready(fn(*args)))
    except BaseException:
        pltpu.reset_tpu_interpret_mode_state()   # as the tester does after a failure
        raise


# ---------------------------------------------------------------- the numpy twins

@pytest.mark.parametrize("src, dst", [(jnp.bfloat16, jnp.uint32), (jnp.uint32, jnp.bfloat16),
                                      (jnp.int8, jnp.int32), (jnp.int32, jnp.int8),
                                      (jnp.float32, jnp.int32), (jnp.uint16, jnp.bfloat16)])
def test_bitcast_twin_matches_jax_state_bitcast(src, dst):
    from jax._src.state import utils as state_utils
    rng = np.random.default_rng(0)
    x = np.asarray(rng.integers(0, 2**31, (3, 8, 16)).astype(np.uint32)).view(np.uint8)
    x = x.view(np.dtype(src)).reshape(3, -1, 16)[:, :8]   # arbitrary bit patterns, (3, 8, 16)
    got = jax_compat.bitcast(np.ascontiguousarray(x), dst)
    want = np.asarray(state_utils.bitcast(jnp.asarray(x), dst))
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.tobytes() == want.tobytes()


def test_bitcast_twin_packs_consecutive_rows_lower_row_low_bits():
    # TPU packing, independently of both implementations: u32 row r = bf16 rows 2r | 2r+1 << 16.
    x = np.arange(4 * 128, dtype=np.float32).reshape(4, 128).astype(ml_dtypes.bfloat16)
    got = jax_compat.bitcast(x, np.uint32)
    bits = x.view(np.uint16).astype(np.uint32)
    assert got.shape == (2, 128)
    np.testing.assert_array_equal(got, bits[0::2] | (bits[1::2] << 16))
    np.testing.assert_array_equal(jax_compat.bitcast(got, ml_dtypes.bfloat16).view(np.uint16),
                                  x.view(np.uint16))


def test_transform_array_twin_matches_jax_discharge():
    from jax._src.state import discharge, indexing
    from jax._src.state.types import BitcastTransform, ReshapeTransform
    x = np.random.default_rng(1).standard_normal((2, 4, 8, 128)).astype(ml_dtypes.bfloat16)
    chain = (indexing.NDIndexer.from_indices_shape((1,), x.shape),
             ReshapeTransform((32, 128)), BitcastTransform(jnp.dtype(jnp.uint32)),
             indexing.NDIndexer.from_indices_shape((pl.ds(1, 8, 2),), (16, 128)))
    got = jax_compat.transform_array(x, chain)
    want = np.asarray(discharge.transform_array(jnp.asarray(x), chain))
    assert got.shape == want.shape == (8, 128)
    np.testing.assert_array_equal(got, want)


def test_transform_array_twin_out_of_bounds_raises_or_reads_uninitialized():
    from jax._src.state import indexing
    from jax._src.state.types import ReshapeTransform
    x = np.arange(4 * 8 * 128, dtype=np.float32).reshape(4, 8, 128)
    rows_28_to_36 = indexing.NDIndexer((indexing.Slice(28, 8, 1), indexing.Slice(0, 128, 1)),
                                       (32, 128), (), validate=False)   # as a dynamic start
    chain = (ReshapeTransform((32, 128)), rows_28_to_36)
    with pytest.raises(IndexError, match="Out-of-bounds read"):
        jax_compat.transform_array(x, chain, "raise")
    got = jax_compat.transform_array(x, chain, "uninitialized", "nan")
    assert got.shape == (8, 128)
    np.testing.assert_array_equal(got[:4], x.reshape(32, 128)[28:])
    assert np.isnan(got[4:]).all()


# ---------------------------------------------------------------- reads through views

def _strided_kv_read(x):
    """The access pattern of ragged_paged_attention's KV buffer: a buffer of a double-buffered
    scratch, reshaped to 2D, bitcast to u32, every other row from an offset."""
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref.at[1].reshape(32, 128).bitcast(jnp.uint32)[1::2, :]
    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.uint32))(x)


def test_read_through_reshape_bitcast_and_stride_in_tpu_interpret_mode():
    x = np.random.default_rng(2).standard_normal((2, 4, 8, 128)).astype(ml_dtypes.bfloat16)
    got = _interpret(_strided_kv_read, jnp.asarray(x))
    bits = x[1].reshape(32, 128).view(np.uint16).astype(np.uint32)
    want = (bits[0::2] | (bits[1::2] << 16))[1::2]
    np.testing.assert_array_equal(got, want)


def _dynamic_read_after_reshape(start, x):
    def kernel(start_ref, x_ref, o_ref):
        o_ref[...] = x_ref.reshape(32, 128)[pl.ds(start_ref[0], 8), :]
    return pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((8, 128), x.dtype),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(1,),
            in_specs=[pl.BlockSpec((4, 8, 128), lambda i, s: (0, 0, 0))],
            out_specs=pl.BlockSpec((8, 128), lambda i, s: (0, 0))))(start, x)


def test_read_after_reshape_is_bounds_checked():
    x = np.random.default_rng(3).standard_normal((4, 8, 128)).astype(np.float32)
    got = _interpret(_dynamic_read_after_reshape, jnp.array([24], jnp.int32), jnp.asarray(x))
    np.testing.assert_array_equal(got, x.reshape(32, 128)[24:32])
    with pytest.raises(Exception, match="Out-of-bounds read"):
        _interpret(_dynamic_read_after_reshape, jnp.array([28], jnp.int32), jnp.asarray(x))


def _dma_from_reshaped_hbm(x):
    def kernel(x_hbm, o_ref, buf, sem):
        copy = pltpu.make_async_copy(x_hbm.reshape(32, 128).at[pl.ds(8, 16)], buf, sem)
        copy.start()
        copy.wait()
        o_ref[...] = buf[...] * 2
    return pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((16, 128), x.dtype),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        scratch_shapes=[pltpu.VMEM((16, 128), x.dtype), pltpu.SemaphoreType.DMA(())])(x)


def test_dma_source_through_reshape():
    x = np.random.default_rng(4).standard_normal((4, 8, 128)).astype(np.float32)
    got = _interpret(_dma_from_reshaped_hbm, jnp.asarray(x))
    np.testing.assert_array_equal(got, x.reshape(32, 128)[8:24] * 2)


# ---------------------------------------------------------------- masked stores

def _masked_store(start, lo, hi, x):
    """Zeroes a (16, 8, 128) output, then stores x through heads 4..7 from row start on, rows
    lo..hi of the view masked in (as ragged_paged_attention's masked_store into head_acc_ref)."""
    def kernel(s_ref, x_ref, o_ref):
        o_ref[...] = jnp.zeros(o_ref.shape, o_ref.dtype)
        view = o_ref.at[pl.ds(s_ref[0], 16), pl.ds(4, 4), :]
        rows = jax.lax.broadcasted_iota(jnp.int32, view.shape, 0)
        pltpu.store(view, x_ref[...], mask=(rows >= s_ref[1]) & (rows < s_ref[2]))
    return pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((16, 8, 128), x.dtype),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(1,),
            in_specs=[pl.BlockSpec((16, 4, 128), lambda i, s: (0, 0, 0))],
            out_specs=pl.BlockSpec((16, 8, 128), lambda i, s: (0, 0, 0))))(
        jnp.array([start, lo, hi], jnp.int32), x)


def test_masked_store_into_rank_3_ref_writes_the_masked_rows_only():
    x = np.random.default_rng(5).standard_normal((16, 4, 128)).astype(np.float32)
    got = _interpret(_masked_store, 0, 6, 16, jnp.asarray(x))
    want = np.zeros((16, 8, 128), np.float32)
    want[6:, 4:8] = x[6:]
    np.testing.assert_array_equal(got, want)


def test_masked_store_is_out_of_bounds_only_where_the_mask_is_set():
    x = np.random.default_rng(6).standard_normal((16, 4, 128)).astype(np.float32)
    # From row 4 on, rows 12..15 of the view lie beyond the ref's 16 rows: fine masked off ...
    got = _interpret(_masked_store, 4, 2, 12, jnp.asarray(x))
    want = np.zeros((16, 8, 128), np.float32)
    want[6:16, 4:8] = x[2:12]
    np.testing.assert_array_equal(got, want)
    # ... refused when one of them is masked in.
    with pytest.raises(Exception, match="Out-of-bounds masked swap"):
        _interpret(_masked_store, 4, 2, 13, jnp.asarray(x))


# ---------------------------------------------------------------- without the shims

PRISTINE = """
import sys
sys.path.insert(0, {test_dir!r})
import jax, jax.numpy as jnp, numpy as np
from jax.experimental.pallas import tpu as pltpu
import test_jax_compat as t
for name, fn, args in [
        ("read", t._strided_kv_read, (jnp.zeros((2, 4, 8, 128), jnp.bfloat16),)),
        ("store", t._masked_store, (0, 6, 16, jnp.zeros((16, 4, 128), jnp.float32)))]:
    try:
        with pltpu.force_tpu_interpret_mode(t.PARAMS):
            jax.block_until_ready(fn(*args))
        print(name, "ok")
    except Exception as e:
        print(name, type(e).__name__, " ".join(str(e).split()))
    pltpu.reset_tpu_interpret_mode_state()
"""


def test_pristine_jax_fails_both_patterns():
    # The reason the shims exist; when a JAX release passes here, drop them.
    test_dir = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT / "tpu_nodes" / "worker"), test_dir]), JAX_PLATFORMS="cpu")
    run = subprocess.run([sys.executable, "-c", PRISTINE.format(test_dir=test_dir)],
                         capture_output=True, text=True, timeout=300, env=env)
    lines = dict(line.split(" ", 1) for line in run.stdout.splitlines() if " " in line)
    assert "'ReshapeTransform' object has no attribute 'indices'" in lines.get("read", ""), run
    assert "Out-of-bounds masked swap" in lines.get("store", ""), run


# ---------------------------------------------------------------- the expert kernel

SPEC = ROOT / "bench" / "specs" / "operators" / "ragged_paged_attention.yaml"
BASELINE = SPEC.parent / "baselines" / "ragged_paged_attention.py"
# Each edit of the wrapper must make it fail; the spec's tolerance is atol 2^-8, rtol 1e-2, so
# an output scaled by 1.01 would sit within rtol: 1.05 is the smallest round scale beyond it.
BROKEN = {
    "output x 1.05": ("    return rpa.ragged_paged_attention(",
                      "    return 1.05 * rpa.ragged_paged_attention("),
    "softmax scale x 1.1": ("sm_scale=1.0 / math.sqrt(q.shape[-1]),",
                            "sm_scale=1.1 / math.sqrt(q.shape[-1]),"),
}


@pytest.mark.skipif(not BIN.exists(), reason="maxkernel is not built")
@pytest.mark.parametrize("edit", list(BROKEN))
def test_a_broken_copy_of_the_ragged_baseline_fails_check(edit, tmp_path):
    old, new = BROKEN[edit]
    source = BASELINE.read_text()
    assert source.count(old) == 1, f"the baseline no longer contains {old!r}"
    kernel = tmp_path / "broken_ragged_paged_attention.py"
    kernel.write_text(source.replace(old, new))
    run = subprocess.run([str(BIN), "check", str(SPEC), str(kernel), "--no-store", "--json", "-"],
                         capture_output=True, text=True, timeout=900)
    result = json.loads(run.stdout)
    phases = {p["phase"]: p for p in result["phases"]}
    assert run.returncode != 0 and not result["correct"], run.stderr[-2000:]
    assert phases["lower"]["status"] == "ok"
    assert phases["test"]["status"] == "failed"
    assert phases["test"]["error_class"] == "mismatch", phases["test"]
    failed = [c for c in result["test"]["cases"] if not c["passed"]]
    assert failed and "beyond atol" in failed[0]["message"]
