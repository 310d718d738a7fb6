"""Which inputs and outputs of a node may change from float32 to a lower precision.

NOTE: the answer comes from the ONNX schema of the op at the model's opset, not from a
hand-written table: an input whose type variable also allows the target type (``T`` of Conv)
may change, one with a fixed type (Resize ``scales``: ``tensor(float)``) may not, and an op
whose schema does not list the target type at all (Conv before opset 22 has no bfloat16)
stays float32.  The converted model therefore always passes the ONNX checker.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx
import onnx_ir as ir

from codegraft.passes._layout_rules import NHWC_DOMAIN

# Ops whose output type is chosen by an attribute, not by their inputs.
_TYPE_BY_ATTRIBUTE = frozenset(
    {
        "ConstantOfShape",
        "EyeLike",
        "Multinomial",
        "RandomNormal",
        "RandomNormalLike",
        "RandomUniform",
        "RandomUniformLike",
        "Bernoulli",
    }
)


@dataclass(frozen=True)
class Slots:
    """Per input / output: may this float32 slot hold the lower precision instead."""

    inputs: tuple[bool, ...]
    outputs: tuple[bool, ...]


def _type_name(dtype: ir.DataType) -> str:
    return f"tensor({'float16' if dtype == ir.DataType.FLOAT16 else dtype.name.lower()})"


def low_precision_slots(node: ir.Node, opset: int, dtype: ir.DataType) -> Slots | str:
    """The slots that may change to ``dtype``, or the reason the node must stay float32."""
    if any(a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS) for a in node.attributes.values()):
        return "control flow: its bodies stay float32"
    if node.op_type in _TYPE_BY_ATTRIBUTE:
        return "its output type is set by an attribute"
    domain = "" if node.domain in ("", "ai.onnx", NHWC_DOMAIN) else node.domain
    try:
        schema = onnx.defs.get_schema(node.op_type, opset, domain)
    except onnx.defs.SchemaError:
        return f"no ONNX schema for {node.domain or 'ai.onnx'}::{node.op_type}"
    allowed = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}
    wanted = _type_name(dtype)

    def convertible(params: list[onnx.defs.OpSchema.FormalParameter], count: int) -> tuple[bool, ...]:
        result = []
        for i in range(count):
            param = params[min(i, len(params) - 1)] if params else None
            type_str = "" if param is None else param.type_str
            types = allowed.get(type_str, {type_str})
            result.append(wanted in types and "tensor(float)" in types)
        return tuple(result)

    slots = Slots(
        convertible(list(schema.inputs), len(node.inputs)),
        convertible(list(schema.outputs), len(node.outputs)),
    )
    if node.op_type == "Cast":  # T2 lists every type; what counts is the ``to`` attribute
        slots = Slots(slots.inputs, (node.attributes.get_int("to") == ir.DataType.FLOAT,))
    return slots
