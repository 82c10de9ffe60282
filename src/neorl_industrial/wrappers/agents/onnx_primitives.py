"""The ONNX nodes of the JAX primitives: one equation of a jaxpr whose operands are not
all constants, written with the node-building methods of the lowering
(:class:`~.onnx_graph._Lowering`, which mixes :class:`PrimitiveNodes` in)."""

from __future__ import annotations

import string
from typing import Any

import numpy as np

from neorl_industrial.extras import optional_imports
from neorl_industrial.wrappers.agents.onnx_values import (
    OnnxExportError,
    _is_symbolic,
    _onnx_dtype,
    _same_dim,
    _Value,
)

with optional_imports():
    from onnx import TensorProto

__all__ = ["PrimitiveNodes"]

_INT64_MAX = np.iinfo(np.int64).max

# One ONNX operator per primitive, operands in order.
_ELEMENTWISE = {
    "add": "Add",
    "sub": "Sub",
    "mul": "Mul",
    "div": "Div",
    "max": "Max",
    "min": "Min",
    "neg": "Neg",
    "abs": "Abs",
    "tanh": "Tanh",
    "exp": "Exp",
    "log": "Log",
    "sqrt": "Sqrt",
    "logistic": "Sigmoid",
    "erf": "Erf",
    "sign": "Sign",
    "floor": "Floor",
    "ceil": "Ceil",
    "sin": "Sin",
    "cos": "Cos",
    "pow": "Pow",
    "eq": "Equal",
    "lt": "Less",
    "le": "LessOrEqual",
    "gt": "Greater",
    "ge": "GreaterOrEqual",
}
# Logical on booleans, bitwise on integers.
_LOGICAL = {"and": ("And", "BitwiseAnd"), "or": ("Or", "BitwiseOr"), "xor": ("Xor", "BitwiseXor")}
# Primitives that only carry their operand (no effect on values in a forward pass).
_IDENTITY = {"stop_gradient", "copy", "copy_p", "optimization_barrier", "name"}


