"""Each distinct convolution of a light model, ``c``'s kernel against onnxruntime's: alone or in the model.

Run from the repository root::

    .venv/bin/python -m bench.c_layers [--model resnet50] [--threads 1] [--repeat 7] [--flush-mb 400]
    .venv/bin/python -m bench.c_layers --in-model [--model vgg19] [--threads 1] [--repeat 15]

A whole-model ratio (``bench.c_models``) says how far ``c`` is from onnxruntime, not where.
This one builds, for each distinct Conv of the model (weights, input shape, strides, pads,
groups; counted by how often it occurs), a model of that Conv with a bias and a Relu, and
times one call at a time with the caches flushed before each (``--flush-mb`` of memory
rewritten): inside a model a layer's weights come from memory, since no layer runs twice in
a row.  ``c`` is read from its own kernel timers (the Conv kernel alone, padding copy
included, without the layout transposes a one-layer partition adds); onnxruntime from its
profiler (the Conv node alone, without its NCHWc reorders).  Printed per layer: the medians
and their ratio, then the total weighted by occurrences.

With ``--in-model`` the whole model runs, ``c`` and onnxruntime called in turn, each with
its per-kernel timers (``CRunnable.profile_ops``, onnxruntime's profiler), and each Conv is
timed where it sits: its input from the layer before, in cache when it fits, as users run it.
Alone and in the model can differ by a third (vgg19's 256 -> 256 3x3 at 56x56 on an AVX-512
Xeon: onnxruntime 30.5 ms alone, 22.0 ms in the model); the in-model table says where the
whole-model gap comes from, the one-layer runs let a layer be studied alone.  onnxruntime
fuses a Conv with the BatchNormalization, Add and activation after it and names the node
after its last output: each such node is traced back to its Conv (``conv_of_ort_nodes``).

The random weights and inputs come from a fixed seed; the same-seeded light model
(``codegraft.testing.light_model``) only supplies the shapes.
"""

from __future__ import annotations

import argparse
import json
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

from bench.c_ops import on_c, settle
from codegraft.backend import Partition
from codegraft.backends.c import CBackend
from codegraft.backends.c._toolchain import usable_cpus
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
    counts: dict[tuple[tuple[int, ...], tuple[int, ...], tuple[tuple[str, object], ...]], int] = {}
    for key in conv_keys(model).values():
        counts[key] = counts.get(key, 0) + 1
    return [Layer(w, x, a, n) for (w, x, a), n in counts.items()]


def conv_keys(
    model: onnx.ModelProto,
) -> dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[tuple[str, object], ...]]]:
    """Each Conv node's name -> (weight shape, input shape, attributes), in graph order."""
    inferred = onnx.shape_inference.infer_shapes(model)
    shapes = {
        v.name: tuple(d.dim_value for d in v.type.tensor_type.shape.dim)
        for v in (*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output)
    }
    weights = {t.name: tuple(t.dims) for t in model.graph.initializer}
    keys = {}
    for node in model.graph.node:
        if node.op_type == "Conv":
            attributes = tuple(sorted((a.name, _plain(helper.get_attribute_value(a))) for a in node.attribute))
            keys[node.name] = (weights[node.input[1]], shapes[node.input[0]], attributes)
    return keys


# What onnxruntime's CPU provider fuses into the Conv before it (its fused Conv nodes are
# named after the last of these).
_FUSED_AFTER_CONV = {"BatchNormalization", "Relu", "Add", "Sum", "Clip", "LeakyRelu", "Sigmoid", "HardSigmoid"}


