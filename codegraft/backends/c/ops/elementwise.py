"""Elementwise ops: each kind's C expression, the ONNX ops made of them, fused loops and epilogues.

NOTE: a fused group is emitted as one loop whose body evaluates every step into a local
``const float``; nothing between steps touches memory.  Broadcasting is resolved at
compile time into per-operand strides over the output's physical shape; adjacent axes
that every operand walks contiguously are merged, so the innermost loop has unit or zero
strides and the compiler vectorises it.  The same expressions are the epilogues Conv and
MatMul apply to each register tile (``emit_epilogue``).

Adding a one-input op is one :class:`Unary` line: its C expression over ``{a}``, with the
float attributes it reads as ``{p0}``, ``{p1}``.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from codegraft.backends.c import _graph as g
from codegraft.backends.c._emit import Context
from codegraft.backends.c._fuse import Kernel, Ref, Step
from codegraft.backends.c._lowerer import Lowerer, LoweringError
from codegraft.backends.c._node import (
    attr_float,
    attr_floats,
    attr_int,
    attr_str,
    compile_time,
    is_constant,
    opset_of,
    present,
    rank_of,
)
from codegraft.backends.c.ops._spec import INTEGER_DTYPES, KernelOp, Layout, OnnxOp


@dataclass(frozen=True)
class Unary:
    """A one-input ONNX op that is one C expression: ``{a}`` the input, ``{p0}``/``{p1}`` its float ``attributes``
    (``ml``: an op of the ``ai.onnx.ml`` domain, ``OnnxOp.ml``)."""

    op_type: str
    c: str
    attributes: tuple[tuple[str, float], ...] = ()  # (name, default), in parameter order
    ml: bool = False

    @property
    def kind(self) -> str:
        return self.op_type.lower()

    def lower(self, lw: Lowerer, node: ir.Node) -> None:
        x = lw.tensor(node.inputs[0])
        params = tuple(attr_float(node, name, default) for name, default in self.attributes)
        lw.bind(node.outputs[0], lw.elementwise(self.kind, [x], params))


UNARY = (
    Unary("Relu", "({a} < 0.0f ? 0.0f : {a})"),  # NaN passes through, as in onnxruntime (one maxps)
    Unary("LeakyRelu", "({a} >= 0.0f ? {a} : {a} * {p0})", (("alpha", 0.01),)),
    Unary("Elu", "({a} > 0.0f ? {a} : {p0} * (cg_exp({a}) - 1.0f))", (("alpha", 1.0),)),
    Unary("Selu", "{p1} * ({a} > 0.0f ? {a} : {p0} * (cg_exp({a}) - 1.0f))",
          (("alpha", 1.6732632423543772), ("gamma", 1.0507009873554805))),
    Unary("Softplus", "({a} > 20.0f ? {a} : log1pf(expf({a})))"),  # log(1 + e^x), exact where e^x overflows a float
    Unary("Sigmoid", "cg_sigmoid({a})"),
    Unary("Tanh", "cg_tanh({a})"),
    Unary("HardSigmoid", "cg_fmax(0.0f, cg_fmin(1.0f, {p0} * {a} + {p1}))", (("alpha", 0.2), ("beta", 0.5))),
    Unary("HardSwish", "{a} * cg_fmax(0.0f, cg_fmin(1.0f, {a} * 0x1.555556p-3f + 0.5f))"),
    Unary("Erf", "cg_erf({a})"),
    Unary("Exp", "cg_exp_op({a})"),
    Unary("Sqrt", "sqrtf({a})"),
    Unary("Log", "logf({a})"),
    Unary("Sin", "cg_sin({a})"),  # a diffusion model's timestep embedding, an STFT's window, a DFT
    Unary("Cos", "cg_cos({a})"),
    Unary("Neg", "-{a}"),
    Unary("Abs", "fabsf({a})"),
    Unary("Reciprocal", "1.0f / {a}"),
    Unary("Floor", "floorf({a})"),  # (an old dynamic quantizer's int32 bias: Floor(b / scale))
    Unary("Ceil", "ceilf({a})"),
    Unary("Round", "rintf({a})"),  # half to even, as ONNX rounds
    # -0 gives 0 and NaN stays NaN, as onnxruntime's
    Unary("Sign", "({a} > 0.0f ? 1.0f : {a} < 0.0f ? -1.0f : {a} == 0.0f ? 0.0f : {a})"),
    # the C library's, as onnxruntime calls them (tf2onnx's Atan2 is Atan and Sign: a fingerprint
    # model's ridge orientations)
    Unary("Atan", "atanf({a})"),
    Unary("Tan", "tanf({a})"),
    Unary("Asin", "asinf({a})"),
    Unary("Acos", "acosf({a})"),
    Unary("Sinh", "sinhf({a})"),
    Unary("Cosh", "coshf({a})"),
    Unary("Asinh", "asinhf({a})"),
    Unary("Acosh", "acoshf({a})"),
    Unary("Atanh", "atanhf({a})"),
    # ai.onnx.ml: 1 above the threshold, else 0 (float only, as onnxruntime registers it; a NaN,
    # which onnxruntime answers with an error, gives 0)
    Unary("Binarizer", "({a} > {p0} ? 1.0f : 0.0f)", (("threshold", 0.0),), ml=True),
)

# The C expression of every elementwise kind (``g.Elementwise.kind``): operands ``{a}``, ``{b}``,
# ``{c}``; float parameters ``{p0}``, ``{p1}`` as exact literals.  ``powc`` is ``expression``'s own.
EXPRESSIONS: dict[str, str] = {
    "add": "{a} + {b}",
    "sub": "{a} - {b}",
    "mul": "{a} * {b}",
    "div": "{a} / {b}",
    "pow": "powf({a}, {b})",
    "prelu": "({a} < 0.0f ? {b} * {a} : {a})",
    "max": "cg_max_op({a}, {b})",
    "min": "cg_min_op({a}, {b})",
    "where": "({a} != 0.0f ? {b} : {c})",  # Where(condition as 0/1, x, y)
    # comparisons and logic: bool as 0/1 floats (IEEE: a NaN compares false, as in onnxruntime)
    "less": "({a} < {b} ? 1.0f : 0.0f)",
    "less_equal": "({a} <= {b} ? 1.0f : 0.0f)",
    "greater": "({a} > {b} ? 1.0f : 0.0f)",
    "greater_equal": "({a} >= {b} ? 1.0f : 0.0f)",
    "equal": "({a} == {b} ? 1.0f : 0.0f)",
    "and": "({a} != 0.0f && {b} != 0.0f ? 1.0f : 0.0f)",
    "or": "({a} != 0.0f || {b} != 0.0f ? 1.0f : 0.0f)",
    "xor": "(({a} != 0.0f) != ({b} != 0.0f) ? 1.0f : 0.0f)",
    "not": "({a} != 0.0f ? 0.0f : 1.0f)",
    "isnan": "({a} != {a} ? 1.0f : 0.0f)",
    "nonzero": "({a} != 0.0f ? 1.0f : 0.0f)",  # Cast to bool
    # IsInf(detect_negative = p0, detect_positive = p1)
    "isinf": "(({a} == INFINITY && {p1} != 0.0f) || ({a} == -INFINITY && {p0} != 0.0f) ? 1.0f : 0.0f)",
    "clip": "cg_clamp({a}, {p0}, {p1})",
    "clip_min": "cg_clamp({a}, {b}, INFINITY)",  # Clip by a computed lower bound
    "clip_max": "cg_clamp({a}, -INFINITY, {b})",
    "gelu": "0.5f * {a} * (1.0f + cg_erf({a} * 0x1.6a09e6p-1f))",
    "gelu_tanh": "0.5f * {a} * (1.0f + cg_tanh(0x1.988454p-1f * ({a} + 0x1.6e5ba6p-5f * {a} * {a} * {a})))",
    "fmod": "fmodf({a}, {b})",  # Mod of floats (fmod=1; C's fmod, the dividend's sign)
    # uint8 quantization by a scale {b} and zero point {c} (held as exact floats), clamped
    # before rounding as onnxruntime's MlasQuantizeLinear does (the bounds are integers)
    "quantize_u8": "rintf(cg_clamp({a} / {b}, -{c}, 255.0f - {c})) + {c}",
    # QuantizeLinear to the type's range [p0, p1] by a scale {b} and zero point {c}: the same
    # steps, a NaN to the lowest value (MlasQuantizeLinear's MAXPS keeps the bound for a NaN)
    "quantize": "rintf(cg_qclamp({a} / {b}, {p0} - {c}, {p1} - {c})) + {c}",
    # QLinearConv's requantization (MlasRequantizeOutput): an int32 sum as a float times the
    # multiplier {b}, the same clamp and rounding, the zero point {c}
    "requantize": "rintf(cg_qclamp({a} * {b}, {p0} - {c}, {p1} - {c})) + {c}",
    "round_half": "cg_half({a})",  # Cast to float16 (computed in float32: ops/_spec.FLOATS)
    "probit": "cg_probit({a})",  # ai.onnx.ml's PROBIT post transform, in onnxruntime's arithmetic
    "mlas_logistic": "cg_mlas_logistic({a})",  # ai.onnx.ml's LOGISTIC: MLAS's FMA3 kernel, bit for bit
    "ml_logistic": "cg_ml_logistic({a})",  # ml_common.h's ComputeLogistic
    # ai.onnx.ml's Imputer: {b} where {a} is the replaced value {p0}, or where it is NaN
    "impute": "({a} == {p0} ? {b} : {a})",
    "impute_nan": "({a} != {a} ? {b} : {a})",
    **{op.kind: op.c for op in UNARY},
    **{kind: c for kind, c in (
        # Integers held as exact floats (every one up to 2**24): a result that float32 cannot
        # hold exactly, or a division by zero, raises cg_int_overflow and the call goes to the
        # host (INTEGER_HELPERS; the runtime reads the flag after each call).
        ("iadd", "cg_int({a} + {b})"),
        ("isub", "cg_int({a} - {b})"),
        ("imul", "cg_int({a} * {b})"),
        ("idiv", "cg_idiv({a}, {b})"),
        ("imod", "cg_imod({a}, {b})"),
        ("ifmod", "cg_ifmod({a}, {b})"),
        ("itrunc", "cg_itrunc({a}, {p0})"),  # Cast of a float to an integer type of range +-{p0}
        ("iwrap", "cg_wrap({a}, {p0}, {p1})"),  # into a narrow type's {p1} values from {p0}
    )},
}
# Kinds calling ops/mlas_math.c (the partition's C then carries it).
MLAS_KINDS = frozenset({"probit", "mlas_logistic", "ml_logistic"})
INTEGER_KINDS = frozenset({"iadd", "isub", "imul", "idiv", "imod", "ifmod", "itrunc", "iwrap"})
# Defined in a program only where an integer kind is used (float programs' C is unchanged).
# Below 2**24 in magnitude (strictly: 2**24 + 1 rounds to 2**24) a float32 result of integer
# operands is exact; the quotient and remainder are taken in double, exact for such operands.
INTEGER_HELPERS = """
int cg_int_overflow;
static inline float cg_int(float v) {
  if (!(fabsf(v) < 16777216.0f)) cg_int_overflow = 1;
  return v;
}
/* cg_int lane by lane, for a Conv's or MatMul's register tiles (an int32 bias added to a
   ConvInteger's sums: ddddocr's int8 model) */
