"""Bringing a model in: a path, bytes, ``onnx.ModelProto``, ``onnx_ir.Model`` or a torch module.

Whatever comes in leaves as one normalised onnx-ir model: checked, shapes inferred, every
value named, constants lifted to initializers, initializers no longer doubling as graph inputs,
written at the IR version the installed onnxruntime reads (:mod:`codegraft.core.irversion`).
"""

from __future__ import annotations

import functools
import heapq
import json
import math
import mmap
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import onnx
import onnx_ir as ir
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from onnx_ir.passes import common as common_passes

from codegraft.core.gcpause import without_gc
from codegraft.core.graphinfo import is_flat
from codegraft.core.irversion import ir_version_for
from codegraft.errors import ModelError
from codegraft.frontend import aside
from codegraft.frontend.torch_export import export_module, is_torch_module
from codegraft.frontend.utf8 import all_text_is_utf8
from codegraft.frontend.zipmap import attach as attach_output_maps
from codegraft.frontend.zipmap import split_zipmaps

ModelSource = str | os.PathLike[str] | bytes | onnx.ModelProto | ir.Model | Any


@without_gc
def import_model(source: ModelSource, *, example_inputs: Sequence[Any] | None = None) -> ir.Model:
    """Read, check and normalise a model; see the module docstring for what is accepted.

    A large flat graph is checked and its shapes inferred on a second core while this one
    builds the IR (:mod:`codegraft.frontend.aside`); the result is the same.
    """
    proto = _to_proto(source, example_inputs)
    visible = [o.name for o in proto.graph.output]
    proto, output_maps = split_zipmaps(proto)  # (a sequence of maps: onnx-ir holds no map type)
    graphs = _graphs(proto.graph)
    proto = _layer_norm_as_opset_17(proto, graphs, _describe(source))
    graphs = _graphs(proto.graph)
    proto = _placeholder_dims_unknown(proto, graphs)
    where = _describe(source)
    try:
        model = _checked_ir(proto, where, flat=len(graphs) == 1)
    except ModelError as error:
        # ONNX wants nodes in an order that computes each value before its readers;
        # onnxruntime sorts a graph itself (PaddleOCR's table detector lists two the wrong way
        # round).  Sorting is tried only when the checker says so: a large graph's walk in
        # Python costs a second.
        ordered = _nodes_in_order(proto) if _UNSORTED in str(error) else proto
        if ordered is proto:
            raise
        model = _checked_ir(ordered, where, flat=len(graphs) == 1)
    _drop_repeated_outputs(model)
    attach_output_maps(model, output_maps, visible)
    # Initializers are no longer inputs, which IR 3 required; and an IR version newer than the
    # installed onnxruntime reads would make every partition unloadable (see core.irversion).
    model.ir_version = ir_version_for(model)
    return model


_UNSORTED = "must be topologically sorted"  # the onnx checker's words


def _checked_ir(proto: onnx.ModelProto, where: str, *, flat: bool) -> ir.Model:
    """The checked, inferred IR of ``proto`` (a flat graph checked on a second core)."""
    pending = None
    if flat and not len(proto.functions):  # (a body's inferred types stay in its node)
        pending = aside.start(proto, where, functools.partial(_inferred_types, where=where))
    try:
        if pending is None:
            proto = _checked_and_inferred(proto, where)
        return _read_ir(proto, where, pending)
    finally:
        if pending is not None:
            pending.cancel()  # (nothing to do once collected)


def _checked_and_inferred(proto: onnx.ModelProto, where: str) -> onnx.ModelProto:
    """:func:`check_model_proto`, then onnx's shape inference (a new proto).

    Shapes the file stores for intermediate values (``value_info``) are an exporter's notes:
    where one contradicts what inference finds (PaddleOCR's table detector stores ``[N]`` for a
    ``[N, 1]`` gather), onnxruntime warns and takes the inferred one, and so does codegraft:
    inference runs again without them, and without the graph outputs' declared shapes, which
    are such notes too (ocrspine's PP-OCRv5 classifier declares ``[]`` for an ``[N, 2]``).
    """
    check_model_proto(proto, where)
    try:
        return onnx.shape_inference.infer_shapes(proto, strict_mode=True)
    except Exception as error:  # onnx raises several internal error types here
        if proto.graph.value_info or any(o.type.tensor_type.HasField("shape") for o in proto.graph.output):
            without = onnx.ModelProto()
            without.CopyFrom(proto)
            del without.graph.value_info[:]
            for output in without.graph.output:  # a declared output shape is a note too (onnxruntime: lenient merge)
                output.type.tensor_type.ClearField("shape")
            try:
                return onnx.shape_inference.infer_shapes(without, strict_mode=True)
            except Exception:  # noqa: BLE001 - the first error says what is wrong with the model
                pass
        raise ModelError(f"{where}: shape inference failed: {one_line(error)}") from None


