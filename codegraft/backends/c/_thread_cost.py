"""How many threads each kernel uses, and how a GEMM's iteration space is split: a cost model.

NOTE: waking and synchronising threads costs a few microseconds per kernel and grows with
the number of threads; a small layer split 16 ways spends more on that than on its work
(issue 18: squeezenet and shufflenet were slower on 16 threads than on 4).  So each kernel
gets the thread count ``t`` (at most the count the library is compiled for) that minimises

    time(t) = max(flops / (t * flop_rate), bytes / bandwidth(t)) * imbalance(t) + sync(t)

where ``imbalance(t)`` is the slowest thread's share of the kernel's parallel units
(``ceil(units / t) * t / units``), ``bandwidth(t)`` grows per thread from cache and is
capped from main memory (a kernel whose bytes exceed the last-level cache streams from
DRAM, which a few cores saturate), and ``sync(t)`` is zero on one thread (the loop runs
inline, nobody is woken) and ``sync_ns + wake_ns * (t - 1)`` otherwise.  Ties go to fewer
threads.  Kernels that only move data (transposes, concats) count their element moves as
flops, as elementwise kernels do (``_codegen.kernel_work``).  Each thread takes the same share
of every loop (``thread_pool.c``), so most of what a kernel reads was written on the core that
reads it.  Before shares, a copy of data the pool had just written was kept on one thread
while its bytes fit in the last-level cache (each core fetched its share from the others'
caches); with shares, shufflenet's channel shuffles ran 0.6-0.7x as long on two threads than
on one thread of two, the whole model 0.885x.  The rates are estimates from the
CPU's vector width and caches (:class:`Machine`), not measurements: they only need to be
right within a factor of two for the choice to be, since the cost grows slowly around the
optimum.

The GEMM driver's split (row tiles per task, ``_blocking.py``) follows from the chosen
count: tasks of at least ~5 us of the core's FMA rate, halved until there are 8 per thread,
so a kernel given 2 threads is cut in 16 tasks, not in 8 per core of the machine.

Example::

    >>> m = Machine.for_cpu(vector_floats=16, l2_bytes=1 << 20, l3_bytes=32 << 20)
    >>> choose(Work(flops=2e9, bytes=4e6, units=4096, gemm=True), threads=16, machine=m).threads
    16
    >>> choose(Work(flops=2e4, bytes=8e4, units=64, gemm=False), threads=16, machine=m).threads
    1
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# One kernel's fixed cost of going parallel (publish the job, wake sleepers, wait for the
# last task) and the extra per thread that joins.  Measured on the 16-core Xeon (issue 18's
# machine, bench/MANY_CORES.md, `bench.c_measure --model squeezenet --threads 16`): every
# kernel timed at 1, 2, 4, 8 and 16 threads, small ones (10-60 us on one thread) still gained
# from 8 to 16, and what a kernel lost beyond its scaled one-thread time hardly grew with the
# count (8.5 us at 2, 14-15 us at 4, 8 and 16).  The counts this model picks, summed at their
# measured times, were the measured best's with the extra per thread at 250 ns or less (1.043
# ms at 16 threads, the best 1.041); at 1500 (the high end of pool microbenchmarks, the value
# before) 1.222 ms, small kernels kept to 1-7 threads and squeezenet's expand branches side by
# side on 1 and 15 threads, which ran 1.2x as long as one after the other.  The fixed part did
# not change a count from 2 to 6 us.
SYNC_NS = 4000.0
WAKE_NS = 250.0
# Go parallel (or side by side, _branches) only where estimated at least 10% faster: within
# that the estimate's error decides, not the work
PARALLEL_GAIN = 0.9


@dataclass(frozen=True)
class Machine:
    """What the cost model assumes of the CPU; see :meth:`for_cpu`."""

    gemm_flops_per_ns: float  # one core, register-blocked FMA kernel
    other_flops_per_ns: float  # one core, the plain loops of pools, elementwise, softmax...
    cache_bytes_per_ns: float  # one core, data in its caches
    memory_bytes_per_ns: float  # all cores together, streaming from DRAM
    l2_bytes: int  # per core
    l3_bytes: int  # shared

    @staticmethod
    def for_cpu(vector_floats: int, l2_bytes: int, l3_bytes: int) -> Machine:
        """Rates from the SIMD width (two FMA pipes at ~2.5 GHz, ~60% of it reached)."""
        peak = vector_floats * 2 * 2 * 2.5
        return Machine(
            gemm_flops_per_ns=0.6 * peak,
            other_flops_per_ns=0.1 * peak,
            cache_bytes_per_ns=vector_floats * 4 * 0.5,
            memory_bytes_per_ns=40.0,
            l2_bytes=l2_bytes,
            l3_bytes=l3_bytes,
        )


@dataclass(frozen=True)
class Work:
    """One kernel's work: flops, bytes read and written, and parallel units (tasks it can split into)."""

    flops: float  # a data move (transpose, concat) counts one per element moved
    bytes: float
    units: int
    gemm: bool  # runs on the register-blocked micro-kernel
    loops: int = 1  # parallel loops, each woken and joined (a Winograd Conv's transforms and GEMM: 3)
    # On 2 up to (not including) this many threads the kernel is one parallel loop whatever
    # ``loops`` says: a Winograd Conv in chunks, each run whole by one thread (ops/winograd.py)
    one_loop_below: int = 0


