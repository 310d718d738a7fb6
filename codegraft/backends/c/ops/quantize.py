"""Quantization: DynamicQuantizeLinear, MatMulInteger and ConvInteger on exact floats; static
quantization's (QDQ) QuantizeLinear, DequantizeLinear and Convs on 8-bit products (QuantConv).

NOTE: onnxruntime's ``quantize_dynamic`` turns each float MatMul (Conv) into
DynamicQuantizeLinear -> MatMulInteger (ConvInteger) -> Cast to float -> Mul by the two
scales.  Here the uint8 and int8 values are held as exact floats, as every integer is
(``_spec.INTEGER_DTYPES``):

- DynamicQuantizeLinear is a :class:`QuantRange` (one pass for the range: onnxruntime's scale
  and zero point) and an elementwise ``quantize_u8`` (onnxruntime's rounding and clamping).
- MatMulInteger of a constant 8-bit weight runs on 8-bit products, its sums in int32, where
  the target has AVX-512 VNNI or AVX2 (:class:`QuantMatMul`, below).  Elsewhere MatMulInteger,
  and ConvInteger, subtract the zero points (the weight's at compile time) and
  run on the float GEMM engine.  A product of two 8-bit values is exact in float32, and so is
  every partial sum below 2**24.  Where ``K * |a - a0| * |b - b0|`` can reach 2**24 the sum is
  rounded once it gets there, as a float MatMul rounds it (relative 6e-8), so the op is then
  taken only where its int32 result is read as a float: by Casts to float, as dynamic
  quantization reads it.  (onnxruntime's own u8s8 kernel on AVX2 without VNNI saturates
  instead: ``bench.corpus.exact_integer_matmuls``.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from codegraft.backends.c import _graph as g
from codegraft.backends.c._c_files import c_file
from codegraft.backends.c._emit import Context
from codegraft.backends.c._fuse import Kernel
from codegraft.backends.c._lowerer import Lowerer
from codegraft.backends.c._node import attr_int, is_constant, present, rank_of
from codegraft.backends.c._toolchain import eight_bit_products
from codegraft.backends.c.ops._qpack import (
    EIGHT_BIT_SPAN,
    QGEMM_COLS,
    QGEMM_DEPTH,
    QGEMM_ROWS,
    QGEMM_RUN,
    as_weight_bytes,
    define_qgemm,
    int8_columns,
    qgemm_packed,
    vnni_packed,
)
from codegraft.backends.c.ops._spec import KernelOp, Layout, OnnxOp, core_of
from codegraft.backends.c.ops.conv import check_conv_geometry, constant_weight_dims, lower_conv
from codegraft.backends.c.ops.data import slice_op
from codegraft.backends.c.ops.elementwise import emit_epilogue
from codegraft.backends.c.ops.matmul import bind_matmul
from codegraft.backends.c.ops.qconv import SCALES, SUMS, QuantMatMul

EXACT_SUMS = 1 << 24  # float32 holds every integer sum of at most this magnitude
_EIGHT_BITS = frozenset({ir.DataType.UINT8, ir.DataType.INT8})


# -- DynamicQuantizeLinear -------------------------------------------------------------------------


@dataclass(eq=False)
class QuantRange(g.Op):
    """DynamicQuantizeLinear's scale and zero point of all of ``inputs[0]``: ``out`` is ``[2]``."""


def _dynamic_quantize(lw: Lowerer, node: ir.Node) -> None:
    x = lw.tensor(node.inputs[0])
    params = lw.new((2,), "qparams")
    lw.ops.append(QuantRange([x], params))
    scale = lw.view(slice_op(lw, params, {0: (0, 1, 1)}), ())
    zero_point = lw.view(slice_op(lw, params, {0: (1, 2, 1)}), ())
    results = (lw.elementwise("quantize_u8", [x, scale, zero_point]), scale, zero_point)
    for value, tensor in zip(node.outputs, results, strict=True):
        if value.name:
            lw.bind(value, tensor)


def emit_quant_range(ctx: Context, kernel: Kernel) -> None:
    op = core_of(kernel, QuantRange)
    assert not kernel.steps, "nothing fuses after a QuantRange"
    fn = ctx.define_once("cg_quant_range", lambda: c_file("ops/quantize.c"))
    ctx.body.append(f"  {fn}({ctx.ptr(op.inputs[0])}, {op.inputs[0].size}L, {ctx.ptr(op.out)});")


