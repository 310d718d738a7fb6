"""An example codegraft backend: elementwise ops, MatMul, Gemm and Softmax run by numpy.

The blob is ``u32 header size | JSON program | raw weight bytes``: a list of steps (op,
input and output names, attributes) plus the partition's constants.  No pickle, no eval.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Sequence

import numpy as np
import onnx_ir as ir

from codegraft import Capabilities, Partition, Support

_UNARY: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "Relu": lambda x: np.maximum(x, 0),
    "Sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "Tanh": np.tanh,
    "Neg": np.negative,
    "Abs": np.abs,
    "Exp": np.exp,
    "Sqrt": np.sqrt,
    "Identity": lambda x: x,
}
_BINARY: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "Add": np.add,
    "Sub": np.subtract,
    "Mul": np.multiply,
    "Div": np.divide,
    "MatMul": np.matmul,
}


class NumpyBackend:
    """The example backend: float32 only, any shapes."""

    name = "numpy_example"
    version = "0.1.0"
    capabilities = Capabilities(dynamic_shapes=True, dtypes=frozenset({"float32"}))

    def supports(self, node: ir.Node) -> Support:
        if node.domain not in ("", "ai.onnx"):
            return Support.no(f"domain {node.domain} not supported")
        if node.op_type in _UNARY or node.op_type in _BINARY:
            return Support.yes()
        if node.op_type == "Gemm":
            if node.attributes.get_int("transA", 0):
                return Support.no("Gemm: transA=1 not supported")
            return Support.yes()
        if node.op_type == "Softmax":
            return Support.yes()
        return Support.no(f"{node.op_type} not implemented")

    def compile(self, partition: Partition) -> bytes:
        graph = partition.model.graph
        steps = []
        for node in graph:
            steps.append({
                "op": node.op_type,
                "inputs": [v.name if v is not None else "" for v in node.inputs],
                "outputs": [v.name for v in node.outputs],
                "attrs": {k: a.value for k, a in node.attributes.items() if isinstance(a.value, int | float)},
            })
        weights, chunks, offset = [], [], 0
        for name, value in graph.initializers.items():
            array = np.ascontiguousarray(value.const_value.numpy(), dtype=np.float32)  # type: ignore[union-attr]
            weights.append({"name": name, "shape": list(array.shape), "offset": offset})
            chunks.append(array.tobytes())
            offset += array.nbytes
        program = json.dumps({
            "inputs": partition.input_names, "outputs": partition.output_names,
            "steps": steps, "weights": weights,
        }).encode()
        return struct.pack("<I", len(program)) + program + b"".join(chunks)

    def load(self, blob: bytes) -> NumpyProgram:
        (size,) = struct.unpack_from("<I", blob)
        program = json.loads(blob[4 : 4 + size])
        data = blob[4 + size :]
        weights = {
            w["name"]: np.frombuffer(data, np.float32, int(np.prod(w["shape"])), w["offset"]).reshape(w["shape"])
            for w in program["weights"]
        }
        return NumpyProgram(program, weights)


class NumpyProgram:
    """A loaded partition: walks its steps with numpy (stateless, so thread-safe)."""

    def __init__(self, program: dict[str, list], weights: dict[str, np.ndarray]) -> None:  # type: ignore[type-arg]
        self._program = program
        self._weights = weights

    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        env = dict(self._weights)
        env.update(zip(self._program["inputs"], inputs, strict=True))
        for step in self._program["steps"]:
            args = [env[name] if name else None for name in step["inputs"]]
            env[step["outputs"][0]] = _execute(step["op"], args, step["attrs"]).astype(np.float32, copy=False)
        return [env[name] for name in self._program["outputs"]]


def _execute(op: str, args: list, attrs: dict[str, float]) -> np.ndarray:  # type: ignore[type-arg]
    if op in _UNARY:
        return _UNARY[op](args[0])
    if op in _BINARY:
        return _BINARY[op](args[0], args[1])
    if op == "Gemm":
        a, b = args[0], args[1].T if attrs.get("transB", 0) else args[1]
        result = attrs.get("alpha", 1.0) * (a @ b)
        if len(args) > 2 and args[2] is not None:
            result = result + attrs.get("beta", 1.0) * args[2]
        return result
    if op == "Softmax":
        x = args[0]
        axis = int(attrs.get("axis", -1))
        shifted = np.exp(x - x.max(axis=axis, keepdims=True))
        return shifted / shifted.sum(axis=axis, keepdims=True)
    raise ValueError(f"unexpected op {op}")
