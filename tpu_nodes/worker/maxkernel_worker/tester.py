"""Correctness: the candidate in TPU interpret mode against the reference, on fresh inputs.

Hardening against reward hacking (all in-process, so defence in depth behind the sandbox;
arbitrary Python in the same process can always dig deeper):
  - while candidate code runs (guard()), executing any code of the task's reference files,
    opening them, importing the task's modules, walking the heap (gc), or removing the trace
    hook is recorded as rewardHack; sockets and subprocesses as sandboxViolation. A frame
    hook (sys.settrace) sees the reference's code whatever path the candidate took to it;
    when the reference is jitted, jax.clear_caches() before each run makes it re-execute
    its Python (a cache hit would run no Python at all).
  - the reference runs after the candidate on each case, so its answer for the current
    inputs does not exist while the candidate runs;
  - several seeds: a constant answer, or one replayed from an earlier case, fails (a replay
    of an answer that passed earlier is reported as rewardHack);
  - a degenerate reference (outputs barely change between seeds) adds cases on inputs
    redrawn from N(0,1);
  - patches to jax / numpy module attributes are detected, undone and reported.
"""

import contextlib
import ctypes
import errno
import gc
import hashlib
import os
import resource
import socket
import sys
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas import tpu as pltpu

from . import candidate as candidate_mod
from . import generators
from .errors import WorkerError
from .sandbox import CpuLimitExceeded, denial_message

DEFAULT_SEEDS = (0, 1, 2)
DEGENERATE_CHANGE = 1e-6
# A mismatch against the reference is re-judged against a float64 evaluation of it (the
# "truth"), as PyTorch's accuracy checks do with their fp64 reference: elements beyond the
# tolerance pass when the candidate is within the tolerance plus WIDE_MULTIPLIER times the
# reference's own rounding error of the truth. A bf16 value rounded the other way before a
# norm, or cancellation in a layer norm over values scaled x1000, is then not a failure; a
# wrong kernel still is. Only mismatches of at most WIDE_MAX_BAD_FRACTION of an output's
# elements are re-judged (past that the kernel is wrong whatever the rounding; the float64
# run costs time).
WIDE_MULTIPLIER = 2.0
WIDE_MAX_BAD_FRACTION = 0.01
MAX_MESSAGE = 2000
INTERPRET_PARAMS = pltpu.InterpretParams(uninitialized_memory="nan", out_of_bounds_reads="raise")

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_LIBRARY_DIRS = tuple({os.path.dirname(os.path.dirname(os.path.abspath(m.__file__)))
                       for m in (jax, np, os)})
_TASK_MODULE_PREFIXES = ("maxkernel_task_", "maxkernel_reference")


class RewardHack(BaseException):
    """Raised into candidate code at a forbidden act. BaseException, so that a candidate's
    `except Exception` does not swallow it (the act is recorded anyway)."""


# ---------------------------------------------------------------------------- the guard

class _Guard:
    def __init__(self, files: frozenset, dirs: tuple):
        self.files = files          # code filenames and paths of the task's reference files
        self.dirs = dirs            # task directories: nothing beneath them may be opened
        self.violations: list[tuple[str, str]] = []

    def violate(self, error_class: str, message: str):
        if len(self.violations) < 8:
            self.violations.append((error_class, message))
        raise RewardHack(message) if error_class == "rewardHack" else PermissionError(message)

    def forbidden_path(self, path) -> bool:
        if isinstance(path, int):
            return False
        try:
            real = os.path.realpath(os.fsdecode(path))
        except (TypeError, ValueError):
            return False
        return real in self.files or any(real == d or real.startswith(d + os.sep) for d in self.dirs)


_active: _Guard | None = None

_HEAP_EVENTS = ("gc.get_objects", "gc.get_referrers", "gc.get_referents")
_PROCESS_EVENTS = ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn",
                   "os.fork", "os.forkpty", "pty.spawn")
_NETWORK_EVENTS = ("socket.connect", "socket.bind", "socket.getaddrinfo", "socket.sendto",
                   "socket.gethostbyname", "urllib.Request")
_LIMIT_EVENTS = ("resource.setrlimit", "resource.prlimit")
# libc functions that start processes, open sockets, lift limits or leave the namespaces: a
# candidate reaching them through ctypes bypasses the audit events of os and socket.
_PROCESS_SYMBOLS = frozenset((
    "fork", "vfork", "clone", "clone3", "__clone", "_Fork", "daemon", "system", "popen",
    "posix_spawn", "posix_spawnp", "execve", "execv", "execvp", "execvpe", "execl", "execlp",
    "execle", "fexecve"))
_OTHER_SYMBOLS = frozenset((
    "syscall", "socket", "socketpair", "connect", "bind", "setrlimit", "prlimit", "prlimit64",
    "unshare", "setns", "mount", "ptrace", "process_vm_readv", "process_vm_writev", "kill",
    "signal", "sigaction"))


def _symbol_addresses() -> dict:
    """The addresses of those functions in this process's libc (ctypes.call_function names
    a function by address, e.g. one resolved before the guard and cached on a CDLL)."""
    libc = ctypes.CDLL(None)
    out = {}
    for name in _PROCESS_SYMBOLS | _OTHER_SYMBOLS:
        try:
            out[ctypes.cast(libc[name], ctypes.c_void_p).value] = name
        except (AttributeError, OSError):
            pass
    return out


