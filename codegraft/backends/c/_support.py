"""Which nodes the C backend takes, decided from the node alone, with the reason when not.

NOTE: the checks look only at what a node carries (its attributes, the dtype and rank of
its values, and which inputs are constants), never at neighbours: the partitioner may put
any supported node in any partition.  Shapes may still be symbolic here; the backend
compiles per concrete shape later, so only ranks matter.
"""

from __future__ import annotations

from collections.abc import Callable

import onnx_ir as ir

from codegraft.backend import Support

NHWC_DOMAIN = "codegraft.nhwc"

UNARY = frozenset(
    {"Relu", "LeakyRelu", "Sigmoid", "Tanh", "Clip", "HardSigmoid", "HardSwish", "Erf", "Gelu", "Exp", "Sqrt",
     "Neg", "Abs", "Reciprocal", "Elu", "Selu", "Softplus"}
)
BINARY = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "PRelu"})
VIEWS = frozenset({"Identity", "Dropout", "Reshape", "Flatten", "Squeeze", "Unsqueeze"})
NHWC_OPS = frozenset({"Conv", "MaxPool", "AveragePool", "GlobalAveragePool", "BatchNormalization"})


def opset_of(node: ir.Node) -> int:
    """The opset version a node is read with (the default domain's for ``codegraft.nhwc``)."""
    if node.version is not None and node.domain in ("", "ai.onnx"):
        return node.version
    graph = node.graph
    while graph is not None:
        version = graph.opset_imports.get("")
        if version is not None:
            return version
        parent = getattr(graph, "parent", None)
        graph = getattr(parent, "graph", None) if parent is not None else None
    return 21


def attr_int(node: ir.Node, name: str, default: int) -> int:
    attr = node.attributes.get(name)
    return default if attr is None else attr.as_int()


def attr_float(node: ir.Node, name: str, default: float) -> float:
    attr = node.attributes.get(name)
    return default if attr is None else attr.as_float()


def attr_ints(node: ir.Node, name: str) -> list[int] | None:
    attr = node.attributes.get(name)
    return None if attr is None else list(attr.as_ints())


def attr_str(node: ir.Node, name: str, default: str) -> str:
    attr = node.attributes.get(name)
    return default if attr is None else attr.as_string()


def present(node: ir.Node, index: int) -> ir.Value | None:
    """Input ``index`` of ``node`` when given (ONNX marks omitted optional inputs by ``""``)."""
    if index < len(node.inputs):
        return node.inputs[index]
    return None


def rank_of(value: ir.Value | None) -> int | None:
    return None if value is None or value.shape is None else len(value.shape)


# Evaluated at compile time when every input is (ops on shapes and constants: exporters' shape
# arithmetic).  The backend compiles per concrete input shape, so ``Shape`` is always a constant.
SHAPE_OPS = frozenset({"Shape", "Size"})
FOLDABLE = frozenset(
    {"Gather", "Slice", "Concat", "Squeeze", "Unsqueeze", "Reshape", "Cast", "Add", "Sub", "Mul", "Div", "Mod",
     "Neg", "Abs", "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "Not", "And", "Or", "Where",
     "Expand", "ConstantOfShape", "Range", "Identity", "Min", "Max", "Transpose", "ReduceProd", "ReduceSum"}
)


def compile_time(value: ir.Value | None, _seen: dict[int, bool] | None = None) -> bool:
    """Whether ``value`` is known when the partition is compiled: a constant, or computed from
    shapes and constants only.

    NOTE: this looks at producers, not only at the node: a partition holding the consumer but
    not the producers fails to lower and runs on the host instead (logged, in the report).
    """
    if value is None or _const(value):
        return True
    seen = {} if _seen is None else _seen
    key = id(value)
    if key not in seen:
        seen[key] = False  # a cycle cannot happen in a graph; this only bounds the walk
        producer = value.producer()
        if producer is None or producer.domain not in ("", "ai.onnx"):
            seen[key] = False
        elif producer.op_type in SHAPE_OPS or producer.op_type == "Constant":
            seen[key] = True
        else:
            seen[key] = producer.op_type in FOLDABLE and all(compile_time(v, seen) for v in producer.inputs)
    return seen[key]


