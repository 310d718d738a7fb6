"""Control flow with partitioned bodies: If and Loop run by codegraft's own runtime.

NOTE: by default a node with subgraphs runs on the host, bodies and all.  When a target could
take nodes inside an If or Loop body, codegraft instead compiles each body as a model of its
own (its formal inputs, then the outer-scope values it reads) with the same targets, and runs
the If or Loop itself, calling the bodies' executables.  So nodes inside bodies are
partitioned like any other, recursively.  Scan stays on the host.

Blob layout: ``u32 size | JSON program | nested body artifacts``; no pickle.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
import onnx_ir as ir

from codegraft.backend import Backend
from codegraft.plan.annotate import Annotation, check_node
from codegraft.runtime.executable import Executable

CONTROL_BACKEND = "codegraft.control"
CONTROL_OPS = frozenset({"If", "Loop"})

CompileBody = Callable[[onnx.ModelProto, str], Executable]
LoadBody = Callable[[bytes, str], Executable]


@dataclass(frozen=True)
class Body:
    """One compiled subgraph: the executable, its formal inputs and outer-scope inputs."""

    attribute: str
    formal: tuple[str, ...]
    outer: tuple[str, ...]
    executable: Executable


@dataclass(frozen=True)
class ControlNode:
    """An If or Loop node with compiled bodies."""

    name: str
    op: str
    inputs: tuple[str, ...]  # "" for an omitted optional input
    outputs: tuple[str, ...]
    bodies: dict[str, Body]


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


def compile_control_nodes(
    model: ir.Model, nodes: Sequence[ir.Node], compile_body: CompileBody
) -> list[ControlNode]:
    """Compile every body of ``nodes`` with ``compile_body``."""
    compiled = []
    for node in nodes:
        bodies = {}
        for attribute, graph in body_graphs(node).items():
            proto, formal, outer = body_model(graph, model)
            bodies[attribute] = Body(attribute, formal, outer, compile_body(proto, f"{node.name}.{attribute}"))
        compiled.append(
            ControlNode(
                node.name or "",
                node.op_type,
                tuple(v.name or "" if v is not None else "" for v in node.inputs),
                tuple(v.name or "" for v in node.outputs),
                bodies,
            )
        )
    return compiled


class ControlGroupRunnable:
    """Runs a partition of If/Loop nodes in order (stateless per call: thread-safe)."""

    def __init__(self, nodes: Sequence[ControlNode], inputs: Sequence[str], outputs: Sequence[str]) -> None:
        self.nodes = tuple(nodes)
        self.inputs = tuple(inputs)
        self.outputs = tuple(outputs)

    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        env = dict(zip(self.inputs, inputs, strict=True))
        for node in self.nodes:
            results = _run_if(node, env) if node.op == "If" else _run_loop(node, env)
            env.update(zip(node.outputs, results, strict=True))
        return [env[name] for name in self.outputs]


def _call(body: Body, env: dict[str, np.ndarray], formal: Sequence[np.ndarray] = ()) -> list[np.ndarray]:
    feeds = dict(zip(body.formal, formal, strict=True))
    feeds.update((name, env[name]) for name in body.outer)
    results = body.executable.run(feeds)
    return [results[name] for name in body.executable.outputs]


def _run_if(node: ControlNode, env: dict[str, np.ndarray]) -> list[np.ndarray]:
    branch = "then_branch" if bool(np.asarray(env[node.inputs[0]])) else "else_branch"
    return _call(node.bodies[branch], env)


def _run_loop(node: ControlNode, env: dict[str, np.ndarray]) -> list[np.ndarray]:
    body = node.bodies["body"]
    trip, cond_name, *initial = node.inputs
    max_trips = int(np.asarray(env[trip])) if trip else None
    keep_going = bool(np.asarray(env[cond_name])) if cond_name else True
    carried = [env[name] for name in initial]
    scans: list[list[np.ndarray]] = []
    iteration = 0
    while keep_going and (max_trips is None or iteration < max_trips):
        formal = [np.array(iteration, np.int64), np.array(keep_going), *carried]
        results = _call(body, env, formal)
        keep_going = bool(np.asarray(results[0]))
        carried = results[1 : 1 + len(initial)]
        step_scans = results[1 + len(initial) :]
        if not scans:
            scans = [[] for _ in step_scans]
        for collected, value in zip(scans, step_scans, strict=True):
            collected.append(value)
        iteration += 1
    scan_count = len(node.outputs) - len(initial)
    stacked = [np.stack(values) for values in scans] if scans else [np.zeros((0,), np.float32)] * scan_count
    return [*carried, *stacked]


def control_blob(nodes: Sequence[ControlNode], inputs: Sequence[str], outputs: Sequence[str]) -> bytes:
    """Serialise a control group; bodies nest as artifacts."""
    from codegraft.runtime.artifact import artifact_bytes

    chunks: list[bytes] = []
    offset = 0
    program_nodes = []
    for node in nodes:
        bodies = {}
        for attribute, body in node.bodies.items():
            data = artifact_bytes(body.executable)
            bodies[attribute] = {"formal": list(body.formal), "outer": list(body.outer),
                                 "offset": offset, "size": len(data)}
            chunks.append(data)
            offset += len(data)
        program_nodes.append({"name": node.name, "op": node.op, "inputs": list(node.inputs),
                              "outputs": list(node.outputs), "bodies": bodies})
    program = json.dumps({"inputs": list(inputs), "outputs": list(outputs), "nodes": program_nodes}).encode()
    return struct.pack("<I", len(program)) + program + b"".join(chunks)


def load_control_blob(blob: bytes, load_body: LoadBody) -> ControlGroupRunnable:
    """Inverse of :func:`control_blob`; ``load_body`` loads each nested artifact."""
    (size,) = struct.unpack_from("<I", blob)
    program = json.loads(blob[4 : 4 + size])
    data = blob[4 + size :]
    nodes = []
    for entry in program["nodes"]:
        bodies = {}
        for attribute, body in entry["bodies"].items():
            nested = data[body["offset"] : body["offset"] + body["size"]]
            executable = load_body(nested, f"{entry['name']}.{attribute}")
            bodies[attribute] = Body(attribute, tuple(body["formal"]), tuple(body["outer"]), executable)
        nodes.append(ControlNode(entry["name"], entry["op"], tuple(entry["inputs"]), tuple(entry["outputs"]), bodies))
    return ControlGroupRunnable(nodes, program["inputs"], program["outputs"])
