"""Annotation: which backend takes each node, and why every other target declined it.

Targets are asked in the user's order of preference.  For each target, its composite
patterns claim whole groups first, then single nodes it supports; a node claimed by an earlier
target is not offered to a later one, but every target is still asked so the report can say
why each declined.  A pattern match is claimed only if the target's ``supports`` accepts each
of its members.  Each target declines a node at most once: a node refused by ``supports``
and by a pattern gets one decline carrying both reasons.  Whatever no target claims goes to
the host.  Nodes with subgraphs (If, Loop, Scan) always run on the host with their bodies.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import onnx_ir as ir

from codegraft.backend import Backend, Capture, Composite, Support, backend_patterns
from codegraft.core.dtypes import dtype_name
from codegraft.core.gcpause import without_gc
from codegraft.core.graphinfo import RANDOM_OPS, NodeInfo, node_infos

if TYPE_CHECKING:
    from codegraft.patterns import Match

CONTROL_FLOW_REASON = "control flow runs on the host with its bodies"
# Arithmetic on host-computed scalars (scales, bounds, counts: one element, so activations,
# however small, never cascade back) goes back to the host when what it makes is this small:
# the host computes it in well under a microsecond, a crossing to a target costs tens.
SCALAR_ELEMENTS = 1
SMALL_VALUE_ELEMENTS = 4096
# what such arithmetic makes: floats, and the bools of comparing scalars (Silero's sr == 16000)
_SMALL_RESULTS = frozenset({ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16, ir.DataType.DOUBLE,
                            ir.DataType.BOOL})  # fmt: skip
QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"})
# what shape arithmetic makes (sizes, indices, axes)
_SHAPE_VALUES = frozenset({ir.DataType.INT64, ir.DataType.INT32})


@dataclass(frozen=True)
class NodeDecline:
    """A target's reason for not taking a node (the report's "declined" column).

    Not to be confused with :class:`codegraft.patterns.Decline`, a composite rule's reason for
    not taking a structural match.
    """

    backend: str
    reason: str


@dataclass(frozen=True)
class Unit:
    """What the partitioner places: one node, or a composite claimed whole."""

    nodes: tuple[int, ...]
    backend: str
    composite: Composite | None = None


@dataclass(frozen=True)
class Annotation:
    """The annotated graph: nodes, their units, and every decline."""

    infos: tuple[NodeInfo, ...]
    units: tuple[Unit, ...]
    unit_of_node: tuple[int, ...]
    declines: tuple[tuple[NodeDecline, ...], ...]  # per node
    capable: tuple[tuple[str, ...], ...]  # per node: targets that accept it alone, in order

    @without_gc
    def unit_predecessors(self) -> list[list[int]]:
        """For each unit, the units producing the values it reads."""
        producer_unit: dict[ir.Value, int] = {}
        for index, info in enumerate(self.infos):
            for value in info.node.outputs:
                producer_unit[value] = self.unit_of_node[index]
        preds: list[list[int]] = [[] for _ in self.units]
        for index, info in enumerate(self.infos):
            unit = self.unit_of_node[index]
            for value in info.reads:
                pred = producer_unit.get(value)
                if pred is not None and pred != unit:
                    preds[unit].append(pred)
        return preds


def check_node(backend: Backend, node: ir.Node) -> Support:
    """Ask ``backend`` about ``node``: declared dtypes first, then its own ``supports``."""
    if node.op_type in QDQ_OPS and "int8" not in backend.capabilities.precisions:
        return Support.no(f"{node.op_type}: int8 not declared by {backend.name}")
    allowed = backend.capabilities.dtypes
    if allowed is not None:
        for role, values in (("input", node.inputs), ("output", node.outputs)):
            for value in values:
                if value is None:
                    continue
                name = dtype_name(value.dtype)
                if name not in allowed:
                    return Support.no(
                        f"{node.op_type}: {role} value '{value.name}' is {name}, not in {backend.name}'s "
                        f"declared dtypes ({', '.join(sorted(allowed))})"
                    )
    try:
        verdict = backend.supports(node)
    except Exception as error:  # a vendor's bug must not take the compile down
        return Support.no(f"supports() raised {type(error).__name__}: {error}")
    if isinstance(verdict, bool):  # tolerate a plain bool from a hurried vendor
        return Support.yes() if verdict else Support.no("declined")
    return verdict


@without_gc
def annotate(
    graph: ir.Graph, targets: Sequence[Backend], *, host: str, progress: Callable[[int], None] | None = None
) -> Annotation:
    """Decide a backend for each top-level node of ``graph``; see the module docstring.

    ``progress(done)`` hears how many of the ``len(graph) * len(targets)`` questions are answered.
    """
    infos = node_infos(graph)
    index_of = {info.node: i for i, info in enumerate(infos)}
    count = len(infos)
    claimed: list[str | None] = [None] * count
    composite_of: list[Composite | None] = [None] * count
    declines: list[list[NodeDecline]] = [[] for _ in range(count)]
    capable: list[list[str]] = [[] for _ in range(count)]

    for i, info in enumerate(infos):
        if info.has_subgraphs:
            claimed[i] = host
            declines[i] = [NodeDecline(t.name, CONTROL_FLOW_REASON) for t in targets]

    composite_members: dict[str, tuple[int, ...]] = {}
    for asked, target in enumerate(targets):
        # A backend may answer support questions better with the whole graph at hand
        # (OpenVINO asks its plugin once for the whole model): let it look first.
        prepare = getattr(target, "prepare", None)
        if callable(prepare):
            prepare(graph)
        verdict_of = _CachedCheck(target)
        pattern_reasons: list[list[str]] = [[] for _ in range(count)]
        composite_members.update(
            _claim_composites(graph, target, index_of, claimed, composite_of, pattern_reasons, verdict_of)
        )
        for i, info in enumerate(infos):
            if info.has_subgraphs:
                continue
            if composite_of[i] is not None and claimed[i] == target.name:
                capable[i].append(target.name)
                continue
            verdict = verdict_of(info.node)
            reasons = pattern_reasons[i]
            if verdict.ok:
                capable[i].append(target.name)
                if claimed[i] is None:
                    claimed[i] = target.name
            else:
                # the member decline a pattern met on this very node repeats this reason
                reasons = [verdict.reason, *(r for r in reasons if verdict.reason not in r)]
            if reasons:
                declines[i].append(NodeDecline(target.name, "; ".join(reasons)))
            if progress is not None:
                progress(asked * count + i + 1)

    quantized_members = _keep_quantized_units_whole(graph, index_of, claimed, composite_of, capable, declines, host)
    _leave_small_arithmetic_to_the_host(infos, index_of, claimed, composite_of, quantized_members, declines, host)
    _shape_arithmetic_follows_its_users(infos, index_of, claimed, composite_of, quantized_members, capable, declines,
                                        host)

    units: list[Unit] = []
    unit_of_node = [-1] * count
    seen_composites: dict[str, int] = {}
    for i in range(count):
        backend = claimed[i] or host
        composite = composite_of[i]
        if composite is not None:
            if composite.instance not in seen_composites:
                seen_composites[composite.instance] = len(units)
                units.append(Unit(composite_members[composite.instance], backend, composite))
            unit_of_node[i] = seen_composites[composite.instance]
        elif i in quantized_members:
            members = quantized_members[i]
            if unit_of_node[members[0]] < 0:
                for member in members:
                    unit_of_node[member] = len(units)
                units.append(Unit(members, backend))
        else:
            unit_of_node[i] = len(units)
            units.append(Unit((i,), backend))
    return Annotation(
        tuple(infos),
        tuple(units),
        tuple(unit_of_node),
        tuple(tuple(d) for d in declines),
        tuple(tuple(c) for c in capable),
    )


class _CachedCheck:
    """``check_node`` for one target, asked once per node (the matcher asks members again)."""

    def __init__(self, target: Backend) -> None:
        self.target = target
        self.verdicts: dict[ir.Node, Support] = {}

    def __call__(self, node: ir.Node) -> Support:
        if node not in self.verdicts:
            self.verdicts[node] = check_node(self.target, node)
        return self.verdicts[node]


def _claim_composites(
    graph: ir.Graph,
    target: Backend,
    index_of: dict[ir.Node, int],
    claimed: list[str | None],
    composite_of: list[Composite | None],
    pattern_reasons: list[list[str]],
    member_check: Callable[[ir.Node], Support],
) -> dict[str, tuple[int, ...]]:
    """Claim ``target``'s pattern matches; returns each composite's member node indices.

    Why a pattern did not take a node goes to ``pattern_reasons`` (per node)."""
    members_of: dict[str, tuple[int, ...]] = {}
    rules = backend_patterns(target)
    if not rules:
        return members_of
    from codegraft.patterns import find_composites

    excluded = [node for node, i in index_of.items() if claimed[i] is not None]
    result = find_composites(graph, rules, excluded=excluded, member_check=member_check)
    for node, i in index_of.items():
        pattern_reasons[i].extend(result.reasons(node))
    for number, match in enumerate(result.matches):
        members = [index_of[node] for node in match.nodes if node in index_of]
        if len(members) != len(match.nodes) or any(claimed[i] is not None for i in members):
            continue  # a match inside a body, or one overlapping an earlier claim
        instance = f"{target.name}.{match.rule}_{number}"
        composite = Composite(match.rule, instance, tuple(n.name or "" for n in match.nodes), _captures(match))
        members_of[instance] = tuple(sorted(members))
        for i in members:
            claimed[i] = target.name
            composite_of[i] = composite
    return members_of


def _captures(match: Match) -> tuple[Capture, ...]:
    """A match's named captures, by the names of the nodes and values they bind."""
    captures = []
    for name, item in sorted(match.captures.items()):
        if isinstance(item, ir.Node):
            captures.append(Capture(name, "node", item.name or ""))
        elif item.name:
            captures.append(Capture(name, "value", item.name))
    return tuple(captures)


