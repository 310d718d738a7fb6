"""Winograd F(2x2, 3x3) Convs (ops/winograd.py): which Convs take it, and that they give
onnxruntime's results wherever the Conv's output goes - its fused bias, residual and Relu,
a Concat's slot, the next Conv's zero border, an input read from inside one - and on odd
sizes, pads and channel counts that are not a multiple of the vector width."""

from __future__ import annotations

import re
from collections import Counter

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from c_backend_util import needs_compiler
from onnx import TensorProto, helper, numpy_helper

import codegraft as cg
from bench.winograd_layers import winograd_layers
from codegraft.backend import Partition
from codegraft.backends.c import CBackend
from codegraft.backends.c._codegen import generate
from codegraft.backends.c._toolchain import host_target
from codegraft.backends.c.ops.winograd import A_T, B_T, winograd_pays, winograd_weights
from codegraft.testing import light_model, run_onnxruntime

pytestmark = needs_compiler


def _weight(rng: np.random.Generator, m: int, c: int, k: int = 3) -> np.ndarray:
    return (rng.standard_normal((m, c, k, k)) / np.sqrt(k * k * c)).astype(np.float32)


def _graph(
    nodes: list[onnx.NodeProto], inputs: dict[str, list[int]], weights: dict[str, np.ndarray]
) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(name, TensorProto.FLOAT, dims) for name, dims in inputs.items()],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(value, name) for name, value in weights.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _check(model: onnx.ModelProto, threads: int = 1, convs: int = 1) -> None:
    """``model`` on ``c`` against onnxruntime, ``convs`` of its Convs as Winograd ones."""
    source = generate(ir.from_proto(model), host_target(), threads).source
    assert source.count("if (cg_wino_in(") + source.count(", cg_wino_chunk_task, &") == convs
    rng = np.random.default_rng(7)
    feeds = {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
             for i in model.graph.input}
    got = cg.compile(model, targets=["c"], threads=threads).run(feeds)["y"]
    want = run_onnxruntime(model, feeds)["y"]
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


# (channels in, out, height, width, pad): odd sizes leave a last tile row / column of one;
# 120 output channels end in a scalar loop on 8- and 16-float vectors
SHAPES = [(128, 128, 28, 28, 1), (160, 120, 13, 11, 1), (144, 128, 9, 8, 0), (144, 120, 7, 15, 1), (96, 208, 14, 14, 1)]


@pytest.mark.parametrize(("c", "m", "h", "w", "pad"), SHAPES)
@pytest.mark.parametrize("threads", [1, 3])
def test_a_winograd_conv_with_bias_residual_and_relu_gives_onnxruntimes_result(
    c: int, m: int, h: int, w: int, pad: int, threads: int
) -> None:
    rng = np.random.default_rng(c + m + h)
    oh, ow = h + 2 * pad - 2, w + 2 * pad - 2
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[pad] * 4),
        helper.make_node("Add", ["c", "r"], ["s"]),
        helper.make_node("Relu", ["s"], ["y"]),
    ]
    weights = {"w": _weight(rng, m, c), "b": rng.standard_normal(m).astype(np.float32)}
    _check(_graph(nodes, {"x": [1, c, h, w], "r": [1, m, oh, ow]}, weights), threads)


def test_a_winograd_conv_folds_its_batch_normalization() -> None:
    rng = np.random.default_rng(3)
    c, m = 128, 128
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1] * 4),
        helper.make_node("BatchNormalization", ["c", "s", "t", "mu", "var"], ["y"]),
    ]
    weights = {"w": _weight(rng, m, c), "s": rng.uniform(0.5, 2, m).astype(np.float32),
               "t": rng.standard_normal(m).astype(np.float32), "mu": rng.standard_normal(m).astype(np.float32),
               "var": rng.uniform(0.5, 2, m).astype(np.float32)}  # fmt: skip
    _check(_graph(nodes, {"x": [2, c, 14, 14]}, weights))


