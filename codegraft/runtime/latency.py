"""Timing calls: latency percentiles and throughput, for a count of runs or a duration, from
one thread or from N concurrent requests (benchmark_app's ``-hint throughput``).

NOTE: with ``concurrency`` N, N threads each call ``fn`` in a loop (``Executable.run`` is
safe from several threads; each peer gives each thread its own request object).  Latency is
per call as each thread saw it; throughput is completed calls over the wall time of the whole
measurement, which is what concurrency raises.  In count mode the N threads share the
``runs`` budget; in duration mode each keeps calling until the deadline and the call in
flight then is still counted.

Example::

    latency = measure(lambda: exe.run(feeds), runs=100, concurrency=4)
    print(latency.describe())   # "p50 3.10 ms, p90 3.52 ms, p99 4.01 ms, min 2.95 ms; 1268.1 inferences/s ..."
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from codegraft.core.options import check_at_least
from codegraft.errors import OptionError


@dataclass(frozen=True)
class Latency:
    """Latency percentiles (ms) of ``runs`` calls and the throughput they reached."""

    runs: int
    min_ms: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    mean_ms: float
    throughput: float  # calls completed per second of wall time
    wall_s: float
    concurrency: int = 1

    @staticmethod
    def of(samples_ms: Sequence[float], wall_s: float, concurrency: int = 1) -> Latency:
        """Statistics of per-call times ``samples_ms`` measured over ``wall_s`` seconds."""
        if not samples_ms:
            nan = float("nan")
            return Latency(0, nan, nan, nan, nan, nan, nan, wall_s, concurrency)
        values = np.asarray(samples_ms, dtype=np.float64)
        p50, p90, p99 = (float(v) for v in np.percentile(values, [50, 90, 99]))
        return Latency(
            len(values), float(values.min()), p50, p90, p99, float(values.mean()),
            len(values) / wall_s if wall_s > 0 else float("nan"), wall_s, concurrency,
        )

    def describe(self) -> str:
        """One line: percentiles, min, throughput, and how many calls they are of."""
        streams = f", {self.concurrency} concurrent requests" if self.concurrency > 1 else ""
        return (
            f"p50 {self.p50_ms:.3f} ms, p90 {self.p90_ms:.3f} ms, p99 {self.p99_ms:.3f} ms, min {self.min_ms:.3f} ms; "
            f"{self.throughput:.1f} inferences/s ({self.runs} runs in {self.wall_s:.2f} s{streams})"
        )


def measure(
    fn: Callable[[], object],
    *,
    runs: int | None = None,
    duration: float | None = None,
    concurrency: int = 1,
    on_call: Callable[[], None] | None = None,
) -> Latency:
    """Call ``fn`` ``runs`` times, or for ``duration`` seconds, from ``concurrency`` threads."""
    samples, wall = time_calls(fn, runs=runs, duration=duration, concurrency=concurrency, on_call=on_call)
    return Latency.of(samples, wall, concurrency)


def time_calls(
    fn: Callable[[], object],
    *,
    runs: int | None = None,
    duration: float | None = None,
    concurrency: int = 1,
    on_call: Callable[[], None] | None = None,
) -> tuple[list[float], float]:
    """Per-call times (ms) and the wall time (s) of the whole measurement; see the module note."""
    check_mode(runs, duration, concurrency)
    samples: list[float] = []
    lock = threading.Lock()
    budget = [runs if runs is not None else -1]
    errors: list[BaseException] = []
    start = time.perf_counter()
    deadline = start + duration if duration is not None else float("inf")

    def worker() -> None:
        try:
            while True:
                with lock:
                    if errors or (runs is not None and budget[0] <= 0):
                        return
                    budget[0] -= 1
                if time.perf_counter() >= deadline:
                    return
                began = time.perf_counter()
                fn()
                took = (time.perf_counter() - began) * 1e3
                with lock:
                    samples.append(took)
                if on_call is not None:
                    on_call()
        except BaseException as error:  # noqa: BLE001 - re-raised in the caller's thread
            with lock:
                errors.append(error)

    if concurrency == 1:
        worker()
    else:
        threads = [threading.Thread(target=worker, daemon=True) for _ in range(concurrency)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    wall = time.perf_counter() - start
    if errors:
        raise errors[0]
    return samples, wall


def check_mode(runs: int | None, duration: float | None, concurrency: int) -> None:
    """Exactly one of ``runs`` (>= 1) and ``duration`` (> 0 s); ``concurrency`` >= 1."""
    if (runs is None) == (duration is None):
        raise OptionError("give either runs or duration (seconds), not both or neither")
    if runs is not None:
        check_at_least("runs", runs, 1)
    if duration is not None and not duration > 0:
        raise OptionError(f"duration must be > 0 seconds, got {duration!r}")
    check_at_least("concurrency", concurrency, 1)


__all__ = ["Latency", "check_mode", "measure", "time_calls"]