static inline vf cg_vint(vf v) {
  const vi beyond = ~((vf)((vi)v & 0x7fffffff) < 16777216.0f);
  int any = 0;
  for (int l = 0; l < VW; l++) any |= beyond[l];
  if (any) cg_int_overflow = 1;
  return v;
}
/* Cast of a float to int32 (bound 2**31) or int64 (2**63): toward zero, exact as a float at any
   size (a float beyond 2**24 is an integer); NaN, infinities and values out of range give the
   lowest value, as x86's conversions give onnxruntime (T5's relative-position buckets cast
   log(0) = -inf in the branch their Where drops). */
static inline float cg_itrunc(float v, float bound) { return fabsf(v) < bound ? truncf(v) : -bound; }
static inline float cg_wrap(float v, float lowest, float count) {  /* exact: count is a power of 2 */
  return v - count * floorf((v - lowest) / count);
}
static inline float cg_idiv(float a, float b) {  /* truncated, as C and onnxruntime divide */
  if (b == 0.0f) { cg_int_overflow = 1; return 0.0f; }
  return (float)trunc((double)a / (double)b);
}
static inline float cg_ifmod(float a, float b) {  /* the dividend's sign (fmod=1) */
  if (b == 0.0f) { cg_int_overflow = 1; return 0.0f; }
  return (float)fmod((double)a, (double)b);
}
static inline float cg_imod(float a, float b) {  /* the divisor's sign (fmod=0, as Python's %) */
  if (b == 0.0f) { cg_int_overflow = 1; return 0.0f; }
  double r = fmod((double)a, (double)b);
  if (r != 0.0 && ((r < 0.0) != (b < 0.0f))) r += b;
  return (float)r;
}
"""


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
    if step.kind == "powc":  # Pow by a constant 1, 2, 3 or 0.5: multiplications (see _binary)
        return _pow_const(args[0], step.params[0])
    template = EXPRESSIONS.get(step.kind)
    if template is None:
        raise ValueError(f"unknown elementwise kind {step.kind!r}")
    operands = dict(zip("abc", args, strict=False))
    return template.format(**operands, **{f"p{i}": c_float(v) for i, v in enumerate(step.params)})


# -- checks and lowerings of the ONNX ops ------------------------------------------------------


def check_clip(node: ir.Node) -> str:
    for index in (1, 2):
        bound = present(node, index)
        # ONNX makes bounds scalars; a computed one of unknown shape is checked at lowering
        dims = None if bound is None or bound.shape is None else bound.shape.dims
        if bound is not None and not is_constant(bound) and dims is not None \
                and all(isinstance(d, int) for d in dims) and math.prod(dims) != 1:  # fmt: skip
            return f"{'min' if index == 1 else 'max'} must be a constant or a one-value tensor"
    return ""


def _check_gelu(node: ir.Node) -> str:
    approximate = attr_str(node, "approximate", "none")
    return "" if approximate in ("none", "tanh") else f"approximate={approximate!r} is not supported"


def _gelu(lw: Lowerer, node: ir.Node) -> None:
    tanh = attr_str(node, "approximate", "none") == "tanh"
    lw.bind(node.outputs[0], lw.elementwise("gelu_tanh" if tanh else "gelu", [lw.tensor(node.inputs[0])]))


def _bias_gelu(lw: Lowerer, node: ir.Node) -> None:
    """onnxruntime's BiasGelu (erf) and FastGelu (tanh): GELU of ``x + bias``, the bias optional."""
    x = lw.tensor(node.inputs[0])
    bias = present(node, 1)
    if bias is not None:
        x = lw.elementwise("add", [x, lw.tensor(bias)])
    tanh = node.op_type == "FastGelu"
    lw.bind(node.outputs[0], lw.elementwise("gelu_tanh" if tanh else "gelu", [x]))