_SYMBOL_ADDRESSES = _symbol_addresses()


def _ctypes_violation(guard, name) -> None:
    if name in _PROCESS_SYMBOLS:
        guard.violate("sandboxViolation", f"tried to start a process (libc {name} through ctypes)")
    if name in _OTHER_SYMBOLS:
        guard.violate("sandboxViolation", f"tried to call libc {name} through ctypes")


def _audit(event: str, args) -> None:
    guard = _active
    if guard is None:
        return
    if event == "open":
        if args and guard.forbidden_path(args[0]):
            guard.violate("rewardHack", f"opened the task's file {args[0]}")
    elif event == "import":
        name = args[0] if args else ""
        if isinstance(name, str) and name.startswith(_TASK_MODULE_PREFIXES):
            guard.violate("rewardHack", f"imported the task's module {name}")
        if len(args) > 1 and args[1] and guard.forbidden_path(args[1]):
            guard.violate("rewardHack", f"imported the task's file {args[1]}")
    elif event in ("compile", "exec"):
        code = args[0] if args else None
        filename = args[1] if event == "compile" and len(args) > 1 else getattr(code, "co_filename", None)
        if isinstance(filename, str) and filename in guard.files:
            guard.violate("rewardHack", f"compiled the task's file {filename}")
    elif event in _HEAP_EVENTS:
        guard.violate("rewardHack", f"walked the heap ({event}) to reach the harness")
    elif event in ("sys.settrace", "sys.setprofile"):
        guard.violate("rewardHack", f"removed the harness's hook ({event})")
    elif event.startswith(_PROCESS_EVENTS):
        guard.violate("sandboxViolation", f"tried to start a process ({event})")
    elif event in _NETWORK_EVENTS:
        guard.violate("sandboxViolation", f"tried to use the network ({event} {args[1:2]})")
    elif event in _LIMIT_EVENTS:
        guard.violate("sandboxViolation", f"tried to change its resource limits ({event})")
    elif event == "ctypes.dlsym":
        name = args[1] if len(args) > 1 else None
        _ctypes_violation(guard, name.decode() if isinstance(name, bytes) else name)
    elif event == "ctypes.call_function":
        _ctypes_violation(guard, _SYMBOL_ADDRESSES.get(args[0] if args else None))


sys.addaudithook(_audit)


def _trace(frame, event, arg):
    guard = _active
    if guard is not None and frame.f_code.co_filename in guard.files:
        guard.violate("rewardHack", f"called the reference ({frame.f_code.co_name} in "
                                    f"{frame.f_code.co_filename})")
    return None


def _own_code(filename: str) -> bool:
    return filename.startswith(_PACKAGE_DIR) or filename.startswith(_LIBRARY_DIRS)


def _code_files(fn, depth: int = 0) -> set[str]:
    """Filenames of the reference's own code, looking through wrappers (functools.wraps,
    jax.jit, closures of the task's adapters) but never into our package or libraries."""
    if depth > 3 or fn is None:
        return set()
    files = set()
    code = getattr(fn, "__code__", None)
    if code is not None and not _own_code(code.co_filename):
        files.add(code.co_filename)
    for inner in (getattr(fn, "__wrapped__", None), getattr(fn, "func", None)):
        if inner is not None and inner is not fn:
            files |= _code_files(inner, depth + 1)
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:
            continue
        if callable(value) and not isinstance(value, type):
            files |= _code_files(value, depth + 1)
    return files


def _is_jitted(obj) -> bool:
    return callable(obj) and hasattr(obj, "__wrapped__") and hasattr(obj, "lower")


def _jitted_reference(task) -> bool:
    """Whether the reference, or anything in its module, is jax.jit-wrapped: its compiled
    cache would answer a candidate's call without running the reference's Python."""
    for c in range(task.num_configurations):
        try:
            fn = task.reference(c)
        except Exception:
            continue
        pending, seen = [fn], set()
        while pending:
            f = pending.pop()
            if id(f) in seen or len(seen) > 64:
                continue
            seen.add(id(f))
            if _is_jitted(f):
                return True
            inner = getattr(f, "__wrapped__", None)
            if inner is not None:
                pending.append(inner)
            for cell in getattr(f, "__closure__", None) or ():
                try:
                    if callable(cell.cell_contents):
                        pending.append(cell.cell_contents)
                except ValueError:
                    pass
            code = getattr(f, "__code__", None)
            if code is not None and not _own_code(code.co_filename):
                if any(_is_jitted(v) for v in getattr(f, "__globals__", {}).values()):
                    return True
    return False


def forbidden_for(task, spec: dict | None) -> tuple[frozenset, tuple]:
    """(files, dirs) a candidate must not touch: the reference's code and the task's files."""
    files, dirs = set(), []
    for c in range(task.num_configurations):
        try:
            files |= _code_files(task.reference(c))
        except Exception:   # a broken reference is reported by the test itself
            pass
    source = (spec or {}).get("sourcePath", "") or ""
    if source and os.path.isdir(source):
        dirs.append(os.path.realpath(source))
    elif source:
        files.add(os.path.realpath(source))
    files |= {os.path.realpath(f) for f in list(files) if os.path.isabs(f)}
    return frozenset(files), tuple(dirs)


_PATCHABLE = (jax, jnp, jax.lax, jax.random, np, np.random, pltpu)


def _module_snapshot() -> list[dict]:
    import jax.experimental.pallas as pl
    return [dict(vars(m)) for m in _PATCHABLE + (pl,)]


