"""The built-in pattern library on the onnx light models, the benchmark zoo and small graphs."""

from __future__ import annotations

import functools
from collections import Counter

import onnx
import onnx.parser
import onnx_ir as ir
import pytest

from bench import zoo
from codegraft.backend import Support
from codegraft.patterns import find_composites, library
from codegraft.testing import LIGHT_MODELS, light_model


@functools.cache
def light_graph(name: str) -> ir.Graph:
    # Cached: randomizing vgg19's weights takes seconds; the tests only read the graph.
    return ir.from_proto(light_model(name)).graph


def only_consumer(value: ir.Value) -> ir.Node | None:
    uses = list(value.uses())
    if value.is_graph_output() or len(uses) != 1:
        return None
    return uses[0].node


def is_const(value: ir.Value | None) -> bool:
    return value is not None and value.const_value is not None and not value.is_graph_input()


def conv_chain(conv: ir.Node) -> tuple[ir.Node, ...]:
    """What conv_bias_act should take from ``conv``, found by walking single consumers."""
    chain = [conv]
    nxt = only_consumer(conv.outputs[0])
    if nxt is not None and nxt.op_type == "Add" and any(is_const(v) for v in nxt.inputs):
        chain.append(nxt)
        nxt = only_consumer(nxt.outputs[0])
    if nxt is not None and nxt.op_type == "BatchNormalization" and all(is_const(v) for v in nxt.inputs[1:]):
        chain.append(nxt)
        nxt = only_consumer(nxt.outputs[0])
    if nxt is not None and nxt.op_type in {
        "Relu",
        "Clip",
        "LeakyRelu",
        "Sigmoid",
        "HardSwish",
    }:
        chain.append(nxt)
    # The last link's output may be used anywhere; a Conv followed by one consumer that is
    # not part of the chain stops there.
    return tuple(chain)


def test_every_conv_bn_relu_of_resnet50_is_found() -> None:
    g = light_graph("resnet50")
    result = find_composites(g, [library.CONV_BIAS_ACT.rule()])
    shapes = Counter(tuple(n.op_type for n in m.nodes) for m in result)
    # Counted independently: a Relu whose input is a BatchNormalization read only by it,
    # whose input is a Conv read only by it.
    expected_full = 0
    for relu in g:
        bn = relu.inputs[0].producer() if relu.op_type == "Relu" and relu.inputs[0] is not None else None
        if bn is not None and bn.op_type == "BatchNormalization" and only_consumer(bn.outputs[0]) is relu:
            conv = bn.inputs[0].producer() if bn.inputs[0] is not None else None
            if conv is not None and conv.op_type == "Conv" and only_consumer(conv.outputs[0]) is bn:
                expected_full += 1
    assert expected_full == 33  # the other 16 Relus follow the residual Sums
    assert shapes[("Conv", "BatchNormalization", "Relu")] == expected_full
    assert shapes[("Conv", "BatchNormalization")] == 53 - expected_full
    assert sum(shapes.values()) == sum(n.op_type == "Conv" for n in g) == 53


@pytest.mark.parametrize("name", LIGHT_MODELS)
def test_conv_bias_act_on_every_light_model_matches_a_walk(name: str) -> None:
    g = light_graph(name)
    result = find_composites(g, [library.CONV_BIAS_ACT.rule()])
    found = {m.nodes for m in result}
    expected = {conv_chain(n) for n in g if n.op_type == "Conv"}
    assert found == expected
    for m in result:
        assert m.captures["conv"] is m.nodes[0]
        assert ("act" in m.captures) == (m.nodes[-1].op_type == "Relu")


def test_gemm_bias_act_on_light_models() -> None:
    for name, gemms, with_relu in (("vgg19", 3, 2), ("resnet50", 1, 0)):
        result = find_composites(light_graph(name), [library.GEMM_BIAS_ACT.rule()])
        assert len(result) == gemms
        assert sum("act" in m.captures for m in result) == with_relu


def test_transformer_encoder_from_the_zoo() -> None:
    g = ir.from_proto(zoo.transformer_encoder(layers=2, d_model=32, heads=2, seq=8)).graph
    names = ("attention", "matmul_add_gelu", "layer_norm", "gemm_bias_act")
    result = find_composites(g, [library.get(n).rule() for n in names])
    assert Counter(m.rule for m in result) == {
        "layer_norm": 5,
        "gemm_bias_act": 6,
        "attention": 2,
        "matmul_add_gelu": 2,
    }
    gelu = next(m for m in result if m.rule == "matmul_add_gelu")
    assert [n.op_type for n in gelu.nodes] == [
        "MatMul",
        "Add",
        "Mul",
        "Erf",
        "Add",
        "Mul",
        "Mul",
    ]
    attention = next(m for m in result if m.rule == "attention")
    assert [n.op_type for n in attention.nodes] == [
        "MatMul",
        "Mul",
        "Softmax",
        "MatMul",
    ]
    assert "scale" in attention.captures and "mask" not in attention.captures


