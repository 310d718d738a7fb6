"""The NHWC layout pass: equivalence on random inputs, and golden counts of what remains.

onnxruntime cannot run ``codegraft.nhwc`` ops, so every check lowers them back with the
reference :func:`codegraft.passes.lower_nhwc` and compares with the untouched model.
"""

from __future__ import annotations

import collections
import functools

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxscript import optimizer

from codegraft.passes import NHWC_DOMAIN, LayoutResult, lower_nhwc, to_nhwc
from codegraft.testing import assert_close, light_model, random_feeds, run_onnxruntime

RNG = np.random.default_rng(0)


def _init(name: str, *shape: int) -> onnx.TensorProto:
    return numpy_helper.from_array(RNG.standard_normal(shape).astype(np.float32) * 0.3, name)


def _model(
    nodes: list[onnx.NodeProto],
    inputs: list[tuple[str, list[int | str]]],
    outputs: list[str],
    inits: list[onnx.TensorProto],
    opset: int = 17,
) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    return onnx.shape_inference.infer_shapes(model)


def _check(proto: onnx.ModelProto, *, fold_first: bool = False, **dims: int) -> tuple[LayoutResult, ir.Model]:
    """Rewrite, check outputs keep names, lower back, compare with the original on random data."""
    model = ir.serde.deserialize_model(proto)
    if fold_first:
        optimizer.fold_constants(model)
    output_names = [o.name for o in model.graph.outputs]
    output_shapes = [o.shape for o in model.graph.outputs]
    result = to_nhwc(model)
    assert [o.name for o in model.graph.outputs] == output_names
    assert [o.shape for o in model.graph.outputs] == output_shapes
    rewritten = ir.serde.serialize_model(model)
    onnx.checker.check_model(rewritten)
    lowered = lower_nhwc(ir.serde.deserialize_model(rewritten))
    feeds = random_feeds(proto, dim_values=dims)
    assert_close(run_onnxruntime(ir.serde.serialize_model(lowered), feeds), run_onnxruntime(proto, feeds))
    return result, model


def _ops(model: ir.Model) -> collections.Counter[str]:
    return collections.Counter(f"{n.domain}::{n.op_type}" if n.domain else n.op_type for n in model.graph)


def test_cnn_keeps_one_transpose_at_the_input() -> None:
    proto = _model(
        [
            helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["c1"], ["r1"]),
            helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
            helper.make_node("Conv", ["p1", "w2"], ["c2"], group=2),
            helper.make_node("Add", ["c2", "bias"], ["a2"]),  # [C,1,1] broadcast bias
            helper.make_node("PRelu", ["a2", "slope"], ["r2"]),
            helper.make_node("GlobalAveragePool", ["r2"], ["g"]),
            helper.make_node("Flatten", ["g"], ["f"]),
            helper.make_node("Gemm", ["f", "fc"], ["y"], transB=1),
        ],
        [("x", [2, 3, 8, 8])],
        ["y"],
        [_init("w1", 4, 3, 3, 3), _init("b1", 4), _init("w2", 6, 2, 3, 3), _init("bias", 6, 1, 1),
         _init("slope", 6, 1, 1), _init("fc", 5, 6)],
    )  # fmt: skip
    result, model = _check(proto)
    assert result.converted_ops == 4
    assert result.transposes_inserted == 1
    assert result.constants_folded == 4  # two weights, bias, slope
    ops = _ops(model)
    assert ops["Transpose"] == 1
    assert ops[f"{NHWC_DOMAIN}::Conv"] == 2
    assert model.opset_imports[NHWC_DOMAIN] == 17
    conv = next(n for n in model.graph if n.op_type == "Conv")
    assert conv.inputs[1] is not None and list(conv.inputs[1].shape) == [4, 3, 3, 3]  # OHWI
    second = [n for n in model.graph if n.op_type == "Conv"][1]
    assert second.inputs[1] is not None and list(second.inputs[1].shape) == [6, 3, 3, 2]
    assert "w1" not in model.graph.initializers  # the NCHW copy is not kept


def test_graph_output_in_nhwc_gets_one_transpose_back_and_keeps_its_name() -> None:
    proto = _model(
        [
            helper.make_node("Conv", ["x", "w"], ["c"]),
            helper.make_node("Relu", ["c"], ["y"]),
            helper.make_node("Sigmoid", ["c"], ["z"]),
        ],
        [("x", ["N", 3, 5, 5])],
        ["y", "z"],
        [_init("w", 4, 3, 1, 1)],
    )
    result, model = _check(proto, N=3)
    assert result.transposes_inserted == 3  # input, and each output back
    assert _ops(model)["Transpose"] == 3


