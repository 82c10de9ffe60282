"""The plant schema's expression language, and the known parts of a plant: reward and cost
channels that its schema defines as expressions of observations and actions, computed in
JAX from a predicted observation.

The language (numbers, column names, ``+ - * / **``, unary minus and plus, parentheses, the
functions ``abs``, ``min``, ``max`` (element-wise, two or more arguments), ``exp``, ``log``
and ``sqrt``, and the comparisons ``< <= > >=``, which are 1 where they hold and 0 where
not: an alarm threshold such as ``temperature > 420``) is defined here once.
:func:`compile_expression` parses the text with :mod:`ast` and turns it into a function of
columns in the array module ``xp``: traceable with ``jax.numpy`` (a plant model computes a
channel from its predicted observation inside a compiled rollout), or ``numpy``
(``integration.datasets.expressions`` evaluates reward and cost definitions on a plant log
with it). Anything else (attributes, subscripts, ``==`` and ``!=`` (exact equality of
measured values), ``and``/``or``, keywords, other calls) is refused by name before any
evaluation, and nothing is ever passed to ``eval``.

The text comes from a schema file, so it is untrusted: it is limited in length, in nesting
depth (checked on the text before :mod:`ast` parses it, and on the tree before it is
compiled, so neither recursion can run out of stack) and in the size of its number literals
(a literal must fit a float64; a computed overflow such as ``10 ** 10 ** 10`` is infinity,
which the caller reports). A literal is a float64 in numpy and a weakly typed scalar in JAX,
so there it takes the precision of the columns.

A channel is *known* when every name in its expression is an observation (or, evaluated on
the transition's own row, an action) and, on the data, the expression reproduces the logged
channel (:func:`match_row`): the row it is evaluated on (``current``: the transition's
observation and action; ``next``: the observation the action led to) is the schema's
``reward_row`` when given, otherwise the one the data agrees with.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np

__all__ = [
    "MAX_DEPTH",
    "MAX_LENGTH",
    "ROWS",
    "KnownSignal",
    "KnownSignals",
    "compile_expression",
    "match_row",
]

#: The longest expression text accepted, in characters.
MAX_LENGTH = 1000
#: The deepest nesting accepted: parentheses, function calls, unary signs and operators
#: (``a + b + c`` is two levels). Compiling and evaluating recurse once per level.
MAX_DEPTH = 100
#: Rows a channel of transition ``t`` can be evaluated on: the transition's own (its
#: observation and action) or the next one (the observation the action led to).
ROWS = ("current", "next")

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
}
#: Comparisons, 1 where they hold and 0 where not (a chain ``a < b < c`` holds where each
#: of its links does).
_COMPARE: dict[type[ast.cmpop], Callable[[Any, Any], Any]] = {
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
}
_UNARY = ("abs", "exp", "log", "sqrt")
_VARIADIC = {"min": "minimum", "max": "maximum"}
_ALLOWED = (
    "numbers, column names, + - * / **, unary minus, parentheses, the functions "
    "abs, min, max, exp, log, sqrt and the comparisons < <= > >="
)
_TOO_DEEP = f"nested more than {MAX_DEPTH} levels deep; write it with fewer levels"

Columns = Mapping[str, Any]


def compile_expression(source: str, xp: Any = jnp) -> tuple[Callable[[Columns], Any], frozenset]:
    """``(function, names)``: ``function(columns)`` evaluates ``source`` with the array
    module ``xp`` (``jax.numpy``: traceable; ``numpy``) on a mapping of column name to
    array, and ``names`` are the columns it reads (not the functions it calls).

    The value is an array (or a scalar, for an expression of constants only) that
    broadcasts with the columns. Non-finite values (``log`` of a negative, division by
    zero, an overflowing power) are returned as they are; numpy's warnings about them are
    the caller's to silence.

    Raises:
        ValueError: naming the construct outside the grammar, a syntax error, a literal
            larger than a float64, or text too long or too deeply nested.
    """
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
    names: set[str] = set()
    try:
        function = _compile(tree.body, names, xp)
    except RecursionError:
        raise ValueError(_TOO_DEEP) from None
    return function, frozenset(names)


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


def _constant(value: int | float) -> float:
    """A number literal as a float; one beyond float64's range is refused."""
    try:
        constant = float(value)
    except OverflowError:  # an int too large for a float
        constant = np.inf
    if not np.isfinite(constant):
        digits = len(str(abs(int(value)))) if isinstance(value, int) else None
        size = f"a {digits}-digit number" if digits else "a number"
        raise ValueError(
            f"{size} literal is larger than a float64 holds "
            f"(at most {np.finfo(np.float64).max:.3g}); write a smaller number"
        )
    return constant


