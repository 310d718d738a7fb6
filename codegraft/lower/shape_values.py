"""A partition specialised on the values of its shape tensors, its constant outputs computed once.

A static-shape backend gets each partition specialised to each input shape
(:class:`~codegraft.lower.lowering.ShapeSpecialisingRunnable`).  Two kinds of partition
still fail there, because the partitioner cut shape arithmetic apart from its use:

- one that receives a shape as a run-time integer input (``Shape -> Concat`` on one side of
  the cut, ``Reshape`` on the other): the backend cannot size its buffers;
- one whose output is shape arithmetic, an integer constant once the input shapes are known,
  which a float-only backend cannot return.

Only when the shape-specialised compile failed, :class:`ValueSpecialisingRunnable` tries
again: small integer inputs (a few elements: shape tensors) become constant initializers,
keyed by their values (a bounded number of versions, then the host), and the integer outputs
that depend on nothing but shapes and constants are computed once on the host at those
shapes and values and returned as they are; the backend compiles the rest.

Example::

    compile_rest = lambda proto, name: compile_and_load(c_backend, proto, replace(request, name=name)).runnable
    runnable = ValueSpecialisingRunnable(compile_rest, specialised_proto, "p2_c@1x3", host, inputs)
    runnable.run(inputs)   # the backend's code, with the shape values baked in
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
import onnx_ir as ir

from codegraft.backend import Backend, Partition, Runnable
from codegraft.core.graphinfo import RANDOM_OPS
from codegraft.errors import BackendError

log = logging.getLogger("codegraft")

MAX_VALUE_ELEMENTS = 16  # an integer input this small is a shape (or a scalar index), not data
MAX_VALUE_VERSIONS = 8  # distinct values compiled per input shape before the host takes the rest

_STANDARD = ("", "ai.onnx")
_SHAPE_OF = ("Shape", "Size")

ValueKey = tuple[tuple[int, ...], ...]


def value_inputs(inputs: Sequence[np.ndarray]) -> list[int]:
    """Positions of the small integer inputs (shape tensors, scalars) worth specialising on."""
    return [i for i, a in enumerate(inputs) if a.dtype.kind in "iu" and a.size <= MAX_VALUE_ELEMENTS]


def with_values(proto: onnx.ModelProto, values: dict[str, np.ndarray]) -> onnx.ModelProto:
    """A copy of ``proto`` whose inputs named in ``values`` are constant initializers."""
    concrete = onnx.ModelProto.FromString(proto.SerializeToString())
    kept = [v for v in concrete.graph.input if v.name not in values]
    del concrete.graph.input[:]
    concrete.graph.input.extend(kept)
    concrete.graph.initializer.extend(onnx.numpy_helper.from_array(a, name) for name, a in values.items())
    return concrete


def static_integer_outputs(proto: onnx.ModelProto) -> list[str]:
    """The non-float outputs that depend on nothing but input shapes and constants.

    A value is static when it is an initializer, the output of ``Shape``/``Size``, or the
    output of a deterministic standard node (no subgraph) whose inputs are all static.
    """
    graph = proto.graph
    static = {t.name for t in graph.initializer} | {""}
    for node in graph.node:
        if node.domain not in _STANDARD or node.op_type in RANDOM_OPS:
            continue
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
            continue
        if node.op_type in _SHAPE_OF or all(name in static for name in node.input):
            static.update(node.output)
    return [
        v.name for v in graph.output
        if v.name in static and v.type.tensor_type.elem_type != onnx.TensorProto.FLOAT
    ]


def without_outputs(proto: onnx.ModelProto, dropped: set[str]) -> onnx.ModelProto:
    """A copy of ``proto`` without the outputs ``dropped`` and the nodes only they needed."""
    concrete = onnx.ModelProto.FromString(proto.SerializeToString())
    graph = concrete.graph
    kept_outputs = [v for v in graph.output if v.name not in dropped]
    del graph.output[:]
    graph.output.extend(kept_outputs)
    needed = {v.name for v in kept_outputs}
    kept_nodes = []
    for node in reversed(graph.node):
        if any(name in needed for name in node.output):
            kept_nodes.append(node)
            needed.update(node.input)
    del graph.node[:]
    graph.node.extend(reversed(kept_nodes))
    return concrete


@dataclass(frozen=True)
class _Version:
    """One compiled version: the backend's runnable (None when every output is a constant)."""

    runnable: Runnable | None
    backend_inputs: tuple[int, ...]  # positions of the partition's inputs the runnable takes
    outputs: tuple[int | np.ndarray, ...]  # per partition output: the runnable's output index, or its value

    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        got: Sequence[np.ndarray] = ()
        if self.runnable is not None:
            got = self.runnable.run([inputs[i] for i in self.backend_inputs])
        return [got[o] if isinstance(o, int) else o for o in self.outputs]