def _keep_quantized_units_whole(
    graph: ir.Graph,
    index_of: dict[ir.Node, int],
    claimed: list[str | None],
    composite_of: list[Composite | None],
    capable: list[list[str]],
    declines: list[list[NodeDecline]],
    host: str,
) -> dict[int, tuple[int, ...]]:
    """DequantizeLinear -> op -> QuantizeLinear units are placed whole: on the one backend that
    claimed all their nodes, else on the first target (in the user's order) that accepts every
    one of them, else on the host.  Returns node index -> the unit's members.

    (A target earlier in the order that takes a unit's op but not its quantizers, as `c` takes
    a QDQ model's convolutions, no longer sends the unit to the host past a later target that
    declares int8 and takes all of it.)
    """
    if not any(node.op_type == "QuantizeLinear" for node in index_of):
        return {}
    from codegraft.patterns import quantized_units

    members_of: dict[int, tuple[int, ...]] = {}
    for nodes in quantized_units(graph):
        members = tuple(sorted(index_of[n] for n in nodes if n in index_of))
        if len(members) != len(nodes) or any(composite_of[i] is not None for i in members):
            continue  # inside a body, or already whole inside a composite
        owners = {claimed[i] for i in members}
        if len(owners) != 1 or None in owners:
            whole = [t for t in capable[members[0]] if all(t in capable[i] for i in members)]
            for i in members:
                if claimed[i] not in (None, host, *whole[:1]):
                    declines[i].append(NodeDecline(str(claimed[i]), "quantized unit is not supported whole"))
                claimed[i] = whole[0] if whole else host
        for i in members:
            members_of[i] = members
    return members_of


