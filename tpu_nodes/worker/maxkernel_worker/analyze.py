"""Dataflow graph of a traced JAX function: every equation with its flops, transcendentals
and bytes, and for every dot_general the sizes the MXU sees (DotOp: batch, m, n, k, dtypes).

The TPU performance model prices the XLA reference from this graph, and extract.py prices the
work a candidate does outside its pallas_calls with it, so the flop counts follow XLA's cost
analysis: dot_general 2*batch*M*N*K, convolutions 2*out*window*in_features, elementwise ops one
per output element, reductions one per input element, transcendental ops counted as
transcendentals (not flops), data movement free.
"""

from __future__ import annotations

import enum
import json
import math

import jax
import numpy as np
from jax.extend import core as jex_core

from .errors import WorkerError

TRANSCENDENTAL = frozenset({
    "exp", "exp2", "log", "log1p", "expm1", "tanh", "logistic", "erf", "erfc", "erf_inv",
    "rsqrt", "sqrt", "cbrt", "sin", "cos", "tan", "asin", "acos", "atan", "atan2", "sinh",
    "cosh", "asinh", "acosh", "atanh", "pow", "lgamma", "digamma", "igamma", "igammac",
    "igamma_grad_a", "random_gamma_grad", "bessel_i0e", "bessel_i1e", "polygamma", "zeta",
    "regularized_incomplete_beta", "reciprocal",
})

# One flop per output element (VPU work, casts included as XLA does).
ELEMENTWISE = frozenset({
    "add", "add_any", "sub", "mul", "div", "rem", "max", "min", "neg", "sign", "floor", "ceil",
    "round", "abs", "and", "or", "xor", "not", "eq", "ne", "lt", "le", "gt", "ge", "select_n",
    "eq_to", "lt_to", "le_to",  # total-order comparisons (sort, searchsorted)
    "clamp", "nextafter", "shift_left", "shift_right_logical", "shift_right_arithmetic",
    "population_count", "clz", "square", "is_finite", "conj", "real", "imag", "complex",
    "copysign", "convert_element_type", "reduce_precision", "erf_inv_approx", "imul",
})

# One flop per input element.
REDUCTIONS = frozenset({
    "reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and", "reduce_or",
    "reduce_xor", "argmax", "argmin", "cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp",
})

# Primitives that only read or write a Ref inside a Pallas kernel body: their bytes are the
# value moved, not the whole Ref (pl.load / pl.store bind masked_load / masked_swap).
REF_READ = frozenset({"get", "load", "masked_load"})
REF_WRITE = frozenset({"swap", "store", "addupdate", "masked_swap"})
REF_ACCESS = REF_READ | REF_WRITE

# MXU work: flops by the matmul and convolution rules.
MATMUL = frozenset({"dot_general", "ragged_dot", "ragged_dot_general", "conv_general_dilated"})

# A manual copy started inside a Pallas TPU kernel (make_async_copy / async_copy /
# async_remote_copy all bind it); its bytes are the copied slice.
DMA_START = frozenset({"dma_start"})

# Data movement, indexing and bookkeeping: no flops under XLA's rules either. Listed so that a
# primitive in none of these sets is known to be unpriced rather than silently free.
NO_FLOPS = frozenset({
    "reshape", "broadcast_in_dim", "transpose", "squeeze", "expand_dims", "concatenate", "pad",
    "slice", "dynamic_slice", "dynamic_update_slice", "gather", "scatter", "rev", "iota",
    "copy", "copy_p", "device_put", "bitcast", "bitcast_convert_type", "split", "roll",
    "program_id", "num_programs", "multiple_of", "dma_wait", "semaphore_read",
    "semaphore_signal", "semaphore_wait", "get_barrier_semaphore", "delay", "trace_value",
    "add_dependency", "debug_callback", "debug_print", "optimization_barrier",
    "sharding_constraint", "axis_index", "pvary", "random_wrap", "random_unwrap",
    "with_memory_space_constraint", "tile", "broadcast_to", "empty", "empty2", "unstack",
    "create_token", "after_all", "platform_index", "prng_seed",
})

