"""The C backend's own small graph: tensors with concrete shapes and a physical layout, and ops.

NOTE: the ONNX graph is translated into these few typed ops (``_translate.py``) so that the later
steps - layout (``_layout.py``), fusion (``_fuse.py``), memory planning and C emission -
deal with one shape of data instead of every ONNX attribute spelling.  The ops here are the
ones those steps build or recognise (fusion's anchors and elementwise steps, the translator's
views, layout's transposes and copies, Concat slots); every other op is declared by its
family in ``ops/``, next to its lowering and emitter.  A tensor has a
*logical* shape (ONNX's) and a physical axis order ``perm``: ``perm = (0, 2, 3, 1)``
stores a logical NCHW tensor as NHWC in memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np


@dataclass(eq=False)
class Tensor:
    """A value of the partition: concrete logical shape, physical order, maybe a constant."""

    name: str
    shape: tuple[int, ...]
    const: np.ndarray | None = None
    perm: tuple[int, ...] = ()
    view_of: Tensor | None = None  # shares the storage of another tensor (same bytes)
    origin: str = ""  # the ONNX node whose lowering made it (kernel names in per-op profiles)

    def __post_init__(self) -> None:
        if not self.perm:
            self.perm = tuple(range(len(self.shape)))

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def physical_shape(self) -> tuple[int, ...]:
        return tuple(self.shape[a] for a in self.perm)

    def physical_const(self) -> np.ndarray:
        """The constant laid out in this tensor's physical order."""
        assert self.const is not None
        return np.ascontiguousarray(np.transpose(self.const.reshape(self.shape), self.perm), dtype=np.float32)

    def root(self) -> Tensor:
        """The tensor that owns the storage."""
        tensor = self
        while tensor.view_of is not None:
            tensor = tensor.view_of
        return tensor


def same_memory_order(shape: tuple[int, ...], perm_a: tuple[int, ...], perm_b: tuple[int, ...]) -> bool:
    """Whether two physical orders of ``shape`` put the bytes in the same order.

    Size-1 axes do not move bytes, so e.g. NCHW and NHWC agree when H = W = 1.
    """
    keep_a = [a for a in perm_a if shape[a] != 1]
    keep_b = [a for a in perm_b if shape[a] != 1]
    return keep_a == keep_b


def row_major_strides(shape: tuple[int, ...]) -> list[int]:
    """Strides (in elements) of a contiguous row-major array of ``shape``."""
    strides, step = [0] * len(shape), 1
    for axis in reversed(range(len(shape))):
        strides[axis] = step
        step *= shape[axis]
    return strides


def channels_last(rank: int) -> tuple[int, ...]:
    """The physical order that stores logical N, C, spatial... as N, spatial..., C."""
    return (0, *range(2, rank), 1)


@dataclass(frozen=True)
class Window:
    """Kernel geometry shared by Conv and pools (spatial axes only)."""

    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    pads_begin: tuple[int, ...]
    pads_end: tuple[int, ...]
    dilations: tuple[int, ...]


@dataclass(eq=False)
class Op:
    """Base of the lowered ops: inputs and one output."""

    inputs: list[Tensor]
    out: Tensor
    # Its emitter runs the elementwise steps fused after it on each finished output row
    # (``emit_epilogue``), so fusion treats it as an anchor, like Conv and MatMul (_fuse.py).
    row_epilogue: ClassVar[bool] = False
    # Dropped where nothing reads its result (it only computes it): the elementwise ops of a
    # DequantizeLinear whose Conv reads the 8-bit values instead (ops/quantize.quantized_conv).
    dropped_unread: ClassVar[bool] = False

    def checks_at_run_time(self) -> bool:
        """Whether its kernel may find a run-time value it cannot compute with (a sequence
        length out of range) and set ``cg_int_overflow``, which hands the call to the host."""
        return False


@dataclass(eq=False)
class SpatialOp(Op):
    """An op on images that runs on channels-last data (Conv, the pools)."""

    native_nhwc: bool = False  # the codegraft.nhwc form: logical shapes are already NHWC
    # Its kernel can write its result inside the next Conv's zero border (GEMM Convs and the
    # pools: _fuse._write_into_borders, Kernel.border).
    border_output: ClassVar[bool] = False


@dataclass(eq=False)
class Conv(SpatialOp):
    """Convolution on channels-last data; ``weight`` is ``[M, k..., C/group]`` (OHWI)."""

    weight: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    group: int = 1
    window: Window | None = None
    border_output: ClassVar[bool] = True  # not depthwise ones: _fuse checks


@dataclass(eq=False)
class MatMul(Op):
    """``A @ B`` with numpy batching; ``trans_a``/``trans_b`` swap the last two axes (Gemm)."""

    trans_a: bool = False
    trans_b: bool = False


@dataclass(eq=False)
class Elementwise(Op):
    """One elementwise op (``kind``: a key of ``ops/elementwise.EXPRESSIONS``) with broadcasting."""

    kind: str = ""
    params: tuple[float, ...] = ()
    dropped_unread: ClassVar[bool] = True


@dataclass(eq=False)
class Concat(Op):
    """Concatenation along logical ``axis``."""

    axis: int = 0


@dataclass(eq=False)
class Transpose(Op):
    """Physical transpose: output physical axis ``i`` is input physical axis ``perm[i]``."""

    perm: tuple[int, ...] = ()


@dataclass(eq=False)
class View(Op):
    """The same bytes under another logical shape (Reshape, Flatten, Squeeze, Identity, ...)."""


@dataclass(eq=False)
class Copy(Op):
    """A plain copy (a graph output that is an input, a constant or a view)."""


@dataclass
class Graph:
    """A lowered partition: ops in execution order, inputs and outputs in partition order."""

    inputs: list[Tensor]
    outputs: list[Tensor]
    ops: list[Op]
