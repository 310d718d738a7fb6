"""Every structural mismatch of the matcher carries a reason: the closest miss is reported."""

from __future__ import annotations

import onnx
import onnx.parser
import onnx_ir as ir

from codegraft.backend import CompositeRule
from codegraft.patterns import const, find_composites, pattern


def _graph(body: str, signature: str) -> ir.Graph:
    text = f'<ir_version: 8, opset_import: ["" : 20]>\ng {signature} {{\n{body}\n}}'
    model = onnx.parser.parse_model(text)
    for i, node in enumerate(model.graph.node):
        node.name = f"n{i}"
    return ir.from_proto(onnx.shape_inference.infer_shapes(model)).graph


@pattern
def conv_relu(op, x, w):  # type: ignore[no-untyped-def]
    return op.Relu(op.Conv(x, w, group=1))


@pattern
def scaled_relu(op, x):  # type: ignore[no-untyped-def]
    return op.Relu(op.Mul(x, const(value=2.0)))


def _near_misses(graph: ir.Graph, p: object) -> list[str]:
    result = find_composites(graph, [CompositeRule(p.name, p)])  # type: ignore[attr-defined, arg-type]
    assert result.matches == () and result.declines == ()  # a near miss is not a decline
    return [d.message for d in result.near_misses]


def test_wrong_op_type_is_named() -> None:
    g = _graph("m = MatMul(x, w)\ny = Relu(m)", "(float[4,4] x, float[4,4] w) => (float[4,4] y)")
    assert _near_misses(g, conv_relu) == ["pattern conv_relu: n0 is MatMul, expected Conv"]


def test_wrong_attribute_is_named() -> None:
    g = _graph(
        "c = Conv <group=3> (x, w)\ny = Relu(c)",
        "(float[1,3,8,8] x, float[3,1,1,1] w) => (float[1,3,8,8] y)",
    )
    assert _near_misses(g, conv_relu) == ["pattern conv_relu: n0: attribute group = 3, expected 1"]


def test_a_constant_that_differs_is_named() -> None:
    g = _graph(
        "k = Constant <value_float=3.0> ()\nm = Mul(x, k)\ny = Relu(m)",
        "(float[4] x) => (float[4] y)",
    )
    (message,) = _near_misses(g, scaled_relu)
    assert message == "pattern scaled_relu: k is not the constant 2"


def test_a_graph_input_where_an_op_is_expected() -> None:
    g = _graph("y = Relu(x)", "(float[4] x) => (float[4] y)")
    assert _near_misses(g, conv_relu) == ["pattern conv_relu: x is a graph input or constant, expected Conv"]


def test_the_furthest_attempt_wins() -> None:
    # Relu(Conv) with the wrong group gets further (two nodes bound) than a bare Relu would.
    g = _graph(
        "c = Conv <group=3> (x, w)\nr = Relu(c)\ny = Relu(x)",
        "(float[1,3,8,8] x, float[3,1,1,1] w) => (float[1,3,8,8] r, float[1,3,8,8] y)",
    )
    assert sorted(_near_misses(g, conv_relu)) == [
        "pattern conv_relu: n0: attribute group = 3, expected 1",
        "pattern conv_relu: x is a graph input or constant, expected Conv",
    ]


def test_matches_are_unchanged_by_tracing() -> None:
    g = _graph(
        "c = Conv (x, w)\ny = Relu(c)", "(float[1,3,8,8] x, float[3,3,1,1] w) => (float[3,3,8,8] y)"
    )
    result = find_composites(g, [CompositeRule("conv_relu", conv_relu)])
    assert [[n.name for n in m.nodes] for m in result.matches] == [["n0", "n1"]]
    assert result.near_misses == ()
