"""Measured placement: where several backends can run a region, time it on each and choose.

NOTE: the unit of decision is a *region*, one partition of the default placement (first target
that supports a node), and the regions form a chain in execution order.  Each region is timed
on every backend that can run all of it - the host included, since onnxruntime runs any
standard op.  Each maximal stretch of consecutive regions that one backend can run is also
timed as a single partition on it, since one partition may fuse across the regions' borders.
The cheapest way along the chain is then found by dynamic programming: an option's time less
its backend's call overhead when it stays on the previous option's backend (their calls
merge), its full time plus :data:`CROSSING_US` when it changes backend.  Choosing region by
region instead fragments a model whose targets alternate (17 partitions for a 4-layer
transformer), every crossing costing more than the region it saves time on.

Times measured apart still add up wrong when runtimes disturb each other: an OpenMP team and
onnxruntime's spinning workers sharing two cores made a plan estimated at 3 ms run in 20 to 37.
So the estimate only proposes: it and every single-backend plan ("all the regions it can run
on B") are run end to end, partition after partition as the executable will, and the fastest
measured plan is kept (the report's "model" record shows all of them).

A region large enough is also cut into a few *chunks* (contiguous stretches of its
topological order, cut where the fewest tensors are live) so that it can end up split:

* chunks are timed *in a chain*, all chunks one after another as in the real run.  Timed
  alone, a chunk finds its weights still in cache from its previous call and looks two to
  three times faster than it is inside the model;
* the cheapest assignment of backends to chunks is found by the same dynamic programming;
* that split is then run for real, chunks on their chosen backends, and kept only when it
  beats the region's time on its chosen backend by :data:`SPLIT_MARGIN`.  Estimates miss how
  backends disturb each other (onnxruntime's worker threads spin for a while after a call,
  taking the cores from whoever runs next), so only a measured split is trusted.

Measurements are cached on disk (:class:`MeasurementCache`) by a hash of the region's ONNX and
input shapes, the backend's name, version and thread count, and the precision, so a second
compile of the same model measures nothing.  Inputs of inner regions are real intermediates:
the whole model runs once on the host on the sample inputs (given, or generated from the
declared shapes) to produce them.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np
import onnx_ir as ir

from codegraft.backend import Backend
from codegraft.plan.annotate import Annotation, check_node
from codegraft.plan.planner import group_units
from codegraft.report.report import PlacementReport
from codegraft.tune.measure import (
    ALTERNATE_ROUNDS,
    CLOSE_FRACTION,
    MeasurementCache,
    Piece,
    Timer,
    cut_piece,
    default_cache_dir,
    intermediates,
    sample_feeds,
)

if TYPE_CHECKING:
    from codegraft.core.options import CompileOptions

# Added to each change of backend on top of the new backend's call overhead: runtimes run
# back to back disturb each other (worker threads still spinning, caches), which timing
# them apart does not see.  bench/boundary.py measures 11-27 us per OpenVINO <-> onnxruntime
# crossing where the two call overheads alone are 4 and 15 us.
CROSSING_US = 10.0
# A split region must beat the best whole-region time by this fraction; see the module note.
SPLIT_MARGIN = 0.10
# Regions of at least this many nodes are also measured in chunks...
MIN_SPLIT_NODES = 12
# ...of at least this many nodes each, at most this many chunks.
MIN_CHUNK_NODES = 6
MAX_CHUNKS = 6


# --- what is measured -------------------------------------------------------------------------
@dataclass(frozen=True)
class Region:
    """Units that the default placement groups into one partition, in execution order."""

    name: str
    units: tuple[int, ...]
    candidates: tuple[str, ...]  # backends able to run every unit, in preference order


@dataclass(frozen=True)
class Decision:
    """How one region is placed: each unit's backend, and the record for the report."""

    unit_backends: Mapping[int, str]
    record: PlacementReport


