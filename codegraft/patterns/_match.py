"""The matcher: where do a backend's composite rules match, and why did they not.

NOTE: matching is anchored.  For each rule we only try the nodes whose op type can produce
the pattern's first output (an index by op type, built once), and match top-down through
their inputs with backtracking (alternatives, optional links, swapped commutative inputs).
A fixed pattern explores a bounded number of bindings per anchor, so a fixed rule set costs
time linear in the graph.  Bindings live in small copy-on-write maps owned by the search,
never on the pattern.

Roots are tried consumers first (reverse graph order): the match rooted at a Relu that
swallows its Conv is seen before the bare Conv could claim the Conv alone, so fused groups
come out as large as the pattern allows.  Results are reported in graph order.

A structural match is rejected (and reported as a :class:`Decline`) when a value computed
inside it, other than a pattern output, is used outside it or is a graph output, when it is
not convex (a path leaves it and comes back: one partition could not hold it without a
cycle), or when the pattern's or the rule's check says no.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np
import onnx_ir as ir

from codegraft.core.support import Support
from codegraft.patterns._pattern import (
    CompositeRule,
    Const,
    Either,
    OpOutput,
    OpPattern,
    Pattern,
    ValuePattern,
    Var,
    attribute_default,
    root_op_types,
)

Captured = ir.Value | ir.Node
# Asked about every member of a structural match: the backend's own per-node answer.
MemberCheck = Callable[[ir.Node], Support]


@dataclass(frozen=True, eq=False)  # identity: hashable though captures is a mapping
class Match:
    """One place where a rule matched: its nodes (graph order), captures and outputs.

    Example: ``Match(rule="conv_bias_act", nodes=(conv, bn, relu), captures={"x": ..., "conv": conv}, ...)``.
    """

    rule: str
    nodes: tuple[ir.Node, ...]
    captures: Mapping[str, Captured]
    outputs: tuple[ir.Value, ...] = ()

    @property
    def inputs(self) -> tuple[ir.Value, ...]:
        """Values the match reads but does not compute, in first-use order."""
        inside = {v for n in self.nodes for v in n.outputs}
        seen: dict[ir.Value, None] = {}
        for n in self.nodes:
            for v in n.inputs:
                if v is not None and v not in inside:
                    seen.setdefault(v, None)
        return tuple(seen)


@dataclass(frozen=True)
class Decline:
    """A structural match a rule did not take, and why (shown in the report).

    Example: ``Decline("conv_bias_relu", (conv, add, relu), "bias is not 1-D").message``
    is ``"pattern conv_bias_relu: bias is not 1-D"``.
    """

    rule: str
    nodes: tuple[ir.Node, ...]
    reason: str

    @property
    def message(self) -> str:
        return f"pattern {self.rule}: {self.reason}"


@dataclass(frozen=True)
class MatchResult:
    """Accepted matches (rule priority, then graph order) and the declines met on the way.

    ``near_misses`` says, for anchors where a rule matched nothing, why the closest attempt
    failed: ``result.near_misses[0].message`` is e.g. ``"pattern conv_relu: conv_1 is
    MatMul, expected Conv"``.
    """

    matches: tuple[Match, ...]
    declines: tuple[Decline, ...]
    # Anchors where a rule found no structural match at all, each with the mismatch that
    # stopped the match that got furthest ("Add_3 is Mul, expected Add").  Kept apart from
    # ``declines``: the report lists what a backend turned down, not every near miss.
    near_misses: tuple[Decline, ...] = ()
    _by_node: Mapping[ir.Node, Match] = field(init=False, repr=False, compare=False)
    _declined: Mapping[ir.Node, tuple[Decline, ...]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_node = {n: m for m in self.matches for n in m.nodes}
        declined: dict[ir.Node, list[Decline]] = defaultdict(list)
        for d in self.declines:
            for n in d.nodes:
                # A node that ended up in a match of that very rule was not declined by it.
                owner = by_node.get(n)
                if owner is None or owner.rule != d.rule:
                    declined[n].append(d)
        object.__setattr__(self, "_by_node", MappingProxyType(by_node))
        object.__setattr__(
            self,
            "_declined",
            MappingProxyType({n: tuple(ds) for n, ds in declined.items()}),
        )

    def match_of(self, node: ir.Node) -> Match | None:
        """The accepted match holding ``node``, if any."""
        return self._by_node.get(node)

    def declines_of(self, node: ir.Node) -> tuple[Decline, ...]:
        """Declines touching ``node`` (except by the rule whose match holds it)."""
        return self._declined.get(node, ())

    def __iter__(self) -> Iterator[Match]:
        return iter(self.matches)

    def __len__(self) -> int:
        return len(self.matches)

    def __getitem__(self, index: int) -> Match:
        return self.matches[index]

    def reasons(self, node: ir.Node) -> tuple[str, ...]:
        """``("pattern conv_bias_relu: bias is not 1-D", ...)`` for ``node``, deduplicated."""
        return tuple(dict.fromkeys(d.message for d in self.declines_of(node)))


def find_composites(
    graph: ir.Graph,
    rules: Sequence[CompositeRule],
    *,
    excluded: Collection[ir.Node] = (),
    member_check: MemberCheck | None = None,
) -> MatchResult:
    """Non-overlapping matches of ``rules`` in ``graph``: earlier rules win, then graph order.

    Matches touching ``excluded`` nodes or an earlier match are skipped; those failing a
    check, escaping or non-convex are skipped and reported in ``result.declines``.  With
    ``member_check`` (the core passes the backend's ``supports``), a match with a member it
    declines is skipped too, naming the member.  The result iterates over its matches like
    a list.

    Example::

        result = find_composites(model.graph, [library.CONV_BIAS_ACT.rule()])
        for m in result:                       # same as result.matches
            print(m.rule, [n.name for n in m.nodes])
        print(result.reasons(some_node))       # ("pattern conv_bias_act: ...", ...)
    """
    order = {node: i for i, node in enumerate(graph)}
    by_type: dict[str, list[ir.Node]] = defaultdict(list)
    for node in graph:
        by_type[node.op_type].append(node)
    outer = _nested_owners(graph)
    taken: set[ir.Node] = set(excluded)
    matches: list[Match] = []
    declines: list[Decline] = []
    near_misses: list[Decline] = []
    for rule in rules:
        found: list[Match] = []
        pattern = rule.pattern
        roots = sorted(
            {n for t in pattern.anchors for n in by_type.get(t, ())},
            key=order.__getitem__,
            reverse=True,
        )
        for root in roots:
            if root in taken:
                continue
            match, root_declines = _best_at(root, rule, order, outer, taken, near_misses, member_check)
            if match is None:
                declines.extend(root_declines)
            else:
                taken.update(match.nodes)
                found.append(match)
        found.sort(key=lambda m: order[m.nodes[0]])
        matches.extend(found)
    return MatchResult(tuple(matches), tuple(declines), tuple(near_misses))


def all_matches(graph: ir.Graph, pattern: Pattern) -> Iterator[Match]:
    """Every structural match of ``pattern`` (overlapping, unchecked): for debugging patterns.

    Example: ``len({m.nodes for m in all_matches(g, library.LAYER_NORM)})``.
    """
    order = {node: i for i, node in enumerate(graph)}
    for root in graph:
        if root.op_type in pattern.anchors:
            for b in _enumerate(pattern, root):
                yield _to_match(pattern.name, pattern, b, order)


def _best_at(
    root: ir.Node,
    rule: CompositeRule,
    order: Mapping[ir.Node, int],
    outer: Mapping[ir.Node, ir.Node],
    taken: Collection[ir.Node],
    near_misses: list[Decline] | None = None,
    member_check: MemberCheck | None = None,
) -> tuple[Match | None, list[Decline]]:
    """The first acceptable match rooted at ``root`` (preference order), else the declines.

    When nothing matches structurally at all, the furthest attempt's mismatch is appended to
    ``near_misses``.
    """
    pattern = rule.pattern
    seen: set[tuple[frozenset[ir.Node], tuple[tuple[str, int], ...]]] = set()
    declines: list[Decline] = []
    trace = _Trace()
    for b in _enumerate(pattern, root, trace):
        key = (
            frozenset(b.nodes.values()),
            tuple(sorted((k, id(v)) for k, v in b.names.items())),
        )
        if key in seen:
            continue
        seen.add(key)
        if not key[0].isdisjoint(taken):
            continue
        match = _to_match(rule.name, pattern, b, order)
        reason = (
            _structural_problem(match, order, outer, multi_output=len(pattern.outputs) > 1)
            or _declined_member(match, member_check)
            or _ask(pattern.check, match.captures)
            or _ask(rule.check, match.captures)
        )
        if reason is None:
            return match, []
        if all(d.nodes != match.nodes or d.reason != reason for d in declines):
            declines.append(Decline(rule.name, match.nodes, reason))
    if not seen and near_misses is not None and trace.reason is not None:
        near_misses.append(Decline(rule.name, trace.nodes or (root,), trace.reason))
    return None, declines


def _to_match(rule: str, pattern: Pattern, b: _Binding, order: Mapping[ir.Node, int]) -> Match:
    nodes = tuple(sorted(b.nodes.values(), key=lambda n: order.get(n, -1)))
    outputs = tuple(v for v in (b.values[p] for p in pattern.outputs) if v is not None)
    return Match(rule, nodes, MappingProxyType(dict(b.names)), outputs)


def _ask(
    check: Callable[[dict[str, Captured]], object] | None,
    captures: Mapping[str, Captured],
) -> str | None:
    """None when ``check`` says yes, else its reason.  A raising check is a decline too."""
    if check is None:
        return None
    try:
        result = check(dict(captures))
    except Exception as exc:  # a vendor's check must not take the compile down
        return f"check raised {type(exc).__name__}: {exc}"
    if isinstance(result, bool):
        return None if result else "check failed"
    if not isinstance(result, Support):
        return f"check returned {type(result).__name__}, expected Support or bool"
    return None if result.ok else (result.reason or "check failed")


def _declined_member(match: Match, member_check: MemberCheck | None) -> str | None:
    """The first member ``member_check`` declines, with its reason; None when all pass."""
    if member_check is None:
        return None
    for node in match.nodes:
        verdict = member_check(node)
        if not verdict.ok:
            return f"member {node.name} ({node.op_type}) declined: {verdict.reason}"
    return None


def _structural_problem(
    match: Match,
    order: Mapping[ir.Node, int],
    outer: Mapping[ir.Node, ir.Node],
    *,
    multi_output: bool,
) -> str | None:
    inside = set(match.nodes)
    outputs = set(match.outputs)
    for node in match.nodes:
        for value in node.outputs:
            if value in outputs:
                continue
            if value.is_graph_output():
                return f"{value.name} (from {node.name}) is a graph output but not an output of the pattern"
            for use in value.uses():
                user = outer.get(use.node, use.node)
                if user not in inside:
                    where = f"{user.name} ({user.op_type})"
                    return f"{value.name} (from {node.name}) is also used by {where} outside the match"
    # With one output every matched node is an ancestor of the root and nothing but the
    # root's outputs leaves, so no path can come back: only multi-output patterns need this.
    if multi_output:
        reentry = _reentry(inside, order, outer)
        if reentry is not None:
            return f"not convex: a path leaves the match and comes back through {reentry.name}"
    return None


def _reentry(inside: set[ir.Node], order: Mapping[ir.Node, int], outer: Mapping[ir.Node, ir.Node]) -> ir.Node | None:
    """A node outside ``inside`` on a path from it back into it, or None.

    Only nodes placed before the match's last node can lead back (graph order is
    topological), which keeps the search local.
    """
    last = max(order[n] for n in inside)
    stack = [outer.get(u.node, u.node) for n in inside for v in n.outputs for u in v.uses()]
    seen: set[ir.Node] = set()
    while stack:
        node = stack.pop()
        if node in inside or node in seen or order.get(node, last) >= last:
            continue
        seen.add(node)
        for v in node.outputs:
            for use in v.uses():
                user = outer.get(use.node, use.node)
                if user in inside:
                    return node
                stack.append(user)
    return None


def _nested_owners(graph: ir.Graph) -> dict[ir.Node, ir.Node]:
    """Node inside a subgraph (any depth) -> the top-level node owning that subgraph."""
    owners: dict[ir.Node, ir.Node] = {}
    for top in graph:
        stack = [top]
        while stack:
            node = stack.pop()
            for attr in node.attributes.values():
                if attr.type == ir.AttributeType.GRAPH:
                    subgraphs = [attr.value]
                elif attr.type == ir.AttributeType.GRAPHS:
                    subgraphs = list(attr.value)
                else:
                    continue
                for sub in subgraphs:
                    for inner in sub:
                        owners[inner] = top
                        stack.append(inner)
    return owners


# --- the search ----------------------------------------------------------------------

_UNBOUND = object()


class _Trace:
    """The mismatch that stopped the attempt which got furthest (most pattern nodes bound).

    NOTE: owned by one search (:func:`_best_at`), never by the pattern.  Reasons are built
    lazily, only for an attempt deeper than the best so far: matching is the hot loop.
    """

    __slots__ = ("depth", "nodes", "reason")

    def __init__(self) -> None:
        self.depth = -1
        self.nodes: tuple[ir.Node, ...] = ()
        self.reason: str | None = None

    def fail(self, b: _Binding, reason: str | Callable[[], str]) -> None:
        if len(b.nodes) > self.depth:
            self.depth = len(b.nodes)
            self.nodes = tuple(b.nodes.values())
            self.reason = reason if isinstance(reason, str) else reason()


def _fail(trace: _Trace | None, b: _Binding, reason: str | Callable[[], str]) -> None:
    if trace is not None:
        trace.fail(b, reason)


def _name(v: ir.Value | ir.Node | None) -> str:
    return "nothing" if v is None else (v.name or "?")


class _Binding:
    """Pattern objects -> graph objects for one partial match (copy on write)."""

    __slots__ = ("names", "nodes", "values")

    def __init__(
        self,
        values: dict[ValuePattern, ir.Value | None],
        nodes: dict[OpPattern, ir.Node],
        names: dict[str, Captured],
    ) -> None:
        self.values = values
        self.nodes = nodes
        self.names = names

    def with_value(self, p: ValuePattern, v: ir.Value | None, name: str | None) -> _Binding | None:
        names = self.names
        if name is not None and v is not None:
            if name in names:
                if names[name] is not v:
                    return None
            else:
                names = {**names, name: v}
        return _Binding({**self.values, p: v}, self.nodes, names)

    def with_node(self, p: OpPattern, node: ir.Node) -> _Binding | None:
        names = self.names
        if p.name is not None:
            if p.name in names:
                if names[p.name] is not node:
                    return None
            else:
                names = {**names, p.name: node}
        return _Binding(self.values, {**self.nodes, p: node}, names)


def _enumerate(pattern: Pattern, root: ir.Node, trace: _Trace | None = None) -> Iterator[_Binding]:
    first = pattern.outputs[0]
    for value in root.outputs:
        for b in _match_value(first, value, _Binding({}, {}, {}), trace):
            yield from _match_rest(pattern.outputs[1:], b, trace)


def _match_rest(outputs: Sequence[ValuePattern], b: _Binding, trace: _Trace | None = None) -> Iterator[_Binding]:
    """Bind further pattern outputs near what is already bound (their ops read it)."""
    if not outputs:
        yield b
        return
    p, rest = outputs[0], outputs[1:]
    if p in b.values:
        yield from _match_rest(rest, b, trace)
        return
    anchors = root_op_types(p) or frozenset()
    candidates = [node for node in _nearby_consumers(b, _depth(p)) if node.op_type in anchors]
    if not candidates:
        _fail(trace, b, lambda: f"no {'|'.join(sorted(anchors))} near the match for its next output")
    for node in candidates:
        for value in node.outputs:
            for b2 in _match_value(p, value, b, trace):
                yield from _match_rest(rest, b2, trace)


def _nearby_consumers(b: _Binding, depth: int) -> list[ir.Node]:
    """Nodes reachable from bound values in at most ``depth`` steps, nearest first."""
    frontier = [v for v in b.values.values() if v is not None]
    frontier += [v for n in b.nodes.values() for v in n.outputs]
    seen: dict[ir.Node, None] = {}
    for _ in range(depth):
        nxt: list[ir.Value] = []
        for v in frontier:
            for use in v.uses():
                if use.node not in seen:
                    seen[use.node] = None
                    nxt.extend(use.node.outputs)
        frontier = nxt
    return list(seen)


def _depth(p: ValuePattern) -> int:
    if isinstance(p, OpOutput):
        return 1 + max((_depth(i) for i in p.op.inputs), default=0)
    if isinstance(p, Either):
        return max(_depth(a) for a in p.alternatives)
    return 0


def _match_value(
    p: ValuePattern, v: ir.Value | None, b: _Binding, trace: _Trace | None = None
) -> Iterator[_Binding]:
    bound = b.values.get(p, _UNBOUND)
    if bound is not _UNBOUND:
        if bound is v:
            yield b
        else:
            _fail(trace, b, lambda: f"{_name(v)} is not {_name(bound)}, which the pattern reads there too")  # type: ignore[arg-type]
        return
    if isinstance(p, (Var, Const)):
        if v is None:
            if p.optional:
                yield _Binding({**b.values, p: None}, b.nodes, b.names)
            else:
                _fail(trace, b, lambda: f"an input the pattern needs ({p.name or 'unnamed'}) is missing")
            return
        violation = p.constraint.violation(v)
        if violation is not None:
            _fail(trace, b, violation)
            return
        if isinstance(p, Const) and not _const_ok(p, v):
            wanted = "a constant" if p.value is None else f"the constant {p.value:g}"
            _fail(trace, b, lambda: f"{_name(v)} is not {wanted}")
            return
        b2 = b.with_value(p, v, p.name)
        if b2 is not None:
            yield b2
        else:
            _fail(trace, b, lambda: f"{p.name} would capture both {_name(b.names.get(p.name or ''))} and {_name(v)}")
    elif isinstance(p, OpOutput):
        if v is None:
            _fail(trace, b, lambda: f"an input the pattern needs ({'|'.join(sorted(p.op.op_types))}) is missing")
            return
        node = v.producer()
        if node is None:
            expected = "|".join(sorted(p.op.op_types))
            _fail(trace, b, lambda: f"{_name(v)} is a graph input or constant, expected {expected}")
            return
        if v.index() != p.index:
            _fail(trace, b, lambda: f"{_name(v)} is output {v.index()} of {_name(node)}, expected output {p.index}")
            return
        violation = p.constraint.violation(v)
        if violation is not None:
            _fail(trace, b, violation)
            return
        for b2 in _match_node(p.op, node, b, trace):
            b3 = b2.with_value(p, v, None)
            if b3 is not None:
                yield b3
    elif isinstance(p, Either):
        for alt in p.alternatives:
            for b2 in _match_value(alt, v, b, trace):
                b3 = b2.with_value(p, v, None)
                if b3 is not None:
                    yield b3
    else:
        raise TypeError(f"unknown value pattern {type(p).__name__}")


def _match_node(p: OpPattern, node: ir.Node, b: _Binding, trace: _Trace | None = None) -> Iterator[_Binding]:
    bound = b.nodes.get(p)
    if bound is not None:
        if bound is node:
            yield b
        else:
            _fail(trace, b, lambda: f"{_name(node)} is not {_name(bound)}, which the pattern reads there too")
        return
    if node.op_type not in p.op_types or _domain(node.domain) != p.domain:
        _fail(trace, b, lambda: f"{_name(node)} is {_qualified(node.domain, node.op_type)}, expected "
              + "|".join(_qualified(p.domain, t) for t in sorted(p.op_types)))
        return
    if len(node.outputs) < p.num_outputs:
        _fail(trace, b, lambda: f"{_name(node)} has {len(node.outputs)} outputs, expected {p.num_outputs}")
        return
    if any(n is node for n in b.nodes.values()):
        _fail(trace, b, lambda: f"{_name(node)} would stand for two nodes of the pattern")
        return  # one graph node per pattern node
    wrong = _attribute_problem(p, node)
    if wrong is not None:
        _fail(trace, b, wrong)
        return
    actual: list[ir.Value | None] = list(node.inputs)
    while actual and actual[-1] is None:
        actual.pop()
    if len(actual) > len(p.inputs):
        _fail(trace, b, lambda: f"{_name(node)} has {len(actual)} inputs, the pattern {len(p.inputs)}")
        return
    actual += [None] * (len(p.inputs) - len(actual))
    b1 = b.with_node(p, node)
    if b1 is None:
        _fail(trace, b, lambda: f"{p.name} would capture two nodes")
        return
    yield from _match_inputs(p.inputs, actual, b1, trace)
    if p.commutative:
        yield from _match_inputs((p.inputs[1], p.inputs[0]), actual, b1, trace)


def _qualified(domain: str, op_type: str) -> str:
    return op_type if _domain(domain) == "" else f"{domain}::{op_type}"


def _match_inputs(
    pats: Sequence[ValuePattern], values: Sequence[ir.Value | None], b: _Binding, trace: _Trace | None = None
) -> Iterator[_Binding]:
    if not pats:
        yield b
        return
    for b2 in _match_value(pats[0], values[0], b, trace):
        yield from _match_inputs(pats[1:], values[1:], b2, trace)


def _domain(domain: str) -> str:
    return "" if domain == "ai.onnx" else domain


def _attribute_problem(p: OpPattern, node: ir.Node) -> str | None:
    """Why ``node``'s attributes break ``p``'s constraints, or None when they do not."""
    for name, want in p.attributes:
        attr = node.attributes.get(name)
        got = attr.value if attr is not None else attribute_default(node.op_type, node.domain, name)
        if callable(want):
            if not want(got):
                return f"{_name(node)}: attribute {name} = {got!r} fails the pattern's test"
        elif not _same(got, want):
            return f"{_name(node)}: attribute {name} = {got!r}, expected {want!r}"
    return None


def _same(got: object, want: object) -> bool:
    if isinstance(got, (list, tuple)) and isinstance(want, (list, tuple)):
        return len(got) == len(want) and all(_same(g, w) for g, w in zip(got, want, strict=True))
    if isinstance(got, float) or isinstance(want, float):
        return (
            isinstance(got, (int, float)) and isinstance(want, (int, float)) and math.isclose(got, want, rel_tol=1e-6)
        )
    return got == want


def _const_ok(p: Const, v: ir.Value) -> bool:
    if p.value is None:
        return _is_constant(v)
    array = constant_array(v)
    if array is None or array.size == 0:
        return False
    return bool(np.allclose(array.astype(np.float64), p.value, rtol=p.rtol, atol=0.0))


def _is_constant(v: ir.Value) -> bool:
    if v.is_graph_input():  # an initializer that is also an input can be overridden
        return False
    if v.const_value is not None:
        return True
    node = v.producer()
    return node is not None and node.op_type == "Constant" and _domain(node.domain) == ""


def constant_array(v: ir.Value) -> np.ndarray | None:
    """The value of a constant (initializer, known ``const_value`` or ``Constant`` output), else None."""
    if v.is_graph_input():
        return None
    if v.const_value is not None:
        return np.asarray(v.const_value.numpy())
    node = v.producer()
    if node is None or node.op_type != "Constant" or _domain(node.domain) != "":
        return None
    for name, attr in node.attributes.items():
        if name == "value":
            return np.asarray(attr.value.numpy())
        if name in ("value_float", "value_int", "value_floats", "value_ints"):
            return np.asarray(attr.value)
    return None


__all__ = [
    "Decline",
    "Match",
    "MatchResult",
    "all_matches",
    "constant_array",
    "find_composites",
]
