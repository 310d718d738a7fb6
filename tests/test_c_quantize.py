"""C backend: dynamic quantization (DynamicQuantizeLinear, MatMulInteger, ConvInteger,
DequantizeLinear) on exact floats, against onnxruntime and against exact integer sums.

onnxruntime's uint8 x int8 kernel saturates on AVX2 CPUs without VNNI (its documentation
warns), so a full-range int8 weight is checked against numpy's exact int64 sum, and
onnxruntime is the reference where its sums are exact (weights within +-63, or uint8).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from c_backend_util import backend, needs_compiler, run_c, typed_model
from onnx import TensorProto, helper, numpy_helper

import codegraft as cg
from codegraft.backend import Partition
from codegraft.backends.c._blob import Blob
from codegraft.backends.c._runtime import CRunnable
from codegraft.backends.c._toolchain import Target, Toolchain, cpu_features, eight_bit_products
from codegraft.testing import run_onnxruntime

pytestmark = needs_compiler
RNG = np.random.default_rng(0)


_model = typed_model


def _dynamic_layer(op: str, weight: np.ndarray, weight_zero: np.ndarray, x_shape: list[int], **attrs: Any
                   ) -> onnx.ModelProto:
    """What onnxruntime's quantize_dynamic makes of a float MatMul (Conv): quantize the input,
    the integer op, cast, multiply by both scales."""
    nodes = [
        helper.make_node("DynamicQuantizeLinear", ["x"], ["q", "s", "z"]),
        helper.make_node(op, ["q", "w", "z", "wz"], ["acc"], **attrs),
        helper.make_node("Cast", ["acc"], ["accf"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["s", "ws"], ["scale"]),
        helper.make_node("Mul", ["accf", "scale"], ["y"]),
    ]
    inits = {"w": weight, "wz": weight_zero, "ws": np.array(0.02, np.float32)}
    outputs = {"y": TensorProto.FLOAT, "q": TensorProto.UINT8, "s": TensorProto.FLOAT, "z": TensorProto.UINT8}
    return _model(nodes, {"x": (TensorProto.FLOAT, x_shape)}, outputs, inits)


@pytest.mark.parametrize(
    "values",
    [
        RNG.standard_normal((3, 37)),  # a tail shorter than a vector
        np.abs(RNG.standard_normal((2, 64))) + 0.5,  # all positive: the zero point is 0
        -np.abs(RNG.standard_normal((5, 7))) - 0.1,  # all negative: 255
        np.zeros((4, 8)),  # an empty range: scale 1, as onnxruntime sets it
        np.array([[-1.0, 0.5, 0.5 + 1e-7, 3.0, 2.5, -0.25, 7.0, 1.5, 0.0]]),  # halves
    ],
)
def test_dynamic_quantize_linear_is_onnxruntimes_bit_for_bit(values: np.ndarray) -> None:
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["q", "s", "z"])]
    outputs = {"q": TensorProto.UINT8, "s": TensorProto.FLOAT, "z": TensorProto.UINT8}
    model = _model(nodes, {"x": (TensorProto.FLOAT, list(values.shape))}, outputs, {})
    feeds = {"x": values.astype(np.float32)}
    got, want = run_c(model, feeds), run_onnxruntime(model, feeds)
    for name in ("q", "s", "z"):
        assert got[name].dtype == want[name].dtype, name
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


@pytest.mark.parametrize("x_shape", [[2, 5, 64], [7, 64], [64]])
@pytest.mark.parametrize("per_column", [False, True])
def test_matmul_integer_sums_exactly_with_full_range_int8_weights(x_shape: list[int], per_column: bool) -> None:
    weight = RNG.integers(-128, 128, size=(64, 24)).astype(np.int8)
    zero = RNG.integers(-3, 4, size=24).astype(np.int8) if per_column else np.array(3, np.int8)
    model = _dynamic_layer("MatMulInteger", weight, zero, x_shape)
    exe = cg.compile(model, targets=["c"])
    assert [p.backend for p in exe.report().partitions] == ["c"], exe.report()
    feeds = {"x": RNG.standard_normal(x_shape).astype(np.float32)}
    got = exe.run(feeds)
    q, z = got["q"].astype(np.int64), int(got["z"])
    exact = ((q - z) @ (weight.astype(np.int64) - zero.astype(np.int64))).astype(np.float32)
    np.testing.assert_array_equal(got["y"], exact * (got["s"] * np.float32(0.02)))
    want = run_onnxruntime(model, feeds)
    for name in ("q", "s", "z"):
        np.testing.assert_array_equal(got[name], want[name])


def test_matmul_integer_matches_onnxruntime_where_its_sums_are_exact() -> None:
    weight = RNG.integers(-63, 64, size=(48, 32)).astype(np.int8)  # no saturation in onnxruntime's pairs
    model = _dynamic_layer("MatMulInteger", weight, np.array(0, np.int8), [6, 48])
    feeds = {"x": RNG.standard_normal((6, 48)).astype(np.float32)}
    got, want = run_c(model, feeds), run_onnxruntime(model, feeds)
    np.testing.assert_array_equal(got["y"], want["y"])


@pytest.mark.parametrize(
    ("group", "attrs"),
    [(1, {"pads": [1, 1, 1, 1], "strides": [2, 1]}), (1, {}), (6, {"pads": [1, 1, 1, 1], "group": 6})],
)
def test_conv_integer_matches_onnxruntime(group: int, attrs: dict[str, Any]) -> None:
    # padding is with the input's zero point in onnxruntime: a 0 once it is subtracted here
    weight = RNG.integers(-63, 64, size=(12, 6 // group, 3, 3)).astype(np.int8)
    model = _dynamic_layer("ConvInteger", weight, np.array(-4, np.int8), [2, 6, 9, 11], **attrs)
    feeds = {"x": (RNG.standard_normal((2, 6, 9, 11)) + 0.7).astype(np.float32)}
    got, want = run_c(model, feeds), run_onnxruntime(model, feeds)
    assert np.abs(want["y"]).max() > 1
    np.testing.assert_array_equal(got["y"], want["y"])


def test_conv_integer_with_a_zero_point_per_output_channel() -> None:
    # onnxruntime refuses per-channel weight zero points; the exact sum is the reference
    weight = RNG.integers(-128, 128, size=(8, 3, 3, 3)).astype(np.int8)
    zero = RNG.integers(-5, 6, size=8).astype(np.int8)
    model = _dynamic_layer("ConvInteger", weight, zero, [1, 3, 7, 7], pads=[1, 1, 1, 1])
    got = run_c(model, {"x": RNG.standard_normal((1, 3, 7, 7)).astype(np.float32)})
    q = got["q"].astype(np.int64) - int(got["z"])
    w = weight.astype(np.int64) - zero.astype(np.int64)[:, None, None, None]
    padded = np.pad(q, ((0, 0), (0, 0), (1, 1), (1, 1)))
    windows = np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(2, 3))  # [1, 3, 7, 7, 3, 3]
    exact = np.einsum("nchwij,mcij->nmhw", windows, w).astype(np.float32)
    np.testing.assert_array_equal(got["y"], exact * (got["s"] * np.float32(0.02)))


def _wide_matmul_integer(read_as: str) -> onnx.ModelProto:
    """A MatMulInteger of 1024-deep full-range sums, its int32 result cast to float or left integer."""
    nodes = [helper.make_node("MatMulInteger", ["a", "w"], ["acc"])]
    outputs = {"acc": TensorProto.INT32}
    if read_as == "float":
        nodes.append(helper.make_node("Cast", ["acc"], ["y"], to=TensorProto.FLOAT))
        outputs = {"y": TensorProto.FLOAT}
    weight = RNG.integers(-128, 128, size=(1024, 8)).astype(np.int8)
    return _model(nodes, {"a": (TensorProto.UINT8, [2, 1024])}, outputs, {"w": weight})


def test_a_matmul_integer_whose_sums_may_round_is_taken_only_when_read_as_a_float() -> None:
    # 1024 x 255 x 128 > 2**24: float32 may round the sum; as an int32 result that would be
    # a wrong integer, cast to float it is a float MatMul's rounding
    integer = ir.from_proto(_wide_matmul_integer("integer"))
    verdict = backend().supports(next(iter(integer.graph)))
    assert not verdict and "beyond 2**24" in verdict.reason and "read as an integer" in verdict.reason
    as_float = _wide_matmul_integer("float")
    assert backend().supports(next(iter(ir.from_proto(as_float).graph)))
    a = RNG.integers(0, 256, size=(2, 1024)).astype(np.uint8)
    weight = numpy_helper.to_array(as_float.graph.initializer[0]).astype(np.int64)
    exact = (a.astype(np.int64) @ weight).astype(np.float64)
    got = run_c(as_float, {"a": a})["y"]
    np.testing.assert_allclose(got, exact, rtol=1e-6)


def test_dequantize_linear_per_axis_of_gathered_int8_rows() -> None:
    # pyfrspell: a quantized embedding table's rows, gathered by token, dequantized where read
    table = RNG.integers(-128, 128, size=(50, 16)).astype(np.int8)
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["rows"]),
        helper.make_node("DequantizeLinear", ["rows", "scale", "zero"], ["y"], axis=2),
    ]
    inits = {"table": table, "scale": RNG.uniform(0.01, 0.1, 16).astype(np.float32),
             "zero": RNG.integers(-3, 4, 16).astype(np.int8)}  # fmt: skip
    model = _model(nodes, {"ids": (TensorProto.INT64, [2, 5])}, {"y": TensorProto.FLOAT}, inits, opset=13)
    feeds = {"ids": RNG.integers(0, 50, size=(2, 5))}
    exe = cg.compile(model, targets=["c"])
    assert [p.backend for p in exe.report().partitions] == ["c"], exe.report()
    np.testing.assert_array_equal(exe.run(feeds)["y"], run_onnxruntime(model, feeds)["y"])


@pytest.mark.parametrize("op_type", ["Floor", "Ceil", "Round"])
def test_floor_ceil_and_round_half_to_even(op_type: str) -> None:
    x = np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 0.49999997, -3.7, 3.7, 1e9 + 0.5, -0.0], np.float32)
    model = _model([helper.make_node(op_type, ["x"], ["y"])], {"x": (TensorProto.FLOAT, [x.size])},
                   {"y": TensorProto.FLOAT}, {})  # fmt: skip
    np.testing.assert_array_equal(run_c(model, {"x": x})["y"], run_onnxruntime(model, {"x": x})["y"])


def test_a_dynamically_quantized_cnn_runs_whole_on_c() -> None:
    # onnxruntime's own quantize_dynamic on a light CNN (uint8 weights: onnxruntime's sums are
    # exact), every Conv a ConvInteger: one c partition, within the quantizers' rounding
    import tempfile

    from onnxruntime.quantization import QuantType, quantize_dynamic

    from codegraft.testing import light_model

    with tempfile.TemporaryDirectory() as tmp:
        onnx.save(light_model("squeezenet"), f"{tmp}/f.onnx")
        quantize_dynamic(f"{tmp}/f.onnx", f"{tmp}/q.onnx", op_types_to_quantize=["Conv"], weight_type=QuantType.QUInt8)
        model = onnx.load(f"{tmp}/q.onnx")
    assert sum(n.op_type == "ConvInteger" for n in model.graph.node) > 20
    exe = cg.compile(model, targets=["c"])
    assert [p.backend for p in exe.report().partitions] == ["c"], exe.report()
    name = model.graph.input[0].name
    for seed in range(3):
        feeds = {name: np.random.default_rng(seed).standard_normal((1, 3, 224, 224)).astype(np.float32)}
        got, want = next(iter(exe.run(feeds).values())), next(iter(run_onnxruntime(model, feeds).values()))
        # onnxruntime's quantized steps: the float layers' last-bit differences move an
        # activation across a half step now and then (1e-4 of the output's range at most
        # on these inputs; a wrong zero point or scale is the whole range)
        assert np.abs(got - want).max() <= 1e-3 * np.abs(want).max(), seed


def test_a_wide_conv_integer_read_through_an_integer_bias_add_is_taken() -> None:
    # ddddocr's old quantizer adds the bias in int32 before casting: that Add still reads the
    # sum as a step to a float (its own result is checked against 2**24), so the ConvInteger
    # (576 products of up to 255 x 128: sums may pass 2**24) is taken; left an int32 output, not
    weight = RNG.integers(-128, 128, size=(8, 64, 3, 3)).astype(np.int8)
    conv = helper.make_node("ConvInteger", ["x", "w"], ["acc"], pads=[1, 1, 1, 1])
    biased = [conv, helper.make_node("Add", ["acc", "bias"], ["sum"]),
              helper.make_node("Cast", ["sum"], ["y"], to=TensorProto.FLOAT)]  # fmt: skip
    inits = {"w": weight, "bias": RNG.integers(-1000, 1000, size=(1, 8, 1, 1)).astype(np.int32)}
    inputs = {"x": (TensorProto.UINT8, [1, 64, 5, 5])}
    as_float = _model(biased, inputs, {"y": TensorProto.FLOAT}, inits)
    assert backend().supports(next(iter(ir.from_proto(as_float).graph)))
    x = RNG.integers(0, 256, size=(1, 64, 5, 5)).astype(np.uint8)
    padded = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    windows = np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(2, 3))
    exact = np.einsum("nchwij,mcij->nmhw", windows, weight.astype(np.int64)) + inits["bias"]
    np.testing.assert_allclose(run_c(as_float, {"x": x})["y"], exact, rtol=1e-6)
    left_integer = _model([conv], inputs, {"acc": TensorProto.INT32}, {"w": weight})
    verdict = backend().supports(next(iter(ir.from_proto(left_integer).graph)))
    assert not verdict and "read as an integer" in verdict.reason


_EIGHT_BIT_HOST = eight_bit_products(cpu_features())  # VNNI or AVX2


@pytest.mark.parametrize(("x_shape", "columns"), [([1, 37], 70), ([5, 130], 64), ([2, 9, 64], 130), ([300], 3)])
@pytest.mark.parametrize("weights", ["int8", "uint8 about 128", "uint8 about 126", "int8 per column"])
def test_matmul_integer_on_8_bit_products_sums_exactly(x_shape: list[int], columns: int, weights: str) -> None:
    # With VNNI (or AVX2) the products run four to a lane (ops/qgemm.c): depths not a multiple of 4,
    # rows not a multiple of the 4-row tile, columns not a multiple of 64; weights less their
    # zero point that fit int8 (uint8 about 128, int8 with a zero point per column) or not (126)
    depth = x_shape[-1]
    if weights.startswith("uint8"):  # 126 (pnm's): less it, up to 129, beyond int8: an offset per column
        weight = RNG.integers(0, 256, size=(depth, columns)).astype(np.uint8)
        zero = np.array(int(weights.split()[-1]), np.uint8)
    elif weights == "int8 per column":
        zero = RNG.integers(-2, 3, size=columns).astype(np.int8)
        weight = (RNG.integers(-126, 126, size=(depth, columns)) + zero).astype(np.int8)
    else:
        weight, zero = RNG.integers(-128, 128, size=(depth, columns)).astype(np.int8), np.array(0, np.int8)
    model = _dynamic_layer("MatMulInteger", weight, zero, x_shape)
    partition = cg.compile(model, targets=["c"]).report().partitions
    assert [p.backend for p in partition] == ["c"]
    feeds = {"x": RNG.standard_normal(x_shape).astype(np.float32)}
    got = run_c(model, feeds)
    q, z = got["q"].astype(np.int64), int(got["z"])
    exact = ((q - z) @ (weight.astype(np.int64) - zero.astype(np.int64))).astype(np.float32)
    np.testing.assert_array_equal(got["y"], exact * (got["s"] * np.float32(0.02)))
    source = backend().generate(Partition("p", ir.from_proto(model))).source
    assert ("cg_qgemm(&q)" in source) == _EIGHT_BIT_HOST


def test_the_8_bit_products_rebuilt_for_a_cpu_without_vnni_sum_alike() -> None:
    # a library carried to a CPU without VNNI is rebuilt from its source: the plain C sums
    weight = RNG.integers(-128, 128, size=(45, 70)).astype(np.int8)
    model = _dynamic_layer("MatMulInteger", weight, np.array(0, np.int8), [6, 45])
    vnni = Target(frozenset({"avx512_vnni"}), (), 4)  # the lowering's choice; portable vectors
    program = backend(target=vnni).generate(Partition("p", ir.from_proto(model)))
    assert "cg_qgemm(&q)" in program.source
    plain = Target(frozenset(), (), 4)
    toolchain = Toolchain(cache_dir=backend().toolchain.cache_dir)
    runnable = CRunnable(Blob.built(program, toolchain.build(program.source, plain), plain, program.scratch_floats),
                         toolchain)
    feeds = {"x": RNG.standard_normal((6, 45)).astype(np.float32)}
    y, q, s, z = runnable.run([feeds["x"]])
    exact = ((q.astype(np.int64) - int(z)) @ weight.astype(np.int64)).astype(np.float32)
    np.testing.assert_array_equal(y, exact * (s * np.float32(0.02)))