_baseline = None


def _undo_patches() -> list[str]:
    """Names of jax/numpy attributes changed since start; restores them."""
    global _baseline
    import jax.experimental.pallas as pl
    modules = _PATCHABLE + (pl,)
    if _baseline is None:
        _baseline = _module_snapshot()
        return []
    patched = []
    for module, before in zip(modules, _baseline):
        now = vars(module)
        for name, value in before.items():
            if now.get(name, _baseline) is not value:
                patched.append(f"{module.__name__}.{name}")
                setattr(module, name, value)
    return patched


_undo_patches()   # the baseline: taken at import, before any candidate ran


@contextlib.contextmanager
def guard(files: frozenset = frozenset(), dirs: tuple = ()):
    """Runs candidate code with the reference fenced off. On exit, raises WorkerError
    rewardHack / sandboxViolation when the candidate did something forbidden, even when its
    own code caught the exception we raised into it."""
    global _active
    g = _Guard(files, dirs)
    previous = sys.gettrace()
    sys.settrace(_trace)
    threading.settrace(_trace)
    _active = g   # after settrace: setting our own hook is not the candidate removing it
    failure = None
    try:
        yield g
    except RewardHack:
        pass   # recorded in g.violations
    except BaseException as e:   # re-raised below unless a violation explains it
        failure = e
    finally:
        _active = None
        sys.settrace(previous)
        threading.settrace(None)
    patched = _undo_patches()
    if patched:
        g.violations.insert(0, ("rewardHack", "patched " + ", ".join(patched[:5])))
    if g.violations:
        error_class, message = g.violations[0]
        raise WorkerError(error_class, message) from failure
    if failure is not None:
        raise failure


def unguarded(fn, *args, **kwargs):
    """Calls harness code (the task's input generators, which live in the very files the
    guard fences off) from inside a guarded region, e.g. extract's concrete_args."""
    global _active
    saved, _active = _active, None
    try:
        return fn(*args, **kwargs)
    finally:
        _active = saved


# ---------------------------------------------------------------------------- comparison

def _shape_text(args) -> str:
    parts = []
    for a in args:
        if hasattr(a, "shape") and hasattr(a, "dtype"):
            parts.append(f"({','.join(str(int(d)) for d in a.shape)}) {a.dtype}")
        else:
            parts.append(repr(a))
    return ", ".join(parts)


def _digest(leaves) -> str:
    h = hashlib.sha256()
    for x in leaves:
        h.update(str(x.dtype).encode() + str(x.shape).encode())
        h.update(np.ascontiguousarray(x).tobytes())
    return h.hexdigest()


def _to_numpy(tree) -> list:
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(tree)]


def compare(got: list, expected: list, tolerance) -> dict:
    """A TestCase dict (without configuration/seed/kind/reduced/inputShapes) and its failure
    class (None when it passes): |got - expected| <= atol + rtol * |expected| per element."""
    case = {"passed": False, "output": -1, "maxAbsErr": 0.0, "maxRelErr": 0.0,
            "worstIndex": [], "message": ""}
    if len(got) != len(expected):
        case["message"] = f"the reference returns {len(expected)} outputs, the candidate {len(got)}"
        return case, "wrongOutput"
    for k, (g, e) in enumerate(zip(got, expected)):
        if g.shape != e.shape or g.dtype != e.dtype:
            case["output"] = k
            case["message"] = (f"output {k}: expected {e.shape} {e.dtype}, "
                               f"got {g.shape} {g.dtype}")
            return case, "wrongOutput"
    worst = None   # (excess, output, index, failure class)
    with np.errstate(invalid="ignore", over="ignore"):   # inf - inf where both are infinite
        return _compare_values(case, got, expected, tolerance)


def _compare_values(case, got, expected, tolerance):
    worst = None
    for k, (g, e) in enumerate(zip(got, expected)):
        atol, rtol = tolerance(k)
        a = g.astype(np.float32)
        b = e.astype(np.float32)
        if a.size == 0:
            continue
        finite_b = np.isfinite(b)
        non_finite = ~np.isfinite(a) & finite_b
        err = np.abs(a - b)
        both = finite_b & np.isfinite(a)
        err_f = np.where(both, err, 0.0)
        case["maxAbsErr"] = max(case["maxAbsErr"], float(err_f.max()))
        rel = np.where(both & (b != 0), err_f / np.where(b != 0, np.abs(b), 1.0), 0.0)
        case["maxRelErr"] = max(case["maxRelErr"], float(rel.max()))
        if non_finite.any():
            index = np.unravel_index(int(np.argmax(non_finite)), a.shape)
            count = int(non_finite.sum())
            msg = (f"output {k}: {count} of {a.size} elements are NaN/Inf where the reference "
                   f"is finite; first at {tuple(int(i) for i in index)}: got {a[index]}, "
                   f"expected {b[index]}")
            return dict(case, output=k, worstIndex=[int(i) for i in index], message=msg), "nonFinite"
        # Where the reference itself is not finite, the candidate must match it exactly.
        special_bad = ~finite_b & ~((a == b) | (np.isnan(a) & np.isnan(b)))
        excess = np.where(both, err - (atol + rtol * np.abs(b)), 0.0)
        excess = np.where(special_bad, np.inf, excess)
        flat = int(np.argmax(excess))
        index = np.unravel_index(flat, a.shape)
        bad = int((excess > 0).sum())
        if worst is None or excess[index] > worst[0]:
            worst = (float(excess[index]), k, index, bad, atol, rtol, a[index], b[index])
    if worst is None:
        case["passed"] = True
        return case, None
    excess, k, index, bad, atol, rtol, got_v, exp_v = worst
    case.update(output=k, worstIndex=[int(i) for i in index])
    if excess > 0:
        total = got[k].size
        case["message"] = (f"output {k}: {bad} of {total} elements beyond atol={atol:g} "
                           f"rtol={rtol:g}; worst at {tuple(int(i) for i in index)}: got "
                           f"{got_v:g}, expected {exp_v:g}")
        return case, "mismatch"
    case["passed"] = True
    return case, None