def _clip(lw: Lowerer, node: ir.Node) -> None:
    """Constant bounds are parameters of one step; a computed one (a log-mel spectrogram's
    ``max(x, x.max() - 80)``, openWakeWord's) is an operand of a step of its own."""
    x = lw.tensor(node.inputs[0])
    given = {index: present(node, index) for index in (1, 2)} if opset_of(node) >= 11 else {}
    computed = {index: v for index, v in given.items() if v is not None and v.const_value is None}
    out = lw.elementwise("clip", [x], _clip_bounds(node)) if len(computed) < 2 else x
    for index, bound in computed.items():
        scalar = lw.view(lw.tensor(bound), ())
        out = lw.elementwise("clip_min" if index == 1 else "clip_max", [out, scalar])
    lw.bind(node.outputs[0], out)


def _clip_bounds(node: ir.Node) -> tuple[float, float]:
    if opset_of(node) < 11:
        return attr_float(node, "min", -math.inf), attr_float(node, "max", math.inf)
    bounds = []
    for index, default in ((1, -math.inf), (2, math.inf)):
        value = present(node, index)
        if value is None or value.const_value is None:
            bounds.append(default)
        else:
            bounds.append(float(np.asarray(value.const_value.numpy()).reshape(-1)[0]))
    return bounds[0], bounds[1]