def test_winograd_convs_write_into_a_concat_and_into_the_next_convs_zero_border() -> None:
    """Two Winograd Convs fill a Concat's channels; a 1x1 Conv writes inside the first one's
    zero border, which it then reads as its input; the second's result feeds a padded
    3x3 Conv of too few channels for Winograd, inside whose border it is written."""
    rng = np.random.default_rng(5)
    c = 128
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["a"]),  # 1x1, into the next Conv's border
        helper.make_node("Conv", ["a", "w2"], ["b"], pads=[1] * 4),  # Winograd, its input bordered
        helper.make_node("Relu", ["b"], ["rb"]),
        helper.make_node("Conv", ["x", "w3"], ["d"], pads=[1] * 4),  # Winograd, into a border
        helper.make_node("Conv", ["d", "w4"], ["e"], pads=[1] * 4),  # 128 -> 8: direct
        helper.make_node("Conv", ["x", "w5"], ["f"], pads=[1] * 4),  # Winograd, into the Concat
        helper.make_node("Concat", ["rb", "f", "e"], ["y"], axis=1),
    ]
    weights = {"w1": _weight(rng, c, c, 1), "w2": _weight(rng, c, c), "w3": _weight(rng, c, c),
               "w4": _weight(rng, 8, c), "w5": _weight(rng, c, c)}  # fmt: skip
    model = _graph(nodes, {"x": [1, c, 12, 10]}, weights)
    source = generate(ir.from_proto(model), host_target(), 1).source
    assert "cg_zero_border(" in source
    fallback = False  # inside a Winograd kernel's direct Conv, for an input holding an Inf or a NaN
    for line in source.splitlines():
        fallback = "} else {  /* an Inf" in line or (fallback and line != "  }")
        assert fallback or not line.startswith("  cg_pad(")  # Winograd reads a padded input in place
    _check(model, convs=3)


def test_the_winograd_transforms_compute_the_convolution() -> None:
    """``A^T [(G g G^T) * (B^T d B)] A`` of a 4x4 patch is its 3x3 filter's 2x2 correlation."""
    rng = np.random.default_rng(0)
    patch = rng.standard_normal((4, 4))
    filt = rng.standard_normal((1, 3, 3, 1)).astype(np.float32)
    points = winograd_weights(filt).reshape(4, 4).astype(np.float64)
    got = A_T @ (points * (B_T @ patch @ B_T.T)) @ A_T.T
    want = [[np.sum(patch[i : i + 3, j : j + 3] * filt[0, :, :, 0]) for j in range(2)] for i in range(2)]
    assert np.allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize(
    ("layer", "taken"),
    [
        ((256, 256, 56), True),  # vgg19
        ((512, 512, 28), True),
        ((512, 512, 14), True),
        ((128, 128, 28), True),  # resnet50
        ((256, 256, 14), True),
        ((512, 512, 7), False),  # 16 tiles for 512 channels: the weights' traffic dominates
        ((64, 64, 56), True),  # run in chunks that stay in the L2: its weights are small
        ((64, 192, 56), True),  # inception_v1's 64 -> 192, in chunks
        ((128, 128, 56), True),  # 12.8 MB of transformed values
        ((128, 128, 112), True),  # 51 MB, but in chunks: 1 MB of weights
        ((128, 32, 14), False),  # densenet121's growth layers: too little saving
        ((96, 128, 28), True),  # inception_v1's first 3x3, in chunks
        ((256, 256, 112), False),  # 4 MB of weights: no chunks, and 205 MB of values
        ((96, 208, 14), True),  # inception_v1's
        ((48, 192, 13), True),  # squeezenet's: small enough for half the L2
        ((32, 128, 27), False),
    ],
)
def test_which_convs_take_winograd(layer: tuple[int, int, int], taken: bool) -> None:
    c, m, size = layer
    assert winograd_pays((3, 3), (1, 1), (1, 1), 1, c, m, size, size, l2_bytes=2 << 20) is taken


