"""Compiled partitions cached on disk, in front of lowering: a recompile skips layout and
precision conversion and the backend's compile, and only loads what it compiled before.

NOTE on the key (learned from onnxruntime's EP context cache, TensorRT's engine cache and
torch inductor's FX graph cache, whose keys are the graph *and* everything that shapes the
code made from it): a SHA-256 over

- the partition's ONNX, weights included: its deterministic serialisation without the
  weights' bytes, then those bytes where they lie (the initializers' raw data, or the
  weights' arrays when the caller keeps them out of the model: a hit never copies them);
- the lowering request: partition name, composites, precision, the precision check's samples;
- the backend: its name, ``version`` and ``cache_fingerprint()`` (its options, the CPU and
  its features, its compiler's or library's version); a backend without that method, or
  returning ``None``, is never cached;
- codegraft's own lowering: a hash of codegraft's files (layout and precision passes run
  before the backend; C kernels kept as text) and the onnx, onnx-ir and numpy versions.

An entry holds the backend's blob and the lowering note the report shows, so the report of
a hit reads as the compile's.  Every read checks magic, format, key, length and digest;
anything off is a miss, logged, and the file removed; a blob that then fails to load is
removed and compiled again (:func:`codegraft.lower.lowering.compile_and_load`), and an
entry is written only after its blob loaded.  Writes are atomic (a temporary file renamed),
so parallel compiles race safely; after each write the least recently used entries go until
the folder is under its size limit.  Entries a cache object read or wrote stay in memory (up
to 512 MiB, least recently used first; the bytes are the executables' own, not a copy) and
serve again without a read or a hash while their file is unchanged (same inode, size,
modification and change times), so a recompile in the same process (a notebook, dynamo's
recompiles) costs no disk traffic.

Off with ``compile(..., cache=False)``, ``--no-cache`` or ``CODEGRAFT_COMPILE_CACHE=0``;
emptied with ``codegraft cache clear``.

Trust: like the C toolchain's library cache, the folder holds native code that gets loaded,
so whoever can write to it can run code as you; digests catch corruption, not tampering.
It is created private to its user (mode 700).

Example::

    cache = CompileCache(pathlib.Path("/tmp/parts"))
    key = cache.key(backend, proto, name="p0_c")
    if key and (hit := cache.get(key)):
        runnable = backend.load(hit.blob)
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pathlib
import struct
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, BinaryIO

import numpy as np
import onnx
import onnx_ir as ir

from codegraft.backend import Backend, Composite, backend_fingerprint, backend_version
from codegraft.core.cachedir import cache_folder

log = logging.getLogger("codegraft")

SWITCH_ENV = "CODEGRAFT_COMPILE_CACHE"  # 0/off/false/no: no compiled-partition cache
MAX_MB_ENV = "CODEGRAFT_COMPILE_CACHE_MAX_MB"
DEFAULT_MAX_BYTES = 2 << 30
DEFAULT_MEMORY_BYTES = 512 << 20  # entries kept in memory per cache object (shared with executables)
SUFFIX = ".cgpart"

_MAGIC = b"CGXPART\0"
_FORMAT = 1
_PREFIX = struct.Struct("<8sII")  # magic, format, header length
_OFF = {"0", "off", "false", "no"}


@dataclass(frozen=True)
class CachedPartition:
    """What a compile left: the backend's blob and the lowering note the report shows."""

    blob: bytes
    note: str = ""


@dataclass
class CacheStats:
    """Counts of one :class:`CompileCache` object since it was made."""

    hits: int = 0
    misses: int = 0
    stored: int = 0
    rejected: int = 0  # entries found corrupt or unloadable, removed


