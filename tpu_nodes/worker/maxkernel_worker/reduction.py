"""Reduced problem sizes for fast interpret-mode correctness tests.

reduced_sizes(task, configuration, blocks) -> the sizes to test at; {} when nothing can be
reduced safely. blocks are the (array_shape, block_shape) pairs of the
candidate's blocked operands (block dims of -1/None are squeezed, i.e. blocks of 1).

Native specs (named dims) are reduced BY NAME: the result is {dim name: reduced size} (only
the dims that change), and make_args builds every input's shape from its dimNames (literal axes
keep their size; code generators receive the reduced dims). Blocks are mapped to names through
the kernel input whose full shape equals the blocked operand's array shape (outputs of the same
shape map the same way); an operand matching no input maps by equal size at the same axis from
the end, else by equal size. Per name:
  * blocked (tiled by b < full on some operand, possibly several b): the reduced size keeps
    full mod lcm(b) and at least two grid steps (>= 2*max(b));
  * a full-size block on one of an operand's last two axes freezes the name at full size;
  * unblocked: min(full, 128) if the name is the last axis of some >=2-D input, min(full, 16)
    if second-to-last, else min(full, 8) (batch, heads, counts; 1-D inputs count as leading);
  * divisibility found at full size is kept between dims sharing a kind of position (last,
    second-to-last, leading; integer inputs' axes count as leading): when full(a) divides
    full(b) (a < b), the reduced
    b is a multiple of the reduced a, and for two leading dims at least min(b/a, 2) times it
    (HQ/HKV keeps a group of two or more heads; NUM_PAGES stays a multiple of NUM_SEQS and PAGES_PER_SEQ); a static int
    argument (> 1) dividing a dim keeps dividing it (GroupNorm groups). Sizes only grow to fix.
  * validation: the inputs are drawn at the reduced dims (float inputs over 4M elements as
    zero placeholders) and the reference must trace under jax.eval_shape (or, if it reads
    values, run); otherwise the caps are multiplied by 4, then 16, then full size ({}).
  * cost: when the largest value the reference computes at the plan is over 256 MiB (blocked
    dims kept large, e.g. attention scores at S 4096 tiled by 2048), the leading (count) dims
    are planned again with a cap of 1 (relations above still hold) and that plan is taken if
    the reference runs on it and computes less.
  * derived dims (NamedDim.expression, e.g. SEQ_BOUNDS = MAX_SEQS + 1) are never planned on
    their own: the rules above plan the other dims, and each derived dim is recomputed from
    them (task.reduced_dims; the result lists it when it changes). A derived dim may be the
    divisor of a divisibility relation, never the dim raised to keep one. When a derived
    value comes out illegal (below 1, above its full size, not on its block lattice, or
    changed while frozen by a full block), the dims it is computed from are pinned at full
    size and the plan is made again.

JAXBench / MaxKernel tasks are reduced BY SIZE VALUE: {original dimension size: reduced size},
every dim of size S gets the same r(S) <= S:
  * blocked (some operand tiles S with block b < S, possibly several b): r(S) = S - k*L with L
    the lcm of those b and k as large as possible while r(S) >= 2*max(b). So r(S) keeps
    S mod b (the ragged last block stays ragged) and every blocked axis keeps >= 2 grid steps;
  * a full-size block on one of the last two dims of some operand: S is left alone (shrinking
    it would break the (8,128) rule for the block, which equals the array dim there);
  * otherwise (not blocked, e.g. leading full-block dims or dims the kernel never tiles):
    S < 1024 is left alone; larger S becomes 512 + S mod 512.
That map is then realized per format:
  (a) JAXBench / MaxKernel with integer entries in a `CONFIG = {...}` literal: CONFIG entries
      are shrunk one by one (largest first) to values that move the dims they drive to their
      targets; each trial re-runs create_inputs / get_inputs under eval_shape and is kept only
      when every dim of the inputs and the reference's outputs maps consistently (one new size
      per old size) within the rule above. make_args then runs the task's code with that CONFIG,
      so structural inputs (group sizes, page tables) stay consistent;
  (c) otherwise by value: the map applies to every dim; float inputs are redrawn at the reduced
      shapes with the task's mean/std; a static int equal to a reduced size follows it. Refused
      ({}) when the task has integer array inputs (their values may encode the sizes) or when
      the reference's output shapes do not follow the map.
"""

