"""Reduced problem sizes for fast interpret-mode correctness tests.

reduced_sizes(task, configuration, blocks) -> {original dimension size: reduced size}; {} when
nothing can be reduced safely. blocks are the (array_shape, block_shape) pairs of the
candidate's blocked operands (block dims of -1/None are squeezed, i.e. blocks of 1).

The rule, by dimension size S (every dim of size S gets the same reduced size r(S) <= S):
  * blocked (some operand tiles S with block b < S, possibly several b): r(S) = S - k*L with L
    the lcm of those b and k as large as possible while r(S) >= 2*max(b). So r(S) keeps
    S mod b (the ragged last block stays ragged) and every blocked axis keeps >= 2 grid steps;
  * a full-size block on one of the last two dims of some operand: S is left alone (shrinking
    it would break the (8,128) rule for the block, which equals the array dim there);
  * otherwise (not blocked, e.g. leading full-block dims or dims the kernel never tiles):
    S < 1024 is left alone; larger S becomes 512 + S mod 512.
The map is then realized per format:
  (b) native specs: the named dimensions shrink (generators see the reduced dims);
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


def reduced_sizes(task, configuration: int, blocks: list) -> dict[int, int]:
    rule = _targets(task, configuration, blocks)
    if not rule:
        return {}
    if task.format == "native":
        # named dims only; code generators get the reduced dims, so structure stays consistent
        named = set(task.dims.values())
        return {s: r for s, r in rule.items() if s in named}
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
