"""``inspect``: the report of a compile, without compiling (annotation and partitioning only)."""

from __future__ import annotations

import pathlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import onnx
import onnx_ir as ir

from codegraft.backends.onnxruntime import OnnxRuntimeBackend
from codegraft.compiler.driver import (
    Target,
    apply_fixed_inputs,
    hint_after_passes,
    resolve_targets,
    run_common_passes,
    stage_reports,
)
from codegraft.core.gcpause import without_gc
from codegraft.core.options import (
    MIN_PARTITION_MACS,
    CompileOptions,
    InputShapes,
    input_shapes_option,
    input_values_option,
)
from codegraft.core.stages import Progress, Stages
from codegraft.frontend.model import ModelSource, import_model
from codegraft.plan.annotate import Annotation
from codegraft.plan.extract import Plan
from codegraft.plan.planner import plan
from codegraft.report.report import PartitionReport, Report


@dataclass(frozen=True)
class Inspection:
    """The report of an inspect, plus what drawing and exporting need."""

    report: Report
    model: ir.Model
    annotation: Annotation
    plan: Plan

    def partitioned_onnx(self) -> onnx.ModelProto:
        """The partitioned model for Netron (see :mod:`codegraft.plan.netron`)."""
        from codegraft.plan.netron import partitioned_onnx

        return partitioned_onnx(self.model, self.annotation, self.plan)


@without_gc
def inspect_model(
    model: ModelSource,
    targets: Sequence[Target],
    *,
    min_partition_size: int = 1,
    min_partition_macs: int = MIN_PARTITION_MACS,
    progress: Progress | None = None,
    input_shapes: InputShapes | None = None,
    input_values: Mapping[str, object] | None = None,
) -> Inspection:
    """Where each node would run and why; no backend compiles anything.

    ``progress(stage, done, total)`` hears each stage as :func:`codegraft.compile`'s does;
    ``input_shapes`` and ``input_values`` as :func:`codegraft.compile` takes them.
    """
    stages = Stages(progress)
    host = OnnxRuntimeBackend()
    backends = resolve_targets(targets)
    options = CompileOptions(min_partition_size=min_partition_size, min_partition_macs=min_partition_macs,
                             input_shapes=input_shapes_option(input_shapes),
                             input_values=input_values_option(input_values))  # fmt: skip
    with stages.stage("import"):
        ir_model = import_model(model)
        _, options, notes = apply_fixed_inputs(ir_model, options)
    passes = run_common_passes(ir_model, options, stages)
    notes += hint_after_passes(ir_model, options)
    planned = plan(ir_model, backends, host, options, stages=stages)
    with stages.stage("report"):
        nodes = planned.node_reports()
        partitions = tuple(
            PartitionReport(p.name, p.backend, len(p.node_indices), p.inputs, p.outputs)
            for p in planned.plan.partitions
        )
    report = Report(tuple(b.name for b in backends), host.name, tuple(nodes), partitions, passes,
                    stages=stage_reports(stages), notes=notes)
    return Inspection(report, ir_model, planned.annotation, planned.plan)


def draw_report(inspection: Inspection, path: pathlib.Path, *, fmt: str, collapse: bool | None) -> None:
    """Draw the partitioned graph as SVG or HTML (needs graphviz's ``dot``)."""
    from codegraft.report.draw import draw_inspection

    draw_inspection(inspection, path, fmt=fmt, collapse=collapse)
