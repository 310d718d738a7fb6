"""Which nodes the C backend takes, decided from the node alone, with the reason when not.

NOTE: the checks look only at what a node carries (its attributes, the dtype and rank of
its values, and which inputs are constants), never at neighbours: the partitioner may put
any supported node in any partition.  Shapes may still be symbolic here; the backend
compiles per concrete shape later, so only ranks matter.  Each op's own check is in its
family's entry of the op table (``ops/``); the checks every op shares are here.
"""

from __future__ import annotations

import onnx_ir as ir

from codegraft.backend import Support
from codegraft.backends.c._node import CONTRIB_DOMAIN, FOLDABLE, ML_DOMAIN, NHWC_DOMAIN, SHAPE_OPS, compile_time
from codegraft.backends.c.ops import ONNX_OPS
from codegraft.backends.c.ops._spec import FLOATS, INTEGER_DTYPES


def supports(node: ir.Node) -> Support:
    """Yes, or ``"<op>: <reason>"``."""
    op = node.op_type
    entry = ONNX_OPS.get(op)
    if node.domain == NHWC_DOMAIN:
        if entry is None or not entry.nhwc:
            return Support.no(f"{op}: not implemented in the {NHWC_DOMAIN} domain")
    elif node.domain == CONTRIB_DOMAIN:
        if entry is None or not entry.contrib:
            return Support.no(f"{op}: not implemented in the {CONTRIB_DOMAIN} domain")
    elif node.domain == ML_DOMAIN:
        if entry is None or not entry.ml:
            return Support.no(f"{op}: not implemented in the {ML_DOMAIN} domain")
    elif node.domain not in ("", "ai.onnx"):
        return Support.no(f"{op}: domain {node.domain!r} is not supported")
    elif entry is not None and entry.ml:
        return Support.no(f"{op}: an op of the {ML_DOMAIN} domain, not of the default one")
    elif op in SHAPE_OPS or (op in FOLDABLE and all(compile_time(v) for v in node.inputs)):
        return Support.yes()  # folded to a constant at compile time, whatever its dtype
    if entry is None:
        return Support.no(f"{op}: not implemented by the C backend")
    reason = float_data(node) or _empty(node) or entry.check(node)
    return Support.no(f"{op}: {reason}") if reason else Support.yes()


def _empty(node: ir.Node) -> str:
    """Kernels index by sizes and divide by them: an empty tensor goes to the host instead.

    Shape, axes and flag inputs (the op's ``non_data``) are read at compile time, not by a
    kernel: Resize's unused ``roi`` is an empty constant in most exported models.
    """
    entry = ONNX_OPS.get(node.op_type)
    skip = entry.non_data if entry is not None else _NO_INPUTS
    for values, skipped in ((node.inputs, skip), (node.outputs, _NO_INPUTS)):
        for index, value in enumerate(values):
            if value is None or index in skipped:
                continue
            shape = value.shape
            # (a symbolic dimension never equals 0)
            if shape is not None and 0 in shape.dims:
                return f"{value.name!r} is empty (shape {list(shape)}); empty tensors run on the host"
    return ""


_BOOL = ir.DataType.BOOL
_NO_INPUTS: frozenset[int] = frozenset()


# What a partition's entry converts to float32 exactly as ONNX's Cast does (an int64 beyond
# 2**24 rounds as Cast rounds it): the values an op's ``converted`` inputs may hold.
CONVERTED_DTYPES = frozenset({
    ir.DataType.BOOL, ir.DataType.INT8, ir.DataType.UINT8, ir.DataType.INT16, ir.DataType.UINT16,
    ir.DataType.INT32, ir.DataType.UINT32, ir.DataType.INT64, ir.DataType.UINT64,
})  # fmt: skip
# integer types float32 does not hold every value of
WIDE_INTEGERS = frozenset({ir.DataType.INT32, ir.DataType.INT64, ir.DataType.UINT32, ir.DataType.UINT64})


def float_data(node: ir.Node) -> str:
    """Why a data input or a used output of ``node`` is not float32 (or float16), or ``""`` (shape/axes inputs are
    skipped, a ``converted`` input may be bool or an integer, and an op that only moves data
    may move bool or integer data, a constant one only with integers float32 holds exactly)."""
    entry = ONNX_OPS.get(node.op_type)
    skip = entry.non_data if entry is not None else _NO_INPUTS
    converted = entry.converted if entry is not None else _NO_INPUTS
    moves_data = entry is not None and entry.moves_data
    arithmetic = entry is not None and entry.integer_arithmetic
    for index, value in enumerate(node.inputs):
        if value is None or index in skip:
            continue
        dtype = value.dtype
        if dtype is None or dtype in FLOATS:
            continue
        integers = arithmetic and dtype in INTEGER_DTYPES
        if not (index in converted or moves_data or integers) or dtype not in CONVERTED_DTYPES:
            return f"input {index} is {dtype.name.lower()}, only float32 and float16 are supported"
        if (moves_data or integers) and index not in converted and not held_exactly(value):
            return f"input {index} holds integers beyond 2**24, which float32 cannot hold exactly"
    bool_output = entry is not None and entry.bool_output
    integer_output = moves_data or (entry is not None and entry.index_output)
    for index, value in enumerate(node.outputs):
        dtype = value.dtype
        if dtype is None or dtype in FLOATS or not value.uses():
            continue
        if not ((bool_output and dtype == _BOOL) or (integer_output and dtype in CONVERTED_DTYPES)
                or (arithmetic and dtype in INTEGER_DTYPES)):
            return f"output {index} is {dtype.name.lower()}, only float32 and float16 are supported"
    return ""


EXACT_INTEGERS = 1 << 24  # float32 holds every integer of at most this magnitude


def held_exactly(value: ir.Value) -> bool:
    """Whether float32 holds ``value`` exactly as far as is known now: a computed value is
    checked at run time (``Program.exact_inputs``), a constant here."""
    const = value.const_value
    if const is None or value.dtype not in WIDE_INTEGERS:
        return True
    array = const.numpy()
    return not array.size or (int(array.max()) <= EXACT_INTEGERS and int(array.min()) >= -EXACT_INTEGERS)
