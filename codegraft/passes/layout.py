"""Rewrite a partition into channels-last (NHWC) layout, with transposes only at its edges.

NOTE: the naive rewrite wraps every Conv in a Transpose pair and then cancels the pairs that
meet.  We get the same result in one forward walk instead: every value remembers the layout
(a *perm*, see :mod:`codegraft.passes._layout_rules`) it is stored in, each node's rule says
which layout it wants its inputs in, and a Transpose is made only where a value is stored
one way and wanted another.  Transposes made from the same value to the same layout are
shared, constants are re-laid-out instead of transposed at run time, and the model's own
Transposes compose with the stored perm for free.  What is left are the conversions at the
partition's edges: its inputs, its outputs and ops that have no channels-last form.

The layout-sensitive ops move to the ``codegraft.nhwc`` domain (see ``NHWC.md`` next to
this file); onnxruntime cannot run them, only a backend that declared NHWC.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir
from onnx_ir.passes.common import ShapeInferencePass

from codegraft.passes._graph_util import FreshNames, drop_unused_constants, subgraphs
from codegraft.passes._layout_rules import (
    NHWC_DOMAIN,
    ArrivingInput,
    NodePlan,
    Perm,
    all_identity,
    channels_last,
    identity,
    is_identity,
    permute_shape,
    rule_for,
    same_memory_order,
    unpermute_shape,
)

__all__ = ["NHWC_DOMAIN", "Conversion", "LayoutResult", "to_nhwc"]


@dataclass(frozen=True)
class Conversion:
    """One conversion that remains in the rewritten model, and why it is there."""

    value: str  # the model's value that is converted
    op: str  # "Transpose", or "Reshape" when only unit axes move
    reason: str  # e.g. "LRN 'norm1' reads it NCHW", "graph output 'y' stays NCHW"


@dataclass(frozen=True)
class LayoutResult:
    """The rewritten model and what the rewrite did, for the compile report.

    Attributes:
        model: the model, rewritten in place.
        converted_ops: nodes moved into the ``codegraft.nhwc`` domain.
        transposes_inserted: Transpose nodes added; these are the edge conversions that remain.
        reshapes_inserted: edge conversions that only move unit axes, done by a Reshape
            (no data movement), e.g. a ``[1, 1, 1, C]`` result returned as ``[1, C, 1, 1]``.
        transposes_cancelled: places where a value stayed channels-last between two nodes, so
            the transpose pair a per-op rewrite would have put there cancelled (model
            Transposes that composed away are counted too).
        constants_folded: constants (weights, broadcast operands) stored re-laid-out instead.
        conversions: every Transpose or Reshape added, with the reason it is needed.
    """

    model: ir.Model = field(repr=False)
    converted_ops: int
    transposes_inserted: int
    reshapes_inserted: int
    transposes_cancelled: int
    constants_folded: int
    conversions: tuple[Conversion, ...] = ()


def to_nhwc(model: ir.Model) -> LayoutResult:
    """Rewrite ``model`` (in place) so its layout-sensitive ops run channels-last.

    Graph inputs and outputs keep their names, shapes and NCHW layout; inside, Conv, the
    pools, BatchNormalization and Resize become ``codegraft.nhwc`` ops, Conv weights are
    stored OHWI, elementwise ops and ops with an axis follow along, and Transposes remain
    only where the channels-last region meets something else.
    """
    _ensure_shapes(model)
    opset = model.opset_imports.get("", model.opset_imports.get("ai.onnx", 1))
    rewriter = _Rewriter(model.graph, opset)
    for node in list(model.graph):
        rewriter.visit(node)
    rewriter.restore_outputs()
    rewriter.drop_leftovers()
    if rewriter.converted:
        model.opset_imports[NHWC_DOMAIN] = opset
    return LayoutResult(
        model=model,
        converted_ops=rewriter.converted,
        transposes_inserted=rewriter.inserted,
        reshapes_inserted=rewriter.reshaped,
        transposes_cancelled=rewriter.cancelled,
        constants_folded=rewriter.folded,
        conversions=tuple(rewriter.conversions),
    )


def _ensure_shapes(model: ir.Model) -> None:
    """Run shape inference when a layout-sensitive op's input has no known rank."""
    for node in model.graph:
        data = node.inputs[0] if node.inputs else None
        if data is not None and data.shape is None and rule_for(node) is not None:
            ShapeInferencePass(strict_mode=False)(model)
            return


