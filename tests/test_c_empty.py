"""Empty tensors at run time on the ``c`` backend: no data, so constants, and no kernel sees one.

A NonZero that finds nothing hands an empty tensor on (piper's spline flows; detectors with no
detection).  Before, a partition compiled per input shape refused any empty value and ran on
the host at that shape, with a warning and a fallback in the report each time.  Now the
translation binds empty values to constants: nodes whose outputs are all empty compute
nothing, nodes reading only constants and empties fold (a ReduceSum of nothing is 0, as the
spec and onnxruntime say), a Concat drops its empty operands and a Scatter of no updates is its
data.  Each case is compared with onnxruntime, and must run on ``c`` with no fallback.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from c_backend_util import needs_compiler
from onnx import TensorProto, helper, numpy_helper

import codegraft as cg
from codegraft.testing import run_onnxruntime

pytestmark = needs_compiler

F = TensorProto.FLOAT
RNG = np.random.default_rng(0)


def _model(nodes: list, inputs: dict, outputs: list[str], inits: dict | None = None) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info(name, dtype, shape) for name, (dtype, shape) in inputs.items()],
        [helper.make_tensor_value_info(name, F, None) for name in outputs],
        [numpy_helper.from_array(v, k) for k, v in (inits or {}).items()],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _floats(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


CASES = {
    # every value downstream of the empty input is empty: nothing to compute
    "all empty": (
        [helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0]), helper.make_node("Relu", ["t"], ["y"])],
        {"x": (F, ["n", 3])}, ["y"], None, {"x": _floats(0, 3)},
    ),
    "concat drops the empty operand": (
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Concat", ["r", "z"], ["c"], axis=0),
         helper.make_node("Sigmoid", ["c"], ["y"])],
        {"x": (F, ["n", 3]), "z": (F, [2, 3])}, ["y"], None, {"x": _floats(0, 3), "z": _floats(2, 3)},
    ),
    "scatter of no updates is its data": (
        [helper.make_node("Sigmoid", ["d"], ["s"]), helper.make_node("ScatterND", ["s", "i", "u"], ["o"]),
         helper.make_node("Relu", ["o"], ["y"])],
        {"d": (F, [4, 3]), "i": (TensorProto.INT64, ["n", 1]), "u": (F, ["n", 3])}, ["y"], None,
        {"d": _floats(4, 3), "i": np.zeros((0, 1), np.int64), "u": _floats(0, 3)},
    ),
    "scatter elements of no updates is its data": (
        [helper.make_node("ScatterElements", ["d", "i", "u"], ["o"], axis=0), helper.make_node("Neg", ["o"], ["y"])],
        {"d": (F, [4, 3]), "i": (TensorProto.INT64, ["n", 3]), "u": (F, ["n", 3])}, ["y"], None,
        {"d": _floats(4, 3), "i": np.zeros((0, 3), np.int64), "u": _floats(0, 3)},
    ),
    "a sum of nothing is zero": (
        [helper.make_node("ReduceSum", ["x", "axes"], ["r"], keepdims=0), helper.make_node("Add", ["r", "z"], ["y"])],
        {"x": (F, ["n", 3]), "z": (F, [3])}, ["y"], {"axes": np.array([0], np.int64)},
        {"x": _floats(0, 3), "z": _floats(3)},
    ),
    "an empty gather beside a full output": (
        [helper.make_node("Transpose", ["nz"], ["t"], perm=[1, 0]), helper.make_node("GatherND", ["d", "t"], ["g"]),
         helper.make_node("Sigmoid", ["d"], ["s"])],
        {"nz": (TensorProto.INT64, [2, "n"]), "d": (F, [4, 5])}, ["g", "s"], None,
        {"nz": np.zeros((2, 0), np.int64), "d": _floats(4, 5)},
    ),
    "a product over nothing is zero": (
        [helper.make_node("MatMul", ["a", "b"], ["m"]), helper.make_node("Add", ["m", "z"], ["y"])],
        {"a": (F, [2, "k"]), "b": (F, ["k", 3]), "z": (F, [2, 3])}, ["y"], None,
        {"a": _floats(2, 0), "b": _floats(0, 3), "z": _floats(2, 3)},
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_empty_tensors_run_on_c_as_onnxruntime_runs_them(case: str) -> None:
    nodes, inputs, outputs, inits, feeds = CASES[case]
    model = _model(nodes, inputs, outputs, inits)
    exe = cg.compile(model, targets=["c"])
    got = exe.run(feeds)
    want = run_onnxruntime(model, feeds)
    for name in outputs:
        assert got[name].shape == want[name].shape, name
        assert got[name].dtype == want[name].dtype, name
        np.testing.assert_allclose(got[name], want[name], rtol=1e-6, atol=1e-6)
    report = exe.report()
    assert [p.backend for p in report.partitions] == ["c"]
    assert not any(p.fallback_error for p in report.partitions), [p.fallback_error for p in report.partitions]


def test_the_same_partition_runs_full_and_empty_shapes() -> None:
    """One executable, a batch of 3 then of 0 then of 3 again: each on ``c``, each right."""
    nodes, inputs, outputs, inits, _ = CASES["concat drops the empty operand"]
    model = _model(nodes, inputs, outputs, inits)
    exe = cg.compile(model, targets=["c"])
    z = _floats(2, 3)
    for n in (3, 0, 3):
        feeds = {"x": _floats(n, 3), "z": z}
        np.testing.assert_allclose(exe.run(feeds)["y"], run_onnxruntime(model, feeds)["y"], rtol=1e-6, atol=1e-6)
    assert not any(p.fallback_error for p in exe.report().partitions)


def test_an_empty_output_shape_inference_missed_is_found_by_evaluating_the_node() -> None:
    """A partition specialised on its shape values after inference (table_det's TopK, whose K
    became known) has outputs of unknown shape downstream: a Gather of no indices is then
    found empty by evaluating it on zeros in place of its data, and computes nothing."""
    import onnx_ir as ir

    from codegraft.backends.c._translate import translate

    graph = helper.make_graph(
        [helper.make_node("Gather", ["d", "idx"], ["g"]), helper.make_node("Relu", ["g"], ["y"]),
         helper.make_node("Sigmoid", ["d"], ["s"])],
        "g", [helper.make_tensor_value_info("d", F, [4, 3])],
        [helper.make_tensor_value_info("y", F, None), helper.make_tensor_value_info("s", F, None)],
        [numpy_helper.from_array(np.zeros(0, np.int64), "idx")],
    )  # fmt: skip
    model = ir.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    lowered = translate(model)
    assert lowered.outputs[0].shape == (0, 3) and lowered.outputs[0].const is not None
    assert len(lowered.ops) == 1  # the Sigmoid's, and nothing for the Gather or the Relu


def test_a_slice_found_empty_only_by_the_lowering_computes_nothing() -> None:
    """RivaGAN's encoder slices nothing off a tensor for a Concat; shape inference did not say
    so, the lowering does: the Slice's output is an empty constant and no kernel makes it."""
    import onnx_ir as ir

    from codegraft.backends.c._translate import translate

    graph = helper.make_graph(
        [helper.make_node("Slice", ["x", "starts", "ends", "axes"], ["nothing"]),
         helper.make_node("Concat", ["nothing", "x"], ["c"], axis=1), helper.make_node("Relu", ["c"], ["y"])],
        "g", [helper.make_tensor_value_info("x", F, [1, 4])], [helper.make_tensor_value_info("y", F, None)],
        [numpy_helper.from_array(np.array([v], np.int64), n) for n, v in (("starts", 4), ("ends", 10), ("axes", 1))],
    )  # fmt: skip
    lowered = translate(ir.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])))
    assert lowered.outputs[0].shape == (1, 4)
    assert all(0 not in op.out.shape for op in lowered.ops)
