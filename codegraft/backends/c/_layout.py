"""Layout: choose each tensor's physical order; insert transposes only where orders disagree.

NOTE: each op's rule is declared with it in the op table (``ops/``, :class:`Layout`).
Convolutions and pools run on channels-last data (``NHWC``).  Standard ONNX Conv
reads logical NCHW, so its input is stored with ``perm = (0, 2, 3, 1)``; ops in the
``codegraft.nhwc`` domain are already logically NHWC and need nothing.  Elementwise ops
and Concat follow their inputs' order, so a chain Conv -> BN -> Relu -> Conv stays
channels-last; everything else (MatMul, Softmax, Reshape, partition outputs, ...) wants
the plain order.  A conversion whose bytes would not move (all moved axes have size 1,
e.g. NCHW -> NHWC after a global pool) becomes a view, not a copy.

Reshapes and Transposes between channels-last ops keep the data where it is when their
consumers take any order (views) or run channels-last: a Reshape of a channels-last tensor
that only splits or merges axes whose bytes are adjacent is a view in a matching physical
order (:func:`view_perm`), and a Transpose of a tensor not in plain order is a view whose
physical order relabels the input's (no bytes move).  ShuffleNet's channel shuffle
(Reshape to ``[N, G, C/G, H, W]``, Transpose of the two channel axes, Reshape back) thus
costs one per-pixel ``G x C/G`` transpose instead of three whole-tensor ones (NHWC to NCHW,
the shuffle, back).
"""

from __future__ import annotations

import math

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
    consumers: dict[int, list[g.Op]] = {}
    for op in graph.ops:
        for tensor in op.inputs:
            consumers.setdefault(id(tensor), []).append(op)
    partition_outputs = {id(t) for t in graph.outputs}

    def absorbed(tensor: g.Tensor) -> bool:
        """Whether every use of ``tensor`` takes any order (a view) or wants channels-last."""
        uses = consumers.get(id(tensor), [])
        return bool(uses) and id(tensor) not in partition_outputs and all(
            KERNEL_OPS[type(use)].layout in (Layout.VIEW, Layout.PERMUTE, Layout.CHANNELS_LAST) for use in uses
        )

    for op in graph.ops:
        rule = KERNEL_OPS[type(op)].layout
        if rule is Layout.PERMUTE:
            assert isinstance(op, g.Transpose)
            x = op.inputs[0]
            if x.perm != tuple(range(len(x.shape))):  # a plain input: a real transpose, as before
                # output axis i is input axis perm[i]: the same bytes, read in the input's order
                op.out.perm = tuple(op.perm.index(axis) for axis in x.perm)
                op.out.view_of = x
                continue
            rule = Layout.PLAIN
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
        elif rule is Layout.ANY_ORDER:
            pass  # its input as it is kept, its output plain
        elif rule is Layout.VIEW and op.out.shape == op.inputs[0].shape:
            op.out.perm = op.inputs[0].perm  # Identity keeps any order
        elif rule is Layout.VIEW and absorbed(op.out) and _keep_reshaped(lay, op, consumers[id(op.out)]):
            pass
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


def _keep_reshaped(lay: _Layouter, op: g.Op, uses: list[g.Op]) -> bool:
    """Give a reshaping view of a non-plain tensor a physical order without going through the
    plain one: the input's own bytes when they fit the new shape, else (for channels-last
    consumers) one conversion of the input to the order that makes the output channels-last."""
    x, out = op.inputs[0], op.out
    if x.perm == tuple(range(len(x.shape))):
        return False
    perm = view_perm(x.shape, x.perm, out.shape)
    if perm is None:
        wanted = {_channels_last_perm(use) for use in uses}
        if len(wanted) != 1 or None in wanted:
            return False
        target = wanted.pop()
        assert target is not None
        needed = view_perm(out.shape, target, x.shape)
        if needed is None:
            return False
        op.inputs = [lay.as_perm(x, needed)]
        perm = target
    out.perm = perm
    return True


def _channels_last_perm(op: g.Op) -> tuple[int, ...] | None:
    if KERNEL_OPS[type(op)].layout is not Layout.CHANNELS_LAST or not isinstance(op, g.SpatialOp):
        return None
    rank = len(op.inputs[0].shape)
    return tuple(range(rank)) if op.native_nhwc else g.channels_last(rank)


def view_perm(shape: tuple[int, ...], perm: tuple[int, ...], new_shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """A physical order for ``new_shape`` under which the (row-major) reshape of ``shape``
    stored in order ``perm`` moves no bytes, or ``None`` when there is none.

    Both shapes are cut into common factors ("atoms"); the reshape is a view when each new
    axis is a run of atoms that lie next to each other, in order, in the stored bytes.

    >>> view_perm((1, 136, 28, 28), (0, 2, 3, 1), (1, 4, 34, 28, 28))  # split C of NHWC: N H W G C/G
    (0, 3, 4, 1, 2)
    >>> view_perm((1, 64, 7, 7), (0, 2, 3, 1), (1, 3136)) is None  # flattening NHWC as NCHW moves bytes
    True
    """
    def inner(dims: tuple[int, ...], axis: int) -> int:
        return math.prod(dims[axis + 1:])

    bounds = sorted({inner(shape, a) for a in range(len(shape))} | {inner(new_shape, a) for a in range(len(new_shape))}
                    | {math.prod(shape)})
    if math.prod(shape) != math.prod(new_shape) or any(b % a for a, b in zip(bounds, bounds[1:], strict=False)):
        return None

    def atoms(dims: tuple[int, ...], axis: int) -> list[int]:  # lower bounds, most significant first
        low = inner(dims, axis)
        return [b for b in reversed(bounds) if low <= b < low * dims[axis]]

    stored = [b for axis in perm for b in atoms(shape, axis)]
    position = {b: i for i, b in enumerate(stored)}
    key: dict[int, tuple[float, int]] = {}
    last = -1.0
    for axis in range(len(new_shape)):
        runs = [position[b] for b in atoms(new_shape, axis)]
        if runs != list(range(runs[0], runs[0] + len(runs))) if runs else False:
            return None
        if runs:
            key[axis], last = (runs[0], axis), runs[-1]
        else:  # a size-1 axis: right after the axis before it
            key[axis] = (last + 0.5, axis)
    return tuple(sorted(range(len(new_shape)), key=lambda a: key[a]))
