"""Elementwise code: scalar C expressions, fused loops over broadcast operands, epilogues.

NOTE: a fused group is emitted as one loop whose body evaluates every step into a local
``const float``; nothing between steps touches memory.  Broadcasting is resolved at
compile time into per-operand strides over the output's physical shape; adjacent axes
that every operand walks contiguously are merged, so the innermost loop has unit or zero
strides and the compiler vectorises it.
"""

from __future__ import annotations

import math

import numpy as np

from codegraft.backends.c import _graph as g
from codegraft.backends.c._emit import Context
from codegraft.backends.c._fuse import Kernel, Ref, Step


def c_float(value: float) -> str:
    """An exact C literal for a float32 value."""
    value = float(np.float32(value))
    if math.isinf(value):
        return "INFINITY" if value > 0 else "(-INFINITY)"
    if math.isnan(value):
        return "NAN"
    return f"{value.hex()}f" if value != 0 else "0.0f"


def _pow_const(x: str, exponent: float) -> str:
    return {1.0: x, 2.0: f"{x} * {x}", 3.0: f"{x} * {x} * {x}", 0.5: f"sqrtf({x})"}[exponent]


def expression(step: Step, args: list[str]) -> str:
    """C expression of one step over already-evaluated argument names."""
    a = args[0]
    p = [c_float(v) for v in step.params]
    kind = step.kind
    binary = {"add": "+", "sub": "-", "mul": "*", "div": "/"}
    if kind in binary:
        return f"{a} {binary[kind]} {args[1]}"
    if kind == "where":  # Where(condition as 0/1, x, y)
        return f"({a} != 0.0f ? {args[1]} : {args[2]})"
    if kind in ("max", "min", "prelu"):
        b = args[1]
        forms = {
            "max": f"cg_max_op({a}, {b})", "min": f"cg_min_op({a}, {b})", "prelu": f"({a} < 0.0f ? {b} * {a} : {a})"
        }
        return forms[kind]
    simple = {
        "pow": f"powf({a}, {args[1]})" if len(args) > 1 else "",
        "relu": f"({a} < 0.0f ? 0.0f : {a})",  # NaN passes through, as in onnxruntime (one maxps)
        "sigmoid": f"cg_sigmoid({a})",
        "tanh": f"cg_tanh({a})",
        "erf": f"cg_erf({a})",
        "gelu": f"0.5f * {a} * (1.0f + cg_erf({a} * 0x1.6a09e6p-1f))",
        "gelu_tanh": f"0.5f * {a} * (1.0f + cg_tanh(0x1.988454p-1f * ({a} + 0x1.6e5ba6p-5f * {a} * {a} * {a})))",
        "exp": f"cg_exp_op({a})",
        "sqrt": f"sqrtf({a})",
        "neg": f"-{a}",
        "abs": f"fabsf({a})",
        "reciprocal": f"1.0f / {a}",
        "hardswish": f"{a} * cg_fmax(0.0f, cg_fmin(1.0f, {a} * 0x1.555556p-3f + 0.5f))",
    }
    if kind in simple:
        return simple[kind]
    if kind == "elu":
        return f"({a} > 0.0f ? {a} : {p[0]} * (cg_exp({a}) - 1.0f))"
    if kind == "selu":
        return f"{p[1]} * ({a} > 0.0f ? {a} : {p[0]} * (cg_exp({a}) - 1.0f))"
    if kind == "softplus":  # log(1 + e^x), exact where e^x overflows a float
        return f"({a} > 20.0f ? {a} : log1pf(expf({a})))"
    if kind == "leakyrelu":
        return f"({a} >= 0.0f ? {a} : {a} * {p[0]})"
    if kind == "clip":
        return f"cg_clamp({a}, {p[0]}, {p[1]})"
    if kind == "hardsigmoid":
        return f"cg_fmax(0.0f, cg_fmin(1.0f, {p[0]} * {a} + {p[1]}))"
    if kind == "powc":
        return _pow_const(a, step.params[0])
    raise ValueError(f"unknown elementwise kind {kind!r}")


def step_lines(steps: list[Step], indent: str) -> list[str]:
    """``const float vK = ...;`` for each step; operands are ``iJ``, the anchor result ``acc``."""

    def name(ref: Ref) -> str:
        kind, index = ref
        return {"acc": "acc", "in": f"i{index}", "step": f"v{index}"}[kind]

    return [
        f"{indent}const float v{k} = {expression(step, [name(r) for r in step.args])};" for k, step in enumerate(steps)
    ]


def result_name(kernel: Kernel) -> str:
    return f"v{len(kernel.steps) - 1}" if kernel.steps else "acc"


def operand_strides(operand: g.Tensor, out: g.Tensor) -> list[int]:
    """Strides (in floats) of ``operand`` over ``out``'s physical axes; 0 where broadcast."""
    rank = len(out.shape)
    padded = (1,) * (rank - len(operand.shape)) + operand.shape
    physical = [padded[a] for a in out.perm]
    strides, step = [0] * rank, 1
    for axis in reversed(range(rank)):
        strides[axis] = step if physical[axis] != 1 else 0
        step *= physical[axis]
    return strides