# -- DequantizeLinear ------------------------------------------------------------------------------
# ``(x - zero point) * scale``, per tensor or along ``axis``: a quantized embedding table's rows
# after a Gather (pyfrspell), dequantized where they are read.


def _check_dequantize(node: ir.Node) -> str:
    if attr_int(node, "block_size", 0):
        return "blocked quantization (block_size) is not supported"
    scale = node.inputs[1] if len(node.inputs) > 1 else None
    if rank_of(scale) not in (0, 1) or rank_of(node.inputs[0]) is None:
        return "the scale must be a scalar or a vector, and the input's rank known"
    return ""


def _along_axis(lw: Lowerer, node: ir.Node, x: g.Tensor, per: g.Tensor) -> g.Tensor:
    """A vector ``per`` of more than one value shaped to broadcast along ``node``'s ``axis`` of ``x``."""
    if len(per.shape) != 1 or per.shape[0] == 1 or not x.shape:
        return per
    axis = attr_int(node, "axis", 1) % len(x.shape)
    return lw.view(per, tuple(per.shape[0] if a == axis else 1 for a in range(len(x.shape))))


def _exact_floats(lw: Lowerer, value: ir.Value | None) -> g.Tensor:
    """``value``'s tensor, a constant of integers turned into float32 (exact: 8- to 32-bit data)."""
    tensor = lw.tensor(value)
    return tensor if tensor.const is None else lw.const(tensor.const.astype(np.float32))


def _dequantize(lw: Lowerer, node: ir.Node) -> None:
    x = _exact_floats(lw, node.inputs[0])
    zero_value = present(node, 2)
    if zero_value is not None:
        x = lw.elementwise("sub", [x, _along_axis(lw, node, x, _exact_floats(lw, zero_value))])
    scale = lw.tensor(node.inputs[1])
    lw.bind(node.outputs[0], lw.elementwise("mul", [x, _along_axis(lw, node, x, scale)]))


# -- QuantizeLinear --------------------------------------------------------------------------------
# ``saturate(round_half_even(x / scale) + zero point)``, per tensor or along ``axis``, as
# onnxruntime's MlasQuantizeLinear computes it: the division, the clamp to the type's range
# less the zero point (a NaN to its lowest value), the rounding, then the zero point's add.

_RANGES = {ir.DataType.UINT8: (0.0, 255.0), ir.DataType.INT8: (-128.0, 127.0)}


def _quantized_type(node: ir.Node) -> ir.DataType | None:
    """QuantizeLinear's result type: its output's, else its zero point's, else ``output_dtype``'s (uint8 by default)."""
    zero = present(node, 2)
    for dtype in (node.outputs[0].dtype, None if zero is None else zero.dtype):
        if dtype is not None:
            return dtype
    given = attr_int(node, "output_dtype", 0)
    return ir.DataType(given) if given else ir.DataType.UINT8


def _check_quantize(node: ir.Node) -> str:
    if attr_int(node, "block_size", 0):
        return "blocked quantization (block_size) is not supported"
    x, scale = node.inputs[0], present(node, 1)
    if x is None or x.dtype != ir.DataType.FLOAT or scale is None or scale.dtype != ir.DataType.FLOAT:
        return "the input and the scale must be float32"
    if rank_of(scale) not in (0, 1) or rank_of(x) is None:
        return "the scale must be a scalar or a vector, and the input's rank known"
    dtype = _quantized_type(node)
    if dtype not in _RANGES:
        return f"only uint8 and int8 results are supported, not {dtype.name.lower() if dtype else 'unknown'}"
    return ""


