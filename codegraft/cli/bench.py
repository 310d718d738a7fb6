"""``codegraft bench``: one model under the peers (onnxruntime, OpenVINO) and under codegraft.

NOTE: a fair comparison runs every configuration in the same process, with the same thread
count (onnxruntime's intra-op threads, OpenVINO's ``INFERENCE_NUM_THREADS``, codegraft's host
and backends), on the same inputs, after a warm-up.  Each configuration is built, warmed up,
timed and *released* before the next is built: an idle runtime still holds thread pools
(onnxruntime's spin after each call; OpenMP teams of a loaded library), and with several
loaded at once on a small machine they slow each other down by up to 60x, which would
measure the neighbours instead of the configuration.  The runs are split into ``rounds``
(every configuration rebuilt each round; the placement cache makes that cheap), so a slow
phase of the machine, another process or thermal throttling, hurts every configuration alike
instead of whichever ran then.  Figures are medians; each
is also given as a ratio to the best peer, the number a user compares against.
"""

from __future__ import annotations

import functools
import gc
import json
import math
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np
import onnx

from codegraft.core.irversion import readable_by_runtime
from codegraft.runtime.latency import Latency, time_calls

# progress(label, done, total): called after each step of the measurement.
Progress = Callable[[str, int, int], None]
RunFn = Callable[[Mapping[str, np.ndarray]], Mapping[str, np.ndarray]]

PEER_ORT = "onnxruntime"
PEER_OPENVINO = "openvino"


@dataclass(frozen=True)
class BenchRow:
    """One configuration's result; ``error`` is set (and times are NaN) when it could not run."""

    config: str  # "onnxruntime", "openvino", "codegraft[openvino]", "codegraft[measured]", ...
    peer: bool  # a reference tool, not codegraft
    median_ms: float
    min_ms: float
    ratio: float  # median / the best peer's median; < 1 is faster than every peer
    max_rel_error: float  # against onnxruntime with optimisations off
    error: str = ""
    p90_ms: float = float("nan")
    p99_ms: float = float("nan")
    throughput: float = float("nan")  # inferences per second
    runs: int = 0  # timed calls the figures are of


