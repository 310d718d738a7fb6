"""Translating an ONNX partition (onnx-ir) into the backend's typed ops, with concrete shapes.

(Named apart from :mod:`codegraft.lower`, which lowers a partition onto any backend.)

NOTE: each node is either folded now (shape arithmetic and ops on constants only, evaluated
by onnx's reference evaluator) or lowered by its entry in the op table (``ops/``): Gemm is
a MatMul plus elementwise epilogue ops, Conv's bias is an Add, BatchNormalization a Mul
and an Add by per-channel constants, Sum a chain of Adds, Reshape-like ops views.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from codegraft.backends.c import _graph as g
from codegraft.backends.c._lowerer import Lowerer, LoweringError
from codegraft.backends.c._node import FOLDABLE, SHAPE_OPS, attr_int, opset_of
from codegraft.backends.c._support import float_data
from codegraft.backends.c.ops import ONNX_OPS

__all__ = ["LoweringError", "translate"]


def translate(model: ir.Model, features: frozenset[str] = frozenset()) -> g.Graph:
    """Lower a partition with concrete input shapes for a target with CPU ``features``; raise
    :class:`LoweringError` if unable."""
    lowerer = Lowerer(features)
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
        entry = ONNX_OPS.get(node.op_type)
        if entry is None:
            raise LoweringError(f"{node.op_type} ({node.name}) is not supported")
        # Shape arithmetic is taken whatever its dtype because it folds; cut from its shapes by
        # the partitioner (its operands now this partition's inputs) it would run on floats.
        not_float = float_data(node)
        if not_float:
            raise LoweringError(f"{node.op_type} ({node.name}): {not_float} (not a constant in this partition)")
        made = len(lowerer.ops)
        try:
            entry.lower(lowerer, node)
        except LoweringError as error:
            raise LoweringError(f"{node.op_type} ({node.name}): {error}") from None
        for op in lowerer.ops[made:]:
            op.out.origin = op.out.origin or node.name or ""
    outputs = [lowerer.tensor(v) for v in model.graph.outputs]
    for value, tensor in zip(model.graph.outputs, outputs, strict=True):
        if tensor.const is not None and tensor.const.dtype != np.float32:
            raise LoweringError(f"output {value.name!r} is a {tensor.const.dtype} constant; outputs are float32")
    return g.Graph(inputs, outputs, lowerer.ops)


def _fold(lw: Lowerer, node: ir.Node) -> bool:
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
        with np.errstate(all="ignore"):  # log(0) = -inf, as ONNX computes it: no warning
            results = ReferenceEvaluator(model).run(None, {n: a for n, a in zip(names, arrays, strict=True) if n})
    except Exception as error:
        raise LoweringError(f"cannot evaluate it at compile time: {type(error).__name__}: {error}") from None
    return [np.asarray(r) for r in results]
