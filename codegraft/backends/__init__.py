"""Finding backends: the built-ins, an explicit list, plus the ``codegraft.backends`` entry points.

NOTE: nothing registers itself on import.  A built-in is a factory in :data:`BUILTIN_BACKENDS`
that imports its module only when called, so a missing optional dependency (openvino, a C
compiler) makes that one backend unavailable, with the reason, and nothing else.  A vendor
ships a backend as its own package with an entry point::

    [project.entry-points."codegraft.backends"]
    mybackend = "my_package:make_backend"      # a class or a function returning a Backend

A name may carry options after a colon, ``"iree:cuda:sm_80"``: the part after the first colon
goes to the factory's ``spec`` argument (only factories that take one accept options), and
the backend's own ``name`` is that full spelling, so an artifact names exactly what it needs.

A thread count asked of a whole compile (``codegraft.compile(..., threads=4)``, ``codegraft
compile --threads 4``) goes to the factory's ``threads`` argument, where it has one (every
built-in that runs on the CPU does; a vendor's factory opts in by taking ``threads``), so one
knob sets every backend named by string, not only the host's onnxruntime.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from typing import Protocol

from codegraft.backend import Backend, check_backend
from codegraft.errors import BackendError, BackendUnavailable

# () -> Backend; optionally taking spec (str | None, the options after the colon) and threads
# (int, 0: the backend's default, every core)
BackendFactory = Callable[..., Backend]


class _CanBeUnavailable(Backend, Protocol):
    def unavailable_reason(self) -> str | None: ...


def _onnxruntime(threads: int = 0) -> Backend:
    from codegraft.backends.onnxruntime import OnnxRuntimeBackend

    return OnnxRuntimeBackend(threads=threads)


def _openvino(threads: int = 0) -> Backend:
    try:
        from codegraft.backends.openvino import OpenVINOBackend
    except ImportError as error:
        raise BackendUnavailable(f"openvino is not installed ({error}): pip install 'codegraft[openvino]'") from None
    return OpenVINOBackend(num_threads=threads or None)


def _c(spec: str | None = None, threads: int = 0) -> Backend:
    from codegraft.backends.c import CBackend

    backend = CBackend.from_spec(spec) if spec else CBackend()
    backend.num_threads = threads or None  # c:measure-threads measures up to these
    return _available(backend)


def _dnnl(threads: int = 0) -> Backend:
    from codegraft.backends.dnnl import DnnlBackend

    return _available(DnnlBackend(num_threads=threads or None))


def _available(backend: _CanBeUnavailable) -> Backend:
    """``backend``, or :class:`BackendUnavailable` with its ``unavailable_reason()``."""
    reason = backend.unavailable_reason()
    if reason is not None:
        raise BackendUnavailable(reason)
    return backend


def _iree(spec: str | None = None) -> Backend:
    try:
        from codegraft.backends.iree import make_backend
    except ImportError as error:
        raise BackendUnavailable(f"IREE is not installed ({error}): pip install 'codegraft[iree]'") from None
    return make_backend(spec)


BUILTIN_BACKENDS: dict[str, BackendFactory] = {
    "onnxruntime": _onnxruntime,
    "openvino": _openvino,
    "c": _c,
    "iree": _iree,
    "dnnl": _dnnl,
}
# Spellings with options that ``codegraft backends`` lists too, so users find them.
SHOWN_VARIANTS = ("iree:cuda", "c:measure-threads")
ENTRY_POINT_GROUP = "codegraft.backends"


@dataclass(frozen=True)
class BackendInfo:
    """One installed backend: where it comes from, and why it is unavailable if it is."""

    name: str
    origin: str  # "built-in" or the distribution providing the entry point
    available: bool
    reason: str = ""


def _factories() -> dict[str, tuple[str, Callable[[], Callable[..., object]]]]:
    """Each backend's origin and a loader of its factory (an entry point is imported only when used)."""
    found: dict[str, tuple[str, Callable[[], Callable[..., object]]]] = {
        name: ("built-in", _ready(factory)) for name, factory in BUILTIN_BACKENDS.items()
    }
    for entry in metadata.entry_points(group=ENTRY_POINT_GROUP):
        origin = entry.dist.name if entry.dist is not None else entry.value
        found.setdefault(entry.name, (origin, _entry_point_loader(entry)))
    return found


def _ready(factory: Callable[..., object]) -> Callable[[], Callable[..., object]]:
    return lambda: factory


def _entry_point_loader(entry: metadata.EntryPoint) -> Callable[[], Callable[..., object]]:
    def load() -> Callable[..., object]:
        try:
            target: Callable[..., object] = entry.load()
        except ImportError as error:
            raise BackendUnavailable(f"cannot import {entry.value}: {error}") from None
        return target

    return load


def get_backend(name: str, *, threads: int = 0) -> Backend:
    """Create the backend called ``name`` (``"base:options"`` passes options); a clear error if it cannot.

    ``threads``: the threads it may use, for a factory that takes ``threads`` (0: its default);
    a factory that does not is built as it is.

    >>> get_backend("onnxruntime", threads=2).threads
    2
    """
    factories = _factories()
    base, _, spec = name.partition(":")
    if base not in factories:
        raise BackendError(f"unknown backend {base!r}; installed: {', '.join(sorted(factories))}")
    origin, load = factories[base]
    try:
        factory = load()
    except BackendUnavailable as error:
        raise BackendUnavailable(f"backend {name!r} is unavailable: {error}") from None
    except Exception as error:
        raise BackendError(f"backend {name!r} ({origin}) failed to load: {type(error).__name__}: {error}") from None
    if spec and not _takes(factory, "spec"):
        raise BackendError(f"backend {base!r} takes no options (got {name!r})")
    arguments: dict[str, object] = {"spec": spec} if spec else {}
    if threads and _takes(factory, "threads"):
        arguments["threads"] = threads
    try:
        backend = factory(**arguments)
    except BackendUnavailable as error:
        raise BackendUnavailable(f"backend {name!r} is unavailable: {error}") from None
    except Exception as error:
        raise BackendError(f"backend {name!r} ({origin}) failed to start: {type(error).__name__}: {error}") from None
    return check_backend(backend, f"backend {name!r} ({origin})")


def _takes(factory: Callable[..., object], parameter: str) -> bool:
    import inspect

    try:
        return parameter in inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return False


def list_backends() -> list[BackendInfo]:
    """Every installed backend, available or not (with the reason), and the variants of :data:`SHOWN_VARIANTS`."""
    infos = []
    factories = _factories()
    names = sorted([*factories, *(v for v in SHOWN_VARIANTS if v.partition(":")[0] in factories)])
    for name in names:
        origin = factories[name.partition(":")[0]][0]
        try:
            backend = get_backend(name)
        except BackendError as error:
            infos.append(BackendInfo(name, origin, False, str(error)))
        else:
            note = getattr(backend, "availability_note", None)
            infos.append(BackendInfo(name, origin, True, note() if callable(note) else ""))
    return infos
