"""The C backend's blob: shared library + its C source + required CPU features + weights.

Layout (little-endian)::

    b"CGCBLOB\\0" | u32 format version | u32 header length | header (JSON, UTF-8)
    | C source (UTF-8) | shared library | weights (float32)

NOTE: no pickle: the header is JSON of plain numbers and strings, checked field by field.
The source travels with the library so a CPU lacking the library's features (or a
different OS or architecture) can rebuild it; the weights are kept out of the source so
that recompiling never depends on them and compiled libraries are shared between models
of the same structure.
"""

from __future__ import annotations

import hashlib
import json
import platform
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from codegraft.errors import CodegraftError

if TYPE_CHECKING:
    from codegraft.backends.c._toolchain import Target


class GeneratedProgram(Protocol):
    """What a code generator hands :meth:`Blob.built` (the c and dnnl backends' ``Program``)."""

    @property
    def source(self) -> str: ...
    @property
    def weights(self) -> np.ndarray: ...
    @property
    def input_shapes(self) -> tuple[tuple[int, ...], ...]: ...
    @property
    def output_shapes(self) -> tuple[tuple[int, ...], ...]: ...

MAGIC = b"CGCBLOB\0"
FORMAT_VERSION = 1
_PREFIX = struct.Struct("<8sII")


class BlobError(CodegraftError):
    """A C backend blob is truncated, corrupted or of another format version."""


@dataclass(frozen=True)
class Blob:
    """Everything needed to run (or rebuild) one compiled partition."""

    source: str
    library: bytes
    weights: np.ndarray
    features: frozenset[str]
    machine: str
    scratch_floats: int
    input_shapes: tuple[tuple[int, ...], ...]
    output_shapes: tuple[tuple[int, ...], ...]
    bool_outputs: tuple[int, ...] = ()
    exact_inputs: tuple[int, ...] = ()
    integer_outputs: tuple[tuple[int, str], ...] = ()  # (output, numpy dtype name)
    integer_checks: bool = False  # read cg_int_overflow after each call
    io_checks: bool = False  # read cg_io_checks after each call (older libraries: numpy checks)
    half_outputs: tuple[int, ...] = ()  # float16 outputs, computed in float32

    @staticmethod
    def built(program: GeneratedProgram, library: bytes, target: Target, scratch_floats: int = 0) -> Blob:
        """The blob of ``program`` compiled into ``library`` for ``target`` on this machine type."""
        return Blob(
            source=program.source,
            library=library,
            weights=program.weights,
            features=target.features,
            machine=platform.machine(),
            scratch_floats=scratch_floats,
            input_shapes=program.input_shapes,
            output_shapes=program.output_shapes,
            # the c backend's program says these; dnnl's computes float32 only
            bool_outputs=tuple(getattr(program, "bool_outputs", ())),
            exact_inputs=tuple(getattr(program, "exact_inputs", ())),
            integer_outputs=tuple(getattr(program, "integer_outputs", ())),
            integer_checks=bool(getattr(program, "integer_checks", False)),
            io_checks=bool(getattr(program, "io_checks", False)),
            half_outputs=tuple(getattr(program, "half_outputs", ())),
        )

    def encode(self) -> bytes:
        """The blob's bytes."""
        source = self.source.encode()
        # memoryviews, not bytes: the weights can be hundreds of megabytes; copy them once
        weights = np.ascontiguousarray(self.weights, dtype="<f4").reshape(-1).view(np.uint8).data
        digest = hashlib.sha256(source)
        digest.update(self.library)
        digest.update(weights)
        header = {
            "features": sorted(self.features),
            "machine": self.machine,
            "scratch_floats": self.scratch_floats,
            "input_shapes": [list(s) for s in self.input_shapes],
            "output_shapes": [list(s) for s in self.output_shapes],
            "bool_outputs": list(self.bool_outputs),
            "exact_inputs": list(self.exact_inputs),
            "integer_outputs": [[i, dtype] for i, dtype in self.integer_outputs],
            "integer_checks": self.integer_checks,
            "io_checks": self.io_checks,
            "half_outputs": list(self.half_outputs),
            "source_bytes": len(source),
            "library_bytes": len(self.library),
            "weight_bytes": weights.nbytes,
            "sha256": digest.hexdigest(),
        }
        head = json.dumps(header, sort_keys=True).encode()
        return b"".join([_PREFIX.pack(MAGIC, FORMAT_VERSION, len(head)), head, source, self.library, weights])

    @staticmethod
    def decode(data: bytes) -> Blob:
        """Parse and verify a blob; :class:`BlobError` names what is wrong."""
        if len(data) < _PREFIX.size:
            raise BlobError("C backend blob is truncated (no header)")
        magic, version, head_len = _PREFIX.unpack_from(data)
        if magic != MAGIC:
            raise BlobError("not a C backend blob (bad magic)")
        if version != FORMAT_VERSION:
            raise BlobError(f"C backend blob format version {version}, this codegraft reads {FORMAT_VERSION}")
        start = _PREFIX.size
        try:
            header = json.loads(data[start : start + head_len].decode())
            sizes = [int(header[k]) for k in ("source_bytes", "library_bytes", "weight_bytes")]
        except (ValueError, KeyError, TypeError) as error:
            raise BlobError(f"C backend blob header is corrupted: {error}") from None
        body = memoryview(data)[start + head_len :]
        if len(body) != sum(sizes):
            raise BlobError(f"C backend blob is truncated or padded: {len(body)} body bytes, expected {sum(sizes)}")
        if hashlib.sha256(body).hexdigest() != header.get("sha256"):
            raise BlobError("C backend blob is corrupted (hash mismatch)")
        source, library = body[: sizes[0]], body[sizes[0] : sizes[0] + sizes[1]]
        weights = np.frombuffer(body[sizes[0] + sizes[1] :], dtype="<f4")  # a view: no copy
        return Blob(
            source=bytes(source).decode(),
            library=bytes(library),
            weights=weights,
            features=frozenset(str(f) for f in header["features"]),
            machine=str(header["machine"]),
            scratch_floats=int(header["scratch_floats"]),
            input_shapes=tuple(tuple(int(d) for d in s) for s in header["input_shapes"]),
            output_shapes=tuple(tuple(int(d) for d in s) for s in header["output_shapes"]),
            bool_outputs=tuple(int(i) for i in header.get("bool_outputs", ())),
            exact_inputs=tuple(int(i) for i in header.get("exact_inputs", ())),
            integer_outputs=_integer_outputs(header.get("integer_outputs", ())),
            integer_checks=header.get("integer_checks", False) is True,
            io_checks=header.get("io_checks", False) is True,
            half_outputs=tuple(int(i) for i in header.get("half_outputs", ())),
        )


_INTEGER_DTYPES = frozenset({"int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"})


def _integer_outputs(listed: object) -> tuple[tuple[int, str], ...]:
    """The header's ``[[output, dtype], ...]``, each dtype one of numpy's integer names
    (never handed to numpy unchecked: a blob may come from anywhere)."""
    pairs = []
    for entry in listed if isinstance(listed, list) else ():
        if not (isinstance(entry, list) and len(entry) == 2 and entry[1] in _INTEGER_DTYPES):
            raise BlobError(f"C backend blob header is corrupted: integer output {entry!r}")
        pairs.append((int(entry[0]), str(entry[1])))
    return tuple(pairs)