# --- the entry point --------------------------------------------------------------------------
def measure_placement(
    model: ir.Model,
    annotation: Annotation,
    backends: Sequence[Backend],
    host: Backend,
    options: CompileOptions,
    *,
    cache: MeasurementCache | None = None,
) -> tuple[list[str], tuple[PlacementReport, ...]]:
    """Choose a backend for every unit of ``annotation`` by measurement.

    Returns each unit's backend (the host's name for the host) and one report record per
    region with the numbers behind the choice.  Sample inputs come from
    ``options.sample_inputs`` (the first one) or are generated from the declared shapes.
    """
    cache = cache or MeasurementCache()
    by_name: dict[str, Backend] = {b.name: b for b in backends}
    by_name[host.name] = host
    unit_backends = [unit.backend for unit in annotation.units]
    sequence = plan_regions(annotation, backends, host)
    regions = [r for r in sequence if len(r.candidates) > 1]
    if not regions:
        return unit_backends, ()
    feeds = sample_feeds(model, options)
    # Any value a region reads may become a chunk's input.
    needed = {
        value.name or ""
        for region in sequence
        for unit in region.units
        for node in annotation.units[unit].nodes
        for value in annotation.infos[node].reads
        if not value.is_initializer()
    }
    values = intermediates(model, feeds, needed, host)
    timer = Timer(by_name, values, options.precision, cache)
    # Every region is measured, fixed ones too: a stretch measured as one partition below
    # includes them, so the chain must count their time the same way.
    choices: list[list[_Option]] = [[] for _ in sequence]
    whole_us: dict[str, dict[str, float]] = {}
    excluded: dict[str, tuple[tuple[str, str], ...]] = {}
    margins: dict[str, tuple[float | None, str]] = {}
    for index, region in enumerate(sequence):
        piece, why_not = _cut(model, annotation, region.units, region.name)
        times: dict[str, float] = {}
        failed: list[tuple[str, str]] = []
        for backend in region.candidates:
            measured = timer.time_us(piece, backend) if piece else None
            if measured is None:
                failed.append((backend, why_not or (piece and timer.failure(piece, backend)) or "not timed"))
            else:
                times[backend] = measured
        excluded[region.name] = tuple(failed)
        if piece and len(sequence) == 1:  # one region: these timings decide, so close ones are re-timed
            times, margins[region.name] = _retime_close(timer, times, {b: ([piece], [b]) for b in times})
        # A region no candidate could run keeps its default placement, timed 0.
        whole_us[region.name] = times or {region.candidates[0]: 0.0}
        choices[index].extend(_Option(index + 1, b, t) for b, t in whole_us[region.name].items())
    # A backend able to run a stretch of several regions may run it better as one partition
    # (fusions across the regions' borders): each maximal stretch is measured as one option.
    for start, end, backend in _stretches(sequence):
        units = [u for r in sequence[start:end] for u in r.units]
        piece, _ = _cut(model, annotation, units, f"{sequence[start].name}..{sequence[end - 1].name}")
        measured = timer.time_us(piece, backend) if piece else None
        if measured is not None:
            choices[start].append(_Option(end, backend, measured))
    path = _cheapest_path(choices, timer.overhead_us)
    estimated = [option.backend for start, option in path for _ in range(start, option.end)]
    records = []
    assignment = estimated
    if len(sequence) > 1:  # one region: its own measurements above are the whole story
        assignment, plan_record = _verify_plan(model, annotation, sequence, estimated, timer)
        records.append(plan_record)
    for index, region in enumerate(sequence):
        backend = assignment[index]
        for unit in region.units:
            unit_backends[unit] = backend
        if len(region.candidates) == 1:
            continue
        before, after = assignment[index - 1] if index else None, assignment[index + 1 : index + 2]
        if before == backend or backend in after:
            continue  # part of a larger partition: no split of its own
        decision = decide_region(model, annotation, region, timer, whole_us[region.name], backend)
        margin, note = margins.get(region.name, (None, ""))
        decision = _with_note(decision, note) if note else decision
        record = replace(decision.record, excluded=excluded[region.name], margin=margin)
        decision = Decision(decision.unit_backends, record)
        for unit, chosen in decision.unit_backends.items():
            unit_backends[unit] = chosen
        records.append(decision.record)
    return unit_backends, tuple(records)


