"""The artifact header's schema: every field's type and range, and that the schedule holds together.

NOTE: the header is data from a file, so nothing in it is trusted before :func:`validate_header`
has passed: its hashes only prove the bytes are the ones written, not that the writer was
codegraft (see ``signature.py`` for who wrote it).  The checks are what the loader and the
runtime rely on: each payload lies inside the file, each dtype is a numpy dtype, each
constant's size matches its shape, every value a step reads exists by then, every output is
computed or given.  A failure names the field, e.g. ``steps[1].outputs[0]``.

Example::

    validate_header(json.loads(text), payload_size=len(payload), where="model.cgx")
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from codegraft.errors import ArtifactError

PRECISIONS = frozenset({"float32", "float16", "bfloat16", "int8"})
_SHA256 = re.compile(r"[0-9a-f]{64}")
_TOP = {"format_version": int, "codegraft_version": str, "inputs": list, "outputs": list, "steps": list,
        "constants": list, "native_code": bool, "report": dict}
_STEP = {"name": str, "backend": str, "inputs": list, "outputs": list, "native_code": bool, "precision": str,
         "composites": list}


class _Checker:
    def __init__(self, where: str, payload_size: int) -> None:
        self.where = where
        self.payload_size = payload_size

    def fail(self, path: str, problem: str) -> ArtifactError:
        return ArtifactError(f"{self.where}: malformed artifact header: {path} {problem}")

    def fields(self, value: Any, path: str, fields: Mapping[str, type]) -> Mapping[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(path, f"must be an object, not {_kind(value)}")
        for name, kind in fields.items():
            if name not in value:
                raise self.fail(path, f"lacks {name!r}")
            self.typed(value[name], f"{path}.{name}" if path else name, kind)
        return value

    def typed(self, value: Any, path: str, kind: type) -> Any:
        # bool is an int in Python; JSON true is not a count, and 1 is not a flag
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise self.fail(path, f"must be {kind.__name__}, not {_kind(value)}")
        return value

    def strings(self, value: Any, path: str, *, unique: bool = False) -> list[str]:
        self.typed(value, path, list)
        for index, item in enumerate(value):
            self.typed(item, f"{path}[{index}]", str)
        if unique and len(set(value)) != len(value):
            raise self.fail(path, f"lists a name twice: {sorted({v for v in value if value.count(v) > 1})}")
        return value

    def dtype(self, value: Any, path: str, *, allow_empty: bool = False) -> None:
        self.typed(value, path, str)
        if allow_empty and value == "":
            return
        try:
            dtype = np.dtype(value)
        except TypeError:
            raise self.fail(path, f"is not a dtype: {value!r}") from None
        if dtype.name != value or dtype.hasobject and value != "object":
            raise self.fail(path, f"is not a dtype name: {value!r}")

    def payload(self, value: Any, path: str) -> int:
        entry = self.fields(value, path, {"offset": int, "size": int, "sha256": str})
        offset, size = entry["offset"], entry["size"]
        if offset < 0 or size < 0 or offset + size > self.payload_size:
            raise self.fail(path, f"points outside the file (offset {offset}, size {size}, "
                                  f"payload {self.payload_size} bytes)")
        if not _SHA256.fullmatch(entry["sha256"]):
            raise self.fail(f"{path}.sha256", "is not a SHA-256 in hex")
        return int(size)


def _check_bound(check: _Checker, spec: dict[str, Any], path: str) -> None:
    """A bound input (``input_values``): numbers, as many as its fixed shape holds, of a numeric dtype."""
    bound, shape = spec["bound"], spec.get("shape")
    check.typed(bound, f"{path}.bound", list)
    if not all(isinstance(v, int | float) for v in bound):  # bool is an int: a bound flag
        raise check.fail(f"{path}.bound", "must be a list of numbers")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
        raise check.fail(f"{path}.shape", "must be fixed sizes for a bound input")
    if int(np.prod(shape, dtype=np.int64)) != len(bound):
        raise check.fail(f"{path}.bound", f"holds {len(bound)} values; its shape {shape} holds {int(np.prod(shape))}")
    if not spec["dtype"] or np.dtype(spec["dtype"]).kind not in "biuf":
        raise check.fail(f"{path}.dtype", "must be numeric for a bound input")


def validate_header(header: Any, *, payload_size: int, where: str, control_backend: str) -> None:
    """Raise :class:`ArtifactError` naming the first field that is missing, mistyped or inconsistent."""
    check = _Checker(where, payload_size)
    check.fields(header, "", _TOP)
    threads = header.get("threads", 0)  # the host's (absent in artifacts before it was kept)
    if check.typed(threads, "threads", int) < 0:
        raise check.fail("threads", f"must be 0 (all cores) or more, not {threads}")
    available: set[str] = set()
    for index, spec in enumerate(header["inputs"]):
        path = f"inputs[{index}]"
        check.fields(spec, path, {"name": str, "dtype": str})
        check.dtype(spec["dtype"], f"{path}.dtype", allow_empty=True)
        shape = spec.get("shape")
        if shape is not None:
            check.typed(shape, f"{path}.shape", list)
            for axis, dim in enumerate(shape):
                if dim is not None and not isinstance(dim, str) and not (
                    isinstance(dim, int) and not isinstance(dim, bool) and dim >= 0
                ):
                    raise check.fail(f"{path}.shape[{axis}]", f"must be a size, a name or null, not {dim!r}")
        if "bound" in spec:
            _check_bound(check, spec, path)
        _add(check, available, spec["name"], path)
    for index, constant in enumerate(header["constants"]):
        path = f"constants[{index}]"
        check.fields(constant, path, {"name": str, "dtype": str, "shape": list})
        check.dtype(constant["dtype"], f"{path}.dtype")
        if np.dtype(constant["dtype"]).hasobject:
            raise check.fail(f"{path}.dtype", "cannot be object: constants are raw bytes")
        for axis, dim in enumerate(constant["shape"]):
            if not isinstance(dim, int) or isinstance(dim, bool) or dim < 0:
                raise check.fail(f"{path}.shape[{axis}]", f"must be a size, not {dim!r}")
        size = check.payload(constant, path)
        expected = math.prod(constant["shape"]) * np.dtype(constant["dtype"]).itemsize
        if size != expected:
            raise check.fail(path, f"holds {size} bytes; {constant['dtype']}{constant['shape']} needs {expected}")
        _add(check, available, constant["name"], path)
    for index, step in enumerate(header["steps"]):
        path = f"steps[{index}]"
        check.fields(step, path, _STEP)
        if step["precision"] not in PRECISIONS:
            raise check.fail(f"{path}.precision", f"is {step['precision']!r}; one of {sorted(PRECISIONS)}")
        for c, composite in enumerate(step["composites"]):
            check.fields(composite, f"{path}.composites[{c}]", {"rule": str, "instance": str, "node_names": list})
            check.strings(composite["node_names"], f"{path}.composites[{c}].node_names")
        for what in ("blob", "template"):
            if what not in step:
                raise check.fail(path, f"lacks {what!r}")
            if step[what] is not None:
                check.payload(step[what], f"{path}.{what}")
        if step["blob"] is None and (step["template"] is None or step["backend"] == control_backend):
            raise check.fail(path, "has no compiled blob" + ("" if step["backend"] == control_backend
                                                             else " and no model to compile"))
        for i, name in enumerate(check.strings(step["inputs"], f"{path}.inputs")):
            if name not in available:
                raise check.fail(f"{path}.inputs[{i}]", f"reads {name!r}, which no input, constant or earlier "
                                                         "step provides")
        for i, name in enumerate(check.strings(step["outputs"], f"{path}.outputs", unique=True)):
            _add(check, available, name, f"{path}.outputs[{i}]")
    built = _output_maps(check, header.get("output_maps", []), available)
    outputs = check.strings(header["outputs"], "outputs", unique=True)
    if not outputs:
        raise check.fail("outputs", "is empty: the model would compute nothing")
    for index, name in enumerate(outputs):
        if name not in available and name not in built:
            raise check.fail(f"outputs[{index}]", f"names {name!r}, which nothing computes")


def _output_maps(check: _Checker, entries: Any, available: set[str]) -> set[str]:
    """The outputs built from a computed tensor after the run (a ZipMap's); their names."""
    if not isinstance(entries, list):
        raise check.fail("output_maps", f"is {_kind(entries)}, expected a list")
    names = set()
    for index, entry in enumerate(entries):
        path = f"output_maps[{index}]"
        check.fields(entry, path, {"name": str, "tensor": str, "labels": list})
        if entry["tensor"] not in available:
            raise check.fail(f"{path}.tensor", f"names {entry['tensor']!r}, which nothing computes")
        if not all(isinstance(v, (int, str)) and not isinstance(v, bool) for v in entry["labels"]):
            raise check.fail(f"{path}.labels", "must be integers or strings")
        names.add(entry["name"])
    return names


def _add(check: _Checker, available: set[str], name: str, path: str) -> None:
    if not name:
        raise check.fail(path, "has an empty name")
    if name in available:
        raise check.fail(path, f"defines {name!r} a second time")
    available.add(name)


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__
