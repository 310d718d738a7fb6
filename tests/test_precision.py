"""float16 / bfloat16 conversion: casts only at edges, the self-check, the light models.

onnxruntime's CPU has no bfloat16 kernels and runs many float16 ops in float32 behind the
scenes (it casts around kernels it lacks and merges the casts, so a float16 overflow between
two such ops goes unseen).  Converted models are therefore run through :func:`_emulate`:
every 16-bit value is computed in float32 and then rounded to 16 bits (a Cast there and
back), which is what 16-bit hardware with float32 accumulators does too.
"""

from __future__ import annotations

import collections
import functools
import zlib

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

from codegraft.passes import (
    DEFAULT_BLOCKLIST,
    convert_precision,
    convert_precision_checked,
    convert_precision_detailed,
    sample_feeds_for,
)
from codegraft.passes.precision_check import relative_error
from codegraft.testing import light_model, random_feeds, run_onnxruntime


def _init(name: str, *shape: int, scale: float = 0.3) -> onnx.TensorProto:
    """Random weights that depend only on the name, so rebuilt models are identical."""
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)


def _cnn(opset: int = 17) -> onnx.ModelProto:
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["c1"], ["r1"]),
            helper.make_node("Exp", ["r1"], ["e"]),  # block-listed: float32, casts around it
            helper.make_node("MaxPool", ["e"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
            helper.make_node("Shape", ["p"], ["shape"]),  # reads a float16 value: no cast
            helper.make_node("Conv", ["p", "w2"], ["c2"]),
            helper.make_node("GlobalAveragePool", ["c2"], ["g"]),
            helper.make_node("Flatten", ["g"], ["f"]),
            helper.make_node("Gemm", ["f", "fc", "fcb"], ["y"], transB=1),
        ],
        "cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 5]),
            helper.make_tensor_value_info("shape", TensorProto.INT64, [4]),
        ],
        [_init("w1", 4, 3, 3, 3), _init("b1", 4), _init("w2", 6, 4, 3, 3), _init("fc", 5, 6),
         _init("fcb", 5)],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _ort(model: ir.Model, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return run_onnxruntime(ir.serde.serialize_model(model), feeds)


def _emulate(model: ir.Model, low: ir.DataType = ir.DataType.FLOAT16) -> ir.Model:
    """16-bit storage, float32 arithmetic: runnable on onnxruntime's CPU kernels."""
    graph = model.graph
    for value in list(graph.initializers.values()):
        if value.dtype == low and value.const_value is not None:
            array = value.const_value.numpy().astype(np.float32)
            value.const_value = ir.tensor(array, name=value.name)
            value.type = ir.TensorType(ir.DataType.FLOAT)
    for node in list(graph):
        for out in node.outputs:
            if out.dtype != low:
                continue
            is_cast = node.op_type == "Cast"
            out.type = ir.TensorType(ir.DataType.FLOAT)
            down = ir.Node("", "Cast", [out], [ir.AttrInt64("to", int(low))])
            up = ir.Node("", "Cast", [down.outputs[0]], [ir.AttrInt64("to", int(ir.DataType.FLOAT))])
            if is_cast:  # Cast(to=16 bits) itself becomes Cast(to=float32) + the round trip
                node.attributes["to"] = ir.AttrInt64("to", int(ir.DataType.FLOAT))
            ir.convenience.replace_all_uses_with(out, up.outputs[0])
            down.replace_input_with(0, out)
            graph.insert_after(node, [down, up])
    return model


def _run16(model: ir.Model, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run a float32, float16 or bfloat16 model faithfully (see the module note)."""
    model = _emulate(_emulate(model.clone(), ir.DataType.FLOAT16), ir.DataType.BFLOAT16)
    return _ort(model, feeds)


def _casts(model: ir.Model) -> int:
    return sum(1 for n in model.graph if n.op_type == "Cast")


def test_float16_casts_only_at_edges_and_around_blocklisted_ops() -> None:
    proto = _cnn()
    model = ir.serde.deserialize_model(proto)
    result = convert_precision_detailed(model, "float16")
    # x down; Exp's input up and its output down; y up.  Shape reads float16 directly.
    assert result.casts_inserted == _casts(model) == 4
    assert [k.op_type for k in result.kept_float32] == ["Exp"]
    assert result.kept_float32[0].reason == "block-listed op"
    weights = {v.name: v.dtype for v in model.graph.initializers.values()}
    assert set(weights.values()) == {ir.DataType.FLOAT16}  # converted, no float32 copy kept
    assert [(o.name, o.dtype) for o in model.graph.outputs] == [
        ("y", ir.DataType.FLOAT),
        ("shape", ir.DataType.INT64),
    ]
    assert model.graph.inputs[0].dtype == ir.DataType.FLOAT
    converted = ir.serde.serialize_model(model)
    onnx.checker.check_model(converted, full_check=True)
    feeds = random_feeds(proto, dim_values={"N": 2})
    got, want = run_onnxruntime(converted, feeds), run_onnxruntime(proto, feeds)
    assert relative_error(got["y"], want["y"]) < 1e-2
    np.testing.assert_array_equal(got["shape"], want["shape"])


def test_empty_blocklist_converts_everything() -> None:
    model = ir.serde.deserialize_model(_cnn())
    result = convert_precision_detailed(model, "float16", keep_float32_ops=frozenset())
    assert result.kept_float32 == ()
    assert _casts(model) == 2


def test_bfloat16_needs_an_opset_whose_schema_has_it() -> None:
    """Conv has a bfloat16 form from opset 22 only; before that it stays float32, and says so."""
    old = convert_precision_detailed(ir.serde.deserialize_model(_cnn(17)), "bfloat16")
    assert {k.op_type for k in old.kept_float32} >= {"Conv", "MaxPool", "GlobalAveragePool"}
    assert "no bfloat16 form of Conv at opset 17" in {k.reason for k in old.kept_float32}
    model = ir.serde.deserialize_model(_cnn(22))
    new = convert_precision_detailed(model, "bfloat16")
    assert [k.op_type for k in new.kept_float32] == ["Exp"]
    onnx.checker.check_model(ir.serde.serialize_model(model), full_check=True)
    feeds = sample_feeds_for(model, 1, dim_values={"N": 3})[0]
    reference = _ort(ir.serde.deserialize_model(_cnn(22)), feeds)
    got = _run16(model, feeds)
    assert 0 < relative_error(got["y"], reference["y"]) < 5e-2


def test_sample_feeds_for_declared_shapes() -> None:
    model = ir.serde.deserialize_model(_cnn())
    samples = sample_feeds_for(model, 3, seed=1, dim_values={"N": 2})
    assert len(samples) == 3
    assert samples[0]["x"].shape == (2, 3, 8, 8) and samples[0]["x"].dtype == np.float32
    assert not np.array_equal(samples[0]["x"], samples[1]["x"])
    again = sample_feeds_for(model, 3, seed=1, dim_values={"N": 2})
    np.testing.assert_array_equal(samples[2]["x"], again[2]["x"])


def test_checked_conversion_within_tolerance_moves_nothing() -> None:
    model = ir.serde.deserialize_model(_cnn())
    samples = sample_feeds_for(model, 2, dim_values={"N": 2})
    result = convert_precision_checked(model, "float16", samples, _run16)
    assert result.within_tolerance and result.rounds == 0
    assert result.moved_to_float32 == ()
    assert 0 < result.error < result.tolerance == 1e-2
    assert model.graph.initializers["w1"].dtype == ir.DataType.FLOAT  # input left alone


def _overflowing_model() -> onnx.ModelProto:
    """x*300 squared passes float16's 65504: the Mul and what reads it must go back."""
    graph = helper.make_graph(
        [
            helper.make_node("Mul", ["x", "big"], ["a"]),
            helper.make_node("Mul", ["a", "a"], ["sq"]),  # up to ~1e6: inf in float16
            helper.make_node("Mul", ["sq", "small"], ["s"]),  # back to ~1
            helper.make_node("Relu", ["s"], ["r"]),
            helper.make_node("Add", ["r", "x"], ["y"]),
        ],
        "overflow",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16])],
        [
            numpy_helper.from_array(np.array(300.0, np.float32), "big"),
            numpy_helper.from_array(np.array(1e-5, np.float32), "small"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_checked_conversion_moves_overflowing_ops_back() -> None:
    model = ir.serde.deserialize_model(_overflowing_model())
    samples = sample_feeds_for(model, 2)
    result = convert_precision_checked(model, "float16", samples, _run16)
    assert result.initial_error == float("inf")
    assert result.within_tolerance and result.error < 1e-2
    moved = {m.op_type for m in result.moved_to_float32}
    assert moved == {"Mul"}
    assert "sq" in {
        o.name for n in result.model.graph if n.op_type == "Mul" for o in n.outputs if o.dtype == ir.DataType.FLOAT
    }
    assert all("tolerance" in m.reason for m in result.moved_to_float32)
    out = _ort(result.model, samples[0])
    want = _ort(ir.serde.deserialize_model(_overflowing_model()), samples[0])
    assert relative_error(out["y"], want["y"]) < 1e-2


def test_checked_conversion_reports_when_rounds_run_out() -> None:
    model = ir.serde.deserialize_model(_overflowing_model())
    result = convert_precision_checked(model, "float16", sample_feeds_for(model, 1), _run16, max_rounds=0)
    assert not result.within_tolerance and result.moved_to_float32 == ()


@functools.cache
def _light(name: str) -> onnx.ModelProto:
    return light_model(name)


@pytest.mark.parametrize("name", ["resnet50", "squeezenet", "densenet121"])
def test_light_models_in_float16(name: str) -> None:
    proto = _light(name)
    model = ir.serde.deserialize_model(proto)
    result = convert_precision_checked(model, "float16", sample_feeds_for(model, 1), _run16)
    assert result.within_tolerance, result
    assert result.casts_inserted == 2  # the input down, the output up
    ops = collections.Counter(n.op_type for n in result.model.graph)
    assert ops["Cast"] == 2
    print(f"{name}: float16 relative error {result.error:.2e}")


def test_default_blocklist_is_frozen() -> None:
    assert "Exp" in DEFAULT_BLOCKLIST and isinstance(DEFAULT_BLOCKLIST, frozenset)
    with pytest.raises(ValueError, match="precision must be one of"):
        convert_precision(ir.serde.deserialize_model(_cnn()), "int4")  # type: ignore[arg-type]


def test_nhwc_partition_in_float16() -> None:
    """The core's order for an NHWC float16 backend: layout first, then the checked precision."""
    from codegraft.passes import lower_nhwc, to_nhwc

    proto = _light("squeezenet")
    model = ir.serde.deserialize_model(proto)
    layout = to_nhwc(model)
    assert layout.transposes_inserted == 1

    def evaluate(m: ir.Model, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return _run16(lower_nhwc(m), feeds)

    samples = sample_feeds_for(model, 1)
    result = convert_precision_checked(layout.model, "float16", samples, evaluate)
    assert result.within_tolerance and result.casts_inserted == 2
    assert all(n.domain == "codegraft.nhwc" for n in result.model.graph if n.op_type == "Conv")
    reference = run_onnxruntime(proto, samples[0])
    got = evaluate(result.model.clone(), samples[0])
    assert relative_error(got[proto.graph.output[0].name], reference[proto.graph.output[0].name]) < 1e-2


def test_old_model_in_bfloat16_after_an_opset_upgrade() -> None:
    from codegraft.passes import BFLOAT16_OPSET, upgrade_opset

    proto = _light("squeezenet")  # opset 9: no bfloat16 Conv
    model = upgrade_opset(ir.serde.deserialize_model(proto), BFLOAT16_OPSET)
    assert model.opset_imports[""] == BFLOAT16_OPSET
    samples = sample_feeds_for(model, 1)
    result = convert_precision_checked(model, "bfloat16", samples, _run16)
    assert result.within_tolerance and result.kept_float32 == ()
    assert result.casts_inserted == 2
    print(f"squeezenet: bfloat16 relative error {result.error:.2e}")


def test_unknown_types_stay_float32() -> None:
    """A custom op without a schema: its result's type is unknown, so what reads it stays float32."""
    graph = helper.make_graph(
        [
            helper.make_node("Relu", ["x"], ["r"]),
            helper.make_node("Mystery", ["r"], ["m"], domain="vendor"),
            helper.make_node("Sigmoid", ["m"], ["y"]),
        ],
        "custom",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("vendor", 1)])
    result = convert_precision_detailed(ir.serde.deserialize_model(proto), "float16")
    reasons = {k.op_type: k.reason for k in result.kept_float32}
    assert reasons == {"Mystery": "no ONNX schema for vendor::Mystery", "Sigmoid": "an input's type is unknown"}
    assert result.converted_ops == 1 and result.casts_inserted == 2  # Relu: x down, r up
