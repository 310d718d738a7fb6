"""The ``iree`` backend: IREE, an MLIR compiler and runtime, for the CPU and (cross-compiled) GPUs.

A partition's ONNX goes through IREE's ONNX importer and ``iree-compile`` for one target;
the blob is the VM flatbuffer with what is needed to check it at load (target, IREE
version, CPU features).  IREE compiles dynamic dimensions, so partitions are not
specialised per shape.  Running needs only ``iree-base-runtime``; compiling needs
``iree-base-compiler`` too (``pip install 'codegraft[iree]'`` installs both).

Targets are spelled ``iree`` (this CPU), ``iree:cuda`` (``sm_80``), ``iree:cuda:sm_89``,
``iree:cpu:x86-64-v3`` (a portable CPU), in Python and on the command line alike.

Example::

    import codegraft as cg
    from codegraft.backends.iree import IreeBackend

    exe = cg.compile("model.onnx", targets=["iree"])                        # this CPU
    gpu = cg.compile("model.onnx", targets=[IreeBackend(device="cuda", arch="sm_80")])
    gpu.save("model.cgx")                   # runs where a CUDA GPU and iree-base-runtime are
"""

from __future__ import annotations

import onnx_ir as ir

from codegraft.backend import Capabilities, Partition, Support
from codegraft.backends.iree._blob import IreeBlob
from codegraft.backends.iree._runtime import IreeRunnable, device_unavailable_reason, runtime_version
from codegraft.backends.iree._support import supports
from codegraft.backends.iree._target import IreeTarget, host_cpu_features, host_machine, simd_features
from codegraft.errors import BackendError, BackendUnavailable

BASE_NAME = "iree"


class IreeBackend:
    """IREE for one target: ``device`` (``cpu``, ``cuda``, ``hip``, ``vulkan``) and ``arch``.

    ``extra_flags`` are passed to ``iree-compile`` as they are.
    """

    # float64 is left out: iree-compile demotes it to float32 by default, so a float64 value
    # would be computed in float32 and passed with the wrong element size (survey:
    # pytorch-operator add/broadcast cases fail at the call).  Strings and complex numbers
    # have no lowering.
    capabilities = Capabilities(dynamic_shapes=True, native_code=True, dtypes=frozenset({
        "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool",
    }))

    def __init__(self, device: str = "cpu", arch: str | None = None, *, extra_flags: tuple[str, ...] = ()) -> None:
        self.target = IreeTarget.parse(f"{device}:{arch}" if arch else device)
        self.extra_flags = tuple(extra_flags)
        self.name = BASE_NAME if str(self.target) == "cpu:host" else f"{BASE_NAME}:{self.target}"
        self.version = f"{runtime_version()}+{' '.join(self.extra_flags)}"

    @staticmethod
    def from_spec(spec: str) -> IreeBackend:
        """The backend named ``iree:<spec>`` (``cuda``, ``cuda:sm_89``, ``cpu:x86-64-v3``)."""
        target = IreeTarget.parse(spec)
        return IreeBackend(target.device, target.arch)

    def compiler_unavailable_reason(self) -> str | None:
        """Why this machine cannot compile for IREE, or ``None``."""
        try:
            import iree.compiler  # noqa: F401
        except ImportError as error:
            return f"iree-base-compiler is not installed ({error}): pip install 'codegraft[iree]'"
        return None

    def device_unavailable_reason(self) -> str | None:
        """Why this machine cannot run this target's modules, or ``None``."""
        return device_unavailable_reason(self.target)

    def availability_note(self) -> str:
        """What ``codegraft backends`` shows beside an available backend: compile-only or run-only."""
        compile_reason, device_reason = self.compiler_unavailable_reason(), self.device_unavailable_reason()
        if device_reason:
            return f"compile only (cross-compilation): {device_reason}"
        if compile_reason:
            return f"run only: {compile_reason}"
        return ""

    def supports(self, node: ir.Node) -> Support:
        """Yes, or why not, from the survey of IREE in ``support.json``."""
        reason = self.compiler_unavailable_reason()
        return Support.no(reason) if reason else supports(node)

    def compile(self, partition: Partition) -> bytes:
        """Import the partition's ONNX, compile it for the target, pack the blob."""
        from codegraft.backends.iree._compile import ENTRY_FUNCTION, compile_mlir, import_onnx

        reason = self.compiler_unavailable_reason()
        if reason:
            raise BackendError(reason)
        from iree.compiler.version import VERSION

        module = compile_mlir(import_onnx(ir.to_proto(partition.model)), self.target, self.extra_flags)
        features = simd_features(host_cpu_features()) if self.target.arch == "host" else frozenset()
        return IreeBlob(
            target=str(self.target),
            iree_version=str(VERSION),
            machine=host_machine(),
            cpu_features=tuple(sorted(features)),
            function=ENTRY_FUNCTION,
            input_names=tuple(partition.input_names),
            output_names=tuple(partition.output_names),
            module=module,
        ).encode()

    def load(self, blob: bytes) -> IreeRunnable:
        """Check the blob and load it on its target's device (see ``_runtime`` on absent devices)."""
        return IreeRunnable(IreeBlob.decode(blob))


def make_backend(spec: str | None = None) -> IreeBackend:
    """codegraft's factory: unavailable, with the reason, when neither compiling nor running is possible."""
    try:
        backend = IreeBackend.from_spec(spec or "cpu")
    except BackendError as error:
        if "not installed" in str(error):
            raise BackendUnavailable(str(error)) from None
        raise
    compile_reason = backend.compiler_unavailable_reason()
    device_reason = backend.device_unavailable_reason() if compile_reason else None
    if compile_reason and device_reason:
        raise BackendUnavailable(f"{device_reason} (and it cannot compile here: {compile_reason})")
    return backend


__all__ = ["IreeBackend", "IreeBlob", "IreeRunnable", "IreeTarget", "make_backend"]
