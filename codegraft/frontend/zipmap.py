"""ZipMap outputs: a classifier's probabilities as one dict per row, built after the graph runs.

NOTE: scikit-learn classifiers exported by skl2onnx end, by default, in ai.onnx.ml's ZipMap,
whose output is a sequence of maps (label -> probability), a type onnx-ir cannot hold, so such
a model could not be imported at all.  A ZipMap that makes a graph output only reshapes a
tensor into Python objects: it is taken off the graph, the tensor it reads becomes the output
the backends compute, and the executable builds the maps from it as onnxruntime returns them
(a list of dicts, labels as ints or strings, probabilities as floats).  The artifact carries
the labels (``output_maps`` in its header).

Example::

    proto, maps = split_zipmaps(onnx.load("logreg_iris.onnx"))
    maps[0].name, maps[0].tensor, maps[0].labels    # ('output_probability', 'probabilities', (0, 1, 2))
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
import onnx_ir as ir

METADATA_KEY = "codegraft.output_maps"  # where an imported model carries its maps to compile()


@dataclass(frozen=True)
class OutputMap:
    """Graph output ``name``: one ``{label: probability}`` per row of the tensor ``tensor``."""

    name: str
    tensor: str
    labels: tuple[int | str, ...]

    def build(self, values: np.ndarray) -> list[dict[int | str, float]]:
        """The maps of ``values`` (``[rows, labels]``, or one row), as onnxruntime gives them."""
        rows = np.asarray(values, dtype=np.float32).reshape(-1, len(self.labels)).tolist()  # Python floats
        return [dict(zip(self.labels, row, strict=True)) for row in rows]

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "tensor": self.tensor, "labels": list(self.labels)}

    @classmethod
    def from_json(cls, entry: Mapping[str, object]) -> OutputMap:
        labels = entry["labels"]
        assert isinstance(labels, list)
        return cls(str(entry["name"]), str(entry["tensor"]), tuple(labels))


def split_zipmaps(proto: onnx.ModelProto) -> tuple[onnx.ModelProto, tuple[OutputMap, ...]]:
    """``proto`` without the ZipMaps that make graph outputs (each output replaced by the
    tensor its ZipMap reads), and those maps; ``proto`` itself when it has none."""
    graph = proto.graph
    outputs = {o.name for o in graph.output}
    zipmaps = [n for n in graph.node if n.op_type == "ZipMap" and n.domain == "ai.onnx.ml" and n.output[0] in outputs]
    if not zipmaps:
        return proto, ()
    split = onnx.ModelProto()
    split.CopyFrom(proto)
    maps = []
    for node in zipmaps:
        attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        given = attributes.get("classlabels_int64s") or attributes.get("classlabels_strings") or []
        labels = tuple(int(v) if isinstance(v, int) else v.decode() if isinstance(v, bytes) else str(v) for v in given)
        maps.append(OutputMap(node.output[0], node.input[0], labels))
    gone = {m.name for m in maps}
    kept = [n for n in split.graph.node if not (n.op_type == "ZipMap" and n.output and n.output[0] in gone)]
    del split.graph.node[:]
    split.graph.node.extend(kept)
    already = {o.name for o in split.graph.output}
    new_outputs = []
    for output in split.graph.output:
        entry = next((m for m in maps if m.name == output.name), None)
        if entry is None:
            new_outputs.append(output)
        elif entry.tensor not in already:
            new_outputs.append(onnx.helper.make_tensor_value_info(entry.tensor, onnx.TensorProto.FLOAT, None))
            already.add(entry.tensor)
    del split.graph.output[:]
    split.graph.output.extend(new_outputs)
    return split, tuple(maps)


def attach(model: ir.Model, maps: Sequence[OutputMap], outputs: Sequence[str]) -> None:
    """Record ``maps`` and the model's ``outputs`` as its user sees them (in order: a map's name
    where its ZipMap stood) in the imported model, for :func:`of_model` at compile time."""
    if maps:
        model.metadata_props[METADATA_KEY] = json.dumps({"outputs": list(outputs), "maps": [m.to_json() for m in maps]})


def of_model(model: ir.Model) -> tuple[tuple[OutputMap, ...], list[str] | None]:
    """The output maps and visible outputs :func:`attach` recorded (none for most models)."""
    text = model.metadata_props.get(METADATA_KEY)
    if not text:
        return (), None
    recorded = json.loads(text)
    return tuple(OutputMap.from_json(entry) for entry in recorded["maps"]), list(recorded["outputs"])
