"""A kernel exported in the JAXBench convention: the kernel module followed by CONFIG and
create_inputs, so that it drops into a JAXBench task directory as optimized.py and runs alone.

    python -m maxkernel_worker.export --spec SPEC.bin --kernel KERNEL.py --out OUT.py

SPEC.bin is a binary KernelSpec (`maxkernel spec SPEC --out FILE`). What is appended:

- JAXBench task: baseline.py's CONFIG and create_inputs with every top-level definition,
  assignment and import they need (transitively); MaxKernel task: kernel_task.yaml's
  input_gen_code (get_inputs and what it needs), CONFIG (its own, or name and tolerances) and a
  create_inputs() returning the first configuration's dynamic then static arguments. Names the
  kernel binds the same way are not redefined; a reference name the kernel binds differently
  is copied under a prefixed name (`_reference_NAME`) and its uses in the copied code are
  rewritten. The reference's workload / entry function is never copied unless create_inputs
  needs it (then under the prefixed name).
- Native spec: CONFIG = name, dims and tolerances as a dict literal; create_inputs(seed=0)
  draws every input at full size exactly as the worker's generators.py does for that seed
  (numpy Generator per input index, cast with jax.numpy); code generators are copied with
  their helpers under a per-input prefix. Derived dims are recomputed from CONFIG's other dims.

Then the result is checked without running the kernel: it must compile and import, its
create_inputs must give the spec's input shapes and dtypes (task directories: under
jax.eval_shape; native: built from the spec by construction), and jax.eval_shape of its
workload on those inputs must give the reference's output shapes and dtypes.

Exit codes: 0 written; 1 the result is not a valid module in the convention (the reason on
stderr); 2 bad input (unreadable spec, a generator that cannot be written as source).
"""

from __future__ import annotations

import argparse
import ast
import copy
import json
import keyword
import math
import os
import sys
import symtable
import types

PREFIX = "_reference_"
_LOCALS = {"np", "jnp", "rng", "dims", "seed", "CONFIG", "create_inputs"}   # create_inputs' own names
_DRAW_LIMIT = 64 << 20   # native create_inputs is run for real below this many input bytes
# Names the worker binds before running task code (generators.exec_source, task_dir).
_PREBOUND = {"native": ("jax", "jnp", "np"), "maxkernel": ("jax", "jnp"), "jaxbench": ()}
_PREBOUND_IMPORT = {"jax": ("jax", None), "jnp": ("jax.numpy", "jnp"), "np": ("numpy", "np")}


class ExportError(Exception):
    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


# ---------------------------------------------------------------- module analysis

