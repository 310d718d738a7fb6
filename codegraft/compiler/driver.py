"""``compile``: import, optimise, annotate, partition, lower each partition, build the executable."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from codegraft.backend import Backend, Runnable, check_backend
from codegraft.backends import get_backend
from codegraft.backends.onnxruntime import OnnxRuntimeBackend
from codegraft.compiler.steps import build_control_step, build_step, host_step, warn_fallbacks
from codegraft.core.dtypes import numpy_dtype
from codegraft.core.gcpause import without_gc
from codegraft.core.names import CONTROL_BACKEND
from codegraft.core.options import CompileOptions
from codegraft.core.reference import values_inside
from codegraft.core.stages import Progress, Stages
from codegraft.errors import BackendError, ModelError, OptionError
from codegraft.frontend.fixed_inputs import bind_input_values, control_flow_hint, fix_input_shapes
from codegraft.frontend.model import ModelSource, import_model
from codegraft.frontend.torch_export import DynamicShapes, export_module, is_torch_module
from codegraft.frontend.zipmap import of_model as output_maps_of
from codegraft.passes import pipeline as passes_pipeline
from codegraft.passes.pipeline import PassOptions, PassRecord
from codegraft.plan.annotate import Annotation
from codegraft.plan.extract import PartitionPlan, Plan, partition_proto
from codegraft.plan.planner import Planned, plan
from codegraft.report.report import PartitionReport, PassReport, Report, StageReport
from codegraft.runtime.executable import Executable, HostFallback, Step, TensorSpec
from codegraft.tune.placement import measure_placement

Target = str | Backend


def compile(  # noqa: A001 - the public name the README promises
    model: ModelSource,
    targets: Sequence[Target] = (),
    *,
    example_inputs: Sequence[Any] | None = None,
    dynamic_shapes: DynamicShapes | None = None,
    input_names: Sequence[str] | None = None,
    output_names: Sequence[str] | None = None,
    options: CompileOptions | None = None,
    export_onnx: str | os.PathLike[str] | None = None,
    progress: Progress | None = None,
    **overrides: Any,
) -> Executable:
    """Compile ``model`` for ``targets`` (ordered by preference); the host takes the rest.

    ``model`` is a path, bytes, ``onnx.ModelProto``, ``onnx_ir.Model`` or a torch module
    (with ``example_inputs``; ``dynamic_shapes`` in ``torch.export``'s spelling, e.g.
    ``{"x": {0: "batch"}}``; inputs named as ``forward``'s parameters unless ``input_names``,
    outputs ``output``/``output_<i>`` unless ``output_names``).  ``targets`` holds backend
    names or backend objects.
    Keyword overrides set :class:`CompileOptions` fields, e.g. ``strict=True``.
    ``export_onnx`` also writes the partitioned model as ONNX, each partition a local
    function with its backend in the node's metadata, for Netron.  ``progress(stage, done,
    total)`` hears each stage start, advance and end (the CLI draws bars from it); the report
    lists each stage's time either way.

    Example::

        exe = codegraft.compile("model.onnx", targets=["c"], min_partition_size=3)
        print(exe.report())
    """
    options = _with_overrides(options or CompileOptions(), overrides)
    stages = Stages(progress)
    host = OnnxRuntimeBackend(threads=options.threads)
    backends = resolve_targets(targets, threads=options.threads)
    precision_note = check_precision(options.precision, backends, host)
    import_notes: tuple[str, ...] = ()
    if is_torch_module(model):
        with stages.stage("export"):
            exported = export_module(
                model, example_inputs, dynamic_shapes=dynamic_shapes, input_names=input_names,
                output_names=output_names,
            )
        model, import_notes = exported.proto, (exported.note,)
    with stages.stage("import"):
        ir_model = import_model(model)
        input_specs, options, fixed_notes = apply_fixed_inputs(ir_model, options)
    pass_reports = run_common_passes(ir_model, options, stages)
    import_notes += fixed_notes + hint_after_passes(ir_model, options)
    if options.precision == "int8":
        with stages.stage("quantize"):
            ir_model, quantize_report = _quantize(ir_model, options)
        pass_reports += (quantize_report,)

    place = measure_placement if options.placement == "measured" else None
    planned = plan(ir_model, backends, host, options, place=place, stages=stages)
    annotation, partitioning = planned.annotation, planned.plan
    _check_host_can_run(annotation, partitioning, host)
    if export_onnx is not None:
        from codegraft.plan.netron import partitioned_onnx

        onnx.save(partitioned_onnx(ir_model, annotation, partitioning), os.fspath(export_onnx))
    host.spin = len(partitioning.partitions) == 1  # see OnnxRuntimeBackend
    by_name: dict[str, Backend] = {b.name: b for b in backends}
    by_name[host.name] = host

    steps: list[Step] = []
    runnables: list[Runnable] = []
    part_reports: list[PartitionReport] = []
    control_constants: dict[str, np.ndarray] = {}
    target_names = {b.name for b in backends}
    samples = _partition_samples(ir_model, partitioning, options, host.name)
    host_fallbacks: dict[str, HostFallback] = {}
    lowering = stages.stage("lower", total=len(partitioning.partitions))
    for lowered, part in enumerate(partitioning.partitions):
        lowering.advance(lowered)
        if not part.outputs:  # nothing reads what it computes: nothing to run
            part_reports.append(PartitionReport(part.name, part.backend, len(part.node_indices), part.inputs, (),
                                                unused=True))
            continue
        if part.backend == CONTROL_BACKEND:
            # The If/Loop node's own constant inputs come from the executable's constants.
            control_constants.update(
                (name, ir_model.graph.initializers[name].const_value.numpy())  # type: ignore[union-attr]
                for name in part.initializers
            )
            part = replace(part, inputs=part.inputs + part.initializers, initializers=())
            step, runnable, part_report = build_control_step(
                ir_model, annotation, part, host, options,
                # a body's inputs are its own: the model's input shapes reach it as folded constants
                lambda proto, name: compile(
                    proto, targets=backends, options=replace(options, input_shapes=(), input_values=())
                ),
                targets=backends,
            )
        else:
            step, runnable, part_report = build_step(
                ir_model, annotation, part, by_name[part.backend], host, options,
                samples.get(part.name, ()), host_is_target=host.name in target_names,
            )
        steps.append(step)
        runnables.append(runnable)
        part_reports.append(replace(part_report, stored_bytes=len(step.blob or step.template or b"")))
        if step.backend not in (host.name, CONTROL_BACKEND):
            host_fallbacks[part.name] = _host_fallback(ir_model, annotation, part, host)
    lowering.end()
    warn_fallbacks(part_reports, host.name)

    constants = {
        name: ir_model.graph.initializers[name].const_value.numpy()  # type: ignore[union-attr]
        for name in partitioning.shared_constants
    }
    constants.update(_constant_outputs(ir_model))
    constants.update(control_constants)
    with stages.stage("report"):
        report = _build_report(planned, part_reports, backends, host, pass_reports)
    report = replace(report, notes=import_notes + report.notes, stages=stage_reports(stages))
    if precision_note:
        report = replace(report, notes=(*report.notes, precision_note))
    output_maps, visible = output_maps_of(ir_model)
    return Executable(
        inputs=input_specs,
        outputs=visible or [v.name or "" for v in ir_model.graph.outputs],
        output_maps=output_maps,
        steps=steps,
        runnables=runnables,
        constants=constants,
        report=report,
        backends=by_name,
        host_fallbacks=host_fallbacks,
        strict=options.strict,
        host_threads=options.threads,
    )


def apply_fixed_inputs(
    ir_model: ir.Model, options: CompileOptions
) -> tuple[list[TensorSpec], CompileOptions, tuple[str, ...]]:
    """``input_shapes`` and ``input_values`` applied to the imported model (in place).

    Returns the executable's input specs (a bound input keeps its place, with its value),
    the options with bound inputs dropped from ``sample_inputs``, and the report's notes.
    """
    shapes_note = fix_input_shapes(ir_model, options.input_shapes)
    specs = [_tensor_spec(v) for v in ir_model.graph.inputs]
    values_note, bound = bind_input_values(ir_model, options.input_values)
    if bound:  # the executable still takes them (and checks them); the graph has them as constants
        specs = [replace(s, shape=bound[s.name].shape, bound=bound[s.name]) if s.name in bound else s
                 for s in specs]  # fmt: skip
        options = replace(options, sample_inputs=tuple(
            {name: a for name, a in sample.items() if name not in bound} for sample in options.sample_inputs
        ))  # fmt: skip
    return specs, options, tuple(note for note in (shapes_note, values_note) if note)


def hint_after_passes(ir_model: ir.Model, options: CompileOptions) -> tuple[str, ...]:
    """The report's note on If nodes that fixed shapes or bound values might fold, if any."""
    hint = control_flow_hint(
        ir_model, shapes_fixed=bool(options.input_shapes), values_bound=bool(options.input_values)
    )
    return (hint,) if hint else ()