class ValueSpecialisingRunnable:
    """One partition at one input shape, compiled per value of its small integer inputs.

    The first version is compiled in the constructor, so a partition this does not help
    raises :class:`BackendError` there (the caller falls back as before).  Later values that
    fail to compile, and values past :data:`MAX_VALUE_VERSIONS`, run on ``fallback`` at this
    shape; ``on_failure(error)`` is told (the report says so).
    """

    def __init__(
        self,
        compile_rest: Callable[[onnx.ModelProto, str], Runnable],
        proto: onnx.ModelProto,
        name: str,
        fallback: Backend,
        inputs: Sequence[np.ndarray],
        *,
        on_failure: Callable[[str], None] | None = None,
    ) -> None:
        self._compile_rest, self._proto, self._name, self._fallback = compile_rest, proto, name, fallback
        self._on_failure = on_failure
        self._positions = value_inputs(inputs)
        self._names = [v.name for v in proto.graph.input]
        self._versions: dict[ValueKey, _Version] = {}
        self._host: Runnable | None = None
        self._lock = threading.Lock()
        first = self._key(inputs)
        self._versions[first] = self._compile(inputs)

    def _key(self, inputs: Sequence[np.ndarray]) -> ValueKey:
        return tuple(tuple(int(x) for x in np.asarray(inputs[i]).ravel()) for i in self._positions)

    def run(self, inputs: Sequence[np.ndarray]) -> Sequence[np.ndarray]:
        key = self._key(inputs)
        version = self._versions.get(key)
        if version is None:
            with self._lock:
                version = self._versions.get(key) or self._new_version(key, inputs)
        return version.run(inputs)

    def _new_version(self, key: ValueKey, inputs: Sequence[np.ndarray]) -> _Version:
        """Compiled for these values, or the host at this shape (told once per value)."""
        if len(self._versions) < MAX_VALUE_VERSIONS:
            try:
                version = self._compile(inputs)
            except BackendError as error:
                self._failed(str(error))
            else:
                self._versions[key] = version
                return version
        else:
            self._failed(f"more than {MAX_VALUE_VERSIONS} distinct values of its shape inputs")
        on_host = _Version(self._on_host(), tuple(range(len(inputs))), tuple(range(len(self._proto.graph.output))))
        if len(self._versions) < 4 * MAX_VALUE_VERSIONS:  # remembered, so told once; bounded
            self._versions[key] = on_host
        return on_host

    def _failed(self, error: str) -> None:
        if self._on_failure is not None:
            self._on_failure(error)
        else:
            log.warning("%s; running it on %s instead", error.strip().splitlines()[0], self._fallback.name)

    def _on_host(self) -> Runnable:
        if self._host is None:
            partition = Partition(self._name, ir.from_proto(self._proto))
            self._host = self._fallback.load(self._fallback.compile(partition))
        return self._host

    def _compile(self, inputs: Sequence[np.ndarray]) -> _Version:
        """The version for these inputs' values: constants computed on the host, the rest compiled."""
        values = {self._names[i]: np.asarray(inputs[i]) for i in self._positions}
        proto = with_values(self._proto, values)
        constant_names = static_integer_outputs(proto)
        kept = tuple(i for i, name in enumerate(self._names) if name not in values)
        kept_feeds = [inputs[i] for i in kept]
        constants: dict[str, np.ndarray] = {}
        try:
            if constant_names:
                host_proto = without_outputs(proto, set(proto_outputs(proto)) - set(constant_names))
                host = self._fallback.load(
                    self._fallback.compile(Partition(f"{self._name}.constants", ir.from_proto(host_proto)))
                )
                constants = dict(zip(proto_outputs(host_proto), host.run(kept_feeds), strict=True))
        except Exception as error:
            raise BackendError(
                f"{self._fallback.name} failed to compute {self._name}'s constant outputs: "
                f"{type(error).__name__}: {error}"
            ) from error
        rest = without_outputs(proto, set(constants))
        names = proto_outputs(rest)
        runnable = None
        if names:
            suffix = ",".join("x".join(map(str, v.ravel().tolist())) for v in values.values())
            runnable = self._compile_rest(rest, f"{self._name}={suffix}" if suffix else self._name)
        index = {name: i for i, name in enumerate(names)}
        outputs = tuple(
            constants[name] if name in constants else index[name] for name in proto_outputs(self._proto)
        )
        log.info("%s compiled with its shape inputs' values %s; %d constant outputs computed once on %s",
                 self._name, list(values), len(constants), self._fallback.name)
        return _Version(runnable, kept, outputs)


def proto_outputs(proto: onnx.ModelProto) -> list[str]:
    return [v.name for v in proto.graph.output]


def worth_trying(proto: onnx.ModelProto, inputs: Sequence[np.ndarray]) -> bool:
    """Whether value specialisation could change anything for this partition at these inputs."""
    return bool(value_inputs(inputs)) or bool(static_integer_outputs(proto))


def shape_arithmetic_cut(proto: onnx.ModelProto) -> bool:
    """Whether a partition has what :class:`ValueSpecialisingRunnable` helps with, before any run.

    A small integer input (its declared shape static, at most :data:`MAX_VALUE_ELEMENTS`
    elements) or an integer output depending only on shapes and constants.
    """
    for value in proto.graph.input:
        tensor = value.type.tensor_type
        static = tensor.HasField("shape") and all(d.HasField("dim_value") for d in tensor.shape.dim)
        integer = tensor.elem_type in (onnx.TensorProto.INT64, onnx.TensorProto.INT32)
        if integer and static and int(np.prod([d.dim_value for d in tensor.shape.dim])) <= MAX_VALUE_ELEMENTS:
            return True
    return bool(static_integer_outputs(proto))
