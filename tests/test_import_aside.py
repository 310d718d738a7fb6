"""The import's check and shape inference on a second core (frontend/aside.py): the same IR and
the same errors as doing both in turn, and a child that dies is an error, not a dead caller."""

from __future__ import annotations

import os
import signal
import sys

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

import codegraft as cg
from codegraft.frontend import aside
from codegraft.frontend.model import import_model
from codegraft.testing import light_model

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or len(os.sched_getaffinity(0)) < 2, reason="needs fork and two cores"
)


def _both_ways(source: object, monkeypatch: pytest.MonkeyPatch) -> tuple[bytes, bytes]:
    """The imported model's bytes with the check aside (forced: no size floor) and in turn."""
    started: list[aside.Pending | None] = []
    start = aside.start

    def counting_start(*args, **kwargs):  # type: ignore[no-untyped-def]
        pending = start(*args, **kwargs)
        started.append(pending)
        return pending

    results = []
    for floor, env in ((0, "1"), (10**9, "0")):
        with monkeypatch.context() as patch:
            patch.setattr(aside, "MIN_NODES", floor)
            patch.setattr(aside, "start", counting_start)
            patch.setenv("CODEGRAFT_PARALLEL_IMPORT", env)
            model = import_model(source)
        results.append(ir.to_proto(model).SerializeToString(deterministic=True))
    assert started[0] is not None and started[1] is None  # the first went aside, the second not
    return results[0], results[1]


def _with_value_infos() -> onnx.ModelProto:
    """Value infos as exporters write them: plain ones, one with a doc string and metadata,
    one for a graph output, and two entries for one name (the last counts)."""
    weight = numpy_helper.from_array(np.ones((3, 3), np.float32), "w")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["a"]),
        helper.make_node("Relu", ["a"], ["b"]),
        helper.make_node("Sigmoid", ["b"], ["c"]),
        helper.make_node("Add", ["c", "a"], ["y"]),
    ]
    described = helper.make_tensor_value_info("b", TensorProto.FLOAT, ["n", 3], doc_string="relu out")
    helper.set_metadata_props(described, {"origin": "exporter"})
    value_infos = [
        helper.make_tensor_value_info("a", TensorProto.FLOAT, None),
        helper.make_tensor_value_info("a", TensorProto.FLOAT, ["n", 3]),
        described,
        helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3]),
    ]
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])],
        initializer=[weight], value_info=value_infos,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("name", ["squeezenet", "inception_v1"])
