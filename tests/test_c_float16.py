"""float16 models on the C backend: computed in float32, rounded where the model casts to
float16 and at the partition's exit (``ops/_spec.FLOATS``)."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
from onnx import TensorProto, helper, numpy_helper

import codegraft as cg
from codegraft.backend import Partition
from codegraft.backends.c._blob import Blob
from codegraft.testing import assert_close, run_onnxruntime
from tests.c_backend_util import backend, needs_compiler, run_c

pytestmark = needs_compiler


def _values_around_float16_steps() -> np.ndarray:
    """Every finite float16, the midpoints between neighbours (ties) and one float32 step either
    side of each, the edges of the range, and random float32 bit patterns."""
    halves = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
    halves = np.sort(halves[np.isfinite(halves)])
    ties = ((halves[:-1].astype(np.float64) + halves[1:]) / 2).astype(np.float32)
    edges = np.float32([65504, 65519.996, 65520, 65536, 1e30, np.inf, -np.inf, np.nan, -0.0, 2.0**-25, 2.0**-26])
    noise = np.random.default_rng(0).integers(0, 1 << 32, 200_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    return np.concatenate([halves, ties, np.nextafter(ties, np.inf), np.nextafter(ties, -np.inf), edges, noise])


def _same_bits(actual: np.ndarray, expected: np.ndarray) -> None:
    actual, expected = actual.reshape(-1), expected.reshape(-1)
    same = (actual == expected) & (np.signbit(actual) == np.signbit(expected))
    same |= np.isnan(actual) & np.isnan(expected)
    wrong = np.flatnonzero(~same)
    assert wrong.size == 0, (wrong.size, actual[wrong[:5]], expected[wrong[:5]])


def test_a_cast_to_float16_inside_rounds_as_ieee_conversion_does() -> None:
    # Cast(x -> float16) -> Cast(-> float32): the rounding happens inside the partition (cg_half)
    x = _values_around_float16_steps()
    graph = helper.make_graph(
        [helper.make_node("Cast", ["x"], ["h"], to=TensorProto.FLOAT16),
         helper.make_node("Cast", ["h"], ["y"], to=TensorProto.FLOAT)],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [x.size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [x.size])],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with np.errstate(over="ignore"):
        expected = x.astype(np.float16).astype(np.float32)
    _same_bits(run_c(model, {"x": x})["y"], expected)


def test_a_float16_output_is_returned_as_float16_rounded_at_the_exit() -> None:
    x = _values_around_float16_steps()
    graph = helper.make_graph(
        [helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT16)],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [x.size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [x.size])],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    y = run_c(model, {"x": x})["y"]
    assert y.dtype == np.float16
    with np.errstate(over="ignore"):
        _same_bits(y.astype(np.float32), x.astype(np.float16).astype(np.float32))


def _conv_net(dtype: int) -> onnx.ModelProto:
    """Conv -> Relu -> Resize (between Casts to float32, as onnxconverter's float16 converter
    leaves an op without float16 kernels) -> Softmax, in ``dtype`` (its weights too; the float32
    twin rounds to float16 where the float16 model casts back)."""
    rng = np.random.default_rng(1)
    np_dtype = np.float16 if dtype == TensorProto.FLOAT16 else np.float32
    weights = {  # float16 values in either type
        "w": (rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float16).astype(np_dtype),
        "b": rng.standard_normal(8).astype(np.float16).astype(np_dtype),
        "scales": np.array([1, 1, 2, 2], np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("Cast", ["r"], ["r32"], to=TensorProto.FLOAT),
        helper.make_node("Resize", ["r32", "", "scales"], ["u32"], mode="nearest"),
        helper.make_node("Cast", ["u32"], ["u16"], to=TensorProto.FLOAT16),
        helper.make_node("Cast", ["u16"], ["u"], to=dtype),
        helper.make_node("Softmax", ["u"], ["y"], axis=1),
    ]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", dtype, [1, 3, 6, 6])],
        [helper.make_tensor_value_info("y", dtype, None)],
        [numpy_helper.from_array(v, k) for k, v in weights.items()],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_float16_model_runs_whole_on_c_as_its_float32_twin_rounded() -> None:
    half, single = _conv_net(TensorProto.FLOAT16), _conv_net(TensorProto.FLOAT)
    x = np.random.default_rng(2).standard_normal((1, 3, 6, 6)).astype(np.float16)
    exe = cg.compile(half, targets=["c"])
    assert {n.backend for n in exe.report().nodes} == {"c"}
    y = exe.run({"x": x})["y"]
    assert y.dtype == np.float16
    assert_close({"y": y.astype(np.float32)}, {"y": run_onnxruntime(half, {"x": x})["y"].astype(np.float32)},
                 rtol=1e-2)
    # float32 throughout, from exactly widened weights and inputs: the float32 twin's result
    # rounded at the exit (both round the Softmax's input, where the model casts to float16)
    twin = run_c(single, {"x": x.astype(np.float32)})["y"]
    _same_bits(y.astype(np.float32), twin.astype(np.float16).astype(np.float32))


def test_a_blob_carries_its_float16_outputs() -> None:
    model = ir.from_proto(_conv_net(TensorProto.FLOAT16))
    model = ir.from_proto(onnx.shape_inference.infer_shapes(ir.to_proto(model)))
    be = backend()
    blob = be.compile(Partition(name="p", model=model))
    assert Blob.decode(blob).half_outputs == (0,)
