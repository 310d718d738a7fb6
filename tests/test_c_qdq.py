"""C backend: static quantization (QDQ): QuantizeLinear, DequantizeLinear and the quantized
units onnxruntime's quantizer makes (DequantizeLinear -> Conv / MatMul / Add -> QuantizeLinear),
against onnxruntime, placed on ``c``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
import pytest
from c_backend_util import backend, needs_compiler, typed_model
from onnx import TensorProto, helper, numpy_helper

import codegraft as cg
from codegraft.backends.c._toolchain import VNNI, cpu_features
from codegraft.core.irversion import readable_by_runtime
from codegraft.testing import run_onnxruntime

pytestmark = needs_compiler
RNG = np.random.default_rng(0)
_TYPES = {np.uint8: TensorProto.UINT8, np.int8: TensorProto.INT8}


_model = typed_model


def _c() -> Any:
    """``c`` taking every QDQ unit it computes: Convs of uint8 activations, MatMuls (by default they
    stay with onnxruntime)."""
    return backend(all_qdq_units=True)


def _on_c(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], whole: bool = True) -> dict[str, np.ndarray]:
    """``model`` compiled for ``c`` (``whole``: every node on it) and run on ``feeds``."""
    exe = cg.compile(model, targets=[_c()])
    report = exe.report()
    if whole:
        assert [p.backend for p in report.partitions] == ["c"], report
        assert all(n.backend == "c" for n in report.nodes), report
    return dict(exe.run(dict(feeds)))


def _kernels(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> list[str]:
    """The kernels ``c`` runs ``model`` with, by their core op (``QuantConv``, ``Conv``, ``elementwise``)."""
    profile = cg.compile(model, targets=[_c()]).profile(dict(feeds), repeat=1, ops=True)
    return [op.op_type.split(" ")[0] for _, op in profile.ops]


def _activations(shape: list[int], scale: float = 0.05) -> np.ndarray:
    """Values around many half steps of ``scale``, a few far beyond either end, a NaN and infinities."""
    x = (RNG.standard_normal(shape) * 60 * scale).astype(np.float32)
    flat = x.reshape(-1)
    flat[:16] = (np.arange(16) - 8 + 0.5).astype(np.float32) * np.float32(scale)  # exact ties
    flat[16:20] = [1e6, -1e6, np.inf, -np.inf]
    flat[20] = np.nan
    return x


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("per_axis", [False, True])
def test_quantize_and_dequantize_linear_are_onnxruntimes_bit_for_bit(dtype: type, per_axis: bool) -> None:
    shape = [2, 5, 7, 9]
    info = np.iinfo(dtype)
    if per_axis:
        scale = RNG.uniform(0.01, 0.1, 5).astype(np.float32)
        zero = RNG.integers(info.min, info.max, 5, endpoint=True).astype(dtype)
    else:
        scale, zero = np.array(0.05, np.float32), np.array(3 if dtype == np.uint8 else -7, dtype)
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], axis=1),
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], axis=1),
    ]
    model = _model(nodes, {"x": (TensorProto.FLOAT, shape)}, {"q": _TYPES[dtype], "y": TensorProto.FLOAT},
                   {"s": scale, "z": zero})
    feeds = {"x": _activations(shape)}
    got, want = _on_c(model, feeds), run_onnxruntime(model, feeds)
    assert got["q"].dtype == dtype
    np.testing.assert_array_equal(got["q"], want["q"])
    np.testing.assert_array_equal(got["y"], want["y"])


def test_quantize_linear_without_a_zero_point_is_uint8() -> None:
    nodes = [helper.make_node("QuantizeLinear", ["x", "s"], ["q"])]
    model = _model(nodes, {"x": (TensorProto.FLOAT, [3, 50])}, {"q": TensorProto.UINT8}, {"s": np.float32(0.02)})
    feeds = {"x": _activations([3, 50], 0.02)}
    got, want = _on_c(model, feeds), run_onnxruntime(model, feeds)
    assert got["q"].dtype == np.uint8
    np.testing.assert_array_equal(got["q"], want["q"])


def _qdq_convs(x_dtype: type, shape: list[int], layers: list[tuple[int, int, dict[str, Any]]],
               weight_dtype: type = np.int8, weight_bound: int | None = None) -> onnx.ModelProto:
    """What onnxruntime's static quantizer makes of Convs in a row: the input quantized and
    dequantized, 8-bit weights per output channel, an int32 bias at the input's scale times the
    weight's, each result quantized and dequantized for the next.  ``layers``: (output
    channels, kernel size, attributes) each; ``weight_bound``: int8 weights within it, not the
    whole range."""
    info = np.iinfo(x_dtype)
    nodes = [helper.make_node("QuantizeLinear", ["x", "s0", "z0"], ["q0"]),
             helper.make_node("DequantizeLinear", ["q0", "s0", "z0"], ["d0"])]
    inits: dict[str, Any] = {"s0": np.float32(0.04), "z0": np.array(11 if x_dtype == np.uint8 else -3, x_dtype)}
    channels = shape[1]
    for i, (cout, kernel, attrs) in enumerate(layers, 1):
        cin = channels // attrs.get("group", 1)
        w_info = np.iinfo(weight_dtype)
        low, high = (-weight_bound, weight_bound) if weight_bound else (w_info.min, w_info.max)
        weight = RNG.integers(low, high, (cout, cin, *([kernel] * (len(shape) - 2))), endpoint=True)
        w_zero = np.zeros(cout, weight_dtype) if weight_dtype == np.int8 else RNG.integers(100, 150, cout)
        w_scale = RNG.uniform(0.002, 0.01, cout).astype(np.float32)
        inits |= {f"w{i}": weight.astype(weight_dtype), f"ws{i}": w_scale, f"wz{i}": w_zero.astype(weight_dtype),
                  f"b{i}": RNG.integers(-3000, 3000, cout).astype(np.int32), f"bs{i}": inits[f"s{i - 1}"] * w_scale,
                  f"s{i}": np.float32(0.08), f"z{i}": np.array(info.min + 100, x_dtype)}  # fmt: skip
        nodes += [
            helper.make_node("DequantizeLinear", [f"w{i}", f"ws{i}", f"wz{i}"], [f"wd{i}"], axis=0),
            helper.make_node("DequantizeLinear", [f"b{i}", f"bs{i}"], [f"bd{i}"], axis=0),
            helper.make_node("Conv", [f"d{i - 1}", f"wd{i}", f"bd{i}"], [f"c{i}"], **attrs),
            helper.make_node("QuantizeLinear", [f"c{i}", f"s{i}", f"z{i}"], [f"q{i}"]),
            helper.make_node("DequantizeLinear", [f"q{i}", f"s{i}", f"z{i}"], [f"d{i}"]),
        ]
        channels = cout
    last = len(layers)
    outputs = {f"d{last}": TensorProto.FLOAT, f"q{last}": _TYPES[x_dtype]}
    return _model(nodes, {"x": (TensorProto.FLOAT, shape)}, outputs, inits)


def _quantized_differences(got: np.ndarray, want: np.ndarray) -> tuple[int, int]:
    diff = np.abs(got.astype(np.int32) - want.astype(np.int32))
    return int(diff.max()), int(np.count_nonzero(diff))


@pytest.mark.parametrize("x_dtype", [np.uint8, np.int8])
@pytest.mark.parametrize(("cin", "kernel", "attrs"), [
    (16, 1, {}), (8, 3, {"pads": [1, 1, 1, 1]}), (6, 3, {"strides": [2, 2]}), (12, 3, {"group": 12, "pads": [1] * 4}),
    (5, 3, {"dilations": [2, 2], "pads": [2, 1, 0, 2]}),
])  # fmt: skip
def test_a_qdq_conv_unit_runs_on_c(x_dtype: type, cin: int, kernel: int, attrs: dict[str, Any]) -> None:
    """One unit (its input quantized at the entry: a float Conv of the dequantized values), then
    one reading the first's 8-bit result (with VNNI, on 8-bit products; without VNNI both stay
    with onnxruntime, the QuantizeLinear at the entry on ``c``): within one step of
    onnxruntime's 8-bit results, and those rarely (a sum rounded otherwise lands a half step
    the other way), as its own optimized session is of its unoptimized one."""
    cout = 12 if attrs.get("group") else 20
    first = {k: v for k, v in attrs.items() if k != "group"} if attrs.get("group") else attrs
    vnni = VNNI in cpu_features()
    # Without VNNI onnxruntime runs the second unit with its u8 x s8 kernel, whose 16-bit pair
    # sums saturate on full-range weights (tests/test_c_quantize.py): weights within +-63 there.
    model = _qdq_convs(x_dtype, [1, cin, 13, 11], [(cout, kernel, attrs if attrs.get("group") else first),
                                                    (24, kernel, first)], weight_bound=None if vnni else 63)
    feeds = {"x": (RNG.standard_normal([1, cin, 13, 11]) * 2).astype(np.float32)}
    got, want = _on_c(model, feeds, whole=vnni), run_onnxruntime(model, feeds)
    largest, differ = _quantized_differences(got["q2"], want["q2"])
    assert largest <= 1 and differ <= 0.01 * got["q2"].size, (largest, differ)
    if vnni:
        assert "QuantConv" in _kernels(model, feeds)
    else:  # both Convs stay with onnxruntime (test_without_vnni_a_qdq_conv_stays_with_onnxruntime)
        report = cg.compile(model, targets=[_c()]).report()
        assert {n.backend for n in report.nodes if n.op_type == "Conv"} == {"onnxruntime"}, report


def test_without_vnni_a_qdq_conv_stays_with_onnxruntime() -> None:
    """In float a QDQ Conv is slower than onnxruntime's 8-bit kernels (sscd_qdq: about 2x)."""
    from codegraft.backends.c import CBackend
    from codegraft.backends.c._toolchain import target_for

    model = _qdq_convs(np.uint8, [1, 8, 9, 9], [(16, 3, {"pads": [1] * 4})])
    target = target_for(cpu_features() - {VNNI})
    report = cg.compile(model, targets=[CBackend(target=target, all_qdq_units=True)]).report()
    assert {n.backend for n in report.nodes if n.op_type == "Conv"} == {"onnxruntime"}
    assert any("only with AVX-512 VNNI" in reason for _, op, reason, _ in report.decline_reasons() if op == "Conv")


