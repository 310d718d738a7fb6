"""What a vendor implements: a backend is a few small typed classes.

NOTE: the contract is deliberately small.  A backend answers, per node, *yes or why not*
(:meth:`Backend.supports`); it may declare fused groups it wants whole
(:meth:`Backend.patterns`); it turns one :class:`Partition` into self-contained bytes
(:meth:`Backend.compile`) and bytes back into a :class:`Runnable` (:meth:`Backend.load`).
Everything else - optimisation, layout and precision conversion, grouping nodes into
cycle-free partitions, the host fallback, the artifact, the runtime - is codegraft's.

The rules a backend can rely on:

- ``supports`` is asked about *every* node the backend would take, the members of a pattern
  match included: a match with a declined member is not claimed (the report says which
  member and why), so a pattern never smuggles in a node ``supports`` refuses.
- ``name`` (a string) and ``capabilities`` are checked when the backend is registered or
  passed as a target; a missing one is named in the error.
- ``version`` (optional string attribute) keys codegraft's caches (measured-placement
  timings, compiled partitions): change it whenever your generated code changes.
- ``cache_fingerprint()`` (optional, see :class:`CachingBackend`) opts a backend into the
  compiled-partition cache: a recompile then loads the blob it compiled before.
- A backend that cannot run on this machine (no compiler, no driver, no library) should be
  made unavailable by its factory raising :class:`~codegraft.errors.BackendUnavailable`
  with the reason; ``codegraft backends`` shows it and nothing else is affected.

A minimal backend::

    class MyBackend:
        name = "mine"
        capabilities = Capabilities(dynamic_shapes=False)

        def supports(self, node: ir.Node) -> Support:
            if node.op_type not in {"Conv", "Relu"}:
                return Support.no(f"{node.op_type} is not implemented")
            return Support.yes()

        def compile(self, partition: Partition) -> bytes:
            return my_codegen(partition.model)

        def load(self, blob: bytes) -> Runnable:
            return MyRunnable(blob)

Walking a partition in ``compile`` (``partition.model`` is an ``onnx_ir.Model``)::

    graph = partition.model.graph
    for value in graph.inputs:                  # what run() receives, in order
        print(value.name, value.dtype, value.shape)        # shape: concrete dims or names
    for name, value in graph.initializers.items():         # the constants this partition owns
        weights = value.const_value.numpy()
    for node in graph:                                      # topological order
        attrs = node.attributes                             # get_int/get_float/get_ints(...)
        stride = attrs.get_ints("strides", [1, 1])
        x, w = node.inputs[0], node.inputs[1]               # ir.Value (None: omitted optional)
        if w is not None and w.const_value is not None:     # a constant input
            w_array = w.const_value.numpy()
        producer = x.producer()                             # the node computing x, or None
    for composite in partition.composites:                  # pattern matches claimed whole
        parts = partition.captures(composite)               # capture name -> ir.Node | ir.Value
        conv, act = parts["conv"], parts.get("act")         # absent when that part did not match
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

import numpy as np
import onnx_ir as ir

# Support is a basic type (imports nothing); CompositeRule belongs to the pattern language.
# Both are part of the vendor contract, so they are re-exported here.
from codegraft.core.support import Support
from codegraft.errors import BackendError
from codegraft.patterns._pattern import CompositeCheck, CompositeRule

Layout = Literal["NCHW", "NHWC"]
Precision = Literal["float32", "float16", "bfloat16", "int8"]


@dataclass(frozen=True)
class Capabilities:
    """What a backend can take, declared once.

    ``dynamic_shapes=False`` makes codegraft specialise each partition to the concrete
    shapes seen at run time, compiling once per shape and caching the result.
    ``dtypes`` lists the element types (ONNX names such as ``"float32"``) the backend
    accepts on the values its nodes read and write; nodes touching others are declined
    by codegraft with that reason before :meth:`Backend.supports` is asked.
    ``layout`` is the layout the backend wants for layout-sensitive ops.
    ``precisions`` are the compute precisions it runs.
    ``precision_by_hint``: the backend lowers precision itself when :attr:`Partition.precision`
    asks (an inference hint, as OpenVINO's), so codegraft does not convert the graph; it
    still checks the result against float32 and keeps float32 if the error is too large.
    ``native_code`` says the blob holds machine code, which the artifact records and
    hash-checks before loading.
    ``call_overhead_us`` is what one call into one of its partitions costs beyond the kernels,
    in microseconds: its runtime's fixed cost (binding inputs, an inference request).  With
    first-fit placement, a light partition (under ``min_partition_macs`` multiply-adds) of a
    backend whose calls cost more than the host's goes to the host; 0 (not known) never does.
    """

    dynamic_shapes: bool = True
    dtypes: frozenset[str] | None = None  # None: any
    layout: Layout = "NCHW"
    precisions: frozenset[str] = frozenset({"float32"})
    precision_by_hint: bool = False
    native_code: bool = False
    call_overhead_us: float = 0.0


@dataclass(frozen=True)
class Capture:
    """One named part of a pattern match: a node (``kind="node"``) or a value, by name."""

    name: str  # the pattern's capture name, e.g. "conv" or "bias"
    kind: Literal["node", "value"]
    ref: str  # the node's or the value's name in the model


@dataclass(frozen=True)
class Composite:
    """A fused group found by a pattern: the backend receives it whole, named, with its captures.

    Its nodes also carry ``metadata_props["codegraft.composite"] = instance`` in the
    partition model, so a backend walking the graph sees the grouping too.  The pattern's
    named captures (``_name="conv"``, ``const("bias")``) come as :class:`Capture` by name;
    :meth:`Partition.captures` resolves them to the partition's nodes and values, so a
    backend never re-runs the matcher.
    """

    rule: str  # the pattern's name, e.g. "conv_bias_relu"
    instance: str  # unique name of this match, e.g. "conv_bias_relu_3"
    node_names: tuple[str, ...]
    captures: tuple[Capture, ...] = ()


@dataclass(frozen=True)
class Partition:
    """One cycle-free subgraph handed to a backend's ``compile``.

    ``model`` is a standalone ONNX model: its graph inputs are the partition's inputs (in
    the order :meth:`Runnable.run` receives them), its graph outputs the partition's
    outputs (in the order ``run`` must return them), and its initializers the constants
    this partition alone owns.  Shapes are inferred; when the backend declared
    ``dynamic_shapes=False`` every input shape is concrete.
    """

    name: str
    model: ir.Model
    composites: tuple[Composite, ...] = ()
    precision: str = "float32"
    layout: Layout = "NCHW"

    @property
    def input_names(self) -> list[str]:
        return [v.name or "" for v in self.model.graph.inputs]

    def captures(self, composite: Composite) -> dict[str, ir.Node | ir.Value]:
        """``composite``'s captures as this partition's nodes and values, by capture name.

        Example: ``conv = partition.captures(c)["conv"]; bias = partition.captures(c).get("bias")``.
        A capture whose node or value this partition's model no longer has (a layout or
        precision conversion renamed it) is left out.
        """
        graph = self.model.graph
        nodes = {node.name: node for node in graph}
        values: dict[str | None, ir.Value] = {v.name: v for v in graph.inputs}
        values.update(graph.initializers)
        for node in graph:
            values.update((v.name, v) for v in node.outputs)
        found: dict[str, ir.Node | ir.Value] = {}
        for capture in composite.captures:
            item = nodes.get(capture.ref) if capture.kind == "node" else values.get(capture.ref)
            if item is not None:
                found[capture.name] = item
        return found

    @property
    def output_names(self) -> list[str]:
        return [v.name or "" for v in self.model.graph.outputs]


@runtime_checkable
class Runnable(Protocol):
    """A loaded partition.  ``run`` must be safe to call from several threads at once."""

    def run(self, inputs: Sequence[np.ndarray]) -> Sequence[np.ndarray]:
        """Take the partition inputs in order; return its outputs in order."""
        ...


@dataclass(frozen=True)
class OpTime:
    """One op's time inside a partition as the backend's own profiler measured it (mean ms)."""

    name: str
    op_type: str
    ms: float


@runtime_checkable
class ProfilingRunnable(Protocol):
    """Optional: a :class:`Runnable` that can say where its time goes, per op.

    ``codegraft run --profile`` and ``Executable.profile(ops=True)`` call it for partitions
    whose runnable has it (onnxruntime's and OpenVINO's profilers do); others are profiled
    per partition only.

    Example::

        class MyRunnable:
            def run(self, inputs): ...
            def profile_ops(self, inputs, repeat):
                return [OpTime("conv1", "Conv", 0.42), ...]
    """

    def run(self, inputs: Sequence[np.ndarray]) -> Sequence[np.ndarray]: ...

    def profile_ops(self, inputs: Sequence[np.ndarray], repeat: int) -> Sequence[OpTime]:
        """Run ``repeat`` times on ``inputs``; each op's mean time, in execution order."""
        ...


