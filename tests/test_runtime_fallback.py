"""A partition whose backend fails while it runs moves to the host, once, and says so (issue 10).

The failing backend here is made to fail on purpose: it compiles and loads like any other,
then its runnable raises on the calls chosen by the test.
"""

from __future__ import annotations

import logging
import pathlib
from collections.abc import Sequence

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import codegraft as cg
from codegraft.testing import SubsetBackend, assert_close, light_model, random_feeds, run_onnxruntime


class FailingRunnable:
    def __init__(self, inner: object, backend: FailsWhenRunning) -> None:
        self.inner, self.backend = inner, backend

    def run(self, inputs: Sequence[np.ndarray]) -> Sequence[np.ndarray]:
        self.backend.calls += 1
        if self.backend.calls > self.backend.good_calls:
            raise RuntimeError("Can't set the input tensor with index: 2 (simulated device failure)")
        return self.inner.run(inputs)  # type: ignore[attr-defined, no-any-return]


class FailsWhenRunning(SubsetBackend):
    """Claims ``ops``; every call after the first ``good_calls`` raises."""

    def __init__(self, name: str, ops: set[str], good_calls: int = 0) -> None:
        super().__init__(name, ops)
        self.good_calls = good_calls
        self.calls = 0

    def load(self, blob):  # type: ignore[no-untyped-def]
        return FailingRunnable(super().load(blob), self)


def test_a_partition_failing_at_run_time_runs_on_the_host_from_then_on(caplog: pytest.LogCaptureFixture) -> None:
    model = light_model("squeezenet")
    feeds = random_feeds(model)
    expected = run_onnxruntime(model, feeds)
    flaky = FailsWhenRunning("flaky", {"Conv", "Relu"}, good_calls=1)
    exe = cg.compile(model, targets=[flaky], min_partition_size=1)
    assert exe.report().nodes_per_backend().get("flaky")
    with caplog.at_level(logging.WARNING, logger="codegraft"):
        assert_close(exe.run(feeds), expected)  # the first flaky partition works once, the others fail
        assert_close(exe.run(feeds), expected)  # now the first fails too
    calls = flaky.calls
    assert_close(exe.run(feeds), expected)
    assert flaky.calls == calls  # a partition that failed is not tried again
    failed = [p for p in exe.report().fallbacks() if "at run time" in (p.fallback_error or "")]
    assert len(failed) > 1
    assert all(p.backend == "onnxruntime" and p.requested_backend == "flaky" for p in failed)
    assert not any(n.backend == "flaky" for n in exe.report().nodes)
    assert "simulated device failure" in (failed[0].fallback_error or "")
    assert "fell back from flaky" in str(exe.report())
    # One line for the backend, however many of its partitions fail.
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 1, lines
    assert lines[0].startswith("flaky failed at run time (") and "\n" not in lines[0]


def test_strict_raises_when_a_partition_fails_at_run_time() -> None:
    model = light_model("squeezenet")
    exe = cg.compile(model, targets=[FailsWhenRunning("flaky", {"Conv", "Relu"})], strict=True)
    with pytest.raises(cg.BackendError, match="partition .* on flaky failed: RuntimeError: .*simulated device failure"):
        exe.run(random_feeds(model))


def test_a_saved_executable_keeps_the_host_placement(tmp_path: pathlib.Path) -> None:
    model = light_model("squeezenet")
    feeds = random_feeds(model)
    flaky = FailsWhenRunning("flaky", {"Conv", "Relu"})
    exe = cg.compile(model, targets=[flaky])
    exe.run(feeds)  # every flaky partition fails and moves to the host
    assert {s.backend for s in exe.steps} == {"onnxruntime"}
    exe.save(tmp_path / "m.cgx")
    loaded = cg.load_executable(tmp_path / "m.cgx", backends=[flaky])
    assert_close(loaded.run(feeds), run_onnxruntime(model, feeds))


