"""Bringing models in: every accepted form, and clear errors for bad ones."""

from __future__ import annotations

import pathlib

import onnx
import onnx_ir as ir
import onnxruntime
import pytest
from onnx import TensorProto, helper

import codegraft as cg
from codegraft.core.irversion import readable_by_runtime
from codegraft.frontend.model import import_model
from codegraft.testing import SubsetBackend, light_model, light_model_path


def test_every_source_form_gives_the_same_graph(tmp_path: pathlib.Path) -> None:
    proto = light_model("squeezenet")
    path = tmp_path / "m.onnx"
    onnx.save(proto, path)
    forms = [proto, proto.SerializeToString(), str(path), path, ir.from_proto(proto)]
    counts = {len(import_model(f).graph) for f in forms}
    assert counts == {len(proto.graph.node)}


def test_weights_in_an_external_file_are_read(tmp_path: pathlib.Path) -> None:
    proto = light_model("squeezenet")
    path = tmp_path / "m.onnx"
    saved = onnx.ModelProto()
    saved.CopyFrom(proto)  # onnx.save moves the data of what it saves out to the file
    onnx.save(saved, path, save_as_external_data=True, location="m.weights", size_threshold=0)
    assert (tmp_path / "m.weights").stat().st_size > path.stat().st_size
    imported = import_model(path)
    expected = {t.name: onnx.numpy_helper.to_array(t) for t in proto.graph.initializer}
    got = {name: value.const_value.numpy() for name, value in imported.graph.initializers.items()}
    assert got.keys() == expected.keys()
    assert all((got[name] == expected[name]).all() for name in expected)


def test_a_missing_external_weights_file_is_named(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "m.onnx"
    onnx.save(light_model("squeezenet"), path, save_as_external_data=True, location="m.weights", size_threshold=0)
    (tmp_path / "m.weights").unlink()
    with pytest.raises(cg.ModelError, match=r"m\.onnx is not an ONNX model: .*m\.weights"):
        import_model(path)


def test_shapes_are_inferred_at_import() -> None:
    model = import_model(light_model_path("resnet50"))
    assert all(v.shape is not None for node in model.graph for v in node.outputs)


def test_missing_file() -> None:
    with pytest.raises(cg.ModelError, match="model file not found: nope.onnx"):
        cg.compile("nope.onnx")


def test_garbage_bytes(tmp_path: pathlib.Path) -> None:
    (tmp_path / "bad.onnx").write_bytes(b"\x08\x07garbage")
    with pytest.raises(cg.ModelError, match="bad.onnx"):
        cg.compile(tmp_path / "bad.onnx")


def test_invalid_node_is_named() -> None:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"], name="broken_relu"), helper.make_node("NoSuchOp", ["y"], ["z"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2])],
    )
    with pytest.raises(cg.ModelError, match="NoSuchOp"):
        cg.compile(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def test_unsupported_source_type() -> None:
    with pytest.raises(cg.ModelError, match="cannot compile a int"):
        cg.compile(42)  # type: ignore[arg-type]


def test_torch_module_is_exported_and_matches_eager() -> None:
    torch = pytest.importorskip("torch", reason="torch is an optional extra (pip install 'codegraft[torch]')")
    import numpy as np

    from codegraft.testing import SubsetBackend

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 8, 3)
            self.linear = torch.nn.Linear(8, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.linear(torch.relu(self.conv(x)).mean((2, 3)))

    torch.manual_seed(0)
    net = Net()
    x = torch.randn(2, 3, 16, 16)
    exe = cg.compile(net, targets=[SubsetBackend("acc", {"Conv", "Relu"})], example_inputs=(x,))
    (out,) = exe.run({exe.inputs[0].name: x.numpy()}).values()
    np.testing.assert_allclose(out, net(x).detach().numpy(), rtol=1e-4, atol=1e-5)
    assert "acc" in exe.report().nodes_per_backend()


def test_torch_module_needs_example_inputs() -> None:
    torch = pytest.importorskip("torch", reason="torch is an optional extra")
    with pytest.raises(cg.ModelError, match="example_inputs"):
        cg.compile(torch.nn.ReLU())


def test_a_node_nobody_can_run_is_named_at_compile_time() -> None:
    from codegraft.testing import SubsetBackend

    graph = helper.make_graph(
        [helper.make_node("Frobnicate", ["x"], ["y"], domain="vendor.x", name="frob")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("vendor.x", 1)]
    )
    with pytest.raises(cg.ModelError, match=r"node 'frob' \(vendor.x::Frobnicate\) can run nowhere: the host"):
        cg.compile(model, targets=[SubsetBackend("acc", {"Relu"})])


def _negative_dim_model() -> onnx.ModelProto:
    """``float32[-1, 3, ?, ?]`` in, ``[-1, 2]`` out: how an OCR direction classifier declares them."""
    import numpy as np

    rng = np.random.default_rng(0)
    weight = helper.make_tensor("w", TensorProto.FLOAT, [2, 3, 3, 3], rng.standard_normal(54).astype("float32"))
    # -1 and "?" as Paddle2ONNX writes them: unknown sizes, not a size or a shared name
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 3, "?", "?"])
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["c"], ["r"]),
            helper.make_node("GlobalAveragePool", ["r"], ["g"]),
            helper.make_node("Flatten", ["g"], ["y"]),
        ],
        "negative_dims",
        [x],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [-1, 2])],
        [weight],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_a_negative_dim_value_is_an_unknown_size() -> None:
    import numpy as np

    from codegraft.testing import assert_close, run_onnxruntime

    proto = _negative_dim_model()
    model = import_model(proto)
    assert not isinstance(model.graph.inputs[0].shape[0], int)  # unknown, not -1
    assert proto.graph.input[0].type.tensor_type.shape.dim[0].dim_value == -1  # the caller's model is untouched
    exe = cg.compile(proto, targets=["c", "openvino"])
    for shape in [(1, 3, 48, 192), (2, 3, 16, 24)]:
        feeds = {"x": np.random.default_rng(1).standard_normal(shape).astype("float32")}
        assert_close(exe.run(feeds), run_onnxruntime(proto, feeds))
    with pytest.raises(cg.InputError, match="has size 4 on axis 1"):
        exe.run({"x": np.zeros((1, 4, 8, 8), "float32")})


