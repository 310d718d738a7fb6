"""A partition as C that builds oneDNN primitives once (``cg_build``) and runs them per call.

NOTE: the generated part is one call per node or fused group into the fixed helpers of
``prelude.c`` (``conv``, ``matmul``, ``pool``, ``binary``, ...), with every shape and
constant offset spelled out: the partition's shapes are static.  Weights are not in the
source: they go into one float32 array, each tensor at a 64-byte aligned offset, so the
compiled library is shared by every model of the same structure.  A fused group is emitted
at its last node: its inputs are computed by then (graph order is topological and a group
is convex) and nothing outside reads its inner values.

Example::

    program = generate(partition)     # .source (C), .weights (float32), shapes
"""

from __future__ import annotations

import pathlib
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from codegraft.backend import Partition
from codegraft.backends.c._node import attr_float, attr_int, attr_ints, attr_str, opset_of, present
from codegraft.backends.c.ops._window import window_of as _window
from codegraft.backends.dnnl._support import BINARY, COMMUTATIVE, ELTWISE, per_channel
from codegraft.errors import CodegraftError

PRELUDE = (pathlib.Path(__file__).parent / "prelude.c").read_text()
_ALIGN = 16  # floats: 64 bytes
_FLT_MAX = 3.4028234663852886e38


class LoweringError(CodegraftError):
    """The partition cannot be expressed with oneDNN primitives (names the node and why)."""


@dataclass(frozen=True)
class Program:
    """The generated C source, its weights and the partition's edge shapes."""

    source: str
    weights: np.ndarray
    input_shapes: tuple[tuple[int, ...], ...]
    output_shapes: tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class _Group:
    """A composite as the emitter sees it: its rule and resolved captures."""

    rule: str
    captures: dict[str, ir.Node | ir.Value]

    def node(self, name: str) -> ir.Node:
        item = self.captures.get(name)
        if not isinstance(item, ir.Node):
            raise LoweringError(f"capture {name!r} is missing")
        return item


def generate(partition: Partition) -> Program:
    """The C source and weights for ``partition``; :class:`LoweringError` when it cannot."""
    if any(v.shape is None for node in partition.model.graph for v in node.outputs):
        # a partition's inner values carry no shapes when its inputs were static already
        from onnx_ir.passes.common import ShapeInferencePass

        ShapeInferencePass()(partition.model)
    return _Emitter(partition).program()


def _dims(shape: tuple[int, ...]) -> str:
    return f"D({', '.join(str(d) for d in shape)})" if shape else "D(1)"


def _float(x: float) -> str:
    return f"{float(np.float32(max(min(x, _FLT_MAX), -_FLT_MAX)))!r}f"  # repr: always a C float literal


