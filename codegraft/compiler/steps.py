"""Building steps: each planned partition becomes an executable step, compiled and loaded
through :mod:`codegraft.lower`, deferred per shape, or fallen back to the host.

NOTE on names: *lowering* is what :mod:`codegraft.lower` does to one partition for one backend;
*building a step* (here) wraps it with the plan's names, the artifact's record and the host
fallback; the c backend's own ONNX-to-C-ops translation is internal to it.

A partition its backend fails to compile or load runs on the host instead (unless
``strict``), and its report says so with the error; nothing is lost.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np
import onnx
import onnx_ir as ir

from codegraft.backend import Backend, Partition, Runnable
from codegraft.core.names import CONTROL_BACKEND
from codegraft.core.options import CompileOptions
from codegraft.errors import BackendError, CodegraftError, ModelError
from codegraft.frontend.model import one_line
from codegraft.lower.cache import compile_cache
from codegraft.lower.lowering import LoweringRequest, ShapeSpecialisingRunnable, compile_and_load
from codegraft.lower.shape_values import shape_arithmetic_cut
from codegraft.plan.annotate import Annotation
from codegraft.plan.control import body_graphs, body_model, loop_body_work
from codegraft.plan.extract import PartitionPlan, partition_proto
from codegraft.plan.loop_choice import node_model
from codegraft.report.report import PartitionReport
from codegraft.runtime.artifact import artifact_bytes
from codegraft.runtime.control import Body, ControlGroupRunnable, ControlNode
from codegraft.runtime.control_blob import control_blob
from codegraft.runtime.executable import Executable, Step
from codegraft.runtime.loop_choice import LoopPlans

log = logging.getLogger("codegraft")

# What building a step gives: the step (as stored), its loaded runnable, its report record.
Built = tuple[Step, Runnable, PartitionReport]


def build_step(
    model: ir.Model,
    annotation: Annotation,
    part: PartitionPlan,
    backend: Backend,
    host: Backend,
    options: CompileOptions,
    samples: tuple[dict[str, np.ndarray], ...],
    host_is_target: bool,
) -> Built:
    """Compile and load one partition on its backend (deferred per shape where needed)."""
    whole: list[onnx.ModelProto] = []

    def proto() -> onnx.ModelProto:
        if not whole:
            whole.append(partition_proto(model, annotation, part))
        return whole[0]

    # The host keeps float32 unless the user listed it as a target too.
    precision = options.precision if backend is not host or host_is_target else "float32"
    request = LoweringRequest(part.name, part.composites, precision, samples)
    base = PartitionReport(part.name, part.backend, len(part.node_indices), part.inputs, part.outputs)
    caps = backend.capabilities
    cache = compile_cache(options.cache) if backend is not host else None
    # With a cache, the partition without its weights: enough to decide, and (the weights
    # hashed where they lie) to find it in the cache; the whole model is made only to compile.
    head = proto() if cache is None else partition_proto(model, annotation, replace(part, initializers=()))
    # Static-shape backends, and any backend given an input whose rank nobody could infer
    # (OpenVINO refuses a Parameter of dynamic rank), compile per input shape seen at run time.
    def deferred() -> tuple[Step, Runnable, PartitionReport]:
        template = proto().SerializeToString()
        runnable: Runnable = ShapeSpecialisingRunnable(
            backend, template, request, host, strict=options.strict, cache=cache
        )
        step = Step(part.name, part.backend, part.inputs, part.outputs, None, template, caps.native_code,
                    part.composites, options.precision)
        return step, runnable, replace(base, deferred=True)

    if backend is not host and not static_inputs(head) and (not caps.dynamic_shapes or unknown_rank(head)):
        return deferred()
    key = None
    if cache is not None:
        weights = [(name, _constant(model, name)) for name in part.initializers]
        key = cache.key(backend, head, name=part.name, composites=part.composites, precision=precision,
                        samples=samples, weights=weights)
    try:
        lowered = compile_and_load(backend, proto, request, cache, key=key)
    except BackendError as error:
        if options.strict or backend is host:
            raise
        if not caps.dynamic_shapes and shape_arithmetic_cut(proto()):
            # its shape tensors' values are known only at run time, where it is tried again
            log.info("%s: %s; compiled at run time, on its shape tensors' values", part.name, error)
            return deferred()
        return host_fallback(part, proto(), host, error)
    step = Step(part.name, part.backend, part.inputs, part.outputs, lowered.blob, None, caps.native_code,
                part.composites, options.precision)
    return step, lowered.runnable, replace(base, conversion_note=lowered.note)


def _constant(model: ir.Model, name: str) -> ir.TensorProtocol:
    tensor = model.graph.initializers[name].const_value
    assert tensor is not None, f"initializer {name} has no value"
    return tensor


def build_control_step(
    model: ir.Model,
    annotation: Annotation,
    part: PartitionPlan,
    host: Backend,
    options: CompileOptions,
    compile_body: Callable[[onnx.ModelProto, str], Executable],
    targets: Sequence[Backend] = (),
) -> Built:
    """A partition of If/Loop nodes whose bodies are compiled for the targets, recursively.

    A Loop whose body's work for ``targets`` is unknown at compile time keeps the host's plan
    of it too, chosen or not at the first call's shapes (:mod:`codegraft.plan.loop_choice`).
    """
    nodes = [annotation.infos[i].node for i in part.node_indices]
    try:
        compiled = compile_control_nodes(
            model, nodes, compile_body, shapes_fixed=bool(options.input_shapes), targets=targets, host=host
        )
    except CodegraftError as error:
        if options.strict:
            raise
        return host_fallback(part, partition_proto(model, annotation, part), host, error)
    bodies = "; ".join(
        f"{node.name}.{body.attribute}: "
        + (
            ", ".join(f"{b} {n}" for b, n in sorted(body.executable.report().nodes_per_backend().items()))
            if body.executable is not None
            else f"cannot run at these input shapes ({body.unrunnable})"
        )
        + (" (or the whole Loop on the host: its work per iteration is unknown at compile time, the first "
           "call's input shapes choose)" if node.whole is not None else "")
        for node in compiled
        for body in node.bodies.values()
    )
    blob = control_blob(compiled, part.inputs, part.outputs, save_body=artifact_bytes)
    step = Step(part.name, CONTROL_BACKEND, part.inputs, part.outputs, blob)
    report = PartitionReport(part.name, CONTROL_BACKEND, len(nodes), part.inputs, part.outputs, bodies=bodies)
    return step, ControlGroupRunnable(compiled, part.inputs, part.outputs), report


CompileBody = Callable[[onnx.ModelProto, str], Executable]


def compile_control_nodes(
    model: ir.Model,
    nodes: Sequence[ir.Node],
    compile_body: CompileBody,
    *,
    shapes_fixed: bool = False,
    targets: Sequence[Backend] = (),
    host: Backend | None = None,
) -> list[ControlNode]:
    """Compile every body of ``nodes`` (If/Loop) with ``compile_body``, recursively for the targets.

    With ``shapes_fixed`` (``input_shapes`` given), an If branch that is not a valid model at
    those shapes is kept as one that raises when taken, as onnxruntime would fail then.  With
    a ``host``, a Loop whose body's work for ``targets`` is unknown here also gets the host's
    plan of the whole node (:class:`~codegraft.runtime.loop_choice.LoopPlans`).
    """
    compiled = []
    for node in nodes:
        bodies = {}
        for attribute, graph in body_graphs(node).items():
            proto, formal, outer = body_model(graph, model)
            try:
                executable = compile_body(proto, f"{node.name}.{attribute}")
            except ModelError as error:
                if not shapes_fixed or len(body_graphs(node)) < 2:
                    raise
                # Only an If's branch, and only at fixed shapes: the other branch is the one
                # these shapes take (else the whole node would be as invalid as this branch).
                log.warning("%s.%s cannot run at the fixed input shapes: %s", node.name, attribute, error)
                bodies[attribute] = Body(attribute, formal, outer, None, one_line(error))
                continue
            bodies[attribute] = Body(attribute, formal, outer, executable)
        whole = None
        if host is not None and node.op_type == "Loop" and loop_body_work(node, targets) is None:
            proto, inputs = node_model(node, model)
            whole = LoopPlans(node.name or "", proto.SerializeToString(), inputs, targets, host)
        compiled.append(
            ControlNode(
                node.name or "",
                node.op_type,
                tuple(v.name or "" if v is not None else "" for v in node.inputs),
                tuple(v.name or "" for v in node.outputs),
                bodies,
                whole,
            )
        )
    return compiled


def host_fallback(part: PartitionPlan, proto: onnx.ModelProto, host: Backend, error: Exception) -> Built:
    """Run ``part`` on the host because its backend failed; the report keeps the error.

    Only a debug line per partition: ``compile`` warns once per backend (see
    :func:`warn_fallbacks`), since one model can make dozens of partitions fail alike.
    """
    log.debug("%s; %s runs %s instead", error, host.name, part.name)
    step, runnable = host_step(part, proto, host)
    report = PartitionReport(
        part.name, host.name, len(part.node_indices), part.inputs, part.outputs,
        requested_backend=part.backend, fallback_error=str(error),
    )
    return step, runnable, report


def host_step(part: PartitionPlan, proto: onnx.ModelProto, host: Backend) -> tuple[Step, Runnable]:
    """``part`` compiled and loaded on the host."""
    blob = host.compile(Partition(part.name, ir.from_proto(proto)))
    return Step(part.name, host.name, part.inputs, part.outputs, blob), host.load(blob)


def warn_fallbacks(reports: Sequence[PartitionReport], host: str) -> None:
    """One warning line per backend whose partitions fell back to the host at compile time."""
    failed: dict[str, list[PartitionReport]] = {}
    for report in reports:
        if report.fallback_error and report.requested_backend:
            failed.setdefault(report.requested_backend, []).append(report)
    for backend, parts in failed.items():
        first = parts[0]
        reason = (first.fallback_error or "").strip().splitlines()[0]
        log.warning(
            "%s: %d of its partitions run on %s instead (first, %s: %s); details in the report",
            backend, len(parts), host, first.name, reason,
        )


def unknown_rank(proto: onnx.ModelProto) -> bool:
    """Whether some input of ``proto`` has no shape at all (not even a rank)."""
    return any(not value.type.tensor_type.HasField("shape") for value in proto.graph.input)


def static_inputs(proto: onnx.ModelProto) -> bool:
    """Whether every input of ``proto`` has a fully known shape."""
    return all(
        value.type.tensor_type.HasField("shape")
        and all(d.HasField("dim_value") for d in value.type.tensor_type.shape.dim)
        for value in proto.graph.input
    )


__all__ = [
    "CompileBody",
    "Built",
    "compile_control_nodes",
    "host_fallback",
    "host_step",
    "build_control_step",
    "build_step",
    "static_inputs",
    "warn_fallbacks",
]
