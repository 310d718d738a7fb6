"""The one-file artifact (``.cgx``): its format, written here for ``Executable.save``.

:mod:`codegraft.runtime.loader` reads it back (``load_executable``) with the decoding helpers here.

Layout (all integers little-endian)::

    magic        b"CODEGRAFT\\x00CGX\\n"              (14 bytes)
    version      u32                                 (1, or FORMAT_VERSION with a bound input)
    header_size  u64
    header       JSON, UTF-8: inputs, outputs, steps, constants, report, and for every
                 payload its offset, size and SHA-256
    payload      the partitions' blobs and the shared constants' raw bytes, each stored once
    digest       SHA-256 of everything above          (32 bytes)

NOTE: nothing is unpickled or evaluated.  Constants are raw little-endian C-order bytes with
their dtype and shape in the header.  A blob holding native code is flagged in the header and
its own hash is checked again right before the backend loads it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from codegraft._version import __version__
from codegraft.backend import Capture, Composite
from codegraft.core.names import CONTROL_BACKEND
from codegraft.errors import ArtifactError
from codegraft.frontend.zipmap import OutputMap
from codegraft.report.report import Report
from codegraft.runtime.artifact_schema import validate_header
from codegraft.runtime.signature import KeySource, sign_artifact
from codegraft.runtime.step import Step, TensorSpec

MAGIC = b"CODEGRAFT\x00CGX\n"
FORMAT_VERSION = 2
# Version 2 adds inputs bound to a value (``input_values``).  An artifact without one is still
# written as version 1, which every codegraft reads; one with one is version 2, which a
# codegraft that would ignore the binding (and run any value fed) refuses by its version.
READABLE_VERSIONS = (1, 2)
_PREFIX = struct.Struct("<IQ")
_DIGEST_SIZE = 32


@dataclass(frozen=True)
class _Payload:
    offset: int
    size: int
    sha256: str


class Stored(Protocol):
    """What the writer reads of an executable (:class:`~codegraft.runtime.executable.Executable`).

    NOTE: a protocol, not the class, so that the executable imports its writer without an
    import cycle.
    """

    @property
    def inputs(self) -> Sequence[TensorSpec]: ...
    @property
    def outputs(self) -> Sequence[str]: ...
    @property
    def steps(self) -> Sequence[Step]: ...
    @property
    def constants(self) -> Mapping[str, np.ndarray]: ...
    @property
    def output_maps(self) -> Mapping[str, OutputMap]: ...
    @property
    def host_threads(self) -> int: ...
    def report(self) -> Report: ...


class _PayloadWriter:
    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.size = 0

    def add(self, data: bytes) -> dict[str, Any]:
        entry = {"offset": self.size, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        self.chunks.append(data)
        self.size += len(data)
        return entry


def write_artifact(path: str | os.PathLike[str], exe: Stored, *, signing_key: KeySource | None = None) -> None:
    """Serialise ``exe`` to ``path`` (written to a temporary file, then renamed), signed with
    ``signing_key`` (an Ed25519 private key: PEM file or bytes) when given.

    Whatever stops the write (a missing folder, a directory in the way, a full disk) is an
    :class:`ArtifactError` naming the path; no temporary file is left behind.
    """
    where = artifact_path(path)
    data = artifact_bytes(exe)
    if signing_key is not None:
        data = sign_artifact(data, signing_key)
    write_file(where, data)


def artifact_path(path: object) -> str:
    """``path`` as a string; anything that is not a path is an :class:`ArtifactError`."""
    try:
        return os.fspath(path)  # type: ignore[call-overload]
    except TypeError:
        raise ArtifactError(f"an artifact path must be a str or os.PathLike, not {type(path).__name__}") from None


def write_file(where: str, data: bytes) -> None:
    """Write ``data`` to ``where`` through a temporary file; errors are :class:`ArtifactError`.

    Only a regular file (or nothing) is replaced: the rename that makes the write atomic would
    otherwise swap a device such as ``/dev/null`` for a file.
    """
    if os.path.isdir(where):
        raise ArtifactError(f"cannot write artifact {where}: it is a directory")
    if os.path.lexists(where) and not os.path.isfile(where):
        raise ArtifactError(f"cannot write artifact {where}: it is not a regular file (a device, pipe or socket)")
    tmp = f"{where}.tmp"
    try:
        with open(tmp, "wb") as handle:
            handle.write(data)
        os.replace(tmp, where)
    except OSError as error:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise ArtifactError(f"cannot write artifact {where}: {error.strerror or error}") from None


def artifact_bytes(exe: Stored) -> bytes:
    """The artifact of ``exe`` as bytes (also how control-flow bodies nest inside a blob)."""
    payload = _PayloadWriter()
    steps = []
    for step in exe.steps:
        steps.append(
            {
                "name": step.name,
                "backend": step.backend,
                "inputs": list(step.inputs),
                "outputs": list(step.outputs),
                "native_code": step.native_code,
                "precision": step.precision,
                "composites": [_composite_json(c) for c in step.composites],
                "blob": None if step.blob is None else payload.add(step.blob),
                "template": None if step.template is None else payload.add(step.template),
            }
        )
    constants = []
    for name, array in exe.constants.items():
        data = np.asarray(array, order="C")  # ascontiguousarray would make a scalar 1-d
        little = data.astype(data.dtype.newbyteorder("<"), copy=False)
        constants.append(
            {"name": name, "dtype": data.dtype.name, "shape": list(data.shape), **payload.add(little.tobytes())}
        )
    version = FORMAT_VERSION if any(s.bound is not None for s in exe.inputs) else 1
    header = {
        "format_version": version,
        "codegraft_version": __version__,
        "inputs": [{"name": s.name, "dtype": s.dtype, "shape": None if s.shape is None else list(s.shape),
                    **({} if s.bound is None else {"bound": s.bound.reshape(-1).tolist()})}
                   for s in exe.inputs],
        "outputs": list(exe.outputs),
        **({"output_maps": [m.to_json() for m in exe.output_maps.values()]} if exe.output_maps else {}),
        "steps": steps,
        "constants": constants,
        "native_code": any(step.native_code for step in exe.steps),
        **({"threads": exe.host_threads} if exe.host_threads else {}),
        "report": json.loads(exe.report().to_json()),
    }
    header_bytes = json.dumps(header).encode()
    body = b"".join([MAGIC, _PREFIX.pack(version, len(header_bytes)), header_bytes, *payload.chunks])
    return body + hashlib.sha256(body).digest()


def read_artifact_file(where: str) -> bytes:
    """The bytes of an artifact file; an unreadable one is an :class:`ArtifactError`."""
    if os.path.isdir(where):
        raise ArtifactError(f"cannot read artifact {where}: it is a directory")
    try:
        with open(where, "rb") as handle:
            return handle.read()
    except OSError as error:
        raise ArtifactError(f"cannot read artifact {where}: {error.strerror or error}") from None


def check_artifact(data: bytes, where: str) -> Mapping[str, Any]:
    """The validated header of an (unsigned) artifact, without loading anything it holds."""
    header, _ = parse(data, where)
    return header


def parse(data: bytes, where: str) -> tuple[Mapping[str, Any], memoryview]:
    minimum = len(MAGIC) + _PREFIX.size + _DIGEST_SIZE
    if not data.startswith(MAGIC):
        if len(data) < len(MAGIC) and MAGIC.startswith(data):
            raise ArtifactError(f"{where} is truncated ({len(data)} bytes)")
        raise ArtifactError(
            f"{where} is not a codegraft artifact (its first bytes are {bytes(data[:len(MAGIC)])!r}, "
            f"not {MAGIC!r})"
        )
    if len(data) < minimum:
        raise ArtifactError(f"{where} is truncated ({len(data)} bytes)")
    version, header_size = _PREFIX.unpack_from(data, len(MAGIC))
    if version not in READABLE_VERSIONS:
        raise ArtifactError(
            f"{where} has artifact format version {version}; this codegraft reads versions "
            f"{', '.join(map(str, READABLE_VERSIONS))}"
        )
    body, digest = data[:-_DIGEST_SIZE], data[-_DIGEST_SIZE:]
    header_start = len(MAGIC) + _PREFIX.size
    if header_start + header_size > len(body):
        raise ArtifactError(f"{where} is truncated: the header runs past the end of the file")
    if hashlib.sha256(body).digest() != digest:
        raise ArtifactError(f"{where} is corrupted or truncated: its SHA-256 does not match")
    try:
        header = json.loads(bytes(data[header_start : header_start + header_size]))
    except ValueError as error:
        raise ArtifactError(f"{where}: unreadable header: {error}") from None
    except RecursionError:
        raise ArtifactError(f"{where}: unreadable header: nested too deeply") from None
    payload = memoryview(body)[header_start + header_size :]
    validate_header(header, payload_size=len(payload), where=where, control_backend=CONTROL_BACKEND)
    return header, payload


def _bytes(entry: Mapping[str, Any], payload: memoryview, where: str, what: str) -> bytes:
    start, size = int(entry["offset"]), int(entry["size"])
    if start < 0 or start + size > len(payload):
        raise ArtifactError(f"{where}: {what} lies outside the file")
    data = bytes(payload[start : start + size])
    if hashlib.sha256(data).hexdigest() != entry["sha256"]:
        raise ArtifactError(f"{where}: {what} fails its SHA-256 check; refusing to load it")
    return data


def decode_step(entry: Mapping[str, Any], payload: memoryview, where: str) -> Step:
    name = entry["name"]
    blob = None if entry["blob"] is None else _bytes(entry["blob"], payload, where, f"blob of {name}")
    template = None if entry["template"] is None else _bytes(entry["template"], payload, where, f"model of {name}")
    return Step(
        name=name,
        backend=entry["backend"],
        inputs=tuple(entry["inputs"]),
        outputs=tuple(entry["outputs"]),
        blob=blob,
        template=template,
        native_code=bool(entry["native_code"]),
        composites=tuple(_composite_from_json(c) for c in entry["composites"]),
        precision=entry.get("precision", "float32"),
    )


def _composite_json(composite: Composite) -> dict[str, object]:
    return {
        "rule": composite.rule,
        "instance": composite.instance,
        "node_names": list(composite.node_names),
        "captures": [[c.name, c.kind, c.ref] for c in composite.captures],
    }


def _composite_from_json(entry: dict[str, Any]) -> Composite:
    # artifacts written before captures existed have none
    captures = tuple(
        Capture(str(n), "node" if k == "node" else "value", str(r)) for n, k, r in entry.get("captures", ())
    )
    return Composite(entry["rule"], entry["instance"], tuple(entry["node_names"]), captures)


def decode_constant(entry: Mapping[str, Any], payload: memoryview, where: str) -> np.ndarray:
    data = _bytes(entry, payload, where, f"constant {entry['name']}")
    dtype = np.dtype(entry["dtype"]).newbyteorder("<")
    return np.frombuffer(data, dtype=dtype).reshape(entry["shape"]).astype(dtype.newbyteorder("="), copy=False)
