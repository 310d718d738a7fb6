"""Threads per kernel measured on this machine, not estimated: ``CBackend(measure_threads=True)``.

NOTE: the cost model (``_thread_cost.py``) estimates each kernel's time on ``t`` threads from
rates and pool costs that are guesses for a CPU it has never run on; it need only be right
within a factor of two, but on a machine unlike the ones it was checked on (another core
count, another pool wake-up cost, another cache) it can still give a small kernel threads
that cost more than they bring, which is how a model gets slower on 16 threads than on 4.
A deployer who builds once and runs often can pay a few builds more to know instead, as
TensorRT's builder times its tactics: every kernel is built at each count of
:func:`candidate_counts` (1, 2, 4, ... up to the most), all of a build's kernels at that
count, the builds compiled side by side; each is then timed by the library's own per-kernel
timers on random inputs, in rounds that alternate the builds (a pause between two, so the
previous build's spinning workers have gone to sleep), and each kernel gets the fewest
threads whose median time is within :data:`MARGIN` of its best (:func:`pick`) where that
saves a share of the model worth having against the cost model's count (:func:`settle`).
A plan shapes a build like the cost model's decisions would (a GEMM's split follows its
count); kernels of branches that run side by side keep their branch's share as a cap.

The per-kernel times come from builds that run no branches side by side (each kernel timed
at exactly its count), and a kernel timed in a build where every kernel has one count
misjudges whose caches hold its input: alone on one thread, a conversion or a concat reads
what its own core wrote; beside kernels on many threads it does not.  So the whole model
decides last: the cost model's plan, the picked counts with branches side by side and
without, the cost model's counts without them (the variants with branches only where the
cost model runs any), and the cost model's plans for the two largest counts tried below the
most (for 16 threads: 4 and 8) are timed call by call, alternating, and the fastest is kept
if it beats the cost model's plan by :data:`MARGIN` (:attr:`Measurement.kept`).  So branches
side by side, the cost model's other guess at many threads, are measured too, and a model
is not left slower on all its threads than on fewer.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import onnx_ir as ir

from codegraft.backends.c._blob import Blob
from codegraft.backends.c._codegen import Program, generate
from codegraft.backends.c._runtime import CRunnable
from codegraft.backends.c._thread_cost import Machine
from codegraft.backends.c._toolchain import Target, Toolchain

# A kernel keeps fewer threads unless more are this much faster: a margin for the timers'
# noise, on the side of waking fewer threads (they also cost whatever else runs beside).
MARGIN = 0.03
# A kernel's measured count replaces the cost model's only where it saves at least this share
# of the model's time.  Timing each kernel in a build where all run at one count misjudges
# kernels that only move data: how fast they run depends on whose caches hold their input,
# and that is set by the counts of the kernels before them.  Alone, densenet121's concats
# ran as fast on one thread as on two; beside 2-thread kernels, 2.2x as long on one (2-core
# Zen 3).  Such kernels take microseconds, a small share of a model, and keep the estimate.
SIGNIFICANT = 0.002
# Seconds between two builds' timed calls: the last build's workers spin up to 0.4 ms
# (thread_pool.c: CG_SPIN_MAX_NS) before sleeping, and would take cores from the next.
SETTLE_S = 0.002


def candidate_counts(most: int) -> tuple[int, ...]:
    """The thread counts tried: powers of two below ``most``, and ``most``.

    >>> candidate_counts(16), candidate_counts(12), candidate_counts(1)
    ((1, 2, 4, 8, 16), (1, 2, 4, 8, 12), (1,))
    """
    counts = [1]
    while counts[-1] * 2 < most:
        counts.append(counts[-1] * 2)
    if most > 1:
        counts.append(most)
    return tuple(counts)


def pick(ms: Sequence[float], counts: Sequence[int], margin: float = MARGIN) -> int:
    """The fewest of ``counts`` whose time in ``ms`` is within ``margin`` of the least.

    >>> pick([1.00, 0.51, 0.50, 0.60], [1, 2, 4, 8])  # 4 threads are not 3% faster than 2
    2
    >>> pick([0.010, 0.014, 0.020], [1, 2, 4])  # a small kernel: waking costs more than it saves
    1
    """
    best = min(ms)
    return next(count for count, value in zip(counts, ms, strict=True) if value <= best * (1 + margin))


def settle(ms: Sequence[Sequence[float]], counts: Sequence[int], estimated: Sequence[int]) -> tuple[int, ...]:
    """Per kernel, :func:`pick`'s count where it saves at least :data:`SIGNIFICANT` of the
    model's time against the cost model's count (``estimated``, timed at the nearest of
    ``counts``), else the cost model's.

    >>> counts = (1, 2, 4)
    >>> settle([(9.0, 5.0, 3.0), (0.30, 0.20, 0.28), (0.010, 0.012, 0.015)], counts, (4, 4, 2))
    (4, 2, 2)
    """
    total = sum(times[_nearest(counts, est)] for times, est in zip(ms, estimated, strict=True))
    chosen = []
    for times, est in zip(ms, estimated, strict=True):
        count = pick(times, counts)
        saved = times[_nearest(counts, est)] - times[counts.index(count)]
        chosen.append(count if saved >= SIGNIFICANT * total else est)
    return tuple(chosen)


def _nearest(counts: Sequence[int], count: int) -> int:
    return min(range(len(counts)), key=lambda i: (abs(counts[i] - count), counts[i]))


@dataclass(frozen=True)
class Plan:
    """How a build runs: ``threads`` per kernel (by index), or, empty, the cost model's counts
    for ``budget`` threads (0: the most); and whether independent branches run side by side.

    >>> Plan().label(), Plan(budget=4).label(), Plan((2, 1), side_by_side=False).label()
    ('cost model', 'cost model for 4 threads', 'picked, no branches side by side')
    """

    threads: tuple[int, ...] = ()
    side_by_side: bool = True
    budget: int = 0
    winograd: bool = True  # generate's: 3x3 Convs as Winograd where it pays

    def label(self) -> str:
        """What the plan is, in a few words."""
        who = "picked" if self.threads else "cost model" + (f" for {self.budget} threads" if self.budget else "")
        return who if self.side_by_side else f"{who}, no branches side by side"

    def program(self, model: ir.Model, target: Target, most: int, machine: Machine | None = None) -> Program:
        """The plan's C for ``model``, run with up to ``most`` threads (:func:`generate`)."""
        counts = self.threads.__getitem__ if self.threads else None
        return generate(model, target, self.budget or most, machine, plan=counts, side_by_side=self.side_by_side,
                        winograd=self.winograd)


