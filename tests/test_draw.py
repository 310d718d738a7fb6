"""Pictures: the DOT text always; the SVG and HTML when Graphviz's ``dot`` is installed."""

from __future__ import annotations

import pathlib
import re
import shutil

import onnx
import onnx.parser
import onnx_ir as ir
import pytest

from codegraft.errors import CodegraftError
from codegraft.report import draw as _draw
from codegraft.report.draw import (
    HOST_COLOUR,
    PALETTE,
    DrawNode,
    DrawOptions,
    GraphvizNotFound,
    backend_colours,
    draw,
    nodes_from_report,
    to_dot,
    write_html,
    write_svg,
)
from codegraft.report.report import NodeReport, Report

needs_dot = pytest.mark.skipif(
    shutil.which("dot") is None, reason="Graphviz's dot is not installed (apt-get install graphviz)"
)

NODES = [
    DrawNode("conv0", "Conv", "mine", "p0", ("x", "w0"), ("c0",), "mine.conv_bias_act_0"),
    DrawNode("relu0", "Relu", "mine", "p0", ("c0",), ("r0",), "mine.conv_bias_act_0"),
    DrawNode("lrn", "LRN", "onnxruntime", "p1", ("r0",), ("l",)),
    DrawNode("conv1", "Conv", "mine", "p2", ("l", "w1"), ("c1",)),
    DrawNode("add", "Add", "mine", "p2", ("c1", "r0"), ("a",)),
    DrawNode("soft", "Softmax", "other", "p3", ("a",), ("y",)),
]


def test_colours_are_per_backend_and_the_host_is_grey() -> None:
    assert backend_colours(NODES) == {"mine": PALETTE[0], "onnxruntime": HOST_COLOUR, "other": PALETTE[1]}


def test_dot_boxes_partitions_and_composites() -> None:
    text = to_dot(NODES, DrawOptions(graph_inputs=("x",), graph_outputs=("y",), title="demo"))
    assert text.startswith("digraph codegraft {") and text.rstrip().endswith("}")
    assert text.count("subgraph cluster_p") == 4 + 1  # four partitions, one composite
    assert '"p1 · onnxruntime (1 node)"' in text
    assert '"p0 · mine (2 nodes)"' in text and '"p2 · mine (2 nodes)"' in text
    assert '"mine.conv_bias_act_0"' in text
    # Every node is drawn once, filled with its backend's colour.
    for node in NODES:
        (line,) = [ln for ln in text.splitlines() if ln.strip().startswith(f"{node.name} [")]
        assert f'fillcolor="{backend_colours(NODES)[node.backend]}"' in line
    edges = set(re.findall(r"(\w+) -> (\w+)", text))
    # Node ids are the names the report prints (--json, --details).
    assert edges == {
        ("in0", "conv0"),
        ("conv0", "relu0"),
        ("relu0", "lrn"),
        ("lrn", "conv1"),
        ("conv1", "add"),
        ("relu0", "add"),
        ("add", "soft"),
        ("soft", "out0"),
    }


def test_collapsed_dot_has_one_box_per_partition_with_counts() -> None:
    text = to_dot(NODES, DrawOptions(graph_inputs=("x",), graph_outputs=("y",), collapse=True))
    assert "cluster" not in text
    boxes = re.findall(r'^  (p\d) \[label="([^"]*)"', text, flags=re.MULTILINE)
    assert boxes == [
        ("p0", "p0\\nmine\\n2 nodes"),
        ("p1", "p1\\nonnxruntime\\n1 node"),
        ("p2", "p2\\nmine\\n2 nodes"),
        ("p3", "p3\\nother\\n1 node"),
    ]
    edges = set(re.findall(r"(\w+) -> (\w+)", text))
    assert edges == {("in0", "p0"), ("p0", "p1"), ("p1", "p2"), ("p0", "p2"), ("p2", "p3"), ("p3", "out0")}


def test_names_are_escaped() -> None:
    node = DrawNode('we"ird\\name', "Relu", 'back"end', "p0", ("x",), ("y",))
    text = to_dot([node], DrawOptions(graph_inputs=("x",)))
    assert 'we\\"ird\\\\name' in text and 'back\\"end' in text


def test_constant_only_nodes_are_counted_but_hidden_unless_asked() -> None:
    nodes = [
        DrawNode("w", "ConstantOfShape", "onnxruntime", "p0", ("w_shape",), ("w",)),
        DrawNode("only_const", "ConstantOfShape", "onnxruntime", "p1", ("b_shape",), ("b",)),
        DrawNode("conv", "Conv", "onnxruntime", "p0", ("x", "w", "b"), ("y",)),
    ]
    options = DrawOptions(graph_inputs=("x",), graph_outputs=("y",))
    text = to_dot(nodes, options)
    assert '"p0 · onnxruntime (2 nodes, 1 constant hidden)"' in text
    assert "ConstantOfShape" not in text and "p1" not in text
    assert set(re.findall(r"(\w+) -> (\w+)", text)) == {("in0", "conv"), ("conv", "out0")}
    shown = to_dot(nodes, DrawOptions(graph_inputs=("x",), show_constants=True))
    assert shown.count('[label="ConstantOfShape') == 2 and ("w", "conv") in set(re.findall(r"(\w+) -> (\w+)", shown))