def _host_fallback(ir_model: ir.Model, annotation: Annotation, part: PartitionPlan, host: Backend) -> HostFallback:
    """Builds ``part`` on the host if its backend fails at run time.  The partition's ONNX is
    cut again only then; until then the model is kept, not a copy of each partition."""
    return lambda: host_step(part, partition_proto(ir_model, annotation, part), host)


def _with_overrides(options: CompileOptions, overrides: dict[str, Any]) -> CompileOptions:
    known = set(CompileOptions.__dataclass_fields__)
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise TypeError(f"compile() got unknown option(s) {unknown}; known: {sorted(known)}")
    if "sample_inputs" in overrides:
        overrides["sample_inputs"] = tuple(overrides["sample_inputs"])
    return replace(options, **overrides)


def resolve_targets(targets: Sequence[Target] | None, *, threads: int = 0) -> list[Backend]:
    """Backends for names (via :func:`codegraft.get_backend`, with ``threads``) and objects (as
    they are: a backend object keeps its own threads); a name twice is an error."""
    if targets is None:
        targets = []
    if isinstance(targets, str):
        targets = [targets]
    if not isinstance(targets, Sequence):
        raise BackendError(f"targets must be a list of backend names or objects, not {type(targets).__name__}")
    for target in targets:
        if not isinstance(target, str) and not (hasattr(target, "name") or hasattr(target, "supports")):
            raise BackendError(f"target {target!r} is neither a backend name nor a backend object")
    # an object that looks like a backend is checked against the contract, naming what it lacks
    resolved = [get_backend(t, threads=threads) if isinstance(t, str) else check_backend(t) for t in targets]
    names = [b.name for b in resolved]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise BackendError(f"target(s) listed twice: {duplicates}")
    return resolved


