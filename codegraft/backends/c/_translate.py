"""Translating an ONNX partition (onnx-ir) into the backend's typed ops, with concrete shapes.

(Named apart from :mod:`codegraft.lower`, which lowers a partition onto any backend.)

NOTE: shapes are computed here from the partition's concrete input shapes, not read from
the model's value infos, because ``codegraft.nhwc`` ops are unknown to ONNX shape
inference.  Several ONNX ops become simpler ones: Gemm is a MatMul plus elementwise
epilogue ops, Conv's bias is an Add, BatchNormalization a Mul and an Add by per-channel
constants, Sum a chain of Adds, Reshape-like ops views.  Ops on constants only are folded.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from codegraft.backends.c import _graph as g
from codegraft.backends.c._support import (
    FOLDABLE,
    NHWC_DOMAIN,
    SHAPE_OPS,
    attr_float,
    attr_int,
    attr_ints,
    attr_str,
    opset_of,
    present,
)
from codegraft.errors import CodegraftError


class LoweringError(CodegraftError):
    """A partition the C backend cannot compile (names the node and why)."""


class _Lowerer:
    def __init__(self) -> None:
        self.values: dict[str, g.Tensor] = {}
        self.ops: list[g.Op] = []
        self.counter = 0

    # -- tensors -------------------------------------------------------------------------
    def tensor(self, value: ir.Value | None) -> g.Tensor:
        if value is None:
            raise LoweringError("a required input is missing")
        found = self.values.get(value.name or "")
        if found is not None:
            return found
        if value.const_value is not None:
            array = np.asarray(value.const_value.numpy())
            tensor = g.Tensor(value.name or self.fresh("const"), tuple(array.shape), const=array)
            self.values[tensor.name] = tensor
            return tensor
        raise LoweringError(f"value {value.name!r} is used before it is produced")

    def fresh(self, hint: str) -> str:
        self.counter += 1
        return f"_{hint}{self.counter}"

    def const(self, array: np.ndarray | np.floating, hint: str = "const") -> g.Tensor:
        array = np.asarray(array, dtype=np.float32)
        return g.Tensor(self.fresh(hint), tuple(array.shape), const=array)

    def folded(self, array: np.ndarray) -> g.Tensor:
        """A constant computed at compile time, its dtype kept (shape arithmetic is int64)."""
        array = np.asarray(array)
        return g.Tensor(self.fresh("folded"), tuple(array.shape), const=array)

    def new(self, shape: tuple[int, ...], hint: str = "t") -> g.Tensor:
        return g.Tensor(self.fresh(hint), tuple(int(d) for d in shape))

    def bind(self, value: ir.Value, tensor: g.Tensor) -> None:
        self.values[value.name or ""] = tensor

    # -- building blocks -----------------------------------------------------------------
    def elementwise(self, kind: str, inputs: list[g.Tensor], params: tuple[float, ...] = ()) -> g.Tensor:
        if all(t.const is not None for t in inputs) and kind in _FOLD:
            return self.const(_FOLD[kind](*[t.const for t in inputs]))  # type: ignore[misc]
        shape = np.broadcast_shapes(*[t.shape for t in inputs])
        out = self.new(shape)
        self.ops.append(g.Elementwise(list(inputs), out, kind=kind, params=params))
        return out

    def view(self, x: g.Tensor, shape: tuple[int, ...]) -> g.Tensor:
        if math.prod(shape) != x.size:
            raise LoweringError(f"cannot view {x.shape} as {shape}")
        if x.const is not None:
            return self.const(x.const.reshape(shape))
        out = self.new(shape)
        self.ops.append(g.View([x], out))
        return out


def translate(model: ir.Model) -> g.Graph:
    """Lower a partition with concrete input shapes; raise :class:`LoweringError` if unable."""
    lowerer = _Lowerer()
    inputs = []
    for value in model.graph.inputs:
        if value.shape is None or not all(isinstance(d, int) for d in value.shape):
            raise LoweringError(f"input {value.name!r} has no concrete shape ({value.shape})")
        tensor = g.Tensor(value.name or "", tuple(int(d) for d in value.shape))  # type: ignore[arg-type]
        lowerer.bind(value, tensor)
        inputs.append(tensor)
    for node in model.graph:
        try:
            if _fold(lowerer, node):
                continue
        except LoweringError as error:
            raise LoweringError(f"{node.op_type} ({node.name}): {error}") from None
        lower_one = _LOWERINGS.get(node.op_type)
        if lower_one is None:
            raise LoweringError(f"{node.op_type} ({node.name}) is not supported")
        made = len(lowerer.ops)
        try:
            lower_one(lowerer, node)
        except LoweringError as error:
            raise LoweringError(f"{node.op_type} ({node.name}): {error}") from None
        for op in lowerer.ops[made:]:
            op.out.origin = op.out.origin or node.name or ""
    outputs = [lowerer.tensor(v) for v in model.graph.outputs]
    for value, tensor in zip(model.graph.outputs, outputs, strict=True):
        if tensor.const is not None and tensor.const.dtype != np.float32:
            raise LoweringError(f"output {value.name!r} is a {tensor.const.dtype} constant; outputs are float32")
    return g.Graph(inputs, outputs, lowerer.ops)


def _fold(lw: _Lowerer, node: ir.Node) -> bool:
    """Evaluate ``node`` now when it can be: shapes are concrete, and ops on constants only.

    onnx's reference evaluator computes the folded ops, so their semantics are the spec's.
    """
    if node.domain not in ("", "ai.onnx"):
        return False
    if node.op_type in SHAPE_OPS:
        x = lw.tensor(node.inputs[0])
        if node.op_type == "Size":
            value = np.array(x.size, np.int64)
        else:
            end = node.attributes.get("end")
            value = np.array(x.shape[attr_int(node, "start", 0) : None if end is None else end.as_int()], np.int64)
        lw.bind(node.outputs[0], lw.folded(value))
        return True
    if node.op_type not in FOLDABLE:
        return False
    inputs = [None if v is None else lw.tensor(v) for v in node.inputs]
    if any(t is not None and t.const is None for t in inputs):
        return False
    results = _evaluate(node, [None if t is None else t.const for t in inputs])
    for output, array in zip(node.outputs, results, strict=True):
        lw.bind(output, lw.folded(array))
    return True


def _evaluate(node: ir.Node, arrays: list[np.ndarray | None]) -> list[np.ndarray]:
    import onnx
    from onnx.reference import ReferenceEvaluator

    proto = ir.serde.serialize_node(node)
    names = [f"in{i}" if a is not None else "" for i, a in enumerate(arrays)]
    outs = [f"out{i}" for i in range(len(node.outputs))]
    del proto.input[:], proto.output[:]
    proto.input.extend(names)
    proto.output.extend(outs)
    graph = onnx.helper.make_graph(
        [proto], "fold",
        [onnx.helper.make_tensor_value_info(n, onnx.helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
         for n, a in zip(names, arrays, strict=True) if a is not None],
        [onnx.helper.make_tensor_value_info(n, onnx.TensorProto.UNDEFINED, None) for n in outs],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset_of(node))])
    try:
        results = ReferenceEvaluator(model).run(None, {n: a for n, a in zip(names, arrays, strict=True) if n})
    except Exception as error:
        raise LoweringError(f"cannot evaluate it at compile time: {type(error).__name__}: {error}") from None
    return [np.asarray(r) for r in results]


# -- per-op lowerings ------------------------------------------------------------------------

_FOLD: dict[str, Callable[..., np.ndarray]] = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": np.divide,
}


def _window(
    node: ir.Node, spatial_in: tuple[int, ...], kernel: tuple[int, ...], ceil: bool
) -> tuple[g.Window, tuple[int, ...]]:
    rank = len(kernel)
    strides = tuple(attr_ints(node, "strides") or [1] * rank)
    dilations = tuple(attr_ints(node, "dilations") or [1] * rank)
    pads = attr_ints(node, "pads") or [0] * (2 * rank)
    auto_pad = attr_str(node, "auto_pad", "NOTSET")
    begin, end, out = [], [], []
    for i in range(rank):
        extent = (kernel[i] - 1) * dilations[i] + 1
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            size = -(-spatial_in[i] // strides[i])
            total = max(0, (size - 1) * strides[i] + extent - spatial_in[i])
            head = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
            begin.append(head)
            end.append(total - head)
            out.append(size)
            continue
        b, e = (0, 0) if auto_pad == "VALID" else (pads[i], pads[i + rank])
        span = spatial_in[i] + b + e - extent
        if ceil:
            size = -(-span // strides[i]) + 1
            # The last window must start inside the input or the leading pad (as onnxruntime).
            if (size - 1) * strides[i] >= spatial_in[i] + b:
                size -= 1
        else:
            size = span // strides[i] + 1
        begin.append(b)
        end.append(e)
        out.append(size)
    if min(out) < 1:
        raise LoweringError(f"output spatial size {out} is empty")
    return g.Window(tuple(kernel), strides, tuple(begin), tuple(end), dilations), tuple(out)


def _split_layout(x: g.Tensor, native: bool) -> tuple[int, int, tuple[int, ...]]:
    """(N, C, spatial) of a layout-sensitive op's input in either form."""
    if native:
        return x.shape[0], x.shape[-1], x.shape[1:-1]
    return x.shape[0], x.shape[1], x.shape[2:]


