"""Which nodes the ``iree`` backend takes: answered from a survey of IREE, not from its docs.

NOTE: ``support.json`` is written by ``python -m bench.iree_support``, which runs the onnx
wheel's conformance cases and one-node cases of common ops through this backend (IREE's
importer, ``iree-compile``, IREE's runtime) and compares with the reference outputs.  Ops are
keyed by type and the rank of their first input (``MaxPool/5`` is a 3-D pool), since IREE's
lowerings differ by rank.  A node is taken when its key (or, for a rank never tried, its op)
passed and never failed alone; a node whose key only failed is declined with what the survey
saw.  A partition that still fails to compile runs on the host, reported.
"""

from __future__ import annotations

import functools
import json
import pathlib
from dataclasses import dataclass

import onnx_ir as ir

from codegraft.backend import Support

SUPPORT_FILE = pathlib.Path(__file__).with_name("support.json")
# Nodes with subgraphs: codegraft runs If/Loop/Scan itself and offers their bodies to the targets.
_CONTROL_FLOW = frozenset({"If", "Loop", "Scan", "SequenceMap"})


# Attributes that select a different lowering in IREE (reflect padding fails where constant passes).
_DISTINGUISHING = {"Pad": "mode", "Resize": "mode"}


def op_key(node: ir.Node) -> str:
    """``"<op>[:<mode>]/<rank of the first input>"``; without the rank when it is unknown."""
    op = node.op_type
    attribute = _DISTINGUISHING.get(op)
    if attribute is not None:
        value = node.attributes.get(attribute)
        op = f"{op}:{value.as_string() if value is not None else 'default'}"
    first = node.inputs[0] if node.inputs else None
    shape = first.shape if first is not None else None
    return f"{op}/{len(shape)}" if shape is not None else op


@dataclass(frozen=True)
class _Verdicts:
    passed: frozenset[str]  # keys and bare op types that passed somewhere
    failed: dict[str, str]  # key or bare op type -> first failure seen alone


@functools.cache
def _verdicts() -> _Verdicts:
    data = json.loads(SUPPORT_FILE.read_text())
    passed: set[str] = set()
    failed: dict[str, str] = {}
    for case in data["cases"]:
        keys = case["ops"]
        if not case["error"]:
            passed.update(keys)
            passed.update(k.split("/")[0] for k in keys)
        elif len(keys) == 1:
            failed.setdefault(keys[0], f"{case['case']}: {case['error']}")
            failed.setdefault(keys[0].split("/")[0], f"{case['case']}: {case['error']}")
    return _Verdicts(frozenset(passed), failed)


def supports(node: ir.Node) -> Support:
    """Yes, or why not, from the survey (see the module note)."""
    if node.domain not in ("", "ai.onnx"):
        return Support.no(f"{node.op_type}: domain {node.domain!r} is not imported by IREE's ONNX importer")
    if node.op_type in _CONTROL_FLOW:
        return Support.no(f"{node.op_type}: control flow runs in codegraft, its bodies are offered separately")
    unranked = [v.name for v in node.inputs if v is not None and v.shape is None and v.const_value is None]
    if unranked:
        # IREE's lowerings work on ranked tensors; an input of unknown rank fails to legalize.
        return Support.no(f"{node.op_type}: input {unranked[0]!r} has no known rank (IREE needs ranked tensors)")
    verdicts = _verdicts()
    key = op_key(node)
    op = key.split("/")[0]
    if key in verdicts.passed:
        return Support.yes()
    if key in verdicts.failed:
        return Support.no(f"{op}: fails on IREE ({verdicts.failed[key]})")
    if op in verdicts.passed:
        return Support.yes()  # this rank untried; a compile failure would fall back to the host
    if op in verdicts.failed:
        return Support.no(f"{op}: fails on IREE ({verdicts.failed[op]})")
    return Support.no(f"{node.op_type}: not covered by the IREE survey (bench/iree_support.py)")
