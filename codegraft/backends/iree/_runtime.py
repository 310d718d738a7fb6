"""Running a compiled ``iree`` partition with IREE's runtime (``iree-base-runtime`` alone).

NOTE: a module compiled for a device this machine lacks (the usual case when compiling for
``cuda`` on a CPU-only machine) still *loads* into an :class:`IreeRunnable`, whose ``run``
raises one clear line naming the device.  That keeps cross-compilation working: codegraft
loads every partition it compiles, and a host fallback there would put an onnxruntime
partition in an artifact that was asked for a GPU.  On the machine with the device the same
artifact runs.  Everything that can be checked without the device (format, IREE version,
CPU features of a host-CPU module) is checked at load.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from codegraft.backends.iree._blob import IreeBlob
from codegraft.backends.iree._target import IreeTarget, host_cpu_features, host_machine, simd_features
from codegraft.errors import BackendError

log = logging.getLogger("codegraft")
_LOCK = threading.Lock()
_INSTANCE: Any = None
_DEVICES: dict[str, Any] = {}


def runtime_version() -> str:
    """The installed IREE runtime's version, or a :class:`BackendError` when it is missing."""
    try:
        from iree.runtime.version import VERSION
    except ImportError as error:
        raise BackendError(f"iree-base-runtime is not installed ({error}): pip install 'codegraft[iree]'") from None
    return str(VERSION)


def device_for(target: IreeTarget) -> Any:
    """The runtime device for ``target``, created once per process; :class:`BackendError` if absent."""
    global _INSTANCE
    import iree.runtime as rt

    with _LOCK:
        if _INSTANCE is None:
            # The instance and devices live as long as the process, on purpose; nanobind would
            # list them and their types as leaks at exit (hundreds of lines on stderr after
            # `codegraft backends`).
            getattr(getattr(rt, "_binding", None), "disable_leak_checker", lambda: None)()
            _INSTANCE = rt.VmInstance()
        device = _DEVICES.get(target.driver)
        if device is None:
            try:
                driver = rt.get_driver(target.driver)
                if not driver.query_available_devices():
                    raise RuntimeError("the driver lists no device")
                device = driver.create_default_device()
            except (RuntimeError, ValueError) as error:
                raise BackendError(f"no {target.device} device here: {_first_line(str(error))}") from None
            _DEVICES[target.driver] = device
        return device


def device_unavailable_reason(target: IreeTarget) -> str | None:
    """Why ``target``'s device cannot run here, or ``None`` when it can."""
    try:
        device_for(target)
    except BackendError as error:
        return str(error)
    return None


class IreeRunnable:
    """A loaded IREE module; ``run`` is serialised per module (one VM context, not re-entrant)."""

    def __init__(self, blob: IreeBlob) -> None:
        self.blob = blob
        self.target = IreeTarget.parse(blob.target)
        _check_version(blob)
        _check_cpu(blob)
        self._lock = threading.Lock()
        self._invoke: Any = None
        self.unavailable = device_unavailable_reason(self.target)
        if self.unavailable is None:
            self._invoke = self._load()
        else:
            log.warning("IREE module for %s kept for another machine: %s", self.target, self.unavailable)

    def _load(self) -> Any:
        import iree.runtime as rt

        device = device_for(self.target)
        try:
            hal = rt.create_hal_module(_INSTANCE, device)
            module = rt.VmModule.copy_buffer(_INSTANCE, self.blob.module)
            context = rt.VmContext(_INSTANCE, modules=[hal, module])
            function = module.lookup_function(self.blob.function)
        except (RuntimeError, ValueError) as error:
            raise BackendError(f"IREE runtime cannot load the module: {_first_line(str(error))}") from None
        if function is None:
            raise BackendError(f"IREE module has no function {self.blob.function!r}")
        return rt.FunctionInvoker(context, device, function)

    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Take the partition inputs in order; return its outputs in order."""
        if self._invoke is None:
            raise BackendError(
                f"this partition was compiled for IREE {self.target} and cannot run here ({self.unavailable}); "
                "run the artifact on a machine with that device and iree-base-runtime installed"
            )
        arrays = [np.ascontiguousarray(a) for a in inputs]
        with self._lock:
            result = self._invoke(*arrays)
            results = result if isinstance(result, (tuple, list)) else (result,)
            outputs = [_to_host(r) for r in results]
        if len(outputs) != len(self.blob.output_names):
            raise BackendError(f"IREE module returned {len(outputs)} outputs, expected {len(self.blob.output_names)}")
        return outputs


def _to_host(value: Any) -> np.ndarray:
    host = value.to_host() if hasattr(value, "to_host") else value
    return np.array(host, copy=True) if not isinstance(host, np.ndarray) else host.copy()


def _check_version(blob: IreeBlob) -> None:
    installed = runtime_version()
    if _major_minor(installed) != _major_minor(blob.iree_version):
        raise BackendError(
            f"compiled by IREE {blob.iree_version}, this runtime is {installed}: "
            f"install iree-base-runtime=={blob.iree_version} or recompile"
        )


def _check_cpu(blob: IreeBlob) -> None:
    if not blob.cpu_features:
        return
    if blob.machine != host_machine():
        raise BackendError(f"compiled for the CPU of a {blob.machine} machine; this is {host_machine()}: recompile")
    missing = sorted(set(blob.cpu_features) - simd_features(host_cpu_features()))
    if missing:
        raise BackendError(f"compiled for a CPU with {', '.join(missing[:6])}, which this CPU lacks: recompile")


def _major_minor(version: str) -> tuple[str, ...]:
    return tuple(version.split(".")[:2])


def _first_line(message: str) -> str:
    """IREE's status text without its source location: ``c/...c:66: UNAVAILABLE; why`` -> ``why``."""
    lines = [ln.strip() for ln in message.splitlines() if ln.strip()]
    line = lines[0] if lines else message
    return _STATUS_PREFIX.sub("", line)[:300]


_STATUS_PREFIX = re.compile(r"^.*?\.(?:c|cc|cpp):\d+: [A-Z_]+; ")
