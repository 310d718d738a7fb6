"""End-to-end: compile with test backends, compare with onnxruntime on the unpartitioned model."""

from __future__ import annotations

import threading

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import codegraft as cg
from codegraft.testing import SubsetBackend, assert_close, light_model, random_feeds, run_onnxruntime

UNARY = ["Relu", "Sigmoid", "Tanh", "Neg", "Abs"]
BINARY = ["Add", "Mul", "Sub"]


@st.composite
def random_models(draw: st.DrawFn) -> onnx.ModelProto:
    """A random DAG of elementwise ops and MatMuls over [2, 8] tensors, with skips."""
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    weight = numpy_helper.from_array(rng.uniform(-0.5, 0.5, (8, 8)).astype(np.float32), "W")
    values = ["x", "y"]
    nodes = []
    for index in range(draw(st.integers(1, 24))):
        op = draw(st.sampled_from([*UNARY, *BINARY, "MatMul", "chain"]))
        out = f"v{index}"
        if op == "chain":  # a fresh two-node chain, so composite patterns have something to match
            first, second = draw(st.sampled_from([("MatMul", "Tanh"), ("MatMul", "Relu"), ("Add", "Relu")]))
            a, b = draw(st.sampled_from(values)), draw(st.sampled_from(values))
            inputs = [a, "W"] if first == "MatMul" else [a, b]
            nodes.append(helper.make_node(first, inputs, [f"{out}_pre"], name=f"n{index}_pre"))
            nodes.append(helper.make_node(second, [f"{out}_pre"], [out], name=f"n{index}"))
        elif op in BINARY:
            a, b = draw(st.sampled_from(values)), draw(st.sampled_from(values))
            nodes.append(helper.make_node(op, [a, b], [out], name=f"n{index}"))
        elif op == "MatMul":
            nodes.append(helper.make_node("MatMul", [draw(st.sampled_from(values)), "W"], [out], name=f"n{index}"))
        else:
            nodes.append(helper.make_node(op, [draw(st.sampled_from(values))], [out], name=f"n{index}"))
        values.append(out)
    produced = values[2:]
    extra = draw(st.lists(st.sampled_from(produced), max_size=2, unique=True))
    outputs = list(dict.fromkeys([produced[-1], *extra]))
    spec = [2, 8]
    graph = helper.make_graph(
        nodes,
        "random",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, spec) for n in ("x", "y")],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, spec) for n in outputs],
        initializer=[weight],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


ALL_OPS = [*UNARY, *BINARY, "MatMul"]


def _rules() -> dict[str, object]:
    from codegraft.patterns import op, pattern, var

    @pattern
    def matmul_act(op, x):  # type: ignore[no-untyped-def]
        return op.any("Relu", "Tanh", "Sigmoid")(op.MatMul(x, var("w")))

    @pattern
    def add_relu(op, a, b):  # type: ignore[no-untyped-def]
        return op.Relu(op.Add(a, b))

    del op
    return {"matmul_act": matmul_act.rule(), "add_relu": add_relu.rule()}


RULES = _rules()


@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(
    random_models(),
    st.lists(
        st.tuples(st.sets(st.sampled_from(ALL_OPS)), st.sets(st.sampled_from(sorted(RULES)))), min_size=1, max_size=3
    ),
    st.integers(1, 3),
)
def test_random_dags_match_onnxruntime(
    model: onnx.ModelProto, specs: list[tuple[set[str], set[str]]], min_size: int
) -> None:
    targets = [
        SubsetBackend(f"t{i}", ops, rules=tuple(RULES[r] for r in sorted(rules)))
        for i, (ops, rules) in enumerate(specs)
    ]
    exe = cg.compile(model, targets=targets, passes=(), min_partition_size=min_size)
    feeds = random_feeds(model, seed=1)
    assert_close(exe.run(feeds), run_onnxruntime(model, feeds), rtol=1e-5)

    report = exe.report()
    assert sorted(n.name for n in report.nodes) == sorted(n.name for n in model.graph.node)
    # No cycle: in schedule order, every partition reads only what exists already.
    available = {"x", "y", "W", *exe.constants}
    for step in exe.steps:
        assert set(step.inputs) <= available, f"{step.name} reads a value produced later"
        available |= set(step.outputs)
    partitions_of_composite: dict[str, set[str]] = {}
    for node in report.nodes:
        if node.composite:
            partitions_of_composite.setdefault(node.composite, set()).add(node.partition)
    assert all(len(parts) == 1 for parts in partitions_of_composite.values()), "a composite was split"
    event(f"composites: {min(len(partitions_of_composite), 3)}")
    for node in report.nodes:
        part = next(p for p in report.partitions if p.name == node.partition)
        assert node.backend == part.backend
        if node.backend == "onnxruntime":
            continue
        assert part.nodes >= min_size


