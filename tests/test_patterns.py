"""Unit tests of the pattern language and the matcher on small hand-written graphs."""

from __future__ import annotations

import dataclasses

import onnx
import onnx.parser
import onnx_ir as ir
import pytest

from codegraft.backend import CompositeRule, Support
from codegraft.patterns import (
    Pattern,
    all_matches,
    const,
    either,
    find_composites,
    op,
    optional,
    pattern,
    quantized_units,
    var,
)


def graph(
    body: str,
    signature: str = "(float[1,3,8,8] x) => (float[1,3,8,8] y)",
    inits: str = "",
) -> ir.Graph:
    """Parse ONNX text, infer shapes, name nodes n0, n1, ... and return the onnx-ir graph."""
    text = f'<ir_version: 8, opset_import: ["" : 20, "com.microsoft" : 1]>\ng {signature} {inits} {{\n{body}\n}}'
    model = onnx.parser.parse_model(text)
    for i, node in enumerate(model.graph.node):
        node.name = f"n{i}"
    model = onnx.shape_inference.infer_shapes(model)
    return ir.from_proto(model).graph


def node(g: ir.Graph, name: str) -> ir.Node:
    return next(n for n in g if n.name == name)


def names(match_nodes: tuple[ir.Node, ...]) -> list[str]:
    return [n.name or "" for n in match_nodes]


def rule(p: Pattern, check: object = None, name: str | None = None) -> CompositeRule:
    return CompositeRule(name or p.name, p, check)  # type: ignore[arg-type]


CONV_BODY = """
  c = Conv <pads=[1,1,1,1]> (x, w)
  a = Add(c, b)
  y = Relu(a)
"""
CONV_SIG = "(float[1,3,8,8] x, float[3,3,3,3] w) => (float[1,3,8,8] y)"
CONV_INITS = "<float[3,1,1] b = {1.0, 2.0, 3.0}>"


def conv_bias_relu() -> Pattern:
    y = op.Conv(var("x"), var("w"), _name="conv")
    y = op.Add(y, const("bias"), _optional=True, _name="add")
    return Pattern("conv_bias_relu", optional(op.any("Relu", "Clip")(y, _name="act"), otherwise=y))


def test_optional_links_take_the_longest_chain() -> None:
    g = graph(CONV_BODY, CONV_SIG, CONV_INITS)
    result = find_composites(g, [rule(conv_bias_relu())])
    assert [names(m.nodes) for m in result] == [["n0", "n1", "n2"]]
    match = result[0]
    assert match.captures["conv"] is node(g, "n0")
    assert match.captures["act"] is node(g, "n2")
    assert match.captures["bias"] is g.initializers["b"]
    assert match.outputs == (node(g, "n2").outputs[0],)
    assert {v.name for v in match.inputs} == {"x", "w", "b"}


def test_optional_links_may_be_absent() -> None:
    g = graph("c = Conv <pads=[1,1,1,1]> (x, w)\n y = Relu(c)", CONV_SIG)
    (match,) = find_composites(g, [rule(conv_bias_relu())])
    assert names(match.nodes) == ["n0", "n1"]
    assert "bias" not in match.captures and "add" not in match.captures
    g = graph("y = Conv <pads=[1,1,1,1]> (x, w)", CONV_SIG)
    assert [names(m.nodes) for m in find_composites(g, [rule(conv_bias_relu())])] == [["n0"]]


def test_commutative_inputs_match_either_order() -> None:
    g = graph(
        "c = Conv <pads=[1,1,1,1]> (x, w)\n a = Add(b, c)\n y = Relu(a)",
        CONV_SIG,
        CONV_INITS,
    )
    (match,) = find_composites(g, [rule(conv_bias_relu())])
    assert names(match.nodes) == ["n0", "n1", "n2"]
    # Sub is not commutative: the pattern Sub(Relu(x), c) does not match Sub(c, Relu(x)).
    g = graph("r = Relu(x)\n y = Sub(b, r)", inits="<float[1] b = {1.0}>")
    assert not find_composites(g, [rule(Pattern("p", op.Sub(op.Relu(var()), const())))])
    assert find_composites(g, [rule(Pattern("p", op.Sub(const(), op.Relu(var()))))])


def test_op_alternatives_and_wildcards() -> None:
    g = graph("a = Sigmoid(x)\n y = Tanh(a)")
    p = Pattern("p", op.any("Tanh", "Relu")(op.any("Sigmoid", "Exp")(var("x")), _name="outer"))
    (match,) = find_composites(g, [rule(p)])
    assert match.captures["outer"].op_type == "Tanh"  # type: ignore[union-attr]
    assert not find_composites(g, [rule(Pattern("p", op.Relu(op.Sigmoid(var()))))])


