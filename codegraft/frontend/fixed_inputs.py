"""Fixing a model's free input dimensions and binding input values at compile time.

``compile(..., input_shapes=...)`` and ``compile(..., input_values=...)``.

Exporters leave dimensions free (``batch``, ``samples``, or unnamed), and a graph whose
shapes are unknown keeps all the shape arithmetic that torch's tracer writes around them:
``if x.shape[2] == 1: squeeze`` becomes an ``If`` on ``Equal(Gather(Shape(x), 2), 1)``,
padding amounts become ``Concat``/``ConstantOfShape`` chains.  Nothing of that can be folded
while the sizes are unknown, so it runs on every call and cuts the model into partitions.
Given the sizes a deployment feeds, the common passes fold it all away (Silero VAD: 25 If
nodes and 689 nodes down to one If and 227), as onnxruntime's free-dimension overrides,
OpenVINO's ``reshape`` and trtexec's ``--shapes`` do for their engines.

A size given for a named dimension holds wherever that name appears, in every input; the
compiled executable then takes exactly these shapes and names any other it is fed.  Where the
inputs listed give one name different sizes, the exporter reused the name for sizes that
differ (Robust Video Matting declares its frame and its four recurrent states all
``[batch_size, channels, height, width]``): each listed input takes the shape given, as
trtexec's ``--shapes`` and OpenVINO's ``reshape`` take them, and the name fixes no other input.

Example::

    exe = codegraft.compile("silero_vad.onnx", targets=["c"], input_shapes={"input": (1, 512)})
    exe.inputs[0].shape   # (1, 512); state's batch dimension too, where it shares the name
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from codegraft.core.dtypes import numpy_dtype
from codegraft.errors import OptionError


def _input(model: ir.Model, name: str, option: str) -> ir.Value:
    for value in model.graph.inputs:
        if value.name == name:
            return value
    known = ", ".join(repr(v.name) for v in model.graph.inputs) or "none"
    raise OptionError(f"{option} names {name!r}, which is not an input of the model (its inputs: {known})")


def fix_input_shapes(model: ir.Model, shapes: Sequence[tuple[str, tuple[int, ...]]]) -> str:
    """Give the named inputs of ``model`` these shapes (in place); a note for the report.

    Each name must be a graph input; a shape must have the input's rank and agree with its
    fixed sizes; a named dimension takes one size everywhere (also in inputs not listed), but
    one the listed inputs give different sizes is reused by the exporter for independent sizes
    and fixes only the inputs listed.  Anything else is an :class:`OptionError` naming the input
    and the dimension.

    >>> x = ir.Value(name="x", shape=ir.Shape(["batch", 3]), type=ir.TensorType(ir.DataType.FLOAT))
    >>> m = ir.Model(ir.Graph([x], [x], nodes=[]), ir_version=10)
    >>> fix_input_shapes(m, [("x", (2, 3))]), m.graph.inputs[0].shape
    ('input shapes fixed: x=2x3', Shape([2, 3]))
    """
    if not shapes:
        return ""
    named: dict[str, int] = {}
    reused: set[str] = set()  # names given different sizes by different inputs
    for name, dims in shapes:
        declared = _input(model, name, "input_shapes").shape
        if declared is None:
            continue
        if len(declared) != len(dims):
            raise OptionError(
                f"input_shapes[{name!r}] has {len(dims)} dimensions; the model declares {len(declared)}: "
                f"{_spelled(declared)}"
            )
        for axis, (want, have) in enumerate(zip(dims, declared, strict=True)):
            if isinstance(have, int):
                if have != want:
                    raise OptionError(
                        f"input_shapes[{name!r}]: dimension {axis} is fixed to {have} in the model, not {want} "
                        f"(declared {_spelled(declared)})"
                    )
            elif have.value is not None and named.setdefault(have.value, want) != want:
                reused.add(have.value)
    for name in reused:
        del named[name]
    given = dict(shapes)
    reached = []
    for value in model.graph.inputs:
        if value.name in given:
            value.shape = ir.Shape(given[value.name])
        elif value.shape is not None and any(_name_of(d) in named for d in value.shape):
            value.shape = ir.Shape([named.get(_name_of(d) or "", d) for d in value.shape])
            reached.append(value.name or "")
    if reused:
        _check_independent(model, sorted(reused), shapes)
    fixed = ", ".join(f"{n}={'x'.join(map(str, d)) or 'scalar'}" for n, d in shapes)
    note = f"input shapes fixed: {fixed}" + (f" (by a dimension's name also: {', '.join(reached)})" if reached else "")
    if reused:
        note += f"; dimension names given different sizes, taken as independent: {', '.join(sorted(reused))}"
    return note


def _check_independent(model: ir.Model, reused: Sequence[str], shapes: Sequence[tuple[str, tuple[int, ...]]]) -> None:
    """An :class:`OptionError` where the sizes given for a reused name contradict the model's
    own shapes (an Add of two inputs declared ``[n, 4]``, given 3 and 2 rows): then the name
    meant one size after all, and the sizes are a mistake, not the exporter's."""
    import onnx

    try:
        onnx.shape_inference.infer_shapes(ir.serde.serialize_model(model), strict_mode=True)
    except onnx.shape_inference.InferenceError as error:
        given = "; ".join(f"{n}={'x'.join(map(str, d)) or 'scalar'}" for n, d in shapes)
        raise OptionError(
            f"input_shapes: dimension {', '.join(map(repr, reused))} is given different sizes ({given}), "
            f"and the model's shapes do not hold with them: {str(error).strip().splitlines()[0]}"
        ) from None


