"""``codegraft compare`` and inputs (--shape, --save-inputs/--load-inputs), end to end through the CLI."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import onnx
import pytest
from typer.testing import CliRunner

from codegraft.backends import BUILTIN_BACKENDS
from codegraft.cli.main import app
from codegraft.testing import SubsetBackend
from tests.cli_util import save_small_net

runner = CliRunner()


class HardSigmoidBackend(SubsetBackend):
    """A backend with a codegen bug: it lowers Sigmoid as HardSigmoid (a cheap approximation)."""

    def compile(self, partition):  # type: ignore[no-untyped-def]
        for node in partition.model.graph:
            if node.op_type == "Sigmoid":
                node.op_type = "HardSigmoid"
        return super().compile(partition)


@pytest.fixture
def buggy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(BUILTIN_BACKENDS, "buggy", lambda: HardSigmoidBackend("buggy", {"Conv", "Relu", "Sigmoid"}))
    # Takes the Mul too, so the wrong Sigmoid is inside its partition, not at a boundary.
    monkeypatch.setitem(BUILTIN_BACKENDS, "buggy_swish",
                        lambda: HardSigmoidBackend("buggy_swish", {"Conv", "Relu", "Sigmoid", "Mul"}))


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    return save_small_net(tmp_path_factory.mktemp("compare"))


def test_compare_matching_configurations_exit_zero(model: pathlib.Path, tmp_path: pathlib.Path) -> None:
    saved = tmp_path / "inputs.npz"
    result = runner.invoke(app, ["compare", str(model), "-t", "c", "-t", "numpy_example", "-t", "c,numpy_example",
                                 "--shape", "x=2x3x16x16", "--save-inputs", str(saved), "--boundaries"])
    assert result.exit_code == 0, result.output
    assert "inputs: x float32[2, 3, 16, 16] (random, --shape)" in result.output
    for config in ("c", "numpy_example", "c,numpy_example"):
        assert f"| {config} |" in result.output
    assert "all configurations match" in result.output and "MISMATCH" not in result.output
    with np.load(saved) as archive:
        assert archive["x"].shape == (2, 3, 16, 16)


def test_compare_mismatch_exits_one_and_names_where(model: pathlib.Path, buggy: None) -> None:
    result = runner.invoke(app, ["compare", str(model), "-t", "buggy", "-t", "c"])
    assert result.exit_code == 1, result.output
    assert "| buggy | buggy x1, onnxruntime x1 | y |" in result.output and "MISMATCH" in result.output
    assert "| c | c x1 | y |" in result.output

    result = runner.invoke(app, ["compare", str(model), "-t", "buggy", "--boundaries", "--json"])
    assert result.exit_code == 1
    data = json.loads(result.stdout)
    assert not data["ok"]
    (buggy_result,) = data["results"]
    # conv1's output c1 crosses into the host partition too and is still right; s1 is the first wrong value.
    checked = {c["name"]: c["ok"] for c in buggy_result["boundaries"]}
    assert checked["c1"] and not checked["s1"]
    first = buggy_result["first_mismatch"]
    assert (first["name"], first["node"], first["backend"]) == ("s1", "sigmoid1 (Sigmoid)", "buggy")

    result = runner.invoke(app, ["compare", str(model), "-t", "buggy", "--boundaries"])
    assert "first error appears at 's1' from node sigmoid1 (Sigmoid) in partition" in result.output


def test_compare_finds_the_first_wrong_node_inside_a_partition(model: pathlib.Path, buggy: None) -> None:
    result = runner.invoke(app, ["compare", str(model), "-t", "buggy_swish", "--boundaries", "--json"])
    assert result.exit_code == 1, result.output
    (found,) = json.loads(result.stdout)["results"]
    # At the boundary the error shows at the Mul's output; inside the partition it starts at the Sigmoid.
    assert (found["first_mismatch"]["name"], found["first_mismatch"]["node"]) == ("m1", "swish1 (Mul)")
    inside = {c["node"]: c["ok"] for c in found["inside"]}
    assert inside == {"conv0 (Conv)": True, "relu0 (Relu)": True, "conv1 (Conv)": True, "sigmoid1 (Sigmoid)": False,
                      "swish1 (Mul)": False}
    assert found["first_node_mismatch"]["node"] == "sigmoid1 (Sigmoid)"
    result = runner.invoke(app, ["compare", str(model), "-t", "buggy_swish", "--boundaries"])
    assert "inside it, the first node out of tolerance: 's1' from node sigmoid1 (Sigmoid)" in result.output


def test_compare_tolerances_decide(model: pathlib.Path, buggy: None) -> None:
    result = runner.invoke(app, ["compare", str(model), "-t", "buggy", "--rtol", "10"])
    assert result.exit_code == 0, result.output


def test_saved_inputs_feed_run_and_compare_again(model: pathlib.Path, tmp_path: pathlib.Path) -> None:
    artifact = tmp_path / "small.cgx"
    saved = tmp_path / "in.npz"
    assert runner.invoke(app, ["compile", str(model), "-t", "c", "-o", str(artifact)]).exit_code == 0
    result = runner.invoke(app, ["run", str(artifact), "--random", "--shape", "x=4x3x16x16", "--seed", "7",
                                 "--save-inputs", str(saved), "--save", str(tmp_path / "a")])
    assert result.exit_code == 0, result.output
    assert "inputs: x float32[4, 3, 16, 16] (random, --shape)" in result.output
    result = runner.invoke(app, ["run", str(artifact), "--load-inputs", str(saved), "--save", str(tmp_path / "b")])
    assert result.exit_code == 0, result.output
    assert "inputs: x float32[4, 3, 16, 16] (given)" in result.output
    np.testing.assert_array_equal(np.load(tmp_path / "a" / "y.npy"), np.load(tmp_path / "b" / "y.npy"))
    result = runner.invoke(app, ["compare", str(model), "-t", "c", "--load-inputs", str(saved)])
    assert result.exit_code == 0 and "x float32[4, 3, 16, 16] (given)" in result.output


def test_random_says_which_shapes(model: pathlib.Path, tmp_path: pathlib.Path) -> None:
    artifact = tmp_path / "small.cgx"
    assert runner.invoke(app, ["compile", str(model), "-o", str(artifact)]).exit_code == 0
    result = runner.invoke(app, ["run", str(artifact), "--random"])
    assert result.exit_code == 0
    assert "inputs: x float32[1, 3, 16, 16] (random, free dims = 1)" in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--shape", "x=2x3x8x8"], "--shape x=2x3x8x8: input 'x' has size 8 on axis 2 (shape [2, 3, 8, 8]), "
                                   "expected 16: float32[batch, 3, 16, 16]"),
        (["--shape", "x=2x3"], "--shape x=2x3: input 'x' has rank 2 (shape [2, 3]), expected rank 4"),
        (["--shape", "x=2xbig"], "dimensions must be integers joined by 'x'"),
        (["--shape", "nope=1"], "the model has no input 'nope'; its inputs are: x float32[batch, 3, 16, 16]"),
        (["--load-inputs", "missing.npz"], "--load-inputs missing.npz: cannot read it"),
    ],
)
def test_input_errors_are_one_line(model: pathlib.Path, args: list[str], message: str) -> None:
    result = runner.invoke(app, ["compare", str(model), *args])
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split()) and "Traceback" not in result.output


def test_load_inputs_rejects_a_single_npy(model: pathlib.Path, tmp_path: pathlib.Path) -> None:
    np.save(tmp_path / "x.npy", np.zeros((1, 3, 16, 16), np.float32))
    result = runner.invoke(app, ["compare", str(model), "--load-inputs", str(tmp_path / "x.npy")])
    assert result.exit_code == 2 and "not an .npz archive" in result.output
    onnx.checker.check_model(onnx.load(model))


def test_a_named_dimension_set_by_shape_holds_for_every_input(tmp_path: pathlib.Path) -> None:
    import onnx.helper as oh

    graph = oh.make_graph(
        [oh.make_node("Add", ["x", "m"], ["y"], name="add")], "two",
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", 4]),
         oh.make_tensor_value_info("m", onnx.TensorProto.FLOAT, ["batch", 4])],
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["batch", 4])],
    )
    path = tmp_path / "two.onnx"
    onnx.save(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)]), path)
    result = runner.invoke(app, ["compare", str(path), "--shape", "x=3x4"])
    assert result.exit_code == 0, result.output
    assert "inputs: x float32[3, 4] (random, --shape); m float32[3, 4] (random, free dims from --shape or 1)" in (
        result.output
    )
    result = runner.invoke(app, ["compare", str(path), "--shape", "x=3x4", "--shape", "m=2x4"])
    assert result.exit_code == 2
    assert "--shape m=2x4: input 'm' axis 0 is batch=2, but input 'x' set batch=3" in result.output


def test_reference_refusing_random_sizes_is_one_clear_line(tmp_path: pathlib.Path) -> None:
    # A free dimension the model really needs at 4: random inputs (free dims = 1) make onnxruntime
    # itself fail, as YOLO-style detectors do at 1x1 images; found trying nudenet's 320n.onnx.
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["y"])],
        "needs_four",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])],
        [helper.make_tensor("shape", TensorProto.INT64, [2], [2, 2])],
    )
    path = tmp_path / "needs_four.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    result = CliRunner().invoke(app, ["compare", str(path), "-t", "c"])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert lines[-1].startswith("error: onnxruntime (the reference) cannot run the model on these inputs (x [1])")
    assert "--shape" in lines[-1]
    assert "internal error" not in result.output
    ok = CliRunner().invoke(app, ["compare", str(path), "-t", "c", "--shape", "x=4"])
    assert ok.exit_code == 0, ok.output
