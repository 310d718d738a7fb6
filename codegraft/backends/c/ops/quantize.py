"""Dynamic quantization: DynamicQuantizeLinear, MatMulInteger and ConvInteger on exact floats.

NOTE: onnxruntime's ``quantize_dynamic`` turns each float MatMul (Conv) into
DynamicQuantizeLinear -> MatMulInteger (ConvInteger) -> Cast to float -> Mul by the two
scales.  Here the uint8 and int8 values are held as exact floats, as every integer is
(``_spec.INTEGER_DTYPES``):

- DynamicQuantizeLinear is a :class:`QuantRange` (one pass for the range: onnxruntime's scale
  and zero point) and an elementwise ``quantize_u8`` (onnxruntime's rounding and clamping).
- MatMulInteger and ConvInteger subtract the zero points (the weight's at compile time) and
  run on the float GEMM engine.  A product of two 8-bit values is exact in float32, and so is
  every partial sum below 2**24.  Where ``K * |a - a0| * |b - b0|`` can reach 2**24 the sum is
  rounded once it gets there, as a float MatMul rounds it (relative 6e-8), so the op is then
  taken only where its int32 result is read as a float: by Casts to float, as dynamic
  quantization reads it.  (onnxruntime's own u8s8 kernel on AVX2 without VNNI saturates
  instead: ``bench.corpus.exact_integer_matmuls``.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import onnx_ir as ir

from codegraft.backends.c import _graph as g
from codegraft.backends.c._c_files import c_file
from codegraft.backends.c._emit import Context
from codegraft.backends.c._fuse import Kernel
from codegraft.backends.c._lowerer import Lowerer
from codegraft.backends.c._node import NHWC_DOMAIN, attr_int, is_constant, present, rank_of
from codegraft.backends.c._toolchain import VNNI
from codegraft.backends.c.ops._spec import KernelOp, Layout, OnnxOp, core_of
from codegraft.backends.c.ops._window import join_layout, split_layout, window_of
from codegraft.backends.c.ops.conv import check_conv_geometry, constant_weight_dims, lower_conv
from codegraft.backends.c.ops.data import slice_op
from codegraft.backends.c.ops.elementwise import emit_epilogue
from codegraft.backends.c.ops.matmul import bind_matmul

EXACT_SUMS = 1 << 24  # float32 holds every integer sum of at most this magnitude
_EIGHT_BITS = frozenset({ir.DataType.UINT8, ir.DataType.INT8})
_EIGHT_BIT_SPAN = 255  # the largest |x - zero point| of two 8-bit values of one type


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
    sums, scales = lw.values.get(f"{name}{_SUMS}"), lw.values.get(f"{name}{_SCALES}")
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
        return _EIGHT_BIT_SPAN
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
            return _EIGHT_BIT_SPAN
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


# -- MatMulInteger on 8-bit products (AVX-512 VNNI) ------------------------------------------------
# With VNNI one instruction multiplies and adds 64 byte pairs into 16 int32 sums, four times a
# float FMA's products, from a quarter of the weight bytes: onnxruntime's u8 x s8 kernels run
# so, and the float GEMM above ran dynamic-int8 models 1.5-2.3x their time on such a Xeon.

QGEMM_ROWS, QGEMM_COLS, QGEMM_RUN = 4, 64, 16  # a tile, and tiles to a task (CG_QGEMM_* in qgemm.c)
QGEMM_DEPTH = 1 << 14  # 255 * 255 * 2**14 < 2**31: no int32 sum overflows


@dataclass(eq=False)
class QuantMatMul(g.Op):
    """``(a - a0) @ weight`` on 8-bit products: ``inputs`` are ``a`` (``[rows, K]`` uint8
    values as exact floats) and, where present, its zero point ``a0`` (one value); ``weight``
    is ``[K, N]`` int8 (the weight less its zero point), ``colsum`` its column sums; ``out``
    is ``[..., N]``, its rows ``a``'s."""

    weight: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.int8))
    offset: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    row_epilogue: ClassVar[bool] = True  # the Cast to float and the Muls by the scales fuse after it

    @property
    def colsum(self) -> np.ndarray:
        return self.weight.sum(axis=0, dtype=np.int64).astype(np.int32)


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


