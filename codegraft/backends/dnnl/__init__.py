"""The ``dnnl`` backend: each partition becomes C that calls oneDNN (Intel's DNNL).

The code generator of the "bring your own codegen" paper's worked example, on codegraft's
pattern language: fused groups are declared as patterns (``_support.py``), each partition
becomes C source that creates the oneDNN primitives once at load and runs them per call
(``_codegen.py``, ``prelude.c``), built with the system compiler and cached like the ``c``
backend's libraries (the same toolchain, blob and loader).  oneDNN comes from pip:
``pip install 'codegraft[dnnl]'`` (``onednn-cpu-gomp`` and ``onednn-devel-cpu-gomp``).

Example::

    from codegraft.backends.dnnl import DnnlBackend

    exe = codegraft.compile(model, targets=[DnnlBackend(num_threads=2)])
"""

from __future__ import annotations

import json
import pathlib
import platform

import onnx_ir as ir

from codegraft.backend import Capabilities, CompositeRule, Partition, Support
from codegraft.backends.c._blob import Blob
from codegraft.backends.c._toolchain import CompilerNotFoundError, Target, Toolchain, source_version
from codegraft.backends.dnnl._codegen import LoweringError, Program, generate
from codegraft.backends.dnnl._library import OneDNN, OneDNNNotFound, find_onednn
from codegraft.backends.dnnl._runtime import DnnlRunnable
from codegraft.backends.dnnl._support import rules, supports

# The glue needs no SIMD flags: oneDNN picks its kernels for the CPU at run time.
_PORTABLE = Target(frozenset(), (), 4)


class DnnlBackend:
    """oneDNN primitives for float32 partitions with static shapes (NCHW in, NCHW out).

    ``num_threads``: OpenMP threads per call (default: oneDNN's, all cores);
    ``compiler`` and ``cache_dir`` as for the ``c`` backend (libraries are cached by source
    hash under ``$CODEGRAFT_CACHE_DIR/c``).
    """

    name = "dnnl"
    version = source_version(pathlib.Path(__file__).parent, "*.py", "*.c")
    # dtypes=None: ``supports`` checks data inputs itself (Reshape's int64 shape is fine)
    capabilities = Capabilities(dynamic_shapes=False, dtypes=None, layout="NCHW", native_code=True)

    def __init__(
        self,
        *,
        num_threads: int | None = None,
        compiler: str | None = None,
        cache_dir: str | pathlib.Path | None = None,
    ) -> None:
        self.num_threads = num_threads
        self._onednn: OneDNN | None = None
        self._missing = ""
        try:
            self._onednn = find_onednn()
        except OneDNNNotFound as error:
            self._missing = str(error)
        link = self._onednn.link_flags() if self._onednn else ()
        self.toolchain = Toolchain(compiler, pathlib.Path(cache_dir) if cache_dir is not None else None, link)

    def unavailable_reason(self) -> str | None:
        """Why this backend cannot run here (oneDNN or a C compiler missing), or ``None``."""
        if self._onednn is None:
            return self._missing
        try:
            self.toolchain.resolved_compiler()
        except CompilerNotFoundError as error:
            return str(error)
        return None

    def supports(self, node: ir.Node) -> Support:
        """Yes, or ``"<op>: <reason>"``; decided from the node alone."""
        return supports(node)

    def patterns(self) -> list[CompositeRule]:
        """Conv + bias + residual sum + activation; Gemm/MatMul + bias + activation."""
        return rules()

    def cache_fingerprint(self) -> str | None:
        """What besides the partition shapes the blob, for codegraft's compiled-partition cache:
        oneDNN's version and place, the architecture and the compiler; ``None`` without oneDNN.
        (The source is generated from the partition alone; threads are set at load.)"""
        if self._onednn is None:
            return None
        onednn = f"{self._onednn.version} {self._onednn.library}"
        return json.dumps({"onednn": onednn, "arch": platform.machine(), "toolchain": self.toolchain.fingerprint()})

    def generate(self, partition: Partition) -> Program:
        """The C source and weights for a partition, without compiling it."""
        return generate(partition)

    def compile(self, partition: Partition) -> bytes:
        """Generate C, build it against oneDNN (or take it from the cache) and pack the blob."""
        program = generate(partition)
        library = self.toolchain.build(program.source, _PORTABLE)
        return Blob.built(program, library, _PORTABLE).encode()

    def load(self, blob: bytes) -> DnnlRunnable:
        """Create the primitives of a blob from :meth:`compile`."""
        if self._onednn is None:
            raise OneDNNNotFound(self._missing)
        return DnnlRunnable(Blob.decode(blob), self.toolchain, self._onednn, self.num_threads)


__all__ = ["DnnlBackend", "DnnlRunnable", "LoweringError", "Program"]