def _bound_names(stmt: ast.stmt) -> list[str]:
    """Names a top-level statement binds in the module namespace (not inside functions)."""
    out: list[str] = []

    def targets(node):
        if isinstance(node, ast.Name):
            out.append(node.id)
        elif isinstance(node, (ast.Tuple, ast.List)):
            for e in node.elts:
                targets(e)
        elif isinstance(node, ast.Starred):
            targets(node.value)

    def visit(node):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.append(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                if a.name != "*":
                    out.append(a.asname or a.name.split(".")[0])
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                targets(t)
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            targets(node.target)
        elif isinstance(node, (ast.For, ast.AsyncFor)):
            targets(node.target)
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                if item.optional_vars is not None:
                    targets(item.optional_vars)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            out.append(node.name)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return
        # nested statements of compound statements (if, try, with, for) bind at module level too
        for field in ("body", "orelse", "finalbody", "handlers"):
            for child in getattr(node, field, []) or []:
                visit(child)
    visit(stmt)
    # walrus targets at module level
    for n in ast.walk(stmt):
        if isinstance(n, ast.NamedExpr) and isinstance(n.target, ast.Name):
            out.append(n.target.id)
    return list(dict.fromkeys(out))


def _free_names(stmt: ast.stmt) -> set[str]:
    """Module-level names a statement reads (in its own code and in every nested scope)."""
    module = ast.Module(body=[stmt], type_ignores=[])
    try:
        table = symtable.symtable(ast.unparse(module), "<export>", "exec")
    except SyntaxError:
        return set()
    out: set[str] = set()

    def walk(t, top):
        for sym in t.get_symbols():
            if top:
                if sym.is_referenced():
                    out.add(sym.get_name())
            elif sym.is_global() and (sym.is_referenced() or sym.is_assigned()):
                out.add(sym.get_name())
        for child in t.get_children():
            walk(child, False)
    walk(table, True)
    return out


def _mutated_names(stmt: ast.stmt) -> set[str]:
    """Module-level names a statement changes in place: X[k] = v, X.a = v, X += v, X.update()."""
    def base(node):
        while isinstance(node, (ast.Subscript, ast.Attribute)):
            node = node.value
        return node.id if isinstance(node, ast.Name) else None
    out = set()
    if isinstance(stmt, ast.Assign):
        for t in stmt.targets:
            if isinstance(t, (ast.Subscript, ast.Attribute)) and base(t):
                out.add(base(t))
    elif isinstance(stmt, (ast.AugAssign, ast.AnnAssign)):
        if isinstance(stmt.target, (ast.Subscript, ast.Attribute)) and base(stmt.target):
            out.add(base(stmt.target))
    elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        f = stmt.value.func
        if isinstance(f, ast.Attribute) and base(f):
            out.add(base(f))
    return out


def _is_main_guard(stmt: ast.stmt) -> bool:
    t = stmt.test if isinstance(stmt, ast.If) else None
    return (isinstance(t, ast.Compare) and isinstance(t.left, ast.Name) and t.left.id == "__name__")


def _is_docstring(stmt: ast.stmt) -> bool:
    return (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
            and isinstance(stmt.value.value, str))


def _is_future(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.ImportFrom) and stmt.module == "__future__"


class Module:
    """A parsed module: its top-level statements, what each binds and reads."""

    def __init__(self, source: str, filename: str):
        self.source = source
        try:
            self.tree = ast.parse(source, filename)
        except SyntaxError as e:
            raise ExportError(1, f"{filename}:{e.lineno}: syntax error: {e.msg}") from None
        self.stmts = [s for s in self.tree.body
                      if not (_is_main_guard(s) or _is_docstring(s) or _is_future(s))]
        self.binds = [_bound_names(s) for s in self.stmts]
        self.reads = [_free_names(s) for s in self.stmts]
        self.mutates = [_mutated_names(s) for s in self.stmts]
        self.bound = {n for names in self.binds for n in names}

    def binders(self, name: str) -> list[int]:
        return [i for i, names in enumerate(self.binds) if name in names]

    def closure(self, roots, stop=lambda name: False) -> tuple[list[int], set[str]]:
        """Statements needed for `roots` (in source order) and the free names left unbound.
        stop(name): the name is provided elsewhere (the kernel), do not follow it."""
        needed: set[str] = set()
        chosen: set[int] = set()
        unbound: set[str] = set()
        todo = list(roots)
        while todo:
            name = todo.pop()
            if name in needed:
                continue
            needed.add(name)
            if stop(name):
                continue
            idx = self.binders(name)
            if not idx:
                unbound.add(name)
                continue
            idx += [i for i, m in enumerate(self.mutates) if name in m and not self.binds[i]]
            for i in idx:
                if i not in chosen:
                    chosen.add(i)
                    todo.extend(self.reads[i])
                    todo.extend(self.binds[i])   # a tuple assignment binds its siblings too
        return sorted(chosen), unbound


# ---------------------------------------------------------------- renaming

class _Renamer(ast.NodeTransformer):
    """Renames module-level names (mapping) wherever they refer to the module-level binding:
    not where a function, lambda or comprehension has its own local of that name."""

    def __init__(self, mapping: dict[str, str]):
        self.mapping = mapping
        self.scopes: list[set[str]] = []   # locals of enclosing function scopes

    def _new(self, name):
        if name in self.mapping and not any(name in s for s in self.scopes):
            return self.mapping[name]
        return name

    @staticmethod
    def _locals(node) -> set[str]:
        names, declared_global = set(), set()
        args = node.args
        for a in args.posonlyargs + args.args + args.kwonlyargs + [args.vararg, args.kwarg]:
            if a is not None:
                names.add(a.arg)
        body = node.body if isinstance(node.body, list) else [node.body]
        stack = list(body)
        while stack:
            n = stack.pop()
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(n.name)
                stack.extend(n.decorator_list)
                continue
            if isinstance(n, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
                continue
            if isinstance(n, (ast.Global, ast.Nonlocal)):
                declared_global.update(n.names)
            elif isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del)):
                names.add(n.id)
            elif isinstance(n, (ast.Import, ast.ImportFrom)):
                names.update(a.asname or a.name.split(".")[0] for a in n.names)
            elif isinstance(n, ast.ExceptHandler) and n.name:
                names.add(n.name)
            stack.extend(ast.iter_child_nodes(n))
        return names - declared_global

    def _function(self, node):
        if not isinstance(node, ast.Lambda):
            node.name = self._new(node.name)
            node.decorator_list = [self.visit(d) for d in node.decorator_list]
            if node.returns is not None:
                node.returns = self.visit(node.returns)
        node.args = self._visit_defaults(node.args)
        self.scopes.append(self._locals(node))
        if isinstance(node.body, list):
            node.body = [self.visit(s) for s in node.body]
        else:
            node.body = self.visit(node.body)
        self.scopes.pop()
        return node

    def _visit_defaults(self, args):
        args.defaults = [self.visit(d) for d in args.defaults]
        args.kw_defaults = [self.visit(d) if d is not None else None for d in args.kw_defaults]
        for a in args.posonlyargs + args.args + args.kwonlyargs + [args.vararg, args.kwarg]:
            if a is not None and a.annotation is not None:
                a.annotation = self.visit(a.annotation)
        return args

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function

    def visit_ClassDef(self, node):
        node.name = self._new(node.name)
        node.bases = [self.visit(b) for b in node.bases]
        node.keywords = [self.visit(k) for k in node.keywords]
        node.decorator_list = [self.visit(d) for d in node.decorator_list]
        node.body = [self.visit(s) for s in node.body]
        return node

    def _comprehension(self, node):
        targets = set()
        for g in node.generators:
            for n in ast.walk(g.target):
                if isinstance(n, ast.Name):
                    targets.add(n.id)
        # the first iterable is evaluated in the enclosing scope
        node.generators[0].iter = self.visit(node.generators[0].iter)
        self.scopes.append(targets)
        for i, g in enumerate(node.generators):
            g.target = self.visit(g.target)
            if i:
                g.iter = self.visit(g.iter)
            g.ifs = [self.visit(x) for x in g.ifs]
        for field in ("elt", "key", "value"):
            if getattr(node, field, None) is not None:
                setattr(node, field, self.visit(getattr(node, field)))
        self.scopes.pop()
        return node

    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = _comprehension

    def visit_Name(self, node):
        node.id = self._new(node.id)
        return node

    def visit_Global(self, node):
        node.names = [self.mapping.get(n, n) for n in node.names]
        return node

    def visit_Import(self, node):
        if self.scopes:
            return node
        out, extra = [], []
        for a in node.names:
            bound = a.asname or a.name.split(".")[0]
            if bound not in self.mapping:
                out.append(a)
            elif a.asname or "." not in a.name:
                out.append(ast.alias(a.name, self.mapping[bound]))
            else:   # `import a.b` binds a: load a.b, bind the package under the new name
                extra.append(ast.parse(f"{self.mapping[bound]} = __import__({a.name!r})").body[0])
        node.names = out
        return ([node] if out else []) + extra if extra else node

    def visit_ImportFrom(self, node):
        if not self.scopes:
            node.names = [ast.alias(a.name, self.mapping.get(a.asname or a.name, a.asname))
                          if (a.asname or a.name) in self.mapping else a for a in node.names]
        return node