# Primitives with a rule in eqn_cost outside the sets above.
_PRICED = frozenset({"integer_pow", "reduce", "sort", "scatter_add", "scatter-add", "scatter_mul",
                     "scatter_min", "scatter_max", "scatter_sub"})

# Call-like primitives whose single sub-jaxpr is inlined (same operands, same results).
INLINE = frozenset({
    "pjit", "jit", "closed_call", "core_call", "custom_jvp_call", "custom_vjp_call",
    "custom_vjp_call_jaxpr", "remat", "remat2", "checkpoint", "custom_lin", "name_scope",
})

# Primitives the walker descends into (their cost is their bodies').
STRUCTURAL = INLINE | frozenset({"cond", "scan", "while", "run_scoped", "pallas_call"})

_MAX_PARAM_ITEMS = 32
_MAX_PARAM_TEXT = 200


def trace(fn, abstract_args: list, static_argnums: tuple):
    """ClosedJaxpr of fn on abstract args; WorkerError("traceError") when tracing fails."""
    try:
        return jax.make_jaxpr(fn, static_argnums=tuple(static_argnums))(*abstract_args)
    except WorkerError:
        raise
    except Exception as e:  # the candidate's own Python or shape errors
        raise WorkerError("traceError", f"tracing failed: {type(e).__name__}: {e}") from e


def analyze(fn, abstract_args: list, static_argnums: tuple) -> dict:
    """DataflowGraph dict of fn traced on abstract_args (ShapeDtypeStructs and static values)."""
    closed = trace(fn, abstract_args, static_argnums)
    walker = Walker()
    walker.walk_top(closed)
    return walker.graph(closed)


# ----------------------------------------------------------------------------- types and sizes

def aval_of(x):
    """The array aval behind a var, literal or Ref."""
    aval = getattr(x, "aval", x)
    inner = getattr(aval, "inner_aval", None)
    return inner if inner is not None else aval


def tensor_type(x) -> dict:
    aval = aval_of(x)
    shape = getattr(aval, "shape", ())
    dtype = getattr(aval, "dtype", None)
    return {"shape": [int(d) if _is_int(d) else -1 for d in shape],
            "dtype": str(dtype) if dtype is not None else type(aval).__name__}


def _is_int(d) -> bool:
    try:
        int(d)
        return True
    except Exception:
        return False


def num_elements(x) -> int:
    shape = getattr(aval_of(x), "shape", ())
    n = 1
    for d in shape:
        n *= int(d) if _is_int(d) else 1
    return n


def itemsize(x) -> int:
    dtype = getattr(aval_of(x), "dtype", None)
    if dtype is None:
        return 0
    try:
        return int(np.dtype(dtype).itemsize)
    except Exception:
        try:
            return int(dtype.itemsize)
        except Exception:
            return 0  # semaphores and other extended dtypes occupy no data bytes


def nbytes(x) -> int:
    return num_elements(x) * itemsize(x)


# ----------------------------------------------------------------------------- params as JSON

def _jsonable(v, depth=0):
    """Small parameter values as JSON; None for anything big or opaque."""
    if v is None or isinstance(v, (bool, int, float, str)):
        if isinstance(v, str) and len(v) > _MAX_PARAM_TEXT:
            return None
        if isinstance(v, float) and not math.isfinite(v):
            return str(v)
        return v
    if isinstance(v, (np.integer, np.floating, np.bool_)):
        return v.item()
    if isinstance(v, enum.Enum):
        return v.name
    if isinstance(v, (np.dtype, type)) or type(v).__name__.endswith("DType"):
        try:
            return str(np.dtype(v))
        except Exception:
            return str(v)
    if depth > 4:
        return None
    if hasattr(v, "_asdict"):
        return {k: _jsonable(x, depth + 1) for k, x in v._asdict().items()}
    if isinstance(v, (tuple, list)):
        if len(v) > _MAX_PARAM_ITEMS:
            return None
        out = [_jsonable(x, depth + 1) for x in v]
        return out
    if _is_int(v) and type(v).__name__ in ("int32", "int64"):
        return int(v)
    return None


