"""Compile time at scale (issue 15): idle passes skipped without changing the result, one
report JSON text, time per stage, progress as stages go.  No wall-clock limits here: the
timings live in ``bench/compile_scale.py``."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from bench.compile_scale import ladder
from codegraft.compiler.inspect import inspect_model
from codegraft.frontend import model
from codegraft.frontend.model import import_model
from codegraft.passes import PASS_NAMES, PassOptions, _nothing_to_do, pipeline, run_common_passes
from codegraft.report.report import NodeReport, PartitionReport, PassReport, PlacementReport, Report, StageReport
from codegraft.testing import light_model


def _passes_both_ways(
    proto: onnx.ModelProto, options: PassOptions, monkeypatch: pytest.MonkeyPatch
) -> tuple[tuple[bytes, list[object]], tuple[bytes, list[object]]]:
    """(model bytes, records) with the nothing-to-do scans, and with every pass called."""
    results = []
    for scans in (True, False):
        with monkeypatch.context() as patch:
            if not scans:
                patch.setattr(_nothing_to_do, "can_prove", lambda model: False)
            model = import_model(proto)
            records = [dataclasses.astuple(r) for r in run_common_passes(model, options).records]
            results.append((_canonical(ir.to_proto(model)), records))
    return results[0], results[1]


def _canonical(proto: onnx.ModelProto) -> bytes:
    """The model's bytes with initializers (and their value infos) in name order: onnx-ir's
    shape inference pass re-registers initializers over 1 KB last, so skipping it keeps the
    import's order."""
    for field in ("initializer", "value_info"):
        items = sorted(getattr(proto.graph, field), key=lambda item: item.name)
        proto.graph.ClearField(field)
        getattr(proto.graph, field).extend(items)
    return proto.SerializeToString(deterministic=True)


_OPS = ("Relu", "Identity", "Cast", "Transpose", "Dropout", "Expand", "Shape", "Add", "Mul", "Sub", "Div", "Neg")


