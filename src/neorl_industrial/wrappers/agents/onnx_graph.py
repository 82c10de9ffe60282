"""JAX to ONNX: the exported policy's serving function as one ONNX graph.

:func:`lower_to_onnx` traces a JAX function (the policy, its observation normalizer, its
action scaling and the shield, as :mod:`.export` builds it) to a jaxpr with a symbolic
batch size and writes each primitive of it as ONNX operators with the ``onnx`` helper
API. Nothing is re-implemented: the graph is the very computation that ``jax.export``
serializes, primitive for primitive, so the shield's constraint tables, the normalizer's
statistics and the network's weights are the jaxpr's constants. Whatever depends on
constants alone (the shield's per-constraint reciprocals, its static boxes) is evaluated
at export time with JAX itself, so the graph holds only the per-row work.

Why not a converter package: jax2onnx (0.17) patches flax's ``Dense`` and ``jnp.zeros``
at trace time, which breaks ``vmap`` over the policy and the shield's batch-shaped status
computation, and it pins ``orbax-checkpoint < 0.11.37`` (older than the project's) and
pulls in hub clients and a model viewer; tf2onnx needs TensorFlow. Lowering the jaxpr
needs only ``onnx``, and a primitive without an ONNX form is a named
:class:`OnnxExportError`.

Conventions of the graph: opset :data:`OPSET`, float32 in and out, the batch axis a
``dim_param`` named ``batch`` (any batch size, one graph), subnormal inputs read as zero
(as every host reads them). ``lax.cond`` is written as both branches and a ``Where`` on
its predicate (the same results for pure branches; the served graph is the shield's
row-wise form, which has none).
"""

from __future__ import annotations

import hashlib
import string
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jax_core

from neorl_industrial.extras import optional_imports
from neorl_industrial.wrappers.agents.artifact import PolicyArtifactError

with optional_imports():
    import onnx
    from onnx import TensorProto, helper, numpy_helper

__all__ = ["BATCH", "OPSET", "OnnxExportError", "lower_to_onnx"]

#: The ONNX opset the graphs are written for (ONNX Runtime 1.14 or later runs it).
OPSET = 18
#: The name of the symbolic batch axis of every input and output.
BATCH = "batch"