def _inferred_types(proto: onnx.ModelProto, where: str) -> bytes:
    """The checked and inferred graph's value types, as the child of :mod:`aside` sends them
    (grouped there, in the child, off the parent's path: it is still building the IR)."""
    return _value_types(_checked_and_inferred(proto, where).graph, names=True).to_bytes()


def _read_ir(proto: onnx.ModelProto, where: str, pending: aside.Pending | None) -> ir.Model:
    """The normalised IR of ``proto``: inferred already, or with its types from ``pending``.

    ``pending``'s verdict (the checker's) comes before any error met here, as it would had the
    check run first.  A child that has not answered long after the IR was built (stuck: see
    :meth:`aside.Pending.result`) is stopped and its work done here.
    """
    started = time.perf_counter()
    try:
        model = _from_proto(proto) if pending is None else _ir_without_value_types(proto)
    except Exception as error:
        if pending is not None:
            # a refusal from the checker or shape inference is the error to give
            if pending.result(timeout=_CHILD_GRACE_SECONDS) is None:
                _checked_and_inferred(proto, where)
        raise _unreadable(where, error) from None
    types: _ValueTypes | None = None
    if pending is not None:  # (its refusal is raised here, as it is)
        waited = _CHILD_GRACE_SECONDS + 10 * (time.perf_counter() - started)
        inferred = pending.result(timeout=waited)
        types = _ValueTypes.from_bytes(inferred if inferred is not None else _inferred_types(proto, where))
    try:
        if types is not None:
            _set_value_types(model, types)
        for pass_ in _normalising_passes(model, named=types is not None and types.named):
            pass_(model)
    except Exception as error:  # the checker passed, so this is a model onnx-ir cannot represent
        raise _unreadable(where, error) from None
    return model


# How long past ten times the parent's own part a child may take before it counts as stuck:
# the check and shape inference take less than the IR build on every model measured.
_CHILD_GRACE_SECONDS = 30.0


def _unreadable(where: str, error: BaseException) -> ModelError:
    """The error onnx-ir raised, by its first cause: onnx-ir wraps what went wrong in a
    ``SerdeError`` per level it passed ("Error calling _deserialize_graph with: <id>"), and
    only the innermost says what (``Map types are not supported yet``)."""
    while error.__cause__ is not None:
        error = error.__cause__
    return ModelError(f"{where} cannot be read into the IR: {type(error).__name__}: {one_line(error)}")


def _normalising_passes(model: ir.Model, *, named: bool = False) -> list[ir.passes.PassBase]:
    """onnx-ir's passes that name every value, lift constants and free initializers from the
    inputs, less those a scan of a flat model proves have nothing to do (each walks the whole
    graph: a third of a second each on a 100k-node model).  ``named``: the names are known
    complete already (:func:`_proto_names_complete`, in the child of :mod:`aside`)."""
    flat = is_flat(model)
    graph = model.graph
    passes: list[ir.passes.PassBase] = []
    if not (flat and (named or _names_complete(graph))):
        passes.append(common_passes.NameFixPass())
    if not (flat and not any(node.op_type == "Constant" for node in graph)):
        passes.append(common_passes.LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0))
    if not (flat and all(graph.initializers.get(value.name or "") is not value for value in graph.inputs)):
        passes.append(common_passes.RemoveInitializersFromInputsPass())
    return passes


