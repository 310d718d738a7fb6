"""Models and partitions are written at the newest IR version the installed onnxruntime reads.

onnx 1.23 writes IR 14 and onnxruntime 1.30 reads 13 at most: a model that uses nothing of
IR 14 must still run (issue 10, item 4).  The older runtime is simulated by making the probe
answer 9; the suite also passes as a whole with onnxruntime 1.30 installed beside onnx 1.23.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import codegraft as cg
import codegraft.core.irversion as irversion
from codegraft.frontend.model import import_model
from codegraft.testing import SubsetBackend, assert_close, run_onnxruntime


def _chain(ir_version: int | None = None) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Tanh", ["r"], ["t"]),
             helper.make_node("Sigmoid", ["t"], ["y"])]
    model = helper.make_model(helper.make_graph(nodes, "chain", [x], [y]), opset_imports=[helper.make_opsetid("", 17)])
    if ir_version is not None:
        model.ir_version = ir_version
    return model


def test_the_probe_finds_what_onnxruntime_reads() -> None:
    newest = irversion.runtime_ir_version()
    assert 4 <= newest <= onnx.IR_VERSION
    ort.InferenceSession(_chain(newest).SerializeToString(), providers=["CPUExecutionProvider"])
    if newest < onnx.IR_VERSION:
        with pytest.raises(Exception, match="IR version"):
            ort.InferenceSession(_chain(newest + 1).SerializeToString(), providers=["CPUExecutionProvider"])


def test_a_model_newer_than_the_runtime_reads_is_written_at_what_it_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(irversion, "runtime_ir_version", lambda: 9)  # an onnxruntime a few releases back
    proto = _chain(onnx.IR_VERSION)
    assert import_model(proto).ir_version == 9
    backend = SubsetBackend("acc", {"Tanh"})
    exe = cg.compile(proto, targets=[backend], min_partition_size=1, min_partition_macs=0)
    seen = [onnx.load_from_string(s.blob.split(b"\0", 1)[1]).ir_version for s in exe.steps if s.backend == "acc"]
    assert seen == [9]
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)}
    assert_close(exe.run(feeds), run_onnxruntime(proto, feeds))


def test_an_ir3_model_is_written_at_ir4_or_later() -> None:
    # IR 3 needs every initializer listed as an input too, which import undoes (issue 19).
    assert import_model(_chain(3)).ir_version >= 4


def test_what_the_graph_needs_wins() -> None:
    proto = _chain()
    assert irversion.needed_ir_version(proto) == onnx.helper.find_min_ir_version_for(list(proto.opset_import))
    with_function = _chain()
    with_function.functions.append(onnx.FunctionProto(name="f", domain="local"))
    assert irversion.needed_ir_version(with_function) >= 8
    float8 = _chain()
    float8.graph.initializer.append(helper.make_tensor("f8", TensorProto.FLOAT8E4M3FN, [1], [1.0]))
    assert irversion.needed_ir_version(float8) >= 9


def test_the_reference_run_reads_a_model_newer_than_the_runtime(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(irversion, "runtime_ir_version", lambda: 8)
    proto = _chain(onnx.IR_VERSION)
    readable = irversion.readable_by_runtime(proto)
    assert readable.ir_version == 8 and proto.ir_version == onnx.IR_VERSION  # a copy; the caller's is untouched
    assert irversion.readable_by_runtime(_chain(7)).ir_version == 7  # older ones are left alone