def _join_layout(n: int, c: int, spatial: tuple[int, ...], native: bool) -> tuple[int, ...]:
    return (n, *spatial, c) if native else (n, c, *spatial)


def _per_channel(lw: _Lowerer, values: np.ndarray, rank: int, native: bool) -> g.Tensor:
    shape = (len(values),) if native else (len(values), *([1] * (rank - 2)))
    return lw.const(values.reshape(shape))


def _conv(lw: _Lowerer, node: ir.Node) -> None:
    native = node.domain == NHWC_DOMAIN
    x = lw.tensor(node.inputs[0])
    w = lw.tensor(node.inputs[1])
    assert w.const is not None
    weight = w.const.astype(np.float32)
    if not native:  # OIHW -> OHWI
        weight = np.moveaxis(weight, 1, -1)
    n, c, spatial = _split_layout(x, native)
    group = attr_int(node, "group", 1)
    m, cg = weight.shape[0], weight.shape[-1]
    if c != cg * group or m % group:
        raise LoweringError(f"channels {c} do not match weight {w.shape} with group={group}")
    window, out_spatial = _window(node, spatial, tuple(weight.shape[1:-1]), ceil=False)
    out = lw.new(_join_layout(n, m, out_spatial, native))
    lw.ops.append(g.Conv([x], out, weight=np.ascontiguousarray(weight), group=group, window=window, native_nhwc=native))
    bias = present(node, 2)
    if bias is not None:
        b = lw.tensor(bias)
        assert b.const is not None
        out = lw.elementwise("add", [out, _per_channel(lw, b.const.astype(np.float32), len(out.shape), native)])
    lw.bind(node.outputs[0], out)