def _names_complete(graph: ir.Graph) -> bool:
    """Every node and value of a flat ``graph`` has a name no other node or value has (what
    onnx-ir's NameFixPass makes sure of); values are its inputs, initializers and node outputs,
    which hold every value a node reads (the checker saw to that) or the graph returns."""
    node_names = [node.name for node in graph]
    if not all(node_names) or len(set(node_names)) != len(node_names):
        return False
    values = dict.fromkeys(graph.inputs)
    values.update(dict.fromkeys(graph.initializers.values()))
    values.update(dict.fromkeys(v for node in graph for v in node.outputs))
    # (every value a node reads is one of these: the onnx checker, run before, refuses a
    # node reading a value no earlier node, input or initializer defines)
    if not all(v in values for v in graph.outputs):
        return False
    value_names = [v.name for v in values]
    return all(value_names) and len(set(value_names)) == len(value_names)


def _proto_names_complete(graph: onnx.GraphProto) -> bool:
    """What :func:`_names_complete` says of the IR of a flat ``graph`` (and of no other), read
    from the proto: True only where it would be True.  Node names, and the names of the
    inputs, initializers and node outputs (an initializer of an input's name is that input's
    value), are all given and unique; every output names one of them."""
    node_names = [node.name for node in graph.node]
    if not all(node_names) or len(set(node_names)) != len(node_names):
        return False
    produced = [name for node in graph.node for name in node.output]
    inputs = [info.name for info in graph.input]
    initializers = [tensor.name for tensor in graph.initializer]
    given = set(inputs) | set(initializers)
    if len(set(inputs)) != len(inputs) or len(set(initializers)) != len(initializers) or "" in given:
        return False
    if not all(produced) or len(set(produced)) != len(produced) or not given.isdisjoint(produced):
        return False
    given.update(produced)
    return all(info.name in given for info in graph.output)


def _from_proto(proto: onnx.ModelProto) -> ir.Model:
    """``ir.from_proto(proto)``, with the graph's inferred value types read once per distinct type.

    NOTE: after shape inference the graph holds one ValueInfoProto per value, and onnx-ir
    deserialises each one in Python (a type, a shape, its dimensions: two fifths of
    ``from_proto`` on a 100k-node model), although an exported model has few distinct value
    types.  Here the graph's value infos are taken out of the proto before ``from_proto`` and
    set after (:class:`_ValueTypes`), the plain ones once per distinct type.  ``proto`` is
    consumed: it is the copy shape inference returned.
    """
    graph = proto.graph
    if not len(graph.value_info) or (len(proto.functions) and proto.ir_version < 10):
        # (before IR 10, function values' types are stored in the graph's value_info)
        return ir.from_proto(proto)
    types = _value_types(graph, names=False)
    model = _ir_without_value_types(proto, keep=False)
    _set_value_types(model, types)
    return model


def _ir_without_value_types(proto: onnx.ModelProto, *, keep: bool = True) -> ir.Model:
    """``ir.from_proto(proto)`` with the graph's value infos left out (put back after with
    ``keep``: ``proto`` may be the caller's); the types come from :func:`_set_value_types`."""
    graph = proto.graph
    entries = list(graph.value_info) if keep else []
    graph.ClearField("value_info")
    try:
        return ir.from_proto(proto)
    finally:
        graph.value_info.extend(entries)


@dataclass
class _ValueTypes:
    """A graph's value infos, ready to set on its IR (:func:`_set_value_types`).

    ``groups``: the plain ones (a tensor type with a shape and nothing else: no doc string,
    metadata or denotation), the last of each name as onnx-ir keeps, as (type bytes, names);
    each type is deserialised once and its frozen ``Shape`` and ``TensorType`` shared between
    its values (frozen shapes are never changed in place; passes assign new ones).  ``rest``:
    the graph's inputs, outputs and other value infos.  ``named``: every name is known
    complete (:func:`_proto_names_complete`; False when not asked).
    """

    groups: list[tuple[bytes, list[str]]]
    rest: onnx.GraphProto
    named: bool = False

    def to_bytes(self) -> bytes:
        """A byte for ``named``; the groups as JSON after its length (type bytes as latin-1
        text); ``rest`` serialised."""
        header = json.dumps([[key.decode("latin-1"), names] for key, names in self.groups]).encode()
        return (b"\x01" if self.named else b"\x00") + len(header).to_bytes(8, "little") + header + \
            self.rest.SerializeToString()

    @staticmethod
    def from_bytes(payload: bytes) -> _ValueTypes:
        size = int.from_bytes(payload[1:9], "little")
        groups = [(key.encode("latin-1"), names) for key, names in json.loads(payload[9:9 + size])]
        return _ValueTypes(groups, onnx.GraphProto.FromString(payload[9 + size:]), payload[:1] == b"\x01")


