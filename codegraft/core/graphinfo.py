"""Dataflow facts about a graph's top-level nodes that annotation and extraction share.

NOTE: a node with subgraphs (If, Loop, Scan) may read values of the enclosing graph from
inside its bodies without naming them as inputs.  Those reads are dependencies all the same,
so :func:`values_read` includes them; forgetting them would let the partitioner schedule a
body before the value it reads exists.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx_ir as ir

from codegraft.core.attributes import attributes_of

# Ops whose output differs call to call however constant their inputs: never folded or
# treated as computed from constants.
RANDOM_OPS = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
                        "Bernoulli"})  # fmt: skip


@dataclass(frozen=True)
class NodeInfo:
    """A top-level node with every value it reads (implicit body reads included)."""

    node: ir.Node
    reads: tuple[ir.Value, ...]
    has_subgraphs: bool


def values_read(node: ir.Node) -> tuple[tuple[ir.Value, ...], bool]:
    """Values ``node`` reads, including outer-scope reads from its subgraphs."""
    reads: list[ir.Value] = [v for v in node.inputs if v is not None]
    subgraphs = subgraphs_of(node) if attributes_of(node) else []
    if subgraphs:
        own_graph = node.graph
        for subgraph in subgraphs:
            for inner_node in ir.traversal.RecursiveGraphIterator(subgraph):
                for value in inner_node.inputs:
                    if value is not None and _defined_in(value, own_graph):
                        reads.append(value)
    return tuple(dict.fromkeys(reads)), bool(subgraphs)


def subgraphs_of(node: ir.Node) -> list[ir.Graph]:
    """The graphs held by the node's attributes (If branches, Loop and Scan bodies)."""
    graphs: list[ir.Graph] = []
    for attr in attributes_of(node).values():
        if attr.type == ir.AttributeType.GRAPH:
            graphs.append(attr.as_graph())
        elif attr.type == ir.AttributeType.GRAPHS:
            graphs.extend(attr.as_graphs())
    return graphs


_GRAPH_ATTRIBUTES = (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)


def is_flat(model: ir.Model) -> bool:
    """No subgraphs (If, Loop, Scan bodies) and no local functions: every node is in ``model.graph``.

    Example::

        if is_flat(model):
            nodes = list(model.graph)  # all of them, no recursion needed
    """
    if model.functions:
        return False
    return not any(attr.type in _GRAPH_ATTRIBUTES for node in model.graph for attr in attributes_of(node).values())


def _defined_in(value: ir.Value, graph: ir.Graph | None) -> bool:
    """Whether ``value`` belongs to ``graph`` (a node output, input or initializer of it)."""
    producer = value.producer()
    if producer is not None:
        return producer.graph is graph
    return value.graph is graph


def node_infos(graph: ir.Graph) -> list[NodeInfo]:
    """Every top-level node of ``graph`` in order, with what it reads."""
    infos = []
    for node in graph:
        reads, has_subgraphs = values_read(node)
        infos.append(NodeInfo(node, reads, has_subgraphs))
    return infos