def _pool(lw: _Lowerer, node: ir.Node) -> None:
    native = node.domain == NHWC_DOMAIN
    x = lw.tensor(node.inputs[0])
    n, c, spatial = _split_layout(x, native)
    kernel = tuple(attr_ints(node, "kernel_shape") or [])
    ceil = attr_int(node, "ceil_mode", 0) != 0
    window, out_spatial = _window(node, spatial, kernel, ceil)
    out = lw.new(_join_layout(n, c, out_spatial, native))
    kind = "max" if node.op_type == "MaxPool" else "avg"
    include = attr_int(node, "count_include_pad", 0) != 0
    lw.ops.append(g.Pool([x], out, kind=kind, window=window, count_include_pad=include, native_nhwc=native))
    lw.bind(node.outputs[0], out)


def _global_pool(lw: _Lowerer, node: ir.Node) -> None:
    native = node.domain == NHWC_DOMAIN
    x = lw.tensor(node.inputs[0])
    n, c, spatial = _split_layout(x, native)
    out = lw.new(_join_layout(n, c, tuple(1 for _ in spatial), native))
    lw.ops.append(g.GlobalAveragePool([x], out, native_nhwc=native))
    lw.bind(node.outputs[0], out)


def _batchnorm(lw: _Lowerer, node: ir.Node) -> None:
    native = node.domain == NHWC_DOMAIN
    x = lw.tensor(node.inputs[0])
    scale, bias, mean, var = (lw.tensor(node.inputs[i]).const for i in range(1, 5))
    eps = attr_float(node, "epsilon", 1e-5)
    assert scale is not None and bias is not None and mean is not None and var is not None
    s = scale.astype(np.float64) / np.sqrt(var.astype(np.float64) + eps)
    t = bias.astype(np.float64) - mean.astype(np.float64) * s
    rank = len(x.shape)
    y = lw.elementwise("mul", [x, _per_channel(lw, s.astype(np.float32), rank, native)])
    y = lw.elementwise("add", [y, _per_channel(lw, t.astype(np.float32), rank, native)])
    lw.bind(node.outputs[0], y)


