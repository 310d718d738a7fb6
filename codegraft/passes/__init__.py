"""codegraft's shared optimisation pipeline and hardware-aware conversions.

A backend only *declares* what it prefers (layout, precisions); these passes do the work:

* :func:`run_common_passes`: constant folding, CSE, dead code, Identity/no-op removal and
  shape inference, each switchable through :class:`PassOptions`, each recorded.
* :func:`to_nhwc`: rewrite a partition channels-last, transposes only at its edges.
* :func:`lower_nhwc`: the reference meaning of the ``codegraft.nhwc`` ops, in plain ONNX.
"""

from codegraft.passes.layout import NHWC_DOMAIN, LayoutResult, to_nhwc
from codegraft.passes.nhwc_reference import lower_nhwc
from codegraft.passes.pipeline import (
    PASS_NAMES,
    PassOptions,
    PassRecord,
    PipelineResult,
    run_common_passes,
)

__all__ = [
    "NHWC_DOMAIN",
    "PASS_NAMES",
    "LayoutResult",
    "PassOptions",
    "PassRecord",
    "PipelineResult",
    "lower_nhwc",
    "run_common_passes",
    "to_nhwc",
]
