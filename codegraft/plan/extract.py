"""Cutting partitions out of the annotated graph as standalone ONNX models.

NOTE on constants: every initializer is stored once.  One used by a single partition lives
inside that partition.  One used by several is either tiny (a shape, a scalar: copied, since a
backend compiles better with it known) or becomes a *shared constant* that the executable
stores once and feeds to each partition as an input.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import onnx
import onnx_ir as ir

from codegraft.backend import Composite
from codegraft.core.gcpause import without_gc
from codegraft.plan.annotate import Annotation
from codegraft.plan.partition import Group

# Initializers up to this many elements are copied into each partition that reads them.
TINY_CONSTANT_ELEMENTS = 64


@dataclass(frozen=True)
class PartitionPlan:
    """One partition, before compilation: what it runs, reads and produces."""

    name: str
    backend: str
    node_indices: tuple[int, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    initializers: tuple[str, ...]
    composites: tuple[Composite, ...]


@dataclass(frozen=True)
class Plan:
    """All partitions in execution order, plus the constants shared between them."""

    partitions: tuple[PartitionPlan, ...]
    shared_constants: tuple[str, ...]


@without_gc
def plan_partitions(model: ir.Model, annotation: Annotation, groups: Sequence[Group]) -> Plan:
    """Work out each partition's inputs, outputs and constants."""
    graph = model.graph
    infos = annotation.infos
    group_nodes = [
        tuple(sorted(i for unit in group.units for i in annotation.units[unit].nodes)) for group in groups
    ]
    partition_of_node = [-1] * len(infos)
    for p, nodes in enumerate(group_nodes):
        for i in nodes:
            partition_of_node[i] = p

    readers: dict[ir.Value, set[int]] = {}
    for i, info in enumerate(infos):
        for value in info.reads:
            readers.setdefault(value, set()).add(partition_of_node[i])
    graph_outputs = set(graph.outputs)
    initializers = {v for v in graph.initializers.values()}

    shared: list[str] = []
    for value in initializers:
        parts = readers.get(value, set())
        const = value.const_value
        if len(parts) > 1 and const is not None and const.size > TINY_CONSTANT_ELEMENTS:
            shared.append(value.name or "")
    shared_set = set(shared)

    plans: list[PartitionPlan] = []

    def owned(value: ir.Value) -> bool:
        return value in initializers and (value.name or "") not in shared_set

    for p, (group, nodes) in enumerate(zip(groups, group_nodes, strict=True)):

        def read_outside(value: ir.Value, p: int = p) -> bool:
            return value in graph_outputs or any(q != p for q in readers.get(value, ()))

        inputs, outputs, owned_constants = partition_io(annotation, nodes, owned=owned, read_outside=read_outside)
        composites = tuple(
            dict.fromkeys(
                unit.composite for unit_index in group.units if (unit := annotation.units[unit_index]).composite
            )
        )
        plans.append(
            PartitionPlan(
                name=f"p{p}_{group.backend}",
                backend=group.backend,
                node_indices=nodes,
                inputs=inputs,
                outputs=outputs,
                initializers=owned_constants,
                composites=composites,
            )
        )
    return Plan(tuple(plans), tuple(sorted(shared)))


def partition_io(
    annotation: Annotation,
    nodes: Sequence[int],
    *,
    owned: Callable[[ir.Value], bool],
    read_outside: Callable[[ir.Value], bool],
) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """(inputs, outputs, owned constants) of the sub-model made of ``nodes`` (graph order).

    A value read but not computed inside is an input, or an owned constant when ``owned``
    says so; a value computed inside is an output when ``read_outside`` says something
    outside the nodes (or the graph's caller) reads it.  Shared by planning and by measured
    placement's pieces, so both cut a region the same way.
    """
    produced: set[ir.Value] = set()
    seen: set[ir.Value] = set()
    inputs: list[str] = []
    constants: list[str] = []
    for i in nodes:
        for value in annotation.infos[i].reads:
            if value in produced or value in seen:
                continue
            seen.add(value)
            (constants if owned(value) else inputs).append(value.name or "")
        produced.update(annotation.infos[i].node.outputs)
    outputs = [value.name or "" for i in nodes for value in annotation.infos[i].node.outputs if read_outside(value)]
    return tuple(inputs), tuple(outputs), tuple(constants)


def partition_proto(model: ir.Model, annotation: Annotation, plan: PartitionPlan) -> onnx.ModelProto:
    """The standalone ONNX model of one partition (inputs and outputs in plan order)."""
    graph = model.graph
    values = _values_by_name(model, annotation, plan)
    nodes, notes = [], []
    for i in plan.node_indices:
        node = annotation.infos[i].node
        notes += _types_onnx_does_not_infer(node, plan)
        proto = ir.serde.serialize_node(node)
        if any(c is not None and node.name in c.node_names for c in plan.composites):
            composite = next(c for c in plan.composites if node.name in c.node_names)
            entry = proto.metadata_props.add()
            entry.key, entry.value = "codegraft.composite", composite.instance
        nodes.append(proto)
    graph_proto = onnx.helper.make_graph(
        nodes,
        plan.name,
        [ir.serde.serialize_value(values[name]) for name in plan.inputs],
        [ir.serde.serialize_value(values[name]) for name in plan.outputs],
        initializer=[_serialize_initializer(graph.initializers[name]) for name in plan.initializers],
        value_info=notes,
    )
    proto = onnx.helper.make_model(
        graph_proto,
        opset_imports=[onnx.helper.make_opsetid(domain, version) for domain, version in graph.opset_imports.items()],
        ir_version=model.ir_version,
        producer_name="codegraft",
    )
    proto.functions.extend(ir.serde.serialize_function(f) for f in model.functions.values())
    return proto


def _types_onnx_does_not_infer(node: ir.Node, plan: PartitionPlan) -> list[onnx.ValueInfoProto]:
    """The known types of what an op outside the default domain makes inside the partition: onnx
    infers none for some (ai.onnx.ml's Scaler, Normalizer, LinearRegressor), and a partition
    compiled per input shape is inferred again from its proto (``lower.lowering.specialise``:
    a MatMul after a Scaler had an untyped input there)."""
    if node.domain in ("", "ai.onnx"):
        return []
    return [
        onnx.helper.make_tensor_value_info(value.name, int(value.dtype), None)
        for value in node.outputs
        if value.name and isinstance(value.type, ir.TensorType) and value.dtype is not None
        and value.name not in plan.outputs
    ]


def _values_by_name(model: ir.Model, annotation: Annotation, plan: PartitionPlan) -> dict[str, ir.Value]:
    wanted = set(plan.inputs) | set(plan.outputs)
    found: dict[str, ir.Value] = {}
    for i in plan.node_indices:
        info = annotation.infos[i]
        for value in (*info.reads, *info.node.outputs):
            if value.name in wanted:
                found[value.name] = value
    return found


def _serialize_initializer(value: ir.Value) -> onnx.TensorProto:
    assert value.const_value is not None, f"initializer {value.name} has no value"
    tensor = ir.serde.serialize_tensor(value.const_value)
    tensor.name = value.name or ""
    return tensor
