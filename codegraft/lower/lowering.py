"""Lowering one partition for its backend: prepare (layout, precision), compile, load.

Shared by compile time and by run time, where a backend that needs static shapes gets its
partition specialised to each new input shape.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import onnx
import onnx_ir as ir

from codegraft.backend import Backend, Composite, OpTime, Partition, ProfilingRunnable, Runnable
from codegraft.errors import BackendError
from codegraft.lower.cache import CachedPartition, CompileCache
from codegraft.lower.shape_values import ValueSpecialisingRunnable, worth_trying

log = logging.getLogger("codegraft")


@dataclass(frozen=True)
class LoweringRequest:
    """What a partition needs to be compiled: its model and how the backend wants it.

    ``samples`` are values of the partition's inputs for the precision self-check (generated
    from the declared shapes when empty).
    """

    name: str
    composites: tuple[Composite, ...] = ()
    precision: str = "float32"
    samples: tuple[dict[str, np.ndarray], ...] = field(default=(), repr=False)


@dataclass(frozen=True)
class Prepared:
    """The partition as the backend receives it, and what precision conversion did."""

    partition: Partition
    precision_note: str = ""
    layout_note: str = ""

    @property
    def note(self) -> str:
        return "; ".join(n for n in (self.layout_note, self.precision_note) if n)


def prepare(backend: Backend, proto: onnx.ModelProto, request: LoweringRequest) -> Prepared:
    """The :class:`Partition` the backend receives: its layout and precision applied.

    A lower precision is checked against float32 on sample inputs, run by the backend
    itself; ops that push the error past the tolerance go back to float32 (or, for a backend
    that applies precision as a hint, the whole partition stays float32), and the note says so.
    """
    model = ir.from_proto(proto)
    caps = backend.capabilities
    layout_note = ""
    if caps.layout == "NHWC":
        from codegraft.passes.layout import to_nhwc

        result = to_nhwc(model)
        model = result.model
        if result.converted_ops:
            layout_note = (
                f"NHWC: {result.converted_ops} ops converted, {result.transposes_inserted} transposes "
                f"and {result.reshapes_inserted} reshapes left at edges, {result.transposes_cancelled} cancelled"
            )
    prepared = _prepare_precision(backend, model, request)
    return replace(prepared, layout_note=layout_note)


def _prepare_precision(backend: Backend, model: ir.Model, request: LoweringRequest) -> Prepared:
    caps = backend.capabilities
    wanted = request.precision
    if wanted in ("float32", "int8"):
        return Prepared(Partition(request.name, model, request.composites, "float32", caps.layout))
    if wanted not in caps.precisions:
        note = f"{wanted} not declared by {backend.name}: runs float32"
        return Prepared(Partition(request.name, model, request.composites, "float32", caps.layout), note)
    samples = list(request.samples) or _generated_samples(model)
    if caps.precision_by_hint:
        return _check_hinted(backend, model, request, samples)
    return _convert_and_check(backend, model, request, samples)


def _generated_samples(model: ir.Model) -> list[dict[str, np.ndarray]]:
    from codegraft.passes import sample_feeds_for

    return sample_feeds_for(model, n=2)


def _evaluator(backend: Backend, request: LoweringRequest, precision: str) -> Callable[
    [ir.Model, dict[str, np.ndarray]], dict[str, np.ndarray]
]:
    def evaluate(model: ir.Model, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        partition = Partition(request.name, model, request.composites, precision, backend.capabilities.layout)
        runnable = backend.load(backend.compile(partition))
        outputs = runnable.run([feeds[name] for name in partition.input_names])
        return dict(zip(partition.output_names, outputs, strict=True))

    return evaluate


def _check_hinted(
    backend: Backend, model: ir.Model, request: LoweringRequest, samples: Sequence[dict[str, np.ndarray]]
) -> Prepared:
    from codegraft.passes.precision_check import DEFAULT_TOLERANCE, relative_error

    precision = request.precision
    reference = _evaluator(backend, request, "float32")
    lowered = _evaluator(backend, request, precision)
    error = 0.0
    for sample in samples:
        got, want = lowered(model, dict(sample)), reference(model, dict(sample))
        error = max(error, *(relative_error(got[name], want[name]) for name in want))
    tolerance = DEFAULT_TOLERANCE.get(precision, 1e-2)
    layout = backend.capabilities.layout
    if error > tolerance:
        note = f"{precision} error {error:.2g} > {tolerance:.2g}: partition kept float32"
        return Prepared(Partition(request.name, model, request.composites, "float32", layout), note)
    note = f"{precision} ({backend.name} precision hint), error {error:.2g} vs float32"
    return Prepared(Partition(request.name, model, request.composites, precision, layout), note)


def _convert_and_check(
    backend: Backend, model: ir.Model, request: LoweringRequest, samples: Sequence[dict[str, np.ndarray]]
) -> Prepared:
    from codegraft.passes import BFLOAT16_OPSET, convert_precision_checked, upgrade_opset

    precision = request.precision
    if precision == "bfloat16":
        model = upgrade_opset(model, BFLOAT16_OPSET)
    result = convert_precision_checked(
        model, precision, list(samples), _evaluator(backend, request, precision)  # type: ignore[arg-type]
    )
    layout = backend.capabilities.layout
    if not result.within_tolerance:
        note = f"{precision} error {result.error:.2g} > {result.tolerance:.2g} even after moving ops back: float32"
        return Prepared(Partition(request.name, model, request.composites, "float32", layout), note)
    moved = ", ".join(f"{m.node} ({m.op_type})" for m in result.moved_to_float32)
    note = f"{precision}, error {result.error:.2g} vs float32"
    if moved:
        note += f"; moved back to float32: {moved}"
    return Prepared(Partition(request.name, result.model, request.composites, precision, layout), note)


def compile_blob(backend: Backend, proto: onnx.ModelProto, request: LoweringRequest) -> tuple[bytes, str]:
    """Prepare and compile; any error is re-raised as a :class:`BackendError` naming the partition.

    Returns the blob and the layout and precision notes of :class:`Prepared`.
    """
    try:
        prepared = prepare(backend, proto, request)
        return backend.compile(prepared.partition), prepared.note
    except Exception as error:
        message = f"{backend.name} failed to compile {request.name}: {type(error).__name__}: {error}"
        raise BackendError(message) from error


@dataclass(frozen=True)
class Lowered:
    """A partition compiled (or taken from the cache) and loaded."""

    blob: bytes
    note: str  # the layout and precision notes of :class:`Prepared`
    runnable: Runnable
    cached: bool = False


def compile_and_load(
    backend: Backend,
    proto: onnx.ModelProto | Callable[[], onnx.ModelProto],
    request: LoweringRequest,
    cache: CompileCache | None = None,
    *,
    key: str | None = None,
) -> Lowered:
    """:func:`compile_blob` then :func:`load_runnable`, through ``cache`` when one is given.

    A hit only loads the cached blob; one that fails to load is removed and the partition
    compiled again.  A blob is stored only once it has loaded.  ``proto`` may be a function
    making the partition's model, called only to compile (or to compute the key); ``key`` is
    the cache key when the caller computed it from a cheaper form of the partition (see
    :meth:`CompileCache.key`'s ``weights``).  Errors as for :func:`compile_blob` and
    :func:`load_runnable`.
    """
    model_of = proto if callable(proto) else (lambda: proto)
    if cache is not None and key is None:
        key = cache.key(
            backend, model_of(), name=request.name, composites=request.composites, precision=request.precision,
            samples=request.samples,
        )
    if cache is not None and key is not None:
        hit = cache.get(key)
        if hit is not None:
            try:
                return Lowered(hit.blob, hit.note, backend.load(hit.blob), cached=True)
            except Exception as error:
                log.warning("compiled-partition cache: %s's cached %s did not load (%s: %s); compiling it again",
                            backend.name, request.name, type(error).__name__, error)
                cache.stats.rejected += 1
                cache.discard(key)
    blob, note = compile_blob(backend, model_of(), request)
    runnable = load_runnable(backend, blob, request.name)
    if cache is not None and key is not None:
        cache.put(key, CachedPartition(blob, note))
    return Lowered(blob, note, runnable)


def load_runnable(backend: Backend, blob: bytes, name: str) -> Runnable:
    try:
        return backend.load(blob)
    except Exception as error:
        raise BackendError(f"{backend.name} failed to load {name}: {type(error).__name__}: {error}") from error


def specialise(proto: onnx.ModelProto, shapes: Sequence[tuple[int, ...]]) -> onnx.ModelProto:
    """A copy of ``proto`` with concrete input shapes, shapes re-inferred throughout.

    Where that fails for want of a type (onnx infers none for ai.onnx.ml's Scaler, Normalizer
    and LinearRegressor, so a Relu or MatMul after one has an untyped input), inference runs
    again with the types ``proto`` noted for its values, their shapes still left to inference.
    """
    concrete = onnx.ModelProto.FromString(proto.SerializeToString())
    for value, shape in zip(concrete.graph.input, shapes, strict=True):
        dims = value.type.tensor_type.shape.dim
        del dims[:]
        for size in shape:
            dims.add().dim_value = size
    notes = list(concrete.graph.value_info)
    del concrete.graph.value_info[:]
    for output in concrete.graph.output:
        output.type.tensor_type.ClearField("shape")
    try:
        return onnx.shape_inference.infer_shapes(concrete, strict_mode=True)
    except Exception as error:  # onnx raises several internal error types here
        if not notes:
            raise
        first = error
    for note in notes:
        note.type.tensor_type.ClearField("shape")
    concrete.graph.value_info.extend(notes)
    try:
        return onnx.shape_inference.infer_shapes(concrete, strict_mode=True)
    except Exception:  # noqa: BLE001 - the first error says what is wrong
        raise first from None


class ShapeSpecialisingRunnable:
    """Runs a partition on a static-shape backend: one compile per distinct input shape.

    A shape whose compile fails runs on ``fallback`` (the host) instead, unless ``strict``:
    ``on_failure(partition, shape_key, fallback_name, error)`` is told when set (the executable owning this
    runnable sets it, to put the fallback in its report and warn once per backend), else it is
    logged here.  ``compiled`` holds blobs already made per shape (from an artifact); other
    shapes are compiled through ``cache`` (the compiled-partition cache) when one is given.
    """

    on_failure: Callable[[str, tuple[tuple[int, ...], ...], str, str], None] | None = None

    def __init__(
        self,
        backend: Backend,
        template: bytes,
        request: LoweringRequest,
        fallback: Backend,
        *,
        strict: bool,
        compiled: dict[tuple[tuple[int, ...], ...], bytes] | None = None,
        cache: CompileCache | None = None,
    ) -> None:
        self._backend = backend
        self._template = onnx.ModelProto.FromString(template)
        self._request = request
        self._fallback = fallback
        self._strict = strict
        self._cache = cache
        self._lock = threading.Lock()
        self._runnables: dict[tuple[tuple[int, ...], ...], Runnable] = {}
        self.compiled: dict[tuple[tuple[int, ...], ...], bytes] = dict(compiled or {})
        self.failures: dict[tuple[tuple[int, ...], ...], str] = {}

    def run(self, inputs: Sequence[np.ndarray]) -> Sequence[np.ndarray]:
        key = _shapes_of(inputs)
        runnable = self._runnables.get(key)
        if runnable is None:
            with self._lock:
                runnable = self._runnables.get(key)
                if runnable is None:
                    runnable = self._build(key, inputs)
                    self._runnables[key] = runnable
        return runnable.run(inputs)

    def profile_ops(self, inputs: Sequence[np.ndarray], repeat: int) -> Sequence[OpTime]:
        """Per-op times of the runnable compiled for these inputs' shapes, if it can tell."""
        self.run(inputs)  # compiles this shape if it is new
        runnable = self._runnables[_shapes_of(inputs)]
        return runnable.profile_ops(inputs, repeat) if isinstance(runnable, ProfilingRunnable) else []

    def _build(self, key: tuple[tuple[int, ...], ...], inputs: Sequence[np.ndarray]) -> Runnable:
        proto = specialise(self._template, key)
        request = replace(self._request, name=f"{self._request.name}@{'x'.join(map(str, key[0])) if key else ''}")
        try:
            stored = self.compiled.get(key)
            if stored is not None:
                blob, runnable = stored, load_runnable(self._backend, stored, request.name)
            else:
                lowered = compile_and_load(self._backend, proto, request, self._cache)
                blob, runnable = lowered.blob, lowered.runnable
            self.compiled[key] = blob
            return runnable
        except BackendError as error:
            failure = error
        if worth_trying(proto, inputs):
            # shape arithmetic cut apart from its use: try again with the shape tensors' values
            try:
                def compile_rest(rest: onnx.ModelProto, name: str) -> Runnable:
                    return compile_and_load(self._backend, rest, replace(request, name=name), self._cache).runnable

                return ValueSpecialisingRunnable(
                    compile_rest, proto, request.name, self._fallback, inputs,
                    on_failure=lambda error: self._failed(key, error),
                )
            except BackendError as retry_error:
                log.debug("%s: specialising on shape values did not help either: %s", request.name, retry_error)
        if self._strict:
            raise failure
        self._failed(key, str(failure))
        host_blob = self._fallback.compile(Partition(request.name, ir.from_proto(proto)))
        return self._fallback.load(host_blob)

    def _failed(self, key: tuple[tuple[int, ...], ...], error: str) -> None:
        if self._strict:
            raise BackendError(error)
        self.failures[key] = error
        if self.on_failure is not None:
            self.on_failure(self._request.name, key, self._fallback.name, error)
        else:
            log.warning("%s; running it on %s instead", error.strip().splitlines()[0], self._fallback.name)


def _shapes_of(inputs: Sequence[np.ndarray]) -> tuple[tuple[int, ...], ...]:
    """The key of the runnable compiled for these inputs: their shapes (a numpy shape is a
    tuple of Python ints already; rebuilding each, int by int, cost 5 us a call for ten inputs)."""
    return tuple([a.shape for a in inputs])
