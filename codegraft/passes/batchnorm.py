"""Fold an inference-mode BatchNormalization into the Conv before it.

NOTE: ``BatchNormalization(Conv(x, W, b))`` with constant statistics is one Conv with
``W' = W * s`` (per output channel) and ``b' = (b - mean) * s + beta``, where
``s = scale / sqrt(var + epsilon)``.  Every backend gains: one op fewer to run, and a
Conv + bias + activation epilogue that fused kernels (the ``c`` backend, oneDNN, OpenVINO)
already handle.  The arithmetic is done in float64 and stored as float32, so the folded
Conv matches the unfolded pair to float32 rounding.

Folded only when it is exact: float32 (or float64) tensors, the BatchNormalization's
scale/bias/mean/var and the Conv's weight (and bias) constant, the Conv's output read by
the BatchNormalization alone, one output (inference mode), ``training_mode`` off.

Example::

    folded = fold_batchnorm_into_conv(model)    # in place; returns how many were folded
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from codegraft.passes._graph_util import register_constant

__all__ = ["fold_batchnorm_into_conv"]


def fold_batchnorm_into_conv(model: ir.Model) -> int:
    """Fold every foldable Conv -> BatchNormalization pair of the main graph; see the module note."""
    graph = model.graph
    count = 0
    for bn in list(graph):
        conv = _foldable_conv(bn)
        if conv is None:
            continue
        weight_value, bias_value = conv.inputs[1], conv.inputs[2] if len(conv.inputs) > 2 else None
        assert weight_value is not None and weight_value.const_value is not None
        weight = weight_value.const_value.numpy().astype(np.float64)
        scale, beta, mean, var = (_required(bn.inputs[i]).astype(np.float64) for i in range(1, 5))
        epsilon = bn.attributes.get_float("epsilon", 1e-5)
        factor = scale / np.sqrt(var + epsilon)
        bias = _required(bias_value).astype(np.float64) if bias_value is not None else np.zeros_like(mean)
        dtype = weight_value.const_value.numpy().dtype
        new_weight = (weight * factor.reshape(-1, *([1] * (weight.ndim - 1)))).astype(dtype)
        new_bias = ((bias - mean) * factor + beta).astype(dtype)
        base = conv.name or "conv"
        weight_const = _initializer(graph, f"{base}_bn_folded_weight", new_weight)
        bias_const = _initializer(graph, f"{base}_bn_folded_bias", new_bias)
        conv.replace_input_with(1, weight_const)
        if len(conv.inputs) > 2:
            conv.replace_input_with(2, bias_const)
        else:
            # onnx-ir nodes have fixed inputs: rebuild the Conv with its bias
            conv = _with_bias(graph, conv, bias_const)
        out = bn.outputs[0]
        conv_out = conv.outputs[0]
        conv_out.type, conv_out.shape = out.type, out.shape
        out.replace_all_uses_with(conv_out)
        graph.remove(bn, safe=True)
        count += 1
    return count


def _foldable_conv(bn: ir.Node) -> ir.Node | None:
    """The Conv ``bn`` can be folded into, or None."""
    if bn.op_type != "BatchNormalization" or bn.domain not in ("", "ai.onnx"):
        return None
    if len(bn.outputs) != 1 or bn.attributes.get_int("training_mode", 0) != 0 or len(bn.inputs) != 5:
        return None
    if any(_constant(v) is None for v in bn.inputs[1:]):
        return None
    x = bn.inputs[0]
    conv = x.producer() if x is not None else None
    if conv is None or conv.op_type != "Conv" or conv.domain not in ("", "ai.onnx") or conv.graph is not bn.graph:
        return None
    if x is None or len(x.uses()) != 1 or x.is_graph_output():
        return None
    weight = conv.inputs[1] if len(conv.inputs) > 1 else None
    bias = conv.inputs[2] if len(conv.inputs) > 2 else None
    if weight is None or weight.const_value is None or (bias is not None and _constant(bias) is None):
        return None
    if weight.const_value.numpy().dtype not in (np.float32, np.float64):
        return None
    channels = weight.const_value.numpy().shape[0]
    if any(_required(v).size != channels for v in bn.inputs[1:]):
        return None
    return conv


def _constant(value: ir.Value | None) -> np.ndarray | None:
    if value is None or value.const_value is None:
        return None
    return value.const_value.numpy()


def _required(value: ir.Value | None) -> np.ndarray:
    array = _constant(value)
    assert array is not None, "checked by _foldable_conv"
    return array


def _initializer(graph: ir.Graph, name: str, array: np.ndarray) -> ir.Value:
    taken = set(graph.initializers)
    unique, n = name, 1
    while unique in taken:
        unique, n = f"{name}_{n}", n + 1
    return register_constant(graph, unique, array)


def _with_bias(graph: ir.Graph, conv: ir.Node, bias: ir.Value) -> ir.Node:
    """A copy of ``conv`` reading ``bias`` as its third input, in its place in the graph."""
    x, weight = conv.inputs[0], conv.inputs[1]
    new = ir.Node(
        conv.domain,
        "Conv",
        [x, weight, bias],
        list(conv.attributes.values()),
        num_outputs=1,
        name=conv.name,
        version=conv.version,
    )
    old_out, new_out = conv.outputs[0], new.outputs[0]
    new_out.type, new_out.shape = old_out.type, old_out.shape
    graph.insert_after(conv, new)
    old_out.replace_all_uses_with(new_out)
    name = old_out.name
    graph.remove(conv, safe=True)
    new_out.name = name
    return new
