"""The partitioned model as ONNX, for Netron: one node per partition, its body a local function.

Netron draws the top-level graph as a chain of partition nodes (domain
``codegraft.partition``, named ``p3_c`` and so on, with the backend in their metadata) and
opens each one's function to show the nodes inside.  Weights stay top-level initializers.
"""

from __future__ import annotations

import onnx
import onnx_ir as ir

from codegraft.plan.annotate import Annotation
from codegraft.plan.extract import Plan, partition_proto

PARTITION_DOMAIN = "codegraft.partition"


def partitioned_onnx(model: ir.Model, annotation: Annotation, plan: Plan) -> onnx.ModelProto:
    """Build the ONNX model described in the module docstring."""
    functions: list[onnx.FunctionProto] = []
    nodes: list[onnx.NodeProto] = []
    initializers: list[onnx.TensorProto] = []
    for part in plan.partitions:
        proto = partition_proto(model, annotation, part)
        graph = proto.graph
        weights = [t.name for t in graph.initializer]
        initializers.extend(graph.initializer)
        functions.append(
            onnx.helper.make_function(
                PARTITION_DOMAIN,
                part.name,
                [*part.inputs, *weights],
                list(part.outputs),
                list(graph.node),
                opset_imports=list(proto.opset_import),
            )
        )
        node = onnx.helper.make_node(
            part.name, [*part.inputs, *weights], list(part.outputs), name=part.name, domain=PARTITION_DOMAIN
        )
        entry = node.metadata_props.add()
        entry.key, entry.value = "codegraft.backend", part.backend
        node.doc_string = f"{part.backend}: {len(part.node_indices)} nodes"
        nodes.append(node)
    for name in plan.shared_constants:
        value = model.graph.initializers[name]
        assert value.const_value is not None
        tensor = ir.serde.serialize_tensor(value.const_value)
        tensor.name = name
        initializers.append(tensor)
    main = onnx.helper.make_graph(
        nodes,
        model.graph.name or "partitioned",
        [ir.serde.serialize_value(v) for v in model.graph.inputs],
        [ir.serde.serialize_value(v) for v in model.graph.outputs],
        initializer=initializers,
    )
    opsets = [onnx.helper.make_opsetid(d, v) for d, v in model.graph.opset_imports.items()]
    opsets.append(onnx.helper.make_opsetid(PARTITION_DOMAIN, 1))
    result = onnx.helper.make_model(main, opset_imports=opsets, functions=functions, producer_name="codegraft")
    result.ir_version = max(model.ir_version, 8)  # model-local functions need IR 8
    return result