def _gemm(lw: _Lowerer, node: ir.Node) -> None:
    a, b = lw.tensor(node.inputs[0]), lw.tensor(node.inputs[1])
    trans_a, trans_b = attr_int(node, "transA", 0) != 0, attr_int(node, "transB", 0) != 0
    rows = a.shape[1] if trans_a else a.shape[0]
    cols = b.shape[0] if trans_b else b.shape[1]
    out = lw.new((rows, cols))
    lw.ops.append(g.MatMul([a, b], out, trans_a=trans_a, trans_b=trans_b))
    alpha, beta = attr_float(node, "alpha", 1.0), attr_float(node, "beta", 1.0)
    if alpha != 1.0:
        out = lw.elementwise("mul", [out, lw.const(np.float32(alpha))])
    c_value = present(node, 2)
    if c_value is not None and beta != 0.0:
        c = lw.tensor(c_value)
        if c.const is not None:
            c = lw.const(c.const.astype(np.float32) * np.float32(beta))
        elif beta != 1.0:
            c = lw.elementwise("mul", [c, lw.const(np.float32(beta))])
        out = lw.elementwise("add", [out, c])
    lw.bind(node.outputs[0], out)


def _matmul(lw: _Lowerer, node: ir.Node) -> None:
    a, b = lw.tensor(node.inputs[0]), lw.tensor(node.inputs[1])
    a2 = lw.view(a, (1, a.shape[0])) if len(a.shape) == 1 else a
    b2 = lw.view(b, (b.shape[0], 1)) if len(b.shape) == 1 else b
    if a2.shape[-1] != b2.shape[-2]:
        raise LoweringError(f"inner dimensions differ: {a.shape} @ {b.shape}")
    batch = np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
    out = lw.new((*batch, a2.shape[-2], b2.shape[-1]))
    lw.ops.append(g.MatMul([a2, b2], out))
    shape = out.shape
    if len(a.shape) == 1:
        shape = shape[:-2] + shape[-1:]
    if len(b.shape) == 1:
        shape = shape[:-1]
    lw.bind(node.outputs[0], out if shape == out.shape else lw.view(out, shape))


_BINARY_KIND = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Pow": "pow", "PRelu": "prelu"}


def _binary(lw: _Lowerer, node: ir.Node) -> None:
    inputs = [lw.tensor(node.inputs[0]), lw.tensor(node.inputs[1])]
    kind = _BINARY_KIND[node.op_type]
    x, slope = inputs
    if kind == "prelu" and opset_of(node) < 7 and len(x.shape) > 2 and slope.shape == (x.shape[1],):
        # opset < 7 PRelu: a [C] slope is per channel (axis 1), not numpy-broadcast on the last axis
        inputs[1] = lw.view(slope, (x.shape[1], *([1] * (len(x.shape) - 2))))
    if kind == "pow" and inputs[1].const is not None and inputs[1].size == 1:
        exponent = float(inputs[1].const.reshape(-1)[0])
        if exponent in (1.0, 2.0, 3.0, 0.5):  # exact shortcuts (powf is slow and these are common)
            shape = np.broadcast_shapes(inputs[0].shape, inputs[1].shape)
            y = lw.elementwise("powc", [inputs[0]], (exponent,))
            lw.bind(node.outputs[0], y if y.shape == shape else _broadcast_to(lw, y, shape))
            return
    lw.bind(node.outputs[0], lw.elementwise(kind, inputs))


def _broadcast_to(lw: _Lowerer, x: g.Tensor, shape: tuple[int, ...]) -> g.Tensor:
    return lw.elementwise("add", [x, lw.const(np.zeros(shape, np.float32))])


def _sum(lw: _Lowerer, node: ir.Node) -> None:
    """Sum, Max and Min: a chain of the binary op."""
    inputs = [lw.tensor(v) for v in node.inputs if v is not None]
    kind = {"Sum": "add", "Max": "max", "Min": "min"}[node.op_type]
    y = inputs[0]
    for other in inputs[1:]:
        y = lw.elementwise(kind, [y, other])
    if len(inputs) == 1:
        y = lw.view(y, y.shape)
    lw.bind(node.outputs[0], y)


