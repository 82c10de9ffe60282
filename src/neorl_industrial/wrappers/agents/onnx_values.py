"""The ONNX graph's tensors and types, shared by the lowering (:mod:`.onnx_graph`) and
its primitives (:mod:`.onnx_primitives`): the opset, the batch axis's name, the dtypes
with an ONNX form, and the error for what has none."""

from __future__ import annotations

from typing import Any

import numpy as np

from neorl_industrial.extras import optional_imports
from neorl_industrial.wrappers.agents.artifact import PolicyArtifactError

with optional_imports():
    import onnx
    from onnx import TensorProto, helper

__all__ = ["BATCH", "OPSET", "OnnxExportError"]

#: The ONNX opset the graphs are written for (ONNX Runtime 1.14 or later runs it).
OPSET = 18
#: The name of the symbolic batch axis of every input and output.
BATCH = "batch"


_DTYPES = {
    np.dtype(np.float32): TensorProto.FLOAT,
    np.dtype(np.float64): TensorProto.DOUBLE,
    np.dtype(np.float16): TensorProto.FLOAT16,
    np.dtype(np.int8): TensorProto.INT8,
    np.dtype(np.int16): TensorProto.INT16,
    np.dtype(np.int32): TensorProto.INT32,
    np.dtype(np.int64): TensorProto.INT64,
    np.dtype(np.uint8): TensorProto.UINT8,
    np.dtype(np.uint32): TensorProto.UINT32,
    np.dtype(np.bool_): TensorProto.BOOL,
}


class OnnxExportError(PolicyArtifactError):
    """A function that cannot be written as an ONNX graph; the message names the
    primitive (or shape) that has no ONNX form and where it comes from."""


class _Value:
    """A tensor of the graph: its name and its JAX type (shape may hold the batch)."""

    __slots__ = ("aval", "name")

    def __init__(self, name: str, aval: Any):
        self.name = name
        self.aval = aval


def _value_info(name: str, dtype: Any, shape: tuple, batch: Any) -> onnx.ValueInfoProto:
    dims = [BATCH if _is_symbolic(d) else int(d) for d in shape]
    return helper.make_tensor_value_info(name, _onnx_dtype(dtype, name), dims)


def _is_symbolic(dim: Any) -> bool:
    return not isinstance(dim, int | np.integer)


def _onnx_dtype(dtype: Any, where: str) -> int:
    try:
        return _DTYPES[np.dtype(dtype)]
    except (KeyError, TypeError):
        raise OnnxExportError(f"{where}: the dtype {dtype} has no ONNX form here") from None


def _same_dim(a: Any, b: Any) -> bool:
    if _is_symbolic(a) != _is_symbolic(b):
        return False
    return bool(a == b)
