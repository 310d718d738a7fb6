"""Partitions cut apart from their shape arithmetic still run on a static-shape backend (issue 10).

The partitioner may put ``Shape -> Gather -> Concat`` in one ``c`` partition and the
``Reshape`` using it in another, a host-only node between them: the first then returns an
int64 constant, the second receives its shape at run time.  Both compiled per input shape
failed there and fell back to the host; :mod:`codegraft.lower.shape_values` makes them compile.
"""

from __future__ import annotations

import pathlib

import numpy as np
import onnx
import onnx.helper as oh
import onnxruntime as ort
import pytest

import codegraft as cg
from bench import corpus
from codegraft.core.irversion import readable_by_runtime
from codegraft.lower.shape_values import MAX_VALUE_VERSIONS, static_integer_outputs, with_values

pytest.importorskip("codegraft.backends.c")


def _cut_reshape_model(batch: str | int = "N") -> onnx.ModelProto:
    """Relu, then the batch size read into a Reshape's shape around a host-only Softsign."""
    nodes = [
        oh.make_node("Relu", ["x"], ["a"], name="relu_in"),
        oh.make_node("Shape", ["a"], ["s"], name="shape"),
        oh.make_node("Gather", ["s", "zero"], ["n"], name="batch", axis=0),
        oh.make_node("Unsqueeze", ["n", "axes"], ["n1"], name="batch_1d"),
        oh.make_node("Concat", ["n1", "rest"], ["target"], name="target_shape", axis=0),
        oh.make_node("Softsign", ["a"], ["h"], name="host_only"),  # the c backend has no Softsign
        oh.make_node("Reshape", ["h", "target"], ["r"], name="reshape"),
        oh.make_node("Relu", ["r"], ["y"], name="relu_out"),
    ]
    graph = oh.make_graph(
        nodes, "cut_reshape",
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [batch, 4, 6])],
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [batch, 24])],
        [
            onnx.numpy_helper.from_array(np.array(0, np.int64), "zero"),
            onnx.numpy_helper.from_array(np.array([0], np.int64), "axes"),
            onnx.numpy_helper.from_array(np.array([24], np.int64), "rest"),
        ],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])


def test_shape_arithmetic_cut_from_its_reshape_runs_on_c_and_is_exact(tmp_path: pathlib.Path) -> None:
    model = _cut_reshape_model()
    cg.compile(model, ["c"]).save(tmp_path / "cut.cgx")
    exe = cg.load_executable(tmp_path / "cut.cgx")  # the loaded artifact specialises the same way
    backends = {step.name: step.backend for step in exe.steps}
    assert sorted(backends.values()).count("c") >= 2, backends  # the cut this test is about
    session = ort.InferenceSession(readable_by_runtime(model).SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    for batch in (1, 3, 3, 5):
        x = rng.standard_normal((batch, 4, 6)).astype(np.float32)
        (want,) = session.run(None, {"x": x})
        got = exe.run({"x": x})["y"]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    fallbacks = [p.fallback_error for p in exe.report().partitions if p.fallback_error]
    assert fallbacks == []  # was: int64 constant output, and the Reshape's shape not known


def test_a_constant_only_partition_failing_at_compile_time_is_compiled_at_run_time() -> None:
    # silero_vad_sequence: its inputs' shapes known, a c partition with no inputs (the STFT's
    # padding sizes: Concat, Reshape, Slice, Transpose, Reshape) returns an int64 constant and
    # failed at compile time; it now waits for run time, where its output is computed once
    from tests.test_corpus import _fetched

    model = _fetched(next(m for m in corpus.MODELS if m.name == "silero_vad_sequence"))
    result = corpus.check(model)
    assert not result.failure and result.right, (result.failure, result.error)
    assert result.fallbacks == ()  # was: p0_c ... is a int64 constant; outputs are float32
    assert result.share.get("onnxruntime", 0.0) == 0.0, dict(result.share)  # was 16%


def test_value_specialisation_is_bounded_then_the_host_takes_over() -> None:
    from codegraft.backends.c import CBackend
    from codegraft.backends.onnxruntime import OnnxRuntimeBackend
    from codegraft.lower.lowering import LoweringRequest, ShapeSpecialisingRunnable

    # the Reshape half alone: its shape arrives at run time
    data = oh.make_tensor_value_info("h", onnx.TensorProto.FLOAT, ["N", 4, 6])
    shape = oh.make_tensor_value_info("target", onnx.TensorProto.INT64, [2])
    out = oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)
    graph = oh.make_graph(
        [oh.make_node("Reshape", ["h", "target"], ["r"]), oh.make_node("Relu", ["r"], ["y"])],
        "reshape_half", [data, shape], [out],
    )
    template = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)]).SerializeToString()
    failures: list[str] = []
    runnable = ShapeSpecialisingRunnable(
        CBackend(), template, LoweringRequest("half"), OnnxRuntimeBackend(), strict=False
    )
    runnable.on_failure = lambda name, key, host, error: failures.append(error)
    h = np.random.default_rng(1).standard_normal((2, 4, 6)).astype(np.float32)
    targets = [(2, 24), (48, 1), (1, 48), (4, 12), (12, 4), (6, 8), (8, 6), (3, 16), (16, 3), (24, 2)]
    assert len(targets) > MAX_VALUE_VERSIONS
    for _ in range(2):
        for target in targets:
            (got,) = runnable.run([h, np.array(target, np.int64)])
            np.testing.assert_array_equal(got, np.maximum(h.reshape(target), 0))
    too_many = f"more than {MAX_VALUE_VERSIONS} distinct values of its shape inputs"
    assert failures == [too_many] * (len(targets) - MAX_VALUE_VERSIONS)  # told once per value, not per run


