"""C backend: the AVX-512 VNNI path of 8-bit products (``ops/q8.c``, ``qgemm.c``) built for a
CPU without VNNI, against exact int64 sums requantized as QLinearConv / QLinearMatMul do it.

Weights packed for VNNI (the target's features) and a compiler without it: ``q8.c`` runs the
VNNI path on portable definitions of its intrinsics.  That is what an artifact built on a Xeon
does when loaded on a CPU without VNNI (rebuilt there from its source), and it lets CI's AVX2
machines check the VNNI path's sums and weight layout, which would otherwise run only on a
Xeon.  onnxruntime is no reference here: its AVX2 u8s8 kernel saturates its pair sums
(``vpmaddubsw``: off by up to 174 steps on full-range weights), while VNNI's are exact.
"""

from __future__ import annotations

import pathlib
import platform
from typing import Any

import numpy as np
import onnx
import pytest
from c_backend_util import backend, needs_compiler, run_c
from onnx import numpy_helper
from test_c_qdq import _exact_sums, _qdq_convs, _qdq_linear
from test_c_quantized_lstm import _feeds, quantized_lstm

import codegraft as cg
from codegraft.backends.c import CBackend
from codegraft.backends.c import _runtime as runtime
from codegraft.backends.c._toolchain import _X86_TARGETS, Target, cpu_features

VNNI_FEATURES, VNNI_FLAGS = _X86_TARGETS[0]
# VNNI's weight layout and 16-float vectors, compiled for AVX2: the intrinsics portable
EMULATED = Target(VNNI_FEATURES, ("-mavx2", "-mfma", "-Wno-psabi"), 16)

pytestmark = [
    needs_compiler,
    pytest.mark.skipif(platform.machine().lower() not in {"x86_64", "amd64"} or not {"avx2", "fma"} <= cpu_features(),
                       reason="the portable VNNI path is built for AVX2 here"),
]
RNG = np.random.default_rng(7)


