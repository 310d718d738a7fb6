"""Compile options: one explicit object, every field also a keyword of ``compile``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np


@dataclass(frozen=True)
class CompileOptions:
    """How to compile; every field has a keyword of the same name on :func:`compile`.

    ``min_partition_size``: non-host partitions with fewer nodes go back to the host.
    ``strict``: a partition its backend fails to compile is an error instead of a fallback.
    ``precision``: compute precision asked of backends that declare it.
    ``passes``: names of the common passes to run (``None``: the default set; ``()``: none).
    ``placement``: ``"first"`` (first target that supports a node) or ``"measured"``.
    ``threads``: intra-op threads of the host (0: all cores).
    """

    min_partition_size: int = 1
    strict: bool = False
    precision: str = "float32"
    passes: Sequence[str] | None = None
    placement: Literal["first", "measured"] = "first"
    threads: int = 0
    sample_inputs: tuple[dict[str, np.ndarray], ...] = field(default=())
