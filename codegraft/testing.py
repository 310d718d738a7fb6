"""Helpers for checking a backend against onnxruntime: real models, random weights and feeds.

NOTE: the light models shipped inside the onnx wheel compute every weight with
``ConstantOfShape(0.02)``, so their output does not depend on the input and layout or
indexing bugs pass unseen.  :func:`light_model` swaps those weights for random ones of the
same shapes (scaled by fan-in) and can drop the final Softmax, so numerical comparisons see
real logits.

Example::

    model = light_model("resnet50")            # onnx.ModelProto with random weights
    feeds = random_feeds(model)
    expected = run_onnxruntime(model, feeds)

    for result in check_ops(MyBackend()):      # op-by-op conformance against onnxruntime
        print(result)                           # "Conv 3x3 pad 1 + bias: ok (2.1e-07)" or why not
"""

from __future__ import annotations

import pathlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import onnx
from onnx import helper, numpy_helper

if TYPE_CHECKING:
    from codegraft.backend import Backend

__all__ = [
    "LIGHT_MODELS",
    "OP_CASES",
    "OpCase",
    "OpResult",
    "SubsetBackend",
    "assert_close",
    "check_ops",
    "light_model",
    "light_model_path",
    "op_model",
    "randomize_constant_weights",
    "random_feeds",
    "run_onnxruntime",
    "without_final_softmax",
]

# random_feeds lives in core (one copy, shared with the compiler); it is public here.
from codegraft.core.feeds import random_feeds as random_feeds
from codegraft.core.reference import run_reference

LIGHT_MODELS = (
    "bvlc_alexnet",
    "densenet121",
    "inception_v1",
    "inception_v2",
    "resnet50",
    "shufflenet",
    "squeezenet",
    "vgg19",
    "zfnet512",
)


def light_model_path(name: str) -> pathlib.Path:
    """Path of ``light_<name>.onnx`` inside the installed onnx wheel."""
    root = pathlib.Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
    path = root / f"light_{name}.onnx"
    if not path.exists():
        raise FileNotFoundError(f"{path} not found; known light models: {', '.join(LIGHT_MODELS)}")
    return path


def light_model(name: str, *, seed: int = 0, drop_softmax: bool = True) -> onnx.ModelProto:
    """A light model with random weights of the real shapes; see the module note."""
    model = onnx.load(str(light_model_path(name)))
    return randomize_constant_weights(model, seed=seed, drop_softmax=drop_softmax)


def randomize_constant_weights(
    model: onnx.ModelProto, *, seed: int = 0, drop_softmax: bool = True
) -> onnx.ModelProto:
    """Replace every ``ConstantOfShape`` whose shape is a constant by a random initializer.

    Weights are drawn uniform in ``±sqrt(3/fan_in)`` (unit variance through a layer);
    BatchNormalization variances are made positive.  With ``drop_softmax`` a final
    Softmax feeding a graph output is removed so outputs are logits.
    """
    rng = np.random.default_rng(seed)
    model = onnx.ModelProto.FromString(model.SerializeToString())
    # IR version 4 is the first that lets an initializer not be a graph input.
    model.ir_version = max(model.ir_version, 4)
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    variance_inputs = {n.input[4] for n in graph.node if n.op_type == "BatchNormalization"}
    scale_inputs = {n.input[1] for n in graph.node if n.op_type == "BatchNormalization"}
    kept, new_inits = [], []
    for node in graph.node:
        if node.op_type == "ConstantOfShape" and node.input[0] in inits:
            shape = tuple(int(d) for d in numpy_helper.to_array(inits[node.input[0]]))
            fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
            bound = float(np.sqrt(3.0 / max(fan_in, 1)))
            if node.output[0] in variance_inputs:
                value = rng.uniform(0.5, 1.5, size=shape)
            elif node.output[0] in scale_inputs:
                value = rng.uniform(0.5, 1.5, size=shape)
            elif len(shape) <= 1:
                value = rng.uniform(-0.1, 0.1, size=shape)
            else:
                value = rng.uniform(-bound, bound, size=shape)
            new_inits.append(numpy_helper.from_array(value.astype(np.float32), node.output[0]))
        else:
            kept.append(node)
    used = {i for n in kept for i in n.input}
    del graph.node[:]
    graph.node.extend(kept)
    remaining = [t for t in graph.initializer if t.name in used]
    del graph.initializer[:]
    graph.initializer.extend(remaining + new_inits)
    init_names = {t.name for t in graph.initializer}
    real_inputs = [i for i in graph.input if i.name not in init_names and i.name in used | _outputs(graph)]
    del graph.input[:]
    graph.input.extend(real_inputs)
    if drop_softmax:
        _drop_final_softmax(graph)
    return model


