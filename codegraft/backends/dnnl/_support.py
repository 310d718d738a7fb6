"""What the ``dnnl`` backend takes: per-node checks and its fused groups, each declining with a reason.

NOTE: the per-node rules reuse the ``c`` backend's checks where the constraint is the same
(constant weights, window attributes, Reshape's constant shape) and add oneDNN's own: group
convolutions must divide the channels, Softmax before opset 13 only on the last axis, a
broadcast first operand only for commutative ops.  Fused groups are written in codegraft's
pattern language: a convolution with bias, a residual Add as oneDNN's *sum* post-op and an
activation as an *eltwise* post-op; Gemm/MatMul with bias and activation.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import onnx_ir as ir

from codegraft.backend import CompositeRule, Support
from codegraft.backends.c._node import attr_int, attr_str, opset_of, present, rank_of
from codegraft.backends.c._node import is_constant as _const
from codegraft.backends.c._support import float_data as _float_data
from codegraft.backends.c.ops.conv import check_conv as _check_conv_window
from codegraft.backends.c.ops.elementwise import check_clip as _check_clip
from codegraft.backends.c.ops.norm import check_batchnorm as _check_batchnorm_constants
from codegraft.backends.c.ops.norm import check_layernorm as _check_layernorm_constants
from codegraft.backends.c.ops.norm import check_lrn as _check_lrn
from codegraft.backends.c.ops.pool import check_global_pool as _check_global_pool
from codegraft.backends.c.ops.pool import check_pool as _check_pool
from codegraft.backends.c.ops.views import check_dropout as _check_dropout
from codegraft.backends.c.ops.views import check_reshape as _check_reshape
from codegraft.patterns import Pattern, const, library, op, optional, var

# op -> oneDNN eltwise algorithm (alpha and beta are read from the node when the op has them)
ELTWISE = {
    "Relu": "dnnl_eltwise_relu",
    "LeakyRelu": "dnnl_eltwise_relu",
    "Sigmoid": "dnnl_eltwise_logistic",
    "Tanh": "dnnl_eltwise_tanh",
    "Elu": "dnnl_eltwise_elu",
    "Exp": "dnnl_eltwise_exp",
    "Log": "dnnl_eltwise_log",
    "Sqrt": "dnnl_eltwise_sqrt",
    "Abs": "dnnl_eltwise_abs",
    "Neg": "dnnl_eltwise_linear",
    "Softplus": "dnnl_eltwise_soft_relu",
    "HardSigmoid": "dnnl_eltwise_hardsigmoid",
    "HardSwish": "dnnl_eltwise_hardswish",
    "Gelu": "dnnl_eltwise_gelu_erf",
    "Clip": "dnnl_eltwise_clip_v2",
}
BINARY = {"Add": "dnnl_binary_add", "Sum": "dnnl_binary_add", "Sub": "dnnl_binary_sub", "Mul": "dnnl_binary_mul",
          "Div": "dnnl_binary_div", "Max": "dnnl_binary_max", "Min": "dnnl_binary_min"}
COMMUTATIVE = frozenset({"Add", "Sum", "Mul", "Max", "Min"})
VIEWS = frozenset({"Identity", "Dropout", "Reshape", "Flatten", "Squeeze", "Unsqueeze"})
POST_OP_ACTIVATIONS = ("Relu", "Clip", "LeakyRelu", "Sigmoid", "Tanh", "HardSwish", "Gelu", "Elu")

# Inputs that are shapes or axes, not float data (the dtype check skips them).
_NON_DATA = {"Reshape": {1}, "Squeeze": {1}, "Unsqueeze": {1}, "Dropout": {1, 2}}


def supports(node: ir.Node) -> Support:
    """Yes, or ``"<op>: <reason>"``."""
    op_type = node.op_type
    if node.domain not in ("", "ai.onnx"):
        return Support.no(f"{op_type}: domain {node.domain!r} is not supported")
    check = _CHECKS.get(op_type)
    if check is None:
        return Support.no(f"{op_type}: not implemented by the dnnl backend")
    reason = _float_inputs(node) or check(node)
    return Support.no(f"{op_type}: {reason}") if reason else Support.yes()


def _float_inputs(node: ir.Node) -> str:
    if node.op_type in _NON_DATA:
        skip = _NON_DATA[node.op_type]
        for index, value in enumerate(node.inputs):
            if value is not None and index not in skip and value.dtype not in (None, ir.DataType.FLOAT):
                return f"input {index} is {value.dtype.name.lower()}, only float32 is supported"
        return ""
    return _float_data(node)


def _check_conv(node: ir.Node) -> str:
    reason = _check_conv_window(node)
    if reason:
        return reason
    weight = node.inputs[1]
    if weight is None or weight.const_value is None:  # (c's check also takes a DequantizeLinear of one)
        return "the weight must be a constant initializer"
    bias = node.inputs[2] if len(node.inputs) > 2 else None
    if bias is not None and bias.const_value is None:
        return "the bias must be a constant initializer"
    group = attr_int(node, "group", 1)
    out_channels, in_per_group = (int(d) for d in weight.const_value.shape.numpy()[:2])
    x = node.inputs[0]
    channels = x.shape[1] if x is not None and x.shape is not None and len(x.shape) > 1 else None
    if group < 1 or out_channels % group:
        return f"group={group} does not divide the {out_channels} output channels"
    if isinstance(channels, int) and in_per_group * group != channels:
        return f"group={group} with {in_per_group} input channels per group does not map {channels} input channels"
    return ""


def _check_batchnorm(node: ir.Node) -> str:
    if attr_int(node, "training_mode", 0) != 0 or len(node.outputs) > 1:
        return "training mode is not supported (inference only)"
    return _check_batchnorm_constants(node)


def _check_binary(node: ir.Node) -> str:
    if len(node.inputs) != 2:
        return f"{len(node.inputs)} inputs (only 2)"
    a, b, out = node.inputs[0], node.inputs[1], node.outputs[0]
    if any(v is None or v.shape is None for v in (a, b, out)):
        return ""  # decided per concrete shape at compile time
    assert a is not None and b is not None and out.shape is not None
    if _const(a) and _const(b):
        return "both operands are constants (constant folding's job)"
    if a.shape != out.shape and b.shape != out.shape:
        return "neither operand has the output's shape (both broadcast)"
    if a.shape != out.shape and node.op_type not in COMMUTATIVE:
        return "the first operand is broadcast (oneDNN broadcasts the second only)"
    if _const(a) and node.op_type not in COMMUTATIVE:
        return "a constant first operand is not supported"
    return ""


def _check_softmax(node: ir.Node) -> str:
    rank = rank_of(node.inputs[0])
    if rank is None:
        return "the input rank is unknown"
    axis = attr_int(node, "axis", -1 if opset_of(node) >= 13 else 1)
    if opset_of(node) < 13 and axis % rank != rank - 1:
        return f"before opset 13 Softmax flattens from axis {axis}; only the last axis is supported"
    return ""


def _check_eltwise(node: ir.Node) -> str:
    if node.op_type == "Gelu" and attr_str(node, "approximate", "none") not in ("none", "tanh"):
        return f"approximate={attr_str(node, 'approximate', 'none')!r} is not supported"
    if node.op_type == "Clip":
        return _check_clip(node)
    return ""


def _check_matmul(node: ir.Node) -> str:
    a, b = node.inputs[0], node.inputs[1]
    if not _const(b):
        return "the second operand must be a constant (weights)"
    ranks = (rank_of(a), rank_of(b))
    if None in ranks:
        return "operand ranks are unknown"
    if min(r or 0 for r in ranks) < 2:
        return f"operand ranks {ranks}: 1-D operands are not supported"
    if ranks[1] != 2:
        return f"the weights have rank {ranks[1]} (only 2-D weights)"
    return ""


def _check_gemm(node: ir.Node) -> str:
    if attr_int(node, "transA", 0) != 0:
        return "transA=1 is not supported"
    if node.attributes.get_float("alpha", 1.0) != 1.0 or node.attributes.get_float("beta", 1.0) != 1.0:
        return "alpha and beta other than 1 are not supported"
    if not _const(node.inputs[1]):
        return "B must be a constant (weights)"
    bias = present(node, 2)
    if bias is not None and not _const(bias):
        return "C must be a constant"
    if rank_of(node.inputs[0]) not in (None, 2):
        return f"A has rank {rank_of(node.inputs[0])}, expected 2"
    return ""


def _check_concat(node: ir.Node) -> str:
    if len(node.inputs) > 64:
        return f"{len(node.inputs)} inputs (at most 64)"
    if any(_const(v) for v in node.inputs):
        return "constant inputs are not supported"
    return ""


def _check_transpose(node: ir.Node) -> str:
    rank = rank_of(node.inputs[0])
    return "" if rank is not None and 1 <= rank <= 12 else "the input rank is unknown or over 12"


def _check_view(node: ir.Node) -> str:
    if node.op_type == "Reshape":
        # the result's shape must be known when the partition is generated
        return _check_reshape(node) if _const(present(node, 1)) else "the shape input must be a constant"
    if node.op_type == "Dropout":
        return _check_dropout(node)
    if node.op_type in ("Squeeze", "Unsqueeze"):
        axes = present(node, 1)
        if axes is not None and not _const(axes):
            return "the axes input must be a constant"
    return ""


def _check_avg_pool(node: ir.Node) -> str:
    if attr_int(node, "ceil_mode", 0) and attr_int(node, "count_include_pad", 0):
        return "ceil_mode=1 with count_include_pad=1 is not supported (the ceil padding would be counted)"
    return _check_pool(node)


def _check_layernorm(node: ir.Node) -> str:
    if rank_of(node.inputs[0]) is None:
        return "the input rank is unknown"
    return _check_layernorm_constants(node)


_CHECKS: dict[str, Callable[[ir.Node], str]] = {
    "Conv": _check_conv,
    "MaxPool": _check_pool,
    "AveragePool": _check_avg_pool,
    "GlobalAveragePool": _check_global_pool,
    "GlobalMaxPool": _check_global_pool,
    "BatchNormalization": _check_batchnorm,
    "LRN": _check_lrn,
    "Softmax": _check_softmax,
    "Concat": _check_concat,
    "Gemm": _check_gemm,
    "MatMul": _check_matmul,
    "Transpose": _check_transpose,
    "LayerNormalization": _check_layernorm,
    **{name: _check_binary for name in BINARY},
    **{name: _check_eltwise for name in ELTWISE},
    **{name: _check_view for name in VIEWS},
}


# --- fused groups -------------------------------------------------------------------------


def _conv_sum_act() -> Pattern:
    conv = op.Conv(var("x"), var("w"), var("b", optional=True), _name="conv")
    y = op.Add(conv, const("bias"), _optional=True, _name="bias_add")
    y = op.any("Add", "Sum")(y, var("residual"), _optional=True, _name="sum")
    act = op.any(*POST_OP_ACTIVATIONS)(
        y, const("clip_min", optional=True), const("clip_max", optional=True), _name="act"
    )
    return Pattern("conv_sum_act", optional(act, otherwise=y))


CONV_SUM_ACT = _conv_sum_act()
"""Conv [+ Add constant bias] [+ Add/Sum residual (sum post-op)] [+ activation (eltwise post-op)]."""

Captures = dict[str, "ir.Value | ir.Node"]


def _value(captures: Captures, name: str) -> ir.Value | None:
    item = captures.get(name)
    return item if isinstance(item, ir.Value) else None


def _check_conv_group(captures: Captures) -> Support:
    conv, weight = captures["conv"], _value(captures, "w")
    assert isinstance(conv, ir.Node)
    out = conv.outputs[0]
    bias = _value(captures, "bias")
    if bias is not None and bias.const_value is not None and weight is not None and weight.const_value is not None:
        rank = len(weight.const_value.shape)
        if not per_channel(tuple(bias.const_value.shape.numpy()), rank, int(weight.const_value.shape.numpy()[0])):
            return Support.no(f"the bias Add's shape {list(bias.const_value.shape)} is not per output channel")
    residual = _value(captures, "residual")
    if residual is not None:
        if residual.const_value is not None:
            return Support.no("the residual is a constant (not a sum post-op)")
        if residual.shape is not None and out.shape is not None and residual.shape != out.shape:
            return Support.no(f"the residual's shape {residual.shape} is not the Conv's {out.shape}")
    return _check_activation(captures)


def per_channel(shape: Sequence[int] | ir.Shape, rank: int, channels: int) -> bool:
    """Does a constant of ``shape`` broadcast along axis 1 only, of size ``channels``, at ``rank``?"""
    dims = [int(d) for d in shape]  # type: ignore[arg-type]
    dims = [1] * (rank - len(dims)) + dims
    return len(dims) == rank and dims[1] == channels and all(d == 1 for i, d in enumerate(dims) if i != 1)


def _check_activation(captures: Captures) -> Support:
    act = captures.get("act")
    if isinstance(act, ir.Node) and act.op_type == "Gelu" and attr_str(act, "approximate", "none") != "none":
        if attr_str(act, "approximate", "none") != "tanh":
            return Support.no(f"Gelu approximate={attr_str(act, 'approximate', 'none')!r}")
    return Support.yes()


def _check_gemm_group(captures: Captures) -> Support:
    bias = _value(captures, "bias")
    if bias is not None and bias.const_value is None:
        return Support.no("the bias is not a constant")
    return _check_activation(captures)


def rules() -> list[CompositeRule]:
    """The fused groups, in priority order."""
    return [
        CONV_SUM_ACT.rule(check=_check_conv_group),
        library.GEMM_BIAS_ACT.rule(check=_check_gemm_group),
    ]