def test_axis_ops_are_remapped_not_transposed() -> None:
    proto = _model(
        [
            helper.make_node("Conv", ["x", "w1"], ["c1"]),
            helper.make_node("Conv", ["x", "w2"], ["c2"], pads=[1, 1, 1, 1]),
            helper.make_node("Concat", ["c1", "c2"], ["cat"], axis=1),
            helper.make_node("Softmax", ["cat"], ["s"], axis=1),
            helper.make_node("ReduceMean", ["s"], ["m"], axes=[2, 3], keepdims=0),
            helper.make_node("ReduceMax", ["s"], ["k"], axes=[1], keepdims=1),
            helper.make_node("Conv", ["k", "w3"], ["y2"]),
        ],
        [("x", [1, 3, 6, 7])],
        ["m", "y2"],
        [_init("w1", 2, 3, 1, 1), _init("w2", 3, 3, 3, 3), _init("w3", 2, 1, 1, 1)],
        opset=17,
    )
    result, model = _check(proto)
    # the input, and y2 back to NCHW; m is [N, C] in either layout
    assert result.transposes_inserted == 2
    concat = next(n for n in model.graph if n.op_type == "Concat")
    assert concat.attributes.get_int("axis") == 3
    softmax = next(n for n in model.graph if n.op_type == "Softmax")
    assert softmax.attributes.get_int("axis") == 3
    mean = next(n for n in model.graph if n.op_type == "ReduceMean")
    assert list(mean.attributes.get_ints("axes") or []) == [1, 2]


def test_old_softmax_and_reduce_with_axes_input() -> None:
    proto = _model(
        [
            helper.make_node("Conv", ["x", "w"], ["c"]),
            helper.make_node("Softmax", ["c"], ["s"], axis=1),  # opset 11: flattens from axis 1
            helper.make_node("ReduceSum", ["s", "axes"], ["y"], keepdims=0),
        ],
        [("x", [2, 3, 4, 5])],
        ["y"],
        [_init("w", 4, 3, 1, 1), numpy_helper.from_array(np.array([1], np.int64), "axes")],
        opset=13,
    )
    result, _ = _check(proto)
    # only the input: y drops C, and [N, H, W] is stored in that order already
    assert result.transposes_inserted == 1
    old = _model(
        [
            helper.make_node("Conv", ["x", "w"], ["c"]),
            helper.make_node("Softmax", ["c"], ["y"], axis=1),
        ],
        [("x", [2, 3, 4, 5])],
        ["y"],
        [_init("w", 4, 3, 1, 1)],
        opset=11,
    )  # before opset 13 Softmax normalises over everything from axis 1: stays NHWC
    result, _ = _check(old)
    assert result.transposes_inserted == 2


def test_model_transposes_compose_away() -> None:
    """An NHWC-input model that transposes to NCHW for its conv needs no transpose at all."""
    proto = _model(
        [
            helper.make_node("Transpose", ["x"], ["xt"], perm=[0, 3, 1, 2]),
            helper.make_node("Conv", ["xt", "w"], ["c"]),
            helper.make_node("Relu", ["c"], ["r"]),
            helper.make_node("Transpose", ["r"], ["y"], perm=[0, 2, 3, 1]),
        ],
        [("x", [1, 5, 6, 3])],
        ["y"],
        [_init("w", 4, 3, 3, 3)],
    )
    result, model = _check(proto)
    assert result.transposes_inserted == 0
    assert _ops(model)["Transpose"] == 0


def test_reshapes_that_split_or_merge_stored_groups_stay_nhwc() -> None:
    """[N,C,H,W] -> [N,C,H*W] -> softmax over space -> back: H and W are stored together."""
    proto = _model(
        [
            helper.make_node("Conv", ["x", "w"], ["c"]),
            helper.make_node("Reshape", ["c", "flat"], ["f"]),
            helper.make_node("Softmax", ["f"], ["s"], axis=2),
            helper.make_node("Reshape", ["s", "back"], ["b"]),
            helper.make_node("Conv", ["b", "w2"], ["y"]),
        ],
        [("x", [2, 3, 5, 6])],
        ["y"],
        [_init("w", 4, 3, 1, 1), _init("w2", 2, 4, 1, 1),
         numpy_helper.from_array(np.array([2, 4, -1], np.int64), "flat"),
         numpy_helper.from_array(np.array([0, 4, 5, 6], np.int64), "back")],
    )  # fmt: skip
    result, model = _check(proto)
    assert (result.transposes_inserted, result.reshapes_inserted) == (2, 0)  # input, output
    softmax = next(n for n in model.graph if n.op_type == "Softmax")
    assert softmax.attributes.get_int("axis") == 1  # stored [N, H*W, C]


