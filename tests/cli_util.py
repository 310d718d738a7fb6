"""A small dynamic-batch CNN for the command-line tests (fast to compile on every backend)."""

from __future__ import annotations

import pathlib

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh


def small_net(seed: int = 0, *, size: int = 16) -> onnx.ModelProto:
    """x float32[batch, 3, size, size] -> Conv 3x3 -> Relu -> Conv 1x1 -> Sigmoid*x-like mix -> pooled logits y."""
    rng = np.random.default_rng(seed)

    def const(name: str, shape: tuple[int, ...]) -> onnx.TensorProto:
        return onh.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name)

    nodes = [
        oh.make_node("Conv", ["x", "w0", "b0"], ["c0"], name="conv0", pads=[1, 1, 1, 1]),
        oh.make_node("Relu", ["c0"], ["r0"], name="relu0"),
        oh.make_node("Conv", ["r0", "w1", "b1"], ["c1"], name="conv1"),
        oh.make_node("Sigmoid", ["c1"], ["s1"], name="sigmoid1"),
        oh.make_node("Mul", ["c1", "s1"], ["m1"], name="swish1"),
        oh.make_node("GlobalAveragePool", ["m1"], ["p"], name="pool"),
        oh.make_node("Flatten", ["p"], ["f"], name="flatten"),
        oh.make_node("Gemm", ["f", "wf", "bf"], ["y"], name="fc", transB=1),
    ]
    graph = oh.make_graph(
        nodes,
        "small_net",
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", 3, size, size])],
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["batch", 10])],
        [const("w0", (8, 3, 3, 3)), const("b0", (8,)), const("w1", (8, 8, 1, 1)), const("b1", (8,)),
         const("wf", (10, 8)), const("bf", (10,))],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model


def save_small_net(folder: pathlib.Path, name: str = "SmallNet.onnx", **kwargs: object) -> pathlib.Path:
    path = folder / name
    onnx.save(small_net(**kwargs), path)  # type: ignore[arg-type]
    return path