@pytest.mark.parametrize(
    ("layer", "taken"),
    [
        ((128, 32, 56), True),  # densenet121's growth layers: 0.68-0.90x on a Zen 3
        ((128, 32, 7), True),
        ((32, 128, 27), True),  # squeezenet's
        ((256, 256, 56), True),  # vgg19's: 25.7 MB of transformed values, 50 L2s
        ((128, 128, 112), True),
        ((16, 64, 55), False),  # squeezenet's first: a saving of 12.8, nothing gained
        ((3, 64, 224), False),  # vgg19's first
        ((512, 512, 7), False),  # 16 tiles for 512 channels, as with 16-wide vectors
    ],
)
def test_which_convs_take_winograd_with_8_wide_vectors(layer: tuple[int, int, int], taken: bool) -> None:
    """With AVX2's 8-wide vectors a multiply-add saved is worth twice the time: a saving of
    ``NARROW_LEAST_SAVING`` pays whatever the transformed values' traffic (a 512 KB L2)."""
    c, m, size = layer
    assert winograd_pays((3, 3), (1, 1), (1, 1), 1, c, m, size, size, l2_bytes=512 << 10, vector_floats=8) is taken


def test_winograd_can_be_turned_off() -> None:
    """``CBackend(winograd=False)`` (``c:no-winograd``) runs every Conv directly, and the
    compiled-partition cache tells the two builds apart."""
    model = light_model("resnet50")
    partition = Partition("p", ir.from_proto(model))
    assert "cg_wino_in(" not in CBackend(winograd=False).generate(partition).source
    assert CBackend.from_spec("no-winograd").winograd is False
    assert CBackend(winograd=False).cache_fingerprint() != CBackend().cache_fingerprint()


def test_the_winograd_bench_finds_resnet50s_winograd_layers() -> None:
    layers = winograd_layers(light_model("resnet50"), l2_bytes=2 << 20, vector_floats=16)
    assert sorted(Counter(layers.values()).items()) == [
        ("128->128 @28x28", 3), ("256->256 @14x14", 5), ("64->64 @56x56", 3),
    ]


def test_the_winograd_bench_marks_the_layers_the_rule_leaves_direct() -> None:
    """``--every-3x3`` times every Conv that fits Winograd; those the rule leaves are marked."""
    layers = winograd_layers(light_model("squeezenet"), l2_bytes=2 << 20, vector_floats=16, every=True)
    assert sorted(Counter(layers.values()).items()) == [
        ("16->64 @55x55 forced", 2), ("32->128 @27x27 forced", 2), ("48->192 @13x13", 2), ("64->256 @13x13", 2),
    ]


@pytest.mark.parametrize("threads", [1, 2])
def test_an_inf_or_nan_input_reaches_the_outputs_it_would_reach_directly(threads: int) -> None:
    """A patch's transform mixes its 16 pixels (Inf - Inf, 0 * Inf), so an Inf or a NaN would
    reach every output of its tiles: the kernel sees one and runs the direct Conv instead."""
    rng = np.random.default_rng(9)
    c, m = 128, 128
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1] * 4)]
    weights = {"w": _weight(rng, m, c), "b": rng.standard_normal(m).astype(np.float32)}
    model = _graph(nodes, {"x": [1, c, 12, 12]}, weights)
    assert generate(ir.from_proto(model), host_target(), threads).source.count("if (cg_wino_in(") == 1
    compiled = cg.compile(model, targets=["c"], threads=threads)
    for bad in ([np.inf], [np.nan], [np.inf, -np.inf]):
        x = rng.standard_normal((1, c, 12, 12)).astype(np.float32)
        for value, (ci, yy, xx) in zip(bad, [(5, 4, 4), (70, 9, 2)], strict=False):
            x[0, ci, yy, xx] = value
        got, want = compiled.run({"x": x})["y"], run_onnxruntime(model, {"x": x})["y"]
        assert np.array_equal(np.isnan(got), np.isnan(want))
        assert np.array_equal(np.isposinf(got), np.isposinf(want))
        assert np.array_equal(np.isneginf(got), np.isneginf(want))
        finite = np.isfinite(want)
        assert np.abs(got[finite] - want[finite]).max() <= 1e-5 * np.abs(want[finite]).max()