def test_channel_shuffle_costs_one_transpose() -> None:
    proto = _model(
        [
            helper.make_node("Conv", ["x", "w"], ["c"]),
            helper.make_node("Reshape", ["c", "split"], ["r"]),
            helper.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 1, 3, 4]),
            helper.make_node("Reshape", ["t", "merge"], ["m"]),
            helper.make_node("Conv", ["m", "w2"], ["y"]),
        ],
        [("x", [1, 3, 4, 4])],
        ["y"],
        [_init("w", 6, 3, 1, 1), _init("w2", 2, 6, 1, 1),
         numpy_helper.from_array(np.array([1, 2, 3, 4, 4], np.int64), "split"),
         numpy_helper.from_array(np.array([1, 6, 4, 4], np.int64), "merge")],
    )  # fmt: skip
    result, model = _check(proto)
    # the input, the shuffle, the output
    assert (result.transposes_inserted, result.reshapes_inserted) == (3, 0)
    shuffle = [n for n in model.graph if n.op_type == "Transpose"][1]
    assert list(shuffle.attributes.get_ints("perm") or []) == [0, 1, 2, 4, 3]


def _ints(name: str, values: list[int]) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(values, np.int64), name)


def test_pad_slice_split_follow_their_axes() -> None:
    proto = _model(
        [
            helper.make_node("Conv", ["x", "w"], ["c"]),
            helper.make_node("Pad", ["c", "pads"], ["p"], mode="reflect"),
            helper.make_node("Slice", ["p", "starts", "ends", "axes"], ["s"]),
            helper.make_node("Split", ["s", "sizes"], ["a", "b"], axis=1),
            helper.make_node("Mul", ["a", "b"], ["m"]),
            helper.make_node("Conv", ["m", "w2"], ["y"]),
        ],
        [("x", [2, 3, 5, 6])],
        ["y"],
        [_init("w", 6, 3, 1, 1), _init("w2", 2, 2, 1, 1),
         _ints("pads", [0, 0, 1, 2, 0, 0, 2, 1]), _ints("starts", [1, 0]), _ints("ends", [5, -1]),
         _ints("axes", [1, 3]), _ints("sizes", [2, 2])],
    )  # fmt: skip
    result, model = _check(proto)
    assert result.transposes_inserted == 2  # input and output only
    split = next(n for n in model.graph if n.op_type == "Split")
    assert split.attributes.get_int("axis") == 3


def test_pad_and_slice_before_opset_10_use_attributes() -> None:
    proto = _model(
        [
            helper.make_node("Conv", ["x", "w"], ["c"]),
            helper.make_node("Pad", ["c"], ["p"], pads=[0, 0, 1, 0, 0, 0, 0, 2]),
            helper.make_node("Slice", ["p"], ["s"], starts=[1], ends=[3], axes=[1]),
            helper.make_node("Conv", ["s", "w2"], ["y"]),
        ],
        [("x", [1, 3, 4, 4])],
        ["y"],
        [_init("w", 4, 3, 1, 1), _init("w2", 2, 2, 1, 1)],
        opset=9,
    )
    result, _ = _check(proto)
    assert result.transposes_inserted == 2


def test_ops_without_nhwc_form_get_transposes_around_them() -> None:
    proto = _model(
        [
            helper.make_node("Conv", ["x", "w"], ["c"]),
            helper.make_node("LRN", ["c"], ["l"], size=3),
            helper.make_node("Conv", ["l", "w2"], ["y"]),
        ],
        [("x", [1, 3, 6, 6])],
        ["y"],
        [_init("w", 4, 3, 3, 3), _init("w2", 2, 4, 1, 1)],
    )
    result, _ = _check(proto)
    assert result.converted_ops == 2
    assert result.transposes_inserted == 4  # in, around LRN (2), out
    reasons = [c.reason for c in result.conversions]
    assert reasons[0].startswith("Conv ") and reasons[0].endswith("reads it NHWC")
    assert reasons[1].startswith("LRN ") and reasons[1].endswith("reads it NCHW")
    assert reasons[3] == "graph output 'y' stays NCHW"
    assert [c.value for c in result.conversions][:2] == ["x", "c"]


