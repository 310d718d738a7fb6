"""Measured placement with fake backends whose cost is known: a sleep on chosen op types.

The sleeps (milliseconds) dwarf everything else a call costs (tens of microseconds), so the
decisions asserted here do not depend on the machine's speed; no test limits wall-clock time.
"""

from __future__ import annotations

import pathlib
import time
from collections.abc import Sequence

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper

import codegraft as cg
from codegraft.backend import Capabilities, Partition, Support
from codegraft.compiler.driver import CompileOptions
from codegraft.frontend.model import import_model
from codegraft.plan.annotate import annotate
from codegraft.plan.placement import (
    MeasurementCache,
    default_cache_dir,
    find_regions,
    measure_placement,
)
from codegraft.report.report import PlacementReport
from codegraft.testing import assert_close, random_feeds, run_onnxruntime

SLEEP_S = 0.003


class SleepyBackend:
    """Runs partitions with onnxruntime, sleeping when a partition holds one of ``slow_on``."""

    capabilities = Capabilities()
    version = "1"

    def __init__(self, name: str, slow_on: Sequence[str]) -> None:
        self.name = name
        self.slow_on = frozenset(slow_on)
        self.compiles = 0

    def supports(self, node: ir.Node) -> Support:
        return Support.yes()

    def compile(self, partition: Partition) -> bytes:
        self.compiles += 1
        return ir.to_proto(partition.model).SerializeToString()

    def load(self, blob: bytes) -> SleepyRunnable:
        slow = any(n.op_type in self.slow_on for n in onnx.load_from_string(blob).graph.node)
        return SleepyRunnable(blob, slow)


class SleepyRunnable:
    def __init__(self, blob: bytes, slow: bool) -> None:
        import onnxruntime as ort

        self._session = ort.InferenceSession(blob, providers=["CPUExecutionProvider"])
        self._inputs = [i.name for i in self._session.get_inputs()]
        self._slow = slow

    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        if self._slow:
            time.sleep(SLEEP_S)
        return self._session.run(None, dict(zip(self._inputs, inputs, strict=True)))  # type: ignore[no-any-return]