def supports(node: ir.Node) -> Support:
    """Yes, or ``"<op>: <reason>"``."""
    op = node.op_type
    if node.domain == NHWC_DOMAIN:
        if op not in NHWC_OPS:
            return Support.no(f"{op}: not implemented in the {NHWC_DOMAIN} domain")
    elif node.domain not in ("", "ai.onnx"):
        return Support.no(f"{op}: domain {node.domain!r} is not supported")
    elif op in SHAPE_OPS or (op in FOLDABLE and all(compile_time(v) for v in node.inputs)):
        return Support.yes()  # folded to a constant at compile time, whatever its dtype
    check = _CHECKS.get(op)
    if check is None:
        return Support.no(f"{op}: not implemented by the C backend")
    reason = _float_data(node) or _empty(node) or check(node)
    return Support.no(f"{op}: {reason}") if reason else Support.yes()


def _empty(node: ir.Node) -> str:
    """Kernels index by sizes and divide by them: an empty tensor goes to the host instead."""
    for value in (*node.inputs, *node.outputs):
        # (a symbolic dimension never equals 0)
        if value is not None and value.shape is not None and 0 in value.shape.dims:
            return f"{value.name!r} is empty (shape {list(value.shape)}); empty tensors run on the host"
    return ""


# Inputs that are not float data (shapes, axes), by op: skipped by the dtype check.
_NON_DATA_INPUTS: dict[str, frozenset[int]] = {
    "Reshape": frozenset({1}),
    "Squeeze": frozenset({1}),
    "Unsqueeze": frozenset({1}),
    "ReduceMean": frozenset({1}),
    "ReduceSum": frozenset({1}),
    "Dropout": frozenset({1, 2}),
    "Slice": frozenset({1, 2, 3, 4}),
    "Split": frozenset({1}),
    "Pad": frozenset({1, 3}),
    "Gather": frozenset({1}),
    "Where": frozenset({0}),
    "Expand": frozenset({1}),
}


_FLOAT = ir.DataType.FLOAT
_NO_INPUTS: frozenset[int] = frozenset()


def _float_data(node: ir.Node) -> str:
    skip = _NON_DATA_INPUTS.get(node.op_type, _NO_INPUTS)
    for index, value in enumerate(node.inputs):
        if value is None or index in skip:
            continue
        dtype = value.dtype
        if dtype is not None and dtype != _FLOAT:
            return f"input {index} is {dtype.name.lower()}, only float32 is supported"
    for index, value in enumerate(node.outputs):
        dtype = value.dtype
        if dtype is not None and dtype != _FLOAT and value.uses():
            return f"output {index} is {dtype.name.lower()}, only float32 is supported"
    return ""


def _const(value: ir.Value | None) -> bool:
    # An initializer that is also a graph input is only a default: the caller may override it.
    return value is not None and value.const_value is not None and not value.is_graph_input()


def _check_conv(node: ir.Node) -> str:
    weight = present(node, 1)
    if not _const(weight):
        return "the weight must be a constant initializer"
    assert weight is not None and weight.const_value is not None
    weight_dims = _dims(weight.const_value)
    rank = len(weight_dims)
    if rank not in (3, 4):
        return f"{rank - 2}-D convolution is not supported (only 1-D and 2-D)"
    bias = present(node, 2)
    if bias is not None and not _const(bias):
        return "the bias must be a constant initializer"
    return _check_window(node, rank - 2, weight_dims)


def _dims(tensor: ir.TensorProtocol) -> tuple[int, ...]:
    """A constant's dimensions.  (onnx-ir builds a new ``Shape`` each time a tensor read from
    a proto is asked for its shape: a tenth of ``supports`` on a Conv; the proto has them.)"""
    if isinstance(tensor, ir.serde.TensorProtoTensor):
        return tuple(tensor.raw.dims)
    return tuple(tensor.shape.numpy())


def _check_window(node: ir.Node, spatial: int, weight_dims: tuple[int, ...] | None = None) -> str:
    """``weight_dims``: a Conv's constant weight, whose spatial dims are the kernel's."""
    auto_pad = attr_str(node, "auto_pad", "NOTSET")
    if auto_pad not in ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"):
        return f"auto_pad={auto_pad} is not supported"
    for name, length in (("strides", spatial), ("dilations", spatial), ("pads", 2 * spatial)):
        values = attr_ints(node, name)
        if values is not None and len(values) != length:
            return f"{name} has {len(values)} values, expected {length}"
        if values is not None and name != "pads" and min(values) < 1:
            return f"{name}={values} must be positive"
    if auto_pad.startswith("SAME") and any(d != 1 for d in attr_ints(node, "dilations") or []):
        # the padding rule for this case is not settled (onnxruntime refuses it); do not guess
        return f"auto_pad={auto_pad} with dilations is not supported"
    kernel = attr_ints(node, "kernel_shape")
    if kernel is not None and len(kernel) != spatial:
        return f"kernel_shape has {len(kernel)} values, expected {spatial}"
    if kernel is None and weight_dims is not None and node.op_type == "Conv":
        shape = [int(d) for d in weight_dims]
        kernel = shape[1:-1] if node.domain == NHWC_DOMAIN else shape[2:]
    strides = attr_ints(node, "strides") or [1] * spatial
    if auto_pad.startswith("SAME") and kernel and any(k < s for k, s in zip(kernel, strides, strict=False)):
        # the total padding would be negative (a crop); onnxruntime refuses it, so do not guess
        return f"auto_pad={auto_pad} with a kernel smaller than the stride is not supported"
    return ""


