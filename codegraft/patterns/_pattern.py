"""The pattern language: fused groups written the way onnx-ir graphs are built.

NOTE: a pattern is an immutable DAG of small frozen objects - :class:`Var` (a wildcard),
:class:`Const` (an initializer or ``Constant`` output), :class:`OpOutput` (an output of an
:class:`OpPattern`) and :class:`Either` (alternatives; an optional link is ``Either(op,
its input)``).  Objects compare by identity, so using one object twice in a pattern means
"the same graph value/node twice" (layer norm reads ``x`` twice).  Nothing is written onto a
pattern while matching: the matcher (``_match.py``) carries its bindings separately and
returns frozen :class:`~codegraft.patterns.Match` objects.

Example (Conv, optionally a bias Add, optionally Relu or Clip)::

    @pattern
    def conv_relu(op, x, w):
        y = op.Conv(x, w, _name="conv")
        y = op.Add(y, const("bias"), _optional=True)
        return either(op.Relu(y), op.Clip(y, const(optional=True), const(optional=True)), y)
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Literal, overload

import onnx
import onnx_ir as ir

from codegraft.core.support import Support

# A dimension constraint: an int (that size), a str (a symbolic name, or any size where
# the dimension is symbolic) or None (anything).
Dim = int | str | None
# What a check sees: the named captures of one match.
Captures = dict[str, ir.Value | ir.Node]
# A check on a match: Support (yes, or no with a reason) or a plain bool.
PatternCheck = Callable[[Captures], Support | bool]
# A backend's own check on a match of its composite rule: yes, or why not.
CompositeCheck = Callable[[Captures], Support]
# An attribute constraint: the expected value, or a predicate on the value (None if absent
# and without a default in the op's schema).
AttrConstraint = int | float | str | Sequence[int] | Sequence[float] | Callable[[object], bool] | None

# Ops whose two inputs may be swapped without changing the result.
COMMUTATIVE_OPS = frozenset({"Add", "Mul", "Max", "Min", "Sum", "Mean", "And", "Or", "Xor", "Equal"})


@dataclass(frozen=True)
class ValueConstraint:
    """Constraints on one value's element type, rank and shape (None: unconstrained).

    Example: ``ValueConstraint(rank=1)``; ``ValueConstraint(shape=(None, 64, 1, 1))``.
    A value whose type or shape is unknown fails a constraint on it (we cannot prove it).
    """

    dtype: frozenset[ir.DataType] | None = None
    rank: int | None = None
    shape: tuple[Dim, ...] | None = None

    def violation(self, value: ir.Value) -> str | None:
        """Why ``value`` breaks this constraint, or None when it satisfies it."""
        name = value.name or "value"
        if self.dtype is not None and value.dtype not in self.dtype:
            wanted = ", ".join(sorted(d.name.lower() for d in self.dtype))
            return f"{name} has dtype {value.dtype}, expected {wanted}"
        if self.rank is None and self.shape is None:
            return None
        shape = value.shape
        if shape is None:
            return f"{name} has an unknown shape"
        if self.rank is not None and shape.rank() != self.rank:
            return f"{name} has rank {shape.rank()}, expected {self.rank}"
        if self.shape is not None:
            if shape.rank() != len(self.shape):
                return f"{name} has rank {shape.rank()}, expected {len(self.shape)}"
            for axis, (want, got) in enumerate(zip(self.shape, shape.dims, strict=True)):
                if want is None:
                    continue
                if isinstance(want, int) and got != want:
                    return f"{name} has dim {axis} = {got}, expected {want}"
                if isinstance(want, str) and isinstance(got, int):
                    return f"{name} has dim {axis} = {got}, expected symbolic {want!r}"
        return None

    @property
    def is_empty(self) -> bool:
        return self.dtype is None and self.rank is None and self.shape is None


_NO_CONSTRAINT = ValueConstraint()


class ValuePattern:
    """Base of everything that stands for one graph value in a pattern."""

    __slots__ = ()


@dataclass(frozen=True, eq=False)
class Var(ValuePattern):
    """A wildcard: any value (captured under ``name`` when given).

    ``optional=True`` also matches a missing trailing input (e.g. Conv's bias).
    """

    name: str | None = None
    constraint: ValueConstraint = _NO_CONSTRAINT
    optional: bool = False


@dataclass(frozen=True, eq=False)
class Const(ValuePattern):
    """A constant: an initializer, a value with a known ``const_value``, or a ``Constant`` output.

    ``value`` (a number) requires every element to be close to it (``rtol``), e.g. the
    ``1.4142`` of a decomposed GELU.
    """

    name: str | None = None
    constraint: ValueConstraint = _NO_CONSTRAINT
    optional: bool = False
    value: float | None = None
    rtol: float = 1e-3


@dataclass(frozen=True, eq=False)
class OpPattern:
    """One node: its op type (or alternatives), inputs, attribute constraints.

    Built through :data:`op` (``op.Conv(x, w, group=1)``), rarely by hand.  ``name``
    captures the matched node.  ``commutative`` lets a two-input op match with its inputs
    swapped.  A node may have more outputs than ``num_outputs`` (unused optional outputs).
    """

    op_types: frozenset[str]
    inputs: tuple[ValuePattern, ...]
    domain: str = ""
    attributes: tuple[tuple[str, AttrConstraint], ...] = ()
    num_outputs: int = 1
    commutative: bool = False
    name: str | None = None


@dataclass(frozen=True, eq=False)
class OpOutput(ValuePattern):
    """Output ``index`` of an :class:`OpPattern`."""

    op: OpPattern
    index: int = 0
    constraint: ValueConstraint = _NO_CONSTRAINT


@dataclass(frozen=True, eq=False)
class Either(ValuePattern):
    """The first alternative that matches, in order (all are tried on backtracking).

    An optional link is ``Either(op_output, op_input)``: the op, or straight through it.
    """

    alternatives: tuple[ValuePattern, ...]


def _constraint(dtype: object, rank: int | None, shape: Sequence[Dim] | None) -> ValueConstraint:
    if dtype is None:
        dtypes = None
    elif isinstance(dtype, ir.DataType):
        dtypes = frozenset({dtype})
    else:
        assert isinstance(dtype, Collection)
        dtypes = frozenset(dtype)
    return ValueConstraint(dtypes, rank, None if shape is None else tuple(shape))


def var(
    name: str | None = None,
    *,
    dtype: ir.DataType | Collection[ir.DataType] | None = None,
    rank: int | None = None,
    shape: Sequence[Dim] | None = None,
    optional: bool = False,
) -> Var:
    """A wildcard value, optionally constrained.  Example: ``var("x", rank=4)``."""
    return Var(name, _constraint(dtype, rank, shape), optional)


def const(
    name: str | None = None,
    *,
    value: float | None = None,
    dtype: ir.DataType | Collection[ir.DataType] | None = None,
    rank: int | None = None,
    shape: Sequence[Dim] | None = None,
    optional: bool = False,
    rtol: float = 1e-3,
) -> Const:
    """A constant value.  Example: ``const("bias", rank=1)``, ``const(value=0.5)``."""
    return Const(name, _constraint(dtype, rank, shape), optional, value, rtol)


def either(*alternatives: ValuePattern) -> Either:
    """One of several sub-patterns.  Example: ``either(op.Relu(y), op.Sigmoid(y))``."""
    if len(alternatives) < 2:
        raise ValueError("either() needs at least two alternatives")
    return Either(tuple(alternatives))


def optional(pattern: ValuePattern, *, otherwise: ValuePattern | None = None) -> Either:
    """``pattern``, or skip it: the value is then ``otherwise`` (default: the op's first input).

    Example: ``optional(either(op.Div(s, const()), op.Mul(s, const())), otherwise=s)``.
    """
    if otherwise is None:
        if not isinstance(pattern, OpOutput) or not pattern.op.inputs:
            raise ValueError("optional(): give otherwise= unless the pattern is an op output")
        otherwise = pattern.op.inputs[0]
    return Either((pattern, otherwise))


class _OpFactory:
    """``op.Conv`` / ``op.any("Relu", "Clip")``: call it with inputs to get an op pattern."""

    __slots__ = ("_op_types",)

    def __init__(self, op_types: frozenset[str]) -> None:
        self._op_types = op_types

    @overload
    def __call__(
        self,
        *inputs: ValuePattern | float | None,
        _name: str | None = None,
        _domain: str = "",
        _outputs: Literal[1] = 1,
        _commute: bool | None = None,
        _optional: bool = False,
        _dtype: ir.DataType | Collection[ir.DataType] | None = None,
        _rank: int | None = None,
        _shape: Sequence[Dim] | None = None,
        **attributes: AttrConstraint,
    ) -> ValuePattern: ...

    @overload
    def __call__(
        self,
        *inputs: ValuePattern | float | None,
        _name: str | None = None,
        _domain: str = "",
        _outputs: int,
        _commute: bool | None = None,
        _optional: bool = False,
        _dtype: ir.DataType | Collection[ir.DataType] | None = None,
        _rank: int | None = None,
        _shape: Sequence[Dim] | None = None,
        **attributes: AttrConstraint,
    ) -> ValuePattern | tuple[OpOutput, ...]: ...

    def __call__(
        self,
        *inputs: ValuePattern | float | None,
        _name: str | None = None,
        _domain: str = "",
        _outputs: int = 1,
        _commute: bool | None = None,
        _optional: bool = False,
        _dtype: ir.DataType | Collection[ir.DataType] | None = None,
        _rank: int | None = None,
        _shape: Sequence[Dim] | None = None,
        **attributes: AttrConstraint,
    ) -> ValuePattern | tuple[OpOutput, ...]:
        """Inputs are value patterns (a number means ``const(value=number)``, None an absent input).

        ``_optional=True`` makes the op skippable (the value then is the first input);
        ``_outputs=n`` returns a tuple of n outputs; ``_commute`` defaults to True for
        Add, Mul and other commutative ops; other keywords constrain attributes.
        """
        pats = tuple(_as_value_pattern(i) for i in inputs)
        commutative = _commute if _commute is not None else bool(self._op_types & COMMUTATIVE_OPS)
        node = OpPattern(
            op_types=self._op_types,
            inputs=pats,
            domain="" if _domain == "ai.onnx" else _domain,
            attributes=tuple(sorted(attributes.items())),
            num_outputs=_outputs,
            commutative=commutative and len(pats) == 2,
            name=_name,
        )
        constraint = _constraint(_dtype, _rank, _shape)
        outs = tuple(OpOutput(node, i, constraint) for i in range(_outputs))
        if _optional:
            if _outputs != 1:
                raise ValueError("an optional op must have exactly one output")
            return optional(outs[0])
        return outs[0] if _outputs == 1 else outs


def _as_value_pattern(value: ValuePattern | float | None) -> ValuePattern:
    if isinstance(value, ValuePattern):
        return value
    if value is None:
        # An input that must be absent: only an absent input matches an optional var
        # bound to "nothing"; we express it as a Const that never matches a real value.
        return _ABSENT_ONLY
    if isinstance(value, (int, float)):
        return const(value=float(value))
    raise TypeError(f"a pattern input must be a value pattern, a number or None, not {type(value).__name__}")


_ABSENT_ONLY = Const(optional=True, value=float("nan"))  # NaN never compares close


class OpBuilder:
    """Builds op patterns: ``op.Relu(x)``, ``op.any("Relu", "Clip")(x)``, ``op.Split(x, _outputs=2)``."""

    __slots__ = ()

    def __getattr__(self, op_type: str) -> _OpFactory:
        if op_type.startswith("_"):
            raise AttributeError(op_type)
        return _OpFactory(frozenset({op_type}))

    def any(self, *op_types: str) -> _OpFactory:
        """Any of these op types, with the same inputs.  Example: ``op.any("Relu", "Sigmoid")(y)``."""
        if not op_types:
            raise ValueError("op.any() needs at least one op type")
        return _OpFactory(frozenset(op_types))


op = OpBuilder()


@dataclass(frozen=True, eq=False)
class Pattern:
    """A named fused group: one or more output value patterns and an optional check.

    The first output is where matching starts (it must be produced by an op); further
    outputs must share a value or node with it.  ``check`` receives the captures and
    returns :class:`~codegraft.backend.Support` (or a bool).

    Example::

        x = var("x")
        p = Pattern("add_relu", op.Relu(op.Add(x, var("y")), _name="relu"))
    """

    name: str
    outputs: tuple[ValuePattern, ...]
    check: PatternCheck | None = None
    anchors: frozenset[str] = field(init=False, repr=False)

    def __init__(
        self,
        name: str,
        outputs: ValuePattern | Sequence[ValuePattern],
        check: PatternCheck | None = None,
    ) -> None:
        outs = (outputs,) if isinstance(outputs, ValuePattern) else tuple(outputs)
        if not outs:
            raise ValueError(f"pattern {name!r} has no outputs")
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "outputs", outs)
        object.__setattr__(self, "check", check)
        for i, out in enumerate(outs):
            if root_op_types(out) is None:
                raise ValueError(f"pattern {name!r}: output {i} may be a bare wildcard; it must come from an op")
        first = set(map(id, walk(outs[0])))
        for i, out in enumerate(outs[1:], start=1):
            if not first & set(map(id, walk(out))):
                raise ValueError(f"pattern {name!r}: output {i} shares nothing with output 0")
        anchors = root_op_types(outs[0])
        assert anchors is not None
        object.__setattr__(self, "anchors", anchors)

    def rule(self, check: CompositeCheck | None = None, *, name: str | None = None) -> CompositeRule:
        """This pattern as a backend's composite rule.  Example: ``CONV_BIAS_ACT.rule(my_check)``."""
        return CompositeRule(name or self.name, self, check)

    def describe(self) -> str:
        """The pattern as one line of text, e.g. ``Relu?(Add(Conv(x, w), const bias))``.

        ``Op?`` is an optional op, ``(a | b)`` alternatives, ``Relu|Clip`` op alternatives.
        """
        seen: set[int] = set()
        return ", ".join(_describe(out, seen) for out in self.outputs)

    def __repr__(self) -> str:
        return f"Pattern({self.name!r}: {self.describe()})"

    def capture_names(self) -> frozenset[str]:
        """Every capture name the pattern may bind (some only in some alternatives)."""
        names: set[str] = set()
        for p in walk(*self.outputs):
            if isinstance(p, (Var, Const)) and p.name:
                names.add(p.name)
            elif isinstance(p, OpOutput) and p.op.name:
                names.add(p.op.name)
        return frozenset(names)


@dataclass(frozen=True)
class CompositeRule:
    """A fused group a backend wants whole: ``(name, pattern, check)``, in priority order.

    Example: ``CompositeRule("conv_relu", CONV_RELU, lambda c: Support.yes())``, or
    ``CONV_RELU.rule(check)``.
    """

    name: str
    pattern: Pattern
    check: CompositeCheck | None = None


def pattern(
    fn: Callable[..., ValuePattern | Sequence[ValuePattern]] | None = None,
    *,
    name: str | None = None,
    check: PatternCheck | None = None,
) -> Pattern | Callable[[Callable[..., ValuePattern | Sequence[ValuePattern]]], Pattern]:
    """Build a :class:`Pattern` from a function: the first parameter is :data:`op`, the
    others become wildcards named after them.

    Example::

        @pattern
        def gelu_bias(op, x, b):
            return op.Gelu(op.Add(x, b), _domain="com.microsoft")
    """

    def build(f: Callable[..., ValuePattern | Sequence[ValuePattern]]) -> Pattern:
        params = list(inspect.signature(f).parameters)[1:]
        out = f(op, *(var(p) for p in params))
        return Pattern(name or f.__name__, out, check)

    return build if fn is None else build(fn)


def _describe(p: ValuePattern, seen: set[int]) -> str:
    """Text of ``p``; a named op met a second time (a shared sub-pattern) prints as ``@name``."""
    if isinstance(p, Var):
        return (p.name or "_") + ("?" if p.optional else "")
    if isinstance(p, Const):
        text = "const" + (f" {p.name}" if p.name else "") + (f"={p.value:g}" if p.value is not None else "")
        return text + ("?" if p.optional else "")
    if isinstance(p, OpOutput):
        if p.op.name and id(p.op) in seen:
            return f"@{p.op.name}"
        seen.add(id(p.op))
        ops = "|".join(sorted(p.op.op_types))
        domain = f"{p.op.domain}." if p.op.domain else ""
        index = f"[{p.index}]" if p.op.num_outputs > 1 else ""
        label = f"@{p.op.name}=" if p.op.name else ""
        return f"{label}{domain}{ops}({', '.join(_describe(i, seen) for i in p.op.inputs)}){index}"
    if isinstance(p, Either):
        alts = p.alternatives
        # optional(op) is Either(op output, its first input): print it as "Op?(...)".
        if len(alts) == 2 and isinstance(alts[0], OpOutput) and alts[0].op.inputs[:1] == (alts[1],):
            head, _, rest = _describe(alts[0], seen).partition("(")
            return f"{head}?({rest}"
        return "(" + " | ".join(_describe(a, seen) for a in alts) + ")"
    return type(p).__name__


def walk(*roots: ValuePattern) -> Iterator[ValuePattern]:
    """Every value pattern reachable from ``roots``, each once (identity)."""
    seen: set[int] = set()
    stack = list(roots)
    while stack:
        p = stack.pop()
        if id(p) in seen:
            continue
        seen.add(id(p))
        yield p
        if isinstance(p, OpOutput):
            stack.extend(p.op.inputs)
        elif isinstance(p, Either):
            stack.extend(p.alternatives)


def root_op_types(p: ValuePattern) -> frozenset[str] | None:
    """The op types that can produce a value matching ``p``; None if a leaf could."""
    if isinstance(p, OpOutput):
        return p.op.op_types
    if isinstance(p, Either):
        out: set[str] = set()
        for alt in p.alternatives:
            types = root_op_types(alt)
            if types is None:
                return None
            out |= types
        return frozenset(out)
    return None


@lru_cache(maxsize=4096)
def attribute_default(op_type: str, domain: str, name: str) -> object:
    """The schema default of an attribute (None if there is none or the op is unknown)."""
    try:
        schema = onnx.defs.get_schema(op_type, domain)
    except onnx.defs.SchemaError:
        return None
    attr = schema.attributes.get(name)
    if attr is None or not attr.default_value.name:
        return None
    value = onnx.helper.get_attribute_value(attr.default_value)
    return value.decode() if isinstance(value, bytes) else value


__all__ = [
    "CompositeCheck",
    "CompositeRule",
    "COMMUTATIVE_OPS",
    "AttrConstraint",
    "Captures",
    "Const",
    "Either",
    "OpBuilder",
    "OpOutput",
    "OpPattern",
    "Pattern",
    "PatternCheck",
    "ValueConstraint",
    "ValuePattern",
    "Var",
    "const",
    "either",
    "op",
    "optional",
    "pattern",
    "var",
]
