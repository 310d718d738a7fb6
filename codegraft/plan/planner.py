"""``plan``: the one planning entry point that compile, inspect and measured placement share.

NOTE: planning is annotate, send If/Loop nodes with claimable bodies to codegraft's runtime,
optionally let a *placer* choose each unit's backend (measured placement lives in
:mod:`codegraft.tune`, a later stage, so it is passed in rather than imported), then group the
units into cycle-free partitions (:func:`group_units`, demoting partitions below the minimum
size to the host) and work out each partition's inputs, outputs and constants.  Compile and
inspect both call :func:`plan` and report its nodes with :meth:`Planned.node_reports`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

import onnx_ir as ir

from codegraft.backend import Backend
from codegraft.core.gcpause import without_gc
from codegraft.core.names import CONTROL_BACKEND
from codegraft.core.options import CompileOptions
from codegraft.core.stages import Stages
from codegraft.plan.annotate import Annotation, annotate
from codegraft.plan.control import known_multiply_adds, mark_control_units
from codegraft.plan.extract import Plan, plan_partitions
from codegraft.plan.partition import (
    Group,
    demote_costly_light_groups,
    demote_light_islands,
    demote_small_groups,
    merge_independent_groups,
    partition_units,
)
from codegraft.report.report import NodeReport, PlacementReport

# Why planning moved a unit a target took to the host (the report's "why not" for its nodes).
SMALL_PARTITION = "in a partition under min_partition_size nodes: the host runs it"
LIGHT_ISLAND = "in a light partition (min_partition_macs) between host ones: the host runs it, two crossings fewer"
COSTLY_CALLS = "in a light partition (min_partition_macs), and the host's calls cost less (call_overhead_us)"

Placer = Callable[
    [ir.Model, Annotation, Sequence[Backend], Backend, CompileOptions],
    tuple[list[str], tuple[PlacementReport, ...]],
]
"""Chooses every unit's backend (the host's name for the host) and says why, per region."""


@dataclass(frozen=True)
class Planned:
    """What :func:`plan` decided: the annotation, the partitions and any placement records."""

    annotation: Annotation
    plan: Plan
    placements: tuple[PlacementReport, ...] = ()
    moved: Mapping[int, tuple[str, str]] = field(default_factory=dict)  # unit -> (backend it left, why)

    @without_gc
    def node_reports(self, ran_on: Mapping[str, str] | None = None) -> tuple[NodeReport, ...]:
        """One record per node: its partition, the backend running it, and why others declined.

        ``ran_on`` maps a partition's name to the backend that runs it when that differs from
        the plan (a partition whose backend failed to compile runs on the host).
        """
        annotation = self.annotation
        where: dict[int, tuple[str, str]] = {}
        for part in self.plan.partitions:
            backend = (ran_on or {}).get(part.name, part.backend)
            for index in part.node_indices:
                where[index] = (backend, part.name)
        nodes = []
        for index, info in enumerate(annotation.infos):
            backend, partition = where[index]
            unit_index = annotation.unit_of_node[index]
            unit = annotation.units[unit_index]
            declined = [(d.backend, d.reason) for d in annotation.declines[index] if d.backend != backend]
            if unit_index in self.moved and self.moved[unit_index][0] != backend:
                declined.append(self.moved[unit_index])
            nodes.append(
                NodeReport(
                    name=info.node.name or "",
                    op_type=info.node.op_type,
                    backend=backend,
                    partition=partition,
                    composite=unit.composite.instance if unit.composite else None,
                    declined=tuple(declined),
                )
            )
        return tuple(nodes)


@without_gc
def plan(
    model: ir.Model,
    backends: Sequence[Backend],
    host: Backend,
    options: CompileOptions,
    *,
    place: Placer | None = None,
    stages: Stages | None = None,
) -> Planned:
    """Annotate and partition ``model``: everything up to (not including) compiling partitions.

    ``place``, when given and there are targets, replaces the default placement (the first
    target that supports a node takes it).  ``stages`` times annotate, placement and partition.

    Example::

        planned = plan(model, [get_backend("c")], OnnxRuntimeBackend(), CompileOptions())
        print([p.name for p in planned.plan.partitions])
    """
    stages = stages or Stages()
    with stages.stage("annotate", total=len(model.graph) * max(len(backends), 1)) as annotating:
        annotation = annotate(model.graph, backends, host=host.name, progress=annotating.advance)
        unit_backends = [unit.backend for unit in annotation.units]
        annotation = mark_control_units(annotation, unit_backends, backends)
    placements: tuple[PlacementReport, ...] = ()
    if place is not None and backends:  # the host is always a candidate too
        with stages.stage("placement"):
            unit_backends, placements = place(model, annotation, backends, host, options)
    with stages.stage("partition"):
        preference = [b.name for b in backends]
        host_call = host.capabilities.call_overhead_us
        costly = {b.name for b in backends if b.capabilities.call_overhead_us > host_call}
        moved: dict[int, tuple[str, str]] = {}
        groups = group_units(annotation, unit_backends, host.name, preference, options.min_partition_size,
                             min_partition_macs=options.min_partition_macs if place is None else 0, costly=costly,
                             moved=moved)
        partitions = plan_partitions(model, annotation, groups)
    return Planned(annotation, partitions, placements, moved)


def group_units(
    annotation: Annotation,
    unit_backends: list[str],
    host: str,
    preference: Sequence[str],
    min_partition_size: int = 1,
    *,
    min_partition_macs: int = 0,
    costly: Collection[str] = (),
    moved: dict[int, tuple[str, str]] | None = None,
) -> list[Group]:
    """Cycle-free groups of units on their backends; groups under ``min_partition_size`` nodes
    go to the host (``unit_backends`` is updated) and the rest is regrouped until none is left.
    A target's group between host groups (reading from one, feeding one) that does fewer than
    ``min_partition_macs`` multiply-adds goes to the host too (:func:`demote_light_islands`; the
    planner asks it of first-fit placement, where nothing timed the choice), and then so does
    such a light group anywhere on a ``costly`` backend, whose calls cost more than the host's
    (:func:`demote_costly_light_groups`).  ``moved``, when given, receives each unit so moved:
    the backend it left and why (the report's "why not" for its nodes)."""
    preds = annotation.unit_predecessors()
    sizes = [len(unit.nodes) for unit in annotation.units]
    work = _unit_work(annotation, min_partition_macs) if min_partition_macs else []
    costly = set(costly) - {CONTROL_BACKEND}
    moves = moved if moved is not None else {}

    def note(before: list[str], why: str) -> bool:
        changed = [u for u, (was, now) in enumerate(zip(before, unit_backends, strict=True)) if was != now]
        for unit in changed:
            moves.setdefault(unit, (before[unit], why))
        return bool(changed)

    # Light islands move first; once a costly backend's light groups have moved, islands that
    # this leaves between host groups stay: piper's 137-node c islands of spline arithmetic,
    # between OpenVINO's NonZeros once, were 6% slower as 137 onnxruntime kernels.
    moved_costly = False
    while True:
        groups = partition_units(unit_backends, preds, host=host, preference=preference)
        groups = merge_independent_groups(groups, preds, exempt={CONTROL_BACKEND})
        before = list(unit_backends)
        if min_partition_size > 1 and demote_small_groups(
            groups, unit_backends, host=host, min_nodes=min_partition_size, unit_sizes=sizes,
            exempt={CONTROL_BACKEND},
        ):
            note(before, SMALL_PARTITION)
            continue
        if min_partition_macs and not moved_costly and demote_light_islands(
            groups, unit_backends, preds, host=host, work=work, min_work=min_partition_macs, exempt={CONTROL_BACKEND},
        ):
            note(before, LIGHT_ISLAND)
            continue
        if min_partition_macs and costly and demote_costly_light_groups(
            groups, unit_backends, host=host, work=work, min_work=min_partition_macs, costly=costly,
        ):
            moved_costly = note(before, COSTLY_CALLS)
            continue
        return groups


def _unit_work(annotation: Annotation, unknown: int) -> list[int]:
    """Each unit's multiply-adds, ``unknown`` where a size is not known (a convolution over an
    image of any size is no light partition)."""
    work = []
    for unit in annotation.units:
        counts = [known_multiply_adds(annotation.infos[i].node) for i in unit.nodes]
        work.append(unknown if None in counts else sum(c for c in counts if c is not None))
    return work


__all__ = ["Placer", "Planned", "group_units", "plan"]
