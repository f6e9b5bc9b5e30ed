"""Measured time of a candidate on a real TPU: warmup, then N timed runs, median and p95.

Each run is the wall time from dispatch to block_until_ready of the compiled workload on
device-resident inputs; on a TPU that is the device time plus a few microseconds of
dispatch, which is why the C++ side labels the figure `measured`, never `modeled`.
The harness itself (measure) runs on any backend so that its logic is tested on the CPU;
time_candidate refuses to answer without a TPU.
"""

import time

import jax
import numpy as np

from .errors import WorkerError


def platform() -> str:
    return jax.devices()[0].platform


def measure(fn, args: list, static_argnums: tuple, runs: int, warmup: int,
            clock=time.perf_counter) -> dict:
    """Runs jit(fn) warmup times untimed, then runs times; returns a Profile dict (times in
    microseconds) with timing=measured, timeUs = median, notes with p95/min/max."""
    if runs < 1:
        raise WorkerError("badInput", f"timeRuns must be at least 1, got {runs}")
    compiled = jax.jit(fn, static_argnums=static_argnums)
    device_args = [jax.device_put(a) if hasattr(a, "shape") else a for a in args]
    device_args = jax.block_until_ready(device_args)
    compile_start = clock()
    jax.block_until_ready(compiled(*device_args))   # compiles; never timed
    compile_s = clock() - compile_start
    for _ in range(max(warmup, 0)):
        jax.block_until_ready(compiled(*device_args))
    times = []
    for _ in range(runs):
        start = clock()
        jax.block_until_ready(compiled(*device_args))
        times.append((clock() - start) * 1e6)
    median = float(np.median(times))
    p95 = float(np.percentile(times, 95))
    return {
        "timing": "measured",
        "timeUs": median,
        "runs": times,
        "notes": [f"median of {runs} runs after {warmup} warmup runs: {median:.3f} us; "
                  f"p95 {p95:.3f} us, min {min(times):.3f} us, max {max(times):.3f} us",
                  f"first call (compile + run) {compile_s * 1e3:.1f} ms; wall time to "
                  f"block_until_ready on {platform()}"],
    }


def time_candidate(fn, args: list, static_argnums: tuple, runs: int, warmup: int,
                   chip: str = "", require_tpu: bool = True) -> dict:
    """Profile dict of the candidate on this worker's TPU. Raises WorkerError badInput when
    the worker has no TPU (the request was sent to the wrong backend)."""
    if require_tpu and platform() != "tpu":
        raise WorkerError("badInput", f"no TPU is present on this worker (JAX platform "
                                      f"{platform()}): measured timing needs the jax-tpu backend")
    profile = measure(fn, args, static_argnums, runs, warmup)
    profile["chip"] = chip or getattr(jax.devices()[0], "device_kind", "")
    return profile
