"""What a lowering builds with: tensors of the backend's graph, constants, elementwise ops, views.

NOTE: each op family's lowering (``ops/``) turns one ONNX node into the backend's ops through a
:class:`Lowerer`; ``_translate.py`` walks the partition and picks the lowering from the table.
Shapes are computed here from the partition's concrete input shapes, not read from the
model's value infos, because ``codegraft.nhwc`` ops are unknown to ONNX shape inference.
Ops on constants only are folded as they are built.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from codegraft.backends.c import _graph as g
from codegraft.backends.c._node import attr_ints, opset_of, present
from codegraft.errors import CodegraftError


class LoweringError(CodegraftError):
    """A partition the C backend cannot compile (names the node and why)."""


# Elementwise kinds computed in numpy when every operand is a constant.
_FOLD: dict[str, Callable[..., np.ndarray]] = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": np.divide,
}


def _widened(array: np.ndarray) -> np.ndarray:
    """A float16 constant as float32 (exactly): the backend computes float16 in float32."""
    return array.astype(np.float32) if array.dtype == np.float16 else array


class Lowerer:
    """The backend's graph being built: ONNX values bound to tensors, and the ops so far."""

    def __init__(self, features: frozenset[str] = frozenset()) -> None:
        # the target's CPU features: a lowering may pick a form only some CPUs run fast
        # (MatMulInteger on 8-bit products where VNNI is there: ops/quantize.py)
        self.features = features
        self.values: dict[str, g.Tensor] = {}
        self.ops: list[g.Op] = []
        self.counter = 0

    # -- tensors -------------------------------------------------------------------------
    def tensor(self, value: ir.Value | None) -> g.Tensor:
        if value is None:
            raise LoweringError("a required input is missing")
        found = self.values.get(value.name or "")
        if found is not None:
            return found
        if value.const_value is not None:
            array = _widened(np.asarray(value.const_value.numpy()))
            tensor = g.Tensor(value.name or self.fresh("const"), tuple(array.shape), const=array)
            self.values[tensor.name] = tensor
            return tensor
        raise LoweringError(f"value {value.name!r} is used before it is produced")

    def known(self, value: ir.Value | None, what: str) -> np.ndarray:
        """The constant ``value`` is at compile time (a ``what``: indices, a condition, a shape)."""
        const = self.tensor(value).const
        if const is None:
            raise LoweringError(f"the {what} is not known at compile time")
        return const

    def ints(self, node: ir.Node, index: int) -> list[int] | None:
        """Input ``index`` of ``node`` as a flat list of ints, when it is given and known now:
        an initializer, or a value folded here (a Slice's ends read from a shape in this
        partition; the IR knows only initializers, pnm's decoder's mask slice was lost so)."""
        value = present(node, index)
        if value is None:
            return None
        found = self.values.get(value.name or "")
        if found is None:
            return None if value.const_value is None else [int(v) for v in value.const_value.numpy().reshape(-1)]
        return None if found.const is None else [int(v) for v in np.asarray(found.const).reshape(-1)]

    def axes(self, node: ir.Node, input_from: int) -> list[int] | None:
        """The ``axes`` of a reduce/squeeze-like node: an attribute before opset ``input_from``, input 1 since."""
        return attr_ints(node, "axes") if opset_of(node) < input_from else self.ints(node, 1)

    def fresh(self, hint: str) -> str:
        self.counter += 1
        return f"_{hint}{self.counter}"

    def const(self, array: np.ndarray | np.floating, hint: str = "const") -> g.Tensor:
        array = np.asarray(array, dtype=np.float32)
        return g.Tensor(self.fresh(hint), tuple(array.shape), const=array)

    def folded(self, array: np.ndarray) -> g.Tensor:
        """A constant computed at compile time, its dtype kept (shape arithmetic is int64)."""
        array = _widened(np.asarray(array))
        return g.Tensor(self.fresh("folded"), tuple(array.shape), const=array)

    def per_channel(self, values: np.ndarray, rank: int, native: bool) -> g.Tensor:
        """A ``[C]`` constant that broadcasts over the channel axis of an NCHW (or native NHWC) tensor."""
        shape = (len(values),) if native else (len(values), *([1] * (rank - 2)))
        return self.const(values.reshape(shape))

    def new(self, shape: tuple[int, ...], hint: str = "t") -> g.Tensor:
        return g.Tensor(self.fresh(hint), tuple(int(d) for d in shape))

    def bind(self, value: ir.Value, tensor: g.Tensor) -> None:
        self.values[value.name or ""] = tensor

    # -- building blocks -----------------------------------------------------------------
    def elementwise(self, kind: str, inputs: list[g.Tensor], params: tuple[float, ...] = ()) -> g.Tensor:
        if all(t.const is not None for t in inputs) and kind in _FOLD:
            return self.const(_FOLD[kind](*[t.const for t in inputs]))  # type: ignore[misc]
        shape = np.broadcast_shapes(*[t.shape for t in inputs])
        out = self.new(shape)
        self.ops.append(g.Elementwise(list(inputs), out, kind=kind, params=params))
        return out

    def broadcast_to(self, x: g.Tensor, shape: tuple[int, ...]) -> g.Tensor:
        return self.elementwise("add", [x, self.const(np.zeros(shape, np.float32))])

    def view(self, x: g.Tensor, shape: tuple[int, ...]) -> g.Tensor:
        if math.prod(shape) != x.size:
            raise LoweringError(f"cannot view {x.shape} as {shape}")
        if x.const is not None:
            return self.const(x.const.reshape(shape))
        out = self.new(shape)
        self.ops.append(g.View([x], out))
        return out