def _quantize(lw: Lowerer, node: ir.Node) -> None:
    x = lw.tensor(node.inputs[0])
    dtype = _quantized_type(node)
    assert dtype is not None
    zero_value = present(node, 2)
    zero = lw.const(np.zeros((), np.float32)) if zero_value is None else _exact_floats(lw, zero_value)
    scale = lw.tensor(node.inputs[1])
    name = node.inputs[0].name if node.inputs[0] is not None else ""
    sums, scales = lw.values.get(f"{name}{SUMS}"), lw.values.get(f"{name}{SCALES}")
    if (sums is not None and scales is not None and scales.const is not None and scale.const is not None
            and scale.size == 1 and zero.size == 1):
        # a QDQ Conv's QuantizeLinear: QLinearConv's requantization of its sums, by
        # (x scale * w scale) / y scale in float32 as onnxruntime computes the multiplier
        multiplier = lw.const((scales.const / scale.const.reshape(())).astype(np.float32))
        lw.bind(node.outputs[0], lw.elementwise("requantize", [sums, multiplier, zero], _RANGES[dtype]))
        return
    out = lw.elementwise("quantize", [x, _along_axis(lw, node, x, scale), _along_axis(lw, node, x, zero)],
                         _RANGES[dtype])
    lw.bind(node.outputs[0], out)


# -- MatMulInteger and ConvInteger -----------------------------------------------------------------


def _span(node: ir.Node, data: int, zero: int) -> int:
    """The largest ``|x - zero point|`` of input ``data``: from the values where both are constants."""
    value, zero_value = present(node, data), present(node, zero)
    if not is_constant(value) or (zero_value is not None and not is_constant(zero_value)):
        return EIGHT_BIT_SPAN
    assert value is not None and value.const_value is not None
    x = value.const_value.numpy().astype(np.int64)
    if zero_value is not None:
        assert zero_value.const_value is not None
        zp = zero_value.const_value.numpy().astype(np.int64)
        if zp.ndim == 1 and zp.size > 1 and x.ndim > 1:  # per output channel, column or row
            axis = 0 if node.op_type == "ConvInteger" else x.ndim - (1 if data == 1 else 2)
            zp = zp.reshape([zp.size if a == axis else 1 for a in range(x.ndim)])
        try:
            x = x - zp
        except ValueError:  # shapes the op would refuse
            return EIGHT_BIT_SPAN
    return int(np.abs(x).max()) if x.size else 0


def _sums_exact(node: ir.Node, depth: int | None) -> str:
    """``""`` where every partial sum is exact in float32, or where the int32 result is only
    read as a float (rounded then as a float MatMul rounds); else why not."""
    if depth is not None:
        bound = depth * _span(node, 0, 2) * _span(node, 1, 3)
        if bound < EXACT_SUMS:
            return ""
        why = f"its sums can reach {bound} (over {depth} products), beyond 2**24"
    else:
        why = "its depth is unknown, so its sums may pass 2**24"
    if _read_as_float(node.outputs[0]):
        return ""
    return f"{why}, where float32 rounds, and its int32 result is read as an integer"


def _read_as_float(value: ir.Value, hops: int = 2) -> bool:
    """Whether every use of ``value`` casts it to float, maybe after adding an integer bias
    (ddddocr's old quantizer adds the bias in int32, then casts: ``Add`` checks its own
    result against 2**24, ``INTEGER_HELPERS``)."""

    def as_float(user: ir.Node) -> bool:
        if user.op_type == "Cast":
            return attr_int(user, "to", 0) == ir.DataType.FLOAT
        return user.op_type in ("Add", "Sub") and hops > 0 and _read_as_float(user.outputs[0], hops - 1)

    uses = value.uses()
    return bool(uses) and not value.is_graph_output() and all(as_float(user) for user, _ in uses)


def _check_operands(node: ir.Node) -> str:
    for index in (0, 1):
        value = node.inputs[index] if index < len(node.inputs) else None
        if value is None or value.dtype not in _EIGHT_BITS:
            return f"input {index} is not uint8 or int8"
    return ""


def _check_matmul_integer(node: ir.Node) -> str:
    reason = _check_operands(node)
    if reason:
        return reason
    a, b = node.inputs[0], node.inputs[1]
    if rank_of(a) in (None, 0) or rank_of(b) in (None, 0):
        return "the operands' ranks must be known and not 0"
    assert b is not None and b.shape is not None
    depth = b.shape[0] if len(b.shape) == 1 else b.shape[-2]
    return _sums_exact(node, depth if isinstance(depth, int) else None)