def _check_pool(node: ir.Node) -> str:
    kernel = attr_ints(node, "kernel_shape")
    if kernel is None:
        return "kernel_shape is required"
    if len(kernel) not in (1, 2):
        return f"{len(kernel)}-D pooling is not supported (only 1-D and 2-D)"
    if node.op_type == "AveragePool" and any(d != 1 for d in attr_ints(node, "dilations") or []):
        return "dilations are not supported"
    if node.op_type == "MaxPool":
        if len(node.outputs) > 1 and node.outputs[1].uses():
            return "the Indices output is not supported"
        if attr_int(node, "storage_order", 0) != 0:
            return "storage_order=1 is not supported"
    return _check_window(node, len(kernel))


def _check_global_pool(node: ir.Node) -> str:
    rank = rank_of(node.inputs[0])
    if rank is not None and rank < 3:
        return f"input rank {rank} < 3"
    return ""


def _check_batchnorm(node: ir.Node) -> str:
    if any(not _const(present(node, i)) for i in range(1, 5)):
        return "scale, B, mean and var must be constant initializers (inference only)"
    if attr_int(node, "training_mode", 0) != 0:
        return "training_mode=1 is not supported"
    if any(v.uses() or v.is_graph_output() for v in node.outputs[1:]):
        return "training outputs (running mean/var) are not supported"
    if attr_int(node, "spatial", 1) != 1:
        return "spatial=0 is not supported"
    return ""


def _check_gemm(node: ir.Node) -> str:
    for index in (0, 1):
        rank = rank_of(node.inputs[index])
        if rank is not None and rank != 2:
            return f"input {index} has rank {rank}, expected 2"
    return ""


def _check_matmul(node: ir.Node) -> str:
    for index in (0, 1):
        if rank_of(node.inputs[index]) == 0:
            return "scalar operands are not valid"
    return ""


def _check_clip(node: ir.Node) -> str:
    for index in (1, 2):
        bound = present(node, index)
        if bound is not None and not _const(bound):
            return f"{'min' if index == 1 else 'max'} must be a constant"
    return ""


def _check_layernorm(node: ir.Node) -> str:
    if not _const(present(node, 1)):
        return "scale must be a constant initializer"
    bias = present(node, 2)
    if bias is not None and not _const(bias):
        return "bias must be a constant initializer"
    if any(v.uses() or v.is_graph_output() for v in node.outputs[1:]):
        return "the Mean and InvStdDev outputs are not supported (only Y)"
    return ""


def _check_gelu(node: ir.Node) -> str:
    approximate = attr_str(node, "approximate", "none")
    return "" if approximate in ("none", "tanh") else f"approximate={approximate!r} is not supported"


def _check_reshape(node: ir.Node) -> str:
    if not compile_time(present(node, 1)):
        return "the shape input must be a constant or computed from shapes"
    if not _const(present(node, 1)):
        return ""  # allowzero with a 0 in a computed shape is refused when it is lowered
    shape = present(node, 1).const_value.numpy()  # type: ignore[union-attr]
    if attr_int(node, "allowzero", 0) != 0 and (shape == 0).any():
        # allowzero=1 makes a 0 an empty dimension, not "copy the input's": empty tensors are not supported
        return "allowzero=1 with a 0 in the shape (an empty tensor) is not supported"
    return ""


def _known_at_compile_time(index: int, what: str) -> Callable[[ir.Node], str]:
    """A check that input ``index`` (``what``) is a constant or computed from shapes."""

    def check(node: ir.Node) -> str:
        return "" if compile_time(present(node, index)) else f"the {what} must be a constant or computed from shapes"

    return check


