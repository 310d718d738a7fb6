"""MaxPool, AveragePool (``count_include_pad``, ``ceil_mode``), GlobalAveragePool and GlobalMaxPool,
on channels-last data.

NOTE: the kernels (``cg_pool``, ``cg_global_pool``) are hand-written C in ``prelude.c``: one
task per output row, every channel of a pixel in the innermost loop; ``cg_pool`` holds a
pixel's channels in vector registers over its window, blocks of four vectors first, and
stores each once (0.78-0.91x as long as storing per tap, in the light models at 1 thread).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import onnx_ir as ir

from codegraft.backends.c import _graph as g
from codegraft.backends.c._emit import Context
from codegraft.backends.c._fuse import Kernel
from codegraft.backends.c._lowerer import Lowerer
from codegraft.backends.c._node import NHWC_DOMAIN, attr_int, attr_ints, rank_of
from codegraft.backends.c.ops._spec import KernelOp, Layout, OnnxOp, core_of
from codegraft.backends.c.ops._window import check_window, join_layout, split_layout, window_of

# -- MaxPool and AveragePool -----------------------------------------------------------------------


@dataclass(eq=False)
class Pool(g.SpatialOp):
    """Max or average pooling on channels-last data."""

    kind: str = "max"  # "max" | "avg"
    window: g.Window | None = None
    count_include_pad: bool = False
    border_output: ClassVar[bool] = True  # cg_pool takes the output's image size


def check_pool(node: ir.Node) -> str:
    kernel = attr_ints(node, "kernel_shape")
    if kernel is None:
        return "kernel_shape is required"
    if len(kernel) not in (1, 2):
        return f"{len(kernel)}-D pooling is not supported (only 1-D and 2-D)"
    if node.op_type == "AveragePool" and any(d != 1 for d in attr_ints(node, "dilations") or []):
        return "dilations are not supported"
    if node.op_type == "MaxPool":
        if len(node.outputs) > 1 and node.outputs[1].uses():
            return "the Indices output is not supported"
        if attr_int(node, "storage_order", 0) != 0:
            return "storage_order=1 is not supported"
    return check_window(node, len(kernel))


def _pool(lw: Lowerer, node: ir.Node) -> None:
    native = node.domain == NHWC_DOMAIN
    x = lw.tensor(node.inputs[0])
    n, c, spatial = split_layout(x, native)
    kernel = tuple(attr_ints(node, "kernel_shape") or [])
    ceil = attr_int(node, "ceil_mode", 0) != 0
    window, out_spatial = window_of(node, spatial, kernel, ceil)
    out = lw.new(join_layout(n, c, out_spatial, native))
    kind = "max" if node.op_type == "MaxPool" else "avg"
    include = attr_int(node, "count_include_pad", 0) != 0
    lw.ops.append(Pool([x], out, kind=kind, window=window, count_include_pad=include, native_nhwc=native))
    lw.bind(node.outputs[0], out)


def emit_pool(ctx: Context, kernel: Kernel) -> None:
    op = core_of(kernel, Pool)
    x, out = op.inputs[0], op.out
    assert op.window is not None
    phys_in, phys_out = x.physical_shape, out.physical_shape
    n, c = phys_in[0], phys_in[-1]
    spatial, out_spatial = list(phys_in[1:-1]), list(phys_out[1:-1])
    win = op.window
    size, strides, dil = list(win.kernel), list(win.strides), list(win.dilations)
    pb, pe = list(win.pads_begin), list(win.pads_end)
    if len(spatial) == 1:
        spatial, out_spatial = [1, *spatial], [1, *out_spatial]
        size, strides, dil = [1, *size], [1, *strides], [1, *dil]
        pb, pe = [0, *pb], [0, *pe]
    mode = 0 if op.kind == "max" else (2 if op.count_include_pad else 1)
    if kernel.border is not None:  # inside the next Conv's zero border (_fuse.py)
        y, image = ctx.bordered_output(out, kernel.border), list(kernel.border[2:])
    else:
        y, image = ctx.ptr(out), out_spatial
    ctx.body.append(
        f"  cg_pool({ctx.ptr(x)}, {y}, {n}, {spatial[0]}, {spatial[1]}, {c}, {out_spatial[0]}, "
        f"{out_spatial[1]}, {size[0]}, {size[1]}, {strides[0]}, {strides[1]}, {pb[0]}, {pb[1]}, {dil[0]}, "
        f"{dil[1]}, {mode}, {spatial[0] + pe[0]}, {spatial[1] + pe[1]}, {image[0]}, {image[1]});"
    )


# -- GlobalAveragePool and GlobalMaxPool -------------------------------------------------------------


@dataclass(eq=False)
class GlobalAveragePool(g.SpatialOp):
    """Mean over the spatial axes of channels-last data."""

    largest: ClassVar[bool] = False


@dataclass(eq=False)
class GlobalMaxPool(GlobalAveragePool):
    """Maximum over the spatial axes of channels-last data; a NaN is taken in wherever it sits,
    as this backend's ReduceMax does.  (A class of its own: profiles name kernels by class.)"""

    largest: ClassVar[bool] = True


def check_global_pool(node: ir.Node) -> str:
    rank = rank_of(node.inputs[0])
    if rank is not None and rank < 3:
        return f"input rank {rank} < 3"
    return ""


def _global_pool(lw: Lowerer, node: ir.Node) -> None:
    native = node.domain == NHWC_DOMAIN
    x = lw.tensor(node.inputs[0])
    n, c, spatial = split_layout(x, native)
    out = lw.new(join_layout(n, c, tuple(1 for _ in spatial), native))
    kind = GlobalMaxPool if node.op_type == "GlobalMaxPool" else GlobalAveragePool
    lw.ops.append(kind([x], out, native_nhwc=native))
    lw.bind(node.outputs[0], out)


def emit_global_pool(ctx: Context, kernel: Kernel) -> None:
    op = core_of(kernel, GlobalAveragePool)
    x = op.inputs[0]
    phys = x.physical_shape
    hw = math.prod(phys[1:-1])
    ctx.body.append(
        f"  cg_global_pool({ctx.ptr(x)}, {ctx.ptr(op.out)}, {phys[0]}, {hw}, {phys[-1]}, {int(op.largest)});"
    )


# -- the family's entries in the op table ----------------------------------------------------------


ONNX = (
    OnnxOp("MaxPool", _pool, check_pool, nhwc=True),
    OnnxOp("AveragePool", _pool, check_pool, nhwc=True),
    OnnxOp("GlobalAveragePool", _global_pool, check_global_pool, nhwc=True),
    OnnxOp("GlobalMaxPool", _global_pool, check_global_pool, nhwc=True),
)


KERNELS = (
    KernelOp(Pool, Layout.CHANNELS_LAST, emit_pool),
    KernelOp(GlobalAveragePool, Layout.CHANNELS_LAST, emit_global_pool),
    KernelOp(GlobalMaxPool, Layout.CHANNELS_LAST, emit_global_pool),
)
