"""Bad input found by fuzzing (issue 11): one clear codegraft error, never a dependency's traceback.

Models the onnx checker lets through, feeds numpy cannot hold, saves that cannot be written,
and the CLI's error lines (one line each, not wrapped when piped).
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import codegraft as cg
from codegraft.frontend.utf8 import all_text_is_utf8


def relu_model(*, opset: int = 17, name: str = "relu0", outputs: int = 1) -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"], name=name)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])] * outputs,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _with_bytes(model: onnx.ModelProto, marker: bytes, replacement: bytes) -> bytes:
    data = model.SerializeToString()
    assert marker in data
    return data.replace(marker, replacement)


@pytest.fixture(scope="module")
def exe() -> cg.Executable:
    return cg.compile(relu_model(), targets=["c"])


def test_invalid_utf8_in_the_doc_string_is_named() -> None:
    model = relu_model()
    model.doc_string = "DOCDOC"
    with pytest.raises(cg.ModelError, match=r"model\.doc_string is not valid UTF-8"):
        cg.compile(_with_bytes(model, b"DOCDOC", b"DO\xff\xfeOC"), targets=["c"])


def test_invalid_utf8_in_a_node_name_is_named(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "bad.onnx"
    path.write_bytes(_with_bytes(relu_model(name="NODENAME"), b"NODENAME", b"NODE\xffAME"))
    with pytest.raises(cg.ModelError, match=r"bad\.onnx: model\.graph\.node\[0\]\.name is not valid UTF-8"):
        cg.compile(path, targets=["c"])


def test_invalid_utf8_deep_in_a_constant_is_named() -> None:
    # Text in a message under an attribute: protobuf's proto3 twin (frontend/utf8.py) finds
    # it, and the walk in Python names where it is.
    value = numpy_helper.from_array(np.ones(3, np.float32), "TNAME")
    graph = helper.make_graph(
        [helper.make_node("Constant", [], ["c"], value=value), helper.make_node("Add", ["x", "c"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
    )
    model = helper.make_model(graph)
    assert all_text_is_utf8(model) is True
    data = _with_bytes(model, b"TNAME", b"TN\xffME")
    assert all_text_is_utf8(onnx.load_from_string(data)) is False
    with pytest.raises(cg.ModelError, match=r"model\.graph\.node\[0\]\.attribute\[0\]\.t\.name is not valid UTF-8"):
        cg.compile(data, targets=["c"])


@pytest.mark.parametrize("where", ["initializer", "constant"])
def test_a_tensor_whose_data_does_not_fill_its_shape_is_named(where: str) -> None:
    short = numpy_helper.from_array(np.ones(3, np.float32), "c")
    short.dims[:] = [2, 2]
    nodes = [helper.make_node("Add", ["x", "c"], ["y"], name="add")]
    if where == "constant":
        nodes.insert(0, helper.make_node("Constant", [], ["c"], value=short, name="const"))
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])],
        initializer=[short] if where == "initializer" else [],
    )
    spelled = {
        "initializer": r"model\.graph\.initializer\[0\]",
        "constant": r"model\.graph\.node\[0\]\.attribute\[0\]\.t",
    }[where]
    with pytest.raises(cg.ModelError, match=rf"tensor 'c' \({spelled}\) stores 12 bytes; shape \[2, 2\] needs 16"):
        cg.compile(helper.make_model(graph), targets=["c"])


def test_an_output_listed_twice_runs_like_onnxruntime() -> None:
    exe = cg.compile(relu_model(outputs=2), targets=["c"])
    x = np.array([[-1, 2, -3], [4, -5, 6]], np.float32)
    out = exe.run({"x": x})
    assert list(out) == ["y"]
    np.testing.assert_array_equal(out["y"], np.maximum(x, 0))


def test_external_data_is_read_from_the_models_folder_or_named(tmp_path: pathlib.Path) -> None:
    model = helper.make_model(
        helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64])],
                          [numpy_helper.from_array(np.arange(64, dtype=np.float32), "w")]),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    path = tmp_path / "model.onnx"
    onnx.save(model, str(path), save_as_external_data=True, location="weights.bin", size_threshold=0)
    x = np.ones(64, np.float32)
    np.testing.assert_array_equal(cg.compile(str(path), targets=[]).run({"x": x})["y"], x + np.arange(64))
    without_data = onnx.load(str(path), load_external_data=False)
    with pytest.raises(cg.ModelError, match=r"initializer 'w' keeps its data in the file 'weights.bin'.*model's path"):
        cg.compile(without_data, targets=[])


def test_empty_graph_is_refused() -> None:
    model = helper.make_model(helper.make_graph([], "g", [], []), opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(cg.ModelError, match="no outputs"):
        cg.compile(model)


@pytest.mark.parametrize("opset", [99, 0])
def test_unknown_opset_is_refused(opset: int) -> None:
    with pytest.raises(cg.ModelError, match=f"opset {opset} of the default domain"):
        cg.compile(relu_model(opset=opset), targets=["c", "openvino"])


def test_checker_message_keeps_the_node_name() -> None:
    model = relu_model(name="my_relu")
    model.graph.node[0].attribute.append(helper.make_attribute("alpha", 1.0))
    with pytest.raises(cg.ModelError) as caught:
        cg.compile(model)
    message = str(caught.value)
    assert "Unrecognized attribute: alpha" in message and "my_relu" in message and "\n" not in message


def test_ragged_list_feed_is_an_input_error(exe: cg.Executable) -> None:
    with pytest.raises(cg.InputError, match=r"input 'x' is not an array .*expected float32\[2, 3\]"):
        exe.run({"x": [[1.0, 2.0, 3.0], [1.0, 2.0]]})


def test_save_into_a_missing_folder_or_onto_a_directory(exe: cg.Executable, tmp_path: pathlib.Path) -> None:
    with pytest.raises(cg.ArtifactError, match="No such file or directory"):
        exe.save(tmp_path / "missing" / "model.cgx")
    with pytest.raises(cg.ArtifactError, match="it is a directory"):
        exe.save(tmp_path)
    assert list(tmp_path.iterdir()) == []  # no temporary file left behind


def test_string_initializer_runs() -> None:
    graph = helper.make_graph(
        [helper.make_node("Identity", ["s"], ["y"]), helper.make_node("Relu", ["x"], ["z"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.STRING, [2]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, [2])],
        initializer=[numpy_helper.from_array(np.array(["a", "b"], dtype=object), "s")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    out = cg.compile(model, targets=["c"]).run({"x": np.array([-1, 1], np.float32)})
    assert out["y"].tolist() in (["a", "b"], [b"a", b"b"])
    np.testing.assert_array_equal(out["z"], [0, 1])


# -- the command line, as a user runs it: a subprocess whose stderr is a pipe ---------------

def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "40"}
    return subprocess.run([sys.executable, "-m", "codegraft.cli.main", *args], capture_output=True, text=True, env=env,
                          timeout=600)


def _one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


def test_cli_error_is_one_unwrapped_line(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "a-model-with-a-long-enough-name-to-wrap-at-forty-columns.onnx"
    path.write_bytes(_with_bytes(relu_model(name="NODENAME"), b"NODENAME", b"NODE\xffAME"))
    line = _one_error_line(_cli("compile", str(path), "-t", "c", "-o", str(tmp_path / "m.cgx")))
    assert str(path) in line and "not valid UTF-8" in line


def test_cli_compile_into_a_missing_folder(tmp_path: pathlib.Path) -> None:
    model = tmp_path / "m.onnx"
    onnx.save(relu_model(), model)
    line = _one_error_line(_cli("compile", str(model), "-o", str(tmp_path / "no" / "m.cgx")))
    assert "cannot write artifact" in line
    line = _one_error_line(_cli("compile", str(model), "-o", str(tmp_path)))
    assert "it is a directory" in line


def test_cli_usage_error_is_one_line() -> None:
    line = _one_error_line(_cli("run", "--no-such-option"))
    assert "--no-such-option" in line and "run --help" in line


@pytest.mark.parametrize("dims", [[64, 5], [-1, 6], [3]])
def test_initializer_whose_data_does_not_fill_its_shape_is_named(dims: list[int]) -> None:
    # Found by tests/test_fuzz.py: the checker lets it through, then onnx-ir failed deep in a pass.
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "k"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6])],
        [numpy_helper.from_array(np.ones((1, 6), np.float32), "k")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    del model.graph.initializer[0].dims[:]
    model.graph.initializer[0].dims.extend(dims)
    with pytest.raises(cg.ModelError, match=r"tensor 'k' \(model\.graph\.initializer\[0\]\)"):
        cg.compile(model, targets=["c"])


def test_save_never_replaces_a_device(exe: cg.Executable, tmp_path: pathlib.Path) -> None:
    # The atomic write renames a temporary file over the target: over a device that would
    # swap e.g. /dev/null for a file (found by the fuzzer; tested through a link to it).
    link = tmp_path / "devnull"
    link.symlink_to(os.devnull)
    with pytest.raises(cg.ArtifactError, match="not a regular file"):
        exe.save(link)
    assert link.is_symlink() and pathlib.Path(os.devnull).is_char_device()


@pytest.mark.parametrize(("call", "error"), [
    (lambda exe: cg.compile(relu_model(), targets=[3]), cg.BackendError),
    (lambda exe: exe.save(None), cg.ArtifactError),
    (lambda exe: cg.load_executable(5), cg.ArtifactError),
    (lambda exe: exe.save("x.cgx", signing_key=5), cg.SignatureError),
])
def test_wrong_argument_types_are_codegraft_errors(exe: cg.Executable, call, error) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(error):
        call(exe)


def test_no_targets_may_be_none() -> None:
    assert [s.backend for s in cg.compile(relu_model(), targets=None).steps] == ["onnxruntime"]


def test_cli_inspect_refuses_opset_99(tmp_path: pathlib.Path) -> None:
    onnx.save(relu_model(opset=99), tmp_path / "op99.onnx")
    done = _cli("inspect", str(tmp_path / "op99.onnx"), "-t", "c")
    assert done.returncode == 2
    assert "opset 99" in _one_error_line(done)


def test_cli_compare_refuses_an_empty_model_file(tmp_path: pathlib.Path) -> None:
    # Found by tests/test_fuzz.py: compare handed an empty file straight to onnxruntime (exit 3).
    (tmp_path / "empty.onnx").write_bytes(b"")
    assert "no outputs" in _one_error_line(_cli("compare", str(tmp_path / "empty.onnx"), "-t", "c"))
