"""Per-op layout rules: in which layout each input must arrive, in which each output leaves.

NOTE: a *perm* ``p`` describes how a value is stored: the stored tensor is
``numpy.transpose(logical, p)``, so stored axis ``j`` holds logical axis ``p[j]``.  The
identity perm is the model's own layout (NCHW); ``(0, 2, 3, 1)`` is NHWC.  Tracking a
general perm (not just an "is NHWC" flag) lets one rule serve rank-3 and rank-4 tensors,
reductions that drop axes, and the model's own Transposes, which simply compose.

A rule looks at a node and the perms its inputs arrive in, and returns a :class:`NodePlan`
or ``None`` (meaning: everything in the model's layout, the safe default).  Rules keep no
state; the driver in :mod:`codegraft.passes.layout` applies the plans.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

Perm = tuple[int, ...]

NHWC_DOMAIN = "codegraft.nhwc"


def identity(rank: int) -> Perm:
    """The perm that leaves a tensor of ``rank`` as it is."""
    return tuple(range(rank))


def channels_last(rank: int) -> Perm:
    """``(0, 2, ..., rank-1, 1)``: channels moved from axis 1 to the end."""
    return (0, *range(2, rank), 1)


def is_identity(perm: Perm) -> bool:
    """Whether ``perm`` keeps every axis in place."""
    return all(axis == i for i, axis in enumerate(perm))


def permute_shape(shape: ir.Shape | None, perm: Perm) -> ir.Shape | None:
    """The shape of ``numpy.transpose(x, perm)`` for ``x`` of ``shape``."""
    if shape is None:
        return None
    dims = list(shape.dims)
    return ir.Shape([dims[axis] for axis in perm])


def unpermute_shape(stored: ir.Shape | None, perm: Perm) -> ir.Shape | None:
    """The logical shape of a tensor stored in ``perm`` with ``stored`` shape."""
    if stored is None:
        return None
    dims: list[int | ir.SymbolicDim] = list(stored.dims)
    logical = [dims[perm.index(axis)] for axis in range(len(perm))]
    return ir.Shape(logical)


@dataclass(frozen=True)
class ArrivingInput:
    """What a rule knows about one input of the node it plans."""

    value: ir.Value | None  # the model's value (its ``shape`` may already be the stored one)
    perm: Perm | None  # the perm it is stored in; None: rank unknown
    is_constant: bool
    shape: ir.Shape | None = None  # the logical shape, as in the original model

    @property
    def rank(self) -> int | None:
        """Rank of the logical tensor, when known."""
        return None if self.perm is None else len(self.perm)

    @property
    def is_single_element(self) -> bool:
        """Known to hold exactly one element, so any layout reads the same."""
        return self.shape is not None and all(isinstance(d, int) and d == 1 for d in self.shape.dims)


@dataclass(frozen=True)
class NodePlan:
    """How one node runs after the rewrite.

    ``input_perms[i]`` is the perm input ``i`` must be stored in (``None``: leave it as is,
    used for absent inputs and single-element operands); a constant of lower rank than its
    perm is first given leading unit axes (numpy broadcasting is unchanged by that).
    """

    input_perms: tuple[Perm | None, ...]
    output_perms: tuple[Perm | None, ...]
    domain: str | None = None  # move the node to this domain
    attributes: Mapping[str, ir.Attr] = field(default_factory=dict)
    new_constants: Mapping[int, np.ndarray] = field(default_factory=dict)  # input index -> value
    reason: str = ""


Rule = Callable[[ir.Node, Sequence[ArrivingInput], int], "NodePlan | None"]


def _all_identity(node: ir.Node, inputs: Sequence[ArrivingInput]) -> NodePlan:
    return NodePlan(
        input_perms=tuple(None if a.perm is None else identity(len(a.perm)) for a in inputs),
        output_perms=tuple(None for _ in node.outputs),
    )


# --- layout-sensitive ops: moved into the codegraft.nhwc domain ---------------------------

_SPATIAL_RANKS: Mapping[str, tuple[int, ...]] = {
    "Conv": (3, 4),
    "MaxPool": (3, 4),
    "AveragePool": (3, 4),
    "LpPool": (3, 4),
    "GlobalAveragePool": (3, 4),
    "GlobalMaxPool": (3, 4),
    "BatchNormalization": (4,),
    "Resize": (4,),
}


def _to_channels_last(node: ir.Node, inputs: Sequence[ArrivingInput], opset: int) -> NodePlan | None:
    rank = inputs[0].rank
    if rank not in _SPATIAL_RANKS[node.op_type]:
        return None
    if len(node.outputs) != 1:  # MaxPool Indices, training-mode BatchNormalization
        return None
    perm = channels_last(rank)
    wanted: list[Perm | None] = [perm]
    for i, arriving in enumerate(inputs[1:], start=1):
        if arriving.value is None or arriving.perm is None:
            wanted.append(None)
        elif node.op_type == "Conv" and i == 1:
            if arriving.rank != rank:
                return None
            wanted.append(perm)  # OIHW -> OHWI is the same perm as NCHW -> NHWC
        else:
            wanted.append(identity(len(arriving.perm)))
    return NodePlan(tuple(wanted), (perm,), domain=NHWC_DOMAIN, reason="layout-sensitive")


# --- ops that work in any layout, element by element ---------------------------------------

ELEMENTWISE: frozenset[str] = frozenset(
    {
        "Abs", "Acos", "Acosh", "Add", "And", "Asin", "Asinh", "Atan", "Atanh", "BitShift",
        "Cast", "Ceil", "Celu", "Clip", "Cos", "Cosh", "Div", "Dropout", "Elu", "Equal", "Erf",
        "Exp", "Floor", "Gelu", "Greater", "GreaterOrEqual", "HardSigmoid", "HardSwish",
        "Identity", "IsInf", "IsNaN", "LeakyRelu", "Less", "LessOrEqual", "Log", "Max", "Mean",
        "Min", "Mish", "Mod", "Mul", "Neg", "Not", "Or", "Pow", "PRelu", "Reciprocal", "Relu",
        "Round", "Selu", "Shrink", "Sigmoid", "Sign", "Sin", "Sinh", "Softplus", "Softsign",
        "Sqrt", "Sub", "Sum", "Tan", "Tanh", "ThresholdedRelu", "Where", "Xor",
    }
)  # fmt: skip


def _dominant_perm(inputs: Sequence[ArrivingInput], rank: int) -> Perm | None:
    """The non-identity perm most full-rank computed inputs arrive in (constants don't vote)."""
    votes = Counter(
        a.perm
        for a in inputs
        if a.perm is not None and len(a.perm) == rank and not a.is_constant and not is_identity(a.perm)
    )
    return votes.most_common(1)[0][0] if votes else None


def _elementwise(node: ir.Node, inputs: Sequence[ArrivingInput], opset: int) -> NodePlan | None:
    present = [a for a in inputs if a.value is not None]
    if any(a.perm is None for a in present):
        return None
    rank = max(len(a.perm) for a in present if a.perm is not None)
    perm = _dominant_perm(present, rank)
    if perm is None:
        return None
    wanted: list[Perm | None] = []
    for a in inputs:
        if a.value is None or a.perm is None or a.is_single_element:
            wanted.append(None)
        elif len(a.perm) == rank or a.is_constant:
            wanted.append(perm)
        else:  # a computed operand of lower rank would need a reshape too: not worth it
            return None
    return NodePlan(tuple(wanted), tuple(perm for _ in node.outputs), reason="elementwise")


# --- ops with an axis: the axis is remapped -------------------------------------------------


def _stored_axis(perm: Perm, axis: int) -> int:
    """Where logical ``axis`` sits in storage."""
    return perm.index(axis % len(perm))


def _concat(node: ir.Node, inputs: Sequence[ArrivingInput], opset: int) -> NodePlan | None:
    if any(a.perm is None for a in inputs) or len({a.rank for a in inputs}) != 1:
        return None
    rank = len(inputs[0].perm or ())
    perm = _dominant_perm(inputs, rank)
    if perm is None:
        return None
    axis = node.attributes.get_int("axis", 0)
    return NodePlan(
        tuple(perm for _ in inputs),
        (perm,),
        attributes={"axis": ir.AttrInt64("axis", _stored_axis(perm, axis))},
        reason="axis remapped",
    )


def _softmax(node: ir.Node, inputs: Sequence[ArrivingInput], opset: int) -> NodePlan | None:
    perm = inputs[0].perm
    if perm is None or is_identity(perm):
        return None
    rank = len(perm)
    if opset >= 13:
        axis = node.attributes.get_int("axis", -1) % rank
        attrs = {"axis": ir.AttrInt64("axis", _stored_axis(perm, axis))}
        return NodePlan((perm,), (perm,), attributes=attrs, reason="axis remapped")
    # Before opset 13 the op flattens to [prod(dims[:axis]), prod(dims[axis:])]: the result is
    # the same when storage keeps the leading axes in place and only shuffles the trailing
    # ones, and only for Softmax/LogSoftmax (Hardmax breaks ties by position).
    axis = node.attributes.get_int("axis", 1) % rank
    if node.op_type == "Hardmax" or tuple(perm[:axis]) != identity(axis):
        return None
    return NodePlan((perm,), (perm,), reason="trailing axes permuted")


_REDUCE_AXES_AS_INPUT_SINCE: Mapping[str, int] = {
    name: 18
    for name in (
        "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax", "ReduceMean",
        "ReduceMin", "ReduceProd", "ReduceSumSquare",
    )
} | {"ReduceSum": 13}  # fmt: skip


def _drop_axes(perm: Perm, dropped: set[int]) -> Perm:
    """The perm of what remains when logical ``dropped`` axes are removed."""
    kept = sorted(set(range(len(perm))) - dropped)
    renumber = {axis: i for i, axis in enumerate(kept)}
    return tuple(renumber[axis] for axis in perm if axis not in dropped)


def _reduce(node: ir.Node, inputs: Sequence[ArrivingInput], opset: int) -> NodePlan | None:
    perm = inputs[0].perm
    if perm is None or is_identity(perm):
        return None
    rank = len(perm)
    keepdims = node.attributes.get_int("keepdims", 1)
    if opset >= _REDUCE_AXES_AS_INPUT_SINCE[node.op_type]:
        if len(inputs) < 2 or inputs[1].value is None:
            return None  # reduce all / noop_with_empty_axes: not worth a special case
        tensor = ir.convenience.get_const_tensor(inputs[1].value)
        if tensor is None:
            return None
        axes = [int(a) % rank for a in tensor.numpy().reshape(-1)]
    else:
        listed = node.attributes.get_ints("axes")
        axes = list(range(rank)) if listed is None else [int(a) % rank for a in listed]
    stored = sorted(_stored_axis(perm, a) for a in axes)
    out_perm = perm if keepdims else _drop_axes(perm, set(axes))
    if opset >= _REDUCE_AXES_AS_INPUT_SINCE[node.op_type]:
        return NodePlan(
            (perm, None),
            (out_perm,),
            new_constants={1: np.asarray(stored, dtype=np.int64)},
            reason="axes remapped",
        )
    return NodePlan(
        (perm,),
        (out_perm,),
        attributes={"axes": ir.AttrInt64s("axes", stored)},
        reason="axes remapped",
    )


def _arg_reduce(node: ir.Node, inputs: Sequence[ArrivingInput], opset: int) -> NodePlan | None:
    perm = inputs[0].perm
    if perm is None or is_identity(perm):
        return None
    axis = node.attributes.get_int("axis", 0) % len(perm)
    keepdims = node.attributes.get_int("keepdims", 1)
    out_perm = perm if keepdims else _drop_axes(perm, {axis})
    attrs = {"axis": ir.AttrInt64("axis", _stored_axis(perm, axis))}
    return NodePlan((perm,), (out_perm,), attributes=attrs, reason="axis remapped")


# --- ops that only read memory order ---------------------------------------------------------


def same_memory_order(shape: ir.Shape | None, perm: Perm) -> bool:
    """Whether storing in ``perm`` only moves unit axes, so the bytes are already in order.

    The usual case: ``[N, C, 1, 1]`` after a global pool, stored NHWC as ``[N, 1, 1, C]``.
    """
    if shape is None:
        return False
    moving = [axis for axis in perm if not (isinstance(shape[axis], int) and shape[axis] == 1)]
    return moving == sorted(moving)


def _reads_memory_order(node: ir.Node, inputs: Sequence[ArrivingInput], opset: int) -> NodePlan | None:
    """Reshape and Flatten see only the bytes, so unit-axis moves need no transpose."""
    data = inputs[0]
    if data.perm is None or is_identity(data.perm) or data.value is None:
        return None
    shape = data.shape
    if not same_memory_order(shape, data.perm) or shape is None:
        return None
    stored = permute_shape(shape, data.perm)
    assert stored is not None
    if node.op_type == "Flatten":
        axis = node.attributes.get_int("axis", 1) % len(data.perm)
        if not _same_product(shape.dims[:axis], stored.dims[:axis]):
            return None
        return NodePlan((data.perm,), (None,), reason="memory order unchanged")
    # Reshape: a 0 in the target shape copies the input's dim at that index.
    if len(inputs) < 2 or inputs[1].value is None:
        return None
    target = ir.convenience.get_const_tensor(inputs[1].value)
    if target is None:
        return None
    allowzero = node.attributes.get_int("allowzero", 0)
    for i, dim in enumerate(target.numpy().reshape(-1)):
        if dim == 0 and not allowzero and (i >= len(shape) or shape[i] != stored[i]):
            return None
    return NodePlan((data.perm, None), (None,), reason="memory order unchanged")


def _same_product(a: Sequence[int | ir.SymbolicDim], b: Sequence[int | ir.SymbolicDim]) -> bool:
    if all(isinstance(d, int) for d in (*a, *b)):
        return int(np.prod(a)) == int(np.prod(b))  # type: ignore[arg-type]
    return Counter(map(str, a)) == Counter(map(str, b))


def _reshape_groups(source: Sequence[int], target: Sequence[int]) -> list[tuple[list[int], list[int]]] | None:
    """Split a reshape into groups: consecutive source axes whose product makes consecutive target axes."""
    if 0 in source or 0 in target:
        return None
    groups: list[tuple[list[int], list[int]]] = []
    i = j = 0
    while i < len(source) or j < len(target):
        taken_in: list[int] = []
        taken_out: list[int] = []
        size_in = size_out = 1
        if i < len(source):
            taken_in.append(i)
            size_in, i = source[i], i + 1
        if j < len(target):
            taken_out.append(j)
            size_out, j = target[j], j + 1
        while size_in != size_out:
            if size_in < size_out and i < len(source):
                taken_in.append(i)
                size_in, i = size_in * source[i], i + 1
            elif size_out < size_in and j < len(target):
                taken_out.append(j)
                size_out, j = size_out * target[j], j + 1
            else:
                return None
        groups.append((taken_in, taken_out))
    return groups


def _reshape(node: ir.Node, inputs: Sequence[ArrivingInput], opset: int) -> NodePlan | None:
    """Reshape in storage order when each merged or split group of axes is stored together.

    The groups keep the order they are stored in; only a group stored out of order needs a
    transpose first.  A channel shuffle (``[N,C,H,W] -> [N,g,C/g,H,W] -> Transpose ->
    [N,C,H,W]``) so costs one transpose, the shuffle itself, instead of three.
    """
    data, out = inputs[0], node.outputs[0]
    if data.perm is None or is_identity(data.perm) or data.value is None or out.shape is None:
        return _reads_memory_order(node, inputs, opset)
    source, target = data.shape, out.shape
    if source is None or not source.is_static() or not target.is_static():
        return _reads_memory_order(node, inputs, opset)
    source_dims, target_dims = [int(d) for d in source.numpy()], [int(d) for d in target.numpy()]
    groups = _reshape_groups(source_dims, target_dims)
    if groups is None:
        return None
    position = {axis: i for i, axis in enumerate(data.perm)}
    keys: list[float] = []
    for taken_in, _ in groups:  # a group with no source axes (a new unit axis) follows its left neighbour
        keys.append(min(position[a] for a in taken_in) if taken_in else (keys[-1] if keys else -1))
    order = sorted(range(len(groups)), key=lambda g: keys[g])
    wanted = tuple(a for g in order for a in groups[g][0])
    out_perm = tuple(a for g in order for a in groups[g][1])
    stored = np.asarray([target_dims[a] for a in out_perm], dtype=np.int64)
    return NodePlan((wanted, None), (out_perm,), new_constants={1: stored}, reason="reshaped in storage order")


def _constant_ints(arriving: ArrivingInput | None) -> list[int] | None:
    if arriving is None or arriving.value is None or not arriving.is_constant:
        return None
    tensor = ir.convenience.get_const_tensor(arriving.value)
    return None if tensor is None else [int(v) for v in tensor.numpy().reshape(-1)]


def _input(inputs: Sequence[ArrivingInput], index: int) -> ArrivingInput | None:
    return inputs[index] if index < len(inputs) and inputs[index].value is not None else None


def _pad(node: ir.Node, inputs: Sequence[ArrivingInput], opset: int) -> NodePlan | None:
    """Pad: the begin and end pads follow their axes into storage order."""
    perm = inputs[0].perm
    if perm is None or is_identity(perm):
        return None
    rank = len(perm)
    if opset < 11:
        pads = node.attributes.get_ints("pads")
        if pads is None or len(pads) != 2 * rank:
            return None
        stored = [int(pads[a]) for a in perm] + [int(pads[rank + a]) for a in perm]
        attrs = {"pads": ir.AttrInt64s("pads", stored)}
        return NodePlan((perm,), (perm,), attributes=attrs, reason="pads remapped")
    pads_input = _constant_ints(_input(inputs, 1))
    if pads_input is None or len(pads_input) != 2 * rank or _input(inputs, 3) is not None:
        return None  # computed pads, or an ``axes`` input: not worth a special case
    stored = [pads_input[a] for a in perm] + [pads_input[rank + a] for a in perm]
    wanted = (perm, *(None for _ in inputs[1:]))
    return NodePlan(wanted, (perm,), new_constants={1: np.asarray(stored, dtype=np.int64)}, reason="pads remapped")


def _slice(node: ir.Node, inputs: Sequence[ArrivingInput], opset: int) -> NodePlan | None:
    """Slice: the sliced axes are renumbered; starts, ends and steps stay as they are."""
    perm = inputs[0].perm
    if perm is None or is_identity(perm):
        return None
    rank = len(perm)
    if opset < 10:
        starts = node.attributes.get_ints("starts") or ()
        listed = node.attributes.get_ints("axes")
        axes = list(range(len(starts))) if listed is None else [int(a) % rank for a in listed]
        attrs = {"axes": ir.AttrInt64s("axes", [_stored_axis(perm, a) for a in axes])}
        return NodePlan((perm,), (perm,), attributes=attrs, reason="axes remapped")
    axes_input = _constant_ints(_input(inputs, 3))
    if axes_input is None:
        return None  # absent or computed axes: the model's layout
    stored = np.asarray([_stored_axis(perm, a % rank) for a in axes_input], dtype=np.int64)
    wanted = (perm, *(None for _ in inputs[1:]))
    return NodePlan(wanted, (perm,), new_constants={3: stored}, reason="axes remapped")


def _quantize_linear(node: ir.Node, inputs: Sequence[ArrivingInput], opset: int) -> NodePlan | None:
    """QuantizeLinear and DequantizeLinear (a QDQ model's activations) work element by element:
    per tensor in any layout, per axis with the axis remapped; the scale and zero point stay."""
    perm = inputs[0].perm
    if perm is None or is_identity(perm) or node.attributes.get_int("block_size", 0) != 0:
        return None
    scale = inputs[1] if len(inputs) > 1 else None
    if scale is None or scale.perm is None or len(scale.perm) > 1:
        return None
    wanted = (perm, *(None for _ in inputs[1:]))
    if scale.is_single_element or not scale.perm:
        return NodePlan(wanted, (perm,), reason="quantized per tensor")
    attrs = {"axis": ir.AttrInt64("axis", _stored_axis(perm, node.attributes.get_int("axis", 1)))}
    return NodePlan(wanted, (perm,), attributes=attrs, reason="axis remapped")


def _split(node: ir.Node, inputs: Sequence[ArrivingInput], opset: int) -> NodePlan | None:
    perm = inputs[0].perm
    if perm is None or is_identity(perm):
        return None
    axis = node.attributes.get_int("axis", 0) % len(perm)
    attrs = {"axis": ir.AttrInt64("axis", _stored_axis(perm, axis))}
    wanted = (perm, *(None for _ in inputs[1:]))
    return NodePlan(wanted, tuple(perm for _ in node.outputs), attributes=attrs, reason="axis remapped")


def rule_for(node: ir.Node) -> Rule | None:
    """The rule that plans ``node``, or ``None`` for ops that stay in the model's layout."""
    if node.domain != "":
        return None
    op = node.op_type
    if op in _SPATIAL_RANKS:
        return _to_channels_last
    if op in ELEMENTWISE:
        return _elementwise
    if op == "Concat":
        return _concat
    if op in ("Softmax", "LogSoftmax", "Hardmax"):
        return _softmax
    if op in _REDUCE_AXES_AS_INPUT_SINCE:
        return _reduce
    if op in ("ArgMax", "ArgMin"):
        return _arg_reduce
    if op == "Reshape":
        return _reshape
    if op == "Pad":
        return _pad
    if op == "Slice":
        return _slice
    if op == "Split":
        return _split
    if op in ("QuantizeLinear", "DequantizeLinear"):
        return _quantize_linear
    if op == "Flatten":
        return _reads_memory_order
    return None


all_identity = _all_identity
