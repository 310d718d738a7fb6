"""The report: which node went where, and why not elsewhere.

It is plain data (frozen dataclasses), stored in the artifact as JSON and rendered as tables.
"""

from __future__ import annotations

import io
import json
from collections import Counter
from dataclasses import dataclass, field, fields, is_dataclass
from json.encoder import encode_basestring_ascii as _quote
from typing import TYPE_CHECKING

from codegraft.core.gcpause import without_gc

if TYPE_CHECKING:
    from rich.table import Table


@dataclass(frozen=True)
class NodeReport:
    """One node: where it runs, its composite if any, and each other target's reason."""

    name: str
    op_type: str
    backend: str
    partition: str
    composite: str | None = None
    declined: tuple[tuple[str, str], ...] = ()  # (backend, reason)


@dataclass(frozen=True)
class PartitionReport:
    """One partition: its backend, size, edges, and any fallback that happened to it."""

    name: str
    backend: str
    nodes: int
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    requested_backend: str | None = None  # set when the partition fell back to the host
    fallback_error: str | None = None
    deferred: bool = False  # compiled at run time, once per input shape
    unused: bool = False  # no output is read by anything: not compiled, not run
    bodies: str = ""  # for control flow run by codegraft: where each body's nodes went
    loop_choices: str = ""  # each Loop's plan at each input shapes seen, " | " between (runtime.loop_choice)
    stored_bytes: int = 0  # size of its blob in the artifact (weights included)
    conversion_note: str = ""  # what layout and precision conversion (and its self-check) did


@dataclass(frozen=True)
class PassReport:
    """What one optimisation or conversion pass changed."""

    name: str
    nodes_before: int
    nodes_after: int
    detail: str = ""


@dataclass(frozen=True)
class PlacementReport:
    """One measured-placement decision with the numbers behind it."""

    region: str
    chosen: str
    timings_us: tuple[tuple[str, float], ...]
    detail: str = ""
    excluded: tuple[tuple[str, str], ...] = ()  # (candidate, why it could not be timed): left out of the choice
    margin: float | None = None  # the runner-up's time over the chosen one's, after re-timing close candidates


@dataclass(frozen=True)
class StageReport:
    """Wall-clock seconds of one stage (import, passes, annotate, partition, lower, ...)."""

    name: str
    seconds: float


