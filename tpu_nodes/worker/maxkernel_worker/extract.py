"""KernelStructure of a candidate: its pallas_calls (grid, blocks, index-map movement, per-step
work) and the work it does outside them, read from a trace. Input of the TPU performance model.

Index maps are evaluated along each grid axis separately (from a few base points), never over
the whole grid, so a grid of a million steps costs the same as a small one. Data-dependent index
maps (scalar prefetch: page tables, group offsets) are evaluated on the task's own prefetch
values, computed by evaluating only the slice of the program that produces them.

Per-step work is the average over the grid, from walking the kernel body once: loops with
static trip counts multiply what they contain; each branch of a cond (pl.when) whose predicate
follows from program ids, grid sizes, constants and scalar-prefetch tables is weighted by the
share of grid steps taking it (init/finalize branches, causal block skipping, block-sparse
masks), and a fori_loop whose bounds follow from them (paged attention's loop over a
sequence's blocks) by its mean trip count, both evaluated on every grid point or on a fixed
sample of MAX_WHEN_POINTS; a cond on data counts its most expensive branch on every step (an
upper bound) and a loop whose trip count only the data knows counts once: both are named in
unknownPrimitives, as is every primitive no cost rule prices.
"""

from __future__ import annotations

import hashlib
import json

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jex_core

from .analyze import (DMA_START, REF_ACCESS, REF_WRITE, Walker, aval_of, has_cost_rule,
                      itemsize, nbytes, pallas_name, sub_jaxprs, tensor_type, trace,
                      while_trip_count)
from .errors import WorkerError

SCHEMA_VERSION = 1
MAX_SAMPLES_PER_AXIS = 4096   # index-map evaluations per grid axis (all base points together)
UNKNOWN_AXIS_SAMPLES = 8      # positions sampled along a dynamic axis of unknown size
DEFAULT_BUFFERING = 2         # pallas_call double-buffers every pipelined block
MAX_WHEN_POINTS = 4096        # grid points a cond predicate is evaluated on (all when fewer)
WHEN_SEED = 0                 # the sample of a bigger grid is the same on every run
COND_UNKNOWN = "cond (branch frequency unknown, counted every step)"
WHILE_UNKNOWN = "while (trip count unknown, counted once)"   # as analyze.Walker names it

_MEMORY_SPACES = {"default": "vmem", "vmem": "vmem", "vmem_shared": "vmem", "smem": "smem",
                  "any": "any", "hbm": "hbm", "semaphore_mem": "semaphore",
                  "semaphore": "semaphore", "index": "smem", "cmem": "vmem", "host": "hbm"}


class _Unknown(Exception):
    """A value that cannot be computed before running the kernel."""


def extract(fn, abstract_args: list, static_argnums: tuple, concrete_args=None) -> dict:
    """KernelStructure dict of fn traced on abstract_args.

    concrete_args: zero-argument callable returning the full-size concrete args, called only
    when a scalar-prefetch operand or a dynamic grid size is needed.
    """
    closed = trace(fn, abstract_args, static_argnums)
    found = []

    def on_pallas(eqn, refs, count, evaluable, node_id):
        found.append((eqn, refs, count, evaluable, node_id))

    walker = Walker(on_pallas=on_pallas)
    walker.walk_top(closed)
    values = _PrefetchValues(walker, concrete_args, static_argnums, closed.jaxpr.invars)
    calls = []
    for i, (eqn, refs, count, evaluable, node_id) in enumerate(found):
        try:
            call = _pallas_call(eqn, refs, count, evaluable, values)
        except WorkerError:
            raise
        except Exception as e:  # JAX internals we did not foresee: say which call
            raise WorkerError("internal", f"extracting pallas_call {i} ({pallas_name(eqn)}): "
                              f"{type(e).__name__}: {e}") from e
        calls.append(call)
        walker.nodes[node_id]["params"] = json.dumps({"pallasCall": i, "name": call["name"]})
    return {"schemaVersion": SCHEMA_VERSION, "pallasCalls": calls,
            "outside": walker.graph(closed)}


def blocks_of(structure: dict) -> list[tuple[tuple, tuple]]:
    """(array_shape, block_shape) of every blocked input and output of every pallas_call.

    Operands left in HBM (memory space any/hbm) are listed with their whole shape as the block,
    which pins their sizes: a kernel that DMAs them by hand may rely on the full size.
    """
    out = []
    for call in structure.get("pallasCalls", []):
        for op in call["operands"]:
            if op["role"] == "scalarPrefetch":
                continue
            out.append((tuple(op["type"]["shape"]), tuple(op["blockShape"])))
    return out


# ----------------------------------------------------------------------------- one pallas_call