@pytest.mark.skipif(VNNI not in cpu_features(), reason="8-bit products need AVX-512 VNNI")
@pytest.mark.parametrize(("kernel", "attrs"), [
    (1, {}), (3, {"pads": [1, 1, 1, 1]}), (3, {"strides": [2, 2], "pads": [0, 1, 1, 0]}),
    (5, {"dilations": [2, 1], "pads": [4, 2, 4, 2]}),
])  # fmt: skip
@pytest.mark.parametrize("weight_dtype", [np.int8, np.uint8])
def test_qdq_convs_on_8_bit_products_are_qlinear_convs_bit_for_bit(kernel: int, attrs: dict[str, Any],
                                                                   weight_dtype: type) -> None:
    """onnxruntime's optimizer fuses each uint8 unit into a QLinearConv: the exact int32 sums plus
    the bias, times (x scale * w scale) / y scale, rounded; ``c`` computes the same."""
    import onnxruntime as ort

    model = _qdq_convs(np.uint8, [2, 24, 15, 14], [(32, kernel, attrs), (40, kernel, attrs)], weight_dtype)
    feeds = {"x": (RNG.standard_normal([2, 24, 15, 14]) * 2).astype(np.float32)}
    assert _kernels(model, feeds).count("QuantConv") == 2
    got = _on_c(model, feeds)
    session = ort.InferenceSession(readable_by_runtime(model).SerializeToString(), providers=["CPUExecutionProvider"])
    want = dict(zip(["q2"], session.run(["q2"], feeds), strict=True))
    np.testing.assert_array_equal(got["q2"], want["q2"])


