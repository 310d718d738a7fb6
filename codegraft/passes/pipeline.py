"""The common passes run on every model before partitioning, each one switchable.

NOTE: we write none of these passes; onnx-ir (CSE, dead code, Identity removal, shape
inference) and onnxscript (constant folding, no-op rewrite rules) already have them.  This
module only chooses the order, caps what folding may store, and records what each pass
changed so the compile report can say "fold_constants: 212 -> 180 nodes, 12 constants".
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, fields, replace

import numpy as np
import onnx_ir as ir
from onnx_ir.passes import common as ir_passes
from onnxscript import optimizer
from onnxscript.rewriter import RewriteRuleSet
from onnxscript.rewriter.rules import common as rewrite_rules

from codegraft.passes import _output_fence

__all__ = ["PASS_NAMES", "PassOptions", "PassRecord", "PipelineResult", "run_common_passes"]

# The run order; also the names PassOptions.from_names accepts.
PASS_NAMES: tuple[str, ...] = (
    "shape_inference",
    "identity",
    "fold_constants",
    "cse",
    "dce",
)


@dataclass(frozen=True)
class PassOptions:
    """Which common passes run, and the limits they run under.

    Attributes:
        shape_inference: infer shapes first and again at the end (kept up to date).
        identity: remove Identity nodes and no-ops (``x*1``, ``x+0``, inference Dropout,
            Cast to the same type, Transpose by the identity perm, ...).
        fold_constants: evaluate nodes whose inputs are all constants.
        cse: merge nodes that compute the same thing from the same inputs.
        dce: remove nodes and initializers nothing reads.
        fold_max_elements: a folded tensor larger than this is not stored (unless it
            replaces inputs at least as large), so folding never blows up the model.
        fold_max_input_elements: nodes with a constant input larger than this are not folded
            (folding them would only spend compile time; e.g. transposing a large weight).
    """

    shape_inference: bool = True
    identity: bool = True
    fold_constants: bool = True
    cse: bool = True
    dce: bool = True
    fold_max_elements: int = 1 << 20
    fold_max_input_elements: int = 1 << 20

    @classmethod
    def from_names(cls, names: Iterable[str], **limits: int) -> PassOptions:
        """Only the named passes on, e.g. ``PassOptions.from_names(["cse", "dce"])``."""
        wanted = set(names)
        unknown = wanted - set(PASS_NAMES)
        if unknown:
            raise ValueError(f"unknown pass name(s) {sorted(unknown)}; known: {', '.join(PASS_NAMES)}")
        return cls(**{name: name in wanted for name in PASS_NAMES}, **limits)  # type: ignore[arg-type]

    @classmethod
    def none(cls) -> PassOptions:
        """Every pass off."""
        return cls.from_names(())

    @property
    def enabled(self) -> tuple[str, ...]:
        """Names of the passes that run, in run order."""
        return tuple(name for name in PASS_NAMES if getattr(self, name))

    def without(self, *names: str) -> PassOptions:
        """These options with the named passes switched off."""
        return replace(self, **{name: False for name in names if name in PASS_NAMES})  # type: ignore[arg-type]


@dataclass(frozen=True)
class PassRecord:
    """What one pass changed, for the report."""

    name: str
    nodes_before: int
    nodes_after: int
    constants_folded: int  # constants made by folding that are still in the model after it
    detail: str

    @property
    def nodes_removed(self) -> int:
        """Nodes fewer after the pass (negative if it added some)."""
        return self.nodes_before - self.nodes_after


@dataclass(frozen=True)
class PipelineResult:
    """The model (changed in place) and one record per pass that ran, in order."""

    model: ir.Model = field(repr=False)
    records: tuple[PassRecord, ...]

    @property
    def nodes_removed(self) -> int:
        """Nodes removed by all passes together."""
        return sum(r.nodes_removed for r in self.records)


def run_common_passes(model: ir.Model, options: PassOptions = PassOptions()) -> PipelineResult:
    """Run the enabled common passes on ``model`` in place, in :data:`PASS_NAMES` order.

    Graph input and output names, shapes and types are kept; with ``shape_inference`` on,
    shape inference runs again at the end (when a pass changed the graph) so later stages
    see the shapes of new values.
    """
    records: list[PassRecord] = []
    for name in options.enabled:
        records.append(_run_one(name, model, options))
    changed = any(r.nodes_before != r.nodes_after or r.constants_folded for r in records)
    if options.shape_inference and len(records) > 1 and changed:
        records.append(_run_one("shape_inference", model, options))
    return PipelineResult(model=model, records=tuple(records))


def _run_one(name: str, model: ir.Model, options: PassOptions) -> PassRecord:
    before = _count_nodes(model)
    folded_before = _folded_values(model)
    signature = [(v.name, v.type, v.shape) for v in model.graph.outputs]
    if name == "shape_inference":  # renames nothing, and the fence domain has no schema
        detail = _PASSES[name](model, options)
    else:
        with _output_fence.outputs_fenced(model):
            detail = _PASSES[name](model, options)
    _restore_output_types(model, signature, name)
    folded = len(_folded_values(model) - folded_before)
    return PassRecord(name, before, _count_nodes(model), folded, detail)


def _restore_output_types(
    model: ir.Model,
    signature: list[tuple[str | None, ir.TypeProtocol | None, ir.Shape | None]],
    name: str,
) -> None:
    """Graph outputs keep their names, types and shapes through every pass.

    Passes that merge values (CSE, Identity removal) keep the output's name but may hand it
    a value whose type was never inferred; the declared type must survive for the caller.
    """
    outputs = model.graph.outputs
    names = [v.name for v in outputs]
    if names != [n for n, _, _ in signature]:
        raise RuntimeError(f"pass {name} changed the graph outputs {[n for n, _, _ in signature]} to {names}")
    for value, (_, type_, shape) in zip(outputs, signature, strict=True):
        if value.type is None:
            value.type = type_
        if value.shape is None:
            value.shape = shape


# --- the passes: each calls the library and says in a few words what happened ---------------


def _shape_inference(model: ir.Model, options: PassOptions) -> str:
    strings = [name for name, v in model.graph.initializers.items() if v.dtype == ir.DataType.STRING]
    if strings:  # onnx-ir cannot size a string tensor: it fails midway, leaving them as graph inputs
        return f"skipped: string initializer {strings[0]!r} (import-time shapes kept)"
    inputs = list(model.graph.inputs)
    # strict_mode off: one op without a shape function must not stop the rest
    ir_passes.ShapeInferencePass(strict_mode=False)(model)
    if list(model.graph.inputs) != inputs:  # a failure inside onnx-ir must not add graph inputs
        model.graph.inputs.clear()
        model.graph.inputs.extend(inputs)
    values = [v for node in model.graph for v in node.outputs]
    known = sum(1 for v in values if v.shape is not None)
    return f"shapes known for {known} of {len(values)} values"


def _identity(model: ir.Model, options: PassOptions) -> str:
    identities = sum(1 for n in model.graph if n.op_type == "Identity" and n.domain == "")
    ir_passes.IdentityEliminationPass()(model)
    # no-ops become Identity nodes (x*1 -> Identity(x)); eliminate those too
    no_ops = _NO_OP_RULES.apply_to_model(model)
    ir_passes.IdentityEliminationPass()(model)
    return f"{identities} Identity nodes and {no_ops} no-ops considered"


# x*1, x+0, x-0, x/1, inference Dropout, Cast to the same type, Expand to the same shape,
# Transpose by the identity perm.
_NO_OP_RULES = RewriteRuleSet(
    [
        *rewrite_rules.mul_by_1_rule.commute(),
        *rewrite_rules.add_0_rule.commute(),
        rewrite_rules.sub_0_rule,
        rewrite_rules.div_by_1_rule,
        rewrite_rules.dropout_zero_rule,
        rewrite_rules.dropout_inference_rule,
        rewrite_rules.no_op_cast_rule,
        rewrite_rules.no_op_expand_rule,
        rewrite_rules.no_op_transpose_rule,
    ]
)


def _fold_constants(model: ir.Model, options: PassOptions) -> str:
    before = _folded_values(model)
    optimizer.fold_constants(
        model,
        # shapes were inferred for the whole graph already; per-node inference costs ~3x
        onnx_shape_inference=False,
        input_size_limit=options.fold_max_input_elements,
        output_size_limit=options.fold_max_elements,
    )
    filled = _materialize_constant_of_shape(model, options.fold_max_elements)
    folded = len(_folded_values(model) - before)
    return (
        f"{folded} values folded into constants, {filled} ConstantOfShape fills materialised "
        f"(none over {options.fold_max_elements} elements)"
    )


def _materialize_constant_of_shape(model: ir.Model, max_elements: int) -> int:
    """Turn ``ConstantOfShape`` of a constant shape into an initializer.

    onnxscript's folder keeps ConstantOfShape on purpose (a fill is smaller than its
    result), but a backend needs a weight computed that way as a constant to pack or fuse it
    (the onnx wheel's light models compute every weight so).  Fills up to ``max_elements``
    become initializers; graph outputs keep their producer so output names stay put.
    """
    graph = model.graph
    count = 0
    for node in list(graph):
        if node.op_type != "ConstantOfShape" or node.domain not in ("", "ai.onnx"):
            continue
        shape_value, output = node.inputs[0], node.outputs[0]
        if shape_value is None or shape_value.const_value is None or output.is_graph_output():
            continue
        shape = [int(d) for d in shape_value.const_value.numpy().reshape(-1)]
        if int(np.prod(shape, dtype=np.int64)) > max_elements:
            continue
        fill = node.attributes.get("value")
        scalar = fill.as_tensor().numpy().reshape(-1)[:1] if fill is not None else np.zeros(1, np.float32)
        array = np.full(shape, scalar[0], dtype=scalar.dtype)
        name = output.name
        output.name = None  # the initializer takes over the name
        constant = ir.Value(
            name=name,
            shape=ir.Shape(shape),
            type=ir.TensorType(ir.DataType.from_numpy(array.dtype)),
            const_value=ir.tensor(array, name=name),
        )
        output.replace_all_uses_with(constant)
        graph.remove(node, safe=True)
        graph.register_initializer(constant)
        count += 1
    return count


def _cse(model: ir.Model, options: PassOptions) -> str:
    before = _count_nodes(model)
    ir_passes.CommonSubexpressionEliminationPass()(model)
    return f"merged {before - _count_nodes(model)} duplicate nodes"


def _dce(model: ir.Model, options: PassOptions) -> str:
    initializers, nodes = len(model.graph.initializers), _count_nodes(model)
    ir_passes.RemoveUnusedNodesPass()(model)
    ir_passes.RemoveUnusedOpsetsPass()(model)
    removed = initializers - len(model.graph.initializers)
    return f"removed {nodes - _count_nodes(model)} unused nodes, {removed} unused initializers"


_PASSES = {
    "shape_inference": _shape_inference,
    "identity": _identity,
    "fold_constants": _fold_constants,
    "cse": _cse,
    "dce": _dce,
}
assert tuple(_PASSES) == PASS_NAMES
assert {f.name for f in fields(PassOptions)} >= set(PASS_NAMES)


def _count_nodes(model: ir.Model) -> int:
    return sum(1 for _ in ir.traversal.RecursiveGraphIterator(model.graph))


def _folded_values(model: ir.Model) -> set[ir.Value]:
    """Constants that constant folding made (it tags them with where they came from)."""
    found = {v for v in model.graph.initializers.values() if optimizer.FOLDED_FROM_KEY in v.meta}
    for node in model.graph:
        if node.op_type == "Constant":
            found |= {v for v in node.outputs if optimizer.FOLDED_FROM_KEY in v.meta}
    return found