def _pallas_call(eqn, refs, count, evaluable, values) -> dict:
    p = eqn.params
    gm = p["grid_mapping"]
    n_dyn = sum(1 for d in gm.grid if not _is_static(d))
    n_idx = gm.num_index_operands
    dyn_refs, idx_refs = refs[:n_dyn], refs[n_dyn:n_dyn + n_idx]
    idx_vars = eqn.invars[n_dyn:n_dyn + n_idx]

    # Dynamic grid sizes and scalar-prefetch tables come from one evaluation of the slice of
    # the program that computes them, only when an index map or the grid needs them.
    uses = [_uses_prefetch(bm.index_map_jaxpr, len(gm.grid)) for bm in gm.block_mappings]
    vals = _Unknown()
    if evaluable and (n_dyn or any(uses)):
        vals = values.get(dyn_refs + idx_refs)
    dyn = _Unknown() if isinstance(vals, _Unknown) else vals[:n_dyn]
    prefetch = _Unknown() if isinstance(vals, _Unknown) else vals[n_dyn:]
    grid = _grid(gm.grid, dyn)
    semantics = _dimension_semantics(p.get("compiler_params"), len(grid),
                                     tuple(getattr(gm, "vmapped_dims", ()) or ()))

    operands = []
    for k, v in enumerate(idx_vars):
        operands.append({"role": "scalarPrefetch", "index": k, "type": tensor_type(v),
                         "blockShape": list(tensor_type(v)["shape"]), "memorySpace": "smem",
                         "buffering": 1, "dependence": [], "blockBytes": nbytes(v)})
    for j, bm in enumerate(gm.block_mappings):
        is_input = j < gm.num_inputs
        space = _memory_space(bm.transformed_block_aval)
        block_shape = [_block_dim(b) for b in bm.block_shape]
        dependence = _dependence(bm, grid, prefetch if uses[j] else [])
        operands.append({
            "role": "input" if is_input else "output",
            "index": j if is_input else j - gm.num_inputs,
            "type": tensor_type(bm.array_aval),
            "blockShape": block_shape,
            "memorySpace": space,
            "buffering": _buffering(bm, space),
            "dependence": dependence,
            "blockBytes": int(np.prod([max(b, 1) for b in block_shape], dtype=np.int64))
                          * itemsize(bm.array_aval),
        })

    scratch = [{"type": tensor_type(a), "memorySpace": _memory_space(a), "bytes": nbytes(a)}
               for a in gm.scratch_avals]

    # Prefetch tables a cond predicate reads: those computed above, else computed on demand.
    tried = evaluable and (n_dyn or any(uses))
    fetched = {}

    def body_prefetch():
        if "v" not in fetched:
            v = vals if tried or not evaluable else values.get(dyn_refs + idx_refs)
            fetched["v"] = v if isinstance(v, _Unknown) else v[n_dyn:]
        return fetched["v"]

    vmapped = set(getattr(gm, "vmapped_dims", ()) or ())
    user_grid = [g for a, g in enumerate(grid) if a not in vmapped]  # what program_id sees
    body_jaxpr = p["jaxpr"]
    body_in = [(-1, ("in", k)) for k in range(len(body_jaxpr.invars))]
    writes = _TableWrites(n_idx)
    writes.walk(body_jaxpr, [], body_in, 1.0, False)
    steps = int(np.prod(grid, dtype=np.int64)) if all(g >= 0 for g in grid) else -1
    body = _BodyWalker(user_grid, n_idx, body_prefetch, writes, steps)
    body.walk(body_jaxpr, [], body_in, 1.0, False)
    step_bytes = sum(n["bytes"] * n["count"] for n in body.nodes if n["primitive"] in REF_ACCESS)
    step_dma = sum(n["bytes"] * n["count"] for n in body.nodes if n["primitive"] in DMA_START)
    step_flops = body.total("flops")
    primitives = _primitives(body_jaxpr)
    unknown = {name for name in primitives if not has_cost_rule(name)} | body.unknown

    cost = p.get("cost_estimate")
    aliases = []
    for a, b in p.get("input_output_aliases", ()) or ():
        aliases += [int(a), int(b)]
    return {
        "name": pallas_name(eqn),
        "grid": grid,
        "dimensionSemantics": semantics,
        "operands": operands,
        "scratch": scratch,
        "numScalarPrefetch": n_idx,
        "vmemLimitBytes": _vmem_limit(p.get("compiler_params")),
        "stepFlops": step_flops,
        "stepTranscendentals": body.total("transcendentals"),
        "stepBytes": float(step_bytes),
        "costFlops": float(getattr(cost, "flops", 0) or 0),
        "costTranscendentals": float(getattr(cost, "transcendentals", 0) or 0),
        "costBytes": float(getattr(cost, "bytes_accessed", 0) or 0),
        "count": float(count),
        "bodyPrimitives": sorted(primitives),
        "inputOutputAliases": aliases,
        "stepDots": _merge_dots(body.dots()),
        "stepVpuFlops": max(0.0, step_flops - body.matmul_flops()),
        "stepDmaBytes": float(step_dma),
        "unknownPrimitives": sorted(unknown),
    }


def _merge_dots(dots: list[dict]) -> list[dict]:
    """One entry per distinct matmul (sizes and dtypes), counts summed, in body order."""
    merged: dict[tuple, dict] = {}
    for d in dots:
        key = tuple(v for k, v in sorted(d.items()) if k != "count")
        if key in merged:
            merged[key]["count"] += d["count"]
        else:
            merged[key] = dict(d)
    return list(merged.values())


def _is_static(d) -> bool:
    try:
        int(d)
        return True
    except Exception:
        return False


def _grid(grid, dyn) -> list[int]:
    """Grid sizes; a dynamic size comes from its operand's value, -1 when it is unknown."""
    out, k = [], 0
    for d in grid:
        if _is_static(d):
            out.append(int(d))
            continue
        out.append(-1 if isinstance(dyn, _Unknown) else int(np.asarray(dyn[k]).reshape(-1)[0]))
        k += 1
    return out


def _compiler_param(cp, name):
    if cp is None:
        return None
    if isinstance(cp, dict):  # older JAX: {"mosaic": {...}}
        for v in cp.values():
            if isinstance(v, dict) and name in v:
                return v[name]
            if hasattr(v, name):
                return getattr(v, name)
        return cp.get(name)
    return getattr(cp, name, None)


def _dimension_semantics(cp, ndim, vmapped) -> list[str]:
    """Per grid axis, as Mosaic lowers them: the user's semantics for the user's axes
    ("arbitrary" when none are given), "parallel" for axes added by jax.vmap."""
    sem = _compiler_param(cp, "dimension_semantics")
    user = [str(getattr(s, "value", s)).lower().rsplit(".", 1)[-1] for s in (sem or ())]
    n_user = ndim - len(vmapped)
    if len(user) != n_user:
        user = (user + ["arbitrary"] * n_user)[:n_user]
    it = iter(user)
    return ["parallel" if i in vmapped else next(it) for i in range(ndim)]


def _vmem_limit(cp) -> int:
    v = _compiler_param(cp, "vmem_limit_bytes")
    return int(v) if v else 0


def _memory_space(aval) -> str:
    ms = getattr(aval, "memory_space", None)
    if ms is None:
        return "vmem"
    s = str(getattr(ms, "value", ms)).lower()
    return _MEMORY_SPACES.get(s, s)


