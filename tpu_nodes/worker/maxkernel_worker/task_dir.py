"""JAXBench and MaxKernel task directories: reading them into a KernelSpec, and running them.

JAXBench (a directory holding baseline.py): `CONFIG` dict, `create_inputs(dtype=...)` returns the
input tuple (arrays and Python scalars), `workload(*inputs)` is the reference, `get_flops()` is
optional; optimized.py beside it is a hand-tuned kernel (spec.baselinePath). Tolerance: CONFIG's
atol/rtol, else 1e-2 (the JAXBench harness default).

MaxKernel (a directory holding kernel_task.yaml + reference.py): `input_gen_code` defines
`get_inputs()` returning `(dynamic_args, static_args)` or a list of such pairs (one per
configuration); reference.py defines `computation(*dynamic_args, *static_args)`. Both run with
`jax` and `jnp` already in their namespace, as MaxKernel's harness does. atol/rtol are a scalar or
a per-output list; absent, MaxKernel's evaluator default 1e-3 applies.

Loading never allocates full-size inputs: create_inputs / get_inputs and the reference run under
`jax.eval_shape`; Python scalars among the inputs are captured during that trace and become
static inputs. Integer and bool arrays are marked structural (group sizes, page tables, labels).
When the reference is not traceable on abstract integers (data-dependent slicing), it is traced
again with the integer inputs concrete: they are computed under jit with every float output
dropped, so XLA never materializes the big float arrays.

Seeds. The task's own code produces the values; to make the seed matter:
  1. create_inputs/get_inputs taking a `seed` (int) or `key`/`rng`/`prng_key` (a jax key)
     parameter get it;
  2. otherwise jax.random.PRNGKey / jax.random.key, numpy.random.seed / default_rng / RandomState
     are patched for the duration of the call so the key value the task passes is shifted by
     seed * 1000003 (seed 0 reproduces the task's published inputs exactly);
  3. if the call seeded nothing we could patch, every float input is redrawn from a normal with
     the same mean and std as the task's values (constant arrays stay constant) while integer
     and static inputs stay as the task produced them.
So a kernel that replays a constant answer cannot pass two seeds (unless the reference itself
ignores its inputs: see `degenerate`).

Degenerate tasks (the output barely depends on the inputs, e.g. zero weights): load_task_dir
compares the reference's outputs on seeds 0 and 1 when that is cheap (inputs <= 64 MiB and the
reference's XLA cost <= 2 GFLOP) and sets spec.degenerate when they agree within tolerance;
when that is too costly, it sets degenerate when some float input is constant (all elements
equal), measured under jit without keeping the arrays. The tester then tests with
redraw_normal=True.

Reduced sizes (reduction.py) are applied through plans registered on the task: CONFIG overrides
(the source is re-executed with CONFIG's integer literals changed, so structural inputs and
workloads that read CONFIG stay consistent) or a by-value redraw of float inputs.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import json
import math
import os
import re
import types

import jax
import jax.numpy as jnp
import numpy as np
import yaml

from . import generators
from .errors import WorkerError
from .task import Task

MAXKERNEL_DEFAULT_TOL = 1e-3   # MaxKernel's evaluator default (DEFAULT_ATOL / DEFAULT_RTOL)
JAXBENCH_DEFAULT_TOL = 1e-2
_SEED_STRIDE = 1000003
_CHEAP_BYTES = 64 << 20
_CHEAP_FLOPS = 2e9
_STATS_BYTES = 1 << 30
_MAX_SOURCE_BYTES = 4 << 20      # baseline.py, kernel_task.yaml, reference.py
_MAX_YAML_NODES = 100_000         # as the native spec loader: aliases counted as expanded
_MAX_YAML_DEPTH = 64
# What task code may raise that we report as the task's error: SystemExit too (sys.exit() in
# create_inputs must not end the request as an internal error); KeyboardInterrupt stays ours.
_TASK_ERRORS = (Exception, SystemExit)


# ---------------------------------------------------------------- sources with CONFIG overrides

class _Source:
    """A Python source file (or code embedded in YAML) executed as a fresh module.

    `knobs` are the integer entries of a `CONFIG = {...}` dict literal anywhere in the source;
    module(overrides) re-executes the source with those literals replaced.
    """

    def __init__(self, text: str, filename: str, line_offset: int = 0, namespace: dict | None = None):
        self.text, self.filename, self.line_offset = text, filename, line_offset
        self.namespace = namespace or {}
        self._modules: dict = {}
        try:
            self.tree = ast.parse(text, filename)
        except SyntaxError as e:
            raise WorkerError("badInput", f"{filename}:{(e.lineno or 0) + line_offset}: syntax error: {e.msg}") from None
        ast.increment_lineno(self.tree, line_offset)
        self.knobs = {}
        for node in ast.walk(self.tree):
            d = _config_dict(node)
            if d is not None:
                for k, v in zip(d.keys, d.values):
                    if (isinstance(k, ast.Constant) and isinstance(k.value, str) and isinstance(v, ast.Constant)
                            and type(v.value) is int and k.value not in self.knobs):
                        self.knobs[k.value] = v.value

    def module(self, overrides: dict | None = None) -> types.ModuleType:
        key = tuple(sorted((overrides or {}).items()))
        if key in self._modules:
            return self._modules[key]
        tree = self.tree
        if overrides:
            tree = _Override(overrides).visit(ast.parse(self.text, self.filename))
            ast.increment_lineno(tree, self.line_offset)
            ast.fix_missing_locations(tree)
        module = types.ModuleType("maxkernel_task_" + os.path.basename(self.filename).split(".")[0])
        module.__file__ = self.filename
        module.__dict__.update(self.namespace)
        try:
            exec(compile(tree, self.filename, "exec"), module.__dict__)
        except WorkerError:
            raise
        except _TASK_ERRORS as e:
            raise WorkerError("badInput", f"{self.filename}:{generators.error_line(e, self.filename)}: "
                                          f"{type(e).__name__}: {e}") from None
        self._modules[key] = module
        return module

    def function(self, module, name: str, what: str):
        fn = getattr(module, name, None)
        if not callable(fn):
            raise WorkerError("badInput", f"{self.filename}: does not define {name}() ({what})")
        return fn


def _config_dict(node):
    if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict):
        if any(isinstance(t, ast.Name) and t.id == "CONFIG" for t in node.targets):
            return node.value
    return None


class _Override(ast.NodeTransformer):
    def __init__(self, overrides):
        self.overrides = overrides

    def visit_Assign(self, node):
        d = _config_dict(node)
        if d is not None:
            for i, k in enumerate(d.keys):
                if isinstance(k, ast.Constant) and k.value in self.overrides:
                    d.values[i] = ast.copy_location(ast.Constant(self.overrides[k.value]), d.values[i])
        return node


def _call(fn, filename: str, what: str, *args, **kwargs):
    """Calls task code; its exceptions become badInput naming the file and line."""
    try:
        return fn(*args, **kwargs)
    except WorkerError:
        raise
    except MemoryError:
        raise WorkerError("tooLarge", f"{filename}: {what} ran out of memory") from None
    except _TASK_ERRORS as e:
        raise WorkerError("badInput", f"{filename}:{generators.error_line(e, filename)}: {what} raised "
                                      f"{type(e).__name__}: {e}") from None


# ---------------------------------------------------------------- seeds

class _SeedPatch:
    """Shifts the seeds task code passes to jax / numpy RNG constructors; counts the calls."""

    def __init__(self, seed: int):
        self.seed = int(seed)
        self.calls = 0

    def _shift(self, value):
        self.calls += 1
        if self.seed == 0:
            return value
        try:
            return (int(value) + self.seed * _SEED_STRIDE) % (1 << 31)
        except (TypeError, ValueError):   # a traced or array seed: leave it
            return value

    @contextlib.contextmanager
    def active(self):
        saved = [(jax.random, "PRNGKey", jax.random.PRNGKey), (jax.random, "key", jax.random.key),
                 (np.random, "seed", np.random.seed), (np.random, "default_rng", np.random.default_rng),
                 (np.random, "RandomState", np.random.RandomState)]
        patch = self

        def wrap(orig):
            def shifted(seed=None, *a, **kw):
                return orig(patch._shift(seed) if seed is not None else seed, *a, **kw)
            return shifted
        try:
            for mod, name, orig in saved:
                setattr(mod, name, wrap(orig))
            yield self
        finally:
            for mod, name, orig in saved:
                setattr(mod, name, orig)


def _is_array(x) -> bool:
    return isinstance(x, (jax.Array, np.ndarray)) or hasattr(x, "aval")


def _is_structural_dtype(dtype) -> bool:
    dt = jnp.dtype(dtype)
    return jnp.issubdtype(dt, jnp.integer) or dt == jnp.bool_


def _nbytes(x) -> int:
    return int(math.prod(x.shape)) * jnp.dtype(x.dtype).itemsize


def _human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024


# ---------------------------------------------------------------- the two formats

class _Program:
    """The Python side of a task directory: produces configurations and the reference."""

    format = ""
    producer_file = ""
    producer_name = ""

    def configurations(self, overrides=None, seed=0) -> list[list]:
        """All configurations' concrete args (task code run with the seed made to matter)."""
        module = self.producer_module(overrides)
        fn = self.producer(module)
        params = _params(fn)
        kwargs = {}
        if "seed" in params:
            kwargs["seed"] = int(seed)
        else:
            for name in ("key", "rng", "prng_key", "rng_key"):
                if name in params:
                    kwargs[name] = jax.random.PRNGKey(int(seed))
                    break
        patch = _SeedPatch(0 if kwargs else seed)
        with patch.active():
            raw = _call(fn, self.producer_file, f"{self.producer_name}()", **kwargs)
        configs = self.normalize(raw)
        self.last_seeded = bool(kwargs) or patch.calls > 0
        return configs

    def abstract_configurations(self, overrides=None) -> list[list]:
        """Configurations as ShapeDtypeStructs (arrays) and Python values (static scalars)."""
        module = self.producer_module(overrides)
        fn = self.producer(module)
        statics: dict = {}

        def traced():
            configs = self.normalize(fn())
            arrays = []
            for ci, args in enumerate(configs):
                row = []
                for ai, a in enumerate(args):
                    if _is_array(a):
                        row.append(a)
                    else:
                        statics[(ci, ai)] = a
                        row.append(None)
                arrays.append(row)
            return arrays
        try:
            shapes = jax.eval_shape(traced)
        except WorkerError:
            raise
        except (jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError,
                jax.errors.TracerIntegerConversionError, jax.errors.TracerBoolConversionError):
            # numpy-based or data-dependent input code: run it for real (sizes checked after)
            return [[jax.ShapeDtypeStruct(a.shape, a.dtype) if _is_array(a) else a for a in args]
                    for args in self.configurations(overrides)]
        except MemoryError:
            raise WorkerError("tooLarge", f"{self.producer_file}: {self.producer_name}() ran out of memory") from None
        except _TASK_ERRORS as e:
            raise WorkerError("badInput", f"{self.producer_file}:{generators.error_line(e, self.producer_file)}: "
                                          f"{self.producer_name}() raised {type(e).__name__}: {e}") from None
        return [[statics[(ci, ai)] if s is None else jax.ShapeDtypeStruct(s.shape, s.dtype)
                 for ai, s in enumerate(row)] for ci, row in enumerate(shapes)]

    def integer_args(self, configuration: int, overrides=None) -> dict[int, jax.Array]:
        """The integer/bool array args of one configuration, computed under jit without the floats."""
        fn = self.producer(self.producer_module(overrides))
        abstract = self.abstract_configurations(overrides)[configuration]
        wanted = [i for i, a in enumerate(abstract)
                  if isinstance(a, jax.ShapeDtypeStruct) and _is_structural_dtype(a.dtype)]
        if not wanted:
            return {}

        def ints():
            args = self.normalize(fn())[configuration]
            return [args[i] for i in wanted]
        try:
            values = jax.jit(ints)()
        except _TASK_ERRORS:
            values = [self.configurations(overrides)[configuration][i] for i in wanted]
        # numpy, not jax arrays: inside a trace, ops on jax arrays are staged even when concrete
        return {i: np.asarray(v) for i, v in zip(wanted, values)}