def test_a_light_model_imports_the_same_aside(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    aside_bytes, in_turn = _both_ways(light_model(name), monkeypatch)
    assert aside_bytes == in_turn


def test_exporters_value_infos_are_read_the_same_aside(monkeypatch: pytest.MonkeyPatch) -> None:
    proto = _with_value_infos()
    before = proto.SerializeToString()
    aside_bytes, in_turn = _both_ways(proto, monkeypatch)
    assert aside_bytes == in_turn
    assert proto.SerializeToString() == before  # the caller's proto is left as it was
    model = ir.from_proto(onnx.ModelProto.FromString(aside_bytes))
    values = {v.name: v for node in model.graph for v in node.outputs}
    assert values["b"].doc_string == "relu out" and values["b"].metadata_props == {"origin": "exporter"}
    assert [str(d) for d in values["c"].shape] == ["n", "3"]  # inferred, not in the file


def test_a_refused_model_gives_the_checkers_error_aside(monkeypatch: pytest.MonkeyPatch) -> None:
    bad = _with_value_infos()
    bad.graph.node[2].input[0] = "missing"
    messages = []
    for floor in (0, 10**9):
        monkeypatch.setattr(aside, "MIN_NODES", floor)
        with pytest.raises(cg.ModelError) as caught:
            import_model(bad)
        messages.append(str(caught.value))
    assert messages[0] == messages[1]
    assert "is not a valid ONNX model" in messages[0] and "missing" in messages[0]


def _dies(model: onnx.ModelProto) -> bytes:
    os.kill(os.getpid(), signal.SIGSEGV)
    return b""


def _buggy(model: onnx.ModelProto) -> bytes:
    raise KeyError("a bug")


def test_a_child_that_dies_is_an_error_not_a_dead_caller(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(aside, "MIN_NODES", 0)
    model = light_model("squeezenet")
    pending = aside.start(model, "m.onnx", _dies)
    assert pending is not None
    with pytest.raises(cg.ModelError, match=r"m\.onnx: onnx's checker or shape inference crashed .*SIGSEGV"):
        pending.result()
    pending = aside.start(model, "m.onnx", _buggy)
    assert pending is not None
    with pytest.raises(cg.ModelError, match=r"m\.onnx: checking the model failed: KeyError: 'a bug'"):
        pending.result()


def test_a_cancelled_child_is_reaped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(aside, "MIN_NODES", 0)
    pending = aside.start(light_model("squeezenet"), "m", lambda model: b"done")
    assert pending is not None
    pending.cancel()
    with pytest.raises(ChildProcessError):
        os.waitpid(pending.pid, os.WNOHANG)  # reaped: no zombie left
    pending.cancel()  # twice is harmless


def test_small_graphs_and_switched_off_stay_in_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    model = light_model("squeezenet")
    assert aside.start(model, "m", lambda m: b"") is None  # under MIN_NODES
    monkeypatch.setattr(aside, "MIN_NODES", 0)
    monkeypatch.setenv("CODEGRAFT_PARALLEL_IMPORT", "0")
    assert aside.start(model, "m", lambda m: b"") is None


def _hangs(model: onnx.ModelProto) -> bytes:
    signal.pause()  # as a child stuck on a lock would
    return b""


def test_a_stuck_child_is_stopped_and_its_work_done_here(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(aside, "MIN_NODES", 0)
    pending = aside.start(light_model("squeezenet"), "m", _hangs)
    assert pending is not None
    assert pending.result(timeout=0.2) is None
    with pytest.raises(ChildProcessError):
        os.waitpid(pending.pid, os.WNOHANG)  # stopped and reaped
    # and through the import: the child's work is done in the caller, the result the same
    from codegraft.frontend import model as frontend

    monkeypatch.setattr(frontend, "_CHILD_GRACE_SECONDS", 0.0)
    real_start = aside.start
    monkeypatch.setattr(aside, "start", lambda proto, where, work: real_start(proto, where, _hangs))
    stuck = ir.to_proto(import_model(light_model("squeezenet"))).SerializeToString(deterministic=True)
    monkeypatch.setenv("CODEGRAFT_PARALLEL_IMPORT", "0")
    in_turn = ir.to_proto(import_model(light_model("squeezenet"))).SerializeToString(deterministic=True)
    assert stuck == in_turn


def _named_graph(**changes: object) -> onnx.ModelProto:
    model = _with_value_infos()
    for index, name in enumerate(["mm", "relu", "sig", "add"]):
        model.graph.node[index].name = name
    if changes.get("unnamed"):
        model.graph.node[1].name = ""
    if changes.get("same_name"):
        model.graph.node[1].name = "mm"
    if changes.get("input_initializer"):
        model.graph.input.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, [3, 3]))
    return model


@pytest.mark.parametrize("changes", [{}, {"unnamed": True}, {"same_name": True}, {"input_initializer": True}])
def test_names_read_from_the_proto_agree_with_the_ir(changes: dict[str, bool]) -> None:
    from codegraft.frontend import model as frontend

    proto = _named_graph(**changes)
    from_proto = frontend._proto_names_complete(proto.graph)
    from_ir = frontend._names_complete(ir.from_proto(proto).graph)
    assert from_proto == from_ir == (not changes.get("unnamed") and not changes.get("same_name"))