def _check_conv_integer(node: ir.Node) -> str:
    reason = _check_operands(node) or check_conv_geometry(node)
    if reason:
        return reason
    weight_zero = present(node, 3)
    if weight_zero is not None and not is_constant(weight_zero):
        return "the weight's zero point must be a constant"
    dims = constant_weight_dims(node)
    assert dims is not None
    return _sums_exact(node, math.prod(dims[1:]))


def _less_zero_point(lw: Lowerer, node: ir.Node, data: int, zero: int) -> g.Tensor:
    """Input ``data`` as exact floats less its zero point (input ``zero``; 0 where absent).

    A per-row zero point of a matrix ``[M, K]`` is a vector ``[M]``: it becomes ``[M, 1]``.
    One subtraction per (operand, zero point), however many MatMulIntegers share them (the
    query, key and value projections of one quantized input).
    """
    x = _exact_floats(lw, node.inputs[data])
    zero_value = present(node, zero)
    if zero_value is None:
        return x
    zp = _exact_floats(lw, zero_value)
    if zp.const is not None and not zp.const.any():
        return x
    if data == 0 and len(zp.shape) == 1 and len(x.shape) >= 2 and zp.shape[0] == x.shape[-2] != 1:
        zp = lw.view(zp, (zp.shape[0], 1))
    key = f"({x.name}) - ({zp.name})"
    if key not in lw.values:
        lw.values[key] = lw.elementwise("sub", [x, zp])
    return lw.values[key]


# -- MatMulInteger on 8-bit products (AVX-512 VNNI or AVX2) ----------------------------------------
# With VNNI one instruction multiplies and adds 64 byte pairs into 16 int32 sums, four times a
# float FMA's products, from a quarter of the weight bytes: onnxruntime's u8 x s8 kernels run
# so, and the float GEMM above ran dynamic-int8 models 1.5-2.3x their time on such a Xeon.
# With AVX2 alone (ops/q8.c) about a float FMA's products an instruction, from a quarter of the
# bytes: T5's int8 encoder and decoder 0.60-0.74x as long as through the float GEMM, pnm's
# decoder 0.78-0.81x (Zen 3, 1 and 2 threads, bench.corpus_revisions).



def _int8_weight(node: ir.Node) -> tuple[np.ndarray, np.ndarray] | None:
    """The constant ``[K, N]`` weight of ``node`` less its zero point as int8 values plus an
    int32 offset per column (0 where the difference fits int8 already; a uint8 weight's
    column spans 255 values at most, so less the middle of its range it fits)."""
    b = node.inputs[1]
    if b is None or b.const_value is None or b.shape is None or len(b.shape) != 2:
        return None
    weight = b.const_value.numpy().astype(np.int32)
    zero = present(node, 3)
    if zero is not None:
        if zero.const_value is None:
            return None
        zp = zero.const_value.numpy().astype(np.int32).reshape(-1)
        if zp.size not in (1, weight.shape[1]):
            return None
        weight = weight - zp.reshape(1, -1)
    return int8_columns(weight)


def _quant_matmul(lw: Lowerer, node: ir.Node) -> bool:
    """Lower ``node`` on 8-bit products where the target sums them fast (AVX-512 VNNI or AVX2:
    ``eight_bit_products``) and the operands allow:
    ``a`` uint8 computed at run time, its zero point one value, the weight a constant 8-bit
    matrix, at most 2**14 deep (every int32 sum exact).  False where not."""
    a_value, zero = node.inputs[0], present(node, 2)
    if not eight_bit_products(lw.features) or a_value is None or a_value.dtype != ir.DataType.UINT8:
        return False
    if is_constant(a_value):
        return False
    found = _int8_weight(node)
    a = lw.tensor(a_value)
    if found is None or not a.shape or a.shape[-1] != found[0].shape[0] or found[0].shape[0] > QGEMM_DEPTH:
        return False
    weight, offset = found
    a0 = None if zero is None else _exact_floats(lw, zero)
    if a0 is not None and a0.size != 1:
        return False
    if a0 is not None and a0.const is not None and not a0.const.any():
        a0 = None
    rows = math.prod(a.shape[:-1])
    # the output in its own shape, no view after it: the Cast to float and the Muls fuse through one view only
    out = lw.new((*a.shape[:-1], weight.shape[1]))
    inputs = [lw.view(a, (rows, weight.shape[0]))] + ([lw.view(a0, ())] if a0 is not None else [])
    lw.ops.append(QuantMatMul(inputs, out, weight=weight, offset=offset))
    lw.bind(node.outputs[0], out)
    return True


