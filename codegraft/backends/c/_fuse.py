"""Fusion: elementwise chains become one loop; elementwise epilogues join their Conv/MatMul.

NOTE: an elementwise op joins the group that produced one of its inputs when that input is
used by nothing else (and is not a partition output) and the op does not broadcast it to a
bigger shape. One exception: a value whose two uses are a chain of single-use elementwise
ops and the op that chain ends in, which reads the value too (``x * sigmoid(x)``, SiLU, of
every YOLO since v5; ``x * relu6(x + 3) / 6``, HardSwish as exporters spell it; GELU as
``x * 0.5 * (1 + erf(x / sqrt 2))``): the chain joins the value's group and the op that closes
it reads the value inside the group (:func:`_diamonds`), so the value is never written
(nudenet's YOLOv8: 57 SiLUs, 2.6 of 20 ms as loops of their own). For a Conv or MatMul group
("anchor") the op's other operands must be addressable per output row/column: a scalar, one
value per output channel (bias, BatchNorm), one per row, or a full tensor in the same layout
(residual Add). A group runs at the position of its *last* member, when every operand of
every member exists; the values inside a group are never written to memory.

Two copies are then avoided by where a kernel writes: a Conv whose result is only a
channel slice of a channels-last Concat writes into the Concat's output (``Kernel.slot``),
and a GEMM Conv or a pool whose result only feeds a padded 2-D Conv writes inside that
Conv's zero border (``Kernel.border``), which then skips its padding copy.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from codegraft.backends.c import _graph as g

# A reference to a scalar inside a fused expression: ("acc", 0) the anchor's result,
# ("in", j) operand j of the group, ("step", k) the result of step k.
Ref = tuple[str, int]


@dataclass(frozen=True)
class Step:
    """One elementwise op inside a fused loop."""

    kind: str
    args: tuple[Ref, ...]
    params: tuple[float, ...]


@dataclass(frozen=True)
class RowCol:
    """How an anchor epilogue operand is indexed: ``row * row_stride + col * col_stride``."""

    row_stride: int
    col_stride: int


@dataclass(eq=False)
class Kernel:
    """One unit of generated code: a core op (or none, for a pure elementwise loop) and steps."""

    core: g.Op | None
    out: g.Tensor
    operands: list[g.Tensor] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    indexing: list[RowCol] = field(default_factory=list)  # anchors only, per operand
    position: int = 0
    # A Conv whose result is only a channel slice of a Concat writes straight into it:
    # (the Concat's output, first channel); the Concat then skips that input.
    slot: tuple[g.Tensor, int] | None = None
    in_place: frozenset[int] = frozenset()  # Concat kernels: inputs already written by their producer
    # A GEMM Conv or a pool whose result only feeds a padded Conv writes it inside that Conv's zero
    # border: (pad top, pad left, padded height, padded width); the reader then skips its
    # padding copy (``padded_input``).
    border: tuple[int, int, int, int] | None = None
    padded_input: bool = False
    # Values computed inside the group that a later member reads again (a SiLU's x): their refs.
    values: dict[int, Ref] = field(default_factory=dict)

    @property
    def is_anchor(self) -> bool:
        return isinstance(self.core, g.Conv | g.MatMul) or (self.core is not None and self.core.row_epilogue)

    def result(self) -> Ref:
        return ("step", len(self.steps) - 1) if self.steps else ("acc", 0)

    def operand_ref(self, tensor: g.Tensor) -> Ref:
        for index, existing in enumerate(self.operands):
            if existing is tensor:
                return ("in", index)
        self.operands.append(tensor)
        return ("in", len(self.operands) - 1)


def row_col(operand: g.Tensor, out: g.Tensor) -> RowCol | None:
    """Indexing of ``operand`` over ``out`` seen as rows x last physical axis, if simple."""
    rank = len(out.shape)
    padded = (1,) * (rank - len(operand.shape)) + operand.shape
    physical = [padded[a] for a in out.perm]
    rows, col = physical[:-1], physical[-1]
    col_stride = 0 if col == 1 else 1
    if all(d == 1 for d in rows):
        return RowCol(0, col_stride)
    if tuple(rows) == out.physical_shape[:-1]:
        return RowCol(col, col_stride)
    return None


def fuse(graph: g.Graph) -> list[Kernel]:
    """Group the ops into kernels, in execution order."""
    uses: dict[int, int] = {}
    for op in graph.ops:
        for tensor in op.inputs:
            uses[id(tensor.root())] = uses.get(id(tensor.root()), 0) + 1
    pinned = {id(t.root()) for t in graph.outputs}
    diamonds = _diamonds(graph, uses, pinned)
    open_groups: dict[int, Kernel] = {}  # id(output tensor) -> its group, while extendable
    kernels: list[Kernel] = []
    for position, op in enumerate(graph.ops):
        if isinstance(op, g.Elementwise):
            kernel = _extend(op, open_groups, uses, pinned, diamonds)
            if kernel is None:
                kernel = Kernel(None, op.out)
                args = tuple(kernel.operand_ref(t) for t in op.inputs)
                kernel.steps.append(Step(op.kind, args, op.params))
                kernels.append(kernel)
        else:
            kernel = Kernel(op, op.out)
            kernels.append(kernel)
        kernel.position = position
        if kernel.core is None or kernel.is_anchor:
            open_groups[id(kernel.out)] = kernel
    kernels.sort(key=lambda k: k.position)
    _write_into_concats(kernels, uses, pinned)
    _write_into_borders(kernels, uses, pinned)
    return kernels


def _write_into_borders(kernels: list[Kernel], uses: dict[int, int], pinned: set[int]) -> None:
    """Let GEMM Conv and pool kernels feeding only a padded 2-D GEMM Conv write inside its
    zero border.

    A padded Conv first copies its input into a zero-bordered buffer (``cg_pad``): vgg19's
    64 -> 64 3x3 at 224x224 spends 2.0 of 24.4 ms on it.  When the input comes from a GEMM
    Conv (its driver places each tile's rows, ``gemm_driver.c``) or a pool (``cg_pool``
    takes the output's image size) and nothing else reads it, that kernel writes into the
    bordered buffer instead and the copy goes.
    """
    producer = {id(k.out): k for k in kernels}
    for kernel in kernels:
        conv = kernel.core
        if not isinstance(conv, g.Conv) or _is_depthwise(conv) or conv.window is None:
            continue
        window = conv.window
        if len(window.kernel) != 2 or not (any(window.pads_begin) or any(window.pads_end)):
            continue
        x = conv.inputs[0]
        source = producer.get(id(x))
        if (
            source is None
            or not isinstance(source.core, g.SpatialOp)
            or not source.core.border_output
            or (isinstance(source.core, g.Conv) and _is_depthwise(source.core))
            or source.slot is not None
            or source.border is not None
            or x.view_of is not None
            or uses.get(id(x), 0) != 1
            or id(x) in pinned
            or len(x.physical_shape) != 4
        ):
            continue
        _, h, w, _ = x.physical_shape
        top, left = window.pads_begin
        source.border = (top, left, h + top + window.pads_end[0], w + left + window.pads_end[1])
        kernel.padded_input = True


def _write_into_concats(kernels: list[Kernel], uses: dict[int, int], pinned: set[int]) -> None:
    """Let Conv kernels feeding a channel-last Concat write their slice directly (no copy)."""
    producer = {id(k.out): k for k in kernels}
    for kernel in kernels:
        concat = kernel.core
        if not isinstance(concat, g.Concat) or concat.out.perm.index(concat.axis) != len(concat.out.shape) - 1:
            continue
        offset, done = 0, set()
        for index, tensor in enumerate(concat.inputs):
            source = producer.get(id(tensor))
            if (
                source is not None
                and isinstance(source.core, g.Conv)
                and not _is_depthwise(source.core)
                and tensor.view_of is None
                and uses.get(id(tensor), 0) == 1
                and id(tensor) not in pinned
                and tensor.perm == concat.out.perm
            ):
                source.slot = (concat.out, offset)
                done.add(index)
            offset += tensor.physical_shape[-1]
        kernel.in_place = frozenset(done)


def _is_depthwise(conv: g.Conv) -> bool:
    channels_in = conv.inputs[0].physical_shape[-1]
    return channels_in == conv.group and conv.weight.shape[0] == conv.group


def _diamonds(graph: g.Graph, uses: dict[int, int], pinned: set[int]) -> dict[int, int]:
    """``id(x) -> id(op)`` for each value ``x`` used twice, by ``op`` heading a chain of
    single-use elementwise ops of ``x``'s shape and order, and by the op that chain ends in
    (see the module note).  Both uses then join ``x``'s group."""
    consumers: dict[int, list[g.Op]] = {}
    for op in graph.ops:
        for tensor in op.inputs:
            consumers.setdefault(id(tensor), []).append(op)
    found: dict[int, int] = {}
    for op in graph.ops:
        x = op.out
        readers = consumers.get(id(x), [])
        if len(readers) != 2 or uses.get(id(x), 0) != 2 or id(x) in pinned or x.view_of is not None:
            continue
        head, join = readers
        if head is join or not all(isinstance(r, g.Elementwise) for r in readers):
            continue
        link: g.Op = head
        while link is not join:
            out = link.out
            following = consumers.get(id(out), [])
            if (out.shape, out.perm) != (x.shape, x.perm) or uses.get(id(out), 0) != 1 or id(out) in pinned \
                    or len(following) != 1 or not isinstance(following[0], g.Elementwise):  # fmt: skip
                break
            link = following[0]
        if link is join and (join.out.shape, join.out.perm) == (x.shape, x.perm):
            found[id(x)] = id(head)
    return found


def _extend(
    op: g.Elementwise, groups: dict[int, Kernel], uses: dict[int, int], pinned: set[int], diamonds: dict[int, int]
) -> Kernel | None:
    for tensor in op.inputs:
        kernel = groups.get(id(tensor))
        source = tensor.view_of
        if kernel is None and source is not None and source.shape == tensor.shape and source.perm == tensor.perm:
            # the same bytes under the same shape (a Cast of integers to float): read through
            kernel = groups.get(id(source)) if source.view_of is None else None
            if kernel is not None and uses.get(id(source), 0) == 1 and id(source) not in pinned:
                del groups[id(source)]
                groups[id(tensor)] = kernel
        heads_a_diamond = diamonds.get(id(tensor)) == id(op)
        root = id(tensor.root())
        if kernel is None or (uses.get(root, 0) != 1 and not heads_a_diamond) or root in pinned:
            continue
        if tensor.shape != op.out.shape or tensor.perm != op.out.perm:
            continue
        others = [t for t in op.inputs if t is not tensor and id(t) not in kernel.values]
        indexing = [row_col(t, op.out) for t in others] if kernel.is_anchor else []
        if any(index is None for index in indexing):
            continue
        if heads_a_diamond:  # the op closing the diamond reads it from inside the group
            kernel.values[id(tensor)] = kernel.result()
        args = []
        for t in op.inputs:
            if t is tensor:
                args.append(kernel.result())
            elif id(t) in kernel.values:
                args.append(kernel.values[id(t)])
            else:
                before = len(kernel.operands)
                args.append(kernel.operand_ref(t))
                if kernel.is_anchor and len(kernel.operands) > before:
                    kernel.indexing.append(row_col(t, op.out))  # type: ignore[arg-type]
        kernel.steps.append(Step(op.kind, tuple(args), op.params))
        del groups[id(tensor)]
        groups[id(op.out)] = kernel
        kernel.out = op.out
        return kernel
    return None