class CompileCache:
    """Compiled partitions under ``directory`` (default ``$CODEGRAFT_CACHE_DIR/compiled``).

    ``max_bytes``: the folder's size limit (default ``$CODEGRAFT_COMPILE_CACHE_MAX_MB``
    megabytes, else 2 GiB); least recently used entries go first.
    """

    def __init__(
        self,
        directory: pathlib.Path | None = None,
        *,
        max_bytes: int | None = None,
        memory_bytes: int = DEFAULT_MEMORY_BYTES,
    ) -> None:
        self.directory = directory if directory is not None else cache_folder("compiled")
        self.max_bytes = max_bytes if max_bytes is not None else _max_bytes_from_env()
        self.memory_bytes = memory_bytes
        self.stats = CacheStats()
        # key -> (the file's identity when its content was checked, the entry): a recompile in
        # this process skips reading and hashing a file that has not changed since
        self._memory: OrderedDict[str, tuple[tuple[int, ...], CachedPartition]] = OrderedDict()
        self._lock = threading.Lock()

    def key(
        self,
        backend: Backend,
        proto: onnx.ModelProto,
        *,
        name: str,
        composites: Sequence[Composite] = (),
        precision: str = "float32",
        samples: Sequence[Mapping[str, np.ndarray]] = (),
        weights: Sequence[tuple[str, ir.TensorProtocol]] = (),
    ) -> str | None:
        """The entry's key for this partition on ``backend``; ``None``: not cacheable.

        ``weights`` are initializers the caller left out of ``proto`` (name, tensor), hashed
        from their arrays: a hit then never serialises them.
        """
        try:
            fingerprint = backend_fingerprint(backend)
        except Exception as error:  # e.g. no compiler: the compile itself will say so
            log.debug("%s: no compiled-partition cache (%s: %s)", backend.name, type(error).__name__, error)
            return None
        if fingerprint is None:
            return None
        caps = backend.capabilities
        head = {
            "format": _FORMAT,
            "codegraft": _codegraft_source_hash(),
            "libraries": _library_versions(),
            "backend": backend.name,
            "version": backend_version(backend),
            "fingerprint": fingerprint,
            "layout": caps.layout,
            "precisions": sorted(caps.precisions),
            "precision_by_hint": caps.precision_by_hint,
            "name": name,
            "composites": [repr(c) for c in composites],
            "precision": precision,
        }
        digest = hashlib.sha256(json.dumps(head, sort_keys=True).encode())
        for sample in samples:
            for input_name in sorted(sample):
                array = np.ascontiguousarray(sample[input_name])
                digest.update(f"\0{input_name}:{array.dtype.str}:{array.shape}\0".encode())
                digest.update(array.reshape(-1).view(np.uint8).data)
        _digest_model(digest, proto)
        for weight_name, tensor in weights:
            _digest_tensor(digest, weight_name, tensor)
        return digest.hexdigest()

    def get(self, key: str) -> CachedPartition | None:
        """The entry under ``key`` if it is there and intact; a damaged one is removed.

        An entry this object read or wrote before, whose file is still the same (inode, size,
        modification and change times), comes from memory: no read, no hash.
        """
        path = self._path(key)
        try:
            remembered = self._recall(key, _identity(path))
        except OSError:
            self.stats.misses += 1
            return None
        if remembered is not None:
            _mark_used(path)
            self._remember(key, path, remembered)  # the file's identity after marking it
            self.stats.hits += 1
            return remembered
        try:
            with path.open("rb") as file:
                entry = _read(file, key)
        except OSError:
            self.stats.misses += 1
            return None
        except _Damaged as problem:
            log.warning("compiled-partition cache: %s %s; removed, compiling again", path, problem)
            self.stats.rejected += 1
            self.stats.misses += 1
            self.discard(key)
            return None
        _mark_used(path)
        self._remember(key, path, entry)
        self.stats.hits += 1
        return entry

    def put(self, key: str, entry: CachedPartition) -> None:
        """Store ``entry`` (atomically); a folder that cannot be written only costs a recompile."""
        data = _encode(key, entry)
        if len(data) > self.max_bytes:
            return
        try:
            self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd, temporary = tempfile.mkstemp(dir=self.directory, suffix=".tmp")
            with os.fdopen(fd, "wb") as file:
                file.write(data)
            _mark_used(pathlib.Path(temporary))
            os.replace(temporary, self._path(key))
        except OSError as error:
            log.debug("compiled-partition cache: not stored (%s)", error)
            return
        self.stats.stored += 1
        self._remember(key, self._path(key), entry)
        self._evict(keep=key)

    def discard(self, key: str) -> None:
        """Remove the entry under ``key`` (nothing if absent)."""
        with self._lock:
            self._memory.pop(key, None)
        try:
            self._path(key).unlink()
        except OSError:
            pass

    def forget(self) -> None:
        """Drop the entries kept in memory: the next :meth:`get` reads and checks the file, as a
        new process would."""
        with self._lock:
            self._memory.clear()

    def entries(self) -> list[pathlib.Path]:
        """The entries' files, least recently used first."""
        try:
            files = [p for p in self.directory.iterdir() if p.suffix == SUFFIX]
        except OSError:
            return []
        return sorted(files, key=_mtime)

    def _path(self, key: str) -> pathlib.Path:
        return self.directory / f"{key}{SUFFIX}"

    def _recall(self, key: str, identity: tuple[int, ...]) -> CachedPartition | None:
        with self._lock:
            remembered = self._memory.get(key)
            if remembered is None or remembered[0] != identity:
                return None
            self._memory.move_to_end(key)
            return remembered[1]

    def _remember(self, key: str, path: pathlib.Path, entry: CachedPartition) -> None:
        if len(entry.blob) > self.memory_bytes:
            return
        try:
            identity = _identity(path)
        except OSError:
            return
        with self._lock:
            self._memory[key] = (identity, entry)
            self._memory.move_to_end(key)
            total = sum(len(e.blob) for _, e in self._memory.values())
            while total > self.memory_bytes:
                _, (_, oldest) = self._memory.popitem(last=False)
                total -= len(oldest.blob)

    def _evict(self, keep: str) -> None:
        entries = self.entries()
        total = sum(_size(p) for p in entries)
        for path in entries:
            if total <= self.max_bytes:
                break
            if path.stem == keep:
                continue
            size = _size(path)
            try:
                path.unlink()
            except OSError:
                continue
            total -= size


