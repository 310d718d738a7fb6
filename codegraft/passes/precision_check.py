"""Convert to a lower precision and check the result, moving offending ops back to float32.

NOTE: the check runs the converted and the float32 model on sample inputs through the
caller's ``evaluate`` (the core passes one that compiles with the chosen backend, tests pass
onnxruntime), so it measures the error the user will actually see.  When the error passes
the tolerance it runs both once more with every intermediate float value exposed as an
output, blames the nodes whose output error grew most over their inputs' error, moves those
back to float32 and converts again; a few rounds usually suffice.  The input model is not
modified.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir
from onnx_ir.passes.common import ShapeInferencePass

from codegraft.core.feeds import random_inputs
from codegraft.passes._graph_util import name_nodes
from codegraft.passes.precision import (
    DEFAULT_BLOCKLIST,
    KeptOp,
    Precision,
    convert_precision_detailed,
)

__all__ = [
    "DEFAULT_TOLERANCE",
    "Evaluate",
    "MovedOp",
    "PrecisionResult",
    "convert_precision_checked",
    "relative_error",
    "sample_feeds_for",
]

Evaluate = Callable[[ir.Model, dict[str, np.ndarray]], dict[str, np.ndarray]]
"""Runs a model on one set of inputs and returns its outputs by name."""

# Relative error (max |converted - float32| / max |float32|, worst output and sample) that is
# accepted without moving anything back: a few units of the format's rounding, accumulated.
DEFAULT_TOLERANCE: Mapping[str, float] = {"float16": 1e-2, "bfloat16": 5e-2}


@dataclass(frozen=True)
class MovedOp:
    """A node the check moved back to float32."""

    node: str
    op_type: str
    added_error: float  # its output's relative error minus its inputs'
    reason: str


@dataclass(frozen=True)
class PrecisionResult:
    """The converted model and how close it is to float32.

    ``within_tolerance`` is False when moving ops back did not bring ``error`` under
    ``tolerance`` within the allowed rounds; the caller decides (e.g. keep float32).
    """

    model: ir.Model = field(repr=False)
    precision: Precision
    error: float
    initial_error: float
    tolerance: float
    within_tolerance: bool
    moved_to_float32: tuple[MovedOp, ...]
    kept_float32: tuple[KeptOp, ...]
    converted_ops: int
    casts_inserted: int
    rounds: int


def sample_feeds_for(
    model: ir.Model,
    n: int = 2,
    seed: int = 0,
    *,
    dim_values: Mapping[str, int] | None = None,
) -> list[dict[str, np.ndarray]]:
    """``n`` random input sets from the graph inputs' declared types and shapes.

    Symbolic dimensions take ``dim_values[name]`` or 1; floats are standard normal, integers
    small non-negative values, booleans random.
    """
    rng = np.random.default_rng(seed)
    return [random_inputs(model, rng, dim_values=dim_values) for _ in range(n)]


def relative_error(actual: np.ndarray, expected: np.ndarray) -> float:
    """``max|a - e| / max|e|`` for floats (inf if non-finite); fraction differing otherwise."""
    a, e = np.asarray(actual), np.asarray(expected)
    if a.shape != e.shape:
        return float("inf")
    if e.size == 0:
        return 0.0
    if not np.issubdtype(e.dtype, np.floating) and e.dtype.kind != "V":
        return float(np.mean(a != e))
    a64, e64 = a.astype(np.float64), e.astype(np.float64)
    # NaN and Inf must sit where the reference has them (a backend may turn a NaN finite,
    # as OpenVINO's Relu, Clip, Exp and Softmax do, or overflow where float32 did not); a
    # NaN compared with ">" would otherwise pass any tolerance.
    finite, infinite = np.isfinite(e64), np.isinf(e64)
    same_nan = np.array_equal(np.isnan(a64), np.isnan(e64))
    if not same_nan or not np.array_equal(a64[infinite], e64[infinite]) or not np.isfinite(a64[finite]).all():
        return float("inf")
    if not finite.any():
        return 0.0
    scale = max(float(np.max(np.abs(e64[finite]))), 1e-6)
    return float(np.max(np.abs(a64[finite] - e64[finite]))) / scale


def convert_precision_checked(
    model: ir.Model,
    precision: Precision,
    sample_feeds: Sequence[Mapping[str, np.ndarray]] | Mapping[str, np.ndarray],
    evaluate: Evaluate,
    tolerance: float | None = None,
    *,
    keep_float32_ops: frozenset[str] = DEFAULT_BLOCKLIST,
    max_rounds: int = 6,
) -> PrecisionResult:
    """Convert a copy of ``model`` to ``precision`` and check it against float32.

    ``tolerance`` defaults to :data:`DEFAULT_TOLERANCE` for the precision.  Up to
    ``max_rounds`` times, when the error on ``sample_feeds`` passes it, the nodes that added
    the most error are moved back to float32 (each with its measured error in the result).
    """
    samples = [dict(sample_feeds)] if isinstance(sample_feeds, Mapping) else [dict(s) for s in sample_feeds]
    if not samples:
        raise ValueError("convert_precision_checked needs at least one sample input set")
    tol = DEFAULT_TOLERANCE[precision] if tolerance is None else tolerance
    base = model.clone()
    name_nodes(base.graph)
    if any(v.dtype is None for node in base.graph for v in node.outputs):
        ShapeInferencePass(strict_mode=False)(base)
    outputs = [v.name for v in base.graph.outputs if v.name]
    expected = [evaluate(base.clone(), feeds) for feeds in samples]
    probes: _Probes | None = None
    moved: list[MovedOp] = []
    keep_nodes: dict[str, str] = {}
    initial_error = error = 0.0
    for round_ in range(max_rounds + 1):
        converted = convert_precision_detailed(
            base.clone(),
            precision,
            keep_float32_ops=keep_float32_ops,
            keep_float32_nodes=keep_nodes,
        )
        got = [evaluate(converted.model.clone(), feeds) for feeds in samples]
        error = max(relative_error(g[name], e[name]) for g, e in zip(got, expected, strict=True) for name in outputs)
        if round_ == 0:
            initial_error = error
        if error <= tol or round_ == max_rounds:
            break
        probes = probes or _Probes.measure(base, samples, evaluate)
        still_float32 = {k.node for k in converted.kept_float32}
        blamed = probes.blame(_converted_probe_run(base, precision, keep_float32_ops, keep_nodes, samples, evaluate))
        candidates = [b for b in blamed if b.node not in still_float32]
        if not candidates:
            break
        worst = candidates[0].added_error
        for found in candidates:
            if found.added_error < 0.5 * worst:
                break
            reason = (
                f"its output gained relative error {found.added_error:.2g} over its inputs; "
                f"model error {error:.2g} > tolerance {tol:.2g}"
            )
            keep_nodes[found.node] = reason
            moved.append(MovedOp(found.node, found.op_type, found.added_error, reason))
    return PrecisionResult(
        model=converted.model,
        precision=precision,
        error=error,
        initial_error=initial_error,
        tolerance=tol,
        within_tolerance=error <= tol,
        moved_to_float32=tuple(moved),
        kept_float32=tuple(k for k in converted.kept_float32 if k.node not in keep_nodes),
        converted_ops=converted.converted_ops,
        casts_inserted=converted.casts_inserted,
        rounds=round_,
    )


@dataclass(frozen=True)
class _Blame:
    node: str
    op_type: str
    added_error: float


def _with_probes(model: ir.Model) -> ir.Model:
    """A copy whose float32 intermediate values are graph outputs too."""
    probed = model.clone()
    present = set(probed.graph.outputs)
    for node in probed.graph:
        for value in node.outputs:
            if value.dtype == ir.DataType.FLOAT and value not in present and value.name:
                probed.graph.outputs.append(value)
                present.add(value)
    return probed


def _converted_probe_run(
    base: ir.Model,
    precision: Precision,
    keep_ops: frozenset[str],
    keep_nodes: Mapping[str, str],
    samples: Sequence[dict[str, np.ndarray]],
    evaluate: Evaluate,
) -> list[dict[str, np.ndarray]]:
    """Intermediate values of the converted model (exposed before converting: exact casts)."""
    probed = convert_precision_detailed(
        _with_probes(base), precision, keep_float32_ops=keep_ops, keep_float32_nodes=keep_nodes
    ).model
    return [evaluate(probed.clone(), feeds) for feeds in samples]


@dataclass(frozen=True)
class _Probes:
    """The float32 model's intermediate values, measured once per check."""

    model: ir.Model
    values: tuple[dict[str, np.ndarray], ...]

    @classmethod
    def measure(cls, base: ir.Model, samples: Sequence[dict[str, np.ndarray]], evaluate: Evaluate) -> _Probes:
        probed = _with_probes(base)
        return cls(base, tuple(evaluate(probed.clone(), feeds) for feeds in samples))

    def blame(self, converted: Sequence[dict[str, np.ndarray]]) -> list[_Blame]:
        """Nodes by the error their outputs add to their inputs' error, worst first."""

        def error_of(name: str | None) -> float | None:
            if name is None or name not in self.values[0]:
                return None
            return max(relative_error(c[name], r[name]) for c, r in zip(converted, self.values, strict=True))

        found = []
        for node in self.model.graph:
            outs = [e for e in (error_of(v.name) for v in node.outputs) if e is not None]
            if not outs:
                continue
            ins = [e for e in (error_of(v.name if v else None) for v in node.inputs) if e is not None]
            added = max(outs) - max(ins, default=0.0)
            if np.isnan(added):  # inf - inf: the input was already broken
                added = 0.0
            found.append(_Blame(node.name or "", node.op_type, added))
        return sorted(found, key=lambda b: -b.added_error)
