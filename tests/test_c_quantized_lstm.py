"""com.microsoft DynamicQuantizeLSTM on the C backend, against onnxruntime bit for bit.

onnxruntime quantizes X (all its steps at once) and, at each step, h_prev on their own ranges,
sums the 8-bit products in int32 and computes the gates with MLAS's sigmoid and tanh; the C
kernel (ops/qlstm.c) does the same, so the outputs are equal, not close.  onnxruntime's
uint8 x int8 kernel saturates on AVX2 CPUs without VNNI (tests/test_c_quantize.py), so int8
weights stay within +-63 where onnxruntime is the reference, unless the host has VNNI.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from c_backend_util import backend, needs_compiler, run_c
from onnx import TensorProto, helper, numpy_helper

import codegraft as cg
from codegraft.backends.c._codegen import KernelThreads, generate
from codegraft.backends.c._toolchain import VNNI, Target, cpu_features, target_for
from codegraft.backends.c.ops.rnn import steps_shared_out
from codegraft.testing import run_onnxruntime

pytestmark = needs_compiler


def quantized_lstm(
    seq: int = 7, hidden: int = 8, width: int = 5, direction: str = "forward", bias: bool = True, h0: str = "",
    c0: str = "", peepholes: bool = False, lens: int | None = None, weights: str = "int8", per_column: bool = False,
    outputs: tuple[str, ...] = ("Y", "Y_h", "Y_c"), batch: int = 1, seed: int = 0, **attrs: object,
) -> onnx.ModelProto:
    """One DynamicQuantizeLSTM node; ``h0``/``c0``: "" absent, "input" a model input, "const" an
    initializer; ``weights``: "int8" (within +-63), "int8 full" (+-127) or "uint8" (zero point 128)."""
    rng = np.random.default_rng(seed)
    dirs = 2 if direction == "bidirectional" else 1
    gh = 4 * hidden
    if weights == "uint8":
        w, r = (rng.integers(0, 256, (dirs, k, gh)).astype(np.uint8) for k in (width, hidden))
        dtype, zero = np.uint8, 128
    else:
        span = 128 if weights == "int8 full" else 64
        w, r = (rng.integers(-span + 1, span, (dirs, k, gh)).astype(np.int8) for k in (width, hidden))
        dtype, zero = np.int8, 0
    shape = (dirs, gh) if per_column else (dirs,)
    inits: dict[str, np.ndarray] = {
        "W": w, "R": r,
        "ws": (rng.uniform(0.5, 1.5, shape) * 0.03).astype(np.float32), "wz": np.full(shape, zero, dtype),
        "rs": (rng.uniform(0.5, 1.5, shape) * 0.03).astype(np.float32), "rz": np.full(shape, zero, dtype),
    }  # fmt: skip
    inputs = {"X": (seq, batch, width)}
    names = ["X", "W", "R", "", "", "", "", "", "ws", "wz", "rs", "rz"]
    if bias:
        names[3], inits["B"] = "B", rng.standard_normal((dirs, 2 * gh)).astype(np.float32)
    if lens is not None:
        names[4], inits["lens"] = "lens", np.array([lens], np.int32)
    if peepholes:
        names[7], inits["P"] = "P", rng.standard_normal((dirs, 3 * hidden)).astype(np.float32)
    for index, (given, name) in enumerate(((h0, "h0"), (c0, "c0")), start=5):
        if given == "input":
            names[index], inputs[name] = name, (dirs, batch, hidden)
        elif given == "const":
            names[index], inits[name] = name, rng.standard_normal((dirs, batch, hidden)).astype(np.float32)
    outs = [o if o in outputs else "" for o in ("Y", "Y_h", "Y_c")]
    while not outs[-1]:
        outs.pop()
    node = helper.make_node("DynamicQuantizeLSTM", names, outs, domain="com.microsoft", hidden_size=hidden,
                            direction=direction, **attrs)  # fmt: skip
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs.items()],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs if o],
        [numpy_helper.from_array(a, n) for n, a in inits.items()],
    )  # fmt: skip
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=opsets))


def _feeds(model: onnx.ModelProto, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    shapes = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input}
    return {name: (2 * rng.standard_normal(shape)).astype(np.float32) for name, shape in shapes.items()}


def check_equal(model: onnx.ModelProto, draws: int = 3) -> None:
    """The model compiles to one ``c`` partition whose outputs equal onnxruntime's."""
    exe = cg.compile(model, targets=["c"])
    assert [p.backend for p in exe.report().partitions] == ["c"], exe.report()
    for seed in range(draws):
        feeds = _feeds(model, seed)
        got, want = exe.run(feeds), run_onnxruntime(model, feeds)
        assert set(got) == set(want)
        for name, value in want.items():
            np.testing.assert_array_equal(got[name], value, err_msg=f"{name}, draw {seed}")