@dataclass(frozen=True)
class Choice:
    """The decision for one kernel: threads, and the estimated time on 1 and on ``threads`` threads."""

    threads: int
    serial_us: float
    parallel_us: float


def estimate_ns(work: Work, threads: int, machine: Machine) -> float:
    """Estimated time of ``work`` on ``threads`` threads (see the module note).

    A Winograd Conv's three loops are joined three times, except on the thread counts where it
    runs in chunks, each whole on one thread: one loop, one join::

        >>> m = Machine.for_cpu(vector_floats=16, l2_bytes=1 << 20, l3_bytes=32 << 20)
        >>> three = Work(1e8, 1e6, 4096, gemm=True, loops=3)
        >>> chunked = Work(1e8, 1e6, 4096, gemm=True, loops=3, one_loop_below=8)
        >>> [round(estimate_ns(three, t, m) - estimate_ns(chunked, t, m)) for t in (1, 4, 8)]
        [0, 9500, 0]
    """
    rate = machine.gemm_flops_per_ns if work.gemm else machine.other_flops_per_ns
    compute = work.flops / (threads * rate)
    bandwidth = threads * machine.cache_bytes_per_ns
    if work.bytes > machine.l3_bytes:
        bandwidth = min(bandwidth, machine.memory_bytes_per_ns)
    units = max(1, work.units)
    imbalance = math.ceil(units / threads) * threads / units
    loops = 1 if threads < work.one_loop_below else work.loops
    sync = 0.0 if threads == 1 else (SYNC_NS + WAKE_NS * (threads - 1)) * loops
    return max(compute, work.bytes / bandwidth) * imbalance + sync


def fixed(work: Work, threads: int, machine: Machine) -> Choice:
    """``threads`` (at most the work's parallel units, at least 1) with its estimated times: a
    count decided elsewhere (measured, :mod:`._thread_measure`) in the form :func:`choose` gives.

    >>> m = Machine.for_cpu(vector_floats=8, l2_bytes=1 << 19, l3_bytes=32 << 20)
    >>> fixed(Work(flops=2e4, bytes=8e4, units=3, gemm=False), threads=16, machine=m).threads
    3
    """
    count = max(1, min(threads, work.units))
    return Choice(count, estimate_ns(work, 1, machine) / 1e3, estimate_ns(work, count, machine) / 1e3)


def choose(work: Work, threads: int, machine: Machine) -> Choice:
    """The thread count in ``1..threads`` with the least estimated time (fewer on ties), one
    thread unless going parallel is estimated at least :data:`PARALLEL_GAIN` faster.

    A data move of a few microseconds stays on one thread where more would save a rounding
    error of the estimate (on the 16-core Xeon a transpose on one thread took 0.59x its
    estimate, on several 1.2x)::

        >>> m = Machine.for_cpu(vector_floats=16, l2_bytes=1 << 20, l3_bytes=32 << 20)
        >>> choose(Work(flops=26656, bytes=213248, units=6, gemm=False), 16, m).threads
        1
    """
    one = estimate_ns(work, 1, machine)
    best, best_ns = 1, one
    for t in range(2, min(threads, max(1, work.units)) + 1):
        ns = estimate_ns(work, t, machine)
        if ns < best_ns:
            best, best_ns = t, ns
    if best_ns > PARALLEL_GAIN * one:
        best, best_ns = 1, one
    return Choice(best, one / 1e3, best_ns / 1e3)