def _block_dim(b) -> int:
    if b is None or type(b).__name__ == "Squeezed":
        return -1
    size = getattr(b, "block_size", b)
    try:
        return int(size)
    except Exception:
        return -1


def _buffering(bm, space) -> int:
    # Blocks left in HBM are not copied by the pipeline: no VMEM buffer.
    if space in ("any", "hbm"):
        return 0
    mode = bm.pipeline_mode
    n = getattr(mode, "buffer_count", None)
    return int(n) if n else DEFAULT_BUFFERING


def _primitives(jaxpr) -> set[str]:
    out = set()
    for eqn in jaxpr.eqns:
        out.add(eqn.primitive.name)
        for sj, _ in sub_jaxprs(eqn.params):
            out |= _primitives(sj)
    return out


# ----------------------------------------------------------------------------- pl.when

_PREFETCH = -1   # in an axes set: the value reads a scalar-prefetch table
_FIRST = -2      # in an axes set: the value reads a flag the body sets (see _BodyWalker)
_NOT_AXES = frozenset({_PREFETCH, _FIRST})


class _BodyWalker(Walker):
    """Walks a kernel body once, weighting each branch of a cond (pl.when) by the share of grid
    steps it runs on, so that per-step figures are averages over the grid.

    A predicate computed from program ids, grid sizes, constants and scalar-prefetch tables is
    evaluated with numpy on every grid point, or on a fixed random sample of MAX_WHEN_POINTS
    points when there are more; only the axes it reads are enumerated, so `k == 0` on a
    million-step grid is exact. A branch inside a branch gets the share of the steps its outer
    branches run on where it runs too (the product of conditional shares). A fori_loop whose
    bounds are computed the same way weighs its body by the mean trip count; what is nested in
    it weighs each grid point by that point's trips (a branch taken on the steps with long
    loops runs more often than on its share of the steps). A predicate on data (VMEM values,
    loop carries) counts its most expensive branch on every step, a loop bounded by data runs
    once: both are named in unknownPrimitives.

    A table the body writes is not constant. A cell it only ever sets to one constant, right
    after reading it in the same block (paged attention's init_flag), is a flag: the first
    execution of that block in the kernel reads the table's value, every later one the
    constant. Predicates and bounds reading it blend both: 1 / (grid steps * executions per
    step) of them see the initial value. Any other read of a written table is data.

    Eval refs of the body: ("in", k) for the k-th body operand; the first n_idx are the
    scalar-prefetch refs.
    """

    def __init__(self, grid, n_idx, prefetch, writes, steps):
        super().__init__()
        self.grid = grid
        self.n_idx = n_idx
        self.prefetch = prefetch   # () -> prefetch values or _Unknown
        self.writes = writes       # _TableWrites of the same body
        self.steps = steps         # grid steps of one kernel run (-1 unknown)
        self._flags: dict[int, object] = {}   # record of a flag read -> the constant it is set to
        # What the enclosing regions run on: ("branch", (index ref,), (branch, branches)) per
        # weighted cond branch, ("trips", (lower ref, upper ref), None) per loop counted over
        # the grid.
        self.taken: list[tuple] = []
        self.loops: list[tuple] = []   # (first record, ids of varying eval refs) per loop
        self._axes_memo: dict[int, frozenset] = {}

    # -- walking
    def eqn(self, eqn, refs, count, evaluable):
        # Inside a loop body the carries are bound to their initial values' refs: note them so
        # that predicates reading them are not evaluated as if they were constant.
        p = eqn.params
        name = eqn.primitive.name
        if name == "scan":
            varying = refs[p["num_consts"]:]
        elif name == "while":
            # A carry the body passes through unchanged (a fori_loop's upper bound) is not.
            body = p["body_jaxpr"].jaxpr
            first = p["body_nconsts"]
            varying = [r for k, r in enumerate(refs[p["cond_nconsts"] + first:])
                       if body.outvars[k] is not body.invars[first + k]]
        else:
            return super().eqn(eqn, refs, count, evaluable)
        self.loops.append((len(self.records), {id(r[1]) for r in varying}))
        try:
            return super().eqn(eqn, refs, count, evaluable)
        finally:
            self.loops.pop()

    def cond(self, eqn, refs, count):
        branches = eqn.params["branches"]
        index = refs[0][1]
        shares = self.branch_shares(index, len(branches), count)
        if shares is None:
            self.unknown.add(COND_UNKNOWN)
            return super().cond(eqn, refs, count)
        outs, best = None, -1.0
        for b, br in enumerate(branches):
            if shares[b] <= 0:
                continue  # never runs: costs nothing
            self.taken.append(("branch", (index,), (b, len(branches))))
            try:
                o = self.walk_sub(br.jaxpr, br.consts, refs[1:], count * shares[b], False)
            finally:
                self.taken.pop()
            if shares[b] > best:
                outs, best = o, shares[b]
        return outs

    def while_loop(self, eqn, refs, count):
        """A loop's body weighs its mean trip count: static bounds as the base walker counts
        them; a fori_loop's bounds computed over the grid like a cond predicate (conditioned
        on the enclosing branches and loops); once and named otherwise."""
        p = eqn.params
        cn, bn = p["cond_nconsts"], p["body_nconsts"]
        cond_consts, body_consts, carry = refs[:cn], refs[cn:cn + bn], refs[cn + bn:]
        # The bounds are read outside the loop: its own carries do not vary there, those of
        # enclosing loops do (an inner loop bounded by an outer counter is not counted from
        # the counter's initial value).
        top = self.loops.pop()
        try:
            bounds = _fori_bounds(p, cond_consts, carry)
            entry, trip = None, None
            if bounds is not None:
                trip = self.trip_mean(bounds, count)
                if trip is not None:
                    entry = ("trips", bounds, None)
            elif not any(self._varying_ref(r[1]) for r in cond_consts + carry):
                trip = while_trip_count(p["cond_jaxpr"], cond_consts, carry)
        finally:
            self.loops.append(top)
        if trip is None:
            self.unknown.add(WHILE_UNKNOWN)
            trip = 1.0
        cj, bj = p["cond_jaxpr"], p["body_jaxpr"]
        self.walk_sub(cj.jaxpr, cj.consts, cond_consts + carry, count * (trip + 1), False)
        if entry is not None:
            self.taken.append(entry)
        try:
            return self.walk_sub(bj.jaxpr, bj.consts, body_consts + carry, count * trip, False)
        finally:
            if entry is not None:
                self.taken.pop()

    # -- predicates and trip counts
    def branch_shares(self, index, n, count) -> list[float] | None:
        """Per branch, the share of the grid steps running the enclosing branches on which
        this cond takes it; None when the index cannot be computed from the grid."""
        def shares(got):
            (v,), w = got
            taken = np.clip(v.astype(np.int64), 0, n - 1)  # lax.cond clamps its index
            return np.array([np.sum(w * (taken == b)) / np.sum(w) for b in range(n)])
        got = self.blend((index,), shares, count)
        return None if got is None else [float(x) for x in got]

    def trip_mean(self, bounds, count) -> float | None:
        """Mean trip count of a loop from lower to upper over the grid steps running its
        enclosing regions (weighted by how often they run there); None when not computable."""
        def mean(got):
            (lo, hi), w = got
            trips = np.maximum(hi.astype(np.int64) - lo.astype(np.int64), 0)
            return np.sum(w * trips) / np.sum(w)
        got = self.blend(bounds, mean, count)
        return None if got is None else float(got)

    def blend(self, refs, stat, count):
        """stat of over_grid(refs); when the refs read a flag, blended with its value on the
        first execution, one of steps * count executions of this region in a kernel run."""
        got = self.over_grid(refs)
        if got is None:
            return None
        steady = stat(got[:2])
        if not got[2]:
            return steady
        first = self.over_grid(refs, first=True)
        if first is None:
            return None
        share = min(1.0, 1.0 / max(self.steps * count, 1e-30))
        return (1.0 - share) * steady + share * stat(first[:2])

    def over_grid(self, refs, first=False):
        """Values of scalar eval refs at every grid point (or a fixed sample), per point how
        often the enclosing regions run there (a branch 0 or 1, a loop its trip count), and
        whether the values read a flag (read at its initial value when `first`); None when a
        value cannot be computed from program ids, grid sizes, constants and tables."""
        if any(self._varying_ref(r) for r in refs):
            return None
        try:
            axes = set()
            for r in refs:
                axes |= self._axes(r)
            # The tables are computed only for a predicate nothing else makes unknown.
            if _PREFETCH in axes and isinstance(self.prefetch(), _Unknown):
                return None
            flagged = _FIRST in axes
            axes -= _NOT_AXES
            # Enclosing regions that share axes with these values (transitively) weigh them;
            # the others are independent of them on a product grid.
            outer = []
            for e in self.taken:
                ax = frozenset()
                for r in e[1]:
                    ax |= self._axes(r)
                outer.append((e, ax - _NOT_AXES))
            linked, grew = [], True
            while grew:
                grew = False
                for k, (e, ax) in enumerate(outer):
                    if k not in linked and ax & axes:
                        linked.append(k)
                        axes |= ax
                        grew = True
            cols, npts = self._points(sorted(axes))
            memo = {}

            def value(r):
                v = np.asarray(self._value(r, cols, npts, memo, first))
                return np.broadcast_to(v, (npts,))

            w = np.ones(npts)
            for k in linked:
                kind, rs, param = outer[k][0]
                vs = [value(r) for r in rs]
                if kind == "branch":
                    b, n = param
                    w = w * (np.clip(vs[0].astype(np.int64), 0, n - 1) == b)
                else:
                    w = w * np.maximum(vs[1].astype(np.int64) - vs[0].astype(np.int64), 0)
            if not w.any():  # the sample missed the enclosing regions: unweighted
                w = np.ones(npts)
            return [value(r) for r in refs], w, flagged
        except (_Unknown, _NotNumpy, ValueError, TypeError, IndexError, KeyError):
            return None

    def _points(self, axes):
        """Columns of grid coordinates over `axes`: every point, or a fixed uniform sample."""
        sizes = [self.grid[a] for a in axes]
        total = int(np.prod(sizes, dtype=np.int64)) if sizes else 1
        if total <= MAX_WHEN_POINTS:
            mesh = np.meshgrid(*[np.arange(n, dtype=np.int64) for n in sizes], indexing="ij")
            return {a: m.reshape(-1) for a, m in zip(axes, mesh)}, total
        rng = np.random.default_rng(WHEN_SEED)
        return {a: rng.integers(0, n, MAX_WHEN_POINTS) for a, n in zip(axes, sizes)}, \
            MAX_WHEN_POINTS

    def _varying_ref(self, ref) -> bool:
        return any(id(ref) in ids for _, ids in self.loops)

    def _varying_record(self, n, operands) -> bool:
        return any(n >= start and any(id(r) in ids for r in operands)
                   for start, ids in self.loops)

    def _axes(self, ref) -> frozenset:
        """Grid axes a scalar eval ref depends on, and _PREFETCH when it reads a scalar-prefetch
        table; _Unknown when it is not computable from those."""
        kind = ref[0]
        if kind in ("lit", "const"):
            if ref[1] is None:
                raise _Unknown()
            return frozenset()
        if kind == "in":
            if ref[1] >= self.n_idx:
                raise _Unknown()  # a VMEM / HBM / scratch operand: data
            return frozenset({_PREFETCH})
        n = ref[1]
        if n in self._axes_memo:
            return self._axes_memo[n]
        eqn, operands, _ = self.records[n]
        name = eqn.primitive.name
        if self._varying_record(n, operands):
            raise _Unknown()
        if name in ("program_id", "num_programs"):
            axis = int(eqn.params["axis"])
            if not 0 <= axis < len(self.grid) or self.grid[axis] < 0:
                raise _Unknown()
            out = frozenset({axis}) if name == "program_id" else frozenset()
        elif name == "get" and operands and operands[0][0] == "in" \
                and operands[0][1] in self.writes.cells:
            out = self._written_read(n, eqn, operands)
        else:
            if name not in _BODY_SCALAR_OPS:
                raise _Unknown()
            if any(tuple(getattr(aval_of(v), "shape", (0,))) != () for v in eqn.outvars):
                raise _Unknown()  # vector work on data, not a scalar predicate
            out = frozenset()
            for r in operands:
                out |= self._axes(r)
        self._axes_memo[n] = out
        return out

    def _written_read(self, n, eqn, operands) -> frozenset:
        """Axes of a read of a table the body writes: a flag's, or _Unknown (see the class)."""
        cells = self.writes.cells[operands[0][1]]
        cell = _cell(eqn, operands[1:])
        if cells is None or cell is None or self.steps < 0:
            raise _Unknown()
        stores = cells.get(cell)
        if not stores:   # another cell of the table is written, not this one
            return frozenset({_PREFETCH})
        values = {v for v, _ in stores}
        block, pos = self.writes.where[id(eqn)]
        if len(values) != 1 or not any(b == block and p > pos for _, (b, p) in stores):
            raise _Unknown()
        self._flags[n] = values.pop()
        return frozenset({_PREFETCH, _FIRST})

    def _value(self, ref, cols, npts, memo, first=False):
        kind = ref[0]
        if kind in ("lit", "const"):
            return np.asarray(ref[1])
        if kind == "in":
            return np.asarray(self.prefetch()[ref[1]])
        n, k = ref[1], ref[2]
        if n not in memo:
            eqn, operands, _ = self.records[n]
            name = eqn.primitive.name
            if name == "program_id":
                memo[n] = [cols[int(eqn.params["axis"])]]
            elif name == "num_programs":
                memo[n] = [np.int64(self.grid[int(eqn.params["axis"])])]
            elif n in self._flags and not first:
                memo[n] = [np.asarray(self._flags[n])]
            else:
                xs = [self._value(r, cols, npts, memo, first) for r in operands]
                memo[n] = xs[:1] if name in _BODY_IDENTITY else _np_apply(eqn, xs, npts)
        return memo[n][k]