def compile_cache(enabled: bool = True) -> CompileCache | None:
    """The cache a compile uses: ``None`` when ``enabled`` is false or ``$CODEGRAFT_COMPILE_CACHE``
    says off; one object per folder, so its :attr:`CompileCache.stats` add up over compiles."""
    if not enabled or os.environ.get(SWITCH_ENV, "").strip().lower() in _OFF:
        return None
    return _cache_for(cache_folder("compiled"), _max_bytes_from_env())


@lru_cache(maxsize=8)
def _cache_for(directory: pathlib.Path, max_bytes: int) -> CompileCache:
    return CompileCache(directory, max_bytes=max_bytes)


class _Damaged(Exception):
    """An entry that must not be used; the message says what is wrong with it."""


def _digest_model(digest: Any, proto: onnx.ModelProto) -> None:
    """Feed ``proto`` to ``digest`` as its deterministic serialisation would, without making
    that copy: the graph without its initializers, then each initializer's fields, then its
    raw bytes as they are (serialising a large model first costs more than hashing it)."""
    skeleton = onnx.ModelProto()
    for field, value in proto.ListFields():
        if field.name != "graph":
            _copy_field(skeleton, field, value)
    for field, value in proto.graph.ListFields():
        if field.name != "initializer":
            _copy_field(skeleton.graph, field, value)
    digest.update(b"\0model\0")
    digest.update(skeleton.SerializeToString(deterministic=True))
    for tensor in proto.graph.initializer:
        header = onnx.TensorProto()
        for field, value in tensor.ListFields():
            if field.name != "raw_data":
                _copy_field(header, field, value)
        fields = header.SerializeToString(deterministic=True)
        digest.update(b"\0tensor\0" + len(fields).to_bytes(8, "little") + fields)
        digest.update(len(tensor.raw_data).to_bytes(8, "little"))
        digest.update(tensor.raw_data)


def _digest_tensor(digest: Any, name: str, tensor: ir.TensorProtocol) -> None:
    """Feed one initializer to ``digest``: its name, type and shape, then its bytes in place."""
    digest.update(f"\0weight\0{name}\0{tensor.dtype}\0{tuple(tensor.shape)}\0".encode())
    try:
        data: Any = np.ascontiguousarray(tensor.numpy()).reshape(-1).view(np.uint8).data
    except (TypeError, ValueError):  # e.g. strings: no fixed-size view; hash what ONNX stores
        data = ir.serde.serialize_tensor(tensor).SerializeToString(deterministic=True)
    digest.update(len(data).to_bytes(8, "little"))
    digest.update(data)