def _verify_plan(
    model: ir.Model, annotation: Annotation, sequence: Sequence[Region], estimated: list[str], timer: Timer
) -> tuple[list[str], PlacementReport]:
    """Run the estimated plan and every single-backend plan for real; keep the fastest.

    Regions timed apart add up to the wrong total when runtimes disturb each other (an
    OpenMP team and onnxruntime's spinning workers sharing two cores made a plan estimated
    at 3 ms run in 37), so the estimate only proposes; the measured run decides.  Each plan
    runs as the executable would: consecutive regions on one backend as one partition.
    """
    plans: dict[str, list[str]] = {"estimated best": estimated}
    for backend in dict.fromkeys(b for r in sequence for b in r.candidates):
        plan = [backend if backend in r.candidates else r.candidates[0] for r in sequence]
        if plan not in plans.values():
            plans[f"all possible on {backend}"] = plan
    measured: dict[str, float] = {}
    runs: dict[str, tuple[list[Piece], list[str]]] = {}
    failed: list[tuple[str, str]] = []
    for label, plan in plans.items():
        try:
            pieces, backends = _plan_pieces(model, annotation, sequence, plan)
        except Exception as error:  # noqa: BLE001 - a plan that cannot be cut is left out, with the reason
            failed.append((label, f"{type(error).__name__}: {error}".splitlines()[0]))
            continue
        times = timer.chain_us(pieces, backends) if len(plans) > 1 else [0.0]
        if times is None:
            why = next((w for p, b in zip(pieces, backends, strict=True) if (w := timer.failure(p, b))), "not timed")
            failed.append((label, why))
        else:
            measured[label], runs[label] = sum(times), (pieces, backends)
    if not measured:
        record = PlacementReport("model", _describe(estimated), (), "no plan could be measured", tuple(failed))
        return estimated, record
    measured, (margin, note) = _retime_close(timer, measured, runs)
    # The estimate wins ties: it is what the per-region numbers support.
    best = min(measured, key=lambda label: (measured[label], label != "estimated best"))
    chosen = plans[best]
    detail = f"{len(sequence)} regions; plan '{best}' measured fastest end to end: {_describe(chosen)}"
    if note:
        detail += f"; {note}"
    timings = tuple((k, round(v, 1)) for k, v in measured.items())
    return chosen, PlacementReport("model", _describe(chosen), timings, detail, tuple(failed), margin)


def _retime_close(
    timer: Timer, measured: Mapping[str, float], runs: Mapping[str, tuple[Sequence[Piece], Sequence[str]]]
) -> tuple[dict[str, float], tuple[float | None, str]]:
    """Re-time alternately the options within :data:`CLOSE_FRACTION` of the fastest.

    Options timed one after another see different loads on a shared machine: a choice
    between two within noise of each other flipped from run to run, landing up to 1.2x off
    the faster one.  Returns the times (re-timed ones replaced by their alternating medians)
    and (the runner-up's time over the fastest's, a note for the report).
    """
    times = dict(measured)
    if len(times) < 2:
        return times, (None, "")
    fastest = min(times.values())
    close = [label for label, t in times.items() if t <= fastest * (1 + CLOSE_FRACTION)]
    retimed = False
    if len(close) > 1:
        medians = timer.alternate_us([runs[label] for label in close])
        if medians is not None:
            times.update(zip(close, medians, strict=True))
            retimed = True
    first, second = sorted(times, key=times.__getitem__)[:2]
    margin = times[second] / times[first] if times[first] > 0 else None
    note = f"{first} {margin:.2f}x faster than {second}" if margin else ""
    if retimed and note:
        note += f" (re-timed alternately, {ALTERNATE_ROUNDS} rounds)"
    return times, (margin, note)


