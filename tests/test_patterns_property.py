"""Property test: the anchored matcher agrees with a brute-force matcher on random graphs.

The brute force expands a pattern into every concrete tree (each alternative, each optional
link present or skipped, each order of a commutative op's inputs) and tries every injective
assignment of graph nodes to the tree's ops.  It shares no code with the matcher.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import numpy as np
import onnx_ir as ir
from hypothesis import given, settings
from hypothesis import strategies as st

from codegraft.backend import CompositeRule
from codegraft.patterns import (
    Const,
    Either,
    OpOutput,
    Pattern,
    ValuePattern,
    Var,
    all_matches,
    const,
    find_composites,
    op,
    optional,
    var,
)
from codegraft.patterns._pattern import walk

UNARY = ("Relu", "Sigmoid", "Neg")
BINARY = ("Add", "Mul", "Sub")

Key = tuple[frozenset[str], frozenset[tuple[str, str]]]


# --- random graphs ---------------------------------------------------------------------


@st.composite
def graphs(draw: st.DrawFn) -> ir.Graph:
    inputs = [ir.Value(name=f"x{i}", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([2])) for i in range(2)]
    k = ir.Value(name="k", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([2]))
    k.const_value = ir.tensor(np.ones(2, np.float32), name="k")
    values = [*inputs, k]
    nodes = []
    for i in range(draw(st.integers(1, 8))):
        op_type = draw(st.sampled_from(UNARY + BINARY))
        arity = 1 if op_type in UNARY else 2
        args = [values[draw(st.integers(0, len(values) - 1))] for _ in range(arity)]
        node = ir.Node("", op_type, args, name=f"n{i}", num_outputs=1)
        node.outputs[0].name = f"v{i}"
        nodes.append(node)
        values.append(node.outputs[0])
    produced = [n.outputs[0] for n in nodes]
    extra = draw(st.lists(st.sampled_from(produced), unique=True, max_size=2))
    outputs = list(dict.fromkeys([produced[-1], *extra]))
    g = ir.Graph(inputs, outputs, nodes=nodes, initializers=[k], name="g")
    return g


# --- random patterns -------------------------------------------------------------------


@st.composite
def patterns(draw: st.DrawFn) -> Pattern:
    leaves: list[ValuePattern] = [var("a"), var("b"), const("k")]

    def build(depth: int, root: bool) -> ValuePattern:
        if depth == 0 or (not root and draw(st.integers(0, 2)) == 0):
            choice = draw(st.integers(0, len(leaves)))
            return var() if choice == len(leaves) else leaves[choice]
        if draw(st.booleans()):
            types = draw(st.sets(st.sampled_from(UNARY), min_size=1, max_size=2))
            p = op.any(*types)(build(depth - 1, False))
            return p if root or not draw(st.booleans()) else optional(p)
        types = draw(st.sets(st.sampled_from(BINARY), min_size=1, max_size=2))
        return op.any(*types)(
            build(depth - 1, False),
            build(depth - 1, False),
            _commute=draw(st.booleans()),
        )

    return Pattern("random", build(draw(st.integers(1, 3)), True))


# --- the brute force -------------------------------------------------------------------


def expand(p: ValuePattern) -> list[object]:
    """Concrete trees: ("leaf", pattern) or ("op", op_type, children, op output pattern)."""
    if isinstance(p, (Var, Const)):
        return [("leaf", p)]
    if isinstance(p, Either):
        return [c for alt in p.alternatives for c in expand(alt)]
    assert isinstance(p, OpOutput)
    out: list[object] = []
    for op_type in sorted(p.op.op_types):
        for kids in itertools.product(*(expand(i) for i in p.op.inputs)):
            out.append(("op", op_type, kids, p))
            if p.op.commutative:
                out.append(("op", op_type, kids[::-1], p))
    return out


def flatten(
    tree: object,
) -> tuple[list[tuple[str, tuple[object, ...]]], list[list[int | ValuePattern]]]:
    """Number a concrete tree's ops in pre-order; each op's children are op numbers or leaves."""
    ops: list[tuple[str, tuple[object, ...]]] = []
    children: list[list[int | ValuePattern]] = []

    def visit(t: object) -> int | ValuePattern:
        assert isinstance(t, tuple)
        if t[0] == "leaf":
            return t[1]
        index = len(ops)
        ops.append((t[1], t[2]))
        children.append([])
        children[index] = [visit(k) for k in t[2]]
        return index

    visit(tree)
    return ops, children


def brute_force(g: ir.Graph, p: Pattern) -> set[Key]:
    found: set[Key] = set()
    nodes = list(g)
    for tree in expand(p.outputs[0]):
        ops, children = flatten(tree)
        candidates = [[n for n in nodes if n.op_type == t and len(n.inputs) == len(kids)] for t, kids in ops]
        for assign in itertools.product(*candidates):
            if len(set(map(id, assign))) < len(assign):
                continue
            bound: dict[int, tuple[Var | Const, ir.Value]] = {}
            ok = True
            for pos, kids in enumerate(children):
                for i, kid in enumerate(kids):
                    value = assign[pos].inputs[i]
                    assert value is not None
                    if isinstance(kid, int):
                        ok = value is assign[kid].outputs[0]
                    else:
                        assert isinstance(kid, (Var, Const))
                        if isinstance(kid, Const) and (value.const_value is None or value.is_graph_input()):
                            ok = False
                        elif id(kid) in bound:
                            ok = bound[id(kid)][1] is value
                        bound[id(kid)] = (kid, value)
                    if not ok:
                        break
                if not ok:
                    break
            if ok:
                captures = frozenset((leaf.name, v.name or "") for leaf, v in bound.values() if leaf.name)
                found.add((frozenset(n.name or "" for n in assign), captures))
    return found


def escapes(g: ir.Graph, members: frozenset[str], root_output: ir.Value) -> bool:
    """An interior value is used outside the match or is a graph output."""
    for n in g:
        if n.name in members:
            for v in n.outputs:
                if v is root_output:
                    continue
                if v.is_graph_output() or any(u.node.name not in members for u in v.uses()):
                    return True
    return False


def key_of(nodes: Iterator[ir.Node] | tuple[ir.Node, ...], captures: object) -> Key:
    caps = frozenset((k, v.name or "") for k, v in captures.items())  # type: ignore[attr-defined]
    return frozenset(n.name or "" for n in nodes), caps


@settings(max_examples=500, derandomize=True, deadline=None)
@given(graphs(), patterns())
def test_matcher_agrees_with_brute_force(g: ir.Graph, p: Pattern) -> None:
    expected = brute_force(g, p)
    found = {key_of(m.nodes, m.captures) for m in all_matches(g, p)}
    assert found == expected

    # The greedy selection: disjoint, each a valid structural match, and maximal (every
    # valid structural match overlaps a chosen one).
    chosen = list(find_composites(g, [CompositeRule("random", p)]))
    taken: set[str] = set()
    for m in chosen:
        key = key_of(m.nodes, m.captures)
        assert key in expected
        assert not escapes(g, key[0], m.outputs[0])
        assert taken.isdisjoint(key[0])
        taken |= key[0]
    by_name = {n.name: n for n in g}
    for members, _ in expected:
        root = next(
            by_name[name]
            for name in members
            if not any(u.node.name in members for u in by_name[name].outputs[0].uses())
        )
        if not escapes(g, members, root.outputs[0]):
            assert not taken.isdisjoint(members), f"valid match {sorted(members)} was missed"


def test_brute_force_sees_optional_and_commuted_forms() -> None:
    # A sanity check of the oracle itself on a graph we can reason about.
    x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([2]))
    relu = ir.Node("", "Relu", [x], name="n0")
    add = ir.Node("", "Add", [x, relu.outputs[0]], name="n1")
    g = ir.Graph([x], [add.outputs[0]], nodes=[relu, add], name="g")
    p = Pattern("p", op.Add(optional(op.Relu(var("a"))), var("b")))
    keys = brute_force(g, p)
    assert (frozenset({"n0", "n1"}), frozenset({("a", "x"), ("b", "x")})) in keys
    assert {key_of(m.nodes, m.captures) for m in all_matches(g, p)} == keys


# --- multi-output patterns: validity against an independent convexity oracle -------------


@st.composite
def multi_output_patterns(draw: st.DrawFn) -> Pattern:
    first = draw(patterns()).outputs[0]
    inner = [p for p in walk(first) if isinstance(p, OpOutput)]
    shared = inner[draw(st.integers(0, len(inner) - 1))]
    if draw(st.booleans()):
        second: ValuePattern = shared  # an interior value declared as an output
    else:
        other = draw(st.sampled_from([var(), const("k"), shared]))
        second = op.any(*draw(st.sets(st.sampled_from(BINARY), min_size=1, max_size=2)))(shared, other)
    return Pattern("multi", (first, second))


def descendants(g: ir.Graph) -> dict[str, set[str]]:
    below: dict[str, set[str]] = {}
    for n in reversed(list(g)):
        reach: set[str] = set()
        for v in n.outputs:
            for use in v.uses():
                reach |= {use.node.name or ""} | below[use.node.name or ""]
        below[n.name or ""] = reach
    return below


def valid(g: ir.Graph, m_nodes: frozenset[str], outputs: tuple[ir.Value, ...]) -> bool:
    below = descendants(g)
    for n in g:
        if n.name in m_nodes:
            for v in n.outputs:
                if v in outputs:
                    continue
                if v.is_graph_output() or any(u.node.name not in m_nodes for u in v.uses()):
                    return False
    outside = {n.name for n in g} - m_nodes
    return not any(
        o in below[s] and below[o] & m_nodes
        for s in m_nodes
        for o in outside  # leaves, then comes back
    )


@settings(max_examples=300, derandomize=True, deadline=None)
@given(graphs(), multi_output_patterns())
def test_multi_output_matches_are_convex_and_maximal(g: ir.Graph, p: Pattern) -> None:
    structural = list(all_matches(g, p))
    chosen = list(find_composites(g, [CompositeRule("multi", p)]))
    taken: set[str] = set()
    keys = {key_of(m.nodes, m.captures) for m in structural}
    for m in chosen:
        names = frozenset(n.name or "" for n in m.nodes)
        assert key_of(m.nodes, m.captures) in keys
        assert valid(g, names, m.outputs), f"accepted an invalid match {sorted(names)}"
        assert taken.isdisjoint(names)
        taken |= names
    for m in structural:
        names = frozenset(n.name or "" for n in m.nodes)
        if valid(g, names, m.outputs):
            assert not taken.isdisjoint(names), f"valid match {sorted(names)} was missed"


# --- planted instances: graphs built around the pattern, so matches span several nodes ----


@st.composite
def planted(draw: st.DrawFn, pattern_strategy: st.SearchStrategy[Pattern]) -> tuple[ir.Graph, Pattern]:
    """A pattern and a graph holding one or two instances of it among random nodes (which
    may also read the instances' interior values, making some invalid)."""
    p = draw(pattern_strategy)
    inputs = [ir.Value(name=f"x{i}", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([2])) for i in range(2)]
    k = ir.Value(name="k", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([2]))
    k.const_value = ir.tensor(np.ones(2, np.float32), name="k")
    values: list[ir.Value] = [*inputs, k]
    nodes: list[ir.Node] = []

    def add(op_type: str, args: list[ir.Value]) -> ir.Value:
        node = ir.Node("", op_type, args, name=f"n{len(nodes)}", num_outputs=1)
        node.outputs[0].name = f"v{len(nodes)}"
        nodes.append(node)
        values.append(node.outputs[0])
        return node.outputs[0]

    def noise() -> None:
        for _ in range(draw(st.integers(0, 3))):
            op_type = draw(st.sampled_from(UNARY + BINARY))
            arity = 1 if op_type in UNARY else 2
            add(op_type, [values[draw(st.integers(0, len(values) - 1))] for _ in range(arity)])

    def plant(tree: object, bound: dict[int, ir.Value]) -> ir.Value:
        assert isinstance(tree, tuple)
        if tree[0] == "leaf":
            leaf = tree[1]
            if isinstance(leaf, Const):
                return k
            if id(leaf) not in bound:
                bound[id(leaf)] = values[draw(st.integers(0, len(values) - 1))]
            return bound[id(leaf)]
        bound[id(tree[3])] = add(tree[1], [plant(child, bound) for child in tree[2]])
        return bound[id(tree[3])]

    def plant_second(second: ValuePattern, bound: dict[int, ir.Value]) -> None:
        """A further output reading the first's value, sometimes through an outside node
        (which makes the match non-convex)."""
        if not isinstance(second, OpOutput) or len(second.op.inputs) != 2 or id(second) in bound:
            return  # an interior value declared as an output, planted with the first or skipped
        if id(second.op.inputs[0]) not in bound:
            return
        shared = bound[id(second.op.inputs[0])]
        other_pattern = second.op.inputs[1]
        if isinstance(other_pattern, Const):
            other = k
        elif id(other_pattern) in bound:
            other = bound[id(other_pattern)]
        elif draw(st.booleans()):
            other = add("Neg", [shared])  # leaves the match and comes back
        else:
            other = values[draw(st.integers(0, len(values) - 1))]
        add(draw(st.sampled_from(sorted(second.op.op_types))), [shared, other])

    trees = expand(p.outputs[0])
    noise()
    for _ in range(draw(st.integers(1, 2))):
        bound: dict[int, ir.Value] = {}
        plant(trees[draw(st.integers(0, len(trees) - 1))], bound)
        for second in p.outputs[1:]:
            plant_second(second, bound)
        noise()
    produced = [n.outputs[0] for n in nodes]
    extra = draw(st.lists(st.sampled_from(produced), unique=True, max_size=2))
    outputs = list(dict.fromkeys([produced[-1], *extra]))
    return ir.Graph(inputs, outputs, nodes=nodes, initializers=[k], name="g"), p


@settings(max_examples=300, derandomize=True, deadline=None)
@given(planted(patterns()))
def test_matcher_agrees_with_brute_force_on_planted_instances(case: tuple[ir.Graph, Pattern]) -> None:
    test_matcher_agrees_with_brute_force.hypothesis.inner_test(*case)  # type: ignore[attr-defined]


@settings(max_examples=300, derandomize=True, deadline=None)
@given(planted(multi_output_patterns()))
def test_multi_output_planted_matches_are_convex_and_maximal(case: tuple[ir.Graph, Pattern]) -> None:
    test_multi_output_matches_are_convex_and_maximal.hypothesis.inner_test(*case)  # type: ignore[attr-defined]
