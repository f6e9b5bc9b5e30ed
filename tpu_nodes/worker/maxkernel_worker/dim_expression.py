"""Derived dims of native specs: NamedDim.expression, like "MAX_SEQS + 1" or "D // 2".

config/ (config/dim_expression.cpp) parses and checks them at load; the worker evaluates them
again whenever dims change (reduced-size tests), so that a derived dim always follows the dims
it is computed from and is never shrunk on its own. The grammar is the same on both sides:
dim names, non-negative integer literals, + - * // (Python's floor division) and parentheses.
Python's own parser reads the text, but only those nodes are accepted (no eval: no calls,
attributes, subscripts, unary operators or other operators), and every intermediate value
must fit in 64 bits, as in config/.
"""

from __future__ import annotations

import ast
import operator

from .errors import WorkerError

_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
              ast.FloorDiv: operator.floordiv}
_SYMBOLS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.FloorDiv: "//"}
_INT64 = (-(1 << 63), (1 << 63) - 1)
_MAX_LENGTH = 1000


class DimError(WorkerError):
    """A derived dim that cannot be evaluated (`dim` names it): badInput."""

    def __init__(self, dim: str, message: str):
        super().__init__("badInput", message)
        self.dim = dim


def parse(text: str, dim: str = "") -> ast.expr:
    """The expression's tree, refused unless it uses only the grammar's nodes."""
    where = f"dim {dim}: " if dim else ""
    text = text.strip()
    if len(text) > _MAX_LENGTH:
        raise DimError(dim, f"{where}the expression is {len(text)} characters long; the limit is {_MAX_LENGTH}")
    try:
        tree = ast.parse(text, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        raise DimError(dim, f"{where}{text!r} is not an expression: {getattr(e, 'msg', e)}") from None
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp):
            if type(node.op) not in _OPERATORS:
                raise DimError(dim, f"{where}{text!r}: operator {type(node.op).__name__} is not "
                                    f"allowed; dims use + - * // and parentheses")
        elif isinstance(node, ast.Name):
            if not isinstance(node.ctx, ast.Load):
                raise DimError(dim, f"{where}{text!r}: not an expression")
        elif isinstance(node, ast.Constant):
            # decimal digits only, as config/ reads them (not 0x10, 1_000 or 1e3)
            literal = ast.get_source_segment(text, node) or ""
            if type(node.value) is not int or not literal.isdigit() or not literal.isascii():
                raise DimError(dim, f"{where}{literal or repr(node.value)} in {text!r} is not a "
                                    f"decimal integer literal")
        elif not isinstance(node, (ast.operator, ast.expr_context)):
            raise DimError(dim, f"{where}{text!r}: {type(node).__name__} is not allowed; dims use "
                                f"names, integers, + - * // and parentheses")
    return tree


def names(tree: ast.expr) -> list[str]:
    """The dim names an expression reads, each once."""
    seen = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id not in seen:
            seen.append(node.id)
    return seen


def evaluate(tree: ast.expr, values: dict, dim: str = "") -> int:
    """Its value with `values` (name -> int); division by zero and int64 overflow are DimErrors.
    Iterative, so that a long chain (1 + 1 + ... + 1) needs no deep recursion."""
    stack, out = [(tree, False)], []
    while stack:
        node, operands_done = stack.pop()
        if isinstance(node, ast.Constant):
            out.append(node.value)
        elif isinstance(node, ast.Name):
            out.append(int(values[node.id]))
        elif not operands_done:
            stack += [(node, True), (node.right, False), (node.left, False)]
        else:
            b, a = out.pop(), out.pop()
            op = type(node.op)
            if op is ast.FloorDiv and b == 0:
                raise DimError(dim, f"dim {dim}: division by zero ({a} // 0)")
            v = _OPERATORS[op](a, b)
            if not _INT64[0] <= v <= _INT64[1]:
                raise DimError(dim, f"dim {dim}: {a} {_SYMBOLS[op]} {b} does not fit in 64 bits")
            out.append(v)
    return out[0]


class DerivedDims:
    """The derived dims of a spec, checked (known names, no cycles) and in evaluation order."""

    def __init__(self, expressions: dict[str, str], all_names):
        all_names = list(all_names)
        self.expressions = {n: e.strip() for n, e in expressions.items()}
        self._trees = {n: parse(e, n) for n, e in self.expressions.items()}
        self._reads = {n: names(t) for n, t in self._trees.items()}
        for n, reads in self._reads.items():
            for r in reads:
                if r not in all_names:
                    raise DimError(n, f"dim {n}: {self.expressions[n]!r} reads unknown dim {r!r}")
        self.order: list[str] = []
        state: dict = {}

        def visit(n, path):
            if state.get(n) == "done" or n not in self._trees:
                return
            if state.get(n) == "open":
                cycle = path[path.index(n):] + [n]
                raise DimError(n, f"dims depend on each other in a cycle: {' -> '.join(cycle)}")
            state[n] = "open"
            for r in self._reads[n]:
                visit(r, path + [n])
            state[n] = "done"
            self.order.append(n)

        for n in self._trees:
            visit(n, [])

    def __bool__(self):
        return bool(self._trees)

    def __contains__(self, name):
        return name in self._trees

    def bases(self, name: str) -> set:
        """The non-derived dims a dim is computed from (itself when it is not derived)."""
        if name not in self._trees:
            return {name}
        out = set()
        for r in self._reads[name]:
            out |= self.bases(r)
        return out

    def apply(self, values: dict) -> dict:
        """`values` (every dim) with each derived dim recomputed from the others, in order;
        a result below 1 is a DimError."""
        out = dict(values)
        for n in self.order:
            v = evaluate(self._trees[n], out, n)
            if v < 1:
                reads = ", ".join(f"{r} = {out[r]}" for r in self._reads[n])
                raise DimError(n, f"dim {n}: {self.expressions[n]!r} is {v}"
                                  f"{' with ' + reads if reads else ''}; sizes must be positive")
            out[n] = v
        return out
