"""Each kernel of a light model on ``c`` at several thread counts: which ones do not scale.

Run from the repository root::

    .venv/bin/python -m bench.c_kernels [--model squeezenet] [--threads 1,4,16] [--repeat 21] [--top 30]

Issue 18's symptom was models slower on 16 threads than on 4; a whole-model time says that
it happens, this says where.  The model is compiled once per thread count (each count has its
own plan: threads per kernel, concurrent stages), the libraries are called in turn, one call
each, and every kernel's time is read from ``c``'s own timers (``CRunnable.profile_ops``).
Printed per kernel, slowest at the largest count first: what it is, the threads the cost
model gave it at each count, its median ms at each count and the speedup from the first
count to the last, ``slower`` where its time grows from one count to the next, and ``*``
where it ran side by side with other kernels (a concurrent stage: its timer overlaps theirs).
Then the cost model against the clock (``_thread_cost.py``): at each count, the median of
measured / estimated time per kind of kernel, those given one thread apart from those given
more.  On one thread it checks the rates (``Machine``); on more, the cost of going parallel
too (``SYNC_NS``, ``WAKE_NS``).
"""

from __future__ import annotations

import argparse
import itertools
import statistics
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from bench.c_models import _counts
from codegraft.backend import Partition
from codegraft.backends.c import CBackend
from codegraft.testing import light_model


@dataclass(frozen=True)
class KernelRow:
    """One kernel at every thread count."""

    name: str  # the ONNX node it computes
    kind: str  # ``Conv -> add+relu``
    ms: tuple[float, ...]  # median per thread count
    threads: tuple[int, ...]  # the cost model's threads per thread count
    side_by_side: bool  # in a concurrent stage at some count
    estimated_us: tuple[float, ...] = ()  # the cost model's time on those threads, per count
    gemm: bool = False  # on the register-blocked micro-kernel

    def slower_steps(self, counts: list[int]) -> list[tuple[int, int]]:
        """``(fewer, more)`` thread counts between which this kernel's time grew.

        >>> KernelRow("n1", "Conv", (1.0, 0.5, 0.6), (1, 4, 16), False).slower_steps([1, 4, 16])
        [(4, 16)]
        """
        steps = zip(itertools.pairwise(counts), itertools.pairwise(self.ms), strict=True)
        return [(a, b) for (a, b), (ta, tb) in steps if tb > ta]


def kernel_rows(model_name: str, counts: list[int], repeat: int) -> list[KernelRow]:
    """Every kernel of ``model_name`` (a light model) timed at each of ``counts`` threads."""
    model = light_model(model_name)
    partition = Partition("bench", ir.from_proto(model))
    rng = np.random.default_rng(0)
    dims = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input}
    inputs = [rng.standard_normal(dims[n]).astype(np.float32) for n in partition.input_names]
    runnables, plans = {}, {}
    for threads in counts:
        backend = CBackend(num_threads=threads)
        runnables[threads] = backend.load(backend.compile(partition))
        plans[threads] = backend.generate(partition)
    times: dict[int, list[list[float]]] = {t: [] for t in counts}
    names: list[str] = []
    kinds: list[str] = []
    for round_ in range(repeat + 1):  # the first round warms up
        order = counts if round_ % 2 == 0 else counts[::-1]
        for threads in order:
            ops = runnables[threads].profile_ops(inputs, 1, warm_up=False)
            if round_:
                times[threads].append([op.ms for op in ops])
            names, kinds = [op.name for op in ops], [op.op_type for op in ops]
    rows = []
    for index, (name, kind) in enumerate(zip(names, kinds, strict=True)):
        together = any(index in stage.kernels for t in counts for stage in plans[t].stages if stage.concurrent)
        rows.append(KernelRow(
            name, kind,
            tuple(statistics.median(call[index] for call in times[t]) for t in counts),
            tuple(plans[t].threads[index].choice.threads for t in counts),
            together,
            tuple(plans[t].threads[index].choice.parallel_us for t in counts),
            plans[counts[0]].threads[index].work.gemm,
        ))
    return rows