def _cut(model: ir.Model, annotation: Annotation, units: Sequence[int], name: str) -> tuple[Piece | None, str]:
    """The units as a standalone piece, or ``None`` and why they cannot stand alone."""
    try:
        return cut_piece(model, annotation, units, name), ""
    except Exception as error:  # noqa: BLE001 - such a region keeps its default placement, reported
        return None, f"cannot be cut as a model of its own: {type(error).__name__}: {error}".splitlines()[0]


def _plan_pieces(
    model: ir.Model, annotation: Annotation, sequence: Sequence[Region], plan: Sequence[str]
) -> tuple[list[Piece], list[str]]:
    """The partitions a plan makes (consecutive regions on one backend merged), in order."""
    pieces, backends = [], []
    for backend, group in itertools.groupby(range(len(sequence)), key=lambda i: plan[i]):
        indices = list(group)
        units = [u for i in indices for u in sequence[i].units]
        name = (
            sequence[indices[0]].name
            if len(indices) == 1
            else f"{sequence[indices[0]].name}..{sequence[indices[-1]].name}"
        )
        pieces.append(cut_piece(model, annotation, units, name))
        backends.append(backend)
    return pieces, backends


def _describe(plan: Sequence[str]) -> str:
    """``"onnxruntime: 1 region, openvino: 3 regions"``: the partitions a plan makes."""
    return ", ".join(f"{b}: {n} region{'s' if n > 1 else ''}" for b, n in _runs(plan))


@dataclass(frozen=True)
class _Option:
    """Run the regions from here up to ``end`` (exclusive) on ``backend``, in ``us``."""

    end: int
    backend: str
    us: float


def _stretches(sequence: Sequence[Region]) -> list[tuple[int, int, str]]:
    """(start, end, backend): maximal runs of two or more consecutive regions that
    ``backend`` can all run, holding at least one region with a choice."""
    found = []
    backends = dict.fromkeys(b for r in sequence for b in r.candidates)
    for backend in backends:
        start = None
        for index in range(len(sequence) + 1):
            able = index < len(sequence) and backend in sequence[index].candidates
            if able and start is None:
                start = index
            elif not able and start is not None:
                if index - start > 1 and any(len(r.candidates) > 1 for r in sequence[start:index]):
                    found.append((start, index, backend))
                start = None
    return found


def _cheapest_path(options: Sequence[Sequence[_Option]], overhead: Callable[[str], float]) -> list[tuple[int, _Option]]:
    """The cheapest way through the chain of regions, as (start, option) steps.

    An option's time includes one call of its backend; an option on the same backend as the
    one before it joins that call, so its overhead is taken out (the boundary it would have
    crossed is gone), and one on another backend pays :data:`CROSSING_US` besides.
    Dynamic programming over positions and the backend arrived on.
    """
    count = len(options)
    # best[i][b]: cheapest (cost, steps) reaching position i with the last step on b.
    best: list[dict[str, tuple[float, list[tuple[int, _Option]]]]] = [{} for _ in range(count + 1)]
    best[0][""] = (0.0, [])
    for index in range(count):
        for previous, (cost, steps) in best[index].items():
            for option in options[index]:
                if previous == option.backend:
                    step_us = max(option.us - overhead(option.backend), 0.0)
                else:
                    step_us = option.us + (CROSSING_US if previous else 0.0)
                total = cost + step_us
                known = best[option.end].get(option.backend)
                if known is None or total < known[0]:
                    best[option.end][option.backend] = (total, [*steps, (index, option)])
    return min(best[count].values(), key=lambda entry: entry[0])[1]


def _cheapest_chain(costs: Sequence[Mapping[str, float]], overhead: Callable[[str], float]) -> list[str]:
    """A backend per element of a chain (each element its own option); see :func:`_cheapest_path`."""
    options = [[_Option(i + 1, b, t) for b, t in row.items()] for i, row in enumerate(costs)]
    return [option.backend for _, option in _cheapest_path(options, overhead)]


