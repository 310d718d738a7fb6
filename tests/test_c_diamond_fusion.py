"""Activations that read their input twice fuse into the Conv or MatMul that produces it
(_fuse._diamonds): SiLU (``x * sigmoid(x)``), HardSwish as exporters spell it
(``x * clip(x + 3, 0, 6) / 6``) and GELU as ``x * 0.5 * (1 + erf(x / sqrt 2))``; their
vector forms run on the GEMM tile's registers.  Each against onnxruntime, NaN included."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from c_backend_util import check, make_model, needs_compiler
from onnx import helper

import codegraft as cg
from codegraft.backends.c._codegen import generate
from codegraft.backends.c._toolchain import cpu_features, host_target
from codegraft.testing import run_onnxruntime

pytestmark = needs_compiler


def _conv_then(activation: list[onnx.NodeProto], m: int = 40, size: int = 9) -> onnx.ModelProto:
    """Conv (with bias) -> ``activation`` (reads ``c``, writes ``y``)."""
    rng = np.random.default_rng(m)
    inits = {
        "w": rng.standard_normal((m, 8, 3, 3)).astype(np.float32) * 0.5,
        "b": rng.standard_normal(m).astype(np.float32),
        "three": np.float32(3.0), "zero": np.float32(0.0), "six": np.float32(6.0),
    }  # fmt: skip
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), *activation]
    return make_model(nodes, {"x": (1, 8, size, size)}, ["y"], inits)


SILU = [helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["y"])]
SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 9.0, -9.0, 18.0, -18.0, 88.8, -88.8, 3e38], np.float32)
HARDSWISH = [
    helper.make_node("Add", ["c", "three"], ["a"]),
    helper.make_node("Clip", ["a", "zero", "six"], ["k"]),
    helper.make_node("Mul", ["c", "k"], ["p"]),
    helper.make_node("Div", ["p", "six"], ["y"]),
]


def _kernels(model: onnx.ModelProto) -> list[str]:
    """The kinds of the generated kernels, the layout's edge transposes left out."""
    graph = ir.from_proto(onnx.shape_inference.infer_shapes(model))
    kinds = [k.kernel.split(" =>")[0] for k in generate(graph, host_target(), 1).threads]
    return [kind for kind in kinds if kind != "Transpose"]


@pytest.mark.parametrize(("activation", "steps"), [(SILU, "add+sigmoid+mul"), (HARDSWISH, "add+add+clip+mul+div")])
@pytest.mark.parametrize(("m", "size"), [(40, 9), (64, 8)])  # ragged and whole register tiles
def test_conv_activation_is_one_kernel_on_registers(activation: list, steps: str, m: int, size: int) -> None:
    model = _conv_then(activation, m, size)
    assert _kernels(model) == [f"Conv -> {steps}"]
    graph = ir.from_proto(onnx.shape_inference.infer_shapes(model))
    assert "static void cg_mkf_" in generate(graph, host_target(), 1).source  # the register epilogue
    check(model)


def test_nan_and_inf_through_a_fused_silu() -> None:
    model = _conv_then(SILU)
    x = np.random.default_rng(0).standard_normal((1, 8, 9, 9)).astype(np.float32)
    x[0, 2, 3, 3], x[0, 5, 0, 8] = np.nan, np.inf
    got = cg.compile(model, targets=["c"]).run({"x": x})["y"]
    want = run_onnxruntime(model, {"x": x})["y"]
    assert np.array_equal(np.isnan(got), np.isnan(want))
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-4, atol=1e-5)


@pytest.mark.skipif("fma" not in cpu_features(), reason="MLAS's FMA3 logistic is what onnxruntime runs on FMA hosts")
def test_sigmoid_silu_and_tanh_are_onnxruntimes_bit_for_bit() -> None:
    # onnxruntime's Sigmoid (and QuickGelu, its fused SiLU) and Tanh are MLAS's rational
    # approximations; c's scalar and vector forms compute them step for step.  1003 values:
    # whole vectors and a scalar tail.
    x = np.concatenate([np.linspace(-20, 20, 991, dtype=np.float32), SPECIAL]).reshape(1, -1)
    nodes = [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["x", "s"], ["y"]),
             helper.make_node("Tanh", ["x"], ["t"])]
    model = make_model(nodes, {"x": x.shape}, ["s", "y", "t"])
    exe = cg.compile(model, targets=["c"])
    assert [s.backend for s in exe.steps] == ["c"]
    got, want = exe.run({"x": x}), run_onnxruntime(model, {"x": x})
    for name in ("s", "y", "t"):
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def test_depthwise_conv_silu_is_one_kernel() -> None:
    rng = np.random.default_rng(3)
    inits = {"w": rng.standard_normal((20, 1, 3, 3)).astype(np.float32),
             "b": rng.standard_normal(20).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], group=20), *SILU]
    model = make_model(nodes, {"x": (1, 20, 7, 9)}, ["y"], inits)
    assert _kernels(model) == ["Conv -> add+sigmoid+mul"]
    check(model)


def test_gelu_spelled_out_after_a_matmul() -> None:
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("Div", ["h", "root2"], ["d"]),
        helper.make_node("Erf", ["d"], ["e"]),
        helper.make_node("Add", ["e", "one"], ["f"]),
        helper.make_node("Mul", ["h", "f"], ["g"]),
        helper.make_node("Mul", ["g", "half"], ["y"]),
    ]
    inits = {"w": np.random.default_rng(1).standard_normal((32, 48)).astype(np.float32) * 0.3,
             "root2": np.float32(np.sqrt(2)), "one": np.float32(1), "half": np.float32(0.5)}  # fmt: skip
    model = make_model(nodes, {"x": (10, 32)}, ["y"], inits)
    assert _kernels(model) == ["MatMul -> div+erf+add+mul+mul"]
    check(model)
    x = np.concatenate([np.linspace(-6, 6, 300), [np.nan, np.inf, -np.inf, 0.0, -0.0]]).astype(np.float32)
    x = np.resize(x, (10, 32))  # through the MatMul, values across erf's range, NaN and infinities
    got, want = cg.compile(model, targets=["c"]).run({"x": x})["y"], run_onnxruntime(model, {"x": x})["y"]
    assert np.array_equal(np.isnan(got), np.isnan(want))
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-5, atol=1e-6)


def test_a_side_value_used_elsewhere_is_not_fused_away() -> None:
    """``s = sigmoid(c)`` is also a model output: it must be written, so the Mul cannot take
    ``c`` from inside the Conv's group; the results are still right."""
    nodes = [*SILU, helper.make_node("Identity", ["s"], ["s_out"])]
    model = _conv_then(nodes)
    model.graph.output.append(helper.make_tensor_value_info("s_out", onnx.TensorProto.FLOAT, None))
    assert len(_kernels(model)) > 1
    check(model)