_BINARY_KIND = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Pow": "pow", "PRelu": "prelu"}


_INTEGER_KIND = {"add": "iadd", "sub": "isub", "mul": "imul", "div": "idiv"}


def integer_valued(value: ir.Value | None) -> bool:
    """Whether ``value`` holds integers (not bool): computed on as exact floats."""
    return value is not None and value.dtype in INTEGER_DTYPES


def _check_binary(node: ir.Node) -> str:
    if integer_valued(node.outputs[0]) and _BINARY_KIND[node.op_type] not in _INTEGER_KIND:
        return f"{node.op_type} of integers is not supported"
    return ""


def _binary(lw: Lowerer, node: ir.Node) -> None:
    inputs = [lw.tensor(node.inputs[0]), lw.tensor(node.inputs[1])]
    kind = _BINARY_KIND[node.op_type]
    if integer_valued(node.outputs[0]):
        lw.bind(node.outputs[0], lw.elementwise(_INTEGER_KIND[kind], inputs))
        return
    x, slope = inputs
    if kind == "prelu" and opset_of(node) < 7 and len(x.shape) > 2 and slope.shape == (x.shape[1],):
        # opset < 7 PRelu: a [C] slope is per channel (axis 1), not numpy-broadcast on the last axis
        inputs[1] = lw.view(slope, (x.shape[1], *([1] * (len(x.shape) - 2))))
    if kind == "pow" and inputs[1].const is not None and inputs[1].size == 1:
        exponent = float(inputs[1].const.reshape(-1)[0])
        if exponent in (1.0, 2.0, 3.0, 0.5):  # exact shortcuts (powf is slow and these are common)
            shape = np.broadcast_shapes(inputs[0].shape, inputs[1].shape)
            y = lw.elementwise("powc", [inputs[0]], (exponent,))
            lw.bind(node.outputs[0], y if y.shape == shape else lw.broadcast_to(y, shape))
            return
    lw.bind(node.outputs[0], lw.elementwise(kind, inputs))


