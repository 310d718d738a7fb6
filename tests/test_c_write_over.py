"""A GEMM kernel's residual Add writes its result over the residual when nothing reads that
afterwards (``Context.write_over``), and never when something still does."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
from c_backend_util import backend, feeds_for, make_model, needs_compiler
from onnx import helper

from codegraft.backend import Partition
from codegraft.backends.c._codegen import generate
from codegraft.backends.c._toolchain import host_target
from codegraft.testing import assert_close, run_onnxruntime

pytestmark = needs_compiler


def _block(residual_used_after: bool, residual_is_output: bool = False) -> onnx.ModelProto:
    """x -> 1x1 conv -> relu = a -> 1x1 conv -> relu = b -> 1x1 conv + a -> relu, over 64 channels
    at 20x20; optionally ``a`` also feeds a later Sigmoid, or is a graph output."""
    rng = np.random.default_rng(0)
    weights = {f"w{i}": (rng.standard_normal((64, 64, k, k)) * 0.1).astype(np.float32)
               for i, k in enumerate((1, 1, 1))}
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["c0"]),
        helper.make_node("Relu", ["c0"], ["a"]),
        helper.make_node("Conv", ["a", "w1"], ["c1"]),
        helper.make_node("Relu", ["c1"], ["b"]),
        helper.make_node("Conv", ["b", "w2"], ["c2"]),
        helper.make_node("Add", ["c2", "a"], ["s"]),
        helper.make_node("Relu", ["s"], ["y"]),
    ]
    outputs = ["y"]
    if residual_used_after:
        nodes.append(helper.make_node("Sigmoid", ["a"], ["later"]))
        outputs.append("later")
    if residual_is_output:
        outputs.append("a")
    return make_model(nodes, {"x": (1, 64, 20, 20)}, outputs, weights)


def _scratch(model: onnx.ModelProto) -> int:
    return generate(ir.from_proto(model), host_target(), threads=1).scratch_floats


def _matches_onnxruntime(model: onnx.ModelProto) -> None:
    feeds = feeds_for(model)
    partition = Partition("p", ir.from_proto(model))
    runnable = backend(num_threads=2).load(backend(num_threads=2).compile(partition))
    expected = run_onnxruntime(model, feeds)
    for _ in range(2):  # the second call runs over the first one's scratch
        got = runnable.run([feeds[name] for name in partition.input_names])
        assert_close(dict(zip(partition.output_names, got, strict=True)), expected)


def test_the_last_reader_writes_over_the_residual() -> None:
    block = _block(residual_used_after=False)
    kept = _block(residual_used_after=True)
    # a, b and the sum each take 64 x 20 x 20 floats of scratch, all live at the last conv
    # unless the sum is written over a
    assert _scratch(block) == 2 * 64 * 20 * 20 and _scratch(kept) == 3 * 64 * 20 * 20
    _matches_onnxruntime(block)


def test_a_residual_read_later_or_returned_is_kept() -> None:
    _matches_onnxruntime(_block(residual_used_after=True))
    _matches_onnxruntime(_block(residual_used_after=False, residual_is_output=True))


def test_a_conv_adding_its_own_input_does_not_write_over_it() -> None:
    """conv(x) + x: the kernel still reads x's rows for other tiles while it writes."""
    rng = np.random.default_rng(1)
    weights = {"w": (rng.standard_normal((64, 64, 3, 3)) * 0.1).astype(np.float32)}
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Conv", ["r", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c", "r"], ["y"]),
    ]
    _matches_onnxruntime(make_model(nodes, {"x": (1, 64, 12, 12)}, ["y"], weights))