def check_precision(precision: str, backends: Sequence[Backend], host: Backend) -> str:
    """A lower float precision must be declared by at least one target, else :class:`OptionError`
    naming what each target runs; returns a note naming the targets that will run float32."""
    if precision not in ("float16", "bfloat16"):
        return ""
    lacking = [b for b in backends if precision not in b.capabilities.precisions]
    if len(lacking) < len(backends):
        names = ", ".join(b.name for b in lacking)
        return f"{precision} is not declared by {names}: its partitions run float32" if lacking else ""
    declared = "; ".join(f"{b.name} runs {', '.join(sorted(b.capabilities.precisions))}" for b in backends)
    raise OptionError(
        f"precision {precision!r} is declared by none of the targets"
        + (f" ({declared})" if declared else " (none given)")
        + "; the host stays float32 unless listed as a target"
        + (f" (-t {host.name} runs {precision})" if precision in host.capabilities.precisions else "")
    )


def run_common_passes(
    model: ir.Model, options: CompileOptions, stages: Stages | None = None
) -> tuple[PassReport, ...]:
    """The shared passes ``options.passes`` names (all by default, none for ``()``), in place."""
    if options.passes is not None and not options.passes:
        return ()
    pass_options = PassOptions() if options.passes is None else PassOptions.from_names(list(options.passes))
    ended: list[PassRecord] = []
    # one step more than the passes: shape inference runs again after a change
    with (stages or Stages()).stage("passes", total=len(pass_options.enabled) + 1) as passing:

        def after_each(record: PassRecord) -> None:
            ended.append(record)
            passing.advance(len(ended))

        result = passes_pipeline.run_common_passes(model, pass_options, after_each=after_each)
    return tuple(
        PassReport(r.name, r.nodes_before, r.nodes_after, getattr(r, "detail", "") or "") for r in result.records
    )


def stage_reports(stages: Stages) -> tuple[StageReport, ...]:
    """The report's "time per stage" rows."""
    return tuple(StageReport(name, round(seconds, 4)) for name, seconds in stages.times)