class _Emitter:
    def __init__(self, partition: Partition) -> None:
        self.partition = partition
        self.graph = partition.model.graph
        self.index: dict[ir.Value, int] = {}
        self.lines: list[str] = []
        self.chunks: list[tuple[int, np.ndarray]] = []
        self.size = 0
        # values whose memory is not a primitive's own result (an input, or a view of
        # another value): never written in place by a sum post-op
        self.borrowed: set[ir.Value] = set()

    # -- values, constants, shapes -----------------------------------------------------------
    def value(self, value: ir.Value | None) -> int:
        if value is None:
            raise LoweringError("an omitted input where a value is needed")
        if value not in self.index:
            self.index[value] = len(self.index)
        return self.index[value]

    def const(self, array: np.ndarray) -> int:
        """Offset (in floats) of ``array`` in the weights blob."""
        offset = self.size
        self.chunks.append((offset, array))  # copied once, into the blob, at the end
        self.size += -(-max(array.size, 1) // _ALIGN) * _ALIGN
        return offset

    def shape(self, value: ir.Value | None) -> tuple[int, ...]:
        if value is None or value.shape is None or not all(isinstance(d, int) for d in value.shape):
            raise LoweringError(f"value {getattr(value, 'name', None)!r} has no static shape")
        return tuple(int(d) for d in value.shape)  # type: ignore[arg-type]

    def emit(self, line: str) -> None:
        self.lines.append(f"    {line}")

    # -- the walk ------------------------------------------------------------------------------
    def program(self) -> Program:
        graph = self.graph
        inputs = [v for v in graph.inputs]
        for i, value in enumerate(inputs):
            shape = self.shape(value)
            self.emit(f"input(n, {i}, {self.value(value)}, {max(len(shape), 1)}, {_dims(shape)});")
            self.borrowed.add(value)
        groups = self._groups()
        for node in graph:
            if (node.name or "") in groups:
                group, last = groups[node.name or ""]
                if node is last:
                    self._emit_group(node, group)
                continue
            self._emit_node(node)
        outputs = list(graph.outputs)
        for j, value in enumerate(outputs):
            shape = self.shape(value)
            self.emit(f"output(n, {j}, {self.value(value)}, {max(len(shape), 1)}, {_dims(shape)});")
        header = (
            f"#define CG_VALUES {max(len(self.index), 1)}\n#define CG_INPUTS {len(inputs)}\n"
            f"#define CG_OUTPUTS {len(outputs)}\n"
        )
        body = "static void cg_build(net_t *n) {\n" + "\n".join(self.lines) + "\n}\n"
        weights = np.zeros(self.size, np.float32)
        for offset, array in self.chunks:
            weights[offset : offset + array.size] = array.reshape(-1)
        return Program(
            header + PRELUDE + body,
            weights,
            tuple(self.shape(v) for v in inputs),
            tuple(self.shape(v) for v in outputs),
        )

    def _groups(self) -> dict[str, tuple[_Group, ir.Node]]:
        """node name -> (the composite's rule and captures, its last node) for grouped nodes."""
        order = {node: i for i, node in enumerate(self.graph)}
        by_name = {node.name: node for node in self.graph}
        groups: dict[str, tuple[_Group, ir.Node]] = {}
        for composite in self.partition.composites:
            members = sorted((by_name[n] for n in composite.node_names if n in by_name), key=order.__getitem__)
            group = _Group(composite.rule, self.partition.captures(composite))
            for node in members:
                groups[node.name or ""] = (group, members[-1])
        return groups

    # -- fused groups ---------------------------------------------------------------------------
    def _emit_group(self, root: ir.Node, group: _Group) -> None:
        rule, captures = group.rule, group.captures
        try:
            if rule == "conv_sum_act":
                self._conv(group.node("conv"), captures, root.outputs[0])
            elif rule == "gemm_bias_act":
                self._matmul(group.node("gemm" if "gemm" in captures else "matmul"), captures, root.outputs[0])
            else:
                raise LoweringError(f"unknown fused group {rule!r}")
        except LoweringError as error:
            raise LoweringError(f"{rule} ending at {root.name} ({root.op_type}): {error}") from None

    def _post_ops(self, act: ir.Node | None, residual: bool) -> str:
        if act is None:
            return "SUM_ONLY" if residual else "NO_POST_OPS"
        alg, alpha, beta = self._eltwise_params(act)
        return f"{'SUM_ELTWISE' if residual else 'ELTWISE'}({alg}, {_float(alpha)}, {_float(beta)})"

    def _conv(self, conv: ir.Node, captures: dict[str, ir.Node | ir.Value], out: ir.Value) -> None:
        x, weight_value = conv.inputs[0], conv.inputs[1]
        if weight_value is None or weight_value.const_value is None:
            raise LoweringError("the weight is not a constant of this partition")
        weight = weight_value.const_value.numpy()
        in_shape, out_shape = self.shape(x), self.shape(out)
        group = attr_int(conv, "group", 1)
        spatial = len(in_shape) - 2
        window, _ = _window(conv, in_shape[2:], tuple(weight.shape[2:]), False)
        bias = np.zeros(weight.shape[0], np.float32)
        has_bias = False
        conv_bias = present(conv, 2)
        if conv_bias is not None:
            if conv_bias.const_value is None:
                raise LoweringError("the bias is not a constant of this partition")
            bias = bias + conv_bias.const_value.numpy().reshape(-1)
            has_bias = True
        extra = captures.get("bias")
        if isinstance(extra, ir.Value) and extra.const_value is not None:
            array = extra.const_value.numpy()
            if not per_channel(array.shape, len(out_shape), weight.shape[0]):
                raise LoweringError(f"bias Add of shape {array.shape} is not per channel")
            bias = bias + array.reshape(-1)
            has_bias = True
        w_shape = tuple(weight.shape)
        if group > 1:
            w_shape = (group, weight.shape[0] // group, *weight.shape[1:])
        residual = captures.get("residual")
        sum_value, in_place = -1, 0
        if isinstance(residual, ir.Value):
            sum_value = self.value(residual)
            sum_node = captures["sum"]
            in_place = int(
                residual not in self.borrowed
                and not residual.is_graph_output()
                and all(use.node is sum_node for use in residual.uses())
            )
        act = captures.get("act")
        post = self._post_ops(act if isinstance(act, ir.Node) else None, sum_value >= 0)
        zeros = (0,) * spatial
        self.emit(
            f"conv(n, {self.value(out)}, {self.value(x)}, {len(in_shape)}, {_dims(in_shape)}, {_dims(out_shape)}, "
            f"{self.const(weight)}, {len(w_shape)}, {_dims(w_shape)}, {self.const(bias) if has_bias else -1}, "
            f"{_dims(window.strides)}, {_dims(tuple(d - 1 for d in window.dilations) or zeros)}, "
            f"{_dims(window.pads_begin)}, {_dims(window.pads_end)}, {sum_value}, {in_place}, {post});"
        )

    def _matmul(self, node: ir.Node, captures: dict[str, ir.Node | ir.Value], out: ir.Value) -> None:
        a, b = node.inputs[0], node.inputs[1]
        if b is None or b.const_value is None:
            raise LoweringError("the weights are not a constant of this partition")
        weights = b.const_value.numpy()
        a_shape, out_shape = self.shape(a), self.shape(out)
        nd = len(out_shape)
        k, n_cols = a_shape[-1], out_shape[-1]
        lead = (1,) * (nd - 2)
        if node.op_type == "Gemm" and attr_int(node, "transB", 0):
            w_dims, w_strides = (*lead, k, n_cols), (*((k * n_cols,) * (nd - 2)), 1, k)
        else:
            w_dims, w_strides = (*lead, k, n_cols), (*((k * n_cols,) * (nd - 2)), n_cols, 1)
        bias_value = present(node, 2) if node.op_type == "Gemm" else captures.get("bias")
        b_off, b_dims = -1, (1,) * nd
        if isinstance(bias_value, ir.Value):
            if bias_value.const_value is None:
                raise LoweringError("the bias is not a constant of this partition")
            bias = bias_value.const_value.numpy()
            b_dims = (1,) * (nd - bias.ndim) + tuple(bias.shape)
            if len(b_dims) != nd or any(d not in (1, o) for d, o in zip(b_dims, out_shape, strict=True)):
                raise LoweringError(f"bias of shape {bias.shape} does not broadcast to {out_shape}")
            b_off = self.const(bias)
        act = captures.get("act")
        post = self._post_ops(act if isinstance(act, ir.Node) else None, False)
        self.emit(
            f"matmul(n, {self.value(out)}, {self.value(a)}, {nd}, {_dims(a_shape)}, {_dims(out_shape)}, "
            f"{self.const(weights)}, {_dims(w_dims)}, {_dims(w_strides)}, {b_off}, {_dims(b_dims)}, {post});"
        )

    # -- single nodes -------------------------------------------------------------------------
    def _emit_node(self, node: ir.Node) -> None:
        op_type = node.op_type
        try:
            if op_type == "Conv":
                self._conv(node, {}, node.outputs[0])
            elif op_type in ("Gemm", "MatMul"):
                self._matmul(node, {}, node.outputs[0])
            elif op_type in ELTWISE:
                alg, alpha, beta = self._eltwise_params(node)
                dst, src = self.value(node.outputs[0]), self.value(node.inputs[0])
                self.emit(f"eltwise(n, {dst}, {src}, {alg}, {_float(alpha)}, {_float(beta)});")
            elif op_type in BINARY:
                self._binary(node)
            elif op_type in ("MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool"):
                self._pool(node)
            elif op_type == "Concat":
                self._concat(node)
            elif op_type == "LayerNormalization":
                self._layernorm(node)
            elif op_type == "BatchNormalization":
                self._batchnorm(node)
            elif op_type == "LRN":
                size = attr_int(node, "size", 1)
                alpha, beta = attr_float(node, "alpha", 1e-4), attr_float(node, "beta", 0.75)
                dst, src = self.value(node.outputs[0]), self.value(node.inputs[0])
                self.emit(f"lrn(n, {dst}, {src}, {size}, {_float(alpha)}, {_float(beta)}, "
                          f"{_float(attr_float(node, 'bias', 1.0))});")
            elif op_type == "Softmax":
                shape = self.shape(node.inputs[0])
                axis = attr_int(node, "axis", -1 if opset_of(node) >= 13 else 1) % len(shape)
                dst, src = self.value(node.outputs[0]), self.value(node.inputs[0])
                self.emit(f"softmax(n, {dst}, {src}, {len(shape)}, {_dims(shape)}, {axis});")
            elif op_type in ("Identity", "Dropout"):
                self.emit(f"n->vals[{self.value(node.outputs[0])}] = n->vals[{self.value(node.inputs[0])}];")
                self.borrowed.add(node.outputs[0])
            elif op_type in ("Reshape", "Flatten", "Squeeze", "Unsqueeze"):
                in_shape, out_shape = self.shape(node.inputs[0]), self.shape(node.outputs[0])
                self.emit(
                    f"reshape(n, {self.value(node.outputs[0])}, {self.value(node.inputs[0])}, {max(len(in_shape), 1)}, "
                    f"{_dims(in_shape)}, {max(len(out_shape), 1)}, {_dims(out_shape)});"
                )
                self.borrowed.add(node.outputs[0])
            elif op_type == "Transpose":
                shape = self.shape(node.inputs[0])
                perm = attr_ints(node, "perm") or list(reversed(range(len(shape))))
                dst, src = self.value(node.outputs[0]), self.value(node.inputs[0])
                self.emit(f"transpose(n, {dst}, {src}, {len(shape)}, {_dims(shape)}, {_dims(tuple(perm))});")
            else:
                raise LoweringError("not implemented by the dnnl code generator")
        except LoweringError as error:
            raise LoweringError(f"{node.name} ({op_type}): {error}") from None

    def _eltwise_params(self, node: ir.Node) -> tuple[str, float, float]:
        op_type = node.op_type
        alpha, beta = 0.0, 0.0
        if op_type == "LeakyRelu":
            alpha = attr_float(node, "alpha", 0.01)
        elif op_type == "Elu":
            alpha = attr_float(node, "alpha", 1.0)
        elif op_type == "Neg":
            alpha = -1.0
        elif op_type == "Softplus":
            alpha = 1.0
        elif op_type == "HardSigmoid":
            alpha, beta = attr_float(node, "alpha", 0.2), attr_float(node, "beta", 0.5)
        elif op_type == "HardSwish":
            alpha, beta = 1.0 / 6.0, 0.5
        elif op_type == "Clip":
            alpha, beta = self._clip_bounds(node)
        alg = ELTWISE[op_type]
        if op_type == "Gelu" and attr_str(node, "approximate", "none") == "tanh":
            alg = "dnnl_eltwise_gelu_tanh"
        return alg, alpha, beta

    def _clip_bounds(self, node: ir.Node) -> tuple[float, float]:
        if opset_of(node) < 11:
            return attr_float(node, "min", -_FLT_MAX), attr_float(node, "max", _FLT_MAX)
        bounds = []
        for index, default in ((1, -_FLT_MAX), (2, _FLT_MAX)):
            value = present(node, index)
            if value is None:
                bounds.append(default)
            elif value.const_value is None:
                raise LoweringError("Clip bounds must be constants")
            else:
                bounds.append(float(value.const_value.numpy().reshape(-1)[0]))
        return bounds[0], bounds[1]

    def _binary(self, node: ir.Node) -> None:
        a, b, out = node.inputs[0], node.inputs[1], node.outputs[0]
        out_shape = self.shape(out)
        nd = len(out_shape)
        if a is None or b is None:
            raise LoweringError("an operand is missing")
        if node.op_type in COMMUTATIVE and (a.const_value is not None or self.shape(a) != out_shape):
            a, b = b, a
        if a.const_value is not None or self.shape(a) != out_shape:
            raise LoweringError("the first operand must be a computed value of the output's shape")
        b_shape = self.shape(b)
        b_dims = (1,) * (nd - len(b_shape)) + b_shape
        alg = BINARY[node.op_type]
        if b.const_value is not None and not b.is_graph_input():
            offset = self.const(b.const_value.numpy())
            self.emit(f"binary(n, {self.value(out)}, {alg}, {self.value(a)}, -1, {offset}, {nd}, {_dims(out_shape)}, "
                      f"{_dims(b_dims)}, 0);")
        else:
            same = int(b_dims == out_shape)
            self.emit(f"binary(n, {self.value(out)}, {alg}, {self.value(a)}, {self.value(b)}, -1, {nd}, "
                      f"{_dims(out_shape)}, {_dims(b_dims)}, {same});")

    def _pool(self, node: ir.Node) -> None:
        in_shape, out_shape = self.shape(node.inputs[0]), self.shape(node.outputs[0])
        spatial = in_shape[2:]
        if node.op_type.startswith("Global"):
            kernel, strides = spatial, (1,) * len(spatial)
            begin = end = (0,) * len(spatial)
        else:
            kernel = tuple(attr_ints(node, "kernel_shape") or ())
            window, out_spatial = _window(node, spatial, kernel, bool(attr_int(node, "ceil_mode", 0)))
            if tuple(out_spatial) != out_shape[2:]:
                raise LoweringError(f"output size {out_spatial} differs from the inferred {out_shape[2:]}")
            strides, begin = window.strides, window.pads_begin
            if any(d != 1 for d in window.dilations):
                raise LoweringError("dilated pooling is not supported")
            # oneDNN takes the right padding that yields the output size (ceil_mode included)
            geometry = zip(out_spatial, strides, kernel, spatial, begin, strict=True)
            end = tuple((o - 1) * s + k - i - b for o, s, k, i, b in geometry)
        if node.op_type in ("MaxPool", "GlobalMaxPool"):
            alg = "dnnl_pooling_max"
        elif attr_int(node, "count_include_pad", 0):
            alg = "dnnl_pooling_avg_include_padding"
        else:
            alg = "dnnl_pooling_avg_exclude_padding"
        self.emit(
            f"pool(n, {self.value(node.outputs[0])}, {self.value(node.inputs[0])}, {len(out_shape)}, "
            f"{_dims(out_shape)}, {alg}, {_dims(tuple(kernel))}, {_dims(tuple(strides))}, {_dims(tuple(begin))}, "
            f"{_dims(tuple(end))});"
        )

    def _concat(self, node: ir.Node) -> None:
        rank = len(self.shape(node.outputs[0]))
        axis = attr_int(node, "axis", 1) % rank
        sources = ", ".join(str(self.value(v)) for v in node.inputs)
        self.emit(f"concat(n, {self.value(node.outputs[0])}, {len(node.inputs)}, (const int[]){{{sources}}}, {axis});")

    def _layernorm(self, node: ir.Node) -> None:
        shape = self.shape(node.inputs[0])
        axis = attr_int(node, "axis", -1) % len(shape)
        rows, cols = int(np.prod(shape[:axis], dtype=np.int64)), int(np.prod(shape[axis:], dtype=np.int64))
        offsets = []
        for index in (1, 2):
            value = present(node, index)
            if value is not None and value.const_value is None:
                raise LoweringError("scale and bias must be constants of this partition")
            array = value.const_value.numpy() if value is not None and value.const_value is not None else None
            if array is not None and array.size != cols:
                array = np.broadcast_to(array, shape[axis:])  # broadcast over the normalised axes
            offsets.append(-1 if array is None else self.const(array))
        # normalised as [rows, cols] rows of the row-major value; the result is the input's shape
        result = self.value(node.outputs[0])
        self.emit(f"layernorm(n, {result}, {self.value(node.inputs[0])}, {len(shape)}, {_dims(shape)}, {rows}, {cols}, "
                  f"{offsets[0]}, {offsets[1]}, {_float(attr_float(node, 'epsilon', 1e-5))});")
        self.emit(f"n->vals[{result}] = view(n, n->vals[{result}], PLAIN({len(shape)}, {_dims(shape)}));")

    def _batchnorm(self, node: ir.Node) -> None:
        arrays = []
        for value in node.inputs[1:5]:
            if value is None or value.const_value is None:
                raise LoweringError("scale, bias, mean and variance must be constants of this partition")
            arrays.append(value.const_value.numpy().reshape(-1))
        offsets = ", ".join(str(self.const(a)) for a in arrays)
        self.emit(
            f"batchnorm(n, {self.value(node.outputs[0])}, {self.value(node.inputs[0])}, {arrays[0].size}, {offsets}, "
            f"{_float(attr_float(node, 'epsilon', 1e-5))});"
        )
