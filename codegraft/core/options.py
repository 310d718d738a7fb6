"""Compile options: one explicit object, every field also a keyword of ``compile``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from codegraft.errors import OptionError

PRECISIONS = ("float32", "float16", "bfloat16", "int8")
PLACEMENTS = ("first", "measured")
# A target's partition between the host's costs a crossing per edge with them (a copy, a
# partition call, the host's thread pool woken again); under this many multiply-adds what the
# target saves cannot pay for them.  Between the int8 units of pipecat's QDQ turn detector
# (which no target takes) first-fit placement gave c the LayerNorms and GELUs: 54 partitions.
# A tenth of a millisecond of one core's multiply-adds; plan.control.LOOP_BODY_MIN_MACS, a
# Loop body's bound, is the same.
MIN_PARTITION_MACS = 1 << 22


@dataclass(frozen=True)
class CompileOptions:
    """How to compile; every field has a keyword of the same name on :func:`compile`.

    ``min_partition_size``: non-host partitions with fewer nodes go back to the host.
    ``min_partition_macs``: with first-fit placement, a non-host partition between host ones
    that does fewer multiply-adds (MatMul, Gemm, Conv, ConvTranspose, LSTM, GRU, RNN, and the
    weighted taps of Resize and GridSample; known sizes only) goes back to the host, and so does
    such a partition anywhere on a backend whose calls cost more than the host's
    (``Capabilities.call_overhead_us``: OpenVINO's) unless it is the model's only one (0: never).
    ``strict``: a partition its backend fails to compile is an error instead of a fallback.
    ``precision``: compute precision asked of backends that declare it (one of :data:`PRECISIONS`).
    ``passes``: names of the common passes to run (``None``: the default set; ``()``: none).
    ``placement``: ``"first"`` (first target that supports a node) or ``"measured"``.
    ``threads``: threads of the host (onnxruntime's intra-op threads) and of every target named
    by string whose backend takes a count (``c``, ``openvino``, ``dnnl``, a vendor's factory
    taking ``threads``); 0: each its default, all cores.  A backend object passed as a target
    keeps its own (``CBackend(num_threads=4)``).  The artifact keeps the host's count.
    ``input_shapes``: sizes for the inputs' free dimensions, ``{"x": (1, 3, 224, 224)}`` (a
    dimension's name fixed once holds in every input), so shape arithmetic folds away before
    partitioning (:mod:`codegraft.frontend.fixed_inputs`); the executable takes these shapes.
    ``input_values``: values of inputs a deployment never changes, ``{"sr": 16000}`` (at most
    :data:`MAX_BOUND_ELEMENTS` elements each), bound as constants before the passes, so what
    they decide folds away; the executable still takes them and refuses any other value.
    ``cache``: reuse partitions compiled before, from ``$CODEGRAFT_CACHE_DIR/compiled``, for
    backends that opt in (``False``, or ``CODEGRAFT_COMPILE_CACHE=0``: compile every one afresh).

    Values are checked when the object is made; a bad one raises :class:`OptionError`
    naming the allowed values::

        CompileOptions(precision="fp16")  # OptionError: precision 'fp16' is not one of: float32, ...
    """

    min_partition_size: int = 1
    min_partition_macs: int = MIN_PARTITION_MACS
    strict: bool = False
    precision: str = "float32"
    passes: Sequence[str] | None = None
    placement: Literal["first", "measured"] = "first"
    threads: int = 0
    sample_inputs: tuple[dict[str, np.ndarray], ...] = field(default=())
    cache: bool = True
    input_shapes: tuple[tuple[str, tuple[int, ...]], ...] = ()
    input_values: tuple[tuple[str, np.ndarray], ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "input_shapes", input_shapes_option(self.input_shapes))
        object.__setattr__(self, "input_values", input_values_option(self.input_values))
        check_choice("precision", self.precision, PRECISIONS)
        check_choice("placement", self.placement, PLACEMENTS)
        check_at_least("min_partition_size", self.min_partition_size, 1)
        check_at_least("min_partition_macs", self.min_partition_macs, 0, note=" (0: never)")
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


def _named_pairs(given: object, option: str, example: str) -> list[tuple[str, object]]:
    """A mapping, or ``(name, value)`` pairs, as a list of pairs; anything else an :class:`OptionError`."""
    if given is None:
        return []
    if isinstance(given, Mapping):
        return [(str(name), value) for name, value in given.items()]
    malformed = OptionError(f"{option} must map input names to {example}; got {given!r}")
    if isinstance(given, str | bytes) or not isinstance(given, Sequence):
        raise malformed
    pairs = []
    for pair in given:
        if isinstance(pair, str | bytes) or not isinstance(pair, Sequence) or len(pair) != 2:
            raise malformed
        pairs.append((str(pair[0]), pair[1]))
    return pairs


def input_shapes_option(shapes: InputShapes | Sequence[tuple[str, Sequence[int]]] | None) -> tuple[
    tuple[str, tuple[int, ...]], ...
]:
    """``{"x": [1, 3, 224, 224]}`` (or its pairs) as sorted ``(name, dims)`` pairs, each size checked.

    >>> input_shapes_option({"x": [1, 3], "a": ()})
    (('a', ()), ('x', (1, 3)))
    """
    checked = []
    for name, dims in _named_pairs(shapes, "input_shapes", "shapes, e.g. {'x': (1, 3, 224, 224)}"):
        if isinstance(dims, str | bytes) or not isinstance(dims, Sequence):
            raise OptionError(
                f"input_shapes[{name!r}] must be a sequence of sizes, e.g. (1, 3, 224, 224); got {dims!r}"
            )
        if any(isinstance(d, bool) or not isinstance(d, int | np.integer) or d < 0 for d in dims):
            raise OptionError(f"input_shapes[{name!r}]: sizes must be integers >= 0, got {tuple(dims)!r}")
        checked.append((name, tuple(int(d) for d in dims)))
    return tuple(sorted(checked))


MAX_BOUND_ELEMENTS = 64  # a bound input is a mode or a size (a sample rate, a flag), not data


def input_values_option(values: Mapping[str, object] | Sequence[tuple[str, object]] | None) -> tuple[
    tuple[str, np.ndarray], ...
]:
    """``{"sr": 16000}`` (or its pairs) as sorted ``(name, array)`` pairs, each a small numeric array.

    >>> input_values_option({"sr": 16000})
    (('sr', array(16000)),)
    """
    checked = []
    for name, value in _named_pairs(values, "input_values", "values, e.g. {'sr': 16000}"):
        try:
            array = np.array(value)
        except (ValueError, TypeError):  # a ragged list
            array = np.array(None, dtype=object)
        if array.dtype.kind not in "biuf":
            raise OptionError(f"input_values[{name!r}] must be a number or an array of numbers, got {value!r}")
        if array.size > MAX_BOUND_ELEMENTS:
            raise OptionError(
                f"input_values[{name!r}] has {array.size} elements; at most {MAX_BOUND_ELEMENTS} can be bound "
                "(a mode or a size, not data)"
            )
        checked.append((name, array))
    return tuple(sorted(checked, key=lambda item: item[0]))