def test_static_integer_outputs_are_shape_arithmetic_only() -> None:
    proto = _cut_reshape_model()
    proto.graph.output.extend([
        oh.make_tensor_value_info("target", onnx.TensorProto.INT64, [2]),
        oh.make_tensor_value_info("a", onnx.TensorProto.FLOAT, None),
    ])
    assert static_integer_outputs(proto) == ["target"]
    fixed = with_values(proto, {"x": np.zeros((1, 4, 6), np.float32)})
    assert [v.name for v in fixed.graph.input] == []
    assert "x" in {t.name for t in fixed.graph.initializer}


def test_a_reshape_to_a_computed_shape_gives_its_output_a_rank() -> None:
    """onnx infers nothing after ``Reshape(x, Concat(Slice(Shape(x)), [-1]))``; the target's
    length is the rank (PP-OCRv4's recognizer), so the ReduceMean and Transpose after it,
    which the ``c`` backend takes only with a known rank, stay in its one partition."""
    nodes = [
        oh.make_node("Shape", ["x"], ["s"]),
        oh.make_node("Slice", ["s", "zero", "two"], ["lead"]),
        oh.make_node("Concat", ["lead", "minus_one"], ["target"], axis=0),
        oh.make_node("Reshape", ["x", "target"], ["r"]),
        oh.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 1]),
        oh.make_node("ReduceMean", ["t"], ["y"], axes=[1], keepdims=0),
    ]
    inits = [
        onnx.numpy_helper.from_array(np.array([0], np.int64), "zero"),
        onnx.numpy_helper.from_array(np.array([2], np.int64), "two"),
        onnx.numpy_helper.from_array(np.array([-1], np.int64), "minus_one"),
    ]
    graph = oh.make_graph(
        nodes, "computed_reshape", [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n", 8, "h", "w"])],
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)], inits,
    )  # fmt: skip
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 13)])
    exe = cg.compile(model, targets=["c"])
    x = np.random.default_rng(0).standard_normal((2, 8, 3, 5)).astype(np.float32)
    session = ort.InferenceSession(readable_by_runtime(model).SerializeToString(), providers=["CPUExecutionProvider"])
    want = session.run(None, {"x": x})[0]
    np.testing.assert_allclose(exe.run({"x": x})["y"], want, rtol=1e-5, atol=1e-6)
    assert [p.backend for p in exe.report().partitions] == ["c"]


def test_shape_arithmetic_whose_operands_come_from_another_partition_keeps_its_dtype() -> None:
    # platerec's decoder: a Concat of sizes read before and after host-only nodes is taken by
    # `c` as shape arithmetic, but in its partition one operand is an input (computed by an
    # earlier `c` partition); it was computed as float32 and handed to the next partition,
    # which wanted int64.  Now the partition is compiled with that input's value instead.
    nodes = [
        oh.make_node("Relu", ["x"], ["a"]),
        oh.make_node("Shape", ["a"], ["s"]),
        oh.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        oh.make_node("Unsqueeze", ["n", "axes"], ["n1"]),
        oh.make_node("Softsign", ["a"], ["h"]),  # the c backend has no Softsign
        oh.make_node("Relu", ["h"], ["h2"]),
        oh.make_node("Shape", ["h2"], ["s2"]),
        oh.make_node("Gather", ["s2", "one"], ["m"], axis=0),
        oh.make_node("Unsqueeze", ["m", "axes"], ["m1"]),
        oh.make_node("Concat", ["n1", "m1", "minus1"], ["target"], axis=0),
        oh.make_node("Softsign", ["h2"], ["h3"]),
        oh.make_node("Reshape", ["h3", "target"], ["y"]),
    ]
    constants = {"zero": np.array(0, np.int64), "one": np.array(1, np.int64), "axes": np.array([0], np.int64),
                 "minus1": np.array([-1], np.int64)}
    graph = oh.make_graph(
        nodes, "cut_concat", [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 4, 6])],
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        [onnx.numpy_helper.from_array(value, name) for name, value in constants.items()],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    exe = cg.compile(model, ["c"], min_partition_macs=0)  # (light c pieces between host ones: the cut kept)
    concat_step = next(s for s in exe.steps if "target" in s.outputs)
    assert concat_step.backend == "c" and "n1" in concat_step.inputs  # the cut this test is about
    session = ort.InferenceSession(readable_by_runtime(model).SerializeToString(), providers=["CPUExecutionProvider"])
    for batch in (2, 3):
        x = np.random.default_rng(batch).standard_normal((batch, 4, 6)).astype(np.float32)
        np.testing.assert_allclose(exe.run({"x": x})["y"], session.run(None, {"x": x})[0], rtol=1e-6)