def _unary(lw: _Lowerer, node: ir.Node) -> None:
    x = lw.tensor(node.inputs[0])
    op = node.op_type
    params: tuple[float, ...] = ()
    kind = op.lower()
    if op == "LeakyRelu":
        params = (attr_float(node, "alpha", 0.01),)
    elif op == "Elu":
        params = (attr_float(node, "alpha", 1.0),)
    elif op == "Selu":
        params = (attr_float(node, "alpha", 1.6732632423543772), attr_float(node, "gamma", 1.0507009873554805))
    elif op == "HardSigmoid":
        params = (attr_float(node, "alpha", 0.2), attr_float(node, "beta", 0.5))
    elif op == "Gelu":
        kind = "gelu_tanh" if attr_str(node, "approximate", "none") == "tanh" else "gelu"
    elif op == "Clip":
        params = _clip_bounds(lw, node)
    lw.bind(node.outputs[0], lw.elementwise(kind, [x], params))


def _clip_bounds(lw: _Lowerer, node: ir.Node) -> tuple[float, float]:
    if opset_of(node) < 11:
        return attr_float(node, "min", -math.inf), attr_float(node, "max", math.inf)
    bounds = []
    for index, default in ((1, -math.inf), (2, math.inf)):
        value = present(node, index)
        if value is None or value.const_value is None:
            bounds.append(default)
        else:
            bounds.append(float(np.asarray(value.const_value.numpy()).reshape(-1)[0]))
    return bounds[0], bounds[1]


def _softmax(lw: _Lowerer, node: ir.Node) -> None:
    x = lw.tensor(node.inputs[0])
    rank = len(x.shape)
    if opset_of(node) < 13:
        axis = attr_int(node, "axis", 1) % max(rank, 1)
        outer, n, inner = math.prod(x.shape[:axis]), math.prod(x.shape[axis:]), 1
    else:
        axis = attr_int(node, "axis", -1) % max(rank, 1)
        outer, n, inner = math.prod(x.shape[:axis]), x.shape[axis], math.prod(x.shape[axis + 1 :])
    out = lw.new(x.shape)
    lw.ops.append(g.Softmax([x], out, outer=outer, n=n, inner=inner, log=node.op_type == "LogSoftmax"))
    lw.bind(node.outputs[0], out)


def _layernorm(lw: _Lowerer, node: ir.Node) -> None:
    """Rows ``[outer, n]`` with ``n`` the product of the axes from ``axis`` on; scale and bias folded to ``n``."""
    x = lw.tensor(node.inputs[0])
    rank = len(x.shape)
    axis = attr_int(node, "axis", -1)
    if not -rank <= axis < rank:
        raise LoweringError(f"axis={axis} is out of range for rank {rank}")
    axis %= rank
    normalized = x.shape[axis:]
    params: list[np.ndarray | None] = []
    for index in (1, 2):
        value = present(node, index)
        if value is None:
            params.append(None)
            continue
        const = lw.tensor(value).const
        if const is None:
            raise LoweringError(f"input {index} must be a constant")
        try:
            params.append(np.broadcast_to(np.asarray(const, np.float32), normalized).reshape(-1))
        except ValueError:
            raise LoweringError(f"input {index} of shape {const.shape} does not broadcast to {normalized}") from None
    assert params[0] is not None
    out = lw.new(x.shape)
    lw.ops.append(g.LayerNorm([x], out, outer=math.prod(x.shape[:axis]), n=math.prod(normalized),
                              epsilon=attr_float(node, "epsilon", 1e-5), scale=params[0], bias=params[1]))
    lw.bind(node.outputs[0], out)


def _axes(lw: _Lowerer, node: ir.Node, input_from: int) -> list[int] | None:
    if opset_of(node) < input_from:
        return attr_ints(node, "axes")
    value = present(node, 1)
    if value is None or value.const_value is None:
        return None
    return [int(a) for a in np.asarray(value.const_value.numpy()).reshape(-1)]


