"""OpenVINO partitions with odd input (issue 11): read-only feeds run, string tensors go to the
host up front, OpenVINO's errors arrive on one line, and its NaN handling cannot slip through
the precision self-check's error measure."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import codegraft as cg
from codegraft.passes.precision_check import relative_error

pytest.importorskip("openvino", reason="openvino is not installed: pip install codegraft[openvino]")


def _model(op: str, dtype: int = TensorProto.FLOAT):  # type: ignore[no-untyped-def]
    graph = helper.make_graph(
        [helper.make_node(op, ["x"], ["y"])], "g",
        [helper.make_tensor_value_info("x", dtype, [2, 3])], [helper.make_tensor_value_info("y", dtype, [2, 3])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_read_only_feed_runs() -> None:
    exe = cg.compile(_model("Relu"), targets=["openvino"])
    assert [s.backend for s in exe.steps] == ["openvino"]
    x = np.array([[-1, 2, -3], [4, -5, 6]], np.float32)
    x.flags.writeable = False
    np.testing.assert_array_equal(exe.run({"x": x})["y"], np.maximum(x, 0))


def test_string_tensors_are_declined_up_front() -> None:
    exe = cg.compile(_model("Identity", TensorProto.STRING), targets=["openvino"])
    assert [s.backend for s in exe.steps] == ["onnxruntime"]
    declined = dict(exe.report().nodes[0].declined)
    assert "string tensor" in declined["openvino"]
    x = np.array([["a", "b", "c"], ["d", "e", "f"]], dtype=object)
    assert exe.run({"x": x})["y"].tolist() == x.tolist()


def test_openvino_errors_are_one_line() -> None:
    # Forced past supports(): a string partition compiles, and OpenVINO refuses it at run time
    # with a message spanning several lines ("Exception from src/...cpp:510:", then the reason).
    import onnx_ir as ir

    from codegraft.backend import Partition
    from codegraft.backends.openvino import OpenVINOBackend

    backend = OpenVINOBackend()
    runnable = backend.load(backend.compile(Partition("p", ir.from_proto(_model("Identity", TensorProto.STRING)))))
    with pytest.raises(RuntimeError) as caught:
        runnable.run([np.array([["a", "b", "c"], ["d", "e", "f"]], dtype=object)])
    message = str(caught.value)
    assert "\n" not in message and "Exception from" not in message and "String" in message


def test_precision_check_sees_nan_turned_finite() -> None:
    # OpenVINO's Relu, Clip, HardSigmoid, Exp and Softmax turn NaN into finite numbers; an error
    # measure built on ">" would let that pass any tolerance.
    reference = np.array([1.0, np.nan, np.inf], np.float32)
    assert relative_error(np.array([1.0, 0.0, np.inf], np.float32), reference) == float("inf")
    assert relative_error(np.array([1.0, np.nan, 3e38], np.float32), reference) == float("inf")
    assert relative_error(np.array([1.0, np.nan, np.inf], np.float32), reference) == 0.0
    assert relative_error(np.array([1.0, np.nan, np.inf], np.float32), np.array([1.0, 2.0, np.inf])) == float("inf")
