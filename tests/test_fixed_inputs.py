"""``compile(..., input_shapes=...)``: free dimensions fixed, so the tracer's shape arithmetic folds away.

The model below is what torch's tracer writes around an STFT and a ``squeeze(dim)`` (Silero
VAD's pattern): pads computed as ``Concat(constant, ConstantOfShape(...))``, and an ``If`` on
``Equal(Gather(Shape(x), 2), 1)`` whose branches differ in rank, all inside an outer If.
"""

from __future__ import annotations

import logging
import pathlib

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

import codegraft as cg
from codegraft.core.options import CompileOptions
from codegraft.errors import InputError, OptionError
from codegraft.frontend.fixed_inputs import fix_input_shapes
from codegraft.testing import SubsetBackend, assert_close, run_onnxruntime

_INT = TensorProto.INT64


def _const(name: str, values: list[int]) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.array(values, np.int64), name))


def _traced_branch(tag: str, *, invalid_when_fixed: bool = False) -> onnx.GraphProto:
    """Pad by computed pads, unsqueeze, ``squeeze(2) if u.shape[2] == 1 else u``, Relu."""
    nodes = [
        _const(f"{tag}_two", [2]),
        helper.make_node("ConstantOfShape", [f"{tag}_two"], [f"{tag}_fill"],
                         value=numpy_helper.from_array(np.array([0], np.int64))),
        _const(f"{tag}_front", [0, 3]),
        helper.make_node("Concat", [f"{tag}_front", f"{tag}_fill"], [f"{tag}_pads"], axis=0),
        helper.make_node("Pad", ["x", f"{tag}_pads"], [f"{tag}_xp"]),
        _const(f"{tag}_axis1", [1]),
        helper.make_node("Unsqueeze", [f"{tag}_xp", f"{tag}_axis1"], [f"{tag}_u"]),
        helper.make_node("Shape", [f"{tag}_u"], [f"{tag}_shape"]),
        _const(f"{tag}_two_i", [2]),
        helper.make_node("Gather", [f"{tag}_shape", f"{tag}_two_i"], [f"{tag}_len"], axis=0),
        _const(f"{tag}_one", [1]),
        helper.make_node("Equal", [f"{tag}_len", f"{tag}_one"], [f"{tag}_eq"]),
        _const(f"{tag}_zero_i", [0]),
        helper.make_node("Squeeze", [f"{tag}_eq", f"{tag}_zero_i"], [f"{tag}_cond"]),
        helper.make_node(
            "If", [f"{tag}_cond"], [f"{tag}_picked"], name=f"{tag}_squeeze_if",
            then_branch=helper.make_graph(
                [_const(f"{tag}_ax2", [2]), helper.make_node("Squeeze", [f"{tag}_u", f"{tag}_ax2"], [f"{tag}_sq"])],
                f"{tag}_then", [], [helper.make_tensor_value_info(f"{tag}_sq", TensorProto.FLOAT, None)],
            ),
            else_branch=helper.make_graph(
                [helper.make_node("Identity", [f"{tag}_u"], [f"{tag}_id"])],
                f"{tag}_else", [], [helper.make_tensor_value_info(f"{tag}_id", TensorProto.FLOAT, None)],
            ),
        ),
        helper.make_node("Relu", [f"{tag}_picked"], [f"{tag}_r"]),
        helper.make_node("Sigmoid", [f"{tag}_r"], [f"{tag}_s"]),
        helper.make_node("ReduceSum", [f"{tag}_s"], [f"{tag}_out"], keepdims=0),
    ]
    if invalid_when_fixed:  # a MatMul that fits 4 columns only: x of 5 columns cannot take it
        nodes += [
            helper.make_node("Constant", [], [f"{tag}_w"], value=numpy_helper.from_array(np.ones((4, 3), np.float32))),
            helper.make_node("MatMul", ["x", f"{tag}_w"], [f"{tag}_mm"]),
            helper.make_node("ReduceSum", [f"{tag}_mm"], [f"{tag}_mms"], keepdims=0),
            helper.make_node("Add", [f"{tag}_out", f"{tag}_mms"], [f"{tag}_final"]),
        ]
    out = f"{tag}_final" if invalid_when_fixed else f"{tag}_out"
    return helper.make_graph(nodes, tag, [], [helper.make_tensor_value_info(out, TensorProto.FLOAT, [])])


