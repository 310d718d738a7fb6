"""codegraft's shared optimisation pipeline and hardware-aware conversions.

A backend only *declares* what it prefers (layout, precisions); these passes do the work:

* :func:`to_nhwc`: rewrite a partition channels-last, transposes only at its edges.
* :func:`lower_nhwc`: the reference meaning of the ``codegraft.nhwc`` ops, in plain ONNX.
"""

from codegraft.passes.layout import NHWC_DOMAIN, LayoutResult, to_nhwc
from codegraft.passes.nhwc_reference import lower_nhwc

__all__ = [
    "NHWC_DOMAIN",
    "LayoutResult",
    "lower_nhwc",
    "to_nhwc",
]
