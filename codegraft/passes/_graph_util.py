"""Small graph helpers the passes share."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator

import numpy as np
import onnx_ir as ir


class FreshNames:
    """Unique names for the values a pass adds: a taken name gets a numbered suffix."""

    def __init__(self, graph: ir.Graph) -> None:
        self._taken = {v.name for v in graph.inputs if v.name} | set(graph.initializers)
        for node in ir.traversal.RecursiveGraphIterator(graph):
            self._taken |= {v.name for v in node.outputs if v.name}
        self._counter = itertools.count()

    def __call__(self, base: str) -> str:
        name = base
        while name in self._taken:
            name = f"{base}_{next(self._counter)}"
        self._taken.add(name)
        return name


def name_nodes(graph: ir.Graph) -> None:
    """Give unnamed nodes stable names, so a report can name them and a check can pick them."""
    taken = {n.name for n in graph if n.name}
    for index, node in enumerate(graph):
        if not node.name:
            name = f"{node.op_type}_{index}"
            while name in taken:
                name += "_"
            node.name = name
            taken.add(name)


def subgraphs(node: ir.Node) -> Iterator[ir.Graph]:
    """The bodies of a control-flow node (If branches, Loop and Scan bodies)."""
    for attr in node.attributes.values():
        if attr.type == ir.AttributeType.GRAPH:
            yield attr.as_graph()
        elif attr.type == ir.AttributeType.GRAPHS:
            yield from attr.as_graphs()


def drop_unused_constants(graph: ir.Graph, values: Iterable[ir.Value]) -> None:
    """Remove the constants in ``values`` that nothing reads any more (a pass replaced them)."""
    for value in values:
        if value.uses() or value.is_graph_output():
            continue
        producer = value.producer()
        if producer is not None:
            graph.remove(producer, safe=True)
        elif value.name is not None and value.name in graph.initializers:
            del graph.initializers[value.name]


def register_constant(graph: ir.Graph, name: str | None, array: np.ndarray) -> ir.Value:
    """A new initializer of ``graph`` holding ``array``, typed and shaped, named ``name``."""
    value = ir.Value(
        name=name,
        shape=ir.Shape(array.shape),
        type=ir.TensorType(ir.DataType.from_numpy(array.dtype)),
        const_value=ir.tensor(array, name=name),
    )
    graph.register_initializer(value)
    return value
