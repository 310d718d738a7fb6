"""NaN and Inf flow through the ``c`` backend as through onnxruntime; empty tensors never reach C's kernels.

Before issue 11: Relu, Sigmoid, Tanh, Clip, Exp, Elu, Selu, Softmax, Max and Min turned a NaN
into a finite number (a user hunting a numerical bug saw nothing), and a zero-size batch
killed the process inside the generated code (SIGFPE or SIGILL, depending on the CPU).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
from c_backend_util import needs_compiler
from onnx import TensorProto, helper, numpy_helper

import codegraft as cg
from codegraft.testing import run_onnxruntime

pytestmark = needs_compiler

SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 100.0, -100.0, 3e38], np.float32)


def make_model(nodes: list, inputs: dict, outputs: dict, inits: dict | None = None, opset: int = 17):  # type: ignore[no-untyped-def]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(k, TensorProto.FLOAT, list(v)) for k, v in inputs.items()],
        [helper.make_tensor_value_info(k, TensorProto.FLOAT, list(v)) for k, v in outputs.items()],
        [numpy_helper.from_array(v, k) for k, v in (inits or {}).items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _assert_same_nonfinite(got: np.ndarray, want: np.ndarray) -> None:
    assert np.array_equal(np.isnan(got), np.isnan(want)), f"NaN mask differs:\n{got}\n{want}"
    assert np.array_equal(np.isposinf(got), np.isposinf(want)), f"+Inf differs:\n{got}\n{want}"
    assert np.array_equal(np.isneginf(got), np.isneginf(want)), f"-Inf differs:\n{got}\n{want}"
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-4, atol=1e-30)


UNARY = [
    ("Relu", {}, 17), ("Sigmoid", {}, 17), ("Tanh", {}, 17), ("Exp", {}, 17), ("Elu", {"alpha": 0.7}, 17),
    ("Selu", {}, 17), ("Clip", {"min": -0.5, "max": 0.5}, 6), ("HardSigmoid", {}, 17), ("LeakyRelu", {}, 17),
    ("HardSwish", {}, 17), ("Softplus", {}, 17), ("Erf", {}, 17), ("Abs", {}, 17), ("Neg", {}, 17),
    ("Softmax", {"axis": -1}, 17), ("Softmax", {"axis": 0}, 17), ("LogSoftmax", {"axis": -1}, 17),
]


@pytest.mark.parametrize(("op", "attrs", "opset"), UNARY, ids=[f"{u[0]}-{u[1]}" for u in UNARY])
def test_nan_and_inf_propagate_like_onnxruntime(op: str, attrs: dict, opset: int) -> None:
    x = np.stack([SPECIAL, SPECIAL[::-1], np.linspace(-3, 3, SPECIAL.size, dtype=np.float32)])
    model = make_model([helper.make_node(op, ["x"], ["y"], **attrs)], {"x": x.shape}, {"y": x.shape}, opset=opset)
    exe = cg.compile(model, targets=["c"])
    assert [s.backend for s in exe.steps] == ["c"]
    _assert_same_nonfinite(exe.run({"x": x})["y"], run_onnxruntime(model, {"x": x})["y"])


@pytest.mark.parametrize("op", ["Max", "Min"])
def test_max_min_propagate_nan_from_either_side(op: str) -> None:
    a = np.tile(SPECIAL, (SPECIAL.size, 1))
    b = a.T.copy()
    model = make_model([helper.make_node(op, ["a", "b"], ["y"])], {"a": a.shape, "b": b.shape}, {"y": a.shape})
    exe = cg.compile(model, targets=["c"])
    assert [s.backend for s in exe.steps] == ["c"]
    _assert_same_nonfinite(exe.run({"a": a, "b": b})["y"], run_onnxruntime(model, {"a": a, "b": b})["y"])


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
def test_reduce_max_min_propagate_nan_wherever_it_sits(op: str) -> None:
    """A NaN anywhere in a reduced row makes its result NaN.  (onnxruntime's depends on where
    it sits: first in the row it propagates, elsewhere it is skipped; so no comparison here.)"""
    x = np.ones((6, 20), np.float32)
    for row, column in enumerate([0, 1, 7, 8, 19]):
        x[row, column] = np.nan
    x[5, 3] = np.inf if op == "ReduceMax" else -np.inf
    model = make_model([helper.make_node(op, ["x"], ["y"], axes=[1], keepdims=0)], {"x": x.shape}, {"y": [6]},
                       opset=13)  # fmt: skip
    exe = cg.compile(model, targets=["c"])
    assert [s.backend for s in exe.steps] == ["c"]
    got = exe.run({"x": x})["y"]
    assert np.isnan(got[:5]).all() and got[5] == x[5, 3]


def test_nan_through_a_fused_conv_epilogue() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 8, 6, 6)).astype(np.float32)
    x[0, 3, 2, 2] = np.nan
    x[0, 5, 4, 1] = np.inf
    w = rng.standard_normal((16, 8, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]), helper.make_node("Clip", ["r"], ["y"], min=0.0, max=6.0)]
    model = make_model(nodes, {"x": x.shape}, {"y": (1, 16, 6, 6)}, {"w": w}, opset=6)
    exe = cg.compile(model, targets=["c"])
    assert [s.backend for s in exe.steps] == ["c"]
    _assert_same_nonfinite(exe.run({"x": x})["y"], run_onnxruntime(model, {"x": x})["y"])


_EMPTY_BATCH = """
import numpy as np
from onnx import TensorProto, helper, numpy_helper
import codegraft as cg
rng = np.random.default_rng(0)
cases = {
    "Conv": ([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], [3, 8, 8], (4, 3, 3, 3), [4, 8, 8]),
    "Gemm": ([helper.make_node("Gemm", ["x", "w"], ["y"])], [3], (3, 4), [4]),
    "MatMul": ([helper.make_node("MatMul", ["x", "w"], ["y"])], [3], (3, 4), [4]),
}
for name, (nodes, rest, wshape, out) in cases.items():
    for batch in ("N", 0):
        graph = helper.make_graph(
            nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, *rest])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, *out])],
            [numpy_helper.from_array(rng.standard_normal(wshape).astype(np.float32), "w")])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        exe = cg.compile(model, targets=["c"])
        y = exe.run({"x": np.zeros((0, *rest), np.float32)})["y"]
        assert y.shape[0] == 0, (name, batch, y.shape)
        fell_back = any(p.fallback_error for p in exe.report().partitions)
        print(name, batch, [s.backend for s in exe.steps], y.shape, "fell back" if fell_back else "")