def test_compile_failures_warn_once_per_backend(caplog: pytest.LogCaptureFixture) -> None:
    # Every partition holding a Concat fails to compile on "flaky": several partitions, one line.
    model = light_model("squeezenet")
    with caplog.at_level(logging.WARNING, logger="codegraft"):
        exe = cg.compile(model, targets=[SubsetBackend("flaky", {"Conv", "Relu", "Concat"}, fail_on="Concat")],
                         min_partition_size=1)
    failed = exe.report().fallbacks()
    assert len(failed) > 1
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"flaky: {len(failed)} of its partitions run on onnxruntime instead (first, ")
    assert "simulated failure" in lines[0] and "\n" not in lines[0]


def _scalar_input_model() -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])
    scale = helper.make_tensor_value_info("scale", TensorProto.FLOAT, [])
    nodes = [
        helper.make_node("Mul", ["x", "scale"], ["m"]),
        helper.make_node("Relu", ["m"], ["r"]),
        helper.make_node("Sigmoid", ["r"], ["y"]),
        helper.make_node("Constant", [], ["three"], value=helper.make_tensor("t", TensorProto.FLOAT, [], [3.0])),
    ]
    outputs = [
        helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4]),
        helper.make_tensor_value_info("three", TensorProto.FLOAT, []),
    ]
    graph = helper.make_graph(nodes, "scalar_input", [x, scale], outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_scalar_input_reaches_openvino_as_a_scalar(tmp_path: pathlib.Path) -> None:
    # OpenVINO refused a 0-d feed made 1-d on the way ("model input (shape=[]) and the tensor
    # (shape=(1)) are incompatible": Silero VAD's sample rate); a 0-d constant output came
    # back from an artifact 1-d the same way.
    proto = _scalar_input_model()
    x = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
    feeds = {"x": x, "scale": np.array(2.0, np.float32)}
    exe = cg.compile(proto, targets=["openvino"], strict=True)
    assert exe.report().nodes_per_backend().get("openvino", 0) >= 3
    assert_close(exe.run(feeds), run_onnxruntime(proto, feeds))
    exe.save(tmp_path / "m.cgx")
    loaded = cg.load_executable(tmp_path / "m.cgx")
    outputs = loaded.run(feeds)
    assert outputs["three"].shape == ()
    assert_close(outputs, run_onnxruntime(proto, feeds))


def test_shapes_failing_to_compile_at_run_time_are_in_the_report_and_warned_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Two partitions compiled per input shape (free batch, a static-shape backend); each fails at
    # the shape it meets, runs on the host there: both in the report, one warning line.
    nodes = [
        helper.make_node("Relu", ["x"], ["a"]),
        helper.make_node("Concat", ["a", "a"], ["b"], axis=1),
        helper.make_node("Softmax", ["b"], ["c"], axis=1),  # the host's: splits the two partitions
        helper.make_node("Relu", ["c"], ["d"]),
        helper.make_node("Concat", ["d", "d"], ["y"], axis=1),
    ]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 16])],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    static = SubsetBackend("static", {"Relu", "Concat"}, dynamic_shapes=False, fail_on="Concat")
    exe = cg.compile(model, targets=[static])
    assert [p.deferred for p in exe.report().partitions if p.backend == "static"] == [True, True]
    feeds = random_feeds(model, dim_values={"batch": 3})
    with caplog.at_level(logging.WARNING, logger="codegraft"):
        assert_close(exe.run(feeds), run_onnxruntime(model, feeds))
    failed = exe.report().fallbacks()
    assert len(failed) == 2
    for partition in failed:
        assert partition.requested_backend == "static"
        assert "failed to compile for input shapes 3x" in (partition.fallback_error or "")
        assert "simulated failure" in (partition.fallback_error or "")
    assert "fell back from static" in str(exe.report())
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 1, lines
    assert "simulated failure" in lines[0] and "\n" not in lines[0]


def test_a_host_partition_failing_at_run_time_is_one_error_without_onnxruntime_logging(
    capfd: pytest.CaptureFixture[str],
) -> None:
    # onnxruntime's own log line for a failing kernel went to stderr beside codegraft's error.
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("shape", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )  # fmt: skip
    exe = cg.compile(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), targets=[])
    capfd.readouterr()
    with pytest.raises(cg.BackendError, match="partition p0_onnxruntime on onnxruntime failed: .*cannot be reshaped"):
        exe.run({"x": np.zeros((2, 3), np.float32), "shape": np.array([4, 4], np.int64)})
    assert "onnxruntime" not in capfd.readouterr().err