def _reduce_mean(lw: _Lowerer, node: ir.Node) -> None:
    """ReduceMean and ReduceSum (axes became an input at opset 18 and 13 respectively)."""
    x = lw.tensor(node.inputs[0])
    rank = len(x.shape)
    mean = node.op_type == "ReduceMean"
    axes = _axes(lw, node, 18 if mean else 13)
    if not axes:
        if attr_int(node, "noop_with_empty_axes", 0):
            lw.bind(node.outputs[0], lw.view(x, x.shape))
            return
        axes = list(range(rank))
    norm = tuple(sorted({a % rank for a in axes}))
    keep = attr_int(node, "keepdims", 1) != 0
    full = tuple(1 if i in norm else d for i, d in enumerate(x.shape))
    out = lw.new(full)
    lw.ops.append(g.ReduceMean([x], out, axes=norm, mean=mean))
    if not keep:
        out = lw.view(out, tuple(d for i, d in enumerate(x.shape) if i not in norm))
    lw.bind(node.outputs[0], out)


def _lrn(lw: _Lowerer, node: ir.Node) -> None:
    x = lw.tensor(node.inputs[0])
    out = lw.new(x.shape)
    lw.ops.append(g.Lrn([x], out, size=attr_int(node, "size", 1), alpha=attr_float(node, "alpha", 1e-4),
                        beta=attr_float(node, "beta", 0.75), bias=attr_float(node, "bias", 1.0)))
    lw.bind(node.outputs[0], out)


def _concat(lw: _Lowerer, node: ir.Node) -> None:
    inputs = [lw.tensor(v) for v in node.inputs if v is not None]
    rank = len(inputs[0].shape)
    axis = attr_int(node, "axis", 1) % rank
    inputs = [t for t in inputs if t.shape[axis] != 0]
    if all(t.const is not None for t in inputs):
        lw.bind(node.outputs[0], lw.const(np.concatenate([t.const for t in inputs], axis=axis)))  # type: ignore[misc]
        return
    shape = list(inputs[0].shape)
    shape[axis] = sum(t.shape[axis] for t in inputs)
    out = lw.new(tuple(shape))
    lw.ops.append(g.Concat(inputs, out, axis=axis))
    lw.bind(node.outputs[0], out)


def _reshape(lw: _Lowerer, node: ir.Node) -> None:
    x = lw.tensor(node.inputs[0])
    shape_input = lw.tensor(node.inputs[1]).const
    if shape_input is None:
        raise LoweringError("the shape is not known at compile time")
    target = [int(d) for d in shape_input.reshape(-1)]
    if attr_int(node, "allowzero", 0) and 0 in target:
        raise LoweringError("allowzero=1 with a 0 in the shape (an empty tensor) is not supported")
    shape = [x.shape[i] if d == 0 else d for i, d in enumerate(target)]
    if -1 in shape:
        known = math.prod(d for d in shape if d != -1)
        shape[shape.index(-1)] = x.size // known if known else 0
    lw.bind(node.outputs[0], lw.view(x, tuple(shape)))


def _flatten(lw: _Lowerer, node: ir.Node) -> None:
    x = lw.tensor(node.inputs[0])
    axis = attr_int(node, "axis", 1) % (len(x.shape) + 1)
    lw.bind(node.outputs[0], lw.view(x, (math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))))


def _squeeze(lw: _Lowerer, node: ir.Node) -> None:
    x = lw.tensor(node.inputs[0])
    axes = _axes(lw, node, 13)
    rank = len(x.shape)
    drop = {a % rank for a in axes} if axes else {i for i, d in enumerate(x.shape) if d == 1}
    lw.bind(node.outputs[0], lw.view(x, tuple(d for i, d in enumerate(x.shape) if i not in drop)))


def _unsqueeze(lw: _Lowerer, node: ir.Node) -> None:
    x = lw.tensor(node.inputs[0])
    axes = _axes(lw, node, 13) or []
    rank = len(x.shape) + len(axes)
    insert = {a % rank for a in axes}
    dims = iter(x.shape)
    lw.bind(node.outputs[0], lw.view(x, tuple(1 if i in insert else next(dims) for i in range(rank))))


def _constant(lw: _Lowerer, node: ir.Node) -> None:
    for name in ("value", "value_float", "value_floats"):
        attr = node.attributes.get(name)
        if attr is None:
            continue
        if name == "value":
            array = np.asarray(attr.as_tensor().numpy())
            if array.dtype != np.float32:  # shape arithmetic: kept as it is
                lw.bind(node.outputs[0], lw.folded(array))
                return
        elif name == "value_float":
            array = np.asarray(attr.as_float(), np.float32)
        else:
            array = np.asarray(attr.as_floats(), np.float32)
        lw.bind(node.outputs[0], lw.const(array))
        return
    raise LoweringError("no float value attribute")


