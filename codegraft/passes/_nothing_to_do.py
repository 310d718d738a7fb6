"""Cheap proofs that a common pass has nothing to do, so the pipeline can skip calling it.

NOTE: the library passes cost time in proportion to the graph even when they change
nothing: onnxscript's rewriter tries every rule on every node (11 no-op rules on a 100k-node
graph are 1.1M match attempts), the constant folder visits every node, onnx-ir's dead-code
pass looks up an ONNX schema per node.  On the graphs that matter for compile time (exported
models with tens of thousands of nodes) they usually have nothing to do.  Each function here
is one linear scan that answers "could this pass change anything?" *conservatively*: it may
say yes when the pass ends up doing nothing (the pass then runs as before), never no when the
pass would have changed something, so the model after the pipeline is the same either way.

The scans apply only where :func:`can_prove` says so (no subgraphs, no local functions);
the pipeline runs every pass on other models, as the passes walk those in their own ways.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import onnx_ir as ir

from codegraft.core.graphinfo import is_flat

__all__ = [
    "NoOpRule",
    "can_prove",
    "may_eliminate_common_subexpressions",
    "may_fold",
    "may_remove_unused",
    "no_op_candidates",
    "shapes_complete",
]

_ONNX_DOMAINS = ("", "ai.onnx")


def can_prove(model: ir.Model) -> bool:
    """Whether the scans below apply: the model is flat and lists each output value once.

    Flat: no subgraphs and no local functions, every node is in ``model.graph`` itself (passes
    never add either, so a flat model stays flat through the pipeline).  An output value
    listed twice gets an Identity from the pipeline's output fence whether a pass changes
    anything or not, so skipping a pass would change the result there.
    """
    outputs = model.graph.outputs
    return len(set(outputs)) == len(outputs) and is_flat(model)


def shapes_complete(model: ir.Model) -> bool:
    """Every value of a model that passed :func:`can_prove` has a dtype and a static shape: inference cannot add any.

    A symbolic or unknown dimension counts as incomplete, since onnx's data propagation may
    still resolve it.
    """
    graph = model.graph
    values: Iterable[ir.Value] = (*graph.inputs, *graph.initializers.values())
    if not all(_known(v) for v in values):
        return False
    return all(_known(v) for node in graph for v in node.outputs)


def _known(value: ir.Value) -> bool:
    shape = value.shape
    return value.dtype is not None and shape is not None and shape.is_static()


@dataclass(frozen=True)
class NoOpRule:
    """Rewrite rules that can only fire on ``op_type`` nodes of the default domain.

    ``needs_constant``: the rule only matches when one of the node's inputs is a constant
    (``x * 1``, ``x + 0``); a graph whose Adds and Muls all have computed operands has
    nothing for it.
    """

    op_type: str
    needs_constant: bool
    rules: tuple[object, ...]


def no_op_candidates(model: ir.Model, table: Iterable[NoOpRule]) -> tuple[bool, set[str]]:
    """``(any Identity node, op types some no-op rule could fire on)`` (after :func:`can_prove`).

    A ``Constant`` node anywhere counts as a candidate for every rule: the rewriter marks
    Constant outputs as constants before matching, and that marking must happen as before.
    """
    table = tuple(table)
    wanted = {entry.op_type: entry.needs_constant for entry in table}
    identity = False
    found: set[str] = set()
    for node in model.graph:
        if node.domain not in _ONNX_DOMAINS:
            continue
        op = node.op_type
        if op == "Identity":
            identity = True
        elif op == "Constant":
            found.update(wanted)
        elif op in wanted and (not wanted[op] or any(_constant(v) for v in node.inputs)):
            found.add(op)
    return identity, found


def _constant(value: ir.Value | None) -> bool:
    if value is None:
        return False
    if value.const_value is not None:
        return True
    producer = value.producer()
    return producer is not None and producer.op_type == "Constant"


def may_fold(model: ir.Model) -> bool:
    """Whether onnxscript's constant folder could change a model that passed :func:`can_prove`.

    It folds nodes whose inputs are all constants, and runs a partial evaluator on a few op
    types (Shape, Reshape, Cast, Identity, ...; its own registry says which).  ``Add``'s
    evaluator only adds up shape values, which come from constants or from other evaluated
    nodes, so an Add of two computed tensors is no candidate.
    """
    evaluated = _partial_evaluator_ops()
    if evaluated is None:
        return True
    for node in model.graph:
        key = (node.domain, node.op_type)
        inputs = [v for v in node.inputs if v is not None]
        if node.op_type == "Constant" or all(v.const_value is not None for v in inputs):
            return True
        if key not in evaluated:
            continue
        if node.op_type != "Add" or node.domain not in _ONNX_DOMAINS:
            return True
        for value in inputs:
            producer = value.producer()
            if value.const_value is not None or (
                producer is not None and (producer.domain, producer.op_type) in evaluated
            ):
                return True
    return False


def _partial_evaluator_ops() -> frozenset[tuple[str, str]] | None:
    """The ops onnxscript's folder evaluates partially, or ``None`` if its registry moved."""
    try:
        from onnxscript.optimizer._constant_folding import registry
    except ImportError:
        return None
    evaluators = getattr(registry, "op_evaluators", None)
    return frozenset(evaluators) if isinstance(evaluators, dict) else None


def may_eliminate_common_subexpressions(model: ir.Model) -> bool:
    """Whether two nodes of a model that passed :func:`can_prove` share op, output count and input values.

    That is the necessary part of onnx-ir's CSE key (it also compares attributes), without
    hashing any attribute.
    """
    seen: set[tuple[object, ...]] = set()
    for node in model.graph:
        key = (node.domain, node.op_type, node.overload, len(node.outputs), *map(id, node.inputs))
        if key in seen:
            return True
        seen.add(key)
    return False


def may_remove_unused(model: ir.Model) -> bool:
    """Whether onnx-ir's dead-code and unused-opset passes could change a model that passed :func:`can_prove`.

    They remove nodes with no used output, unused initializers and opset imports no node
    uses, trim trailing omitted inputs and unused optional outputs, and drop a
    BatchNormalization's ``training_mode`` attribute: a node with any unused output, a
    trailing omitted input or a ``training_mode`` is a candidate.
    """
    graph = model.graph
    outputs = set(graph.outputs)
    inputs = set(graph.inputs)
    domains = {""}
    for node in graph:
        domains.add(node.domain)
        if node.inputs and node.inputs[-1] is None:
            return True
        if node.op_type == "BatchNormalization" and "training_mode" in node.attributes:
            return True
        for value in node.outputs:
            if not value.uses() and value not in outputs:
                return True
    for value in graph.initializers.values():
        if not value.uses() and value not in outputs and value not in inputs:
            return True
    return not set(model.opset_imports) <= domains