def _is_float_array(x) -> bool:
    return hasattr(x, "dtype") and hasattr(x, "shape") and (np.dtype(x.dtype).kind == "f"
                                                             or str(x.dtype) == "bfloat16")


def _widen(x, dtype=np.float64):
    """A float array (any width, bfloat16 included) as a JAX array of `dtype`, converted on
    the device: no wide host copy beside the device's (a MoE's expert weights widened are
    gigabytes). Anything else unchanged. Call under jax.enable_x64 for float64."""
    if _is_float_array(x):
        return jnp.asarray(x).astype(dtype)
    return x


def _only_half_precision_floats(args) -> bool:
    """Whether the float inputs are all 16-bit (bfloat16, float16): a float32 evaluation is
    then a truth far finer than their rounding (2^-24 against 2^-8 for bfloat16)."""
    floats = [a for a in args if _is_float_array(a)]
    return bool(floats) and all(np.dtype(a.dtype).itemsize == 2 for a in floats)


class RejudgeUnfit(MemoryError):
    """The wider evaluation of the reference a re-judge needs did not fit in memory at any
    width tried ("float64", or "float64 and float32")."""

    def __init__(self, widths: str):
        plural = "s" if " and " in widths else ""
        super().__init__(f"the {widths} re-judge{plural} did not fit in memory")
        self.widths = widths


def _rejudge_run(run):
    """`run()`'s value, or None when the reference cannot run this way (it only runs at its
    own dtypes: no truth to judge by). Out of memory (a MemoryError, or XLA's "Out of
    memory allocating" error) is not that: what this process holds is freed and `run` tried
    once more; out of memory again raises MemoryError, so the verdict says the re-judge did
    not fit instead of depending silently on the worker's memory at the time."""
    for attempt in (1, 2):
        try:
            return run()
        except Exception as e:
            if not (isinstance(e, MemoryError) or _out_of_memory(str(e))):
                return None
            if attempt == 2:
                raise MemoryError(_short(e)) from e
            gc.collect()
            jax.clear_caches()
    return None


def _cannot_fit_widened(args, dtype) -> bool:
    """Whether this process's data limit is below three times the float inputs widened to
    `dtype` (the widened inputs, and as much again twice for the reference's work and what
    this process already holds): the attempt and its retry would each allocate gigabytes
    only to fail."""
    soft, _ = resource.getrlimit(resource.RLIMIT_DATA)
    if soft == resource.RLIM_INFINITY:
        return False
    itemsize = np.dtype(dtype).itemsize
    wide = sum(int(np.prod(a.shape)) * itemsize for a in args if _is_float_array(a))
    return 3 * wide > soft


def _reference_in_float64(task, configuration, args, expected,
                          dtype=np.float64) -> list | None:
    """The reference's outputs with its float inputs widened to float64 (or `dtype`) and
    JAX's 64-bit mode on for float64, or None when it fails or its outputs do not line up
    with `expected`. Casts the reference spells out (.astype(jnp.bfloat16)) stay; those it
    derives from an input's dtype widen with it. Raises MemoryError when it does not fit
    (_rejudge_run)."""
    def run():
        with jax.enable_x64(dtype == np.float64):
            out = jax.block_until_ready(
                task.reference(configuration)(*[_widen(a, dtype) for a in args]))
            return [np.asarray(x) for x in jax.tree_util.tree_leaves(out)]

    truth = _rejudge_run(run)
    if truth is None:
        return None
    if len(truth) != len(expected) or any(t.shape != e.shape for t, e in zip(truth, expected)):
        return None
    return truth


def _rounding_spread(task, configuration, args, truth) -> list | None:
    """Per output, |reference(inputs moved by one float32 ulp) - truth|: how far an equally
    valid float32 evaluation (another summation order) may land from the truth where the
    output is ill-conditioned (a softmax over logits ~1e6, where one ulp of a logit is ~0.1);
    None when the reference fails. Only float32/float64 inputs move (a bf16 input is exact
    for the kernel too); the moves are random signs drawn with a fixed seed."""
    rng = np.random.default_rng(0)
    moved = []
    for a in args:
        if hasattr(a, "dtype") and hasattr(a, "shape") and str(a.dtype) in ("float32", "float64"):
            x = np.asarray(a)
            u = rng.choice(np.array([-1.0, 1.0]), size=x.shape)
            moved.append((x.astype(np.float64) * (1.0 + u * 2.0 ** -23)).astype(x.dtype))
        else:
            moved.append(a)
    def run():
        out = jax.block_until_ready(task.reference(configuration)(*moved))
        return [np.asarray(x) for x in jax.tree_util.tree_leaves(out)]

    leaves = _rejudge_run(run)
    if leaves is None:
        return None
    if len(leaves) != len(truth) or any(o.shape != t.shape for o, t in zip(leaves, truth)):
        return None
    with np.errstate(invalid="ignore", over="ignore"):
        return [np.abs(o.astype(np.float64) - t.astype(np.float64)) for o, t in zip(leaves, truth)]