def _traced_model(*, invalid_else: bool = False) -> onnx.ModelProto:
    graph = helper.make_graph(
        [
            helper.make_node("If", ["flag"], ["y"], name="outer", then_branch=_traced_branch("t"),
                             else_branch=_traced_branch("e", invalid_when_fixed=invalid_else)),
        ],
        "traced",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "samples"]),
         helper.make_tensor_value_info("flag", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _ifs(exe: cg.Executable) -> str:
    return "; ".join(p.bodies for p in exe.report().partitions if p.bodies)


_ELEMENTWISE = SubsetBackend("acc", {"Relu", "Sigmoid", "ReduceSum", "Pad", "Unsqueeze", "Squeeze", "Add", "MatMul"})


@pytest.mark.parametrize("flag", [True, False])
def test_fixed_shapes_fold_the_shape_ifs_and_keep_the_results(flag: bool) -> None:
    model = _traced_model()
    feeds = {"x": np.random.default_rng(0).standard_normal((1, 5)).astype(np.float32), "flag": np.array(flag)}
    expected = run_onnxruntime(model, feeds)
    free = cg.compile(model, targets=[_ELEMENTWISE])
    fixed = cg.compile(model, targets=[_ELEMENTWISE], input_shapes={"x": (1, 5)})
    assert_close(free.run(feeds), expected)
    assert_close(fixed.run(feeds), expected)
    # Free: each branch keeps its squeeze-If (a control partition inside); fixed: folded away.
    assert "codegraft.control" in _ifs(free)
    assert "codegraft.control" not in _ifs(fixed)
    assert "acc" in _ifs(fixed)
    assert any("input shapes fixed: x=1x5" in note for note in fixed.report().notes)


def test_fixed_shapes_make_the_executable_take_only_them() -> None:
    exe = cg.compile(_traced_model(), targets=[_ELEMENTWISE], input_shapes={"x": [1, 5]})
    assert exe.inputs[0].shape == (1, 5)
    with pytest.raises(InputError, match="x"):
        exe.run({"x": np.zeros((1, 6), np.float32), "flag": np.array(True)})


def test_a_branch_invalid_at_the_fixed_shapes_fails_only_when_taken(tmp_path: pathlib.Path, caplog) -> None:
    model = _traced_model(invalid_else=True)
    feeds = {"x": np.random.default_rng(1).standard_normal((1, 5)).astype(np.float32), "flag": np.array(True)}
    with caplog.at_level(logging.WARNING, logger="codegraft"):
        exe = cg.compile(model, targets=[_ELEMENTWISE], input_shapes={"x": (1, 5)})
    assert "outer.else_branch cannot run at the fixed input shapes" in caplog.text
    assert "outer.else_branch: cannot run at these input shapes" in _ifs(exe)
    exe.save(tmp_path / "m.cgx")
    loaded = cg.load_executable(tmp_path / "m.cgx", backends=[_ELEMENTWISE])
    for runner in (exe, loaded):
        assert_close(runner.run(feeds), run_onnxruntime(model, feeds))
        with pytest.raises(InputError, match="'outer' took its else_branch, which cannot run at the input shapes"):
            runner.run({**feeds, "flag": np.array(False)})


def test_a_named_dimension_fixed_once_holds_in_every_input() -> None:
    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["y"])], "g",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["batch", 4]),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
    )
    model = ir.serde.deserialize_model(helper.make_model(graph))
    note = fix_input_shapes(model, CompileOptions(input_shapes={"a": (3, 4)}).input_shapes)
    assert [tuple(v.shape) for v in model.graph.inputs] == [(3, 4), (3, 4)]
    assert note == "input shapes fixed: a=3x4 (by a dimension's name also: b)"


