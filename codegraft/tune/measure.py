"""Timing pieces of a model on backends, and remembering the timings on disk.

NOTE: what :mod:`codegraft.tune.placement` decides with, kept apart from the deciding.  A *piece*
is a standalone ONNX model cut from the graph (a region, a chunk, a stretch, a whole plan's
partition); the :class:`Timer` compiles it on a backend, runs it on real intermediate values
and caches the median time under a hash of the piece's ONNX and input shapes, the backend's
name, version and thread count, and the precision.  Loaded runtimes are released after each
measurement: an idle loaded runtime still holds thread pools that slow down whatever is
measured next (by up to 60x on two cores).
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import pathlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
import onnx_ir as ir

from codegraft.backend import Backend, Composite, Runnable, backend_version
from codegraft.core.cachedir import CACHE_ENV, cache_folder
from codegraft.core.feeds import random_array, random_inputs
from codegraft.core.options import CompileOptions
from codegraft.core.reference import values_inside
from codegraft.errors import BackendError
from codegraft.lower.lowering import LoweringRequest, compile_blob, load_runnable, specialise
from codegraft.plan.annotate import Annotation
from codegraft.plan.extract import PartitionPlan, partition_io, partition_proto

# Timing: warm-up runs, then timed runs until both limits are reached (whichever is later).
_WARMUP = 2
_MIN_RUNS = 9
_MIN_SECONDS = 0.15
_MAX_RUNS = 50
# Candidates within this fraction of the fastest are re-timed alternately, this many rounds.
CLOSE_FRACTION = 0.25
ALTERNATE_ROUNDS = 5


# --- the cache ------------------------------------------------------------------------------
def default_cache_dir() -> pathlib.Path:
    """``$CODEGRAFT_CACHE_DIR/placement``, else ``~/.cache/codegraft/placement``."""
    return cache_folder("placement")


class MeasurementCache:
    """Microsecond timings on disk, one small JSON file per key (safe to share between runs)."""

    def __init__(self, directory: pathlib.Path | None = None) -> None:
        self.directory = directory or default_cache_dir()
        self.hits = 0

    def get(self, key: str) -> float | None:
        path = self.directory / f"{key}.json"
        try:
            value = float(json.loads(path.read_text())["us"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
        self.hits += 1
        return value

    def put(self, key: str, microseconds: float, what: str) -> None:
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            temporary = self.directory / f"{key}.{os.getpid()}.tmp"
            temporary.write_text(json.dumps({"us": microseconds, "what": what}))
            temporary.replace(self.directory / f"{key}.json")  # atomic: readers never see half a file
        except OSError:
            pass  # a read-only home only costs a re-measurement next time


@dataclass(frozen=True)
class Piece:
    """A standalone sub-model of the graph that can be compiled and timed."""

    proto: onnx.ModelProto
    inputs: tuple[str, ...]
    composites: tuple[Composite, ...]
    key: str  # hash of the ONNX and the input shapes


class Timer:
    """Compiles pieces on backends and times them on real intermediate values.

    Compiled blobs are kept for the timer's life, so a piece is compiled at most once per
    backend; loaded runnables are released after each measurement, because an idle loaded
    runtime still holds thread pools that slow down whatever is measured next.
    """

    def __init__(
        self,
        backends: Mapping[str, Backend],
        values: Mapping[str, np.ndarray],
        precision: str,
        cache: MeasurementCache,
    ) -> None:
        self.backends = backends
        self.values = values
        self.precision = precision
        self.cache = cache
        self.failures: dict[tuple[str, str], str] = {}
        self._overheads: dict[str, float] = {}
        self._blobs: dict[tuple[str, str], bytes] = {}

    def _key(self, backend_name: str, *parts: object) -> str:
        backend = self.backends[backend_name]
        return content_hash(*parts, backend_name, backend_version(backend), _threads(backend), self.precision)

    def _load(self, piece: Piece, backend_name: str) -> Runnable | None:
        """``piece`` loaded on the backend, or ``None`` (the reason in ``failures``)."""
        if (piece.key, backend_name) in self.failures:
            return None
        backend = self.backends[backend_name]
        request = LoweringRequest(f"measure_{backend_name}", piece.composites, self.precision)
        try:
            blob = self._blobs.get((piece.key, backend_name))
            if blob is None:
                proto = piece.proto
                if not backend.capabilities.dynamic_shapes:
                    proto = specialise(proto, [self.values[name].shape for name in piece.inputs])
                blob = self._blobs[(piece.key, backend_name)] = compile_blob(backend, proto, request)[0]
            return load_runnable(backend, blob, request.name)
        except Exception as error:  # noqa: BLE001 - any failure makes this candidate untimeable, not the compile
            reason = str(error) if isinstance(error, BackendError) else f"{type(error).__name__}: {error}"
            self.failures[(piece.key, backend_name)] = _first_line(reason)
            return None

    def _measure(self, pieces: Sequence[Piece], assignment: Sequence[str]) -> list[float] | None:
        runnables = [self._load(p, b) for p, b in zip(pieces, assignment, strict=True)]
        if any(r is None for r in runnables):
            return None
        calls = [_bind(r, [self.values[n] for n in p.inputs]) for r, p in zip(runnables, pieces, strict=True) if r]
        try:
            return _call_times_us(calls)
        except Exception as error:  # noqa: BLE001 - a backend failing at run time is a failed candidate
            for piece, backend in zip(pieces, assignment, strict=True):
                self.failures[(piece.key, backend)] = f"{type(error).__name__}: {error}"
            return None
        finally:
            del calls, runnables
            gc.collect()

    def failure(self, piece: Piece, backend_name: str) -> str | None:
        """Why ``piece`` could not be timed on the backend, if it could not."""
        return self.failures.get((piece.key, backend_name))

    def time_us(self, piece: Piece, backend_name: str) -> float | None:
        """Microseconds of one call of ``piece`` alone, or ``None`` if it cannot run there."""
        key = self._key(backend_name, piece.key)
        cached = self.cache.get(key)
        if cached is not None:
            return cached
        times = self._measure([piece], [backend_name])
        if times is None:
            return None
        self.cache.put(key, times[0], f"{backend_name} {piece.proto.graph.name}")
        return times[0]

    def chain_us(self, pieces: Sequence[Piece], assignment: Sequence[str]) -> list[float] | None:
        """Microseconds of each piece when all run one after another, ``pieces[i]`` on
        ``assignment[i]``: each piece then finds the caches as the others left them, as in
        the real run, instead of its own weights still in cache from its previous call."""
        chain = content_hash(*(p.key for p in pieces), *assignment)
        keys = [self._key(b, "in-chain", chain, p.key) for p, b in zip(pieces, assignment, strict=True)]
        cached = [self.cache.get(k) for k in keys]
        if all(c is not None for c in cached):
            return [float(c) for c in cached if c is not None]
        times = self._measure(pieces, assignment)
        if times is None:
            return None
        for key, microseconds, piece in zip(keys, times, pieces, strict=True):
            self.cache.put(key, microseconds, f"in chain: {piece.proto.graph.name}")
        return times

    def alternate_us(
        self, options: Sequence[tuple[Sequence[Piece], Sequence[str]]], rounds: int = ALTERNATE_ROUNDS
    ) -> list[float] | None:
        """Total microseconds of each option (its pieces run in a chain on its backends), timed
        in ``rounds`` alternating rounds, the order rotated each round; the median per option.

        Options timed minutes apart see different loads on a shared machine; alternating
        them puts each under the same conditions.  Each option is loaded for its own turn
        only (an idle loaded runtime slows whatever runs next).
        """
        key = content_hash(
            "alternate", rounds, *((*(self._key(b, p.key) for p, b in zip(*o, strict=True)),) for o in options)
        )
        keys = [content_hash(key, index) for index in range(len(options))]
        cached = [self.cache.get(k) for k in keys]
        if all(c is not None for c in cached):
            return [float(c) for c in cached if c is not None]
        totals: list[list[float]] = [[] for _ in options]
        for round_ in range(rounds):
            for index in [(round_ + k) % len(options) for k in range(len(options))]:
                times = self._measure(*options[index])
                if times is None:
                    return None
                totals[index].append(sum(times))
        medians = [float(np.median(t)) for t in totals]
        for k, microseconds in zip(keys, medians, strict=True):
            self.cache.put(k, microseconds, "alternating re-timing")
        return medians

    def overhead_us(self, backend_name: str) -> float:
        """The fixed cost of one partition call on this backend (an Identity of 16 floats)."""
        if backend_name not in self._overheads:
            value = np.zeros(16, np.float32)
            graph = onnx.helper.make_graph(
                [onnx.helper.make_node("Identity", ["x"], ["y"])],
                "overhead",
                [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [16])],
                [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [16])],
            )
            proto = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
            piece = Piece(proto, ("x",), (), content_hash(proto.SerializeToString(), "overhead"))
            timer = Timer(self.backends, {"x": value}, self.precision, self.cache)
            self._overheads[backend_name] = timer.time_us(piece, backend_name) or 0.0
        return self._overheads[backend_name]


# --- pieces of the graph ------------------------------------------------------------------------
def cut_piece(model: ir.Model, annotation: Annotation, units: Sequence[int], name: str) -> Piece:
    inputs, outputs, initializers = region_io(annotation, units)
    nodes = tuple(sorted(i for u in units for i in annotation.units[u].nodes))
    composites = tuple(dict.fromkeys(c for u in units if (c := annotation.units[u].composite) is not None))
    plan = PartitionPlan(name, "", nodes, inputs, outputs, initializers, composites)
    proto = partition_proto(model, annotation, plan)
    proto.graph.name = "region"  # the name must not change the hash of identical regions
    shapes = [tuple(d.dim_value for d in v.type.tensor_type.shape.dim) for v in proto.graph.input]
    key = content_hash(proto.SerializeToString(), repr(shapes))
    proto.graph.name = name
    return Piece(proto, inputs, composites, key)


def region_io(annotation: Annotation, units: Sequence[int]) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """(inputs, outputs, initializers) of the sub-model made of ``units``."""
    nodes = sorted(i for u in units for i in annotation.units[u].nodes)
    inside = set(nodes)
    read_outside = {value for j, info in enumerate(annotation.infos) if j not in inside for value in info.reads}
    return partition_io(
        annotation,
        nodes,
        owned=lambda value: value.is_initializer() and value.const_value is not None,
        read_outside=lambda value: value in read_outside or value.is_graph_output(),
    )


# --- sample inputs and intermediates ----------------------------------------------------------
def sample_feeds(model: ir.Model, options: CompileOptions) -> dict[str, np.ndarray]:
    if options.sample_inputs:
        return {k: np.asarray(v) for k, v in options.sample_inputs[0].items()}
    return random_inputs(model, np.random.default_rng(0))


def intermediates(
    model: ir.Model, feeds: Mapping[str, np.ndarray], names: set[str], host: Backend
) -> dict[str, np.ndarray]:
    """Graph inputs plus the values named in ``names``, from one host run of the model.

    A model the host cannot run (a vendor's custom op) gets random values of the declared
    shapes instead.
    """
    try:
        values = values_inside(model, [feeds], names - set(feeds), threads=_threads(host))[0]
    except Exception:  # noqa: BLE001 - onnxruntime raises several types; random values will do
        values = _random_values(model, names)
    values.update(feeds)
    return values


def _random_values(model: ir.Model, names: set[str]) -> dict[str, np.ndarray]:
    """Random floats (zeros for other types: always valid as indices) of the declared shapes."""
    rng = np.random.default_rng(0)
    values: dict[str, np.ndarray] = {}
    for node in model.graph:
        for value in node.outputs:
            if value.name in names and value.dtype is not None:
                shape = [d if isinstance(d, int) else 1 for d in (value.shape or ())]
                dtype = np.dtype(value.dtype.numpy())
                values[value.name] = random_array(rng, shape, dtype) if dtype.kind == "f" else np.zeros(shape, dtype)
    return values


# --- small helpers ----------------------------------------------------------------------------
def _bind(runnable: Runnable, inputs: list[np.ndarray]) -> Callable[[], object]:
    return lambda: runnable.run(inputs)


def _call_times_us(calls: Sequence[Callable[[], object]]) -> list[float]:
    """Run ``calls`` in order, repeatedly; each call's median time in microseconds.

    The median, not the minimum or a low quantile: some runtimes are bimodal on a loaded
    machine (an OpenMP team whose threads get descheduled runs 30x slower most of the time),
    and the placement must be chosen for the typical run, not the lucky one.
    """
    for _ in range(_WARMUP):
        for call in calls:
            call()
    samples: list[list[float]] = [[] for _ in calls]
    began = time.perf_counter()
    rounds = 0
    while rounds < _MAX_RUNS and (rounds < _MIN_RUNS or time.perf_counter() - began < _MIN_SECONDS):
        for index, call in enumerate(calls):
            start = time.perf_counter()
            call()
            samples[index].append((time.perf_counter() - start) * 1e6)
        rounds += 1
    return [float(np.median(s)) for s in samples]


def _threads(backend: Backend) -> int | None:
    for attribute in ("num_threads", "threads"):
        value = getattr(backend, attribute, None)
        if isinstance(value, int):
            return value
    return None


def _first_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[0] if lines else text


def content_hash(*parts: object) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part if isinstance(part, bytes) else repr(part).encode())
        digest.update(b"\0")
    return digest.hexdigest()[:32]


__all__ = [
    "ALTERNATE_ROUNDS",
    "CACHE_ENV",
    "CLOSE_FRACTION",
    "MeasurementCache",
    "Piece",
    "Timer",
    "cut_piece",
    "default_cache_dir",
    "intermediates",
    "region_io",
    "sample_feeds",
]