def without_final_softmax(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` whose outputs are the logits a final Softmax took; all else as it was
    (weights, IR version, graph inputs).

    Why: the shipped light models' constant weights make logits of ~1e9 (squeezenet's: 6.8e9),
    equal across classes, where a float32 ulp is hundreds.  Two engines that sum in another
    order differ there by a few ulps, which the softmax turns into another answer (OpenVINO on
    squeezenet: probabilities 0.12 apart); the logits agree to 1e-7.  Compare those::

        >>> shipped = onnx.load(str(light_model_path("squeezenet")))
        >>> [n.op_type for n in without_final_softmax(shipped).graph.node][-1], shipped.ir_version
        ('GlobalAveragePool', 3)
    """
    model = onnx.ModelProto.FromString(model.SerializeToString())
    _drop_final_softmax(model.graph)
    return model


def _outputs(graph: onnx.GraphProto) -> set[str]:
    return {o.name for o in graph.output}


def _drop_final_softmax(graph: onnx.GraphProto) -> None:
    outputs = {o.name: o for o in graph.output}
    for node in list(graph.node):
        if node.op_type == "Softmax" and node.output[0] in outputs:
            out = outputs[node.output[0]]
            graph.node.remove(node)
            # Softmax keeps the shape, so the logits have the output's type.
            new_out = onnx.ValueInfoProto(name=node.input[0])
            new_out.type.CopyFrom(out.type)
            index = list(graph.output).index(out)
            graph.output.remove(out)
            graph.output.insert(index, new_out)


def run_onnxruntime(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Outputs of plain onnxruntime (CPU, all optimisations off) on ``model``: the reference."""
    return run_reference(model, feeds)


def assert_close(
    actual: Mapping[str, np.ndarray],
    expected: Mapping[str, np.ndarray],
    *,
    rtol: float = 1e-4,
    atol: float = 1e-5,
) -> float:
    """Assert two output dicts agree; the tolerance is relative to each output's scale.

    Returns the largest relative error seen (``max|a-e| / max(|e|.max(), 1e-6)``).
    """
    assert set(actual) == set(expected), f"outputs differ: {sorted(actual)} vs {sorted(expected)}"
    worst = 0.0
    for name, want in expected.items():
        got = np.asarray(actual[name])
        assert got.shape == want.shape, f"{name}: shape {got.shape}, expected {want.shape}"
        assert got.dtype == want.dtype, f"{name}: dtype {got.dtype}, expected {want.dtype}"
        if want.size == 0:
            continue
        if not np.issubdtype(want.dtype, np.floating):
            assert np.array_equal(got, want), f"{name}: values differ"
            continue
        scale = max(float(np.max(np.abs(want.astype(np.float64)))), 1e-6)
        err = float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)))) / scale
        worst = max(worst, err)
        assert err <= rtol + atol / scale, f"{name}: relative error {err:.3g} > {rtol:.3g}"
    return worst


class SubsetBackend:
    """A test backend that claims only ``ops`` and runs its partitions with onnxruntime.

    It exercises everything codegraft does around a backend (annotation, partitioning,
    specialisation, fallback, artifacts) without a real accelerator.  ``compiled`` records the
    input shapes of every partition compiled, ``fail_on`` makes compile raise for partitions
    containing that op (to test the host fallback).

    Example::

        exe = codegraft.compile(model, targets=[SubsetBackend("acc", {"Conv", "Relu"})])
    """

    def __init__(
        self,
        name: str,
        ops: set[str] | frozenset[str],
        *,
        dynamic_shapes: bool = True,
        fail_on: str | None = None,
        rules: tuple[object, ...] = (),
    ) -> None:
        from codegraft.backend import Capabilities

        self.name = name
        self.ops = frozenset(ops)
        # It runs on onnxruntime, so it takes whatever precision onnxruntime takes.
        self.capabilities = Capabilities(
            dynamic_shapes=dynamic_shapes, precisions=frozenset({"float32", "float16", "int8"})
        )
        self.fail_on = fail_on
        self.compiled: list[list[tuple[int | str | None, ...]]] = []
        self.rules = tuple(rules)
        self.received_composites: list[object] = []

    def patterns(self):  # type: ignore[no-untyped-def]
        return self.rules

    def supports(self, node):  # type: ignore[no-untyped-def]
        from codegraft.backend import Support

        if node.op_type in self.ops:
            return Support.yes()
        return Support.no(f"{node.op_type} is not in {self.name}'s op set")

    def compile(self, partition):  # type: ignore[no-untyped-def]
        import onnx_ir as ir

        if self.fail_on and any(n.op_type == self.fail_on for n in partition.model.graph):
            raise RuntimeError(f"{self.name} cannot compile {self.fail_on} (simulated failure)")
        self.received_composites.extend(partition.composites)
        self.compiled.append(
            [tuple(d if isinstance(d, int) else str(d) for d in (v.shape or ())) for v in partition.model.graph.inputs]
        )
        return self.name.encode() + b"\0" + ir.to_proto(partition.model).SerializeToString()

    def load(self, blob):  # type: ignore[no-untyped-def]
        from codegraft.backends.onnxruntime import OnnxRuntimeRunnable

        prefix = self.name.encode() + b"\0"
        if not blob.startswith(prefix):
            raise ValueError(f"not a {self.name} blob")
        return OnnxRuntimeRunnable(blob[len(prefix) :], threads=1)


# --- op-by-op conformance: one-node models against onnxruntime ------------------------------


@dataclass(frozen=True)
class OpCase:
    """One single-node test model: an op, its input shapes, constants and attributes.

    ``inputs`` are the graph inputs (random float32 of these shapes); ``constants`` are
    initializers given after them, in order (weights, biases, shapes).  Example:
    ``OpCase("Conv 1x1", "Conv", [(1, 8, 5, 5)], [("w", _rand(4, 8, 1, 1))])``.
    """

    name: str
    op_type: str
    inputs: Sequence[tuple[int, ...]]
    constants: Sequence[tuple[str, np.ndarray]] = ()
    attributes: Mapping[str, object] = field(default_factory=dict)
    opset: int = 17


@dataclass(frozen=True)
class OpResult:
    """How a backend did on one :class:`OpCase`: placed on it or not (why), and the error."""

    case: str
    op_type: str
    placed: bool
    reason: str = ""  # why it was declined, or what went wrong
    error: float | None = None  # relative to the output's scale
    passed: bool = False  # placed and within tolerance

    def __str__(self) -> str:
        if not self.placed:
            return f"{self.case}: declined ({self.reason})"
        if self.error is None:
            return f"{self.case}: FAILED ({self.reason})"
        return f"{self.case}: {'ok' if self.passed else 'WRONG'} ({self.error:.2g})"


def _constant(seed: int, *shape: int, low: float = -1.0, high: float = 1.0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(low, high, size=shape).astype(np.float32)


_X = (1, 8, 9, 9)
OP_CASES: tuple[OpCase, ...] = (
    *(OpCase(op, op, [_X]) for op in ("Relu", "Sigmoid", "Tanh", "Exp", "Neg", "Abs", "Erf", "Softplus")),
    OpCase("LeakyRelu", "LeakyRelu", [_X], attributes={"alpha": 0.1}),
    OpCase("Elu", "Elu", [_X], attributes={"alpha": 0.7}),
    OpCase("HardSigmoid", "HardSigmoid", [_X], attributes={"alpha": 0.25, "beta": 0.4}),
    OpCase("HardSwish", "HardSwish", [_X]),
    OpCase("Clip 0..6", "Clip", [_X], [("lo", np.array(0.0, np.float32)), ("hi", np.array(6.0, np.float32))]),
    OpCase("Sqrt", "Sqrt", [_X]),  # negative inputs: NaN on both sides
    *(OpCase(f"{op} same shape", op, [_X, _X]) for op in ("Add", "Sub", "Mul", "Max", "Min")),
    OpCase("Add per-channel", "Add", [_X], [("b", _constant(1, 1, 8, 1, 1))]),
    OpCase("Mul per-channel", "Mul", [_X], [("s", _constant(2, 1, 8, 1, 1))]),
    OpCase("Div by constant", "Div", [_X], [("d", _constant(3, 1, 8, 1, 1, low=0.5, high=2.0))]),
    OpCase("Conv 3x3 pad 1 + bias", "Conv", [_X], [("w", _constant(4, 16, 8, 3, 3)), ("b", _constant(5, 16))],
           {"pads": [1, 1, 1, 1]}),
    OpCase("Conv 1x1 no bias", "Conv", [_X], [("w", _constant(6, 16, 8, 1, 1))]),
    OpCase("Conv 3x3 stride 2", "Conv", [_X], [("w", _constant(7, 4, 8, 3, 3))], {"strides": [2, 2]}),
    OpCase("Conv depthwise 3x3", "Conv", [_X], [("w", _constant(8, 8, 1, 3, 3))], {"group": 8, "pads": [1, 1, 1, 1]}),
    OpCase("Conv grouped (2 groups)", "Conv", [_X], [("w", _constant(9, 8, 4, 3, 3))], {"group": 2}),
    OpCase("Conv dilated", "Conv", [_X], [("w", _constant(10, 8, 8, 3, 3))], {"dilations": [2, 2]}),
    OpCase("Conv asymmetric pads", "Conv", [_X], [("w", _constant(11, 8, 8, 3, 3))], {"pads": [0, 1, 2, 1]}),
    OpCase("MatMul 2-D", "MatMul", [(4, 32)], [("w", _constant(12, 32, 16))]),
    OpCase("MatMul batched", "MatMul", [(2, 4, 32)], [("w", _constant(13, 32, 16))]),
    OpCase("Gemm transB + bias", "Gemm", [(4, 32)], [("w", _constant(14, 16, 32)), ("b", _constant(15, 16))],
           {"transB": 1}),
    OpCase("MaxPool 3x3 stride 2", "MaxPool", [_X], attributes={"kernel_shape": [3, 3], "strides": [2, 2]}),
    OpCase("MaxPool pad 1", "MaxPool", [_X], attributes={"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
    OpCase("AveragePool 2x2", "AveragePool", [_X], attributes={"kernel_shape": [2, 2], "strides": [2, 2]}),
    OpCase("AveragePool pad, excluded", "AveragePool", [_X], attributes={"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
    OpCase("AveragePool pad, included", "AveragePool", [_X],
           attributes={"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1}),
    OpCase("MaxPool ceil_mode", "MaxPool", [_X],
           attributes={"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1}),
    OpCase("GlobalAveragePool", "GlobalAveragePool", [_X]),
    OpCase("GlobalMaxPool", "GlobalMaxPool", [_X]),
    OpCase("BatchNormalization", "BatchNormalization", [_X],
           [("scale", _constant(16, 8)), ("bias", _constant(17, 8)), ("mean", _constant(18, 8)),
            ("var", _constant(19, 8, low=0.5, high=1.5))], {"epsilon": 1e-3}),
    OpCase("LRN size 5", "LRN", [_X], attributes={"size": 5, "alpha": 1e-3, "beta": 0.75, "bias": 1.0}),
    OpCase("Softmax last axis", "Softmax", [(4, 10)]),
    OpCase("Softmax axis 1", "Softmax", [(2, 6, 5)], attributes={"axis": 1}),
    OpCase("LayerNormalization", "LayerNormalization", [(2, 5, 16)],
           [("g", _constant(20, 16)), ("b", _constant(21, 16))]),
    OpCase("Concat channels", "Concat", [_X, (1, 4, 9, 9)], attributes={"axis": 1}),
    OpCase("Flatten", "Flatten", [_X]),
    OpCase("Reshape", "Reshape", [_X], [("shape", np.array([1, -1], np.int64))]),
    OpCase("Transpose", "Transpose", [_X], attributes={"perm": [0, 2, 3, 1]}),
)
"""The cases :func:`check_ops` runs by default: elementwise, Conv (grouped, dilated,
asymmetric pads), MatMul/Gemm, pools, normalisations, Softmax, data movement."""


def op_model(case: OpCase) -> onnx.ModelProto:
    """The one-node model of ``case`` (inputs ``x0, x1, ...``, output ``y``; shapes inferred)."""
    inputs = [
        helper.make_tensor_value_info(f"x{i}", onnx.TensorProto.FLOAT, list(shape))
        for i, shape in enumerate(case.inputs)
    ]
    initializers = [numpy_helper.from_array(array, name) for name, array in case.constants]
    node = helper.make_node(case.op_type, [v.name for v in inputs] + [t.name for t in initializers], ["y"],
                            name=case.op_type.lower(), **case.attributes)  # type: ignore[arg-type]
    output = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)
    graph = helper.make_graph([node], case.name, inputs, [output], initializer=initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", case.opset)])
    model.ir_version = 8
    return onnx.shape_inference.infer_shapes(model, strict_mode=True)


def check_ops(
    backend: Backend, cases: Sequence[OpCase] = OP_CASES, *, rtol: float = 1e-4
) -> list[OpResult]:
    """Run each case as a one-node model on ``backend`` and compare with onnxruntime.

    A case the backend declines is reported with its reason (not a failure); one it takes
    must match within ``rtol`` relative to the output's scale.  A compile or run failure is
    a failed result, never an exception, so a vendor sees the whole table at once::

        results = check_ops(MyBackend())
        assert all(r.passed for r in results if r.placed), "\n".join(map(str, results))
    """
    import codegraft

    results = []
    for case in cases:
        model = op_model(case)
        feeds = random_feeds(model)
        try:
            exe = codegraft.compile(model, targets=[backend], strict=True, passes=())
            placed = [n for n in exe.report().nodes if n.backend == backend.name]
            if not placed:
                declined = [r for n in exe.report().nodes for b, r in n.declined if b == backend.name]
                results.append(OpResult(case.name, case.op_type, False, "; ".join(declined) or "not placed"))
                continue
            got = exe.run(feeds)
        except Exception as error:  # a conformance table reports failures, it does not stop at one
            results.append(OpResult(case.name, case.op_type, True, f"{type(error).__name__}: {error}"))
            continue
        want = run_onnxruntime(model, feeds)["y"]
        results.append(_compare(case, np.asarray(got["y"]), want, rtol))
    return results


def _compare(case: OpCase, got: np.ndarray, want: np.ndarray, rtol: float) -> OpResult:
    if got.shape != want.shape:
        return OpResult(case.name, case.op_type, True, f"shape {got.shape}, expected {want.shape}")
    if not np.array_equal(np.isnan(got), np.isnan(want)):
        return OpResult(case.name, case.op_type, True, "NaNs differ", float("inf"))
    got, want = np.nan_to_num(got), np.nan_to_num(want)
    scale = max(float(np.max(np.abs(want), initial=0.0)), 1e-6)
    error = float(np.max(np.abs(got.astype(np.float64) - want), initial=0.0)) / scale
    return OpResult(case.name, case.op_type, True, "", error, error <= rtol)