def test_random_feeds_read_a_negative_dim_as_unknown() -> None:
    from codegraft.testing import random_feeds

    assert random_feeds(_negative_dim_model())["x"].shape == (1, 3, 1, 1)


def test_an_input_of_unknown_rank_is_accepted_as_onnxruntime_accepts_it() -> None:
    # The onnx checker wants a shape on graph inputs and outputs; onnxruntime runs a model
    # without one, and so must codegraft (an If body's outer value made by a nested If).
    import numpy as np

    from codegraft.testing import assert_close, run_onnxruntime

    x, y = onnx.ValueInfoProto(name="x"), onnx.ValueInfoProto(name="y")
    x.type.tensor_type.elem_type = y.type.tensor_type.elem_type = TensorProto.FLOAT
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Tanh", ["r"], ["y"])],
                              "unranked", [x], [y])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)}
    exe = cg.compile(proto, targets=["openvino"])
    assert_close(exe.run(feeds), run_onnxruntime(proto, feeds))
    assert not proto.graph.input[0].type.tensor_type.HasField("shape")  # the caller's model is untouched
    # A partition input of unknown rank (OpenVINO refuses a Parameter of dynamic rank: magika,
    # RivaGAN, ddddocr) is compiled per shape seen at run time, not sent to the host.
    acc = SubsetBackend("acc", {"Relu", "Tanh"})
    exe = cg.compile(proto, targets=[acc], min_partition_size=1)
    assert_close(exe.run(feeds), run_onnxruntime(proto, feeds))
    (partition,) = exe.report().partitions
    assert partition.backend == "acc" and partition.deferred
    assert acc.compiled == [[(2, 3)]]


def test_a_model_onnx_ir_cannot_hold_names_the_first_cause(tmp_path: pathlib.Path) -> None:
    # a DictVectorizer reading a map, which onnx-ir cannot represent yet; the error says
    # that, not which deserialiser wrapped it
    vectorizer = helper.make_node("DictVectorizer", ["x"], ["y"], domain="ai.onnx.ml", int64_vocabulary=[1, 2, 3])
    floats = helper.make_tensor_type_proto(TensorProto.FLOAT, [])
    graph = helper.make_graph(
        [vectorizer], "g", [helper.make_value_info("x", helper.make_map_type_proto(TensorProto.INT64, floats))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 1)])
    onnx.save(model, tmp_path / "vectorizer.onnx")
    expected = r"vectorizer\.onnx cannot be read into the IR: NotImplementedError: Map types"
    with pytest.raises(cg.ModelError, match=expected):
        import_model(tmp_path / "vectorizer.onnx")


def test_a_classifiers_zipmap_is_built_after_the_run(tmp_path: pathlib.Path) -> None:
    # skl2onnx ends every classifier in ZipMap (onnxruntime's own sample here), whose sequence of
    # maps onnx-ir cannot hold: the graph computes the tensor, the maps are built from it, as
    # onnxruntime returns them, and an artifact carries the labels
    import numpy as np

    path = pathlib.Path(onnxruntime.__file__).parent / "datasets" / "logreg_iris.onnx"
    x = np.random.default_rng(0).standard_normal((3, 2)).astype(np.float32)
    want = dict(zip(["label", "probabilities"], onnxruntime.InferenceSession(
        str(path), providers=["CPUExecutionProvider"]).run(None, {"float_input": x}), strict=True))  # fmt: skip
    exe = cg.compile(path, targets=["c"])
    assert [s for s in exe.outputs] == ["label", "probabilities"]
    for got in (exe.run({"float_input": x}), cg.load_executable(_saved(exe, tmp_path)).run({"float_input": x})):
        np.testing.assert_array_equal(got["label"], want["label"])
        assert got["probabilities"] == want["probabilities"]  # [{0: p0, 1: p1, 2: p2}, ...]
        assert all(type(k) is int for k in got["probabilities"][0])