@pytest.mark.parametrize(
    ("direction", "seq", "hidden", "width", "bias", "h0", "c0"),
    [
        ("forward", 7, 8, 5, True, "", ""),
        ("forward", 1, 8, 5, True, "input", "input"),
        ("reverse", 7, 8, 5, False, "const", ""),
        ("reverse", 9, 33, 17, True, "input", "input"),
        ("bidirectional", 7, 33, 17, True, "input", "const"),
        ("bidirectional", 1, 8, 5, False, "", "input"),
        ("bidirectional", 12, 64, 48, True, "", ""),
    ],
)
def test_dynamic_quantize_lstm(direction: str, seq: int, hidden: int, width: int, bias: bool, h0: str, c0: str) -> None:
    check_equal(quantized_lstm(seq, hidden, width, direction, bias, h0, c0))


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_peepholes_and_clip(direction: str) -> None:
    check_equal(quantized_lstm(direction=direction, peepholes=True, h0="input", c0="input", clip=0.7))


@pytest.mark.parametrize("per_column", [False, True])
@pytest.mark.parametrize("weights", ["int8", "uint8"])
def test_scales_per_direction_or_per_column(weights: str, per_column: bool) -> None:
    # uint8 weights less their zero point (128) span 255 values: int8 plus an offset per column
    check_equal(quantized_lstm(hidden=20, width=9, direction="bidirectional", weights=weights, per_column=per_column))


def test_uint8_zero_points_that_differ_by_direction() -> None:
    model = quantized_lstm(seq=9, hidden=24, width=7, direction="bidirectional", weights="uint8")
    for tensor in model.graph.initializer:
        if tensor.name in ("wz", "rz"):
            tensor.CopyFrom(numpy_helper.from_array(np.array([100, 140], np.uint8), tensor.name))
    check_equal(model)


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_a_constant_sequence_length_shorter_than_x(direction: str) -> None:
    # X's quantization spans only the steps walked; Y is 0 past them
    check_equal(quantized_lstm(seq=6, lens=4, direction=direction, h0="input"))
    check_equal(quantized_lstm(seq=6, lens=6, direction=direction))


@pytest.mark.parametrize("outputs", [("Y_h",), ("Y",), ("Y_c",), ("Y_h", "Y_c")])
def test_some_outputs(outputs: tuple[str, ...]) -> None:
    check_equal(quantized_lstm(direction="bidirectional", outputs=outputs))


@pytest.mark.parametrize(("batch", "direction"), [(2, "bidirectional"), (4, "reverse")])
def test_batch_rows_onnxruntime_quantizes_together(batch: int, direction: str) -> None:
    # 2-4 rows of a hidden size above 256: onnxruntime's one thread quantizes every row's h_prev on one range
    check_equal(quantized_lstm(seq=4, hidden=260, width=6, direction=direction, batch=batch, h0="input"), 2)


@pytest.mark.skipif(VNNI not in cpu_features(), reason="onnxruntime saturates full-range int8 sums without VNNI")
def test_full_range_int8_weights_of_a_corpus_size() -> None:
    # text2tashkeel's layers: hidden 256, 128 inputs, full-range int8 weights, a scale per direction
    check_equal(quantized_lstm(seq=32, hidden=256, width=128, direction="bidirectional", weights="int8 full"), 2)


def test_the_plain_c_sums_without_vnni_agree() -> None:
    # a portable build: the 8-bit sums in plain C, MLAS's sigmoid and tanh through libm's fmaf
    model = quantized_lstm(seq=5, hidden=20, width=9, direction="bidirectional", weights="uint8", h0="input")
    feeds = _feeds(model, 0)
    got = run_c(model, feeds, backend(target=Target(frozenset(), (), 4)))
    for name, value in run_onnxruntime(model, feeds).items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)


