"""Compile options: one explicit object, every field also a keyword of ``compile``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from codegraft.errors import OptionError

PRECISIONS = ("float32", "float16", "bfloat16", "int8")
PLACEMENTS = ("first", "measured")


@dataclass(frozen=True)
class CompileOptions:
    """How to compile; every field has a keyword of the same name on :func:`compile`.

    ``min_partition_size``: non-host partitions with fewer nodes go back to the host.
    ``strict``: a partition its backend fails to compile is an error instead of a fallback.
    ``precision``: compute precision asked of backends that declare it (one of :data:`PRECISIONS`).
    ``passes``: names of the common passes to run (``None``: the default set; ``()``: none).
    ``placement``: ``"first"`` (first target that supports a node) or ``"measured"``.
    ``threads``: intra-op threads of the host (0: all cores).
    ``cache``: reuse partitions compiled before, from ``$CODEGRAFT_CACHE_DIR/compiled``, for
    backends that opt in (``False``, or ``CODEGRAFT_COMPILE_CACHE=0``: compile every one afresh).

    Values are checked when the object is made; a bad one raises :class:`OptionError`
    naming the allowed values::

        CompileOptions(precision="fp16")  # OptionError: precision 'fp16' is not one of: float32, ...
    """

    min_partition_size: int = 1
    strict: bool = False
    precision: str = "float32"
    passes: Sequence[str] | None = None
    placement: Literal["first", "measured"] = "first"
    threads: int = 0
    sample_inputs: tuple[dict[str, np.ndarray], ...] = field(default=())
    cache: bool = True

    def __post_init__(self) -> None:
        check_choice("precision", self.precision, PRECISIONS)
        check_choice("placement", self.placement, PLACEMENTS)
        check_at_least("min_partition_size", self.min_partition_size, 1)
        check_at_least("threads", self.threads, 0, note=" (0: all cores)")


def check_choice(option: str, value: object, allowed: Sequence[str]) -> None:
    """:class:`OptionError` unless ``value`` is one of ``allowed``, listing them."""
    if value not in allowed:
        raise OptionError(f"{option} {value!r} is not one of: {', '.join(allowed)}")


def check_at_least(option: str, value: object, minimum: int, *, note: str = "") -> None:
    """:class:`OptionError` unless ``value`` is an integer >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise OptionError(f"{option} must be an integer >= {minimum}{note}, got {value!r}")
