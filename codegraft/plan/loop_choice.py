"""A Loop whose body's work is unknown at compile time: both plans kept, the first call's sizes choose.

NOTE: the Loop rule (:data:`~codegraft.plan.control.LOOP_BODY_MIN_MACS`) runs a Loop step by step
through its compiled body only where the targets get enough multiply-adds per iteration.  With
the model's dimensions left free, a body's sizes may be unknowable before a call: in Google's
speech embedding (tf2onnx) the frame count comes from Range over arithmetic on the clip's length
and a Reshape to a computed shape leaves no rank, so its STFT counted 0 multiply-adds and the Loop
ran whole on the host, where compiling for the sizes fed put the body on ``c``, twice as fast.

Such a Loop (:func:`~codegraft.plan.control.loop_body_work` is ``None``) goes to codegraft's
runtime with its body compiled as usual, and keeps the other plan too: the node as a model of
its own (:func:`node_model`), which the host runs whole.  At the first call with some input
shapes, :func:`body_work_at` counts again on that model fixed to them, after the common passes
(as ``input_shapes`` would fold the shape arithmetic), and the same rule picks the plan for those
shapes (:mod:`codegraft.runtime.loop_choice` keeps one choice per distinct shapes).  The same
way, ``c`` partitions are compiled per input shape at run time
(:class:`~codegraft.lower.lowering.ShapeSpecialisingRunnable`).
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx
import onnx_ir as ir

from codegraft.backend import Backend
from codegraft.frontend.fixed_inputs import fix_input_shapes
from codegraft.frontend.model import import_model
from codegraft.passes.pipeline import PassOptions, run_common_passes
from codegraft.plan.control import loop_body_work, outer_reads


def node_model(node: ir.Node, parent: ir.Model) -> tuple[onnx.ModelProto, tuple[str, ...]]:
    """``node`` (with its bodies) as a model of its own, and the names of its graph inputs.

    The inputs are what it reads at run time: its own inputs, then the outer-scope values its
    bodies read; constants among them (initializers, Constant nodes' outputs) are folded in as
    initializers, since the shape arithmetic that sizes a body often starts from them.
    """
    reads = [v for v in node.inputs if v is not None]
    for graph in _graphs(node):
        reads.extend(outer_reads(graph))
    inputs, initializers = [], []
    for value in dict.fromkeys(reads):
        constant = value.const_value if value.is_initializer() else ir.convenience.get_const_tensor(value)
        if constant is not None:
            tensor = ir.serde.serialize_tensor(constant)
            tensor.name = value.name or ""
            initializers.append(tensor)
        else:
            inputs.append(ir.serde.serialize_value(value))
    graph = onnx.helper.make_graph(
        [ir.serde.serialize_node(node)],
        node.name or node.op_type,
        inputs,
        [ir.serde.serialize_value(v) for v in node.outputs],
        initializer=initializers,
    )
    opsets = [onnx.helper.make_opsetid(d, v) for d, v in parent.graph.opset_imports.items()]
    model = onnx.helper.make_model(graph, opset_imports=opsets, ir_version=parent.ir_version, producer_name="codegraft")
    model.functions.extend(ir.serde.serialize_function(f) for f in parent.functions.values())
    return model, tuple(value.name for value in inputs)


def body_work_at(model: bytes, shapes: Sequence[tuple[int, ...]], backends: Sequence[Backend]) -> int | None:
    """:func:`~codegraft.plan.control.loop_body_work` of the Loop in ``model`` (a
    :func:`node_model`) when its inputs have ``shapes``; ``None`` if still unknown (a size that
    depends on values, not shapes) or if the model has no Loop left after the passes.

    The body's carried inputs take their initial values' shapes where the body leaves a size
    free (shape inference keeps a body's declared input shapes), then the common passes fold
    what those sizes fix, as compiling with ``input_shapes`` does.
    """
    ir_model = import_model(model)
    fix_input_shapes(ir_model, [(v.name or "", shape) for v, shape in zip(ir_model.graph.inputs, shapes, strict=True)])
    for node in ir_model.graph:
        if node.op_type == "Loop" and node.domain in ("", "ai.onnx"):
            _carry_initial_shapes(node)
    run_common_passes(ir_model, PassOptions())
    loop = next((n for n in ir_model.graph if n.op_type == "Loop" and n.domain in ("", "ai.onnx")), None)
    return None if loop is None else loop_body_work(loop, backends)


def _carry_initial_shapes(loop: ir.Node) -> None:
    """Fill the free sizes of the body's carried inputs (after its iteration number and
    condition) from the Loop's initial values, where the ranks agree or the body gives none."""
    body = loop.attributes["body"].as_graph()
    for formal, initial in zip(body.inputs[2:], loop.inputs[2:], strict=False):
        if initial is None or initial.shape is None:
            continue
        if formal.shape is None:
            formal.shape = ir.Shape(list(initial.shape))
        elif len(formal.shape) == len(initial.shape):
            sizes = zip(formal.shape, initial.shape, strict=True)
            formal.shape = ir.Shape([declared if isinstance(declared, int) else size for declared, size in sizes])


def _graphs(node: ir.Node) -> list[ir.Graph]:
    graphs = []
    for attr in node.attributes.values():
        if attr.type == ir.AttributeType.GRAPH:
            graphs.append(attr.as_graph())
        elif attr.type == ir.AttributeType.GRAPHS:
            graphs.extend(attr.as_graphs())
    return graphs


__all__ = ["body_work_at", "node_model"]
