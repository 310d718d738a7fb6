"""Which ONNX IR version codegraft writes: the newest the installed onnxruntime reads.

NOTE: onnx and onnxruntime are released apart, and a user often has an onnx that writes a newer
IR version than their onnxruntime reads (onnx 1.23 writes IR 14, onnxruntime 1.30 reads 13 at
most), so a model that uses nothing the new IR version added is refused for its version number
alone.  Going the other way matters too: a model written at IR 3 must list every initializer
as a graph input, which codegraft's import removes (shape inference then no longer sees their
types, and partitions cut from the graph fail to load).  So every model and partition is
written at the newest IR version that both the installed onnx and onnxruntime know, never
lower than what the graph needs (its opsets, local functions and element types).

Example::

    proto.ir_version = ir_version_for(proto)   # 13 with onnx 1.23 and onnxruntime 1.30
    model.ir_version = ir_version_for(model)   # an onnx_ir.Model too
"""

from __future__ import annotations

import functools
import re

import onnx
import onnx_ir as ir

from codegraft.core.attributes import attributes_of
from codegraft.core.graphinfo import subgraphs_of

# IR 4: initializers need not be graph inputs (codegraft removes them from the inputs).
_LEAST = 4
# IR 8: model-local functions.
_FUNCTIONS = 8
# The IR version that introduced each element type newer than IR 4.
_DTYPE_IR = {
    **dict.fromkeys(("FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2", "FLOAT8E5M2FNUZ"), 9),
    **dict.fromkeys(("UINT4", "INT4"), 10),
    "FLOAT4E2M1": 11,
    "FLOAT8E8M0": 12,
    **dict.fromkeys(("UINT2", "INT2"), 13),
    **dict.fromkeys(("FLOAT6E2M3", "FLOAT6E3M2"), 14),
}
_MAX_SUPPORTED = re.compile(r"max supported IR version:\s*(\d+)")


@functools.cache
def runtime_ir_version() -> int:
    """The newest IR version that the installed onnx writes and onnxruntime reads.

    onnxruntime does not expose it, so a one-node model is offered to it (once per process):
    its refusal names the version it reads, and a model it loads proves the version.
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 4
    version = int(onnx.IR_VERSION)
    while version > _LEAST:
        probe = _identity_model(version)
        try:
            ort.InferenceSession(probe.SerializeToString(), options, providers=["CPUExecutionProvider"])
            return version
        except Exception as error:  # noqa: BLE001 - onnxruntime raises its own exception types
            found = _MAX_SUPPORTED.search(str(error))
            version = min(int(found.group(1)), version - 1) if found else version - 1
    return _LEAST


def needed_ir_version(model: onnx.ModelProto | ir.Model) -> int:
    """The least IR version that can hold ``model``: its opsets, functions and element types."""
    if isinstance(model, ir.Model):
        opsets = dict(model.opset_imports)
        return _needed(opsets, bool(model.functions), _ir_element_types(model))
    opsets = {o.domain: o.version for o in model.opset_import}
    return _needed(opsets, bool(len(model.functions)), _element_types(model))


def ir_version_for(model: onnx.ModelProto | ir.Model) -> int:
    """The IR version to write ``model`` at: the newest the runtime reads, unless the graph needs more."""
    return max(runtime_ir_version(), needed_ir_version(model))


def readable_by_runtime(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model``, or a copy written at :func:`runtime_ir_version` when it declares a newer IR
    version than onnxruntime reads and needs nothing of it (what a reference run wants)."""
    newest = runtime_ir_version()
    if model.ir_version <= newest or needed_ir_version(model) > newest:
        return model
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    copy.ir_version = newest
    return copy


def _needed(opsets: dict[str, int], has_functions: bool, element_types: set[str]) -> int:
    ids = [onnx.helper.make_opsetid(domain, version) for domain, version in opsets.items()]
    needed = max(_LEAST, onnx.helper.find_min_ir_version_for(ids, ignore_unknown=True) if ids else _LEAST)
    if has_functions:
        needed = max(needed, _FUNCTIONS)
    return max(needed, *(_DTYPE_IR.get(name, _LEAST) for name in element_types))


def _ir_element_types(model: ir.Model) -> set[str]:
    graph = model.graph
    dtypes = {v.dtype for v in graph.initializers.values()}
    dtypes.update(v.dtype for v in graph.inputs)
    add = dtypes.add
    for node in graph:  # (a walk of its own for a body only: few nodes have one)
        for value in node.outputs:
            add(value.dtype)
        for subgraph in subgraphs_of(node) if attributes_of(node) else ():
            dtypes.update(v.dtype for inner in ir.traversal.RecursiveGraphIterator(subgraph) for v in inner.outputs)
    return {dtype.name for dtype in dtypes if dtype is not None}


def _element_types(model: onnx.ModelProto) -> set[str]:
    names: set[str] = set()
    graphs = [model.graph]
    while graphs:
        graph = graphs.pop()
        for tensor in graph.initializer:
            names.add(onnx.TensorProto.DataType.Name(tensor.data_type))
        for info in (*graph.input, *graph.output, *graph.value_info):
            if info.type.HasField("tensor_type"):
                names.add(onnx.TensorProto.DataType.Name(info.type.tensor_type.elem_type))
        for node in graph.node:
            for attribute in node.attribute:
                graphs.extend(attribute.g for _ in [0] if attribute.HasField("g"))
                graphs.extend(attribute.graphs)
    return names


def _identity_model(version: int) -> onnx.ModelProto:
    info = onnx.helper.make_tensor_value_info
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Identity", ["x"], ["y"])],
        "probe",
        [info("x", onnx.TensorProto.FLOAT, [1])],
        [info("y", onnx.TensorProto.FLOAT, [1])],
    )
    return onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 13)], ir_version=version)


__all__ = ["readable_by_runtime", "ir_version_for", "needed_ir_version", "runtime_ir_version"]
