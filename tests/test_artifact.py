"""The artifact: round trip, and clear errors for truncated, corrupted or foreign files."""

from __future__ import annotations

import pathlib
import re
import struct

import numpy as np
import pytest

import codegraft as cg
from codegraft.runtime.artifact import FORMAT_VERSION, MAGIC
from codegraft.testing import SubsetBackend, assert_close, light_model, random_feeds, run_onnxruntime


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[pathlib.Path, cg.Executable]:
    model = light_model("squeezenet")
    exe = cg.compile(model, targets=["openvino"] if _has_openvino() else [])
    path = tmp_path_factory.mktemp("artifact") / "model.cgx"
    exe.save(path)
    return path, exe


def _has_openvino() -> bool:
    return any(i.name == "openvino" and i.available for i in cg.list_backends())


def test_round_trip_runs_without_the_model(saved: tuple[pathlib.Path, cg.Executable]) -> None:
    path, exe = saved
    loaded = cg.load_executable(path)
    model = light_model("squeezenet")
    feeds = random_feeds(model)
    assert_close(loaded.run(feeds), run_onnxruntime(model, feeds))
    assert loaded.report() == exe.report()
    assert [s.backend for s in loaded.steps] == [s.backend for s in exe.steps]


def test_vendor_backend_supplied_at_load(tmp_path: pathlib.Path) -> None:
    model = light_model("squeezenet")
    exe = cg.compile(model, targets=[SubsetBackend("acc", {"Conv", "Relu"})])
    exe.save(tmp_path / "m.cgx")
    with pytest.raises(cg.ArtifactError, match="needs backend 'acc'"):
        cg.load_executable(tmp_path / "m.cgx")
    loaded = cg.load_executable(tmp_path / "m.cgx", backends=[SubsetBackend("acc", {"Conv", "Relu"})])
    feeds = random_feeds(model)
    assert_close(loaded.run(feeds), exe.run(feeds), rtol=0)


def test_shared_constants_round_trip(tmp_path: pathlib.Path) -> None:
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.arange(4096, dtype=np.float32).reshape(64, 64) / 4096, "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["a"]), helper.make_node("Sin", ["a"], ["b"]),
         helper.make_node("MatMul", ["b", "w"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 64])], initializer=[w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    acc = SubsetBackend("acc", {"MatMul"})
    exe = cg.compile(model, targets=[acc])
    exe.save(tmp_path / "m.cgx")
    size = (tmp_path / "m.cgx").stat().st_size
    assert 64 * 64 * 4 < size < 2 * 64 * 64 * 4, "the shared weight is stored once"
    loaded = cg.load_executable(tmp_path / "m.cgx", backends=[acc])
    np.testing.assert_array_equal(loaded.constants["w"], exe.constants["w"])


def test_truncated_file(saved: tuple[pathlib.Path, cg.Executable], tmp_path: pathlib.Path) -> None:
    data = saved[0].read_bytes()
    for cut in (5, 40, len(data) // 2, len(data) - 1):
        (tmp_path / "t.cgx").write_bytes(data[:cut])
        with pytest.raises(cg.ArtifactError, match="truncated"):
            cg.load_executable(tmp_path / "t.cgx")


def test_corrupted_file(saved: tuple[pathlib.Path, cg.Executable], tmp_path: pathlib.Path) -> None:
    data = bytearray(saved[0].read_bytes())
    data[len(data) // 2] ^= 0xFF
    (tmp_path / "c.cgx").write_bytes(bytes(data))
    with pytest.raises(cg.ArtifactError, match="corrupted"):
        cg.load_executable(tmp_path / "c.cgx")


def test_wrong_version(saved: tuple[pathlib.Path, cg.Executable], tmp_path: pathlib.Path) -> None:
    data = bytearray(saved[0].read_bytes())
    struct.pack_into("<I", data, len(MAGIC), FORMAT_VERSION + 1)
    (tmp_path / "v.cgx").write_bytes(bytes(data))
    with pytest.raises(cg.ArtifactError, match=f"format version {FORMAT_VERSION + 1}; this codegraft reads version"):
        cg.load_executable(tmp_path / "v.cgx")


def test_not_an_artifact(tmp_path: pathlib.Path) -> None:
    (tmp_path / "x.cgx").write_bytes(b"PK\x03\x04" + b"\0" * 100)
    with pytest.raises(cg.ArtifactError, match="not a codegraft artifact"):
        cg.load_executable(tmp_path / "x.cgx")
    with pytest.raises(cg.ArtifactError, match="cannot read"):
        cg.load_executable(tmp_path / "missing.cgx")


def test_no_pickle_or_eval_in_the_package() -> None:
    root = pathlib.Path(cg.__file__).parent
    for source in root.rglob("*.py"):
        text = source.read_text()
        assert not re.search(r"^\s*(import|from) (pickle|dill|cloudpickle)", text, re.M), source
        assert not re.search(r"(?<![.\w])eval\(", text), source