def _collapse(sizes: list[int], strides: list[list[int]]) -> tuple[list[int], list[list[int]]]:
    """Drop size-1 axes and merge neighbours every operand walks as one."""
    keep = [i for i, s in enumerate(sizes) if s != 1] or [len(sizes) - 1] if sizes else []
    dims = [sizes[i] for i in keep] or [1]
    cols = [[s[i] for i in keep] or [0] for s in strides]
    merged_dims, merged = [dims[0]], [[c[0]] for c in cols]
    for axis in range(1, len(dims)):
        inner = dims[axis]
        if all(m[-1] == c[axis] * inner for m, c in zip(merged, cols, strict=True)):
            merged_dims[-1] *= inner
            for m, c in zip(merged, cols, strict=True):
                m[-1] = c[axis]
        else:
            merged_dims.append(inner)
            for m, c in zip(merged, cols, strict=True):
                m.append(c[axis])
    return merged_dims, merged


def emit_elementwise(ctx: Context, kernel: Kernel) -> None:
    """A standalone fused elementwise loop writing ``kernel.out``."""
    out = kernel.out
    sizes = list(out.physical_shape) or [1]
    strides = [operand_strides(t, out) or [0] for t in kernel.operands]
    dims, cols = _collapse(sizes, strides)
    inner, outer_dims = dims[-1], dims[:-1]
    outer = math.prod(outer_dims)
    block = 4096
    blocks = -(-inner // block)
    fn = ctx.name("ew")
    count = len(kernel.operands)
    fields = "".join(f"const float* p{j}; " for j in range(count))
    lines = [f"typedef struct {{ {fields}float* y; }} {fn}_t;"]
    lines.append(f"static void {fn}_task(const void* ctx, long task) {{")
    lines.append(f"  const {fn}_t* k = ctx;")
    lines += [f"  const float* p{j} = k->p{j};" for j in range(count)]
    lines.append("  float* y = k->y;")
    lines.append(f"  const long o = task / {blocks}, jb = task % {blocks};")
    lines.append("  long rest = o;")
    lines += [f"  long q{j} = 0;" for j in range(count)]
    for axis in reversed(range(len(outer_dims))):
        lines.append(f"  {{ const long i = rest % {outer_dims[axis]}; rest /= {outer_dims[axis]};")
        lines += [f"    q{j} += i * {col[axis]};" for j, col in enumerate(cols) if col[axis]]
        lines.append("  }")
    lines.append("  (void)rest;")
    lines.append(f"  float* yo = y + o * {inner};")
    lines.append(f"  const long j1 = jb * {block} + {block} < {inner} ? jb * {block} + {block} : {inner};")
    lines.append(f"  for (long j = jb * {block}; j < j1; j++) {{")
    for j, col in enumerate(cols):
        lines.append(f"    const float i{j} = p{j}[q{j}{' + j' if col[-1] else ''}];")
    lines += step_lines(kernel.steps, "    ")
    lines.append(f"    yo[j] = {result_name(kernel)};")
    lines += ["  }", "}"]
    params = ", ".join([f"const float* p{j}" for j in range(count)] + ["float* y"])
    lines.append(f"static void {fn}({params}) {{")
    lines.append(f"  const {fn}_t k = {{{', '.join([f'p{j}' for j in range(count)] + ['y'])}}};")
    tasks = outer * blocks
    if outer * inner > 32768:  # below that, waking the pool costs more than the loop
        lines.append(f"  cg_parallel({tasks}, {fn}_task, &k);")
    else:
        lines.append(f"  for (long t = 0; t < {tasks}; t++) {fn}_task(&k, t);")
    lines.append("}")
    ctx.functions.append("\n".join(lines))
    args = ", ".join([ctx.ptr(t) for t in kernel.operands] + [ctx.ptr(out)])
    ctx.body.append(f"  {fn}({args});")


def emit_epilogue(ctx: Context, kernel: Kernel) -> str:
    """The anchor's ``cg_ep`` function (store with fused steps); returns its name.

    The operand pointer array is declared in the entry body as ``<name>_ops``.
    """
    fn = ctx.name("ep")
    lines = [
        f"static void {fn}(const float* const* ops, float* y, long ldy, const float* t, long ldt,",
        "                 long r0, long nr, long c0, long nc) {",
    ]
    lines += [f"  const float* p{j} = ops[{j}];" for j in range(len(kernel.operands))]
    lines.append("  for (long r = 0; r < nr; r++) {")
    lines.append("    const long row = r0 + r;")
    lines.append("    float* yr = y + row * ldy + c0;")
    lines.append("    const float* tr = t + r * ldt;")
    for j, index in enumerate(kernel.indexing):
        lines.append(f"    const float* b{j} = p{j} + row * {index.row_stride} + c0 * {index.col_stride};")
    lines.append("    for (long c = 0; c < nc; c++) {")
    lines.append("      const float acc = tr[c];")
    for j, index in enumerate(kernel.indexing):
        lines.append(f"      const float i{j} = b{j}[{'c' if index.col_stride else '0'}];")
    lines += step_lines(kernel.steps, "      ")
    lines.append(f"      yr[c] = {result_name(kernel)};")
    lines += ["    }", "  }", "}"]
    ctx.functions.append("\n".join(lines))
    pointers = ", ".join(ctx.ptr(t) for t in kernel.operands) or "0"
    ctx.body.append(f"  const float* const {fn}_ops[] = {{{pointers}}};")
    return fn
