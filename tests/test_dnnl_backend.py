"""The dnnl backend: oneDNN primitives from generated C, checked against onnxruntime.

Every light model (random weights) runs whole on dnnl within 1e-4 relative; the op table of
``codegraft.testing.check_ops`` passes for every op it takes and names the ones it declines;
fused groups (Conv + bias + residual sum + activation, Gemm + bias + activation) reach the
report, its JSON and the SVG; the sum post-op never writes over a value someone still reads.
"""

from __future__ import annotations

import json
import pathlib
import shutil

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

import codegraft as cg
from codegraft.testing import OP_CASES, assert_close, check_ops, light_model, random_feeds, run_onnxruntime


def _available() -> str:
    from codegraft.backends.dnnl import DnnlBackend

    return DnnlBackend().unavailable_reason() or ""


pytestmark = pytest.mark.skipif(bool(_available()), reason=f"dnnl backend unavailable: {_available()}")


def _backend() -> cg.Backend:
    from codegraft.backends.dnnl import DnnlBackend

    return DnnlBackend(num_threads=2)


def test_unavailable_without_onednn_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import codegraft.backends.dnnl as dnnl
    from codegraft.backends.dnnl._library import OneDNNNotFound

    def missing() -> object:
        raise OneDNNNotFound("oneDNN is not installed (onednn-cpu-gomp not found): pip install 'codegraft[dnnl]'")

    monkeypatch.setattr(dnnl, "find_onednn", missing)
    with pytest.raises(cg.BackendUnavailable, match=r"backend 'dnnl' is unavailable: .*codegraft\[dnnl\]"):
        cg.get_backend("dnnl")


def test_op_by_op_conformance() -> None:
    results = check_ops(_backend())
    wrong = [str(r) for r in results if r.placed and not r.passed]
    assert not wrong, wrong
    # a new decline shows up here: Erf has no oneDNN primitive (only inside GELU)
    assert {r.op_type for r in results if not r.placed} == {"Erf"}
    assert len(results) == len(OP_CASES)


FAST_MODELS = ["squeezenet", "resnet50", "shufflenet", "densenet121"]
HEAVY_MODELS = ["bvlc_alexnet", "inception_v1", "inception_v2", "vgg19", "zfnet512"]


def _whole_model_on_dnnl(name: str) -> None:
    model = light_model(name)
    exe = cg.compile(model, targets=[_backend()], strict=True)
    report = exe.report()
    assert report.nodes_per_backend() == {"dnnl": len(report.nodes)}, report.render()
    assert report.composites_per_backend()["dnnl"] > 0
    feeds = random_feeds(model)
    assert_close(exe.run(feeds), run_onnxruntime(model, feeds), rtol=1e-4)


@pytest.mark.parametrize("name", FAST_MODELS)
def test_light_model_whole_on_dnnl(name: str) -> None:
    _whole_model_on_dnnl(name)


@pytest.mark.heavy
@pytest.mark.parametrize("name", HEAVY_MODELS)
def test_heavy_light_model_whole_on_dnnl(name: str) -> None:
    _whole_model_on_dnnl(name)


def test_resnet50_fuses_residual_sums_and_shows_composites(tmp_path: pathlib.Path) -> None:
    exe = cg.compile(light_model("resnet50"), targets=[_backend()], strict=True)
    report = exe.report()
    instances = {n.composite for n in report.nodes if n.composite}
    sums = {n.composite for n in report.nodes if n.op_type == "Sum" and n.composite}
    assert len(sums) == 16 and all(i.startswith("dnnl.conv_sum_act_") for i in sums)  # every residual fused
    assert any(i.startswith("dnnl.gemm_bias_act_") for i in instances)
    assert report.composites_per_backend() == {"dnnl": len(instances)}
    data = json.loads(report.to_json())
    assert sum(1 for n in data["nodes"] if n["composite"]) == sum(1 for n in report.nodes if n.composite)
    exe.save(tmp_path / "r.cgx")
    loaded = cg.load_executable(tmp_path / "r.cgx")
    feeds = random_feeds(light_model("resnet50"))
    assert_close(loaded.run(feeds), exe.run(feeds), rtol=1e-6)