def test_mobilenet_and_mlp_from_the_zoo() -> None:
    g = ir.from_proto(zoo.mobilenet(resolution=32)).graph
    result = find_composites(g, [library.CONV_BIAS_ACT.rule(), library.GEMM_BIAS_ACT.rule()])
    acts = Counter(m.captures["act"].op_type for m in result if "act" in m.captures)  # type: ignore[union-attr]
    assert acts == {"Clip": 19, "HardSwish": 8}
    g = ir.from_proto(zoo.mlp(batch=2, sizes=(4, 8, 8, 2))).graph
    result = find_composites(g, [library.GEMM_BIAS_ACT.rule()])
    assert [tuple(n.op_type for n in m.nodes) for m in result] == [
        ("Gemm", "Relu"),
        ("Gemm", "Relu"),
        ("Gemm",),
    ]


def graph(body: str, signature: str, inits: str = "") -> ir.Graph:
    text = f'<ir_version: 8, opset_import: ["" : 18]>\ng {signature} {inits} {{\n{body}\n}}'
    model = onnx.parser.parse_model(text)
    for i, node in enumerate(model.graph.node):
        node.name = f"n{i}"
    return ir.from_proto(onnx.shape_inference.infer_shapes(model)).graph


def test_decomposed_layer_norm() -> None:
    body = """
      m = ReduceMean(x, axes)
      d = Sub(x, m)
      p = Pow(d, two)
      v = ReduceMean(p, axes)
      e = Add(v, eps)
      s = Sqrt(e)
      n = Div(d, s)
      g = Mul(gamma, n)
      y = Add(g, beta)
    """
    inits = (
        "<int64[1] axes = {-1}, float two = {2.0}, float eps = {1e-5},"
        " float[4] gamma = {1,1,1,1}, float[4] beta = {0,0,0,0}>"
    )
    g = graph(body, "(float[2,4] x) => (float[2,4] y)", inits)
    (match,) = find_composites(g, [library.LAYER_NORM.rule()])
    assert len(match.nodes) == 9
    assert {"x", "scale", "bias", "epsilon", "mean", "norm"} <= set(match.captures)
    # Without the affine tail the Div is the end of the pattern.
    g = graph(
        body.split("g = Mul")[0] + "y = Identity(n)",
        "(float[2,4] x) => (float[2,4] y)",
        inits,
    )
    (match,) = find_composites(g, [library.LAYER_NORM.rule()])
    assert [n.op_type for n in match.nodes][-1] == "Div" and "scale" not in match.captures


def test_erf_gelu_with_division_and_attention_with_mask() -> None:
    gelu = """
      h = MatMul(x, w)
      b = Add(h, bias)
      q = Div(b, sqrt2)
      e = Erf(q)
      o = Add(one, e)
      t = Mul(half, b)
      y = Mul(o, t)
    """
    inits = (
        "<float[4,4] w = {"
        + ",".join(["0.1"] * 16)
        + "}, float[4] bias = {0,0,0,0}, float sqrt2 = {1.4142135}, float one = {1.0}, float half = {0.5}>"
    )
    g = graph(gelu, "(float[2,4] x) => (float[2,4] y)", inits)
    (match,) = find_composites(g, [library.MATMUL_ADD_GELU.rule()])
    assert len(match.nodes) == 7 and match.captures["gelu"] is match.nodes[-1]
    attention = """
      s = MatMul(q, k)
      d = Div(s, scale)
      a = Add(mask, d)
      p = Softmax <axis=-1> (a)
      y = MatMul(p, v)
    """
    sig = "(float[1,2,3,4] q, float[1,2,4,3] k, float[1,2,3,4] v, float[1,1,3,3] mask) => (float[1,2,3,4] y)"
    g = graph(attention, sig, "<float scale = {2.0}>")
    (match,) = find_composites(g, [library.ATTENTION.rule()])
    assert len(match.nodes) == 5 and match.captures["mask"].name == "mask"  # type: ignore[union-attr]


def test_a_backend_check_on_a_library_pattern_declines_with_its_reason() -> None:
    g = light_graph("resnet50")

    def no_wide_kernels(c: dict[str, ir.Value | ir.Node]) -> Support:
        conv = c["conv"]
        assert isinstance(conv, ir.Node)
        kernel = conv.attributes["kernel_shape"].value
        return Support.no(f"kernel {kernel[0]}x{kernel[1]} not supported") if kernel[0] > 3 else Support.yes()

    result = find_composites(g, [library.CONV_BIAS_ACT.rule(no_wide_kernels, name="conv_bn_relu")])
    first_conv = next(n for n in g if n.op_type == "Conv")
    assert result.match_of(first_conv) is None
    assert result.reasons(first_conv) == ("pattern conv_bn_relu: kernel 7x7 not supported",)
    assert len(result) == 52


def test_library_lookup() -> None:
    assert library.names() == (
        "conv_bias_act",
        "gemm_bias_act",
        "matmul_add_gelu",
        "layer_norm",
        "attention",
    )
    assert library.get("attention") is library.ATTENTION
    with pytest.raises(KeyError, match="known: conv_bias_act"):
        library.get("nope")
