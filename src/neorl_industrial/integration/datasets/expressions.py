"""Reward and cost definitions over the columns of a plant log, evaluated in numpy.

The language (numbers, column names, ``+ - * / **``, unary signs, parentheses, ``abs``,
``min``, ``max``, ``exp``, ``log``, ``sqrt``), its parser, its limits (:data:`MAX_LENGTH`,
:data:`MAX_DEPTH`, literals that fit a float64) and its error messages are those of
:func:`neorl_industrial.core.models.signals.compile_expression`, which a plant model also
uses to compute the same channels in JAX; an :class:`Expression` is that compiled with
numpy, evaluated to float64 on every row of a log.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from neorl_industrial.core.models.signals import MAX_DEPTH, MAX_LENGTH, compile_expression

__all__ = ["MAX_DEPTH", "MAX_LENGTH", "Expression"]

Columns = Mapping[str, np.ndarray]


class Expression:
    """A parsed, validated expression; call :meth:`evaluate` on columns.

    Args:
        source: the expression text, e.g. ``"-abs(temperature - 350) - 0.01 * valve"``.

    Raises:
        ValueError: naming the construct that is not allowed, the syntax error, or the
            limit the text goes beyond.
    """

    def __init__(self, source: str):
        self._evaluate, names = compile_expression(source, np)
        self.source = source
        self.names: frozenset[str] = names

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
