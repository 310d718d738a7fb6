"""Element types: ONNX enum <-> numpy <-> readable name, in one place."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir


def numpy_dtype_of_onnx(elem_type: int) -> np.dtype:
    """numpy dtype of an ONNX ``TensorProto`` element type."""
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type))


def dtype_name(dtype: ir.DataType | None) -> str:
    """``"float32"``-style name of an onnx-ir data type (``"unknown"`` when not known)."""
    if dtype is None:
        return "unknown"
    return {
        ir.DataType.FLOAT: "float32",
        ir.DataType.DOUBLE: "float64",
        ir.DataType.FLOAT16: "float16",
        ir.DataType.BFLOAT16: "bfloat16",
        ir.DataType.BOOL: "bool",
    }.get(dtype, dtype.name.lower())


def numpy_dtype(dtype: ir.DataType) -> np.dtype:
    """numpy dtype for an onnx-ir data type."""
    return np.dtype(dtype.numpy())
