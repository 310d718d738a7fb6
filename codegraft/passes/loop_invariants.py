"""Loop-invariant code motion: what a Loop's body computes the same in every iteration is
computed once, before the Loop.

NOTE: two things in a body do not change from one iteration to the next:

- A carried value the body returns as it came in (directly, or through copies: Identity,
  ``x + 0``, ``Squeeze(Unsqueeze(x))``) holds its initial value throughout: loop-invariant,
  only spelled as state.  Paddle's exporter carries every weight the body reads this way
  (SLANet's table decoder: 18 of its 23 carried values).  Read as formal inputs they are
  run-time tensors to whatever compiles the body; read from the enclosing scope instead, the
  body's compiler sees the initializers they are (:func:`codegraft.plan.control.body_model`
  folds outer initializers in), so a backend can pack them once.  The Loop's output for such
  a value is its initial value, and its readers read that instead.
- A node whose inputs all come from outside the body (or from Constant nodes in it)
  computes the same tensor each time: it moves in front of the Loop, with copies of the
  Constants it reads.  SLANet's attention projects the encoder's features by a weight in
  each of its 501 steps; moved, that MatMul runs once.

This is LLVM's LICM and TVM's ``HoistIfThenElse`` at the granularity ONNX gives.  Only
deterministic default-domain nodes without subgraphs move, and never one that produces a
body output (a subgraph must produce its outputs itself).  Inner Loops go first, so what
leaves an inner body can leave the outer one too.

Example::

    hoisted = hoist_loop_invariants(model)    # in place
    hoisted.carried, hoisted.nodes            # carried values made reads, nodes moved out
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from codegraft.passes._output_fence import is_fence

__all__ = ["Hoisted", "hoist_loop_invariants"]

_ONNX = ("", "ai.onnx")
# Nodes whose output may differ between two runs on the same inputs.
_NOT_PURE = frozenset(
    {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial", "Bernoulli", "Dropout"}
)


@dataclass(frozen=True)
class Hoisted:
    """What :func:`hoist_loop_invariants` did: carried values made reads, nodes moved out."""

    carried: int = 0
    nodes: int = 0

    def __bool__(self) -> bool:
        return bool(self.carried or self.nodes)


def hoist_loop_invariants(model: ir.Model) -> Hoisted:
    """Move what every Loop's body (nested ones included) computes the same in each iteration
    out of it; see the module note."""
    loops = [node for node in ir.traversal.RecursiveGraphIterator(model.graph) if _is_loop(node)]
    if not loops:
        return Hoisted()
    names = Counter(v.name for n in ir.traversal.RecursiveGraphIterator(model.graph) for v in n.outputs if v.name)
    carried = nodes = 0
    for loop in reversed(loops):  # inner Loops first
        kept, count = _hoist_carried(loop)
        carried += count
        if kept is not None:
            nodes += _hoist_nodes(kept, names)
    return Hoisted(carried, nodes)


def _is_loop(node: ir.Node) -> bool:
    body = node.attributes.get("body")
    return (
        node.op_type == "Loop"
        and node.domain in _ONNX
        and node.graph is not None
        and body is not None
        and body.type == ir.AttributeType.GRAPH
    )


def _hoist_carried(loop: ir.Node) -> tuple[ir.Node | None, int]:
    """The carried values the body passes through become reads of their initial values;
    returns the Loop (a new node when some were; ``None`` when nothing it computed is left,
    so it went) and how many."""
    graph = loop.graph
    assert graph is not None
    body = loop.attributes["body"].as_graph()
    carried = len(loop.inputs) - 2
    if carried <= 0 or len(body.inputs) != carried + 2 or len(body.outputs) < carried + 1:
        return loop, 0
    enclosing_outputs = set(graph.outputs) if isinstance(graph, ir.Graph) else set()
    invariant = [
        k
        for k in range(carried)
        if loop.inputs[2 + k] is not None
        and _passed_through(body.outputs[1 + k]) is body.inputs[2 + k]
        and loop.outputs[k] not in enclosing_outputs
    ]
    scans = len(loop.outputs) - carried
    if len(invariant) == carried and scans and loop.inputs[1] is None:
        # [M, ""] alone would lose its omitted cond to dead-input trimming, and a Loop needs
        # both; an explicit true cond would make the body's cond output count.  One stays.
        invariant = invariant[1:]
    if not invariant:
        return loop, 0
    for k in reversed(invariant):  # positions shift as entries go
        body.outputs.pop(1 + k)
    for k in reversed(invariant):
        initial = loop.inputs[2 + k]
        assert initial is not None
        body.inputs.pop(2 + k).replace_all_uses_with(initial)
        loop.outputs[k].replace_all_uses_with(initial)
    _remove_dead_copies(body)
    return _rebuild_without(loop, set(invariant)), len(invariant)


def _remove_dead_copies(body: ir.Graph) -> None:
    """The copy chains (``Squeeze(Add(Unsqueeze(w)))``) that produced the dropped outputs,
    now read by nothing, go; so they are not moved out of the Loop for nothing."""
    outputs = set(body.outputs)
    for node in reversed(list(body)):
        dead = not any(output.uses() or output in outputs for output in node.outputs)
        if dead and (_movable(node) or is_fence(node)):
            body.remove(node, safe=True)


def _hoist_nodes(loop: ir.Node, names: Counter[str]) -> int:
    """Move the body's nodes whose inputs all come from outside it (or from its constants:
    Constant nodes and initializers, copied out with them) in front of the Loop; returns how
    many moved."""
    graph = loop.graph
    assert graph is not None
    body = loop.attributes["body"].as_graph()
    inside: set[ir.Value] = {*body.inputs, *body.initializers.values()}
    for node in ir.traversal.RecursiveGraphIterator(body):
        inside.update(node.outputs)
    body_outputs = set(body.outputs)
    constants: dict[ir.Value, ir.TensorProtocol] = {
        value: tensor
        for value in (*body.initializers.values(), *(n.outputs[0] for n in body if n.op_type == "Constant"))
        if (tensor := ir.convenience.get_const_tensor(value)) is not None
    }
    copies: dict[ir.Value, ir.Value] = {}
    moved = 0
    for node in list(body):
        if not _movable(node) or any(output in body_outputs for output in node.outputs):
            continue
        reads = [value for value in node.inputs if value is not None]
        if all(value in inside for value in reads) or any(v in inside and v not in constants for v in reads):
            continue  # nothing from outside (folding's business), or something computed inside
        for index, value in enumerate(node.inputs):
            if value is not None and value in constants:
                if value not in copies:
                    copies[value] = _copy_constant(value, constants[value], loop)
                node.replace_input_with(index, copies[value])
        body.remove(node)
        graph.insert_before(loop, node)
        for output in node.outputs:
            _unique_name(output, names)
        inside.difference_update(node.outputs)
        moved += 1
    return moved


def _unique_name(value: ir.Value, names: Counter[str]) -> None:
    """Two sibling bodies may each name a value ``proj``; moved into one scope, one of them
    takes another name (SSA holds across the whole model)."""
    name = value.name
    if not name or names[name] <= 1:
        return
    names[name] -= 1
    suffix = 1
    while names[f"{name}__hoisted{suffix}"]:
        suffix += 1
    value.name = f"{name}__hoisted{suffix}"
    names[value.name] += 1


def _movable(node: ir.Node) -> bool:
    return (
        node.domain in _ONNX
        and node.op_type not in _NOT_PURE
        and node.op_type != "Constant"
        and not any(a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS) for a in node.attributes.values())
    )


def _copy_constant(original: ir.Value, tensor: ir.TensorProtocol, loop: ir.Node) -> ir.Value:
    """A Constant node in front of ``loop`` holding what the body's ``original`` holds."""
    copy = ir.Node("", "Constant", [], [ir.AttrTensor("value", tensor)])
    value = copy.outputs[0]  # named by the graph: a second Loop may copy a constant of this name
    value.type, value.shape = original.type, original.shape
    assert loop.graph is not None
    loop.graph.insert_before(loop, copy)
    return value