@pytest.mark.skipif(shutil.which("dot") is None, reason="graphviz's dot is not installed")
def test_inspect_json_and_svg_show_composites(tmp_path: pathlib.Path) -> None:
    from codegraft.cli.main import app

    model = tmp_path / "squeezenet.onnx"
    onnx.save(light_model("squeezenet"), model)
    svg = tmp_path / "parts.svg"
    result = CliRunner().invoke(app, ["inspect", str(model), "-t", "dnnl", "--json", "--svg", str(svg)])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout[: result.stdout.rindex("}") + 1])
    composites = {n["composite"] for n in data["nodes"] if n["composite"]}
    assert len(composites) == 26  # every Conv+Relu
    assert "dnnl.conv_sum_act_0" in svg.read_text()


def _residual_model(*, residual_is_input: bool, residual_read_later: bool) -> onnx.ModelProto:
    """y = Relu(Conv(x) + r) with r a graph input or computed; optionally r is read again after."""
    rng = np.random.default_rng(1)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 8, 3, 3)).astype(np.float32) * 0.2, "w"),
             numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv")]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 6, 6])]
    if residual_is_input:
        inputs.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, [1, 8, 6, 6]))
    else:
        nodes.append(helper.make_node("Sigmoid", ["x"], ["r"], name="residual"))
    nodes += [
        helper.make_node("Add", ["c", "r"], ["s"], name="sum"),
        helper.make_node("Relu", ["s"], ["y"], name="act"),
    ]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 6, 6])]
    if residual_read_later:
        nodes.append(helper.make_node("Mul", ["y", "r"], ["z"], name="later"))
        outputs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 8, 6, 6]))
    graph = helper.make_graph(nodes, "residual", inputs, outputs, initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize(("residual_is_input", "residual_read_later"), [(False, False), (False, True), (True, False)])
def test_sum_post_op_never_overwrites_a_live_value(residual_is_input: bool, residual_read_later: bool) -> None:
    model = _residual_model(residual_is_input=residual_is_input, residual_read_later=residual_read_later)
    exe = cg.compile(model, targets=[_backend()], strict=True)
    assert {n.composite for n in exe.report().nodes if n.name in ("conv", "sum", "act")} == {"dnnl.conv_sum_act_0"}
    feeds = random_feeds(model)
    kept = {k: v.copy() for k, v in feeds.items()}
    assert_close(exe.run(feeds), run_onnxruntime(model, kept))
    for name, array in kept.items():  # the caller's arrays are not written
        np.testing.assert_array_equal(feeds[name], array)


def test_pattern_checks_decline_with_reasons() -> None:
    import onnx_ir as ir

    from codegraft.plan.annotate import annotate

    rng = np.random.default_rng(2)
    inits = [numpy_helper.from_array(rng.standard_normal((4, 4, 1, 1)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal((1, 1, 1, 5)).astype(np.float32), "row")]
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
         helper.make_node("Add", ["c", "row"], ["y"], name="add_row")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 5, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 5, 5])], initializer=inits)
    model = ir.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    annotation = annotate(model.graph, [_backend()], host="onnxruntime")
    reasons = [d.reason for ds in annotation.declines for d in ds]
    wanted = "pattern conv_sum_act: the bias Add's shape [1, 1, 1, 5] is not per output channel"
    assert any(wanted in reason for reason in reasons), reasons
    add = next(i for i, info in enumerate(annotation.infos) if info.node.name == "add_row")
    assert annotation.units[annotation.unit_of_node[add]].composite is None  # a binary primitive of its own


def test_supports_declines_what_onednn_cannot_map() -> None:
    import onnx_ir as ir

    from codegraft.backends.dnnl._support import supports

    text = """<ir_version: 8, opset_import: ["" : 11]>
    g (float[1,6,5,5] x, float[2,3] a) => (float[1,6,5,5] y, float[2,3] s) {
        y = Conv <group = 4> (x, w)
        s = Softmax <axis = 0> (a)
    }"""
    model = ir.from_onnx_text(text)
    weight = ir.Value(name="w", const_value=ir.tensor(np.zeros((6, 1, 1, 1), np.float32), name="w"))
    conv, softmax = list(model.graph)
    conv.replace_input_with(1, weight)
    assert supports(conv).reason == "Conv: group=4 does not divide the 6 output channels"
    assert "only the last axis" in supports(softmax).reason


def test_layer_normalization_over_several_axes() -> None:
    from codegraft.testing import OpCase

    rng = np.random.default_rng(3)
    scale, bias = (rng.standard_normal((3, 4)).astype(np.float32) for _ in range(2))
    cases = [OpCase("LayerNormalization axis 1", "LayerNormalization", [(2, 3, 4)], [("g", scale), ("b", bias)],
                    {"axis": 1, "epsilon": 1e-3})]
    (result,) = check_ops(_backend(), cases)
    assert result.passed, str(result)
