"""A kernel task made runnable: reference callable, abstract and concrete arguments, tolerances.

open_task(spec) turns a KernelSpec (pycapnp reader or dict, any of the three formats) into a
Task. Native specs are materialized here from their generators and reference source; JAXBench
and MaxKernel directories are re-read from spec.sourcePath by task_dir.py, whose Python code
produces the values (see its docstring for how seeds are made to matter there).

Native specs: each input's values come from its Generator (generators.py) seeded from
(seed, input index); `sizes` from reduction.py is {dim name: reduced size} (an int key, an
original size, is still accepted and applies to every named dim of that size); every input's
shape is rebuilt from its dimNames, code generators receive the reduced dims, so structural
inputs drawn from the dims stay consistent. Literal (unnamed) axes keep their size. A derived
dim (NamedDim.expression, e.g. SEQ_BOUNDS = MAX_SEQS + 1; dim_expression.py) is always
recomputed from the dims it reads: `sizes` may name it only with that recomputed value.

prefetch_args(configuration, seed): the full-size args extract needs to compute scalar-prefetch
values. Those only depend on integer (structural) inputs, so a native task draws integer and
bool inputs for real and gives float inputs as zero-stride broadcast views (no memory); other
formats produce their inputs in task code and return make_args.
"""

from __future__ import annotations

import json
import math
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from . import generators
from .dim_expression import DerivedDims
from .errors import WorkerError

DEFAULT_TOLERANCE = 1e-2   # JAXBench's harness default, also used when a native spec gives none


def spec_dict(spec) -> dict:
    return spec if isinstance(spec, dict) else spec.to_dict()


class Task:
    """Common surface of the three formats. Subclasses fill reference/abstract_args/make_args."""

    def __init__(self, spec: dict):
        self.spec = spec
        self.name = spec.get("name", "")
        self.format = spec.get("format", "native")
        self.num_configurations = len(spec.get("configurations", []))
        self.degenerate = bool(spec.get("degenerate", False))
        self._tolerances = spec.get("tolerances", [])

    def reference(self, configuration: int) -> Callable:
        raise NotImplementedError

    def abstract_args(self, configuration: int) -> list:
        raise NotImplementedError

    def make_args(self, configuration: int, seed: int, sizes: dict | None = None,
                  redraw_normal: bool = False) -> list:
        raise NotImplementedError

    def prefetch_args(self, configuration: int, seed: int) -> list:
        """Full-size args for computing scalar-prefetch values (integer inputs are real)."""
        return self.make_args(configuration, seed)

    def static_argnums(self, configuration: int) -> tuple[int, ...]:
        return tuple(i for i, a in enumerate(self.abstract_args(configuration))
                     if not isinstance(a, jax.ShapeDtypeStruct))

    def tolerance(self, output: int) -> tuple[float, float]:
        """(atol, rtol): the output's own entry, else the entry for every output (-1), else 1e-2."""
        general = None
        for t in self._tolerances:
            if t.get("output", -1) == output:
                return float(t.get("atol", 0.0)), float(t.get("rtol", 0.0))
            if t.get("output", -1) == -1:
                general = (float(t.get("atol", 0.0)), float(t.get("rtol", 0.0)))
        return general or (DEFAULT_TOLERANCE, DEFAULT_TOLERANCE)

    def input_names(self, configuration: int) -> list[str]:
        inputs = self.spec["configurations"][configuration].get("inputs", [])
        return [i.get("name", f"arg{k}") for k, i in enumerate(inputs)]

    def structural(self, configuration: int) -> list[bool]:
        """Per argument: an integer input that carries structure (kept consistent on reduction)."""
        return [bool(i.get("structural")) for i in self.spec["configurations"][configuration].get("inputs", [])]

    def _check_configuration(self, configuration: int):
        if not 0 <= configuration < self.num_configurations:
            raise WorkerError("badInput", f"task {self.name}: configuration {configuration} out of range "
                                          f"(it has {self.num_configurations})")


