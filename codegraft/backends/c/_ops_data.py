"""Pools, Softmax, LayerNormalization, ReduceMean and data movement (Transpose, Concat, Copy)."""

from __future__ import annotations

import math

from codegraft.backends.c import _graph as g
from codegraft.backends.c._emit import Context
from codegraft.backends.c._ops_elementwise import c_float


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
        spatial, out_spatial = [1, *spatial], [1, *out_spatial]
        kernel, strides, dil = [1, *kernel], [1, *strides], [1, *dil]
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
    ctx.body.append(
        f"  cg_softmax({ctx.ptr(op.inputs[0])}, {ctx.ptr(op.out)}, {op.outer}, {op.n}, {op.inner}, {int(op.log)});"
    )


def emit_layernorm(ctx: Context, op: g.LayerNorm) -> None:
    scale = ctx.weight(op.scale)
    bias = ctx.weight(op.bias) if op.bias is not None else "(const float*)0"
    ctx.body.append(
        f"  cg_layernorm({ctx.ptr(op.inputs[0])}, {ctx.ptr(op.out)}, {scale}, {bias}, {op.outer}, {op.n}, "
        f"{c_float(op.epsilon)});"
    )


def emit_lrn(ctx: Context, op: g.Lrn) -> None:
    x = op.inputs[0]
    axis = x.perm.index(1)
    phys = x.physical_shape
    outer, channels, inner = math.prod(phys[:axis]), phys[axis], math.prod(phys[axis + 1 :])
    lo, hi = (op.size - 1) // 2, op.size // 2  # the window ONNX specifies: floor / ceil of (size - 1) / 2
    ctx.body.append(
        f"  cg_lrn({ctx.ptr(x)}, {ctx.ptr(op.out)}, {outer}, {channels}, {inner}, {lo}, {hi}, "
        f"{c_float(op.alpha / op.size)}, {c_float(op.beta)}, {c_float(op.bias)});"
    )


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
    if op.mean:
        lines.append(f"  for (long i = 0; i < {out.size}; i++) y[i] = y[i] / {float(count)!r}f;")
    lines.append("}")
    ctx.functions.append("\n".join(lines))
    ctx.body.append(f"  {fn}({ctx.ptr(x)}, {ctx.ptr(out)});")


