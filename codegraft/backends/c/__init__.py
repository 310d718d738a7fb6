"""The ``c`` backend: a real code generator that turns a partition into C, then native code.

A partition goes in, C source comes out (one entry point, loops for the ops, fused
epilogues, channels-last convolutions on a register-blocked SIMD micro-kernel, a thread
pool across cores), the system C compiler turns it into a shared library, ctypes calls it.
See ``_codegen.py`` for the pipeline and ``ops/`` for the op table (each op's check, lowering,
layout rule and C emitter, by family).

Example::

    from codegraft.backends.c import CBackend

    backend = CBackend(num_threads=4)
    blob = backend.compile(partition)          # bytes: library + source + weights
    outputs = backend.load(blob).run(inputs)
"""

from __future__ import annotations

import dataclasses
import json
import logging
import pathlib
import platform

import onnx_ir as ir

from codegraft.backend import Capabilities, Partition, Support
from codegraft.backends.c._blob import Blob, BlobError
from codegraft.backends.c._codegen import Program, generate, host_machine
from codegraft.backends.c._runtime import CRunnable
from codegraft.backends.c._support import supports
from codegraft.backends.c._thread_measure import measure
from codegraft.backends.c._toolchain import (
    VNNI,
    CompilerNotFoundError,
    Target,
    Toolchain,
    cpu_features,
    host_target,
    source_version,
    usable_cpus,
)
from codegraft.backends.c.ops.qconv import qdq_conv_input, qdq_matmul
from codegraft.errors import BackendError, CodegraftError

log = logging.getLogger("codegraft")


_SPEC_OPTIONS = frozenset({"measure-threads", "all-qdq-units", "no-winograd"})  # c:<option>+<option>


