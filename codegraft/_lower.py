"""Lowering one partition for its backend: prepare (layout, precision), compile, load.

Shared by compile time and by run time, where a backend that needs static shapes gets its
partition specialised to each new input shape.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import onnx
import onnx_ir as ir

from codegraft.backend import Backend, Composite, Partition, Runnable
from codegraft.errors import BackendError

log = logging.getLogger("codegraft")


@dataclass(frozen=True)
class LoweringRequest:
    """What a partition needs to be compiled: its model and how the backend wants it."""

    name: str
    composites: tuple[Composite, ...] = ()
    precision: str = "float32"


def prepare(backend: Backend, proto: onnx.ModelProto, request: LoweringRequest) -> Partition:
    """The :class:`Partition` the backend receives: its layout and precision applied."""
    model = ir.from_proto(proto)
    layout = backend.capabilities.layout
    if layout == "NHWC":
        from codegraft.passes.layout import to_nhwc

        model = to_nhwc(model).model
    precision = request.precision if request.precision in backend.capabilities.precisions else "float32"
    return Partition(request.name, model, request.composites, precision, layout)


def compile_blob(backend: Backend, proto: onnx.ModelProto, request: LoweringRequest) -> bytes:
    """Prepare and compile; any error is re-raised as a :class:`BackendError` naming the partition."""
    try:
        partition = prepare(backend, proto, request)
        return backend.compile(partition)
    except Exception as error:
        raise BackendError(f"{backend.name} failed to compile {request.name}: {type(error).__name__}: {error}") from error


def load_runnable(backend: Backend, blob: bytes, name: str) -> Runnable:
    try:
        return backend.load(blob)
    except Exception as error:
        raise BackendError(f"{backend.name} failed to load {name}: {type(error).__name__}: {error}") from error


def specialise(proto: onnx.ModelProto, shapes: Sequence[tuple[int, ...]]) -> onnx.ModelProto:
    """A copy of ``proto`` with concrete input shapes, shapes re-inferred throughout."""
    concrete = onnx.ModelProto.FromString(proto.SerializeToString())
    for value, shape in zip(concrete.graph.input, shapes, strict=True):
        dims = value.type.tensor_type.shape.dim
        del dims[:]
        for size in shape:
            dims.add().dim_value = size
    del concrete.graph.value_info[:]
    for output in concrete.graph.output:
        output.type.tensor_type.ClearField("shape")
    return onnx.shape_inference.infer_shapes(concrete, strict_mode=True)


class ShapeSpecialisingRunnable:
    """Runs a partition on a static-shape backend: one compile per distinct input shape.

    A shape whose compile fails runs on ``fallback`` (the host) instead, logged, unless
    ``strict``.
    """

    def __init__(
        self,
        backend: Backend,
        template: bytes,
        request: LoweringRequest,
        fallback: Backend,
        *,
        strict: bool,
        compiled: dict[tuple[tuple[int, ...], ...], bytes] | None = None,
    ) -> None:
        self._backend = backend
        self._template = onnx.ModelProto.FromString(template)
        self._request = request
        self._fallback = fallback
        self._strict = strict
        self._lock = threading.Lock()
        self._runnables: dict[tuple[tuple[int, ...], ...], Runnable] = {}
        self.compiled: dict[tuple[tuple[int, ...], ...], bytes] = dict(compiled or {})
        self.failures: dict[tuple[tuple[int, ...], ...], str] = {}

    def run(self, inputs: Sequence[np.ndarray]) -> Sequence[np.ndarray]:
        key = tuple(tuple(int(d) for d in a.shape) for a in inputs)
        runnable = self._runnables.get(key)
        if runnable is None:
            with self._lock:
                runnable = self._runnables.get(key)
                if runnable is None:
                    runnable = self._build(key)
                    self._runnables[key] = runnable
        return runnable.run(inputs)

    def _build(self, key: tuple[tuple[int, ...], ...]) -> Runnable:
        proto = specialise(self._template, key)
        request = replace(self._request, name=f"{self._request.name}@{'x'.join(map(str, key[0])) if key else ''}")
        try:
            blob = self.compiled.get(key) or compile_blob(self._backend, proto, request)
            runnable = load_runnable(self._backend, blob, request.name)
        except BackendError as error:
            if self._strict:
                raise
            log.warning("%s; running it on %s instead", error, self._fallback.name)
            self.failures[key] = str(error)
            host_blob = self._fallback.compile(Partition(request.name, ir.from_proto(proto)))
            return self._fallback.load(host_blob)
        self.compiled[key] = blob
        return runnable
