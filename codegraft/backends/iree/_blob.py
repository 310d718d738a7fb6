"""The ``iree`` blob: a fixed header, a JSON description, the VM flatbuffer.  No pickle.

What is needed to check the flatbuffer before it is handed to the runtime is in the
description: the target it was compiled for (device and architecture), the IREE version
that compiled it (the runtime refuses modules of another bytecode version), and for a CPU
module the machine and CPU features it may use.
"""

from __future__ import annotations

import json
import struct
from dataclasses import asdict, dataclass

from codegraft.errors import BackendError

_MAGIC = b"CGIR"
_FORMAT_VERSION = 1
_HEADER = struct.Struct("<4sIQQ")  # magic, format version, description length, module length


@dataclass(frozen=True)
class IreeBlob:
    """One compiled partition.  ``cpu_features`` is empty unless compiled for this CPU."""

    target: str  # IreeTarget spelling, e.g. "cpu:host" or "cuda:sm_80"
    iree_version: str
    machine: str
    cpu_features: tuple[str, ...]
    function: str
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    module: bytes  # the VM flatbuffer (.vmfb)

    def encode(self) -> bytes:
        description = {k: v for k, v in asdict(self).items() if k != "module"}
        meta = json.dumps(description).encode()
        return _HEADER.pack(_MAGIC, _FORMAT_VERSION, len(meta), len(self.module)) + meta + self.module

    @staticmethod
    def decode(blob: bytes) -> IreeBlob:
        """Inverse of :meth:`encode`; a clear :class:`BackendError` on anything malformed."""
        if len(blob) < _HEADER.size:
            raise BackendError(f"iree blob truncated: {len(blob)} bytes, the header needs {_HEADER.size}")
        magic, version, n_meta, n_module = _HEADER.unpack_from(blob)
        if magic != _MAGIC:
            raise BackendError(f"not an iree blob (magic {magic!r}, expected {_MAGIC!r})")
        if version != _FORMAT_VERSION:
            raise BackendError(f"iree blob format {version}; this codegraft reads {_FORMAT_VERSION}")
        if len(blob) != _HEADER.size + n_meta + n_module:
            raise BackendError("iree blob truncated or padded: section lengths do not add up")
        try:
            raw = json.loads(blob[_HEADER.size : _HEADER.size + n_meta])
            return IreeBlob(
                target=str(raw["target"]),
                iree_version=str(raw["iree_version"]),
                machine=str(raw["machine"]),
                cpu_features=tuple(str(f) for f in raw["cpu_features"]),
                function=str(raw["function"]),
                input_names=tuple(str(n) for n in raw["input_names"]),
                output_names=tuple(str(n) for n in raw["output_names"]),
                module=bytes(blob[_HEADER.size + n_meta :]),
            )
        except (KeyError, TypeError, ValueError) as error:
            raise BackendError(f"iree blob: malformed description ({type(error).__name__}: {error})") from None
