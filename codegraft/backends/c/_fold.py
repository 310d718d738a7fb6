"""Folding: a Conv's per-channel scale and shift (bias, BatchNorm) go into its weights.

NOTE: after fusion (``_fuse.py``) a Conv followed by a bias and a BatchNormalization is one
kernel whose epilogue starts ``acc + bias``, ``* scale``, ``+ shift``: three loads and three
operations per output value, on every tile, at run time.  Each step whose other operand is
a constant with one value per output channel (or one for all) is affine in the
accumulator, so the whole leading run of them is ``acc * S + B`` with per-channel ``S`` and
``B``: ``S`` is multiplied into the weights once, here, at compile time, and the epilogue
keeps a single ``+ B`` (none when ``B`` is zero).  onnxruntime's graph optimiser does the
same to a Conv followed by BatchNormalization (its ``ConvBNFusion``).  Rounding differs from
the unfolded order by an ulp or so, well inside the 1e-4 the backend is held to.

Example: ``Conv -> add+mul+add+relu`` (bias, BatchNorm, Relu) becomes ``Conv -> add+relu``.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from codegraft.backends.c import _graph as g
from codegraft.backends.c._fuse import Kernel, Ref, RowCol, Step

_AFFINE = frozenset({"add", "mul", "sub"})


def fold_affine(kernel: Kernel) -> None:
    """Fold the leading per-channel affine steps of a Conv kernel into its weights (in place)."""
    conv = kernel.core
    if not isinstance(conv, g.Conv):
        return
    channels = conv.weight.shape[0]
    scale = np.ones(channels, np.float64)
    shift = np.zeros(channels, np.float64)
    current: Ref = ("acc", 0)
    folded = 0
    for step in kernel.steps:
        values = _per_channel(kernel, step, current, channels)
        if values is None:
            break
        if step.kind == "mul":
            scale, shift = scale * values, shift * values
        elif step.kind == "add":
            shift = shift + values
        else:  # "sub", the accumulator first
            shift = shift - values
        current = ("step", folded)
        folded += 1
    if folded == 0 or (folded == 1 and kernel.steps[0].kind == "add"):
        return  # nothing to gain: at most one add, which stays an add
    rest = kernel.steps[folded:]
    if any(ref[0] == "acc" or ref[0] == "step" and ref[1] < folded - 1 for step in rest for ref in step.args):
        return  # a later step reads a value from inside the folded run
    weight = conv.weight.astype(np.float64) * scale.reshape((channels,) + (1,) * (conv.weight.ndim - 1))
    kernel.core = dataclasses.replace(conv, weight=weight.astype(np.float32))
    steps: list[Step] = []
    operands: list[g.Tensor] = []
    indexing: list[RowCol] = []

    def operand(tensor: g.Tensor, index: RowCol) -> Ref:
        for j, existing in enumerate(operands):
            if existing is tensor:
                return ("in", j)
        operands.append(tensor)
        indexing.append(index)
        return ("in", len(operands) - 1)

    if np.any(shift != 0.0):
        bias = _channel_constant(kernel.out, shift.astype(np.float32))
        steps.append(Step("add", (("acc", 0), operand(bias, RowCol(0, 1))), ()))
    folded_value: Ref = ("step", 0) if steps else ("acc", 0)
    offset = len(steps) - folded

    def remap(ref: Ref) -> Ref:
        kind, index = ref
        if kind == "in":
            return operand(kernel.operands[index], kernel.indexing[index])
        return folded_value if index == folded - 1 else ("step", index + offset)

    for step in rest:
        steps.append(Step(step.kind, tuple(remap(r) for r in step.args), step.params))
    kernel.steps, kernel.operands, kernel.indexing = steps, operands, indexing


def _per_channel(kernel: Kernel, step: Step, current: Ref, channels: int) -> np.ndarray | None:
    """The per-channel values ``step`` applies to ``current`` affinely, or ``None``."""
    if step.kind not in _AFFINE or len(step.args) != 2 or step.args[0] != current and step.kind == "sub":
        return None
    if current not in step.args:
        return None
    other = step.args[1] if step.args[0] == current else step.args[0]
    if other == current or other[0] != "in":
        return None
    tensor, index = kernel.operands[other[1]], kernel.indexing[other[1]]
    if tensor.root().const is None or index.row_stride != 0:
        return None
    values = tensor.root().physical_const().reshape(-1).astype(np.float64)
    if values.size == 1:
        return np.full(channels, values[0])
    return values if values.size == channels and index.col_stride == 1 else None


def _channel_constant(out: g.Tensor, values: np.ndarray) -> g.Tensor:
    """A constant holding one value per channel (``out``'s last physical axis), in ``out``'s order."""
    axis = out.perm[-1]
    shape = tuple(values.size if a == axis else 1 for a in range(len(out.shape)))
    return g.Tensor(f"{out.name}_folded_shift", shape, const=values.reshape(shape), perm=out.perm)