@pytest.mark.skipif("avx2" not in cpu_features(), reason="the AVX2 8-bit sums need an AVX2 CPU")
@pytest.mark.parametrize(("hidden", "width", "batch"), [(256, 128, 1), (20, 9, 1), (36, 130, 1), (260, 6, 2)])
def test_the_avx2_sums_without_vnni_are_the_plain_c_ones(hidden: int, width: int, batch: int) -> None:
    # ops/q8.c: vpmaddwd on bytes widened to int16, exact where onnxruntime's AVX2 kernel
    # saturates; full-range int8 weights (text2tashkeel's), the projection's rows ragged
    # against the 4-row tile (7 or 14 of them), 16-17 blocks of 64 columns or a ragged one
    # (hidden 20 and 36: 80 and 144 columns), the recurrence's 32-column halves
    model = quantized_lstm(seq=7, hidden=hidden, width=width, direction="bidirectional", weights="int8 full",
                           h0="input", batch=batch)
    avx2 = backend(target=target_for(cpu_features() - {VNNI}))
    assert avx2.target is not None and "avx2" in avx2.target.features and VNNI not in avx2.target.features
    plain = backend(target=Target(frozenset(), (), 4))
    for seed in range(2):
        feeds = _feeds(model, seed)
        got, want = run_c(model, feeds, avx2), run_c(model, feeds, plain)
        for name, value in want.items():
            np.testing.assert_array_equal(got[name], value, err_msg=f"{name}, draw {seed}")


def _recurrence_threads(model: onnx.ModelProto, threads: int) -> KernelThreads:
    plan = generate(ir.from_proto(model), target_for(cpu_features()), threads).threads
    (recurrence,) = [k for k in plan if k.kernel.startswith("QuantRecurrence")]
    return recurrence


def test_each_step_is_shared_out_among_threads_with_the_same_outputs() -> None:
    # a task per direction and 16 hidden units, every step: 260 units are 17 blocks, the last
    # one ragged; two rows, peepholes and clip.  Built for 4 threads (on any core count), the
    # cost model gives the recurrence more threads than directions, and the outputs are
    # onnxruntime's bit for bit; on one thread, a task per direction walks its steps.
    model = quantized_lstm(seq=6, hidden=260, width=12, direction="bidirectional", batch=2, h0="input", c0="input",
                           peepholes=True, clip=2.5)
    recurrence = _recurrence_threads(model, 4)
    assert (recurrence.work.units, recurrence.work.loops) == (2 * 17, 6)
    assert steps_shared_out(2, recurrence.choice.threads)
    for threads in (4, 1):  # a loop per step; a task per direction walking its steps
        for seed in range(2):
            feeds = _feeds(model, seed)
            got = run_c(model, feeds, backend(num_threads=threads))
            for name, value in run_onnxruntime(model, feeds).items():
                np.testing.assert_array_equal(got[name], value, err_msg=f"{name}, draw {seed}, {threads} threads")


def test_threads_for_the_recurrence_follow_its_size() -> None:
    # voicefilter_embedder's layers (hidden 768, 80 steps) take most of 16 threads (a wake-up
    # and a join every step: 12 at this host's vector width, 16 at AVX-512's); a small LSTM (a
    # step of a few hundred nanoseconds) stays on one, as a loop per step would cost more
    large = _recurrence_threads(quantized_lstm(seq=80, hidden=768, width=40, outputs=("Y",)), 16)
    small = _recurrence_threads(quantized_lstm(seq=80, hidden=16, width=40, outputs=("Y",)), 16)
    assert large.work.units == 48 and large.choice.threads >= 8
    assert (small.work.units, small.choice.threads) == (1, 1)


def test_what_stays_on_the_host() -> None:
    def reason(model: onnx.ModelProto) -> str:
        verdict = backend().supports(next(iter(ir.from_proto(model).graph)))
        assert not verdict
        return verdict.reason

    assert "thread count" in reason(quantized_lstm(batch=2))  # hidden 8: rows split among threads
    assert "thread count" in reason(quantized_lstm(batch=5, hidden=260))
    assert "sequence_lens" in reason(quantized_lstm(batch=2, hidden=260, lens=3))
    assert "input_forget" in reason(quantized_lstm(input_forget=1))
    assert "activations" in reason(quantized_lstm(activations=["Tanh", "Tanh", "Tanh"]))
    computed_lens = quantized_lstm(h0="input")
    computed_lens.graph.node[0].input[4] = "h0"  # any computed value: the check looks only at whether it is constant
    assert "sequence_lens must be a constant" in reason(computed_lens)
    uneven = quantized_lstm(weights="uint8", per_column=True)
    zp = next(t for t in uneven.graph.initializer if t.name == "rz")
    values = numpy_helper.to_array(zp).copy()
    values[0, 1] = 7
    zp.CopyFrom(numpy_helper.from_array(values, "rz"))
    assert "must all be equal" in reason(uneven)