def params_json(eqn) -> str:
    p = eqn.params
    name = eqn.primitive.name
    out = {}
    if name == "dot_general":
        (lc, rc), (lb, rb) = p["dimension_numbers"]
        out = {"lhs_contracting": list(lc), "rhs_contracting": list(rc),
               "lhs_batch": list(lb), "rhs_batch": list(rb),
               "preferred_element_type": _jsonable(p.get("preferred_element_type"))}
    else:
        for k, v in p.items():
            j = _jsonable(v)
            if j is not None:
                out[k] = j
    return json.dumps(out, sort_keys=True, default=str)


# ----------------------------------------------------------------------------- per-equation cost

def eqn_cost(eqn) -> tuple[float, float]:
    """(flops, transcendentals) of one equation without sub-jaxprs."""
    name = eqn.primitive.name
    outs = eqn.outvars
    out_elems = sum(num_elements(v) for v in outs)
    if name == "dot_general":
        lhs, rhs = eqn.invars[0], eqn.invars[1]
        (_, rc), (_, rb) = eqn.params["dimension_numbers"]
        rshape = aval_of(rhs).shape
        free = 1
        for i, d in enumerate(rshape):
            if i not in rc and i not in rb:
                free *= int(d)
        return 2.0 * num_elements(lhs) * free, 0.0
    if name in ("ragged_dot", "ragged_dot_general"):
        lhs, rhs = eqn.invars[0], eqn.invars[1]
        return 2.0 * num_elements(lhs) * int(aval_of(rhs).shape[-1]), 0.0
    if name == "conv_general_dilated":
        rhs = eqn.invars[1]
        dn = eqn.params["dimension_numbers"]
        rshape = aval_of(rhs).shape
        out_feat = int(rshape[dn.rhs_spec[0]]) if dn is not None else int(rshape[0])
        return 2.0 * out_elems * num_elements(rhs) / max(out_feat, 1), 0.0
    if name in TRANSCENDENTAL:
        return 0.0, float(out_elems)
    if name == "integer_pow":
        y = int(eqn.params["y"])
        muls = max(1, abs(y).bit_length() + bin(abs(y)).count("1") - 2) + (1 if y < 0 else 0)
        return float(out_elems * muls), 0.0
    if name in ELEMENTWISE:
        return float(out_elems), 0.0
    if name in REDUCTIONS:
        return float(num_elements(eqn.invars[0])), 0.0
    if name == "reduce":  # generic reduce with its own computation
        return float(sum(num_elements(v) for v in eqn.invars[: len(outs)])), 0.0
    if name.startswith("reduce_window"):
        dims = eqn.params.get("window_dimensions", ())
        return float(out_elems * math.prod(int(d) for d in dims)), 0.0
    if name in ("scatter_add", "scatter-add", "scatter_mul", "scatter_min", "scatter_max",
                "scatter_sub"):
        return float(num_elements(eqn.invars[-1])), 0.0
    if name == "addupdate":
        return float(num_elements(eqn.invars[1])), 0.0
    if name == "sort":
        dim = int(eqn.params.get("dimension", 0))
        shape = aval_of(eqn.invars[0]).shape
        n = int(shape[dim]) if shape else 1
        return float(num_elements(eqn.invars[0]) * max(1, math.ceil(math.log2(max(n, 2))))), 0.0
    return 0.0, 0.0


def has_cost_rule(name: str) -> bool:
    """Whether eqn_cost / eqn_bytes (or the walker, for control flow) know what name costs."""
    return (name in TRANSCENDENTAL or name in ELEMENTWISE or name in REDUCTIONS
            or name in MATMUL or name in REF_ACCESS or name in DMA_START or name in NO_FLOPS
            or name in _PRICED or name in STRUCTURAL or name.startswith("reduce_window"))