_VARIADIC_KIND = {"Sum": "add", "Max": "max", "Min": "min"}
# Ops with a bool output, computed as 0/1 floats; their operands may be bool or integers
# converted at the partition's entry (integers beyond 2**24, which float32 cannot tell
# apart, make the runtime hand the partition to the host: ``COMPARED_EXACTLY``).
_COMPARISON_KIND = {"Less": "less", "LessOrEqual": "less_equal", "Greater": "greater",
                    "GreaterOrEqual": "greater_equal", "Equal": "equal"}  # fmt: skip
_LOGIC_KIND = {"And": "and", "Or": "or", "Xor": "xor"}
COMPARED_EXACTLY = frozenset(_COMPARISON_KIND)


def _compare(lw: Lowerer, node: ir.Node) -> None:
    kind = {**_COMPARISON_KIND, **_LOGIC_KIND}[node.op_type]
    lw.bind(node.outputs[0], lw.elementwise(kind, [lw.tensor(node.inputs[0]), lw.tensor(node.inputs[1])]))


def _not(lw: Lowerer, node: ir.Node) -> None:
    lw.bind(node.outputs[0], lw.elementwise("not", [lw.tensor(node.inputs[0])]))


def _isnan(lw: Lowerer, node: ir.Node) -> None:
    # (attention softmaxes guard against all-masked rows: Where(IsNaN(p), 0, p), once a layer)
    lw.bind(node.outputs[0], lw.elementwise("isnan", [lw.tensor(node.inputs[0])]))


def _isinf(lw: Lowerer, node: ir.Node) -> None:
    flags = (float(attr_int(node, "detect_negative", 1)), float(attr_int(node, "detect_positive", 1)))
    lw.bind(node.outputs[0], lw.elementwise("isinf", [lw.tensor(node.inputs[0])], flags))


def _variadic(lw: Lowerer, node: ir.Node) -> None:
    """Sum, Max and Min: a chain of the binary op."""
    inputs = [lw.tensor(v) for v in node.inputs if v is not None]
    kind = _VARIADIC_KIND[node.op_type]
    y = inputs[0]
    for other in inputs[1:]:
        y = lw.elementwise(kind, [y, other])
    if len(inputs) == 1:
        y = lw.view(y, y.shape)
    lw.bind(node.outputs[0], y)


def _check_mod(node: ir.Node) -> str:
    if not integer_valued(node.outputs[0]) and attr_int(node, "fmod", 0) != 1:
        return "Mod of floats needs fmod=1"
    return ""


def _mod(lw: Lowerer, node: ir.Node) -> None:
    inputs = [lw.tensor(node.inputs[0]), lw.tensor(node.inputs[1])]
    if not integer_valued(node.outputs[0]):
        kind = "fmod"
    else:
        kind = "ifmod" if attr_int(node, "fmod", 0) else "imod"
    lw.bind(node.outputs[0], lw.elementwise(kind, inputs))


def _check_scaler(node: ir.Node) -> str:
    """ai.onnx.ml's Scaler as onnxruntime's ``scaler.cc`` takes it: offset and scale of one length,
    1 or the feature count (axis 1 of a 2-D input, axis 0 of a 1-D one)."""
    scale, offset = attr_floats(node, "scale") or [], attr_floats(node, "offset") or []
    if not scale or len(scale) != len(offset):
        return f"scale ({len(scale)} values) and offset ({len(offset)}) must be given, of one length"
    shape = node.inputs[0].shape if node.inputs[0] is not None else None
    if shape is None:
        return "the input rank is unknown"
    if len(shape) == 0:
        return "a scalar input is not valid (onnxruntime refuses it)"
    if len(scale) > 1:
        if len(shape) > 2:
            return f"a rank-{len(shape)} input with {len(scale)} offsets (onnxruntime indexes them by axis 1 modulo)"
        features = shape.dims[-1]
        if isinstance(features, int) and features != len(scale):
            return f"{len(scale)} offsets for {features} features"
    return ""


def _scaler(lw: Lowerer, node: ir.Node) -> None:
    """``(x - offset) * scale`` in float32, per feature along the last axis (an integer input
    converted to float32 first, as onnxruntime's subtraction converts it)."""
    x = lw.tensor(node.inputs[0])
    scale = np.asarray(attr_floats(node, "scale"), np.float32)
    offset = np.asarray(attr_floats(node, "offset"), np.float32)
    if scale.size > 1 and x.shape[-1] != scale.size:
        raise LoweringError(f"{scale.size} offsets for {x.shape[-1]} features")
    shape = (scale.size,) if scale.size > 1 else ()
    shifted = lw.elementwise("sub", [x, lw.const(offset.reshape(shape))])
    lw.bind(node.outputs[0], lw.elementwise("mul", [shifted, lw.const(scale.reshape(shape))]))