@dataclass(frozen=True)
class Measurement:
    """What :func:`measure` found: per kernel (by index) the median ms at each of ``counts``,
    the count picked from them and the cost model's; the whole model's median ms with each
    plan tried (none when the picked counts are the cost model's and it runs no branches side
    by side), and the plan kept."""

    counts: tuple[int, ...]
    ms: tuple[tuple[float, ...], ...]
    picked: tuple[int, ...]
    estimated: tuple[int, ...]  # the cost model's counts
    timed: tuple[tuple[Plan, float], ...] = ()  # (plan, whole-model ms); the cost model's first

    @property
    def kept(self) -> Plan:
        """The fastest plan timed where it beats the cost model's by :data:`MARGIN`, else the cost model's."""
        if not self.timed:
            return Plan()
        base = self.timed[0][1]
        plan, ms = min(self.timed, key=lambda timed: timed[1])
        return plan if ms * (1 + MARGIN) <= base else self.timed[0][0]

    def summary(self) -> str:
        """One line: how many counts were picked against the estimate, each plan's time, what was
        kept (here: ``kept: picked``).

        >>> cost, picked = Plan(), Plan((2, 1))
        >>> Measurement((1, 2), ((1.0, 0.5), (0.1, 0.2)), (2, 1), (2, 2), ((cost, 1.10), (picked, 1.02))).summary()
        '1 of 2 kernels picked other counts than the cost model; whole model: cost model 1.100 ms, picked 1.020 ms; ...'
        """
        differ = sum(a != b for a, b in zip(self.picked, self.estimated, strict=True))
        line = (f"{differ} of {len(self.picked)} kernels picked other counts than the cost model" if differ
                else "every kernel picked the cost model's count")
        if not self.timed:
            return line
        times = ", ".join(f"{plan.label()} {ms:.3f} ms" for plan, ms in self.timed)
        return f"{line}; whole model: {times}; kept: {self.kept.label()}"

    def table(self, names: Sequence[str] = ()) -> str:
        """A Markdown table: each kernel's time at every count, the count picked and the cost model's."""
        head = "| kernel | " + " | ".join(f"{c} thr ms" for c in self.counts) + " | picked | cost model |"
        rows = [head, "|---|" + "---:|" * (len(self.counts) + 2)]
        for index, (times, chosen) in enumerate(zip(self.ms, self.picked, strict=True)):
            name = names[index] if index < len(names) else str(index)
            rows.append(f"| {name} | " + " | ".join(f"{t:.3f}" for t in times)
                        + f" | {chosen} | {self.estimated[index]} |")
        rows.append("\n" + self.summary())
        return "\n".join(rows)


class Clock(Protocol):
    """How :func:`measure` times a loaded build (:class:`WallClock`; tests give their own)."""

    def kernels_ms(self, program: Program, runnable: CRunnable, inputs: list[np.ndarray]) -> list[float]:
        """Each kernel's ms in one call, by index."""
        ...

    def call_ms(self, program: Program, runnable: CRunnable, inputs: list[np.ndarray]) -> float:
        """The ms of one whole call."""
        ...