def emit_transpose(ctx: Context, op: g.Transpose) -> None:
    """Physical transpose: axes merged where possible, then a tiled 2-D transpose per batch.

    Layout conversions at partition edges (NCHW <-> NHWC) are exactly ``[N][C][HW]`` <->
    ``[N][HW][C]``; full VW x VW tiles are transposed in registers (``cg_transpose_block``),
    the ragged edges element by element.
    """
    x, out = op.inputs[0], op.out
    in_strides = _strides(x.physical_shape)
    dims = [(x.physical_shape[p], in_strides[p]) for p in op.perm if x.physical_shape[p] != 1]
    merged: list[tuple[int, int]] = []
    for size, stride in dims:
        if merged and merged[-1][1] == stride * size:
            merged[-1] = (merged[-1][0] * size, stride)
        else:
            merged.append((size, stride))
    fn = ctx.name("transpose")
    lines = [f"static void {fn}_task(const void* ctx, long o) {{", "  const float* x = ((const float* const*)ctx)[0];",
             "  float* y = ((float* const*)ctx)[1];"]
    if not merged or merged[-1][1] == 1:
        inner = merged[-1][0] if merged else 1
        outer_dims = merged[:-1]
        lines += _decompose(outer_dims, 1)
        lines.append(f"  memcpy(y + o * {inner}, x + xo, {inner * 4});")
        tasks = math.prod(d for d, _ in outer_dims)
    else:
        sizes = [d for d, _ in merged]
        out_strides = _strides(tuple(sizes))
        tiled = next(i for i, (_, stride) in enumerate(merged) if stride == 1)
        last = len(merged) - 1
        outer_dims = [m for i, m in enumerate(merged) if i not in (tiled, last)]
        outer_out = [out_strides[i] for i in range(len(merged)) if i not in (tiled, last)]
        tiles = -(-sizes[tiled] // ctx.target.vector_floats)
        lines += _decompose(outer_dims, tiles, outer_out)
        in_stride, out_stride = merged[last][1], out_strides[tiled]
        lines.append(f"  const long a0 = ti * VW, a1 = cg_min(a0 + VW, {sizes[tiled]});")
        lines.append(f"  for (long b0 = 0; b0 < {sizes[last]}; b0 += VW) {{")
        lines.append(f"    const long b1 = cg_min(b0 + VW, {sizes[last]});")
        lines.append("    if (a1 - a0 == VW && b1 - b0 == VW) {")
        lines.append(f"      cg_transpose_block(x + xo + a0 + b0 * {in_stride}, {in_stride}, "
                     f"y + yo + a0 * {out_stride} + b0, {out_stride});")
        lines.append("      continue;")
        lines.append("    }")
        lines.append("    for (long a = a0; a < a1; a++)")
        lines.append("      for (long b = b0; b < b1; b++)")
        lines.append(f"        y[yo + a * {out_stride} + b] = x[xo + a + b * {in_stride}];")
        lines.append("  }")
        tasks = math.prod(d for d, _ in outer_dims) * tiles
    lines.append("}")
    lines.append(f"static void {fn}(const float* x, float* y) {{")
    lines.append("  const void* k[2] = {x, y};")
    if out.size > 32768:
        lines.append(f"  cg_parallel({tasks}, {fn}_task, k);")
    else:
        lines.append(f"  for (long t = 0; t < {tasks}; t++) {fn}_task(k, t);")
    lines.append("}")
    ctx.functions.append("\n".join(lines))
    ctx.body.append(f"  {fn}({ctx.ptr(x)}, {ctx.ptr(out)});")


def _decompose(dims: list[tuple[int, int]], tiles: int, out_strides: list[int] | None = None) -> list[str]:
    """Split task ``o`` into the tile ``ti`` and the outer axes' input/output offsets ``xo``/``yo``."""
    lines = [f"  long rest = o, xo = 0, yo = 0; const long ti = rest % {tiles}; rest /= {tiles};"]
    for index in reversed(range(len(dims))):
        size, stride = dims[index]
        out_stride = out_strides[index] if out_strides is not None else 0
        lines.append(
            f"  {{ const long i = rest % {size}; rest /= {size}; xo += i * {stride}; yo += i * {out_stride}; }}"
        )
    lines.append("  (void)ti; (void)yo; (void)rest;")
    return lines


def emit_concat(ctx: Context, op: g.Concat, in_place: frozenset[int] = frozenset()) -> None:
    """Copy each input's chunk into place along the physical concat axis (``in_place``: already there)."""
    out = op.out
    axis = out.perm.index(op.axis)
    phys = out.physical_shape
    outer = math.prod(phys[:axis])
    out_chunk = math.prod(phys[axis:])
    offset = 0
    y = ctx.ptr(out)
    for index, tensor in enumerate(op.inputs):
        chunk = math.prod(tensor.physical_shape[axis:])
        if index in in_place:
            offset += chunk
            continue
        ctx.body.append(
            f"  for (long o = 0; o < {outer}; o++) memcpy({y} + o * {out_chunk} + {offset}, "
            f"{ctx.ptr(tensor)} + o * {chunk}, {chunk * 4});"
        )
        offset += chunk


def emit_slice(ctx: Context, op: g.Slice) -> None:
    """Strided gather as nested loops (plain layouts)."""
    x, out = op.inputs[0], op.out
    in_strides, out_strides = _strides(x.shape), _strides(out.shape)
    base = sum(s * st for s, st in zip(op.starts, in_strides, strict=True))
    fn = ctx.name("slice")
    lines = [f"static void {fn}(const float* x, float* y) {{"]
    indent = "  "
    for axis, size in enumerate(out.shape):
        lines.append(f"{indent}for (long d{axis} = 0; d{axis} < {size}; d{axis}++)")
        indent += "  "
    src = " + ".join([str(base)] + [f"d{a} * {op.steps[a] * in_strides[a]}" for a in range(len(out.shape))])
    dst = " + ".join(["0"] + [f"d{a} * {out_strides[a]}" for a in range(len(out.shape))])
    lines.append(f"{indent}y[{dst}] = x[{src}];")
    lines.append("}")
    ctx.functions.append("\n".join(lines))
    ctx.body.append(f"  {fn}({ctx.ptr(x)}, {ctx.ptr(out)});")


def emit_pad(ctx: Context, op: g.Pad) -> None:
    """Fill with the constant, then copy the input's rows into place (plain layouts)."""
    x, out = op.inputs[0], op.out
    in_strides, out_strides = _strides(x.shape), _strides(out.shape)
    base = sum(b * st for b, st in zip(op.begins, out_strides, strict=True))
    fn = ctx.name("pad")
    lines = [f"static void {fn}(const float* x, float* y) {{",
             f"  for (long i = 0; i < {out.size}; i++) y[i] = {c_float(op.value)};"]
    indent = "  "
    for axis, size in enumerate(x.shape):
        lines.append(f"{indent}for (long d{axis} = 0; d{axis} < {size}; d{axis}++)")
        indent += "  "
    src = " + ".join(["0"] + [f"d{a} * {in_strides[a]}" for a in range(len(x.shape))])
    dst = " + ".join([str(base)] + [f"d{a} * {out_strides[a]}" for a in range(len(x.shape))])
    lines.append(f"{indent}y[{dst}] = x[{src}];")
    lines.append("}")
    ctx.functions.append("\n".join(lines))
    ctx.body.append(f"  {fn}({ctx.ptr(x)}, {ctx.ptr(out)});")


def emit_copy(ctx: Context, op: g.Copy) -> None:
    ctx.body.append(f"  memcpy({ctx.ptr(op.out)}, {ctx.ptr(op.inputs[0])}, {op.out.size * 4});")