@dataclass(frozen=True)
class Report:
    """Everything codegraft decided for one compile.  ``str(report)`` is a readable table."""

    targets: tuple[str, ...]
    host: str
    nodes: tuple[NodeReport, ...]
    partitions: tuple[PartitionReport, ...]
    passes: tuple[PassReport, ...] = ()
    placements: tuple[PlacementReport, ...] = ()
    notes: tuple[str, ...] = field(default=())
    stages: tuple[StageReport, ...] = ()

    # -- summaries -------------------------------------------------------------------------
    def nodes_per_backend(self) -> dict[str, int]:
        return dict(Counter(n.backend for n in self.nodes))

    def composites_per_backend(self) -> dict[str, int]:
        """Fused groups (pattern matches claimed whole) per backend."""
        instances = {(n.backend, n.composite) for n in self.nodes if n.composite}
        return dict(Counter(backend for backend, _ in instances))

    def partitions_per_backend(self) -> dict[str, int]:
        return dict(Counter(p.backend for p in self.partitions))

    def fallbacks(self) -> list[PartitionReport]:
        return [p for p in self.partitions if p.fallback_error]

    def decline_reasons(self) -> list[tuple[str, str, str, int]]:
        """(backend, op_type, reason, count) for every decline, most frequent first."""
        counts = Counter((b, n.op_type, r) for n in self.nodes for b, r in n.declined)
        return [(b, op, r, c) for (b, op, r), c in counts.most_common()]

    # -- serialisation ---------------------------------------------------------------------
    def to_json(self) -> str:
        """The report as JSON (the text ``json.dumps(dataclasses.asdict(report), indent=1)`` gives)."""
        return _json_text(self)

    @staticmethod
    def from_json(text: str) -> Report:
        data = json.loads(text)
        return Report(
            targets=tuple(data["targets"]),
            host=data["host"],
            nodes=tuple(
                NodeReport(**{**n, "declined": tuple(tuple(d) for d in n["declined"])}) for n in data["nodes"]
            ),
            partitions=tuple(
                PartitionReport(**{**p, "inputs": tuple(p["inputs"]), "outputs": tuple(p["outputs"])})
                for p in data["partitions"]
            ),
            passes=tuple(PassReport(**p) for p in data.get("passes", ())),
            placements=tuple(
                PlacementReport(
                    **{
                        **p,
                        "timings_us": tuple(tuple(t) for t in p["timings_us"]),
                        "excluded": tuple(tuple(e) for e in p.get("excluded", ())),
                    }
                )
                for p in data.get("placements", ())
            ),
            notes=tuple(data.get("notes", ())),
            stages=tuple(StageReport(**s) for s in data.get("stages", ())),
        )

    # -- rendering -------------------------------------------------------------------------
    def __str__(self) -> str:
        return self.render()

    def render(self, *, details: bool = False, width: int = 120) -> str:
        """The report as text tables: summary, partitions, declines (and every node with
        ``details``)."""
        from rich.console import Console

        # markup=False: names and reasons such as float32[batch, 3] are text, not rich markup.
        console = Console(width=width, record=True, file=io.StringIO(), color_system=None, markup=False)
        for table in self.tables(details=details):
            console.print(table)
        return console.export_text()

    def tables(self, *, details: bool = False) -> list[object]:
        """rich renderables for the CLI; see :meth:`render`."""
        per_backend_nodes = self.nodes_per_backend()
        per_backend_parts = self.partitions_per_backend()
        title = (
            f"codegraft: {len(self.nodes)} nodes, {len(self.partitions)} partitions "
            f"(targets: {', '.join(self.targets) or 'none'}; host: {self.host})"
        )
        composites = self.composites_per_backend()
        summary = _table(title, "backend", "nodes", "share", "partitions", "composites", "stored")
        total = max(len(self.nodes), 1)
        stored = Counter()  # type: Counter[str]
        for part in self.partitions:
            stored[part.backend] += part.stored_bytes
        for backend in sorted(per_backend_nodes, key=lambda b: -per_backend_nodes[b]):
            summary.add_row(backend, str(per_backend_nodes[backend]),
                            f"{100 * per_backend_nodes[backend] / total:.0f}%", str(per_backend_parts.get(backend, 0)),
                            str(composites.get(backend, "")),
                            f"{stored[backend] / 1e6:.2f} MB" if stored[backend] else "")
        tables: list[object] = [summary]

        parts = _table("partitions (execution order)", "partition", "backend", "nodes", "inputs", "outputs", "note")
        for p in self.partitions:
            note = ""
            if p.fallback_error:
                note = f"fell back from {p.requested_backend}: {p.fallback_error}"
            elif p.deferred:
                note = "compiled per input shape at run time"
            elif p.unused:
                note = "outputs unused: not run"
            elif p.bodies:
                note = f"bodies partitioned: {p.bodies}"
            if p.conversion_note:
                note = f"{note}; {p.conversion_note}" if note else p.conversion_note
            if p.loop_choices:
                note = f"{note}; chosen: {p.loop_choices}" if note else f"chosen: {p.loop_choices}"
            parts.add_row(p.name, p.backend, str(p.nodes), str(len(p.inputs)), str(len(p.outputs)), note)
        tables.append(parts)

        reasons = self.decline_reasons()
        if reasons:
            why = _table("why not: declines by target", "target", "op", "reason", "nodes")
            for backend, op, reason, count in reasons:
                why.add_row(backend, op, reason, str(count))
            tables.append(why)
        if self.passes:
            passes = _table("passes", "pass", "nodes before", "nodes after", "detail")
            for record in self.passes:
                passes.add_row(record.name, str(record.nodes_before), str(record.nodes_after), record.detail)
            tables.append(passes)
        if self.placements:
            placed = _table("measured placement", "region", "chosen", "timings (us)", "detail")
            for d in self.placements:
                detail = "; ".join([d.detail, *(f"{b} not timed: {why}" for b, why in d.excluded)])
                placed.add_row(d.region, d.chosen, ", ".join(f"{b}: {t:.1f}" for b, t in d.timings_us), detail)
            tables.append(placed)
        if self.stages:
            total_seconds = sum(s.seconds for s in self.stages) or 1.0
            stages = _table("time per stage", "stage", "seconds", "share")
            for stage in self.stages:
                stages.add_row(stage.name, f"{stage.seconds:.2f}", f"{100 * stage.seconds / total_seconds:.0f}%")
            tables.append(stages)
        if self.notes:
            notes = _table("notes", "note")
            for note in self.notes:
                notes.add_row(note)
            tables.append(notes)
        if details:
            nodes = _table("nodes", "node", "op", "backend", "partition", "composite", "declined by")
            for n in self.nodes:
                nodes.add_row(n.name, n.op_type, n.backend, n.partition, n.composite or "",
                              "; ".join(f"{b}: {r}" for b, r in n.declined))
            tables.append(nodes)
        return tables


