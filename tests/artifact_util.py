"""Editing artifacts the way an attacker (or a fuzzer) would: change the header or a blob, then
recompute every hash so only the schema, the loader and a signature stand in the way."""

from __future__ import annotations

import hashlib
import json
import struct
from typing import Any

from codegraft.runtime.artifact import MAGIC
from codegraft.runtime.signature import split_signature

_PREFIX = struct.Struct("<IQ")


def split(data: bytes) -> tuple[dict[str, Any], bytes]:
    """(header, payload) of an artifact (a signature trailer is dropped)."""
    data, _ = split_signature(data)
    version, size = _PREFIX.unpack_from(data, len(MAGIC))
    start = len(MAGIC) + _PREFIX.size
    return json.loads(data[start : start + size]), data[start + size : -32]


def join(header: Any, payload: bytes, *, header_text: bytes | None = None) -> bytes:
    """An artifact of ``header`` (or raw ``header_text``) and ``payload``, its digest recomputed."""
    text = json.dumps(header).encode() if header_text is None else header_text
    body = MAGIC + _PREFIX.pack(1, len(text)) + text + payload
    return body + hashlib.sha256(body).digest()


def replace_blob(data: bytes, step: int, blob: bytes) -> bytes:
    """The artifact with step ``step``'s blob replaced by ``blob``, every hash recomputed."""
    header, payload = split(data)
    header["steps"][step]["blob"] = {"offset": len(payload), "size": len(blob),
                                     "sha256": hashlib.sha256(blob).hexdigest()}
    return join(header, payload + blob)
