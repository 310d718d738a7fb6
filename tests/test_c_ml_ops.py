"""ai.onnx.ml's arithmetic ops on the c backend (what skl2onnx makes of scikit-learn pipelines):
Scaler, Normalizer, Binarizer, LinearRegressor and LinearClassifier with every post transform,
each placed on ``c`` and checked against onnxruntime (scores to float32 rounding, labels exactly)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
import pytest
from c_backend_util import needs_compiler
from onnx import TensorProto, helper

import codegraft as cg
from codegraft.backends.c import CBackend
from codegraft.testing import assert_close, run_onnxruntime

pytestmark = needs_compiler

ML = "ai.onnx.ml"
F32, I64, I32 = TensorProto.FLOAT, TensorProto.INT64, TensorProto.INT32
TRANSFORMS = ("NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO", "PROBIT")


def _model(
    nodes: Sequence[onnx.NodeProto],
    inputs: dict[str, tuple[int, Sequence[int | str]]],
    outputs: dict[str, int],
    ml_opset: int = 3,
) -> onnx.ModelProto:
    graph = helper.make_graph(
        list(nodes), "ml",
        [helper.make_tensor_value_info(name, dtype, list(shape)) for name, (dtype, shape) in inputs.items()],
        [helper.make_tensor_value_info(name, dtype, None) for name, dtype in outputs.items()],
    )  # fmt: skip
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(ML, ml_opset)]
    return helper.make_model(graph, opset_imports=opsets)


def _on_c(model: onnx.ModelProto, feeds: dict[str, np.ndarray], rtol: float = 2e-6) -> float:
    """Every node placed on ``c``; its outputs against onnxruntime's (integer ones exactly)."""
    exe = cg.compile(model, targets=["c"])
    report = exe.report()
    assert {n.backend for n in report.nodes} == {"c"}, report
    return assert_close(exe.run(feeds), run_onnxruntime(model, feeds), rtol=rtol, atol=0)


def _rand(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _ml(op: str, inputs: list[str], outputs: list[str], **attributes: object) -> onnx.NodeProto:
    return helper.make_node(op, inputs, outputs, domain=ML, **attributes)


# -- Scaler, Normalizer, Binarizer ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "offset", "scale"),
    [((7, 4), [5.36, 0.0, 12.77, 75.48], [0.355, 1.0, 0.147, 0.0232]),  # sklearn_regressor's
     ((7, 4), [0.5], [3.0]), ((5,), [1.0, -2.0, 0.25, 3.0, 0.0], [2.0, 0.5, -1.0, 7.0, 1.5])],
)  # fmt: skip
def test_scaler(shape: tuple[int, ...], offset: list[float], scale: list[float]) -> None:
    model = _model([_ml("Scaler", ["x"], ["y"], offset=offset, scale=scale)], {"x": (F32, shape)}, {"y": F32})
    _on_c(model, {"x": _rand(*shape) * 50}, rtol=0)  # one subtraction and one multiply: bit for bit


@pytest.mark.parametrize("dtype", [I64, I32])
def test_scaler_of_integer_features(dtype: int) -> None:
    model = _model([_ml("Scaler", ["x"], ["y"], offset=[1.5, -3.0, 0.0], scale=[0.5, 0.1, 3.0])],
                   {"x": (dtype, (4, 3))}, {"y": F32})  # fmt: skip
    x = np.array([[1, 2, 3], [-7, 2**24 + 1, 9], [0, 0, 0], [2**20, -(2**23), 5]])
    _on_c(model, {"x": x.astype(helper.tensor_dtype_to_np_dtype(dtype))}, rtol=0)


@pytest.mark.parametrize("norm", ["MAX", "L1", "L2"])
def test_normalizer(norm: str) -> None:
    x = _rand(6, 5, seed=1) * 3
    x[1] = 0.0  # a norm of 0: the row is copied
    x[2] = -np.abs(x[2])  # MAX of a negative row divides by a negative maximum
    x[3, 2] = -0.0
    model = _model([_ml("Normalizer", ["x"], ["y"], norm=norm)], {"x": (F32, (6, 5))}, {"y": F32}, ml_opset=1)
    _on_c(model, {"x": x}, rtol=0)  # onnxruntime's loops, float32 step by step: bit for bit


def test_normalizer_of_one_row_and_of_integers() -> None:
    model = _model([_ml("Normalizer", ["x"], ["y"], norm="L1")], {"x": (F32, (9,))}, {"y": F32}, ml_opset=1)
    _on_c(model, {"x": _rand(9, seed=2)}, rtol=0)
    model = _model([_ml("Normalizer", ["x"], ["y"], norm="MAX")], {"x": (I64, (3, 4))}, {"y": F32}, ml_opset=1)
    _on_c(model, {"x": np.array([[1, -5, 3, 2], [0, 0, 0, 0], [-4, -2, -9, -1]], np.int64)}, rtol=0)


