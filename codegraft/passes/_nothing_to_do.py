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
The answers for all passes come from one walk (:func:`scan`), taken again only after a pass
changed the model: a graph walk in Python costs about the same whatever it looks at.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import onnx_ir as ir

from codegraft.core.graphinfo import is_flat

__all__ = ["Facts", "NoOpRule", "can_prove", "scan"]

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


@dataclass(frozen=True)
class NoOpRule:
    """Rewrite rules that can only fire on ``op_type`` nodes of the default domain.

    ``needs_constant``: the rule only matches when one of the node's inputs is a constant
    (``x * 1``, ``x + 0``); a graph whose Adds and Muls all have computed operands has
    nothing for it.
    """

    op_type: str
    needs_constant: bool
    rules: tuple[str, ...]  # names in onnxscript.rewriter.rules.common, imported when a pass runs
    commute: bool = False  # the rules and their operand-swapped forms (``x * 1`` and ``1 * x``)


@dataclass(frozen=True)
class Facts:
    """What one walk of a model that passed :func:`can_prove` says each pass could do.

    Attributes:
        shapes_complete: every value has a dtype and a static shape, so shape inference
            cannot add any (a symbolic or unknown dimension counts as incomplete, since
            onnx's data propagation may still resolve it).
        values, shapes_known: node outputs, and how many of them have a shape.
        identity: an Identity node is there (onnx-ir's Identity elimination has work).
        no_op_ops: op types some no-op rule of the table could fire on.  A ``Constant`` node
            anywhere counts for every rule: the rewriter marks Constant outputs as constants
            before matching, and that marking must happen as before.
        may_fold: onnxscript's constant folder could change something.  It folds nodes whose
            inputs are all constants, and runs a partial evaluator on a few op types (Shape,
            Reshape, Cast, Identity, ...; its own registry says which).  ``Add``'s evaluator
            only adds up shape values, which come from constants or from other evaluated
            nodes, so an Add of two computed tensors is no candidate.
        batchnorm: a BatchNormalization is there to fold.
        may_eliminate_common_subexpressions: two nodes share op, output count and input
            values: the necessary part of onnx-ir's CSE key (it also compares attributes).
        may_remove_unused: onnx-ir's dead-code and unused-opset passes could change
            something.  They remove nodes with no used output, unused initializers and opset
            imports no node uses, trim trailing omitted inputs and unused optional outputs,
            and drop a BatchNormalization's ``training_mode`` attribute: a node with any
            unused output, a trailing omitted input or a ``training_mode`` is a candidate.
    """

    shapes_complete: bool
    values: int
    shapes_known: int
    identity: bool
    no_op_ops: frozenset[str]
    may_fold: bool
    batchnorm: bool
    may_eliminate_common_subexpressions: bool
    may_remove_unused: bool


def scan(model: ir.Model, no_op_table: Iterable[NoOpRule]) -> Facts:
    """One walk over a model that passed :func:`can_prove`; see :class:`Facts`."""
    graph = model.graph
    wanted = {entry.op_type: entry.needs_constant for entry in no_op_table}
    evaluated = _partial_evaluator_ops()
    outputs = set(graph.outputs)
    static: dict[int, bool] = {}  # by id(shape): values of one type share their shape object

    def known(value: ir.Value) -> bool:
        shape = value.shape
        if value.dtype is None or shape is None:
            return False
        answer = static.get(id(shape))
        if answer is None:
            answer = static[id(shape)] = shape.is_static()
        return answer

    complete = all(known(v) for v in (*graph.inputs, *graph.initializers.values()))
    values = shapes_known = 0
    identity = batchnorm = unused = common = False
    fold = evaluated is None
    no_ops: set[str] = set()
    seen: set[tuple[object, ...]] = set()
    domains = {""}
    for node in graph:
        domain, op, inputs, node_outputs = node.domain, node.op_type, node.inputs, node.outputs
        for value in node_outputs:
            values += 1
            shape = value.shape
            if shape is not None:
                shapes_known += 1
                if complete:  # known(value), inlined: this loop visits every value
                    answer = static.get(id(shape))
                    if answer is None:
                        answer = static[id(shape)] = shape.is_static()
                    complete = answer and value.dtype is not None
            else:
                complete = False
            if not unused and not value.uses() and value not in outputs:
                unused = True
        onnx_domain = domain in _ONNX_DOMAINS
        if onnx_domain:
            if op == "Identity":
                identity = True
            elif op == "Constant":
                no_ops.update(wanted)
            elif op in wanted and op not in no_ops and (not wanted[op] or any(_constant(v) for v in inputs)):
                no_ops.add(op)
        if not fold:
            for read in inputs:  # (the common case, a computed first input, decides at once)
                if read is not None and read.const_value is None:
                    fold = op == "Constant" or _may_fold_node(op, domain, inputs, evaluated)  # type: ignore[arg-type]
                    break
            else:
                fold = True  # every input a constant: the folder evaluates the node
        if op == "BatchNormalization":
            batchnorm = True
            if "training_mode" in node.attributes:
                unused = True
        if not common:
            key = (domain, op, node.overload, len(node_outputs), *map(id, inputs))
            common = key in seen
            seen.add(key)
        domains.add(domain)
        if inputs and inputs[-1] is None:
            unused = True
    if not unused:
        inputs_ = set(graph.inputs)
        unused = any(not v.uses() and v not in outputs and v not in inputs_ for v in graph.initializers.values())
        unused = unused or not set(model.opset_imports) <= domains
    return Facts(complete, values, shapes_known, identity, frozenset(no_ops), fold, batchnorm, common, unused)


def _may_fold_node(
    op: str, domain: str, inputs: Sequence[ir.Value | None], evaluated: frozenset[tuple[str, str]]
) -> bool:
    """Whether the folder's partial evaluator may change a node with a computed input."""
    if (domain, op) not in evaluated:
        return False
    if op != "Add" or domain not in _ONNX_DOMAINS:
        return True
    for value in inputs:
        if value is None:
            continue
        producer = value.producer()
        if value.const_value is not None or (producer is not None and (producer.domain, producer.op_type) in evaluated):
            return True
    return False


def _constant(value: ir.Value | None) -> bool:
    if value is None:
        return False
    if value.const_value is not None:
        return True
    producer = value.producer()
    return producer is not None and producer.op_type == "Constant"


def _partial_evaluator_ops() -> frozenset[tuple[str, str]] | None:
    """The ops onnxscript's folder evaluates partially, or ``None`` if its registry moved."""
    try:
        from onnxscript.optimizer._constant_folding import registry
    except ImportError:
        return None
    evaluators = getattr(registry, "op_evaluators", None)
    return frozenset(evaluators) if isinstance(evaluators, dict) else None
