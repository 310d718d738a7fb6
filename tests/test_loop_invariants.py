"""Loop-invariant code motion (:mod:`codegraft.passes.loop_invariants`) and Loops written as
Paddle's exporter writes them (trip count and iteration number of shape [1], weights carried)."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

import codegraft as cg
from codegraft.errors import BackendError, InputError
from codegraft.passes import Hoisted, hoist_loop_invariants, run_common_passes
from codegraft.testing import assert_close, run_onnxruntime

_F, _I, _B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def _paddle_style_loop(
    *, feats_is_output: bool = False, trips: list[int] | None = None, rows: int = 1, width: int = 8
) -> onnx.ModelProto:
    """``h = tanh(h @ W + mean(feats @ U + b)) + i`` for ``n`` steps, scanning out each ``h``.

    As Paddle writes it: ``W`` and ``feats`` are carried through the Loop unchanged (``W``
    returned as is, ``feats`` through ``Squeeze(Add(Unsqueeze(f, [0]), [0.0]), [0])``), the
    trip count and condition are shape-[1] tensors, and the body declares its iteration
    number and condition with shape [1].  ``feats @ U + b`` is the same in every step.
    ``h`` is ``rows x width``; at 64 x 256 the step's ``h @ W`` is work enough for codegraft to
    run the Loop itself (:data:`codegraft.plan.control.LOOP_BODY_MIN_MACS`), at the default
    1 x 8 it stays on the host.
    """
    const = helper.make_tensor
    body = helper.make_graph(
        [
            helper.make_node("Constant", [], ["zero_axis"], value=const("za", _I, [1], [0])),
            helper.make_node("Constant", [], ["zero"], value=const("z", _F, [1], [0.0])),
            helper.make_node("Constant", [], ["bias"], value=const("b", _F, [width], np.linspace(-1, 1, width))),
            helper.make_node("Unsqueeze", ["f_in", "zero_axis"], ["f_u"]),
            helper.make_node("Add", ["f_u", "zero"], ["f_a"]),
            helper.make_node("Squeeze", ["f_a", "zero_axis"], ["f_out"]),
            helper.make_node("MatMul", ["f_in", "U"], ["proj"]),  # invariant once f_in is read from outside
            helper.make_node("Add", ["proj", "bias"], ["proj_b"]),  # reads a Constant of the body
            helper.make_node("ReduceMean", ["proj_b"], ["context"], axes=[1], keepdims=0),
            helper.make_node("MatMul", ["h_in", "W_in"], ["hw"]),
            helper.make_node("Add", ["hw", "context"], ["pre"]),
            helper.make_node("Tanh", ["pre"], ["t"]),
            helper.make_node("Cast", ["i"], ["i_f"], to=_F),
            helper.make_node("Add", ["t", "i_f"], ["h_out"]),
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Identity", ["h_out"], ["scan"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", _I, [1]),
            helper.make_tensor_value_info("cond_in", _B, [1]),
            helper.make_tensor_value_info("h_in", _F, [rows, width]),
            helper.make_tensor_value_info("W_in", _F, [width, width]),
            helper.make_tensor_value_info("f_in", _F, [1, 5, width]),
        ],
        [
            helper.make_tensor_value_info("cond_out", _B, [1]),
            helper.make_tensor_value_info("h_out", _F, [rows, width]),
            helper.make_tensor_value_info("W_in", _F, [width, width]),
            helper.make_tensor_value_info("f_out", _F, [1, 5, width]),
            helper.make_tensor_value_info("scan", _F, [rows, width]),
        ],
    )
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Loop", ["n", "go", "x", "W", "feats"], ["h_final", "W_final", "f_final", "all"], body=body),
        helper.make_node("ReduceMean", ["f_final"], ["f_mean"], axes=[1, 2], keepdims=0),
        helper.make_node("Add", ["h_final", "f_mean"], ["y"]),
    ]
    outputs = [
        helper.make_tensor_value_info("y", _F, [rows, width]),
        helper.make_tensor_value_info("all", _F, [None, rows, width]),
    ]
    if feats_is_output:
        outputs.append(helper.make_tensor_value_info("f_final", _F, [1, 5, width]))
    graph = helper.make_graph(
        nodes,
        "paddle_loop",
        [
            helper.make_tensor_value_info("x", _F, [rows, width]),
            helper.make_tensor_value_info("feats", _F, [1, 5, width]),
        ],
        outputs,
        initializer=[
            numpy_helper.from_array((rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32), "W"),
            numpy_helper.from_array((rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32), "U"),
            numpy_helper.from_array(np.array(trips or [3], np.int64), "n"),
            numpy_helper.from_array(np.array([True]), "go"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _feeds(rows: int = 1, width: int = 8) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    return {
        "x": rng.standard_normal((rows, width)).astype(np.float32),
        "feats": rng.standard_normal((1, 5, width)).astype(np.float32),
    }


def _loop(model: ir.Model) -> ir.Node:
    return next(node for node in model.graph if node.op_type == "Loop")


def test_carried_pass_throughs_become_reads_and_invariant_nodes_move_out() -> None:
    proto = _paddle_style_loop()
    model = ir.serde.deserialize_model(proto)
    assert hoist_loop_invariants(model) == Hoisted(carried=2, nodes=3)
    loop = _loop(model)
    body = loop.attributes["body"].as_graph()
    assert [v.name for v in body.inputs] == ["i", "cond_in", "h_in"]
    assert [v.name for v in loop.outputs] == ["h_final", "all"]
    moved = [node.op_type for node in model.graph][:-3]  # in front of the Loop, Reduce and Add
    assert sorted(moved) == ["Add", "Constant", "MatMul", "ReduceMean"]  # the Constant is a copy
    assert not any(node.op_type == "MatMul" and node.inputs[1].name == "U" for node in body)
    hoisted = ir.serde.serialize_model(model)
    onnx.checker.check_model(hoisted, full_check=True)
    assert_close(run_onnxruntime(hoisted, _feeds()), run_onnxruntime(proto, _feeds()))
    assert not hoist_loop_invariants(model)  # nothing left to move


def test_a_carried_value_the_graph_outputs_stays_carried() -> None:
    proto = _paddle_style_loop(feats_is_output=True)
    model = ir.serde.deserialize_model(proto)
    assert hoist_loop_invariants(model).carried == 1  # W only: f_final keeps its Loop output
    hoisted = ir.serde.serialize_model(model)
    onnx.checker.check_model(hoisted, full_check=True)
    assert_close(run_onnxruntime(hoisted, _feeds()), run_onnxruntime(proto, _feeds()))


def test_nodes_reading_what_the_body_computes_stay() -> None:
    model = ir.serde.deserialize_model(_paddle_style_loop())
    hoist_loop_invariants(model)
    body = _loop(model).attributes["body"].as_graph()
    assert {"MatMul", "Tanh", "Cast"} <= {node.op_type for node in body}  # h @ W, tanh, the step number


@pytest.mark.parametrize("targets", [["c"], ["onnxruntime"]])
def test_paddle_style_loop_compiles_and_matches(targets: list[str]) -> None:
    proto = _paddle_style_loop()
    exe = cg.compile(proto, targets=targets)
    assert_close(exe.run(_feeds()), run_onnxruntime(proto, _feeds()))
    identity = next(p for p in exe.report().passes if p.name == "identity")
    assert "loop invariants: 2 carried values read from outside, 3 nodes moved" in identity.detail


def test_codegraft_runs_a_paddle_style_loop_with_shape_1_counters() -> None:
    # codegraft's runner, not onnxruntime's: a step's h @ W is 4.2M multiply-adds
    proto = _paddle_style_loop(rows=64, width=256)
    exe = cg.compile(proto, targets=["c"])
    assert "codegraft.control" in [step.backend for step in exe.steps]
    feeds = _feeds(64, 256)
    assert_close(exe.run(feeds), run_onnxruntime(proto, feeds))


def test_pipeline_leaves_no_fence_and_no_dead_chain_behind() -> None:
    model = ir.serde.deserialize_model(_paddle_style_loop())
    run_common_passes(model)
    body = _loop(model).attributes["body"].as_graph()
    assert all(node.domain == "" for node in ir.traversal.RecursiveGraphIterator(model.graph))
    assert not {"Squeeze", "Unsqueeze"} & {node.op_type for node in body}  # feats' copy chain is gone


def test_trip_count_of_more_than_one_value_is_named() -> None:
    proto = _paddle_style_loop(trips=[3, 4], rows=64, width=256)
    exe = cg.compile(proto, targets=["c"], passes=())
    with pytest.raises((InputError, BackendError), match=r"Loop .*M must hold one value, got shape \[2\]"):
        exe.run(_feeds(64, 256))


def test_two_loops_with_one_body_keep_names_unique_when_hoisted() -> None:
    proto = _paddle_style_loop()
    body = proto.graph.node[0].attribute[0].g
    second = helper.make_node("Loop", ["n", "go", "x", "W", "feats"], ["h2", "W2", "f2", "all2"], body=body)
    proto.graph.node.append(second)
    proto.graph.output.append(helper.make_tensor_value_info("h2", _F, [1, 8]))
    model = ir.serde.deserialize_model(proto)
    assert hoist_loop_invariants(model) == Hoisted(carried=4, nodes=6)
    hoisted = ir.serde.serialize_model(model)
    onnx.checker.check_model(hoisted, full_check=True)  # SSA: the second "proj" was renamed
    assert_close(run_onnxruntime(hoisted, _feeds()), run_onnxruntime(proto, _feeds()))


# -- property: hoisting never changes what a Loop computes -------------------------------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_ROW = [2, 3]


@st.composite
def _random_loops(draw: st.DrawFn) -> onnx.ModelProto:
    """A Loop over random float [2, 3] state: each carried value passed through (as is, by
    Identity, or by Paddle's copy chain) or updated from a random mix of the carried values, the
    outer scope and values the body made; random scan outputs; sometimes an inner Loop that
    reads the outer body's values."""
    counter = iter(range(10_000))

    def fresh(prefix: str) -> str:
        return f"{prefix}{next(counter)}"

    def body(depth: int, outer: list[str]) -> tuple[onnx.GraphProto, int, list[str]]:
        carried = draw(st.integers(1, 3))
        ins = [fresh("i"), fresh("c")] + [fresh("v") for _ in range(carried)]
        nodes: list[onnx.NodeProto] = [helper.make_node("Constant", [], [fresh("z")], value=helper.make_tensor(
            "z", _F, [1], [0.0]))]  # fmt: skip
        zero = nodes[0].output[0]
        axis = fresh("axis")
        nodes.append(helper.make_node("Constant", [], [axis], value=helper.make_tensor("a", _I, [1], [0])))
        pool = [*ins[2:], *outer]
        for _ in range(draw(st.integers(1, 5))):
            op = draw(st.sampled_from(["Add", "Mul", "Tanh", "Sub", "Sigmoid"]))
            a = draw(st.sampled_from(pool))
            out = fresh("t")
            if op in ("Tanh", "Sigmoid"):
                nodes.append(helper.make_node(op, [a], [out]))
            else:
                nodes.append(helper.make_node(op, [a, draw(st.sampled_from(pool))], [out]))
            pool.append(out)
        if depth == 0 and draw(st.booleans()):  # an inner Loop reading this body's values
            inner, inner_carried, inner_initial = body(1, pool)
            outs = [fresh("o") for _ in range(len(inner.output) - 1)]
            nodes.append(helper.make_node("Loop", ["two", "", *inner_initial], outs, body=inner))
            pool.extend(outs[:inner_carried])
        outputs = [fresh("cond")]
        nodes.append(helper.make_node("Identity", [ins[1]], [outputs[0]]))
        for k in range(carried):
            kind = draw(st.sampled_from(["same", "identity", "chain", "update"]))
            v = ins[2 + k]
            if kind == "same":
                outputs.append(v)
                continue
            out = fresh("r")
            if kind == "identity":
                nodes.append(helper.make_node("Identity", [v], [out]))
            elif kind == "chain":
                u, s = fresh("u"), fresh("s")
                nodes += [helper.make_node("Unsqueeze", [v, axis], [u]), helper.make_node("Add", [u, zero], [s]),
                          helper.make_node("Squeeze", [s, axis], [out])]  # fmt: skip
            else:
                nodes.append(helper.make_node("Add", [v, draw(st.sampled_from(pool))], [out]))
            outputs.append(out)
        scans = draw(st.lists(st.sampled_from(pool), max_size=2))
        for value in scans:
            scan = fresh("scan")
            nodes.append(helper.make_node("Identity", [value], [scan]))
            outputs.append(scan)
        graph = helper.make_graph(
            nodes, fresh("body"),
            [helper.make_tensor_value_info(ins[0], _I, []), helper.make_tensor_value_info(ins[1], _B, []),
             *(helper.make_tensor_value_info(v, _F, _ROW) for v in ins[2:])],
            [helper.make_tensor_value_info(outputs[0], _B, []),
             *(helper.make_tensor_value_info(v, _F, _ROW) for v in outputs[1 : 1 + carried]),
             *(helper.make_tensor_value_info(v, _F, _ROW) for v in outputs[1 + carried :])],
        )  # fmt: skip
        initial = [draw(st.sampled_from(outer)) for _ in range(carried)]
        return graph, carried, initial

    outer = ["x", "w"]
    graph, carried, initial = body(0, outer)
    outs = [f"out{i}" for i in range(len(graph.output) - 1)]
    nodes = [helper.make_node("Loop", ["three", "", *initial], outs, body=graph)]
    finals = []
    for index, name in enumerate(outs):  # some read by a node after the Loop, some graph outputs
        shape = _ROW if index < carried else [None, *_ROW]
        if not draw(st.booleans()):
            nodes.append(helper.make_node("Neg", [name], [f"{name}_neg"]))
            name = f"{name}_neg"
        finals.append(helper.make_tensor_value_info(name, _F, shape))
    model = helper.make_model(
        helper.make_graph(
            nodes, "loops", [helper.make_tensor_value_info("x", _F, _ROW)],
            finals,
            [numpy_helper.from_array(np.linspace(-1, 1, 6, dtype=np.float32).reshape(_ROW), "w"),
             numpy_helper.from_array(np.array(3, np.int64), "three"),
             numpy_helper.from_array(np.array(2, np.int64), "two")],
        ),
        opset_imports=[helper.make_opsetid("", 17)],
    )  # fmt: skip
    return model


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(_random_loops())
def test_hoisting_never_changes_what_a_loop_computes(proto: onnx.ModelProto) -> None:
    onnx.checker.check_model(proto, full_check=True)
    feeds = {"x": np.array([[0.5, -1.0, 2.0], [0.1, 0.2, -0.3]], np.float32)}
    expected = run_onnxruntime(proto, feeds)
    model = ir.serde.deserialize_model(proto)
    hoist_loop_invariants(model)
    hoisted = ir.serde.serialize_model(model)
    onnx.checker.check_model(hoisted, full_check=True)
    assert [o.name for o in hoisted.graph.output] == [o.name for o in proto.graph.output]
    assert_close(run_onnxruntime(hoisted, feeds), expected)
    # and through the whole pipeline, compiled
    assert_close(cg.compile(proto, targets=["c"]).run(feeds), expected)