def test_conv1d_pool1d_batchnorm_resize_and_computed_weight() -> None:
    proto = _model(
        [
            helper.make_node("Conv", ["x1", "w1"], ["c1"]),
            helper.make_node("AveragePool", ["c1"], ["y1"], kernel_shape=[2]),
            helper.make_node("Conv", ["x", "wx"], ["c"]),  # weight is a graph input: transposed
            helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["bn"]),
            helper.make_node("Resize", ["bn", "", "scales"], ["rs"], mode="nearest"),
            helper.make_node("MaxPool", ["rs"], ["y", "idx"], kernel_shape=[2, 2]),  # Indices: stays
        ],
        [("x1", [2, 3, 9]), ("x", [1, 2, 4, 4]), ("wx", [3, 2, 1, 1])],
        ["y1", "y"],
        [_init("w1", 4, 3, 2), _init("s", 3), _init("b", 3), _init("m", 3),
         numpy_helper.from_array(np.ones(3, np.float32), "v"),
         numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")],
    )  # fmt: skip
    result, model = _check(proto)
    assert result.converted_ops == 5
    assert _ops(model)["MaxPool"] == 1
    # x1, y1 back, x, and rs back for the MaxPool that keeps Indices; wx [3,2,1,1] -> OHWI
    # only moves unit axes, so a Reshape does it
    assert result.transposes_inserted == 4
    assert result.reshapes_inserted == 1


def test_subgraph_reading_an_nhwc_value_sees_nchw() -> None:
    then_graph = helper.make_graph(
        [helper.make_node("Relu", ["c"], ["t"])],
        "then",
        [],
        [helper.make_tensor_value_info("t", 1, None)],
    )
    else_graph = helper.make_graph(
        [helper.make_node("Neg", ["c"], ["e"])],
        "else",
        [],
        [helper.make_tensor_value_info("e", 1, None)],
    )
    proto = _model(
        [
            helper.make_node("Conv", ["x", "w"], ["c"]),
            helper.make_node("ReduceSum", ["x"], ["sum"], keepdims=0),
            helper.make_node("Greater", ["sum", "zero"], ["cond"]),
            helper.make_node("If", ["cond"], ["y"], then_branch=then_graph, else_branch=else_graph),
        ],
        [("x", [1, 3, 4, 4])],
        ["y"],
        [_init("w", 2, 3, 3, 3), numpy_helper.from_array(np.array(0, np.float32), "zero")],
    )
    _check(proto)


@functools.cache
def _light(name: str) -> onnx.ModelProto:
    return light_model(name)


# name -> (Transposes, Reshapes) left after the rewrite (constants folded first, as the
# pipeline does).  The input is the one transpose; a final [1, C, 1, 1] output stored as
# [1, 1, 1, C] needs only a Reshape; Reshape/Flatten after a global pool read NHWC as is.
LIGHT_GOLDEN = {
    "resnet50": (1, 0),
    "squeezenet": (1, 1),
    "densenet121": (1, 1),
    "inception_v1": (5, 0),  # two LRNs, each needs NCHW and back
    "inception_v2": (1, 0),
    "bvlc_alexnet": (6, 0),  # two LRNs, and the last MaxPool -> Reshape needs NCHW order
    "shufflenet": (17, 0),  # the input, and each of the 16 channel shuffles: the shuffle itself
}


@pytest.mark.parametrize("name", sorted(LIGHT_GOLDEN))
def test_light_models(name: str) -> None:
    result, model = _check(_light(name), fold_first=True)
    transposes, reshapes = LIGHT_GOLDEN[name]
    assert (result.transposes_inserted, result.reshapes_inserted) == (transposes, reshapes)
    assert _ops(model)["Transpose"] == transposes
    convs = sum(1 for n in model.graph if n.op_type == "Conv")
    assert result.converted_ops >= convs > 0
    assert all(n.domain == NHWC_DOMAIN for n in model.graph if n.op_type == "Conv")


# --- random graphs: the rewrite must never change what the model computes ------------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


