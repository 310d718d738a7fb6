"""codegraft's shared optimisation pipeline and hardware-aware conversions.

A backend only *declares* what it prefers (layout, precisions); these passes do the work:

* :func:`run_common_passes`: constant folding, CSE, dead code, Identity/no-op removal and
  shape inference, each switchable through :class:`PassOptions`, each recorded.
* :func:`hoist_loop_invariants`: loop-invariant code motion (run by the ``identity`` pass).
* :func:`to_nhwc`: rewrite a partition channels-last, transposes only at its edges.
* :func:`lower_nhwc`: the reference meaning of the ``codegraft.nhwc`` ops, in plain ONNX.
* :func:`convert_precision` / :func:`convert_precision_checked`: float16 or bfloat16 with
  Casts only at edges, checked against float32 on sample inputs, offending ops moved back
  (:func:`upgrade_opset` first for bfloat16 on models older than opset 22).
* :func:`quantize_int8`: static int8 QDQ quantization from calibration samples.
"""

from codegraft.passes.layout import NHWC_DOMAIN, Conversion, LayoutResult, to_nhwc
from codegraft.passes.loop_invariants import Hoisted, hoist_loop_invariants
from codegraft.passes.nhwc_reference import lower_nhwc
from codegraft.passes.opset import BFLOAT16_OPSET, upgrade_opset
from codegraft.passes.pipeline import (
    PASS_NAMES,
    PassOptions,
    PassRecord,
    PipelineResult,
    run_common_passes,
)
from codegraft.passes.precision import (
    DEFAULT_BLOCKLIST,
    ConversionResult,
    KeptOp,
    Precision,
    convert_precision,
    convert_precision_detailed,
)
from codegraft.passes.precision_check import (
    DEFAULT_TOLERANCE,
    Evaluate,
    MovedOp,
    PrecisionResult,
    convert_precision_checked,
    sample_feeds_for,
)

# onnxruntime's quantization tools take ~0.3 s to import: only when asked for
_QUANTIZE_NAMES = ("QDQ_OPSET", "QuantizeOptions", "QuantizeResult", "quantize_int8")


def __getattr__(name: str) -> object:
    if name in _QUANTIZE_NAMES:
        from codegraft.passes import quantize

        return getattr(quantize, name)
    raise AttributeError(f"module 'codegraft.passes' has no attribute {name!r}")


__all__ = [
    "BFLOAT16_OPSET",
    "DEFAULT_BLOCKLIST",
    "DEFAULT_TOLERANCE",
    "NHWC_DOMAIN",
    "PASS_NAMES",
    "QDQ_OPSET",
    "Conversion",
    "ConversionResult",
    "Evaluate",
    "Hoisted",
    "KeptOp",
    "LayoutResult",
    "MovedOp",
    "PassOptions",
    "PassRecord",
    "PipelineResult",
    "Precision",
    "PrecisionResult",
    "QuantizeOptions",
    "QuantizeResult",
    "convert_precision",
    "convert_precision_checked",
    "convert_precision_detailed",
    "hoist_loop_invariants",
    "lower_nhwc",
    "quantize_int8",
    "run_common_passes",
    "sample_feeds_for",
    "to_nhwc",
    "upgrade_opset",
]