def table(rows: list[KernelRow], counts: list[int], top: int) -> str:
    """The Markdown table, slowest at the largest count first, then the totals and flags."""
    at = " / ".join(map(str, counts))
    lines = [
        f"| kernel | node | threads given at {at} | ms at {at} | speedup {counts[0]} -> {counts[-1]} | |",
        "|---|---|---:|---:|---:|---|",
    ]
    for row in sorted(rows, key=lambda r: -r.ms[-1])[:top]:
        flag = "slower" if row.slower_steps(counts) else ""
        mark = " *" if row.side_by_side else ""
        lines.append(
            f"| {row.kind}{mark} | {row.name} | {' / '.join(map(str, row.threads))} | "
            f"{' / '.join(f'{ms:.3f}' for ms in row.ms)} | {row.ms[0] / max(row.ms[-1], 1e-9):.2f} | {flag} |"
        )
    totals = [sum(row.ms[i] for row in rows) for i in range(len(counts))]
    slower = [row for row in rows if row.slower_steps(counts)]
    lines += [
        "",
        f"sum of kernel times at {at} threads: {' / '.join(f'{t:.2f}' for t in totals)} ms"
        " (side-by-side kernels overlap: the sum can exceed the wall time)",
        f"kernels slower with more threads: {len(slower)} of {len(rows)}, "
        f"{sum(row.ms[-1] for row in slower):.2f} ms at {counts[-1]} threads",
    ]
    if all(row.estimated_us for row in rows):
        lines += ["", calibration(rows, counts)]
    return "\n".join(lines)


def calibration(rows: list[KernelRow], counts: list[int]) -> str:
    """Measured / estimated time, medians per count and kind of kernel (GEMM, depthwise Conv,
    Pool, elementwise...), on one thread and on more (side-by-side kernels and those under a
    microsecond left out: their timers overlap, or there is nothing to time).

    >>> rows = [KernelRow("a", "Conv", (0.2, 0.1), (1, 2), False, (100.0, 40.0), gemm=True),
    ...         KernelRow("b", "Pool", (0.1, 0.1), (1, 1), False, (50.0, 50.0))]
    >>> print(calibration(rows, [1, 2]))
    | measured / estimated | 1 thread(s) | 2 thread(s) |
    |---|---:|---:|
    | GEMM on one thread | 2.00 (1) | - |
    | GEMM on more | - | 2.50 (1) |
    | Pool on one thread | 2.00 (1) | 2.00 (1) |
    """
    def kind(row: KernelRow) -> str:
        return "GEMM" if row.gemm else "depthwise Conv" if row.kind.startswith("Conv") else row.kind.split()[0]

    head = " | ".join(f"{t} thread(s)" for t in counts)
    lines = [f"| measured / estimated | {head} |", "|---|" + "---:|" * len(counts)]
    timed = [row for row in rows if not row.side_by_side]
    for name in sorted({kind(row) for row in timed}, key=lambda k: (k != "GEMM", k)):
        for more, how in ((False, "on one thread"), (True, "on more")):
            cells = []
            for i in range(len(counts)):
                ratios = [row.ms[i] * 1e3 / row.estimated_us[i] for row in timed
                          if kind(row) == name and (row.threads[i] > 1) == more
                          and row.ms[i] >= 1e-3 and row.estimated_us[i] > 0]
                cells.append(f"{statistics.median(ratios):.2f} ({len(ratios)})" if ratios else "-")
            if any(cell != "-" for cell in cells):
                lines.append(f"| {name} {how} | {' | '.join(cells)} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="squeezenet")
    parser.add_argument("--threads", type=_counts, default=[1, 4, 16])
    parser.add_argument("--repeat", type=int, default=21)
    parser.add_argument("--top", type=int, default=30, help="rows shown (every kernel counts in the totals)")
    args = parser.parse_args()
    rows = kernel_rows(args.model, args.threads, args.repeat)
    print(f"{args.model}: each kernel on c, median of {args.repeat} calls per thread count, counts called in turn")
    print(table(rows, args.threads, args.top))
    print("(medians of measured / estimated time, kernels counted in brackets)")


if __name__ == "__main__":
    main()