@pytest.mark.parametrize("x_dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("per_column", [False, True])
def test_a_qdq_matmul_unit_runs_on_c(x_dtype: type, per_column: bool) -> None:
    """DequantizeLinear -> MatMul -> QuantizeLinear (the weight int8 per tensor or per column),
    computed in float (dequantized, the float GEMM, quantized), as onnxruntime computes it
    unoptimized: the same 8-bit results but where a sum rounds to the other side of a half step."""
    info = np.iinfo(x_dtype)
    scale = RNG.uniform(0.002, 0.01, 80 if per_column else ()).astype(np.float32)
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
        helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"], axis=1),
        helper.make_node("MatMul", ["xd", "wd"], ["m"]),
        helper.make_node("QuantizeLinear", ["m", "ys", "yz"], ["yq"]),
        helper.make_node("DequantizeLinear", ["yq", "ys", "yz"], ["y"]),
    ]
    inits = {"xs": np.float32(0.04), "xz": np.array(7 if x_dtype == np.uint8 else -5, x_dtype),
             "w": RNG.integers(-127, 128, (96, 80)).astype(np.int8), "ws": scale, "wz": np.zeros(scale.shape, np.int8),
             "ys": np.float32(0.1), "yz": np.array(info.min + 120, x_dtype)}  # fmt: skip
    model = _model(nodes, {"x": (TensorProto.FLOAT, [2, 25, 96])}, {"y": TensorProto.FLOAT, "yq": _TYPES[x_dtype]},
                   inits)
    feeds = {"x": (RNG.standard_normal([2, 25, 96]) * 2).astype(np.float32)}
    got, want = _on_c(model, feeds), run_onnxruntime(model, feeds)
    largest, differ = _quantized_differences(got["yq"], want["yq"])
    assert largest <= 1 and differ <= 0.01 * got["yq"].size, (largest, differ)


