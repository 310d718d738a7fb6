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
    """Concrete trees: ("leaf", pattern) or ("op", op_type, children)."""
    if isinstance(p, (Var, Const)):
        return [("leaf", p)]
    if isinstance(p, Either):
        return [c for alt in p.alternatives for c in expand(alt)]
    assert isinstance(p, OpOutput)
    out: list[object] = []
    for op_type in sorted(p.op.op_types):
        for kids in itertools.product(*(expand(i) for i in p.op.inputs)):
            out.append(("op", op_type, kids))
            if p.op.commutative:
                out.append(("op", op_type, kids[::-1]))
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