@without_gc
def _json_text(value: object) -> str:
    """``json.dumps(asdict(value), indent=1)``, written directly.

    NOTE: json's C encoder does not indent, and its Python one with ``asdict`` before it took
    2 s for a 100k-node report (most of an ``inspect --json`` once the passes got fast).
    This writes the same text in a quarter of the time: dataclass fields in order, tuples as
    lists (a repeated tuple, such as a ``declined`` entry, is written once), strings through
    the C quoting ``json.dumps`` uses; anything else through ``json.dumps`` itself.
    """
    written: dict[tuple[object, int], str] = {}

    def text(value: object, depth: int) -> str:
        if value.__class__ is str:
            return _quote(value)
        if value is None:
            return "null"
        cls = value.__class__
        pad = "\n" + " " * (depth + 1)
        heads = _HEADS.get((cls, depth))  # a dataclass written before at this depth
        if heads is not None:
            if not heads:
                return "{}"
            members = []
            for name, head in heads:  # (the common leaves written here: one call per field less)
                member = getattr(value, name)
                kind = member.__class__
                if kind is str:
                    members.append(head + _quote(member))
                elif member is None:
                    members.append(head + "null")
                elif kind is int:
                    members.append(head + int.__repr__(member))
                else:
                    members.append(head + text(member, depth + 1))
            return "{" + ",".join(members) + "\n" + " " * depth + "}"
        if isinstance(value, list | tuple):
            if not value:
                return "[]"
            key = (value, depth) if value.__class__ is tuple else None
            done = written.get(key) if key is not None else None
            if done is None:
                done = "[" + pad + ("," + pad).join([text(v, depth + 1) for v in value]) + "\n" + " " * depth + "]"
                if key is not None:
                    written[key] = done
            return done
        if is_dataclass(value) and not isinstance(value, type):
            names = _field_names(cls)
            _HEADS[cls, depth] = tuple((name, f"{pad}{_quote(name)}: ") for name in names)
            items = [(name, getattr(value, name)) for name in names]
        elif isinstance(value, dict) and all(isinstance(k, str) for k in value):
            items = list(value.items())
        else:  # numbers, booleans, anything else: json's own text, indented to this depth
            return json.dumps(value, indent=1).replace("\n", "\n" + " " * depth)
        if not items:
            return "{}"
        members = [f"{_quote(k)}: {text(v, depth + 1)}" for k, v in items]
        return "{" + pad + ("," + pad).join(members) + "\n" + " " * depth + "}"

    return text(value, 0)


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}
# (dataclass, depth) -> (field name, the text before its value) per field, in order
_HEADS: dict[tuple[type, int], tuple[tuple[str, str], ...]] = {}


def _field_names(cls: type) -> tuple[str, ...]:
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in fields(cls))
    return names


def _table(title: str, *columns: str) -> Table:
    """A rich table with these column headers."""
    from rich.table import Table

    table = Table(title=title)
    for column in columns:
        table.add_column(column)
    return table
