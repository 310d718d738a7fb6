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


def _model(c: int, m: int, h: int, w: int, kernel: int, group: int = 1):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(m * 100 + h)
    weight = rng.standard_normal((m, c // group, kernel, kernel)).astype(np.float32)
    bias = rng.standard_normal(m).astype(np.float32)
    pad = kernel // 2
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[pad] * 4, group=group),
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


def _assert_like_onnxruntime(model, feeds: dict) -> None:  # type: ignore[no-untyped-def]
    """``y`` on ``c`` as onnxruntime's: NaN and Inf where it has them, the rest within 1e-5."""
    got = cg.compile(model, targets=["c"]).run(feeds)["y"]
    want = run_onnxruntime(model, feeds)["y"]
    assert np.array_equal(np.isnan(got), np.isnan(want))
    assert np.array_equal(np.isinf(got), np.isinf(want))
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("c", "m", "h", "w", "kernel", "group"),
                         [(*shape, 1) for shape in SHAPES] + [(136, 136, 7, 9, 1, 4), (12, 60, 5, 5, 3, 3)])
@pytest.mark.parametrize("special", [False, True])
def test_conv_bias_residual_relu_on_registers(
    c: int, m: int, h: int, w: int, kernel: int, group: int, special: bool,
) -> None:
    """Groups of 34 and 20 channels too (shufflenet's 136 -> 136 in 4 groups): each group's last
    block is ragged, and beyond its valid lanes lie the next group's channels or the next pixel's."""
    model = _model(c, m, h, w, kernel, group)
    source = generate(ir.from_proto(model), host_target(), 1).source
    assert "static void cg_mkf_" in source  # the register epilogue is taken
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, c, h, w)).astype(np.float32)
    r = rng.standard_normal((1, m, h, w)).astype(np.float32)
    if special:
        x[0, 0, 0, 1], x[0, 0, h - 1, w - 1] = np.nan, np.inf  # whole output pixels
        r[0, 1, 0, 0], r[0, m - 1, h - 1, w - 2], r[0, 2, 1, 1], r[0, m - 2, 2, 2] = np.nan, np.nan, np.inf, -np.inf
        r[0, 3, 3, 0] = -0.0
    _assert_like_onnxruntime(model, {"x": x, "r": r})


@pytest.mark.parametrize(("batch", "rows", "depth", "cols"),
                         [((), 37, 64, 72), ((2, 3), 9, 32, 40), ((), 256, 128, 384)])
def test_matmul_bias_residual_relu_on_registers(batch: tuple, rows: int, depth: int, cols: int) -> None:
    """A MatMul's bias + residual + Relu (a transformer's linear layer and skip) on the tile's
    registers too: ragged rows and columns, a batch of products, NaN and Inf in the residual."""
    rng = np.random.default_rng(rows)
    weight = rng.standard_normal((depth, cols)).astype(np.float32)
    bias = rng.standard_normal(cols).astype(np.float32)
    shape = [*batch, rows]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["c"]),
             helper.make_node("Add", ["c", "r"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [*shape, depth]),
         helper.make_tensor_value_info("r", TensorProto.FLOAT, [*shape, cols])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [*shape, cols])],
        [numpy_helper.from_array(weight, "w"), numpy_helper.from_array(bias, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert "static void cg_mkf_" in generate(ir.from_proto(model), host_target(), 1).source
    x = rng.standard_normal((*shape, depth)).astype(np.float32)
    r = rng.standard_normal((*shape, cols)).astype(np.float32)
    r.reshape(-1)[[0, 5, cols + 3, r.size - 1]] = np.nan, np.inf, -np.inf, -0.0
    _assert_like_onnxruntime(model, {"x": x, "r": r})


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


def _gemm_trans_a(depth: int, rows: int, cols: int):  # type: ignore[no-untyped-def]
    """``Y = A^T B + C``: A's channel stride is not 1 (the micro-kernel's ``cs`` path)."""
    rng = np.random.default_rng(depth)
    b = rng.standard_normal((depth, cols)).astype(np.float32)
    c = rng.standard_normal(cols).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["a", "b", "c"], ["y"], transA=1)], "g",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [depth, rows])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, cols])],
        [numpy_helper.from_array(b, "b"), numpy_helper.from_array(c, "c")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("steps", [2, 8])
@pytest.mark.parametrize("prefetching", [False, True])
def test_k_steps_per_pass_give_the_same_bits(steps: int, prefetching: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tall tiles run several k-steps a pass (``Blocking.k_steps``, ``gemm._tile``): forced on
    every tile, with depths that leave steps over (5 channels a tap, 83 deep), through the loops
    that prefetch (forced as above), every output is the same float as with one step a pass;
    the channel-strided path (a Gemm with transA, one step a pass whatever) is unchanged."""
    import dataclasses

    from codegraft.backends.c._blocking import Blocking
    from codegraft.backends.c.ops import conv, gemm

    if prefetching:
        real = gemm.host_blocking
        monkeypatch.setattr(gemm, "FILL_BUFFERS", 0)
        tiny_l2 = lambda vector: dataclasses.replace(real(vector), l2=256)  # noqa: E731
        monkeypatch.setattr(gemm, "host_blocking", tiny_l2)
        monkeypatch.setattr(conv, "host_blocking", tiny_l2)
    rng = np.random.default_rng(3)
    cases = [
        (_model(5, 40, 9, 9, 3), {"x": rng.standard_normal((1, 5, 9, 9)), "r": rng.standard_normal((1, 40, 9, 9))}),
        (_model(83, 16, 7, 5, 1), {"x": rng.standard_normal((1, 83, 7, 5)), "r": rng.standard_normal((1, 16, 7, 5))}),
        (_gemm_trans_a(45, 37, 24), {"a": rng.standard_normal((45, 37))}),
    ]
    for model, feeds in cases:
        feeds = {name: value.astype(np.float32) for name, value in feeds.items()}
        results = []
        for forced in (1, steps):
            monkeypatch.setattr(Blocking, "k_steps", lambda self, nv, p, forced=forced: forced)
            source = generate(ir.from_proto(model), host_target(), 1).source
            assert (f"c += {steps}" in source) == (forced > 1)
            results.append(cg.compile(model, targets=["c"]).run(feeds)["y"])
        assert np.array_equal(results[0], results[1])
        np.testing.assert_allclose(results[1], run_onnxruntime(model, feeds)["y"], rtol=1e-4, atol=1e-4)