def _leave_small_arithmetic_to_the_host(
    infos: Sequence[NodeInfo],
    index_of: dict[ir.Node, int],
    claimed: list[str | None],
    composite_of: list[Composite | None],
    quantized_members: dict[int, tuple[int, ...]],
    declines: list[list[NodeDecline]],
    host: str,
) -> None:
    """Arithmetic on scalars the host computed stays on the host.

    A dynamically quantized model computes each layer's scales on the host
    (``DynamicQuantizeLinear``, then ``Mul``/``Div`` by the weight's scales, ``Floor``,
    ``Cast``); a target taking the ``Mul`` and ``Div`` cut ddddocr's int8 model into 88
    partitions, each crossing dearer than the arithmetic.  As onnxruntime keeps such nodes on
    the CPU (its "CPU-preferred nodes"), a target's node goes back to the host when each value
    it computes on is a scalar (:data:`SCALAR_ELEMENTS`) that a host node computed, whatever
    constants it combines them with, and each of its outputs is float (or the bool of a
    comparison) with at most :data:`SMALL_VALUE_ELEMENTS` elements.  That never adds a
    crossing: its inputs are on the host already.  Graph order being topological, a chain of
    them goes back whole, and only scalars carry it on: a small activation after a host op
    must not send the rest of a small model back, and a graph input is the user's data, not
    such arithmetic.  A scalar a target's own node computed (``ReduceMax(x) - 80``) stays
    with it.
    """
    if all(c not in (None, host) for c in claimed):  # nothing on the host computes anything
        return
    for i, info in enumerate(infos):
        target = claimed[i]
        if target in (None, host) or composite_of[i] is not None or i in quantized_members:
            continue
        # inputs first: nearly every node reads an activation larger than a scalar
        computed = [v for v in info.reads if v.const_value is None]
        if not computed or not all(_elements(v) <= SCALAR_ELEMENTS and _from_host(v, index_of, claimed, host)
                                   for v in computed):  # fmt: skip
            continue
        node = info.node
        outputs = [v for v in node.outputs if v is not None]
        if not outputs or not all(v.dtype in _SMALL_RESULTS and _elements(v) <= SMALL_VALUE_ELEMENTS for v in outputs):
            continue
        claimed[i] = host
        declines[i].append(NodeDecline(
            str(target), f"{node.op_type}: arithmetic on host-computed scalars stays on the host "
            "(a crossing costs more)",
        ))  # fmt: skip


