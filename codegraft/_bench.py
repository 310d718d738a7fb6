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

import gc
import os
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx

from codegraft.backend import Backend

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


@dataclass(frozen=True)
class BenchTable:
    """The comparison for one model."""

    model: str
    threads: int
    runs: int
    rows: tuple[BenchRow, ...]
    placement: str = ""  # what measured placement chose, with its numbers

    def best_peer(self) -> BenchRow | None:
        peers = [r for r in self.rows if r.peer and not r.error]
        return min(peers, key=lambda r: r.median_ms) if peers else None

    def row(self, config: str) -> BenchRow | None:
        return next((r for r in self.rows if r.config == config), None)

    def render(self) -> str:
        """A plain-text table (also valid Markdown)."""
        lines = [
            f"{self.model}: median of {self.runs} runs, {self.threads} thread(s)",
            "",
            "| configuration | median ms | min ms | vs best peer | max rel. error |",
            "|---|---:|---:|---:|---:|",
        ]
        for r in self.rows:
            if r.error:
                lines.append(f"| {r.config} | - | - | - | failed: {r.error} |")
            else:
                lines.append(
                    f"| {r.config} | {r.median_ms:.3f} | {r.min_ms:.3f} | {r.ratio:.2f}x | {r.max_rel_error:.1e} |"
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
) -> BenchTable:
    """Time ``model`` under the peers and under codegraft with each target, host only, and
    (``measured``, with at least one target) measured placement over all targets.

    Example::

        table = compare("model.onnx", ["openvino"], runs=20, threads=2)
        print(table.render())
    """
    from codegraft._options import check_at_least
    from codegraft.testing import random_feeds, run_onnxruntime

    check_at_least("runs", runs, 1)
    check_at_least("threads", threads, 1)
    check_at_least("warmup", warmup, 0)
    check_at_least("rounds", rounds, 1)
    proto = _load(model)
    feeds = random_feeds(proto)
    reference = run_onnxruntime(proto, feeds)
    notes: dict[str, str] = {}
    configs = _configs(proto, targets, threads, measured, notes)
    total = len(configs) * (len(_blocks(runs, rounds)) * (1 + warmup) + runs)
    done = 0

    def tick(label: str) -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(label, done, total)

    errors: dict[str, str] = {}
    accuracy: dict[str, float] = {}
    samples: dict[str, list[float]] = {c.name: [] for c in configs}
    for block in _blocks(runs, rounds):
        for config in configs:
            if config.name in errors:
                done += 1 + warmup + block
                continue
            try:
                runner = config.build()
                if config.name not in accuracy:
                    accuracy[config.name] = _max_rel_error(runner(feeds), reference)
            except Exception as error:  # noqa: BLE001 - a configuration that cannot run is a result, not a crash
                errors[config.name] = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
                done += warmup + block
                tick(f"compile {config.name}")
                continue
            tick(f"compile {config.name}")
            for _ in range(warmup):
                runner(feeds)
                tick(f"warm-up {config.name}")
            for _ in range(block):
                start = time.perf_counter()
                runner(feeds)
                samples[config.name].append((time.perf_counter() - start) * 1e3)
                tick(f"run {config.name}")
            del runner  # its thread pools must not compete with the next configuration's
            gc.collect()

    medians = {n: statistics.median(s) for n, s in samples.items() if s}
    peer_medians = [medians[c.name] for c in configs if c.peer and c.name in medians]
    best = min(peer_medians) if peer_medians else float("nan")
    rows = []
    for config in configs:
        if config.name in errors:
            nan = float("nan")
            rows.append(BenchRow(config.name, config.peer, nan, nan, nan, nan, errors[config.name]))
            continue
        median = medians[config.name]
        rows.append(
            BenchRow(
                config.name,
                config.peer,
                median,
                min(samples[config.name]),
                median / best,
                accuracy[config.name],
            )
        )
    placement = notes.get("codegraft[measured]", "")
    return BenchTable(name or _model_name(model), threads, runs, tuple(rows), placement)


def _blocks(runs: int, rounds: int) -> list[int]:
    """``runs`` split into ``rounds`` near-equal blocks (none empty)."""
    rounds = max(1, min(rounds, runs))
    return [runs // rounds + (1 if i < runs % rounds else 0) for i in range(rounds)]


def _configs(
    proto: onnx.ModelProto, targets: Sequence[str], threads: int, measured: bool, notes: dict[str, str]
) -> list[_Config]:
    data = proto.SerializeToString()
    configs = [_Config(PEER_ORT, True, lambda: _onnxruntime_peer(data, threads))]
    if _openvino_installed():
        configs.append(_Config(PEER_OPENVINO, True, lambda: _openvino_peer(data, threads)))
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


def _openvino_peer(model: bytes, threads: int) -> RunFn:
    import openvino

    core = openvino.Core()
    config = {"INFERENCE_NUM_THREADS": threads, "INFERENCE_PRECISION_HINT": "f32"}
    compiled = core.compile_model(core.read_model(model, b""), "CPU", config)
    request = compiled.create_infer_request()
    outputs = [(port, port.get_any_name()) for port in compiled.outputs]

    def run(feeds: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
        result = request.infer(dict(feeds))
        return {name: np.array(result[port]) for port, name in outputs}

    return run


def _codegraft(
    proto: onnx.ModelProto, targets: list[str], threads: int, placement: str, notes: dict[str, str]
) -> Callable[[], RunFn]:
    """Build a codegraft executable; ``notes`` receives where its partitions run and why."""

    def build() -> RunFn:
        import codegraft

        backends = [make_target(t, threads) for t in targets]
        exe = codegraft.compile(proto, targets=backends, threads=threads, placement=placement)
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


def make_target(name: str, threads: int) -> Backend:
    """The backend called ``name``, with ``threads`` where the backend takes a thread count."""
    if name == "openvino":
        from codegraft.backends.openvino import OpenVINOBackend

        return OpenVINOBackend(num_threads=threads)
    if name == "onnxruntime":
        from codegraft.backends.onnxruntime import OnnxRuntimeBackend

        return OnnxRuntimeBackend(threads=threads)
    from codegraft.backends import get_backend

    return get_backend(name)


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


__all__ = ["BenchRow", "BenchTable", "Progress", "compare", "make_target"]