def _copy_field(target: Any, field: Any, value: Any) -> None:
    repeated = getattr(field, "is_repeated", None)  # protobuf >= 5; ``label`` before
    if repeated if repeated is not None else field.label == field.LABEL_REPEATED:
        getattr(target, field.name).extend(value)
    elif field.type == field.TYPE_MESSAGE:
        getattr(target, field.name).CopyFrom(value)
    else:
        setattr(target, field.name, value)


def _encode(key: str, entry: CachedPartition) -> bytes:
    header = json.dumps({
        "key": key,
        "note": entry.note,
        "blob_bytes": len(entry.blob),
        "blob_sha256": hashlib.sha256(entry.blob).hexdigest(),
    }).encode()
    return b"".join([_PREFIX.pack(_MAGIC, _FORMAT, len(header)), header, entry.blob])


def _read(file: BinaryIO, key: str) -> CachedPartition:
    """The entry in ``file``, checked; the blob is read straight into its own bytes (no copy)."""
    prefix = file.read(_PREFIX.size)
    if len(prefix) < _PREFIX.size:
        raise _Damaged("is truncated (no header)")
    magic, version, head_bytes = _PREFIX.unpack(prefix)
    if magic != _MAGIC:
        raise _Damaged("is not a compiled-partition entry (bad magic)")
    if version != _FORMAT:
        raise _Damaged(f"has format {version}, this codegraft reads {_FORMAT}")
    try:
        header = json.loads(file.read(head_bytes).decode())
        stored_key, note = str(header["key"]), str(header["note"])
        blob_bytes, blob_sha256 = int(header["blob_bytes"]), str(header["blob_sha256"])
    except (ValueError, KeyError, TypeError) as error:
        raise _Damaged(f"has a corrupted header ({type(error).__name__})") from None
    if stored_key != key:
        raise _Damaged("holds another key")
    blob = file.read()
    if len(blob) != blob_bytes:
        raise _Damaged(f"is truncated or padded ({len(blob)} blob bytes, header says {blob_bytes})")
    if hashlib.sha256(blob).hexdigest() != blob_sha256:
        raise _Damaged("is corrupted (digest mismatch)")
    return CachedPartition(blob, note)


@lru_cache(maxsize=1)
def _codegraft_source_hash() -> str:
    """Changes whenever any of codegraft's files does: its Python (passes run inside lowering)
    and the C text backends compile (kernels kept in ``.c`` files), compiled files left out."""
    package = pathlib.Path(__file__).resolve().parent.parent
    digest = hashlib.sha256()
    files = (p for p in package.rglob("*") if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc")
    for path in sorted(files):
        digest.update(str(path.relative_to(package)).encode() + b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


@lru_cache(maxsize=1)
def _library_versions() -> str:
    return f"onnx {onnx.__version__}, onnx-ir {ir.__version__}, numpy {np.__version__}"


def _max_bytes_from_env() -> int:
    text = os.environ.get(MAX_MB_ENV, "").strip()
    try:
        return int(float(text) * (1 << 20)) if text else DEFAULT_MAX_BYTES
    except ValueError:
        log.warning("%s=%r is not a number of megabytes; using %d", MAX_MB_ENV, text, DEFAULT_MAX_BYTES >> 20)
        return DEFAULT_MAX_BYTES


def _identity(path: pathlib.Path) -> tuple[int, ...]:
    """What changes when the file is replaced or written (:class:`OSError` when it is gone)."""
    status = path.stat()
    return (status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns, status.st_ctime_ns)


def _mark_used(path: pathlib.Path) -> None:
    """Stamp the last use in the modification time, from the fine clock (the file system's own
    stamp can be a tick of several milliseconds, too coarse to order entries written together)."""
    now = time.time_ns()
    try:
        os.utime(path, ns=(now, now))
    except OSError:
        pass


def _mtime(path: pathlib.Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return 0


def _size(path: pathlib.Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


__all__ = [
    "CacheStats",
    "CachedPartition",
    "CompileCache",
    "DEFAULT_MAX_BYTES",
    "MAX_MB_ENV",
    "SWITCH_ENV",
    "compile_cache",
]