class _TableWrites(Walker):
    """Where a kernel body writes its scalar-prefetch tables, in every branch and loop body:
    cells[table][cell] lists (constant stored, (id of its jaxpr, position)); cells[table] is
    None for a table written otherwise (a computed value, a dynamic cell, a masked store).
    where[id(eqn)] is every equation's (id of its jaxpr, position)."""

    def __init__(self, n_idx):
        super().__init__()
        self.n_idx = n_idx
        self.cells: dict[int, dict | None] = {}
        self.where: dict[int, tuple] = {}

    def walk(self, jaxpr, const_refs, in_refs, count, evaluable):
        for pos, e in enumerate(jaxpr.eqns):
            self.where[id(e)] = (id(jaxpr), pos)
        return super().walk(jaxpr, const_refs, in_refs, count, evaluable)

    def eqn(self, eqn, refs, count, evaluable):
        name = eqn.primitive.name
        ref = refs[0][1] if refs else None
        if name in REF_WRITE and ref is not None and ref[0] == "in" and ref[1] < self.n_idx:
            k = ref[1]
            value = refs[1][1] if name == "swap" else ("lit", None)
            cell = _cell(eqn, [r[1] for r in refs[2:]]) if name == "swap" else None
            if cell is None or value[0] not in ("lit", "const") or value[1] is None \
                    or np.ndim(value[1]) != 0 or self.cells.get(k, {}) is None:
                self.cells[k] = None
            else:
                stored = np.asarray(value[1]).item()
                self.cells.setdefault(k, {}).setdefault(cell, []).append(
                    (stored, self.where[id(eqn)]))
        return super().eqn(eqn, refs, count, evaluable)

    def add_node(self, eqn, refs, count, evaluable, **_):
        # Only the wiring matters here: no costs, types or parameters.
        node_id = len(self.nodes)
        self.nodes.append({"flops": 0.0, "transcendentals": 0.0})
        rec = self.record(eqn, refs, evaluable)
        return node_id, [(node_id, ("rec", rec, k)) for k in range(len(eqn.outvars))]

    def cond(self, eqn, refs, count):
        outs = None
        for br in eqn.params["branches"]:   # every branch, not only the most expensive
            outs = self.walk_sub(br.jaxpr, br.consts, refs[1:], count, False)
        return outs