def _value_types(graph: onnx.GraphProto, *, names: bool) -> _ValueTypes:
    """``graph``'s value infos as :class:`_ValueTypes` (``names``: also check the names)."""
    entries = {info.name: info for info in graph.value_info}
    groups: dict[bytes, list[str]] = {}
    plain_type: dict[bytes, bool] = {}
    rest = onnx.GraphProto()
    rest.input.extend(graph.input)
    rest.output.extend(graph.output)
    for name, info in entries.items():
        key = info.type.SerializeToString(deterministic=True)
        plain = plain_type.get(key)
        if plain is None:
            plain = plain_type[key] = _plain_tensor_type(info.type)
        if plain and not info.doc_string and not len(info.metadata_props):
            groups.setdefault(key, []).append(name)
        else:
            rest.value_info.append(info)
    return _ValueTypes(list(groups.items()), rest, names and _proto_names_complete(graph))


def _set_value_types(model: ir.Model, types: _ValueTypes) -> None:
    """Give ``model``'s values ``types`` as ``ir.from_proto`` of the proto they came from would
    have: input infos on the inputs; the value info of each node output and each initializer
    that is not an input; the output infos last (an entry naming no such value of the graph,
    a value inside a body say, onnx-ir would not apply either)."""
    graph, rest = model.graph, types.rest
    inputs = {value.name: value for value in graph.inputs}
    for info in rest.input:
        if info.name in inputs:
            ir.serde.deserialize_value_info_proto(info, inputs[info.name])
    typed = {value.name: value for node in graph for value in node.outputs}
    typed.update((value.name, value) for value in graph.initializers.values() if not value.is_graph_input())
    typed.pop("", None)  # (an omitted optional output: onnx-ir gives it no value info)
    for key, names in types.groups:
        type_proto = onnx.TypeProto.FromString(key)
        shape = ir.serde.deserialize_type_proto_for_shape(type_proto)
        type_ = ir.serde.deserialize_type_proto_for_type(type_proto)
        for name in names:
            value = typed.get(name)
            if value is not None:
                value.shape, value.type = shape, type_
    for info in rest.value_info:
        if info.name in typed:
            ir.serde.deserialize_value_info_proto(info, typed[info.name])
    outputs: dict[str, list[ir.Value]] = {}
    for value in graph.outputs:
        outputs.setdefault(value.name or "", []).append(value)
    for info in rest.output:
        for value in outputs.get(info.name, ()):
            ir.serde.deserialize_value_info_proto(info, value)


def _plain_tensor_type(type_proto: onnx.TypeProto) -> bool:
    """A tensor type with a shape, and no denotation."""
    if type_proto.denotation or type_proto.WhichOneof("value") != "tensor_type":
        return False
    tensor_type = type_proto.tensor_type
    if not tensor_type.elem_type or not tensor_type.HasField("shape"):
        return False
    return not any(dim.denotation for dim in tensor_type.shape.dim)


