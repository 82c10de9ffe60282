"""A tiny, safe arithmetic language for reward and cost definitions over log columns.

Allowed: numbers, column names, ``+ - * / **``, unary minus and plus, parentheses, and the
functions ``abs``, ``min``, ``max`` (element-wise, two or more arguments), ``exp``, ``log``
and ``sqrt``. The text is parsed with :mod:`ast` and compiled into numpy calls; anything
else (attributes, subscripts, comparisons, keywords, other calls) is rejected before any
evaluation, and nothing is ever passed to ``eval``.
"""

from __future__ import annotations

import ast
import functools
import operator
from collections.abc import Callable, Mapping

import numpy as np

MAX_LENGTH = 1000

Columns = Mapping[str, np.ndarray]
_Node = Callable[[Columns], np.ndarray | float]

_BINARY: dict[type[ast.operator], Callable[[object, object], object]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
}
_UNARY_FUNCTIONS = {"abs": np.abs, "exp": np.exp, "log": np.log, "sqrt": np.sqrt}
_VARIADIC_FUNCTIONS = {"min": np.minimum, "max": np.maximum}
_ALLOWED = (
    "numbers, column names, + - * / **, unary minus, parentheses and the functions "
    "abs, min, max, exp, log, sqrt"
)


class Expression:
    """A parsed, validated expression; call :meth:`evaluate` on columns.

    Args:
        source: the expression text, e.g. ``"-abs(temperature - 350) - 0.01 * valve"``.

    Raises:
        ValueError: naming the construct that is not allowed, or the syntax error.
    """

    def __init__(self, source: str):
        if len(source) > MAX_LENGTH:
            raise ValueError(f"expression longer than {MAX_LENGTH} characters")
        try:
            tree = ast.parse(source.strip(), mode="eval")
        except SyntaxError as error:
            raise ValueError(f"not a valid expression: {error.msg}") from None
        self.source = source
        names: set[str] = set()
        self._evaluate = _compile(tree.body, names)
        self.names: frozenset[str] = frozenset(names)

    def evaluate(self, columns: Columns, length: int) -> np.ndarray:
        """The expression's value on every row, as float64 ``[length]``.

        Non-finite results (``log`` of a negative, division by zero) are returned as they
        are; the caller reports them with their row.
        """
        with np.errstate(all="ignore"):
            value = self._evaluate(columns)
        return np.broadcast_to(np.asarray(value, np.float64), (length,)).copy()

    def __repr__(self) -> str:
        return f"Expression({self.source!r})"


def _compile(node: ast.expr, names: set[str]) -> _Node:
    match node:
        case ast.Constant(value=value) if isinstance(value, int | float) and not isinstance(
            value, bool
        ):
            # numpy floats overflow to inf where Python ints would compute 10 ** 10 ** 10
            # exactly (endlessly) and Python floats would raise on 1 / 0.
            constant = np.float64(value)
            return lambda columns: constant
        case ast.Name(id=name):
            names.add(name)
            return lambda columns: columns[name]
        case ast.BinOp(left=left, op=op, right=right) if type(op) in _BINARY:
            apply = _BINARY[type(op)]
            left_node, right_node = _compile(left, names), _compile(right, names)
            return lambda columns: apply(left_node(columns), right_node(columns))
        case ast.UnaryOp(op=ast.USub(), operand=operand):
            inner = _compile(operand, names)
            return lambda columns: -inner(columns)
        case ast.UnaryOp(op=ast.UAdd(), operand=operand):
            return _compile(operand, names)
        case ast.Call(func=ast.Name(id=function), args=args, keywords=[]) if all(
            not isinstance(arg, ast.Starred) for arg in args
        ):
            return _compile_call(node, function, args, names)
    raise ValueError(f"'{ast.unparse(node)}' is not allowed; expressions may use {_ALLOWED}")


def _compile_call(node: ast.Call, function: str, args: list[ast.expr], names: set[str]) -> _Node:
    arguments = [_compile(arg, names) for arg in args]
    if function in _UNARY_FUNCTIONS:
        if len(arguments) != 1:
            raise ValueError(f"'{ast.unparse(node)}': {function} takes one argument")
        apply = _UNARY_FUNCTIONS[function]
        (argument,) = arguments
        return lambda columns: apply(argument(columns))
    if function in _VARIADIC_FUNCTIONS:
        if len(arguments) < 2:
            raise ValueError(f"'{ast.unparse(node)}': {function} takes two or more arguments")
        combine = _VARIADIC_FUNCTIONS[function]
        return lambda columns: functools.reduce(combine, (arg(columns) for arg in arguments))
    raise ValueError(f"'{ast.unparse(node)}' is not allowed; expressions may use {_ALLOWED}")