from __future__ import annotations

import math

import jax
import numpy as np

from .dim_expression import DimError
from .errors import WorkerError

_UNBLOCKED_MIN = 1024
_UNBLOCKED_BASE = 512


def _targets(task, configuration: int, blocks) -> dict[int, int]:
    blocked: dict[int, set] = {}
    frozen: set = set()
    for array_shape, block_shape in blocks:
        array_shape, block_shape = tuple(array_shape), tuple(block_shape)
        n = len(array_shape)
        for axis, (s, b) in enumerate(zip(array_shape, block_shape)):
            s = int(s)
            b = 1 if b is None or int(b) < 0 else int(b)
            if b >= s:
                if axis >= n - 2:
                    frozen.add(s)
            else:
                blocked.setdefault(s, set()).add(b)
    sizes = set(blocked)
    for a in task.abstract_args(configuration):
        if isinstance(a, jax.ShapeDtypeStruct):
            sizes.update(int(s) for s in a.shape)
    targets = {}
    for s in sizes:
        if s in frozen:
            continue
        if s in blocked:
            bs = blocked[s]
            lcm = math.lcm(*bs)
            floor = 2 * max(bs)
            k = (s - floor) // lcm if s > floor else 0
            r = s - k * lcm
        elif s >= _UNBLOCKED_MIN:
            r = _UNBLOCKED_BASE + s % _UNBLOCKED_BASE
        else:
            r = s
        if r < s:
            targets[s] = r
    return _Rule(targets, blocked, frozen)


class _Rule(dict):
    """The target map, plus what any achieved map must respect."""

    def __init__(self, targets, blocked, frozen):
        super().__init__(targets)
        self.blocked, self.frozen = blocked, frozen

    def allows(self, s: int, n: int) -> bool:
        if n == s:
            return True
        if n > s or n < 1 or s in self.frozen:
            return False
        if s in self.blocked:
            bs = self.blocked[s]
            return all((s - n) % b == 0 for b in bs) and n >= 2 * max(bs)
        return True


def _shape_map(old: list, new: list) -> dict | None:
    """old size -> new size over corresponding arrays; None when not one consistent map."""
    if len(old) != len(new):
        return None
    m: dict = {}
    for a, b in zip(old, new):
        a_arr, b_arr = isinstance(a, jax.ShapeDtypeStruct), isinstance(b, jax.ShapeDtypeStruct)
        if a_arr != b_arr:
            return None
        if not a_arr:
            continue
        if len(a.shape) != len(b.shape) or a.dtype != b.dtype:
            return None
        for s, n in zip(a.shape, b.shape):
            if m.setdefault(int(s), int(n)) != int(n):
                return None
    return m


def _outputs_abstract(task, configuration, args, overrides=None):
    from .task_dir import _outputs
    return [jax.ShapeDtypeStruct(tuple(o["shape"]), o["dtype"])
            for o in _outputs(task.program, args, configuration, overrides)]