def _passed_through(value: ir.Value) -> ir.Value:
    """What ``value`` is an unchanged copy of: follows Identity, ``x + 0``, ``x - 0``,
    ``x * 1``, ``x / 1`` (a one-element constant of no higher rank than ``x``) and
    ``Squeeze(Unsqueeze(x, axes), axes)``, the chains exporters write for "assign" (Paddle:
    ``Squeeze(Add(Unsqueeze(w, [0]), [0.0]), [0])``)."""
    while (source := _copied_from(value)) is not None:
        value = source
    return value


def _copied_from(value: ir.Value) -> ir.Value | None:
    node = value.producer()
    if node is None or not node.inputs or node.inputs[0] is None or not (node.domain in _ONNX or is_fence(node)):
        return None
    first = node.inputs[0]
    if node.op_type == "Identity" or is_fence(node):  # the pipeline fences body outputs
        return first
    if node.op_type in _NEUTRAL and len(node.inputs) == 2 and node.inputs[1] is not None:
        if _neutral_operand(node.inputs[1], first, _NEUTRAL[node.op_type]):
            return first
        if node.op_type in ("Add", "Mul") and _neutral_operand(first, node.inputs[1], _NEUTRAL[node.op_type]):
            return node.inputs[1]
        return None
    if node.op_type == "Squeeze" and len(node.inputs) == 2:
        inner = _passed_through(first).producer()  # Paddle adds its 0 between the two
        if inner is None or inner.op_type != "Unsqueeze" or inner.domain not in ("", "ai.onnx"):
            return None
        if len(inner.inputs) != 2 or inner.inputs[0] is None or node.inputs[1] is None or inner.inputs[1] is None:
            return None
        axes, unsqueezed = _constant(node.inputs[1]), _constant(inner.inputs[1])
        if axes is not None and unsqueezed is not None and sorted(axes.ravel().tolist()) == sorted(
            unsqueezed.ravel().tolist()
        ):
            return inner.inputs[0]
    return None