class PrimitiveNodes:
    """``emit``: the nodes of one equation, by primitive (``_p_<name>`` for those with
    parameters). The lowering that mixes this in provides ``node``, ``operand``,
    ``constant`` and ``shape_tensor``.
    """

    def emit(self, eqn: Any, values: list[Any]) -> list[Any]:
        name = eqn.primitive.name
        handler = getattr(self, f"_p_{name}", None)
        if name in _ELEMENTWISE:
            out = self.node(_ELEMENTWISE[name], [self.operand(v) for v in values])
        elif name in _LOGICAL:
            logical, bitwise = _LOGICAL[name]
            op = logical if eqn.outvars[0].aval.dtype == np.bool_ else bitwise
            out = self.node(op, [self.operand(v) for v in values])
        elif name in _IDENTITY:
            return list(values)
        elif handler is not None:
            out = handler(eqn, values)
        else:
            raise OnnxExportError(
                f"the policy uses the JAX primitive {name!r}, which has no ONNX lowering "
                f"here (at {_where(eqn)}); export it with format='jax', or write the policy "
                "without it"
            )
        outs = out if isinstance(out, list) else [out]
        return [_Value(o, var.aval) for o, var in zip(outs, eqn.outvars, strict=True)]

    def select(self, index: _Value, cases: list[Any], aval: Any) -> _Value:
        """``cases[index]`` elementwise (``select_n`` / ``cond``)."""
        if len(cases) == 1:
            return (
                cases[0] if isinstance(cases[0], _Value) else _Value(self.operand(cases[0]), aval)
            )
        if index.aval.dtype == np.bool_:
            return _Value(self.where(index.name, cases[1], cases[0], aval), aval)
        result = cases[-1]
        for k in range(len(cases) - 2, -1, -1):
            k_value = self.constant(np.asarray(k, index.aval.dtype))
            is_k = self.node("Equal", [index.name, k_value])
            result = _Value(self.where(is_k, cases[k], result, aval), aval)
        return result

    def where(self, condition: str, yes: Any, no: Any, aval: Any) -> str:
        """``Where``; on booleans (which ONNX Runtime's ``Where`` lacks) in logic."""
        yes, no = self.operand(yes), self.operand(no)
        if aval.dtype != np.bool_:
            return self.node("Where", [condition, yes, no])
        otherwise = self.node("And", [self.node("Not", [condition]), no])
        return self.node("Or", [self.node("And", [condition, yes]), otherwise])

    # ----- primitives with parameters ----------------------------------------------------
    def _p_select_n(self, eqn: Any, values: list[Any]) -> str:
        index = values[0]
        if not isinstance(index, _Value):
            index = _Value(self.operand(index), eqn.invars[0].aval)
        return self.select(index, values[1:], eqn.outvars[0].aval).name

    def _p_not(self, eqn: Any, values: list[Any]) -> str:
        op = "Not" if eqn.outvars[0].aval.dtype == np.bool_ else "BitwiseNot"
        return self.node(op, [self.operand(values[0])])

    def _p_ne(self, eqn: Any, values: list[Any]) -> str:
        return self.node("Not", [self.node("Equal", [self.operand(v) for v in values])])

    def _p_is_finite(self, eqn: Any, values: list[Any]) -> str:
        x = self.operand(values[0])
        bad = self.node("Or", [self.node("IsNaN", [x]), self.node("IsInf", [x])])
        return self.node("Not", [bad])

    def _p_square(self, eqn: Any, values: list[Any]) -> str:
        x = self.operand(values[0])
        return self.node("Mul", [x, x])

    def _p_rsqrt(self, eqn: Any, values: list[Any]) -> str:
        return self.node("Reciprocal", [self.node("Sqrt", [self.operand(values[0])])])

    def _p_log1p(self, eqn: Any, values: list[Any]) -> str:
        one = self.constant(np.asarray(1, eqn.outvars[0].aval.dtype))
        return self.node("Log", [self.node("Add", [one, self.operand(values[0])])])

    def _p_expm1(self, eqn: Any, values: list[Any]) -> str:
        one = self.constant(np.asarray(1, eqn.outvars[0].aval.dtype))
        return self.node("Sub", [self.node("Exp", [self.operand(values[0])]), one])

    def _p_integer_pow(self, eqn: Any, values: list[Any]) -> str:
        x, power = self.operand(values[0]), int(eqn.params["y"])
        if power == 0:
            one = self.constant(np.ones((), eqn.outvars[0].aval.dtype))
            return self.node("Expand", [one, self.shape_tensor(eqn.outvars[0].aval.shape, "pow")])
        result = x
        for _ in range(abs(power) - 1):
            result = self.node("Mul", [result, x])
        return self.node("Reciprocal", [result]) if power < 0 else result

    def _p_clamp(self, eqn: Any, values: list[Any]) -> str:
        low, x, high = (self.operand(v) for v in values)
        return self.node("Min", [self.node("Max", [x, low]), high])

    def _p_convert_element_type(self, eqn: Any, values: list[Any]) -> str:
        dtype = eqn.params["new_dtype"]
        if np.dtype(dtype) == np.dtype(eqn.invars[0].aval.dtype):
            return self.node("Identity", [self.operand(values[0])])
        return self.node(
            "Cast", [self.operand(values[0])], to=_onnx_dtype(dtype, "convert_element_type")
        )

    def _p_broadcast_in_dim(self, eqn: Any, values: list[Any]) -> str:
        shape = tuple(eqn.params["shape"])
        dims = tuple(int(d) for d in eqn.params["broadcast_dimensions"])
        if list(dims) != sorted(dims):
            raise OnnxExportError(f"broadcast_in_dim: the dimensions {dims} reorder axes")
        x = self.operand(values[0])
        operand_shape = eqn.invars[0].aval.shape
        missing = [axis for axis in range(len(shape)) if axis not in dims]
        if missing:
            x = self.node("Unsqueeze", [x, self.constant(np.asarray(missing, np.int64))])
        unsqueezed = [1] * len(shape)
        for i, axis in enumerate(dims):
            unsqueezed[axis] = operand_shape[i]
        if all(_same_dim(a, b) for a, b in zip(unsqueezed, shape, strict=True)):
            return x if missing else self.node("Identity", [x])
        return self.node("Expand", [x, self.shape_tensor(shape, "broadcast_in_dim")])

    def _p_reshape(self, eqn: Any, values: list[Any]) -> str:
        if eqn.params.get("dimensions") not in (None, ()):
            raise OnnxExportError("reshape: reshapes that transpose have no lowering here")
        shape = self.shape_tensor(tuple(eqn.params["new_sizes"]), "reshape")
        return self.node("Reshape", [self.operand(values[0]), shape])

    def _p_squeeze(self, eqn: Any, values: list[Any]) -> str:
        axes = self.constant(np.asarray(eqn.params["dimensions"], np.int64))
        return self.node("Squeeze", [self.operand(values[0]), axes])

    def _p_expand_dims(self, eqn: Any, values: list[Any]) -> str:
        axes = self.constant(np.asarray(eqn.params["dimensions"], np.int64))
        return self.node("Unsqueeze", [self.operand(values[0]), axes])

    def _p_slice(self, eqn: Any, values: list[Any]) -> str:
        shape = eqn.invars[0].aval.shape
        starts, ends, axes = [], [], []
        strides = eqn.params["strides"] or (1,) * len(shape)
        for axis, (start, limit, size) in enumerate(
            zip(eqn.params["start_indices"], eqn.params["limit_indices"], shape, strict=True)
        ):
            if _is_symbolic(start) or (_is_symbolic(limit) and limit != size):
                raise OnnxExportError(f"slice: a slice of the batch axis ({start}:{limit})")
            if start == 0 and (limit is size or limit == size) and strides[axis] == 1:
                continue
            starts.append(int(start))
            ends.append(_INT64_MAX if _is_symbolic(limit) else int(limit))
            axes.append(axis)
        if not axes:
            return self.node("Identity", [self.operand(values[0])])
        steps = [int(strides[axis]) for axis in axes]
        arrays = (np.asarray(a, np.int64) for a in (starts, ends, axes, steps))
        return self.node("Slice", [self.operand(values[0]), *map(self.constant, arrays)])

    def _p_concatenate(self, eqn: Any, values: list[Any]) -> str:
        return self.node(
            "Concat", [self.operand(v) for v in values], axis=int(eqn.params["dimension"])
        )

    def _p_stack(self, eqn: Any, values: list[Any]) -> str:
        axis = int(eqn.params["axis"])
        axes = self.constant(np.asarray([axis], np.int64))
        parts = [self.node("Unsqueeze", [self.operand(v), axes]) for v in values]
        return self.node("Concat", parts, axis=axis)

    def _p_transpose(self, eqn: Any, values: list[Any]) -> str:
        perm = [int(p) for p in eqn.params["permutation"]]
        return self.node("Transpose", [self.operand(values[0])], perm=perm)

    def _p_dot_general(self, eqn: Any, values: list[Any]) -> str:
        (lhs_contract, rhs_contract), (lhs_batch, rhs_batch) = eqn.params["dimension_numbers"]
        lhs_aval, rhs_aval = eqn.invars[0].aval, eqn.invars[1].aval
        lhs, rhs = values
        out_dtype = eqn.outvars[0].aval.dtype
        if (
            not lhs_batch
            and tuple(lhs_contract) == (lhs_aval.ndim - 1,)
            and rhs_aval.ndim == 2
            and tuple(rhs_contract) in ((0,), (1,))
        ):
            # [..., k] by [k, n] (or [n, k]): MatMul.
            if tuple(rhs_contract) == (1,):
                rhs = (
                    np.asarray(rhs).T
                    if not isinstance(rhs, _Value)
                    else _Value(self.node("Transpose", [rhs.name], perm=[1, 0]), rhs.aval)
                )
            out = self.node("MatMul", [self.operand(lhs), self.operand(rhs)])
        else:
            letters = iter(string.ascii_letters)
            lhs_labels = [next(letters) for _ in range(lhs_aval.ndim)]
            rhs_labels = [next(letters) for _ in range(rhs_aval.ndim)]
            for i, j in zip(lhs_contract, rhs_contract, strict=True):
                rhs_labels[j] = lhs_labels[i]
            for i, j in zip(lhs_batch, rhs_batch, strict=True):
                rhs_labels[j] = lhs_labels[i]
            out_labels = [lhs_labels[i] for i in lhs_batch]
            out_labels += [
                lhs_labels[i]
                for i in range(lhs_aval.ndim)
                if i not in lhs_contract and i not in lhs_batch
            ]
            out_labels += [
                rhs_labels[j]
                for j in range(rhs_aval.ndim)
                if j not in rhs_contract and j not in rhs_batch
            ]
            equation = f"{''.join(lhs_labels)},{''.join(rhs_labels)}->{''.join(out_labels)}"
            out = self.node("Einsum", [self.operand(lhs), self.operand(rhs)], equation=equation)
        if np.dtype(out_dtype) != np.dtype(lhs_aval.dtype):
            out = self.node("Cast", [out], to=_onnx_dtype(out_dtype, "dot_general"))
        return out

    def _p_gather(self, eqn: Any, values: list[Any]) -> str:
        """``x[..., i]`` with constant indices (what indexing with a symbolic batch size
        traces to) as ONNX ``Gather``; gathers at run-time indices have no lowering."""
        numbers = eqn.params["dimension_numbers"]
        operand, indices = values
        shape = eqn.invars[0].aval.shape
        axes = tuple(numbers.start_index_map)
        kept = [axis for axis in range(len(shape)) if axis not in axes]
        static = (
            not isinstance(indices, _Value)
            and np.shape(indices) == (len(axes),)
            and tuple(numbers.collapsed_slice_dims) == tuple(sorted(axes))
            and not numbers.operand_batching_dims
            and tuple(numbers.offset_dims) == tuple(range(len(kept)))
            and all(eqn.params["slice_sizes"][axis] == 1 for axis in axes)
            and all(_same_dim(eqn.params["slice_sizes"][a], shape[a]) for a in kept)
        )
        if not static:
            raise OnnxExportError(
                f"gather: only constant indices of single elements have an ONNX lowering here "
                f"(at {_where(eqn)})"
            )
        x = self.operand(operand)
        positions = dict(zip(axes, np.asarray(indices).tolist(), strict=True))
        for axis in sorted(axes, reverse=True):
            index = int(positions[axis])
            if not 0 <= index < shape[axis]:
                raise OnnxExportError(f"gather: index {index} is outside axis {axis} of {shape}")
            x = self.node("Gather", [x, self.constant(np.asarray(index, np.int64))], axis=axis)
        return x

    def _reduce(self, op: str, eqn: Any, values: list[Any]) -> str:
        x = self.operand(values[0])
        if not eqn.params["axes"]:  # over no axis: the operand (ONNX would reduce all)
            return self.node("Identity", [x])
        axes = self.constant(np.asarray(eqn.params["axes"], np.int64))
        boolean = eqn.invars[0].aval.dtype == np.bool_
        if boolean:
            x = self.node("Cast", [x], to=TensorProto.INT32)
        out = self.node(op, [x, axes], keepdims=0)
        return self.node("Cast", [out], to=TensorProto.BOOL) if boolean else out

    def _p_reduce_sum(self, eqn: Any, values: list[Any]) -> str:
        return self._reduce("ReduceSum", eqn, values)

    def _p_reduce_max(self, eqn: Any, values: list[Any]) -> str:
        return self._reduce("ReduceMax", eqn, values)

    def _p_reduce_min(self, eqn: Any, values: list[Any]) -> str:
        return self._reduce("ReduceMin", eqn, values)

    def _p_reduce_and(self, eqn: Any, values: list[Any]) -> str:
        return self._reduce("ReduceMin", eqn, values)

    def _p_reduce_or(self, eqn: Any, values: list[Any]) -> str:
        return self._reduce("ReduceMax", eqn, values)

    def _arg(self, op: str, eqn: Any, values: list[Any]) -> str:
        (axis,) = eqn.params["axes"]
        out = self.node(op, [self.operand(values[0])], axis=int(axis), keepdims=0)
        return self.node("Cast", [out], to=_onnx_dtype(eqn.params["index_dtype"], op))

    def _p_argmax(self, eqn: Any, values: list[Any]) -> str:
        return self._arg("ArgMax", eqn, values)

    def _p_argmin(self, eqn: Any, values: list[Any]) -> str:
        return self._arg("ArgMin", eqn, values)


def _where(eqn: Any) -> str:
    """Where an equation comes from in the user's code (file:line), if JAX knows."""
    try:
        from jax._src import source_info_util

        frame = source_info_util.user_frame(eqn.source_info.traceback)
    except Exception:
        frame = None
    if frame is None:
        return "an unknown place"
    return f"{frame.file_name}:{frame.start_line}"