@dataclass(frozen=True)
class BenchTable:
    """The comparison for one model."""

    model: str
    threads: int
    runs: int
    rows: tuple[BenchRow, ...]
    placement: str = ""  # what measured placement chose, with its numbers
    duration: float | None = None  # seconds per configuration, when timed by duration
    concurrency: int = 1  # concurrent requests per configuration
    inputs: tuple[str, ...] = ()  # what was fed

    def best_peer(self) -> BenchRow | None:
        peers = [r for r in self.rows if r.peer and not r.error]
        key = (lambda r: -r.throughput) if self.concurrency > 1 else (lambda r: r.median_ms)
        return min(peers, key=key) if peers else None

    def row(self, config: str) -> BenchRow | None:
        return next((r for r in self.rows if r.config == config), None)

    def to_json(self) -> str:
        """The table as JSON (NaN, for a configuration that failed, as null)."""
        data = asdict(self)
        for row in data["rows"]:
            for key, value in row.items():
                if isinstance(value, float) and math.isnan(value):
                    row[key] = None
        return json.dumps(data, indent=1)

    def render(self) -> str:
        """A plain-text table (also valid Markdown)."""
        measured = f"{self.duration:g} s" if self.duration is not None else f"{self.runs} runs"
        mode = f", {self.concurrency} concurrent requests" if self.concurrency > 1 else ""
        versus = "throughput vs best peer" if self.concurrency > 1 else "vs best peer"
        lines = [
            f"{self.model}: {measured} per configuration{mode}, {self.threads} thread(s)",
            *([f"inputs: {'; '.join(self.inputs)}"] if self.inputs else []),
            "",
            "| configuration | runs | median ms | p90 ms | p99 ms | min ms | inferences/s "
            f"| {versus} | max rel. error |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in self.rows:
            if r.error:
                lines.append(f"| {r.config} | - | - | - | - | - | - | - | failed: {r.error} |")
            else:
                lines.append(
                    f"| {r.config} | {r.runs} | {r.median_ms:.3f} | {r.p90_ms:.3f} | {r.p99_ms:.3f} | {r.min_ms:.3f} "
                    f"| {r.throughput:.1f} | {r.ratio:.2f}x | {r.max_rel_error:.1e} |"
                )
        if self.placement:
            lines += ["", f"measured placement: {self.placement}"]
        return "\n".join(lines)


@dataclass(frozen=True)
class _Config:
    name: str
    peer: bool
    build: Callable[[], RunFn]


def compare(
    model: str | os.PathLike[str] | bytes | onnx.ModelProto,
    targets: Sequence[str],
    *,
    runs: int = 20,
    threads: int = 2,
    warmup: int = 3,
    rounds: int = 3,
    measured: bool = True,
    progress: Progress | None = None,
    name: str | None = None,
    duration: float | None = None,
    concurrency: int = 1,
    feeds: Mapping[str, np.ndarray] | None = None,
    inputs: Sequence[str] = (),
) -> BenchTable:
    """Time ``model`` under the peers and under codegraft with each target, host only, and
    (``measured``, with at least one target) measured placement over all targets.

    ``runs`` timed calls per configuration, or (``duration``) as many as fit in that many
    seconds; ``concurrency`` requests at once (throughput mode, see :mod:`codegraft.runtime.latency`).
    ``feeds`` defaults to random inputs of the declared shapes.

    Example::

        table = compare("model.onnx", ["openvino"], runs=20, threads=2)
        print(table.render())
    """
    from codegraft.core.feeds import random_feeds
    from codegraft.core.options import check_at_least
    from codegraft.core.reference import run_reference
    from codegraft.runtime.latency import check_mode

    check_mode(None if duration is not None else runs, duration, concurrency)
    check_at_least("threads", threads, 1)
    check_at_least("warmup", warmup, 0)
    check_at_least("rounds", rounds, 1)
    proto = _load(model)
    feeds = dict(feeds) if feeds is not None else random_feeds(proto)
    reference = run_reference(proto, feeds)
    notes: dict[str, str] = {}
    configs = _configs(proto, targets, threads, measured, notes, concurrency)
    blocks = _blocks(runs, rounds) if duration is None else [0] * rounds
    per_block = [1 + warmup + (block if duration is None else 1) for block in blocks]
    total = len(configs) * sum(per_block)
    done = 0
    lock = threading.Lock()

    def tick(label: str, steps: int = 1) -> None:
        nonlocal done
        with lock:
            done += steps
            now = done
        if progress is not None:
            progress(label, now, total)

    errors: dict[str, str] = {}
    accuracy: dict[str, float] = {}
    samples: dict[str, list[float]] = {c.name: [] for c in configs}
    walls: dict[str, float] = {c.name: 0.0 for c in configs}
    for block, units in zip(blocks, per_block, strict=True):
        for config in configs:
            if config.name in errors:
                tick(f"skip {config.name}", units)
                continue
            try:
                runner = config.build()
                if config.name not in accuracy:
                    accuracy[config.name] = _max_rel_error(runner(feeds), reference)
            except Exception as error:  # noqa: BLE001 - a configuration that cannot run is a result, not a crash
                errors[config.name] = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
                tick(f"compile {config.name}", units)
                continue
            tick(f"compile {config.name}")
            for _ in range(warmup):
                runner(feeds)
                tick(f"warm-up {config.name}")
            label = f"run {config.name}"
            call = functools.partial(runner, feeds)
            on_call = functools.partial(tick, label) if duration is None else None
            times, wall = time_calls(
                call,
                runs=block if duration is None else None,
                duration=duration / rounds if duration is not None else None,
                concurrency=concurrency,
                on_call=on_call,
            )
            if duration is not None:
                tick(label)
            samples[config.name] += times
            walls[config.name] += wall
            del runner, call  # its thread pools must not compete with the next configuration's
            gc.collect()

    stats = {n: Latency.of(s, walls[n], concurrency) for n, s in samples.items() if s}
    peers = [stats[c.name] for c in configs if c.peer and c.name in stats]
    rows = []
    for config in configs:
        if config.name in errors or config.name not in stats:
            nan = float("nan")
            rows.append(BenchRow(config.name, config.peer, nan, nan, nan, nan, errors.get(config.name, "no runs")))
            continue
        latency = stats[config.name]
        if concurrency > 1:  # throughput mode: the best peer is the one with the most inferences/s
            ratio = max(p.throughput for p in peers) / latency.throughput if peers else float("nan")
        else:
            ratio = latency.p50_ms / min(p.p50_ms for p in peers) if peers else float("nan")
        rows.append(
            BenchRow(
                config.name, config.peer, latency.p50_ms, latency.min_ms, ratio, accuracy[config.name],
                p90_ms=latency.p90_ms, p99_ms=latency.p99_ms, throughput=latency.throughput, runs=latency.runs,
            )
        )
    placement = notes.get("codegraft[measured]", "")
    return BenchTable(
        name or _model_name(model), threads, runs, tuple(rows), placement, duration, concurrency, tuple(inputs)
    )


def _blocks(runs: int, rounds: int) -> list[int]:
    """``runs`` split into ``rounds`` near-equal blocks (none empty)."""
    rounds = max(1, min(rounds, runs))
    return [runs // rounds + (1 if i < runs % rounds else 0) for i in range(rounds)]


def _configs(
    proto: onnx.ModelProto,
    targets: Sequence[str],
    threads: int,
    measured: bool,
    notes: dict[str, str],
    concurrency: int = 1,
) -> list[_Config]:
    # The peers read the model at an IR version the installed onnxruntime reads (onnx 1.23 writes
    # 14, onnxruntime 1.30 reads 13), as codegraft writes its partitions; nothing else changes.
    data = readable_by_runtime(proto).SerializeToString()
    configs = [_Config(PEER_ORT, True, lambda: _onnxruntime_peer(data, threads))]
    if _openvino_installed():
        configs.append(_Config(PEER_OPENVINO, True, lambda: _openvino_peer(data, threads, concurrency)))
    for target in targets:
        configs.append(_Config(f"codegraft[{target}]", False, _codegraft(proto, [target], threads, "first", notes)))
    configs.append(_Config("codegraft[host]", False, _codegraft(proto, [], threads, "first", notes)))
    if measured and targets:
        # The host is listed as a target too, so that it is a candidate even with one target.
        everything = [*targets, "onnxruntime"] if "onnxruntime" not in targets else list(targets)
        configs.append(_Config("codegraft[measured]", False, _codegraft(proto, everything, threads, "measured", notes)))
    return configs


def _onnxruntime_peer(model: bytes, threads: int) -> RunFn:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]

    def run(feeds: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
        return dict(zip(names, session.run(names, dict(feeds)), strict=True))

    return run


def _openvino_peer(model: bytes, threads: int, concurrency: int = 1) -> RunFn:
    import openvino

    core = openvino.Core()
    config: dict[str, object] = {"INFERENCE_NUM_THREADS": threads, "INFERENCE_PRECISION_HINT": "f32"}
    if concurrency > 1:  # as benchmark_app does for concurrent requests: streams to serve them
        config["NUM_STREAMS"] = concurrency
    compiled = core.compile_model(core.read_model(model, b""), "CPU", config)
    outputs = [(port, port.get_any_name()) for port in compiled.outputs]
    local = threading.local()  # an infer request serves one call at a time: one per thread

    def run(feeds: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
        request = getattr(local, "request", None)
        if request is None:
            request = local.request = compiled.create_infer_request()
        result = request.infer(dict(feeds))
        return {name: np.array(result[port]) for port, name in outputs}

    return run


def _codegraft(
    proto: onnx.ModelProto, targets: list[str], threads: int, placement: str, notes: dict[str, str]
) -> Callable[[], RunFn]:
    """Build a codegraft executable; ``notes`` receives where its partitions run and why."""

    def build() -> RunFn:
        import codegraft

        # the threads reach every target named here, as they reach the peers
        exe = codegraft.compile(proto, targets=list(targets), threads=threads, placement=placement)
        counts: dict[str, int] = {}
        for step in exe.steps:
            counts[step.backend] = counts.get(step.backend, 0) + 1
        note = "partitions: " + ", ".join(f"{b} x{n}" for b, n in counts.items())
        for decision in exe.report().placements:
            timings = ", ".join(f"{b} {us / 1e3:.2f} ms" for b, us in decision.timings_us)
            note += f"; {decision.region} -> {decision.chosen} ({timings})"
        notes[f"codegraft[{placement}]" if placement == "measured" else f"codegraft[{','.join(targets) or 'host'}]"] = (
            note
        )
        return exe.run

    return build


def _openvino_installed() -> bool:
    try:
        import openvino  # noqa: F401
    except ImportError:
        return False
    return True


def _load(model: str | os.PathLike[str] | bytes | onnx.ModelProto) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        proto = model
    elif isinstance(model, bytes):
        proto = onnx.load_from_string(model)
    else:
        proto = onnx.load(os.fspath(model))
    return onnx.shape_inference.infer_shapes(proto)


def _model_name(model: object) -> str:
    if isinstance(model, str | os.PathLike):
        return os.path.basename(os.fspath(model))
    if isinstance(model, onnx.ModelProto) and model.graph.name:
        return model.graph.name
    return "model"


def _max_rel_error(actual: Mapping[str, np.ndarray], expected: Mapping[str, np.ndarray]) -> float:
    worst = 0.0
    for name, want in expected.items():
        got = np.asarray(actual[name], dtype=np.float64)
        want64 = want.astype(np.float64)
        scale = max(float(np.max(np.abs(want64))) if want64.size else 0.0, 1e-6)
        if got.shape != want64.shape:
            return float("inf")
        if want64.size:
            worst = max(worst, float(np.max(np.abs(got - want64))) / scale)
    return worst


__all__ = ["BenchRow", "BenchTable", "Progress", "compare"]