_NEUTRAL = {"Add": 0, "Sub": 0, "Mul": 1, "Div": 1}


def _neutral_operand(operand: ir.Value, other: ir.Value, neutral: int) -> bool:
    """``operand`` is a one-element constant equal to ``neutral`` whose broadcast leaves the
    shape of ``other`` as it is (its rank is no higher).  (ONNX gives both one dtype.)"""
    array = _constant(operand)
    if array is None or array.size != 1 or array.ravel()[0] != neutral:
        return False
    return array.ndim <= _known_rank(other)


def _known_rank(value: ir.Value) -> int:
    """``value``'s rank, or a lower bound (an Unsqueeze's output has at least 1), or -1."""
    if value.shape is not None:
        return len(value.shape)
    producer = value.producer()
    return 1 if producer is not None and producer.op_type == "Unsqueeze" else -1


def _constant(value: ir.Value) -> np.ndarray | None:
    tensor = ir.convenience.get_const_tensor(value)
    return None if tensor is None else tensor.numpy()


def _rebuild_without(loop: ir.Node, dropped: set[int]) -> ir.Node | None:
    """Replace ``loop`` by a Loop without the carried values at ``dropped`` (their outputs
    have no readers left).  onnx-ir fixes a node's outputs at creation, hence a new node.  A
    Loop left with no output computes nothing anyone reads (ONNX ops have no side effects):
    it goes, and ``None`` is returned."""
    graph = loop.graph
    assert graph is not None
    carried = len(loop.inputs) - 2
    inputs = [*loop.inputs[:2], *(v for k, v in enumerate(loop.inputs[2:]) if k not in dropped)]
    kept_outputs = [v for k, v in enumerate(loop.outputs) if k >= carried or k not in dropped]
    if not kept_outputs:
        loop.resize_inputs(0)
        graph.remove(loop, safe=True)
        return None
    attributes = list(loop.attributes.values())
    replacement = ir.Node(
        loop.domain,
        "Loop",
        inputs,
        attributes,
        num_outputs=len(kept_outputs),
        version=loop.version,
        name=loop.name,
        doc_string=loop.doc_string,
    )
    graph.insert_before(loop, replacement)
    for old, new in zip(kept_outputs, replacement.outputs, strict=True):
        name, old.name = old.name, None
        new.name, new.type, new.shape = name, old.type, old.shape
        old.replace_all_uses_with(new, replace_graph_outputs=True)
    loop.resize_inputs(0)
    graph.remove(loop, safe=True)
    return replacement
