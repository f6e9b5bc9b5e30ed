"""The timing harness: its logic on the CPU backend; real device time only on a TPU."""

import itertools

import jax
import jax.numpy as jnp
import pytest

from maxkernel_worker import timing
from maxkernel_worker.errors import WorkerError


def test_harness_warms_up_then_reports_the_median_of_the_runs():
    calls = []

    def fn(x, scale):
        calls.append(scale)   # Python runs only while tracing
        return x * scale
    # A scripted clock makes the figures exact: the runs take 1, 2, 3, 1, 2 ... us.
    ticks = itertools.count()
    durations = itertools.cycle([1, 2, 3])
    now = [0.0]

    def clock():
        if next(ticks) % 2 == 0:
            return now[0]
        now[0] += next(durations) * 1e-6
        return now[0]
    profile = timing.measure(fn, [jnp.ones((8, 128)), 2], (1,), runs=5, warmup=2, clock=clock)
    assert profile["timing"] == "measured"
    assert len(profile["runs"]) == 5
    assert profile["timeUs"] == pytest.approx(sorted(profile["runs"])[2])
    assert len(calls) == 1   # traced once: warmup and timed runs reuse the compiled program
    assert "median of 5 runs after 2 warmup runs" in profile["notes"][0]


def test_harness_times_real_runs_on_cpu():
    profile = timing.measure(lambda x: x @ x, [jnp.ones((128, 128))], (), runs=3, warmup=1)
    assert all(t > 0 for t in profile["runs"]) and profile["timeUs"] > 0


def test_refuses_without_a_tpu():
    if timing.platform() == "tpu":
        pytest.skip("a TPU is present")
    with pytest.raises(WorkerError) as info:
        timing.time_candidate(lambda x: x, [jnp.ones(4)], (), runs=3, warmup=1)
    assert "no TPU" in info.value.message


def test_zero_runs_is_bad_input():
    with pytest.raises(WorkerError) as info:
        timing.measure(lambda x: x, [jnp.ones(4)], (), runs=0, warmup=0)
    assert info.value.error_class == "badInput"


@pytest.mark.tpu
def test_measures_on_a_real_tpu():
    assert jax.devices()[0].platform == "tpu"
    x = jnp.ones((1024, 1024), jnp.bfloat16)
    profile = timing.time_candidate(lambda a: a @ a, [x], (), runs=10, warmup=3)
    assert profile["timing"] == "measured" and len(profile["runs"]) == 10
    assert 0 < profile["timeUs"] < 1e6