def within_reference_error(got: list, expected: list, truth: list, tolerance,
                           spread: list | None = None) -> tuple[bool, int]:
    """(passes, elements rescued): every element within atol + rtol*|expected| of the
    reference, or (all finite) within atol + rtol*|truth| + WIDE_MULTIPLIER*noise of the
    float64 truth, noise being the largest of |expected - truth| there, its RMS over the
    output and (when given) the reference's own spread there under input rounding
    (_rounding_spread)."""
    from .generators import is_float_dtype
    rescued = 0
    for k, (g, e, t) in enumerate(zip(got, expected, truth)):
        if g.size == 0:
            continue
        atol, rtol = tolerance(k)
        a, b, x = g.astype(np.float64), e.astype(np.float64), t.astype(np.float64)
        with np.errstate(invalid="ignore", over="ignore"):
            ok = (np.abs(a - b) <= atol + rtol * np.abs(b)) | (a == b) | (np.isnan(a) & np.isnan(b))
            strict = int(ok.sum())
            if is_float_dtype(e.dtype):   # integer outputs (indices) get no allowance
                finite = np.isfinite(a) & np.isfinite(b) & np.isfinite(x)
                ref_err = np.where(finite, np.abs(b - x), 0.0)
                # The reference's error at one element can be small by chance where the
                # output is ill-conditioned everywhere (softmax of logits ~1e6): its RMS
                # over the output is the floor of the noise a reordering may show.
                noise = np.maximum(ref_err, float(np.sqrt(np.mean(ref_err * ref_err))))
                if spread is not None and spread[k] is not None:
                    noise = np.maximum(noise, np.where(finite & np.isfinite(spread[k]),
                                                       spread[k], 0.0))
                ok |= finite & (np.abs(a - x) <= atol + rtol * np.abs(x) + WIDE_MULTIPLIER * noise)
        if not np.all(ok):
            return False, 0
        rescued += g.size - strict
    return True, rescued


def _rejudge_in_float64(task, configuration, args, got, expected) -> str:
    """A note when a mismatch is within the reference's own rounding error (see
    WIDE_MULTIPLIER), "" when it is not (or the float64 reference cannot say)."""
    for k, (g, e) in enumerate(zip(got, expected)):
        atol, rtol = task.tolerance(k)
        with np.errstate(invalid="ignore", over="ignore"):
            a, b = g.astype(np.float64), e.astype(np.float64)
            bad = int((~((np.abs(a - b) <= atol + rtol * np.abs(b)) | (a == b))).sum())
        if bad > max(1, WIDE_MAX_BAD_FRACTION * g.size):
            return ""
    # Inputs of 16 bits have a truth in float32 too, in half the memory (a MoE's expert
    # weights at their test size, widened to float64, are several GiB); for them a width
    # whose widened inputs cannot fit is not even tried.
    half = _only_half_precision_floats(args)
    tried = []
    for dtype in (np.float64, np.float32) if half else (np.float64,):
        width = np.dtype(dtype).name
        tried.append(width)
        if half and _cannot_fit_widened(args, dtype):
            continue
        try:
            truth = _reference_in_float64(task, configuration, args, expected, dtype)
            break
        except MemoryError:
            continue
    else:
        raise RejudgeUnfit(" and ".join(tried))
    if truth is None:
        return ""
    ok, rescued = within_reference_error(got, expected, truth, task.tolerance)
    how = f"the reference's own error against a {width} evaluation of the reference"
    if not ok:
        spread = _rounding_spread(task, configuration, args, truth)
        if spread is None:
            return ""
        ok, rescued = within_reference_error(got, expected, truth, task.tolerance, spread)
        if not ok:
            return ""
        how = (f"the reference's own spread against a {width} evaluation of the reference "
               "when its float32 inputs move by one ulp")
    return (f"{rescued} element(s) beyond the tolerance against the reference are within it "
            f"plus {WIDE_MULTIPLIER:g}x {how}")


def _constant(leaves: list) -> bool:
    return all(x.size == 0 or bool(np.all(x == x.reshape(-1)[0])) for x in leaves)


def _relative_change(a: list, b: list) -> float:
    num, den = 0.0, 0.0
    for x, y in zip(a, b):
        x = x.astype(np.float64)
        y = y.astype(np.float64)
        if x.shape != y.shape:
            return 1.0   # shapes differ: certainly input-dependent
        finite = np.isfinite(x) & np.isfinite(y)
        if finite.any():
            num = max(num, float(np.abs(x - y)[finite].max()))
            den = max(den, float(np.abs(x)[finite].max()))
    if num == 0.0:
        return 0.0
    return num / den if den > 0 else float("inf")


# ---------------------------------------------------------------------------- running

def _short(exc: BaseException) -> str:
    text = str(exc).strip()
    # JAX's re-raised errors repeat the message with a long traceback note: keep the head.
    text = text.split("\n\nThe preceding stack trace")[0]
    out = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return out[:MAX_MESSAGE]


