"""A fuzzer for codegraft's promise: bad input gets a codegraft error, never a traceback, a crash,
a hang or a silently wrong answer.

Cases are small JSON descriptors (a kind and a seed) generated deterministically, so a failure
is replayed from its descriptor alone::

    .venv/bin/python tests/fuzz_harness.py '{"kind": "model", "seed": 17}'

Four kinds: ``model`` (a seed model mutated in its protobuf fields or its bytes, compiled for
random targets, run, and compared with onnxruntime when onnxruntime runs it too), ``feed``
(odd feeds to compiled seed models, results compared with onnxruntime), ``artifact`` (saved
artifacts with bytes flipped, or their JSON header edited with every hash recomputed; signed
ones loaded with trusted keys must be refused) and ``cli`` (random command lines).

NOTE: cases run in worker subprocesses, a batch per worker, each case announced before it
starts; when a worker dies (a signal: the crash this is here to find) or stops answering, the
case it was on is counted as a crash or a hang and a fresh worker takes the next one.  So a
crash is counted, never fatal, without paying a Python start-up per case.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import pathlib
import random
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

KINDS = ("model", "feed", "artifact", "cli")
TARGET_CHOICES = ([], ["c"], ["openvino"], ["c", "openvino"])
OUTCOMES_OK = ("ok", "error")  # ran, or refused with codegraft's own error
FAILURES = ("escape", "crash", "hang", "wrong", "cli")


def make_cases(count: int, seed: int = 0, kinds: tuple[str, ...] = KINDS) -> list[dict[str, Any]]:
    """``count`` case descriptors spread over ``kinds``, reproducible from ``seed``."""
    return [{"kind": kinds[i % len(kinds)], "seed": seed * 1_000_003 + i} for i in range(count)]


# -- seed models -------------------------------------------------------------------------------

def seed_model(index: int) -> onnx.ModelProto:
    """Small models every backend takes: a conv net (static) and an elementwise chain (batch N)."""
    rng = np.random.default_rng(index)
    if index % 2 == 0:
        nodes = [
            helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
            helper.make_node("Relu", ["c"], ["r"], name="relu"),
            helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2], name="pool"),
            helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
            helper.make_node("Gemm", ["f", "g"], ["l"], name="gemm"),
            helper.make_node("Softmax", ["l"], ["y"], axis=-1, name="softmax"),
        ]
        inits = [numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w"),
                 numpy_helper.from_array(rng.standard_normal((64, 5)).astype(np.float32), "g")]
        graph = helper.make_graph(nodes, "convnet", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                   [2, 3, 8, 8])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5])], inits)
    else:
        nodes = [
            helper.make_node("Add", ["a", "b"], ["s"], name="add"),
            helper.make_node("Mul", ["s", "k"], ["m"], name="mul"),
            helper.make_node("Sigmoid", ["m"], ["g"], name="sigmoid"),
            helper.make_node("Tanh", ["s"], ["t"], name="tanh"),
            helper.make_node("Clip", ["t", "lo", "hi"], ["c"], name="clip"),
            helper.make_node("Exp", ["c"], ["e"], name="exp"),
            helper.make_node("Max", ["g", "e"], ["y"], name="max"),
            helper.make_node("Relu", ["m"], ["z"], name="relu"),
        ]
        inits = [numpy_helper.from_array(rng.standard_normal((1, 6)).astype(np.float32), "k"),
                 numpy_helper.from_array(np.array(-0.5, np.float32), "lo"),
                 numpy_helper.from_array(np.array(0.5, np.float32), "hi")]
        graph = helper.make_graph(
            nodes, "chain",
            [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["N", 6]),
             helper.make_tensor_value_info("b", TensorProto.FLOAT, ["N", 6])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 6]),
             helper.make_tensor_value_info("z", TensorProto.FLOAT, ["N", 6])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


class TooBigToFeed(Exception):
    """A (mutated) model declares an input too large to feed on a shared test machine."""


MAX_FEED_ELEMENTS = 1 << 22
MEMORY_LIMIT_BYTES = 8 << 30  # per worker: a runaway allocation fails here instead of waking the OOM killer


def random_feeds(specs: list[tuple[str, str, Any]], rng: random.Random) -> dict[str, np.ndarray]:
    """Feeds for (name, dtype, shape) specs; free dimensions 2."""
    feeds = {}
    for name, dtype, shape in specs:
        dims = [d if isinstance(d, int) and d >= 0 else 2 for d in (shape or [])]
        if int(np.prod(dims, dtype=np.float64)) > MAX_FEED_ELEMENTS:
            raise TooBigToFeed(f"input {name} declares {dims}")
        dt = np.dtype(dtype or "float32")
        if dt.kind == "f":
            feeds[name] = np.asarray(np.random.default_rng(rng.randrange(2**31)).standard_normal(dims), dtype=dt)
        elif dt.kind in "iub":
            feeds[name] = np.random.default_rng(rng.randrange(2**31)).integers(0, 3, size=dims).astype(dt)
        else:
            feeds[name] = np.full(dims, "s", dtype=object)
    return feeds


# -- model mutations ---------------------------------------------------------------------------

_OPS = ["Relu", "Conv", "Gemm", "Softmax", "Bogus", "Add", "Identity", "MaxPool", "Reshape", "If", "Loop", "Cast",
        "Exp", "Clip", "Flatten", "MatMul", "Concat", "Split", ""]
_ELEM_TYPES = [TensorProto.DOUBLE, TensorProto.INT64, TensorProto.STRING, TensorProto.BOOL, TensorProto.FLOAT16,
               TensorProto.UNDEFINED, TensorProto.BFLOAT16, 999]
_BAD_TEXT = "\udcff"  # a lone surrogate: serialises to bytes that are not UTF-8


def _names(model: onnx.ModelProto) -> list[str]:
    graph = model.graph
    names = [v.name for v in (*graph.input, *graph.output)] + [t.name for t in graph.initializer]
    return names + [o for n in graph.node for o in (*n.input, *n.output)]


def _mutate_model(model: onnx.ModelProto, rng: random.Random) -> tuple[str, onnx.ModelProto | bytes]:
    graph = model.graph
    choice = rng.randrange(22)
    node = graph.node[rng.randrange(len(graph.node))] if graph.node else None
    if choice == 0:
        model.opset_import[0].version = rng.choice([0, 1, 6, 7, 99, -1, 10**6])
        return f"opset {model.opset_import[0].version}", model
    if choice == 1:
        value = rng.choice([*graph.input, *graph.output])
        dims = value.type.tensor_type.shape.dim
        if dims:
            dim = dims[rng.randrange(len(dims))]
            new = rng.choice([0, -1, 1, 3, 10**9, "sym"])
            if isinstance(new, str):
                dim.dim_param = new
            else:
                dim.dim_value = new
            return f"dim of {value.name} -> {new}", model
        return "no dims", model
    if choice == 2:
        value = rng.choice([*graph.input, *graph.output])
        value.type.tensor_type.elem_type = rng.choice(_ELEM_TYPES)
        return f"elem_type of {value.name}", model
    if choice == 3 and node is not None:
        node.op_type = rng.choice(_OPS)
        return f"op {node.name} -> {node.op_type!r}", model
    if choice == 4 and node is not None:
        graph.node.remove(node)
        return f"removed {node.name}", model
    if choice == 5 and node is not None:
        graph.node.append(copy.deepcopy(node))
        return f"duplicated {node.name}", model
    if choice == 6 and node is not None and node.input:
        node.input[rng.randrange(len(node.input))] = rng.choice(["ghost", "", *_names(model), node.output[0]])
        return f"input of {node.name} rewired", model
    if choice == 7 and node is not None:
        name = rng.choice(["axis", "pads", "kernel_shape", "strides", "alpha", "group", "perm", "to", "bogus"])
        value = rng.choice([0, -5, 99, [0, 0], [-1, -1, -1, -1], [1] * 9, 1.5, "text", [2.5]])
        if rng.random() < 0.3:
            del node.attribute[:]
        node.attribute.append(helper.make_attribute(name, value))
        return f"attribute {name}={value!r} on {node.name}", model
    if choice == 8:
        graph.output.append(copy.deepcopy(graph.output[0]))
        return "output listed twice", model
    if choice == 9:
        del graph.output[:]
        return "no outputs", model
    if choice == 10:
        graph.output.append(helper.make_tensor_value_info("nowhere", TensorProto.FLOAT, [1]))
        return "output nothing computes", model
    if choice == 11 and graph.initializer:
        init = graph.initializer[rng.randrange(len(graph.initializer))]
        try:
            array = numpy_helper.to_array(init).copy()
        except ValueError:  # an earlier mutation broke it already
            return "initializer already broken", model
        if array.size and rng.random() < 0.5:
            array.flat[rng.randrange(array.size)] = rng.choice([np.nan, np.inf, -np.inf, 3e38])
            init.CopyFrom(numpy_helper.from_array(array.astype(np.float32), init.name))
            return f"non-finite in {init.name}", model
        del init.dims[:]
        init.dims.extend(rng.choice([[], [1], [2, 2], [0], [-1], [3, 0, 2]]))
        return f"dims of {init.name} mismatched", model
    if choice == 12 and graph.initializer:
        init = graph.initializer[rng.randrange(len(graph.initializer))]
        init.data_type = rng.choice(_ELEM_TYPES[:-1])
        return f"data_type of {init.name}", model
    if choice == 13:
        target = rng.choice(["node", "doc", "value", "graph"])
        data = model.SerializeToString()
        marker = {"node": (node.name if node else "g"), "doc": None,
                  "value": graph.input[0].name if graph.input else graph.name, "graph": graph.name}[target]
        if marker is None:
            model.doc_string = "DOCSTRING"
            data, marker = model.SerializeToString(), "DOCSTRING"
        text = marker.encode()
        bad = (text[:-2] + b"\xff\xfe") if len(text) >= 2 else b"\xff"  # same length: the wire format holds
        return f"invalid UTF-8 in {target}", data.replace(text, bad, 1)
    if choice == 14:
        del graph.node[:]
        del graph.output[:]
        del graph.input[:]
        return "empty graph", model
    if choice == 15 and node is not None:
        node.input.append(node.output[0])
        return f"{node.name} reads its own output", model
    if choice == 16 and graph.initializer:
        init = graph.initializer[rng.randrange(len(graph.initializer))]
        init.CopyFrom(numpy_helper.from_array(np.array(["a", "b"], dtype=object), init.name))
        return f"{init.name} a string initializer", model
    data = model.SerializeToString()
    if choice in (17, 18, 19):
        flipped = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            flipped[rng.randrange(len(flipped))] ^= 1 << rng.randrange(8)
        return "bytes flipped", bytes(flipped)
    if choice == 20:
        return "truncated", data[: rng.randrange(len(data))]
    return "garbage appended", data + bytes(rng.randrange(256) for _ in range(rng.randint(1, 64)))


# -- running a case, inside a worker -----------------------------------------------------------

@dataclass
class Outcome:
    """What happened to one case; ``status`` is one of ok, error, escape, wrong, cli, crash, hang."""

    case: dict[str, Any]
    status: str
    detail: str = ""
    mutation: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def _compare(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> str:
    """Why ``got`` differs from onnxruntime's ``want`` (NaN where NaN, Inf where Inf), or ''."""
    for name, expected in want.items():
        if name not in got:
            return f"output {name!r} missing"
        actual = np.asarray(got[name])
        expected = np.asarray(expected)
        if actual.shape != expected.shape:
            return f"{name}: shape {actual.shape}, onnxruntime {expected.shape}"
        if expected.dtype.kind != "f":
            if not np.array_equal(actual, expected):
                return f"{name}: values differ"
            continue
        a, e = actual.astype(np.float64), expected.astype(np.float64)
        if not np.array_equal(np.isnan(a), np.isnan(e)):
            return f"{name}: NaN at other places than onnxruntime's"
        inf = np.isinf(e)
        if not np.array_equal(a[inf], e[inf]) or not np.isfinite(a[np.isfinite(e)]).all():
            return f"{name}: Inf at other places than onnxruntime's"
        finite = np.isfinite(e)
        if finite.any():
            err = float(np.max(np.abs(a[finite] - e[finite])))
            scale = max(float(np.max(np.abs(e[finite]))), 1e-3)
            if err > 1e-3 * scale + 1e-5:
                return f"{name}: max abs error {err:.3g} (scale {scale:.3g})"
    return ""


