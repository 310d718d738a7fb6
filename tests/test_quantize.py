"""Static int8 QDQ quantization: structure, and error against float32 on a small CNN."""

from __future__ import annotations

import collections
import zlib

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

from codegraft.passes import QuantizeOptions, quantize_int8, sample_feeds_for
from codegraft.passes.precision_check import relative_error
from codegraft.testing import run_onnxruntime

# The QDQ model's outputs stay within this relative error (max |q - f| / max |f|) of float32
# on inputs like the calibration samples.
TOLERANCE = 0.05


def _init(name: str, *shape: int) -> onnx.TensorProto:
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
    return numpy_helper.from_array((rng.uniform(-1, 1, shape) * np.sqrt(3 / fan_in)).astype(np.float32), name)


def _small_cnn() -> ir.Model:
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["c1"], ["r1"]),
            helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
            helper.make_node("Conv", ["p1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["c2"], ["r2"]),
            helper.make_node("GlobalAveragePool", ["r2"], ["g"]),
            helper.make_node("Flatten", ["g"], ["f"]),
            helper.make_node("Gemm", ["f", "fc", "fcb"], ["y"], transB=1),
        ],
        "small_cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
        [_init("w1", 8, 3, 3, 3), _init("b1", 8), _init("w2", 16, 8, 3, 3), _init("b2", 16),
         _init("fc", 10, 16), _init("fcb", 10)],
    )  # fmt: skip
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return ir.serde.deserialize_model(proto)


def _error(quantized: ir.Model, original: ir.Model, samples: list[dict[str, np.ndarray]]) -> float:
    q, f = ir.serde.serialize_model(quantized), ir.serde.serialize_model(original)
    return max(relative_error(run_onnxruntime(q, s)["y"], run_onnxruntime(f, s)["y"]) for s in samples)


def test_qdq_small_cnn_within_tolerance() -> None:
    model = _small_cnn()
    calibration = sample_feeds_for(model, 16, seed=0)
    result = quantize_int8(model, calibration)
    ops = collections.Counter(n.op_type for n in result.model.graph)
    assert ops["Conv"] == 2 and ops["Gemm"] == 1  # QDQ: the float ops stay, wrapped
    assert result.quantize_nodes == ops["QuantizeLinear"] > 0
    assert result.dequantize_nodes == ops["DequantizeLinear"] > result.quantize_nodes  # weights too
    assert len(result.quantized_ops) >= 3
    assert [v.name for v in result.model.graph.inputs] == ["x"]
    assert [(v.name, v.dtype) for v in result.model.graph.outputs] == [("y", ir.DataType.FLOAT)]
    weights = {v.dtype for v in result.model.graph.initializers.values() if v.name in ("w1_quantized", "w2_quantized")}
    assert weights == {ir.DataType.INT8}
    assert model.graph.initializers["w1"].dtype == ir.DataType.FLOAT  # input not modified
    error = _error(result.model, model, sample_feeds_for(model, 4, seed=1))
    print(f"int8 QDQ relative error {error:.3g}")
    assert 0 < error < TOLERANCE


def test_options_exclude_and_op_types() -> None:
    model = _small_cnn()
    calibration = sample_feeds_for(model, 4, seed=0)
    only_conv = quantize_int8(model, calibration, QuantizeOptions(op_types=("Conv",), per_channel=False))
    readers = collections.Counter(n.op_type for n in only_conv.model.graph if n.name in only_conv.quantized_ops)
    assert set(readers) <= {"Conv", "Relu", "MaxPool"} and readers["Conv"] == 2
    with pytest.raises(ValueError, match="calibration sample"):
        quantize_int8(model, [])


def test_light_squeezenet_opset9_is_upgraded_and_within_tolerance() -> None:
    from codegraft.testing import light_model

    proto = light_model("squeezenet")  # opset 9: QDQ needs 13
    model = ir.serde.deserialize_model(proto)
    result = quantize_int8(model, sample_feeds_for(model, 4))
    assert result.model.opset_imports[""] == 13
    output = proto.graph.output[0].name
    quantized = ir.serde.serialize_model(result.model)
    errors = [
        relative_error(run_onnxruntime(quantized, s)[output], run_onnxruntime(proto, s)[output])
        for s in sample_feeds_for(model, 2, seed=5)
    ]
    print(f"squeezenet int8 QDQ relative error {max(errors):.3g}")
    assert max(errors) < TOLERANCE
