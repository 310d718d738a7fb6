"""PyTorch modules in: an ``nn.Module`` and example inputs out as an ONNX model.

torch's current exporter (``torch.onnx.export(..., dynamo=True)``, built on ``torch.export``)
is the default.  The legacy TorchScript exporter is tried only when it fails, and the
returned :class:`TorchExport` says so with the reason, for the report.  Input names come
from ``forward``'s signature (or ``input_names``), outputs are ``output`` / ``output_<i>``
(or ``output_names``), and ``dynamic_shapes`` follows ``torch.export``'s spelling.

Example::

    exported = export_module(net, (x,), dynamic_shapes={"x": {0: "batch"}})
    exported.proto.graph.input[0].name      # "x", its first dimension "batch"
"""

from __future__ import annotations

import inspect
import io
import logging
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import onnx
import onnx_ir as ir

from codegraft.errors import ModelError

log = logging.getLogger("codegraft")

# torch.export's spelling: per input (by name or position) a mapping axis -> Dim/str/None,
# or a sequence with one entry per axis.
DynamicShapes = Mapping[str, Any] | Sequence[Any]


@dataclass(frozen=True)
class TorchExport:
    """An exported module: the ONNX model, which exporter made it, and a line for the report."""

    proto: onnx.ModelProto
    exporter: str  # "dynamo" or "legacy"
    note: str


def is_torch_module(source: object) -> bool:
    """Whether ``source`` is a ``torch.nn.Module`` (checked without importing torch)."""
    return any(cls.__module__.startswith("torch") and cls.__name__ == "Module" for cls in type(source).__mro__)


def export_module(
    module: Any,
    example_inputs: Sequence[Any] | None,
    *,
    dynamic_shapes: DynamicShapes | None = None,
    input_names: Sequence[str] | None = None,
    output_names: Sequence[str] | None = None,
) -> TorchExport:
    """Export ``module`` called on ``example_inputs``; see the module docstring."""
    if example_inputs is None:
        raise ModelError("a torch module needs example_inputs= (a tuple of tensors) to be exported")
    import torch

    args = tuple(example_inputs) if isinstance(example_inputs, list | tuple) else (example_inputs,)
    names = list(input_names) if input_names is not None else forward_names(module, len(args))
    if len(names) != len(args):
        raise ModelError(f"input_names has {len(names)} names for {len(args)} example inputs")
    module.eval()
    try:
        proto = _export_dynamo(torch, module, args, names, dynamic_shapes)
        exporter, note = "dynamo", "exported with torch.onnx.export(dynamo=True)"
    except Exception as error:  # the exporter raises many types; the legacy one gets its chance
        reason = first_line(error)
        log.warning("torch's dynamo exporter failed for %s (%s); trying the legacy exporter",
                    type(module).__name__, reason)
        try:
            proto = _export_legacy(torch, module, args, names, dynamic_shapes)
        except Exception as legacy_error:
            raise ModelError(
                f"torch.onnx.export failed for {type(module).__name__}: dynamo exporter: {reason}; "
                f"legacy exporter: {first_line(legacy_error)}"
            ) from None
        exporter = "legacy"
        note = f"exported with the legacy TorchScript exporter: the dynamo exporter failed: {reason}"
    proto = _rename(proto, names, output_names)
    return TorchExport(proto, exporter, note)