@runtime_checkable
class Backend(Protocol):
    """What a vendor implements.  See the module docstring for a complete example."""

    name: str
    capabilities: Capabilities

    def supports(self, node: ir.Node) -> Support:
        """Yes, or the reason this node cannot run here (shown in the report)."""
        ...

    def compile(self, partition: Partition) -> bytes:
        """Turn one partition into a self-contained blob (stored in the artifact)."""
        ...

    def load(self, blob: bytes) -> Runnable:
        """Turn a blob from :meth:`compile` back into something that runs."""
        ...


@runtime_checkable
class CachingBackend(Protocol):
    """Optional: a :class:`Backend` whose compiled partitions codegraft may cache on disk.

    ``cache_fingerprint()`` returns a string naming everything *besides* the partition, the
    precision and layout codegraft asked for, and the backend's ``name`` and ``version``
    that changes what :meth:`Backend.compile` returns: its options (threads, tuning), the
    CPU or device it compiles for and that target's features, its compiler's or runtime
    library's version.  Two calls returning the same string promise the same blob for the
    same partition; ``None`` means "do not cache" (the backend cannot tell).  Without the
    method a backend is never cached, so a wrong fingerprint is the only way a stale blob
    can come back: when in doubt, put it in.

    The cache key also covers the partition's ONNX bytes (weights included), codegraft's
    own source and the onnx, onnx-ir and numpy versions; a hit skips layout and precision
    conversion and ``compile``, and calls only ``load`` (a blob that fails to load is
    compiled again).

    Example::

        class MyBackend:
            name, version = "mine", "3"
            def __init__(self, threads: int = 4, arch: str = "v2") -> None:
                self.threads, self.arch = threads, arch
            def cache_fingerprint(self) -> str | None:
                return f"threads={self.threads} arch={self.arch} sdk={my_sdk.__version__}"
            ...
    """

    name: str
    capabilities: Capabilities

    def supports(self, node: ir.Node) -> Support: ...

    def compile(self, partition: Partition) -> bytes: ...

    def load(self, blob: bytes) -> Runnable: ...

    def cache_fingerprint(self) -> str | None:
        """What besides the partition shapes the compiled blob; ``None``: do not cache."""
        ...