def test_a_qdq_add_unit_runs_on_c() -> None:
    """A residual Add of two dequantized 8-bit tensors, quantized again (ResNet's blocks)."""
    nodes = [
        helper.make_node("QuantizeLinear", ["a", "s1", "z1"], ["aq"]),
        helper.make_node("QuantizeLinear", ["b", "s2", "z2"], ["bq"]),
        helper.make_node("DequantizeLinear", ["aq", "s1", "z1"], ["ad"]),
        helper.make_node("DequantizeLinear", ["bq", "s2", "z2"], ["bd"]),
        helper.make_node("Add", ["ad", "bd"], ["sum"]),
        helper.make_node("QuantizeLinear", ["sum", "s3", "z3"], ["q"]),
    ]
    inits = {"s1": np.float32(0.05), "z1": np.uint8(128), "s2": np.float32(0.03), "z2": np.uint8(0),
             "s3": np.float32(0.07), "z3": np.uint8(60)}  # fmt: skip
    shape = [1, 8, 6, 6]
    model = _model(nodes, {"a": (TensorProto.FLOAT, shape), "b": (TensorProto.FLOAT, shape)},
                   {"q": TensorProto.UINT8}, inits)
    feeds = {"a": _activations(shape), "b": np.abs(RNG.standard_normal(shape)).astype(np.float32) * 3}
    got, want = _on_c(model, feeds), run_onnxruntime(model, feeds)
    np.testing.assert_array_equal(got["q"], want["q"])


@pytest.mark.skipif(VNNI not in cpu_features(), reason="8-bit products need AVX-512 VNNI")
@pytest.mark.parametrize("x_dtype", [np.uint8, np.int8])
def test_by_default_c_takes_qdq_convs_of_int8_activations_only(x_dtype: type) -> None:
    """onnxruntime's QLinearConv of uint8 activations was 10-30% faster than c's (sscd_qdq); of
    int8 ones it leaves many in float (efficientword-net), where c is 2-3x faster."""
    model = _qdq_convs(x_dtype, [1, 8, 9, 9], [(16, 3, {"pads": [1] * 4}), (16, 3, {"pads": [1] * 4})])
    report = cg.compile(model, targets=["c"]).report()
    placed = {n.backend for n in report.nodes if n.op_type == "Conv"}
    assert placed == ({"onnxruntime"} if x_dtype == np.uint8 else {"c"}), report.decline_reasons()