@pytest.mark.parametrize(
    ("shapes", "message"),
    [
        ({"nope": (1, 5)}, r"input_shapes names 'nope', which is not an input of the model \(its inputs: 'x', 'flag'"),
        ({"x": (1, 5, 1)}, r"input_shapes\['x'\] has 3 dimensions; the model declares 2: \[batch, samples\]"),
        ({"flag": (1,)}, r"input_shapes\['flag'\] has 1 dimensions; the model declares 0"),
        ({"x": (1, -5)}, r"input_shapes\['x'\]: sizes must be integers >= 0"),
        ({"x": "1x5"}, r"input_shapes\['x'\] must be a sequence of sizes"),
        ({"x": (1.5, 5)}, r"sizes must be integers"),
        ([1, 5], r"input_shapes must map input names to shapes"),
    ],
)
def test_bad_input_shapes_name_what_is_wrong(shapes: object, message: str) -> None:
    with pytest.raises(OptionError, match=message):
        cg.compile(_traced_model(), targets=[_ELEMENTWISE], input_shapes=shapes)


def test_sizes_that_contradict_the_model_are_refused() -> None:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["a"], ["y"]), helper.make_node("Relu", ["b"], ["z"])], "g",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["n", 4]),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, ["n", 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, ["n", 2])],
    )
    model = helper.make_model(graph)
    with pytest.raises(OptionError, match=r"input_shapes\['a'\]: dimension 1 is fixed to 4 in the model, not 5"):
        cg.compile(model, input_shapes={"a": (1, 5)})
    # one name given two sizes where the model's shapes need one: a mistake, said so
    added = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["y"])], "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["n", 4]) for n in ("a", "b")],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])],
    )
    with pytest.raises(OptionError, match=r"dimension 'n' is given different sizes \(a=3x4; b=2x4\), and the "
                                          r"model's shapes do not hold with them: .*Incompatible dimensions"):
        cg.compile(helper.make_model(added), input_shapes={"a": (3, 4), "b": (2, 4)})


def test_a_dimension_name_reused_for_different_sizes_fixes_each_input_given() -> None:
    # Robust Video Matting declares its frame and its four recurrent states all
    # [batch_size, channels, height, width]; onnxruntime runs it, and so does a shape per input
    graph = helper.make_graph(
        [helper.make_node("Relu", ["a"], ["y"]), helper.make_node("Relu", ["b"], ["z"]),
         helper.make_node("Relu", ["c"], ["w"])], "g",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["n", "k"]),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, ["n", "k"]),
         helper.make_tensor_value_info("c", TensorProto.FLOAT, ["n", "k"])],
        [helper.make_tensor_value_info(v, TensorProto.FLOAT, None) for v in ("y", "z", "w")],
    )  # fmt: skip
    model = helper.make_model(graph)
    exe = cg.compile(model, input_shapes={"a": (1, 4), "b": (2, 4)})
    assert [spec.shape for spec in exe.inputs] == [(1, 4), (2, 4), ("n", 4)]  # k=4 reaches c; n fixes nothing
    assert any("taken as independent: n" in note for note in exe.report().notes)
    rng = np.random.default_rng(0)
    feeds = {"a": rng.standard_normal((1, 4)), "b": rng.standard_normal((2, 4)), "c": rng.standard_normal((3, 4))}
    feeds = {k: v.astype(np.float32) for k, v in feeds.items()}
    got = exe.run(feeds)
    for name, out in (("a", "y"), ("b", "z"), ("c", "w")):
        np.testing.assert_array_equal(got[out], np.maximum(feeds[name], 0))