def test_a_shared_variable_binds_one_value() -> None:
    x = var("x")
    same = Pattern("same", op.Add(x, x))
    assert find_composites(graph("y = Add(x, x)"), [rule(same)])
    assert not find_composites(graph("r = Relu(x)\n y = Add(x, r)"), [rule(same)])


def test_constants_initializers_and_values() -> None:
    g = graph(
        "k = Constant <value = float {0.5}> ()\n a = Mul(x, k)\n y = Mul(a, h)",
        "(float[1,3,8,8] x, float h) => (float[1,3,8,8] y)",
    )
    half = Pattern("half", op.Mul(var("x"), const("k", value=0.5), _name="mul"))
    (match,) = find_composites(g, [rule(half)])
    assert names(match.nodes) == ["n1"]  # the Constant node feeds the match; it is not in it
    # A graph input is not a constant even when its value might be 0.5.
    assert names(find_composites(g, [rule(Pattern("c", op.Mul(var(), const())))])[0].nodes) == ["n1"]
    assert not find_composites(g, [rule(Pattern("v", op.Mul(var(), const(value=2.0))))])


def test_attribute_constraints_use_schema_defaults_and_predicates() -> None:
    body = "a = Conv <pads=[1,1,1,1]> (x, w)\n y = Conv <pads=[1,1,1,1], group=3> (a, v)"
    sig = "(float[1,3,8,8] x, float[3,3,3,3] w, float[3,1,3,3] v) => (float[1,3,8,8] y)"
    g = graph(body, sig)
    plain = Pattern("plain", op.Conv(var(), var(), group=1))
    assert [names(m.nodes) for m in find_composites(g, [rule(plain)])] == [["n0"]]
    grouped = Pattern("grouped", op.Conv(var(), var(), group=lambda v: v != 1))
    assert [names(m.nodes) for m in find_composites(g, [rule(grouped)])] == [["n1"]]
    padded = Pattern(
        "padded",
        op.Conv(var(), var(), pads=[1, 1, 1, 1], strides=lambda s: s in (None, [1, 1])),
    )
    assert len(find_composites(g, [rule(padded)])) == 2
    # Conv's strides has no schema default: an absent attribute reads as None.
    assert not find_composites(g, [rule(Pattern("s", op.Conv(var(), var(), strides=(1, 1))))])


def test_dtype_rank_and_shape_constraints() -> None:
    g = graph("y = Relu(x)")

    def count(**kw: object) -> int:
        return len(find_composites(g, [rule(Pattern("p", op.Relu(var(**kw))))]))  # type: ignore[arg-type]

    assert count(dtype=ir.DataType.FLOAT, rank=4, shape=(1, 3, None, 8)) == 1
    assert count(dtype={ir.DataType.FLOAT16, ir.DataType.BFLOAT16}) == 0
    assert count(rank=3) == 0
    assert count(shape=(1, 3, 8, 9)) == 0
    # Constraints on an op's output.
    assert len(find_composites(g, [rule(Pattern("p", op.Relu(var(), _rank=4)))])) == 1
    assert len(find_composites(g, [rule(Pattern("p", op.Relu(var(), _shape=(2, None, None, None))))])) == 0


def test_symbolic_dimensions() -> None:
    g = graph("y = Relu(x)", "(float[N,3] x) => (float[N,3] y)")
    assert find_composites(g, [rule(Pattern("p", op.Relu(var(shape=("N", 3)))))])
    assert not find_composites(g, [rule(Pattern("p", op.Relu(var(shape=(1, 3)))))])


def test_check_reason_becomes_a_decline_on_each_node() -> None:
    g = graph(CONV_BODY, CONV_SIG, CONV_INITS)

    def bias_is_1d(c: dict[str, ir.Value | ir.Node]) -> Support:
        bias = c.get("bias")
        if isinstance(bias, ir.Value) and bias.shape is not None and bias.shape.rank() != 1:
            return Support.no("bias is not 1-D")
        return Support.yes()

    result = find_composites(g, [rule(conv_bias_relu(), bias_is_1d)])
    # The chain is declined at the Relu and at the Add; the bare Conv is then taken.
    assert [names(m.nodes) for m in result] == [["n0"]]
    assert result.reasons(node(g, "n2")) == ("pattern conv_bias_relu: bias is not 1-D",)
    assert result.reasons(node(g, "n1")) == ("pattern conv_bias_relu: bias is not 1-D",)
    assert result.reasons(node(g, "n0")) == ()  # it is in a match of that very rule
    assert result.declines[0].nodes == (node(g, "n0"), node(g, "n1"), node(g, "n2"))
    assert result.declines[0].message == "pattern conv_bias_relu: bias is not 1-D"
    assert result.match_of(node(g, "n0")) is result[0]


