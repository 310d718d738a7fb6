"""Independent branches side by side: which kernels run concurrently, on how many threads each.

NOTE: every parallel kernel costs a publish, a wake and a wait for its last task (see
``_thread_pool.py``).  Inception and DenseNet blocks have kernels with no data dependence
between them (the four branches of an inception block read the same input); split over all
threads one after the other, each pays that cost and its own load imbalance, and a small
one uses 16 threads badly.  Run side by side, each on a subset of the threads, they pay one
dispatch together.  Which is better is the cost model's call (:func:`plan_stages`):

- kernels are grouped by *level* (longest chain of dependences from the inputs; a kernel
  depends on an earlier one it reads from, writes what it reads, or writes the same
  buffer), so a level's kernels are independent of each other;
- for a level of several kernels, threads are dealt out one at a time to the branch whose
  estimated time is longest (each branch starts with one; with more kernels than threads,
  kernels are packed onto ``threads`` branches longest first and run one after the other
  on one thread each), and the level runs concurrently when that is estimated at least
  10% faster than the kernels one after the other, each on its own best thread count;
- a level that stays serial keeps its kernels in the original order; a concurrent one is
  emitted where its first kernel was, after whatever its members need (pulled forward).

The generated code gives each concurrent stage a function whose ``switch`` has one case per
branch (the kernels' usual code, each setting its own ``cg_op_threads``) and calls it
through ``cg_stage``, one parallel loop whose tasks are the branches.  With per-kernel
timers on (``profile_ops``) the branches run one after the other, so every kernel's time is
its own.  Memory planning treats a stage as one step: all its buffers are live together.

Example (two independent 20 MFLOP convolutions on 16 threads: ~77 us one after the other,
each on 16 threads and paying its own dispatch; ~46 us side by side on 8 threads each)::

    >>> from codegraft.backends.c._thread_cost import Machine, Work
    >>> m = Machine.for_cpu(16, l2_bytes=1 << 20, l3_bytes=32 << 20)
    >>> w = Work(flops=2e7, bytes=1e5, units=64, gemm=True)
    >>> [(s.branches, s.threads) for s in plan_stages([set(), set()], [w, w], 16, m)]
    [(((0,), (1,)), ((8,), (8,)))]
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from codegraft.backends.c import _graph as g
from codegraft.backends.c._c_files import c_file
from codegraft.backends.c._fuse import Kernel
from codegraft.backends.c._thread_cost import PARALLEL_GAIN, SYNC_NS, WAKE_NS, Machine, Work, choose, estimate_ns


@dataclass(frozen=True)
class Stage:
    """Kernels (indices in the original order) run together: one branch each, or one kernel alone."""

    branches: tuple[tuple[int, ...], ...]  # kernels of each branch, run in order on its threads
    threads: tuple[tuple[int, ...], ...]  # threads of each kernel, same shape as ``branches``
    serial_us: float = 0.0  # estimated: the same kernels one after the other
    concurrent_us: float = 0.0  # estimated: side by side (0 for a single kernel)

    @property
    def concurrent(self) -> bool:
        return len(self.branches) > 1

    @property
    def kernels(self) -> tuple[int, ...]:
        return tuple(k for branch in self.branches for k in branch)


def dependences(kernels: Sequence[Kernel]) -> list[set[int]]:
    """For each kernel, the earlier kernels it must follow (reads after writes, and the reverse).

    Convolutions writing their channels straight into a Concat's output (``Kernel.slot``)
    write disjoint parts of one buffer: they need not follow each other, but whatever reads
    or wholly writes that buffer follows them all.
    """
    whole: dict[int, int] = {}  # id(root buffer) -> last kernel writing all of it
    parts: dict[int, list[int]] = {}  # id(root buffer) -> slot writers since then
    readers: dict[int, list[int]] = {}
    result: list[set[int]] = []
    for index, kernel in enumerate(kernels):
        reads = {id(t.root()) for t in _inputs(kernel)}
        written = id((kernel.slot[0] if kernel.slot is not None else kernel.out).root())
        after: set[int] = set()
        for buffer in reads | {written}:
            after |= {whole[buffer]} if buffer in whole else set()
        for buffer in reads:
            after |= set(parts.get(buffer, ()))
        after |= set(readers.get(written, ()))  # do not overwrite what an earlier kernel still reads
        if kernel.slot is None:
            after |= set(parts.pop(written, ()))
            whole[written] = index
            readers.pop(written, None)
        else:
            parts.setdefault(written, []).append(index)
        for buffer in reads:
            readers.setdefault(buffer, []).append(index)
        result.append(after - {index})
    return result


def _inputs(kernel: Kernel) -> list[g.Tensor]:
    return [*(kernel.core.inputs if kernel.core is not None else []), *kernel.operands]


def plan_stages(
    after: Sequence[set[int]], works: Sequence[Work], threads: int, machine: Machine, side_by_side: bool = True
) -> list[Stage]:
    """Stages in execution order (see the module note); ``after[i]``: kernels kernel ``i`` follows.
    Without ``side_by_side``, one kernel a stage whatever the cost model says."""
    count = len(works)
    level = [0] * count
    for i in range(count):
        level[i] = 1 + max((level[d] for d in after[i]), default=-1)
    by_level: dict[int, list[int]] = {}
    for i in range(count):
        by_level.setdefault(level[i], []).append(i)
    group: dict[int, Stage] = {}
    for members in by_level.values():
        if len(members) > 1 and threads > 1 and side_by_side:
            stage = _concurrent(members, works, threads, machine)
            if stage is not None:
                for i in members:
                    group[i] = stage
    stages: list[Stage] = []
    done: set[int] = set()

    def place(i: int) -> None:
        if i in done:
            return
        stage = group.get(i)
        members = stage.kernels if stage is not None else (i,)
        done.update(members)
        for member in sorted(members):
            for dependence in sorted(after[member]):
                place(dependence)
        if stage is None:
            stage = Stage(((i,),), ((choose(works[i], threads, machine).threads,),))
        stages.append(stage)

    for i in range(count):
        place(i)
    return stages


def _concurrent(members: list[int], works: Sequence[Work], threads: int, machine: Machine) -> Stage | None:
    """The level as concurrent branches, or ``None`` when that is not estimated to pay."""
    serial = sum(choose(works[i], threads, machine).parallel_us for i in members) * 1e3
    order = sorted(members, key=lambda i: -estimate_ns(works[i], 1, machine))
    if len(members) > threads:  # pack onto ``threads`` single-threaded branches, longest first
        bins: list[list[int]] = [[] for _ in range(threads)]
        loads = [0.0] * threads
        for i in order:
            b = loads.index(min(loads))
            bins[b].append(i)
            loads[b] += estimate_ns(works[i], 1, machine)
        branches = [sorted(b) for b in bins if b]
        counts = [[1] * len(b) for b in branches]
        longest = max(loads)
    else:
        branches = [[i] for i in order]
        counts = [[1] for _ in order]
        times = [estimate_ns(works[i], 1, machine) for i in order]
        for _ in range(threads - len(order)):
            slowest = times.index(max(times))
            i, t = order[slowest], counts[slowest][0] + 1
            faster = estimate_ns(works[i], t, machine)
            if faster >= times[slowest]:
                break
            counts[slowest][0], times[slowest] = t, faster
        longest = max(times)
    concurrent = longest + SYNC_NS + WAKE_NS * (len(branches) - 1)
    if concurrent > PARALLEL_GAIN * serial:  # run a level concurrently only where 10% faster
        return None
    return Stage(tuple(map(tuple, branches)), tuple(map(tuple, counts)), serial / 1e3, concurrent / 1e3)


# The dispatcher of concurrent stages (after the pool and the timers in the generated source).
STAGE = c_file("stage.c")

_SYMBOL = re.compile(r"\b[A-Za-z_]\w*\b")


def stage_function(name: str, cases: Sequence[Sequence[str]], declarations: Sequence[str]) -> str:
    """A ``cg_branch_fn`` running ``cases[branch]`` (lines of the entry point's body).

    Only the weight and scratch declarations the cases use are repeated in it.
    """
    used = {word for case in cases for line in case for word in _SYMBOL.findall(line)}
    lines = [f"static void {name}(const float* const* in, float* const* out, const float* w, float* s, long branch) {{"]
    for declaration in declarations:
        symbol = declaration.split("=")[0].split()[-1]
        if symbol in used:
            lines.append(declaration)
    lines.append("  (void)in; (void)out; (void)w; (void)s;")
    lines.append("  switch (branch) {")
    for index, case in enumerate(cases):
        lines.append(f"  case {index}: {{")
        lines += [f"  {line}" for line in case]
        lines.append("  } break;")
    lines += ["  }", "}"]
    return "\n".join(lines)