"""


def test_empty_batch_runs_without_crashing() -> None:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(_EMPTY_BATCH)], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr[-2000:]}"
    lines = done.stdout.splitlines()
    assert len(lines) == 6
    # A batch declared 0 never goes to c; a symbolic batch compiles for c, and batch 0 runs
    # there too, computing nothing (test_c_empty.py): it fell back to the host before.
    assert all("['onnxruntime']" in line for line in lines if " 0 " in line)
    assert all("['c']" in line and "fell back" not in line for line in lines if " N " in line)


def test_empty_tensor_is_declined_with_the_reason() -> None:
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": (0, 3)}, {"y": (0, 3)})
    report = cg.compile(model, targets=["c"]).report()
    assert "empty" in report.nodes[0].declined[0][1]


def test_exp_and_softmax_underflow_as_onnxruntime() -> None:
    """exp below the normals: subnormal values, then exactly 0 under -103.97, as onnxruntime's
    Exp gives, and its Softmax on an AVX-512 core (on an AVX2 core its Softmax gives 0 for all
    below the normals: either is taken); a Softmax over masked logits (x - max ~ -1e4) is 0 there, not
    exp(-87) = 1.6e-38 (atspm's attention head: those tiny weights made subnormal products
    downstream, which an Intel core pays a microcode assist each for), and exp(-87.2) is its
    own value, not exp(-87)'s (39% off before)."""
    from c_backend_util import make_model as float_model
    from c_backend_util import run_c

    gaps = np.concatenate([np.linspace(-110, -80, 301), [-1e4, -1e30, -np.inf, 0.0]]).astype(np.float32)
    x = np.stack([np.zeros_like(gaps), gaps], 1)  # softmax rows [0, gap]: the second is exp(gap) / (1 + exp(gap))
    model = float_model(
        [helper.make_node("Softmax", ["x"], ["y"], axis=-1), helper.make_node("Exp", ["x"], ["e"]),
         helper.make_node("Softmax", ["x"], ["v"], axis=0)],  # a strided Softmax (inner > 1) too
        {"x": list(x.shape)}, ["y", "e", "v"],
    )
    got, want = run_c(model, {"x": x}), run_onnxruntime(model, {"x": x})
    subnormal_step, tiny = np.float32(2.0**-149), np.finfo(np.float32).tiny
    below = np.stack([np.zeros_like(gaps, bool), gaps < -103.97], 1)  # exp under half the least subnormal
    for name in ("y", "e", "v"):
        assert (got[name][below] == 0).all(), name  # the masked logits' weights: exactly zero
        if name == "e":  # zero exactly where onnxruntime's Exp is, on any core
            assert np.array_equal(got[name] == 0, want[name] == 0), name
        normal = np.abs(want[name]) >= tiny
        np.testing.assert_allclose(got[name][normal], want[name][normal], rtol=1e-6, err_msg=name)
        off = np.abs(got[name][~normal] - want[name][~normal])
        # onnxruntime's Softmax on an AVX2 core gives 0 for the subnormal ones, its AVX-512 one (and
        # its Exp) the subnormal values; c's Softmax gives 0 (tiny weights make subnormal products
        # downstream): a Softmax's result below the normals may be either there
        flushed = (np.abs(got[name][~normal]) < tiny) & (name != "e")
        assert (off[~flushed] <= subnormal_step).all(), name