def conv_of_ort_nodes(model: onnx.ModelProto, names: list[str]) -> dict[str, str]:
    """onnxruntime node name -> the Conv node it runs, for the ones that run a Conv.

    A name is a node's (a Conv, alone or with what onnxruntime fused into it, or any other
    node it ran on its own: a Sum or Relu after a Conv is not the Conv) or, less ``_nchwc``,
    the output of the last node fused into an NCHWc Conv; from there the graph is walked back
    through fusable ops to Conv nodes.  Where an Add joins two convolutions (a residual with a
    projection), the other one has its own onnxruntime node: each node gets the Conv no
    other node claims::

        >>> from codegraft.testing import light_model
        >>> conv_of_ort_nodes(light_model("squeezenet"), ["r1_nchwc", "n3", "n4"])
        {'r1_nchwc': 'n0', 'n3': 'n3'}
    """
    by_name = {n.name: n for n in model.graph.node}
    producer = {o: n for n in model.graph.node for o in n.output}
    candidates: dict[str, list[str]] = {}
    for name in names:
        if name in by_name:  # a node onnxruntime ran under its own name: a Conv or not one
            if by_name[name].op_type == "Conv":
                candidates[name] = [name]
            continue
        start = producer.get(name.removesuffix("_nchwc"))
        found: list[str] = []
        todo = [start] if start is not None else []
        while todo:
            node = todo.pop(0)
            if node.op_type == "Conv":
                found.append(node.name)
            elif node.op_type in _FUSED_AFTER_CONV:
                todo += [producer[i] for i in node.input if i in producer]
        if found:
            candidates[name] = found
    claimed = {found[0] for found in candidates.values() if len(found) == 1}
    result = {}
    for name, found in sorted(candidates.items(), key=lambda item: len(item[1])):
        choice = found[0] if len(found) == 1 else next((f for f in found if f not in claimed), found[0])
        claimed.add(choice)
        result[name] = choice
    return result


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