def _prod(shape, dims) -> int:
    n = 1
    for i in dims:
        d = shape[i]
        n *= int(d) if _is_int(d) else 1
    return n


def dot_op(eqn, count: float) -> dict:
    """DotOp dict of a dot_general: lhs (batch, m, k) x rhs (batch, k, n), from its
    dimension numbers; free dims of each side multiply into m (lhs) and n (rhs)."""
    lhs, rhs = aval_of(eqn.invars[0]), aval_of(eqn.invars[1])
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    lc, rc, lb, rb = (tuple(int(i) for i in d) for d in (lc, rc, lb, rb))
    lfree = [i for i in range(len(lhs.shape)) if i not in lc and i not in lb]
    rfree = [i for i in range(len(rhs.shape)) if i not in rc and i not in rb]
    return {"batch": _prod(lhs.shape, lb), "m": _prod(lhs.shape, lfree),
            "n": _prod(rhs.shape, rfree), "k": _prod(lhs.shape, lc),
            "lhsDtype": str(lhs.dtype), "rhsDtype": str(rhs.dtype),
            "outDtype": str(aval_of(eqn.outvars[0]).dtype), "count": float(count)}


def conv_op(eqn, count: float) -> dict:
    """DotOp dict of a convolution as the implicit GEMM the MXU runs: m = output positions
    (batch x spatial), n = output features per group, k = input features per group x window,
    batch = feature groups. Its flops equal the convolution rule's."""
    lhs, rhs, out = aval_of(eqn.invars[0]), aval_of(eqn.invars[1]), aval_of(eqn.outvars[0])
    dn = eqn.params.get("dimension_numbers")
    groups = int(eqn.params.get("feature_group_count", 1) or 1)
    out_feat = int(rhs.shape[dn.rhs_spec[0]]) if dn is not None else int(rhs.shape[0])
    out_elems = int(math.prod(int(d) for d in out.shape))
    return {"batch": groups, "m": out_elems // max(out_feat, 1),
            "n": max(out_feat // groups, 1),
            "k": int(math.prod(int(d) for d in rhs.shape)) // max(out_feat, 1),
            "lhsDtype": str(lhs.dtype), "rhsDtype": str(rhs.dtype), "outDtype": str(out.dtype),
            "count": float(count)}


def ragged_dot_op(eqn, count: float) -> dict:
    """DotOp dict of a ragged dot: each row of lhs meets one group's matrix, so the MXU sees
    (m, k) x (k, n) with the group dims of rhs left out of n."""
    lhs, rhs, out = aval_of(eqn.invars[0]), aval_of(eqn.invars[1]), aval_of(eqn.outvars[0])
    rdn = eqn.params.get("ragged_dot_dimension_numbers")
    if rdn is None:  # plain ragged_dot: (m, k) x (groups, k, n)
        lc, rc, lb, rb, rg = (len(lhs.shape) - 1,), (1,), (), (), (0,)
    else:
        (lc, rc), (lb, rb) = rdn.dot_dimension_numbers
        rg = tuple(rdn.rhs_group_dimensions)
    lc, rc, lb, rb, rg = (tuple(int(i) for i in d) for d in (lc, rc, lb, rb, rg))
    lfree = [i for i in range(len(lhs.shape)) if i not in lc and i not in lb]
    rfree = [i for i in range(len(rhs.shape)) if i not in rc and i not in rb and i not in rg]
    return {"batch": _prod(lhs.shape, lb), "m": _prod(lhs.shape, lfree),
            "n": _prod(rhs.shape, rfree), "k": _prod(lhs.shape, lc),
            "lhsDtype": str(lhs.dtype), "rhsDtype": str(rhs.dtype), "outDtype": str(out.dtype),
            "count": float(count)}


# The MXU ops a DotOp describes, and how to build it.
DOT_OPS = {"dot_general": dot_op, "conv_general_dilated": conv_op, "ragged_dot": ragged_dot_op,
           "ragged_dot_general": ragged_dot_op}


def dma_bytes(eqn) -> float | None:
    """Bytes a dma_start copies: the source slice (shape after its indexers and transforms);
    None when the operand tree cannot be read (a JAX version we do not know)."""
    try:
        src = jax.tree_util.tree_unflatten(eqn.params["tree"],
                                           [getattr(v, "aval", v) for v in eqn.invars])[0]
        shape = tuple(src.shape)
        dtype = src.dtype
        n = 1
        for d in shape:
            n *= int(d)
        return float(n * np.dtype(dtype).itemsize)
    except Exception:
        return None


def eqn_bytes(eqn) -> float:
    name = eqn.primitive.name
    if name in REF_READ:
        return float(sum(nbytes(v) for v in eqn.outvars))
    if name == "masked_swap":  # returns the old value: as big as the value stored
        return float(sum(nbytes(v) for v in eqn.outvars))
    if name in ("swap", "store"):
        return float(nbytes(eqn.invars[1]))
    if name in DMA_START:
        b = dma_bytes(eqn)
        return 0.0 if b is None else b
    if name == "addupdate":
        return 2.0 * nbytes(eqn.invars[1])
    return float(sum(nbytes(v) for v in eqn.invars) + sum(nbytes(v) for v in eqn.outvars))


# ----------------------------------------------------------------------------- the walker

def sub_jaxprs(params) -> list[tuple[object, list]]:
    """(Jaxpr, consts) for every sub-jaxpr in an equation's params, in order."""
    found = []

    def visit(v):
        if isinstance(v, jex_core.ClosedJaxpr):
            found.append((v.jaxpr, list(v.consts)))
        elif isinstance(v, jex_core.Jaxpr):
            found.append((v, []))
        elif isinstance(v, (tuple, list)):
            for x in v:
                visit(x)

    for v in params.values():
        visit(v)
    return found


def _const(v):
    return (-1, ("const", v))


def ref_input(ref) -> int:
    """The graph input a ref is (its index), or -1."""
    return ref[1][1] if ref[0] == -1 and ref[1][0] == "in" else -1


def ref_literal(ref) -> str:
    """JSON of a scalar literal or constant ("inf", "-inf", "nan" as strings), else ""."""
    if ref[0] != -1 or ref[1][0] not in ("lit", "const") or ref[1][1] is None:
        return ""
    v = np.asarray(ref[1][1])
    if v.size != 1:
        return ""
    x = v.reshape(()).item()
    if isinstance(x, bool):
        return json.dumps(x)
    if isinstance(x, (int, np.integer)):
        return json.dumps(int(x))
    if isinstance(x, float) and not math.isfinite(x):
        return json.dumps(str(x))
    try:
        return json.dumps(float(x)) if isinstance(x, float) else json.dumps(x)
    except TypeError:
        return ""


UNKNOWN = (-1, ("lit", None))


class Walker:
    """Flattens a jaxpr into DataflowNode dicts, inlining calls and weighting loop bodies.

    Every value is a ref (node id or -1, eval ref). The node id feeds operandIds; the eval ref
    ("in", k) | ("const", v) | ("lit", v) | ("rec", record, k) lets callers re-evaluate a slice
    of the program: records[i] = (eqn, operand eval refs, evaluable). Loops and conds get one
    record for the whole equation (evaluable as such) while their bodies are listed as nodes once
    with a count instead of being unrolled (those records are not evaluable).
    on_pallas(eqn, refs, count, evaluable, node_id) is called for each pallas_call; without it
    a pallas_call is priced as its body's cost times its grid steps.
    `unknown` collects what the walk could not price: loops of unknown trip count (counted
    once), copies of unknown size. Opaque primitives with bodies are priced by their bodies
    once; the matmuls inside them are kept in hidden_dots (they have no node of their own).
    """

    def __init__(self, on_pallas=None):
        self.nodes: list[dict] = []
        self.records: list[tuple] = []
        self.on_pallas = on_pallas
        self.unknown: set[str] = set()
        self.hidden_dots: list[dict] = []
        self.hidden_matmul_flops = 0.0
        # Which result of its node a ref is: records of nodes map to their node id; a loop's or
        # cond's result k (one record for the whole equation) to the ref its listed body gave.
        self.record_node: dict[int, int] = {}
        self.whole_outs: dict[tuple[int, int], tuple] = {}

    # -- entry points
    def walk_top(self, closed):
        in_refs = [(-1, ("in", k)) for k in range(len(closed.jaxpr.invars))]
        self.out_refs = self.walk(closed.jaxpr, [_const(c) for c in closed.consts], in_refs,
                                  1.0, True)
        return self.out_refs

    def graph(self, closed) -> dict:
        inputs = [tensor_type(v) for v in closed.jaxpr.invars]
        inputs += [tensor_type(v) for v in closed.jaxpr.constvars]
        outputs = [tensor_type(v) for v in closed.jaxpr.outvars]
        min_bytes = sum(nbytes(v) for v in closed.jaxpr.invars)
        min_bytes += sum(nbytes(v) for v in closed.jaxpr.constvars)
        min_bytes += sum(nbytes(v) for v in closed.jaxpr.outvars)
        out_refs = getattr(self, "out_refs", [])
        return {
            "nodes": self.nodes,
            "inputs": inputs,
            "outputs": outputs,
            "outputIds": [r[0] for r in out_refs],
            "outputInputs": [ref_input(r) for r in out_refs],
            "outputResults": [r[1][2] if r[1][0] == "rec" else 0 for r in out_refs],
            "flops": self.total("flops"),
            "transcendentals": self.total("transcendentals"),
            "bytes": self.total("bytes"),
            "minBytes": float(min_bytes),
        }

    def result_index(self, ref) -> int:
        """Which result of node ref[0] the ref reads; -1 when it is not a node's result."""
        seen = 0
        while ref[0] >= 0 and ref[1][0] == "rec" and seen < 10000:
            rec, k = ref[1][1], ref[1][2]
            if self.record_node.get(rec) == ref[0]:
                return k
            inner = self.whole_outs.get((rec, k))
            if inner is None or inner[0] != ref[0]:
                return -1
            ref, seen = inner, seen + 1
        return -1

    def total(self, field: str) -> float:
        return float(sum(n[field] * n["count"] for n in self.nodes))

    def dots(self) -> list[dict]:
        """DotOp dicts of every dot_general walked, their counts weighted by loops."""
        return [n["dot"] for n in self.nodes if n.get("hasDot")] + list(self.hidden_dots)

    def matmul_flops(self) -> float:
        """The share of total("flops") done by matmuls and convolutions."""
        return float(sum(n["flops"] * n["count"] for n in self.nodes
                         if n["primitive"] in MATMUL)) + self.hidden_matmul_flops

    # -- recursion
    def walk(self, jaxpr, const_refs, in_refs, count, evaluable):
        env = {}

        def read(a):
            if isinstance(a, jex_core.Literal):
                return (-1, ("lit", a.val))
            return env.get(a, UNKNOWN)

        for v, r in zip(jaxpr.constvars, const_refs):
            env[v] = r
        for v, r in zip(jaxpr.invars, in_refs):
            env[v] = r
        for eqn in jaxpr.eqns:
            refs = [read(a) for a in eqn.invars]
            outs = self.eqn(eqn, refs, count, evaluable)
            for v, r in zip(eqn.outvars, outs):
                env[v] = r
        return [read(a) for a in jaxpr.outvars]

    def walk_sub(self, jaxpr, consts, refs, count, evaluable):
        return self.walk(jaxpr, [_const(c) for c in consts], refs, count, evaluable)

    def record(self, eqn, refs, evaluable) -> int:
        self.records.append((eqn, [r[1] for r in refs], evaluable))
        return len(self.records) - 1

    def whole(self, eqn, refs, evaluable, inner_outs):
        """Refs for the results of a loop or cond: graph ids from its listed body, evaluation
        through the whole equation."""
        rec = self.record(eqn, refs, evaluable)
        for k, r in enumerate(inner_outs):
            self.whole_outs[(rec, k)] = r
        return [(g, ("rec", rec, k)) for k, (g, _) in enumerate(inner_outs)]

    def eqn(self, eqn, refs, count, evaluable):
        name = eqn.primitive.name
        subs = sub_jaxprs(eqn.params)
        if name == "pallas_call":
            return self.pallas(eqn, refs, count, evaluable)
        if name == "cond":
            return self.whole(eqn, refs, evaluable, self.cond(eqn, refs, count))
        if name == "scan":
            jaxpr, consts = subs[0]
            length = float(eqn.params["length"])
            outs = self.walk_sub(jaxpr, consts, refs, count * length, False)
            return self.whole(eqn, refs, evaluable, outs)
        if name == "while":
            return self.whole(eqn, refs, evaluable, self.while_loop(eqn, refs, count))
        if name == "run_scoped":  # Pallas scratch scope: its body runs once, in place
            jaxpr = eqn.params["jaxpr"]
            if len(jaxpr.constvars) == len(refs) and len(jaxpr.outvars) == len(eqn.outvars):
                return self.walk(jaxpr, refs, [UNKNOWN] * len(jaxpr.invars), count, False)
        if subs and (name in INLINE or len(subs) == 1):
            jaxpr, consts = subs[0]
            if len(jaxpr.invars) == len(refs) and len(jaxpr.outvars) == len(eqn.outvars):
                return self.walk_sub(jaxpr, consts, refs, count, evaluable)
        node_id, outs = self.add_node(eqn, refs, count, evaluable)
        if subs:  # opaque primitive with bodies: price the bodies once into this node
            inner = Walker()
            for jaxpr, consts in subs:
                inner.walk_sub(jaxpr, consts, [UNKNOWN] * len(jaxpr.invars), 1.0, False)
            self.nodes[node_id]["flops"] += inner.total("flops")
            self.nodes[node_id]["transcendentals"] += inner.total("transcendentals")
            self.unknown |= inner.unknown
            self.hidden_dots += [dict(d, count=d["count"] * count) for d in inner.dots()]
            self.hidden_matmul_flops += inner.matmul_flops() * count
        return outs

    def add_node(self, eqn, refs, count, evaluable, flops=None, transcendentals=None,
                 bytes_=None, params=None):
        """Appends a node; returns its id and the refs of its results."""
        f, t = eqn_cost(eqn)
        name = eqn.primitive.name
        if name in DMA_START and bytes_ is None and dma_bytes(eqn) is None:
            self.unknown.add(f"{name} (size of the copy unknown)")
        node_id = len(self.nodes)
        self.nodes.append({
            "id": node_id,
            "primitive": eqn.primitive.name,
            "params": params if params is not None else params_json(eqn),
            "operands": [tensor_type(v) for v in eqn.invars],
            "results": [tensor_type(v) for v in eqn.outvars],
            "operandIds": [r[0] for r in refs],
            "operandInputs": [ref_input(r) for r in refs],
            "operandLiterals": [ref_literal(r) for r in refs],
            "operandResults": [self.result_index(r) for r in refs],
            "flops": float(f if flops is None else flops),
            "transcendentals": float(t if transcendentals is None else transcendentals),
            "bytes": float(eqn_bytes(eqn) if bytes_ is None else bytes_),
            "count": float(count),
            "hasDot": name in DOT_OPS,
        })
        if name in DOT_OPS:
            self.nodes[node_id]["dot"] = DOT_OPS[name](eqn, count)
        rec = self.record(eqn, refs, evaluable)
        self.record_node[rec] = node_id
        return node_id, [(node_id, ("rec", rec, k)) for k in range(len(eqn.outvars))]

    def cond(self, eqn, refs, count):
        # Only one branch runs: list the most expensive one (by flops+transcendentals, then bytes).
        branches = eqn.params["branches"]
        ops = refs[1:]
        best, best_key = 0, None
        for i, br in enumerate(branches):
            w = Walker()
            w.walk_sub(br.jaxpr, br.consts, ops, 1.0, False)
            key = (w.total("flops") + w.total("transcendentals"), w.total("bytes"))
            if best_key is None or key > best_key:
                best, best_key = i, key
        br = branches[best]
        return self.walk_sub(br.jaxpr, br.consts, ops, count, False)

    def while_loop(self, eqn, refs, count):
        p = eqn.params
        cn, bn = p["cond_nconsts"], p["body_nconsts"]
        cond_consts, body_consts, carry = refs[:cn], refs[cn:cn + bn], refs[cn + bn:]
        trip = while_trip_count(p["cond_jaxpr"], cond_consts, carry)
        if trip is None:
            self.unknown.add("while (trip count unknown, counted once)")
        n = float(trip) if trip is not None else 1.0
        cj, bj = p["cond_jaxpr"], p["body_jaxpr"]
        self.walk_sub(cj.jaxpr, cj.consts, cond_consts + carry, count * (n + 1), False)
        return self.walk_sub(bj.jaxpr, bj.consts, body_consts + carry, count * n, False)

    def pallas(self, eqn, refs, count, evaluable):
        if self.on_pallas is not None:
            node_id, outs = self.add_node(eqn, refs, count, evaluable, flops=0.0,
                                          transcendentals=0.0, bytes_=0.0, params="{}")
            self.on_pallas(eqn, refs, count, evaluable, node_id)
            return outs
        # Priced as a whole: the body's work times the grid steps, reading its operands and
        # writing its results once.
        body = Walker()
        jaxpr = eqn.params["jaxpr"]
        body.walk(jaxpr, [], [UNKNOWN] * len(jaxpr.invars), 1.0, False)
        steps = grid_steps(eqn.params["grid_mapping"].grid)
        _, outs = self.add_node(eqn, refs, count, evaluable,
                                flops=body.total("flops") * steps,
                                transcendentals=body.total("transcendentals") * steps,
                                params=json.dumps({"name": pallas_name(eqn)}))
        return outs


def grid_steps(grid) -> int:
    steps = 1
    for d in grid:
        steps *= int(d) if _is_int(d) else 1
    return steps


def pallas_name(eqn) -> str:
    name = eqn.params.get("name")
    if name:
        return str(name)
    meta = eqn.params.get("metadata")
    if meta and isinstance(meta, dict) and meta.get("name"):
        return str(meta["name"])
    dbg = getattr(eqn.params.get("jaxpr"), "debug_info", None)
    return str(getattr(dbg, "func_name", "") or "pallas_call")


def while_trip_count(cond_jaxpr, cond_consts, carry) -> int | None:
    """Trip count of a fori-style while loop (i < n, both known literals); None otherwise."""
    j = cond_jaxpr.jaxpr
    if len(j.eqns) != 1 or j.eqns[0].primitive.name != "lt":
        return None
    refs = {v: r[1] for v, r in zip(j.invars, list(cond_consts) + list(carry))}
    vals = []
    for a in j.eqns[0].invars:
        r = ("lit", a.val) if isinstance(a, jex_core.Literal) else refs.get(a)
        if r is None or r[0] not in ("lit", "const") or r[1] is None:
            return None
        try:
            vals.append(int(np.asarray(r[1])))
        except Exception:
            return None
    return max(0, vals[1] - vals[0])
