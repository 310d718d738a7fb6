"""Planning control flow: which If/Loop nodes codegraft runs itself, and their bodies as models.

NOTE: by default a node with subgraphs runs on the host, bodies and all.  When a target could
take nodes inside an If or Loop body, the node's unit goes to :data:`CONTROL_BACKEND`
instead: the compiler then compiles each body as a model of its own (its formal inputs, then
the outer-scope values it reads, :func:`body_model`) with the same targets, and
:mod:`codegraft.runtime.control` runs the If or Loop, calling the bodies' executables.  So
nodes inside bodies are partitioned like any other, recursively.  Scan stays on the host, and
so does a Loop whose body gives the targets too little work per iteration
(:data:`LOOP_BODY_MIN_MACS`).  Where that work depends on sizes not known at compile time
(:func:`loop_body_work` is ``None``), the Loop keeps both plans and the first call's sizes
choose (:mod:`codegraft.plan.loop_choice`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import onnx
import onnx_ir as ir

from codegraft.backend import Backend
from codegraft.core.names import CONTROL_BACKEND, CONTROL_OPS
from codegraft.core.options import MIN_PARTITION_MACS
from codegraft.plan.annotate import Annotation, NodeDecline, check_node

# A Loop runs its body once per iteration from Python, each partition of it a call (tens of
# microseconds) and each crossing a copy; onnxruntime runs a Loop it has whole in C++.  Below
# this many multiply-adds per iteration on the targets, what they save cannot pay for that:
# SLANet's decoder, 0.6M on c in 6 partitions, took 400 ms over its 501 steps run by
# codegraft and 200 ms whole on the host (2-core VM).  A body that convolves a feature map
# (millions per step) is worth it.  The same bound as a light partition's between host ones.
LOOP_BODY_MIN_MACS = MIN_PARTITION_MACS


def mark_control_units(
    annotation: Annotation, unit_backends: list[str], backends: Sequence[Backend]
) -> Annotation:
    """Send If/Loop units whose bodies a target could partly take to codegraft's runtime.

    A Loop whose body gives the targets too little work per iteration (see
    :data:`LOOP_BODY_MIN_MACS`) stays on the host, whole; the returned annotation's declines
    say so for it.  One whose work is not known at these sizes goes to codegraft's runtime,
    which also keeps the whole Loop for the host (:mod:`codegraft.plan.loop_choice`).
    """
    if not backends:
        return annotation
    declines = list(annotation.declines)
    for index, unit in enumerate(annotation.units):
        if len(unit.nodes) != 1:
            continue
        node = annotation.infos[unit.nodes[0]].node
        if node.op_type not in CONTROL_OPS or node.domain not in ("", "ai.onnx"):
            continue
        inner = [n for graph in body_graphs(node).values() for n in ir.traversal.RecursiveGraphIterator(graph)]
        taken = [n for n in inner if not _has_subgraphs(n) and any(check_node(b, n).ok for b in backends)]
        if not taken:
            continue
        if node.op_type == "Loop":
            work = _body_work(inner, taken)
            if work is not None and work < LOOP_BODY_MIN_MACS:
                reason = (
                    f"Loop: its body gives the targets {work:,} multiply-adds per iteration, fewer than the "
                    f"{LOOP_BODY_MIN_MACS:,} that pay for running it step by step; it runs whole on the host"
                )
                declines[unit.nodes[0]] = tuple(NodeDecline(b.name, reason) for b in backends)
                continue
        unit_backends[index] = CONTROL_BACKEND
    return replace(annotation, declines=tuple(declines))


def loop_body_work(node: ir.Node, backends: Sequence[Backend]) -> int | None:
    """Multiply-adds per iteration that ``backends`` take from a Loop's body, or ``None`` where the
    count depends on sizes not known here and what is known stays below :data:`LOOP_BODY_MIN_MACS`.

    A free leading dimension is taken as a batch of 1, as :func:`multiply_adds` takes it and as
    deployments mostly run (chars2vec's LSTM step, ``[batch, 300] x [300, 1200]``, is 360,000);
    any other size or rank not known, in a multiplying node of the body taken or not (a target
    may decline a node for want of its sizes), leaves the work unknown.  The speech embedding's
    STFT body, shapes without rank below a computed Reshape, counted 0 and ran whole on the host,
    2x slower than on ``c``: such a body is left to the first call's sizes instead of judged small.
    """
    inner = [n for graph in body_graphs(node).values() for n in ir.traversal.RecursiveGraphIterator(graph)]
    return _body_work(inner, [n for n in inner if not _has_subgraphs(n) and any(check_node(b, n).ok for b in backends)])


def _body_work(inner: Sequence[ir.Node], taken: Sequence[ir.Node]) -> int | None:
    """:func:`loop_body_work` of a body whose nodes are ``inner`` and the targets take ``taken``."""
    work = sum(multiply_adds(n) for n in taken)
    if work < LOOP_BODY_MIN_MACS and not all(_sized_but_batch(n) for n in inner if not _has_subgraphs(n)):
        return None
    return work


def _sized_but_batch(node: ir.Node) -> bool:
    """Whether :func:`multiply_adds` knows every size of ``node`` it counts but perhaps a leading one."""
    if node.op_type not in _MULTIPLYING or node.domain not in ("", "ai.onnx"):
        return True
    values = [*node.outputs[:1]] if node.op_type in _SAMPLING else [*node.inputs[:3], *node.outputs[:1]]
    return all(
        value is None
        or (value.shape is not None and all(isinstance(d, int) and d >= 0 for d in list(value.shape)[1:]))
        for value in values
    )


def multiply_adds(node: ir.Node) -> int:
    """Multiply-adds of a MatMul, Gemm, Conv, ConvTranspose (or MatMulInteger, ConvInteger), LSTM,
    GRU or RNN from its shapes (a dimension not known counts as 1, so this errs low), the
    weighted taps of a Resize or GridSample; 0 for any other node.

    >>> import onnx_ir as ir
    >>> a = ir.Value(name="a", shape=ir.Shape([64, 256]), type=ir.TensorType(ir.DataType.FLOAT))
    >>> b = ir.Value(name="b", shape=ir.Shape([256, 128]), type=ir.TensorType(ir.DataType.FLOAT))
    >>> node = ir.Node("", "MatMul", [a, b])
    >>> node.outputs[0].shape = ir.Shape([64, 128])
    >>> multiply_adds(node)
    2097152
    """
    if node.domain not in ("", "ai.onnx"):
        return 0
    if node.op_type in _RECURRENT:
        return _recurrent_multiply_adds(node)
    if node.op_type in _SAMPLING:
        return _sampling_multiply_adds(node)
    if node.op_type not in _PRODUCTS:
        return 0
    first, second = (node.inputs[i] if len(node.inputs) > i else None for i in (0, 1))
    if first is None or second is None or first.shape is None or second.shape is None or not node.outputs:
        return 0
    output = node.outputs[0].shape
    if node.op_type in ("MatMul", "MatMulInteger"):
        reduced = _dim(first.shape[-1]) if len(first.shape) else 1
        return _elements(output) * reduced
    if node.op_type == "Gemm":
        transposed = node.attributes.get_int("transA", 0)
        reduced = _dim(first.shape[0 if transposed else -1]) if len(first.shape) == 2 else 1
        return _elements(output) * reduced
    # Conv: each output value sums (input channels / group) x kernel taps; ConvTranspose: each
    # input value spreads over (output channels / group) x kernel taps
    taps = math.prod(_dim(d) for d in second.shape[2:]) if len(second.shape) > 2 else 1
    if node.op_type in ("Conv", "ConvInteger"):
        return _elements(output) * (_dim(second.shape[1]) if len(second.shape) > 1 else 1) * taps
    return _elements(first.shape) * (_dim(second.shape[1]) if len(second.shape) > 1 else 1) * taps


_RECURRENT = frozenset({"LSTM", "GRU", "RNN"})
# (the integer forms of dynamically quantized models: ddddocr's int8 CNN counted as no work, and
# the light-partition rule sent it all to the host)
_PRODUCTS = frozenset({"MatMul", "Gemm", "Conv", "ConvTranspose", "MatMulInteger", "ConvInteger"})
_SAMPLING = frozenset({"Resize", "GridSample"})
_MULTIPLYING = frozenset({*_PRODUCTS, *_RECURRENT, *_SAMPLING})


def known_multiply_adds(node: ir.Node) -> int | None:
    """:func:`multiply_adds`, or ``None`` where a size it depends on is not known (where that
    function would count it as 1): for a decision that must not err low.

    >>> import onnx_ir as ir
    >>> a = ir.Value(name="a", shape=ir.Shape(["n", 256]), type=ir.TensorType(ir.DataType.FLOAT))
    >>> b = ir.Value(name="b", shape=ir.Shape([256, 128]), type=ir.TensorType(ir.DataType.FLOAT))
    >>> node = ir.Node("", "MatMul", [a, b])
    >>> node.outputs[0].shape = ir.Shape(["n", 128])
    >>> known_multiply_adds(node) is None, known_multiply_adds(ir.Node("", "Relu", [a]))
    (True, 0)
    """
    if node.op_type not in _MULTIPLYING or node.domain not in ("", "ai.onnx"):
        return 0
    # (a sampling op's count needs only its output's shape; its scales, roi and grid may be any)
    values = [*node.outputs[:1]] if node.op_type in _SAMPLING else [*node.inputs[:3], *node.outputs[:1]]
    for value in values:
        if value is not None and (value.shape is None or not all(isinstance(d, int) and d >= 0 for d in value.shape)):
            return None
    return multiply_adds(node)


def _sampling_multiply_adds(node: ir.Node) -> int:
    """Each output value weighs 1 (nearest), 2 (linear) or 4 (cubic) source values along each
    axis it interpolates (taken as all but batch and channels).  Counted because an image's
    Resize or GridSample is real work with no product in it (UVDoc's GridSample over a page)."""
    if not node.outputs or node.outputs[0].shape is None:
        return 0
    output = node.outputs[0].shape
    mode = node.attributes.get_string("mode", "nearest" if node.op_type == "Resize" else "linear")
    per_axis = 4 if "cubic" in mode else 2 if "linear" in mode else 1
    return _elements(output) * per_axis ** max(len(output) - 2, 1)


def _recurrent_multiply_adds(node: ir.Node) -> int:
    """Every step of every direction multiplies its input by W ([directions, gates x hidden,
    input]) and its state by R ([directions, gates x hidden, hidden])."""
    x, w, r = (node.inputs[i] if len(node.inputs) > i else None for i in range(3))
    if x is None or w is None or r is None or x.shape is None or w.shape is None or r.shape is None:
        return 0
    if len(x.shape) != 3 or len(w.shape) != 3 or len(r.shape) != 3:
        return 0
    steps_times_batch = _dim(x.shape[0]) * _dim(x.shape[1])
    return steps_times_batch * _dim(w.shape[0]) * _dim(w.shape[1]) * (_dim(w.shape[2]) + _dim(r.shape[2]))


def _dim(d: object) -> int:
    return d if isinstance(d, int) and d > 0 else 1


def _elements(shape: ir.Shape | None) -> int:
    return math.prod(_dim(d) for d in shape) if shape is not None else 1


def _has_subgraphs(node: ir.Node) -> bool:
    return any(a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS) for a in node.attributes.values())


def body_graphs(node: ir.Node) -> dict[str, ir.Graph]:
    """The node's subgraph attributes by name."""
    return {
        name: attr.as_graph() for name, attr in node.attributes.items() if attr.type == ir.AttributeType.GRAPH
    }


def body_model(body: ir.Graph, parent: ir.Model) -> tuple[onnx.ModelProto, tuple[str, ...], tuple[str, ...]]:
    """A standalone model of ``body``: formal inputs, then outer reads (initializers folded in)."""
    graph = ir.serde.serialize_graph(body)
    outer: list[str] = []
    for value in outer_reads(body):
        constant = value.const_value if value.is_initializer() else ir.convenience.get_const_tensor(value)
        if constant is not None:  # an initializer, or a Constant node's output (Paddle's weights)
            tensor = ir.serde.serialize_tensor(constant)
            tensor.name = value.name or ""
            graph.initializer.append(tensor)
        else:
            graph.input.append(ir.serde.serialize_value(value))
            outer.append(value.name or "")
    _distinct_output_names(graph)
    opsets = [onnx.helper.make_opsetid(d, v) for d, v in parent.graph.opset_imports.items()]
    model = onnx.helper.make_model(graph, opset_imports=opsets, ir_version=parent.ir_version)
    return model, tuple(v.name or "" for v in body.inputs), tuple(outer)


def _distinct_output_names(graph: onnx.GraphProto) -> None:
    """Body outputs are positional, and passes may leave one value in two output slots; a
    standalone model needs distinct output names, so repeats get an Identity of their own."""
    seen: set[str] = set()
    for index, output in enumerate(graph.output):
        if output.name in seen:
            alias = f"{output.name}__output{index}"
            graph.node.append(onnx.helper.make_node("Identity", [output.name], [alias]))
            output.name = alias
        seen.add(output.name)


def outer_reads(body: ir.Graph) -> list[ir.Value]:
    """Values read anywhere inside ``body`` (nested bodies included) but defined outside it."""
    defined: set[ir.Value] = set()
    reads: list[ir.Value] = []
    graphs = [body]
    for node in ir.traversal.RecursiveGraphIterator(body):
        for attr in node.attributes.values():
            if attr.type == ir.AttributeType.GRAPH:
                graphs.append(attr.as_graph())
            elif attr.type == ir.AttributeType.GRAPHS:
                graphs.extend(attr.as_graphs())
    for graph in graphs:
        defined.update(graph.inputs)
        defined.update(graph.initializers.values())
    for node in ir.traversal.RecursiveGraphIterator(body):
        defined.update(node.outputs)
    for node in ir.traversal.RecursiveGraphIterator(body):
        reads.extend(v for v in node.inputs if v is not None and v not in defined)
    return list(dict.fromkeys(reads))


__all__ = [
    "LOOP_BODY_MIN_MACS",
    "body_graphs",
    "body_model",
    "known_multiply_adds",
    "loop_body_work",
    "mark_control_units",
    "multiply_adds",
    "outer_reads",
]