def _onnxruntime(model: onnx.ModelProto | bytes, feeds: dict[str, Any]) -> dict[str, np.ndarray] | None:
    """onnxruntime's outputs, or None where it refuses the model or the feeds."""
    import onnxruntime as ort

    data = model if isinstance(model, bytes) else model.SerializeToString()
    try:
        session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        return dict(zip(names, session.run(names, feeds), strict=True))
    except Exception:
        return None


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Dependencies log warnings (and onnx-ir tracebacks) to stderr; the worker's stdout is the
    protocol, so silence the noise: what counts is what escapes."""
    import logging

    logging.disable(logging.CRITICAL)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)


_EXE_CACHE: dict[Any, Any] = {}


def _compiled(index: int, targets: tuple[str, ...]) -> Any:
    import codegraft as cg

    key = (index, targets)
    if key not in _EXE_CACHE:
        _EXE_CACHE[key] = cg.compile(seed_model(index), targets=list(targets))
    return _EXE_CACHE[key]


def run_model_case(case: dict[str, Any]) -> Outcome:
    import codegraft as cg

    rng = random.Random(case["seed"])
    model = seed_model(rng.randrange(2))
    mutation, mutated = "", model
    for _ in range(rng.choice([1, 1, 2])):
        if isinstance(mutated, bytes):
            break
        what, mutated = _mutate_model(mutated, rng)
        mutation += ("; " if mutation else "") + what
    targets = rng.choice(TARGET_CHOICES)
    try:
        exe = cg.compile(mutated, targets=targets)
        feeds = random_feeds([(s.name, s.dtype, s.shape) for s in exe.inputs], rng)
        got = exe.run(feeds)
    except cg.CodegraftError as error:
        return Outcome(case, "error", f"{type(error).__name__}: {error}", mutation)
    except TooBigToFeed as error:
        return Outcome(case, "ok", f"compiled; not run: {error}", mutation)
    want = _onnxruntime(mutated, feeds)
    if want is None:
        return Outcome(case, "ok", "onnxruntime refuses this model; codegraft ran it", mutation, {"lenient": True})
    return _judged(case, exe, _compare(got, want), mutation)


def _judged(case: dict[str, Any], exe: Any, why: str, what: str) -> Outcome:
    """A mismatch is 'wrong', except OpenVINO's documented NaN/Inf handling (README: not ours
    to fix; its kernels turn NaN finite)."""
    if why and ("NaN" in why or "Inf" in why) and "openvino" in [s.backend for s in exe.steps]:
        return Outcome(case, "ok", f"openvino non-finite (documented): {why}", what, {"openvino_nan": True})
    return Outcome(case, "wrong" if why else "ok", why, what)


_FEED_MUTATIONS = ("nan", "inf", "huge", "denormal", "zero batch", "batch 7", "dtype", "rank", "dim", "ragged",
                   "nested list", "scalar", "none", "string", "missing", "extra", "fortran", "negative strides",
                   "non-contiguous", "read-only", "positional", "list not dict", "bytes", "object array", "tiny")


def _mutate_feeds(feeds: dict[str, np.ndarray], rng: random.Random) -> tuple[str, Any, bool]:
    """(what, the mutated feeds, whether onnxruntime's answer is comparable)."""
    what = rng.choice(_FEED_MUTATIONS)
    name = rng.choice(sorted(feeds))
    x = feeds[name]
    out: dict[str, Any] = dict(feeds)
    if what in ("nan", "inf", "huge", "denormal", "tiny"):
        y = x.copy()
        value = {"nan": np.nan, "inf": rng.choice([np.inf, -np.inf]), "huge": 3e38, "denormal": 1e-40,
                 "tiny": -1e-30}[what]
        y.flat[rng.randrange(y.size)] = value
        if rng.random() < 0.3:
            y[...] = value
        out[name] = y
        return what, out, True
    if what == "zero batch":
        return what, {k: v[:0] for k, v in feeds.items()}, True
    if what == "batch 7":
        return what, {k: np.concatenate([v] * 4)[:7] for k, v in feeds.items()}, True
    if what == "dtype":
        out[name] = x.astype(rng.choice([np.float64, np.int64, np.float16, np.bool_]))
    elif what == "rank":
        out[name] = x[None]
    elif what == "dim":
        out[name] = np.concatenate([x, x], axis=-1)
    elif what == "ragged":
        out[name] = [[1.0, 2.0], [3.0]]
    elif what == "nested list":
        out[name] = x.tolist()
        return what, out, False
    elif what == "scalar":
        out[name] = np.float32(1.0)
    elif what == "none":
        out[name] = None
    elif what == "string":
        out[name] = "not an array"
    elif what == "missing":
        del out[name]
    elif what == "extra":
        out["extra_input"] = x
    elif what == "fortran":
        out[name] = np.asfortranarray(x)
        return what, out, True
    elif what == "negative strides":
        out[name] = np.ascontiguousarray(x[::-1])[::-1]
        return what, out, True
    elif what == "non-contiguous":
        out[name] = np.repeat(x, 2, axis=-1)[..., ::2]
        return what, out, True
    elif what == "read-only":
        y = x.copy()
        y.flags.writeable = False
        out[name] = y
        return what, out, True
    elif what == "positional":
        return what, list(feeds.values()) + [x], False
    elif what == "list not dict":
        return what, list(feeds.values()), False
    elif what == "bytes":
        out[name] = x.tobytes()
    else:
        out[name] = x.astype(object)
    return what, out, False


def run_feed_case(case: dict[str, Any]) -> Outcome:
    import codegraft as cg

    rng = random.Random(case["seed"])
    index = rng.randrange(2)
    targets = tuple(rng.choice(TARGET_CHOICES))
    exe = _compiled(index, targets)
    feeds = random_feeds([(s.name, s.dtype, s.shape) for s in exe.inputs], rng)
    what, mutated, comparable = _mutate_feeds(feeds, rng)
    try:
        got = exe.run(*mutated) if isinstance(mutated, list) else exe.run(mutated)
    except cg.CodegraftError as error:
        return Outcome(case, "error", f"{type(error).__name__}: {error}", what)
    if not comparable:
        return Outcome(case, "ok", "ran", what)
    want = _onnxruntime(seed_model(index), {k: np.ascontiguousarray(v) for k, v in mutated.items()})
    if want is None:
        return Outcome(case, "ok", "onnxruntime refuses these feeds; codegraft ran them", what, {"lenient": True})
    return _judged(case, exe, _compare(got, want), what)


def _json_paths(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    paths = [path]
    if isinstance(value, dict):
        for key, item in value.items():
            paths += _json_paths(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            paths += _json_paths(item, (*path, index))
    return paths


_JSON_VALUES: list[Any] = [None, -1, 0, 2**70, "bogus", "", [], {}, True, 1.5, [None], {"a": 1}, "float32", "x" * 1000]


def _edit_header(header: dict[str, Any], rng: random.Random) -> str:
    paths = [p for p in _json_paths(header) if p and p[0] != "report"] or [("outputs",)]
    path = rng.choice(paths)
    parent = header
    for key in path[:-1]:
        parent = parent[key]
    key = path[-1]
    action = rng.choice(["set", "set", "delete", "duplicate"])
    if action == "delete":
        del parent[key]
    elif action == "duplicate" and isinstance(parent, list):
        parent.insert(int(key), copy.deepcopy(parent[key]))
    else:
        parent[key] = copy.deepcopy(rng.choice(_JSON_VALUES))
    return f"header {action} {'.'.join(map(str, path))}"


_ARTIFACTS: dict[Any, bytes] = {}
_KEYS: dict[str, bytes] = {}


def _keys() -> dict[str, bytes]:
    if not _KEYS:
        from codegraft.runtime.signature import generate_key

        _KEYS["private"], _KEYS["public"] = generate_key()
    return _KEYS


def run_artifact_case(case: dict[str, Any]) -> Outcome:
    import codegraft as cg
    from codegraft.runtime.signature import sign_artifact

    sys.path.insert(0, str(pathlib.Path(__file__).parent))
    from artifact_util import join, split

    rng = random.Random(case["seed"])
    index = rng.randrange(2)
    targets = tuple(rng.choice(TARGET_CHOICES))
    exe = _compiled(index, targets)
    key = (index, targets)
    if key not in _ARTIFACTS:
        with tempfile.TemporaryDirectory() as folder:
            exe.save(pathlib.Path(folder) / "a.cgx")
            _ARTIFACTS[key] = (pathlib.Path(folder) / "a.cgx").read_bytes()
    data = _ARTIFACTS[key]
    signed = rng.random() < 0.25
    style = rng.choice(["flip", "flip", "truncate", "append", "header", "header", "header"])
    if style == "flip":
        flipped = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            flipped[rng.randrange(len(flipped))] ^= 1 << rng.randrange(8)
        what, mutated = "bytes flipped", bytes(flipped)
    elif style == "truncate":
        what, mutated = "truncated", data[: rng.randrange(len(data))]
    elif style == "append":
        what, mutated = "garbage appended", data + os.urandom(rng.randint(1, 200))
    else:
        header, payload = split(data)
        what = _edit_header(header, rng)
        mutated = join(header, payload)
    if signed:  # signed, then changed: with the trusted key it must never load
        mutated = sign_artifact(data, _keys()["private"])
        cut = len(mutated) - 104
        body = bytearray(mutated[:cut])
        body[rng.randrange(len(body))] ^= 1 << rng.randrange(8)
        mutated = bytes(body) + mutated[cut:]
        what = "signed, then a byte flipped"
    with tempfile.TemporaryDirectory() as folder:
        path = pathlib.Path(folder) / "m.cgx"
        path.write_bytes(mutated)
        try:
            loaded = cg.load_executable(path, trusted_keys=[_keys()["public"]] if signed else [])
            if signed:
                return Outcome(case, "wrong", "a tampered signed artifact loaded with the trusted key", what)
            feeds = random_feeds([(s.name, s.dtype, s.shape) for s in exe.inputs], rng)
            got = loaded.run(feeds)
        except cg.CodegraftError as error:
            return Outcome(case, "error", f"{type(error).__name__}: {error}", what)
    want = exe.run(feeds)
    if sorted(got) != sorted(want) or any(np.shape(got[k]) != np.shape(want[k]) for k in want):
        return Outcome(case, "wrong", f"outputs {sorted(got)} vs {sorted(want)} (shapes differ?)", what)
    return Outcome(case, "ok", "loaded and ran", what)


def _crash_self(case: dict[str, Any]) -> Outcome:
    """The harness's own check: a worker killed by a signal is counted as a crash."""
    import signal

    os.kill(os.getpid(), signal.SIGSEGV)
    raise AssertionError("unreachable")


def run_case(case: dict[str, Any]) -> Outcome:
    """Run one case in this process; anything but codegraft's own errors is an ``escape``."""
    runner: Callable[[dict[str, Any]], Outcome] = {
        "model": run_model_case, "feed": run_feed_case, "artifact": run_artifact_case, "cli": run_cli_case,
        "crash-self": _crash_self,
    }[case["kind"]]
    try:
        with _quiet(), contextlib.redirect_stdout(io.StringIO()):
            return runner(case)
    except Exception as error:
        return Outcome(case, "escape", "".join(traceback.format_exception(error))[-3000:])


# -- the command line ---------------------------------------------------------------------------

def _cli_argv(rng: random.Random, folder: pathlib.Path) -> list[str]:
    model, artifact = str(folder / "m.onnx"), str(folder / "m.cgx")
    # a device, through a link in the case's folder: never the machine's /dev/null itself
    device = str(folder / "devnull")
    paths = [model, artifact, str(folder / "missing.onnx"), str(folder), device, str(folder / "bad.onnx"),
             str(folder / "bad.cgx"), ""]
    command = rng.choice(["compile", "run", "inspect", "verify", "sign", "keygen", "backends", "compare", "bogus",
                          "--version", "run", "compile"])
    argv = [command]
    if command in ("compile", "run", "inspect", "verify", "sign", "compare"):
        argv.append(rng.choice([model, model, artifact, artifact, *paths]))
    options = [
        ["-t", rng.choice(["c", "openvino", "onnxruntime", "bogus", ""])], ["-o", rng.choice(paths + [artifact])],
        ["--precision", rng.choice(["float32", "bfloat16", "fp8", ""])],
        ["--min-partition-size", rng.choice(["-1", "0", "abc", "3"])], ["--random"],
        ["--input", rng.choice(["x=missing.npy", "x", "=", f"a={device}"])],
        ["--shape", rng.choice(["x=0x3x8x8", "x=abc", "a=1x6", "a=0x6", "y=1"])], ["--seed", rng.choice(["-1", "x"])],
        ["--runs", rng.choice(["0", "-3", "1"])], ["--trusted-key", rng.choice(paths)], ["--key", rng.choice(paths)],
        ["--json"], ["--sign", rng.choice(paths)], ["--save", rng.choice(paths)], ["--bogus-option"],
        ["--placement", rng.choice(["measured", "bogus"])], [rng.choice(paths)],
    ]
    if command != "backends" or rng.random() < 0.3:
        for _ in range(rng.randint(0, 3)):
            argv += rng.choice(options)
    if command == "keygen":
        argv = ["keygen", rng.choice([str(folder / "k"), str(folder / "nodir" / "k"), str(folder), device])]
    if command == "run" and rng.random() < 0.5:
        argv += ["--random"]
    return argv


def _cli_files(folder: pathlib.Path) -> None:
    import codegraft as cg

    onnx.save(seed_model(0), folder / "m.onnx")
    (folder / "devnull").symlink_to("/dev/null")
    (folder / "bad.onnx").write_bytes(b"\x08\x07garbage" * 10)
    (folder / "bad.cgx").write_bytes(b"CODEGRAFT\x00CGX\nshort")
    cg.compile(seed_model(0), targets=["c"]).save(folder / "m.cgx")


def run_cli_case(case: dict[str, Any]) -> Outcome:
    rng = random.Random(case["seed"])
    with tempfile.TemporaryDirectory() as name:
        folder = pathlib.Path(name)
        _cli_files(folder)
        argv = _cli_argv(rng, folder)
        env = {k: v for k, v in os.environ.items() if k != "CODEGRAFT_TRUSTED_KEYS"}
        env["COLUMNS"] = "50"
        done = subprocess.run([sys.executable, "-m", "codegraft._cli", *argv], capture_output=True, text=True,
                              cwd=folder, env=env, timeout=300)
    shown = " ".join(a.replace(str(folder), "$TMP") for a in argv)
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    if done.returncode < 0:
        return Outcome(case, "crash", f"signal {-done.returncode}", shown)
    if "Traceback" in done.stderr or done.returncode == 3:
        return Outcome(case, "cli", f"exit {done.returncode}: {done.stderr[-1500:]}", shown)
    errors = [ln for ln in lines if ln.startswith("error: ")]
    if done.returncode == 2 and (len(errors) != 1 or lines[-1] != errors[0]):
        # one error line, last (progress lines such as "loading m.cgx: 1.2 s" may come before)
        return Outcome(case, "cli", f"error is not one line: {done.stderr[-800:]!r}", shown)
    if done.returncode not in (0, 1, 2):
        return Outcome(case, "cli", f"exit {done.returncode}", shown)
    return Outcome(case, "error" if done.returncode else "ok", lines[0] if lines else "", shown)


# -- the harness ---------------------------------------------------------------------------------

def _outcome_json(outcome: Outcome) -> str:
    return json.dumps({"case": outcome.case, "status": outcome.status, "detail": outcome.detail,
                       "mutation": outcome.mutation, "extra": outcome.extra})


_MARK = "@@fuzz "


def worker(cases: list[dict[str, Any]]) -> None:
    """Run ``cases`` in this process, announcing each before it starts (see the module note)."""
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))
    out = sys.__stdout__
    assert out is not None
    for case in cases:
        out.write(_MARK + json.dumps({"start": case}) + "\n")
        out.flush()
        outcome = _outcome_json(run_case(case))
        out.write(_MARK + outcome + "\n")
        out.flush()


def run_cases(cases: list[dict[str, Any]], *, case_timeout: float = 300.0) -> list[Outcome]:
    """Run ``cases`` in worker subprocesses; a crash or hang is an outcome, not the end."""
    outcomes: list[Outcome] = []
    pending = list(cases)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("CODEGRAFT_TRUSTED_KEYS", None)
    while pending:
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
            json.dump(pending, handle)
        process = subprocess.Popen([sys.executable, __file__, "--worker", handle.name], stdout=subprocess.PIPE,
                                   stderr=subprocess.DEVNULL, text=True, env=env)
        current: dict[str, Any] | None = None
        assert process.stdout is not None
        try:
            for line in _lines_with_timeout(process, case_timeout):
                if not line.startswith(_MARK):
                    continue  # something a native library printed
                message = json.loads(line[len(_MARK):])
                if "start" in message:
                    current = message["start"]
                    continue
                outcomes.append(Outcome(message["case"], message["status"], message["detail"], message["mutation"],
                                        message["extra"]))
                pending.pop(0)
                current = None
        except TimeoutError:
            process.kill()
            outcomes.append(Outcome(current or pending[0], "hang", f"no answer in {case_timeout:.0f} s"))
            pending.pop(0)
            continue
        finally:
            os.unlink(handle.name)
        code = process.wait()
        if current is not None:
            outcomes.append(Outcome(current, "crash", f"worker died with exit {code} during this case"))
            pending.pop(0)
    return outcomes


def _lines_with_timeout(process: subprocess.Popen[str], timeout: float) -> Iterator[str]:
    import selectors

    assert process.stdout is not None
    selector = selectors.DefaultSelector()
    selector.register(process.stdout, selectors.EVENT_READ)
    while True:
        if not selector.select(timeout):
            raise TimeoutError
        line = process.stdout.readline()
        if not line:
            return
        yield line


def summary(outcomes: list[Outcome], seconds: float) -> str:
    """Counts per kind and status, then every failure with its descriptor (to replay it)."""
    counts: dict[str, dict[str, int]] = {}
    for outcome in outcomes:
        per_kind = counts.setdefault(outcome.case["kind"], {})
        per_kind[outcome.status] = per_kind.get(outcome.status, 0) + 1
    lines = [f"{len(outcomes)} cases in {seconds:.0f} s"]
    for kind, per_status in sorted(counts.items()):
        lines.append(f"  {kind:<9}" + ", ".join(f"{status} {n}" for status, n in sorted(per_status.items())))
    lenient = sum(1 for o in outcomes if o.extra.get("lenient"))
    if lenient:
        lines.append(f"  ran {lenient} case(s) onnxruntime refuses (not failures; see each 'ok' detail)")
    documented = sum(1 for o in outcomes if o.extra.get("openvino_nan"))
    if documented:
        lines.append(f"  {documented} case(s) where OpenVINO turned NaN/Inf finite (documented, not ours to fix)")
    for outcome in outcomes:
        if outcome.status in FAILURES:
            lines.append(f"FAIL {outcome.status}: {json.dumps(outcome.case)} [{outcome.mutation}] "
                         f"{outcome.detail.strip()[-1200:]}")
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    if argv and argv[0] == "--worker":
        worker(json.loads(pathlib.Path(argv[1]).read_text()))
        return
    if argv and argv[0].startswith("{"):  # replay one case, here, with its traceback
        outcome = run_case(json.loads(argv[0]))
        print(outcome.status, outcome.mutation, outcome.detail, sep="\n")
        return
    count = int(argv[0]) if argv else 100
    started = time.perf_counter()
    outcomes = run_cases(make_cases(count, seed=int(argv[1]) if len(argv) > 1 else 0))
    print(summary(outcomes, time.perf_counter() - started))


if __name__ == "__main__":
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
    main(sys.argv[1:])
