"""Storing a control group in the artifact: ``u32 size | JSON program | nested body artifacts``.

NOTE: no pickle.  The bodies are executables, stored as whole artifacts of their own; the
caller says how (``save_body``, ``load_body``), so this module needs neither the artifact
writer nor the reader and no import cycle closes through it.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Sequence

from codegraft.runtime.control import Body, ControlGroupRunnable, ControlNode
from codegraft.runtime.executable import Executable

SaveBody = Callable[[Executable], bytes]
LoadBody = Callable[[bytes, str], Executable]


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
        program_nodes.append({"name": node.name, "op": node.op, "inputs": list(node.inputs),
                              "outputs": list(node.outputs), "bodies": bodies})
    program = json.dumps({"inputs": list(inputs), "outputs": list(outputs), "nodes": program_nodes}).encode()
    return struct.pack("<I", len(program)) + program + b"".join(chunks)


def load_control_blob(blob: bytes, load_body: LoadBody) -> ControlGroupRunnable:
    """Inverse of :func:`control_blob`; ``load_body`` loads each nested artifact."""
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
        nodes.append(ControlNode(entry["name"], entry["op"], tuple(entry["inputs"]), tuple(entry["outputs"]), bodies))
    return ControlGroupRunnable(nodes, program["inputs"], program["outputs"])


__all__ = ["LoadBody", "SaveBody", "control_blob", "load_control_blob"]