@pytest.mark.parametrize("vnni", [True, False])
def test_by_default_a_qdq_matmul_is_taken_with_vnni_only(vnni: bool) -> None:
    """On 8-bit products (VNNI) c's QDQ MatMul is QLinearMatMul's, and faster (the turn detector
    whole on c: 0.5-0.75x of onnxruntime's time); in float it is slower (2x): left to the host."""
    from codegraft.backends.c import CBackend
    from codegraft.backends.c._toolchain import target_for

    if vnni and VNNI not in cpu_features():
        pytest.skip("8-bit products need AVX-512 VNNI")
    nodes = [
        helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
        helper.make_node("DequantizeLinear", ["w", "ws"], ["wd"]),
        helper.make_node("MatMul", ["xd", "wd"], ["m"]),
        helper.make_node("QuantizeLinear", ["m", "ys", "yz"], ["y"]),
    ]
    inits = {"xs": np.float32(0.04), "xz": np.uint8(7), "w": RNG.integers(-127, 128, (16, 8)).astype(np.int8),
             "ws": np.float32(0.01), "ys": np.float32(0.1), "yz": np.uint8(120)}  # fmt: skip
    model = _model(nodes, {"xq": (TensorProto.UINT8, [4, 16])}, {"y": TensorProto.UINT8}, inits)
    features = cpu_features() if vnni else cpu_features() - {VNNI}
    report = cg.compile(model, targets=[CBackend(target=target_for(features))]).report()
    assert {n.backend for n in report.nodes if n.op_type == "MatMul"} == {"c" if vnni else "onnxruntime"}
    if not vnni:
        assert any("QLinearMatMul" in reason for _, op, reason, _ in report.decline_reasons() if op == "MatMul")


def test_the_shell_names_the_option_as_a_target() -> None:
    """``-t c:all-qdq-units`` (options joined by ``+``) is the Python option from the shell."""
    from codegraft.backends import get_backend
    from codegraft.errors import BackendError

    both = get_backend("c:all-qdq-units+measure-threads")
    assert both.all_qdq_units and both.measure_threads  # type: ignore[attr-defined]
    assert not get_backend("c:measure-threads").all_qdq_units  # type: ignore[attr-defined]
    with pytest.raises(BackendError, match="unknown option 'fast'; the options are all-qdq-units, measure-threads"):
        get_backend("c:fast")


def _optimized_onnxruntime(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], names: list[str]) -> dict[str, Any]:
    """onnxruntime's default session: its QDQ transformer fuses the units (QLinearMatMul, QGemm, QLinearConv)."""
    import onnxruntime as ort

    session = ort.InferenceSession(readable_by_runtime(model).SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip(names, session.run(names, dict(feeds)), strict=True))