def test_the_command_line_compiles_for_a_shape(tmp_path: pathlib.Path) -> None:
    from typer.testing import CliRunner

    from codegraft.cli.main import app

    model = tmp_path / "traced.onnx"
    onnx.save(_traced_model(), model)
    artifact = tmp_path / "traced.cgx"
    runner = CliRunner()
    result = runner.invoke(app, ["compile", str(model), "--shape", "x=1x5", "-o", str(artifact), "-q"])
    assert result.exit_code == 0, result.output
    loaded = cg.load_executable(artifact)
    assert loaded.inputs[0].shape == (1, 5)
    feeds = {"x": np.ones((1, 5), np.float32), "flag": np.array(False)}
    assert_close(loaded.run(feeds), run_onnxruntime(_traced_model(), feeds))
    result = runner.invoke(app, ["compile", str(model), "--shape", "y=1x5", "-o", str(artifact), "-q"])
    assert result.exit_code == 2
    assert "input_shapes names 'y', which is not an input of the model" in result.output
    assert "Traceback" not in result.output


# --- input_values: inputs bound to a value ------------------------------------------------


def test_a_bound_input_folds_its_if_away_and_refuses_another_value(tmp_path: pathlib.Path) -> None:
    model = _traced_model(invalid_else=True)
    x = np.random.default_rng(2).standard_normal((1, 5)).astype(np.float32)
    exe = cg.compile(model, targets=[_ELEMENTWISE], input_shapes={"x": (1, 5)}, input_values={"flag": True})
    assert not _ifs(exe), "the outer If (on flag) and the shape Ifs are gone"
    assert {p.backend for p in exe.report().partitions} == {"acc"}
    assert any(note == "inputs bound: flag=True" for note in exe.report().notes)
    assert exe.inputs[1].describe() == "bool[] = True"
    exe.save(tmp_path / "m.cgx")
    loaded = cg.load_executable(tmp_path / "m.cgx", backends=[_ELEMENTWISE])
    expected = run_onnxruntime(model, {"x": x, "flag": np.array(True)})
    for runner in (exe, loaded):
        assert_close(runner.run({"x": x, "flag": np.array(True)}), expected)
        assert_close(runner.run(x, True), expected)  # positionally too: the input is still there
        with pytest.raises(InputError, match=r"input 'flag' is False, but the model was compiled with it bound"):
            runner.run({"x": x, "flag": np.array(False)})


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"nope": 1}, r"input_values names 'nope', which is not an input of the model"),
        ({"flag": "yes"}, r"input_values\['flag'\] must be a number or an array of numbers"),
        ({"flag": np.zeros(65)}, r"input_values\['flag'\] has 65 elements; at most 64 can be bound"),
        ({"flag": 2}, r"input_values\['flag'\]: 2 is not a bool value"),
        ({"flag": [True, False]}, r"input_values\['flag'\] has shape \[2\]; the model declares \[\]"),
        ("flag=1", r"input_values must map input names to values"),
    ],
)
def test_bad_input_values_name_what_is_wrong(values: object, message: str) -> None:
    with pytest.raises(OptionError, match=message):
        cg.compile(_traced_model(), targets=[_ELEMENTWISE], input_values=values)