class WallClock:
    """The library's per-kernel timers and the wall clock, each reading after an untimed call."""

    def kernels_ms(self, program: Program, runnable: CRunnable, inputs: list[np.ndarray]) -> list[float]:
        return [op.ms for op in runnable.profile_ops(inputs, 1, warm_up=True)]

    def call_ms(self, program: Program, runnable: CRunnable, inputs: list[np.ndarray]) -> float:
        runnable.run(inputs)
        start = time.perf_counter()
        runnable.run(inputs)
        return (time.perf_counter() - start) * 1e3


def measure(
    model: ir.Model, target: Target, most: int, toolchain: Toolchain, rounds: int = 7, *,
    machine: Machine | None = None, clock: Clock | None = None, winograd: bool = True,
) -> Measurement:
    """Build ``model`` with every kernel at each of :func:`candidate_counts` (``most``), time
    every kernel of every build on random inputs in ``rounds`` alternating rounds, pick
    each kernel's count (:func:`settle`), then time the whole model with each plan worth
    trying against the cost model's (on ``machine``: default this CPU; see the module note)."""
    clock = clock or WallClock()
    counts = candidate_counts(most)
    uniform = [generate(model, target, most, machine, plan=_everywhere(count), side_by_side=False, winograd=winograd)
               for count in counts]
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(shape).astype(np.float32) for shape in uniform[0].input_shapes]
    runnables = _load_all(uniform, target, toolchain, most, inputs)
    samples: list[list[list[float]]] = [[] for _ in counts]  # [count][round][kernel]
    for round_ in range(rounds):
        for position in _alternate(len(counts), round_):
            time.sleep(SETTLE_S)
            samples[position].append(clock.kernels_ms(uniform[position], runnables[position], inputs))
    ms = tuple(
        tuple(statistics.median(sample[kernel] for sample in samples[position]) for position in range(len(counts)))
        for kernel in range(uniform[0].kernels)
    )
    _release(runnables)
    del uniform, runnables  # each holds a copy of the weights: one set of builds at a time
    estimate = generate(model, target, most, machine, winograd=winograd)
    estimated = tuple(decision.choice.threads for decision in estimate.threads)
    picked = settle(ms, counts, estimated)
    branches = any(stage.concurrent for stage in estimate.stages)
    plans = [Plan()]
    if picked != estimated:
        plans += [Plan(picked, side_by_side=False)] + ([Plan(picked)] if branches else [])
    if branches:
        plans.append(Plan(side_by_side=False))
    # the cost model for fewer threads (the two largest counts tried below the most): what
    # runs slower on more threads than on fewer is not kept
    plans += [Plan(budget=count) for count in counts[1:-1][-2:]]
    plans = [dataclasses.replace(plan, winograd=winograd) for plan in plans]
    if len(plans) == 1:
        return Measurement(counts, ms, picked, estimated)
    programs = [estimate] + [plan.program(model, target, most, machine) for plan in plans[1:]]
    runnables = _load_all(programs, target, toolchain, most, inputs)
    whole: list[list[float]] = [[] for _ in plans]
    for round_ in range(3 * rounds):
        for position in _alternate(len(plans), round_):
            time.sleep(SETTLE_S)
            whole[position].append(clock.call_ms(programs[position], runnables[position], inputs))
    _release(runnables)
    timed = tuple((plan, statistics.median(times)) for plan, times in zip(plans, whole, strict=True))
    return Measurement(counts, ms, picked, estimated, timed)


def _release(runnables: list[CRunnable]) -> None:
    """End the timed builds' worker threads: nothing calls these libraries again (the one
    compiled for the plan kept, if it is one of them, starts its workers again when run)."""
    for runnable in runnables:
        runnable.release_threads()


def _everywhere(count: int) -> Callable[[int], int]:
    """A plan giving every kernel ``count`` threads."""
    return lambda _index: count


def _alternate(count: int, round_: int) -> Sequence[int]:
    return range(count) if round_ % 2 == 0 else range(count - 1, -1, -1)


def _load_all(
    programs: list[Program], target: Target, toolchain: Toolchain, most: int, inputs: list[np.ndarray]
) -> list[CRunnable]:
    """Each program built (one compiler process per program, side by side: the compiler is
    the slow part) and loaded, and run once untimed (first touch of weights and scratch)."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(programs)) as pool:
        libraries = list(pool.map(toolchain.build, [program.source for program in programs], [target] * len(programs)))
    runnables = [CRunnable(Blob.built(program, library, target, program.scratch_floats), toolchain, most)
                 for program, library in zip(programs, libraries, strict=True)]
    for runnable in runnables:
        runnable.run(inputs)
    return runnables