def _qdq_linear(x_dtype: type, weight_dtype: type, per_column: bool, op: str, shape: list[int], cols: int,
                bias: bool = True) -> onnx.ModelProto:
    """What onnxruntime's static quantizer makes of a MatMul (a Gemm: transB, an int32 bias at
    the input's scale times the weight's): the input quantized and dequantized, the 8-bit
    weight per tensor or per column, the result quantized and dequantized."""
    info, w_info = np.iinfo(x_dtype), np.iinfo(weight_dtype)
    depth = shape[-1]
    scale = RNG.uniform(0.002, 0.01, cols if per_column else ()).astype(np.float32)
    if weight_dtype == np.int8:
        w_zero = np.zeros(scale.shape, np.int8)
    else:
        w_zero = RNG.integers(100, 150, scale.shape).astype(np.uint8)
    weight = RNG.integers(w_info.min, w_info.max, (cols, depth) if op == "Gemm" else (depth, cols), endpoint=True)
    x_scale = np.float32(0.04)
    inits: dict[str, Any] = {
        "xs": x_scale, "xz": np.array(7 if x_dtype == np.uint8 else -5, x_dtype), "w": weight.astype(weight_dtype),
        "ws": scale, "wz": w_zero, "ys": np.float32(0.1 if op == "MatMul" else 0.2),
        "yz": np.array(info.min + 120, x_dtype),
    }  # fmt: skip
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
        helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"], axis=0 if op == "Gemm" else 1),
    ]
    if op == "Gemm":
        inputs = ["xd", "wd"]
        if bias:
            inits |= {"b": RNG.integers(-3000, 3000, cols).astype(np.int32), "bs": (x_scale * scale).astype(np.float32)}
            nodes.append(helper.make_node("DequantizeLinear", ["b", "bs"], ["bd"], axis=0))
            inputs.append("bd")
        nodes.append(helper.make_node("Gemm", inputs, ["m"], transB=1))
    else:
        nodes.append(helper.make_node("MatMul", ["xd", "wd"], ["m"]))
    nodes += [helper.make_node("QuantizeLinear", ["m", "ys", "yz"], ["yq"]),
              helper.make_node("DequantizeLinear", ["yq", "ys", "yz"], ["y"])]
    return _model(nodes, {"x": (TensorProto.FLOAT, shape)}, {"y": TensorProto.FLOAT, "yq": _TYPES[x_dtype]}, inits)