def _chain(ops: Sequence[str]) -> onnx.ModelProto:
    nodes, previous = [], "x"
    for index, op in enumerate(ops):
        nodes.append(helper.make_node(op, [previous], [f"v{index}"], name=f"n{index}"))
        previous = f"v{index}"
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
        [helper.make_tensor_value_info(previous, TensorProto.FLOAT, [4, 8])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _place(
    proto: onnx.ModelProto, targets: list[SleepyBackend], cache_dir: pathlib.Path
) -> tuple[ir.Model, list[str], tuple[PlacementReport, ...], MeasurementCache]:
    model = import_model(proto)
    host = SleepyBackend("host", slow_on=("Relu", "Tanh", "Sigmoid"))  # never the best choice
    annotation = annotate(model.graph, targets, host=host.name)
    cache = MeasurementCache(cache_dir)
    backends, records = measure_placement(model, annotation, targets, host, CompileOptions(), cache=cache)
    by_node = [backends[annotation.unit_of_node[i]] for i in range(len(annotation.infos))]
    return model, by_node, records, cache


def test_chooses_the_faster_backend_over_the_preferred_one(tmp_path: pathlib.Path) -> None:
    slow = SleepyBackend("slow", slow_on=("Relu",))
    fast = SleepyBackend("fast", slow_on=())
    _, by_node, records, _ = _place(_chain(["Relu"] * 4), [slow, fast], tmp_path)
    assert by_node == ["fast"] * 4
    (record,) = records
    timings = dict(record.timings_us)
    assert record.chosen == "fast" and timings["slow"] > timings["fast"]
    assert set(timings) >= {"slow", "fast", "host"}


def test_splits_a_region_between_backends(tmp_path: pathlib.Path) -> None:
    # "a" is slow on Tanh, "b" slow on Relu: the best placement runs each half on the other.
    a = SleepyBackend("a", slow_on=("Tanh",))
    b = SleepyBackend("b", slow_on=("Relu",))
    _, by_node, records, _ = _place(_chain(["Relu"] * 12 + ["Tanh"] * 12), [a, b], tmp_path)
    assert by_node == ["a"] * 12 + ["b"] * 12
    (record,) = records
    assert record.chosen == "a+b"
    assert "split" in dict(record.timings_us)


def test_second_compile_measures_nothing(tmp_path: pathlib.Path) -> None:
    slow = SleepyBackend("slow", slow_on=("Relu",))
    fast = SleepyBackend("fast", slow_on=())
    _, first, _, _ = _place(_chain(["Relu"] * 4), [slow, fast], tmp_path)
    compiles = slow.compiles + fast.compiles
    _, second, _, cache = _place(_chain(["Relu"] * 4), [slow, fast], tmp_path)
    assert second == first
    assert slow.compiles + fast.compiles == compiles
    assert cache.hits > 0


def test_a_new_backend_version_is_measured_again(tmp_path: pathlib.Path) -> None:
    fast = SleepyBackend("fast", slow_on=())
    _place(_chain(["Relu"] * 4), [SleepyBackend("slow", ("Relu",)), fast], tmp_path)
    before = fast.compiles
    fast.version = "2"
    _place(_chain(["Relu"] * 4), [SleepyBackend("slow", ("Relu",)), fast], tmp_path)
    assert fast.compiles > before


def test_only_regions_with_a_choice_are_measured() -> None:
    proto = _chain(["Relu"] * 3)
    model = import_model(proto)
    only = SleepyBackend("only", slow_on=())

    class HostThatDeclines(SleepyBackend):
        def supports(self, node: ir.Node) -> Support:
            return Support.no("test host declines")

    annotation = annotate(model.graph, [only], host="host")
    assert find_regions(annotation, [only], HostThatDeclines("host", ())) == []
    assert len(find_regions(annotation, [only], SleepyBackend("host", ()))) == 1


def test_cache_directory_from_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    monkeypatch.setenv("CODEGRAFT_CACHE_DIR", str(tmp_path))
    assert default_cache_dir() == tmp_path / "placement"
    monkeypatch.delenv("CODEGRAFT_CACHE_DIR")
    assert default_cache_dir() == pathlib.Path.home() / ".cache" / "codegraft" / "placement"


def test_compile_with_measured_placement_is_correct(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    monkeypatch.setenv("CODEGRAFT_CACHE_DIR", str(tmp_path))
    proto = _chain(["Relu", "Tanh"] * 8)
    feeds = random_feeds(proto)
    exe = cg.compile(
        proto,
        targets=[SleepyBackend("a", ("Tanh",)), SleepyBackend("b", ("Relu",))],
        placement="measured",
    )
    assert_close(exe.run(feeds), run_onnxruntime(proto, feeds))
    assert exe.report().placements


def test_chain_keeps_a_region_with_its_neighbours_when_crossing_costs_more() -> None:
    from codegraft.plan.placement import _cheapest_chain

    overhead = {"a": 10.0, "b": 10.0}.__getitem__
    # The middle element is 5 us faster on b, but leaving a and coming back costs two calls.
    costs = [{"a": 100.0}, {"a": 50.0, "b": 45.0}, {"a": 100.0}]
    assert _cheapest_chain(costs, overhead) == ["a", "a", "a"]
    # 50 us faster on b is worth the crossings.
    costs[1] = {"a": 100.0, "b": 50.0}
    assert _cheapest_chain(costs, overhead) == ["a", "b", "a"]


def test_a_plan_is_measured_end_to_end_before_it_is_kept(tmp_path: pathlib.Path) -> None:
    # Relu only on "relus", Tanh only on "tanhs": the host (slow everywhere) could run it all,
    # but the measured plan that alternates the two targets wins.
    class Only(SleepyBackend):
        def __init__(self, name: str, op: str) -> None:
            super().__init__(name, slow_on=())
            self.op = op

        def supports(self, node: ir.Node) -> Support:
            return Support.yes() if node.op_type == self.op else Support.no(f"{self.name}: {self.op} only")

    _, by_node, records, _ = _place(
        _chain(["Relu", "Relu", "Tanh", "Tanh"]), [Only("relus", "Relu"), Only("tanhs", "Tanh")], tmp_path
    )
    assert by_node == ["relus", "relus", "tanhs", "tanhs"]
    plan = records[0]
    assert plan.region == "model"
    timings = dict(plan.timings_us)
    assert timings["estimated best"] < timings["all possible on host"]