def _saved(exe: cg.Executable, folder: pathlib.Path) -> pathlib.Path:
    exe.save(folder / "m.cgx")
    return folder / "m.cgx"


def _out_of_order_model(*, listed_shape: list[int] | None = None) -> onnx.ModelProto:
    """x -> Relu -> Neg -> y, with Neg listed first (as PaddleOCR's table detector lists two
    nodes); ``listed_shape``: a stored shape for the Relu's output that inference contradicts."""
    graph = helper.make_graph(
        [helper.make_node("Neg", ["r"], ["y"]), helper.make_node("Relu", ["x"], ["r"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
    )  # fmt: skip
    if listed_shape is not None:
        graph.value_info.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, listed_shape))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_nodes_out_of_order_are_sorted_as_onnxruntime_sorts_them() -> None:
    import numpy as np

    model = _out_of_order_model()
    with pytest.raises(onnx.checker.ValidationError, match="topologically sorted"):
        onnx.checker.check_model(model)  # what the checker says; onnxruntime runs it
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    exe = cg.compile(model, targets=["c"])
    np.testing.assert_array_equal(exe.run({"x": x})["y"], -np.maximum(x, 0))
    # a graph that no order computes is still refused, naming why
    broken = _out_of_order_model()
    broken.graph.node[0].input[0] = "nothing_makes_this"
    with pytest.raises(cg.ModelError, match="nothing_makes_this"):
        import_model(broken)


def test_a_stored_shape_that_inference_contradicts_is_dropped_as_onnxruntime_drops_it() -> None:
    import numpy as np

    model = _out_of_order_model(listed_shape=[6])  # rank 1 where inference finds [2, 3]
    onnx_model = helper.make_model(model.graph, opset_imports=[helper.make_opsetid("", 17)])
    del onnx_model.graph.node[:]
    onnx_model.graph.node.extend([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Neg", ["r"], ["y"])])
    x = np.random.default_rng(1).standard_normal((2, 3)).astype(np.float32)
    exe = cg.compile(onnx_model, targets=["c"])
    np.testing.assert_array_equal(exe.run({"x": x})["y"], -np.maximum(x, 0))
    # both at once, as in the table detector
    np.testing.assert_array_equal(cg.compile(model, targets=["c"]).run({"x": x})["y"], -np.maximum(x, 0))


@pytest.mark.parametrize("declared", [[], [6], [2, 4]])
def test_a_declared_output_shape_that_inference_contradicts_is_dropped(declared: list[int]) -> None:
    # ocrspine's PP-OCRv5 classifier declares its [N, 2] output as []: onnxruntime warns
    # ("lenient merge") and runs it; the output is the shape computed
    import numpy as np

    model = _out_of_order_model()
    model.graph.node.sort(key=lambda n: n.op_type != "Relu")
    model.graph.output[0].type.tensor_type.shape.ClearField("dim")
    for size in declared:
        model.graph.output[0].type.tensor_type.shape.dim.add().dim_value = size
    x = np.random.default_rng(2).standard_normal((2, 3)).astype(np.float32)
    got = cg.compile(model, targets=["c"]).run({"x": x})["y"]
    np.testing.assert_array_equal(got, -np.maximum(x, 0))
    assert got.shape == (2, 3)


def test_a_zipmap_of_string_labels_and_the_probabilities_too() -> None:
    # a classifier exporting both the probabilities and their maps: both outputs, in order
    import numpy as np

    nodes = [helper.make_node("Softmax", ["x"], ["p"], axis=1),
             helper.make_node("ZipMap", ["p"], ["maps"], domain="ai.onnx.ml", classlabels_strings=["cat", "dog"])]
    maps_type = helper.make_sequence_type_proto(helper.make_map_type_proto(
        TensorProto.STRING, helper.make_tensor_type_proto(TensorProto.FLOAT, [])))  # fmt: skip
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2])],
        [helper.make_value_info("maps", maps_type), helper.make_tensor_value_info("p", TensorProto.FLOAT, ["N", 2])],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 1)])
    x = np.random.default_rng(1).standard_normal((4, 2)).astype(np.float32)
    readable = readable_by_runtime(model).SerializeToString()
    session = onnxruntime.InferenceSession(readable, providers=["CPUExecutionProvider"])
    want = session.run(None, {"x": x})
    got = cg.compile(model, targets=["c"]).run({"x": x})
    assert list(got) == ["maps", "p"]
    assert [{k: round(v, 5) for k, v in row.items()} for row in got["maps"]] == [
        {k: round(v, 5) for k, v in row.items()} for row in want[0]]  # fmt: skip
    np.testing.assert_allclose(got["p"], want[1], rtol=1e-6)
