"""A candidate kernel's source loaded as a fresh Python module."""

import dataclasses
import hashlib
import os
import sys
import traceback
import types
from typing import Callable

from .errors import WorkerError
from .sandbox import denial_message

_cache: dict[str, "LoadedCandidate"] = {}
_MODULE_PREFIX = "maxkernel_candidate_"


@dataclasses.dataclass
class LoadedCandidate:
    id: str
    module: types.ModuleType
    workload: Callable
    path: str


def _field(candidate, name: str, default=""):
    if isinstance(candidate, dict):
        return candidate.get(name, default)
    return getattr(candidate, name)


def _innermost_line(exc: BaseException, path: str) -> str:
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if frame.filename == path:
            return f"{path}:{frame.lineno}"
    return path


def load_candidate(candidate, workdir: str) -> LoadedCandidate:
    """Imports a Candidate (pycapnp reader or dict) once per id.

    The source is written to workdir/candidates/ so that tracebacks, inspect and Pallas's
    source locations name a real file. Raises WorkerError loadError / noWorkload.
    """
    source = _field(candidate, "source")
    cid = _field(candidate, "id") or hashlib.sha256(source.encode()).hexdigest()
    cached = _cache.get(cid)
    if cached is not None:
        return cached
    # A unique module name per candidate: two candidates never share globals or caches.
    digest = hashlib.sha256(cid.encode()).hexdigest()[:16]
    name = f"{_MODULE_PREFIX}{digest}"
    directory = os.path.join(workdir, "candidates")
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"{name}.py")
    with open(path, "w") as f:
        f.write(source)
    try:
        code = compile(source, path, "exec")
    except SyntaxError as e:
        raise WorkerError("loadError", f"{path}:{e.lineno}: SyntaxError: {e.msg}") from None
    module = types.ModuleType(name)
    module.__file__ = path
    sys.modules[name] = module   # dataclasses and pickling look the module up by name
    try:
        exec(code, module.__dict__)
    except BaseException as e:   # SystemExit included: a module must not end the worker
        del sys.modules[name]
        denied = denial_message(e)
        if denied:
            raise WorkerError("sandboxViolation", f"{_innermost_line(e, path)}: {denied}") from e
        raise WorkerError("loadError",
                          f"{_innermost_line(e, path)}: {type(e).__name__}: {e}") from e
    workload = module.__dict__.get("workload")
    if not callable(workload):
        del sys.modules[name]
        what = "does not define workload" if workload is None else "defines workload, but not as a function"
        raise WorkerError("noWorkload", f"{path}: the candidate {what}(*inputs)")
    loaded = LoadedCandidate(cid, module, workload, path)
    _cache[cid] = loaded
    return loaded


def innermost_location(exc: BaseException, candidate: LoadedCandidate) -> str:
    """file:line of the candidate's innermost frame in exc's traceback ("" when none)."""
    location = _innermost_line(exc, candidate.path)
    return "" if location == candidate.path else location


def forget(candidate_id: str) -> None:
    """Drops a cached candidate (one caught doing something forbidden while loading)."""
    loaded = _cache.pop(candidate_id, None)
    if loaded is not None:
        sys.modules.pop(loaded.module.__name__, None)