@pytest.mark.parametrize("threshold", [None, 0.25])
def test_binarizer(threshold: float | None) -> None:
    attributes = {} if threshold is None else {"threshold": threshold}
    model = _model([_ml("Binarizer", ["x"], ["y"], **attributes)], {"x": (F32, (4, 6))}, {"y": F32})
    x = _rand(4, 6, seed=3)
    x[0, :3] = [0.0, 0.25, -0.0]  # at either threshold: 0
    _on_c(model, {"x": x}, rtol=0)


@pytest.mark.parametrize(
    ("imputed", "replaced"), [([1.5, -2.0, 0.25, 9.0], 0.0), ([7.0], float("nan")), ([1.5, -2.0, 3.0], -1.0)]
)
def test_imputer(imputed: list[float], replaced: float) -> None:
    """Per feature where there are as many values as features, else the first for all (as onnxruntime)."""
    node = _ml("Imputer", ["x"], ["y"], imputed_value_floats=imputed, replaced_value_float=replaced)
    model = _model([node], {"x": (F32, ("N", 4))}, {"y": F32}, ml_opset=1)
    x = _rand(6, 4, seed=18).round(0)  # some 0.0, some -1.0, some -0.0
    x[1, 2] = x[3, 0] = np.nan
    x[4, 1] = -0.0
    exe = cg.compile(model, targets=["c"])
    assert {n.backend for n in exe.report().nodes} == {"c"}
    got, want = exe.run({"x": x})["y"], run_onnxruntime(model, {"x": x})["y"]
    np.testing.assert_array_equal(got, want)  # NaN where a NaN is kept (equal_nan), bit for bit elsewhere


# -- LinearRegressor -----------------------------------------------------------------------------


@pytest.mark.parametrize("transform", TRANSFORMS)
@pytest.mark.parametrize("targets", [1, 3])
def test_linear_regressor(transform: str, targets: int) -> None:
    rng = np.random.default_rng(4)
    features = 6
    # small positive scores for PROBIT (its ErfInv is defined for scores in (0, 1))
    coefficients = rng.uniform(0.0, 0.1, (targets, features)) if transform == "PROBIT" else \
        rng.standard_normal((targets, features))  # fmt: skip
    intercepts = rng.uniform(0.2, 0.4, targets)
    if transform == "SOFTMAX_ZERO" and targets > 1:
        intercepts[0] = 0.0  # the zero row's first score is 0: left out of the sum
    node = _ml("LinearRegressor", ["x"], ["y"], coefficients=coefficients.reshape(-1).tolist(),
               intercepts=intercepts.tolist(), targets=targets, post_transform=transform)  # fmt: skip
    model = _model([node], {"x": (F32, ("N", features))}, {"y": F32}, ml_opset=1)
    x = rng.uniform(0.0, 1.0, (5, features)).astype(np.float32) if transform == "PROBIT" else _rand(5, features)
    x[0] = 0.0
    _on_c(model, {"x": x})


def test_linear_regressor_without_intercepts_of_one_row() -> None:
    node = _ml("LinearRegressor", ["x"], ["y"], coefficients=[0.5, -1.0, 2.0, 0.25], targets=2)
    model = _model([node], {"x": (F32, (2,))}, {"y": F32}, ml_opset=1)
    _on_c(model, {"x": np.array([3.0, -1.5], np.float32)})


# -- LinearClassifier ----------------------------------------------------------------------------


def _classifier(classes: int, features: int, transform: str, seed: int, **labels: object) -> onnx.NodeProto:
    rng = np.random.default_rng(seed)
    coefficients = rng.standard_normal((classes, features)) * (0.1 if transform == "PROBIT" else 1.0)
    intercepts = rng.uniform(0.3, 0.6, classes) if transform == "PROBIT" else rng.standard_normal(classes)
    if transform == "SOFTMAX_ZERO":
        intercepts[-1] = 0.0
    return _ml("LinearClassifier", ["x"], ["label", "scores"], coefficients=coefficients.reshape(-1).tolist(),
               intercepts=intercepts.tolist(), post_transform=transform, **labels)  # fmt: skip