def _params(fn) -> set:
    try:
        return set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return set()


class _JaxBench(_Program):
    format = "jaxbench"
    producer_name = "create_inputs"

    def __init__(self, path: str):
        self.dir = path
        self.baseline_path = os.path.join(path, "baseline.py")
        self.producer_file = self.baseline_path
        self.source = _Source(_read(self.baseline_path, path), self.baseline_path)
        module = self.source.module()
        self.source.function(module, "create_inputs", "the inputs")
        self.source.function(module, "workload", "the reference")
        config = getattr(module, "CONFIG", {})
        if not isinstance(config, dict):
            raise WorkerError("badInput", f"{self.baseline_path}: CONFIG must be a dict, got {type(config).__name__}")
        self.config = config

    def producer_module(self, overrides=None):
        return self.source.module(overrides)

    def producer(self, module):
        return self.source.function(module, "create_inputs", "the inputs")

    def reference(self, overrides=None):
        return self.source.function(self.source.module(overrides), "workload", "the reference")

    def reference_file(self):
        return self.baseline_path

    def normalize(self, raw) -> list[list]:
        if not isinstance(raw, (tuple, list)):
            raise WorkerError("badInput", f"{self.baseline_path}: create_inputs() must return a tuple of inputs, "
                                          f"got {_kind(raw)}")
        return [list(raw)]

    def knobs(self):
        return {k: v for k, v in self.source.knobs.items() if k not in ("atol", "rtol")}


