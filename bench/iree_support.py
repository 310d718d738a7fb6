"""Derive what the ``iree`` backend supports by testing IREE, not by reading its docs.

Runs every case of the onnx wheel's conformance data (``pytorch-converted``,
``pytorch-operator``, ``simple``) and one-node cases of the ops real models use (expected
outputs from onnxruntime) through the backend's own path: IREE's ONNX
importer, ``iree-compile`` for this CPU, IREE's runtime, compared with the stored outputs
(1e-4 relative).  Writes ``codegraft/backends/iree/support.json``, which
``IreeBackend.supports`` reads: an op is taken when it passed and never failed alone.

    python -m bench.iree_support            # about 3 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import json
import pathlib
import time
from collections.abc import Iterator

import numpy as np
import onnx
import onnx_ir as ir
from onnx import TensorProto, helper, numpy_helper

from codegraft.backends.iree import IreeBackend
from codegraft.backends.iree._support import SUPPORT_FILE, op_key

DATA = pathlib.Path(onnx.__file__).parent / "backend" / "test" / "data"
KINDS = ("pytorch-converted", "pytorch-operator", "simple")
F = TensorProto.FLOAT


def _tensors(folder: pathlib.Path, prefix: str) -> list[np.ndarray]:
    files = sorted(folder.glob(f"{prefix}_*.pb"), key=lambda p: int(p.stem.split("_")[-1]))
    return [numpy_helper.to_array(onnx.load_tensor(str(f))) for f in files]


def conformance_cases() -> Iterator[tuple[str, onnx.ModelProto, list[np.ndarray], list[np.ndarray]]]:
    for kind in KINDS:
        for case in sorted((DATA / kind).glob("test_*")):
            data = sorted(case.glob("test_data_set_*"))
            if not data:
                continue
            model = onnx.load(str(case / "model.onnx"))
            inputs, expected = _tensors(data[0], "input"), _tensors(data[0], "output")
            yield f"{kind}/{case.name}", model, inputs, expected


def _one_node(op: str, inputs: list[tuple[str, np.ndarray]], consts: dict[str, np.ndarray] | None = None,
              n_out: int = 1, opset: int = 17, **attrs: object) -> tuple[onnx.ModelProto, list[np.ndarray]]:
    consts = consts or {}
    names = [n for n, _ in inputs] + list(consts)
    node = helper.make_node(op, names, [f"y{i}" for i in range(n_out)], **attrs)
    graph = helper.make_graph(
        [node], op,
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape) for n, a in inputs],
        [helper.make_value_info(f"y{i}", onnx.TypeProto()) for i in range(n_out)],
        [numpy_helper.from_array(v, n) for n, v in consts.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    model = onnx.shape_inference.infer_shapes(model)
    return model, [a for _, a in inputs]


def op_cases() -> Iterator[tuple[str, onnx.ModelProto, list[np.ndarray], list[np.ndarray]]]:
    """One-node cases of the ops the zoo and the light models use, and their common neighbours.

    The reference is onnxruntime, as for every backend (onnx's reference evaluator computes
    LRN 3e-4 away from it).
    """
    from codegraft.testing import run_onnxruntime

    rng = np.random.default_rng(0)

    def r(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32)

    x4, x3, x2 = ("x", r(1, 4, 8, 8)), ("x", r(2, 5, 16)), ("x", r(6, 16))
    i64 = np.int64
    cases: dict[str, tuple[onnx.ModelProto, list[np.ndarray]]] = {
        "Gemm": _one_node("Gemm", [x2], {"w": r(8, 16), "b": r(8)}, transB=1),
        "MatMul": _one_node("MatMul", [x3], {"w": r(16, 8)}),
        "Relu": _one_node("Relu", [x4]),
        "Sigmoid": _one_node("Sigmoid", [x4]),
        "Tanh": _one_node("Tanh", [x4]),
        "Erf": _one_node("Erf", [x4]),
        "Exp": _one_node("Exp", [x4]),
        "Log": _one_node("Log", [("x", np.abs(r(4, 8)) + 0.1)]),
        "Sqrt": _one_node("Sqrt", [("x", np.abs(r(4, 8)))]),
        "Reciprocal": _one_node("Reciprocal", [("x", np.abs(r(4, 8)) + 0.5)]),
        "Neg": _one_node("Neg", [x4]),
        "Abs": _one_node("Abs", [x4]),
        "Add": _one_node("Add", [x4], {"b": r(1, 4, 1, 1)}),
        "Sub": _one_node("Sub", [x4], {"b": r(8)}),
        "Mul": _one_node("Mul", [x4], {"b": r(1, 4, 1, 1)}),
        "Div": _one_node("Div", [x4], {"b": np.abs(r(8)) + 0.5}),
        "Pow": _one_node("Pow", [("x", np.abs(r(4, 8)))], {"p": np.array(2.0, np.float32)}),
        "Max": _one_node("Max", [x2, ("z", r(6, 16))]),
        "Min": _one_node("Min", [x2, ("z", r(6, 16))]),
        "Clip": _one_node("Clip", [x4], {"lo": np.array(0, np.float32), "hi": np.array(6, np.float32)}),
        "HardSigmoid": _one_node("HardSigmoid", [x4]),
        "HardSwish": _one_node("HardSwish", [x4]),
        "LeakyRelu": _one_node("LeakyRelu", [x4], alpha=0.1),
        "Softmax": _one_node("Softmax", [x3], axis=-1),
        "LogSoftmax": _one_node("LogSoftmax", [x3], axis=-1),
        "LayerNormalization": _one_node("LayerNormalization", [x3], {"s": r(16), "b": r(16)}, axis=-1),
        "BatchNormalization": _one_node("BatchNormalization", [x4], {
            "s": r(4), "b": r(4), "m": r(4), "v": np.abs(r(4)) + 0.5}),
        "InstanceNormalization": _one_node("InstanceNormalization", [x4], {"s": r(4), "b": r(4)}),
        "Conv": _one_node("Conv", [x4], {"w": r(6, 4, 3, 3), "b": r(6)}, pads=[1, 1, 1, 1]),
        "Conv_group": _one_node("Conv", [x4], {"w": r(4, 1, 3, 3)}, group=4, strides=[2, 2], pads=[1, 1, 1, 1]),
        "ConvTranspose": _one_node("ConvTranspose", [x4], {"w": r(4, 3, 2, 2)}, strides=[2, 2]),
        "MaxPool": _one_node("MaxPool", [x4], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
        "AveragePool": _one_node("AveragePool", [x4], kernel_shape=[2, 2], strides=[2, 2]),
        "GlobalAveragePool": _one_node("GlobalAveragePool", [x4]),
        "GlobalMaxPool": _one_node("GlobalMaxPool", [x4]),
        "LRN": _one_node("LRN", [x4], size=3),
        "Transpose": _one_node("Transpose", [x3], perm=[0, 2, 1]),
        "Reshape": _one_node("Reshape", [x3], {"s": np.array([2, -1, 4], i64)}),
        "Flatten": _one_node("Flatten", [x4], axis=1),
        "Squeeze": _one_node("Squeeze", [("x", r(1, 4, 1, 8))], {"a": np.array([0, 2], i64)}),
        "Unsqueeze": _one_node("Unsqueeze", [x2], {"a": np.array([1], i64)}),
        "Concat": _one_node("Concat", [x2, ("z", r(6, 4))], axis=1),
        "Split": _one_node("Split", [x2], {"s": np.array([8, 8], i64)}, n_out=2, axis=1),
        "Slice": _one_node("Slice", [x3], {"st": np.array([1], i64), "en": np.array([9], i64),
                                            "ax": np.array([2], i64), "sp": np.array([2], i64)}),
        "Gather": _one_node("Gather", [x2], {"i": np.array([[0, 3], [5, 1]], i64)}, axis=0),
        "Expand": _one_node("Expand", [("x", r(1, 16))], {"s": np.array([4, 16], i64)}),
        "Tile": _one_node("Tile", [x2], {"t": np.array([2, 1], i64)}),
        "Pad": _one_node("Pad", [x4], {"p": np.array([0, 0, 1, 2, 0, 0, 2, 1], i64)}),
        "Shape": _one_node("Shape", [x3]),
        "Cast": _one_node("Cast", [x4], to=TensorProto.INT32),
        "Where": _one_node("Where", [("c", r(6, 16) > 0), x2, ("z", r(6, 16))]),
        "Equal": _one_node("Equal", [("x", rng.integers(0, 3, (6, 4)).astype(i64)),
                                      ("z", rng.integers(0, 3, (6, 4)).astype(i64))]),
        "Less": _one_node("Less", [x2, ("z", r(6, 16))]),
        "ReduceMean": _one_node("ReduceMean", [x3], {"a": np.array([-1], i64)}, opset=18),
        "ReduceSum": _one_node("ReduceSum", [x3], {"a": np.array([1], i64)}),
        "ReduceMax": _one_node("ReduceMax", [x3], {"a": np.array([1], i64)}, opset=18),
        "ArgMax": _one_node("ArgMax", [x3], axis=2),
        "TopK": _one_node("TopK", [x2], {"k": np.array([3], i64)}, n_out=2),
        "CumSum": _one_node("CumSum", [x2], {"a": np.array(1, i64)}),
        "Einsum": _one_node("Einsum", [x3, ("z", r(2, 16, 3))], equation="bij,bjk->bik"),
        "Resize": _one_node("Resize", [x4], {"roi": np.zeros(0, np.float32),
                                             "sc": np.array([1, 1, 2, 2], np.float32)}, mode="nearest"),
        "DepthToSpace": _one_node("DepthToSpace", [x4], blocksize=2),
        "Range": _one_node("Range", [], {"a": np.array(0, i64), "b": np.array(10, i64), "c": np.array(3, i64)}),
        "ConstantOfShape": _one_node("ConstantOfShape", [], {"s": np.array([2, 3], i64)},
                                     value=numpy_helper.from_array(np.array([1.5], np.float32))),
        "Trilu": _one_node("Trilu", [("x", r(5, 5))]),
        "Gelu": _one_node("Gelu", [x4], opset=20),
        "Mod": _one_node("Mod", [("x", rng.integers(1, 50, (4, 4)).astype(i64)),
                                  ("z", rng.integers(1, 7, (4, 4)).astype(i64))]),
        "Dropout": _one_node("Dropout", [x4]),
        "Identity": _one_node("Identity", [x4]),
        "Not": _one_node("Not", [("x", r(4, 4) > 0)]),
    }
    for name, (model, inputs) in cases.items():
        feeds = {i.name: a for i, a in zip(model.graph.input, inputs, strict=True)}
        expected = list(run_onnxruntime(model, feeds).values())
        yield f"op/{name}", model, inputs, expected


def run_case(backend: IreeBackend, model: onnx.ModelProto, inputs: list[np.ndarray],
             expected: list[np.ndarray]) -> str:
    """'' when IREE matches ``expected``; otherwise what went wrong, in one line."""
    from codegraft.backend import Partition

    model = onnx.ModelProto.FromString(model.SerializeToString())
    # Old IR lists initializers as graph inputs too; only the ones with test data are inputs.
    kept = list(model.graph.input)[: len(inputs)]
    del model.graph.input[:]
    model.graph.input.extend(kept)
    model.ir_version = max(model.ir_version, 4)  # initializers need not be inputs from IR 4 on
    for value, array in zip(model.graph.input, inputs, strict=True):
        del value.type.tensor_type.shape.dim[:]
        for size in array.shape:
            value.type.tensor_type.shape.dim.add().dim_value = size
    feeds = list(inputs)
    try:
        partition = Partition("p", ir.from_proto(model))
        outputs = backend.load(backend.compile(partition)).run(feeds)
    except Exception as error:  # noqa: BLE001 - recorded, that is the point
        return str(error).splitlines()[0][:300] if str(error) else type(error).__name__
    for got, want in zip(outputs, expected, strict=True):
        if got.shape != want.shape:
            return f"wrong shape {list(got.shape)}, expected {list(want.shape)}"
        if want.dtype.kind in "fc":
            if not np.array_equal(np.isnan(got), np.isnan(want)):
                return "wrong values: NaN where the reference has none, or the other way round"
            got, want = np.nan_to_num(got), np.nan_to_num(want)
            scale = max(float(np.max(np.abs(want), initial=0.0)), 1e-6)
            error = float(np.max(np.abs(got.astype(np.float64) - want), initial=0.0)) / scale
            if not error <= 1e-4:
                return f"wrong values: {error:.2g} relative error against the reference"
        elif not np.array_equal(got, want):
            return "wrong values against the reference"
    return ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--write", type=pathlib.Path, default=SUPPORT_FILE)
    parser.add_argument("--only", nargs="*", default=None,
                        help="rerun only cases whose name contains one of these, keeping the other results")
    args = parser.parse_args()
    previous = {c["case"]: c for c in json.loads(args.write.read_text())["cases"]} if args.only else {}
    backend = IreeBackend()
    results = []
    start = time.time()
    for name, model, inputs, expected in (*conformance_cases(), *op_cases()):
        if args.only is not None and not any(part in name for part in args.only):
            if name in previous:
                results.append(previous[name])
            continue
        if any(a.dtype == np.float64 for a in (*inputs, *expected)):
            print(f"skip {name}: float64, which the backend declines (IREE demotes it to float32)")
            continue
        ops = sorted({op_key(n) for n in ir.from_proto(model).graph})
        error = run_case(backend, model, inputs, expected)
        results.append({"case": name, "ops": ops, "error": error})
        print(f"{'ok  ' if not error else 'FAIL'} {name:60s} {error}", flush=True)
    ops: dict[str, dict[str, object]] = {}
    for result in results:
        for op in result["ops"]:
            entry = ops.setdefault(op, {"passed": 0, "failed": 0, "reasons": []})
            if not result["error"]:
                entry["passed"] += 1  # type: ignore[operator]
            elif len(result["ops"]) == 1:
                entry["failed"] += 1  # type: ignore[operator]
                entry["reasons"].append(f"{result['case']}: {result['error']}")  # type: ignore[attr-defined]
    from iree.compiler.version import VERSION

    data = {"iree_version": VERSION, "seconds": round(time.time() - start), "ops": dict(sorted(ops.items())),
            "cases": results}
    args.write.write_text(json.dumps(data, indent=1) + "\n")
    passed = sum(1 for r in results if not r["error"])
    print(f"{passed}/{len(results)} cases pass; wrote {args.write}")


if __name__ == "__main__":
    main()
