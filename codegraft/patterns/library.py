"""Built-in patterns for the usual fusions, reusable by name or by symbol.

Each is a plain :class:`~codegraft.patterns.Pattern` (module constants, so go-to-definition
works); :func:`get` and :func:`names` look them up by name for configuration files and the
CLI.  The patterns are structural only: a backend adds its own check (dtypes, kernel sizes,
bias shape) through ``PATTERN.rule(check=...)``.

Captures (present only when that part matched):

- ``conv_bias_act``: x, w, b (Conv's own bias), conv, bias, bias_add, bn, bn_scale,
  bn_bias, bn_mean, bn_var, act
- ``gemm_bias_act``: a, b, c, gemm | matmul, bias, bias_add, act
- ``matmul_add_gelu``: a, w, bias, matmul, bias_add, gelu (the fused op, or the final Mul
  of the Erf form), erf_plus_one
- ``layer_norm``: x, scale, bias, epsilon, layer_norm | mean, centered, norm
- ``attention``: q, k, v, scale, mask, qk, softmax, av

List more specific patterns first: ``matmul_add_gelu`` before ``gemm_bias_act``,
``attention`` before ``gemm_bias_act``.

Example::

    from codegraft.patterns import library
    rules = [library.get(n).rule() for n in ("conv_bias_act", "attention")]
"""

from __future__ import annotations

from codegraft.patterns._pattern import (
    Pattern,
    ValuePattern,
    const,
    either,
    op,
    optional,
    var,
)

_SQRT2 = 1.4142135623730951


def _activation(y: ValuePattern, *op_types: str) -> ValuePattern:
    # Clip carries min/max as optional inputs (opset >= 11); the others ignore them.
    return op.any(*op_types)(y, const(optional=True), const(optional=True), _name="act")


def _conv_bias_act() -> Pattern:
    conv = op.Conv(var("x"), var("w"), var("b", optional=True), _name="conv")
    y = op.Add(conv, const("bias"), _optional=True, _name="bias_add")
    bn_params = (const("bn_scale"), const("bn_bias"), const("bn_mean"), const("bn_var"))
    y = op.BatchNormalization(y, *bn_params, _optional=True, _name="bn")
    act = _activation(y, "Relu", "Clip", "LeakyRelu", "Sigmoid", "HardSwish")
    return Pattern("conv_bias_act", optional(act, otherwise=y))


def _gemm_bias_act() -> Pattern:
    a, b = var("a"), var("b")
    gemm = op.Gemm(a, b, var("c", optional=True), _name="gemm")
    matmul_add = op.Add(op.MatMul(a, b, _name="matmul"), const("bias"), _name="bias_add")
    y = either(gemm, matmul_add)
    act = _activation(y, "Relu", "Clip", "LeakyRelu", "Sigmoid", "Tanh", "HardSwish", "Gelu")
    return Pattern("gemm_bias_act", optional(act, otherwise=y))


def _erf_gelu(y: ValuePattern) -> ValuePattern:
    """0.5 * y * (1 + erf(y / sqrt(2))), in the operand orders exporters produce."""
    scaled = either(op.Div(y, const(value=_SQRT2)), op.Mul(y, const(value=1 / _SQRT2)))
    one_plus = op.Add(op.Erf(scaled), const(value=1.0), _name="erf_plus_one")
    half = const(value=0.5)
    return either(
        op.Mul(op.Mul(y, one_plus), half, _name="gelu"),
        op.Mul(y, op.Mul(one_plus, half), _name="gelu"),
        op.Mul(op.Mul(y, half), one_plus, _name="gelu"),
    )


def _matmul_add_gelu() -> Pattern:
    y = op.Add(op.MatMul(var("a"), var("w"), _name="matmul"), const("bias"), _name="bias_add")
    gelu = either(
        op.Gelu(y, _name="gelu"),
        op.Gelu(y, _domain="com.microsoft", _name="gelu"),
        _erf_gelu(y),
    )
    return Pattern("matmul_add_gelu", gelu)


def _layer_norm() -> Pattern:
    x = var("x")
    fused = op.LayerNormalization(x, var("scale"), var("bias", optional=True), _name="layer_norm")
    # ReduceMean takes its axes as an attribute before opset 18 and as an input after.
    d = op.Sub(x, op.ReduceMean(x, const(optional=True), _name="mean"), _name="centered")
    variance = op.ReduceMean(op.Pow(d, const(value=2.0)), const(optional=True))
    norm = op.Div(d, op.Sqrt(op.Add(variance, const("epsilon"))), _name="norm")
    scaled = op.Mul(norm, const("scale"), _optional=True)
    decomposed = op.Add(scaled, const("bias"), _optional=True)
    return Pattern("layer_norm", either(fused, decomposed))


def _attention() -> Pattern:
    scores = op.MatMul(var("q"), var("k"), _name="qk")
    scaled = optional(
        either(op.Div(scores, const("scale")), op.Mul(scores, const("scale"))),
        otherwise=scores,
    )
    masked = op.Add(scaled, var("mask"), _optional=True)
    probs = op.Softmax(masked, _name="softmax")
    return Pattern("attention", op.MatMul(probs, var("v"), _name="av"))


CONV_BIAS_ACT = _conv_bias_act()
"""Conv [+ Add constant bias] [+ BatchNormalization] [+ Relu | Clip | LeakyRelu | Sigmoid | HardSwish]."""
GEMM_BIAS_ACT = _gemm_bias_act()
"""Gemm, or MatMul + Add constant bias, [+ Relu | Clip | LeakyRelu | Sigmoid | Tanh | HardSwish | Gelu]."""
MATMUL_ADD_GELU = _matmul_add_gelu()
"""MatMul + Add bias + GELU (the Gelu op, com.microsoft Gelu, or the Erf form Div/Erf/Add/Mul/Mul)."""
LAYER_NORM = _layer_norm()
"""LayerNormalization, or ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div [+ Mul scale] [+ Add bias]."""
ATTENTION = _attention()
"""MatMul(q, k) [+ Div | Mul scale] [+ Add mask] + Softmax + MatMul(., v)."""

_ALL: tuple[Pattern, ...] = (
    CONV_BIAS_ACT,
    GEMM_BIAS_ACT,
    MATMUL_ADD_GELU,
    LAYER_NORM,
    ATTENTION,
)


def names() -> tuple[str, ...]:
    """Names of the built-in patterns.  Example: ``"attention" in library.names()``."""
    return tuple(p.name for p in _ALL)


def get(name: str) -> Pattern:
    """The built-in pattern called ``name``.  Example: ``library.get("layer_norm")``."""
    for p in _ALL:
        if p.name == name:
            return p
    raise KeyError(f"no built-in pattern {name!r}; known: {', '.join(names())}")


__all__ = [
    "ATTENTION",
    "CONV_BIAS_ACT",
    "GEMM_BIAS_ACT",
    "LAYER_NORM",
    "MATMUL_ADD_GELU",
    "get",
    "names",
]