def _check_cast(node: ir.Node) -> str:
    to = attr_int(node, "to", 0)
    if to != ir.DataType.FLOAT:
        return f"a cast to {ir.DataType(to).name.lower()} is not supported (only float32 data)"
    return ""


def _check_axes_input(node: ir.Node) -> str:
    axes = present(node, 1)
    if axes is not None and not _const(axes):
        return "the axes input must be a constant"
    return ""


def _check_dropout(node: ir.Node) -> str:
    if len(node.outputs) > 1 and node.outputs[1].uses():
        return "the mask output is not supported"
    training = present(node, 2)
    if training is not None:
        if not _const(training) or bool(training.const_value.numpy().item()):  # type: ignore[union-attr]
            return "training_mode must be a constant false"
    return ""


def _check_reduce_mean(node: ir.Node) -> str:
    reason = _check_axes_input(node)
    if reason:
        return reason
    if rank_of(node.inputs[0]) is None:
        return "the input rank is unknown"
    return ""


def _check_lrn(node: ir.Node) -> str:
    if node.attributes.get("size") is None:
        return "the size attribute is required"
    if attr_int(node, "size", 1) % 2 == 0:  # the window of an even size is read two ways; do not guess
        return "an even size is not supported"
    rank = rank_of(node.inputs[0])
    if rank is not None and rank < 2:
        return f"input rank {rank} < 2"
    return ""


def _check_slice(node: ir.Node) -> str:
    if opset_of(node) >= 10 and any(present(node, i) is not None and not _const(present(node, i)) for i in range(1, 5)):
        return "starts, ends, axes and steps must be constants"
    if rank_of(node.inputs[0]) is None:
        return "the input rank is unknown"
    return ""


def _check_split(node: ir.Node) -> str:
    if opset_of(node) >= 13 and present(node, 1) is not None and not _const(present(node, 1)):
        return "the split input must be a constant"
    if rank_of(node.inputs[0]) is None:
        return "the input rank is unknown"
    return ""


def _check_pad(node: ir.Node) -> str:
    mode = attr_str(node, "mode", "constant")
    if mode != "constant":
        return f"mode={mode} is not supported (only constant)"
    if opset_of(node) >= 11:
        if not _const(present(node, 1)) or (present(node, 2) is not None and not _const(present(node, 2))):
            return "pads and constant_value must be constants"
        if present(node, 3) is not None:
            return "the axes input is not supported"
        pads = [int(v) for v in present(node, 1).const_value.numpy().reshape(-1)]  # type: ignore[union-attr]
    else:
        pads = attr_ints(node, "pads") or []
    if any(p < 0 for p in pads):
        return "negative pads (cropping) are not supported"
    return ""


def _check_constant(node: ir.Node) -> str:
    if not any(node.attributes.get(n) is not None for n in ("value", "value_float", "value_floats")):
        return "only value, value_float and value_floats are supported"
    return ""


def _ok(node: ir.Node) -> str:
    return ""


_CHECKS: dict[str, Callable[[ir.Node], str]] = {
    "Conv": _check_conv,
    "MaxPool": _check_pool,
    "AveragePool": _check_pool,
    "GlobalAveragePool": _check_global_pool,
    "BatchNormalization": _check_batchnorm,
    "Gemm": _check_gemm,
    "MatMul": _check_matmul,
    "Clip": _check_clip,
    "Gelu": _check_gelu,
    "Reshape": _check_reshape,
    "Gather": _known_at_compile_time(1, "indices"),
    "Where": _known_at_compile_time(0, "condition"),
    "Expand": _known_at_compile_time(1, "shape"),
    "Cast": _check_cast,
    "Squeeze": _check_axes_input,
    "Unsqueeze": _check_axes_input,
    "Dropout": _check_dropout,
    "ReduceMean": _check_reduce_mean,
    "ReduceSum": _check_reduce_mean,
    "LayerNormalization": _check_layernorm,
    "Constant": _check_constant,
    "Slice": _check_slice,
    "Split": _check_split,
    "Pad": _check_pad,
    "LogSoftmax": _ok,
    "Max": _ok,
    "Min": _ok,
    "LRN": _check_lrn,
    "Softmax": _ok,
    "Concat": _ok,
    "Flatten": _ok,
    "Transpose": _ok,
    "Identity": _ok,
    "Sum": _ok,
    **{op: _ok for op in UNARY - {"Clip", "Gelu"}},
    **{op: _ok for op in BINARY},
}