@pytest.mark.parametrize("threads", [1, 3])
def test_a_winograd_conv_run_in_chunks_of_tile_rows_gives_onnxruntimes_result(
    threads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chunks of tile rows (``chunk_rows``) across two images, a ragged last one, into the
    next Conv's zero border; an Inf in a later chunk than the first still gives the direct
    Conv's result everywhere.  On several threads the chunks are shared out, each run whole by
    one thread (``thread_chunk_rows``, ``cg_wino_chunk_task``): the same bits as one thread."""
    import dataclasses

    from codegraft.backends.c import _codegen as codegen
    from codegraft.backends.c.ops import winograd

    real = winograd.host_blocking
    small_l2 = lambda vector: dataclasses.replace(real(vector), l2=512 << 10)  # noqa: E731
    monkeypatch.setattr(winograd, "host_blocking", small_l2)
    assert winograd.chunk_rows(38, 6, 64, 64, 1, 512 << 10) == 2  # of 6 tile columns, 64 + 64 channels
    assert winograd.chunk_rows(38, 6, 64, 64, 3, 512 << 10) == 8  # 3 threads' L2s: 8 rows at most
    assert winograd.thread_chunk_rows(38, 6, 64, 64, 3, 512 << 10) == 2  # one thread's L2 each: 19 chunks
    rng = np.random.default_rng(11)
    c = 64
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["a"], pads=[1] * 4),  # Winograd in chunks
        helper.make_node("Relu", ["a"], ["r"]),
        helper.make_node("Conv", ["r", "w2"], ["y"], pads=[1] * 4),  # 64 -> 8: direct
    ]
    weights = {"w1": _weight(rng, c, c), "b1": rng.standard_normal(c).astype(np.float32), "w2": _weight(rng, 8, c)}
    model = _graph(nodes, {"x": [2, c, 37, 11]}, weights)
    source = generate(ir.from_proto(model), host_target(), threads).source
    assert "cg_zero_border(" in source
    if threads == 1:  # one chunk after the other, over the 2 x 19 tile rows
        loop = re.search(r"< 38; \w+ \+= (\d+)\) \{", source)
        assert source.count("if (cg_wino_in(") == 1 and loop and int(loop.group(1)) == 2
    else:
        assert source.count("cg_parallel(19, cg_wino_chunk_task, &") == 1
    # in chunks on 2 and 3 threads (5 and 8 rows of 38), whole from 4: the cost model counts
    # one loop (one join) on 2 and 3, the three loops from 4 on
    monkeypatch.setattr(codegen, "host_blocking", small_l2)
    work = next(k.work for k in generate(ir.from_proto(model), host_target(), threads).threads if k.work.loops == 3)
    assert work.one_loop_below == 4
    _check(model, threads)
    x = rng.standard_normal((2, c, 37, 11)).astype(np.float32)
    one_thread = cg.compile(model, targets=["c"], threads=1).run({"x": x})["y"]
    assert np.array_equal(cg.compile(model, targets=["c"], threads=threads).run({"x": x})["y"], one_thread)
    x[1, 3, 30, 4] = np.inf  # image 1, tile row 15: a chunk after the first
    got = cg.compile(model, targets=["c"], threads=threads).run({"x": x})["y"]
    want = run_onnxruntime(model, {"x": x})["y"]
    assert np.array_equal(np.isnan(got), np.isnan(want)) and np.array_equal(np.isinf(got), np.isinf(want))
    finite = np.isfinite(want)
    assert np.abs(got[finite] - want[finite]).max() <= 1e-5 * np.abs(want[finite]).max()


def test_a_conv_of_non_finite_weights_runs_directly() -> None:
    rng = np.random.default_rng(4)
    weight = _weight(rng, 128, 128)
    weight[3, 7, 1, 1] = np.inf
    model = _graph([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1] * 4)], {"x": [1, 128, 8, 8]}, {"w": weight})
    assert "if (cg_wino_in(" not in generate(ir.from_proto(model), host_target(), 1).source
