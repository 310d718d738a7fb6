"""Bringing a model in: a path, bytes, ``onnx.ModelProto``, ``onnx_ir.Model`` or a torch module.

Whatever comes in leaves as one normalised onnx-ir model: checked, shapes inferred, every
value named, constants lifted to initializers, initializers no longer doubling as graph inputs.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import onnx
import onnx_ir as ir
from onnx_ir.passes import common as common_passes

from codegraft.errors import ModelError
from codegraft.frontend.torch_export import export_module, is_torch_module

ModelSource = str | os.PathLike[str] | bytes | onnx.ModelProto | ir.Model | Any


def import_model(source: ModelSource, *, example_inputs: Sequence[Any] | None = None) -> ir.Model:
    """Read, check and normalise a model; see the module docstring for what is accepted."""
    proto = _to_proto(source, example_inputs)
    where = _describe(source)
    try:
        onnx.checker.check_model(proto)
    except onnx.checker.ValidationError as error:
        raise ModelError(f"{where} is not a valid ONNX model: {_first_line(error)}") from None
    try:
        proto = onnx.shape_inference.infer_shapes(proto, strict_mode=True)
    except Exception as error:  # onnx raises several internal error types here
        raise ModelError(f"{where}: shape inference failed: {_first_line(error)}") from None
    model = ir.from_proto(proto)
    for pass_ in (
        common_passes.NameFixPass(),
        common_passes.LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0),
        common_passes.RemoveInitializersFromInputsPass(),
    ):
        pass_(model)
    return model


def _to_proto(source: ModelSource, example_inputs: Sequence[Any] | None) -> onnx.ModelProto:
    if isinstance(source, onnx.ModelProto):
        return source
    if isinstance(source, ir.Model):
        return ir.to_proto(source)
    if isinstance(source, bytes | bytearray):
        try:
            return onnx.load_from_string(bytes(source))
        except Exception as error:
            raise ModelError(f"the given bytes are not an ONNX model: {_first_line(error)}") from None
    if isinstance(source, str | os.PathLike):
        path = os.fspath(source)
        if not os.path.exists(path):
            raise ModelError(f"model file not found: {path}")
        try:
            return onnx.load(path)
        except Exception as error:
            raise ModelError(f"{path} is not an ONNX model: {_first_line(error)}") from None
    if is_torch_module(source):
        return export_module(source, example_inputs).proto
    raise ModelError(
        f"cannot compile a {type(source).__name__}: pass a path, bytes, onnx.ModelProto, "
        "onnx_ir.Model or a torch.nn.Module with example_inputs="
    )


def _describe(source: ModelSource) -> str:
    if isinstance(source, str | os.PathLike):
        return os.fspath(source)
    return f"the {type(source).__name__} model"


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