def _shape_arithmetic_follows_its_users(
    infos: Sequence[NodeInfo],
    index_of: dict[ir.Node, int],
    claimed: list[str | None],
    composite_of: list[Composite | None],
    quantized_members: dict[int, tuple[int, ...]],
    capable: list[list[str]],
    declines: list[list[NodeDecline]],
    host: str,
) -> None:
    """Integer arithmetic on shapes, and what is computed from constants alone, goes to the
    backend of the nodes that use it.

    A target earlier in the user's order may take ``Shape -> Gather -> Concat`` feeding a later
    target's ``Reshape``: a partition of its own computing a few integers, two crossings,
    between the later target's partitions (platerec's float16 decoder: `c`, which computes no
    float16, took its shape arithmetic and cut OpenVINO's layers into 17 partitions).  Walking
    from the graph's end (so a chain follows its last user), a target's node whose outputs are
    all small integers (:data:`SMALL_VALUE_ELEMENTS`) and whose users all run on one other
    backend that accepts it (the host accepts everything) moves there, when each value it
    reads is small, a graph input or made on that backend: a ``Shape`` of another target's
    activation stays, the activation is not carried across for its shape.

    A node computing from constants only (no input of the model's reaches it) moves so too,
    whatever it makes: where it stood it handed its result across every call (a MiniLM's int8
    word embeddings dequantized by ``Cast`` and ``Mul`` on `c`, 47 MB to the host's ``Gather``
    each call, 9 ms of 15), where its users are it is folded once.
    """
    from_constants = _computed_from_constants(infos, index_of)
    for i in range(len(infos) - 1, -1, -1):
        target = claimed[i]
        if target in (None, host) or composite_of[i] is not None or i in quantized_members:
            continue
        node = infos[i].node
        outputs = [v for v in node.outputs if v is not None]
        shape_values = all(v.dtype in _SHAPE_VALUES and _elements(v) <= SMALL_VALUE_ELEMENTS for v in outputs)
        if not outputs or not (shape_values or from_constants[i]):
            continue
        users: set[str | None] = set()
        for value in outputs:
            if value.is_graph_output():
                users.add(None)
            for user, _ in value.uses():
                j = index_of.get(user)
                users.add(None if j is None else claimed[j] or host)  # None: a subgraph's user
        destination = users.pop() if len(users) == 1 else None
        if destination is None or destination == target or (destination != host and destination not in capable[i]):
            continue
        if not from_constants[i] and not all(
            _small_or_made_on(v, destination, index_of, claimed, host) for v in infos[i].reads
        ):
            continue
        claimed[i] = destination
        # (the users' backend is not named: planning may still move them, to the host say, and
        # the node with them; the scout's fingerprint model read "goes with the openvino nodes"
        # for nodes that all ran on the host)
        if shape_values:
            why = "shape arithmetic goes with the nodes using it, where they run (a partition of its own costs " \
                "two crossings)"
        else:
            why = "computed from constants only, it goes with the nodes using it, where they run (folded there once, " \
                "not handed across every call)"
        declines[i].append(NodeDecline(str(target), f"{node.op_type}: {why}"))


def _computed_from_constants(infos: Sequence[NodeInfo], index_of: dict[ir.Node, int]) -> list[bool]:
    """Per node: whether every value it reads is a constant or made by such a node (graph order)."""
    result = [False] * len(infos)
    for i, info in enumerate(infos):
        node = info.node
        if info.has_subgraphs or node.domain not in ("", "ai.onnx") or node.op_type in RANDOM_OPS:
            continue
        ok = bool(info.reads)
        for value in info.reads:
            if value.const_value is not None and not value.is_graph_input():
                continue
            producer = value.producer()
            index = index_of.get(producer) if producer is not None else None
            if index is None or not result[index]:
                ok = False
                break
        result[i] = ok or (node.op_type == "Constant" and not node.inputs)
    return result


def _small_or_made_on(
    value: ir.Value, backend: str, index_of: dict[ir.Node, int], claimed: list[str | None], host: str
) -> bool:
    if value.const_value is not None or _elements(value) <= SMALL_VALUE_ELEMENTS:
        return True
    producer = value.producer()
    if producer is None:  # a graph input
        return True
    index = index_of.get(producer)
    return index is not None and (claimed[index] or host) == backend


def _elements(value: ir.Value) -> int:
    """Elements of a value of static shape; a large number when unknown."""
    dims = [d for d in value.shape if isinstance(d, int)] if value.shape is not None else []
    if value.shape is None or len(dims) != len(value.shape):
        return 1 << 62
    return math.prod(dims)


def _from_host(value: ir.Value, index_of: dict[ir.Node, int], claimed: list[str | None], host: str) -> bool:
    producer = value.producer()
    if producer is None:  # a graph input: the user's data (a tabular model's 10 features), not arithmetic
        return False
    index = index_of.get(producer)
    return index is not None and claimed[index] in (None, host)
