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
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from typing import Protocol

from codegraft.backend import Backend, check_backend
from codegraft.errors import BackendError, BackendUnavailable

BackendFactory = Callable[..., Backend]  # () -> Backend, or (spec: str | None) -> Backend


class _CanBeUnavailable(Backend, Protocol):
    def unavailable_reason(self) -> str | None: ...


def _onnxruntime() -> Backend:
    from codegraft.backends.onnxruntime import OnnxRuntimeBackend

    return OnnxRuntimeBackend()


def _openvino() -> Backend:
    try:
        from codegraft.backends.openvino import OpenVINOBackend
    except ImportError as error:
        raise BackendUnavailable(f"openvino is not installed ({error}): pip install 'codegraft[openvino]'") from None
    return OpenVINOBackend()


def _c(spec: str | None = None) -> Backend:
    from codegraft.backends.c import CBackend

    return _available(CBackend.from_spec(spec) if spec else CBackend())


def _dnnl() -> Backend:
    from codegraft.backends.dnnl import DnnlBackend

    return _available(DnnlBackend())


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


def _factories() -> dict[str, tuple[str, Callable[..., object]]]:
    found: dict[str, tuple[str, Callable[..., object]]] = {
        name: ("built-in", factory) for name, factory in BUILTIN_BACKENDS.items()
    }
    for entry in metadata.entry_points(group=ENTRY_POINT_GROUP):
        origin = entry.dist.name if entry.dist is not None else entry.value
        found.setdefault(entry.name, (origin, _entry_point_factory(entry)))
    return found


def _entry_point_factory(entry: metadata.EntryPoint) -> Callable[[], object]:
    def factory() -> object:
        try:
            target = entry.load()
        except ImportError as error:
            raise BackendUnavailable(f"cannot import {entry.value}: {error}") from None
        return target()

    return factory


def get_backend(name: str) -> Backend:
    """Create the backend called ``name`` (``"base:options"`` passes options); a clear error if it cannot."""
    factories = _factories()
    base, _, spec = name.partition(":")
    if base not in factories:
        raise BackendError(f"unknown backend {base!r}; installed: {', '.join(sorted(factories))}")
    origin, factory = factories[base]
    if spec and not _takes_spec(factory):
        raise BackendError(f"backend {base!r} takes no options (got {name!r})")
    try:
        backend = factory(spec) if spec else factory()
    except BackendUnavailable as error:
        raise BackendUnavailable(f"backend {name!r} is unavailable: {error}") from None
    except Exception as error:
        raise BackendError(f"backend {name!r} ({origin}) failed to start: {type(error).__name__}: {error}") from None
    return check_backend(backend, f"backend {name!r} ({origin})")


def _takes_spec(factory: Callable[..., object]) -> bool:
    import inspect

    try:
        return "spec" in inspect.signature(factory).parameters
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
