"""LayerNormalization in models importing an opset before 17, as onnxruntime runs them.

onnxruntime registers its own LayerNormalization for opsets 1-16 (its transformer optimizer
writes it there); the onnx checker refuses it.  codegraft reads such a model as opset 17:
found on pnm's int8 phoneme decoder (opset 16), refused before as "not a valid ONNX model".
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import onnxruntime as ort
import pytest

import codegraft as cg
from codegraft.core.irversion import readable_by_runtime
from codegraft.errors import ModelError


def _model(opset: int, output_shape: list[int] | None = None) -> onnx.ModelProto:
    # an Unsqueeze whose form changed at opset 13: the conversion must rewrite it
    unsqueeze = (oh.make_node("Unsqueeze", ["x"], ["u"], axes=[0]) if opset < 13
                 else oh.make_node("Unsqueeze", ["x", "axes"], ["u"]))
    nodes = [unsqueeze, oh.make_node("LayerNormalization", ["u", "g", "b"], ["y"], axis=-1, epsilon=1e-5)]
    rng = np.random.default_rng(0)
    initializers = [onnx.numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "g"),
                    onnx.numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b")]
    if opset >= 13:
        initializers.append(onnx.numpy_helper.from_array(np.array([0], np.int64), "axes"))
    graph = oh.make_graph(nodes, "ln", [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [4, 8])],
                          [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, output_shape)], initializers)
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", opset)])


@pytest.mark.parametrize("opset", [11, 13, 16])
@pytest.mark.parametrize("targets", [["c"], []])
@pytest.mark.parametrize("output_shape", [[1, 4, 8], None])
def test_read_as_opset_17_and_right(opset: int, targets: list[str], output_shape: list[int] | None) -> None:
    model = _model(opset, output_shape)
    x = np.random.default_rng(1).standard_normal((4, 8)).astype(np.float32)
    session = ort.InferenceSession(readable_by_runtime(model).SerializeToString(), providers=["CPUExecutionProvider"])
    (want,) = session.run(None, {"x": x})
    exe = cg.compile(model, targets)
    np.testing.assert_allclose(exe.run({"x": x})["y"], want, rtol=1e-5, atol=1e-6)


def test_a_model_the_converter_cannot_take_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from onnx import version_converter

    def fail(model: onnx.ModelProto, version: int) -> onnx.ModelProto:
        raise RuntimeError("No Adapter For Some op")

    monkeypatch.setattr(version_converter, "convert_version", fail)
    model = _model(11)
    with pytest.raises(ModelError, match="LayerNormalization, an opset-17 op, but imports opset 11"):
        cg.compile(model, ["c"])