def plan_regions(annotation: Annotation, backends: Sequence[Backend], host: Backend) -> list[Region]:
    """The partitions of the default placement, in execution order, with the backends that
    could run each whole (one candidate: nothing to choose)."""
    default = [unit.backend for unit in annotation.units]
    groups = group_units(annotation, default, host.name, [b.name for b in backends])
    order = list(dict.fromkeys([*(b.name for b in backends), host.name]))
    host_ok = _host_capable(annotation, host)
    regions = []
    for index, group in enumerate(groups):
        if group.backend == host.name:
            regions.append(Region(f"r{index}_{group.backend}", group.units, (host.name,)))
            continue  # no target claimed these nodes: nothing to choose
        able = set(order)
        for unit_index in group.units:
            unit = annotation.units[unit_index]
            if unit.composite is not None:  # a composite is its claimer's, or the host's
                able &= {unit.backend, host.name}
            for node in unit.nodes:
                able &= set(annotation.capable[node]) | ({host.name} if host_ok[node] else set())
        candidates = tuple(name for name in order if name in able) or (group.backend,)
        regions.append(Region(f"r{index}_{group.backend}", group.units, candidates))
    return regions


def find_regions(annotation: Annotation, backends: Sequence[Backend], host: Backend) -> list[Region]:
    """The regions of :func:`plan_regions` that more than one backend could run."""
    return [r for r in plan_regions(annotation, backends, host) if len(r.candidates) > 1]


def decide_region(
    model: ir.Model,
    annotation: Annotation,
    region: Region,
    timer: Timer,
    whole_us: Mapping[str, float],
    chosen: str,
) -> Decision:
    """Record the choice for ``region`` (``chosen`` by the chain over all regions) and try to
    split it between backends, keeping a split only when it measures faster."""
    size = _node_count(annotation, region.units)
    timings = tuple((b, round(t, 1)) for b, t in whole_us.items())
    fastest = min(whole_us, key=lambda b: (whole_us[b], region.candidates.index(b)))
    if fastest == chosen:
        detail = f"{size} nodes; fastest on {chosen}"
    else:
        detail = f"{size} nodes; fastest alone on {fastest}, but {chosen} saves crossings to its neighbours"
    decision = Decision(dict.fromkeys(region.units, chosen), PlacementReport(region.name, chosen, timings, detail))
    chunks = _chunks(annotation, region.units)
    if len(chunks) < 2 or len(whole_us) < 2:
        return decision
    pieces = [cut_piece(model, annotation, chunk, f"{region.name}_c{n}") for n, chunk in enumerate(chunks)]
    split = _best_split(pieces, timer, list(whole_us))
    if split is None:
        return decision
    estimate, assignment = split
    runs = _runs(assignment)
    if len(runs) < 2:
        return _with_note(decision, f"chunk times favour no split ({estimate:.0f} us estimated)")
    measured = timer.chain_us(pieces, assignment)
    if measured is None:
        return decision
    split_us = sum(measured)
    timings = (*timings, ("split", round(split_us, 1)))
    shape = ", ".join(f"{b} x{n}" for b, n in runs)
    if split_us >= (1 - SPLIT_MARGIN) * whole_us[chosen]:
        note = f"split ({shape}) measured {split_us:.0f} us, not {SPLIT_MARGIN:.0%} faster"
        return _with_note(Decision(decision.unit_backends, replace(decision.record, timings_us=timings)), note)
    units = {unit: b for chunk, b in zip(chunks, assignment, strict=True) for unit in chunk}
    detail = (
        f"{size} nodes split in {len(chunks)} chunks ({shape}): measured {split_us:.0f} us "
        f"against {whole_us[chosen]:.0f} us whole on {chosen}"
    )
    return Decision(units, PlacementReport(region.name, "+".join(b for b, _ in runs), timings, detail))


