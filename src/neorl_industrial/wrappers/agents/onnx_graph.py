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
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax.extend import core as jax_core

from neorl_industrial.extras import optional_imports
from neorl_industrial.wrappers.agents.onnx_folding import fold
from neorl_industrial.wrappers.agents.onnx_primitives import PrimitiveNodes
from neorl_industrial.wrappers.agents.onnx_values import (
    BATCH,
    OPSET,
    OnnxExportError,
    _is_symbolic,
    _onnx_dtype,
    _Value,
    _value_info,
)

with optional_imports():
    import onnx
    from onnx import TensorProto, helper, numpy_helper

__all__ = ["BATCH", "OPSET", "OnnxExportError", "lower_to_onnx"]

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


class _Lowering(PrimitiveNodes):
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
                results = fold(eqn, values)
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


def _concrete(outvars: Sequence[Any]) -> bool:
    return all(not any(_is_symbolic(d) for d in var.aval.shape) for var in outvars)
