"""A Conv's bias + residual + Relu run on the GEMM tile's registers (ops/gemm.py) and give
onnxruntime's result: full tiles take the register path, the ragged last rows and channel
block the buffer and scalar epilogue, NaN and Inf included."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
from c_backend_util import needs_compiler
from onnx import TensorProto, helper, numpy_helper

import codegraft as cg
from codegraft.backends.c._codegen import generate
from codegraft.backends.c._toolchain import host_target
from codegraft.testing import run_onnxruntime

pytestmark = needs_compiler


def _model(c: int, m: int, h: int, w: int, kernel: int):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(m * 100 + h)
    weight = rng.standard_normal((m, c, kernel, kernel)).astype(np.float32)
    bias = rng.standard_normal(m).astype(np.float32)
    pad = kernel // 2
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[pad] * 4),
        helper.make_node("Add", ["c", "r"], ["s"]),
        helper.make_node("Relu", ["s"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, h, w]),
         helper.make_tensor_value_info("r", TensorProto.FLOAT, [1, m, h, w])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, m, h, w])],
        [numpy_helper.from_array(weight, "w"), numpy_helper.from_array(bias, "b")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


# rows (h * w) not a multiple of any tile height; channels a multiple of the block width or not
SHAPES = [(16, 64, 7, 5, 1), (16, 40, 7, 5, 1), (8, 72, 11, 3, 3), (24, 256, 6, 7, 1)]


@pytest.mark.parametrize(("c", "m", "h", "w", "kernel"), SHAPES)
@pytest.mark.parametrize("special", [False, True])
def test_conv_bias_residual_relu_on_registers(c: int, m: int, h: int, w: int, kernel: int, special: bool) -> None:
    model = _model(c, m, h, w, kernel)
    source = generate(ir.from_proto(model), host_target(), 1).source
    assert "static void cg_mkf_" in source  # the register epilogue is taken
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, c, h, w)).astype(np.float32)
    r = rng.standard_normal((1, m, h, w)).astype(np.float32)
    if special:
        x[0, 0, 0, 1], x[0, 0, h - 1, w - 1] = np.nan, np.inf  # whole output pixels
        r[0, 1, 0, 0], r[0, m - 1, h - 1, w - 2], r[0, 2, 1, 1], r[0, m - 2, 2, 2] = np.nan, np.nan, np.inf, -np.inf
        r[0, 3, 3, 0] = -0.0
    got = cg.compile(model, targets=["c"]).run({"x": x, "r": r})["y"]
    want = run_onnxruntime(model, {"x": x, "r": r})["y"]
    assert np.array_equal(np.isnan(got), np.isnan(want))
    assert np.array_equal(np.isinf(got), np.isinf(want))
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("c", "m", "h", "w", "kernel"), [(64, 64, 7, 5, 1), (8, 72, 11, 3, 3), (5, 40, 9, 9, 3)])
def test_prefetching_loops_compute_the_same(
    c: int, m: int, h: int, w: int, kernel: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The k-steps that prefetch run in loops of their own (spread residual and output lines
    first, then the next tile's rows, then the next range's weights, then the rest), their
    bounds crossing taps and falling inside one: forced on any CPU (no fill buffers, a tiny
    L2), the result is unchanged, on one thread and on two (where a thread fetches only the
    ranges its own share runs next)."""
    import dataclasses

    from codegraft.backends.c.ops import conv, gemm

    real = gemm.host_blocking
    monkeypatch.setattr(gemm, "FILL_BUFFERS", 0)
    tiny_l2 = lambda vector: dataclasses.replace(real(vector), l2=256)  # noqa: E731
    monkeypatch.setattr(gemm, "host_blocking", tiny_l2)
    monkeypatch.setattr(conv, "host_blocking", tiny_l2)
    model = _model(c, m, h, w, kernel)
    source = generate(ir.from_proto(model), host_target(), 1).source
    assert "_s(" in source  # spread
    if kernel == 1:
        assert "_x_w(" in source and "_x_w_f" in source  # the next tile's rows and range's weights
    else:
        assert "_w(" in source and "_w_f" in source  # the next range's weights, beside spread
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, c, h, w)).astype(np.float32)
    r = rng.standard_normal((1, m, h, w)).astype(np.float32)
    want = run_onnxruntime(model, {"x": x, "r": r})["y"]
    for threads in (1, 2):
        got = cg.compile(model, targets=["c"], threads=threads).run({"x": x, "r": r})["y"]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
