"""Storing a control group in the artifact: ``u32 size | JSON program | nested body artifacts``.

NOTE: no pickle.  The bodies are executables, stored as whole artifacts of their own; the
caller says how (``save_body``, ``load_body``), so this module needs neither the artifact
writer nor the reader and no import cycle closes through it.  A Loop that chooses its plan per
input shapes (:mod:`codegraft.runtime.loop_choice`) also stores the node as ONNX, its inputs
and the targets it counts for; ``load_plans`` rebuilds its :class:`LoopPlans` (the loader
resolves the targets and the host).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Sequence

from codegraft.runtime.control import Body, ControlGroupRunnable, ControlNode
from codegraft.runtime.executable import Executable
from codegraft.runtime.loop_choice import LoopPlans

SaveBody = Callable[[Executable], bytes]
LoadBody = Callable[[bytes, str], Executable]
# (Loop name, the node as ONNX, its inputs, its targets' names) -> its plans
LoadPlans = Callable[[str, bytes, tuple[str, ...], tuple[str, ...]], LoopPlans]


def control_blob(
    nodes: Sequence[ControlNode], inputs: Sequence[str], outputs: Sequence[str], save_body: SaveBody
) -> bytes:
    """Serialise a control group; ``save_body`` turns each body's executable into its artifact."""
    chunks: list[bytes] = []
    offset = 0
    program_nodes = []
    for node in nodes:
        bodies = {}
        for attribute, body in node.bodies.items():
            data = save_body(body.executable) if body.executable is not None else b""
            bodies[attribute] = {"formal": list(body.formal), "outer": list(body.outer),
                                 "offset": offset, "size": len(data)}
            if body.executable is None:
                bodies[attribute]["unrunnable"] = body.unrunnable
            chunks.append(data)
            offset += len(data)
        entry = {"name": node.name, "op": node.op, "inputs": list(node.inputs),
                 "outputs": list(node.outputs), "bodies": bodies}
        if node.whole is not None:
            entry["whole"] = {"inputs": list(node.whole.inputs), "targets": [b.name for b in node.whole.targets],
                              "offset": offset, "size": len(node.whole.model)}
            chunks.append(node.whole.model)
            offset += len(node.whole.model)
        program_nodes.append(entry)
    program = json.dumps({"inputs": list(inputs), "outputs": list(outputs), "nodes": program_nodes}).encode()
    return struct.pack("<I", len(program)) + program + b"".join(chunks)


def load_control_blob(blob: bytes, load_body: LoadBody, load_plans: LoadPlans) -> ControlGroupRunnable:
    """Inverse of :func:`control_blob`; ``load_body`` loads each nested artifact, ``load_plans``
    each Loop's choice of plans."""
    (size,) = struct.unpack_from("<I", blob)
    program = json.loads(blob[4 : 4 + size])
    data = blob[4 + size :]
    nodes = []
    for entry in program["nodes"]:
        bodies = {}
        for attribute, body in entry["bodies"].items():
            unrunnable = str(body.get("unrunnable", ""))
            nested = data[body["offset"] : body["offset"] + body["size"]]
            executable = None if unrunnable else load_body(nested, f"{entry['name']}.{attribute}")
            bodies[attribute] = Body(attribute, tuple(body["formal"]), tuple(body["outer"]), executable, unrunnable)
        whole = None
        if "whole" in entry:
            stored = entry["whole"]
            model = bytes(data[stored["offset"] : stored["offset"] + stored["size"]])
            whole = load_plans(entry["name"], model, tuple(stored["inputs"]), tuple(stored["targets"]))
        nodes.append(ControlNode(entry["name"], entry["op"], tuple(entry["inputs"]), tuple(entry["outputs"]), bodies,
                                 whole))
    return ControlGroupRunnable(nodes, program["inputs"], program["outputs"])


__all__ = ["LoadBody", "LoadPlans", "SaveBody", "control_blob", "load_control_blob"]