def _check_imputer(node: ir.Node) -> str:
    """ai.onnx.ml's Imputer of floats as onnxruntime's ``imputer.cc`` takes it (int64 data stays on the host)."""
    if not attr_floats(node, "imputed_value_floats"):
        return "no imputed_value_floats (int64 imputation stays on the host)"
    rank = rank_of(node.inputs[0])
    if rank not in (1, 2):
        return "the input rank is unknown" if rank is None else f"a rank-{rank} input (imputed values by axis 1 modulo)"
    return ""


def _imputer(lw: Lowerer, node: ir.Node) -> None:
    """The imputed value per feature where there are as many as features (the last axis), else
    the first for all, as onnxruntime picks; a NaN replaced value replaces NaNs."""
    x = lw.tensor(node.inputs[0])
    imputed = np.asarray(attr_floats(node, "imputed_value_floats"), np.float32)
    values = lw.const(imputed if imputed.size == x.shape[-1] else imputed[0])
    replaced = attr_float(node, "replaced_value_float", 0.0)
    if math.isnan(replaced):
        lw.bind(node.outputs[0], lw.elementwise("impute_nan", [x, values]))
    else:
        lw.bind(node.outputs[0], lw.elementwise("impute", [x, values], (replaced,)))


def _where(lw: Lowerer, node: ir.Node) -> None:
    condition = node.inputs[0]
    x, y = lw.tensor(node.inputs[1]), lw.tensor(node.inputs[2])
    if condition is not None and compile_time(condition):
        mask = lw.const(lw.known(condition, "condition").astype(np.float32))
    else:  # a run-time mask (a length mask, an attention mask): 0/1 floats from the entry
        mask = lw.tensor(condition)
    lw.bind(node.outputs[0], lw.elementwise("where", [mask, x, y]))


ONNX = (
    # (Abs and Neg of integers held as exact floats are exact: T5's relative positions)
    *(OnnxOp(op.op_type, op.lower, integer_arithmetic=op.op_type in ("Abs", "Neg", "Sign"), ml=op.ml)
      for op in UNARY),
    # ai.onnx.ml's Scaler: float32, or int32/int64 features converted as onnxruntime converts them
    OnnxOp("Scaler", _scaler, _check_scaler, converted=frozenset({0}), ml=True),
    OnnxOp("Imputer", _imputer, _check_imputer, ml=True),
    OnnxOp("Gelu", _gelu, _check_gelu, contrib=True),
    OnnxOp("BiasGelu", _bias_gelu, contrib=True),
    OnnxOp("FastGelu", _bias_gelu, contrib=True),
    OnnxOp("Clip", _clip, check_clip),
    *(OnnxOp(op_type, _binary, _check_binary, integer_arithmetic=True) for op_type in _BINARY_KIND),
    OnnxOp("Mod", _mod, _check_mod, integer_arithmetic=True),
    # Max and Min of integers (exact floats) are exact, and Where only picks one of two values:
    # T5's relative-position buckets clamp and choose int64 distances so
    *(OnnxOp(op_type, _variadic, integer_arithmetic=op_type in ("Max", "Min")) for op_type in _VARIADIC_KIND),
    OnnxOp("Where", _where, converted=frozenset({0}), moves_data=True),
    *(OnnxOp(op_type, _compare, converted=frozenset({0, 1}), bool_output=True)
      for op_type in (*_COMPARISON_KIND, *_LOGIC_KIND)),
    OnnxOp("Not", _not, converted=frozenset({0}), bool_output=True),
    OnnxOp("IsNaN", _isnan, bool_output=True),
    OnnxOp("IsInf", _isinf, bool_output=True),
)


# -- emission -------------------------------------------------------------------------------


def ref_name(ref: Ref) -> str:
    """The C name of a step's argument: the anchor result ``acc``, operand ``iJ``, step ``vK``."""
    kind, index = ref
    return {"acc": "acc", "in": f"i{index}", "step": f"v{index}"}[kind]