def test_a_bound_value_takes_the_inputs_dtype_and_fixed_shape() -> None:
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "k"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]),
         helper.make_tensor_value_info("k", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    exe = cg.compile(model, input_values={"k": 0.1})  # a float64 scalar: float32, shape [1]
    assert exe.inputs[1].bound is not None and exe.inputs[1].bound.dtype == np.float32
    assert exe.inputs[1].shape == (1,)
    x = np.array([1.0, 2.0], np.float32)
    assert_close(exe.run({"x": x, "k": np.array([0.1], np.float32)}), {"y": x * np.float32(0.1)})


def test_the_artifact_refuses_a_bound_value_that_does_not_fit_its_shape(tmp_path: pathlib.Path) -> None:
    from codegraft.errors import ArtifactError
    from codegraft.runtime.artifact_schema import validate_header

    header = {"format_version": 1, "codegraft_version": "x", "outputs": [], "steps": [], "constants": [],
              "native_code": False, "report": {},
              "inputs": [{"name": "sr", "dtype": "int64", "shape": [], "bound": [1, 2]}]}
    with pytest.raises(ArtifactError, match=r"inputs\[0\]\.bound.*holds 2 values; its shape \[\] holds 1"):
        validate_header(header, payload_size=0, where="m.cgx", control_backend="codegraft.control")


def test_the_command_line_binds_a_value(tmp_path: pathlib.Path) -> None:
    from typer.testing import CliRunner

    from codegraft.cli.main import app

    model = tmp_path / "traced.onnx"
    onnx.save(_traced_model(), model)
    artifact = tmp_path / "traced.cgx"
    runner = CliRunner()
    result = runner.invoke(app, ["compile", str(model), "--shape", "x=1x5", "--value", "flag=1", "-o", str(artifact),
                                 "-q"])  # fmt: skip
    assert result.exit_code == 0, result.output
    loaded = cg.load_executable(artifact)
    assert loaded.inputs[1].bound is not None and bool(loaded.inputs[1].bound) is True
    result = runner.invoke(app, ["compile", str(model), "--value", "flag=yes", "-o", str(artifact), "-q"])
    assert result.exit_code == 2 and "--value 'flag=yes': values must be numbers" in result.output


def test_the_report_says_when_fixed_shapes_or_values_could_fold_if_nodes() -> None:
    free = cg.compile(_traced_model(), targets=[_ELEMENTWISE])
    hint = next(note for note in free.report().notes if "If node" in note)
    assert hint.startswith("3 If nodes remain") and "free here: x [batch, samples]" in hint
    shaped = cg.compile(_traced_model(), targets=[_ELEMENTWISE], input_shapes={"x": (1, 5)})
    assert any(n.startswith("1 If node remains") and "free here" not in n for n in shaped.report().notes)
    bound = cg.compile(_traced_model(), targets=[_ELEMENTWISE], input_shapes={"x": (1, 5)}, input_values={"flag": 1})
    assert not any("If node" in note for note in bound.report().notes)


def test_inspect_shows_the_partitions_at_fixed_shapes_and_values(tmp_path: pathlib.Path) -> None:
    from typer.testing import CliRunner

    from codegraft.cli.main import app

    model = tmp_path / "traced.onnx"
    onnx.save(_traced_model(), model)
    runner = CliRunner()
    free = runner.invoke(app, ["inspect", str(model), "-t", "c", "--json", "-q"])
    fixed = runner.invoke(app, ["inspect", str(model), "-t", "c", "--json", "-q", "--shape", "x=1x5",
                                "--value", "flag=1"])  # fmt: skip
    assert free.exit_code == 0 and fixed.exit_code == 0, free.output + fixed.output
    import json

    def backends(result) -> list[str]:  # type: ignore[no-untyped-def]
        data = json.loads(result.stdout[: result.stdout.rindex("}") + 1])
        return [p["backend"] for p in data["partitions"]]

    assert "codegraft.control" in backends(free)
    assert backends(fixed) == ["c"]


def test_only_an_artifact_with_a_bound_input_takes_the_new_format_version(tmp_path: pathlib.Path) -> None:
    import struct

    from codegraft.runtime.artifact import MAGIC

    def version(exe: cg.Executable, name: str) -> int:
        exe.save(tmp_path / name)
        return int(struct.unpack_from("<I", (tmp_path / name).read_bytes(), len(MAGIC))[0])

    shaped = cg.compile(_traced_model(), targets=[_ELEMENTWISE], input_shapes={"x": (1, 5)})
    bound = cg.compile(_traced_model(), targets=[_ELEMENTWISE], input_values={"flag": True})
    # version 1 stays readable by every codegraft; a reader that would ignore a binding refuses 2
    assert (version(shaped, "a.cgx"), version(bound, "b.cgx")) == (1, 2)
    assert cg.load_executable(tmp_path / "b.cgx", backends=[_ELEMENTWISE]).inputs[1].bound is not None