_INT64_MAX = np.iinfo(np.int64).max

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
# Primitives whose parameter holds a jaxpr called with the equation's operands.
_CALLS = {
    "jit": "jaxpr",
    "pjit": "jaxpr",
    "closed_call": "call_jaxpr",
    "core_call": "call_jaxpr",
    "remat": "jaxpr",
    "checkpoint": "jaxpr",
    "custom_jvp_call": "call_jaxpr",
    "custom_vjp_call": "call_jaxpr",
    "custom_vjp_call_jaxpr": "fun_jaxpr",
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


def lower_to_onnx(
    function: Callable[..., Any],
    inputs: Sequence[tuple[str, tuple[int, ...], Any]],
    outputs: Sequence[str],
    *,
    doc: str = "",
    metadata: dict[str, str] | None = None,
    trace_min_batch: int = 1,
) -> onnx.ModelProto:
    """The ONNX model of ``function`` for any batch size.

    Args:
        function: a pure JAX function of arrays ``[batch, *shape]``, one per input,
            returning a tuple of arrays whose leading axis is the batch.
        inputs: ``(name, shape without the batch, dtype)`` of each argument.
        outputs: the names of the results, in order.
        doc: the graph's description.
        metadata: ``metadata_props`` of the model (strings).
        trace_min_batch: the batch size the function is traced as being at least (a
            function that branches on it, as the shield does from ``BRANCH_MIN_BATCH``
            rows on, takes that side); the graph serves every batch size all the same.

    Returns:
        A checked ``onnx.ModelProto`` at opset :data:`OPSET`.

    Raises:
        OnnxExportError: naming the primitive or shape with no ONNX form.
    """
    constraints = (f"{BATCH} >= {trace_min_batch}",) if trace_min_batch > 1 else ()
    (batch,) = jax.export.symbolic_shape(BATCH, constraints=constraints)
    specs = [jax.ShapeDtypeStruct((batch, *shape), np.dtype(dtype)) for _, shape, dtype in inputs]
    try:
        closed = jax.make_jaxpr(function)(*specs)
    except Exception as error:
        raise OnnxExportError(
            f"cannot trace the policy for a symbolic batch size: {type(error).__name__}: {error}"
        ) from error
    lowering = _Lowering(batch)
    graph_inputs = []
    lowering.batch_source = inputs[0][0]
    for (name, _, _), spec, var in zip(inputs, specs, closed.jaxpr.invars, strict=True):
        lowering.env[var] = _Value(_flushed(lowering, name, spec.dtype), var.aval)
        graph_inputs.append(_value_info(name, spec.dtype, spec.shape, batch))
    lowering.batch_size()  # in the main graph, where every branch can read it
    for var, const in zip(closed.jaxpr.constvars, closed.consts, strict=True):
        lowering.env[var] = np.asarray(const)
    lowering.run(closed.jaxpr.eqns)
    results = [lowering.read(var) for var in closed.jaxpr.outvars]
    if len(results) != len(outputs):
        raise OnnxExportError(f"the function returns {len(results)} arrays, not {len(outputs)}")
    graph_outputs = []
    for name, result, var in zip(outputs, results, closed.jaxpr.outvars, strict=True):
        lowering.node("Identity", [lowering.operand(result)], [name])
        graph_outputs.append(_value_info(name, var.aval.dtype, var.aval.shape, batch))
    nodes = _live(lowering.nodes, [output.name for output in graph_outputs])
    used = set().union(*(_reads(node) for node in nodes))
    initializers = [tensor for tensor in lowering.initializers if tensor.name in used]
    graph = helper.make_graph(
        nodes, "policy", graph_inputs, graph_outputs, initializers, doc_string=doc
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="neorl_industrial",
        doc_string=doc,
    )
    # The IR version of the opset, not the newest the onnx package knows: older runtimes
    # read it.
    model.ir_version = min(onnx.IR_VERSION, 8)
    for key, value in (metadata or {}).items():
        model.metadata_props.add(key=key, value=value)
    try:
        onnx.checker.check_model(model, full_check=True)
    except Exception as error:
        raise OnnxExportError(f"the ONNX graph does not check: {error}") from error
    return model


def _flushed(lowering: _Lowering, name: str, dtype: Any) -> str:
    """The input ``name`` with its subnormal elements read as zero (a floating input).

    XLA on CPU flushes subnormals to zero in some fused operations and not in others, and
    ONNX Runtime never does; the hosts read a subnormal reading as zero before anything
    checks it (:mod:`neorl_industrial.wrappers.agents.readings`), and so does the graph,
    so ``-1.4e-45`` on a bound of 0 is a valid reading of 0 on every runtime. NaN and
    infinity pass unchanged (the shield judges them)."""
    dtype = np.dtype(dtype)
    if not np.issubdtype(dtype, np.floating):
        return name
    tiny = lowering.constant(np.asarray(np.finfo(dtype).tiny, dtype))
    small = lowering.node("Less", [lowering.node("Abs", [name]), tiny])
    return lowering.node("Where", [small, lowering.constant(np.zeros((), dtype)), name])


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


def _live(nodes: list[onnx.NodeProto], outputs: list[str]) -> list[onnx.NodeProto]:
    """The nodes that some output depends on, in order."""
    needed = set(outputs)
    kept = []
    for node in reversed(nodes):
        if any(name in needed for name in node.output):
            kept.append(node)
            needed.update(_reads(node))
    return kept[::-1]


def _reads(node: onnx.NodeProto) -> set[str]:
    """The names a node reads: its inputs and what its subgraphs take from outside."""
    names = set(node.input)
    for attribute in node.attribute:
        if attribute.type == onnx.AttributeProto.GRAPH:
            graph = attribute.g
            inner = set().union(*(_reads(n) for n in graph.node)) if graph.node else set()
            made = {name for n in graph.node for name in n.output}
            names |= inner - made
    return names


class _Lowering:
    """Walks a jaxpr, folding what depends on constants and writing the rest as nodes."""

    def __init__(self, batch: Any):
        self.batch = batch
        self.batch_source = ""
        self.env: dict[Any, Any] = {}
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._constants: dict[tuple, str] = {}
        self._counter = 0
        self._batch_tensor: str | None = None

    # ----- values ----------------------------------------------------------------------
    def fresh(self) -> str:
        self._counter += 1
        return f"t{self._counter}"

    def read(self, atom: Any) -> Any:
        """A ``_Value`` or a numpy constant for a jaxpr variable or literal."""
        if isinstance(atom, jax_core.Literal):
            return np.asarray(atom.val, atom.aval.dtype)
        return self.env[atom]

    def constant(self, value: np.ndarray) -> str:
        """The name of an initializer holding ``value`` (one per distinct value)."""
        value = np.array(value, order="C")  # (ascontiguousarray makes a scalar 1-d)
        key = (value.dtype.str, value.shape, hashlib.sha256(value.tobytes()).hexdigest())
        name = self._constants.get(key)
        if name is None:
            name = f"c{len(self._constants)}"
            if value.dtype == np.bool_:
                tensor = helper.make_tensor(
                    name, TensorProto.BOOL, value.shape, value.reshape(-1).tolist()
                )
            else:
                _onnx_dtype(value.dtype, "a constant")
                tensor = numpy_helper.from_array(value, name)
            self.initializers.append(tensor)
            self._constants[key] = name
        return name

    def operand(self, value: Any) -> str:
        if isinstance(value, _Value):
            return value.name
        return self.constant(np.asarray(value))

    def node(self, op: str, inputs: list[str], outputs: list[str] | None = None, **attrs) -> str:
        outputs = outputs or [self.fresh()]
        self.nodes.append(helper.make_node(op, inputs, outputs, **attrs))
        return outputs[0]

    def shape_tensor(self, shape: tuple, where: str) -> str:
        """An int64 ``[rank]`` tensor of ``shape``, reading the batch size at run time."""
        if not any(_is_symbolic(d) for d in shape):
            return self.constant(np.asarray(shape, np.int64))
        parts = []
        for dim in shape:
            if not _is_symbolic(dim):
                parts.append(self.constant(np.asarray([dim], np.int64)))
            elif dim == self.batch:
                parts.append(self.batch_size())
            else:
                raise OnnxExportError(
                    f"{where}: the shape {shape} has the size {dim}, which is not the batch "
                    "size; only the batch axis may vary in the ONNX graph"
                )
        return self.node("Concat", parts, axis=0)

    def batch_size(self) -> str:
        if self._batch_tensor is None:
            self._batch_tensor = self.node("Shape", [self.batch_source], start=0, end=1)
        return self._batch_tensor

    # ----- the walk --------------------------------------------------------------------
    def run(self, eqns: Sequence[Any]) -> None:
        for eqn in eqns:
            name = eqn.primitive.name
            values = [self.read(atom) for atom in eqn.invars]
            if name in _CALLS:
                results = self.call(eqn, values)
            elif name == "cond":
                results = self.cond(eqn, values)
            elif name == "while":
                results = self.while_loop(eqn, values)
            elif not any(isinstance(v, _Value) for v in values) and _concrete(eqn.outvars):
                results = self.fold(eqn, values)
            else:
                results = self.emit(eqn, values)
            for var, result in zip(eqn.outvars, results, strict=True):
                if not isinstance(var, jax_core.DropVar):
                    self.env[var] = result

    def inline(self, closed: Any, values: list[Any]) -> list[Any]:
        jaxpr = closed.jaxpr if hasattr(closed, "jaxpr") else closed
        consts = getattr(closed, "consts", ())
        for var, const in zip(jaxpr.constvars, consts, strict=True):
            self.env[var] = np.asarray(const)
        for var, value in zip(jaxpr.invars, values, strict=True):
            self.env[var] = value
        self.run(jaxpr.eqns)
        return [self.read(var) for var in jaxpr.outvars]

    def call(self, eqn: Any, values: list[Any]) -> list[Any]:
        closed = eqn.params[_CALLS[eqn.primitive.name]]
        if callable(closed) and not hasattr(closed, "jaxpr") and not hasattr(closed, "eqns"):
            closed = closed()  # custom_vjp's fun_jaxpr may be a thunk
        return self.inline(closed, values)

    def cond(self, eqn: Any, values: list[Any]) -> list[Any]:
        index, operands = values[0], values[1:]
        branches = eqn.params["branches"]
        if not isinstance(index, _Value):
            return self.inline(branches[int(np.clip(index, 0, len(branches) - 1))], operands)
        if not index.aval.shape and len(branches) == 2:
            return self.branch(index, branches, operands, eqn.outvars)
        outcomes = [self.inline(branch, operands) for branch in branches]
        results = []
        for k, var in enumerate(eqn.outvars):
            cases = [outcome[k] for outcome in outcomes]
            results.append(self.select(index, cases, var.aval))
        return results

    def branch(
        self, index: _Value, branches: Sequence[Any], operands: list[Any], outvars: list[Any]
    ) -> list[Any]:
        """A two-way ``cond`` on a scalar as an ONNX ``If``: only the branch taken runs
        (the shield's repair, when no row of the batch needs it, costs nothing)."""
        graphs = []
        for number, closed in enumerate(branches):
            outer = self.nodes
            self.nodes = []
            try:
                results = self.inline(closed, operands)
                names = []
                for k, (result, var) in enumerate(zip(results, outvars, strict=True)):
                    name = f"{self.fresh()}_b{number}_{k}"
                    self.node("Identity", [self.operand(result)], [name])
                    names.append(_value_info(name, var.aval.dtype, var.aval.shape, self.batch))
                nodes = _live(self.nodes, [info.name for info in names])
            finally:
                self.nodes = outer
            graphs.append(helper.make_graph(nodes, f"branch{self._counter}", [], names))
        condition = self.node("Cast", [index.name], to=TensorProto.BOOL)
        outputs = [self.fresh() for _ in outvars]
        self.nodes.append(
            helper.make_node(
                "If", [condition], outputs, then_branch=graphs[1], else_branch=graphs[0]
            )
        )
        return [_Value(name, var.aval) for name, var in zip(outputs, outvars, strict=True)]

    def while_loop(self, eqn: Any, values: list[Any]) -> list[Any]:
        """``lax.while_loop`` as an ONNX ``Loop`` (the shield's exact projection, whose
        loop is capped by its own step count). A batched condition (what ``vmap`` makes
        of a loop whose rows finish apart) runs the loop while any row's holds and moves
        only those rows, as XLA runs it: each pass reads the rows' conditions on the
        carried values, applies the body where they hold, and goes on while any does."""
        cond_closed, body_closed = eqn.params["cond_jaxpr"], eqn.params["body_jaxpr"]
        n_cond, n_body = eqn.params["cond_nconsts"], eqn.params["body_nconsts"]
        cond_consts = values[:n_cond]
        body_consts = values[n_cond : n_cond + n_body]
        initial = values[n_cond + n_body :]
        avals = [var.aval for var in eqn.outvars]
        pred_aval = cond_closed.jaxpr.outvars[0].aval
        (first,) = self.inline(cond_closed, [*cond_consts, *initial])
        outer = self.nodes
        self.nodes = []
        try:
            step_name, cond_name = f"{self.fresh()}_step", f"{self.fresh()}_go"
            carried = [_Value(f"{self.fresh()}_carry{k}", aval) for k, aval in enumerate(avals)]
            if pred_aval.shape:
                (rows,) = self.inline(cond_closed, [*cond_consts, *carried])
            updated = self.inline(body_closed, [*body_consts, *carried])
            if pred_aval.shape:
                updated = [
                    self.rows_where(rows, pred_aval, new, old)
                    for new, old in zip(updated, carried, strict=True)
                ]
            (again,) = self.inline(cond_closed, [*cond_consts, *updated])
            go_out = f"{self.fresh()}_go_out"
            self.node("Identity", [self.any_of(again, pred_aval)], [go_out])
            outputs = [helper.make_tensor_value_info(go_out, TensorProto.BOOL, [])]
            for k, (result, aval) in enumerate(zip(updated, avals, strict=True)):
                name = f"{self.fresh()}_next{k}"
                self.node("Identity", [self.operand(result)], [name])
                outputs.append(_value_info(name, aval.dtype, aval.shape, self.batch))
            nodes = _live(self.nodes, [info.name for info in outputs])
        finally:
            self.nodes = outer
        inputs = [
            helper.make_tensor_value_info(step_name, TensorProto.INT64, []),
            helper.make_tensor_value_info(cond_name, TensorProto.BOOL, []),
            *(_value_info(v.name, v.aval.dtype, v.aval.shape, self.batch) for v in carried),
        ]
        body = helper.make_graph(nodes, f"loop{self._counter}", inputs, outputs)
        go = self.any_of(first, pred_aval)
        results = [self.fresh() for _ in avals]
        self.nodes.append(
            helper.make_node(
                "Loop", ["", go, *(self.operand(v) for v in initial)], results, body=body
            )
        )
        return [_Value(name, aval) for name, aval in zip(results, avals, strict=True)]

    def any_of(self, value: Any, aval: Any) -> str:
        """A boolean scalar: whether any element of ``value`` is true."""
        x = self.operand(value)
        if not aval.shape:
            return self.node("Cast", [x], to=TensorProto.BOOL)
        counted = self.node("Cast", [x], to=TensorProto.INT32)
        return self.node(
            "Cast", [self.node("ReduceMax", [counted], keepdims=0)], to=TensorProto.BOOL
        )

    def rows_where(self, rows: Any, rows_aval: Any, new: Any, old: Any) -> Any:
        """``new`` where the leading-axes mask ``rows`` holds, else ``old``."""
        aval = new.aval if isinstance(new, _Value) else old.aval
        condition = self.operand(rows)
        extra = len(aval.shape) - len(rows_aval.shape)
        if extra:
            axes = np.arange(len(rows_aval.shape), len(aval.shape), dtype=np.int64)
            condition = self.node("Unsqueeze", [condition, self.constant(axes)])
        return _Value(self.where(condition, new, old, aval), aval)

    def fold(self, eqn: Any, values: list[Any]) -> list[Any]:
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


def _same_dim(a: Any, b: Any) -> bool:
    if _is_symbolic(a) != _is_symbolic(b):
        return False
    return bool(a == b)


def _concrete(outvars: Sequence[Any]) -> bool:
    return all(not any(_is_symbolic(d) for d in var.aval.shape) for var in outvars)


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
