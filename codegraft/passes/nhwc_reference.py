"""Run ``codegraft.nhwc`` ops anywhere: rewrite each one as Transpose -> ONNX op -> Transpose.

The reference semantics of the domain (see ``NHWC.md``), used by our tests and usable by a
backend's tests: a model after :func:`codegraft.passes.to_nhwc`, passed through
:func:`lower_nhwc`, runs on onnxruntime and must match the original model.
"""

from __future__ import annotations

import onnx_ir as ir

from codegraft.passes._layout_rules import NHWC_DOMAIN, channels_last, permute_shape

__all__ = ["lower_nhwc"]


def lower_nhwc(model: ir.Model) -> ir.Model:
    """Replace (in place) every ``codegraft.nhwc`` node by its default-domain equivalent."""
    graph = model.graph
    for node in list(graph):
        if node.domain != NHWC_DOMAIN:
            continue
        data = node.inputs[0]
        assert data is not None and data.shape is not None, f"{node.name}: input rank unknown"
        rank = len(data.shape)
        to_last = channels_last(rank)
        to_first = tuple(to_last.index(axis) for axis in range(rank))
        new_nodes = [_transpose(data, to_first)]
        inputs = [new_nodes[0].outputs[0], *node.inputs[1:]]
        if node.op_type == "Conv" and inputs[1] is not None:
            new_nodes.append(_transpose(inputs[1], to_first))  # OHWI -> OIHW
            inputs[1] = new_nodes[-1].outputs[0]
        plain = ir.Node("", node.op_type, inputs, list(node.attributes.values()))
        new_nodes.append(plain)
        back = _transpose(plain.outputs[0], to_last)
        new_nodes.append(back)
        graph.insert_before(node, new_nodes)
        result = node.outputs[0]
        back.outputs[0].shape, back.outputs[0].type = result.shape, result.type
        result.replace_all_uses_with(back.outputs[0], replace_graph_outputs=True)
        name = result.name
        graph.remove(node, safe=True)
        back.outputs[0].name = name
    model.opset_imports.pop(NHWC_DOMAIN, None)
    return model


def _transpose(value: ir.Value, perm: tuple[int, ...]) -> ir.Node:
    node = ir.Node("", "Transpose", [value], [ir.AttrInt64s("perm", list(perm))])
    node.outputs[0].shape = permute_shape(value.shape, perm)
    node.outputs[0].type = value.type
    return node