def _cell(eqn, index_refs) -> tuple | None:
    """The cell a scalar get / swap addresses, from the eval refs of its indexer operands;
    None when an index is not a constant or the access is not one scalar."""
    vals = []
    for r in index_refs:
        if r[0] not in ("lit", "const") or r[1] is None:
            return None
        vals.append(r[1])
    try:
        transforms = jax.tree_util.tree_unflatten(eqn.params["tree"], vals)
    except Exception:
        return None
    if len(transforms) != 1 or not hasattr(transforms[0], "indices"):
        return None
    cell = []
    for i in transforms[0].indices:
        if hasattr(i, "start"):
            if getattr(i, "size", None) != 1 or getattr(i, "stride", 1) != 1:
                return None
            i = i.start
        try:
            cell.append(int(np.asarray(i)))
        except Exception:
            return None
    return tuple(cell)


def _fori_bounds(p, cond_consts, carry):
    """(lower, upper) eval refs of a while loop that is a fori_loop with dynamic bounds, as
    lax.fori_loop lowers it: carry (i, upper, ...), cond `i < upper`, body `i + 1` and upper
    passed through (or an upper bound among the cond's consts); None for any other loop."""
    cj, bj = p["cond_jaxpr"], p["body_jaxpr"].jaxpr
    cn, bn = p["cond_nconsts"], p["body_nconsts"]
    j = cj.jaxpr
    if len(j.eqns) != 1 or j.eqns[0].primitive.name != "lt" or len(j.outvars) != 1 \
            or j.outvars[0] is not j.eqns[0].outvars[0]:
        return None
    x, y = j.eqns[0].invars

    def position(v, vs):
        return next((k for k, u in enumerate(vs) if u is v), None)

    ci = position(x, j.invars[cn:])
    if ci is None:
        return None
    if isinstance(y, jex_core.Literal):
        upper = ("lit", y.val)
    elif position(y, j.constvars) is not None:
        upper = ("const", cj.consts[position(y, j.constvars)])
    elif position(y, j.invars[:cn]) is not None:
        upper = cond_consts[position(y, j.invars[:cn])][1]
    elif position(y, j.invars[cn:]) is not None:
        cu = position(y, j.invars[cn:])
        if cu == ci or bj.outvars[cu] is not bj.invars[bn + cu]:
            return None   # an upper bound the body changes
        upper = carry[cu][1]
    else:
        return None
    # The body steps the counter by one.
    i_in, i_out = bj.invars[bn + ci], bj.outvars[ci]
    step = next((e for e in bj.eqns if e.outvars and e.outvars[0] is i_out), None)
    if step is None or step.primitive.name != "add":
        return None
    a, b = step.invars
    if b is i_in:
        a, b = b, a
    if a is not i_in or not isinstance(b, jex_core.Literal) or np.asarray(b.val) != 1:
        return None
    return carry[ci][1], upper