# A sandbox limit reached: processes (EAGAIN from fork), the private directory's size or the
# file size limit, open files, memory.
_LIMIT_ERRNOS = (errno.EAGAIN, errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EMFILE,
                 errno.ENFILE, errno.ENOMEM)


def _out_of_memory(text: str) -> bool:
    """XLA's CPU runtime reports an allocation past the data segment limit as an error of the
    computation ("Out of memory allocating N bytes"), not as a MemoryError."""
    return "RESOURCE_EXHAUSTED" in text or "Out of memory allocating" in text


def classify_candidate_exception(exc: BaseException, cand, default: str) -> WorkerError:
    """The failure class of an exception raised by candidate code."""
    if isinstance(exc, WorkerError):
        return exc
    where = candidate_mod.innermost_location(exc, cand) if cand is not None else ""
    prefix = f"{where}: " if where else ""
    denied = denial_message(exc)
    if denied or isinstance(exc, socket.gaierror):
        return WorkerError("sandboxViolation", prefix + (denied or _short(exc)))
    if isinstance(exc, (MemoryError, CpuLimitExceeded)) or _out_of_memory(str(exc)):
        return WorkerError("resourceLimit", prefix + _short(exc))
    if isinstance(exc, OSError) and exc.errno in _LIMIT_ERRNOS:
        return WorkerError("resourceLimit", prefix + _short(exc))
    return WorkerError(default, prefix + _short(exc))


def _run_candidate(cand, fn, args, files, dirs, clear_caches: bool):
    """The candidate's outputs as numpy leaves; raises WorkerError on any failure."""
    if clear_caches:
        jax.clear_caches()   # a jitted reference must run its Python again, under the hook
    try:
        with guard(files, dirs):
            try:
                with pltpu.force_tpu_interpret_mode(INTERPRET_PARAMS):
                    out = jax.block_until_ready(fn(*args))
                return _to_numpy(out)
            except (WorkerError, RewardHack):
                raise
            except BaseException as e:   # SystemExit too: a candidate never ends the worker
                if isinstance(e, KeyboardInterrupt):
                    raise
                raise classify_candidate_exception(e, cand, "runtimeError") from e
    except BaseException:
        pltpu.reset_tpu_interpret_mode_state()
        raise


def _run_reference(task, configuration, args, seed, kind) -> list:
    try:
        return _to_numpy(jax.block_until_ready(task.reference(configuration)(*args)))
    except (WorkerError, KeyboardInterrupt):
        raise
    except (Exception, SystemExit) as e:   # sys.exit() in the reference is its failure too
        source = (getattr(task, "spec", None) or {}).get("sourcePath") or f"task {task.name}"
        line = generators.error_line(e, f"{source}: reference")
        at = f" (line {line} of its code)" if line != "?" else ""
        raise WorkerError("badInput", f"{source}: the reference failed{at} on configuration "
                                      f"{configuration}, seed {seed} ({kind} inputs): {_short(e)}") from e


def _blocks_for(cand, task, configuration: int, seed: int, files, dirs):
    """(blocks, why): the candidate's (array shape, block shape) pairs, or None and why not.
    Raises WorkerError on a forbidden act while its structure is traced."""
    from .extract import blocks_of, extract
    static = task.static_argnums(configuration)
    try:
        with guard(files, dirs):
            structure = extract(cand.workload, task.abstract_args(configuration), static,
                                concrete_args=lambda: unguarded(task.prefetch_args, configuration, seed))
        return blocks_of(structure), ""
    except WorkerError as e:
        if e.error_class in ("rewardHack", "sandboxViolation"):
            raise
        return None, f"{e.error_class}: {e.message}"
    except KeyboardInterrupt:
        raise
    except BaseException as e:   # SystemExit too; the test itself will report the candidate
        return None, f"no reduction: {_short(e)}"


def reduction_for(cand, task, configuration: int, seed: int, files, dirs) -> tuple[dict, str]:
    """(sizes, note): a reduced size per original size from the candidate's blocks, or {}."""
    from .reduction import reduced_sizes
    blocks, why = _blocks_for(cand, task, configuration, seed, files, dirs)
    if blocks is None:
        return {}, f"configuration {configuration}: tested at full size ({why})"
    try:
        sizes = reduced_sizes(task, configuration, blocks)
    except WorkerError as e:
        if e.error_class in ("rewardHack", "sandboxViolation"):
            raise
        return {}, f"configuration {configuration}: tested at full size ({e.error_class}: {e.message})"
    except KeyboardInterrupt:
        raise
    except BaseException as e:
        return {}, f"configuration {configuration}: tested at full size (no reduction: {_short(e)})"
    # keys: original sizes, or dim names for native specs
    full = getattr(task, "dims", {})
    sizes = {k: int(v) for k, v in sizes.items() if int(full.get(k, k)) != int(v)}
    if not sizes:
        return {}, f"configuration {configuration}: tested at full size (nothing to reduce)"
    return sizes, f"configuration {configuration}: tested at reduced sizes {_sizes_text(sizes, full)}"


def _sizes_text(sizes: dict, full: dict) -> str:
    return ", ".join(f"{k} {full[k]}->{v}" if k in full else f"{k}->{v}"
                     for k, v in sorted(sizes.items(), key=lambda kv: str(kv[0])))