def step_lines(steps: list[Step], indent: str) -> list[str]:
    """``const float vK = ...;`` for each step; operands are ``iJ``, the anchor result ``acc``."""
    return [
        f"{indent}const float v{k} = {expression(step, [ref_name(r) for r in step.args])};"
        for k, step in enumerate(steps)
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
    # Short rows (a per-channel operand over channels-last pixels: rows of C values) go
    # ``rows`` to a task, so a task is ~``block`` values, not one pixel's few (6,400 tasks of
    # 24 values after a ConvTranspose: 0.24 ms); an odometer steps the operands' offsets.
    rows = max(1, block // inner) if outer > 1 else 1
    if rows > 1:
        lines += _row_loop(kernel, outer_dims, cols, inner, rows)
    else:
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
        lines += _row_invariants(cols, "  ")
        lines.append(f"  for (long j = jb * {block}; j < j1; j++) {{")
        lines += _element_lines(kernel, cols, "    ")
        lines += ["  }", "}"]
    params = ", ".join([f"const float* p{j}" for j in range(count)] + ["float* y"])
    lines.append(f"static void {fn}({params}) {{")
    lines.append(f"  const {fn}_t k = {{{', '.join([f'p{j}' for j in range(count)] + ['y'])}}};")
    tasks = -(-outer // rows) * blocks
    if outer * inner > 32768:  # below that, waking the pool costs more than the loop
        lines.append(f"  cg_parallel({tasks}, {fn}_task, &k);")
    else:
        lines.append(f"  for (long t = 0; t < {tasks}; t++) {fn}_task(&k, t);")
    lines.append("}")
    ctx.functions.append("\n".join(lines))
    args = ", ".join([ctx.ptr(t) for t in kernel.operands] + [ctx.ptr(out)])
    ctx.body.append(f"  {fn}({args});")


def _row_invariants(cols: list[list[int]], indent: str) -> list[str]:
    """The operands broadcast along a row (a scale, a zero point), read once before its loop:
    read inside it, where the store might alias them, GCC did not vectorise the loop
    (DynamicQuantizeLinear's quantize step by a computed scale: 8 us for 8192 values)."""
    return [f"{indent}const float i{j} = p{j}[q{j}];" for j, col in enumerate(cols) if not col[-1]]


def _element_lines(kernel: Kernel, cols: list[list[int]], indent: str) -> list[str]:
    """Element ``j`` of a row: each operand that walks the row read at its offset (``q<j> + j``;
    the others before the loop, :func:`_row_invariants`), the steps, the store into ``yo``."""
    lines = [f"{indent}const float i{j} = p{j}[q{j} + j];" for j, col in enumerate(cols) if col[-1]]
    return [*lines, *step_lines(kernel.steps, indent), f"{indent}yo[j] = {result_name(kernel)};"]


def _row_loop(kernel: Kernel, outer_dims: list[int], cols: list[list[int]], inner: int, rows: int) -> list[str]:
    """The body of a task over ``rows`` consecutive whole rows of ``inner`` values: each
    operand's offset found once by division, then carried from row to row like an odometer
    (``a<axis>``: the row's index along each outer axis)."""
    outer = math.prod(outer_dims)
    last = len(outer_dims) - 1
    lines = [f"  const long o0 = task * {rows}, o1 = o0 + {rows} < {outer} ? o0 + {rows} : {outer};"]
    lines.append("  long rest = o0;")
    lines += [f"  long q{j} = 0;" for j in range(len(cols))]
    for axis in reversed(range(len(outer_dims))):
        lines.append(f"  long a{axis} = rest % {outer_dims[axis]}; rest /= {outer_dims[axis]};")
        lines += [f"  q{j} += a{axis} * {col[axis]};" for j, col in enumerate(cols) if col[axis]]
    lines += ["  (void)rest;", "  for (long o = o0; o < o1; o++) {", f"    float* yo = y + o * {inner};"]
    lines += _row_invariants(cols, "    ")
    lines.append(f"    for (long j = 0; j < {inner}; j++) {{")
    lines += [*_element_lines(kernel, cols, "      "), "    }"]

    def advance(axis: int, indent: str) -> list[str]:
        step = [f"q{j} += {col[axis]};" for j, col in enumerate(cols) if col[axis]]
        if axis == 0:  # the outermost never wraps inside a task's rows
            return [f"{indent}a0++; {' '.join(step)}".rstrip()]
        back = [f"q{j} -= {(outer_dims[axis] - 1) * col[axis]};" for j, col in enumerate(cols) if col[axis]]
        return [
            f"{indent}if (++a{axis} < {outer_dims[axis]}) {{ {' '.join(step)} }}",
            f"{indent}else {{",
            f"{indent}  a{axis} = 0; {' '.join(back)}".rstrip(),
            *advance(axis - 1, indent + "  "),
            f"{indent}}}",
        ]

    lines += advance(last, "    ")
    lines += ["  }", "}"]
    return lines


def emit_epilogue(ctx: Context, kernel: Kernel, hoist: bool = False) -> str:
    """The anchor's ``cg_ep`` function (store with fused steps); returns its name.

    The operand pointer array is declared in the entry body as ``<name>_ops``.  With ``hoist``
    (the 8-bit GEMMs' epilogues) an operand of one value per row is read once a row, before the
    loop over the columns: otherwise GCC 12 checks each against the stores at run time, and
    past ten such checks leaves the loop scalar (smart_turn's requantize, bias, GELU and
    quantize: ten operands, 20 ms a layer instead of 2).
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
    per_row = {j for j, index in enumerate(kernel.indexing) if hoist and not index.col_stride}
    lines += [f"    const float i{j} = b{j}[0];" for j in sorted(per_row)]
    lines.append("    for (long c = 0; c < nc; c++) {")
    lines.append("      const float acc = tr[c];")
    for j, index in enumerate(kernel.indexing):
        if j not in per_row:
            lines.append(f"      const float i{j} = b{j}[{'c' if index.col_stride else '0'}];")
    lines += step_lines(kernel.steps, "      ")
    lines.append(f"      yr[c] = {result_name(kernel)};")
    lines += ["    }", "  }", "}"]
    ctx.functions.append("\n".join(lines))
    pointers = ", ".join(ctx.ptr(t) for t in kernel.operands) or "0"
    ctx.body.append(f"  const float* const {fn}_ops[] = {{{pointers}}};")
    return fn


KERNELS = (KernelOp(g.Elementwise, Layout.FOLLOW_INPUTS, emit_elementwise),)


# -- epilogues on a GEMM tile's registers (gemm.py) ----------------------------------------------

# Steps with a vector form on ``vf`` values, each the same arithmetic per element as its
# scalar form.  (A multiply next to an add may be contracted into an FMA in one form and not
# the other - GCC's default for gnu11 - so a full register tile and a ragged one, which takes
# the scalar epilogue, can differ in the last bit where such steps meet.)
VECTOR_FORMS = {
    "add": "{a} + {b}",
    "sub": "{a} - {b}",
    "mul": "{a} * {b}",
    "div": "{a} / {b}",
    "relu": "cg_vrelu({a})",
    "sigmoid": "cg_vsigmoid({a})",
    "clip": "cg_vclamp({a}, {p0}, {p1})",
    "quantize": "cg_vquantize({a} / {b}, (vf){{0}} + {c}, {p0}, {p1})",  # {c} a float or a vector
    "requantize": "cg_vquantize({a} * {b}, (vf){{0}} + {c}, {p0}, {p1})",
    "hardsigmoid": "cg_vhardsigmoid({a}, {p0}, {p1})",
    "hardswish": "{a} * cg_vhardsigmoid({a}, 0x1.555556p-3f, 0.5f)",
    "iadd": "cg_vint({a} + {b})",
    "isub": "cg_vint({a} - {b})",
    "imul": "cg_vint({a} * {b})",
}


@dataclass(frozen=True)
class VectorEpilogue:
    """An anchor epilogue written on vectors: ``operands`` per operand ``"c"`` (a run of
    columns: bias, residual) or ``"s"`` (one value per row); row strides are runtime values,
    so layers with the same steps and operand kinds share one micro-kernel (``key``)."""

    steps: tuple[Step, ...]
    operands: tuple[str, ...]
    row_strides: tuple[int, ...]

    @property
    def key(self) -> str:
        text = repr((self.steps, self.operands))
        return f"{zlib.crc32(text.encode()):08x}"

    @property
    def result(self) -> str:
        return f"v{len(self.steps) - 1}" if self.steps else "acc"

    def lines(self, indent: str) -> list[str]:
        return [
            f"{indent}const vf v{k} = "
            + VECTOR_FORMS[s.kind].format(
                **dict(zip("abc", [ref_name(r) for r in s.args], strict=False)),
                **{f"p{i}": c_float(v) for i, v in enumerate(s.params)},
            )
            + ";"
            for k, s in enumerate(self.steps)
        ]


def vector_epilogue(kernel: Kernel) -> VectorEpilogue | None:
    """``kernel``'s epilogue on vectors, or None when a step has no vector form."""
    if any(s.kind not in VECTOR_FORMS for s in kernel.steps):
        return None
    if any(index.col_stride not in (0, 1) for index in kernel.indexing):
        return None
    for step in kernel.steps:  # a step's result is a vector as soon as the accumulator is in it
        if not any(ref[0] in ("acc", "step") or kernel.indexing[ref[1]].col_stride for ref in step.args):
            return None
    return VectorEpilogue(
        tuple(kernel.steps),
        tuple("c" if index.col_stride else "s" for index in kernel.indexing),
        tuple(index.row_stride for index in kernel.indexing),
    )
