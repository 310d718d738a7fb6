"""The sliding window Conv and the pools share: its attribute check and its output geometry."""

from __future__ import annotations

import onnx_ir as ir

from codegraft.backends.c import _graph as g
from codegraft.backends.c._lowerer import LoweringError
from codegraft.backends.c._node import NHWC_DOMAIN, attr_ints, attr_str


def check_window(node: ir.Node, spatial: int, weight_dims: tuple[int, ...] | None = None) -> str:
    """Why the window attributes (``auto_pad``, strides, dilations, pads, kernel_shape) are not taken, or ``""``.

    ``weight_dims``: a Conv's constant weight, whose spatial dims are the kernel's.
    """
    auto_pad = attr_str(node, "auto_pad", "NOTSET")
    if auto_pad not in ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"):
        return f"auto_pad={auto_pad} is not supported"
    for name, length in (("strides", spatial), ("dilations", spatial), ("pads", 2 * spatial)):
        values = attr_ints(node, name)
        if values is not None and len(values) != length:
            return f"{name} has {len(values)} values, expected {length}"
        if values is not None and name != "pads" and min(values) < 1:
            return f"{name}={values} must be positive"
    if auto_pad.startswith("SAME") and any(d != 1 for d in attr_ints(node, "dilations") or []):
        # the padding rule for this case is not settled (onnxruntime refuses it); do not guess
        return f"auto_pad={auto_pad} with dilations is not supported"
    kernel = attr_ints(node, "kernel_shape")
    if kernel is not None and len(kernel) != spatial:
        return f"kernel_shape has {len(kernel)} values, expected {spatial}"
    if kernel is None and weight_dims is not None and node.op_type == "Conv":
        shape = [int(d) for d in weight_dims]
        kernel = shape[1:-1] if node.domain == NHWC_DOMAIN else shape[2:]
    strides = attr_ints(node, "strides") or [1] * spatial
    if auto_pad.startswith("SAME") and kernel and any(k < s for k, s in zip(kernel, strides, strict=False)):
        # the total padding would be negative (a crop); onnxruntime refuses it, so do not guess
        return f"auto_pad={auto_pad} with a kernel smaller than the stride is not supported"
    return ""


def window_of(
    node: ir.Node, spatial_in: tuple[int, ...], kernel: tuple[int, ...], ceil: bool
) -> tuple[g.Window, tuple[int, ...]]:
    """The window of ``node`` over an input of spatial size ``spatial_in``, and the output's spatial size."""
    rank = len(kernel)
    strides = tuple(attr_ints(node, "strides") or [1] * rank)
    dilations = tuple(attr_ints(node, "dilations") or [1] * rank)
    pads = attr_ints(node, "pads") or [0] * (2 * rank)
    auto_pad = attr_str(node, "auto_pad", "NOTSET")
    begin, end, out = [], [], []
    for i in range(rank):
        extent = (kernel[i] - 1) * dilations[i] + 1
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            size = -(-spatial_in[i] // strides[i])
            total = max(0, (size - 1) * strides[i] + extent - spatial_in[i])
            head = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
            begin.append(head)
            end.append(total - head)
            out.append(size)
            continue
        b, e = (0, 0) if auto_pad == "VALID" else (pads[i], pads[i + rank])
        span = spatial_in[i] + b + e - extent
        if ceil:
            size = -(-span // strides[i]) + 1
            # The last window must start inside the input or the leading pad (as onnxruntime).
            if (size - 1) * strides[i] >= spatial_in[i] + b:
                size -= 1
        else:
            size = span // strides[i] + 1
        begin.append(b)
        end.append(e)
        out.append(size)
    if min(out) < 1:
        raise LoweringError(f"output spatial size {out} is empty")
    return g.Window(tuple(kernel), strides, tuple(begin), tuple(end), dilations), tuple(out)


def split_layout(x: g.Tensor, native: bool) -> tuple[int, int, tuple[int, ...]]:
    """(N, C, spatial) of an image op's input in either form (NCHW, or the native NHWC)."""
    if native:
        return x.shape[0], x.shape[-1], x.shape[1:-1]
    return x.shape[0], x.shape[1], x.shape[2:]


def join_layout(n: int, c: int, spatial: tuple[int, ...], native: bool) -> tuple[int, ...]:
    return (n, *spatial, c) if native else (n, c, *spatial)