@pytest.mark.parametrize("transform", TRANSFORMS)
@pytest.mark.parametrize("labels", [[0, 1, 2, 3], [10, -3, 7, 2**24], [4, 3, 2, 1, 0, -1, -2]])
def test_linear_classifier_multiclass(transform: str, labels: list[int]) -> None:
    """(4 classes: onnxruntime's SOFTMAX is its own loop; 7: MLAS's softmax, within its rounding)"""
    node = _classifier(len(labels), 5, transform, seed=5, classlabels_ints=labels)
    model = _model([node], {"x": (F32, ("N", 5))}, {"label": I64, "scores": F32}, ml_opset=1)
    x = _rand(64, 5, seed=6) * (0.3 if transform == "PROBIT" else 1.0)
    x[0] = 0.0
    _on_c(model, {"x": x})


def test_linear_classifier_labels_ties_to_the_first_class() -> None:
    """Equal scores (equal coefficients): the first class wins, as onnxruntime's loop picks it."""
    coefficients = [1.0, 2.0, 0.5, 1.0, 2.0, 0.5, -1.0, 0.0, 0.0]
    node = _ml("LinearClassifier", ["x"], ["label", "scores"], coefficients=coefficients, intercepts=[0.0, 0.0, 0.0],
               classlabels_ints=[7, 8, 9])  # fmt: skip
    model = _model([node], {"x": (F32, (4, 3))}, {"label": I64, "scores": F32}, ml_opset=1)
    _on_c(model, {"x": np.array([[1, 1, 1], [0, 0, 0], [-1, -1, -1], [-3, 0, 0]], np.float32)})


@pytest.mark.parametrize("transform", TRANSFORMS[:-1])
def test_linear_classifier_binary_with_two_labels(transform: str) -> None:
    """One set of coefficients and 2 labels: the second label above 0, scores [1 - p, p], p the score
    after LOGISTIC, the raw score after the others (PROBIT declined), as onnxruntime writes them."""
    node = _classifier(1, 4, transform, seed=7, classlabels_ints=[3, 11])
    model = _model([node], {"x": (F32, ("N", 4))}, {"label": I64, "scores": F32}, ml_opset=1)
    _on_c(model, {"x": _rand(32, 4, seed=8)})


@pytest.mark.parametrize("transform", TRANSFORMS)
def test_linear_classifier_binary_without_labels(transform: str) -> None:
    """One set of coefficients, no labels: 1 above 0 else 0, one score column (PROBIT applied,
    the other transforms not, as onnxruntime's)."""
    node = _classifier(1, 4, transform, seed=9)
    model = _model([node], {"x": (F32, ("N", 4))}, {"label": I64, "scores": F32}, ml_opset=1)
    _on_c(model, {"x": _rand(32, 4, seed=10) * (0.3 if transform == "PROBIT" else 1.0)})


@pytest.mark.parametrize("dtype", [I64, I32])
def test_linear_classifier_of_integer_features(dtype: int) -> None:
    node = _classifier(3, 4, "SOFTMAX", seed=11, classlabels_ints=[5, 6, 7])
    model = _model([node], {"x": (dtype, (6, 4))}, {"label": I64, "scores": F32}, ml_opset=1)
    x = np.random.default_rng(12).integers(-20, 20, (6, 4)).astype(helper.tensor_dtype_to_np_dtype(dtype))
    _on_c(model, {"x": x})


def test_logreg_iris_reads_as_many_coefficients_as_its_input_has_features() -> None:
    """onnxruntime's logreg_iris sample: 3 x 4 coefficients, a [3, 2] input; onnxruntime reads the
    first 3 x 2 of them, and so does c; then L1 Normalizer (its ZipMap stays on the host)."""
    coefficients = np.random.default_rng(13).standard_normal(12).round(3).tolist()
    nodes = [_ml("LinearClassifier", ["x"], ["label", "p"], classlabels_ints=[0, 1, 2], coefficients=coefficients,
                 intercepts=[0.25, 0.58, -0.94], multi_class=0, post_transform="LOGISTIC"),
             _ml("Normalizer", ["p"], ["y"], norm="L1")]  # fmt: skip
    model = _model(nodes, {"x": (F32, (3, 2))}, {"label": I64, "y": F32}, ml_opset=1)
    _on_c(model, {"x": _rand(3, 2, seed=14)})


def test_a_scikit_learn_pipeline_is_one_c_partition() -> None:
    """Scaler -> LinearClassifier -> Normalizer, with the default domain's ops between: one partition."""
    nodes = [
        _ml("Scaler", ["x"], ["scaled"], offset=[0.1, -0.2, 0.3], scale=[2.0, 0.5, 1.5]),
        helper.make_node("Relu", ["scaled"], ["r"]),
        _classifier(3, 3, "SOFTMAX", seed=15, classlabels_ints=[1, 2, 4]),
        _ml("Normalizer", ["scores"], ["y"], norm="L2"),
    ]
    nodes[2].input[0] = "r"
    model = _model(nodes, {"x": (F32, ("N", 3))}, {"label": I64, "y": F32})
    # (onnx infers no type for Scaler's output)
    model.graph.value_info.append(helper.make_tensor_value_info("scaled", F32, ["N", 3]))
    exe = cg.compile(model, targets=["c"])
    assert [p.backend for p in exe.report().partitions] == ["c"], exe.report()
    _on_c(model, {"x": _rand(16, 3, seed=16)})


