"""Threads per kernel measured instead of estimated (``CBackend(measure_threads=True)``).

The picking and the whole-model check run on a fake clock (times made from each build's
thread counts), so what they decide does not depend on this machine's load; one test times
for real and checks only what timing cannot change: the counts are valid and the outputs right.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import helper

from codegraft.backend import Partition
from codegraft.backends.c._codegen import KernelThreads, Program, generate
from codegraft.backends.c._runtime import CRunnable
from codegraft.backends.c._thread_cost import Machine
from codegraft.backends.c._thread_measure import Measurement, Plan, candidate_counts, measure, settle
from codegraft.backends.c._toolchain import cpu_features, host_target, target_for
from codegraft.errors import CodegraftError
from codegraft.testing import assert_close, run_onnxruntime
from tests.c_backend_util import backend, feeds_for, make_model, needs_compiler, run_c

# A cost model that never finds threads worth waking: every kernel estimated at one thread.
SERIAL = Machine(gemm_flops_per_ns=1e9, other_flops_per_ns=1e9, cache_bytes_per_ns=1e9, memory_bytes_per_ns=1e9,
                 l2_bytes=1 << 20, l3_bytes=32 << 20)


def _convs() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    return make_model(
        [
            helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["a"], ["b"]),
            helper.make_node("Conv", ["b", "w2"], ["c"], pads=[1, 1, 1, 1]),
            helper.make_node("Sigmoid", ["c"], ["y"]),
        ],
        {"x": [1, 16, 28, 28]},
        ["y"],
        {"w1": rng.standard_normal((32, 16, 3, 3)).astype(np.float32) * 0.1,
         "w2": rng.standard_normal((32, 32, 3, 3)).astype(np.float32) * 0.1},
    )


class FakeClock:
    """Kernel ``i`` takes ``work[i] / t + 0.05 (t - 1)`` ms on ``t`` threads; a call, their sum
    times ``whole_factor`` for builds whose counts differ from the cost model's."""

    def __init__(self, work: list[float], estimated: tuple[int, ...] | None = None, whole_factor: float = 1.0):
        self.work, self.estimated, self.whole_factor = work, estimated, whole_factor

    def kernels_ms(self, program: Program, runnable: CRunnable, inputs: list[np.ndarray]) -> list[float]:
        return [w / k.choice.threads + 0.05 * (k.choice.threads - 1)
                for w, k in zip(self.work, program.threads, strict=True)]

    def call_ms(self, program: Program, runnable: CRunnable, inputs: list[np.ndarray]) -> float:
        counts = tuple(k.choice.threads for k in program.threads)
        factor = self.whole_factor if counts != self.estimated else 1.0
        return sum(self.kernels_ms(program, runnable, inputs)) * factor


def test_candidate_counts_are_powers_of_two_and_the_most() -> None:
    assert candidate_counts(16) == (1, 2, 4, 8, 16)
    assert candidate_counts(6) == (1, 2, 4, 6)
    assert candidate_counts(2) == (1, 2)


def test_settle_keeps_the_estimate_where_the_saving_is_a_sliver_of_the_model() -> None:
    counts = (1, 2, 4, 8, 16)
    big = (16.0, 8.1, 4.2, 2.3, 1.4)              # scales: keeps 16
    small = (0.020, 0.030, 0.050, 0.090, 0.170)   # slower with every thread: 0.15 ms of ~2.5 saved on 1
    shrinking = (1.0, 0.55, 0.40, 0.45, 0.90)     # best at 4; at 16 (the estimate) 0.5 ms lost
    tiny = (0.0010, 0.0011, 0.0013, 0.0017, 0.0030)  # faster on 1, but 0.08% of the model: the estimate
    assert settle([big, small, shrinking, tiny], counts, (16, 16, 16, 16)) == (16, 1, 4, 16)
    # the estimate at a count not tried (12) is timed at the nearest tried (8, then 16)
    assert settle([big, small, shrinking, tiny], counts, (12, 12, 12, 12))[2] == 4


def test_generate_gives_each_kernel_the_plans_count_capped_by_its_units() -> None:
    model = ir.from_proto(_convs())
    target = host_target()
    by_model = generate(model, target, 8, SERIAL)
    assert {k.choice.threads for k in by_model.threads} == {1}
    planned = generate(model, target, 8, SERIAL, plan=lambda index: 8 if index % 2 == 0 else 3)
    assert planned.kernels == by_model.kernels
    for index, k in enumerate(planned.threads):
        assert k.choice.threads == min(8 if index % 2 == 0 else 3, k.work.units)
    assert "cg_op_threads = 8;" in planned.source


def _measure_on_fake_clock(most: int, whole_factor: float = 1.0) -> tuple[tuple[KernelThreads, ...], Measurement]:
    """The conv model measured up to ``most`` threads against the never-parallel cost model,
    on a clock where the convolutions take 5 ms of work and everything else 4 us."""
    model = ir.from_proto(_convs())
    kernels = generate(model, host_target(), most, SERIAL).threads
    work = [5.0 if k.kernel.startswith("Conv") else 0.004 for k in kernels]
    estimated = tuple(k.choice.threads for k in kernels)
    clock = FakeClock(work, estimated, whole_factor)
    return kernels, measure(model, host_target(), most, backend().toolchain, rounds=3, machine=SERIAL, clock=clock)


