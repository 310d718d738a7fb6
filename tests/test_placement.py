"""Measured placement with fake backends whose cost is known: a sleep on chosen op types.

The sleeps (milliseconds) dwarf everything else a call costs (tens of microseconds), so the
decisions asserted here do not depend on the machine's speed; no test limits wall-clock time.
"""

from __future__ import annotations

import itertools
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
from codegraft.report.report import PlacementReport
from codegraft.testing import assert_close, random_feeds, run_onnxruntime
from codegraft.tune.placement import (
    MeasurementCache,
    default_cache_dir,
    find_regions,
    measure_placement,
)

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
    from codegraft.tune.placement import _cheapest_chain

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


# --- issue 19: what cannot be timed is reported, close candidates are re-timed --------------------
class StaticSleepy(SleepyBackend):
    """A backend taking static shapes only: its pieces are specialised before they compile."""

    capabilities = Capabilities(dynamic_shapes=False)


def test_a_candidate_that_cannot_be_timed_is_reported_and_left_out(
    monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path
) -> None:
    import codegraft.tune.measure as measure

    def refuse(proto: onnx.ModelProto, shapes: object) -> onnx.ModelProto:
        raise ValueError("shape inference refused this piece")

    monkeypatch.setattr(measure, "specialise", refuse)  # what onnx's InferenceError did on light_inception_v1
    static = StaticSleepy("static", slow_on=())
    dynamic = SleepyBackend("dynamic", slow_on=())
    _, by_node, records, _ = _place(_chain(["Relu"] * 4), [static, dynamic], tmp_path)
    assert by_node == ["dynamic"] * 4
    (record,) = records
    assert dict(record.excluded) == {"static": "ValueError: shape inference refused this piece"}
    assert "static" not in dict(record.timings_us)


def test_failing_targets_leave_the_region_to_the_host_and_say_why(tmp_path: pathlib.Path) -> None:
    class Broken(SleepyBackend):
        def load(self, blob: bytes) -> SleepyRunnable:
            raise RuntimeError("device lost")

    _, by_node, records, _ = _place(_chain(["Relu"] * 4), [Broken("a", ()), Broken("b", ())], tmp_path)
    assert by_node == ["host"] * 4
    (record,) = records
    assert dict(record.excluded) == {
        "a": "a failed to load measure_a: RuntimeError: device lost",
        "b": "b failed to load measure_b: RuntimeError: device lost",
    }
    rendered = " ".join(_report_with(records).render(width=400).split())
    assert "a not timed: a failed to load measure_a: RuntimeError: device lost" in rendered


def _report_with(records: tuple[PlacementReport, ...]) -> cg.Report:
    return cg.Report(targets=("a", "b"), host="host", nodes=(), partitions=(), placements=records)


class FakeClock:
    """The clock the timer reads: it moves only when a :class:`ClockedRunnable` runs, so the
    times measured are exactly the costs given, and a load burst is exactly what a test says."""

    def __init__(self) -> None:
        self.now = 0.0
        self.calls: list[str] = []  # which backend ran, in order
        self.burst_calls = 0  # this many calls from now on cost ``burst`` times more
        self.burst = 1.0

    def perf_counter(self) -> float:
        return self.now

    def spend(self, backend: str, microseconds: float) -> None:
        factor = self.burst if self.burst_calls > 0 else 1.0
        self.burst_calls -= 1
        self.now += microseconds * factor * 1e-6
        self.calls.append(backend)


class ClockedBackend:
    """Takes ``ops``; a call costs ``us_per_node`` per node of the partition on the fake clock."""

    capabilities = Capabilities()
    version = "1"

    def __init__(self, name: str, clock: FakeClock, us_per_node: float, ops: Sequence[str] = ("Relu", "Tanh")) -> None:
        self.name, self.clock, self.us_per_node, self.ops = name, clock, us_per_node, frozenset(ops)
        self.compiles = 0

    def supports(self, node: ir.Node) -> Support:
        return Support.yes() if node.op_type in self.ops else Support.no(f"{self.name}: not {node.op_type}")

    def compile(self, partition: Partition) -> bytes:
        self.compiles += 1
        return str(len(partition.model.graph)).encode()

    def load(self, blob: bytes) -> ClockedRunnable:
        return ClockedRunnable(self, int(blob))


class ClockedRunnable:
    def __init__(self, backend: ClockedBackend, nodes: int) -> None:
        self.backend, self.nodes = backend, nodes

    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        self.backend.clock.spend(self.backend.name, self.backend.us_per_node * self.nodes)
        return []