def test_scaler_before_a_matmul_compiled_per_batch_size() -> None:
    """sklearn_regressor's head: Scaler -> Cast -> MatMul over a free batch.  onnx infers no type
    for Scaler's output; the Cast, a no-op, is dropped, and the partition compiled per batch size
    is inferred again from its proto, which must carry that type (it did not: the c partition
    failed at run time and onnxruntime ran it)."""
    rng = np.random.default_rng(17)
    nodes = [_ml("Scaler", ["x"], ["scaled"], offset=[5.36, 0.0, 12.77, 75.48], scale=[0.355, 1.0, 0.147, 0.0232]),
             helper.make_node("Cast", ["scaled"], ["cast"], to=F32),
             helper.make_node("MatMul", ["cast", "w"], ["y"])]  # fmt: skip
    model = _model(nodes, {"x": (F32, ("N", 4))}, {"y": F32}, ml_opset=1)
    model.graph.initializer.append(onnx.numpy_helper.from_array(rng.standard_normal((4, 3)).astype(np.float32), "w"))
    exe = cg.compile(model, targets=["c"])
    for rows in (1, 5):
        x = {"x": _rand(rows, 4, seed=rows) * 20}
        assert_close(exe.run(x), run_onnxruntime(model, x), rtol=2e-6, atol=0)
    assert {n.backend for n in exe.report().nodes} == {"c"}
    assert not exe.report().fallbacks(), exe.report().fallbacks()


# -- what stays on the host --------------------------------------------------------------------


def _verdict(node: onnx.NodeProto, inputs: dict[str, tuple[int, Sequence[int | str]]],
             outputs: dict[str, int]) -> str:  # fmt: skip
    import onnx_ir as ir

    model = _model([node], inputs, outputs)
    verdict = CBackend().supports(ir.from_proto(onnx.shape_inference.infer_shapes(model)).graph.node(0))
    return "" if verdict else verdict.reason


def test_what_stays_on_the_host_says_why() -> None:
    x = {"x": (F32, (4, 3))}
    strings = _ml("LinearClassifier", ["x"], ["label", "scores"], coefficients=[1.0] * 6, intercepts=[0.0, 1.0],
                  classlabels_strings=["a", "b"])  # fmt: skip
    assert "string" in _verdict(strings, x, {"label": TensorProto.STRING, "scores": F32})
    probit = _ml("LinearClassifier", ["x"], ["label", "scores"], coefficients=[1.0] * 3, intercepts=[0.5],
                 classlabels_ints=[0, 1], post_transform="PROBIT")  # fmt: skip
    assert "PROBIT" in _verdict(probit, x, {"label": I64, "scores": F32})
    few = _ml("LinearClassifier", ["x"], ["label", "scores"], coefficients=[1.0] * 3, intercepts=[0.5, 1.0])
    assert "coefficients" in _verdict(few, x, {"label": I64, "scores": F32})
    rank3 = _ml("Normalizer", ["x"], ["y"], norm="L2")
    assert "rank-3" in _verdict(rank3, {"x": (F32, (2, 3, 4))}, {"y": F32})
    assert "squares them" in _verdict(rank3, {"x": (I64, (2, 3))}, {"y": F32})
    double = _ml("Scaler", ["x"], ["y"], offset=[0.0], scale=[2.0])
    assert "double" in _verdict(double, {"x": (TensorProto.DOUBLE, (2, 3))}, {"y": F32})
    assert "offsets for 3 features" in _verdict(_ml("Scaler", ["x"], ["y"], offset=[0.0] * 2, scale=[1.0] * 2),
                                                x, {"y": F32})  # fmt: skip
    unknown = _ml("LinearRegressor", ["x"], ["y"], coefficients=[1.0] * 3, post_transform="probit")
    assert "post_transform" in _verdict(unknown, x, {"y": F32})
    integers = _ml("Imputer", ["x"], ["y"], imputed_value_int64s=[0], replaced_value_int64=-1)
    assert "int64" in _verdict(integers, {"x": (I64, (4, 3))}, {"y": I64})
    plain = helper.make_node("Binarizer", ["x"], ["y"])  # no such op in the default domain
    assert "ai.onnx.ml" in _verdict(plain, x, {"y": F32})
