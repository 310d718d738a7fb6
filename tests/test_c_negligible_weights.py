"""GEMM and depthwise weights below 2**-100 are dropped (``ops/gemm.negligible_terms``): their
products would be subnormal, a microcode assist per multiply-add on Intel cores."""

from __future__ import annotations

import numpy as np
from onnx import helper

from codegraft.testing import assert_close, run_onnxruntime
from tests.c_backend_util import make_model, needs_compiler, run_c

pytestmark = needs_compiler


def _decayed(shape: tuple[int, ...], dead_channels: int) -> tuple[np.ndarray, np.ndarray]:
    """Weights with some tiny ones (1e-35, 1e-40: subnormal) scattered and ``dead_channels``
    output channels made of tiny ones only (PP-OCRv4's English recogniser), and the same
    weights with those set to zero."""
    rng = np.random.default_rng(0)
    weights = rng.standard_normal(shape).astype(np.float32)
    tiny = rng.random(shape) < 0.3
    tiny[:dead_channels] = True
    weights[tiny] = np.where(rng.random(tiny.sum()) < 0.5, 1e-35, -1e-40).astype(np.float32)
    return weights, np.where(tiny, 0.0, weights).astype(np.float32)


def test_a_convs_negligible_weights_are_dropped() -> None:
    decayed, zeroed = _decayed((16, 8, 3, 3), dead_channels=3)
    bias = np.random.default_rng(1).standard_normal(16).astype(np.float32)
    bias[:3] = 0.0  # the dead channels' results: 0, not about 1e-35
    x = {"x": np.random.default_rng(2).standard_normal((1, 8, 10, 10)).astype(np.float32)}
    conv = helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1])
    got = run_c(make_model([conv], {"x": (1, 8, 10, 10)}, ["y"], {"w": decayed, "b": bias}), x)
    same = run_c(make_model([conv], {"x": (1, 8, 10, 10)}, ["y"], {"w": zeroed, "b": bias}), x)
    np.testing.assert_array_equal(got["y"], same["y"])
    assert_close(got, run_onnxruntime(make_model([conv], {"x": (1, 8, 10, 10)}, ["y"], {"w": decayed, "b": bias}), x))


def test_a_matmuls_and_a_depthwise_convs_negligible_weights_are_dropped() -> None:
    cases = [
        (helper.make_node("MatMul", ["x", "w"], ["y"]), (1, 20, 24), _decayed((24, 32), dead_channels=0)),
        (helper.make_node("Conv", ["x", "w"], ["y"], group=8, pads=[1, 1, 1, 1]), (1, 8, 6, 6),
         _decayed((8, 1, 3, 3), dead_channels=2)),
    ]  # fmt: skip
    for node, shape, (decayed, zeroed) in cases:
        x = {"x": np.random.default_rng(3).standard_normal(shape).astype(np.float32)}
        got = run_c(make_model([node], {"x": shape}, ["y"], {"w": decayed}), x)
        same = run_c(make_model([node], {"x": shape}, ["y"], {"w": zeroed}), x)
        np.testing.assert_array_equal(got["y"], same["y"])
