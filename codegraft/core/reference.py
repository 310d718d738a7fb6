"""Plain onnxruntime on the CPU: the reference every backend is checked against, and the
source of real values *inside* a model (a partition's inputs are some other node's outputs).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import onnx
import onnx_ir as ir

from codegraft.core.irversion import readable_by_runtime


def run_reference(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Outputs of onnxruntime (CPU, all graph optimisations off) on ``model``."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 4  # failures surface as exceptions; no second copy on stderr
    model = readable_by_runtime(model)  # onnx may write a newer IR version than onnxruntime reads
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, dict(feeds)), strict=True))


def values_inside(
    model: ir.Model,
    feeds: Sequence[Mapping[str, np.ndarray]],
    names: Iterable[str],
    *,
    threads: int | None = None,
) -> list[dict[str, np.ndarray]]:
    """For each set of ``feeds``, the graph outputs and the intermediate values ``names``.

    One onnxruntime session (``threads`` intra-op threads, its default when None) with the
    wanted values added as graph outputs; its errors propagate (the caller decides what a model
    the host cannot run means).
    """
    import onnxruntime as ort

    proto = ir.to_proto(model)
    known = {o.name for o in proto.graph.output}
    types = {v.name: v for v in proto.graph.value_info}
    for name in sorted(set(names) - known - {i.name for i in proto.graph.input}):
        proto.graph.output.append(types[name] if name in types else onnx.ValueInfoProto(name=name))
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads or 0
    options.log_severity_level = 3  # its optimiser's warnings are not the user's concern
    session = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    out_names = [o.name for o in session.get_outputs()]
    return [dict(zip(out_names, session.run(out_names, dict(f)), strict=True)) for f in feeds]


__all__ = ["run_reference", "values_inside"]
