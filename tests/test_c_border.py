"""A GEMM Conv or a pool whose result only feeds a padded Conv writes it inside that Conv's zero border
(``_fuse._write_into_borders``), so the reader's padding copy goes; results stay onnxruntime's."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from c_backend_util import backend, feeds_for, make_model, needs_compiler
from onnx import helper

from codegraft.backend import Partition
from codegraft.backends.c._codegen import generate
from codegraft.backends.c._toolchain import host_target
from codegraft.testing import assert_close, run_onnxruntime

pytestmark = needs_compiler


def _chain(also_read: bool) -> onnx.ModelProto:
    """Two images of 13 x 11 pixels (rows of output pixels that tiles straddle) through three
    3x3 Convs: symmetric pads, asymmetric pads, then stride 2; optionally the first Conv's
    result is read by a Sigmoid too."""
    rng = np.random.default_rng(0)
    weights = {
        "w0": (rng.standard_normal((24, 8, 3, 3)) * 0.2).astype(np.float32),
        "w1": (rng.standard_normal((40, 24, 3, 3)) * 0.1).astype(np.float32),
        "w2": (rng.standard_normal((16, 40, 3, 3)) * 0.1).astype(np.float32),
        "b1": rng.standard_normal(40).astype(np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["c0"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c0"], ["a"]),
        helper.make_node("Conv", ["a", "w1", "b1"], ["c1"], pads=[1, 2, 1, 0]),
        helper.make_node("Relu", ["c1"], ["b"]),
        helper.make_node("Conv", ["b", "w2"], ["y"], pads=[1, 1, 1, 1], strides=[2, 2]),
    ]
    outputs = ["y"]
    if also_read:
        nodes.append(helper.make_node("Sigmoid", ["a"], ["s"]))
        outputs.append("s")
    return make_model(nodes, {"x": (2, 8, 13, 11)}, outputs, weights)


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("also_read", [False, True])
def test_convs_written_into_the_next_ones_border_give_onnxruntime_results(also_read: bool, threads: int) -> None:
    model = _chain(also_read)
    source = generate(ir.from_proto(model), host_target(), threads=threads).source
    # the first Conv reads the partition's input (after a layout transpose): it keeps its copy
    borders = 1 if also_read else 2
    assert (source.count("  cg_pad("), source.count("  cg_zero_border(")) == (3 - borders, borders)
    feeds = feeds_for(model)
    partition = Partition("p", ir.from_proto(model))
    runnable = backend(num_threads=threads).load(backend(num_threads=threads).compile(partition))
    expected = run_onnxruntime(model, feeds)
    for _ in range(2):  # the second call runs over the first one's scratch: borders must be zero again
        got = runnable.run([feeds[name] for name in partition.input_names])
        assert_close(dict(zip(partition.output_names, got, strict=True)), expected)


@pytest.mark.parametrize("threads", [1, 3])
def test_pools_written_into_the_next_convs_border_give_onnxruntime_results(threads: int) -> None:
    """MaxPool and a padded AveragePool (which counts only real pixels) each feeding a padded Conv."""
    rng = np.random.default_rng(1)
    weights = {f"w{i}": (rng.standard_normal((16, c, 3, 3)) * 0.2).astype(np.float32)
               for i, c in enumerate((3, 16, 16))}
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["c0"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c0"], ["r0"]),
        helper.make_node("MaxPool", ["r0"], ["p0"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p0", "w1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("AveragePool", ["r1"], ["p1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["p1", "w2"], ["y"], pads=[0, 1, 2, 1]),
    ]
    model = make_model(nodes, {"x": (2, 3, 19, 15)}, ["y"], weights)
    source = generate(ir.from_proto(model), host_target(), threads=threads).source
    assert (source.count("  cg_pad("), source.count("  cg_zero_border(")) == (1, 2)
    feeds = feeds_for(model)
    partition = Partition("p", ir.from_proto(model))
    runnable = backend(num_threads=threads).load(backend(num_threads=threads).compile(partition))
    expected = run_onnxruntime(model, feeds)
    for _ in range(2):
        got = runnable.run([feeds[name] for name in partition.input_names])
        assert_close(dict(zip(partition.output_names, got, strict=True)), expected)
