"""Conv and ConvTranspose (1-D and 2-D, groups, depthwise, strides, pads, dilations) on channels-last data.

NOTE: a Conv becomes the backend's ``g.Conv`` (weights reordered to OHWI once, at compile
time) plus an elementwise Add for its bias, which fusion turns into part of the epilogue.
A depthwise Conv gets a kernel specialised per layer (``depthwise.py``); every other one
runs on the shared GEMM engine (``gemm.py``), reading kernel taps straight from the padded
channels-last input.

A ConvTranspose is two ops: a 1x1 ``g.Conv`` (the GEMM engine again) that multiplies every
input pixel by every kernel tap at once, its output channel ``gi * (K * Cg) + t * Cg + c``
for group ``gi``, tap ``t = ky * kw + kx`` and channel ``c`` of the group, and a
:class:`Col2Im` that gathers, for each output pixel, the taps that reach it, plus the bias
(``conv_transpose.c``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import onnx_ir as ir

from codegraft.backends.c import _graph as g
from codegraft.backends.c._blocking import host_blocking, weights_outweigh
from codegraft.backends.c._c_files import c_file
from codegraft.backends.c._emit import Context
from codegraft.backends.c._fuse import Kernel
from codegraft.backends.c._lowerer import Lowerer, LoweringError
from codegraft.backends.c._node import (
    NHWC_DOMAIN,
    attr_floats,
    attr_int,
    attr_ints,
    attr_str,
    compile_time,
    is_constant,
    present,
)
from codegraft.backends.c.ops._spec import KernelOp, Layout, OnnxOp, core_of
from codegraft.backends.c.ops._window import check_window, join_layout, split_layout, window_of
from codegraft.backends.c.ops.depthwise import DepthwiseShape, depthwise_function
from codegraft.backends.c.ops.elementwise import emit_epilogue, vector_epilogue
from codegraft.backends.c.ops.gemm import (
    c_longs,
    choose_tile,
    gemm_function,
    negligible_terms,
    pack_weights,
    row_strides_arg,
    write_over_residual,
)
from codegraft.backends.c.ops.qconv import quantized_conv
from codegraft.backends.c.ops.winograd import emit_winograd, runs_as_winograd


def constant_weight_dims(node: ir.Node) -> tuple[int, ...] | None:
    """The dimensions of a Conv's (ConvTranspose's) weight, ``None`` unless it is a constant
    initializer or computed from constants at compile time (a QDQ model's DequantizeLinear of
    an int8 weight) with a known shape."""
    weight = present(node, 1)
    if is_constant(weight):
        assert weight is not None and weight.const_value is not None
        return _dims(weight.const_value)
    if weight is None or weight.shape is None or not compile_time(weight):
        return None
    dims = tuple(weight.shape.dims)
    return dims if all(isinstance(d, int) for d in dims) else None  # type: ignore[return-value]


def check_conv(node: ir.Node) -> str:
    bias = present(node, 2)
    if bias is not None and not (is_constant(bias) or compile_time(bias)):
        return "the bias must be a constant (or computed from constants: a DequantizeLinear of one)"
    return check_conv_geometry(node)


def check_conv_geometry(node: ir.Node) -> str:
    """Why the weight, window or rank of a Conv (or ConvInteger) is not taken, or ``""``."""
    weight_dims = constant_weight_dims(node)
    if weight_dims is None:
        return "the weight must be a constant initializer"
    rank = len(weight_dims)
    if rank not in (3, 4, 5):
        return f"{rank - 2}-D convolution is not supported (only 1-D and 2-D, and 3-D of kernel depth 1)"
    window = check_window(node, rank - 2, weight_dims)
    if window or rank < 5:
        return window
    return _check_depth_one(node, weight_dims)


def _check_depth_one(node: ir.Node, weight_dims: tuple[int, ...]) -> str:
    """A 3-D convolution is taken when each depth slice is a 2-D convolution of its own
    (RivaGAN's video frames: kernel 1 x 11 x 11): kernel depth 1, depth stride 1, no depth
    padding.  Its depth then joins the batch (:func:`emit_conv`)."""
    strides = attr_ints(node, "strides") or [1, 1, 1]
    pads = attr_ints(node, "pads") or [0] * 6
    if weight_dims[2] != 1 or strides[0] != 1 or pads[0] or pads[3]:
        return (
            f"3-D convolution is only supported with kernel depth 1, depth stride 1 and no depth padding "
            f"(kernel depth {weight_dims[2]}, stride {strides[0]}, pads {pads[0]}/{pads[3]})"
        )
    return ""


def _dims(tensor: ir.TensorProtocol) -> tuple[int, ...]:
    """A constant's dimensions.  (onnx-ir builds a new ``Shape`` each time a tensor read from
    a proto is asked for its shape: a tenth of ``supports`` on a Conv; the proto has them.)"""
    if isinstance(tensor, ir.serde.TensorProtoTensor):
        return tuple(tensor.raw.dims)
    return tuple(tensor.shape.numpy())


def _conv(lw: Lowerer, node: ir.Node) -> None:
    bias = present(node, 2)
    weight = lw.known(node.inputs[1], "weight")
    quantized = quantized_conv(lw, node, weight, None if bias is None else lw.known(bias, "bias"))
    lw.bind(node.outputs[0], quantized if quantized is not None else _conv_with_bias(lw, node))


def _conv_with_bias(lw: Lowerer, node: ir.Node) -> g.Tensor:
    """Conv's (and FusedConv's) ``X * W + B`` from inputs 0, 1 and 2."""
    bias = present(node, 2)
    bias_values = None if bias is None else lw.known(bias, "bias").astype(np.float32)
    return lower_conv(lw, node, lw.tensor(node.inputs[0]), lw.known(node.inputs[1], "weight"), bias_values)


# onnxruntime's FusedConv: activation -> (elementwise kind, its attribute parameters' defaults)
_FUSED_ACTIVATIONS: dict[str, tuple[str, tuple[float, ...]]] = {
    "Relu": ("relu", ()), "Tanh": ("tanh", ()), "Sigmoid": ("sigmoid", ()), "LeakyRelu": ("leakyrelu", (0.01,)),
    "Clip": ("clip", (float("-inf"), float("inf"))), "HardSigmoid": ("hardsigmoid", (0.2, 0.5)),
}  # fmt: skip


def _check_fused_conv(node: ir.Node) -> str:
    activation = attr_str(node, "activation", "")
    if activation and activation not in _FUSED_ACTIVATIONS:
        return f"activation {activation!r} is not supported"
    return check_conv(node)


def _fused_conv(lw: Lowerer, node: ir.Node) -> None:
    """onnxruntime's FusedConv (its optimizer's Conv + activation): ``act(conv(X, W) + B + Z)``."""
    out = _conv_with_bias(lw, node)
    z = present(node, 3)
    if z is not None:
        out = lw.elementwise("add", [out, lw.tensor(z)])
    activation = attr_str(node, "activation", "")
    if activation:
        kind, defaults = _FUSED_ACTIVATIONS[activation]
        given = attr_floats(node, "activation_params") or []
        params = tuple(float(v) for v in given[: len(defaults)]) + defaults[len(given) :]
        out = lw.elementwise(kind, [out], params)
    lw.bind(node.outputs[0], out)


def lower_conv(lw: Lowerer, node: ir.Node, x: g.Tensor, weight: np.ndarray, bias: np.ndarray | None) -> g.Tensor:
    """``node``'s convolution of ``x`` by ``weight`` (OIHW, or OHWI in the ``codegraft.nhwc``
    domain) plus ``bias``, its window from ``node``'s attributes (ConvInteger passes its
    operands less their zero points, FusedConv adds its activation)."""
    native = node.domain == NHWC_DOMAIN
    given = weight.shape
    weight = weight.astype(np.float32)
    if not native:  # OIHW -> OHWI
        weight = np.moveaxis(weight, 1, -1)
    n, c, spatial = split_layout(x, native)
    group = attr_int(node, "group", 1)
    m, cg = weight.shape[0], weight.shape[-1]
    if c != cg * group or m % group:
        raise LoweringError(f"channels {c} do not match weight {given} with group={group}")
    window, out_spatial = window_of(node, spatial, tuple(weight.shape[1:-1]), ceil=False)
    out = lw.new(join_layout(n, m, out_spatial, native))
    lw.ops.append(g.Conv([x], out, weight=np.ascontiguousarray(weight), group=group, window=window, native_nhwc=native))
    if bias is not None:
        out = lw.elementwise("add", [out, lw.per_channel(bias, len(out.shape), native)])
    return out


def emit_conv(ctx: Context, kernel: Kernel) -> None:
    conv = core_of(kernel, g.Conv)
    assert conv.window is not None
    x = conv.inputs[0]
    phys_in, phys_out = x.physical_shape, kernel.out.physical_shape
    n, c = phys_in[0], phys_in[-1]
    spatial, out_spatial = list(phys_in[1:-1]), list(phys_out[1:-1])
    win = conv.window
    kernel_dims, strides, dilations = list(win.kernel), list(win.strides), list(win.dilations)
    pads_b, pads_e = list(win.pads_begin), list(win.pads_end)
    if len(spatial) == 1:  # 1-D: a 2-D conv with one row
        spatial, out_spatial = [1, *spatial], [1, *out_spatial]
        kernel_dims, strides, dilations = [1, *kernel_dims], [1, *strides], [1, *dilations]
        pads_b, pads_e = [0, *pads_b], [0, *pads_e]
    elif len(spatial) == 3:  # 3-D of kernel depth 1 (check_conv): each depth slice is one more image
        assert kernel_dims[0] == 1 and strides[0] == 1 and not pads_b[0] and not pads_e[0]
        n *= spatial[0]
        spatial, out_spatial = spatial[1:], out_spatial[1:]
        kernel_dims, strides, dilations = kernel_dims[1:], strides[1:], dilations[1:]
        pads_b, pads_e = pads_b[1:], pads_e[1:]
    h, w_ = spatial
    hp, wp = h + pads_b[0] + pads_e[0], w_ + pads_b[1] + pads_e[1]
    m = phys_out[-1]
    group = conv.group
    cg, mg = c // group, m // group
    taps = [
        (i * dilations[0] * wp + j * dilations[1]) * c for i in range(kernel_dims[0]) for j in range(kernel_dims[1])
    ]
    ep = emit_epilogue(ctx, kernel)
    src = ctx.ptr(x)
    weight = conv.weight.reshape(m, -1)  # OHWI: row m is (kh, kw, c) in tap order
    winograd = ctx.winograd and runs_as_winograd(conv, ctx.target.vector_floats)
    yrow = yimg = 0
    if kernel.border is not None:  # inside the next Conv's zero border (_fuse.py)
        y, ldy = ctx.bordered_output(kernel.out, kernel.border), m
        bordered_h, bordered_w = kernel.border[2:]
        yrow = bordered_w - out_spatial[-1]
        yimg = bordered_h * bordered_w - out_spatial[-2] * out_spatial[-1]
    elif kernel.slot is None:
        # the GEMM path (the depthwise kernel's epilogue runs per channel run; Winograd's
        # stores its results before the epilogue reads the residual)
        if (cg > 1 or mg > 1) and not winograd:
            write_over_residual(ctx, kernel)
        y, ldy = ctx.ptr(kernel.out), m
    else:  # write our channels straight into the Concat's output
        target, first = kernel.slot
        y, ldy = f"({ctx.ptr(target)} + {first})", target.physical_shape[-1]
    if cg == 1 and mg == 1:  # depthwise (never given a Concat slot, see _fuse.py)
        assert kernel.slot is None
        shape = DepthwiseShape(n, h, w_, c, out_spatial[0], out_spatial[1], kernel_dims[0], kernel_dims[1],
                               strides[0], strides[1], dilations[0], dilations[1], pads_b[0], pads_b[1])
        fn = ctx.name("dw")
        ctx.functions.append(depthwise_function(fn, shape, ep, ctx.target.vector_floats))
        dw = ctx.weight(np.ascontiguousarray(negligible_terms(weight).T))
        ctx.body.append(f"  {fn}({src}, {dw}, {y}, {ep}_ops);")
        return
    transformed = None
    if winograd:  # its input transform reads zeros outside the input itself: no padded copy
        frame = (hp, wp) if kernel.padded_input else (h, w_)
        at = (0, 0) if kernel.padded_input else (pads_b[0], pads_b[1])
        weight_ohwi = conv.weight.reshape(m, 3, 3, c)
        out_hw = (out_spatial[0], out_spatial[1])
        transformed = emit_winograd(ctx, src, (n, *frame, c), at, weight_ohwi, out_hw, y, ldy, yrow, yimg, ep)
        # what follows is the direct Conv, for an input holding an Inf or a NaN
    if (any(pads_b) or any(pads_e)) and not kernel.padded_input:
        padded = ctx.temp(n * hp * wp * c)
        ctx.body.append(f"  cg_pad({src}, {padded}, {n}, {h}, {w_}, {c}, {pads_b[0]}, {pads_b[1]}, {hp}, {wp});")
        src = padded
    run = cg
    if group == 1 and dilations[1] == 1:
        # A kernel row's taps are adjacent in channels-last memory: read them as one run of
        # kw * C values (same order as the packed weights), so the inner loop is long even
        # for 3-channel images.
        taps, run = [i * dilations[0] * wp * c for i in range(kernel_dims[0])], kernel_dims[1] * c
    tap_sym = ctx.name("tap")
    ctx.body.append(f"  static const long {tap_sym}[] = {c_longs(taps)};")
    rows = n * out_spatial[0] * out_spatial[1]
    nv, p = choose_tile(mg, rows, ctx.target.vector_floats, len(taps) * run)
    vector = ctx.target.vector_floats
    if transformed is None:
        packed, nmb = pack_weights(weight, group, nv, vector)
        wsym = ctx.weight(packed)
    else:  # built from the transformed weights when it runs: one copy of the weights in the library
        nmb = -(-m // (nv * vector))
        wsym = transformed.unpack(ctx, nmb, nv * vector)
    fused = vector_epilogue(kernel)
    contiguous = group == 1 and len(taps) == 1 and run == c and strides == [1, 1] and (hp, wp) == tuple(out_spatial)
    blocking = host_blocking(ctx.target.vector_floats)
    width = nv * ctx.target.vector_floats
    split = blocking.split(nmb, group, -(-rows // p), len(taps) * run, width, p, ctx.op_threads,
                           weights_outweigh_input=weights_outweigh(weight.size, n * h * w_ * c),
                           input_floats=n * h * w_ * c)
    driver = gemm_function(ctx, nv, p, fused, contiguous_input=n * h * w_ * c if contiguous else 0,
                           depth=len(taps) * run, fetch_next=split.fetch_next)
    rs_arg = row_strides_arg(ctx, ep, fused)
    job = ctx.name("job")
    ctx.body.append(
        f"  {{ const cg_gemm_t {job} = {{{src}, {c}, 1, {run}, {n}, {hp}, {wp}, {out_spatial[0]}, {out_spatial[1]}, "
        f"{strides[0]}, {strides[1]}, {len(taps)}, {tap_sym}, {group}, {mg}, {nmb}, {wsym}, {y}, {ldy}, 0, "
        f"{ep}, {ep}_ops, {split.runs}, {split.blocks_per_task}, {int(split.rows_outer)}, {yrow}, {yimg}{rs_arg}}};\n"
        f"    {driver}(&{job}); }}"
    )
    if winograd:
        ctx.body.append("  }")


# -- ConvTranspose ---------------------------------------------------------------------------------


@dataclass(eq=False)
class Col2Im(g.SpatialOp):
    """ConvTranspose's gather: ``inputs[0]`` is the 1x1 Conv's per-tap products (channels
    ``[group][tap][Cout / group]``), the output sums the taps that reach each pixel, plus ``bias``."""

    window: g.Window | None = None
    group: int = 1
    bias: np.ndarray | None = None
    exact: bool = False  # kernel == stride, no dilation, no output_padding: one tap per output pixel
    taps: np.ndarray | None = None  # depthwise: [taps][C] weights, and ``inputs[0]`` is the input itself
    row_epilogue: ClassVar[bool] = True


def check_conv_transpose(node: ir.Node) -> str:
    weight_dims = constant_weight_dims(node)
    if weight_dims is None:
        return "the weight must be a constant initializer"
    spatial = len(weight_dims) - 2
    if spatial not in (1, 2):
        return f"{spatial}-D ConvTranspose is not supported (only 1-D and 2-D)"
    bias = present(node, 2)
    if bias is not None and not is_constant(bias):
        return "the bias must be a constant initializer"
    auto_pad = attr_str(node, "auto_pad", "NOTSET")
    if auto_pad not in ("NOTSET", "VALID"):
        return f"auto_pad={auto_pad} is not supported (only NOTSET and VALID)"
    if attr_ints(node, "output_shape") is not None:
        return "the output_shape attribute is not supported (give pads and output_padding)"
    for name, length, least in (("strides", spatial, 1), ("dilations", spatial, 1), ("pads", 2 * spatial, 0),
                                ("output_padding", spatial, 0), ("kernel_shape", spatial, 1)):
        values = attr_ints(node, name)
        if values is not None and len(values) != length:
            return f"{name} has {len(values)} values, expected {length}"
        if values is not None and min(values) < least:
            return f"{name}={values} must be at least {least}"
    kernel = attr_ints(node, "kernel_shape")
    if kernel is not None and tuple(kernel) != tuple(int(d) for d in weight_dims[2:]):
        return f"kernel_shape={kernel} does not match the weight's {list(weight_dims[2:])}"
    strides = attr_ints(node, "strides") or [1] * spatial
    extra = attr_ints(node, "output_padding") or [0] * spatial
    if any(p >= s for p, s in zip(extra, strides, strict=True)):
        # the ONNX text allows up to max(stride, dilation); onnxruntime refuses, so do not guess
        return f"output_padding={extra} must be below the strides {strides}"
    group = attr_int(node, "group", 1)
    if group < 1 or int(weight_dims[0]) % group:
        return f"group={group} does not divide the weight's {weight_dims[0]} input channels"
    return ""


def conv_transpose_geometry(
    node: ir.Node, spatial_in: tuple[int, ...], kernel: tuple[int, ...]
) -> tuple[g.Window, tuple[int, ...]]:
    """The window of a ConvTranspose (kernel, strides, pads, dilations) and its output's spatial size.

    Each output size is ONNX's ``stride * (in - 1) + output_padding + (k - 1) * dilation + 1
    - pad_begin - pad_end``.
    """
    rank = len(kernel)
    strides = tuple(attr_ints(node, "strides") or [1] * rank)
    dilations = tuple(attr_ints(node, "dilations") or [1] * rank)
    pads = attr_ints(node, "pads") or [0] * (2 * rank)
    if attr_str(node, "auto_pad", "NOTSET") == "VALID":
        pads = [0] * (2 * rank)
    extra = attr_ints(node, "output_padding") or [0] * rank
    out = tuple(
        strides[i] * (spatial_in[i] - 1) + extra[i] + (kernel[i] - 1) * dilations[i] + 1 - pads[i] - pads[i + rank]
        for i in range(rank)
    )
    if min(out) < 1:
        raise LoweringError(f"output spatial size {list(out)} is empty")
    window = g.Window(kernel, strides, tuple(pads[:rank]), tuple(pads[rank:]), dilations)
    return window, out


def _conv_transpose(lw: Lowerer, node: ir.Node) -> None:
    x = lw.tensor(node.inputs[0])
    w = lw.tensor(node.inputs[1])
    assert w.const is not None
    weight = w.const.astype(np.float32)  # [Cin, Cout / group, k...]
    n, c, spatial = split_layout(x, False)
    group = attr_int(node, "group", 1)
    cin, cg_out, kernel = weight.shape[0], weight.shape[1], tuple(int(d) for d in weight.shape[2:])
    if c != cin or cin % group:
        raise LoweringError(f"channels {c} do not match weight {w.shape} with group={group}")
    cg_in, taps, m = cin // group, math.prod(kernel), cg_out * group
    window, out_spatial = conv_transpose_geometry(node, spatial, kernel)
    extra = attr_ints(node, "output_padding") or [0] * len(kernel)
    exact = not any(extra) and all(
        k == s and (d == 1 or k == 1) for k, s, d in zip(kernel, window.strides, window.dilations, strict=True)
    )
    bias = present(node, 2)
    bias_values = None
    if bias is not None:
        b = lw.tensor(bias)
        assert b.const is not None
        bias_values = np.ascontiguousarray(b.const.astype(np.float32).reshape(m))
    out = lw.new((n, m, *out_spatial))
    if cg_in == 1 and cg_out == 1:  # depthwise: the gather multiplies by each tap's weight itself
        per_tap = np.ascontiguousarray(weight.reshape(cin, taps).T)  # [t][c]
        lw.ops.append(Col2Im([x], out, window=window, group=group, bias=bias_values, exact=exact, taps=per_tap))
        lw.bind(node.outputs[0], out)
        return
    # The 1x1 Conv's OHWI weight: output channel gi * (taps * Cg) + t * Cg + c reads input
    # channel gi * Cg_in + ci with the ONNX weight [gi * Cg_in + ci, c, ky, kx].
    per_group = weight.reshape(group, cg_in, cg_out, taps)  # [gi][ci][c][t]
    ohwi = per_group.transpose(0, 3, 2, 1).reshape(group * taps * cg_out, *([1] * len(kernel)), cg_in)
    ones = tuple(1 for _ in kernel)
    zeros = tuple(0 for _ in kernel)
    col = lw.new((n, group * taps * cg_out, *spatial), hint="col")
    lw.ops.append(g.Conv([x], col, weight=np.ascontiguousarray(ohwi), group=group,
                         window=g.Window(ones, ones, zeros, zeros, ones)))
    lw.ops.append(Col2Im([col], out, window=window, group=group, bias=bias_values, exact=exact))
    lw.bind(node.outputs[0], out)


def emit_col2im(ctx: Context, kernel: Kernel) -> None:
    op = core_of(kernel, Col2Im)
    col, out = op.inputs[0], kernel.out  # the last fused step's output (op.out is never stored)
    assert op.window is not None
    phys_in, phys_out = col.physical_shape, out.physical_shape
    n, m = phys_in[0], phys_out[-1]
    spatial, out_spatial = list(phys_in[1:-1]), list(phys_out[1:-1])
    win = op.window
    size, strides, dil, pb = list(win.kernel), list(win.strides), list(win.dilations), list(win.pads_begin)
    if len(spatial) == 1:  # 1-D: one row
        spatial, out_spatial = [1, *spatial], [1, *out_spatial]
        size, strides, dil, pb = [1, *size], [1, *strides], [1, *dil], [0, *pb]
    assert phys_in[-1] == (m if op.taps is not None else m * size[0] * size[1])
    fn = ctx.define_once("cg_col2im", lambda: c_file("ops/conv_transpose.c"))
    bias = ctx.weight(op.bias if op.bias is not None else np.zeros(m, np.float32))
    taps = ctx.weight(op.taps) if op.taps is not None else "NULL"
    ep = emit_epilogue(ctx, kernel) if kernel.steps else ""
    flat = all(index.row_stride == 0 and index.col_stride == 0 for index in kernel.indexing)
    ctx.body.append(
        f"  {fn}({ctx.ptr(col)}, {bias}, {ctx.ptr(out)}, {n}, {spatial[0]}, {spatial[1]}, {op.group}, "
        f"{m // op.group}, {out_spatial[0]}, {out_spatial[1]}, {size[0]}, {size[1]}, {strides[0]}, {strides[1]}, "
        f"{pb[0]}, {pb[1]}, {dil[0]}, {dil[1]}, {int(op.exact)}, {ep or 'NULL'}, {ep + '_ops' if ep else 'NULL'}, "
        f"{int(flat)}, {taps});"
    )


# -- the family's entries in the op table ----------------------------------------------------------


ONNX = (
    OnnxOp("Conv", _conv, check_conv, nhwc=True),
    OnnxOp("FusedConv", _fused_conv, _check_fused_conv, contrib=True),
    OnnxOp("ConvTranspose", _conv_transpose, check_conv_transpose),
)
KERNELS = (
    KernelOp(g.Conv, Layout.CHANNELS_LAST, emit_conv),
    KernelOp(Col2Im, Layout.CHANNELS_LAST, emit_col2im),
)
