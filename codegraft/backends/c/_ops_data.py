"""Pools, Softmax, ReduceMean and data movement (Transpose, Concat, Copy)."""

from __future__ import annotations

import math

from codegraft.backends.c import _graph as g
from codegraft.backends.c._emit import Context


def emit_pool(ctx: Context, op: g.Pool) -> None:
    x, out = op.inputs[0], op.out
    assert op.window is not None
    phys_in, phys_out = x.physical_shape, out.physical_shape
    n, c = phys_in[0], phys_in[-1]
    spatial, out_spatial = list(phys_in[1:-1]), list(phys_out[1:-1])
    win = op.window
    kernel, strides, dil = list(win.kernel), list(win.strides), list(win.dilations)
    pb, pe = list(win.pads_begin), list(win.pads_end)
    if len(spatial) == 1:
        spatial, out_spatial, kernel, strides, dil = [1, *spatial], [1, *out_spatial], [1, *kernel], [1, *strides], [1, *dil]
        pb, pe = [0, *pb], [0, *pe]
    mode = 0 if op.kind == "max" else (2 if op.count_include_pad else 1)
    ctx.body.append(
        f"  cg_pool({ctx.ptr(x)}, {ctx.ptr(out)}, {n}, {spatial[0]}, {spatial[1]}, {c}, {out_spatial[0]}, "
        f"{out_spatial[1]}, {kernel[0]}, {kernel[1]}, {strides[0]}, {strides[1]}, {pb[0]}, {pb[1]}, {dil[0]}, "
        f"{dil[1]}, {mode}, {spatial[0] + pe[0]}, {spatial[1] + pe[1]});"
    )


def emit_global_average(ctx: Context, op: g.GlobalAveragePool) -> None:
    x = op.inputs[0]
    phys = x.physical_shape
    hw = math.prod(phys[1:-1])
    ctx.body.append(f"  cg_global_avg({ctx.ptr(x)}, {ctx.ptr(op.out)}, {phys[0]}, {hw}, {phys[-1]});")


def emit_softmax(ctx: Context, op: g.Softmax) -> None:
    ctx.body.append(f"  cg_softmax({ctx.ptr(op.inputs[0])}, {ctx.ptr(op.out)}, {op.outer}, {op.n}, {op.inner});")


def _strides(shape: tuple[int, ...]) -> list[int]:
    strides, step = [0] * len(shape), 1
    for axis in reversed(range(len(shape))):
        strides[axis] = step
        step *= shape[axis]
    return strides


def emit_reduce_mean(ctx: Context, op: g.ReduceMean) -> None:
    """Accumulate every input element into its output slot, then scale (plain layouts)."""
    x, out = op.inputs[0], op.out
    shape = x.shape
    out_strides = _strides(out.shape)
    count = math.prod(shape[a] for a in op.axes)
    fn = ctx.name("reduce")
    lines = [f"static void {fn}(const float* x, float* y) {{", f"  for (long i = 0; i < {out.size}; i++) y[i] = 0.0f;"]
    lines.append("  long src = 0;")
    indent = "  "
    for axis, size in enumerate(shape):
        lines.append(f"{indent}for (long d{axis} = 0; d{axis} < {size}; d{axis}++)")
        indent += "  "
    offset = " + ".join(f"d{a} * {out_strides[a]}" for a in range(len(shape)) if a not in op.axes) or "0"
    lines.append(f"{indent}y[{offset}] += x[src++];")
    lines.append(f"  for (long i = 0; i < {out.size}; i++) y[i] = y[i] / {float(count)!r}f;")
    lines.append("}")
    ctx.functions.append("\n".join(lines))
    ctx.body.append(f"  {fn}({ctx.ptr(x)}, {ctx.ptr(out)});")


def emit_transpose(ctx: Context, op: g.Transpose) -> None:
    """Physical transpose as nested loops; the outermost is split across threads."""
    x, out = op.inputs[0], op.out
    in_shape = x.physical_shape
    in_strides = _strides(in_shape)
    out_shape = tuple(in_shape[p] for p in op.perm)
    fn = ctx.name("transpose")
    lines = [f"static void {fn}(const float* x, float* y) {{"]
    if not out_shape:
        lines.append("  y[0] = x[0];")
    else:
        out_strides = _strides(out_shape)
        lines.append(f"  #pragma omp parallel for schedule(static) if({int(out.size > 32768)})")
        indent = "  "
        for axis, size in enumerate(out_shape):
            lines.append(f"{indent}for (long d{axis} = 0; d{axis} < {size}; d{axis}++)")
            indent += "  "
        src = " + ".join(f"d{a} * {in_strides[op.perm[a]]}" for a in range(len(out_shape)))
        dst = " + ".join(f"d{a} * {out_strides[a]}" for a in range(len(out_shape)))
        lines.append(f"{indent}y[{dst}] = x[{src}];")
    lines.append("}")
    ctx.functions.append("\n".join(lines))
    ctx.body.append(f"  {fn}({ctx.ptr(x)}, {ctx.ptr(out)});")


def emit_concat(ctx: Context, op: g.Concat) -> None:
    """Copy each input's chunk into place along the physical concat axis."""
    out = op.out
    axis = out.perm.index(op.axis)
    phys = out.physical_shape
    outer = math.prod(phys[:axis])
    out_chunk = math.prod(phys[axis:])
    offset = 0
    y = ctx.ptr(out)
    for tensor in op.inputs:
        chunk = math.prod(tensor.physical_shape[axis:])
        ctx.body.append(
            f"  for (long o = 0; o < {outer}; o++) memcpy({y} + o * {out_chunk} + {offset}, "
            f"{ctx.ptr(tensor)} + o * {chunk}, {chunk * 4});"
        )
        offset += chunk


def emit_copy(ctx: Context, op: g.Copy) -> None:
    ctx.body.append(f"  memcpy({ctx.ptr(op.out)}, {ctx.ptr(op.inputs[0])}, {op.out.size * 4});")