class CBackend:
    """Generates, compiles and runs C for float32 partitions with static shapes (float16 ones
    computed in float32, integers as exact floats).

    ``compiler``: the C compiler (default: ``cc``/``gcc``/``clang`` on PATH);
    ``cache_dir``: where compiled libraries are cached (default
    ``$CODEGRAFT_CACHE_DIR/c`` or ``~/.cache/codegraft/c``); ``num_threads``:
    threads per call (default: every CPU this process may use); ``target``: the CPU to compile for (default:
    this one); ``measure_threads``: give each kernel the thread count measured fastest on
    this machine (1, 2, 4, ... up to ``num_threads``, one build per count, timed on random
    inputs: a compile takes a few builds longer) instead of the cost model's estimate; see
    ``_thread_measure.py``.  The artifact then carries this machine's counts.
    ``all_qdq_units``: take every static-quantization (QDQ) unit it can compute, also the Convs
    of uint8 activations (on 8-bit products, as QLinearConv computes them) and, without AVX-512
    VNNI, the MatMul and Gemm units (in float).  By default those stay with the host: its
    QLinearConv ran uint8 Convs 10-30% faster (c's 8-bit values are floats in memory: four times
    the bytes) and its QLinearMatMul the turn detector's MatMuls 2x faster than c's float GEMM.
    With VNNI a QDQ MatMul or Gemm of a constant weight runs on 8-bit products, as QLinearMatMul
    computes it (the turn detector whole on ``c``: 0.5-0.75x of onnxruntime's time), and is taken;
    Convs of int8 activations, which onnxruntime leaves partly in float (efficientword-net: 20
    of 53), ``c`` takes, 2-3x faster.
    ``winograd``: 3x3 stride-1 Convs run as Winograd F(2x2, 3x3) where it pays (2.25x fewer
    multiply-adds, results as close to onnxruntime's as the direct Conv's; ``ops/winograd.py``);
    ``False`` (``c:no-winograd``) keeps every Conv direct, for results summed in the direct
    order or an A/B of the two (``bench/winograd_layers.py``).
    """

    name = "c"
    # Changes whenever the code generator's source (Python or C text) does, so caches keyed by
    # backend version (measured placement's timings) never serve numbers of an older generator.
    version = source_version(pathlib.Path(__file__).parent, "**/*.py", "**/*.c")
    # dtypes=None: ``supports`` checks the dtype of *data* inputs itself, so a Reshape whose
    # shape input is an int64 constant is still taken (a declared {"float32"} would refuse it).
    # int8: it takes dynamically quantized layers (DynamicQuantizeLinear, MatMulInteger,
    # ConvInteger, ``ops/quantize.py``) and static (QDQ) units: QuantizeLinear, DequantizeLinear,
    # their Convs on 8-bit products where the target has VNNI (declined without: ``supports``).
    # call_overhead_us: a two-op partition, ~5 us a call (2-core VM), most of it numpy's
    capabilities = Capabilities(
        dynamic_shapes=False, dtypes=None, layout="NHWC", native_code=True, precisions=frozenset({"float32", "int8"}),
        call_overhead_us=5.0,
    )

    def __init__(
        self,
        *,
        compiler: str | None = None,
        cache_dir: str | pathlib.Path | None = None,
        num_threads: int | None = None,
        target: Target | None = None,
        measure_threads: bool = False,
        all_qdq_units: bool = False,
        winograd: bool = True,
    ) -> None:
        self.toolchain = Toolchain(compiler, pathlib.Path(cache_dir) if cache_dir is not None else None)
        self.num_threads = num_threads
        self.target = target
        self.measure_threads = measure_threads
        self.all_qdq_units = all_qdq_units
        self.winograd = winograd
        # the name an artifact records: loading it makes a backend like this one (codegraft.backends)
        self.name = "c:measure-threads" if measure_threads else "c"

    @staticmethod
    def from_spec(spec: str) -> CBackend:
        """The backend named ``c:<spec>``: options joined by ``+``, ``measure-threads`` (threads
        per kernel timed here) and ``all-qdq-units`` (every static-int8 unit it computes, see
        ``all_qdq_units``) and ``no-winograd`` (every Conv direct, see ``winograd``); from the shell
        ``-t c:all-qdq-units+measure-threads``.

        >>> CBackend.from_spec("measure-threads").measure_threads
        True
        >>> CBackend.from_spec("all-qdq-units").all_qdq_units
        True
        >>> CBackend.from_spec("no-winograd").winograd
        False
        """
        options = {part.strip() for part in spec.split("+")}
        unknown = sorted(options - _SPEC_OPTIONS)
        if unknown:
            raise BackendError(
                f"c: unknown option {unknown[0]!r}; the options are {', '.join(sorted(_SPEC_OPTIONS))}, joined by "
                "'+' (c:measure-threads, c:all-qdq-units+measure-threads)"
            )
        return CBackend(measure_threads="measure-threads" in options, all_qdq_units="all-qdq-units" in options,
                        winograd="no-winograd" not in options)

    def unavailable_reason(self) -> str | None:
        """Why this backend cannot compile here (no C compiler), or ``None`` when it can.

        For a backend factory that wants ``codegraft backends`` to show the reason::

            reason = backend.unavailable_reason()
            if reason:
                raise BackendUnavailable(reason)
        """
        try:
            self.toolchain.resolved_compiler()
        except CompilerNotFoundError as error:
            return str(error)
        return None

    def supports(self, node: ir.Node) -> Support:
        """Yes, or ``"<op>: <reason>"``; decided from the node alone."""
        verdict = supports(node)
        quantized = qdq_conv_input(node) if verdict else None
        vnni = VNNI in (self.target or host_target()).features
        if quantized is not None and not vnni:
            return Support.no(
                f"{node.op_type}: a QDQ Conv runs on 8-bit products only with AVX-512 VNNI; in float it is "
                "slower than onnxruntime's 8-bit kernels"
            )
        if quantized == ir.DataType.UINT8 and not self.all_qdq_units:
            return Support.no(
                f"{node.op_type}: a QDQ Conv of uint8 activations is left to onnxruntime's QLinearConv, "
                "10-30% faster than c's (all_qdq_units=True takes it)"
            )
        if verdict and not self.all_qdq_units and not vnni and qdq_matmul(node):
            return Support.no(
                f"{node.op_type}: a QDQ {node.op_type} is left to onnxruntime's QLinearMatMul: without AVX-512 VNNI "
                "c computes it in float, 2x slower (all_qdq_units=True takes it)"
            )
        if verdict and node.op_type == "QuantizeLinear" and not self.all_qdq_units and self._read_by_host_units(node):
            return Support.no(
                "QuantizeLinear: its 8-bit values are read only by QDQ units left to onnxruntime, where "
                "quantizing them crosses no partition boundary"
            )
        return verdict

    def _read_by_host_units(self, node: ir.Node) -> bool:
        """Whether every reader of a QuantizeLinear's output is a DequantizeLinear read only by
        nodes this backend declines (a model's input quantized for units left to the host: on
        ``c`` it was one more partition, smart_turn_v3_2 1.07-1.37x against 0.93-1.05x)."""
        readers = [use.node for use in node.outputs[0].uses()]
        if not readers or node.outputs[0].is_graph_output():
            return False
        units = []
        for reader in readers:
            if reader.op_type != "DequantizeLinear" or reader.outputs[0].is_graph_output():
                return False
            units += [use.node for use in reader.outputs[0].uses() if use.node.op_type not in ("Shape", "Size")]
        return bool(units) and not any(self.supports(unit) for unit in units)

    def cache_fingerprint(self) -> str:
        """What besides the partition shapes the blob, for codegraft's compiled-partition cache:
        the target CPU's features and flags, the threads, the cost model's view of this CPU,
        the architecture and the compiler (see :class:`codegraft.backend.CachingBackend`).

        NOTE: whatever :func:`generate` or :meth:`compile` reads besides the partition must be
        named here, or a recompile may be served a blob made for other settings.
        """
        target = self.target or host_target()
        return json.dumps({
            "target": [sorted(target.features), list(target.flags), target.vector_floats],
            "threads": self.num_threads or usable_cpus(),
            "measure_threads": self.measure_threads,
            "winograd": self.winograd,
            "machine": repr(host_machine(target)),
            "arch": platform.machine(),
            "toolchain": self.toolchain.fingerprint(),
        }, sort_keys=True)

    def generate(self, partition: Partition) -> Program:
        """The C source (and weights) for a partition, without compiling it."""
        return generate(partition.model, self.target or host_target(), self.num_threads, winograd=self.winograd)

    def compile(self, partition: Partition) -> bytes:
        """Generate C, build it (or take it from the cache) and pack the blob."""
        target = self.target or host_target()
        if self.measure_threads:
            missing = target.features - cpu_features()
            if missing:
                raise CodegraftError(
                    f"measure_threads times each build on this machine, which lacks {sorted(missing)} of the "
                    "target's CPU features: measure on a machine of the target's kind, or leave it off"
                )
            most = self.num_threads or usable_cpus()
            found = measure(partition.model, target, most, self.toolchain, winograd=self.winograd)
            log.info("c: %s: threads measured at %s for %d kernels; %s", partition.name,
                     "/".join(map(str, found.counts)), len(found.picked), found.summary())
            program = dataclasses.replace(found.kept, winograd=self.winograd).program(partition.model, target, most)
        else:
            program = generate(partition.model, target, self.num_threads, winograd=self.winograd)
        library = self.toolchain.build(program.source, target)
        return Blob.built(program, library, target, program.scratch_floats).encode()

    def load(self, blob: bytes) -> CRunnable:
        """Load a blob from :meth:`compile` (rebuilding it if this CPU cannot run it)."""
        return CRunnable(Blob.decode(blob), self.toolchain, self.num_threads)


__all__ = ["BlobError", "CBackend", "CRunnable", "CompilerNotFoundError", "Program", "Target"]
