"""The records an op family fills in: one per ONNX op type, one per op of the backend's graph.

An :class:`OnnxOp` says whether a node is taken (``check``: ``""`` or the reason why not) and
what it becomes (``lower``: the backend's ops, via :class:`~codegraft.backends.c._lowerer.Lowerer`).
A :class:`KernelOp` says, for one op class of ``_graph.py`` or of a family, in which physical
order its tensors are kept (:class:`Layout`) and how its C is written (``emit``).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import onnx_ir as ir

from codegraft.backends.c import _graph as g
from codegraft.backends.c._emit import Context
from codegraft.backends.c._fuse import Kernel
from codegraft.backends.c._lowerer import Lowerer

OpT = TypeVar("OpT", bound=g.Op)
Check = Callable[[ir.Node], str]
Lowering = Callable[[Lowerer, ir.Node], None]
Emitter = Callable[[Context, Kernel], None]


def accept(node: ir.Node) -> str:
    """The check of an op with nothing to check beyond the common ones (float32 data, no empty tensor)."""
    return ""


# The integer types (bool aside) the backend holds as exact floats (every value up to 2**24).
INTEGER_DTYPES = frozenset({
    ir.DataType.INT8, ir.DataType.UINT8, ir.DataType.INT16, ir.DataType.UINT16,
    ir.DataType.INT32, ir.DataType.UINT32, ir.DataType.INT64, ir.DataType.UINT64,
})  # fmt: skip

# float16 data is computed in float32, as onnxruntime's CPU provider computes it (it casts
# around every op without a float16 kernel, and drops the casts between such ops): widened
# exactly at a partition's entry, rounded again where the model casts to float16 and at its exit.
FLOATS = frozenset({ir.DataType.FLOAT, ir.DataType.FLOAT16})


@dataclass(frozen=True)
class OnnxOp:
    """One ONNX op type the backend takes: why a node may not be taken, and what it becomes.

    ``non_data``: inputs that are shapes, axes, indices or flags rather than float data (the
    common float32 check skips them); ``converted``: inputs that may be bool or integer at run
    time, which reach the kernels as float32 (the partition's entry converts them as ONNX's
    Cast to float does; Where's condition, a Cast's input, a comparison's operands);
    ``bool_output``: its output is bool, computed as 0/1 floats (comparisons, Not, And; a
    partition output of them is converted back at the exit); ``moves_data``: it moves its data
    without computing on it, so bool data (0/1 floats) and integer data (held exactly: float32
    holds every integer up to 2**24) pass through it (Reshape, Concat, Gather: an attention mask
    reshaped and gathered, token ids sliced before their embedding; a partition output of them is
    converted back at the exit, and an integer input beyond 2**24 sends the partition to the
    host at run time); ``index_output``: its output is integer indices, computed as exact floats
    (ArgMax); ``integer_arithmetic``: it computes on integers too, held as exact floats (a
    result float32 cannot hold sends the call to the host: ``INTEGER_HELPERS``); ``nhwc``: also taken in the
    ``codegraft.nhwc`` domain; ``contrib``: taken in onnxruntime's ``com.microsoft`` domain,
    where the op of this name is onnxruntime's contrib op (SkipLayerNormalization, BiasGelu:
    what onnxruntime's transformer optimizer leaves in a model); ``ml``: an op of the
    ``ai.onnx.ml`` domain, taken there only (Scaler, Normalizer, LinearClassifier: what skl2onnx
    makes of a scikit-learn pipeline, in onnxruntime's arithmetic, ``core/providers/cpu/ml``).

    Example::

        OnnxOp("Flatten", lower=_flatten)
        OnnxOp("Reshape", lower=_reshape, check=check_reshape, non_data=frozenset({1}))
    """

    op_type: str
    lower: Lowering
    check: Check = accept
    non_data: frozenset[int] = frozenset()
    converted: frozenset[int] = frozenset()
    bool_output: bool = False
    moves_data: bool = False
    index_output: bool = False
    integer_arithmetic: bool = False
    nhwc: bool = False
    contrib: bool = False
    ml: bool = False


class Layout(enum.Enum):
    """Where an op of the backend's graph wants its tensors (``_layout.py`` applies the rule)."""

    PLAIN = "plain"  # inputs converted to the logical order (NCHW), output plain
    CHANNELS_LAST = "channels-last"  # image ops: input and output NHWC (a g.SpatialOp)
    FOLLOW_INPUTS = "follow-inputs"  # elementwise: the order of the first non-plain operand, broadcasting
    ALIGN_INPUTS = "align-inputs"  # Concat: every input converted to the first non-plain one's order
    KEEP_INPUT = "keep-input"  # input untouched, output in its order (works along any channel axis)
    ANY_ORDER = "any-order"  # input untouched, output plain (reads all of its input, in any order)
    VIEW = "view"  # no code: the output shares the input's bytes (plain unless the shape is unchanged)
    PERMUTE = "permute"  # a logical transpose: a view of a non-plain input (no bytes move), else a plain transpose


@dataclass(frozen=True)
class KernelOp:
    """One op class of the backend's graph: its layout rule and its C emitter.

    ``emit`` is ``None`` exactly for :attr:`Layout.VIEW` (a view is storage sharing, not work).

    Example::

        KernelOp(Softmax, Layout.PLAIN, emit_softmax)
    """

    op: type[g.Op]
    layout: Layout
    emit: Emitter | None



def core_of(kernel: Kernel, op_class: type[OpT]) -> OpT:
    """The kernel's core op, which is an ``op_class`` (the table calls an emitter only for its own class)."""
    core = kernel.core
    assert isinstance(core, op_class), f"{op_class.__name__}'s emitter called on {type(core).__name__}"
    return core