# monkeypatch is used through .context(), undone after each example
@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=st.data(), options=st.sampled_from([PassOptions(), *(PassOptions.from_names([n]) for n in PASS_NAMES)]))
def test_skipping_idle_passes_changes_nothing(
    data: st.DataObject, options: PassOptions, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Random graphs with every kind of pass work (and none): the scans may skip a pass only
    where calling it would have changed nothing."""
    inits = [numpy_helper.from_array(np.array(v, np.float32), n) for n, v in (("one", 1.0), ("zero", 0.0),
                                                                               ("c", [0.5, -1.0, 2.0]))]
    inits.append(numpy_helper.from_array(np.array([3, 3], np.int64), "shape"))
    values, nodes = ["x"], []
    for index in range(data.draw(st.integers(1, 10), label="length")):
        a = data.draw(st.sampled_from(values), label="a")
        op = data.draw(st.sampled_from(_OPS), label="op")
        out = f"v{index}"
        if op in ("Add", "Mul", "Sub", "Div"):
            b = data.draw(st.sampled_from([*values, "one", "zero", "c"]), label="b")
            nodes.append(helper.make_node(op, [a, b], [out]))
        elif op == "Cast":
            nodes.append(helper.make_node(op, [a], [out], to=TensorProto.FLOAT))
        elif op == "Transpose":
            nodes.append(helper.make_node(op, [a], [out], perm=data.draw(st.sampled_from([[0, 1], [1, 0]]))))
        elif op == "Expand":
            nodes.append(helper.make_node(op, [a, "shape"], [out]))
        elif op == "Shape":
            nodes.append(helper.make_node("Shape", [a], [f"s{index}"]))
            nodes.append(helper.make_node("Reshape", [a, f"s{index}"], [out]))
        else:
            nodes.append(helper.make_node(op, [a], [out]))
        if data.draw(st.booleans(), label="duplicate"):
            nodes.append(helper.make_node(nodes[-1].op_type, list(nodes[-1].input), [f"d{index}"],
                                          **{a.name: helper.get_attribute_value(a) for a in nodes[-1].attribute}))
        values.append(out)
    if data.draw(st.booleans(), label="constant-only node"):
        nodes.append(helper.make_node("Add", ["c", "one"], ["k"]))
        nodes.append(helper.make_node("Add", [values[-1], "k"], ["v_k"]))
        values.append("v_k")
    produced = [o for n in nodes for o in n.output if not o.startswith("s")]  # not Shape's int64
    outputs = sorted({values[-1], *data.draw(st.sets(st.sampled_from(produced), max_size=2), label="outs")})
    graph = helper.make_graph(
        nodes, "random", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 3])],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs], inits,
    )
    proto = onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    scanned, called = _passes_both_ways(proto, options, monkeypatch)
    assert scanned == called


@pytest.mark.parametrize("name", ["resnet50", "squeezenet"])
def test_light_models_same_with_and_without_the_scans(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    scanned, called = _passes_both_ways(light_model(name), PassOptions(), monkeypatch)
    assert scanned == called


def test_ladder_calls_no_pass_at_all(monkeypatch: pytest.MonkeyPatch) -> None:
    """On the benchmark's ladder every pass proves it has nothing to do: no library pass runs."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a library pass was called on a graph it has nothing to do for")

    monkeypatch.setattr(pipeline, "_PASSES", {name: refuse for name in PASS_NAMES})
    model = import_model(ladder(300))
    records = run_common_passes(model).records
    assert [r.name for r in records] == list(PASS_NAMES)
    assert all(r.nodes_before == r.nodes_after == len(model.graph) for r in records)
    assert records[0].detail == f"shapes known for {len(model.graph)} of {len(model.graph)} values"


def test_ladder_is_one_c_partition_with_gates() -> None:
    model = ladder(200)
    ops = {n.op_type for n in model.graph.node}
    assert ops == {"Conv", "Add", "Relu", "Sigmoid", "Mul"}
    assert 200 <= len(model.graph.node) < 205
    report = inspect_model(model, ["c"]).report
    assert [p.backend for p in report.partitions] == ["c"]


_TEXT = st.text(alphabet=st.characters(codec="utf-8"), max_size=8)


@settings(max_examples=50, deadline=None, derandomize=True)
@given(
    st.lists(st.tuples(_TEXT, st.one_of(st.none(), _TEXT), st.lists(st.tuples(_TEXT, _TEXT), max_size=2)), max_size=5),
    st.lists(st.tuples(_TEXT, st.floats(allow_nan=True, allow_infinity=True)), max_size=3),
)
def test_report_json_is_the_text_json_dumps_gives(
    nodes: list[tuple[str, str | None, list[tuple[str, str]]]], timings: list[tuple[str, float]]
) -> None:
    report = Report(
        ("c", "openvino"), "onnxruntime",
        tuple(NodeReport(name, "Conv", "c", "p0", composite, tuple(declined)) for name, composite, declined in nodes),
        (PartitionReport("p0", "c", 3, ("x",), ("y", "z"), fallback_error="boom\n", stored_bytes=12),),
        (PassReport("cse", 4, 3, "merged 1"),),
        (PlacementReport("r0", "c", tuple(timings), "why"),),
        ("a note",),
        (StageReport("import", 0.25),),
    )
    assert report.to_json() == json.dumps(dataclasses.asdict(report), indent=1)
    assert Report.from_json(report.to_json()).to_json() == report.to_json()


def test_inspect_reports_time_per_stage_and_tells_progress() -> None:
    heard: list[tuple[str, int, int]] = []
    report = inspect_model(ladder(100), ["c"], progress=lambda *event: heard.append(event)).report
    stages = [s.name for s in report.stages]
    assert stages == ["import", "passes", "annotate", "partition", "report"]
    assert all(s.seconds >= 0 for s in report.stages)
    assert [e[0] for e in heard if e[1] == 0] == stages  # each stage starts once, in order
    ends = [e[0] for e in heard if e[1] == e[2]]
    assert list(dict.fromkeys(ends)) == stages
    assert "time per stage" in report.render()
    assert Report.from_json(report.to_json()).stages == report.stages


def _model_with_value_infos() -> onnx.ModelProto:
    """A graph whose value infos take every path of the import's typed fast path: plain ones,
    one with a doc string, one with metadata, a denotation, a repeated name, one naming a
    graph output, an initializer and a graph input, and a value without a shape."""
    nodes = [
        helper.make_node("Relu", ["x"], ["a"]),
        helper.make_node("Add", ["a", "w"], ["b"]),
        helper.make_node("Sigmoid", ["b"], ["c"]),
        helper.make_node("Mul", ["b", "c"], ["d"]),
        helper.make_node("Neg", ["d"], ["e"]),
        helper.make_node("Relu", ["e"], ["y"]),
        helper.make_node("Relu", ["e"], ["f"]),
    ]
    infos = [
        helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, 4]),
        helper.make_tensor_value_info("b", TensorProto.FLOAT, [1, 4], doc_string="noted"),
        helper.make_tensor_value_info("c", TensorProto.FLOAT, ["n", 4]),
        helper.make_tensor_value_info("d", TensorProto.FLOAT, [1, 4]),
        helper.make_tensor_value_info("d", TensorProto.FLOAT, [1, "m"]),  # repeated: the last counts
        helper.make_tensor_value_info("e", TensorProto.FLOAT, None),  # no shape
        helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "q"]),  # a graph output
        helper.make_tensor_value_info("w", TensorProto.FLOAT, [4]),  # an initializer
        helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "p"]),  # a graph input
        helper.make_tensor_value_info("f", TensorProto.FLOAT, [1, 4]),
    ]
    infos[2].type.tensor_type.shape.dim[1].denotation = "DATA_CHANNEL"
    helper.set_metadata_props(infos[-1], {"k": "v"})
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [numpy_helper.from_array(np.ones(4, np.float32), "w")], value_info=infos,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _denotations(shape: ir.Shape | None) -> list[str | None] | None:
    return None if shape is None else [shape.get_denotation(i) for i in range(len(shape))]


@pytest.mark.parametrize("make", [_model_with_value_infos, lambda: ladder(200), lambda: light_model("squeezenet")])
def test_import_reads_value_types_as_onnx_ir_does(make) -> None:  # type: ignore[no-untyped-def]
    proto = make()
    if make is not _model_with_value_infos:
        proto = onnx.shape_inference.infer_shapes(proto)
    ours = model._from_proto(onnx.ModelProto.FromString(proto.SerializeToString()))
    theirs = ir.from_proto(proto)

    def described(m: ir.Model) -> list[tuple[object, ...]]:
        values = [*m.graph.inputs, *m.graph.initializers.values(), *(v for n in m.graph for v in n.outputs)]
        return [(v.name, v.type, v.shape, _denotations(v.shape), v.doc_string, dict(v.metadata_props)) for v in values]

    assert described(ours) == described(theirs)
    assert ir.to_proto(ours).SerializeToString(deterministic=True) == ir.to_proto(theirs).SerializeToString(
        deterministic=True
    )
    shapes = [v.shape for n in ours.graph for v in n.outputs if v.shape is not None]
    assert all(s.frozen for s in shapes)  # shared between values, so never changed in place