def _import_key(alias: ast.alias, node) -> str:
    """What an import binds, comparable across spellings (`from jax import numpy` = jax.numpy)."""
    if isinstance(node, ast.Import):
        return "module " + (alias.name if alias.asname else alias.name.split(".")[0])
    return f"module {'.' * node.level}{node.module or ''}.{alias.name}"


def _binding_keys(module: Module, name: str) -> list[str]:
    keys = []
    for i in module.binders(name):
        s = module.stmts[i]
        if isinstance(s, (ast.Import, ast.ImportFrom)):
            keys += [_import_key(a, s) for a in s.names if (a.asname or a.name.split(".")[0]) == name]
        else:
            keys.append(ast.dump(s))
    return keys


def _fresh(name: str, taken: set[str], prefix: str = PREFIX) -> str:
    new = prefix + name
    k = 2
    while new in taken:
        new = f"{prefix}{k}_{name}"
        k += 1
    taken.add(new)
    return new


def _statement_source(module: Module, index: int, mapping: dict[str, str], only: set[str] | None) -> str:
    """One copied statement: imports keep only the aliases in `only`; renamed statements are
    unparsed, others keep the author's text."""
    stmt = module.stmts[index]
    if isinstance(stmt, (ast.Import, ast.ImportFrom)) and only is not None:
        aliases = [a for a in stmt.names if (a.asname or a.name.split(".")[0]) in only]
        if not aliases:
            return ""
        stmt = type(stmt)(**{**{f: getattr(stmt, f) for f in stmt._fields}, "names": aliases})
        ast.copy_location(stmt, module.stmts[index])
        return _unparse(_Renamer(mapping).visit(stmt))
    if set(mapping) & _all_names(stmt):
        return _unparse(_Renamer(mapping).visit(copy.deepcopy(stmt)))
    first = min([stmt.lineno] + [d.lineno for d in getattr(stmt, "decorator_list", [])])
    lines = module.source.splitlines()
    shares_line = any(s is not stmt and (s.lineno <= stmt.end_lineno and s.end_lineno >= first)
                      for s in module.tree.body)
    if shares_line:
        return ast.unparse(stmt)
    return "\n".join(lines[first - 1:stmt.end_lineno])