def int8_columns(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """An integer ``[K, N]`` matrix (an 8-bit weight less its zero point) as int8 values plus
    an int32 offset per column (0 where the values fit int8 already; a uint8 weight's column
    spans 255 values at most, so less the middle of its range it fits); ``None`` where not."""
    if not weight.size:
        return None
    weight = weight.astype(np.int32)
    offset = np.zeros(weight.shape[1], np.int32)
    if weight.min() < -128 or weight.max() > 127:
        low, high = weight.min(axis=0), weight.max(axis=0)
        offset = ((low + high + 1) // 2).astype(np.int32)
    shifted = weight - offset.reshape(1, -1)
    if shifted.min() < -128 or shifted.max() > 127:
        return None
    return shifted.astype(np.int8), offset


def _quant_matmul(lw: Lowerer, node: ir.Node) -> bool:
    """Lower ``node`` on 8-bit products where the target has VNNI and the operands allow:
    ``a`` uint8 computed at run time, its zero point one value, the weight a constant 8-bit
    matrix, at most 2**14 deep (every int32 sum exact).  False where not."""
    a_value, zero = node.inputs[0], present(node, 2)
    if VNNI not in lw.features or a_value is None or a_value.dtype != ir.DataType.UINT8 or is_constant(a_value):
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


def vnni_packed(weight: np.ndarray) -> np.ndarray:
    """An int8 ``[K, N]`` weight as the 8-bit kernels read it: zero-padded to ``K4`` (a multiple
    of 4) rows and whole blocks of ``QGEMM_COLS`` columns, laid out [block][k / 4][column][k % 4]:
    four consecutive k of a column in one 32-bit lane (vpdpbusd)."""
    depth, cols = weight.shape
    k4, blocks = -(-depth // 4) * 4, -(-cols // QGEMM_COLS)
    padded = np.zeros((k4, blocks * QGEMM_COLS), np.int8)
    padded[:depth, :cols] = weight
    return padded.reshape(k4 // 4, 4, blocks, QGEMM_COLS).transpose(2, 0, 3, 1)


def as_weight_bytes(ctx: Context, array: np.ndarray) -> str:
    """The symbol of an int8 or int32 constant placed in the (float) weight arena byte for byte."""
    return ctx.weight(np.ascontiguousarray(array).reshape(-1).view(np.float32))


def emit_quant_matmul(ctx: Context, kernel: Kernel) -> None:
    op = core_of(kernel, QuantMatMul)
    a = op.inputs[0]
    rows, depth = a.shape
    cols = op.weight.shape[1]
    k4 = -(-depth // 4) * 4
    weights, colsum = as_weight_bytes(ctx, vnni_packed(op.weight)), as_weight_bytes(ctx, op.colsum.astype(np.int32))
    offset = as_weight_bytes(ctx, op.offset.astype(np.int32)) if op.offset.any() else "0"
    ep = emit_epilogue(ctx, kernel)
    byte_floats = -(-rows * k4 // 4)  # the input as bytes, in floats of scratch
    scratch = ctx.temp(byte_floats + rows)  # the bytes, then each row's sum
    fn = ctx.define_once("cg_qgemm", lambda: c_file("ops/qgemm.c"))
    a0 = ctx.ptr(op.inputs[1]) if len(op.inputs) > 1 else "0"
    ctx.body.append(
        f"  {{ const cg_qgemm_t q = {{{ctx.ptr(a)}, {rows}, {depth}, {k4}, {a0}, (const int8_t*){weights}, "
        f"(const int32_t*){colsum}, (const int32_t*){offset}, {cols}, (uint8_t*){scratch}, "
        f"(int32_t*)({scratch} + {byte_floats}), {ctx.ptr(kernel.out)}, {cols}, {ep}, {ep}_ops}};\n"
        f"    {fn}(&q); }}"
    )


# -- a QDQ model's Conv on 8-bit products (AVX-512 VNNI) -------------------------------------------
# DequantizeLinear(x) -> Conv(DequantizeLinear(int8 weight), DequantizeLinear(int32 bias)): the
# sums of (x - x0)(w - w0) exact in int32 on VNNI (QuantMatMul's tiles, each row one output
# pixel's taps gathered channels-last), times x's scale and the weight's per channel, plus the
# bias: the float Conv's value but for its rounding (the float Conv rounds every product and
# partial sum; this rounds once).  The QuantizeLinear after it fuses into the epilogue.


@dataclass(eq=False)
class QuantConv(g.SpatialOp):
    """``(x - x0) * weight`` on 8-bit products, channels-last: ``inputs[0]`` holds 8-bit values
    as exact floats (``shift`` 128 for int8 ones, then uint8); ``weight`` is ``[K, M]`` int8
    (K in (kh, kw, C) order, the weight less its zero point, less ``offset`` per column);
    ``zero`` is x0 plus ``shift``; ``out`` the int32 sums as floats."""

    weight: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.int8))
    offset: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    bias: np.ndarray | None = None  # int32 per column, added to the sums
    window: g.Window | None = None
    zero: int = 0
    shift: int = 0
    row_epilogue: ClassVar[bool] = True

    @property
    def colsum(self) -> np.ndarray:
        return self.weight.sum(axis=0, dtype=np.int64).astype(np.int32)


def _dequantized(value: ir.Value | None, moved: bool = False) -> ir.Node | None:
    """The DequantizeLinear ``value`` is the output of (with ``moved``, through Transposes and
    Reshapes: the layout pass moves a weight to OHWI), or ``None``."""
    node = None if value is None else value.producer()
    while moved and node is not None and node.op_type in _MOVES and node.domain in ("", "ai.onnx"):
        node = node.inputs[0].producer() if node.inputs[0] is not None else None
    if node is None or node.op_type != "DequantizeLinear" or node.domain not in ("", "ai.onnx"):
        return None
    return node


_MOVES = frozenset({"Transpose", "Reshape", "Identity"})


def _constant(value: ir.Value | None) -> np.ndarray | None:
    return None if value is None or value.const_value is None else value.const_value.numpy()


def _integer_weight(node: ir.Node, weight: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """The Conv's weight (as lowered: ``[M, ..., C]`` floats) as the integers less their zero
    point it dequantizes, and its scale per output channel; ``None`` unless it is a
    DequantizeLinear of 8-bit constants per tensor or along the output channels and those
    integers times the scale are ``weight`` bit for bit."""
    dq = _dequantized(node.inputs[1], moved=True)
    if dq is None:
        return None
    q, scale = _constant(dq.inputs[0]), _constant(present(dq, 1))
    if q is None or q.dtype not in (np.int8, np.uint8) or scale is None or scale.dtype != np.float32:
        return None
    if scale.size != 1 and (scale.ndim != 1 or attr_int(dq, "axis", 1) % q.ndim != 0):
        return None  # per output channel (still axis 0 after the layout pass) or per tensor only
    scales = np.broadcast_to(scale.reshape(-1), (weight.shape[0],)).astype(np.float32)
    if not scales.all() or not np.isfinite(scales).all():
        return None
    shape = (-1, *([1] * (weight.ndim - 1)))
    with np.errstate(all="ignore"):
        ints = np.rint(weight.astype(np.float32) / scales.reshape(shape))
    if not np.isfinite(ints).all() or np.abs(ints).max(initial=0) > _EIGHT_BIT_SPAN:
        return None
    if not np.array_equal(ints.astype(np.float32) * scales.reshape(shape), weight):
        return None
    return ints.astype(np.int32), np.ascontiguousarray(scales)


def quantized_conv_weight(node: ir.Node) -> bool:
    """Whether ``node`` is a QDQ model's Conv: its weight a DequantizeLinear (through the layout
    pass's Transposes).  Without VNNI it would run in float (``CBackend.supports`` declines it)."""
    return node.op_type == "Conv" and _dequantized(present(node, 1), moved=True) is not None


def quantized_conv(lw: Lowerer, node: ir.Node, weight: np.ndarray, bias: np.ndarray | None) -> g.Tensor | None:
    """A QDQ Conv on 8-bit products (see above), or ``None`` where the target lacks VNNI or the
    Conv is not one: its input a DequantizeLinear of 8-bit values in this partition by one
    constant scale and zero point, its weight 8-bit constants per tensor or per output channel,
    one group, at most 2**14 deep."""
    if VNNI not in lw.features or attr_int(node, "group", 1) != 1:
        return None
    source, perm = node.inputs[0], None
    producer = None if source is None else source.producer()
    if producer is not None and producer.op_type == "Transpose" and producer.domain in ("", "ai.onnx"):
        # the layout pass's move of a model's first quantized image to channels-last
        perm, source = producer.attributes.get_ints("perm", None), producer.inputs[0]
        if perm is None:
            return None
    dq = _dequantized(source)
    if dq is None:
        return None
    q_value, x_scale, x_zero = dq.inputs[0], _constant(present(dq, 1)), _constant(present(dq, 2))
    if q_value is None or q_value.dtype not in (ir.DataType.UINT8, ir.DataType.INT8) or not q_value.name:
        return None
    x = lw.values.get(q_value.name)
    if x is None or x.const is not None or x_scale is None or x_scale.size != 1:
        return None
    if present(dq, 2) is not None and x_zero is None:
        return None
    if perm is not None:  # transposing DequantizeLinear's 8-bit input instead (per tensor: the same values)
        moved = lw.new(tuple(x.shape[p] for p in perm))
        lw.ops.append(g.Transpose([x], moved, perm=tuple(perm)))
        x = moved
    shift = 128 if q_value.dtype == ir.DataType.INT8 else 0
    zero = (0 if x_zero is None else int(x_zero.reshape(-1)[0])) + shift
    integer = _integer_weight(node, weight)
    native = node.domain == NHWC_DOMAIN
    if integer is None or len(x.shape) not in (3, 4):
        return None
    ints, scales = integer
    if not native:  # OIHW -> OHWI
        ints = np.moveaxis(ints, 1, -1)
    m, depth = ints.shape[0], math.prod(ints.shape[1:])
    found_columns = int8_columns(ints.reshape(m, depth).T)
    if found_columns is None or depth > QGEMM_DEPTH:
        return None
    n, c, spatial = split_layout(x, native)
    if c != ints.shape[-1]:
        return None
    window, out_spatial = window_of(node, spatial, tuple(ints.shape[1:-1]), ceil=False)
    out = lw.new(join_layout(n, m, out_spatial, native))
    columns, offset = found_columns
    x_scale32 = np.float32(x_scale.reshape(-1)[0])
    product = (x_scale32 * scales).astype(np.float32)  # onnxruntime's x scale * w scale, in float32
    int_bias = _integer_bias(node, product)
    lw.ops.append(QuantConv([x], out, weight=columns, offset=offset, bias=int_bias, window=window, zero=zero,
                            shift=shift, native_nhwc=native))
    per_column = lw.per_channel(product, len(out.shape), native)
    if int_bias is not None or bias is None:
        # (sum + bias) as QLinearConv has it, for a QuantizeLinear after it (_quantize)
        name = node.outputs[0].name or ""
        lw.values[f"{name}{_SUMS}"], lw.values[f"{name}{_SCALES}"] = out, per_column
        return lw.elementwise("mul", [out, per_column])
    out = lw.elementwise("mul", [out, per_column])
    return lw.elementwise("add", [out, lw.per_channel(bias.astype(np.float32), len(out.shape), native)])


# Keys beside a QDQ Conv's output in ``Lowerer.values``: its int32 sums plus the bias (floats),
# and x scale * w scale per channel (shaped to broadcast over them).
_SUMS, _SCALES = "::qlinear-sums", "::qlinear-scales"


def _integer_bias(node: ir.Node, product: np.ndarray) -> np.ndarray | None:
    """The Conv's bias as the int32 values its DequantizeLinear reads (zeros where it has none),
    where their scale is x scale * w scale exactly (as onnxruntime's quantizer makes it, and
    QLinearConv reads it) and their zero point 0; ``None`` where not."""
    value = present(node, 2)
    if value is None:
        return np.zeros(product.shape, np.int32)
    dq = _dequantized(value)
    if dq is None:
        return None
    q, scale, zero = _constant(dq.inputs[0]), _constant(present(dq, 1)), _constant(present(dq, 2))
    if q is None or q.dtype != np.int32 or q.shape != product.shape or scale is None or scale.dtype != np.float32:
        return None
    if (present(dq, 2) is not None and (zero is None or zero.any())) or scale.size not in (1, product.size):
        return None
    if not np.array_equal(np.broadcast_to(scale.reshape(-1), product.shape), product):
        return None
    return q.astype(np.int32)


def emit_quant_conv(ctx: Context, kernel: Kernel) -> None:
    op = core_of(kernel, QuantConv)
    assert op.window is not None
    x = op.inputs[0]
    phys_in, phys_out = x.physical_shape, kernel.out.physical_shape
    win = op.window
    kernel_dims, strides, dilations = list(win.kernel), list(win.strides), list(win.dilations)
    pads = list(win.pads_begin)
    if len(kernel_dims) == 1:  # 1-D: one row
        phys_in, phys_out = (phys_in[0], 1, *phys_in[1:]), (phys_out[0], 1, *phys_out[1:])
        kernel_dims, strides, dilations, pads = [1, *kernel_dims], [1, *strides], [1, *dilations], [0, *pads]
    n, h, w, c = phys_in
    oh, ow, m = phys_out[1:]
    rows, depth = n * oh * ow, op.weight.shape[0]
    k4 = -(-depth // 4) * 4
    weights, colsum = as_weight_bytes(ctx, vnni_packed(op.weight)), as_weight_bytes(ctx, op.colsum.astype(np.int32))
    offset = as_weight_bytes(ctx, op.offset.astype(np.int32)) if op.offset.any() else "0"
    ep = emit_epilogue(ctx, kernel)
    byte_floats = -(-rows * k4 // 4)
    scratch = ctx.temp(byte_floats + rows)
    fn = ctx.define_once("cg_qgemm", lambda: c_file("ops/qgemm.c"))
    bias = "0" if op.bias is None or not op.bias.any() else as_weight_bytes(ctx, op.bias.astype(np.int32))
    geom, zero = ctx.name("qconv"), ctx.name("qzero")
    values = [n, h, w, c, oh, ow, *kernel_dims, *strides, *dilations, *pads]
    ctx.body.append(
        f"  {{ static const long {geom}[] = {{{', '.join(str(v) for v in values)}}};\n"
        f"    static const float {zero}[] = {{{op.zero}.0f}};\n"
        f"    const cg_qgemm_t q = {{{ctx.ptr(x)}, {rows}, {depth}, {k4}, {zero}, (const int8_t*){weights}, "
        f"(const int32_t*){colsum}, (const int32_t*){offset}, {m}, (uint8_t*){scratch}, "
        f"(int32_t*)({scratch} + {byte_floats}), {ctx.ptr(kernel.out)}, {m}, {ep}, {ep}_ops, {geom}, {op.shift}.0f, "
        f"(const int32_t*){bias}}};\n"
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
    KernelOp(QuantConv, Layout.CHANNELS_LAST, emit_quant_conv),
)


__all__ = [
    "EXACT_SUMS", "KERNELS", "ONNX", "QGEMM_COLS", "QGEMM_ROWS", "QGEMM_RUN", "QuantConv", "QuantMatMul",
    "QuantRange", "as_weight_bytes", "int8_columns", "quantized_conv", "quantized_conv_weight", "vnni_packed",
]