def forward_names(module: Any, count: int) -> list[str]:
    """Names of ``forward``'s first ``count`` positional parameters (``input_<i>`` past them)."""
    try:
        parameters = list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError):
        parameters = []
    positional = [
        p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    return [positional[i] if i < len(positional) else f"input_{i}" for i in range(count)]


def _export_dynamo(
    torch: Any, module: Any, args: tuple[Any, ...], names: list[str], dynamic_shapes: DynamicShapes | None
) -> onnx.ModelProto:
    quiet = logging.getLogger("torch.onnx")  # "torchvision is not installed" lines on every export
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        program = _dynamo_program(torch, module, args, names, dynamic_shapes)
    finally:
        quiet.setLevel(level)
    return program.model_proto


def _dynamo_program(
    torch: Any, module: Any, args: tuple[Any, ...], names: list[str], dynamic_shapes: DynamicShapes | None
) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # FutureWarnings from torch internals; our errors say what matters
        return torch.onnx.export(
            module, args, dynamo=True, dynamic_shapes=_for_torch_export(dynamic_shapes, names, module),
            verbose=False, report=False,
        )


def _for_torch_export(dynamic_shapes: DynamicShapes | None, names: list[str], module: Any) -> Any:
    """torch.export wants one entry per parameter of ``forward``: a ``*inputs`` one takes a tuple."""
    by_name = _by_name(dynamic_shapes, names, module)
    if by_name is None:
        return None
    try:
        kinds = [p.kind for p in inspect.signature(module.forward).parameters.values()]
    except (TypeError, ValueError):
        kinds = []
    if kinds and kinds[0] == inspect.Parameter.VAR_POSITIONAL:
        return (tuple(by_name.get(name) for name in names),)
    return by_name


def _export_legacy(
    torch: Any, module: Any, args: tuple[Any, ...], names: list[str], dynamic_shapes: DynamicShapes | None
) -> onnx.ModelProto:
    buffer = io.BytesIO()
    axes = {
        name: {int(axis): _dim_name(dim, name, int(axis)) for axis, dim in spec.items() if dim is not None}
        for name, spec in (_by_name(dynamic_shapes, names, module) or {}).items()
        if spec
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, buffer, dynamo=False, input_names=names, dynamic_axes=axes or None)
    return onnx.load_from_string(buffer.getvalue())


def _by_name(dynamic_shapes: DynamicShapes | None, names: list[str], module: Any) -> dict[str, dict[int, Any]] | None:
    """torch.export's spellings normalised to ``{input name: {axis: Dim or name}}``."""
    if dynamic_shapes is None:
        return None
    if isinstance(dynamic_shapes, Mapping):
        unknown = sorted(set(dynamic_shapes) - set(names))
        if unknown:
            raise ModelError(
                f"dynamic_shapes names {unknown}, which {type(module).__name__}.forward does not take "
                f"(its inputs: {names})"
            )
        items = list(dynamic_shapes.items())
    else:
        if len(dynamic_shapes) != len(names):
            raise ModelError(f"dynamic_shapes has {len(dynamic_shapes)} entries for {len(names)} inputs")
        items = list(zip(names, dynamic_shapes, strict=True))
    result: dict[str, dict[int, Any]] = {}
    for name, spec in items:
        if spec is None:
            continue
        if isinstance(spec, Mapping):
            result[name] = {int(axis): dim for axis, dim in spec.items()}
        else:
            result[name] = {axis: dim for axis, dim in enumerate(spec) if dim is not None}
    return result


def _dim_name(dim: Any, name: str, axis: int) -> str:
    if isinstance(dim, str):
        return dim
    return str(getattr(dim, "__name__", "") or f"{name}_dim{axis}")


def _rename(proto: onnx.ModelProto, input_names: list[str], output_names: Sequence[str] | None) -> onnx.ModelProto:
    """Graph inputs named as ``forward``'s parameters, outputs ``output``/``output_<i>`` (or as given)."""
    model = ir.from_proto(proto)
    outputs = list(model.graph.outputs)
    wanted_out = list(output_names) if output_names is not None else (
        ["output"] if len(outputs) == 1 else [f"output_{i}" for i in range(len(outputs))]
    )
    if len(wanted_out) != len(outputs):
        raise ModelError(f"output_names has {len(wanted_out)} names, the module returns {len(outputs)} outputs")
    taken = {v.name for v in _all_values(model)}
    pairs = list(zip(model.graph.inputs, input_names, strict=False)) + list(zip(outputs, wanted_out, strict=True))
    for value, name in pairs:
        if value.name == name:
            continue
        if name in taken:  # a value inside already has that name: leave the exporter's name
            log.warning("cannot rename %r to %r: the name is taken inside the graph", value.name, name)
            continue
        taken.discard(value.name)
        value.name = name
        taken.add(name)
    return ir.to_proto(model)


def _all_values(model: ir.Model) -> list[ir.Value]:
    values = list(model.graph.inputs) + list(model.graph.initializers.values())
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        values.extend(v for v in node.outputs)
    return values


def first_line(error: BaseException) -> str:
    """The first line of an error's message (exporters write pages), or its type's name."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
