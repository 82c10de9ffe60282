"""A tiny, safe arithmetic language for reward and cost definitions over log columns.

Allowed: numbers, column names, ``+ - * / **``, unary minus and plus, parentheses, and the
functions ``abs``, ``min``, ``max`` (element-wise, two or more arguments), ``exp``, ``log``
and ``sqrt``. The text is parsed with :mod:`ast` and compiled into numpy calls; anything
else (attributes, subscripts, comparisons, keywords, other calls) is rejected before any
evaluation, and nothing is ever passed to ``eval``.

The text comes from a schema file, so it is untrusted: it is limited in length, in
nesting depth (checked on the text before :mod:`ast` parses it, and on the tree before it
is compiled, so neither recursion can run out of stack) and in the size of its number
literals (a literal must fit a float64; a computed overflow such as ``10 ** 10 ** 10`` is
infinity, which the caller reports with its row).
"""

from __future__ import annotations

import ast
import functools
import operator
from collections.abc import Callable, Mapping

import numpy as np

MAX_LENGTH = 1000
#: The deepest nesting accepted: parentheses, function calls, unary signs and operators
#: (``a + b + c`` is two levels). Compiling and evaluating recurse once per level.
MAX_DEPTH = 100

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
        _check_depth(_text_depth(source))
        try:
            tree = ast.parse(source.strip(), mode="eval")
        except SyntaxError as error:
            raise ValueError(f"not a valid expression: {error.msg}") from None
        except (RecursionError, MemoryError):
            raise ValueError(_TOO_DEEP) from None
        _check_depth(_tree_depth(tree.body))
        self.source = source
        names: set[str] = set()
        try:
            self._evaluate = _compile(tree.body, names)
        except RecursionError:
            raise ValueError(_TOO_DEEP) from None
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


_TOO_DEEP = f"nested more than {MAX_DEPTH} levels deep; write it with fewer levels"


def _check_depth(depth: int) -> None:
    if depth > MAX_DEPTH:
        raise ValueError(f"nested {depth} levels deep, more than {MAX_DEPTH}; simplify it")


def _text_depth(source: str) -> int:
    """The nesting of ``source`` as the parser meets it, read off the text without
    parsing: brackets, plus the unary signs in front of an operand (``-(-(-x))`` is 5)."""
    bases: list[int] = []  # the level at each open bracket
    level = deepest = 0
    expects_operand = True
    for char in source:
        if char.isspace():
            continue
        if char in "([{":
            bases.append(level)
            level += 1
            expects_operand = True
        elif char in ")]}":
            level = bases.pop() if bases else 0
            expects_operand = False
        elif char in "+-~" and expects_operand:
            level += 1  # a unary sign nests its operand
        elif char in "+-*/%@<>=!&|^,:":
            # A binary operator: the unary signs before its left operand are closed.
            level = bases[-1] + 1 if bases else 0
            expects_operand = True
        else:
            expects_operand = False
        deepest = max(deepest, level)
    return deepest


# Nodes that only mark what their parent is (``+``, a load); they add no level.
_MARKERS = (ast.expr_context, ast.operator, ast.unaryop, ast.boolop, ast.cmpop)


def _tree_depth(root: ast.AST) -> int:
    """The depth of the expression tree (every part of it, also those the language
    refuses: an error message unparses them), counted without recursion."""
    deepest = 0
    pending = [(root, 0)]
    while pending:
        node, depth = pending.pop()
        deepest = max(deepest, depth)
        pending.extend(
            (child, depth + 1)
            for child in ast.iter_child_nodes(node)
            if not isinstance(child, _MARKERS)
        )
    return deepest


def _constant(value: int | float) -> np.float64:
    """A number literal as float64; one beyond float64's range is refused."""
    try:
        constant = np.float64(value)
    except OverflowError:
        constant = np.float64(np.inf)
    if not np.isfinite(constant):
        digits = len(str(abs(int(value)))) if isinstance(value, int) else None
        size = f"a {digits}-digit number" if digits else "a number"
        raise ValueError(
            f"{size} literal is larger than a float64 holds "
            f"(at most {np.finfo(np.float64).max:.3g}); write a smaller number"
        )
    return constant


def _compile(node: ast.expr, names: set[str]) -> _Node:
    match node:
        case ast.Constant(value=value) if isinstance(value, int | float) and not isinstance(
            value, bool
        ):
            # numpy floats overflow to inf where Python ints would compute 10 ** 10 ** 10
            # exactly (endlessly) and Python floats would raise on 1 / 0.
            constant = _constant(value)
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
