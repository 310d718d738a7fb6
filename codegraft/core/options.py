"""Compile options: one explicit object, every field also a keyword of ``compile``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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
    ``input_shapes``: sizes for the inputs' free dimensions, ``{"x": (1, 3, 224, 224)}`` (a
    dimension's name fixed once holds in every input), so shape arithmetic folds away before
    partitioning (:mod:`codegraft.frontend.input_shapes`); the executable takes these shapes.
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
    input_shapes: tuple[tuple[str, tuple[int, ...]], ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "input_shapes", input_shapes_option(self.input_shapes))
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


InputShapes = Mapping[str, Sequence[int]]


def input_shapes_option(shapes: InputShapes | Sequence[tuple[str, Sequence[int]]] | None) -> tuple[
    tuple[str, tuple[int, ...]], ...
]:
    """``{"x": [1, 3, 224, 224]}`` (or its pairs) as sorted ``(name, dims)`` pairs, each size checked.

    >>> input_shapes_option({"x": [1, 3], "a": ()})
    (('a', ()), ('x', (1, 3)))
    """
    if not shapes:
        return ()
    pairs = shapes.items() if isinstance(shapes, Mapping) else shapes
    checked = []
    try:
        for name, dims in pairs:
            if isinstance(dims, str | bytes) or not isinstance(dims, Sequence):
                raise OptionError(
                    f"input_shapes[{name!r}] must be a sequence of sizes, e.g. (1, 3, 224, 224); got {dims!r}"
                )
            if any(isinstance(d, bool) or not isinstance(d, int | np.integer) or d < 0 for d in dims):
                raise OptionError(f"input_shapes[{name!r}]: sizes must be integers >= 0, got {tuple(dims)!r}")
            checked.append((str(name), tuple(int(d) for d in dims)))
    except (TypeError, ValueError) as error:
        if isinstance(error, OptionError):
            raise
        raise OptionError(
            f"input_shapes must map input names to shapes, e.g. {{'x': (1, 3, 224, 224)}}; got {shapes!r}"
        ) from None
    return tuple(sorted(checked))
