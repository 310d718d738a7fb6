"""Random inputs: the one place that says what a random value of a given type looks like.

Floats are standard normal, booleans fair coin flips, integers small non-negative values (0 to
3: valid as indices, axes and repeat counts of the small models tests use).  The public
:func:`codegraft.testing.random_feeds`, the precision self-check, measured placement and the
command line's ``--random`` inputs all draw from here, so a seed means the same data everywhere.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx
import onnx_ir as ir

from codegraft.core.dtypes import numpy_dtype_of_onnx


def random_array(rng: np.random.Generator, shape: Sequence[int], dtype: np.dtype) -> np.ndarray:
    """One random array of ``shape`` and ``dtype``.  Example: ``random_array(rng, [2, 3], np.dtype("float32"))``."""
    if np.issubdtype(dtype, np.floating):
        return rng.standard_normal(shape).astype(dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, size=shape).astype(bool)
    return rng.integers(0, 4, size=shape).astype(dtype)


def random_inputs(
    model: ir.Model, rng: np.random.Generator, *, dim_values: Mapping[str, int] | None = None
) -> dict[str, np.ndarray]:
    """Random values for the graph inputs of ``model`` (not its initializers).

    Symbolic dimensions take ``dim_values[name]`` or 1.  An input without a declared type and
    shape is a ``ValueError`` naming it.
    """
    initializers = set(model.graph.initializers)
    feeds: dict[str, np.ndarray] = {}
    for value in model.graph.inputs:
        if value.name in initializers or value.name is None:
            continue
        if value.dtype is None or value.shape is None:
            raise ValueError(f"input {value.name!r} has no declared type and shape")
        shape = [d if isinstance(d, int) else (dim_values or {}).get(str(d), 1) for d in value.shape]
        feeds[value.name] = random_array(rng, shape, np.dtype(value.dtype.numpy()))
    return feeds


def random_feeds(
    model: onnx.ModelProto, *, seed: int = 0, dim_values: Mapping[str, int] | None = None
) -> dict[str, np.ndarray]:
    """Random inputs for every graph input; symbolic (and negative, "any size") dims take
    ``dim_values`` or 1.

    Example: ``random_feeds(onnx.load("model.onnx"), seed=1)``.
    """
    rng = np.random.default_rng(seed)
    init_names = {t.name for t in model.graph.initializer}
    feeds: dict[str, np.ndarray] = {}
    for value in model.graph.input:
        if value.name in init_names:
            continue
        tensor_type = value.type.tensor_type
        shape = [
            d.dim_value if d.HasField("dim_value") and d.dim_value >= 0 else (dim_values or {}).get(d.dim_param, 1)
            for d in tensor_type.shape.dim
        ]
        feeds[value.name] = random_array(rng, shape, numpy_dtype_of_onnx(tensor_type.elem_type))
    return feeds


__all__ = ["random_array", "random_feeds", "random_inputs"]