def _compile(node: ast.expr, names: set[str], xp: Any) -> Callable[[Columns], Any]:
    match node:
        case ast.Constant(value=value) if isinstance(value, int | float) and not isinstance(
            value, bool
        ):
            # An array of xp, not a Python number: Python ints would compute 10 ** 10 ** 10
            # exactly (endlessly) and Python floats would raise on 1 / 0, where arrays
            # overflow to inf. numpy makes it float64; JAX a weakly typed scalar.
            constant = _constant(value)
            return lambda columns: xp.asarray(constant)
        case ast.Name(id=name):
            names.add(name)
            return lambda columns: columns[name]
        case ast.BinOp(left=left, op=op, right=right) if type(op) in _BINARY:
            apply = _BINARY[type(op)]
            first, second = _compile(left, names, xp), _compile(right, names, xp)
            return lambda columns: apply(first(columns), second(columns))
        case ast.Compare(left=left, ops=ops, comparators=rights) if all(
            type(op) in _COMPARE for op in ops
        ):
            operands = [_compile(part, names, xp) for part in (left, *rights)]
            links = [_COMPARE[type(op)] for op in ops]
            return lambda columns: _holds(links, [operand(columns) for operand in operands], xp)
        case ast.UnaryOp(op=ast.USub(), operand=operand):
            inner = _compile(operand, names, xp)
            return lambda columns: -inner(columns)
        case ast.UnaryOp(op=ast.UAdd(), operand=operand):
            return _compile(operand, names, xp)
        case ast.Call(func=ast.Name(id=function), args=args, keywords=[]) if all(
            not isinstance(arg, ast.Starred) for arg in args
        ):
            return _compile_call(node, function, args, names, xp)
    raise ValueError(f"'{ast.unparse(node)}' is not allowed; expressions may use {_ALLOWED}")


def _holds(links: list[Callable[[Any, Any], Any]], values: list[Any], xp: Any) -> Any:
    """1 where every link of a comparison chain holds, 0 where one does not (a NaN
    operand compares false), in the operands' floating type."""
    pairs = zip(links, values[:-1], values[1:], strict=True)
    held = functools.reduce(xp.logical_and, (link(a, b) for link, a, b in pairs))
    return xp.where(held, xp.asarray(1.0), xp.asarray(0.0))


def _compile_call(
    node: ast.Call, function: str, args: list[ast.expr], names: set[str], xp: Any
) -> Callable[[Columns], Any]:
    arguments = [_compile(arg, names, xp) for arg in args]
    if function in _UNARY:
        if len(arguments) != 1:
            raise ValueError(f"'{ast.unparse(node)}': {function} takes one argument")
        apply = getattr(xp, function)
        (argument,) = arguments
        return lambda columns: apply(argument(columns))
    if function in _VARIADIC:
        if len(arguments) < 2:
            raise ValueError(f"'{ast.unparse(node)}': {function} takes two or more arguments")
        combine = getattr(xp, _VARIADIC[function])
        return lambda columns: functools.reduce(combine, (arg(columns) for arg in arguments))
    raise ValueError(f"'{ast.unparse(node)}' is not allowed; expressions may use {_ALLOWED}")