def _const_ints(node: ir.Node, index: int) -> list[int] | None:
    value = present(node, index)
    if value is None or value.const_value is None:
        return None
    return [int(v) for v in np.asarray(value.const_value.numpy()).reshape(-1)]


def _slice_op(lw: _Lowerer, x: g.Tensor, bounds: dict[int, tuple[int, int, int]]) -> g.Tensor:
    """``x`` sliced on some axes: axis -> (start, end, step) with numpy semantics."""
    starts, steps, shape = [], [], []
    for axis, dim in enumerate(x.shape):
        start, end, step = bounds.get(axis, (0, dim, 1))
        chosen = range(*slice(start, end, step).indices(dim))
        starts.append(chosen.start if len(chosen) else 0)
        steps.append(step)
        shape.append(len(chosen))
    if x.const is not None:
        index = tuple(slice(*slice(*bounds.get(a, (0, d, 1))).indices(d)) for a, d in enumerate(x.shape))
        return lw.const(x.const[index])
    out = lw.new(tuple(shape))
    lw.ops.append(g.Slice([x], out, starts=tuple(starts), steps=tuple(steps)))
    return out


def _slice(lw: _Lowerer, node: ir.Node) -> None:
    x = lw.tensor(node.inputs[0])
    rank = len(x.shape)
    if opset_of(node) < 10:
        starts, ends = attr_ints(node, "starts") or [], attr_ints(node, "ends") or []
        axes, steps = attr_ints(node, "axes"), None
    else:
        starts, ends = _const_ints(node, 1) or [], _const_ints(node, 2) or []
        axes, steps = _const_ints(node, 3), _const_ints(node, 4)
    axes = axes if axes is not None else list(range(len(starts)))
    steps = steps if steps is not None else [1] * len(starts)
    bounds = {a % rank: (b, e, st) for a, b, e, st in zip(axes, starts, ends, steps, strict=True)}
    lw.bind(node.outputs[0], _slice_op(lw, x, bounds))


