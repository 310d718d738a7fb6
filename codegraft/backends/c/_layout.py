"""Layout: choose each tensor's physical order; insert transposes only where orders disagree.

NOTE: each op's rule is declared with it in the op table (``ops/``, :class:`Layout`).
Convolutions and pools run on channels-last data (``NHWC``).  Standard ONNX Conv
reads logical NCHW, so its input is stored with ``perm = (0, 2, 3, 1)``; ops in the
``codegraft.nhwc`` domain are already logically NHWC and need nothing.  Elementwise ops
and Concat follow their inputs' order, so a chain Conv -> BN -> Relu -> Conv stays
channels-last; everything else (MatMul, Softmax, Reshape, partition outputs, ...) wants
the plain order.  A conversion whose bytes would not move (all moved axes have size 1,
e.g. NCHW -> NHWC after a global pool) becomes a view, not a copy.
"""

from __future__ import annotations

from codegraft.backends.c import _graph as g
from codegraft.backends.c.ops import KERNEL_OPS, Layout


class _Layouter:
    def __init__(self) -> None:
        self.ops: list[g.Op] = []
        self.converted: dict[tuple[int, tuple[int, ...]], g.Tensor] = {}

    def as_perm(self, tensor: g.Tensor, perm: tuple[int, ...]) -> g.Tensor:
        """``tensor`` stored in physical order ``perm`` (itself, a view, a constant or a copy)."""
        if tensor.perm == perm:
            return tensor
        key = (id(tensor), perm)
        if key in self.converted:
            return self.converted[key]
        if tensor.const is not None:
            out = g.Tensor(tensor.name + "_p", tensor.shape, const=tensor.const, perm=perm)
        elif g.same_memory_order(tensor.shape, tensor.perm, perm):
            out = g.Tensor(tensor.name + "_v", tensor.shape, perm=perm, view_of=tensor)
        else:
            out = g.Tensor(tensor.name + "_t", tensor.shape, perm=perm)
            physical = tuple(tensor.perm.index(axis) for axis in perm)
            self.ops.append(g.Transpose([tensor], out, perm=physical))
        self.converted[key] = out
        return out

    def plain(self, tensor: g.Tensor) -> g.Tensor:
        return self.as_perm(tensor, tuple(range(len(tensor.shape))))


def assign_layout(graph: g.Graph) -> g.Graph:
    """Set ``perm`` on every tensor and return the graph with the needed transposes.

    Each op's rule is its entry's :class:`~codegraft.backends.c.ops.Layout` in the op table.
    """
    lay = _Layouter()
    for op in graph.ops:
        rule = KERNEL_OPS[type(op)].layout
        if rule is Layout.CHANNELS_LAST:
            assert isinstance(op, g.SpatialOp)
            rank = len(op.out.shape)
            perm = tuple(range(rank)) if op.native_nhwc else g.channels_last(rank)
            op.inputs = [lay.as_perm(op.inputs[0], perm)]
            op.out.perm = perm
        elif rule is Layout.FOLLOW_INPUTS:
            _follow_inputs(lay, op, op.inputs)
        elif rule is Layout.ALIGN_INPUTS:
            # Follow the first input not in plain order (usually channels-last from a Conv):
            # the others are converted, often reusing a conversion made for a Conv anyway.
            identity = tuple(range(len(op.out.shape)))
            perm = next((t.perm for t in op.inputs if t.const is None and t.perm != identity), identity)
            op.inputs = [lay.as_perm(t, perm) for t in op.inputs]
            op.out.perm = perm
        elif rule is Layout.KEEP_INPUT:
            op.out.perm = op.inputs[0].perm
        elif rule is Layout.VIEW and op.out.shape == op.inputs[0].shape:
            op.out.perm = op.inputs[0].perm  # Identity keeps any order
        else:
            op.inputs = [lay.plain(t) for t in op.inputs]
        if rule is Layout.VIEW:
            op.out.view_of = op.inputs[0]
            continue  # a view is storage sharing, not work
        lay.ops.append(op)
    outputs = _materialise_outputs(lay, graph)
    return g.Graph(graph.inputs, outputs, lay.ops)


def _follow_inputs(lay: _Layouter, op: g.Op, inputs: list[g.Tensor]) -> None:
    rank = len(op.out.shape)
    identity = tuple(range(rank))
    perm = next((t.perm for t in inputs if t.const is None and len(t.shape) == rank and t.perm != identity), identity)
    converted = []
    for tensor in inputs:
        lead = rank - len(tensor.shape)
        own = tuple(a - lead for a in perm if a >= lead)  # ``perm`` restricted to this operand's axes
        padded = (1,) * lead + tensor.shape
        extended = tuple(range(lead)) + tuple(a + lead for a in tensor.perm)
        if tensor.const is None and g.same_memory_order(padded, extended, perm):
            converted.append(tensor)
        else:
            converted.append(lay.as_perm(tensor, own))
    op.inputs = converted
    op.out.perm = perm


def _materialise_outputs(lay: _Layouter, graph: g.Graph) -> list[g.Tensor]:
    """Partition outputs must be plain, owned tensors written by a kernel (the caller's buffers)."""
    inputs = {id(t) for t in graph.inputs}
    taken: set[int] = set()
    outputs = []
    for tensor in graph.outputs:
        tensor = lay.plain(tensor)
        produced = {id(op.out) for op in lay.ops}
        if tensor.view_of is not None or id(tensor) in inputs or id(tensor) not in produced or id(tensor) in taken:
            copy = g.Tensor(tensor.name + "_out", tensor.shape)
            lay.ops.append(g.Copy([tensor], copy))
            tensor = copy
        taken.add(id(tensor))
        outputs.append(tensor)
    return outputs
