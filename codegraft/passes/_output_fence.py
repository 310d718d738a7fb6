"""Keep graph outputs out of reach of passes that merge or rename values.

NOTE: onnx-ir's IdentityEliminationPass and onnxscript's no-op rules, when an Identity or a
no-op links one graph output to another (``[r, Identity(r)]``, two no-ops of one value),
rename the surviving value to the output's name, and the graph then lists one value under
two output names (seen with onnx-ir 1.1 and onnxscript 0.7).  Instead of patching those
passes we fence the outputs: each output is produced by an Identity in a private domain the
passes do not touch, and afterwards each fence is removed if its input can take the
output's name, or kept as a plain Identity if it cannot (a graph input, or a value already
named for another output).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import onnx_ir as ir

from codegraft.core.graphinfo import subgraphs_of

_FENCE_DOMAIN = "codegraft.fence"


def is_fence(node: ir.Node) -> bool:
    """Whether ``node`` is a fence: an Identity that passes run inside a fence may look through."""
    return node.domain == _FENCE_DOMAIN


@contextlib.contextmanager
def outputs_fenced(model: ir.Model, *, flat: bool = False) -> Iterator[None]:
    """Run the body with every graph output behind a fence; output names survive it.

    Subgraphs (If branches, Loop and Scan bodies) are fenced too: a branch that returns
    ``Identity(outer)`` would otherwise have the Identity removed and the outer-scope value
    made an output of the branch as well, which onnx-ir refuses ("already an output of a
    different graph") and onnxruntime cannot load.  ``flat=True`` says the caller knows the
    model has no subgraphs (saves looking for them: a walk over every node).
    """
    graphs = (model.graph,) if flat else (model.graph, *_subgraphs(model.graph))
    fenced_graphs = [(graph, _fence(graph)) for graph in graphs]
    model.opset_imports[_FENCE_DOMAIN] = 1
    try:
        yield
    finally:
        for graph, fences in fenced_graphs:
            _remove_fences(graph, fences)
        model.opset_imports.pop(_FENCE_DOMAIN, None)


def _fence(graph: ir.Graph) -> list[tuple[ir.Node, ir.Value]]:
    fences: list[tuple[ir.Node, ir.Value]] = []
    for index, output in enumerate(list(graph.outputs)):
        if (output.is_graph_input() or output.is_initializer()) and output.graph is graph:
            continue  # passes do not rename these, and their names must not change
        name = output.name
        # the index keeps CSE from merging two fences of one value
        fence = ir.Node(_FENCE_DOMAIN, "Identity", [output], [ir.AttrInt64("output", index)])
        fenced = fence.outputs[0]
        fenced.type, fenced.shape = output.type, output.shape
        graph.append(fence)
        output.name = f"{name}__fenced"  # the fence's output takes the name
        fenced.name = name
        graph.outputs[index] = fenced
        fences.append((fence, output))
    return fences


def _subgraphs(graph: ir.Graph) -> list[ir.Graph]:
    return [sub for node in ir.traversal.RecursiveGraphIterator(graph) for sub in subgraphs_of(node)]


def _remove_fences(graph: ir.Graph, fences: list[tuple[ir.Node, ir.Value]]) -> None:
    named: set[ir.Value] = set(graph.outputs)
    positions = {value: index for index, value in enumerate(graph.outputs)}
    for fence, original in fences:
        index = positions.get(fence.outputs[0], -1)
        if index < 0 and fence.graph is graph:
            # a pass dropped the body output the fence stood for (a Loop's carried value that
            # became a read of the outer value), and its fence with it
            if not fence.outputs[0].uses():
                graph.remove(fence, safe=True)
            else:
                fence.domain = ""
                fence.attributes.pop("output", None)
            continue
        if fence.graph is not graph:
            # a pass moved the fence (constant folding inlined its If branch) or removed it:
            # where it still is, it is a plain Identity
            fence.domain = ""
            fence.attributes.pop("output", None)
            continue
        source, fenced = fence.inputs[0], fence.outputs[0]
        assert source is not None
        name = fenced.name
        producer = original.producer()
        if source.is_graph_input() and producer is not None and producer.graph is graph and original not in named:
            # the pass forwarded the output to a graph input but left the original node (e.g.
            # constant folding through an Identity): keep the original rather than add a copy
            source = original
        ours = source.name == f"{name}__fenced"  # the output's own value, maybe folded
        if (
            source.is_graph_input()
            or source in named
            or (source.is_initializer() and not ours)
            or source.graph is not graph  # an outer-scope value: a subgraph must produce its outputs itself
        ):
            # inputs and the user's initializers keep their names (renaming an initializer
            # renames the TensorProto it wraps), and a value carries one output name only
            fence.domain = ""
            fence.attributes.pop("output")
            continue
        graph.outputs[index] = source
        graph.remove(fence, safe=True)
        source.name = name
        named.add(source)
