"""Reading an ONNX node: attributes with their defaults, optional inputs, constness, opsets.

NOTE: every op family's check and lowering (``ops/``) reads nodes through these, so "is
this input a constant" or "which opset is this node" has one answer in the backend.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from codegraft.core.attributes import attributes_of

NHWC_DOMAIN = "codegraft.nhwc"
CONTRIB_DOMAIN = "com.microsoft"  # onnxruntime's contrib ops (ops/_spec.OnnxOp.contrib)
ML_DOMAIN = "ai.onnx.ml"  # ONNX's traditional-ML ops, as scikit-learn exports them (ops/_spec.OnnxOp.ml)

# Evaluated at compile time when every input is (ops on shapes and constants: exporters' shape
# arithmetic).  The backend compiles per concrete input shape, so ``Shape`` is always a constant.
# Log, Floor and the like too: T5's relative-position buckets take the log of distances from
# Range over the sequence's length, in a branch its Where drops for short ones (log(0) = -inf,
# cast to int64, offset: beyond 2**24 at run time, a call handed to the host), and the common
# passes fold the same chain at fixed sizes with the same evaluator.
SHAPE_OPS = frozenset({"Shape", "Size"})
FOLDABLE = frozenset(
    {"Gather", "Slice", "Concat", "Squeeze", "Unsqueeze", "Reshape", "Cast", "Add", "Sub", "Mul", "Div", "Mod",
     "Neg", "Abs", "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "Not", "And", "Or", "Where",
     "Expand", "ConstantOfShape", "Range", "Identity", "Min", "Max", "Transpose", "ReduceProd", "ReduceSum",
     "Log", "Exp", "Sqrt", "Pow", "Reciprocal", "Floor", "Ceil", "Round", "Sign", "Split"}
)
# Folded too where their inputs are known, by their own lowering (its arithmetic, onnxruntime's):
# a QDQ model's weights and biases, DequantizeLinear of 8-bit (int32) constants.
FOLDED_WHEN_KNOWN = frozenset({"DequantizeLinear"})


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
    attr = attributes_of(node).get(name)
    return default if attr is None else attr.as_int()


def attr_float(node: ir.Node, name: str, default: float) -> float:
    attr = attributes_of(node).get(name)
    return default if attr is None else attr.as_float()


def attr_ints(node: ir.Node, name: str) -> list[int] | None:
    attr = attributes_of(node).get(name)
    return None if attr is None else list(attr.as_ints())


def attr_floats(node: ir.Node, name: str) -> list[float] | None:
    attr = attributes_of(node).get(name)
    return None if attr is None else list(attr.as_floats())


def attr_str(node: ir.Node, name: str, default: str) -> str:
    attr = attributes_of(node).get(name)
    return default if attr is None else attr.as_string()


def attr_strs(node: ir.Node, name: str) -> list[str]:
    attr = attributes_of(node).get(name)
    return [] if attr is None else [v.decode() if isinstance(v, bytes) else str(v) for v in attr.as_strings()]


def present(node: ir.Node, index: int) -> ir.Value | None:
    """Input ``index`` of ``node`` when given (ONNX marks omitted optional inputs by ``""``)."""
    if index < len(node.inputs):
        return node.inputs[index]
    return None


def rank_of(value: ir.Value | None) -> int | None:
    return None if value is None or value.shape is None else len(value.shape)


def input_rank_known(node: ir.Node) -> str:
    """The check of an op that needs only its first input's rank: ``""``, or why not."""
    return "" if rank_of(node.inputs[0] if node.inputs else None) is not None else "the input rank is unknown"


def is_constant(value: ir.Value | None) -> bool:
    """A constant initializer (one that is also a graph input is only a default the caller may override)."""
    return value is not None and value.const_value is not None and not value.is_graph_input()


def const_ints(node: ir.Node, index: int) -> list[int] | None:
    """Input ``index`` as a flat list of ints, when it is given and constant."""
    value = present(node, index)
    if value is None or value.const_value is None:
        return None
    return [int(v) for v in np.asarray(value.const_value.numpy()).reshape(-1)]


def axes_of(node: ir.Node, input_from: int) -> list[int] | None:
    """The ``axes`` of a reduce/squeeze-like node: an attribute before opset ``input_from``, input 1 since."""
    if opset_of(node) < input_from:
        return attr_ints(node, "axes")
    return const_ints(node, 1)


def compile_time(value: ir.Value | None, _seen: dict[int, bool] | None = None) -> bool:
    """Whether ``value`` is known when the partition is compiled: a constant, or computed from
    shapes and constants only.

    NOTE: this looks at producers, not only at the node: a partition holding the consumer but
    not the producers fails to lower and runs on the host instead (logged, in the report).
    """
    if value is None or is_constant(value):
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
            folds = producer.op_type in FOLDABLE or producer.op_type in FOLDED_WHEN_KNOWN
            seen[key] = folds and all(compile_time(v, seen) for v in producer.inputs)
    return seen[key]


def known_at_compile_time(index: int, what: str) -> Callable[[ir.Node], str]:
    """A check that input ``index`` (``what``) is a constant or computed from shapes."""

    def check(node: ir.Node) -> str:
        return "" if compile_time(present(node, index)) else f"the {what} must be a constant or computed from shapes"

    return check


def check_axes_input(node: ir.Node) -> str:
    """Squeeze, Unsqueeze and the reductions: the axes input, when given, must be a constant."""
    axes = present(node, 1)
    if axes is not None and not is_constant(axes):
        return "the axes input must be a constant"
    return ""
