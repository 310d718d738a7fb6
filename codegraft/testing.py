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
"""

from __future__ import annotations

import pathlib
from collections.abc import Mapping

import numpy as np
import onnx
from onnx import numpy_helper

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