def _config_plan(task, configuration: int, rule: _Rule):
    """Greedy CONFIG search; returns (achieved map, overrides) or None."""
    knobs = task.program.knobs()
    if not knobs or not rule:
        return None
    base_args = task.abstract_args(configuration)
    try:
        base_out = _outputs_abstract(task, configuration, base_args)
    except Exception:
        return None
    overrides: dict = {}
    achieved: dict = {}
    for name, v in sorted(knobs.items(), key=lambda kv: -kv[1]):
        if v <= 1:
            continue
        candidates = []
        if v in rule:
            candidates.append(rule[v])
        for s, r in rule.items():
            if s != v and s % v == 0 and r % (s // v) == 0:
                candidates.append(r // (s // v))
        for cand in dict.fromkeys(candidates):
            if not 1 <= cand < v:
                continue
            trial = dict(overrides, **{name: cand})
            try:
                args = task.program.abstract_configurations(trial)[configuration]
                out = _outputs_abstract(task, configuration, args, trial)
            except Exception:
                continue
            m_in, m_out = _shape_map(base_args, args), _shape_map(base_out, out)
            if m_in is None or m_out is None:
                continue
            merged = dict(m_in)
            if any(merged.setdefault(s, n) != n for s, n in m_out.items()):
                continue
            if not all(rule.allows(s, n) for s, n in merged.items()):
                continue
            changed = {s: n for s, n in merged.items() if s != n}
            if changed == achieved:
                continue   # this entry drives nothing we want to shrink
            overrides, achieved = trial, changed
            break
    return (achieved, overrides) if achieved else None


def _value_plan(task, configuration: int, sizes: dict) -> bool:
    """Whether the by-value redraw can realize `sizes` for this task."""
    args = task.abstract_args(configuration)
    if any(isinstance(a, jax.ShapeDtypeStruct) and not jax.numpy.issubdtype(a.dtype, jax.numpy.floating)
           for a in args):
        return False
    new_args = [jax.ShapeDtypeStruct(tuple(sizes.get(int(s), int(s)) for s in a.shape), a.dtype)
                if isinstance(a, jax.ShapeDtypeStruct) else (sizes.get(a, a) if type(a) is int else a)
                for a in args]
    try:
        old_out = _outputs_abstract(task, configuration, args)
        new_out = _outputs_abstract(task, configuration, new_args)
    except Exception:
        return False
    m = _shape_map(old_out, new_out)
    return m is not None and all(sizes.get(s, s) == n for s, n in m.items())


def reduced_sizes(task, configuration: int, blocks: list) -> dict:
    if task.format == "native":
        return _native_sizes(task, configuration, blocks)
    rule = _targets(task, configuration, blocks)
    if not rule:
        return {}
    plan = _config_plan(task, configuration, rule)
    if plan is not None:
        achieved, overrides = plan
        task.plans[(configuration, frozenset(achieved.items()))] = ("config", overrides)
        return achieved
    sizes = dict(rule)
    if _value_plan(task, configuration, sizes):
        task.plans[(configuration, frozenset(sizes.items()))] = ("value", sizes)
        return sizes
    return {}


def plan_for(task, configuration: int, sizes: dict):
    """A plan realizing exactly `sizes` (when make_args gets sizes reduced_sizes did not register)."""
    rule = _Rule(sizes, {}, set())
    plan = _config_plan(task, configuration, rule)
    if plan is not None and plan[0] == sizes:
        result = ("config", plan[1])
    elif _value_plan(task, configuration, sizes):
        result = ("value", sizes)
    else:
        raise WorkerError("internal", f"task {task.name}: sizes {sizes} cannot be applied to configuration "
                                      f"{configuration}")
    task.plans[(configuration, frozenset(sizes.items()))] = result
    return result


# ----------------------------------------------------------------------------- native specs

_CAP_LAST, _CAP_SECOND, _CAP_LEADING = 128, 16, 8
_NATIVE_LEVELS = (1, 4, 16)      # target multipliers tried before giving up (full size)
_DRAW_LIMIT = 1 << 22            # float inputs above this many elements are not drawn to validate
_VALUE_BUDGET = 256 << 20        # above this largest reference value, count dims shrink to 1


def _name_positions(task, configuration):
    """name -> {"last" | "second" | "leading"}, and per input (full shape, names per axis)."""
    positions: dict = {}
    inputs = []
    for inp in task._inputs(configuration):
        if inp.get("isStatic"):
            continue
        shape = tuple(int(s) for s in inp.get("type", {}).get("shape", []))
        names = list(inp.get("dimNames", []))[:len(shape)]
        names += [""] * (len(shape) - len(names))
        full = tuple(task.dims.get(n, s) if n else s for n, s in zip(names, shape))
        inputs.append((full, names))
        for axis, name in enumerate(names):
            if not name:
                continue
            # 1-D arrays (lengths, group sizes) and integer tables count as leading: their
            # axes are counts, not features
            dtype = inp.get("type", {}).get("dtype") or "float32"
            table = len(shape) < 2 or not jax.numpy.issubdtype(jax.numpy.dtype(dtype), jax.numpy.floating)
            where = ("leading" if table else "last" if axis == len(shape) - 1 else
                     "second" if axis == len(shape) - 2 else "leading")
            positions.setdefault(name, set()).add(where)
    return positions, inputs


def _native_constraints(task, positions, inputs, blocks):
    """(name -> set of block sizes tiling it, names frozen at full size)."""
    blocked: dict = {}
    frozen: set = set()
    for array_shape, block_shape in blocks:
        array_shape = tuple(int(s) for s in array_shape)
        n = len(array_shape)
        matches = [names for full, names in inputs if full == array_shape]
        for axis, (s, b) in enumerate(zip(array_shape, block_shape)):
            b = 1 if b is None or int(b) < 0 else int(b)
            if matches:
                names = {m[axis] for m in matches if m[axis]}
            else:
                # an output or intermediate: the names of that size at the same position from
                # the end, else every name of that size (conservative)
                from_end = n - axis
                same = {nm for full, nms in inputs for k, nm in enumerate(nms)
                        if nm and full[k] == s and len(full) - k == from_end}
                names = same or {nm for nm, size in task.dims.items() if size == s}
            for name in names:
                if b >= s:
                    if axis >= n - 2:
                        frozen.add(name)
                else:
                    blocked.setdefault(name, set()).add(b)
    return blocked, frozen


def _allowed(v, full, bs, frozen):
    """Whether reduced size v is legal for a dim of full size `full` under its blocks."""
    if v == full:
        return True
    if frozen or v > full or v < 1:
        return False
    if bs:
        return (full - v) % math.lcm(*bs) == 0 and v >= 2 * max(bs)
    return True


def _raise_to(v, full, bs, frozen, multiple_of=1):
    """The smallest legal size >= v that is a multiple of multiple_of (full size if none)."""
    if frozen or v >= full:
        return full
    step = math.lcm(*bs) if bs else 1
    if bs:   # first legal value >= v on the lattice full - k*step
        v = max(v, 2 * max(bs))
        v = full - ((full - v) // step) * step
    while v < full:
        if v % multiple_of == 0:
            return v
        v += step
    return full


def _derived_values(task, plan):
    """Every dim's value under `plan` (base dims), derived dims recomputed; None on a DimError,
    with the derived dim that failed."""
    try:
        return task.derived.apply({**task.dims, **plan}), None
    except DimError as e:
        return None, e.dim


def _native_plan(task, configuration, blocked, frozen, positions, level, leading_cap=_CAP_LEADING):
    """{name: reduced size} for the dims that change, derived dims included (recomputed).

    Derived dims are never planned: they follow the base dims they read. When one comes out
    illegal (below 1, above its full size, off its block lattice, or changed while frozen),
    the base dims it reads are pinned at full size and the plan is made again."""
    derived = task.derived
    pinned: set = set()
    while True:
        plan = _base_plan(task, configuration, blocked, frozen, positions, level, leading_cap, pinned)
        values, bad = _derived_values(task, plan)
        if bad is None:
            bad = next((d for d in derived.order
                        if not _allowed(values[d], task.dims[d], blocked.get(d), d in frozen)), None)
        if bad is None:
            return {n: v for n, v in values.items() if v != task.dims[n]}
        more = derived.bases(bad) - pinned
        if not more:   # cannot happen: pinned bases give the derived dim its full size
            return {}
        pinned |= more


def _base_plan(task, configuration, blocked, frozen, positions, level, leading_cap, pinned):
    dims = task.dims
    derived = task.derived
    plan = {}
    for name, full in dims.items():
        if name in derived:
            continue
        if name in pinned:
            plan[name] = full
            continue
        where = positions.get(name, {"leading"})
        cap = (_CAP_LAST if "last" in where else _CAP_SECOND if "second" in where else leading_cap)
        plan[name] = _raise_to(min(full, cap * level), full, blocked.get(name), name in frozen)
    # divisibility found among the full sizes (and static integer arguments) is kept, and a
    # dim that was at least twice a divisor stays so (HQ/HKV keeps a group of >= 2 heads)
    statics = {a for a in task.abstract_args(configuration)
               if type(a) is int and a > 1}
    # only between dims in the same kind of position (heads and heads, not head_dim and seq):
    # powers of two divide each other everywhere, and most of those relations mean nothing.
    # A derived dim may be the divisor (at its recomputed value), never the one raised.
    pairs = [(a, b) for a in dims for b in dims
             if b not in derived and dims[a] < dims[b] and dims[b] % dims[a] == 0
             and positions.get(a, {"leading"}) & positions.get(b, {"leading"})]
    counts = {n for n in dims if "leading" in positions.get(n, {"leading"})}
    fixed = [(s, b) for s in statics for b in dims
             if b not in derived and s < dims[b] and dims[b] % s == 0]
    for _ in range(4 * len(dims) + 4):
        changed = False
        values, _bad = _derived_values(task, plan)
        if values is None:
            break   # a derived dim fails here: _native_plan pins its bases
        for b_name, need in ([(b, (values[a], (min(dims[b] // dims[a], 2) if a in counts and b in counts
                                              else 1) * values[a])) for a, b in pairs] +
                             [(b, (s, s)) for s, b in fixed]):
            div, floor = need
            v = plan[b_name]
            if v % div == 0 and v >= floor:
                continue
            new = _raise_to(max(v, floor), dims[b_name], blocked.get(b_name), b_name in frozen, div)
            if new != v:
                plan[b_name], changed = new, True
                values, _bad = _derived_values(task, plan)
                if values is None:
                    break
        if not changed or values is None:
            break
    return plan


def _largest_value_bytes(jaxpr) -> int:
    """Bytes of the largest value a jaxpr (and the jaxprs inside it) computes."""
    largest = 0
    for eqn in jaxpr.eqns:
        for v in eqn.outvars:
            aval = getattr(v, "aval", None)
            if hasattr(aval, "shape") and hasattr(aval, "dtype"):
                largest = max(largest, int(np.prod(aval.shape)) * np.dtype(aval.dtype).itemsize)
        for param in eqn.params.values():
            for sub in (param if isinstance(param, (list, tuple)) else [param]):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    largest = max(largest, _largest_value_bytes(inner))
    return largest


def _native_cost(task, configuration, plan):
    """The largest value the reference computes at the reduced dims (bytes), or None when
    the inputs cannot be drawn or the reference fails on them."""
    import functools
    try:
        dims = task.reduced_dims(plan)
        args = task.placeholder_args(configuration, 0, plan, draw_below=_DRAW_LIMIT)
    except Exception:
        return None
    static = set(task.static_argnums(configuration))
    ref = task.reference(configuration)

    def bound(*dynamic):
        it = iter(dynamic)
        return ref(*[args[i] if i in static else next(it) for i in range(len(args))])

    dynamic = [a for i, a in enumerate(args) if i not in static]
    try:
        return _largest_value_bytes(jax.make_jaxpr(functools.partial(bound))(*dynamic).jaxpr)
    except Exception:
        pass
    # a reference that reads its inputs' values cannot be traced abstractly: run it for real
    # when that is cheap
    if any(int(np.prod(task._shape(inp, dims))) > _DRAW_LIMIT
           for inp in task._inputs(configuration) if not inp.get("isStatic")):
        return None
    try:
        out = jax.block_until_ready(ref(*task.make_args(configuration, 0, plan)))
        return max((int(np.asarray(o).nbytes) for o in jax.tree.leaves(out)), default=0)
    except Exception:
        return None


def _native_sizes(task, configuration: int, blocks) -> dict[str, int]:
    positions, inputs = _name_positions(task, configuration)
    blocked, frozen = _native_constraints(task, positions, inputs, blocks)
    key = (configuration, tuple(sorted((n, tuple(sorted(b))) for n, b in blocked.items())),
           tuple(sorted(frozen)))
    if key in task.plans:
        return dict(task.plans[key])
    result: dict = {}
    tried = []
    for level in _NATIVE_LEVELS:
        plan = _native_plan(task, configuration, blocked, frozen, positions, level)
        if not plan:
            break
        if plan in tried:
            continue
        tried.append(plan)
        cost = _native_cost(task, configuration, plan)
        if cost is None:
            continue
        result = plan
        # Blocked dims can keep a reference large (attention scores at S 4096 when the kernel
        # tiles S by 2048): then the count dims (batch, heads, sequences) go as low as the
        # relations between dims allow, if the reference still runs on that.
        if cost > _VALUE_BUDGET:
            lean = _native_plan(task, configuration, blocked, frozen, positions, level,
                                leading_cap=1)
            lean_cost = _native_cost(task, configuration, lean) if lean != plan else None
            if lean_cost is not None and lean_cost < cost:
                result = lean
        break
    task.plans[key] = result
    return dict(result)


# ----------------------------------------------------------------------------- ragged sizes
#
# The tester's shapeMode "ragged" (agents/tester, docs/agents.md): reduced sizes that leave a
# partial last block, so a kernel that assumes its blocks divide the array (a grid of
# size // block, an unmasked last block) is caught by the NaN-poisoned output. Starting from
# the reduced plan above, each dim that is free to change (not frozen by a full-size block on
# an operand's last two axes, not derived) is moved, one at a time in the spec's order, to
# r = k*unit + p: unit is the lcm of the candidate's blocks on it, else the (8,128) tile of its
# position (128 last axis, 8 second-to-last; leading dims without blocks have none), p an odd
# partial block (unit//2 + 1), k >= 1 (two grid steps, the last partial) with r <= the full
# size. A move is kept only when what the reduction guarantees still holds: derived dims are
# recomputed and stay within 1..full, divisibility among count (leading) dims and by static
# int arguments is kept, and the reference runs at the sizes. Relations between feature dims
# (M and K both powers of two) are not kept: they are coincidences the ragged case breaks on
# purpose.

_TILE_LAST, _TILE_SECOND = 128, 8


def _partial(unit: int) -> int:
    """An odd partial block (not a multiple of the sublane tile either)."""
    p = unit // 2 + 1 if unit >= 3 else 1
    if p % 2 == 0:
        p += 1
    return min(p, unit - 1)


def _ragged_size(v: int, full: int, unit: int) -> int | None:
    """A size <= full near v that leaves a partial last block of `unit`; None when none."""
    if unit <= 1:
        return None
    p = _partial(unit)
    k = max(1, v // unit - 1)
    while k > 1 and k * unit + p > full:
        k -= 1
    r = k * unit + p
    if r > full:
        r = p if p < full else None
    return r


def _is_ragged(v: int, unit: int) -> bool:
    return unit > 1 and v % unit != 0


def _tile(where: set) -> int:
    return _TILE_LAST if "last" in where else _TILE_SECOND if "second" in where else 1


def ragged_sizes(task, configuration: int, blocks: list) -> tuple[dict, list[str], str]:
    """(sizes, ragged, reason): sizes as reduced_sizes gives them (dim names for native specs,
    original sizes otherwise), the readable list of the dims left with a partial last block,
    and when that list is empty, why no dim could be made ragged."""
    if task.format == "native":
        return _native_ragged(task, configuration, blocks)
    return _value_ragged(task, configuration, blocks)


def _native_ragged(task, configuration, blocks):
    key = ("ragged", configuration, tuple(sorted((tuple(map(int, a)), tuple(-1 if b is None else int(b) for b in bs))
                                                 for a, bs in blocks)))
    if key in task.plans:
        return task.plans[key]
    positions, inputs = _name_positions(task, configuration)
    blocked, frozen = _native_constraints(task, positions, inputs, blocks)
    dims, derived = task.dims, task.derived
    base = dict(reduced_sizes(task, configuration, blocks))
    values = task.reduced_dims(base)
    plan = {n: values[n] for n in dims if n not in derived}
    counts = [n for n in dims if "leading" in positions.get(n, {"leading"})]
    count_pairs = [(a, b) for a in counts for b in counts
                   if dims[a] < dims[b] and dims[b] % dims[a] == 0 and values[b] % values[a] == 0]
    statics = {a for a in task.abstract_args(configuration) if type(a) is int and a > 1}
    static_pairs = [(s, b) for s in statics for b in dims if s < dims[b] and dims[b] % s == 0]

    def units(name):
        bs = {b for b in blocked.get(name, ()) if b > 1}
        return math.lcm(*bs) if bs else _tile(positions.get(name, {"leading"}))

    def keeps_guarantees(trial):
        vals, bad = _derived_values(task, trial)
        if vals is None:
            return None
        if any(not 1 <= vals[d] <= dims[d] for d in derived.order):
            return None
        if any(vals[b] % vals[a] for a, b in count_pairs) or any(vals[b] % s for s, b in static_pairs):
            return None
        return vals

    refused = []
    for name in dims:
        if name in derived or name in frozen:
            continue
        unit = units(name)
        if unit <= 1 or _is_ragged(plan[name], unit):
            continue
        r = _ragged_size(plan[name], dims[name], unit)
        if r is None:
            refused.append(f"{name} {dims[name]} is smaller than a partial {unit}-block can make ragged")
            continue
        trial = dict(plan, **{name: r})
        vals = keeps_guarantees(trial)
        if vals is None:
            refused.append(f"{name} {r} would break a derived dim or a divisibility the task keeps")
            continue
        if _native_cost(task, configuration, {n: v for n, v in vals.items() if v != dims[n]}) is None:
            refused.append(f"the reference does not run with {name} {r}")
            continue
        plan = trial
    values = task.reduced_dims(plan)
    sizes = {n: v for n, v in values.items() if v != dims[n]}
    ragged = [f"{n} {values[n]} ({values[n] // units(n)} blocks of {units(n)} + {values[n] % units(n)})"
              for n in dims if n not in frozen and _is_ragged(values[n], units(n))]
    reason = ""
    if not ragged:
        free = [n for n in dims if n not in derived and n not in frozen and units(n) > 1]
        reason = ("no dim is free to take a ragged size: " +
                  ("; ".join(refused) if refused else
                   "every dim is frozen by a full-size block, derived, or a count without blocks"
                   if not free else "no candidate size found"))
    result = (sizes, ragged, reason)
    task.plans[key] = result
    return result


def _value_ragged(task, configuration, blocks):
    """JAXBench / MaxKernel tasks: ragged targets by size value, realized like reductions."""
    rule = _targets(task, configuration, blocks)
    tiles: dict[int, int] = {}
    for a in task.abstract_args(configuration):
        if isinstance(a, jax.ShapeDtypeStruct) and len(a.shape) >= 2 and \
                jax.numpy.issubdtype(a.dtype, jax.numpy.floating):
            s_last, s_second = int(a.shape[-1]), int(a.shape[-2])
            tiles[s_last] = max(tiles.get(s_last, 1), _TILE_LAST)
            tiles[s_second] = max(tiles.get(s_second, 1), _TILE_SECOND)

    def unit(s):
        bs = {b for b in rule.blocked.get(s, ()) if b > 1}
        return math.lcm(*bs) if bs else tiles.get(s, 1)

    targets = {}
    for s in sorted(set(tiles) | set(rule.blocked)):
        if s in rule.frozen:
            continue
        v = rule.get(s, s)
        r = v if _is_ragged(v, unit(s)) else _ragged_size(v, s, unit(s))
        if r is not None and r != s:
            targets[s] = r
    if not targets:
        return {}, [], "no dimension is free to take a ragged size (full-size blocks or no tile)"
    ragged_rule = _RaggedRule(targets, rule.frozen)
    achieved = None
    plan = _config_plan(task, configuration, ragged_rule)
    if plan is not None and any(_is_ragged(n, unit(s)) for s, n in plan[0].items()):
        achieved = plan[0]
        task.plans[(configuration, frozenset(achieved.items()))] = ("config", plan[1])
    elif _value_plan(task, configuration, targets):
        achieved = targets
        task.plans[(configuration, frozenset(achieved.items()))] = ("value", targets)
    if achieved is None:
        return {}, [], ("the task's sizes cannot be made ragged: its CONFIG drives no ragged "
                        "size and its inputs cannot be redrawn at other sizes")
    ragged = [f"{s}->{n} ({n // unit(s)} blocks of {unit(s)} + {n % unit(s)})"
              for s, n in sorted(achieved.items()) if _is_ragged(n, unit(s))]
    return achieved, ragged, ""


class _RaggedRule(_Rule):
    """Targets off the block lattice: any smaller size of a dim that is not frozen."""

    def __init__(self, targets, frozen):
        super().__init__(targets, {}, frozen)

    def allows(self, s: int, n: int) -> bool:
        return n == s or (s not in self.frozen and 1 <= n < s)