def _name_of(dim: int | ir.SymbolicDim) -> str | None:
    return None if isinstance(dim, int) else dim.value


def _spelled(shape: ir.Shape) -> str:
    return "[" + ", ".join(str(d) if isinstance(d, int) else (d.value or "?") for d in shape) + "]"


def bind_input_values(model: ir.Model, values: Sequence[tuple[str, np.ndarray]]) -> tuple[str, dict[str, np.ndarray]]:
    """Turn the named inputs of ``model`` into constants of these values (in place).

    Returns a note for the report and each bound value in its input's dtype.  A value must
    fit the input's dtype exactly and its declared shape; else :class:`OptionError`.
    The passes then fold what the value decides (Silero VAD's ``If(sr == 16000)``), as TVM
    binds parameters by name and TensorRT specialises on shape-input values.

    >>> sr = ir.Value(name="sr", shape=ir.Shape([]), type=ir.TensorType(ir.DataType.INT64))
    >>> m = ir.Model(ir.Graph([sr], [sr], nodes=[]), ir_version=10)
    >>> bind_input_values(m, [("sr", np.array(16000))])
    ('inputs bound: sr=16000', {'sr': array(16000)})
    >>> len(m.graph.inputs), m.graph.initializers["sr"].const_value.numpy()
    (0, array(16000))
    """
    bound: dict[str, np.ndarray] = {}
    targets: list[ir.Value] = []
    for name, value in values:
        target = _input(model, name, "input_values")
        dtype = numpy_dtype(target.dtype) if target.dtype is not None else value.dtype
        with np.errstate(all="ignore"):
            cast = value.astype(dtype)
        rounded = np.dtype(dtype).kind == "f" and value.dtype.kind == "f"  # 0.1 as float32 is a rounding, not a misfit
        if not rounded and not np.array_equal(cast, value):
            raise OptionError(f"input_values[{name!r}]: {value.tolist()} is not a {np.dtype(dtype).name} value")
        declared = target.shape
        fixed = [d for d in declared if isinstance(d, int)] if declared is not None else []
        if declared is not None and len(fixed) == len(declared) and cast.size == int(np.prod(fixed, dtype=np.int64)):
            cast = cast.reshape(tuple(fixed))  # 16000 for a [1] input, say
        if declared is not None and (
            len(declared) != cast.ndim
            or any(isinstance(d, int) and d != n for d, n in zip(declared, cast.shape, strict=True))
        ):
            raise OptionError(
                f"input_values[{name!r}] has shape {list(cast.shape)}; the model declares {_spelled(declared)}"
            )
        bound[name] = cast
        targets.append(target)
    for (name, array), target in zip(bound.items(), targets, strict=True):
        # NOTE: pop, not del or remove: onnx-ir 1.1 leaves a value removed by slice still
        # marked as a graph input, and register_initializer refuses it then.
        model.graph.inputs.pop(list(model.graph.inputs).index(target))
        target.shape = ir.Shape(array.shape)
        target.const_value = ir.tensor(array, name=name)
        model.graph.register_initializer(target)
    note = ", ".join(f"{name}={array.tolist()}" for name, array in bound.items())
    return (f"inputs bound: {note}" if note else ""), bound


def control_flow_hint(model: ir.Model, *, shapes_fixed: bool, values_bound: bool) -> str:
    """A report note when If nodes remain that fixed shapes or bound values might fold, or ``""``.

    Each If runs its branch through codegraft's runtime on every call, and torch's tracer
    writes one around many a ``squeeze`` and ``pad``; a deployer who knows the input sizes
    (or a sample rate that never changes) can have them folded away.

    >>> x = ir.Value(name="x", shape=ir.Shape(["n"]), type=ir.TensorType(ir.DataType.BOOL))
    >>> def branch(name):
    ...     node = ir.Node("", "Not", [x], num_outputs=1)
    ...     return ir.AttrGraph(name, ir.Graph([], node.outputs, nodes=[node]))
    >>> node = ir.Node("", "If", [x], attributes=[branch("then_branch"), branch("else_branch")], num_outputs=1)
    >>> hint = control_flow_hint(ir.Model(ir.Graph([x], node.outputs, nodes=[node]), ir_version=10),
    ...                          shapes_fixed=False, values_bound=False)
    >>> hint[:20], "(free here: x [n])" in hint, hint[-30:]
    ('1 If node remains (e', True, ' (--shape / --value) fold them')
    """
    ifs = sum(1 for node in ir.traversal.RecursiveGraphIterator(model.graph) if node.op_type == "If")
    if not ifs:
        return ""
    free = [
        f"{v.name} {_spelled(v.shape) if v.shape is not None else '[?]'}" for v in model.graph.inputs
        if v.shape is None or not all(isinstance(d, int) for d in v.shape)
    ]
    asks = []
    if free and not shapes_fixed:
        asks.append(f"on input sizes (free here: {', '.join(free)})")
    if model.graph.inputs and not values_bound:
        asks.append("on inputs that never change")
    if not asks:
        return ""
    nodes = "If node remains" if ifs == 1 else "If nodes remain"
    return (
        f"{ifs} {nodes} (each call runs a branch through codegraft's runtime): where conditions depend "
        f"{' or '.join(asks)}, input_shapes= / input_values= (--shape / --value) fold them"
    )