@dataclasses.dataclass(frozen=True)
class KnownSignal:
    """One channel computed, not learned: ``channel`` is ``reward`` or a cost name,
    ``index`` its cost column (None for the reward), ``source`` its expression and
    ``row`` where it is evaluated (:data:`ROWS`)."""

    channel: str
    index: int | None
    source: str
    row: str

    def __post_init__(self) -> None:
        if self.row not in ROWS:
            raise ValueError(f"{self.channel}: row must be one of {list(ROWS)}, got {self.row!r}")
        compile_expression(self.source)  # refuses text outside the grammar here

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class KnownSignals:
    """The known channels of a model, and the columns they are evaluated on.

    ``observation_names`` name the observation features (every frame of a stacked one),
    ``action_names`` the actions (in plant units when evaluated).
    """

    signals: tuple[KnownSignal, ...] = ()
    observation_names: tuple[str, ...] = ()
    action_names: tuple[str, ...] = ()

    @property
    def reward(self) -> KnownSignal | None:
        return next((s for s in self.signals if s.index is None), None)

    @property
    def cost_indices(self) -> tuple[int, ...]:
        return tuple(sorted(s.index for s in self.signals if s.index is not None))

    def evaluate(
        self, observation: Any, action: Any, next_observation: Any, xp: Any = jnp
    ) -> dict[str, Any]:
        """Every known channel's value (by channel name) on one transition or a batch:
        ``observation`` and ``next_observation`` ``[..., obs_size]``, ``action``
        ``[..., action_size]`` in plant units."""
        values = {}
        for signal in self.signals:
            function, _ = compile_expression(signal.source, xp)
            row = observation if signal.row == "current" else next_observation
            columns = _columns(self.observation_names, row)
            if signal.row == "current":
                columns |= _columns(self.action_names, action)
            shape = xp.shape(row)[:-1]
            values[signal.channel] = xp.broadcast_to(
                xp.asarray(function(columns), row.dtype), shape
            )
        return values

    def to_dict(self) -> dict[str, Any]:
        return {
            "signals": [signal.to_dict() for signal in self.signals],
            "observation_names": list(self.observation_names),
            "action_names": list(self.action_names),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> KnownSignals:
        return cls(
            signals=tuple(KnownSignal(**dict(signal)) for signal in data.get("signals", ())),
            observation_names=tuple(data.get("observation_names", ())),
            action_names=tuple(data.get("action_names", ())),
        )


def _columns(names: Sequence[str], values: Any) -> dict[str, Any]:
    return {name: values[..., i] for i, name in enumerate(names)}


def computable_rows(
    source: str, observation_names: Sequence[str], action_names: Sequence[str]
) -> tuple[str, ...]:
    """The rows (:data:`ROWS`) on which ``source`` can be computed from a transition:
    ``current`` when it reads only observations and actions, ``next`` when only
    observations; none when it reads another column of the log (an alarm flag, a meter).

    Raises:
        ValueError: for text outside the expression grammar.
    """
    _, names = compile_expression(source, np)
    observations, actions = set(observation_names), set(action_names)
    rows = []
    if names <= observations | actions:
        rows.append("current")
    if names <= observations:
        rows.append("next")
    return tuple(rows)


def match_row(
    source: str,
    logged: np.ndarray,
    observations: np.ndarray,
    actions: np.ndarray,
    next_observations: np.ndarray,
    observation_names: Sequence[str],
    action_names: Sequence[str],
    rows: Sequence[str] = ROWS,
) -> str | None:
    """The first of ``rows`` on which ``source``, evaluated on the data's transitions
    (host arrays, actions in plant units), reproduces the ``logged`` channel (float32
    rounding allowed); None when none does or it reads columns the model does not have."""
    possible = computable_rows(source, observation_names, action_names)
    function, _ = compile_expression(source, np)
    logged = np.asarray(logged, np.float64)
    tolerance = 1e-4 * max(1.0, float(np.max(np.abs(logged), initial=0.0)))
    for row in rows:
        if row not in possible:
            continue
        frame = observations if row == "current" else next_observations
        columns = _columns(observation_names, np.asarray(frame, np.float64))
        if row == "current":
            columns |= _columns(action_names, np.asarray(actions, np.float64))
        with np.errstate(all="ignore"):
            value = np.broadcast_to(np.asarray(function(columns), np.float64), logged.shape)
        if np.all(np.isfinite(value)) and np.max(np.abs(value - logged), initial=0.0) <= tolerance:
            return row
    return None
