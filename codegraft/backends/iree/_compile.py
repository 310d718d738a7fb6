"""A partition's ONNX through IREE's ONNX importer and ``iree-compile``, to a VM flatbuffer.

NOTE: IREE's ONNX lowering (torch-mlir's ``onnx`` -> ``torch`` patterns) is registered per
opset: most ops only from a recent opset on (``MaxPool`` from 12, for example), so an opset-9
model fails to compile with "failed to legalize operation 'torch.operator'".  The partition is
therefore upgraded to :data:`IMPORT_OPSET` with onnx's version converter first (kept as is
when the converter cannot).  The weights become constants inside the module: compiled in
once, never sent again on a call.
"""

from __future__ import annotations

import io
import re
import warnings

import onnx

from codegraft.backends.iree._target import IreeTarget
from codegraft.errors import BackendError

IMPORT_OPSET = 17
ENTRY_FUNCTION = "main"
# Flags for every target: IREE's own defaults otherwise.
_COMMON_FLAGS = ["--iree-input-type=onnx"]


def import_onnx(model: onnx.ModelProto) -> bytes:
    """MLIR bytecode of ``model`` as IREE's ONNX importer makes it (entry function ``main``)."""
    from iree.compiler import ir
    from iree.compiler.extras import onnx_importer

    model = _upgraded(model)
    model.graph.name = ENTRY_FUNCTION
    # Under IR version 3 the importer takes initializers for arguments, and IREE's lowerings
    # of BatchNormalization and ConvTranspose then fail (they want constant weights).  A
    # partition's graph inputs are exactly its inputs, so the newer reading is the right one.
    model.ir_version = max(model.ir_version, 8)
    try:
        model = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception:  # shape inference is a help to the importer, not a requirement
        pass
    context = ir.Context()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "node without a valid type proto": the compile reports it
            info = onnx_importer.ModelInfo(model)
            module = info.create_module(context=context).operation
            onnx_importer.NodeImporter.define_function(info.main_graph, module).import_all()
        module.verify()
    except Exception as error:
        raise BackendError(f"IREE's ONNX importer: {type(error).__name__}: {_first_error(str(error))}") from None
    buffer = io.BytesIO()
    module.write_bytecode(buffer)
    return buffer.getvalue()


def compile_mlir(mlir: bytes, target: IreeTarget, extra_flags: list[str] | tuple[str, ...] = ()) -> bytes:
    """``iree-compile`` for ``target``: the VM flatbuffer, or a one-line :class:`BackendError`."""
    import iree.compiler as compiler

    flags = _COMMON_FLAGS + target.compiler_flags() + list(extra_flags)
    try:
        return bytes(compiler.compile_str(mlir, extra_args=flags))
    except compiler.CompilerToolError as error:
        raise BackendError(f"iree-compile ({target}): {_first_error(str(error))}") from None


def _upgraded(model: onnx.ModelProto) -> onnx.ModelProto:
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), IMPORT_OPSET)
    if opset >= IMPORT_OPSET:
        return onnx.ModelProto.FromString(model.SerializeToString())
    try:
        converted = onnx.version_converter.convert_version(model, IMPORT_OPSET)
    except Exception:  # some old-opset models do not convert; the compile then says what fails
        return onnx.ModelProto.FromString(model.SerializeToString())
    _drop_stale_attributes(converted.graph)
    return converted


def _drop_stale_attributes(graph: onnx.GraphProto) -> None:
    """Remove attributes the target opset no longer defines (``is_test`` of BatchNormalization-6).

    onnx's version converter leaves them, and IREE's lowerings refuse a node carrying an
    attribute they do not know.
    """
    for node in graph.node:
        if node.domain not in ("", "ai.onnx"):
            continue
        try:
            known = onnx.defs.get_schema(node.op_type, IMPORT_OPSET).attributes
        except onnx.defs.SchemaError:
            continue
        kept = [a for a in node.attribute if a.name in known]
        if len(kept) != len(node.attribute):
            del node.attribute[:]
            node.attribute.extend(kept)


_LEGALIZE = re.compile(r"failed to legalize operation 'torch\.operator'.*?name = \"onnx\.(\w+)\"")


def _first_error(message: str) -> str:
    """The first ``error:`` line of a compiler diagnostic, shortened to what a person reads."""
    legalize = _LEGALIZE.search(message)
    if legalize:
        return f"no IREE lowering for ONNX {legalize.group(1)} (failed to legalize torch.operator)"
    for line in message.splitlines():
        if "error:" in line:
            text = line.split("error:", 1)[1].strip()
            return text[:300]
    diagnostics = message.split("Diagnostics:", 1)[-1]  # CompilerToolError: the tool's stderr follows
    lines = [ln.strip() for ln in diagnostics.splitlines() if ln.strip()]
    return lines[0][:300] if lines else "unknown error"