def test_light_resnet50_with_a_conv_only_accelerator() -> None:
    model = light_model("resnet50")
    accelerator = SubsetBackend("acc", {"Conv", "Relu", "BatchNormalization"})
    exe = cg.compile(model, targets=[accelerator])
    feeds = random_feeds(model)
    assert_close(exe.run(feeds), run_onnxruntime(model, feeds))
    counts = exe.report().nodes_per_backend()
    assert counts["acc"] > 100 and counts["onnxruntime"] > 0
    # The residual Sums fall to the host, so the accelerator runs one partition per stage.
    assert exe.report().partitions_per_backend()["acc"] >= 16


def test_report_names_each_declining_target_and_its_reason() -> None:
    model = light_model("squeezenet")
    exe = cg.compile(model, targets=[SubsetBackend("a", {"Conv"}), SubsetBackend("b", {"Relu"})])
    relu = next(n for n in exe.report().nodes if n.op_type == "Relu")
    assert relu.backend == "b"
    assert ("a", "Relu is not in a's op set") in relu.declined
    pool = next(n for n in exe.report().nodes if n.op_type == "MaxPool")
    assert pool.backend == "onnxruntime"
    assert {b for b, _ in pool.declined} == {"a", "b"}
    assert "why not" in str(exe.report())


def test_failed_compile_falls_back_to_host_and_strict_raises() -> None:
    model = light_model("squeezenet")
    feeds = random_feeds(model)
    flaky = SubsetBackend("flaky", {"Conv", "Relu", "Concat"}, fail_on="Concat")
    exe = cg.compile(model, targets=[flaky])
    assert_close(exe.run(feeds), run_onnxruntime(model, feeds))
    fallbacks = exe.report().fallbacks()
    assert fallbacks and all("simulated failure" in (p.fallback_error or "") for p in fallbacks)
    assert all(p.backend == "onnxruntime" and p.requested_backend == "flaky" for p in fallbacks)
    assert "fell back from flaky" in str(exe.report())
    with pytest.raises(cg.BackendError, match="simulated failure"):
        # (min_partition_macs=0: Concats alone between host partitions would go to the host)
        cg.compile(model, targets=[SubsetBackend("flaky", {"Concat"}, fail_on="Concat")], strict=True,
                   min_partition_macs=0)


def _symbolic_model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((8, 4)).astype(np.float32), "w")
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["h"]),
            helper.make_node("Relu", ["h"], ["r"]),
            helper.make_node("Softmax", ["r"], ["y"], axis=-1),
        ],
        "symbolic",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 4])],
        initializer=[w],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_symbolic_dims_on_a_static_shape_backend_compile_once_per_shape() -> None:
    model = _symbolic_model()
    static = SubsetBackend("static", {"MatMul", "Relu"}, dynamic_shapes=False)
    exe = cg.compile(model, targets=[static])
    assert exe.report().partitions[0].deferred
    for batch, seq in [(1, 3), (2, 5), (1, 3)]:
        feeds = random_feeds(model, dim_values={"batch": batch, "seq": seq})
        assert_close(exe.run(feeds), run_onnxruntime(model, feeds))
    assert static.compiled == [[(1, 3, 8)], [(2, 5, 8)]]


def test_dynamic_backend_receives_symbolic_shapes() -> None:
    model = _symbolic_model()
    dynamic = SubsetBackend("dyn", {"MatMul", "Relu"})
    exe = cg.compile(model, targets=[dynamic])
    assert dynamic.compiled == [[(  "batch", "seq", 8)]]
    feeds = random_feeds(model, dim_values={"batch": 3, "seq": 2})
    assert_close(exe.run(feeds), run_onnxruntime(model, feeds))


def test_run_is_safe_from_several_threads() -> None:
    model = _symbolic_model()
    exe = cg.compile(model, targets=[SubsetBackend("static", {"MatMul"}, dynamic_shapes=False)])
    feeds = [random_feeds(model, seed=s, dim_values={"batch": 1 + s % 3, "seq": 2}) for s in range(8)]
    expected = [run_onnxruntime(model, f) for f in feeds]
    errors: list[BaseException] = []

    def work(index: int) -> None:
        try:
            for _ in range(5):
                assert_close(exe.run(feeds[index]), expected[index])
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


def test_shared_weights_are_stored_once() -> None:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32), "w")
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["a"]),
            helper.make_node("Sin", ["a"], ["b"]),
            helper.make_node("MatMul", ["b", "w"], ["y"]),
        ],
        "shared",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 64])],
        initializer=[w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    exe = cg.compile(model, targets=[SubsetBackend("acc", {"MatMul"})])
    assert len(exe.steps) == 3
    assert list(exe.constants) == ["w"]
    assert all("w" in s.inputs for s in exe.steps if s.backend == "acc")
    feeds = random_feeds(model)
    assert_close(exe.run(feeds), run_onnxruntime(model, feeds))


def test_unknown_target_is_a_clear_error() -> None:
    with pytest.raises(cg.BackendError, match="unknown backend 'nope'; installed: .*onnxruntime"):
        cg.compile(light_model("squeezenet"), targets=["nope"])


def test_unknown_option_is_a_clear_error() -> None:
    with pytest.raises(TypeError, match="unknown option"):
        cg.compile(_symbolic_model(), targets=[], min_partition=3)
