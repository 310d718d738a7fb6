"""Plan: who runs each node, and the cycle-free partitions that follow, before anything compiles.

In: the optimised ``onnx_ir.Model`` and the target backends in order of preference.  Out: an
:class:`~codegraft.plan.annotate.Annotation` (every node's units, the backends that accept it
and why the others decline) and a :class:`~codegraft.plan.extract.Plan` (each partition's nodes,
inputs, outputs and constants, each extractable as a standalone ONNX model, or all together as
one ONNX model for Netron).  If/Loop nodes whose bodies a target could take go to codegraft's
own runtime (``control``).  Measured placement (:mod:`codegraft.tune`) may choose otherwise.
"""