class _MaxKernel(_Program):
    format = "maxkernel"
    producer_name = "get_inputs"

    def __init__(self, path: str):
        self.dir = path
        self.yaml_path = os.path.join(path, "kernel_task.yaml")
        self.producer_file = self.yaml_path
        text = _read(self.yaml_path, path)
        try:
            node = yaml.compose(text)
            _check_yaml_size(node, self.yaml_path)
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            line = mark.line + 1 if mark else "?"
            raise WorkerError("badInput", f"{self.yaml_path}:{line}: invalid YAML: "
                                          f"{getattr(e, 'problem', None) or e}") from None
        except RecursionError:
            raise WorkerError("badInput", f"{self.yaml_path}: nested more than {_MAX_YAML_DEPTH} "
                                          f"levels deep; refusing it") from None
        if not isinstance(data, dict) or not isinstance(node, yaml.MappingNode):
            raise WorkerError("badInput", f"{self.yaml_path}:1: expected a mapping with task_id, input_gen_code, ...")
        seen = set()
        for k, _ in node.value:
            key = getattr(k, "value", None)
            if isinstance(key, str) and key in seen:
                raise WorkerError("badInput", f"{self.yaml_path}:{k.start_mark.line + 1}: field {key}: "
                                              f"duplicate key (the file gives it twice)")
            seen.add(key)
        self.data = data
        code = data.get("input_gen_code")
        if not isinstance(code, str) or not code.strip():
            raise WorkerError("badInput", f"{self.yaml_path}: field input_gen_code is missing or not text")
        offset = 0
        for k, v in node.value:
            if k.value == "input_gen_code":
                # block scalars start on the line after the key; others on the key's line
                offset = v.start_mark.line + (1 if v.style in ("|", ">") else 0)
        ns = {"jax": jax, "jnp": jnp}
        self.gen = _Source(code, self.yaml_path, offset, ns)
        self.source = self.gen
        self.gen.function(self.gen.module(), "get_inputs", "field input_gen_code")
        self.reference_path = os.path.join(path, "reference.py")
        self.ref = _Source(_read(self.reference_path, path), self.reference_path, 0, dict(ns))
        self.ref.function(self.ref.module(), "computation", "the reference")

    def producer_module(self, overrides=None):
        return self.gen.module(overrides)

    def producer(self, module):
        return self.gen.function(module, "get_inputs", "field input_gen_code")

    def reference(self, overrides=None):
        return self.ref.function(self.ref.module(), "computation", "the reference")

    def reference_file(self):
        return self.reference_path

    def normalize(self, raw) -> list[list]:
        def is_pair(x):
            return (isinstance(x, (list, tuple)) and len(x) == 2 and isinstance(x[0], (list, tuple))
                    and isinstance(x[1], (list, tuple)))
        if isinstance(raw, (list, tuple)) and raw and all(is_pair(e) for e in raw):
            pairs = list(raw)
        elif is_pair(raw):
            pairs = [raw]
        else:
            raise WorkerError("badInput", f"{self.yaml_path}: input_gen_code: get_inputs() must return "
                                          f"(dynamic_args, static_args) or a list of such pairs, "
                                          f"got {_kind(raw)}")
        return [list(d) + list(s) for d, s in pairs]

    def knobs(self):
        return dict(self.gen.knobs)