def _place_clocked(
    monkeypatch: pytest.MonkeyPatch, proto: onnx.ModelProto, targets: list[ClockedBackend], cache_dir: pathlib.Path
) -> tuple[list[str], tuple[PlacementReport, ...]]:
    import codegraft.tune.measure as measure

    clock = targets[0].clock
    monkeypatch.setattr(measure, "time", clock)  # the timer reads time.perf_counter()
    model = import_model(proto)
    host = ClockedBackend("host", clock, us_per_node=10_000.0)  # never the best choice
    annotation = annotate(model.graph, targets, host=host.name)
    backends, records = measure_placement(
        model, annotation, targets, host, CompileOptions(), cache=MeasurementCache(cache_dir)
    )
    return [backends[annotation.unit_of_node[i]] for i in range(len(annotation.infos))], records


def test_close_candidates_are_retimed_alternately_and_the_margin_reported(
    monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path
) -> None:
    # "a" is truly faster (250 us a node against 262.5), but a load burst while "a" is timed
    # first makes it look 1.2x slower: timed once each, "b" would win.  Re-timed alternately,
    # "a" does, and the report gives the margin.
    clock = FakeClock()
    clock.burst, clock.burst_calls = 1.2, 52  # "a"'s whole first measurement (2 warm-ups + 50 runs)
    a, b = ClockedBackend("a", clock, 250.0), ClockedBackend("b", clock, 262.5)
    by_node, records = _place_clocked(monkeypatch, _chain(["Relu"] * 4), [a, b], tmp_path)
    assert by_node == ["a"] * 4
    (record,) = records
    assert record.margin == pytest.approx(1.05)
    assert "a 1.05x faster than b (re-timed alternately, 5 rounds)" in record.detail
    # Alternating: after the first measurements, the two take turns, round after round.
    turns = [name for name, _ in itertools.groupby(n for n in clock.calls if n in "ab")]
    assert turns[:2] == ["a", "b"] and len(turns) >= 2 + 5  # each round turns at least once
    # The re-timing is cached with the rest: a second compile measures nothing.
    compiles = a.compiles + b.compiles
    by_node_again, _ = _place_clocked(monkeypatch, _chain(["Relu"] * 4), [a, b], tmp_path)
    assert by_node_again == by_node and a.compiles + b.compiles == compiles


def test_distant_candidates_are_not_retimed(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    clock = FakeClock()
    a, b = ClockedBackend("a", clock, 100.0), ClockedBackend("b", clock, 200.0)
    by_node, records = _place_clocked(monkeypatch, _chain(["Relu"] * 4), [a, b], tmp_path)
    (record,) = records
    assert by_node == ["a"] * 4
    assert record.margin == pytest.approx(2.0)
    assert record.detail.endswith("a 2.00x faster than b")


def test_close_plans_are_retimed_alternately(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    # "relus" takes Relu only; "b" and "c" take everything at nearly the same cost: two
    # regions, and the plans all on "b" and all on "c" time within noise of each other.
    clock = FakeClock()
    relus = ClockedBackend("relus", clock, 1000.0, ops=("Relu",))
    b, c = ClockedBackend("b", clock, 100.0), ClockedBackend("c", clock, 101.0)
    by_node, records = _place_clocked(monkeypatch, _chain(["Relu", "Relu", "Tanh", "Tanh"]), [relus, b, c], tmp_path)
    assert by_node == ["b"] * 4
    plan = records[0]
    assert plan.region == "model"
    assert plan.margin == pytest.approx(1.01)
    assert "re-timed alternately" in plan.detail


def test_pieces_of_a_shipped_ir3_model_infer_shapes() -> None:
    # light_inception_v1 as shipped is IR 3, where initializers must also be graph inputs;
    # import takes them out of the inputs, so it must also move the model to IR >= 4, or
    # shape inference of a piece loses the initializers' types (issue 19).
    from codegraft.lower.lowering import specialise
    from codegraft.testing import light_model_path
    from codegraft.tune.measure import cut_piece

    model = import_model(str(light_model_path("inception_v1")))
    assert model.ir_version >= 4
    annotation = annotate(model.graph, [SleepyBackend("any", ())], host="host")
    piece = cut_piece(model, annotation, range(len(annotation.units)), "whole")  # type: ignore[arg-type]
    inferred = specialise(piece.proto, [(1, 3, 224, 224)])
    assert inferred.graph.output[0].type.tensor_type.shape.dim[0].dim_value == 1