def emit_quant_matmul(ctx: Context, kernel: Kernel) -> None:
    op = core_of(kernel, QuantMatMul)
    a = op.inputs[0]
    rows, depth = a.shape
    cols = op.weight.shape[1]
    k4 = -(-depth // 4) * 4
    weights = as_weight_bytes(ctx, qgemm_packed(op.weight, ctx.target.features))
    colsum = as_weight_bytes(ctx, op.colsum.astype(np.int32))
    offset = as_weight_bytes(ctx, op.offset.astype(np.int32)) if op.offset.any() else "0"
    ep = emit_epilogue(ctx, kernel, hoist=True)
    byte_floats = -(-rows * k4 // 4)  # the input as bytes, in floats of scratch
    scratch = ctx.temp(byte_floats + rows)  # the bytes, then each row's sum
    fn = define_qgemm(ctx)
    a0 = ctx.ptr(op.inputs[1]) if len(op.inputs) > 1 else "0"
    # a QDQ MatMul's (qconv.quantized_matmul): int8 data shifted to uint8, QGemm's int32 bias
    bias = "0" if op.bias is None or not op.bias.any() else as_weight_bytes(ctx, op.bias.astype(np.int32))
    qdq = f", 0, {op.shift}.0f, (const int32_t*){bias}" if op.shift or bias != "0" else ""
    ctx.body.append(
        f"  {{ const cg_qgemm_t q = {{{ctx.ptr(a)}, {rows}, {depth}, {k4}, {a0}, (const int8_t*){weights}, "
        f"(const int32_t*){colsum}, (const int32_t*){offset}, {cols}, (uint8_t*){scratch}, "
        f"(int32_t*)({scratch} + {byte_floats}), {ctx.ptr(kernel.out)}, {cols}, {ep}, {ep}_ops{qdq}}};\n"
        f"    {fn}(&q); }}"
    )


def _matmul_integer(lw: Lowerer, node: ir.Node) -> None:
    if _quant_matmul(lw, node):
        return
    bind_matmul(lw, node, _less_zero_point(lw, node, 0, 2), _less_zero_point(lw, node, 1, 3))


def _conv_integer(lw: Lowerer, node: ir.Node) -> None:
    x = _less_zero_point(lw, node, 0, 2)
    weight = lw.known(node.inputs[1], "weight").astype(np.float32)
    weight_zero = present(node, 3)
    if weight_zero is not None:
        zp = lw.known(weight_zero, "weight's zero point").astype(np.float32)
        weight = weight - (zp.reshape(-1, *([1] * (weight.ndim - 1))) if zp.ndim == 1 else zp)
    lw.bind(node.outputs[0], lower_conv(lw, node, x, weight, None))


# -- the family's entries in the op table ----------------------------------------------------------


ONNX = (
    OnnxOp("DynamicQuantizeLinear", _dynamic_quantize, index_output=True),
    # (the entry converts integer data as Cast does, which is how onnxruntime converts x - x0)
    OnnxOp("DequantizeLinear", _dequantize, _check_dequantize, converted=frozenset({0, 2})),
    OnnxOp("QuantizeLinear", _quantize, _check_quantize, converted=frozenset({2}), index_output=True),
    OnnxOp("MatMulInteger", _matmul_integer, _check_matmul_integer, integer_arithmetic=True),
    OnnxOp("ConvInteger", _conv_integer, _check_conv_integer, integer_arithmetic=True),
)


KERNELS = (
    KernelOp(QuantRange, Layout.ANY_ORDER, emit_quant_range),
    KernelOp(QuantMatMul, Layout.PLAIN, emit_quant_matmul),
)


__all__ = [
    "EXACT_SUMS", "KERNELS", "ONNX", "QGEMM_COLS", "QGEMM_ROWS", "QGEMM_RUN", "QuantMatMul", "QuantRange",
    "as_weight_bytes", "int8_columns", "qgemm_packed", "vnni_packed",
]
