"""Planning control flow: which If/Loop nodes codegraft runs itself, and their bodies as models.

NOTE: by default a node with subgraphs runs on the host, bodies and all.  When a target could
take nodes inside an If or Loop body, the node's unit goes to :data:`CONTROL_BACKEND`
instead: the compiler then compiles each body as a model of its own (its formal inputs, then
the outer-scope values it reads, :func:`body_model`) with the same targets, and
:mod:`codegraft.runtime.control` runs the If or Loop, calling the bodies' executables.  So
nodes inside bodies are partitioned like any other, recursively.  Scan stays on the host.
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx
import onnx_ir as ir

from codegraft.backend import Backend
from codegraft.core.names import CONTROL_BACKEND, CONTROL_OPS
from codegraft.plan.annotate import Annotation, check_node


def mark_control_units(annotation: Annotation, unit_backends: list[str], backends: Sequence[Backend]) -> None:
    """Send If/Loop units whose bodies a target could partly take to codegraft's runtime."""
    if not backends:
        return
    for index, unit in enumerate(annotation.units):
        if len(unit.nodes) != 1:
            continue
        node = annotation.infos[unit.nodes[0]].node
        if node.op_type not in CONTROL_OPS or node.domain not in ("", "ai.onnx"):
            continue
        inner = [n for graph in body_graphs(node).values() for n in ir.traversal.RecursiveGraphIterator(graph)]
        if any(check_node(b, n).ok for n in inner for b in backends if not _has_subgraphs(n)):
            unit_backends[index] = CONTROL_BACKEND


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
        if value.is_initializer() and value.const_value is not None:
            tensor = ir.serde.serialize_tensor(value.const_value)
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


__all__ = ["body_graphs", "body_model", "mark_control_units", "outer_reads"]