def _kind(x) -> str:
    return "an array" if _is_array(x) else type(x).__name__


def _inside(path: str, root: str) -> str:
    """`path` checked to be a regular file inside the task directory `root` (symlinks resolved)."""
    real, top = os.path.realpath(path), os.path.realpath(root)
    if os.path.commonpath([real, top]) != top:
        raise WorkerError("badInput", f"{path}: leads outside the task directory {root} (to {real}); "
                                      f"a task's files must be inside it")
    if not os.path.exists(real):
        raise WorkerError("badInput", f"{path}: file not found")
    if not os.path.isfile(real):
        raise WorkerError("badInput", f"{path}: not a regular file")
    return real


def _read(path: str, root: str) -> str:
    real = _inside(path, root)
    try:
        if os.path.getsize(real) > _MAX_SOURCE_BYTES:
            raise WorkerError("badInput", f"{path}: larger than {_MAX_SOURCE_BYTES >> 20} MiB")
        with open(real, encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError as e:
        line = e.object[:e.start].count(b"\n") + 1
        raise WorkerError("badInput", f"{path}:{line}: invalid UTF-8 (byte 0x{e.object[e.start]:02X}); "
                                      f"the file must be UTF-8") from None
    except OSError as e:
        raise WorkerError("badInput", f"{path}: cannot read: {e.strerror or e}") from None
    if "\0" in text:
        line = text[:text.index("\0")].count("\n") + 1
        raise WorkerError("badInput", f"{path}:{line}: a NUL byte; the file must be text")
    return text


def _check_yaml_size(node, filename: str) -> None:
    """Refuses alias bombs and deep nesting before anything is constructed from the document."""
    sizes: dict = {}

    def size(n, depth):
        if depth > _MAX_YAML_DEPTH:
            raise WorkerError("badInput", f"{filename}:{n.start_mark.line + 1}: nested more than "
                                          f"{_MAX_YAML_DEPTH} levels deep; refusing it")
        if id(n) in sizes:
            return sizes[id(n)]
        sizes[id(n)] = 1   # a cycle (an alias to its own parent) counts once, then stops
        total = 1
        if isinstance(n, yaml.SequenceNode):
            children = n.value
        elif isinstance(n, yaml.MappingNode):
            children = [c for pair in n.value for c in pair]
        else:
            children = []
        for c in children:
            total += size(c, depth + 1)
            if total > _MAX_YAML_NODES:
                raise WorkerError("badInput", f"{filename}:{n.start_mark.line + 1}: the document expands to "
                                              f"more than {_MAX_YAML_NODES} YAML nodes (aliases of aliases?); "
                                              f"refusing it")
        sizes[id(n)] = total
        return total
    if node is not None:
        size(node, 0)


def _program(path: str) -> _Program:
    if not os.path.isdir(path):
        raise WorkerError("badInput", f"{path}: not a directory")
    if os.path.exists(os.path.join(path, "baseline.py")):
        return _JaxBench(path)
    if os.path.exists(os.path.join(path, "kernel_task.yaml")):
        return _MaxKernel(path)
    raise WorkerError("badInput", f"{path}: neither baseline.py (JAXBench) nor kernel_task.yaml (MaxKernel) found")


# ---------------------------------------------------------------- the Task

def _signature(args) -> tuple:
    return tuple((tuple(a.shape), str(a.dtype)) if hasattr(a, "shape") else ("static", repr(a)) for a in args)


class DirTask(Task):
    """A JAXBench or MaxKernel task: its own code makes the values."""

    def __init__(self, spec: dict, program: _Program | None = None):
        super().__init__(spec)
        self.program = program or _program(spec.get("sourcePath", ""))
        self._abstract = self.program.abstract_configurations()
        if len(self._abstract) != self.num_configurations:
            self.num_configurations = len(self._abstract)
        self.plans: dict = {}          # (configuration, frozenset(sizes)) -> ("config", overrides) | ("value", sizes)
        self._variants: dict = {}      # args signature -> CONFIG overrides, for workloads that read CONFIG
        self._stats: dict = {}
        self._last = None

    # -- the contract
    def reference(self, configuration: int):
        self._check_configuration(configuration)
        base = self.program.reference()
        if not self.program.knobs():
            return base
        task = self

        def reference(*args):
            overrides = task._variants.get(_signature(args))
            return task.program.reference(overrides)(*args) if overrides else base(*args)
        reference.__name__ = getattr(base, "__name__", "reference")
        return reference

    def abstract_args(self, configuration: int) -> list:
        self._check_configuration(configuration)
        return list(self._abstract[configuration])

    def config_for_args(self, args) -> dict | None:
        """CONFIG overrides in force for these (reduced) args, None at full size."""
        return self._variants.get(_signature(args))

    def make_args(self, configuration: int, seed: int, sizes: dict | None = None,
                  redraw_normal: bool = False) -> list:
        self._check_configuration(configuration)
        sizes = {int(k): int(v) for k, v in (sizes or {}).items() if int(k) != int(v)}
        plan = ("config", None)
        if sizes:
            plan = self.plans.get((configuration, frozenset(sizes.items())))
            if plan is None:
                from .reduction import plan_for   # reduction builds on this module
                plan = plan_for(self, configuration, sizes)
        if plan[0] == "value":
            args = self._value_args(configuration, seed, plan[1])
        else:
            args = self._task_args(configuration, seed, plan[1])
            if plan[1]:
                self._variants[_signature(args)] = plan[1]
        if redraw_normal:
            args = [generators.redraw_float(a.shape, a.dtype, seed, i)
                    if _is_array(a) and generators.is_float_dtype(a.dtype) else a
                    for i, a in enumerate(args)]
        return args

    # -- helpers
    def _task_args(self, configuration, seed, overrides):
        key = (seed, tuple(sorted((overrides or {}).items())))
        if self._last is not None and self._last[0] == key:
            configs, seeded = self._last[1], self._last[2]
        else:
            self._last = None   # drop the previous arrays before making new ones
            configs = self.program.configurations(overrides, seed)
            seeded = self.program.last_seeded
            self._last = (key, configs, seeded)
        args = list(configs[configuration])
        if not seeded and seed != 0:
            args = [generators.redraw_float(a.shape, a.dtype, seed, i, *_mean_std(a))
                    if _is_array(a) and generators.is_float_dtype(a.dtype) else a
                    for i, a in enumerate(args)]
        return args

    def float_stats(self, configuration: int) -> dict[int, tuple[float, float]]:
        """(mean, std) of each float input of the task's own values, computed under jit."""
        if configuration not in self._stats:
            fn = self.program.producer(self.program.producer_module())
            abstract = self._abstract[configuration]
            idx = [i for i, a in enumerate(abstract)
                   if isinstance(a, jax.ShapeDtypeStruct) and generators.is_float_dtype(a.dtype)]

            def stats():
                args = self.program.normalize(fn())[configuration]
                return [(jnp.mean(args[i].astype(jnp.float32)), jnp.std(args[i].astype(jnp.float32))) for i in idx]
            try:
                values = jax.jit(stats)()
            except _TASK_ERRORS:
                concrete = self.program.configurations()[configuration]
                values = [_mean_std(concrete[i]) for i in idx]
            self._stats[configuration] = {i: (float(m), float(s)) for i, (m, s) in zip(idx, values)}
        return self._stats[configuration]

    def _value_args(self, configuration, seed, sizes):
        stats = self.float_stats(configuration)
        args = []
        for i, a in enumerate(self._abstract[configuration]):
            if isinstance(a, jax.ShapeDtypeStruct):
                shape = tuple(sizes.get(int(s), int(s)) for s in a.shape)
                mean, std = stats.get(i, (0.0, 1.0))
                args.append(generators.redraw_float(shape, a.dtype, seed, i, mean, std))
            elif type(a) is int and a in sizes:
                args.append(sizes[a])      # a static size argument follows its dimension
            else:
                args.append(a)
        return args


def _mean_std(a) -> tuple[float, float]:
    x = jnp.asarray(a, jnp.float32)
    return float(jnp.mean(x)), float(jnp.std(x))


def open_task_dir(spec: dict) -> DirTask:
    return DirTask(spec)


# ---------------------------------------------------------------- load_task_dir

def _default_memory_limit() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2
    except (ValueError, OSError):
        return 8 << 30


def _input_names(fn, count: int) -> list[str]:
    try:
        params = [p for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    if len(params) >= count:
        return [p.name for p in params[:count]]
    return [f"arg{i}" for i in range(count)]


def _outputs(program: _Program, args: list, configuration: int, overrides=None) -> list:
    """The reference's output types ({"shape", "dtype"} dicts) on these abstract args."""
    ref = program.reference(overrides)
    statics = {i: a for i, a in enumerate(args) if not isinstance(a, jax.ShapeDtypeStruct)}
    dyn = [i for i in range(len(args)) if i not in statics]

    def run(*dyn_values, ints=None):
        full = list(args)
        for i, v in zip(dyn, dyn_values):
            full[i] = v
        for i, v in (ints or {}).items():
            full[i] = v
        return ref(*full)
    try:
        out = jax.eval_shape(run, *[args[i] for i in dyn])
    except _TASK_ERRORS as first:
        # data-dependent references: trace again with the integer inputs concrete
        try:
            ints = program.integer_args(configuration, overrides)
            if not ints:
                raise first
            floats = [i for i in dyn if i not in ints]

            def run_floats(*values):
                full = list(args)
                for i, v in zip(floats, values):
                    full[i] = v
                for i, v in ints.items():
                    full[i] = v
                return ref(*full)
            out = jax.eval_shape(run_floats, *[args[i] for i in floats])
        except WorkerError:
            raise
        except _TASK_ERRORS:
            f = program.reference_file()
            raise WorkerError("badInput", f"{f}:{generators.error_line(first, f)}: the reference raised on the "
                                          f"task's input shapes: {type(first).__name__}: {first}") from None
    leaves = jax.tree_util.tree_leaves(out)
    return [{"shape": [int(s) for s in o.shape], "dtype": str(o.dtype)} for o in leaves]


def _tolerances(program: _Program, num_outputs: int) -> list[dict]:
    if isinstance(program, _JaxBench):
        atol = program.config.get("atol", JAXBENCH_DEFAULT_TOL)
        rtol = program.config.get("rtol", JAXBENCH_DEFAULT_TOL)
        where = f"{program.baseline_path}: CONFIG"
    else:
        atol = program.data.get("atol", MAXKERNEL_DEFAULT_TOL)
        rtol = program.data.get("rtol", MAXKERNEL_DEFAULT_TOL)
        where = program.yaml_path

    def number(v, field):
        # Text is read as a number: PyYAML (YAML 1.1) reads `atol: 1e-3` as the string "1e-3".
        # NaN would fail every comparison, infinity pass every one, a negative value none.
        try:
            if isinstance(v, bool) or not isinstance(v, (int, float, str, np.integer, np.floating)):
                raise ValueError
            f = float(v)
        except ValueError:
            raise WorkerError("badInput", f"{where}: field {field} must be a number or a list of numbers, "
                                          f"got {str(v)[:40]!r}") from None
        if not math.isfinite(f) or f < 0:
            raise WorkerError("badInput", f"{where}: field {field} must be finite and non-negative, got {f}")
        return f

    def as_list(value, field):
        if not isinstance(value, (list, tuple)):
            return number(value, field)
        out = [number(v, field) for v in value]
        if len(out) != num_outputs:
            raise WorkerError("badInput", f"{where}: field {field} lists {len(out)} tolerances for "
                                          f"{num_outputs} outputs")
        return out
    a, r = as_list(atol, "atol"), as_list(rtol, "rtol")
    if isinstance(a, float) and isinstance(r, float):
        return [{"output": -1, "atol": a, "rtol": r}]
    return [{"output": i, "atol": a[i] if isinstance(a, list) else a, "rtol": r[i] if isinstance(r, list) else r}
            for i in range(num_outputs)]


def load_task_dir(path: str, memory_limit: int) -> dict:
    """KernelSpec dict for a JAXBench or MaxKernel directory, without allocating full-size inputs."""
    path = os.path.abspath(path)
    program = _program(path)
    limit = int(memory_limit) or _default_memory_limit()
    abstract = program.abstract_configurations()
    if not abstract:
        raise WorkerError("badInput", f"{program.producer_file}: {program.producer_name}() returned no configuration")
    ref = program.reference()
    configurations = []
    for ci, args in enumerate(abstract):
        names = _input_names(ref, len(args))
        arrays = [(i, a) for i, a in enumerate(args) if isinstance(a, jax.ShapeDtypeStruct)]
        total = sum(_nbytes(a) for _, a in arrays)
        if total > limit:
            i, big = max(arrays, key=lambda p: _nbytes(p[1]))
            raise WorkerError("tooLarge", f"{path}: input '{names[i]}' {tuple(big.shape)} {big.dtype} needs "
                                          f"{_human(_nbytes(big))}; the inputs total {_human(total)}, more than "
                                          f"the memory limit {_human(limit)}")
        inputs = []
        for i, a in enumerate(args):
            if isinstance(a, jax.ShapeDtypeStruct):
                inputs.append({"name": names[i], "type": {"shape": [int(s) for s in a.shape], "dtype": str(a.dtype)},
                               "generator": {"task": None}, "structural": _is_structural_dtype(a.dtype)})
            else:
                inputs.append({"name": names[i], "type": {"shape": [], "dtype": ""}, "generator": {"task": None},
                               "isStatic": True, "staticValue": json.dumps(a, default=str)})
        configurations.append({"name": f"config{ci}" if len(abstract) > 1 else "default",
                               "inputs": inputs, "outputs": _outputs(program, args, ci)})
    num_outputs = len(configurations[0]["outputs"])
    spec = {
        "schemaVersion": 1,
        "format": program.format,
        "sourcePath": path,
        "configurations": configurations,
        "tolerances": _tolerances(program, num_outputs),
    }
    if isinstance(program, _JaxBench):
        module = program.source.module()
        spec["name"] = _task_name(program.config.get("name"), path, f"{program.baseline_path}: CONFIG['name']")
        spec["description"] = (module.__doc__ or "").strip()
        spec["referenceEntry"] = "workload"
        spec["reference"] = program.source.text
        spec["configJson"] = json.dumps(program.config, default=str)
        get_flops = getattr(module, "get_flops", None)
        if callable(get_flops):
            flops = _call(get_flops, program.baseline_path, "get_flops()")
            try:
                spec["flops"] = float(flops)
            except (TypeError, ValueError):
                raise WorkerError("badInput", f"{program.baseline_path}: get_flops() must return a number, "
                                              f"got {type(flops).__name__}") from None
        optimized = os.path.join(path, "optimized.py")
        if os.path.lexists(optimized):
            spec["baselinePath"] = _inside(optimized, path)
    else:
        spec["name"] = _task_name(program.data.get("task_id"), path, f"{program.yaml_path}: field task_id")
        spec["description"] = str(program.data.get("description") or "")
        spec["referenceEntry"] = "computation"
        spec["reference"] = program.ref.text
    task = DirTask(spec, program)
    spec["degenerate"] = _degenerate(task)
    return spec


def _task_name(value, path: str, where: str) -> str:
    """The task's name, held to the native spec's rule: it goes into reports and the header
    comment of kernel.py, where a newline would inject code."""
    name = value if value else os.path.basename(path)
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.-]{1,128}", name) or not name.strip("."):
        if not value:   # the directory's own name: keep what is safe of it
            return re.sub(r"[^A-Za-z0-9_.-]", "_", str(name))[:128].strip(".") or "task"
        shown = repr(value)[:60]
        raise WorkerError("badInput", f"{where}: {shown} is not a name of 1-128 of [A-Za-z0-9_.-]")
    return name


def _degenerate(task: DirTask) -> bool:
    for c in range(task.num_configurations):
        args = task.abstract_args(c)
        arrays = [a for a in args if isinstance(a, jax.ShapeDtypeStruct)]
        if not any(generators.is_float_dtype(a.dtype) for a in arrays):
            continue
        total = sum(_nbytes(a) for a in arrays)
        ref = task.program.reference()
        flops = None
        if total <= _CHEAP_BYTES:
            try:
                static = task.static_argnums(c)
                cost = jax.jit(ref, static_argnums=static).lower(*args).cost_analysis()
                cost = cost[0] if isinstance(cost, (list, tuple)) else cost
                flops = float((cost or {}).get("flops", 0.0))
            except _TASK_ERRORS:
                flops = None
        if flops is not None and flops <= _CHEAP_FLOPS:
            try:
                outs = [jax.tree_util.tree_leaves(ref(*task.make_args(c, s))) for s in (0, 1)]
            except _TASK_ERRORS:
                continue   # the tester will find it
            if all(np.allclose(np.asarray(a, np.float32), np.asarray(b, np.float32),
                               atol=task.tolerance(k)[0], rtol=task.tolerance(k)[1], equal_nan=True)
                   for k, (a, b) in enumerate(zip(*outs))):
                return True
            continue
        if total <= _STATS_BYTES:
            try:
                if any(std == 0.0 for _, std in task.float_stats(c).values()):
                    return True
            except _TASK_ERRORS:
                continue
    return False