def backend_fingerprint(backend: Backend) -> str | None:
    """``backend.cache_fingerprint()``, or ``None`` for a backend without one (never cached)."""
    fingerprint = getattr(backend, "cache_fingerprint", None)
    if not callable(fingerprint):
        return None
    value = fingerprint()
    return None if value is None else str(value)


def backend_patterns(backend: Backend) -> Sequence[CompositeRule]:
    """The backend's composite rules; a backend without ``patterns()`` has none."""
    patterns = getattr(backend, "patterns", None)
    return tuple(patterns()) if callable(patterns) else ()


def check_backend(candidate: object, where: str = "") -> Backend:
    """``candidate`` if it implements the :class:`Backend` contract, else a :class:`BackendError`
    naming every missing or mistyped member.

    Example: ``check_backend(object())`` raises ``backend object lacks: name (a str),
    capabilities (a Capabilities), supports(), compile(), load()``.
    """
    problems = []
    name = getattr(candidate, "name", None)
    if not isinstance(name, str) or not name:
        problems.append("name (a str)")
    if not isinstance(getattr(candidate, "capabilities", None), Capabilities):
        problems.append("capabilities (a Capabilities)")
    for method in ("supports", "compile", "load"):
        if not callable(getattr(candidate, method, None)):
            problems.append(f"{method}()")
    if problems:
        what = where or (f"backend {name!r}" if isinstance(name, str) else f"backend {type(candidate).__name__}")
        raise BackendError(f"{what} lacks: {', '.join(problems)} (see codegraft/backend.py)")
    return candidate  # type: ignore[return-value]


def backend_version(backend: Backend) -> str:
    """A backend's version string (``version`` attribute), used to key caches."""
    return str(getattr(backend, "version", "0"))


__all__ = [
    "Backend",
    "CachingBackend",
    "Capabilities",
    "Capture",
    "Composite",
    "CompositeCheck",
    "CompositeRule",
    "Layout",
    "OpTime",
    "Partition",
    "Precision",
    "ProfilingRunnable",
    "Runnable",
    "Support",
    "backend_fingerprint",
    "backend_patterns",
    "backend_version",
    "check_backend",
]