def _unparse(result) -> str:
    """A renamed statement (a list when an import became several statements)."""
    stmts = result if isinstance(result, list) else [result]
    return "\n".join(ast.unparse(ast.fix_missing_locations(s)) for s in stmts)


def _all_names(stmt) -> set[str]:
    out = set()
    for n in ast.walk(stmt):
        if isinstance(n, ast.Name):
            out.add(n.id)
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(n.name)
        elif isinstance(n, ast.alias):
            out.add(n.asname or n.name.split(".")[0])
        elif isinstance(n, ast.Global):
            out.update(n.names)
    return out


def copy_definitions(kernel: Module, source: str, filename: str, roots: list[str],
                     prebound: tuple = (), taken: set[str] | None = None,
                     rename_all: str | None = None) -> tuple[str, dict[str, str]]:
    """The source of `roots` and everything they need from `source`, to follow the kernel.

    Names the kernel binds the same way are used from the kernel; other clashes are renamed.
    rename_all: a prefix given to every copied name (code generators, which share nothing).
    Returns (text, mapping of renamed names)."""
    ref = Module(source, filename)
    taken = set(taken or set()) | kernel.bound | ref.bound

    def same_in_kernel(name):
        if rename_all is not None or name not in kernel.bound or name not in ref.bound:
            return False
        return _binding_keys(ref, name) == _binding_keys(kernel, name)

    chosen, unbound = ref.closure(roots, stop=same_in_kernel)
    mapping: dict[str, str] = {}
    copied_names = {n for i in chosen for n in ref.binds[i]}
    for name in sorted(copied_names):
        if rename_all is not None:
            mapping[name] = _fresh(name, taken, rename_all)
        elif name in kernel.bound and not same_in_kernel(name):
            mapping[name] = _fresh(name, taken)
    # names the task code gets from the worker's namespace (jax, jnp, np) without importing
    header = []
    for name in sorted(unbound):
        if name in prebound:
            module_name, asname = _PREBOUND_IMPORT[name]
            if rename_all is None and name in kernel.bound and _binding_keys(kernel, name) == [
                    f"module {module_name}"]:
                continue
            if rename_all is not None or name in kernel.bound:
                mapping[name] = _fresh(name, taken, rename_all or PREFIX)
                header.append(f"import {module_name} as {mapping[name]}")
            else:
                header.append(f"import {module_name}" + (f" as {asname}" if asname else ""))
    needed = set()
    for i in chosen:
        needed.update(ref.reads[i])
    needed.update(roots)
    parts = list(header)
    for i in chosen:
        s = ref.stmts[i]
        only = None
        if isinstance(s, (ast.Import, ast.ImportFrom)):
            only = {n for n in ref.binds[i] if n in needed and not same_in_kernel(n)}
        text = _statement_source(ref, i, mapping, only)
        if text:
            parts.append(text)
    return "\n\n\n".join(parts), mapping


# ---------------------------------------------------------------- the three formats

def _config_literal(d: dict, name: str = "CONFIG") -> str:
    items = ",\n".join(f"    {k!r}: {v!r}" for k, v in d.items())
    return f"{name} = {{\n" + items + ",\n}" if d else f"{name} = {{}}"


def _tolerance_entries(spec: dict) -> dict:
    tols = spec.get("tolerances") or []
    general = [t for t in tols if t.get("output", -1) == -1]
    per = sorted((t for t in tols if t.get("output", -1) != -1), key=lambda t: t["output"])
    if per:
        return {"atol": [float(t.get("atol", 0.0)) for t in per],
                "rtol": [float(t.get("rtol", 0.0)) for t in per]}
    if general:
        return {"atol": float(general[0].get("atol", 0.0)), "rtol": float(general[0].get("rtol", 0.0))}
    return {"atol": 1e-2, "rtol": 1e-2}