def test_missing_graphviz_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    monkeypatch.setattr(_draw.shutil, "which", lambda name: None)
    with pytest.raises(GraphvizNotFound, match="apt-get install graphviz"):
        write_svg(NODES, tmp_path / "out.svg")
    assert not (tmp_path / "out.svg").exists()


@needs_dot
def test_svg_and_html(tmp_path: pathlib.Path) -> None:
    svg = write_svg(NODES, tmp_path / "out.svg", DrawOptions(graph_inputs=("x",), graph_outputs=("y",))).read_text()
    assert "<svg" in svg and "p0 · mine (2 nodes)" in svg and "mine.conv_bias_act_0" in svg
    page = write_html(NODES, tmp_path / "out.html", DrawOptions(collapse=True, title="demo <model>")).read_text()
    assert page.startswith("<!DOCTYPE html>") and "<?xml" not in page
    assert "<svg" in page and "demo &lt;model&gt;" in page
    assert re.search(r"mine</td><td>4</td><td>2</td>", page)
    assert re.search(r"onnxruntime \(host\)</td><td>1</td><td>1</td>", page)


def _model() -> ir.Model:
    text = """<ir_version: 8, opset_import: ["" : 18]>
    g (float[1,4] x) => (float[1,4] y) {
      a = Relu(x)
      b = Sigmoid(a)
      y = Add(a, b)
    }"""
    proto = onnx.parser.parse_model(text)
    for i, node in enumerate(proto.graph.node):
        node.name = f"n{i}"
    return ir.from_proto(proto)


def _report() -> Report:
    nodes = (
        NodeReport("n0", "Relu", "mine", "p0"),
        NodeReport("n1", "Sigmoid", "onnxruntime", "p1", declined=(("mine", "Sigmoid is not implemented"),)),
        NodeReport("n2", "Add", "mine", "p2"),
    )
    return Report(("mine",), "onnxruntime", nodes, ())


def test_nodes_from_report_take_value_names_from_the_graph() -> None:
    drawn = nodes_from_report(_report(), _model().graph)
    assert [(d.name, d.backend, d.inputs, d.outputs) for d in drawn] == [
        ("n0", "mine", ("x",), ("a",)),
        ("n1", "onnxruntime", ("a",), ("b",)),
        ("n2", "mine", ("a", "b"), ("y",)),
    ]


def test_draw_writes_dot_by_suffix(tmp_path: pathlib.Path) -> None:
    text = draw(_report(), _model(), tmp_path / "model.dot").read_text()
    assert '"g: mine (host onnxruntime)"' in text
    assert set(re.findall(r"(\w+) -> (\w+)", text)) == {
        ("in0", "n0"),
        ("n0", "n1"),
        ("n0", "n2"),
        ("n1", "n2"),
        ("n2", "out0"),
    }
    with pytest.raises(CodegraftError, match="cannot draw as 'png'"):
        draw(_report(), _model(), tmp_path / "model.png")


@needs_dot
def test_draw_html_from_a_report(tmp_path: pathlib.Path) -> None:
    page = draw(_report(), _model(), tmp_path / "model.html", collapse=True).read_text()
    assert "<svg" in page and "mine</td><td>2</td><td>2</td>" in page


def test_big_models_are_drawn_collapsed_by_default(tmp_path: pathlib.Path) -> None:
    from codegraft.report.draw import COLLAPSE_ABOVE

    def chain(n: int) -> tuple[Report, ir.Model]:
        body = "\n".join(f"  v{i + 1} = Relu(v{i})" for i in range(n))
        proto = onnx.parser.parse_model(
            f'<ir_version: 8, opset_import: ["" : 18]>\ng (float[1,4] v0) => (float[1,4] v{n}) {{\n{body}\n}}'
        )
        for i, node in enumerate(proto.graph.node):
            node.name = f"r{i}"
        nodes = tuple(NodeReport(f"r{i}", "Relu", "mine", f"p{i // 100}") for i in range(n))
        return Report(("mine",), "onnxruntime", nodes, ()), ir.from_proto(proto)

    big = draw(*chain(COLLAPSE_ABOVE + 1), tmp_path / "big.dot").read_text()
    assert "cluster" not in big and '"p3\\nmine\\n1 node"' in big
    small = draw(*chain(COLLAPSE_ABOVE), tmp_path / "small.dot").read_text()
    assert "subgraph cluster_p0" in small and 'label="1x4"' in small
    expanded = draw(*chain(COLLAPSE_ABOVE + 1), tmp_path / "x.dot", collapse=False).read_text()
    assert "subgraph cluster_p0" in expanded