def test_a_smaller_match_is_taken_when_the_larger_is_declined() -> None:
    g = graph(CONV_BODY, CONV_SIG, CONV_INITS)
    no_act = rule(
        conv_bias_relu(),
        lambda c: Support.no("no activation") if "act" in c else Support.yes(),
    )
    result = find_composites(g, [no_act])
    assert [names(m.nodes) for m in result] == [["n0", "n1"]]
    assert result.reasons(node(g, "n2")) == ("pattern conv_bias_relu: no activation",)
    assert result.reasons(node(g, "n0")) == ()  # it is in a match of that very rule


def test_pattern_check_and_bool_results() -> None:
    g = graph("y = Relu(x)")
    assert not find_composites(g, [rule(Pattern("p", op.Relu(var()), check=lambda c: False))])
    result = find_composites(g, [rule(Pattern("p", op.Relu(var()), check=lambda c: True))])
    assert len(result) == 1

    def broken(c: dict[str, ir.Value | ir.Node]) -> Support:
        raise ValueError("boom")

    result = find_composites(g, [rule(Pattern("p", op.Relu(var())), broken)])
    assert result.reasons(node(g, "n0")) == ("pattern p: check raised ValueError: boom",)


def test_interior_values_used_outside_reject_the_match() -> None:
    g = graph("r = Relu(x)\n s = Sigmoid(r)\n y = Add(s, r)")
    p = Pattern("relu_sigmoid", op.Sigmoid(op.Relu(var())))
    result = find_composites(g, [rule(p)])
    assert not result.matches
    assert "r (from n0) is also used by n2 (Add) outside the match" in result.declines[0].reason
    # Declaring the interior value as a second output makes it legal.
    r = op.Relu(var())
    two = Pattern("two", (op.Sigmoid(r), r))
    (match,) = find_composites(g, [rule(two)])
    assert names(match.nodes) == ["n0", "n1"] and len(match.outputs) == 2


def test_an_interior_graph_output_rejects_the_match() -> None:
    g = graph(
        "r = Relu(x)\n y = Sigmoid(r)",
        "(float[1,3,8,8] x) => (float[1,3,8,8] y, float[1,3,8,8] r)",
    )
    result = find_composites(g, [rule(Pattern("p", op.Sigmoid(op.Relu(var()))))])
    assert not result.matches and "graph output" in result.declines[0].reason


def test_multi_output_patterns_find_their_second_output_through_consumers() -> None:
    g = graph("r = Relu(x)\n a = Sigmoid(r)\n b = Tanh(r)\n y = Add(a, b)")
    r = op.Relu(var("x"), _name="relu")
    p = Pattern("fork", (op.Sigmoid(r, _name="sig"), op.Tanh(r, _name="tanh")))
    (match,) = find_composites(g, [rule(p)])
    assert names(match.nodes) == ["n0", "n1", "n2"]
    assert [v.name for v in match.outputs] == ["a", "b"]


def test_multi_op_outputs() -> None:
    g = graph(
        "a, b = Split <axis=1, num_outputs=2> (x)\n y = Add(a, b)",
        "(float[1,4] x) => (float[1,2] y)",
    )
    halves = op.Split(var("x"), _outputs=2)
    assert isinstance(halves, tuple)
    p = Pattern("split_add", op.Add(halves[0], halves[1]))
    (match,) = find_composites(g, [rule(p)])
    assert names(match.nodes) == ["n0", "n1"]


def test_non_convex_multi_output_match_is_rejected() -> None:
    # r -> s (outside the match) -> t, and r -> t: taking {r, t} would leave through s and come back.
    g = graph("r = Relu(x)\n s = Neg(r)\n y = Add(r, s)")
    r = op.Relu(var())
    p = Pattern("around", (op.Add(r, var()), r))
    result = find_composites(g, [rule(p)])
    assert not result.matches
    assert result.declines and "not convex" in result.declines[0].reason


