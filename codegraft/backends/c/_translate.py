"""Translating an ONNX partition (onnx-ir) into the backend's typed ops, with concrete shapes.

(Named apart from :mod:`codegraft.lower`, which lowers a partition onto any backend.)

NOTE: each node is either folded now (shape arithmetic and ops on constants only, evaluated
by onnx's reference evaluator) or lowered by its entry in the op table (``ops/``): Gemm is
a MatMul plus elementwise epilogue ops, Conv's bias is an Add, BatchNormalization a Mul
and an Add by per-channel constants, Sum a chain of Adds, Reshape-like ops views.

Empty tensors (a dimension of 0, as a NonZero that found nothing hands on) hold no data, so
they are constants: an empty input is bound to one, a node whose outputs are all empty is
computed by nothing (its outputs are empty constants), and a node reading only constants and
empties folds whatever its op, so a ReduceSum or Pad of nothing gets the spec's value.  What
reads an empty tensor beside data (a Concat, a Scatter of no updates) skips it in its
lowering.  No kernel ever sees an empty tensor: the kernels divide work by sizes.
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
        lowerer.bind(value, _empty_constant(value) if 0 in tensor.shape else tensor)
        inputs.append(tensor)
    for node in model.graph:
        try:
            if _fold(lowerer, node) or _computes_nothing(lowerer, node):
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
        _drop_empty_results(lowerer, node, made)
    outputs = [lowerer.tensor(v) for v in model.graph.outputs]
    for index, (value, tensor) in enumerate(zip(model.graph.outputs, outputs, strict=True)):
        if tensor.const is not None and tensor.const.size == 0:  # no data: its type is the runtime's to give
            outputs[index] = g.Tensor(tensor.name, tensor.shape, const=np.zeros(tensor.shape, np.float32))
        elif tensor.const is not None and tensor.const.dtype != np.float32:
            raise LoweringError(f"output {value.name!r} is a {tensor.const.dtype} constant; outputs are float32")
    _drop_unread(lowerer, outputs)
    for op in lowerer.ops:  # what the rules above left empty (a shape inference could not tell)
        empty = next((t for t in (*op.inputs, op.out) if 0 in t.shape), None)
        if empty is not None:
            raise LoweringError(f"{op.out.origin or type(op).__name__} reads or makes an empty tensor "
                                f"(shape {list(empty.shape)}) that its kernel cannot take")
    return g.Graph(inputs, outputs, lowerer.ops)


def _drop_empty_results(lw: Lowerer, node: ir.Node, made: int) -> None:
    """What the lowering found empty that shape inference did not (RivaGAN's Slice of nothing
    into a Concat): the node's empty outputs become empty constants, and its ops making an
    empty tensor, computing nothing, go."""
    for value in node.outputs:
        tensor = lw.values.get(value.name or "")
        if tensor is not None and tensor.const is None and 0 in tensor.shape:
            lw.bind(value, g.Tensor(f"{value.name}:empty", tensor.shape, const=np.zeros(tensor.shape, _dtype(value))))
    lw.ops[made:] = [op for op in lw.ops[made:] if 0 not in op.out.shape]


def _drop_unread(lowerer: Lowerer, outputs: list[g.Tensor]) -> None:
    """Drop the ops (``dropped_unread``) whose results nothing reads: a QDQ Conv taken on 8-bit
    products (``ops/quantize.quantized_conv``) reads its input's 8-bit values, not the
    DequantizeLinear of them lowered before it."""
    read = {id(t) for t in outputs}
    kept: list[g.Op] = []
    for op in reversed(lowerer.ops):
        if op.dropped_unread and id(op.out) not in read:
            continue
        kept.append(op)
        read.update(id(t) for t in op.inputs)
    lowerer.ops[:] = kept[::-1]


def _empty_constant(value: ir.Value) -> g.Tensor:
    shape = tuple(int(d) for d in value.shape)  # type: ignore[union-attr, arg-type]
    return g.Tensor(f"{value.name}:empty", shape, const=np.zeros(shape, _dtype(value)))


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
    inputs = [None if v is None else lw.tensor(v) for v in node.inputs]
    if any(t is not None and t.const is None for t in inputs):
        return False
    # Any op folds when one operand is empty (its values and the rest known): cheap, and no kernel takes it.
    if node.op_type not in FOLDABLE and not any(t is not None and t.const is not None and t.const.size == 0
                                                for t in inputs):
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


def _computes_nothing(lw: Lowerer, node: ir.Node) -> bool:
    """A node whose every output is empty needs no kernel: its outputs are bound to empty constants.

    Shape inference tells most; where it could not (a value specialised after inference), a
    node reading an empty tensor is evaluated on zeros standing in for its other operands: its
    output shapes depend on their shapes only, its inputs read as sizes or axes being known.
    """
    outputs = list(node.outputs)
    if not outputs:
        return False
    shapes = [_concrete(value) for value in outputs]
    if all(shape is not None and 0 in shape for shape in shapes):
        for value in outputs:
            lw.bind(value, _empty_constant(value))
        return True
    inputs = [None if v is None else lw.tensor(v) for v in node.inputs]
    entry = ONNX_OPS.get(node.op_type)
    if node.domain not in ("", "ai.onnx") or entry is None or not any(
        t is not None and t.const is not None and t.const.size == 0 for t in inputs
    ):
        return False
    if any(t is not None and t.const is None and i in entry.non_data for i, t in enumerate(inputs)):
        return False
    stand_ins = [None if t is None else t.const if t.const is not None else np.zeros(t.shape, _dtype(v))
                 for t, v in zip(inputs, node.inputs, strict=True)]  # fmt: skip
    try:
        results = _evaluate(node, stand_ins)
    except LoweringError:
        return False
    if not all(0 in r.shape for r in results):
        return False
    for value, result in zip(outputs, results, strict=True):
        lw.bind(value, lw.folded(result))
    return True


def _concrete(value: ir.Value) -> tuple[int, ...] | None:
    dims = value.shape.dims if value.shape is not None else None
    if dims is None or not all(isinstance(d, int) for d in dims):
        return None
    return tuple(int(d) for d in dims)  # type: ignore[arg-type]


def _dtype(value: ir.Value | None) -> type | np.dtype:
    return value.dtype.numpy() if value is not None and value.dtype is not None else np.float32
