"""A static-quantization (QDQ) model's Conv on 8-bit products (AVX-512 VNNI): QuantConv.

Its own module so that ``conv.py`` (whose Conv lowering tries it first) and ``quantize.py``
(whose QuantizeLinear requantizes its sums) both build on it without importing each other.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import onnx_ir as ir

from codegraft.backends.c import _graph as g
from codegraft.backends.c._emit import Context
from codegraft.backends.c._fuse import Kernel
from codegraft.backends.c._lowerer import Lowerer
from codegraft.backends.c._node import NHWC_DOMAIN, attr_float, attr_int, present
from codegraft.backends.c._toolchain import VNNI
from codegraft.backends.c.ops._qpack import (
    EIGHT_BIT_SPAN,
    QGEMM_DEPTH,
    as_weight_bytes,
    define_qgemm,
    int8_columns,
    qgemm_packed,
)
from codegraft.backends.c.ops._spec import KernelOp, Layout, core_of
from codegraft.backends.c.ops._window import join_layout, split_layout, window_of
from codegraft.backends.c.ops.elementwise import emit_epilogue

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


@dataclass(eq=False)
class QuantMatMul(g.Op):
    """``(a - a0) @ weight`` on 8-bit products: ``inputs`` are ``a`` (``[rows, K]`` 8-bit
    values as exact floats, ``shift`` 128 for int8 ones, then uint8) and, where present, its
    zero point ``a0`` (one value, plus ``shift``); ``weight`` is ``[K, N]`` int8 (the weight
    less its zero point, less ``offset`` per column), ``colsum`` its column sums; ``bias`` an
    int32 per column added to the sums, or none; ``out`` is ``[..., N]``, its rows ``a``'s.
    MatMulInteger's (``quantize.py``), the quantized recurrences' (``rnn.py``) and a QDQ
    MatMul's or Gemm's (:func:`quantized_matmul`)."""

    weight: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.int8))
    offset: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    shift: int = 0
    bias: np.ndarray | None = None
    row_epilogue: ClassVar[bool] = True  # the Cast to float and the Muls by the scales fuse after it

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
    return _integers_by_row(weight, scale)


def _integers_by_row(weight: np.ndarray, scale: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """``weight`` (``[rows, ...]`` floats) as integers times ``scale`` (one value, or one per
    row): the integers (at most ``EIGHT_BIT_SPAN`` in magnitude) and the scale per row, or
    ``None`` unless those products are ``weight`` bit for bit."""
    if scale.size not in (1, weight.shape[0]):
        return None
    scales = np.broadcast_to(scale.reshape(-1), (weight.shape[0],)).astype(np.float32)
    if not scales.all() or not np.isfinite(scales).all():
        return None
    shape = (-1, *([1] * (weight.ndim - 1)))
    with np.errstate(all="ignore"):
        ints = np.rint(weight.astype(np.float32) / scales.reshape(shape))
    if not np.isfinite(ints).all() or np.abs(ints).max(initial=0) > EIGHT_BIT_SPAN:
        return None
    if not np.array_equal(ints.astype(np.float32) * scales.reshape(shape), weight):
        return None
    return ints.astype(np.int32), np.ascontiguousarray(scales)


def _quantized_input(lw: Lowerer, value: ir.Value | None) -> tuple[g.Tensor, int, int, np.float32] | None:
    """Where ``value`` is a DequantizeLinear of 8-bit values computed in this partition by one
    constant scale and zero point: those values' tensor, the zero point plus the shift (128 for
    int8 values, read as uint8), the shift and the scale; else ``None``."""
    dq = _dequantized(value)
    if dq is None:
        return None
    q_value, x_scale, x_zero = dq.inputs[0], _constant(present(dq, 1)), _constant(present(dq, 2))
    if q_value is None or q_value.dtype not in (ir.DataType.UINT8, ir.DataType.INT8) or not q_value.name:
        return None
    x = lw.values.get(q_value.name)
    if x is None or x.const is not None or x_scale is None or x_scale.size != 1 or x_scale.dtype != np.float32:
        return None
    if present(dq, 2) is not None and x_zero is None:
        return None
    shift = 128 if q_value.dtype == ir.DataType.INT8 else 0
    zero = (0 if x_zero is None else int(x_zero.reshape(-1)[0])) + shift
    return x, zero, shift, np.float32(x_scale.reshape(-1)[0])


def quantized_matmul(lw: Lowerer, node: ir.Node) -> g.Tensor | None:
    """A QDQ MatMul or Gemm on 8-bit products, as onnxruntime's QLinearMatMul (QGemm) computes
    it: the sums of (a - a0)(b - b0) exact in int32 (QuantMatMul), times a's scale and b's per
    column, plus a Gemm's bias (its int32 values added to the sums where their scale is a scale
    * b scale, as the quantizer makes it); a QuantizeLinear reading it requantizes those sums
    (``quantize.py``).  ``None`` where the target lacks VNNI or the node is not one: ``a`` a
    DequantizeLinear of 8-bit values in this partition by one constant scale and zero point, b
    a constant ``[K, N]`` (a Gemm's ``[N, K]`` with transB) of 8-bit integers times a scale per
    tensor or per column, bit for bit, at most 2**14 deep; a Gemm's transA 0 and alpha 1."""
    if VNNI not in lw.features:
        return None
    gemm = node.op_type == "Gemm"
    if gemm and (attr_int(node, "transA", 0) or attr_float(node, "alpha", 1.0) != 1.0):
        return None
    found = _quantized_input(lw, node.inputs[0])
    dq = _dequantized(node.inputs[1], moved=True)
    q = None if dq is None else dq.inputs[0]
    if found is None or dq is None or q is None or q.const_value is None:
        return None
    b, scale = lw.tensor(node.inputs[1]), _constant(present(dq, 1))
    if b.const is None or len(b.shape) != 2 or scale is None or scale.dtype != np.float32:
        return None
    if q.dtype not in (ir.DataType.UINT8, ir.DataType.INT8):
        return None
    x, zero, shift, x_scale = found
    weight = b.const.astype(np.float32)
    by_row = weight if gemm and attr_int(node, "transB", 0) else weight.T  # [N, K]
    integer = _integers_by_row(by_row, scale)
    if integer is None or not x.shape or x.shape[-1] != by_row.shape[1] or by_row.shape[1] > QGEMM_DEPTH:
        return None
    ints, scales = integer
    found_columns = int8_columns(ints.T)
    if found_columns is None:
        return None
    columns, offset = found_columns
    depth, cols = columns.shape
    product = (x_scale * scales).astype(np.float32)  # onnxruntime's a scale * b scale, in float32
    bias_value = present(node, 2) if gemm and attr_float(node, "beta", 1.0) != 0.0 else None
    int_bias = None
    if bias_value is not None and attr_float(node, "beta", 1.0) == 1.0:
        int_bias = _integer_bias_of(bias_value, product)
    rows = math.prod(x.shape[:-1])
    out = lw.new((*x.shape[:-1], cols))
    a0 = [lw.const(np.array(zero, np.float32))] if zero else []
    lw.ops.append(QuantMatMul([lw.view(x, (rows, depth)), *a0], out, weight=columns, offset=offset, shift=shift,
                              bias=int_bias))
    per_column = lw.const(product)
    if bias_value is None or int_bias is not None:
        # the sums (plus the bias) as QLinearMatMul and QGemm have them, for a QuantizeLinear after it
        name = node.outputs[0].name or ""
        lw.values[f"{name}{SUMS}"], lw.values[f"{name}{SCALES}"] = out, per_column
        return lw.elementwise("mul", [out, per_column])
    result = lw.elementwise("mul", [out, per_column])
    c = lw.tensor(bias_value)
    beta = attr_float(node, "beta", 1.0)
    if c.const is not None:
        c = lw.const(c.const.astype(np.float32) * np.float32(beta))
    elif beta != 1.0:
        c = lw.elementwise("mul", [c, lw.const(np.float32(beta))])
    return lw.elementwise("add", [result, c])


def qdq_matmul(node: ir.Node) -> bool:
    """Whether ``node`` is a QDQ model's MatMul or Gemm: both operands DequantizeLinear outputs
    (onnxruntime fuses such a unit into QLinearMatMul; ``c`` would compute it in float)."""
    return node.op_type in ("MatMul", "Gemm") and all(
        _dequantized(present(node, i), moved=True) is not None for i in (0, 1)
    )


def qdq_conv_input(node: ir.Node) -> ir.DataType | None:
    """The 8-bit type a QDQ model's Conv dequantizes its input from (its input and its weight
    DequantizeLinear outputs, through the layout pass's Transposes), or ``None`` where ``node``
    is not one.  ``CBackend.supports`` declines such a Conv without VNNI (it would run in float)
    and, by default, with uint8 input (see there)."""
    if node.op_type != "Conv" or _dequantized(present(node, 1), moved=True) is None:
        return None
    dq = _dequantized(present(node, 0), moved=True)
    value = None if dq is None else dq.inputs[0]
    return None if value is None or value.dtype not in (ir.DataType.UINT8, ir.DataType.INT8) else value.dtype


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
    found = _quantized_input(lw, source)
    if found is None:
        return None
    x, zero, shift, x_scale32 = found
    if perm is not None:  # transposing DequantizeLinear's 8-bit input instead (per tensor: the same values)
        moved = lw.new(tuple(x.shape[p] for p in perm))
        lw.ops.append(g.Transpose([x], moved, perm=tuple(perm)))
        x = moved
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
    product = (x_scale32 * scales).astype(np.float32)  # onnxruntime's x scale * w scale, in float32
    int_bias = _integer_bias(node, product)
    lw.ops.append(QuantConv([x], out, weight=columns, offset=offset, bias=int_bias, window=window, zero=zero,
                            shift=shift, native_nhwc=native))
    per_column = lw.per_channel(product, len(out.shape), native)
    if int_bias is not None or bias is None:
        # (sum + bias) as QLinearConv has it, for a QuantizeLinear after it (_quantize)
        name = node.outputs[0].name or ""
        lw.values[f"{name}{SUMS}"], lw.values[f"{name}{SCALES}"] = out, per_column
        return lw.elementwise("mul", [out, per_column])
    out = lw.elementwise("mul", [out, per_column])
    return lw.elementwise("add", [out, lw.per_channel(bias.astype(np.float32), len(out.shape), native)])


# Keys beside a QDQ Conv's output in ``Lowerer.values`` (quantize.py's QuantizeLinear reads
# them): its int32 sums plus the bias (floats), and x scale * w scale per channel (shaped to
# broadcast over them).
SUMS, SCALES = "::qlinear-sums", "::qlinear-scales"


def _integer_bias(node: ir.Node, product: np.ndarray) -> np.ndarray | None:
    """The Conv's bias as the int32 values its DequantizeLinear reads (zeros where it has none),
    where their scale is x scale * w scale exactly (as onnxruntime's quantizer makes it, and
    QLinearConv reads it) and their zero point 0; ``None`` where not."""
    value = present(node, 2)
    if value is None:
        return np.zeros(product.shape, np.int32)
    return _integer_bias_of(value, product)


def _integer_bias_of(value: ir.Value, product: np.ndarray) -> np.ndarray | None:
    """``value`` (a bias per output channel or column) as the int32 values its DequantizeLinear
    reads, as :func:`_integer_bias` has them, or ``None``."""
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
    weights = as_weight_bytes(ctx, qgemm_packed(op.weight, ctx.target.features))
    colsum = as_weight_bytes(ctx, op.colsum.astype(np.int32))
    offset = as_weight_bytes(ctx, op.offset.astype(np.int32)) if op.offset.any() else "0"
    ep = emit_epilogue(ctx, kernel, hoist=True)
    byte_floats = -(-rows * k4 // 4)
    scratch = ctx.temp(byte_floats + rows)
    fn = define_qgemm(ctx)
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


KERNELS = (KernelOp(QuantConv, Layout.CHANNELS_LAST, emit_quant_conv),)
ONNX = ()  # (the Conv entry is conv.py's; it calls quantized_conv first)

__all__ = ["KERNELS", "ONNX", "SCALES", "SUMS", "QuantConv", "QuantMatMul", "qdq_conv_input", "qdq_matmul",
           "quantized_conv", "quantized_matmul"]