@needs_compiler
def test_measure_gives_threads_where_they_pay_against_a_wrong_estimate() -> None:
    kernels, found = _measure_on_fake_clock(4)
    estimated = tuple(k.choice.threads for k in kernels)
    assert found.counts == (1, 2, 4) and found.estimated == estimated == (1,) * len(kernels)
    for k, picked in zip(kernels, found.picked, strict=True):
        assert picked == (min(4, k.work.units) if k.kernel.startswith("Conv") else 1), k.kernel
    # no branches to run side by side: the cost model's plan, the picked counts alone, and the
    # cost model's plan for 2 threads
    plans = [Plan(), Plan(found.picked, side_by_side=False), Plan(budget=2)]
    assert [plan for plan, _ in found.timed] == plans
    assert found.timed[1][1] < found.timed[0][1] and found.kept == Plan(found.picked, side_by_side=False)
    assert all(len(times) == 3 for times in found.ms)
    assert found.table([k.kernel for k in kernels]).endswith("kept: picked, no branches side by side")


@needs_compiler
def test_measure_keeps_the_estimate_when_the_whole_model_is_not_faster() -> None:
    # per kernel two threads pay, yet the whole model with them runs 3x as long (say, caches)
    _, found = _measure_on_fake_clock(2, whole_factor=3.0)
    assert found.picked != found.estimated and found.kept == Plan()


def test_a_measurement_without_differences_times_no_whole_model() -> None:
    same = Measurement((1, 2), ((1.0, 0.6),), (2,), (2,))
    assert same.kept == Plan() and same.table().endswith("every kernel picked the cost model's count")


class BranchesCost(FakeClock):
    """Every kernel as fast at any count; a whole call 20% longer with branches side by side."""

    def kernels_ms(self, program: Program, runnable: CRunnable, inputs: list[np.ndarray]) -> list[float]:
        return [0.1] * program.kernels

    def call_ms(self, program: Program, runnable: CRunnable, inputs: list[np.ndarray]) -> float:
        return 1.2 if any(stage.concurrent for stage in program.stages) else 1.0


@needs_compiler
def test_measure_times_branches_side_by_side_against_one_after_another() -> None:
    # four independent convolutions the cost model runs side by side on 2 threads
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", f"w{i}"], [f"c{i}"]) for i in range(4)]
    nodes.append(helper.make_node("Concat", [f"c{i}" for i in range(4)], ["y"], axis=1))
    weights = {f"w{i}": rng.standard_normal((32, 32, 1, 1)).astype(np.float32) for i in range(4)}
    model = ir.from_proto(make_model(nodes, {"x": [1, 32, 14, 14]}, ["y"], weights))
    wide = Machine.for_cpu(16, l2_bytes=1 << 20, l3_bytes=32 << 20)
    assert any(stage.concurrent for stage in generate(model, host_target(), 2, wide).stages)
    found = measure(model, host_target(), 2, backend().toolchain, rounds=3, machine=wide, clock=BranchesCost([]))
    assert found.picked == found.estimated  # every count as fast: the fewest threads, as estimated
    assert [plan.side_by_side for plan, _ in found.timed] == [True, False]
    assert found.kept == Plan(side_by_side=False)
    assert found.summary().endswith("kept: cost model, no branches side by side")


@needs_compiler
def test_measured_threads_compile_to_the_right_outputs() -> None:
    # real clocks: which counts win depends on the machine, the outputs must not
    be = backend(num_threads=2, measure_threads=True)
    assert '"measure_threads": true' in be.cache_fingerprint()
    model = _convs()
    feeds = feeds_for(model)
    assert_close(run_c(model, feeds, be), run_onnxruntime(model, feeds), rtol=1e-4)


@needs_compiler
def test_measuring_for_a_cpu_this_machine_is_not_is_refused() -> None:
    avx512 = target_for(frozenset({"avx2", "fma", "avx512f", "avx512dq", "avx512bw", "avx512vl"}))
    if avx512.features <= cpu_features():
        pytest.skip("this CPU runs AVX-512 code: no foreign target to try")
    be = backend(num_threads=2, measure_threads=True, target=avx512)
    with pytest.raises(CodegraftError, match="measure_threads times each build on this machine"):
        be.compile(Partition("p", ir.from_proto(_convs())))


class FewerThreadsFaster(FakeClock):
    """Every kernel as fast at any count; a whole call faster where no kernel has over 2 threads."""

    def kernels_ms(self, program: Program, runnable: CRunnable, inputs: list[np.ndarray]) -> list[float]:
        return [0.1] * program.kernels

    def call_ms(self, program: Program, runnable: CRunnable, inputs: list[np.ndarray]) -> float:
        return 1.0 if max(k.choice.threads for k in program.threads) <= 2 else 1.5


@needs_compiler
def test_measure_keeps_the_cost_models_plan_for_fewer_threads_where_the_model_runs_faster() -> None:
    model = ir.from_proto(_convs())
    wide = Machine.for_cpu(16, l2_bytes=1 << 20, l3_bytes=32 << 20)
    found = measure(model, host_target(), 8, backend().toolchain, rounds=3, machine=wide,
                    clock=FewerThreadsFaster([]))
    assert max(found.estimated) > 2  # the cost model gives the convolutions more than 2 threads
    assert [plan for plan, _ in found.timed][-2:] == [Plan(budget=2), Plan(budget=4)]
    assert found.kept == Plan(budget=2)
    assert found.summary().endswith("kept: cost model for 2 threads")
