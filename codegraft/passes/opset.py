"""Move a model to a newer ONNX opset (onnx's version converter does the work).

Why: several ops gained their bfloat16 form late (Conv, pools, BatchNormalization at opset
22), so a model exported at opset 9 converts to bfloat16 only after an upgrade.
"""

from __future__ import annotations

import onnx_ir as ir
from onnx import version_converter

__all__ = ["BFLOAT16_OPSET", "upgrade_opset"]

# The first opset where the common CNN ops (Conv, pools, BatchNormalization) take bfloat16.
BFLOAT16_OPSET = 22


def upgrade_opset(model: ir.Model, version: int) -> ir.Model:
    """A copy of ``model`` at default-domain opset ``version`` (returned as is if already there).

    Raises what the converter raises for an op it cannot move (rare for standard ops).
    """
    current = model.opset_imports.get("", model.opset_imports.get("ai.onnx", version))
    if current >= version:
        return model
    converted = version_converter.convert_version(ir.serde.serialize_model(model), version)
    return ir.serde.deserialize_model(converted)