def check_model_proto(proto: onnx.ModelProto, where: str) -> None:
    """Refuse, naming the problem, what the onnx checker lets through but nothing can run.

    Invalid UTF-8 in any text (the protobuf runtime hands it over as bytes), a tensor whose
    data does not fill its declared shape (onnx-ir fails on it deep in a pass), an opset newer
    than the installed onnx knows (``opset 99``), a graph without outputs (onnxruntime refuses
    it too), and then everything the onnx checker refuses, on one line, node name kept.
    """
    # protobuf's C parser checks the text (utf8.py); the walk in Python checks the tensors and,
    # when the parser found text that is not UTF-8, says where it is.
    _check_text(proto, "model", where, text=all_text_is_utf8(proto) is not True)
    known = onnx.defs.onnx_opset_version()
    for opset in proto.opset_import:
        if opset.domain in ("", "ai.onnx") and not 1 <= opset.version <= known:
            raise ModelError(
                f"{where} imports opset {opset.version} of the default domain; this onnx knows opsets 1 to {known}"
            )
    if not proto.graph.output:
        raise ModelError(f"{where}: the graph has no outputs (nothing to compute)")
    external = next((t for t in proto.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL), None)
    if external is not None:
        location = next((e.value for e in external.external_data if e.key == "location"), "?")
        raise ModelError(
            f"{where}: initializer {external.name!r} keeps its data in the file {location!r}, which a model "
            "passed without its path cannot be located from: pass the model's path (codegraft reads that file "
            "from the model's folder), or onnx.load(path) it with its external data"
        )
    # The checker wants a shape on every graph input and output; onnxruntime reads one without
    # as "rank unknown" (a body's outer value made by a nested If, say), and so do we: those
    # get an empty shape for the checker's eyes only, taken off again after.
    unranked = [
        info.type.tensor_type
        for info in (*proto.graph.input, *proto.graph.output)
        if info.type.HasField("tensor_type") and not info.type.tensor_type.HasField("shape")
    ]
    for tensor_type in unranked:
        tensor_type.shape.SetInParent()
    try:
        onnx.checker.check_model(proto)
    except Exception as error:  # ValidationError, and whatever the C++ checker lets escape
        raise ModelError(f"{where} is not a valid ONNX model: {one_line(error)}") from None
    finally:
        for tensor_type in unranked:
            tensor_type.ClearField("shape")


_TEXT = FieldDescriptor.TYPE_STRING
_MESSAGE = FieldDescriptor.TYPE_MESSAGE
_TENSOR_TEXT = ("name", "doc_string", "external_data", "metadata_props")


_TENSOR_TEXT_FIELDS = tuple(onnx.TensorProto.DESCRIPTOR.fields_by_name[name] for name in _TENSOR_TEXT)


# Where a message sits: the root's name, or (parent, field name, index or None).  Spelled
# out (``model.graph.node[3].name``) only for an error: the check visits every node.
_Path = str | tuple[object, str, int | None]


def _spell(path: _Path) -> str:
    if isinstance(path, str):
        return path
    parent, name, index = path
    return f"{_spell(parent)}.{name}" + ("" if index is None else f"[{index}]")  # type: ignore[arg-type]


def _check_text(message: Message, path: _Path, where: str, *, text: bool = True) -> None:
    """Every string field decodes as UTF-8 (checked per field; tensor payloads are not visited)
    and every tensor's data fills its shape; with ``text=False`` only the tensors are checked,
    and only messages that can hold one are visited."""
    if type(message) is onnx.TensorProto:  # not ListFields: it would copy the weights
        problem = _tensor_size_problem(message)
        if problem:
            raise ModelError(f"{where}: tensor {message.name!r} ({_spell(path)}) {problem}")
        fields = [(field, getattr(message, field.name)) for field in _TENSOR_TEXT_FIELDS] if text else []
    elif not text and type(message) is onnx.NodeProto:
        # Most nodes hold numbers in their attributes: visit only those holding a message.
        # (An attribute whose ``type`` hides a message field it also carries is refused by the
        # onnx checker, which runs next: "type field and data field mismatch".)
        for index, attribute in enumerate(message.attribute):
            if attribute.type not in _PLAIN_ATTRIBUTE_TYPES:
                _check_text(attribute, (path, "attribute", index), where, text=False)
        return
    else:
        fields = message.ListFields()
    for field, value in fields:
        if field.type == _TEXT:
            if not text:
                continue
            if field.is_repeated:
                try:
                    "".join(value)  # raises on an item that is bytes (not UTF-8)
                    continue
                except TypeError:
                    pass
            items = value if field.is_repeated else (value,)
            for index, item in enumerate(items):
                if not isinstance(item, str):
                    here = _spell((path, field.name, index if field.is_repeated else None))
                    raise ModelError(f"{where}: {here} is not valid UTF-8 text ({bytes(item)[:40]!r})")
        elif field.type == _MESSAGE and (text or field.message_type in _HOLDS_TENSORS):
            if field.is_repeated:
                for index, item in enumerate(value):
                    _check_text(item, (path, field.name, index), where, text=text)
            else:
                _check_text(value, (path, field.name, None), where, text=text)


