"""How partitioning scales: synthetic graphs of 1k, 10k and 100k nodes.

Each graph is a chain of blocks with skip connections (Add of a value a few blocks back)
and an op no test backend supports every few nodes, so it is a real DAG with many regions.
Timed: annotation (asking two backends about every node), the partitioner, and planning each
partition's inputs/outputs/constants.  Not timed: building the graph.

Run: ``python bench/partition_scale.py [sizes...]``
"""

from __future__ import annotations

import sys
import time

import onnx_ir as ir

from codegraft.plan.annotate import annotate
from codegraft.plan.extract import plan_partitions
from codegraft.plan.partition import partition_units
from codegraft.testing import SubsetBackend


def synthetic_graph(nodes: int, *, seed: int = 0) -> ir.Model:
    """A [1, 16] float graph of ``nodes`` ops: Relu/Mul/Tanh chains, skip Adds, some Sin."""
    x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([1, 16]))
    graph = ir.Graph([x], [], nodes=[], opset_imports={"": 17})
    values = [x]
    for index in range(nodes):
        if index % 7 == 6:
            inputs, op = [values[-1], values[max(0, len(values) - 5)]], "Add"  # skip connection
        elif index % 11 == 10:
            inputs, op = [values[-1]], "Sin"  # unsupported by both test backends
        elif index % 13 == 12:
            inputs, op = [values[-1]], "Tanh"  # only the second backend
        else:
            inputs, op = [values[-1]], ("Relu", "Neg")[index % 2]
        node = ir.Node("", op, inputs, name=f"n{index}", num_outputs=1)
        node.outputs[0].name = f"v{index}"
        node.outputs[0].type = ir.TensorType(ir.DataType.FLOAT)
        node.outputs[0].shape = ir.Shape([1, 16])
        graph.append(node)
        values.append(node.outputs[0])
    graph.outputs.append(values[-1])
    return ir.Model(graph, ir_version=10)


def time_partitioning(model: ir.Model) -> tuple[float, int]:
    backends = [SubsetBackend("a", {"Relu", "Neg", "Add"}), SubsetBackend("b", {"Relu", "Tanh", "Add"})]
    start = time.perf_counter()
    annotation = annotate(model.graph, backends, host="onnxruntime")
    groups = partition_units(
        [u.backend for u in annotation.units], annotation.unit_predecessors(), host="onnxruntime", preference=["a", "b"]
    )
    plan = plan_partitions(model, annotation, groups)
    return time.perf_counter() - start, len(plan.partitions)


def main(sizes: list[int]) -> None:
    previous: tuple[int, float] | None = None
    print(f"{'nodes':>8} {'partitions':>10} {'seconds':>9} {'vs previous':>24}")
    for size in sizes:
        model = synthetic_graph(size)
        seconds, partitions = time_partitioning(model)
        ratio = ""
        if previous:
            ratio = f"{size / previous[0]:.0f}x nodes -> {seconds / previous[1]:.1f}x time"
        print(f"{size:>8} {partitions:>10} {seconds:>9.3f} {ratio:>24}")
        previous = (size, seconds)


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [1_000, 10_000, 100_000])