def _native_part(spec: dict, kernel: Module) -> str:
    from .dim_expression import DerivedDims
    name = spec.get("name", "")
    dims = spec.get("dims") or []
    sizes = {d["name"]: int(d.get("size", 0)) for d in dims}
    expressions = {d["name"]: d["expression"].strip() for d in dims if (d.get("expression") or "").strip()}
    config = {"name": name}
    config.update(sizes)
    for k, v in _tolerance_entries(spec).items():
        config.setdefault(k, v)
    derived_order = DerivedDims(expressions, sizes).order if expressions else []
    taken = set(kernel.bound) | {"CONFIG", "create_inputs"}
    # a kernel that binds CONFIG or create_inputs keeps them; ours then go under other names
    config_name = _fresh("CONFIG", taken) if "CONFIG" in kernel.bound else "CONFIG"
    create_name = _fresh("create_inputs", taken) if "create_inputs" in kernel.bound else "create_inputs"
    helpers: list[str] = []
    lines = [f"def {create_name}(seed=0):",
             f'    """The inputs of task {name} at full size, drawn as maxkernel\'s worker draws them',
             '    for this seed (numpy Generator per input, cast with jax.numpy)."""',
             "    import numpy as np",
             "    import jax.numpy as jnp",
             "",
             "    def rng(index):",
             "        return np.random.default_rng([int(seed) & 0xFFFFFFFF, index, 0x6D6B])",
             "",
             "    dims = {" + ", ".join(f"{n!r}: {config_name}[{n!r}]" for n in sizes) + "}"]
    for d in derived_order:   # derived dims follow the dims they read
        expr = ast.parse(expressions[d], mode="eval")
        expr = _DimsSubscript().visit(expr)
        lines.append(f"    dims[{d!r}] = {ast.unparse(expr)}")
    configurations = spec.get("configurations") or []
    if not configurations:
        raise ExportError(2, f"task {name}: the spec has no configurations")
    values = []
    for index, inp in enumerate(configurations[0].get("inputs", [])):
        where = f"task {name}: input {inp.get('name', index)}"
        if inp.get("isStatic"):
            try:
                values.append(repr(json.loads(inp.get("staticValue", ""))))
            except ValueError:
                raise ExportError(2, f"{where}: staticValue {inp.get('staticValue')!r} is not a JSON literal") from None
            continue
        t = inp.get("type", {})
        dtype = t.get("dtype") or "float32"
        shape = [int(s) for s in t.get("shape", [])]
        names = list(inp.get("dimNames", []))
        axes = [f"dims[{names[a]!r}]" if a < len(names) and names[a] else str(s) for a, s in enumerate(shape)]
        shape_text = "(" + ", ".join(axes) + ("," if len(axes) == 1 else "") + ")"
        gen = inp.get("generator") or {"normal": {}}
        kind = next(iter(gen)) if gen else "normal"
        params = gen.get(kind) or {}
        r = f"rng({index})"
        if kind == "normal":
            draw = f"{r}.normal({float(params.get('mean', 0.0))!r}, {float(params.get('std', 1.0))!r}, {shape_text})"
        elif kind == "uniform":
            draw = f"{r}.uniform({float(params.get('low', 0.0))!r}, {float(params.get('high', 1.0))!r}, {shape_text})"
        elif kind == "randint":
            low, high = int(params.get("low", 0)), int(params.get("high", 0))
            if high <= low:
                raise ExportError(2, f"{where}: randint needs high > low (got low={low}, high={high})")
            draw = f"{r}.integers({low}, {high}, {shape_text})"
        elif kind == "zeros":
            draw = f"np.zeros({shape_text})"
        elif kind == "ones":
            draw = f"np.ones({shape_text})"
        elif kind == "code":
            code = params if isinstance(params, str) else gen["code"]
            prefix = f"_generator_{inp.get('name', index)}_"
            gen_module = Module(code, f"<{where}: generator code>") if code else None
            if gen_module is None or "generate" not in gen_module.bound:
                raise ExportError(2, f"{where}: generator code does not define generate(rng, shape, dtype, dims)")
            text, mapping = copy_definitions(Module("", "<none>"), code, f"<{where}: generator code>",
                                             ["generate"], prebound=_PREBOUND["native"], taken=taken,
                                             rename_all=prefix)
            helpers.append(text)
            draw = f"jnp.asarray({mapping['generate']}({r}, {shape_text}, {dtype!r}, dict(dims)))"
        else:
            raise ExportError(2, f"{where}: generator kind '{kind}' cannot be written as source "
                                 f"(native specs draw with normal, uniform, randint, zeros, ones or code)")
        var = inp.get("name", "")
        if not var.isidentifier() or var in _LOCALS or var in values or keyword.iskeyword(var):
            var = f"input{index}"
        lines.append(f"    {var} = jnp.asarray({draw}, dtype=jnp.dtype({dtype!r}))")
        if kind == "code":
            lines.append(f"    if tuple({var}.shape) != {shape_text}:")
            message = f"{inp.get('name', index)}: generate() returned shape %s, expected %s"
            lines.append(f"        raise ValueError({message!r} % (tuple({var}.shape), {shape_text}))")
        values.append(var)
    lines.append("    return (" + ", ".join(values) + ("," if len(values) == 1 else "") + ")")
    return "\n\n\n".join([_config_literal(config, config_name)] + helpers + ["\n".join(lines)])


class _DimsSubscript(ast.NodeTransformer):
    def visit_Name(self, node):
        return ast.Subscript(ast.Name("dims", ast.Load()), ast.Constant(node.id), ast.Load())