class NativeTask(Task):
    def __init__(self, spec: dict):
        super().__init__(spec)
        dims = spec.get("dims", [])
        given = {d["name"]: int(d.get("size", 0)) for d in dims}
        # derived dims: evaluated here from the literal ones (and checked against `size`)
        self.derived = DerivedDims({d["name"]: d["expression"] for d in dims
                                    if (d.get("expression") or "").strip()}, given)
        self.dims = self.derived.apply(given)
        for name in self.derived.order:
            if given[name] not in (0, self.dims[name]):
                raise WorkerError("badInput", f"{self.name}: dim {name} has size {given[name]}, but "
                                              f"{self.derived.expressions[name]} = {self.dims[name]}")
        self._reference_fn = None
        self.plans: dict = {}   # reduction.py's validated plans, by configuration and blocks

    def reference(self, configuration: int) -> Callable:
        self._check_configuration(configuration)
        if self._reference_fn is None:
            where = f"{self.spec.get('sourcePath') or self.name}: reference"
            source = self.spec.get("reference", "")
            if not source.strip():
                raise WorkerError("badInput", f"{where}: the spec has no reference source")
            module = generators.exec_source(source, where, "maxkernel_reference")
            entry = self.spec.get("referenceEntry") or "reference"
            fn = getattr(module, entry, None)
            if not callable(fn):
                raise WorkerError("badInput", f"{where}: reference source does not define {entry}()")
            self._reference_fn = fn
        return self._reference_fn

    def _inputs(self, configuration: int) -> list[dict]:
        self._check_configuration(configuration)
        return self.spec["configurations"][configuration].get("inputs", [])

    def _static_value(self, inp: dict):
        text = inp.get("staticValue", "")
        try:
            return json.loads(text)
        except ValueError:
            raise WorkerError("badInput", f"{self.name}: input {inp.get('name')}: staticValue {text!r} "
                                          f"is not a JSON literal") from None

    def _shape(self, inp: dict, dims: dict) -> tuple:
        shape = [int(s) for s in inp.get("type", {}).get("shape", [])]
        names = inp.get("dimNames", [])
        for axis, name in enumerate(names[:len(shape)]):
            if name:
                if name not in dims:
                    raise WorkerError("badInput", f"{self.name}: input {inp.get('name')}: unknown dimension "
                                                  f"'{name}'")
                shape[axis] = dims[name]
        return tuple(shape)

    def abstract_args(self, configuration: int) -> list:
        out = []
        for inp in self._inputs(configuration):
            if inp.get("isStatic"):
                out.append(self._static_value(inp))
            else:
                t = inp.get("type", {})
                out.append(jax.ShapeDtypeStruct(self._shape(inp, self.dims), jnp.dtype(t.get("dtype") or "float32")))
        return out

    def reduced_dims(self, sizes: dict | None) -> dict:
        """name -> size with `sizes` applied (keys: dim names, or original sizes) to the dims
        that are not derived; derived dims are recomputed from those (a DimError when one is
        not positive), and a derived dim `sizes` names must have that value."""
        sizes = sizes or {}
        base = {n: s if n in self.derived else int(sizes.get(n, sizes.get(s, s)))
                for n, s in self.dims.items()}
        out = self.derived.apply(base)
        for name in self.derived.order:
            if name in sizes and int(sizes[name]) != out[name]:
                raise WorkerError("internal", f"{self.name}: sizes give derived dim {name} = "
                                              f"{sizes[name]}, but {self.derived.expressions[name]} "
                                              f"= {out[name]} there")
        return out

    def make_args(self, configuration: int, seed: int, sizes: dict | None = None,
                  redraw_normal: bool = False) -> list:
        return self._args(configuration, seed, self.reduced_dims(sizes), redraw_normal, None)

    def prefetch_args(self, configuration: int, seed: int) -> list:
        return self._args(configuration, seed, dict(self.dims), False, 0)

    def placeholder_args(self, configuration: int, seed: int, sizes: dict | None,
                         draw_below: int) -> list:
        """make_args, but float inputs with more than draw_below elements are zero views."""
        return self._args(configuration, seed, self.reduced_dims(sizes), False, draw_below)

    def _args(self, configuration, seed, dims, redraw_normal, draw_below) -> list:
        args = []
        for index, inp in enumerate(self._inputs(configuration)):
            if inp.get("isStatic"):
                args.append(self._static_value(inp))
                continue
            dtype = inp.get("type", {}).get("dtype") or "float32"
            shape = self._shape(inp, dims)
            if (draw_below is not None and generators.is_float_dtype(dtype)
                    and math.prod(shape) > draw_below):
                # read by no prefetch computation: a broadcast view allocates nothing
                args.append(np.broadcast_to(np.zeros((), jnp.dtype(dtype)), shape))
                continue
            gen = inp.get("generator") or {"normal": {}}
            where = f"{self.spec.get('sourcePath') or self.name}: input {inp.get('name', index)}"
            if redraw_normal and not inp.get("structural") and generators.is_float_dtype(dtype):
                args.append(generators.redraw_float(shape, dtype, seed, index))
            else:
                args.append(generators.draw(gen, shape, dtype, seed, index, dims, where))
        return args


_cache: dict[str, Task] = {}


def open_task(spec) -> Task:
    """A Task for a KernelSpec of any format; the same spec gives the same (cached) Task."""
    d = spec_dict(spec)
    key = json.dumps(d, sort_keys=True, default=str)
    task = _cache.get(key)
    if task is None:
        if not d.get("configurations"):
            raise WorkerError("badInput", f"task {d.get('name', '')}: the spec has no configurations")
        fmt = d.get("format", "native")
        if fmt == "native":
            task = NativeTask(d)
        elif fmt in ("jaxbench", "maxkernel"):
            from .task_dir import open_task_dir   # task_dir builds on Task
            task = open_task_dir(d)
        else:
            raise WorkerError("badInput", f"task {d.get('name', '')}: unknown spec format {fmt!r}")
        _cache[key] = task
    return task


def load_task_dir(path: str, memory_limit: int) -> dict:
    """KernelSpec dict for a JAXBench (baseline.py) or MaxKernel (kernel_task.yaml) directory."""
    from .task_dir import load_task_dir as _load
    return _load(path, memory_limit)
