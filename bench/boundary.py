"""Boundary-crossing cost: a chain of tiny ops alternating between two backends.

Run from the repository root::

    .venv/bin/python -m bench.boundary

The model is ``Relu, Neg, Relu, Neg, ...`` on a small tensor.  One backend takes only Relu,
the other only Neg, so every op is its own partition and every edge crosses a boundary.  The
same chain run as one partition on one backend is the baseline; the difference, divided by
the number of crossings, is what a crossing costs.  Two pairs are measured: two trivial numpy
backends (what codegraft's own runtime adds per crossing) and OpenVINO <-> onnxruntime (what a
real mixed placement pays, each backend's per-call overhead included).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnx
import onnx_ir as ir
from onnx import TensorProto, helper

import codegraft as cg
from codegraft.backend import Backend, Capabilities, Partition, Runnable, Support

CHAIN = 200
WIDTH = 64


@dataclass(frozen=True)
class BoundaryResult:
    """One pair of backends: the chain split at every edge versus run whole."""

    pair: str
    crossings: int
    split_us: float  # median time of the whole chain, one partition per op
    whole_us: float  # median time of the chain as one partition
    per_crossing_us: float


class OnlyOps:
    """Another backend restricted to some op types (to force a partition per op)."""

    def __init__(self, inner: Backend, ops: Sequence[str]) -> None:
        self.inner = inner
        self.ops = frozenset(ops)
        self.name = f"{inner.name}[{'+'.join(sorted(self.ops))}]"
        self.capabilities = inner.capabilities

    def supports(self, node: ir.Node) -> Support:
        if node.op_type not in self.ops:
            return Support.no(f"restricted to {sorted(self.ops)}")
        return self.inner.supports(node)

    def compile(self, partition: Partition) -> bytes:
        return self.inner.compile(partition)

    def load(self, blob: bytes) -> Runnable:
        return self.inner.load(blob)


class NumpyBackend:
    """Relu and Neg in numpy: a backend whose own call costs next to nothing."""

    name = "numpy"
    capabilities = Capabilities()

    def supports(self, node: ir.Node) -> Support:
        return Support.yes() if node.op_type in ("Relu", "Neg") else Support.no("numpy: Relu and Neg only")

    def compile(self, partition: Partition) -> bytes:
        return ",".join(n.op_type for n in partition.model.graph).encode()

    def load(self, blob: bytes) -> Runnable:
        return _NumpyRunnable(blob.decode().split(","))


class _NumpyRunnable:
    def __init__(self, ops: list[str]) -> None:
        self.ops = ops

    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        x = inputs[0]
        for op in self.ops:
            x = np.maximum(x, 0) if op == "Relu" else np.negative(x)
        return [x]


def chain_model(length: int = CHAIN, width: int = WIDTH) -> onnx.ModelProto:
    """``Relu, Neg, Relu, ...`` of ``length`` ops on a ``[1, width]`` float tensor."""
    nodes, previous = [], "x"
    for index in range(length):
        op = "Relu" if index % 2 == 0 else "Neg"
        nodes.append(helper.make_node(op, [previous], [f"v{index}"], name=f"{op.lower()}{index}"))
        previous = f"v{index}"
    graph = helper.make_graph(
        nodes,
        "boundary_chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width])],
        [helper.make_tensor_value_info(previous, TensorProto.FLOAT, [1, width])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def measure_pair(first: Backend, second: Backend, *, runs: int = 200) -> BoundaryResult:
    """Chain split between ``first`` (Relu) and ``second`` (Neg), versus whole on ``first``."""
    model = chain_model()
    feeds = {"x": np.random.default_rng(0).standard_normal((1, WIDTH)).astype(np.float32)}
    split = cg.compile(model, targets=[OnlyOps(first, ["Relu"]), OnlyOps(second, ["Neg"])], passes=())
    whole = cg.compile(model, targets=[first], passes=())
    crossings = len(split.steps) - 1
    assert crossings == CHAIN - 1, f"expected one partition per op, got {len(split.steps)}"
    split_us = _median_us(lambda: split.run(feeds), runs)
    whole_us = _median_us(lambda: whole.run(feeds), runs)
    return BoundaryResult(
        f"{first.name} <-> {second.name}", crossings, split_us, whole_us, (split_us - whole_us) / crossings
    )


def _median_us(call: object, runs: int) -> float:
    assert callable(call)
    for _ in range(10):
        call()
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        call()
        samples.append((time.perf_counter() - start) * 1e6)
    return statistics.median(samples)


def measure_all(threads: int = 1) -> list[BoundaryResult]:
    """The numpy pair and, when installed, OpenVINO <-> onnxruntime."""
    from codegraft.backends.onnxruntime import OnnxRuntimeBackend

    results = [measure_pair(NumpyBackend(), NumpyBackend())]
    try:
        from codegraft.backends.openvino import OpenVINOBackend

        openvino = OpenVINOBackend(num_threads=threads)
    except cg.BackendUnavailable:
        return results
    results.append(measure_pair(openvino, OnnxRuntimeBackend(threads=threads)))
    return results


def render(results: Sequence[BoundaryResult]) -> str:
    """A Markdown table of the results."""
    lines = [
        (
            f"Chain of {CHAIN} tiny ops on a [1, {WIDTH}] float tensor, one partition per op, "
            "versus the same chain as one partition (medians)."
        ),
        "",
        "| backends | crossings | split, us | whole, us | us per crossing |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(f"| {r.pair} | {r.crossings} | {r.split_us:.0f} | {r.whole_us:.0f} | {r.per_crossing_us:.1f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(render(measure_all()))