def _jaxbench_part(spec: dict, kernel: Module) -> str:
    source = spec.get("reference", "")
    where = os.path.join(spec.get("sourcePath", ""), "baseline.py")
    ref = Module(source, where)
    for name in ("CONFIG", "create_inputs"):
        if name not in ref.bound:
            raise ExportError(2, f"{where}: does not define {name}")
    text, _ = copy_definitions(kernel, source, where, ["CONFIG", "create_inputs"])
    return text


def _maxkernel_part(spec: dict, kernel: Module) -> str:
    import yaml
    path = os.path.join(spec.get("sourcePath", ""), "kernel_task.yaml")
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise ExportError(2, f"{path}: cannot read the task's input code: {e}") from None
    code = data.get("input_gen_code") if isinstance(data, dict) else None
    if not isinstance(code, str) or "get_inputs" not in Module(code, path).bound:
        raise ExportError(2, f"{path}: input_gen_code does not define get_inputs()")
    gen = Module(code, path)
    roots = ["get_inputs"] + (["CONFIG"] if "CONFIG" in gen.bound else [])
    text, mapping = copy_definitions(kernel, code, path, roots, prebound=_PREBOUND["maxkernel"])
    parts = [text]
    if "CONFIG" not in gen.bound and "CONFIG" not in kernel.bound:
        parts.append(_config_literal({"name": spec.get("name", ""), **_tolerance_entries(spec)}))
    name = "create_inputs" if "create_inputs" not in kernel.bound else _fresh("create_inputs", set(kernel.bound))
    get_inputs = mapping.get("get_inputs", "get_inputs")
    parts.append(
        f"def {name}():\n"
        f'    """The first configuration of {spec.get("name", "")}: its dynamic, then static arguments\n'
        '    (MaxKernel\'s get_inputs() returns (dynamic_args, static_args) or a list of such pairs)."""\n'
        "    def is_pair(x):\n"
        "        return (isinstance(x, (list, tuple)) and len(x) == 2 and isinstance(x[0], (list, tuple))\n"
        "                and isinstance(x[1], (list, tuple)))\n"
        f"    raw = {get_inputs}()\n"
        "    if isinstance(raw, (list, tuple)) and raw and all(is_pair(e) for e in raw):\n"
        "        raw = raw[0]\n"
        "    dynamic, static = raw\n"
        "    return (*dynamic, *static)")
    return "\n\n\n".join(parts)


# ---------------------------------------------------------------- check

def _load(text: str, path: str) -> types.ModuleType:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    try:
        code = compile(text, path, "exec")
    except SyntaxError as e:
        raise ExportError(1, f"the exported module does not compile: line {e.lineno}: {e.msg}") from None
    name = "maxkernel_export_" + str(abs(hash(path)))
    module = types.ModuleType(name)
    module.__file__ = path
    sys.modules[name] = module
    try:
        exec(code, module.__dict__)
    except BaseException as e:
        from .generators import error_line
        raise ExportError(1, f"the exported module does not import: line {error_line(e, path)}: "
                             f"{type(e).__name__}: {e}") from None
    for name in ("CONFIG", "create_inputs", "workload"):
        if name not in module.__dict__:
            raise ExportError(1, f"the exported module does not define {name}")
    if not isinstance(module.CONFIG, dict):
        raise ExportError(1, f"CONFIG is a {type(module.CONFIG).__name__}, not a dict")
    if not callable(module.create_inputs) or not callable(module.workload):
        raise ExportError(1, "create_inputs and workload must be functions")
    return module


def _types(tree) -> list[tuple]:
    import jax
    return [(tuple(int(s) for s in x.shape), str(x.dtype)) for x in jax.tree_util.tree_leaves(tree)]


def _describe(types_list) -> str:
    return ", ".join(f"{list(s)} {d}" for s, d in types_list) or "nothing"


def _abstract_inputs(spec: dict) -> list:
    import jax
    import jax.numpy as jnp
    out = []
    for inp in (spec.get("configurations") or [{}])[0].get("inputs", []):
        if inp.get("isStatic"):
            out.append(json.loads(inp.get("staticValue", "null")))
        else:
            t = inp.get("type", {})
            out.append(jax.ShapeDtypeStruct(tuple(int(s) for s in t.get("shape", [])),
                                            jnp.dtype(t.get("dtype") or "float32")))
    return out


def _eval_shape(fn, args: list, concrete: dict | None = None):
    """jax.eval_shape of fn(*args) with the non-array args (and `concrete` ones) closed over."""
    import jax
    fixed = {i: a for i, a in enumerate(args) if not isinstance(a, jax.ShapeDtypeStruct)}
    fixed.update(concrete or {})
    dyn = [i for i in range(len(args)) if i not in fixed]

    def run(*values):
        full = list(args)
        for i, v in zip(dyn, values):
            full[i] = v
        for i, v in fixed.items():
            full[i] = v
        return fn(*full)
    return jax.eval_shape(run, *[args[i] for i in dyn])


