"""Each distinct convolution of a light model alone, caches flushed: ``c``'s kernel against onnxruntime's.

Run from the repository root::

    .venv/bin/python -m bench.c_layers [--model resnet50] [--threads 1] [--repeat 7] [--flush-mb 400]

A whole-model ratio (``bench.c_models``) says how far ``c`` is from onnxruntime, not where.
This one builds, for each distinct Conv of the model (weights, input shape, strides, pads,
groups; counted by how often it occurs), a model of that Conv with a bias and a Relu, and
times one call at a time with the caches flushed before each (``--flush-mb`` of memory
rewritten): inside a model a layer's weights come from memory, since no layer runs twice in
a row.  ``c`` is read from its own kernel timers (the Conv kernel alone, padding copy
included, without the layout transposes a one-layer partition adds); onnxruntime from its
profiler (the Conv node alone, without its NCHWc reorders).  Printed per layer: the medians
and their ratio, then the total weighted by occurrences.

The random weights and inputs come from a fixed seed; the same-seeded light model
(``codegraft.testing.light_model``) only supplies the shapes.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import tempfile
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from codegraft.backend import Partition
from codegraft.backends.c import CBackend
from codegraft.testing import light_model


@dataclass(frozen=True)
class Layer:
    """One distinct convolution: its attributes, weight and input shapes, and how often it occurs."""

    weight: tuple[int, ...]
    input: tuple[int, ...]
    attributes: tuple[tuple[str, object], ...]
    count: int


def distinct_convs(model: onnx.ModelProto) -> list[Layer]:
    """The model's Conv nodes grouped by (weight shape, input shape, attributes), in order of first use."""
    inferred = onnx.shape_inference.infer_shapes(model)
    shapes = {
        v.name: tuple(d.dim_value for d in v.type.tensor_type.shape.dim)
        for v in (*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output)
    }
    weights = {t.name: tuple(t.dims) for t in model.graph.initializer}
    counts: dict[tuple[tuple[int, ...], tuple[int, ...], tuple[tuple[str, object], ...]], int] = {}
    for node in model.graph.node:
        if node.op_type != "Conv":
            continue
        attributes = tuple(sorted((a.name, _plain(helper.get_attribute_value(a))) for a in node.attribute))
        key = (weights[node.input[1]], shapes[node.input[0]], attributes)
        counts[key] = counts.get(key, 0) + 1
    return [Layer(w, x, a, n) for (w, x, a), n in counts.items()]


def _plain(value: object) -> object:
    return tuple(value) if isinstance(value, list) else value


def layer_model(layer: Layer, rng: np.random.Generator) -> onnx.ModelProto:
    """Conv (random weights, a bias) followed by Relu, on an input of the layer's shape."""
    weight = (rng.standard_normal(layer.weight) * 0.05).astype(np.float32)
    bias = rng.standard_normal(layer.weight[0]).astype(np.float32)
    attributes: dict[str, Any] = {k: list(v) if isinstance(v, tuple) else v for k, v in layer.attributes}
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", **attributes),
        helper.make_node("Relu", ["c"], ["y"], name="relu"),
    ]
    graph = helper.make_graph(
        nodes, "layer", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(layer.input))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(weight, "w"), numpy_helper.from_array(bias, "b")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def time_layer(model: onnx.ModelProto, threads: int, repeat: int, flush: np.ndarray) -> tuple[float, float]:
    """Median ms of ``c``'s Conv kernel and onnxruntime's Conv node, one cold call at a time."""
    x = np.random.default_rng(1).standard_normal(
        [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]).astype(np.float32)
    backend = CBackend(num_threads=threads)
    runnable = backend.load(backend.compile(Partition("layer", ir.from_proto(model))))
    with tempfile.TemporaryDirectory() as folder:
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.enable_profiling = True
        options.profile_file_prefix = str(pathlib.Path(folder) / "layer")
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        runnable.run([x])
        session.run(None, {"x": x})
        c_ms = []
        for _ in range(repeat):
            flush += 1.0
            kernels = runnable.profile_ops([x], 1, warm_up=False)
            c_ms.append(next(k.ms for k in kernels if k.op_type.startswith("Conv")))
            flush += 1.0
            session.run(None, {"x": x})
        events = json.loads(pathlib.Path(session.end_profiling()).read_text())
    ort_ms = [e["dur"] / 1e3 for e in events
              if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and e["args"].get("op_name") == "Conv"]
    return statistics.median(c_ms), statistics.median(ort_ms[-repeat:])


def describe(layer: Layer) -> str:
    """``256->1024 1x1 @14x14 s1`` (groups shown when more than one)."""
    attributes = dict(layer.attributes)
    groups = int(str(attributes.get("group", 1)))
    strides = attributes.get("strides", (1, 1))
    kernel = "x".join(map(str, layer.weight[2:]))
    text = f"{layer.weight[1] * groups}->{layer.weight[0]} {kernel} @{'x'.join(map(str, layer.input[2:]))}"
    text += f" s{strides[0]}" if isinstance(strides, tuple) else ""
    return text + (f" g{groups}" if groups > 1 else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--flush-mb", type=int, default=400, help="memory rewritten before each call")
    args = parser.parse_args()
    flush = np.ones(args.flush_mb << 18, np.float32)
    rng = np.random.default_rng(0)
    print(f"{args.model}, {args.threads} thread(s), median of {args.repeat} cold calls, host {os.cpu_count()} cores")
    print("| layer | uses | c ms | onnxruntime ms | c / onnxruntime |")
    print("|---|---:|---:|---:|---:|")
    total_c = total_ort = 0.0
    for layer in distinct_convs(light_model(args.model)):
        c_ms, ort_ms = time_layer(layer_model(layer, rng), args.threads, args.repeat, flush)
        total_c += c_ms * layer.count
        total_ort += ort_ms * layer.count
        print(f"| {describe(layer)} | {layer.count} | {c_ms:.3f} | {ort_ms:.3f} | {c_ms / ort_ms:.2f} |", flush=True)
    print(f"| weighted total | | {total_c:.2f} | {total_ort:.2f} | {total_c / total_ort:.3f} |")


if __name__ == "__main__":
    main()
