"""Patterns: fused groups a backend wants whole, the matcher that finds them, a library.

A vendor writes a pattern with the op builder, the way onnx-ir graphs are built, and lists it
in ``Backend.patterns()`` as a :class:`~codegraft.backend.CompositeRule`::

    from codegraft.patterns import const, either, op, pattern, library

    @pattern
    def conv_relu(op, x, w):
        y = op.Conv(x, w, _name="conv")
        y = op.Add(y, const("bias"), _optional=True)   # optional link
        return op.any("Relu", "Clip")(y, _name="act")

    class MyBackend:
        def patterns(self):
            return [conv_relu.rule(check=lambda c: Support.yes()), library.ATTENTION.rule()]

The core calls :func:`find_composites` (matches and declines) and
:func:`quantized_units`; see their docstrings.
"""

from codegraft.patterns import library
from codegraft.patterns._match import (
    Decline,
    Match,
    MatchResult,
    all_matches,
    constant_array,
    find_composites,
)
from codegraft.patterns._pattern import (
    Const,
    Either,
    OpOutput,
    OpPattern,
    Pattern,
    PatternCheck,
    ValueConstraint,
    ValuePattern,
    Var,
    const,
    either,
    op,
    optional,
    pattern,
    var,
)
from codegraft.patterns._quant import quantized_units

__all__ = [
    "Const",
    "Decline",
    "Either",
    "Match",
    "MatchResult",
    "OpOutput",
    "OpPattern",
    "Pattern",
    "PatternCheck",
    "ValueConstraint",
    "ValuePattern",
    "Var",
    "all_matches",
    "const",
    "constant_array",
    "either",
    "find_composites",
    "library",
    "op",
    "optional",
    "pattern",
    "quantized_units",
    "var",
]
