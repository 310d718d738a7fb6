"""Quantized units: ``DequantizeLinear -> op -> QuantizeLinear`` groups never to be split.

NOTE: in the QDQ format an op "runs quantized" only as a whole unit: the DequantizeLinear
nodes feeding it, the op, and the QuantizeLinear nodes reading its result.  A backend that
takes the op but not its Q/DQ would compute in float what the model meant in int8, so the
partitioner treats each unit like a composite.  Units sharing a node (a DequantizeLinear
feeding two ops) are merged, since either split would cut one of them - unless the merged
group would not be convex: where a path leaves it and comes back (a ResNet block's input
dequantized once for its first convolution and for the residual Add after the block's last),
placing it whole would make the partition graph cyclic, so each op keeps a unit of its own
with only the DequantizeLinear nodes it alone reads, and a shared one is a node of its own.
"""

from __future__ import annotations

import onnx_ir as ir

_QUANT_DOMAINS = frozenset({"", "ai.onnx", "com.microsoft"})


def _is(node: ir.Node | None, op_type: str) -> bool:
    return node is not None and node.op_type == op_type and node.domain in _QUANT_DOMAINS


def quantized_units(graph: ir.Graph) -> list[tuple[ir.Node, ...]]:
    """Every ``DequantizeLinear* -> op -> QuantizeLinear+`` unit of ``graph``, in graph order.

    The op must read at least one DequantizeLinear output, and each of its outputs must be
    read only by QuantizeLinear nodes (and not be a graph output).  Each unit lists its
    nodes in graph order.

    Example::

        for unit in quantized_units(model.graph):
            print([n.op_type for n in unit])   # ['DequantizeLinear', 'DequantizeLinear', 'Conv', 'QuantizeLinear']
    """
    order = {node: i for i, node in enumerate(graph)}
    parent: dict[ir.Node, ir.Node] = {}

    def find(node: ir.Node) -> ir.Node:
        while parent[node] is not node:
            parent[node] = parent[parent[node]]
            node = parent[node]
        return node

    for node in graph:
        if _is(node, "QuantizeLinear") or _is(node, "DequantizeLinear"):
            continue
        dqs = _dequantized_inputs(node)
        if not dqs:
            continue
        uses = [u.node for v in node.outputs for u in v.uses()]
        if not uses or any(v.is_graph_output() for v in node.outputs):
            continue
        if not all(_is(u, "QuantizeLinear") for u in uses):
            continue
        unit = [node, *dqs, *uses]
        for member in unit:
            parent.setdefault(member, member)
        root = find(node)
        for member in unit:
            other = find(member)
            if other is not root:
                parent[other] = root
    groups: dict[ir.Node, list[ir.Node]] = {}
    for node in parent:
        groups.setdefault(find(node), []).append(node)
    units: list[tuple[ir.Node, ...]] = []
    for group in groups.values():
        members = set(group)
        if _convex(members, order):
            units.append(tuple(sorted(members, key=order.__getitem__)))
            continue
        for op in (n for n in members if not _is(n, "QuantizeLinear") and not _is(n, "DequantizeLinear")):
            own = [d for d in _dequantized_inputs(op) if all(u.node is op for v in d.outputs for u in v.uses())]
            quantizers = [u.node for v in op.outputs for u in v.uses()]
            units.append(tuple(sorted({op, *own, *quantizers}, key=order.__getitem__)))
    return sorted(units, key=lambda u: order[u[0]])


def _dequantized_inputs(node: ir.Node) -> list[ir.Node]:
    producers = [v.producer() for v in node.inputs if v is not None]
    return [p for p in producers if p is not None and _is(p, "DequantizeLinear")]


def _convex(members: set[ir.Node], order: dict[ir.Node, int]) -> bool:
    """Whether no path leaves ``members`` and comes back (walked in graph order: a path back
    cannot pass a node after the group's last)."""
    last = max(order[n] for n in members)
    pending = [u.node for n in members for v in n.outputs for u in v.uses() if u.node not in members]
    seen: set[ir.Node] = set()
    while pending:
        node = pending.pop()
        if node in seen or order.get(node, last + 1) > last:
            continue  # (a user inside a subgraph has no order here: it cannot lead back)
        seen.add(node)
        for value in node.outputs:
            for use in value.uses():
                if use.node in members:
                    return False
                pending.append(use.node)
    return True


__all__ = ["quantized_units"]