def test_rule_priority_and_excluded_nodes() -> None:
    g = graph(CONV_BODY, CONV_SIG, CONV_INITS)
    relu_only = rule(Pattern("relu", op.Relu(var())))
    result = find_composites(g, [relu_only, rule(conv_bias_relu())])
    assert [(m.rule, names(m.nodes)) for m in result] == [
        ("relu", ["n2"]),
        ("conv_bias_relu", ["n0", "n1"]),
    ]
    result = find_composites(g, [rule(conv_bias_relu())], excluded=[node(g, "n1")])
    assert [names(m.nodes) for m in result] == [["n0"]]
    assert not result.declines  # overlap with excluded nodes is not a decline


def test_matches_are_in_graph_order_and_do_not_overlap() -> None:
    g = graph("a = Relu(x)\n b = Relu(a)\n c = Relu(b)\n y = Relu(c)")
    p = Pattern("pair", op.Relu(op.Relu(var())))
    result = find_composites(g, [rule(p)])
    assert [names(m.nodes) for m in result] == [["n0", "n1"], ["n2", "n3"]]


def test_no_state_is_kept_and_results_are_frozen() -> None:
    p = conv_bias_relu()
    g1 = graph(CONV_BODY, CONV_SIG, CONV_INITS)
    g2 = graph("c = Conv <pads=[1,1,1,1]> (x, w)\n y = Relu(c)", CONV_SIG)
    first = [names(m.nodes) for m in find_composites(g1, [rule(p)])]
    find_composites(g2, [rule(p)])
    assert [names(m.nodes) for m in find_composites(g1, [rule(p)])] == first
    match = find_composites(g1, [rule(p)])[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        match.rule = "other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        match.captures["x"] = match.captures["w"]  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.name = "other"  # type: ignore[misc]


def test_pattern_decorator_and_either() -> None:
    @pattern
    def add_act(op, a, b):  # type: ignore[no-untyped-def]
        s = op.Add(a, b)
        return either(op.Relu(s), op.Gelu(s), op.Gelu(s, _domain="com.microsoft"))

    assert isinstance(add_act, Pattern) and add_act.name == "add_act"
    assert add_act.capture_names() == {"a", "b"}
    g = graph("s = Add(x, x)\n y = Gelu(s)")
    assert len(find_composites(g, [rule(add_act)])) == 1
    g = graph("s = Add(x, x)\n y = com.microsoft.Gelu(s)")
    assert len(find_composites(g, [rule(add_act)])) == 1


def test_optional_trailing_inputs() -> None:
    sig = "(float[1,3,8,8] x, float[3,3,3,3] w, float[3] b) => (float[1,3,8,8] y)"
    p = Pattern("conv", op.Conv(var(), var(), var("b", optional=True)))
    with_bias = find_composites(graph("y = Conv <pads=[1,1,1,1]> (x, w, b)", sig), [rule(p)])
    assert with_bias[0].captures["b"].name == "b"  # type: ignore[union-attr]
    without = find_composites(graph("y = Conv <pads=[1,1,1,1]> (x, w)", sig), [rule(p)])
    assert "b" not in without[0].captures
    two_inputs_only = Pattern("conv2", op.Conv(var(), var()))
    assert not find_composites(graph("y = Conv <pads=[1,1,1,1]> (x, w, b)", sig), [rule(two_inputs_only)])
    # None as an input: that input must be absent.
    absent = Pattern("conv3", op.Conv(var(), var(), None))
    assert not find_composites(graph("y = Conv <pads=[1,1,1,1]> (x, w, b)", sig), [rule(absent)])
    assert find_composites(graph("y = Conv <pads=[1,1,1,1]> (x, w)", sig), [rule(absent)])


def test_invalid_patterns_are_refused_when_built() -> None:
    with pytest.raises(ValueError, match="bare wildcard"):
        Pattern("p", var("x"))
    with pytest.raises(ValueError, match="bare wildcard"):
        Pattern("p", optional(op.Relu(var())))
    with pytest.raises(ValueError, match="shares nothing"):
        Pattern("p", (op.Relu(var()), op.Sigmoid(var())))
    with pytest.raises(ValueError, match="otherwise"):
        optional(either(op.Relu(var()), op.Sigmoid(var())))


def test_all_matches_lists_overlapping_structural_matches() -> None:
    g = graph("a = Relu(x)\n b = Relu(a)\n y = Relu(b)")
    found = {tuple(names(m.nodes)) for m in all_matches(g, Pattern("pair", op.Relu(op.Relu(var()))))}
    assert found == {("n0", "n1"), ("n1", "n2")}


QDQ_SIG = "(float[1,3,8,8] x) => (float[1,3,8,8] y, float[1,3,8,8] z)"
QDQ_INITS = "<float s = {0.1}, uint8 zp = {128}, uint8[3,3,3,3] wq = {" + ",".join(["1"] * 81) + "}>"
QDQ_BODY = """
  xq = QuantizeLinear(x, s, zp)
  xd = DequantizeLinear(xq, s, zp)
  wd = DequantizeLinear(wq, s, zp)
  c = Conv <pads=[1,1,1,1]> (xd, wd)
  cq = QuantizeLinear(c, s, zp)
  c2 = Conv <pads=[1,1,1,1]> (xd, wd)
  c2q = QuantizeLinear(c2, s, zp)
  y = DequantizeLinear(cq, s, zp)
  r = Relu(xd)
  z = Add(r, y)
"""


def test_quantized_units_merge_when_they_share_a_dequantize() -> None:
    g = graph(QDQ_BODY + "\n  unused = DequantizeLinear(c2q, s, zp)", QDQ_SIG, QDQ_INITS)
    units = quantized_units(g)
    # Both Convs read the same DequantizeLinear nodes, so they form one unit; Relu reads a
    # DequantizeLinear but its output is not quantized, so it is no unit.
    assert [names(u) for u in units] == [["n1", "n2", "n3", "n4", "n5", "n6"]]


RESIDUAL_QDQ_BODY = """
  xq = QuantizeLinear(x, s, zp)
  xd = DequantizeLinear(xq, s, zp)
  wd = DequantizeLinear(wq, s, zp)
  c1 = Conv <pads=[1,1,1,1]> (xd, wd)
  c1q = QuantizeLinear(c1, s, zp)
  c1d = DequantizeLinear(c1q, s, zp)
  h = Sigmoid(c1d)
  wd2 = DequantizeLinear(wq, s, zp)
  c2 = Conv <pads=[1,1,1,1]> (h, wd2)
  c2q = QuantizeLinear(c2, s, zp)
  c2d = DequantizeLinear(c2q, s, zp)
  a = Add(xd, c2d)
  aq = QuantizeLinear(a, s, zp)
  y = DequantizeLinear(aq, s, zp)
  z = Relu(y)
"""


def test_quantized_units_sharing_a_dequantize_across_a_block_are_not_merged() -> None:
    # A residual block: the input's DequantizeLinear feeds the first Conv and the Add after
    # the second; merged, the unit {first Conv, Add} would be left and re-entered through the
    # Sigmoid and the second Conv between them, and the partitioner refused the model ("the
    # graph has a cycle"; efficientword-net's int8 ResNet-50).  Each op keeps its own unit;
    # the shared DequantizeLinear of the input is in none.
    g = graph(RESIDUAL_QDQ_BODY, QDQ_SIG, QDQ_INITS)
    units = [names(u) for u in quantized_units(g)]
    assert units == [["n2", "n3", "n4"], ["n7", "n8", "n9"], ["n10", "n11", "n12"]]
    assert [[n.op_type for n in u] for u in quantized_units(g)][0] == ["DequantizeLinear", "Conv", "QuantizeLinear"]


def test_quantized_units_single() -> None:
    body = """
      xq = QuantizeLinear(x, s, zp)
      xd = DequantizeLinear(xq, s, zp)
      r = Relu(xd)
      rq = QuantizeLinear(r, s, zp)
      y = DequantizeLinear(rq, s, zp)
      z = Sigmoid(y)
    """
    g = graph(body, QDQ_SIG, QDQ_INITS)
    assert [[n.op_type for n in u] for u in quantized_units(g)] == [["DequantizeLinear", "Relu", "QuantizeLinear"]]


def test_public_api_is_curated() -> None:
    import codegraft.patterns as patterns

    assert set(patterns.__all__) == {
        "Const", "Decline", "Either", "Match", "MatchResult", "OpOutput", "OpPattern", "Pattern",
        "PatternCheck", "ValueConstraint", "ValuePattern", "Var", "all_matches", "const",
        "constant_array", "either", "find_composites", "library", "op", "optional", "pattern",
        "quantized_units", "var",
    }  # fmt: skip
    assert all(hasattr(patterns, name) for name in patterns.__all__)


def test_describe_prints_the_pattern_on_one_line() -> None:
    assert conv_bias_relu().describe() == "@act=Clip|Relu?(@add=Add?(@conv=Conv(x, w), const bias))"
    x = var("x")
    d = op.Sub(x, op.ReduceMean(x), _name="d")
    assert Pattern("p", op.Div(d, op.Mul(d, 2.0))).describe() == "Div(@d=Sub(x, ReduceMean(x)), Mul(@d, const=2))"
    assert "Pattern('p': Relu(_))" == repr(Pattern("p", op.Relu(var())))
