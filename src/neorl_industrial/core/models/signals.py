"""The known parts of a plant: reward and cost channels that its schema defines as
expressions of observations and actions, computed in JAX from a predicted observation.

A plant-log schema writes its reward and costs in a small arithmetic language (numbers,
column names, ``+ - * / **``, unary signs, parentheses, ``abs``, ``min``, ``max``, ``exp``,
``log``, ``sqrt``; see ``integration.datasets.expressions``, which evaluates it in numpy on
the log). A plant model does not learn what is known: :func:`compile_expression` turns the
same text, parsed by :mod:`ast` and checked against the same grammar, into a function of
columns that is traceable (``jnp``) or numpy (``xp=np``), so a channel is computed from the
model's predicted observation inside a compiled rollout. Nothing is ever passed to
``eval``; text beyond the grammar is refused by name.

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
    "ROWS",
    "KnownSignal",
    "KnownSignals",
    "compile_expression",
    "match_row",
]

#: The longest expression text accepted (as the schema's expression language).
MAX_LENGTH = 1000
#: The deepest expression tree accepted (as the schema's expression language).
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
_UNARY = ("abs", "exp", "log", "sqrt")
_VARIADIC = {"min": "minimum", "max": "maximum"}
_ALLOWED = (
    "numbers, column names, + - * / **, unary minus, parentheses and the functions "
    "abs, min, max, exp, log, sqrt"
)

Columns = Mapping[str, Any]


def compile_expression(source: str, xp: Any = jnp) -> tuple[Callable[[Columns], Any], frozenset]:
    """``(function, names)``: ``function(columns)`` evaluates ``source`` with the array
    module ``xp`` (``jax.numpy``: traceable; ``numpy``) on a mapping of column name to
    array, and ``names`` are the columns it reads.

    Raises:
        ValueError: naming the construct outside the grammar, a syntax error, or text too
            long or too deeply nested.
    """
    if len(source) > MAX_LENGTH:
        raise ValueError(f"expression longer than {MAX_LENGTH} characters")
    try:
        tree = ast.parse(source.strip(), mode="eval")
    except SyntaxError as error:
        raise ValueError(f"{source!r} is not a valid expression: {error.msg}") from None
    except (RecursionError, MemoryError):
        raise ValueError(f"{source[:40]!r}...: nested too deeply") from None
    depth = _tree_depth(tree.body)
    if depth > MAX_DEPTH:
        raise ValueError(f"expression nested {depth} levels deep, more than {MAX_DEPTH}")
    names: set[str] = set()
    function = _compile(tree.body, names, xp)
    return function, frozenset(names)


def _tree_depth(root: ast.AST) -> int:
    deepest, pending = 0, [(root, 0)]
    while pending:
        node, depth = pending.pop()
        deepest = max(deepest, depth)
        pending.extend((child, depth + 1) for child in ast.iter_child_nodes(node))
    return deepest


def _compile(node: ast.expr, names: set[str], xp: Any) -> Callable[[Columns], Any]:
    match node:
        case ast.Constant(value=value) if isinstance(value, int | float) and not isinstance(
            value, bool
        ):
            constant = float(value)
            if not np.isfinite(constant):
                raise ValueError(f"the literal {value!r} is larger than a float64 holds")
            return lambda columns: constant
        case ast.Name(id=name):
            names.add(name)
            return lambda columns: columns[name]
        case ast.BinOp(left=left, op=op, right=right) if type(op) in _BINARY:
            apply = _BINARY[type(op)]
            first, second = _compile(left, names, xp), _compile(right, names, xp)
            return lambda columns: apply(first(columns), second(columns))
        case ast.UnaryOp(op=ast.USub(), operand=operand):
            inner = _compile(operand, names, xp)
            return lambda columns: -inner(columns)
        case ast.UnaryOp(op=ast.UAdd(), operand=operand):
            return _compile(operand, names, xp)
        case ast.Call(func=ast.Name(id=function), args=args, keywords=[]) if all(
            not isinstance(arg, ast.Starred) for arg in args
        ):
            arguments = [_compile(arg, names, xp) for arg in args]
            if function in _UNARY:
                if len(arguments) != 1:
                    raise ValueError(f"'{ast.unparse(node)}': {function} takes one argument")
                apply_one = getattr(xp, function)
                (argument,) = arguments
                return lambda columns: apply_one(argument(columns))
            if function in _VARIADIC:
                if len(arguments) < 2:
                    raise ValueError(
                        f"'{ast.unparse(node)}': {function} takes two or more arguments"
                    )
                combine = getattr(xp, _VARIADIC[function])
                return lambda columns: functools.reduce(
                    combine, (argument(columns) for argument in arguments)
                )
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
