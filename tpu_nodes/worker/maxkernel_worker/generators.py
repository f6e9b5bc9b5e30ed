"""Drawing input values: the Generator union of a native spec, and redraws of task-made inputs.

Every draw uses a numpy Generator seeded from (seed, input index), so values are
deterministic in the seed and independent across inputs. Values are drawn in float64 /
int64 and cast to the input's dtype with JAX (numpy cannot hold bfloat16 natively).

A `code` generator is Python source defining `generate(rng, shape, dtype, dims)`:
rng a numpy Generator, shape the (possibly reduced) shape, dtype a numpy/JAX dtype name,
dims a dict name -> size (reduced values when reduced). It returns an array-like.
"""

from __future__ import annotations

import types

import jax
import jax.numpy as jnp
import numpy as np

from .errors import WorkerError


def rng_for(seed: int, index: int) -> np.random.Generator:
    return np.random.default_rng([int(seed) & 0xFFFFFFFF, int(index), 0x6D6B])


def is_float_dtype(dtype) -> bool:
    return jnp.issubdtype(jnp.dtype(dtype), jnp.floating)


def exec_source(source: str, filename: str, module_name: str) -> types.ModuleType:
    """Runs source as a fresh module with jax, jnp and np already bound (task code relies on it)."""
    module = types.ModuleType(module_name)
    module.__file__ = filename
    module.__dict__.update({"jax": jax, "jnp": jnp, "np": np})
    try:
        code = compile(source, filename, "exec")
    except SyntaxError as e:
        raise WorkerError("badInput", f"{filename}:{e.lineno}: syntax error: {e.msg}") from None
    try:
        exec(code, module.__dict__)
    except (Exception, SystemExit) as e:  # the user's module failed at import time
        raise WorkerError("badInput", f"{filename}:{error_line(e, filename)}: "
                                      f"{type(e).__name__}: {e}") from None
    return module


def error_line(exc: BaseException, filename: str) -> str:
    """The innermost line of `filename` in the exception's traceback ("?" when none)."""
    line = "?"
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == filename:
            line = str(tb.tb_lineno)
        tb = tb.tb_next
    if line == "?" and isinstance(exc, SyntaxError) and exc.lineno:
        line = str(exc.lineno)
    return line


_code_modules: dict[str, types.ModuleType] = {}


def _code_generator(source: str, where: str):
    module = _code_modules.get(source)
    if module is None:
        module = exec_source(source, where, "maxkernel_generator")
        if not callable(getattr(module, "generate", None)):
            raise WorkerError("badInput", f"{where}: generator code does not define generate(rng, shape, dtype, dims)")
        _code_modules[source] = module
    return module.generate


def draw(generator: dict, shape: tuple, dtype: str, seed: int, index: int,
         dims: dict | None = None, where: str = "generator"):
    """Values of one input as a jax array. generator: the capnp Generator as a dict."""
    shape = tuple(int(s) for s in shape)
    rng = rng_for(seed, index)
    kind = next(iter(generator)) if generator else "normal"
    params = generator.get(kind) or {}
    if kind == "normal":
        values = rng.normal(params.get("mean", 0.0), params.get("std", 1.0), shape)
    elif kind == "uniform":
        values = rng.uniform(params.get("low", 0.0), params.get("high", 1.0), shape)
    elif kind == "randint":
        low, high = int(params.get("low", 0)), int(params.get("high", 0))
        if high <= low:
            raise WorkerError("badInput", f"{where}: randint needs high > low (got low={low}, high={high})")
        values = rng.integers(low, high, shape)
    elif kind == "zeros":
        values = np.zeros(shape)
    elif kind == "ones":
        values = np.ones(shape)
    elif kind == "code":
        fn = _code_generator(params if isinstance(params, str) else generator["code"], where)
        try:
            values = fn(rng, shape, dtype, dict(dims or {}))
        except (Exception, SystemExit) as e:
            line = error_line(e, where)
            at = f" (line {line} of its code)" if line != "?" else ""
            raise WorkerError("badInput", f"{where}: generate() raised{at} {type(e).__name__}: {e}") from None
        values = jnp.asarray(values)
        if tuple(values.shape) != shape:
            raise WorkerError("badInput", f"{where}: generate() returned shape {tuple(values.shape)}, "
                                          f"expected {shape}")
    else:
        raise WorkerError("badInput", f"{where}: generator '{kind}' cannot draw values here")
    return jnp.asarray(values, dtype=jnp.dtype(dtype))


def redraw_float(shape, dtype, seed: int, index: int, mean: float = 0.0, std: float = 1.0):
    """Fresh float values with the given statistics (std 0 keeps a constant array constant)."""
    rng = rng_for(seed, index)
    values = rng.normal(mean, std, tuple(shape)) if std > 0 else np.full(tuple(shape), mean)
    return jnp.asarray(values, dtype=jnp.dtype(dtype))


# The tester's value modes (EvalOptions.valueMode, agents/tester): applied to the float,
# non-structural array inputs after they are drawn; integer, bool, structural and static
# inputs keep their values, so group sizes and page tables stay consistent.
VALUE_MODES = ("", "large", "zeros", "sparse")
DEFAULT_LARGE_SCALE = 1000.0
_SPARSE_STREAM = 1 << 20          # an rng stream apart from the one that drew the values


def _is_float_array(a) -> bool:
    return hasattr(a, "shape") and hasattr(a, "dtype") and is_float_dtype(a.dtype)


def apply_value_mode(args: list, mode: str, scale: float, seed: int, structural: list) -> list:
    """args with `mode` applied: "large" multiplies by scale (0: DEFAULT_LARGE_SCALE) in
    float32 before casting back (values past the dtype's range become inf, and the reference
    then says whether it allows them), "zeros" zeroes, "sparse" zeroes half of the elements
    (a mask drawn from (seed, input index))."""
    if not mode:
        return list(args)
    scale = float(scale) or DEFAULT_LARGE_SCALE
    out = []
    for index, a in enumerate(args):
        if not _is_float_array(a) or (index < len(structural) and structural[index]):
            out.append(a)
            continue
        dtype = jnp.dtype(a.dtype)
        if mode == "zeros":
            out.append(jnp.zeros(a.shape, dtype))
        elif mode == "large":
            wide = jnp.float64 if dtype.itemsize == 8 else jnp.float32
            out.append((jnp.asarray(a).astype(wide) * scale).astype(dtype))
        elif mode == "sparse":
            keep = rng_for(seed, _SPARSE_STREAM + index).random(tuple(a.shape)) >= 0.5
            out.append(jnp.where(keep, jnp.asarray(a), jnp.zeros((), dtype)).astype(dtype))
        else:
            raise WorkerError("badInput", f"valueMode {mode!r} is not one of "
                                          f"{', '.join(repr(m) for m in VALUE_MODES)}")
    return out