def _split(lw: _Lowerer, node: ir.Node) -> None:
    x = lw.tensor(node.inputs[0])
    axis = attr_int(node, "axis", 0) % len(x.shape)
    sizes = attr_ints(node, "split") if opset_of(node) < 13 else _const_ints(node, 1)
    count = len(node.outputs)
    if not sizes:
        chunk = -(-x.shape[axis] // count)
        sizes = [min(chunk, x.shape[axis] - i * chunk) for i in range(count)]
    start = 0
    for value, size in zip(node.outputs, sizes, strict=True):
        lw.bind(value, _slice_op(lw, x, {axis: (start, start + size, 1)}))
        start += size


def _pad(lw: _Lowerer, node: ir.Node) -> None:
    x = lw.tensor(node.inputs[0])
    rank = len(x.shape)
    if opset_of(node) < 11:
        pads, value = attr_ints(node, "pads") or [0] * (2 * rank), attr_float(node, "value", 0.0)
    else:
        pads = _const_ints(node, 1) or [0] * (2 * rank)
        fill = present(node, 2)
        value = 0.0 if fill is None or fill.const_value is None else float(fill.const_value.numpy().reshape(-1)[0])
    begins, ends = pads[:rank], pads[rank:]
    shape = tuple(d + b + e for d, b, e in zip(x.shape, begins, ends, strict=True))
    out = lw.new(shape)
    lw.ops.append(g.Pad([x], out, begins=tuple(begins), value=value))
    lw.bind(node.outputs[0], out)


def _identity(lw: _Lowerer, node: ir.Node) -> None:
    x = lw.tensor(node.inputs[0])
    lw.bind(node.outputs[0], lw.view(x, x.shape))


def _transpose(lw: _Lowerer, node: ir.Node) -> None:
    x = lw.tensor(node.inputs[0])
    perm = tuple(attr_ints(node, "perm") or reversed(range(len(x.shape))))
    if x.const is not None:
        lw.bind(node.outputs[0], lw.const(np.transpose(x.const, perm)))
        return
    out = lw.new(tuple(x.shape[p] for p in perm))
    lw.ops.append(g.Transpose([x], out, perm=perm))
    lw.bind(node.outputs[0], out)


def _compile_time(lw: _Lowerer, value: ir.Value | None, what: str) -> np.ndarray:
    const = lw.tensor(value).const
    if const is None:
        raise LoweringError(f"the {what} is not known at compile time")
    return const


def _gather(lw: _Lowerer, node: ir.Node) -> None:
    """Gather with indices known at compile time: one slice per index, concatenated."""
    x = lw.tensor(node.inputs[0])
    indices = _compile_time(lw, node.inputs[1], "indices").astype(np.int64)
    rank = len(x.shape)
    axis = attr_int(node, "axis", 0) % rank
    dim = x.shape[axis]
    flat = [int(i) + dim if i < 0 else int(i) for i in indices.reshape(-1)]
    if any(not 0 <= i < dim for i in flat):
        raise LoweringError(f"indices {indices.reshape(-1).tolist()} are out of range for axis {axis} of size {dim}")
    if len(flat) > _MAX_GATHER_INDICES:
        raise LoweringError(f"{len(flat)} indices (at most {_MAX_GATHER_INDICES} are taken as slices)")
    parts = [_slice_op(lw, x, {axis: (i, i + 1, 1)}) for i in flat]
    y = parts[0]
    if len(parts) > 1:
        shape = list(x.shape)
        shape[axis] = len(parts)
        y = lw.new(tuple(shape))
        lw.ops.append(g.Concat(parts, y, axis=axis))
    lw.bind(node.outputs[0], lw.view(y, (*x.shape[:axis], *indices.shape, *x.shape[axis + 1 :])))


_MAX_GATHER_INDICES = 64


def _where(lw: _Lowerer, node: ir.Node) -> None:
    condition = _compile_time(lw, node.inputs[0], "condition")
    x, y = lw.tensor(node.inputs[1]), lw.tensor(node.inputs[2])
    mask = lw.const(condition.astype(np.float32))
    lw.bind(node.outputs[0], lw.elementwise("where", [mask, x, y]))


def _expand(lw: _Lowerer, node: ir.Node) -> None:
    x = lw.tensor(node.inputs[0])
    target = tuple(int(d) for d in _compile_time(lw, node.inputs[1], "shape").reshape(-1))
    try:
        shape = np.broadcast_shapes(x.shape, target)
    except ValueError:
        raise LoweringError(f"shape {x.shape} does not expand to {target}") from None
    lw.bind(node.outputs[0], lw.view(x, x.shape) if shape == x.shape else _broadcast_to(lw, x, shape))


def _cast(lw: _Lowerer, node: ir.Node) -> None:
    x = lw.tensor(node.inputs[0])  # float32 to float32: the data is unchanged
    lw.bind(node.outputs[0], lw.view(x, x.shape))


_LOWERINGS: dict[str, Callable[[_Lowerer, ir.Node], None]] = {
    "Gather": _gather,
    "Where": _where,
    "Expand": _expand,
    "Cast": _cast,
    "Conv": _conv,
    "MaxPool": _pool,
    "AveragePool": _pool,
    "GlobalAveragePool": _global_pool,
    "BatchNormalization": _batchnorm,
    "Gemm": _gemm,
    "MatMul": _matmul,
    "Sum": _sum,
    "Max": _sum,
    "Min": _sum,
    "Constant": _constant,
    "Slice": _slice,
    "Split": _split,
    "Pad": _pad,
    "LogSoftmax": _softmax,
    "ReduceSum": _reduce_mean,
    "Softmax": _softmax,
    "ReduceMean": _reduce_mean,
    "LayerNormalization": _layernorm,
    "Concat": _concat,
    "LRN": _lrn,
    "Reshape": _reshape,
    "Flatten": _flatten,
    "Squeeze": _squeeze,
    "Unsqueeze": _unsqueeze,
    "Identity": _identity,
    "Dropout": _identity,
    "Transpose": _transpose,
    **{op: _binary for op in _BINARY_KIND},
    **{
        op: _unary
        for op in ("Relu", "LeakyRelu", "Sigmoid", "Tanh", "Clip", "HardSigmoid", "HardSwish", "Erf", "Gelu", "Exp",
                   "Sqrt", "Neg", "Abs", "Reciprocal", "Elu", "Selu", "Softplus")
    },
}