def _with_note(decision: Decision, note: str) -> Decision:
    return Decision(decision.unit_backends, replace(decision.record, detail=f"{decision.record.detail}; {note}"))


def _best_split(pieces: Sequence[Piece], timer: Timer, candidates: list[str]) -> tuple[float, list[str]] | None:
    """Cheapest backend per chunk of one region: :func:`_cheapest_chain` on in-chain times."""
    per_backend: dict[str, list[float]] = {}
    for backend in candidates:
        times = timer.chain_us(pieces, [backend] * len(pieces))
        if times is not None:
            per_backend[backend] = times
    if len(per_backend) < 2:
        return None
    costs = [{b: times[i] for b, times in per_backend.items()} for i in range(len(pieces))]
    assignment = _cheapest_chain(costs, timer.overhead_us)
    estimate = 0.0
    for index, backend in enumerate(assignment):
        same = index > 0 and assignment[index - 1] == backend
        estimate += max(costs[index][backend] - timer.overhead_us(backend), 0.0) if same else costs[index][backend]
    return estimate, assignment


# --- regions as standalone models -------------------------------------------------------------
def _chunks(annotation: Annotation, units: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Contiguous stretches of ``units`` cut where the fewest tensors are live."""
    sizes = [len(annotation.units[u].nodes) for u in units]
    total = sum(sizes)
    if total < MIN_SPLIT_NODES:
        return [units]
    count = min(MAX_CHUNKS, total // MIN_CHUNK_NODES)
    live = _live_at_cuts(annotation, units)
    starts = np.cumsum([0, *sizes])  # node count before each unit
    cuts: list[int] = []
    for k in range(1, count):
        target = total * k / count
        window = total / count / 3  # move a cut at most a third of a chunk to find a narrow spot
        lo = max(cuts[-1] + 1 if cuts else 1, int(np.searchsorted(starts, target - window)))
        hi = min(len(units) - 1, int(np.searchsorted(starts, target + window)))
        if lo > hi:
            continue
        cuts.append(min(range(lo, hi + 1), key=lambda p: (live[p], abs(starts[p] - target))))
    bounds = [0, *cuts, len(units)]
    return [units[a:b] for a, b in itertools.pairwise(bounds) if b > a]


def _live_at_cuts(annotation: Annotation, units: tuple[int, ...]) -> list[int]:
    """For each position p, how many values made before unit p are read at or after it."""
    position = {u: p for p, u in enumerate(units)}
    made_at: dict[ir.Value, int] = {}
    for p, u in enumerate(units):
        for i in annotation.units[u].nodes:
            for value in annotation.infos[i].node.outputs:
                made_at[value] = p
    delta = [0] * (len(units) + 1)
    last_read: dict[ir.Value, int] = {}
    for u in units:
        for i in annotation.units[u].nodes:
            for value in annotation.infos[i].reads:
                if value in made_at:
                    last_read[value] = max(last_read.get(value, -1), position[u])
    for value, last in last_read.items():
        first = made_at[value] + 1
        if last >= first:
            delta[first] += 1
            delta[last + 1] -= 1
    live = list(np.cumsum(delta[:-1]))
    return [int(v) for v in live]


def _runs(assignment: Sequence[str]) -> list[tuple[str, int]]:
    """Run-length encoding: ["a", "a", "b"] -> [("a", 2), ("b", 1)]."""
    runs: list[tuple[str, int]] = []
    for backend in assignment:
        if runs and runs[-1][0] == backend:
            runs[-1] = (backend, runs[-1][1] + 1)
        else:
            runs.append((backend, 1))
    return runs


def _node_count(annotation: Annotation, units: Sequence[int]) -> int:
    return sum(len(annotation.units[u].nodes) for u in units)


def _host_capable(annotation: Annotation, host: Backend) -> list[bool]:
    return [not info.has_subgraphs and bool(check_node(host, info.node)) for info in annotation.infos]


__all__ = ["MeasurementCache", "Region", "default_cache_dir", "find_regions", "measure_placement", "plan_regions"]