def _check_host_can_run(annotation: Annotation, plan: Plan, host: Backend) -> None:
    """A node nobody can run is the model's problem: say so now, naming it, not at run time."""
    for part in plan.partitions:
        if part.backend != host.name:
            continue
        for index in part.node_indices:
            node = annotation.infos[index].node
            verdict = host.supports(node)
            if verdict.ok:
                continue
            others = "; ".join(f"{d.backend}: {d.reason}" for d in annotation.declines[index])
            raise ModelError(
                f"node {node.name!r} ({node.domain or 'ai.onnx'}::{node.op_type}) can run nowhere: "
                f"the host declines it ({verdict.reason})" + (f", and so do the targets ({others})" if others else "")
            )


def _quantize(model: ir.Model, options: CompileOptions) -> tuple[ir.Model, PassReport]:
    """Static int8 quantization (QDQ) calibrated on the user's samples."""
    if not options.sample_inputs:
        raise ModelError("precision='int8' needs calibration data: pass sample_inputs=[{input name: array}, ...]")
    from codegraft.passes.quantize import quantize_int8

    before = len(model.graph)
    result = quantize_int8(model, list(options.sample_inputs))
    detail = (f"{len(result.quantized_ops)} ops quantized; {result.quantize_nodes} QuantizeLinear, "
              f"{result.dequantize_nodes} DequantizeLinear inserted")
    return result.model, PassReport("quantize_int8", before, len(result.model.graph), detail)


def _partition_samples(
    model: ir.Model, plan: Plan, options: CompileOptions, host: str
) -> dict[str, tuple[dict[str, np.ndarray], ...]]:
    """Values at each partition's inputs for the user's sample inputs (for the precision check).

    Only computed when a lower float precision is asked and samples were given; otherwise
    the check generates inputs from the declared shapes.
    """
    if options.precision not in ("float16", "bfloat16") or not options.sample_inputs:
        return {}
    wanted = {name for p in plan.partitions if p.backend != host for name in p.inputs}
    runs = values_inside(model, options.sample_inputs, wanted)
    constants = {n: v.const_value.numpy() for n, v in model.graph.initializers.items() if v.const_value is not None}
    every = [{**constants, **dict(feeds), **run} for feeds, run in zip(options.sample_inputs, runs, strict=True)]
    return {
        p.name: tuple({name: values_of[name] for name in p.inputs} for values_of in every)
        for p in plan.partitions
        if p.backend != host and all(name in every[0] for name in p.inputs)
    }


def _constant_outputs(model: ir.Model) -> dict[str, np.ndarray]:
    """Graph outputs that are initializers: no node produces them, the runtime supplies them."""
    return {
        v.name or "": v.const_value.numpy()
        for v in model.graph.outputs
        if v.producer() is None and v.const_value is not None and v.is_initializer()
    }


def _tensor_spec(value: ir.Value) -> TensorSpec:
    dtype = numpy_dtype(value.dtype).name if value.dtype is not None else ""
    shape = None if value.shape is None else tuple(
        d if isinstance(d, int) else (d.value if d.value else None) for d in value.shape
    )
    return TensorSpec(value.name or "", dtype, shape)


@without_gc
def _build_report(
    planned: Planned,
    partitions: Sequence[PartitionReport],
    backends: Sequence[Backend],
    host: Backend,
    passes: tuple[PassReport, ...],
) -> Report:
    annotation = planned.annotation
    nodes = planned.node_reports({part.name: report.backend for part, report in zip(
        planned.plan.partitions, partitions, strict=True)})
    notes = []
    # planned for the host though a target took them (a partition that fell back is reported apart)
    planned_on = {i: part.backend for part in planned.plan.partitions for i in part.node_indices}
    demoted = sum(1 for i in range(len(nodes)) if planned_on[i] == host.name and annotation.capable[i])
    if demoted:
        notes.append(
            f"{demoted} supported node(s) run on the host (a partition below min_partition_size or "
            "min_partition_macs, or on a backend whose calls cost more than the host's, or measured placement)"
        )
    return Report(
        targets=tuple(b.name for b in backends),
        host=host.name,
        nodes=tuple(nodes),
        partitions=tuple(partitions),
        passes=passes,
        placements=planned.placements,
        notes=tuple(notes),
    )
