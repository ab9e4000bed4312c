"""The safe constraint interpreter: boolean expressions over parameter names, never ``eval``.

A search space may relate its parameters (``max_num_batched_tokens >= max_num_seqs``). The
expression is parsed with :mod:`ast`, checked against a whitelist (comparisons, arithmetic on
numbers, and/or/not, ``len``/``max``/``min``) and interpreted node by node, so a spec file can
never run code, build a huge object or read anything but the values it names.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from autotune.errors import SpecError

#: longest constraint expression accepted (bounds parsing, recursion and every value it builds)
MAX_CONSTRAINT_CHARS = 1000


@dataclass(frozen=True)
class Constraint:
    """A boolean expression over parameter names, e.g. ``max_num_batched_tokens >= max_num_seqs``.

    Evaluated by a small AST interpreter (comparisons, arithmetic, and/or/not), never ``eval``.
    A constraint that names an inactive parameter holds: it says nothing about that config.
    Evaluation never raises a raw Python error: a type error (``mode > 3`` on strings) is a
    :class:`SpecError` naming the constraint; :func:`autotune.space.load.load_space` tries the
    values of every parameter a constraint names, so that happens when the space is loaded,
    not mid-study.
    """

    expr: str
    names: frozenset[str]
    tree: ast.Expression = field(compare=False, repr=False)
    key: str = field(default="constraints", compare=False)
    file: str | None = field(default=None, compare=False)

    def holds(self, values: Mapping[str, Any]) -> bool:
        if not self.names <= set(values):
            return True
        try:
            return bool(_evaluate(self.tree.body, values))
        except _EVAL_ERRORS as exc:
            raise SpecError(self._why(values, exc), file=self.file, key=self.key) from None

    def problem(self, values: Mapping[str, Any]) -> str | None:
        """Why the expression cannot be evaluated for ``values``, or None if it can."""
        try:
            bool(_evaluate(self.tree.body, values))
        except _EVAL_ERRORS as exc:
            return self._why(values, exc)
        return None

    def _why(self, values: Mapping[str, Any], exc: BaseException) -> str:
        shown = ", ".join(f"{n}={values[n]!r}" for n in sorted(self.names))
        reason = str(exc) or type(exc).__name__
        return f"{self.expr!r} cannot be evaluated for {shown}: {reason}"


_ALLOWED = (
    ast.Expression,
    ast.BoolOp,
    ast.And,
    ast.Or,
    ast.UnaryOp,
    ast.Not,
    ast.USub,
    ast.UAdd,
    ast.Compare,
    ast.Eq,
    ast.NotEq,
    ast.Lt,
    ast.LtE,
    ast.Gt,
    ast.GtE,
    ast.In,
    ast.NotIn,
    ast.BinOp,
    ast.Add,
    ast.Sub,
    ast.Mult,
    ast.Div,
    ast.FloorDiv,
    ast.Mod,
    ast.Name,
    ast.Load,
    ast.Constant,
    ast.List,
    ast.Tuple,
    ast.Call,
)
_FUNCS = {"len": len, "max": max, "min": min}
#: the names a constraint reads as functions (so no parameter may have one of them)
FUNCTIONS = frozenset(_FUNCS)
_ORDER = {
    ast.Lt: lambda a, b: a < b,
    ast.LtE: lambda a, b: a <= b,
    ast.Gt: lambda a, b: a > b,
    ast.GtE: lambda a, b: a >= b,
}


#: constants a constraint may contain (no bytes, complex numbers or ``...``)
_CONSTANT_TYPES = (bool, int, float, str, type(None))
_NUMBER_ONLY = {
    ast.Sub: "-",
    ast.Mult: "*",
    ast.Div: "/",
    ast.FloorDiv: "//",
    ast.Mod: "%",
}


class _EvalError(Exception):
    """An operation the interpreter refuses (it would build a huge object, or means nothing)."""


_EVAL_ERRORS = (
    _EvalError,
    TypeError,
    ValueError,
    ArithmeticError,
    RecursionError,
    MemoryError,
)


class ConstraintSyntaxError(Exception):
    """An expression the interpreter refuses to compile; the caller names file and key."""


def compile_constraint(
    expr: Any, names: set[str], *, key: str = "constraints", file: str | None = None
) -> Constraint:
    """Check ``expr`` against the interpreter's whitelist and the known parameter ``names``.
    Raises :class:`ConstraintSyntaxError` with the message the user sees."""
    if not isinstance(expr, str) or not expr.strip():
        raise ConstraintSyntaxError("must be an expression string")
    if len(expr) > MAX_CONSTRAINT_CHARS:
        raise ConstraintSyntaxError(
            f"expression too long ({len(expr)} characters, at most {MAX_CONSTRAINT_CHARS})"
        )
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError as exc:
        raise ConstraintSyntaxError(f"invalid expression {expr!r}: {exc.msg}") from None
    except (ValueError, RecursionError, MemoryError) as exc:
        raise ConstraintSyntaxError(
            f"invalid expression {expr!r}: {exc or type(exc).__name__}"
        ) from None
    used: set[str] = set()
    called = {id(node.func) for node in ast.walk(tree) if isinstance(node, ast.Call)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in _FUNCS and id(node) not in called:
            # ``len > 1`` read no parameter: evaluating it raised a KeyError, a traceback
            raise ConstraintSyntaxError(f"{node.id} is a function: call it in {expr!r}")
        if not isinstance(node, _ALLOWED):
            raise ConstraintSyntaxError(f"{type(node).__name__} is not allowed in {expr!r}")
        if isinstance(node, ast.Call) and not (
            isinstance(node.func, ast.Name) and node.func.id in _FUNCS and not node.keywords
        ):
            raise ConstraintSyntaxError(f"only {', '.join(_FUNCS)} may be called in {expr!r}")
        if isinstance(node, ast.Constant) and not isinstance(node.value, _CONSTANT_TYPES):
            raise ConstraintSyntaxError(f"constant {node.value!r} is not allowed in {expr!r}")
        if isinstance(node, ast.BinOp) and type(node.op) in _NUMBER_ONLY:
            for side in (node.left, node.right):
                if isinstance(side, ast.List | ast.Tuple) or (
                    isinstance(side, ast.Constant) and isinstance(side.value, str)
                ):
                    raise ConstraintSyntaxError(
                        f"{_NUMBER_ONLY[type(node.op)]} applies to numbers only in {expr!r}"
                        " (repeating or formatting a string or list is not allowed)"
                    )
        if isinstance(node, ast.Name) and node.id not in _FUNCS:
            used.add(node.id)
    unknown = used - names
    if unknown:
        raise ConstraintSyntaxError(f"unknown parameter {sorted(unknown)[0]!r} in {expr!r}")
    return Constraint(expr=expr, names=frozenset(used), tree=tree, key=key, file=file)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float)  # bool is an int: True + 1 == 2, as in Python


def _evaluate(node: ast.AST, values: Mapping[str, Any]) -> Any:
    """Interpret an expression checked by :func:`compile_constraint`. ``*``, ``-``, ``/``,
    ``//`` and ``%`` take numbers only, so no operand can make it build a huge string or list
    (``'a' * n``) or format one (``'%999999999d' % n``); anything else that Python refuses
    raises one of ``_EVAL_ERRORS``, turned into a SpecError by :meth:`Constraint.problem`."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return values[node.id]
    if isinstance(node, ast.List | ast.Tuple):
        return [_evaluate(e, values) for e in node.elts]
    if isinstance(node, ast.BoolOp):
        results = (_evaluate(v, values) for v in node.values)
        return all(results) if isinstance(node.op, ast.And) else any(results)
    if isinstance(node, ast.UnaryOp):
        operand = _evaluate(node.operand, values)
        if isinstance(node.op, ast.Not):
            return not operand
        if not _is_number(operand):
            raise _EvalError(f"unary minus or plus needs a number, got {operand!r}")
        return -operand if isinstance(node.op, ast.USub) else +operand
    if isinstance(node, ast.Call):
        return _FUNCS[node.func.id](*[_evaluate(a, values) for a in node.args])
    if isinstance(node, ast.BinOp):
        left, right = _evaluate(node.left, values), _evaluate(node.right, values)
        symbol = _NUMBER_ONLY.get(type(node.op))
        if symbol is not None and not (_is_number(left) and _is_number(right)):
            raise _EvalError(f"{symbol} applies to numbers only, got {left!r} {symbol} {right!r}")
        ops = {
            ast.Add: lambda a, b: a + b,
            ast.Sub: lambda a, b: a - b,
            ast.Mult: lambda a, b: a * b,
            ast.Div: lambda a, b: a / b if b else math.inf,
            ast.FloorDiv: lambda a, b: a // b if b else math.inf,
            ast.Mod: lambda a, b: a % b if b else math.nan,
        }
        return ops[type(node.op)](left, right)
    if isinstance(node, ast.Compare):
        left = _evaluate(node.left, values)
        for op, comparator in zip(node.ops, node.comparators, strict=True):
            right = _evaluate(comparator, values)
            if isinstance(op, ast.In | ast.NotIn) and not isinstance(right, list):
                raise _EvalError(f"'in' needs a list on its right, got {right!r}")
            ok = {
                ast.Eq: lambda a, b: a == b,
                ast.NotEq: lambda a, b: a != b,
                ast.In: lambda a, b: a in b,
                ast.NotIn: lambda a, b: a not in b,
                **_ORDER,
            }[type(op)](left, right)
            if not ok:
                return False
            left = right
        return True
    raise _EvalError(f"unsupported expression node {type(node).__name__}")
