"""The vendor API as a new vendor meets it: the rules it relies on, each tested.

Pattern members are asked ``supports()``; composites carry their captures; one decline per
node and target; dtype declines say where they come from; the report counts composites; the
backend contract is checked at registration; the README's example backend and the backend.py
walk-through run as written; ``codegraft.testing`` is a clean facade with ``check_ops``.
"""

from __future__ import annotations

import pathlib
import re

import numpy as np
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

import codegraft as cg
import codegraft.backend
import codegraft.testing
from codegraft.patterns import library
from codegraft.testing import SubsetBackend, assert_close, random_feeds, run_onnxruntime

README = pathlib.Path(__file__).parent.parent / "README.md"


def _conv_model(group: int = 1) -> object:
    """x -> Conv(3x3, ``group``) + bias -> Relu -> Conv 1x1 -> Relu."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal((8, 8 // group, 3, 3)).astype(np.float32), "w0"),
        numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b0"),
        numpy_helper.from_array(rng.standard_normal((4, 8, 1, 1)).astype(np.float32), "w1"),
    ]
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], name="conv0", group=group, pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["c0"], ["r0"], name="relu0"),
            helper.make_node("Conv", ["r0", "w1"], ["c1"], name="conv1"),
            helper.make_node("Relu", ["c1"], ["y"], name="relu1"),
        ],
        "convs",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 6, 6])],
        initializer=inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


class _NoGroups(SubsetBackend):
    """Declines grouped Conv in ``supports()`` but claims ``conv_bias_act`` without a check."""

    def supports(self, node):  # type: ignore[no-untyped-def]
        if node.op_type == "Conv" and node.attributes.get_int("group", 1) != 1:
            return cg.Support.no("Conv: group>1 not supported")
        return super().supports(node)


def test_pattern_members_are_asked_supports() -> None:
    model = _conv_model(group=2)
    acc = _NoGroups("acc", {"Conv", "Relu"}, rules=(library.CONV_BIAS_ACT.rule(),))
    exe = cg.compile(model, targets=[acc])
    nodes = {n.name: n for n in exe.report().nodes}
    assert nodes["conv0"].backend == "onnxruntime" and nodes["conv0"].composite is None
    assert nodes["conv1"].composite and nodes["relu1"].composite  # the ungrouped pair is fused
    assert nodes["relu0"].backend == "acc" and nodes["relu0"].composite is None  # alone, not fused
    assert [r for b, r in nodes["conv0"].declined if b == "acc"] == ["Conv: group>1 not supported"]
    feeds = random_feeds(model)
    assert_close(exe.run(feeds), run_onnxruntime(model, feeds))


def test_one_decline_per_node_and_target() -> None:
    model = _conv_model(group=2)
    rule = library.CONV_BIAS_ACT.rule(check=lambda captures: cg.Support.no("no fusing today"))
    acc = _NoGroups("acc", {"Conv", "Relu"}, rules=(rule,))
    report = cg.compile(model, targets=[acc]).report()
    conv0 = next(n for n in report.nodes if n.name == "conv0")
    # once: the pattern's member decline repeats the supports() reason, so it is not added
    assert [r for b, r in conv0.declined if b == "acc"] == ["Conv: group>1 not supported"]
    counted = [c for b, op, r, c in report.decline_reasons() if b == "acc" and op == "Conv" and "group>1" in r]
    assert counted == [1]


def test_composites_carry_their_captures() -> None:
    model = _conv_model()
    seen: list[dict[str, object]] = []

    class Acc(SubsetBackend):
        def compile(self, partition):  # type: ignore[no-untyped-def]
            for composite in partition.composites:
                seen.append(partition.captures(composite))
            return super().compile(partition)

    exe = cg.compile(model, targets=[Acc("acc", {"Conv", "Relu"}, rules=(library.CONV_BIAS_ACT.rule(),))])
    assert len(seen) == 2
    first = next(c for c in seen if c["conv"].name == "conv0")  # type: ignore[attr-defined]
    assert isinstance(first["conv"], ir.Node) and isinstance(first["act"], ir.Node)
    assert first["act"].op_type == "Relu"  # type: ignore[attr-defined]
    assert isinstance(first["b"], ir.Value) and first["b"].name == "b0"  # type: ignore[attr-defined]
    assert first["w"].const_value is not None  # type: ignore[attr-defined]
    feeds = random_feeds(model)
    assert_close(exe.run(feeds), run_onnxruntime(model, feeds))


def test_composites_survive_save_and_load(tmp_path: pathlib.Path) -> None:
    model = _conv_model()
    exe = cg.compile(model, targets=[SubsetBackend("acc", {"Conv", "Relu"}, rules=(library.CONV_BIAS_ACT.rule(),))])
    exe.save(tmp_path / "m.cgx")
    loaded = cg.load_executable(tmp_path / "m.cgx", backends=[SubsetBackend("acc", set())])
    captures = [c.captures for step in loaded.steps for c in step.composites]
    assert captures and all({"conv", "x", "w"} <= {c.name for c in caps} for caps in captures)


def test_dtype_decline_names_the_declared_dtypes_and_the_value() -> None:
    class Float32Only(SubsetBackend):
        def __init__(self) -> None:
            super().__init__("f32", {"Reshape", "Relu"})
            self.capabilities = cg.Capabilities(dtypes=frozenset({"float32"}))

    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshape")],
        "r",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 2])],
        initializer=[numpy_helper.from_array(np.array([3, 2], np.int64), "shape")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    report = cg.compile(model, targets=[Float32Only()], passes=()).report()
    (reason,) = [r for n in report.nodes for b, r in n.declined if b == "f32"]
    assert reason == "Reshape: input value 'shape' is int64, not in f32's declared dtypes (float32)"


def test_default_report_counts_composites() -> None:
    acc = SubsetBackend("acc", {"Conv", "Relu"}, rules=(library.CONV_BIAS_ACT.rule(),))
    exe = cg.compile(_conv_model(), targets=[acc])
    assert exe.report().composites_per_backend() == {"acc": 2}
    text = exe.report().render()
    assert "composites" in text
    row = next(line for line in text.splitlines() if line.strip("│ ").startswith("acc"))
    assert re.search(r"│\s*2\s*│", row)


def test_readme_options_table_states_the_default_min_partition_size() -> None:
    default = cg.CompileOptions().min_partition_size
    assert f"`min_partition_size={default}` | the default" in README.read_text()


def test_readme_documents_unavailable_backends_and_version() -> None:
    text = README.read_text()
    assert "BackendUnavailable" in text and "version" in text
    assert "BackendUnavailable" in (codegraft.backend.__doc__ or "")


def test_a_backend_without_name_is_named_at_registration() -> None:
    class Nameless:
        capabilities = cg.Capabilities()

        def supports(self, node):  # type: ignore[no-untyped-def]
            return cg.Support.yes()

    with pytest.raises(cg.BackendError, match=r"lacks: name \(a str\), compile\(\), load\(\)"):
        cg.compile(_conv_model(), targets=[Nameless()])  # type: ignore[list-item]


def test_testing_facade_exports_no_modules() -> None:
    namespace: dict[str, object] = {}
    exec("from codegraft.testing import *", namespace)
    exported = set(namespace) - {"__builtins__"}
    assert exported == set(codegraft.testing.__all__)
    assert not {"np", "onnx", "pathlib"} & exported
    assert {"check_ops", "light_model", "SubsetBackend"} <= exported


def test_check_ops_reports_declines_passes_and_wrong_results() -> None:
    acc = SubsetBackend("acc", {"Relu", "Conv"})
    results = {r.case: r for r in codegraft.testing.check_ops(acc)}
    assert results["Relu"].passed and results["Conv depthwise 3x3"].passed
    assert not results["Softmax last axis"].placed
    assert "Softmax is not in acc's op set" in results["Softmax last axis"].reason

    class Wrong(SubsetBackend):  # runs Relu as Sigmoid
        def compile(self, partition):  # type: ignore[no-untyped-def]
            for node in partition.model.graph:
                node.op_type = "Sigmoid"
            return super().compile(partition)

    relu_case = [c for c in codegraft.testing.OP_CASES if c.name == "Relu"]
    (wrong,) = codegraft.testing.check_ops(Wrong("bad", {"Relu"}), relu_case)
    assert wrong.placed and not wrong.passed and "WRONG" in str(wrong)


def _python_block_after(text: str, heading: str) -> str:
    section = text[text.index(heading) :]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None
    return match.group(1)


def test_readme_example_backend_runs_as_written() -> None:
    namespace: dict[str, object] = {}
    exec(_python_block_after(README.read_text(), "## Write a backend"), namespace)
    backend = namespace["MyBackend"]()  # type: ignore[operator]
    model = _conv_model(group=2)
    exe = cg.compile(model, targets=[backend])
    nodes = {n.name: n for n in exe.report().nodes}
    assert nodes["conv0"].backend == "onnxruntime"  # the grouped Conv, declined as supports() says
    assert nodes["conv1"].backend == "mine" and nodes["conv1"].composite
    feeds = random_feeds(model)
    assert_close(exe.run(feeds), run_onnxruntime(model, feeds))


def test_backend_module_walkthrough_runs() -> None:
    doc = codegraft.backend.__doc__ or ""
    block = doc[doc.index("Walking a partition") :].split("::", 1)[1]
    code = "\n".join(line[4:] for line in block.splitlines() if line.strip())

    class Walker(SubsetBackend):
        def compile(self, partition):  # type: ignore[no-untyped-def]
            exec(code, {"partition": partition, "print": lambda *a: None})
            return super().compile(partition)

    cg.compile(_conv_model(), targets=[Walker("walk", {"Conv", "Relu"}, rules=(library.CONV_BIAS_ACT.rule(),))])


def test_matcher_names_the_declined_member() -> None:
    from codegraft.patterns import find_composites

    graph = ir.from_proto(_conv_model(group=2)).graph

    def no_groups(node: ir.Node) -> cg.Support:
        grouped = node.op_type == "Conv" and node.attributes.get_int("group", 1) != 1
        return cg.Support.no("group>1") if grouped else cg.Support.yes()

    result = find_composites(graph, [library.CONV_BIAS_ACT.rule()], member_check=no_groups)
    assert [[n.name for n in m.nodes] for m in result] == [["conv1", "relu1"]]
    relu0 = next(n for n in graph if n.name == "relu0")
    assert "pattern conv_bias_act: member conv0 (Conv) declined: group>1" in result.reasons(relu0)