def _integer_inputs(spec: dict) -> dict:
    """Native specs: the integer/bool inputs drawn for real (seed 0), for data-dependent shapes."""
    from .task import NativeTask
    task = NativeTask(spec)
    args = task.prefetch_args(0, 0)
    import jax.numpy as jnp
    import numpy as np
    return {i: np.asarray(a) for i, a in enumerate(args)
            if hasattr(a, "dtype") and not jnp.issubdtype(a.dtype, jnp.floating)}


def _task_integer_inputs(module: types.ModuleType, args: list) -> dict:
    """Task directories: the integer/bool inputs of create_inputs(), computed under jit with
    the float inputs dropped (XLA never makes them)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    wanted = [i for i, a in enumerate(args)
              if isinstance(a, jax.ShapeDtypeStruct) and not jnp.issubdtype(a.dtype, jnp.floating)]
    if not wanted:
        return {}
    try:
        values = jax.jit(lambda: [module.create_inputs()[i] for i in wanted])()
    except Exception:
        return {}
    # numpy, not jax arrays: inside a trace, ops on jax arrays are staged even when concrete
    return {i: np.asarray(v) for i, v in zip(wanted, values)}


def _reference_outputs(spec: dict, args: list) -> list[tuple]:
    recorded = (spec.get("configurations") or [{}])[0].get("outputs") or []
    if recorded:
        return [(tuple(int(s) for s in o.get("shape", [])), str(o.get("dtype"))) for o in recorded]
    from . import generators
    module = generators.exec_source(spec.get("reference", ""), "<reference>", "maxkernel_export_reference")
    fn = getattr(module, spec.get("referenceEntry") or "reference", None)
    if not callable(fn):
        raise ExportError(2, f"the reference does not define {spec.get('referenceEntry') or 'reference'}()")
    try:
        return _types(_eval_shape(fn, args))
    except Exception:
        return _types(_eval_shape(fn, args, _integer_inputs(spec)))


def _concretization_errors() -> tuple:
    import jax
    return (jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError,
            jax.errors.TracerIntegerConversionError, jax.errors.TracerBoolConversionError)


def check(spec: dict, module: types.ModuleType) -> list[str]:
    """Raises ExportError(1) when create_inputs or workload disagree with the spec; returns notes."""
    import jax
    concretization = _concretization_errors()
    notes = []
    args = _abstract_inputs(spec)
    expected_inputs = [(tuple(a.shape), str(a.dtype)) if isinstance(a, jax.ShapeDtypeStruct) else ("static", a)
                       for a in args]
    native = spec.get("format", "native") == "native"
    total = sum(math.prod(a.shape) * a.dtype.itemsize for a in args if isinstance(a, jax.ShapeDtypeStruct))
    if native and total > _DRAW_LIMIT:
        notes.append(f"create_inputs() not run: the inputs need {total} bytes (its shapes come "
                     f"from the spec)")
    elif native:   # numpy draws: run it for real, it is small
        try:
            values = module.create_inputs()
        except Exception as e:
            raise ExportError(1, f"create_inputs() raised: {type(e).__name__}: {e}") from None
        got = [(tuple(v.shape), str(v.dtype)) if hasattr(v, "shape") else ("static", v) for v in values]
        if got != expected_inputs:
            raise ExportError(1, f"create_inputs() gives {got}, the task's inputs are {expected_inputs}")
    else:
        statics: dict = {}

        def traced():
            values = module.create_inputs()
            if not isinstance(values, (tuple, list)):
                raise ExportError(1, f"create_inputs() returned a {type(values).__name__}, not a tuple")
            row = []
            for i, v in enumerate(values):
                if hasattr(v, "shape") and hasattr(v, "dtype"):
                    row.append(v)
                else:
                    statics[i] = v
                    row.append(None)
            return row
        try:
            shapes = jax.eval_shape(traced)
        except ExportError:
            raise
        except concretization:   # numpy or data-dependent input code: run it for real
            statics.clear()
            try:
                shapes = traced()
            except ExportError:
                raise
            except Exception as e:
                raise ExportError(1, f"create_inputs() raised: {type(e).__name__}: {e}") from None
        except Exception as e:
            raise ExportError(1, f"create_inputs() raised under jax.eval_shape: {type(e).__name__}: {e}") from None
        got = [("static", statics[i]) if s is None else (tuple(s.shape), str(s.dtype)) for i, s in enumerate(shapes)]
        if got != expected_inputs:
            raise ExportError(1, f"create_inputs() gives {got}, the task's inputs are {expected_inputs}")
    reference = _reference_outputs(spec, args)
    try:
        out = _eval_shape(module.workload, args)
    except Exception as first:
        concrete = _integer_inputs(spec) if native else _task_integer_inputs(module, args)
        if not concrete:
            raise ExportError(1, f"workload raised under jax.eval_shape on the task's inputs: "
                                 f"{type(first).__name__}: {first}") from None
        try:
            out = _eval_shape(module.workload, args, concrete)
        except Exception as e:
            raise ExportError(1, f"workload raised under jax.eval_shape on the task's inputs: "
                                 f"{type(e).__name__}: {e}") from None
    got = _types(out)
    if got != reference:
        raise ExportError(1, f"workload returns {_describe(got)}; the reference returns {_describe(reference)}")
    return notes


# ---------------------------------------------------------------- export

def _prebound_header(kernel: Module, fmt: str) -> str:
    """Imports for jax / jnp / np when the kernel uses them without binding them (a reference
    written for the worker's namespace, exported as the fallback kernel)."""
    used = set()
    for reads in kernel.reads:
        used |= reads
    lines = []
    for name in _PREBOUND.get(fmt, ()):
        if name in used and name not in kernel.bound:
            module_name, asname = _PREBOUND_IMPORT[name]
            lines.append(f"import {module_name}" + (f" as {asname}" if asname else ""))
    return "\n".join(lines)


def export_source(spec: dict, kernel_source: str) -> str:
    """The kernel followed by what the JAXBench convention needs (not checked)."""
    kernel = Module(kernel_source, "<kernel>")
    if "workload" not in kernel.bound:
        raise ExportError(1, "the kernel does not define workload")
    fmt = spec.get("format", "native")
    if fmt == "native":
        extra = _native_part(spec, kernel)
    elif fmt == "jaxbench":
        extra = _jaxbench_part(spec, kernel)
    elif fmt == "maxkernel":
        extra = _maxkernel_part(spec, kernel)
    else:
        raise ExportError(2, f"unknown spec format {fmt!r}")
    header = _prebound_header(kernel, fmt)
    text = kernel_source
    if header:
        body = kernel.tree.body
        # after a module docstring and __future__ imports, which must come first
        after = 0
        for s in body:
            if _is_future(s) or (s is body[0] and _is_docstring(s)):
                after = s.end_lineno
            else:
                break
        lines = kernel_source.splitlines(keepends=True)
        text = "".join(lines[:after]) + header + "\n" + "".join(lines[after:])
    if not text.endswith("\n"):
        text += "\n"
    if not extra.strip():
        return text
    return (text + "\n\n# ---- JAXBench convention (maxkernel export): CONFIG and create_inputs"
            f" of task {spec.get('name', '')}\n" + extra + "\n")


def export(spec: dict, kernel_source: str, out_path: str) -> list[str]:
    text = export_source(spec, kernel_source)
    module = _load(text, out_path)
    return check(spec, module)


def _read_spec(path: str, schema_dir: str) -> dict:
    from .schema import load_schemas
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ExportError(2, f"{path}: cannot read: {e.strerror}") from None
    try:
        schemas = load_schemas(schema_dir)
    except Exception as e:
        raise ExportError(2, f"--schema-dir {schema_dir}: {e}") from None
    try:
        with schemas.KernelSpec.from_bytes(data, traversal_limit_in_words=1 << 32) as reader:
            return reader.to_dict()
    except Exception as e:
        raise ExportError(2, f"{path}: not a KernelSpec: {type(e).__name__}: {e}") from None


def _default_schema_dir() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.normpath(os.path.join(here, "..", "..", "..", "messages", "schema"))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m maxkernel_worker.export",
                                description="write a kernel in the JAXBench convention (CONFIG, "
                                            "create_inputs, workload)")
    p.add_argument("--spec", required=True, help="binary KernelSpec (maxkernel spec SPEC --out FILE)")
    p.add_argument("--kernel", required=True, help="the kernel module (defines workload)")
    p.add_argument("--out", required=True, help="where to write the exported module")
    p.add_argument("--schema-dir", default=_default_schema_dir(), help="directory of the *.capnp schemas")
    args = p.parse_args(argv)
    try:
        spec = _read_spec(args.spec, args.schema_dir)
        try:
            with open(args.kernel, encoding="utf-8") as f:
                kernel_source = f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise ExportError(2, f"{args.kernel}: cannot read: {e}") from None
        tmp = args.out + ".tmp"
        try:
            notes = export(spec, kernel_source, tmp)
            os.replace(tmp, args.out)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    except ExportError as e:
        print(f"export: {e.message}", file=sys.stderr)
        return e.code
    for n in notes:
        print(f"export: note: {n}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
