"""Fixing a model's free input dimensions at compile time (``compile(..., input_shapes=...)``).

Exporters leave dimensions free (``batch``, ``samples``, or unnamed), and a graph whose
shapes are unknown keeps all the shape arithmetic that torch's tracer writes around them:
``if x.shape[2] == 1: squeeze`` becomes an ``If`` on ``Equal(Gather(Shape(x), 2), 1)``,
padding amounts become ``Concat``/``ConstantOfShape`` chains.  Nothing of that can be folded
while the sizes are unknown, so it runs on every call and cuts the model into partitions.
Given the sizes a deployment feeds, the common passes fold it all away (Silero VAD: 25 If
nodes and 689 nodes down to one If and 227), as onnxruntime's free-dimension overrides,
OpenVINO's ``reshape`` and trtexec's ``--shapes`` do for their engines.

A size given for a named dimension holds wherever that name appears, in every input; the
compiled executable then takes exactly these shapes and names any other it is fed.

Example::

    exe = codegraft.compile("silero_vad.onnx", targets=["c"], input_shapes={"input": (1, 512)})
    exe.inputs[0].shape   # (1, 512); state's batch dimension too, where it shares the name
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx_ir as ir

from codegraft.errors import OptionError


def fix_input_shapes(model: ir.Model, shapes: Sequence[tuple[str, tuple[int, ...]]]) -> str:
    """Give the named inputs of ``model`` these shapes (in place); a note for the report.

    Each name must be a graph input; a shape must have the input's rank and agree with its
    fixed sizes; a named dimension takes one size everywhere (also in inputs not listed).
    Anything else is an :class:`OptionError` naming the input and the dimension.

    >>> x = ir.Value(name="x", shape=ir.Shape(["batch", 3]), type=ir.TensorType(ir.DataType.FLOAT))
    >>> m = ir.Model(ir.Graph([x], [x], nodes=[]), ir_version=10)
    >>> fix_input_shapes(m, [("x", (2, 3))]), m.graph.inputs[0].shape
    ('input shapes fixed: x=2x3', Shape([2, 3]))
    """
    if not shapes:
        return ""
    inputs = {v.name: v for v in model.graph.inputs}
    named: dict[str, int] = {}
    for name, dims in shapes:
        value = inputs.get(name)
        if value is None:
            known = ", ".join(repr(n) for n in inputs) or "none"
            raise OptionError(f"input_shapes names {name!r}, which is not an input of the model (its inputs: {known})")
        declared = value.shape
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
            elif have.value is not None:
                if named.setdefault(have.value, want) != want:
                    raise OptionError(
                        f"input_shapes: dimension {have.value!r} is given as both {named[have.value]} and {want} "
                        f"(input {name!r}, dimension {axis})"
                    )
    given = dict(shapes)
    reached = []
    for value in model.graph.inputs:
        if value.name in given:
            value.shape = ir.Shape(given[value.name])
        elif value.shape is not None and any(_name_of(d) in named for d in value.shape):
            value.shape = ir.Shape([named.get(_name_of(d) or "", d) for d in value.shape])
            reached.append(value.name or "")
    fixed = ", ".join(f"{n}={'x'.join(map(str, d)) or 'scalar'}" for n, d in shapes)
    return f"input shapes fixed: {fixed}" + (f" (by a dimension's name also: {', '.join(reached)})" if reached else "")


def _name_of(dim: int | ir.SymbolicDim) -> str | None:
    return None if isinstance(dim, int) else dim.value


def _spelled(shape: ir.Shape) -> str:
    return "[" + ", ".join(str(d) if isinstance(d, int) else (d.value or "?") for d in shape) + "]"
