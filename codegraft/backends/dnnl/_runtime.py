"""Loading a compiled dnnl partition: build its primitives once, then run them per call.

NOTE: ``cg_init`` creates every oneDNN primitive and reorders the weights into the formats
oneDNN chose, once per load; ``cg_run`` only points the edge memories at the caller's
arrays and executes the steps.  Intermediate memories belong to the loaded partition, so
calls take turns (a lock); oneDNN runs each primitive on its OpenMP threads with the GIL
released by ctypes.  The library is the ``c`` backend's kind of blob and is rebuilt from its
source the same way when this machine cannot load it.
"""

from __future__ import annotations

import ctypes
import hashlib
import threading
import weakref
from collections.abc import Sequence

import numpy as np

from codegraft.backends.c._blob import Blob
from codegraft.backends.c._runtime import aligned_floats, checked_inputs, data_address, library_for_this_machine
from codegraft.backends.c._toolchain import Toolchain, store_library
from codegraft.backends.dnnl._library import OneDNN
from codegraft.errors import CodegraftError

_ERROR_BYTES = 1024


class DnnlRunnable:
    """A loaded partition: ``run`` takes the inputs in order and returns new output arrays."""

    def __init__(self, blob: Blob, toolchain: Toolchain, onednn: OneDNN, num_threads: int | None = None) -> None:
        onednn.load_globally()
        library = library_for_this_machine(blob, toolchain)
        path = store_library(toolchain.resolved_cache_dir(), hashlib.sha256(library).hexdigest(), library)
        self._lib = ctypes.CDLL(str(path))
        self._lib.cg_init.restype = ctypes.c_void_p
        self._lib.cg_init.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
        self._lib.cg_run.restype = ctypes.c_int
        self._lib.cg_run.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
        self._lib.cg_free.argtypes = [ctypes.c_void_p]
        self._threads = int(num_threads or 0)
        self._weights = aligned_floats(blob.weights.size, blob.weights)  # read by oneDNN until freed
        error = ctypes.create_string_buffer(_ERROR_BYTES)
        handle = self._lib.cg_init(self._weights.ctypes.data, self._threads, error, _ERROR_BYTES)
        if not handle:
            raise CodegraftError(f"oneDNN could not create the partition's primitives: {error.value.decode()}")
        self._handle = handle
        weakref.finalize(self, self._lib.cg_free, handle)
        self._inputs = blob.input_shapes
        self._outputs = blob.output_shapes
        self._lock = threading.Lock()

    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Run the partition; safe to call from several threads (calls take turns)."""
        arrays = checked_inputs(inputs, self._inputs, "dnnl partition")
        outputs = [np.empty(shape, np.float32) for shape in self._outputs]
        in_ptrs = (ctypes.c_void_p * max(len(arrays), 1))(*map(data_address, arrays))
        out_ptrs = (ctypes.c_void_p * max(len(outputs), 1))(*map(data_address, outputs))
        error = ctypes.create_string_buffer(_ERROR_BYTES)
        with self._lock:
            failed = self._lib.cg_run(self._handle, in_ptrs, out_ptrs, self._threads, error, _ERROR_BYTES)
        if failed:
            raise CodegraftError(f"oneDNN failed while running the partition: {error.value.decode()}")
        return outputs