@pytest.mark.skipif(VNNI not in cpu_features(), reason="8-bit products need AVX-512 VNNI")
@pytest.mark.parametrize("x_dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("weight_dtype", [np.int8, np.uint8])
@pytest.mark.parametrize("per_column", [False, True])
@pytest.mark.parametrize(("op", "shape", "cols", "bias"), [
    ("MatMul", [2, 25, 96], 80, False), ("MatMul", [7, 384], 130, False), ("Gemm", [9, 70], 64, True),
    ("Gemm", [5, 33], 3, False),
])  # fmt: skip
def test_qdq_matmuls_on_8_bit_products_are_qlinear_matmuls_bit_for_bit(
        x_dtype: type, weight_dtype: type, per_column: bool, op: str, shape: list[int], cols: int, bias: bool) -> None:
    """onnxruntime's optimizer fuses each unit into a QLinearMatMul (a Gemm into QGemm): the exact
    int32 sums (plus the bias), times (a scale * b scale) / y scale, rounded; ``c`` computes the
    same on 8-bit products (QuantMatMul).  With int8 activations onnxruntime 1.32 keeps the float
    MatMul between the Q/DQ pairs instead: its float sums can land on the other side of a
    half-way point than the exact one, so there (and only there) the two may be a step apart."""
    model = _qdq_linear(x_dtype, weight_dtype, per_column, op, shape, cols, bias)
    feeds = {"x": (RNG.standard_normal(shape) * 2).astype(np.float32)}
    assert _kernels(model, feeds).count("QuantMatMul") == 1
    got, want = _on_c(model, feeds), _optimized_onnxruntime(model, feeds, ["yq", "y"])
    near_half = _near_half_way(model, feeds["x"], op)
    steps = got["yq"].astype(np.int32) - want["yq"].astype(np.int32)
    assert not steps[~near_half].any(), np.argwhere((steps != 0) & ~near_half)[:5]
    assert np.abs(steps).max(initial=0) <= 1
    if x_dtype == np.uint8:  # onnxruntime's QLinearMatMul / QGemm: exact, so bit for bit everywhere
        np.testing.assert_array_equal(got["yq"], want["yq"])
    same = steps == 0
    np.testing.assert_array_equal(got["y"][same], want["y"][same])


def _exact_sums(model: onnx.ModelProto, x: np.ndarray, op: str) -> np.ndarray:
    """A :func:`_qdq_linear` unit's int64 sums of (x - x zero)(w - w zero), bias aside."""
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    xz = int(inits["xz"])
    info = np.iinfo(inits["xz"].dtype)
    xq = np.clip(np.rint(x / inits["xs"]) + xz, info.min, info.max)
    w = inits["w"].T if op == "Gemm" else inits["w"]  # [depth, cols], zero points per column
    w = w.astype(np.int64) - inits["wz"].astype(np.int64).reshape(1, -1)
    return (xq.astype(np.int64) - xz) @ w


def _near_half_way(model: onnx.ModelProto, x: np.ndarray, op: str) -> np.ndarray:
    """Where the exact requantized value (the int32 sums, plus the bias, times the scales, in
    float64) is within float32 summation error of half-way between two integers."""
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    sums = _exact_sums(model, x, op)
    scale = np.float64(inits["xs"]) * inits["ws"].astype(np.float64)
    exact = sums * scale / np.float64(inits["ys"])
    if "b" in inits:
        exact = exact + inits["b"].astype(np.float64) * inits["bs"].astype(np.float64) / np.float64(inits["ys"])
    return np.abs(np.abs(exact - np.floor(exact)) - 0.5) < 1e-5 * np.maximum(1.0, np.abs(exact))


@pytest.mark.skipif(VNNI not in cpu_features(), reason="8-bit products need AVX-512 VNNI")
def test_two_qdq_matmuls_in_a_row_are_taken_by_default_and_bit_for_bit() -> None:
    """A transformer's projections: uint8 activations, int8 weights per column, the second
    MatMul reading the first's requantized values; on ``c`` by default (with VNNI), the 8-bit
    results onnxruntime's optimized session's (QLinearMatMuls), and a float read of the last
    MatMul the int32 sums times the scales, rounded once (onnxruntime's float MatMul: within
    its rounding)."""
    nodes = [helper.make_node("QuantizeLinear", ["x", "s0", "z0"], ["q0"]),
             helper.make_node("DequantizeLinear", ["q0", "s0", "z0"], ["d0"])]
    inits: dict[str, Any] = {"s0": np.float32(0.04), "z0": np.uint8(100)}
    for i, (depth, cols) in enumerate([(64, 96), (96, 48)], 1):
        scale = RNG.uniform(0.002, 0.01, cols).astype(np.float32)
        inits |= {f"w{i}": RNG.integers(-128, 128, (depth, cols)).astype(np.int8), f"ws{i}": scale,
                  f"wz{i}": np.zeros(cols, np.int8), f"s{i}": np.float32(0.3), f"z{i}": np.uint8(110)}
        nodes += [helper.make_node("DequantizeLinear", [f"w{i}", f"ws{i}", f"wz{i}"], [f"wd{i}"], axis=1),
                  helper.make_node("MatMul", [f"d{i - 1}", f"wd{i}"], [f"m{i}"]),
                  helper.make_node("QuantizeLinear", [f"m{i}", f"s{i}", f"z{i}"], [f"q{i}"]),
                  helper.make_node("DequantizeLinear", [f"q{i}", f"s{i}", f"z{i}"], [f"d{i}"])]
    model = _model(nodes, {"x": (TensorProto.FLOAT, [3, 10, 64])},
                   {"q2": TensorProto.UINT8, "d2": TensorProto.FLOAT, "m2": TensorProto.FLOAT}, inits)
    feeds = {"x": (RNG.standard_normal([3, 10, 64]) * 2).astype(np.float32)}
    exe = cg.compile(model, targets=[backend()])
    assert {n.backend for n in exe.report().nodes} == {"c"}
    got, want = dict(exe.run(dict(feeds))), _optimized_onnxruntime(model, feeds, ["q2", "d2", "m2"])
    np.testing.assert_array_equal(got["q2"], want["q2"])
    np.testing.assert_array_equal(got["d2"], want["d2"])
    # m2, a graph output, onnxruntime leaves a float MatMul (each product and partial sum rounded)
    np.testing.assert_allclose(got["m2"], want["m2"], rtol=0, atol=1e-5 * float(np.abs(want["m2"]).max()))