# ----------------------------------------------------------------------------- index maps

def _input_deps(closed) -> list[set[int]]:
    """For each index-map result, the index-map inputs it depends on (transitively)."""
    jaxpr = closed.jaxpr
    deps = {v: {i} for i, v in enumerate(jaxpr.invars)}

    def of(a):
        return set() if isinstance(a, jex_core.Literal) else deps.get(a, set())

    for eqn in jaxpr.eqns:
        d = set()
        for a in eqn.invars:
            d |= of(a)
        for v in eqn.outvars:
            deps[v] = d
    return [of(a) for a in jaxpr.outvars]


def _uses_prefetch(closed, n_grid) -> bool:
    return any(any(i >= n_grid for i in d) for d in _input_deps(closed))


def _axis_reads_prefetch(deps, axis, n_grid) -> bool:
    """Whether a block index that moves with this axis is looked up in a prefetch table."""
    return any(axis in d and any(i >= n_grid for i in d) for d in deps)


def _axis_positions(n, cap):
    """At most cap positions along an axis of size n (-1 unknown) and the consecutive pairs
    among them: every step when the axis is short, evenly spread pairs otherwise."""
    if n < 0:
        n = UNKNOWN_AXIS_SAMPLES
    if n <= cap:
        pos = np.arange(n)
        return pos, [(i, i + 1) for i in range(n - 1)]
    starts = np.unique(np.linspace(0, n - 2, max(cap // 2, 1)).astype(np.int64))
    pos = np.stack([starts, starts + 1], axis=1).reshape(-1)
    return pos, [(2 * i, 2 * i + 1) for i in range(len(starts))]


def _base_points(grid):
    """Grid points the axes are walked from: the origin, the middle and the last step."""
    known = [max(n, 1) if n >= 0 else UNKNOWN_AXIS_SAMPLES for n in grid]
    bases = []
    for b in ([0] * len(grid), [n // 2 for n in known], [n - 1 for n in known]):
        if b not in bases:
            bases.append(b)
    return bases


def _dependence(bm, grid, prefetch) -> list[dict]:
    closed = bm.index_map_jaxpr
    n_grid = len(grid)
    deps = _input_deps(closed)
    nout = len(deps)
    out = []
    axes_to_eval = [a for a in range(n_grid) if any(a in d for d in deps)]
    evaluated = {}
    if axes_to_eval and not isinstance(prefetch, _Unknown):
        try:
            evaluated = _evaluate_along_axes(closed, grid, axes_to_eval, prefetch)
        except Exception:  # an index map we cannot evaluate: its axes count as irregular
            evaluated = {}
    for a in range(n_grid):
        if a not in axes_to_eval:
            out.append({"axis": a, "kind": "none", "deltas": [0] * nout, "changeFraction": 0.0})
            continue
        if a not in evaluated:  # data-dependent on unknown tables, or not evaluable
            out.append({"axis": a, "kind": "irregular", "deltas": [], "changeFraction": 1.0})
            continue
        deltas = evaluated[a]  # array (pairs, nout)
        if len(deltas) == 0:
            out.append({"axis": a, "kind": "none", "deltas": [0] * nout, "changeFraction": 0.0})
            continue
        changed = np.any(deltas != 0, axis=1)
        fraction = float(changed.mean())
        if not changed.any():
            kind, d = "none", [0] * nout
        elif not _axis_reads_prefetch(deps, a, n_grid) and np.all(deltas == deltas[0]):
            kind, d = "affine", [int(x) for x in deltas[0]]
        else:
            kind, d = "irregular", []
        out.append({"axis": a, "kind": kind, "deltas": d, "changeFraction": fraction})
    return out


def _evaluate_along_axes(closed, grid, axes, prefetch) -> dict:
    """{axis: (pairs, nout) int array of block-index deltas between consecutive steps}."""
    columns = [[] for _ in grid]
    pair_slices = {}
    total = 0
    bases = _base_points(grid)
    for a in axes:
        pos, pairs = _axis_positions(grid[a], MAX_SAMPLES_PER_AXIS // len(bases))
        idx_pairs = []
        for base in bases:
            for g in range(len(grid)):
                columns[g].append(pos if g == a else np.full(len(pos), base[g]))
            idx_pairs += [(total + i, total + j) for i, j in pairs]
            total += len(pos)
        pair_slices[a] = np.asarray(idx_pairs, dtype=np.int64).reshape(-1, 2)
    points = [np.concatenate(c).astype(np.int32) for c in columns]
    blocks = _eval_index_map(closed, points, prefetch)  # (points, nout)
    return {a: blocks[p[:, 1]] - blocks[p[:, 0]] for a, p in pair_slices.items()}


def _eval_index_map(closed, points, prefetch) -> np.ndarray:
    """Block indices at many grid points: one vectorized evaluation of the index map.

    Index maps are a handful of integer scalar ops; numpy evaluates them without compiling
    anything. Maps using primitives the numpy evaluator does not know go through jax.vmap.
    """
    jaxpr = closed.jaxpr
    n_grid = len(points)
    npts = len(points[0]) if points else 0
    args = [np.asarray(p, dtype=np.int64) for p in points]
    args += [np.asarray(v) for v in prefetch]
    for v in jaxpr.invars[len(args):]:  # prefetch operands this map ignores
        aval = aval_of(v)
        args.append(np.zeros(aval.shape, aval.dtype))
    try:
        res = _np_eval(jaxpr, list(closed.consts), args, npts)
    except _NotNumpy:
        res = _jax_eval(closed, args, n_grid)
    return np.stack([np.broadcast_to(np.asarray(r, dtype=np.int64).reshape(-1), (npts,))
                     for r in res], axis=1) if res else np.zeros((npts, 0), np.int64)


class _NotNumpy(Exception):
    """The numpy evaluator does not handle this primitive."""


def _int_div(a, b):
    q = np.floor_divide(a, np.where(b == 0, 1, b))
    # lax.div truncates toward zero for integers
    return np.where((q < 0) & (q * b != a), q + 1, q)


_NP_BINARY = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "max": np.maximum,
    "min": np.minimum, "lt": np.less, "le": np.less_equal, "gt": np.greater,
    "ge": np.greater_equal, "eq": np.equal, "ne": np.not_equal, "and": np.bitwise_and,
    "or": np.bitwise_or, "xor": np.bitwise_xor,
    "rem": lambda a, b: np.fmod(a, np.where(b == 0, 1, b)),
    "div": lambda a, b: _int_div(a, b) if np.issubdtype(np.asarray(a).dtype, np.integer)
    else np.true_divide(a, b),
}
_NP_UNARY = {"neg": np.negative, "abs": np.abs, "sign": np.sign,
             "not": lambda a: np.logical_not(a) if np.asarray(a).dtype == bool else ~a}

# The scalar ops a cond predicate may go through (on scalars, pass-through ops keep the value).
_BODY_IDENTITY = frozenset({"multiple_of", "reshape", "squeeze", "broadcast_in_dim", "copy",
                            "copy_p"})
_BODY_SCALAR_OPS = (frozenset(_NP_BINARY) | frozenset(_NP_UNARY) | _BODY_IDENTITY
                    | {"select_n", "clamp", "convert_element_type", "integer_pow", "get"})


def _np_eval(jaxpr, consts, args, npts):
    """Evaluate an index-map jaxpr on numpy arrays; per-point values are vectors of npts."""
    env = {}

    def read(a):
        return np.asarray(a.val) if isinstance(a, jex_core.Literal) else env[a]

    for v, x in zip(jaxpr.constvars, consts):
        env[v] = np.asarray(x)
    for v, x in zip(jaxpr.invars, args):
        env[v] = x
    for eqn in jaxpr.eqns:
        out = _np_apply(eqn, [read(a) for a in eqn.invars], npts)
        for v, x in zip(eqn.outvars, out):
            env[v] = x
    return [read(a) for a in jaxpr.outvars]


def _np_apply(eqn, xs, npts) -> list:
    """The results of one scalar equation on per-point numpy values (vectors of npts)."""
    name = eqn.primitive.name
    if name in _NP_BINARY:
        return [_NP_BINARY[name](xs[0], xs[1])]
    if name in _NP_UNARY:
        return [_NP_UNARY[name](xs[0])]
    if name == "select_n":
        return [np.choose(np.asarray(xs[0]).astype(np.int64), xs[1:]) if len(xs) > 2 else xs[1]]
    if name == "clamp":
        return [np.clip(xs[1], xs[0], xs[2])]
    if name == "convert_element_type":
        return [np.asarray(xs[0]).astype(np.dtype(eqn.params["new_dtype"]))]
    if name == "integer_pow":
        return [np.power(xs[0], eqn.params["y"])]
    if name in ("pjit", "jit", "closed_call"):
        subs = sub_jaxprs(eqn.params)
        return _np_eval(subs[0][0], subs[0][1], xs, npts)
    if name == "get":
        return [_np_get(eqn, xs)]
    raise _NotNumpy(name)


def _np_get(eqn, xs):
    """ref[i, j, ...] with scalar (per-point) indices: a scalar-prefetch table lookup."""
    ref, flat = xs[0], xs[1:]
    transforms = jax.tree_util.tree_unflatten(eqn.params["tree"], flat)
    if len(transforms) != 1 or not hasattr(transforms[0], "indices"):
        raise _NotNumpy("get")
    idx = []
    for dim, i in enumerate(transforms[0].indices):
        if hasattr(i, "start"):  # a Slice: only the trivial length-1 case is a scalar
            if getattr(i, "size", None) != 1 or getattr(i, "stride", 1) != 1:
                raise _NotNumpy("get")
            i = i.start
        # out-of-range reads clamp, as they do on the scalar core
        idx.append(np.clip(np.asarray(i, dtype=np.int64), 0, ref.shape[dim] - 1))
    return ref[tuple(idx)]


def _jax_eval(closed, args, n_grid):
    from jax._src.state.discharge import discharge_state  # JAX 0.10 internal, no public path

    pure = discharge_state(closed)
    fun = jex_core.jaxpr_as_fun(pure)
    nout = len(closed.jaxpr.outvars)
    in_axes = (0,) * n_grid + (None,) * (len(args) - n_grid)
    xs = [jnp.asarray(a, dtype=jnp.int32) if i < n_grid else jnp.asarray(a)
          for i, a in enumerate(args)]
    res = jax.vmap(lambda *x: fun(*x)[:nout], in_axes=in_axes)(*xs)
    return [np.asarray(r) for r in res]


# ----------------------------------------------------------------------------- prefetch values

class _PrefetchValues:
    """Values of pallas_call operands computed from the concrete args by evaluating only the
    equations they depend on (never a pallas_call)."""

    def __init__(self, walker, concrete_args, static_argnums, invars):
        self.walker = walker
        self.invars = invars
        self.concrete_args = concrete_args
        self.static_argnums = tuple(static_argnums)
        self.flat = None
        self.cache = {}

    def _inputs(self):
        if self.flat is None:
            if self.concrete_args is None:
                raise _Unknown()
            try:
                args = list(self.concrete_args())
            except Exception as e:
                raise WorkerError("badInput", f"the task's inputs failed while computing scalar "
                                  f"prefetch values: {type(e).__name__}: {e}") from e
            dynamic = [a for i, a in enumerate(args) if i not in self.static_argnums]
            flat = jax.tree_util.tree_leaves(dynamic)
            self._check(flat)
            self.flat = flat
        return self.flat

    def _check(self, flat):
        # The tables must come from the full-size inputs the kernel was traced with.
        if len(flat) != len(self.invars):
            raise WorkerError("badInput", f"the task's inputs have {len(flat)} arrays, the "
                              f"traced candidate takes {len(self.invars)}")
        for k, (x, v) in enumerate(zip(flat, self.invars)):
            shape, dtype = tuple(np.shape(x)), jnp.result_type(x)
            want = aval_of(v)
            if shape != tuple(want.shape) or (dtype != want.dtype and not
                                              getattr(want, "weak_type", False)):
                raise WorkerError("badInput", f"input array {k} of the task is "
                                  f"{dtype}{list(shape)}, the candidate was traced with "
                                  f"{want.dtype}{list(want.shape)}")

    def get(self, refs):
        """List of concrete values for refs, or _Unknown()."""
        try:
            needed = self._needed(refs)
            if needed:
                self._run(needed)
            return [self._value(r[1], self.cache) for r in refs]
        except _Unknown:
            return _Unknown()

    def _value(self, ref, computed):
        kind = ref[0]
        if kind == "in":
            return self._inputs()[ref[1]]
        if kind in ("const", "lit"):
            if ref[1] is None:
                raise _Unknown()
            return ref[1]
        return computed[ref[1]][ref[2]]

    def _needed(self, refs) -> list[int]:
        # Collected iteratively: programs can be deep.
        records = self.walker.records
        needed, stack = set(), [r[1][1] for r in refs if r[1][0] == "rec"]
        while stack:
            n = stack.pop()
            if n in needed or n in self.cache:
                continue
            eqn, operand_refs, evaluable = records[n]
            if not evaluable or eqn.primitive.name == "pallas_call":
                raise _Unknown()
            needed.add(n)
            stack += [r[1] for r in operand_refs if r[0] == "rec"]
        return sorted(needed)

    def _run(self, needed):
        # One jitted program for the whole slice (one compilation, not one per op), cached by
        # the slice's structure so a candidate that computes the same tables reuses it.
        records, flat = self.walker.records, self._inputs()
        pos = {n: i for i, n in enumerate(needed)}
        outside = sorted({r[1] for n in needed for r in records[n][1]
                          if r[0] == "rec" and r[1] not in pos})
        outside_vals = [self.cache[n] for n in outside]
        key = _slice_key(records, needed, pos, outside, outside_vals, flat)
        program = _PROGRAMS.get(key) if key is not None else None
        try:
            if program is None:
                program = _compile(_slice_program([records[n] for n in needed], pos, outside),
                                   list(flat), outside_vals)
                if key is not None:
                    if len(_PROGRAMS) >= _MAX_PROGRAMS:
                        _PROGRAMS.pop(next(iter(_PROGRAMS)))
                    _PROGRAMS[key] = program
            result = program(list(flat), outside_vals)
        except _Unknown:
            raise
        except Exception as e:
            raise _Unknown() from e
        for n, out in zip(needed, result):
            self.cache[n] = out


_PROGRAMS: dict = {}
_MAX_PROGRAMS = 64
# These programs are small integer bookkeeping run once: XLA's optimizations cost more
# compilation time (about half of it) than they save.
_FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


def _compile(fn, *args):
    lowered = jax.jit(fn).lower(*args)
    try:
        return lowered.compile(compiler_options=_FAST_COMPILE)
    except Exception:  # options unknown to this XLA
        return lowered.compile()


def _slice_program(recs, pos, outside):
    """A function (flat inputs, values of outside records) -> results of each record in recs."""
    out_pos = {n: i for i, n in enumerate(outside)}

    def program(flat, outside_vals):
        computed = []

        def value(r):
            kind = r[0]
            if kind == "in":
                return flat[r[1]]
            if kind in ("const", "lit"):
                if r[1] is None:
                    raise _Unknown()
                return r[1]
            if r[1] in pos:
                return computed[pos[r[1]]][r[2]]
            return outside_vals[out_pos[r[1]]][r[2]]

        for eqn, refs, _ in recs:
            out = eqn.primitive.bind(*[value(r) for r in refs], **eqn.params)
            computed.append(list(out) if eqn.primitive.multiple_results else [out])
        return computed

    return program


def _slice_key(records, needed, pos, outside, outside_vals, flat):
    """Structural fingerprint of a slice: primitives, params, wiring, constants, input types."""
    try:
        h = hashlib.sha256()
        out_pos = {n: i for i, n in enumerate(outside)}
        for n in needed:
            eqn, refs, _ = records[n]
            h.update(eqn.primitive.name.encode())
            h.update(repr(sorted((k, str(v)) for k, v in eqn.params.items())).encode())
            for r in refs:
                if r[0] == "rec":
                    h.update(repr(("p", pos[r[1]], r[2]) if r[1] in pos
                                  else ("o", out_pos[r[1]], r[2])).encode())
                elif r[0] == "in":
                    h.update(repr(("in", r[1])).encode())
                else:
                    v = np.asarray(r[1])
                    h.update(repr((r[0], v.dtype.str, v.shape)).encode())
                    h.update(v.tobytes())
        for v in list(flat) + [x for vals in outside_vals for x in vals]:
            a = jax.typeof(v) if hasattr(jax, "typeof") else jax.core.get_aval(v)
            h.update(str(a).encode())
        return h.hexdigest()
    except Exception:
        return None  # unhashable constants: compile without caching
