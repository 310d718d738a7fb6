"""ConvTranspose on the c backend (a 1x1 GEMM Conv over every tap, then ``Col2Im``) against onnxruntime.

The first case is the OCR text detectors' (PP-OCRv3/v4/v6 det: DB heads upsampling with a
2x2 kernel at stride 2); the others cover overlapping taps, pads, output_padding, dilations,
groups, 1-D and no bias, then random shapes (hypothesis), then what is declined.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from c_backend_util import check, make_model, needs_compiler
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from onnx import helper

from codegraft.backends.c import CBackend


def _model(
    x: Sequence[int], cout: int, kernel: Sequence[int], group: int = 1, bias: bool = True, seed: int = 0,
    after: Sequence[str] = (), **attrs: Any,
) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    inits = {"w": rng.uniform(-1, 1, (x[1], cout // group, *kernel)).astype(np.float32)}
    names = ["x", "w"]
    if bias:
        inits["b"] = rng.uniform(-1, 1, cout).astype(np.float32)
        names.append("b")
    nodes = [helper.make_node("ConvTranspose", names, ["t0"], group=group, **attrs)]
    for i, op in enumerate(after):
        nodes.append(helper.make_node(op, [f"t{i}"], [f"t{i + 1}"]))
    last = f"t{len(after)}"
    nodes.append(helper.make_node("Identity", [last], ["y"]))
    return make_model(nodes, {"x": x}, ["y"], inits)


CASES: dict[str, tuple[Any, ...]] = {
    "ocr-2x2-s2": ((1, 24, 40, 40), 24, (2, 2), 1, True, {"strides": [2, 2], "pads": [0, 0, 0, 0]}),
    "ocr-2x2-s2-one-channel": ((1, 24, 40, 40), 1, (2, 2), 1, True, {"strides": [2, 2]}),
    "k3-s2-p1-output-padding": ((1, 5, 9, 7), 6, (3, 3), 1, True,
                                {"strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1]}),
    "k4-s2-p1-overlapping": ((1, 8, 10, 10), 4, (4, 4), 1, True, {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
    "dilation-2": ((1, 3, 8, 9), 5, (3, 3), 1, True, {"dilations": [2, 2], "pads": [1, 0, 2, 1]}),
    "groups-2": ((1, 6, 7, 8), 4, (3, 2), 2, True, {"strides": [2, 3]}),
    "depthwise": ((1, 8, 9, 9), 8, (4, 4), 8, True, {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
    # DeepFilterNet's decoders: 64 channels, 1x3 taps, stride 1x2 (the gather multiplies itself)
    "depthwise-1x3-s1x2": ((1, 64, 20, 8), 64, (1, 3), 64, True,
                           {"strides": [1, 2], "pads": [0, 1, 0, 1], "output_padding": [0, 1]}),
    "depthwise-exact-no-bias": ((2, 16, 5, 6), 16, (2, 2), 16, False, {"strides": [2, 2]}),
    "depthwise-1-D-dilated": ((1, 5, 11), 5, (3,), 5, True, {"strides": [2], "dilations": [2], "pads": [1, 2]}),
    "stride-above-kernel": ((1, 3, 5, 5), 4, (2, 2), 1, True, {"strides": [3, 3]}),
    "1-D": ((1, 6, 17), 5, (5,), 1, True, {"strides": [3], "pads": [2, 1], "output_padding": [1]}),
    "batch-2": ((2, 7, 6, 5), 9, (2, 2), 1, True, {"strides": [2, 2]}),
    "no-bias": ((1, 7, 6, 5), 9, (3, 3), 1, False, {"strides": [1, 2]}),
    "valid": ((1, 4, 6, 5), 3, (3, 3), 1, True, {"strides": [2, 2], "auto_pad": "VALID"}),
}


@needs_compiler
@pytest.mark.parametrize("name", list(CASES))
def test_conv_transpose(name: str) -> None:
    x, cout, kernel, group, bias, attrs = CASES[name]
    check(_model(x, cout, kernel, group, bias, **attrs))


@needs_compiler
def test_ocr_head() -> None:
    """The DB head's tail: ConvTranspose, bias Add, BatchNormalization, Relu, ConvTranspose, Sigmoid."""
    rng = np.random.default_rng(1)
    c = 24
    inits = {
        "w0": rng.uniform(-0.3, 0.3, (c, c, 2, 2)).astype(np.float32),
        "b0": rng.uniform(-1, 1, (1, c, 1, 1)).astype(np.float32),
        "scale": rng.uniform(0.5, 1.5, c).astype(np.float32),
        "shift": rng.uniform(-1, 1, c).astype(np.float32),
        "mean": rng.uniform(-1, 1, c).astype(np.float32),
        "var": rng.uniform(0.5, 2, c).astype(np.float32),
        "w1": rng.uniform(-0.3, 0.3, (c, 1, 2, 2)).astype(np.float32),
        "b1": rng.uniform(-1, 1, (1, 1, 1, 1)).astype(np.float32),
    }
    nodes = [
        helper.make_node("ConvTranspose", ["x", "w0"], ["t0"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Add", ["t0", "b0"], ["t1"]),
        helper.make_node("BatchNormalization", ["t1", "scale", "shift", "mean", "var"], ["t2"]),
        helper.make_node("Relu", ["t2"], ["t3"]),
        helper.make_node("ConvTranspose", ["t3", "w1"], ["t4"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Add", ["t4", "b1"], ["t5"]),
        helper.make_node("Sigmoid", ["t5"], ["y"]),
    ]
    check(make_model(nodes, {"x": (1, c, 20, 24)}, ["y"], inits))


@st.composite
def conv_transpose_cases(draw: st.DrawFn) -> tuple[tuple, int, tuple, int, bool, dict]:
    spatial = draw(st.sampled_from([1, 2]))
    group = draw(st.sampled_from([1, 1, 2, 3, 7]))
    depthwise = draw(st.booleans())  # one input and one output channel per group: its own path
    cg_in, cg_out = (1, 1) if depthwise else (draw(st.integers(1, 4)), draw(st.integers(1, 5)))
    kernel = tuple(draw(st.integers(1, 4)) for _ in range(spatial))
    strides = [draw(st.integers(1, 3)) for _ in range(spatial)]
    dilations = [draw(st.integers(1, 2)) for _ in range(spatial)]
    output_padding = [draw(st.integers(0, s - 1)) for s in strides]  # onnxruntime: below the stride
    extent = [(k - 1) * d + 1 for k, d in zip(kernel, dilations, strict=True)]
    pads = [draw(st.integers(0, min(2, e - 1))) for e in extent * 2]
    size = [draw(st.integers(1, 7)) for _ in range(spatial)]
    out = [s * (i - 1) + p + e - pads[a] - pads[a + spatial]
           for a, (s, i, p, e) in enumerate(zip(strides, size, output_padding, extent, strict=True))]
    assume(min(out) >= 1)  # an empty output is an error in onnxruntime too
    attrs = {"strides": strides, "dilations": dilations, "pads": pads, "output_padding": output_padding}
    x = (draw(st.integers(1, 2)), cg_in * group, *size)
    return x, cg_out * group, kernel, group, draw(st.booleans()), attrs


@needs_compiler
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conv_transpose_cases(), st.integers(0, 2**16))
def test_conv_transpose_random(case: tuple[tuple, int, tuple, int, bool, dict], seed: int) -> None:
    x, cout, kernel, group, bias, attrs = case
    check(_model(x, cout, kernel, group, bias, seed=seed, after=("Relu",), **attrs), seed=seed)


@pytest.mark.parametrize(
    ("attrs", "reason"),
    [
        ({"auto_pad": "SAME_UPPER", "strides": [2, 2]}, "auto_pad=SAME_UPPER is not supported"),
        ({"output_shape": [8, 8], "strides": [2, 2]}, "output_shape attribute is not supported"),
        ({"kernel_shape": [3, 3]}, "does not match the weight"),
        ({"strides": [2]}, "strides has 1 values, expected 2"),
        ({"dilations": [2, 2], "output_padding": [1, 1]}, "output_padding=[1, 1] must be below the strides"),
    ],
)
def test_declined(attrs: dict, reason: str) -> None:
    verdict = CBackend().supports(next(iter(ir.from_proto(_model((1, 2, 4, 4), 3, (2, 2), **attrs)).graph)))
    assert not verdict and reason in verdict.reason


def test_declines_3d_and_a_computed_weight() -> None:
    three_d = _model((1, 2, 3, 4, 4), 3, (2, 2, 2))
    verdict = CBackend().supports(next(iter(ir.from_proto(three_d).graph)))
    assert not verdict and "3-D ConvTranspose is not supported" in verdict.reason
    computed = make_model(
        [helper.make_node("ConvTranspose", ["x", "w"], ["y"])], {"x": (1, 2, 4, 4), "w": (2, 3, 2, 2)}, ["y"]
    )
    verdict = CBackend().supports(next(iter(ir.from_proto(computed).graph)))
    assert not verdict and "weight must be a constant" in verdict.reason


@needs_compiler
@pytest.mark.parametrize("channels", [1, 5])
def test_residual_and_channel_epilogue(channels: int) -> None:
    """Steps fused after the gather with a full-tensor operand (a residual) and a per-channel one."""
    rng = np.random.default_rng(2)
    inits = {
        "w": rng.uniform(-1, 1, (3, channels, 3, 3)).astype(np.float32),
        "s": rng.uniform(0.5, 1.5, (1, channels, 1, 1)).astype(np.float32),
    }
    nodes = [
        helper.make_node("ConvTranspose", ["x", "w"], ["t"], strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1]),
        helper.make_node("Add", ["t", "z"], ["u"]),
        helper.make_node("Mul", ["u", "s"], ["v"]),
        helper.make_node("Tanh", ["v"], ["y"]),
    ]
    check(make_model(nodes, {"x": (2, 3, 5, 6), "z": (2, channels, 10, 12)}, ["y"], inits))
