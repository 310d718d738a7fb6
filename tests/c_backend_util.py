"""Shared helpers for the C backend tests: build one-node models, compile them as one partition."""

from __future__ import annotations

import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

from codegraft.backend import Partition
from codegraft.backends.c import CBackend, CompilerNotFoundError
from codegraft.backends.c._toolchain import Toolchain
from codegraft.testing import assert_close, run_onnxruntime


def compiler_available() -> bool:
    try:
        Toolchain().resolved_compiler()
    except CompilerNotFoundError:
        return False
    return True


needs_compiler = pytest.mark.skipif(not compiler_available(), reason="no C compiler (cc/gcc/clang) on PATH")


def typed_model(nodes: list[onnx.NodeProto], inputs: Mapping[str, tuple[int, list[int]]], outputs: Mapping[str, int],
                initializers: Mapping[str, Any], opset: int = 17) -> onnx.ModelProto:
    """A model of ``nodes``: inputs ``name -> (TensorProto type, shape)``, outputs ``name -> type``
    (shapes inferred), initializers from arrays (the int8 tests' integer types)."""
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info(n, t, s) for n, (t, s) in inputs.items()],
        [helper.make_tensor_value_info(n, t, None) for n, t in outputs.items()],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in initializers.items()],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    return onnx.shape_inference.infer_shapes(model)

# One cache for the whole test session: hypothesis examples that generate the same source
# (same shapes, other weights) reuse the compiled library.
_CACHE = pathlib.Path(__import__("tempfile").mkdtemp(prefix="codegraft-c-test-"))


def backend(**kwargs: object) -> CBackend:
    return CBackend(cache_dir=_CACHE, **kwargs)  # type: ignore[arg-type]


def make_model(
    nodes: Sequence[onnx.NodeProto],
    inputs: dict[str, Sequence[int]],
    outputs: Sequence[str],
    initializers: dict[str, np.ndarray] | None = None,
    opset: int = 17,
    domains: Sequence[str] = (),
) -> onnx.ModelProto:
    """A float32 model over ``nodes``; outputs typed but unshaped (inference fills them)."""
    graph = helper.make_graph(
        list(nodes),
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s)) for n, s in inputs.items()],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in (initializers or {}).items()],
    )
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, 1) for d in domains]
    return helper.make_model(graph, opset_imports=opsets)


def feeds_for(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    inits = {t.name for t in model.graph.initializer}
    return {
        i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
        for i in model.graph.input
        if i.name not in inits
    }


def run_c(model: onnx.ModelProto, feeds: dict[str, np.ndarray], be: CBackend | None = None) -> dict[str, np.ndarray]:
    """Compile ``model`` whole as one partition on the C backend and run it."""
    be = be or backend()
    ir_model = ir.from_proto(model)
    for node in ir_model.graph:
        verdict = be.supports(node)
        assert verdict, verdict.reason
    partition = Partition(name="p", model=ir_model)
    runnable = be.load(be.compile(partition))
    outputs = runnable.run([feeds[name] for name in partition.input_names])
    return dict(zip(partition.output_names, outputs, strict=True))


def check(model: onnx.ModelProto, seed: int = 0, rtol: float = 1e-4) -> float:
    """C backend vs onnxruntime on random inputs; returns the worst relative error."""
    feeds = feeds_for(model, seed)
    return assert_close(run_c(model, feeds), run_onnxruntime(model, feeds), rtol=rtol)
