"""Control flow: If and Loop bodies partitioned like any graph, run by codegraft's runtime."""

from __future__ import annotations

import pathlib

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import codegraft as cg
from codegraft.testing import SubsetBackend, assert_close, run_onnxruntime


def _if_model() -> onnx.ModelProto:
    then_graph = helper.make_graph(
        [helper.make_node("Relu", ["h"], ["t1"]), helper.make_node("Sin", ["t1"], ["t2"]),
         helper.make_node("Mul", ["t2", "k"], ["t"])],
        "then", [], [helper.make_tensor_value_info("t", TensorProto.FLOAT, [4])],
    )
    else_graph = helper.make_graph(
        [helper.make_node("Neg", ["h"], ["e"])], "else", [],
        [helper.make_tensor_value_info("e", TensorProto.FLOAT, [4])],
    )
    graph = helper.make_graph(
        [
            helper.make_node("Abs", ["x"], ["h"]),
            helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
            helper.make_node("Greater", ["s", "zero"], ["c"]),
            helper.make_node("If", ["c"], ["o"], then_branch=then_graph, else_branch=else_graph, name="branch"),
            helper.make_node("Sigmoid", ["o"], ["y"]),
        ],
        "cf",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
        initializer=[numpy_helper.from_array(np.array(0, np.float32), "zero"),
                     numpy_helper.from_array(np.arange(4, dtype=np.float32), "k")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_if_bodies_are_partitioned_and_saved(tmp_path: pathlib.Path) -> None:
    model = _if_model()
    acc = SubsetBackend("acc", {"Relu", "Mul", "Neg"})
    exe = cg.compile(model, targets=[acc])
    control = next(p for p in exe.report().partitions if p.backend == "codegraft.control")
    assert "branch.then_branch: acc 2, onnxruntime 1" in control.bodies
    assert "branch.else_branch: acc 1" in control.bodies
    exe.save(tmp_path / "m.cgx")
    loaded = cg.load_executable(tmp_path / "m.cgx", backends=[acc])
    for sign in (1.0, -1.0):
        feeds = {"x": sign * np.arange(1, 5, dtype=np.float32)}
        expected = run_onnxruntime(model, feeds)
        assert_close(exe.run(feeds), expected)
        assert_close(loaded.run(feeds), expected)


def _loop_model(rows: int | str = 64, width: int = 256, *, columns: bool = False) -> onnx.ModelProto:
    # acc = x; for i in range(n): acc = tanh(acc @ W) + i ; also scan-out each acc.
    # 64 x 256 @ 256 x 256 is 4.2M multiply-adds a step: enough work for the targets to pay for
    # running the Loop step by step (plan.control.LOOP_BODY_MIN_MACS).  With ``columns``,
    # acc = tanh(W @ acc) + i, acc [width, rows]: a free ``rows`` is then no leading (batch)
    # dimension, and the body's work is known only at the first call's sizes.
    shape = [width, rows] if columns else [rows, width]
    body = helper.make_graph(
        [
            helper.make_node("MatMul", ["W", "acc_in"] if columns else ["acc_in", "W"], ["m"]),
            helper.make_node("Tanh", ["m"], ["t"]),
            helper.make_node("Cast", ["i"], ["i_f"], to=TensorProto.FLOAT),
            helper.make_node("Add", ["t", "i_f"], ["acc_out"]),
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Identity", ["acc_out"], ["scan"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, shape),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, shape),
            helper.make_tensor_value_info("scan", TensorProto.FLOAT, shape),
        ],
    )
    rng = np.random.default_rng(0)
    weight = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Loop", ["n", "", "x"], ["final", "all"], body=body, name="loop")],
        "loop",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("final", TensorProto.FLOAT, shape),
         helper.make_tensor_value_info("all", TensorProto.FLOAT, [None, *shape])],
        initializer=[numpy_helper.from_array(weight, "W"), numpy_helper.from_array(np.array(4, np.int64), "n")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_loop_body_is_partitioned() -> None:
    model = _loop_model()
    exe = cg.compile(model, targets=[SubsetBackend("acc", {"MatMul", "Add"})])
    assert [s.backend for s in exe.steps] == ["codegraft.control"]
    feeds = {"x": np.random.default_rng(1).standard_normal((64, 256)).astype(np.float32)}
    result = exe.run(feeds)
    assert result["all"].shape == (4, 64, 256)
    assert_close(result, run_onnxruntime(model, feeds))


def test_a_loop_with_little_work_for_the_targets_runs_whole_on_the_host() -> None:
    model = _loop_model(rows=2, width=3)  # 18 multiply-adds a step
    exe = cg.compile(model, targets=[SubsetBackend("acc", {"MatMul", "Add"})])
    assert [s.backend for s in exe.steps] == ["onnxruntime"]
    loop = next(n for n in exe.report().nodes if n.op_type == "Loop")
    assert "18 multiply-adds per iteration" in dict(loop.declined)["acc"]
    assert "runs whole on the host" in dict(loop.declined)["acc"]
    feeds = {"x": np.random.default_rng(1).standard_normal((2, 3)).astype(np.float32)}
    assert_close(exe.run(feeds), run_onnxruntime(model, feeds))


def _loop_choices(exe: cg.Executable) -> str:
    return next(p for p in exe.report().partitions if p.backend == "codegraft.control").loop_choices


def test_a_loop_whose_work_is_unknown_at_compile_time_is_chosen_at_the_first_calls_sizes(
    tmp_path: pathlib.Path,
) -> None:
    # W @ acc with acc's columns free: 256 x 256 a column, the count of columns unknown, which
    # used to count as 1 and send the Loop whole to the host.  At 128 columns the body gives c 8.4M a step.
    model = _loop_model(rows="columns", columns=True)
    # "idle" takes nothing here: a loader without it still loads (and counts for c alone)
    exe = cg.compile(model, targets=["c", SubsetBackend("idle", {"Sin"})])
    assert [s.backend for s in exe.steps] == ["codegraft.control"]
    control = next(p for p in exe.report().partitions if p.backend == "codegraft.control")
    assert "loop.body: c " in control.bodies and "the first call's input shapes choose" in control.bodies
    assert control.loop_choices == ""
    rng = np.random.default_rng(1)
    large = {"x": rng.standard_normal((256, 128)).astype(np.float32)}
    small = {"x": rng.standard_normal((256, 2)).astype(np.float32)}
    assert_close(exe.run(large), run_onnxruntime(model, large))
    assert "loop at input shapes 256x128: its body gives the targets 8,388,608 multiply-adds per iteration" in (
        _loop_choices(exe)
    )
    assert "its compiled body runs step by step" in _loop_choices(exe)
    assert "the whole Loop runs on the host" not in _loop_choices(exe)
    assert_close(exe.run(small), run_onnxruntime(model, small))
    assert "loop at input shapes 256x2: its body gives the targets 131,072 multiply-adds per iteration, fewer " \
        "than 4,194,304; the whole Loop runs on the host" in _loop_choices(exe)
    exe.run(large)  # each shape chooses once
    assert _loop_choices(exe).count("256x128") == 1
    exe.save(tmp_path / "m.cgx")
    loaded = cg.load_executable(tmp_path / "m.cgx")
    saved = _loop_choices(exe)
    assert _loop_choices(loaded) == saved  # the report as saved; the loaded one chooses again, alike
    for feeds in (small, large):
        assert_close(loaded.run(feeds), run_onnxruntime(model, feeds))
    assert _loop_choices(loaded) == saved
    shapes = {"x": rng.standard_normal((256, 3)).astype(np.float32)}
    assert_close(loaded.run(shapes), run_onnxruntime(model, shapes))
    assert "loop at input shapes 256x3" in _loop_choices(loaded) and "256x3" not in saved


def test_a_loop_whose_only_free_size_is_a_batch_is_judged_at_compile_time() -> None:
    # [batch, 3] @ [3, 3]: a free leading dimension counts as a batch of 1 (9 multiply-adds), as
    # chars2vec's LSTM steps do; such a known-small body still goes whole to the host at compile time.
    model = _loop_model(rows="batch", width=3)
    exe = cg.compile(model, targets=[SubsetBackend("acc", {"MatMul", "Add"})])
    assert [s.backend for s in exe.steps] == ["onnxruntime"]
    loop = next(n for n in exe.report().nodes if n.op_type == "Loop")
    assert "9 multiply-adds per iteration" in dict(loop.declined)["acc"]
    feeds = {"x": np.random.default_rng(1).standard_normal((5, 3)).astype(np.float32)}
    assert_close(exe.run(feeds), run_onnxruntime(model, feeds))


def test_a_loop_reading_a_free_sized_outer_value_counts_its_work_at_the_shapes_fed() -> None:
    # The body's product reads x from outside the Loop (as the speech embedding's STFT reads the
    # clip; x + i, so that it is no invariant moved before the Loop): its size comes from the
    # call's input, not from a carried value.
    body = helper.make_graph(
        [helper.make_node("Cast", ["i"], ["i_f"], to=TensorProto.FLOAT), helper.make_node("Add", ["x", "i_f"], ["s"]),
         helper.make_node("MatMul", ["W", "s"], ["m"]), helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("m", TensorProto.FLOAT, [256, "columns"])],
    )
    weight = np.random.default_rng(0).standard_normal((256, 256)).astype(np.float32) / 16
    graph = helper.make_graph(
        [helper.make_node("Loop", ["n", ""], ["all"], body=body, name="loop")],
        "outer_read",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [256, "columns"])],
        [helper.make_tensor_value_info("all", TensorProto.FLOAT, [None, 256, "columns"])],
        initializer=[numpy_helper.from_array(weight, "W"), numpy_helper.from_array(np.array(3, np.int64), "n")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    exe = cg.compile(model, targets=[SubsetBackend("acc", {"MatMul"})])
    rng = np.random.default_rng(3)
    for columns, plan in ((100, "step by step"), (10, "the whole Loop runs on the host")):
        feeds = {"x": rng.standard_normal((256, columns)).astype(np.float32)}
        assert_close(exe.run(feeds), run_onnxruntime(model, feeds))
        assert f"loop at input shapes 256x{columns}: its body gives the targets {columns * 65536:,} multiply-adds" in (
            _loop_choices(exe)
        )
        assert plan in _loop_choices(exe).split(" | ")[-1]


def test_a_loop_chosen_at_the_first_call_still_falls_back_when_its_target_fails() -> None:
    model = _loop_model(rows="columns", columns=True)
    exe = cg.compile(model, targets=[SubsetBackend("acc", {"MatMul", "Add"}, fail_on="MatMul")])
    assert [s.backend for s in exe.steps] == ["codegraft.control"]
    feeds = {"x": np.random.default_rng(2).standard_normal((256, 128)).astype(np.float32)}
    assert_close(exe.run(feeds), run_onnxruntime(model, feeds))
    assert "step by step" in _loop_choices(exe)


def test_bodies_no_target_wants_stay_whole_on_the_host() -> None:
    model = _if_model()
    exe = cg.compile(model, targets=[SubsetBackend("acc", {"Abs", "Sigmoid", "If"})])
    if_node = next(n for n in exe.report().nodes if n.op_type == "If")
    assert if_node.backend == "onnxruntime"
    assert "control flow" in dict(if_node.declined)["acc"]
    # Abs's output is read only inside the bodies: that implicit read must order the If's
    # partition after the one computing it, and make "h" an input of it.
    producer = next(i for i, s in enumerate(exe.steps) if "h" in s.outputs)
    reader = next(i for i, s in enumerate(exe.steps) if if_node.partition == s.name)
    assert producer < reader and "h" in exe.steps[reader].inputs
    for sign in (1.0, -1.0):
        feeds = {"x": sign * np.arange(1, 5, dtype=np.float32)}
        assert_close(exe.run(feeds), run_onnxruntime(model, feeds))


def _counting_loop(trips: str, name: str, inner: onnx.NodeProto | None = None) -> onnx.NodeProto:
    """``Loop(trips, "")`` with no carried values, scanning out ``i + x`` each step (or, with
    ``inner``, what that node scans out): its last input is the omitted condition."""
    i, cond, y = f"{name}_i", f"{name}_cond", f"{name}_y"
    nodes = [helper.make_node("Identity", [cond], [f"{cond}_out"])]
    if inner is None:
        nodes += [helper.make_node("Cast", [i], [f"{name}_f"], to=TensorProto.FLOAT),
                  helper.make_node("Add", [f"{name}_f", "x"], [y])]  # fmt: skip
    else:
        nodes += [inner, helper.make_node("Identity", [inner.output[0]], [y])]
    body = helper.make_graph(
        nodes, f"{name}_body",
        [helper.make_tensor_value_info(i, TensorProto.INT64, []),
         helper.make_tensor_value_info(cond, TensorProto.BOOL, [])],
        [helper.make_tensor_value_info(f"{cond}_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info(y, TensorProto.FLOAT, None if inner is None else [None, 2])],
    )  # fmt: skip
    return helper.make_node("Loop", [trips, ""], [f"{name}_ys"], body=body, name=name)


@pytest.mark.parametrize("targets", [[], ["c"]])
@pytest.mark.parametrize("nested", [False, True])
def test_a_loop_with_an_omitted_condition_and_nothing_carried_keeps_its_two_inputs(
    targets: list[str], nested: bool
) -> None:
    # onnx-ir's dead-code pass trims omitted inputs from a node's end: Loop(M, "") came out
    # Loop(M), which onnxruntime refuses (a Loop takes 2 to any inputs), host partitions too
    loop = _counting_loop("trips", "inner")
    if nested:
        loop = _counting_loop("trips", "outer", inner=loop)
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]),
              helper.make_tensor_value_info("trips", TensorProto.INT64, [])]  # fmt: skip
    output = helper.make_tensor_value_info(loop.output[0], TensorProto.FLOAT, None)
    model = helper.make_model(helper.make_graph([loop], "counting", inputs, [output]),
                              opset_imports=[helper.make_opsetid("", 17)])  # fmt: skip
    feeds = {"x": np.array([0.5, -1.0], np.float32), "trips": np.array(3, np.int64)}
    assert_close(cg.compile(model, targets=targets).run(feeds), run_onnxruntime(model, feeds))


def _if_returning_outer_identities() -> onnx.ModelProto:
    """Each branch returns ``Identity`` of an outer-scope value, as exported recurrent state
    does (Silero VAD): Identity removal must not make the outer value a branch output."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])
    cond = helper.make_tensor_value_info("cond", TensorProto.BOOL, [])

    def branch(name: str, outer: str) -> onnx.GraphProto:
        identity = helper.make_node("Identity", [outer], [f"{name}_out"])
        out = helper.make_tensor_value_info(f"{name}_out", TensorProto.FLOAT, [2, 4])
        return helper.make_graph([identity], name, [], [out])

    nodes = [
        helper.make_node("Relu", ["x"], ["outer_r"]),
        helper.make_node("Sigmoid", ["x"], ["outer_s"]),
        helper.make_node("If", ["cond"], ["chosen"], then_branch=branch("then", "outer_r"),
                         else_branch=branch("else", "outer_s")),
        helper.make_node("Tanh", ["chosen"], ["t"]),
        helper.make_node("Add", ["t", "outer_r"], ["y"]),
    ]
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])
    graph = helper.make_graph(nodes, "if_outer", [x, cond], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("targets", [[], ["c", "openvino"]])
@pytest.mark.parametrize("condition", [True, False])
def test_if_branches_returning_outer_scope_identities(targets: list[str], condition: bool) -> None:
    proto = _if_returning_outer_identities()
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32), "cond": np.array(condition)}
    exe = cg.compile(proto, targets=targets)
    assert_close(exe.run(feeds), run_onnxruntime(proto, feeds))
