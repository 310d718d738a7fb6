"""Loading a ``.cgx`` artifact: signature checked, backends found by name, blobs loaded.

In: the artifact's bytes (format in :mod:`codegraft.runtime.artifact`) and, optionally,
backend instances and trusted keys.  Out: an :class:`~codegraft.runtime.executable.Executable`;
a partition compiled per shape gets its
:class:`~codegraft.lower.lowering.ShapeSpecialisingRunnable`, a control group its runner with
each body loaded from its nested artifact.  No recompiling, no pickle.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from codegraft.backend import Backend, Partition, Runnable
from codegraft.backends import get_backend
from codegraft.backends.onnxruntime import OnnxRuntimeBackend
from codegraft.core.names import CONTROL_BACKEND
from codegraft.core.options import check_at_least
from codegraft.errors import ArtifactError, BackendError
from codegraft.frontend.zipmap import OutputMap
from codegraft.lower.cache import compile_cache
from codegraft.lower.lowering import LoweringRequest, ShapeSpecialisingRunnable, load_runnable
from codegraft.report.report import Report
from codegraft.runtime.artifact import artifact_path, decode_constant, decode_step, parse, read_artifact_file
from codegraft.runtime.control_blob import load_control_blob
from codegraft.runtime.executable import Executable, HostFallback
from codegraft.runtime.loop_choice import LoopPlans
from codegraft.runtime.signature import (
    KeySource,
    load_public_keys,
    split_signature,
    trusted_keys_from_env,
    verify_artifact,
)
from codegraft.runtime.step import Step, TensorSpec


def load_executable(
    path: str | os.PathLike[str],
    *,
    backends: Sequence[Backend] = (),
    strict: bool = False,
    trusted_keys: Sequence[KeySource] | None = None,
    threads: int | None = None,
) -> Executable:
    """Load an artifact written by ``Executable.save``; no recompilation, no original model.

    Backends are found by name among the installed ones; pass ``backends=`` to supply
    instances (for example a vendor backend that is not installed as a package).

    ``threads`` (as onnxruntime's and OpenVINO's thread counts are set when a model is
    loaded): the host's intra-op threads and those of every backend found by name that takes a
    count (0: all cores); ``None``: the host as compiled (``compile(threads=...)``), the
    backends their defaults.  A ``c`` partition then uses at most that many of the threads it
    was compiled for (its kernels' splits are fixed at compile time).

    ``trusted_keys`` (Ed25519 public keys: PEM files or bytes; default: the files listed in
    ``$CODEGRAFT_TRUSTED_KEYS``): when there are any, the artifact must be signed by one of
    them, checked before anything in the file is parsed or loaded; an unsigned artifact, one
    signed by another key or one changed after signing raises :class:`SignatureError`.
    Without keys a signature is not checked (see the README's trust model).

    Example::

        exe = codegraft.load_executable("model.cgx", trusted_keys=["release.pub"])
    """
    where = artifact_path(path)
    data = read_artifact_file(where)
    keys = trusted_keys_from_env() if trusted_keys is None else load_public_keys(list(trusted_keys))
    if keys:
        data, _ = verify_artifact(data, trusted=keys, where=where)
    else:
        data, _ = split_signature(data)
    return executable_from_bytes(data, where=where, backends=backends, strict=strict, threads=threads)


def executable_from_bytes(
    data: bytes, *, where: str, backends: Sequence[Backend] = (), strict: bool = False, threads: int | None = None
) -> Executable:
    """Load an artifact from bytes; ``where`` names it in errors; ``threads`` as :func:`load_executable`'s."""
    if threads is not None:
        check_at_least("threads", threads, 0, note=" (0: all cores)")
    header, payload = parse(data, where)
    supplied = {b.name: b for b in backends}
    steps: list[Step] = []
    runnables: list[Runnable] = []
    try:
        # as compiled (compile(threads=T) holds after a reload) unless the loader says otherwise
        host_threads = header.get("threads", 0) if threads is None else threads
        host = OnnxRuntimeBackend(threads=host_threads, spin=len(header["steps"]) == 1)
        resolved: dict[str, Backend] = {host.name: host, **supplied}
        for entry in header["steps"]:
            step = decode_step(entry, payload, where)
            backend = _resolve(step.backend, resolved, where, threads or 0)
            steps.append(step)
            runnables.append(_runnable(step, backend, host, strict, resolved, where, threads))
        constants = {c["name"]: decode_constant(c, payload, where) for c in header["constants"]}
        inputs = [TensorSpec(i["name"], i["dtype"], None if i["shape"] is None else tuple(i["shape"]), _bound(i))
                  for i in header["inputs"]]
        report = Report.from_json(json.dumps(header["report"]))
        outputs = list(header["outputs"])
        output_maps = [OutputMap.from_json(entry) for entry in header.get("output_maps", [])]
    except (KeyError, TypeError, ValueError) as error:
        raise ArtifactError(f"{where}: malformed artifact header ({type(error).__name__}: {error})") from None
    # A partition kept as ONNX (compiled per shape at run time) can also move to the host if
    # its backend fails while running; one stored only as its backend's blob cannot.
    fallbacks = {s.name: _template_on_host(s, host) for s in steps if s.template is not None and s.backend != host.name}
    return Executable(inputs=inputs, outputs=outputs, steps=steps, runnables=runnables,
                      constants=constants, report=report, backends=resolved, host_fallbacks=fallbacks, strict=strict,
                      output_maps=output_maps, host_threads=host_threads)


def _template_on_host(step: Step, host: Backend) -> HostFallback:
    def build() -> tuple[Step, Runnable]:
        assert step.template is not None
        blob = host.compile(Partition(step.name, ir.from_proto(onnx.ModelProto.FromString(step.template))))
        return Step(step.name, host.name, step.inputs, step.outputs, blob), host.load(blob)

    return build


def _resolve(name: str, resolved: dict[str, Backend], where: str, threads: int) -> Backend | None:
    if name == CONTROL_BACKEND:
        return None  # codegraft's own runtime runs control flow
    if name not in resolved:
        resolved[name] = _backend(name, where, threads)
    return resolved[name]


def _backend(name: str, where: str, threads: int) -> Backend:
    try:
        return get_backend(name, threads=threads)
    except BackendError as error:
        raise ArtifactError(f"{where} needs backend {name!r}, which cannot be used here: {error}") from None


def _runnable(
    step: Step, backend: Backend | None, host: Backend, strict: bool, resolved: dict[str, Backend], where: str,
    threads: int | None,
) -> Runnable:
    if backend is None:
        assert step.blob is not None
        known = list(resolved.values())

        def load_plans(loop: str, model: bytes, inputs: tuple[str, ...], targets: tuple[str, ...]) -> LoopPlans:
            # The body's work is counted for those of its targets that are here: one that is not
            # (an OpenVINO that took nothing of the body) would not run any of it here anyway.
            return LoopPlans(loop, model, inputs, [b for b in map(_available, targets) if b is not None], host)

        def _available(name: str) -> Backend | None:
            try:
                return _resolve(name, resolved, where, threads or 0)
            except ArtifactError:
                return None

        return load_control_blob(
            step.blob,
            lambda data, name: executable_from_bytes(data, where=name, backends=known, strict=strict, threads=threads),
            load_plans,
        )
    if step.blob is None:
        assert step.template is not None
        request = LoweringRequest(step.name, step.composites, step.precision)
        # each new shape is compiled here, through the compiled-partition cache unless it is off
        return ShapeSpecialisingRunnable(backend, step.template, request, host, strict=strict, cache=compile_cache())
    try:
        return load_runnable(backend, step.blob, step.name)
    except BackendError as error:
        raise ArtifactError(str(error)) from None


__all__ = ["executable_from_bytes", "load_executable"]


def _bound(spec: dict[str, Any]) -> np.ndarray | None:
    """An input's bound value (``input_values``), in its dtype and shape; checked by the schema."""
    if "bound" not in spec:
        return None
    return np.array(spec["bound"], dtype=spec["dtype"]).reshape(tuple(spec["shape"]))