def _profiling_session(model: onnx.ModelProto, threads: int, folder: str) -> ort.InferenceSession:
    """onnxruntime as its users run it (default options, ``threads`` intra-op threads), profiling
    into ``folder``."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.enable_profiling = True
    options.profile_file_prefix = str(pathlib.Path(folder) / "profile")
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def time_layer(model: onnx.ModelProto, threads: int, repeat: int, flush: np.ndarray) -> tuple[float, float]:
    """Median ms of ``c``'s Conv kernel and onnxruntime's Conv node, one cold call at a time."""
    x = np.random.default_rng(1).standard_normal(
        [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]).astype(np.float32)
    backend = CBackend(num_threads=threads)
    runnable = backend.load(backend.compile(Partition("layer", ir.from_proto(model))))
    with tempfile.TemporaryDirectory() as folder:
        session = _profiling_session(model, threads, folder)
        runnable.run([x])
        session.run(None, {"x": x})
        c_ms = []
        for _ in range(repeat):
            flush += 1.0
            settle()
            kernels = runnable.profile_ops([x], 1, warm_up=False)
            c_ms.append(next(k.ms for k in kernels if k.op_type.startswith("Conv")))
            flush += 1.0
            settle()
            session.run(None, {"x": x})
        events = json.loads(pathlib.Path(session.end_profiling()).read_text())
    ort_ms = [e["dur"] / 1e3 for e in events
              if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")
              and e["args"].get("op_name") in ("Conv", "FusedConv")]  # FusedConv: a grouped Conv + Relu
    return statistics.median(c_ms), statistics.median(ort_ms[-repeat:])


def time_in_model(model: onnx.ModelProto, threads: int, repeat: int) -> dict[str, tuple[float, float]]:
    """Each Conv node's median ms inside the whole model, ``(c, onnxruntime)``, the two called in
    turn ``repeat`` times after a warm-up; onnxruntime with default session options."""
    runnable, inputs, feeds = on_c(model, threads, seed=1)
    convs = set(conv_keys(model))
    c_ms: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as folder:
        session = _profiling_session(model, threads, folder)
        runnable.run(inputs)
        session.run(None, feeds)
        for _ in range(repeat):
            settle()  # onnxruntime's workers spin on after its run: c would share the cores with them
            for kernel in runnable.profile_ops(inputs, 1, warm_up=False):
                if kernel.name in convs:
                    c_ms.setdefault(kernel.name, []).append(kernel.ms)
            settle()
            session.run(None, feeds)
        events = json.loads(pathlib.Path(session.end_profiling()).read_text())
    ort_events: dict[str, list[float]] = {}
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            ort_events.setdefault(event["name"].removesuffix("_kernel_time"), []).append(event["dur"] / 1e3)
    ort_ms: dict[str, float] = {}
    for name, conv in conv_of_ort_nodes(model, list(ort_events)).items():  # one node per Conv, summed if not
        ort_ms[conv] = ort_ms.get(conv, 0.0) + statistics.median(ort_events[name][-repeat:])
    return {name: (statistics.median(times), ort_ms[name]) for name, times in c_ms.items() if name in ort_ms}


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
    parser.add_argument("--in-model", action="store_true", help="time each Conv inside the whole model instead")
    args = parser.parse_args()
    if args.in_model:
        print_in_model(args.model, args.threads, args.repeat)
        return
    flush = np.ones(args.flush_mb << 18, np.float32)
    rng = np.random.default_rng(0)
    print(f"{args.model}, {args.threads} thread(s), median of {args.repeat} cold calls, host {usable_cpus()} cores")
    print("| layer | uses | c ms | onnxruntime ms | c / onnxruntime |")
    print("|---|---:|---:|---:|---:|")
    total_c = total_ort = 0.0
    for layer in distinct_convs(light_model(args.model)):
        c_ms, ort_ms = time_layer(layer_model(layer, rng), args.threads, args.repeat, flush)
        total_c += c_ms * layer.count
        total_ort += ort_ms * layer.count
        print(f"| {describe(layer)} | {layer.count} | {c_ms:.3f} | {ort_ms:.3f} | {c_ms / ort_ms:.2f} |", flush=True)
    print(f"| weighted total | | {total_c:.2f} | {total_ort:.2f} | {total_c / total_ort:.3f} |")


def side_by_side(model: onnx.ModelProto, threads: int) -> set[str]:
    """The Conv nodes ``c`` runs beside other kernels at ``threads`` (concurrent stages): each
    one's timer runs from its own start to its end on its share of the threads, so their times
    overlap and add up to more than the wall time they took."""
    program = CBackend(num_threads=threads).generate(Partition("bench", ir.from_proto(model)))
    together = {index for stage in program.stages if stage.concurrent for index in stage.kernels}
    convs = set(conv_keys(model))
    return {program.threads[index].node for index in together} & convs


def print_in_model(name: str, threads: int, repeat: int) -> None:
    """The ``--in-model`` table: per distinct layer, the mean over its uses of each Conv's median;
    ``*`` marks layers some of whose uses ran side by side with other kernels."""
    model = light_model(name)
    times = time_in_model(model, threads, repeat)
    together = side_by_side(model, threads)
    groups: dict[Layer, list[tuple[float, float]]] = {}
    keys = conv_keys(model)
    layers = {(layer.weight, layer.input, layer.attributes): layer for layer in distinct_convs(model)}
    marked: set[Layer] = set()
    for conv, pair in times.items():
        groups.setdefault(layers[keys[conv]], []).append(pair)
        if conv in together:
            marked.add(layers[keys[conv]])
    print(f"{name}, {threads} thread(s), in the model, medians of {repeat} calls, host {usable_cpus()} cores")
    print("| layer | uses | c ms | onnxruntime ms | c / onnxruntime |")
    print("|---|---:|---:|---:|---:|")
    for layer, pairs in groups.items():
        c_ms, ort_ms = (sum(p[i] for p in pairs) / len(pairs) for i in (0, 1))
        mark = " *" if layer in marked else ""
        print(f"| {describe(layer)}{mark} | {len(pairs)} | {c_ms:.3f} | {ort_ms:.3f} | {c_ms / ort_ms:.2f} |")
    total_c, total_ort = (sum(pair[i] for pair in times.values()) for i in (0, 1))
    missing = len(keys) - len(times)
    print(f"| all {len(times)} Conv nodes{f' ({missing} not matched)' if missing else ''} | | {total_c:.2f} | "
          f"{total_ort:.2f} | {total_c / total_ort:.3f} |")
    if marked:
        print(f"* {len(together)} of these ran side by side with other kernels (on a share of the threads each); "
              "their times overlap, so their sum exceeds the wall time they took")


if __name__ == "__main__":
    main()
