"""Inputs for the command line: shapes for free dimensions, random data, and .npz files.

``--shape x=1x3x224x224`` fixes an input's shape (checked against the model's fixed
dimensions); other free dimensions are 1.  Random data is standard normal for floats and
small integers (0..3) for integer inputs, from a seeded generator, so a run can be repeated;
``--save-inputs`` writes exactly what was fed (npz, one array per input) and
``--load-inputs`` feeds it again, to a later run, ``bench`` or ``compare``.

Example::

    specs = model_input_specs(onnx.load("model.onnx"))
    feeds, chosen = make_feeds(specs, shapes=parse_shapes(["x=4x3x224x224"]))
    print(chosen)            # ['x float32[4, 3, 224, 224] (random)']
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Mapping, Sequence

import numpy as np
import onnx

from codegraft.core.feeds import random_array
from codegraft.errors import InputError
from codegraft.runtime.executable import TensorSpec, check_shape


def parse_shapes(specs: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """``["x=1x3x224x224", "mask=1x128"]`` -> ``{"x": (1, 3, 224, 224), ...}``; a scalar is ``name=``."""
    shapes: dict[str, tuple[int, ...]] = {}
    for spec in specs:
        name, sep, dims = spec.partition("=")
        if not sep or not name:
            raise InputError(f"--shape {spec!r}: expected name=1x3x224x224")
        try:
            shape = tuple(int(d) for d in dims.lower().split("x")) if dims.strip() else ()
        except ValueError:
            raise InputError(f"--shape {spec!r}: dimensions must be integers joined by 'x', e.g. 1x3x224x224") from None
        if any(d < 0 for d in shape):
            raise InputError(f"--shape {spec!r}: dimensions must be >= 0")
        shapes[name] = shape
    return shapes


def parse_values(specs: Sequence[str]) -> dict[str, np.ndarray]:
    """``["sr=16000", "ids=1,2"]`` -> ``{"sr": array(16000), "ids": array([1, 2])}`` (``--value``).

    Integers stay integers, anything with a point or exponent is a float; the model's input
    dtype is applied (and checked) at compile time.
    """
    values: dict[str, np.ndarray] = {}
    for spec in specs:
        name, sep, text = spec.partition("=")
        if not sep or not name or not text.strip():
            raise InputError(f"--value {spec!r}: expected name=16000 or name=1,2,3")
        parts = [p.strip() for p in text.split(",")]
        try:
            numbers = [int(p) for p in parts]
            array = np.array(numbers if len(parts) > 1 else numbers[0], np.int64)
        except ValueError:
            try:
                floats = [float(p) for p in parts]
            except ValueError:
                raise InputError(f"--value {spec!r}: values must be numbers joined by ',', e.g. sr=16000") from None
            array = np.array(floats if len(parts) > 1 else floats[0], np.float64)
        values[name] = array
    return values


def model_input_specs(model: onnx.ModelProto) -> tuple[TensorSpec, ...]:
    """The graph inputs that are not initializers, as :class:`TensorSpec`."""
    from codegraft.core.dtypes import numpy_dtype_of_onnx

    initializers = {t.name for t in model.graph.initializer}
    specs = []
    for value in model.graph.input:
        if value.name in initializers:
            continue
        tensor = value.type.tensor_type
        dims: list[int | str | None] = []
        for d in tensor.shape.dim:
            dims.append(d.dim_value if d.HasField("dim_value") else (d.dim_param or None))
        shape = tuple(dims) if tensor.HasField("shape") else None
        specs.append(TensorSpec(value.name, numpy_dtype_of_onnx(tensor.elem_type).name, shape))
    return tuple(specs)


def make_feeds(
    specs: Sequence[TensorSpec],
    *,
    shapes: Mapping[str, tuple[int, ...]] | None = None,
    given: Mapping[str, np.ndarray] | None = None,
    random: bool = True,
    seed: int = 0,
) -> tuple[dict[str, np.ndarray], list[str]]:
    """Feeds for ``specs``: ``given`` arrays as they are, the rest random of the chosen shapes.

    Returns the feeds and one line per input saying its type and where it came from.
    """
    shapes = dict(shapes or {})
    given = dict(given or {})
    names = {s.name for s in specs}
    for name in [*shapes, *given]:
        if name not in names:
            known = ", ".join(f"{s.name} {s.describe()}" for s in specs)
            raise InputError(f"the model has no input {name!r}; its inputs are: {known}")
    rng = np.random.default_rng(seed)
    # Named dimensions (batch, seq) set by --shape hold for every input that has them.
    bound: dict[str, tuple[int, str]] = {}
    fixed = {s.name: _checked(s, shapes[s.name], bound) for s in specs if s.name in shapes and s.name not in given}
    feeds: dict[str, np.ndarray] = {}
    chosen: list[str] = []
    for spec in specs:
        if spec.name in given:
            array = np.asarray(given[spec.name])
            feeds[spec.name] = array
            chosen.append(f"{spec.name} {array.dtype}{list(array.shape)} (given)")
            continue
        if not random:
            continue
        shape = fixed[spec.name] if spec.name in fixed else _default_shape(spec, bound)
        dtype = np.dtype(spec.dtype or "float32")
        array = random_array(rng, shape, dtype)
        feeds[spec.name] = array
        how = "--shape" if spec.name in fixed else "free dims from --shape or 1" if _has_free_dims(spec) else "declared"
        if how.startswith("free") and not bound:
            how = "free dims = 1"
        chosen.append(f"{spec.name} {dtype}{list(shape)} (random, {how})")
    return feeds, chosen


def _has_free_dims(spec: TensorSpec) -> bool:
    return spec.shape is None or any(not isinstance(d, int) for d in spec.shape)


def _checked(spec: TensorSpec, wanted: tuple[int, ...], bound: dict[str, tuple[int, str]]) -> tuple[int, ...]:
    """``wanted`` (from --shape) if it fits the declared shape and the dimensions named so far."""
    if spec.shape is not None:
        try:
            check_shape(spec, wanted, bound)
        except InputError as error:
            raise InputError(f"--shape {spec.name}={_dims(wanted)}: {error}") from None
    return wanted


def _default_shape(spec: TensorSpec, bound: dict[str, tuple[int, str]]) -> tuple[int, ...]:
    """The declared shape, named dimensions as --shape set them elsewhere, other free ones 1."""
    if spec.shape is None:
        raise InputError(f"input {spec.name!r} has no declared shape: give --shape {spec.name}=...")
    return tuple(d if isinstance(d, int) else bound[d][0] if isinstance(d, str) and d in bound else 1
                 for d in spec.shape)


def _dims(shape: Sequence[int]) -> str:
    return "x".join(str(d) for d in shape)


def load_inputs(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` file (no pickle), by name."""
    try:
        archive = np.load(path, allow_pickle=False)
        if not isinstance(archive, np.lib.npyio.NpzFile):
            raise InputError(f"--load-inputs {path}: not an .npz archive (write one with --save-inputs)")
        with archive:
            return {name: archive[name] for name in archive.files}
    except InputError:
        raise
    except (OSError, ValueError, EOFError) as error:
        raise InputError(f"--load-inputs {path}: cannot read it: {error}") from None


def save_inputs(path: str | os.PathLike[str], feeds: Mapping[str, np.ndarray]) -> pathlib.Path:
    """Write ``feeds`` as one ``.npz`` (keys are the input names); returns the path written."""
    out = pathlib.Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("wb") as file:  # a file object: numpy would otherwise append .npz to the name
        np.savez(file, **dict(feeds))  # type: ignore[arg-type]
    return out


__all__ = ["load_inputs", "make_feeds", "model_input_specs", "parse_shapes", "save_inputs"]
