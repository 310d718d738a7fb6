"""Convert a partition to float16 or bfloat16, with Casts only where precisions meet.

NOTE: one forward walk, like the layout pass: every node decides whether it runs in the
lower precision (its op is not block-listed, its schema allows the type), every float32
value remembers the precision it is now stored in, and a Cast is made only where a value is
stored one way and wanted the other (made once per value and shared).  Constants are
converted instead of cast; graph inputs and outputs stay float32, so the partition's
signature does not change.  :mod:`codegraft.passes.precision_check` builds the self-check
on top of this.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

import onnx_ir as ir
from onnx_ir.passes.common import ShapeInferencePass

from codegraft.passes._graph_util import FreshNames, drop_unused_constants, name_nodes, subgraphs
from codegraft.passes._type_slots import Slots, low_precision_slots

__all__ = [
    "DEFAULT_BLOCKLIST",
    "ConversionResult",
    "KeptOp",
    "Precision",
    "convert_precision",
    "convert_precision_detailed",
]

Precision = Literal["float16", "bfloat16"]

# Ops that stay float32 unless the caller says otherwise: their results overflow or lose
# too much in 16 bits (exponentials, long sums and products, norms), or they compute
# indices and boxes where a rounding error changes which element is picked.
DEFAULT_BLOCKLIST: frozenset[str] = frozenset(
    {
        "CumSum", "Exp", "Log", "LogSoftmax", "NonMaxSuppression", "Pow", "Range", "ReduceL1",
        "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceProd", "ReduceSum",
        "ReduceSumSquare", "RoiAlign", "Softplus", "TopK",
    }
)  # fmt: skip

_DTYPES: Mapping[str, ir.DataType] = {
    "float16": ir.DataType.FLOAT16,
    "bfloat16": ir.DataType.BFLOAT16,
}


@dataclass(frozen=True)
class KeptOp:
    """A float op that stays float32, and why."""

    node: str
    op_type: str
    reason: str


@dataclass(frozen=True)
class ConversionResult:
    """The converted model (in place) and what the conversion did."""

    model: ir.Model = field(repr=False)
    precision: Precision
    converted_ops: int
    casts_inserted: int
    constants_converted: int
    kept_float32: tuple[KeptOp, ...]


def convert_precision(
    model: ir.Model,
    precision: Precision,
    *,
    keep_float32_ops: frozenset[str] = DEFAULT_BLOCKLIST,
) -> ir.Model:
    """Convert ``model`` in place to ``precision``; returns it.  See :func:`convert_precision_detailed`."""
    return convert_precision_detailed(model, precision, keep_float32_ops=keep_float32_ops).model


def convert_precision_detailed(
    model: ir.Model,
    precision: Precision,
    *,
    keep_float32_ops: frozenset[str] = DEFAULT_BLOCKLIST,
    keep_float32_nodes: Mapping[str, str] | None = None,
) -> ConversionResult:
    """Convert ``model`` in place so its float32 computation runs in ``precision``.

    Ops in ``keep_float32_ops`` and nodes named in ``keep_float32_nodes`` (name -> reason)
    stay float32 with Casts around them; graph inputs and outputs stay float32; float32
    constants are stored converted (a float32 copy is kept only if a float32 op reads it).
    """
    if precision not in _DTYPES:
        raise ValueError(f"precision must be one of {sorted(_DTYPES)}, got {precision!r}")
    name_nodes(model.graph)
    if any(v.dtype is None for node in model.graph for v in node.outputs):
        # the walk needs every value's type to know what is float32
        ShapeInferencePass(strict_mode=False)(model)
    opset = model.opset_imports.get("", model.opset_imports.get("ai.onnx", 1))
    converter = _Converter(model.graph, opset, _DTYPES[precision], keep_float32_ops, dict(keep_float32_nodes or {}))
    for node in list(model.graph):
        converter.visit(node)
    converter.restore_outputs()
    converter.drop_unused_constants()
    return ConversionResult(
        model=model,
        precision=precision,
        converted_ops=converter.converted,
        casts_inserted=converter.casts,
        constants_converted=converter.constants,
        kept_float32=tuple(converter.kept),
    )


class _Converter:
    """State of one conversion walk (created per call, never shared)."""

    def __init__(
        self,
        graph: ir.Graph,
        opset: int,
        low: ir.DataType,
        keep_ops: frozenset[str],
        keep_nodes: dict[str, str],
    ) -> None:
        self.graph, self.opset, self.low = graph, opset, low
        self.keep_ops, self.keep_nodes = keep_ops, keep_nodes
        self.lowered: set[ir.Value] = set()  # float32 values now stored in ``low``
        self.forms: dict[tuple[ir.Value, ir.DataType], ir.Value] = {}
        self.replaced_constants: set[ir.Value] = set()
        self.kept: list[KeptOp] = []
        self._fresh = FreshNames(graph)
        self.converted = self.casts = self.constants = 0

    def is_float32(self, value: ir.Value | None) -> bool:
        """Whether the value is float32 in the original model."""
        return value is not None and (value in self.lowered or value.dtype == ir.DataType.FLOAT)

    def visit(self, node: ir.Node) -> None:
        for sub in subgraphs(node):
            self._restore_captured(node, sub)
        float_ins = [self.is_float32(v) for v in node.inputs]
        float_outs = [self.is_float32(v) for v in node.outputs]
        if not any(float_ins) and not any(float_outs):
            return  # shape and index computation: nothing to convert
        slots = self._decide(node, float_outs)
        for i, value in enumerate(node.inputs):
            if value is None or not float_ins[i]:
                continue
            wanted = self.low if slots is not None and slots.inputs[i] else ir.DataType.FLOAT
            new = self.resolve(value, wanted, before=node)
            if new is not value:
                node.replace_input_with(i, new)
        if slots is None:
            return
        self.converted += 1
        for j, out in enumerate(node.outputs):
            if float_outs[j] and slots.outputs[j]:
                out.type = ir.TensorType(self.low)
                self.lowered.add(out)
        if node.op_type == "Cast" and node.attributes.get_int("to") == ir.DataType.FLOAT:
            node.attributes["to"] = ir.AttrInt64("to", int(self.low))

    def _decide(self, node: ir.Node, float_outs: list[bool]) -> Slots | None:
        """The node's low-precision slots, or None (and a record of why) if it stays float32."""
        reason: str | None
        if node.name in self.keep_nodes:
            reason = self.keep_nodes[node.name]
        elif node.op_type in self.keep_ops:
            reason = "block-listed op"
        elif any(v is not None and v.dtype is None and v not in self.lowered for v in node.inputs):
            # it may really be float32: converting around it could mix types
            reason = "an input's type is unknown"
        else:
            found = low_precision_slots(node, self.opset, self.low)
            if isinstance(found, Slots):
                wanted_out = [ok for ok, f in zip(found.outputs, float_outs, strict=True) if f]
                if any(wanted_out) or (not wanted_out and any(found.inputs)):
                    return found
                reason = f"no {self.low.name.lower()} form of {node.op_type} at opset {self.opset}"
            else:
                reason = found
        self.kept.append(KeptOp(node.name or "", node.op_type, reason))
        return None

    def resolve(self, value: ir.Value, wanted: ir.DataType, *, before: ir.Node | None) -> ir.Value:
        """``value`` stored in ``wanted``: itself, a converted constant or a shared Cast."""
        current = self.low if value in self.lowered else ir.DataType.FLOAT
        if current == wanted:
            return value
        key = (value, wanted)
        if key in self.forms:
            return self.forms[key]
        tensor = None if value.is_graph_input() else ir.convenience.get_const_tensor(value)
        if tensor is not None and current == ir.DataType.FLOAT:
            name = self._fresh(f"{value.name}_{wanted.name.lower()}")
            array = tensor.numpy().astype(wanted.numpy())
            new = ir.Value(
                name=name,
                shape=ir.Shape(array.shape),
                type=ir.TensorType(wanted),
                const_value=ir.tensor(array, dtype=wanted, name=name),
            )
            self.graph.register_initializer(new)
            self.replaced_constants.add(value)
            self.constants += 1
        else:
            cast = ir.Node("", "Cast", [value], [ir.AttrInt64("to", int(wanted))])
            new = cast.outputs[0]
            new.name = self._fresh(f"{value.name}_{wanted.name.lower()}")
            new.type, new.shape = ir.TensorType(wanted), value.shape
            if before is None:
                self.graph.append(cast)
            else:
                self.graph.insert_before(before, cast)
            self.casts += 1
        self.forms[key] = new
        return new

    def _restore_captured(self, node: ir.Node, subgraph: ir.Graph) -> None:
        """Bodies stay float32: values they read from this graph are cast back up."""
        for inner in ir.traversal.RecursiveGraphIterator(subgraph):
            for i, value in enumerate(inner.inputs):
                if value is not None and value.graph is self.graph and value in self.lowered:
                    inner.replace_input_with(i, self.resolve(value, ir.DataType.FLOAT, before=node))

    def restore_outputs(self) -> None:
        """Graph outputs stay float32 and keep their names."""
        for index, output in enumerate(list(self.graph.outputs)):
            if output not in self.lowered:
                continue
            restored = self.resolve(output, ir.DataType.FLOAT, before=None)
            name = output.name
            output.name = self._fresh(f"{name}_{self.low.name.lower()}")
            restored.name = name
            self.graph.outputs[index] = restored

    def drop_unused_constants(self) -> None:
        drop_unused_constants(self.graph, self.replaced_constants)