class _RandomCNN:
    """Builds a random DAG of 4-D ops, tracking shapes so every op is valid."""

    def __init__(self, data: st.DataObject) -> None:
        self.data = data
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.shapes: dict[str, tuple[int, ...]] = {"x": (2, 3, 5, 4)}
        self.rng = np.random.default_rng(data.draw(st.integers(0, 2**16), label="seed"))

    def _name(self, hint: str) -> str:
        return f"{hint}{len(self.nodes)}_{len(self.inits)}"

    def _const(self, shape: tuple[int, ...]) -> str:
        name = self._name("k")
        self.inits.append(numpy_helper.from_array(self.rng.standard_normal(shape).astype(np.float32) * 0.5, name))
        return name

    def _emit(self, op: str, inputs: list[str], shape: tuple[int, ...], **attrs: object) -> None:
        out = self._name(op.lower())
        self.nodes.append(helper.make_node(op, inputs, [out], **attrs))
        self.shapes[out] = shape

    def pick(self) -> str:
        return self.data.draw(st.sampled_from(sorted(self.shapes)), label="operand")

    def step(self) -> None:
        a = self.pick()
        n, c, h, w = self.shapes[a]
        kind = self.data.draw(
            st.sampled_from(
                ["conv", "conv3", "relu", "add_const", "add", "concat", "pool", "gap", "reduce", "softmax",
                 "transpose", "lrn", "slice", "pad"]
            ),
            label="op",
        )  # fmt: skip
        if kind == "conv":
            m = self.data.draw(st.integers(1, 4), label="channels")
            self._emit("Conv", [a, self._const((m, c, 1, 1))], (n, m, h, w))
        elif kind == "conv3":
            self._emit("Conv", [a, self._const((2, c, 3, 3)), self._const((2,))], (n, 2, h, w), pads=[1, 1, 1, 1])
        elif kind == "relu":
            self._emit("Relu", [a], (n, c, h, w))
        elif kind == "add_const":
            self._emit("Add", [a, self._const((c, 1, 1))], (n, c, h, w))
        elif kind == "add":
            same = sorted(k for k, s in self.shapes.items() if s in ((n, c, h, w), (n, c, 1, 1)))
            b = self.data.draw(st.sampled_from(same), label="other")
            self._emit("Mul", [a, b], (n, c, h, w))
        elif kind == "concat":
            same = sorted(k for k, s in self.shapes.items() if s[0] == n and s[2:] == (h, w))
            b = self.data.draw(st.sampled_from(same), label="other")
            self._emit("Concat", [a, b], (n, c + self.shapes[b][1], h, w), axis=1)
        elif kind == "pool":
            self._emit("MaxPool", [a], (n, c, h, w), kernel_shape=[3, 3], pads=[1, 1, 1, 1])
        elif kind == "gap":
            self._emit("GlobalAveragePool", [a], (n, c, 1, 1))
        elif kind == "reduce":
            self._emit("ReduceMean", [a], (n, 1, h, w), axes=[1], keepdims=1)
        elif kind == "softmax":
            axis = self.data.draw(st.integers(1, 3), label="axis")
            self._emit("Softmax", [a], (n, c, h, w), axis=axis)
        elif kind == "transpose":
            self._emit("Transpose", [a], (n, h, w, c), perm=[0, 2, 3, 1])
        elif kind == "lrn":
            self._emit("LRN", [a], (n, c, h, w), size=3)
        elif kind == "slice" and c > 1:
            self._emit("Slice", [a, self._ints([0]), self._ints([c - 1]), self._ints([1])], (n, c - 1, h, w))
        elif kind == "pad":
            self._emit("Pad", [a, self._ints([0, 0, 1, 0, 0, 0, 0, 1])], (n, c, h + 1, w + 1))

    def _ints(self, values: list[int]) -> str:
        name = self._name("i")
        self.inits.append(numpy_helper.from_array(np.array(values, np.int64), name))
        return name

    def model(self) -> onnx.ModelProto:
        produced = [o for node in self.nodes for o in node.output]
        outputs = [produced[-1], *self.data.draw(st.sets(st.sampled_from(produced), max_size=2), label="outs")]
        return _model(self.nodes, [("x", list(self.shapes["x"]))], sorted(set(outputs)), self.inits, opset=17)


@settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_random_graphs_compute_the_same(data: st.DataObject) -> None:
    builder = _RandomCNN(data)
    builder.nodes.append(helper.make_node("Conv", ["x", builder._const((3, 3, 1, 1))], ["start"]))
    builder.shapes["start"] = (2, 3, 5, 4)
    for _ in range(data.draw(st.integers(1, 10), label="length")):
        builder.step()
    result, _ = _check(builder.model())
    assert result.converted_ops >= 1