def ragged_reduction_for(cand, task, configuration: int, seed: int, files, dirs) -> tuple[dict, str, str]:
    """(sizes, note, skip): shapeMode "ragged" sizes (reduction.ragged_sizes) and a note, or
    {} and why the configuration cannot be tested with a partial last block."""
    from .reduction import ragged_sizes
    blocks, why = _blocks_for(cand, task, configuration, seed, files, dirs)
    if blocks is None:
        return {}, "", f"the kernel's blocks are unknown ({why})"
    sizes, ragged, reason = ragged_sizes(task, configuration, blocks)
    if not ragged:
        return {}, "", reason
    full = getattr(task, "dims", {})
    return sizes, (f"configuration {configuration}: ragged sizes {_sizes_text(sizes, full)}; "
                   f"partial last blocks: {', '.join(ragged)}"), ""


class Skipped:
    """run_tests' answer when no case could be checked (every one was skipped): the test
    phase is then reported as skipped with `message`, neither passed nor failed."""

    error_class = "none"

    def __init__(self, message: str):
        self.message = message


SHAPE_MODES = ("", "ragged")


def _modes(options: dict) -> tuple[str, float, str]:
    """(valueMode, valueScale, shapeMode) of EvalOptions; badInput when unknown."""
    from .generators import VALUE_MODES
    value_mode = str(options.get("valueMode") or "")
    shape_mode = str(options.get("shapeMode") or "")
    scale = float(options.get("valueScale") or 0.0)
    if value_mode not in VALUE_MODES:
        raise WorkerError("badInput", f"options.valueMode {value_mode!r} is not one of "
                                      f"{', '.join(repr(m) for m in VALUE_MODES)}")
    if shape_mode not in SHAPE_MODES:
        raise WorkerError("badInput", f"options.shapeMode {shape_mode!r} is not one of "
                                      f"{', '.join(repr(m) for m in SHAPE_MODES)}")
    if not np.isfinite(scale) or scale < 0:
        raise WorkerError("badInput", f"options.valueScale {scale!r} must be a finite number >= 0")
    if shape_mode == "ragged" and options.get("full"):
        raise WorkerError("badInput", "options.shapeMode 'ragged' tests at reduced sizes; it "
                                      "cannot be combined with options.full")
    return value_mode, scale, shape_mode


def _degenerate_output(leaves: list) -> bool:
    """Every output with more than one element holds one value (and some output has more)."""
    big = [x for x in leaves if x.size > 1]
    return bool(big) and _constant(big)


def reference_disallows(expected: list, value_mode: str) -> str:
    """Why the reference's output on adversarial inputs cannot judge a kernel ("" when it
    can): not finite anywhere (overflow, 0/0), or degenerate ("large" and "sparse": one
    value everywhere, which a constant kernel would match; "zeros" expects exactly that)."""
    bad, total = 0, 0
    for x in expected:
        with np.errstate(invalid="ignore", over="ignore"):
            finite = np.isfinite(x.astype(np.float32)) if x.dtype.kind in "fc" or x.dtype.name == "bfloat16" \
                else np.ones(x.shape, bool)
        bad += int(x.size - finite.sum())
        total += int(x.size)
    if bad:
        return (f"the reference's output is not finite on {value_mode} inputs ({bad} of {total} "
                f"elements are NaN or Inf)")
    if value_mode in ("large", "sparse") and _degenerate_output(expected):
        value = next(x for x in expected if x.size > 1).reshape(-1)[0]
        return f"the reference's output is degenerate on {value_mode} inputs (every element is {value})"
    return ""


def _adversarial_reference(task, c, args, seed, kind, value_mode) -> tuple[list | None, str]:
    """(expected, skip): the reference on adversarial inputs, or None and why it disallows them."""
    try:
        expected = _run_reference(task, c, args, seed, kind)
    except WorkerError as e:
        if e.error_class != "badInput":
            raise
        return None, f"the reference fails on {value_mode} inputs ({e.message})"
    return expected, reference_disallows(expected, value_mode)