def _describe(perm: Perm) -> str:
    if is_identity(perm):
        return "NCHW"
    if perm == channels_last(len(perm)):
        return "NHWC"
    return f"in perm {list(perm)}"


def _constant(value: ir.Value) -> ir.TensorProtocol | None:
    """The value's tensor when it is a constant the caller cannot override."""
    if value.is_graph_input():
        return None
    return ir.convenience.get_const_tensor(value)


class _Rewriter:
    """State of one :func:`to_nhwc` walk (created per call, never shared)."""

    def __init__(self, graph: ir.Graph, opset: int) -> None:
        self.graph = graph
        self.opset = opset
        # logical value -> (the value that holds its data, the perm it is stored in)
        self.stored: dict[ir.Value, tuple[ir.Value, Perm]] = {}
        # (logical value, perm) -> a value holding it in that perm (shared Transposes)
        self.forms: dict[tuple[ir.Value, Perm], ir.Value] = {}
        self.replaced_constants: set[ir.Value] = set()
        self.absorbed: list[ir.Node] = []
        self.conversions: list[Conversion] = []
        self._fresh = FreshNames(self.graph)
        self.converted = self.inserted = self.reshaped = self.cancelled = self.folded = 0

    # --- what a value looks like now -----------------------------------------------------

    def perm_of(self, value: ir.Value) -> Perm | None:
        if value in self.stored:
            return self.stored[value][1]
        return None if value.shape is None else identity(len(value.shape))

    def arriving(self, value: ir.Value | None) -> ArrivingInput:
        """What a rule needs to know of an input: its stored perm and logical shape."""
        if value is None:
            return ArrivingInput(None, None, False)
        perm = self.perm_of(value)
        holder = self.holder_of(value)
        shape = value.shape if value not in self.stored or perm is None else unpermute_shape(holder.shape, perm)
        return ArrivingInput(value, perm, _constant(value) is not None, shape)

    def holder_of(self, value: ir.Value) -> ir.Value:
        return self.stored.get(value, (value, ()))[0]

    # --- the walk ------------------------------------------------------------------------

    def visit(self, node: ir.Node) -> None:
        if node.domain == "" and node.op_type == "Transpose" and self._absorb(node):
            return
        for sub in subgraphs(node):
            self._restore_captured(node, sub)
        arriving = [self.arriving(v) for v in node.inputs]
        rule = rule_for(node)
        plan = rule(node, arriving, self.opset) if rule is not None else None
        self._apply(node, plan or all_identity(node, arriving))

    def _apply(self, node: ir.Node, plan: NodePlan) -> None:
        for i, (value, wanted) in enumerate(zip(node.inputs, plan.input_perms, strict=True)):
            if value is None:
                continue
            if i in plan.new_constants:
                self.replaced_constants.add(value)
                node.replace_input_with(i, self._initializer(plan.new_constants[i], f"{node.name or 'node'}_in{i}"))
                continue
            if wanted is None:
                new = self.holder_of(value)
            else:
                why = f"{node.op_type} {node.name!r} reads it {_describe(wanted)}"
                new = self.resolve(value, wanted, before=node, why=why)
            if new is not value:
                node.replace_input_with(i, new)
        for name, attr in plan.attributes.items():
            node.attributes[name] = attr
        if plan.domain is not None:
            node.domain = plan.domain
            self.converted += 1
        for out, perm in zip(node.outputs, plan.output_perms, strict=True):
            if perm is not None and not is_identity(perm):
                self.stored[out] = (out, perm)
                out.shape = permute_shape(out.shape, perm)

    def _absorb(self, node: ir.Node) -> bool:
        """Fold a model Transpose into the perm its input is stored in (no node remains).

        Also when the input is in the model's layout: a model that transposes its NHWC input
        to NCHW for a Conv then needs no transpose at all.  Where a consumer does want the
        transposed tensor, :meth:`resolve` makes the Transpose again, once.
        """
        source = node.inputs[0]
        perm = None if source is None else self.perm_of(source)
        if source is None or perm is None:
            return False
        listed = node.attributes.get_ints("perm")
        t = tuple(reversed(range(len(perm)))) if listed is None else tuple(int(a) for a in listed)
        inverse_t = tuple(int(a) for a in np.argsort(t))
        # stored axis j holds source axis perm[j], which is output axis inverse_t[perm[j]]
        composed = tuple(inverse_t[axis] for axis in perm)
        self.stored[node.outputs[0]] = (self.holder_of(source), composed)
        self.absorbed.append(node)
        if not is_identity(perm):
            self.cancelled += 1
        return True

    def resolve(self, value: ir.Value, wanted: Perm, *, before: ir.Node | None, why: str) -> ir.Value:
        """A value holding ``value``'s data stored in ``wanted`` (made once, then shared)."""
        holder, current = self.stored.get(value, (value, identity(len(wanted))))
        if current == wanted:
            if not is_identity(wanted) and _constant(value) is None:
                self.cancelled += 1
            return holder
        key = (value, wanted)
        if key in self.forms:
            return self.forms[key]
        tensor = _constant(value)
        if tensor is not None and value not in self.stored:
            array = tensor.numpy()
            array = array.reshape((1,) * (len(wanted) - array.ndim) + array.shape)
            new = self._initializer(np.ascontiguousarray(np.transpose(array, wanted)), f"{value.name}_nhwc")
            self.replaced_constants.add(value)
            self.folded += 1
        else:
            new = self._transpose(holder, tuple(current.index(axis) for axis in wanted), before)
            op = new.producer()
            self.conversions.append(Conversion(value.name or "", op.op_type if op else "", why))
        self.forms[key] = new
        return new

    def _initializer(self, array: np.ndarray, base: str) -> ir.Value:
        name = self._fresh(base)
        value = ir.Value(
            name=name,
            shape=ir.Shape(array.shape),
            type=ir.TensorType(ir.DataType.from_numpy(array.dtype)),
            const_value=ir.tensor(array, name=name),
        )
        self.graph.register_initializer(value)
        return value

    def _transpose(self, source: ir.Value, perm: Perm, before: ir.Node | None) -> ir.Value:
        """A Transpose, or a Reshape when only unit axes move (``[1,1,1,C]`` <-> ``[1,C,1,1]``)."""
        shape = permute_shape(source.shape, perm)
        if shape is not None and shape.is_static() and same_memory_order(source.shape, perm):
            target = self._initializer(np.asarray(shape.numpy(), dtype=np.int64), f"{source.name}_shape")
            node = ir.Node("", "Reshape", [source, target])
            self.reshaped += 1
        else:
            node = ir.Node("", "Transpose", [source], [ir.AttrInt64s("perm", list(perm))])
            self.inserted += 1
        out = node.outputs[0]
        out.name = self._fresh(f"{source.name}_T{''.join(map(str, perm))}")
        out.type = source.type
        out.shape = shape
        if before is None:
            self.graph.append(node)
        else:
            self.graph.insert_before(before, node)
        return out

    def _restore_captured(self, node: ir.Node, subgraph: ir.Graph) -> None:
        """Values a subgraph reads from this graph must be in the model's layout."""
        for inner in ir.traversal.RecursiveGraphIterator(subgraph):
            for i, value in enumerate(inner.inputs):
                if value is None or value.graph is not self.graph or value not in self.stored:
                    continue
                perm = self.stored[value][1]
                why = f"{node.op_type} {node.name!r} reads it NCHW in a body"
                inner.replace_input_with(i, self.resolve(value, identity(len(perm)), before=node, why=why))

    # --- finishing -----------------------------------------------------------------------

    def restore_outputs(self) -> None:
        """Graph outputs keep their names and the model's layout."""
        for index, output in enumerate(list(self.graph.outputs)):
            if output not in self.stored:
                continue
            perm = self.stored[output][1]
            why = f"graph output {output.name!r} stays NCHW"
            logical = self.resolve(output, identity(len(perm)), before=None, why=why)
            if logical is output:
                continue
            name = output.name
            assert name is not None
            output.name = self._fresh(f"{name}_stored")
            if logical.is_graph_input() or logical.is_initializer() or logical.is_graph_output():
                copy = ir.Node("", "Identity", [logical])
                copy.outputs[0].type, copy.outputs[0].shape = logical.type, logical.shape
                self.graph.append(copy)
                logical = copy.outputs[0]
            logical.name = name
            self.graph.outputs[index] = logical

    def drop_leftovers(self) -> None:
        """Remove absorbed Transposes and constants nobody reads any more."""
        for node in reversed(self.absorbed):
            self.graph.remove(node, safe=True)
        drop_unused_constants(self.graph, self.replaced_constants)
