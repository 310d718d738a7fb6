"""Static int8 quantization from the user's calibration samples, in QDQ form.

NOTE: onnxruntime's quantization tools do the work (calibration, scale choice, per-channel
weights, which ops to quantize); we only adapt them to onnx-ir models and explicit options.
QDQ format keeps the graph made of standard ops (``DequantizeLinear -> op ->
QuantizeLinear``), so every backend, and the host, can run the result, and a backend that
declares int8 claims the QDQ units whole.
"""

from __future__ import annotations

import collections
import pathlib
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import onnx
import onnx_ir as ir
from onnxruntime import quantization as ort_quant

from codegraft.core.irversion import readable_by_runtime
from codegraft.passes._graph_util import name_nodes
from codegraft.passes.opset import upgrade_opset

__all__ = ["QDQ_OPSET", "QuantizeOptions", "QuantizeResult", "quantize_int8"]

# Older models are moved to this opset first: DequantizeLinear takes ``axis`` from 13.
QDQ_OPSET = 13

IntType = Literal["int8", "uint8"]
_TYPES: Mapping[str, ort_quant.QuantType] = {"int8": ort_quant.QuantType.QInt8, "uint8": ort_quant.QuantType.QUInt8}
_METHODS: Mapping[str, ort_quant.CalibrationMethod] = {
    "minmax": ort_quant.CalibrationMethod.MinMax,
    "entropy": ort_quant.CalibrationMethod.Entropy,
    "percentile": ort_quant.CalibrationMethod.Percentile,
}


@dataclass(frozen=True)
class QuantizeOptions:
    """How to quantize.

    Attributes:
        activations, weights: integer type of each (onnxruntime's CPU default: int8 both).
        per_channel: one scale per output channel of a weight (better accuracy for convs).
        method: how activation ranges are chosen from the calibration samples.
        op_types: only these ops are quantized (None: every op onnxruntime knows how to).
        exclude_nodes: node names left in float.
    """

    activations: IntType = "int8"
    weights: IntType = "int8"
    per_channel: bool = True
    method: Literal["minmax", "entropy", "percentile"] = "minmax"
    op_types: tuple[str, ...] | None = None
    exclude_nodes: tuple[str, ...] = ()


@dataclass(frozen=True)
class QuantizeResult:
    """The QDQ model and how much of it was quantized."""

    model: ir.Model = field(repr=False)
    quantized_ops: tuple[str, ...]  # names of nodes that now read dequantized inputs
    quantize_nodes: int
    dequantize_nodes: int


class _Samples(ort_quant.CalibrationDataReader):  # type: ignore[misc]
    """Hands the calibration samples to onnxruntime one at a time."""

    def __init__(self, samples: Sequence[Mapping[str, np.ndarray]]) -> None:
        self._samples: Iterator[Mapping[str, np.ndarray]] = iter(samples)

    def get_next(self) -> dict[str, np.ndarray] | None:
        sample = next(self._samples, None)
        return None if sample is None else dict(sample)


def quantize_int8(
    model: ir.Model,
    calibration: Sequence[Mapping[str, np.ndarray]],
    options: QuantizeOptions = QuantizeOptions(),
) -> QuantizeResult:
    """Quantize ``model`` (not modified) statically to int8 QDQ, calibrated on ``calibration``.

    Graph inputs and outputs keep their names and float types; a model older than opset 13
    comes back at opset 13.
    """
    if not calibration:
        raise ValueError("quantize_int8 needs at least one calibration sample")
    # QDQ needs opset 10, per-axis scales (per_channel, int32 biases) opset 13
    # onnxruntime's calibrator loads the model it is given: at an IR version it reads (onnx 1.23
    # writes 14, onnxruntime 1.30 reads 13).
    proto = readable_by_runtime(ir.serde.serialize_model(upgrade_opset(model, QDQ_OPSET)))
    with tempfile.TemporaryDirectory(prefix="codegraft-quant-") as tmp:
        # onnxruntime writes the result (and calibration scratch models) to files
        output = pathlib.Path(tmp) / "quantized.onnx"
        ort_quant.quantize_static(
            proto,
            output,
            _Samples(calibration),
            quant_format=ort_quant.QuantFormat.QDQ,
            op_types_to_quantize=list(options.op_types) if options.op_types is not None else None,
            per_channel=options.per_channel,
            activation_type=_TYPES[options.activations],
            weight_type=_TYPES[options.weights],
            nodes_to_exclude=list(options.exclude_nodes),
            calibrate_method=_METHODS[options.method],
            extra_options={"CalibTensorRangeSymmetric": False},
        )
        quantized = ir.serde.deserialize_model(onnx.load(str(output)))
    name_nodes(quantized.graph)
    ops = collections.Counter(n.op_type for n in quantized.graph)
    readers = tuple(
        n.name or ""
        for n in quantized.graph
        if n.op_type not in ("QuantizeLinear", "DequantizeLinear")
        and any(v is not None and (p := v.producer()) is not None and p.op_type == "DequantizeLinear" for v in n.inputs)
    )
    return QuantizeResult(quantized, readers, ops["QuantizeLinear"], ops["DequantizeLinear"])