@pytest.fixture
def emulated(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> CBackend:
    """``c`` compiling for the VNNI target without VNNI's instructions, its library loaded as is
    (not rebuilt for this CPU, which lacks the target's features: the same source again)."""
    monkeypatch.setattr(runtime, "cpu_features", lambda: cpu_features() | VNNI_FEATURES)
    return CBackend(cache_dir=tmp_path, target=EMULATED, all_qdq_units=True)


def _compiled(model: onnx.ModelProto, c: CBackend, feeds: dict[str, np.ndarray],
              names: list[str]) -> tuple[list[str], list[np.ndarray]]:
    """The kernels ``c`` runs ``model`` with (by core op) and the outputs ``names``."""
    exe = cg.compile(model, targets=[c])
    assert [p.backend for p in exe.report().partitions] == ["c"], exe.report()
    kernels = [op.op_type.split(" ")[0] for _, op in exe.profile(feeds, repeat=1, ops=True).ops]
    got = exe.run(feeds)
    return kernels, [got[name] for name in names]


def _requantized(sums: np.ndarray, multiplier: np.ndarray, zero: int, dtype: type) -> np.ndarray:
    """QLinearConv's / QLinearMatMul's output: the int32 sums (bias in) times the float32
    multiplier in float32, rounded half to even, plus the zero point, saturated."""
    info = np.iinfo(dtype)
    value = sums.astype(np.float32) * multiplier.astype(np.float32)
    return np.clip(np.rint(value) + zero, info.min, info.max).astype(dtype)


def _conv_reference(model: onnx.ModelProto, x: np.ndarray, layers: list[tuple[int, int, dict[str, Any]]]) -> np.ndarray:
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    scale, zero = np.float32(inits["s0"]), int(inits["z0"])
    q = np.clip(np.rint(x / scale) + zero, 0, 255).astype(np.int64)
    for i, (cout, k, attrs) in enumerate(layers, 1):
        w = inits[f"w{i}"].astype(np.int64) - inits[f"wz{i}"].astype(np.int64).reshape(-1, 1, 1, 1)
        pads, (sy, sx) = attrs.get("pads", [0] * 4), attrs.get("strides", [1, 1])
        dy, dx = attrs.get("dilations", [1, 1])
        padded = np.pad(q - zero, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
        height = (padded.shape[2] - dy * (k - 1) - 1) // sy + 1
        width = (padded.shape[3] - dx * (k - 1) - 1) // sx + 1
        sums = np.zeros((padded.shape[0], cout, height, width), np.int64)
        for ky in range(k):
            for kx in range(k):
                patch = padded[:, :, ky * dy: ky * dy + sy * (height - 1) + 1: sy,
                               kx * dx: kx * dx + sx * (width - 1) + 1: sx]  # fmt: skip
                sums += np.einsum("nchw,oc->nohw", patch, w[:, :, ky, kx])
        sums += inits[f"b{i}"].astype(np.int64).reshape(1, -1, 1, 1)
        out_scale, out_zero = np.float32(inits[f"s{i}"]), int(inits[f"z{i}"])
        multiplier = (scale * inits[f"ws{i}"] / out_scale).reshape(1, -1, 1, 1)
        q = _requantized(sums, multiplier, out_zero, np.uint8).astype(np.int64)
        scale, zero = out_scale, out_zero
    return q.astype(np.uint8)


def _matmul_reference(model: onnx.ModelProto, x: np.ndarray, x_dtype: type, op: str) -> np.ndarray:
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    sums = _exact_sums(model, x, op) + (inits["b"].astype(np.int64) if "b" in inits else 0)
    multiplier = np.float32(inits["xs"]) * inits["ws"].reshape(-1) / np.float32(inits["ys"])
    return _requantized(sums, multiplier, int(inits["yz"]), x_dtype)


@pytest.mark.parametrize(("kernel", "attrs"), [
    (1, {}), (3, {"pads": [1, 1, 1, 1]}), (3, {"strides": [2, 2], "pads": [0, 1, 1, 0]}),
    (5, {"dilations": [2, 1], "pads": [4, 2, 4, 2]}),
])  # fmt: skip
@pytest.mark.parametrize("weight_dtype", [np.int8, np.uint8])
def test_qdq_convs_on_emulated_vnni_are_exact(emulated: CBackend, kernel: int, attrs: dict[str, Any],
                                              weight_dtype: type) -> None:
    layers = [(32, kernel, attrs), (40, kernel, attrs)]
    model = _qdq_convs(np.uint8, [2, 24, 15, 14], layers, weight_dtype)
    x = (RNG.standard_normal([2, 24, 15, 14]) * 2).astype(np.float32)
    kernels, (got,) = _compiled(model, emulated, {"x": x}, ["q2"])
    assert kernels.count("QuantConv") == 2, kernels
    np.testing.assert_array_equal(got, _conv_reference(model, x, layers))


@pytest.mark.parametrize("x_dtype", [np.uint8, np.int8])
@pytest.mark.parametrize(("op", "shape", "cols", "bias", "weight_dtype", "per_column"), [
    ("MatMul", [2, 25, 96], 80, False, np.int8, True), ("MatMul", [7, 384], 130, False, np.uint8, False),
    ("Gemm", [9, 70], 64, True, np.int8, True), ("Gemm", [5, 33], 3, False, np.uint8, True),
])  # fmt: skip
def test_qdq_matmuls_on_emulated_vnni_are_exact(emulated: CBackend, x_dtype: type, op: str, shape: list[int],
                                                cols: int, bias: bool, weight_dtype: type, per_column: bool) -> None:
    model = _qdq_linear(x_dtype, weight_dtype, per_column, op, shape, cols, bias)
    x = (RNG.standard_normal(shape) * 2).astype(np.float32)
    kernels, (got,) = _compiled(model, emulated, {"x": x}, ["yq"])
    assert kernels.count("QuantMatMul") == 1, kernels
    np.testing.assert_array_equal(got, _matmul_reference(model, x, x_dtype, op))


@pytest.mark.parametrize(("hidden", "width"), [(256, 128), (36, 130)])
def test_the_quantized_lstm_on_emulated_vnni_is_the_plain_c_one(emulated: CBackend, hidden: int, width: int) -> None:
    # qlstm.c's VNNI path (the projection on qgemm.c, the recurrence on vpdpbusd): full-range
    # int8 weights, 16-17 blocks of 64 columns or a ragged one
    model = quantized_lstm(seq=5, hidden=hidden, width=width, direction="bidirectional", weights="int8 full",
                           h0="input", batch=1)
    plain = backend(target=Target(frozenset(), (), 4))
    feeds = _feeds(model, 0)
    got, want = run_c(model, feeds, emulated), run_c(model, feeds, plain)
    for name, value in want.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)


def test_an_artifact_built_for_vnni_is_exact_where_rebuilt_without_it(tmp_path: pathlib.Path) -> None:
    """Built for a Xeon (the VNNI instructions; never run here), saved, loaded on this CPU:
    rebuilt from its source, the VNNI-packed weights read by the portable VNNI path (the AVX2
    path read them as garbage: 3961 of 4000 outputs off)."""
    model = _qdq_linear(np.uint8, np.int8, True, "MatMul", [2, 25, 96], 80, False)
    x = (RNG.standard_normal([2, 25, 96]) * 2).astype(np.float32)
    xeon = Target(VNNI_FEATURES, VNNI_FLAGS, 16)
    assert "-mavx512vnni" in xeon.flags  # (on a VNNI CPU the library runs as built: exact too)
    exe = cg.compile(model, targets=[CBackend(cache_dir=tmp_path / "cache", target=xeon, all_qdq_units=True)])
    assert [p.backend for p in exe.report().partitions] == ["c"], exe.report()
    exe.save(tmp_path / "xeon.cgx")
    got = cg.load_executable(tmp_path / "xeon.cgx").run({"x": x})["yq"]
    np.testing.assert_array_equal(got, _matmul_reference(model, x, np.uint8, "MatMul"))