def run_tests(cand, task, spec: dict | None, options: dict) -> tuple[dict, WorkerError | Skipped | None]:
    """TestReport dict and the failure (None when every case passes, Skipped when no case
    could be checked).

    options: EvalOptions dict (seeds, full, valueMode, valueScale, shapeMode). Raises
    WorkerError badInput when the task itself fails (its inputs or reference), which is not
    the candidate's fault, or when the options are invalid. With a valueMode, a case whose
    reference output is not finite or degenerate (reference_disallows) is skipped with its
    reason in the notes; with shapeMode "ragged", a configuration no dim of which can take a
    partial last block is skipped likewise.
    """
    value_mode, scale, shape_mode = _modes(options)
    seeds = [int(s) for s in (options.get("seeds") or [])] or list(DEFAULT_SEEDS)
    full = bool(options.get("full", False))
    files, dirs = forbidden_for(task, spec)
    clear = _jitted_reference(task)
    report = {"cases": [], "degenerateReference": False, "notes": []}
    failure = None
    skipped = []   # reasons, one per skipped case or configuration
    kind_of_mode = "+".join(m for m in (shape_mode, value_mode) if m) or "fresh"
    for c in range(task.num_configurations):
        # Called eagerly, as a harness would: a workload that keeps Python state between
        # calls (a replayed answer) is caught by its outputs, not hidden inside a jit trace.
        fn = cand.workload
        sizes = {}
        if not full:
            try:
                if shape_mode == "ragged":
                    sizes, note, skip = ragged_reduction_for(cand, task, c, seeds[0], files, dirs)
                    if skip:
                        why = f"configuration {c} ({kind_of_mode}): skipped: {skip}"
                        report["notes"].append(why)
                        skipped.append(why)
                        continue
                else:
                    sizes, note = reduction_for(cand, task, c, seeds[0], files, dirs)
            except WorkerError as e:   # a forbidden act while its structure was traced
                report["notes"].append(f"configuration {c}: {e.error_class} while tracing "
                                       f"the kernel: {e.message}")
                failure = WorkerError(e.error_class, f"configuration {c}: {e.message}")
                break
            report["notes"].append(note)
        # Redrawing from N(0,1) would undo a value mode; such cases judge the reference on
        # each case instead (reference_disallows).
        degenerate = bool(getattr(task, "degenerate", False)) and not value_mode
        plan = [(s, kind_of_mode, False) for s in seeds]
        redrawn = "ragged+redrawn-normal" if shape_mode else "redrawn-normal"
        if degenerate:
            report["degenerateReference"] = True
            plan += [(s, redrawn, True) for s in seeds]
        structural = task.structural(c) if value_mode else []
        seen = []   # (candidate digest, reference digest, passed, case number)
        fresh_refs = []
        i = 0
        while i < len(plan):
            seed, kind, redraw = plan[i]
            i += 1
            args = task.make_args(c, seed, sizes or None, redraw_normal=redraw)
            if value_mode:
                from .generators import apply_value_mode
                args = apply_value_mode(args, value_mode, scale, seed, structural)
            case = {"configuration": c, "seed": seed, "kind": kind, "reduced": bool(sizes),
                    "inputShapes": _shape_text(args)}
            try:
                got = _run_candidate(cand, fn, args, files, dirs, clear)
            except WorkerError as e:
                if value_mode and e.error_class not in ("rewardHack", "sandboxViolation"):
                    # Inputs the reference does not allow judge no kernel, however it fails.
                    _, skip = _adversarial_reference(task, c, args, seed, kind, value_mode)
                    if skip:
                        why = f"configuration {c}, seed {seed} ({kind}): skipped: {skip}"
                        report["notes"].append(why)
                        skipped.append(why)
                        continue
                report["cases"].append(dict(case, passed=False, output=-1, maxAbsErr=0.0,
                                            maxRelErr=0.0, worstIndex=[], message=e.message))
                failure = e
                break
            if value_mode:
                expected, skip = _adversarial_reference(task, c, args, seed, kind, value_mode)
                if skip:
                    why = f"configuration {c}, seed {seed} ({kind}): skipped: {skip}"
                    report["notes"].append(why)
                    skipped.append(why)
                    continue
            else:
                expected = _run_reference(task, c, args, seed, kind)
            result, error_class = compare(got, expected, task.tolerance)
            if error_class == "mismatch":
                try:
                    note = _rejudge_in_float64(task, c, args, got, expected)
                except MemoryError as e:
                    # A float64 reference too large for the worker's memory limit cannot say:
                    # the mismatch stands, and the candidate's failure is a mismatch, not a
                    # crash of the harness; its message says the re-judge could not run.
                    note = ""
                    unfit = (str(e) if isinstance(e, RejudgeUnfit)
                             else "the float64 re-judge did not fit in memory")
                    result = dict(result, message=f"{result['message']}; {unfit}")
                    report["notes"].append(f"configuration {c}, seed {seed} ({kind}): {unfit}")
                if note:
                    result = dict(result, passed=True, message=note)
                    error_class = None
                    report["notes"].append(f"configuration {c}, seed {seed} ({kind}): {note}")
            cand_digest, ref_digest = _digest(got), _digest(expected)
            for earlier_digest, earlier_ref, earlier_passed, number in seen:
                if earlier_digest == cand_digest and earlier_ref != ref_digest and error_class:
                    # A non-constant answer repeated for other inputs is a replay; a constant
                    # one (all zeros) is just wrong.
                    if earlier_passed and not _constant(got):
                        error_class = "rewardHack"
                        result["message"] = (f"replays the answer of case {number} on different "
                                             f"inputs; " + result["message"])
                    else:
                        result["message"] += f"; identical to the output of case {number}"
                    break
            seen.append((cand_digest, ref_digest, error_class is None, len(report["cases"])))
            report["cases"].append(dict(case, **result))
            if not redraw:
                fresh_refs.append(expected)
            if not redraw and len(fresh_refs) == 2 and not degenerate and not value_mode:
                change = _relative_change(fresh_refs[0], fresh_refs[1])
                if change < DEGENERATE_CHANGE:
                    degenerate = True
                    report["degenerateReference"] = True
                    report["notes"].append(
                        f"configuration {c}: the reference's outputs barely change between seeds "
                        f"(relative change {change:.2g}); also testing on inputs redrawn from N(0,1)")
                    plan += [(s, redrawn, True) for s in seeds]
            if error_class:
                failure = WorkerError(error_class, f"configuration {c}, seed {seed} ({kind}"
                                                   f"{', reduced' if sizes else ''}): {result['message']}")
                break
        if failure:
            if c + 1 < task.num_configurations:
                report["notes"].append(f"configurations {c + 1}.. not tested after the failure")
            break
    if failure is None and not report["cases"] and skipped:
        failure = Skipped(f"every case was skipped; {skipped[0]}"
                          + (f" (and {len(skipped) - 1} more)" if len(skipped) > 1 else ""))
    return report, failure
