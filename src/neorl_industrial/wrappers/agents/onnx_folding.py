"""Constant folding for the ONNX lowering (:mod:`.onnx_graph`): an equation whose
operands are all constants is evaluated at export time, in numpy where that is exact and
with JAX otherwise, so the graph holds only the per-row work."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import numpy as np

from neorl_industrial.wrappers.agents.onnx_values import OnnxExportError

__all__ = ["fold"]


def fold(eqn: Any, values: list[Any]) -> list[Any]:
    """Evaluates an equation of constants: exact IEEE operations and data movement in
    numpy (bit for bit what XLA computes), anything else with JAX itself (which
    compiles it, once per primitive and shape)."""
    exact = _EXACT.get(eqn.primitive.name)
    result = None
    if exact is not None:
        with np.errstate(all="ignore"):
            result = exact(*values, **eqn.params)
    if result is not None:
        aval = eqn.outvars[0].aval
        return [np.asarray(result).astype(aval.dtype, copy=False).reshape(aval.shape)]
    try:
        out = eqn.primitive.bind(*(jnp.asarray(v) for v in values), **eqn.params)
    except Exception as error:
        raise OnnxExportError(
            f"{eqn.primitive.name}: cannot evaluate it on the policy's constants: {error}"
        ) from error
    out = out if eqn.primitive.multiple_results else [out]
    return [np.asarray(o) for o in out]


def _broadcast_in_dim(x: Any, shape: tuple, broadcast_dimensions: tuple, **_: Any) -> Any:
    expanded = np.reshape(
        x,
        [
            x.shape[broadcast_dimensions.index(a)] if a in broadcast_dimensions else 1
            for a in range(len(shape))
        ],
    )
    return np.broadcast_to(expanded, shape)


def _slice(x: Any, start_indices: tuple, limit_indices: tuple, strides: Any, **_: Any) -> Any:
    steps = strides or (1,) * len(start_indices)
    return x[
        tuple(slice(a, b, c) for a, b, c in zip(start_indices, limit_indices, steps, strict=True))
    ]


def _select_n(which: Any, *cases: Any) -> Any:
    return np.choose(np.asarray(which, np.int32), np.broadcast_arrays(*cases))


# Constant folding in numpy: operations IEEE 754 rounds exactly (the same bits as XLA's)
# and data movement. Transcendentals are left to JAX (their approximations differ).
_EXACT: dict[str, Callable[..., Any]] = {
    "add": np.add,
    "sub": np.subtract,
    "mul": lambda a, b, **_: np.multiply(a, b),
    "div": lambda a, b: np.divide(a, b) if np.result_type(a, b).kind == "f" else None,
    # (None: left to JAX; an integer division truncates there, a float to integer
    # conversion saturates.)
    "max": np.maximum,
    "min": np.minimum,
    "neg": np.negative,
    "abs": np.abs,
    "square": np.square,
    "sign": np.sign,
    "floor": np.floor,
    "ceil": np.ceil,
    "eq": np.equal,
    "ne": np.not_equal,
    "lt": np.less,
    "le": np.less_equal,
    "gt": np.greater,
    "ge": np.greater_equal,
    "and": np.bitwise_and,
    "or": np.bitwise_or,
    "xor": np.bitwise_xor,
    "not": lambda x: np.logical_not(x) if x.dtype == np.bool_ else np.invert(x),
    "is_finite": np.isfinite,
    "select_n": _select_n,
    "convert_element_type": lambda x, new_dtype, **_: (
        None
        if np.asarray(x).dtype.kind == "f" and np.dtype(new_dtype).kind in "iub"
        else np.asarray(x).astype(new_dtype)
    ),
    "broadcast_in_dim": _broadcast_in_dim,
    "reshape": lambda x, new_sizes, **_: np.reshape(x, new_sizes),
    "squeeze": lambda x, dimensions: np.squeeze(x, tuple(dimensions)),
    "expand_dims": lambda x, dimensions: np.expand_dims(x, tuple(dimensions)),
    "slice": _slice,
    "concatenate": lambda *xs, dimension: np.concatenate(xs, dimension),
    "stack": lambda *xs, axis: np.stack(xs, axis),
    "transpose": lambda x, permutation: np.transpose(x, permutation),
    "reduce_and": lambda x, axes, **_: np.all(x, axis=tuple(axes)),
    "reduce_or": lambda x, axes, **_: np.any(x, axis=tuple(axes)),
    "reduce_max": lambda x, axes, **_: np.max(x, axis=tuple(axes)),
    "reduce_min": lambda x, axes, **_: np.min(x, axis=tuple(axes)),
    "stop_gradient": lambda x: x,
    "copy": lambda x: x,
    "copy_p": lambda x: x,
}
