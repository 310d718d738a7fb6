"""Finding backends: built-ins, entry-point plugins (the example package), unavailability."""

from __future__ import annotations

import importlib.metadata
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import codegraft as cg
from codegraft.testing import assert_close, random_feeds, run_onnxruntime

EXAMPLE = pathlib.Path(__file__).parents[1] / "examples" / "numpy-backend"


@pytest.fixture(scope="module")
def example_plugin(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The example plugin, installed the way a user would (``make test`` installs it too)."""
    if any(e.name == "numpy_example" for e in importlib.metadata.entry_points(group="codegraft.backends")):
        return
    target = tmp_path_factory.mktemp("site")
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(EXAMPLE)],
        capture_output=True, text=True, check=False,
    )
    if result.returncode != 0:
        pytest.skip(f"could not pip-install the example plugin: {result.stderr.strip()[-300:]}")
    sys.path.insert(0, str(target))
    importlib.invalidate_caches()


def _mlp() -> object:
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal((16, 32)).astype(np.float32) / 4, "w1"),
        numpy_helper.from_array(rng.standard_normal(32).astype(np.float32), "b1"),
        numpy_helper.from_array(rng.standard_normal((32, 8)).astype(np.float32) / 6, "w2"),
    ]
    graph = helper.make_graph(
        [
            helper.make_node("Gemm", ["x", "w1", "b1"], ["h"]),
            helper.make_node("Relu", ["h"], ["r"]),
            helper.make_node("LayerNormalization", ["r", "b1"], ["n"], axis=-1),
            helper.make_node("MatMul", ["n", "w2"], ["z"]),
            helper.make_node("Softmax", ["z"], ["y"], axis=-1),
        ],
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])],
        initializer=inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_example_plugin_is_found_and_compiles(example_plugin: None) -> None:
    infos = {i.name: i for i in cg.list_backends()}
    assert infos["numpy_example"].available and infos["numpy_example"].origin == "codegraft-numpy-backend"
    model = _mlp()
    exe = cg.compile(model, targets=["numpy_example"])
    assert [s.backend for s in exe.steps] == ["numpy_example", "onnxruntime", "numpy_example"]
    layer_norm = next(n for n in exe.report().nodes if n.op_type == "LayerNormalization")
    assert dict(layer_norm.declined)["numpy_example"] == "LayerNormalization not implemented"
    feeds = random_feeds(model, dim_values={"batch": 5})
    assert_close(exe.run(feeds), run_onnxruntime(model, feeds))


def test_builtins_are_listed_with_reasons() -> None:
    infos = {i.name: i for i in cg.list_backends()}
    assert {"onnxruntime", "openvino", "c"} <= set(infos)
    assert infos["onnxruntime"].available
    for info in infos.values():
        assert info.available or info.reason


def test_unavailable_backend_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    from codegraft import backends

    def missing() -> cg.Backend:
        raise cg.BackendUnavailable("the 'mycc' compiler is not on PATH")

    monkeypatch.setitem(backends.BUILTIN_BACKENDS, "mine", missing)
    with pytest.raises(cg.BackendUnavailable, match="backend 'mine' is unavailable: the 'mycc' compiler"):
        cg.compile(_mlp(), targets=["mine"])
    assert {i.name: i.reason for i in cg.list_backends()}["mine"].endswith("is not on PATH")



def test_compile_threads_reach_every_backend_named_by_string(
    monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path
) -> None:
    """``compile(threads=T)`` is one knob: the host, every built-in named by string and a vendor
    factory taking ``threads`` get T; a backend object keeps its own; the artifact keeps the host's."""
    from codegraft import backends
    from codegraft.backends.c import CBackend
    from codegraft.compiler.driver import resolve_targets
    from codegraft.testing import SubsetBackend

    asked: list[int] = []

    def vendor(threads: int = 0) -> cg.Backend:
        asked.append(threads)
        return SubsetBackend("vendor", {"Relu"})

    monkeypatch.setitem(backends.BUILTIN_BACKENDS, "vendor", vendor)
    monkeypatch.setitem(backends.BUILTIN_BACKENDS, "plain", lambda: SubsetBackend("plain", {"Gemm"}))
    c, ort, measuring, _, _ = resolve_targets(["c", "onnxruntime", "c:measure-threads", "vendor", "plain"], threads=3)
    assert isinstance(c, CBackend) and isinstance(measuring, CBackend)
    assert (c.num_threads, measuring.num_threads, measuring.measure_threads, getattr(ort, "threads", None)) == (
        3, 3, True, 3,
    )
    assert asked == [3]
    unset = resolve_targets(["c", "vendor"])[0]
    assert isinstance(unset, CBackend) and unset.num_threads is None and asked == [3, 0]
    own = CBackend(num_threads=2)
    assert resolve_targets([own], threads=3) == [own] and own.num_threads == 2

    exe = cg.compile(_mlp(), targets=["vendor", "plain"], threads=1)
    assert asked[-1] == 1 and exe.host_threads == 1
    feeds = random_feeds(_mlp(), dim_values={"batch": 2})
    want = exe.run(feeds)
    exe.save(tmp_path / "m.cgx")
    supplied = [SubsetBackend("vendor", {"Relu"}), SubsetBackend("plain", {"Gemm"})]
    again = cg.load_executable(tmp_path / "m.cgx", backends=supplied)
    assert again.host_threads == 1
    assert_close(again.run(feeds), want)
    # threads given at load, as onnxruntime's are set per session: the host and what is found by name
    reloaded = cg.load_executable(tmp_path / "m.cgx", backends=[SubsetBackend("plain", {"Gemm"})], threads=2)
    assert reloaded.host_threads == 2 and asked[-1] == 2
    assert_close(reloaded.run(feeds), want)
    assert cg.load_executable(tmp_path / "m.cgx", backends=supplied, threads=0).host_threads == 0
    with pytest.raises(cg.OptionError, match="threads"):
        cg.load_executable(tmp_path / "m.cgx", backends=supplied, threads=-1)


def test_an_entry_point_factory_gets_its_options_and_threads(
    monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path
) -> None:
    """A vendor's factory found by entry point takes ``spec`` (after the colon) and ``threads``
    where it declares them; one without ``spec`` refuses options by name."""
    from codegraft import backends

    (tmp_path / "vendor_pkg.py").write_text(
        "from codegraft.testing import SubsetBackend\n"
        "def make(spec=None, threads=0):\n"
        "    backend = SubsetBackend('tuned:' + spec if spec else 'tuned', {'Relu'})\n"
        "    backend.threads = threads\n"
        "    return backend\n"
        "def plain():\n"
        "    return SubsetBackend('plain', {'Relu'})\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    group = backends.ENTRY_POINT_GROUP
    found = [importlib.metadata.EntryPoint("tuned", "vendor_pkg:make", group),
             importlib.metadata.EntryPoint("plain", "vendor_pkg:plain", group),
             importlib.metadata.EntryPoint("gone", "no_such_vendor_pkg:make", group)]
    monkeypatch.setattr(backends.metadata, "entry_points", lambda group: found)
    tuned = cg.get_backend("tuned:fast", threads=6)
    assert (tuned.name, getattr(tuned, "threads", None)) == ("tuned:fast", 6)
    assert getattr(cg.get_backend("tuned"), "threads", None) == 0
    assert cg.get_backend("plain", threads=6).name == "plain"
    with pytest.raises(cg.BackendError, match="backend 'plain' takes no options"):
        cg.get_backend("plain:fast")
    with pytest.raises(cg.BackendUnavailable, match="backend 'gone' is unavailable: cannot import"):
        cg.get_backend("gone")


def test_host_workers_spin_within_a_call_and_stop_when_it_returns_between_other_partitions() -> None:
    # allow_spinning=0 woke sleeping workers at every parallel step (an LSTM parallelises each
    # time step: VoiceFilter-Lite 16.6 ms so, 4.9 spinning until the call returns)
    from codegraft.backends.onnxruntime import OnnxRuntimeRunnable

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    for spin, stop in ((False, "1"), (True, "")):
        runnable = OnnxRuntimeRunnable(model, threads=2, spin=spin)
        assert runnable.run([np.ones(4, np.float32)])[0].tolist() == [1.0] * 4
        options = runnable._session.get_session_options()  # type: ignore[attr-defined]
        assert _config_entry(options, "session.force_spinning_stop") == stop
        assert _config_entry(options, "session.intra_op.allow_spinning") == ""


def _config_entry(options: object, key: str) -> str:
    try:
        return str(options.get_session_config_entry(key))  # type: ignore[attr-defined]
    except RuntimeError:  # "SessionOptions does not have configuration with key"
        return ""