_PLAIN_ATTRIBUTE_TYPES = frozenset(
    getattr(onnx.AttributeProto, name) for name in ("FLOAT", "INT", "STRING", "FLOATS", "INTS", "STRINGS")
)


def _messages_holding(target: Any) -> frozenset[Any]:
    """The message types of onnx's schema that hold a ``target`` message at some depth."""
    holding = {target}
    types = list(target.file.message_types_by_name.values())
    pending = list(types)
    while pending:
        current = pending.pop()
        pending.extend(current.nested_types)
        types.append(current)
    grew = True
    while grew:
        grew = False
        for message_type in types:
            if message_type not in holding and any(field.message_type in holding for field in message_type.fields):
                holding.add(message_type)
                grew = True
    return frozenset(holding)


_HOLDS_TENSORS = _messages_holding(onnx.TensorProto.DESCRIPTOR)


_PACKED_4BIT = {onnx.TensorProto.INT4, onnx.TensorProto.UINT4, getattr(onnx.TensorProto, "FLOAT4E2M1", -1)}
_TWO_PER_ELEMENT = {onnx.TensorProto.COMPLEX64, onnx.TensorProto.COMPLEX128}


def _tensor_size_problem(tensor: onnx.TensorProto) -> str:
    """Why ``tensor``'s stored data cannot be its declared shape, or ''."""
    dims = tensor.dims[:]  # a list: each read of the repeated field goes through protobuf
    if dims and min(dims) < 0:
        return f"has a negative dimension {dims}"
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        return ""  # onnx.load has read or refused it; nothing stored here to count
    count = math.prod(dims)
    if tensor.data_type == onnx.TensorProto.STRING:
        stored, expected = len(tensor.string_data), count
    elif tensor.HasField("raw_data"):
        bits = _bits_per_element(tensor.data_type)
        if bits is None:
            return ""  # a type numpy cannot name; onnx's own checks decide
        stored, expected = len(tensor.raw_data), -(-count * bits // 8)
    else:
        try:
            field = onnx.helper.tensor_dtype_to_field(tensor.data_type)
        except (KeyError, ValueError, TypeError):
            return ""
        if tensor.data_type in _PACKED_4BIT:
            return ""
        stored, expected = len(getattr(tensor, field)), count * (2 if tensor.data_type in _TWO_PER_ELEMENT else 1)
    if stored != expected:
        unit = "bytes" if tensor.HasField("raw_data") and tensor.data_type != onnx.TensorProto.STRING else "values"
        return f"stores {stored} {unit}; shape {dims} needs {expected}"
    return ""


@functools.cache
def _bits_per_element(data_type: int) -> int | None:
    """Bits one element of ``data_type`` takes in ``raw_data``, or None when numpy cannot name it."""
    try:
        itemsize = onnx.helper.tensor_dtype_to_np_dtype(data_type).itemsize
    except (KeyError, ValueError, TypeError):
        return None
    return 4 if data_type in _PACKED_4BIT else 8 * itemsize


def _drop_repeated_outputs(model: ir.Model) -> None:
    """A graph may list one output twice (onnxruntime runs it); ``run`` returns it once."""
    outputs = model.graph.outputs
    names = [value.name for value in outputs]
    for index in reversed(range(len(outputs))):
        if names.index(names[index]) != index:
            outputs.pop(index)


def _placeholder_dims_unknown(proto: onnx.ModelProto, graphs: list[onnx.GraphProto]) -> onnx.ModelProto:
    """``proto``, or a copy in which every placeholder dimension is an unknown one.

    Some exporters write ``-1`` for "any size" and name every unknown dimension ``?``
    (``float32[-1, 3, ?, ?]``, Paddle2ONNX): onnxruntime reads both as unknown sizes, neither
    a size nor a name two dimensions must share, and so must everything after import.
    """
    if not any(_placeholder_dims(graph) for graph in graphs):  # (``graphs``: _graphs(proto.graph))
        return proto
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    for graph in _graphs(copy.graph):
        for dim in _placeholder_dims(graph):
            dim.Clear()
    return copy


def _placeholder_dims(graph: onnx.GraphProto) -> list[onnx.TensorShapeProto.Dimension]:
    return [
        dim
        for info in (*graph.input, *graph.output, *graph.value_info)
        if info.type.HasField("tensor_type")
        for dim in info.type.tensor_type.shape.dim
        if (dim.HasField("dim_value") and dim.dim_value < 0) or (dim.HasField("dim_param") and dim.dim_param == "?")
    ]


# The temporary domain LayerNormalization nodes wait in while the rest of a model is converted.
_LAYER_NORM_ASIDE = "codegraft.opset17"


def _layer_norm_as_opset_17(proto: onnx.ModelProto, graphs: list[onnx.GraphProto], where: str) -> onnx.ModelProto:
    """A model using LayerNormalization (an opset-17 op) while importing an older default opset,
    read as opset 17.

    onnxruntime runs such models (it registers its own LayerNormalization, the same function,
    for opsets 1-16, and its transformer optimizer writes it so); the onnx checker refuses them
    (pnm's int8 phoneme decoder, opset 16).  Opset 17 changed no op of opset 16, so an opset-16
    model only gets its import raised; an older one is converted to opset 17 with onnx's
    version converter, its LayerNormalization nodes set aside in a domain of their own meanwhile.

    >>> node = onnx.helper.make_node("LayerNormalization", ["x", "g"], ["y"])
    >>> graph = onnx.helper.make_graph([node], "g", [], [])
    >>> old = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 16)])
    >>> [o.version for o in _layer_norm_as_opset_17(old, [old.graph], "m").opset_import]
    [17]
    """
    imports = {o.domain: o.version for o in proto.opset_import}
    version = imports.get("", imports.get("ai.onnx", 0))
    if version >= 17 or not any(_is_layer_norm(n) for g in graphs for n in g.node):
        return proto
    if version == 16:
        raised = onnx.ModelProto()
        raised.CopyFrom(proto)
        for opset in raised.opset_import:
            if opset.domain in ("", "ai.onnx"):
                opset.version = 17
        return raised
    from onnx import version_converter

    aside = onnx.ModelProto()
    aside.CopyFrom(proto)
    for graph in _graphs(aside.graph):
        for node in graph.node:
            if _is_layer_norm(node):
                node.domain = _LAYER_NORM_ASIDE
    aside.opset_import.append(onnx.helper.make_opsetid(_LAYER_NORM_ASIDE, 1))
    # the converter wants a shape on every graph input and output (check_model_proto's trick)
    unranked = [
        info.name
        for info in (*aside.graph.input, *aside.graph.output)
        if info.type.HasField("tensor_type") and not info.type.tensor_type.HasField("shape")
    ]
    for info in (*aside.graph.input, *aside.graph.output):
        if info.name in unranked:
            info.type.tensor_type.shape.SetInParent()
    try:
        converted = version_converter.convert_version(aside, 17)
    except Exception as error:  # the converter raises several internal error types
        raise ModelError(
            f"{where} uses LayerNormalization, an opset-17 op, but imports opset {version}, and onnx's version "
            f"converter could not bring it to opset 17: {one_line(error)}"
        ) from None
    for graph in _graphs(converted.graph):
        for node in graph.node:
            if node.domain == _LAYER_NORM_ASIDE:
                node.domain = ""
    for info in (*converted.graph.input, *converted.graph.output):
        if info.name in unranked and not info.type.tensor_type.shape.dim:
            info.type.tensor_type.ClearField("shape")
    kept = [o for o in converted.opset_import if o.domain != _LAYER_NORM_ASIDE]
    del converted.opset_import[:]
    converted.opset_import.extend(kept)
    return converted


def _is_layer_norm(node: onnx.NodeProto) -> bool:
    return node.op_type == "LayerNormalization" and node.domain in ("", "ai.onnx")


def _nodes_in_order(proto: onnx.ModelProto) -> onnx.ModelProto:
    """``proto``, or a copy whose main graph lists its nodes in an order that computes each
    value before its readers.  Among nodes ready at once the file's order is kept; a graph
    that cannot be ordered (a cycle, a value nothing makes) is left as it is, for the checker
    to name.
    """
    graph = proto.graph
    made_by = {name: index for index, node in enumerate(graph.node) for name in node.output if name}
    reads = [_reads(node) for node in graph.node]
    if all(made_by.get(name, -1) < index for index, names in enumerate(reads) for name in names):
        return proto
    waiting = [0] * len(graph.node)
    readers: list[list[int]] = [[] for _ in graph.node]
    for index, names in enumerate(reads):
        for producer in {made_by[name] for name in names if name in made_by and made_by[name] != index}:
            waiting[index] += 1
            readers[producer].append(index)
    ready = [index for index, count in enumerate(waiting) if count == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        index = heapq.heappop(ready)
        order.append(index)
        for reader in readers[index]:
            waiting[reader] -= 1
            if waiting[reader] == 0:
                heapq.heappush(ready, reader)
    if len(order) != len(graph.node):
        return proto
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    del copy.graph.node[:]
    copy.graph.node.extend(graph.node[index] for index in order)
    return copy


def _reads(node: onnx.NodeProto) -> set[str]:
    """The values ``node`` reads: its inputs, and what its subgraphs read from outside them."""
    names = {name for name in node.input if name}
    for attribute in node.attribute:
        for body in ([attribute.g] if attribute.HasField("g") else []) + list(attribute.graphs):
            for inner in _graphs(body):
                names.update(name for n in inner.node for name in n.input if name)
    return names


def _graphs(graph: onnx.GraphProto) -> list[onnx.GraphProto]:
    """``graph`` and every subgraph in it (If branches, Loop and Scan bodies), recursively."""
    found, pending = [], [graph]
    while pending:
        current = pending.pop()
        found.append(current)
        for node in current.node:
            for attribute in node.attribute:
                if attribute.HasField("g"):
                    pending.append(attribute.g)
                pending.extend(attribute.graphs)
    return found


def _to_proto(source: ModelSource, example_inputs: Sequence[Any] | None) -> onnx.ModelProto:
    if isinstance(source, onnx.ModelProto):
        return source
    if isinstance(source, ir.Model):
        return ir.to_proto(source)
    if isinstance(source, bytes | bytearray):
        try:
            return onnx.load_from_string(bytes(source))
        except Exception as error:
            raise ModelError(f"the given bytes are not an ONNX model: {one_line(error)}") from None
    if isinstance(source, str | os.PathLike):
        path = os.fspath(source)
        if not os.path.exists(path):
            raise ModelError(f"model file not found: {path}")
        try:
            return _load_file(path)
        except Exception as error:
            raise ModelError(f"{path} is not an ONNX model: {one_line(error)}") from None
    if is_torch_module(source):
        return export_module(source, example_inputs).proto
    raise ModelError(
        f"cannot compile a {type(source).__name__}: pass a path, bytes, onnx.ModelProto, "
        "onnx_ir.Model or a torch.nn.Module with example_inputs="
    )


def _load_file(path: str) -> onnx.ModelProto:
    """``onnx.load(path)``, without its walk over every tensor when none can be external.

    NOTE: onnx.load visits every tensor in Python to find those stored in other files (0.2 s
    of a 100k-node model's import).  Each of those names its file under the key "location";
    a file without that word anywhere has none, which one scan of its bytes tells.
    """
    proto = onnx.load(path, load_external_data=False)
    if _holds(path, b"location"):
        onnx.external_data_helper.load_external_data_for_model(proto, os.path.dirname(path))
    return proto


def _holds(path: str, word: bytes) -> bool:
    """Whether the file at ``path`` contains ``word`` (mapped, not copied: models are large)."""
    with open(path, "rb") as file:
        try:
            with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as view:
                return view.find(word) >= 0
        except (ValueError, OSError):  # an empty file, or one that cannot be mapped
            return True


def _describe(source: ModelSource) -> str:
    if isinstance(source, str | os.PathLike):
        return os.fspath(source)
    return f"the {type(source).__name__} model"


def one_line(error: BaseException) -> str:
    """A dependency's multi-line message as one line, nothing dropped (the onnx checker puts
    the node name on its "==> Context:" line)."""
    text = " ".join(str(error).split())
    return text.replace(" ==> Context: ", "; ") if text else type(error).__name__
