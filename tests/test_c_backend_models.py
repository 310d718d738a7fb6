"""C backend on whole models, through codegraft's own compile, and its blob and runtime contract."""

from __future__ import annotations

import pathlib
import threading

import numpy as np
import onnx_ir as ir
import pytest
from c_backend_util import backend, check, make_model, needs_compiler, run_c
from onnx import helper

from codegraft.backend import Partition
from codegraft.backends.c import BlobError, CBackend, CompilerNotFoundError
from codegraft.backends.c._blob import Blob
from codegraft.passes.layout import to_nhwc
from codegraft.testing import assert_close, light_model, random_feeds, run_onnxruntime

pytestmark = needs_compiler

# Every node of these is supported, so each compiles as one C partition.
# (zfnet512 is left out: the same ops as bvlc_alexnet, bigger, and the suite should stay quick;
# vgg19, the same ops again and 21 s of the suite, runs with the heavy sweep, `pytest -m heavy`.)
WHOLE_MODELS = [
    "resnet50", "squeezenet", pytest.param("vgg19", marks=pytest.mark.heavy), "densenet121", "inception_v1",
    "inception_v2", "shufflenet", "bvlc_alexnet",
]


@pytest.mark.parametrize("name", WHOLE_MODELS)
def test_light_model_as_one_partition(name: str) -> None:
    model = light_model(name)
    feeds = random_feeds(model)
    assert_close(run_c(model, feeds), run_onnxruntime(model, feeds), rtol=1e-4)


@pytest.mark.parametrize("name", ["resnet50", "shufflenet"])
def test_light_model_after_the_nhwc_layout_pass(name: str) -> None:
    """The ``codegraft.nhwc`` ops the layout pass produces run as well as the plain ones."""
    proto = light_model(name)
    model = to_nhwc(ir.from_proto(proto)).model
    assert any(node.domain == "codegraft.nhwc" for node in model.graph)
    be = backend()
    partition = Partition("p", model)
    outputs = be.load(be.compile(partition)).run([random_feeds(proto)[n] for n in partition.input_names])
    expected = run_onnxruntime(proto, random_feeds(proto))
    assert_close(dict(zip(partition.output_names, outputs, strict=True)), expected, rtol=1e-4)


@pytest.mark.parametrize("name", ["resnet50", "inception_v1"])
def test_codegraft_compile_targets_c(name: str) -> None:
    import codegraft as cg

    model = light_model(name)
    exe = cg.compile(model, targets=["c"])
    feeds = random_feeds(model)
    assert_close(exe.run(feeds), run_onnxruntime(model, feeds), rtol=1e-4)


def test_saved_executable_runs_without_recompiling(tmp_path: pathlib.Path) -> None:
    import codegraft as cg

    model = light_model("squeezenet")
    path = tmp_path / "squeezenet.cgx"
    cg.compile(model, targets=["c"]).save(path)
    feeds = random_feeds(model)
    assert_close(cg.load_executable(path).run(feeds), run_onnxruntime(model, feeds), rtol=1e-4)


def _small_model():  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(1)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y"])]
    return make_model(nodes, {"x": (1, 4, 6, 6)}, ["y"], {"w": rng.standard_normal((8, 4, 3, 3)).astype(np.float32)})


def _compile(be: CBackend) -> tuple[bytes, Partition]:
    partition = Partition("p", ir.from_proto(_small_model()))
    return be.compile(partition), partition


def test_blob_round_trip_and_corruption_errors() -> None:
    blob, _ = _compile(backend())
    decoded = Blob.decode(blob)
    assert "cg_entry" in decoded.source and decoded.library and decoded.weights.size
    with pytest.raises(BlobError, match="truncated"):
        Blob.decode(blob[:-10])
    corrupted = bytearray(blob)
    corrupted[-5] ^= 0xFF
    with pytest.raises(BlobError, match="hash"):
        Blob.decode(bytes(corrupted))
    with pytest.raises(BlobError, match="magic"):
        Blob.decode(b"X" * 64)
    with pytest.raises(BlobError, match="version"):
        Blob.decode(blob[:8] + (99).to_bytes(4, "little") + blob[12:])


def test_missing_cpu_features_rebuilds_from_source(tmp_path: pathlib.Path) -> None:
    blob, _ = _compile(backend())
    decoded = Blob.decode(blob)
    foreign = Blob(decoded.source, b"not a library", decoded.weights, frozenset({"imaginary_simd"}), decoded.machine,
                   decoded.scratch_floats, decoded.input_shapes, decoded.output_shapes).encode()
    model = _small_model()
    feeds = random_feeds(model)
    got = CBackend(cache_dir=tmp_path).load(foreign).run([feeds["x"]])
    assert_close({"y": got[0]}, run_onnxruntime(model, feeds))
    with pytest.raises(Exception, match="imaginary_simd.*no C compiler"):
        CBackend(cache_dir=tmp_path, compiler="no-such-cc-compiler").load(foreign)


def test_missing_compiler_is_a_clear_compile_error(tmp_path: pathlib.Path) -> None:
    assert CBackend(compiler="no-such-cc-compiler").unavailable_reason() is not None
    assert CBackend().unavailable_reason() is None
    with pytest.raises(CompilerNotFoundError, match="no C compiler"):
        _compile(CBackend(cache_dir=tmp_path, compiler="no-such-cc-compiler"))


def test_compiled_libraries_are_cached_by_source(tmp_path: pathlib.Path) -> None:
    be = CBackend(cache_dir=tmp_path)
    _compile(be)
    libraries = sorted(tmp_path.glob("*.so"))
    _compile(be)
    assert sorted(tmp_path.glob("*.so")) == libraries  # the second compile found the first's library


@pytest.mark.parametrize("threads", [1, None])
def test_run_is_thread_safe(threads: int | None) -> None:
    """One runnable shared by threads, and two runnables of one library (one thread pool) at once."""
    blob, _ = _compile(backend())
    runnables = [backend(num_threads=threads).load(blob) for _ in range(2)]
    model = _small_model()
    inputs = [random_feeds(model, seed=s)["x"] for s in range(8)]
    expected = [runnables[0].run([x])[0] for x in inputs]
    results: dict[int, np.ndarray] = {}

    def work(index: int) -> None:
        for _ in range(5):
            results[index] = runnables[index % 2].run([inputs[index]])[0]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for index, want in enumerate(expected):
        np.testing.assert_array_equal(results[index], want)


def test_wrong_input_shape_is_rejected() -> None:
    blob, _ = _compile(backend())
    with pytest.raises(Exception, match="shape"):
        backend().load(blob).run([np.zeros((1, 4, 7, 7), np.float32)])


def test_declines_with_reasons() -> None:
    be = CBackend()
    cases = [
        (helper.make_node("LpPool", ["x"], ["y"], kernel_shape=[2, 2]), {}, "LpPool: not implemented"),
        (helper.make_node("Conv", ["x", "w"], ["y"]), {"w": (2, 3, 2, 1, 1)}, "3-D convolution"),
        (helper.make_node("Conv", ["x", "x"], ["y"]), {}, "weight must be a constant"),
        (helper.make_node("Gelu", ["x"], ["y"], approximate="fast"), {}, "approximate"),
        (helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], storage_order=1), {}, "storage_order"),
        (helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[2, 2], dilations=[2, 2]), {}, "dilations"),
    ]
    for node, inits, reason in cases:
        model = make_model([node], {"x": (1, 3, 4, 4, 4) if "3-D" in reason else (1, 3, 4, 4)}, ["y"],
                           {k: np.zeros(s, np.float32) for k, s in inits.items()}, opset=19)
        verdict = be.supports(next(iter(ir.from_proto(model).graph)))
        assert not verdict and reason in verdict.reason, verdict.reason
    int_model = helper.make_model(
        helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", 7, [3])], [helper.make_tensor_value_info("y", 7, [3])]),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    verdict = be.supports(next(iter(ir.from_proto(int_model).graph)))
    assert not verdict and "only float32" in verdict.reason


def test_elementwise_only_partition_and_check_helper() -> None:
    check(make_model([helper.make_node("Tanh", ["x"], ["y"])], {"x": (1000,)}, ["y"]))


def _other_compiler() -> str | None:
    import shutil

    return next((name for name in ("clang", "clang-14", "clang-15", "clang-16") if shutil.which(name)), None)


@pytest.mark.skipif(_other_compiler() is None, reason="no clang installed: the source is only checked with gcc")
def test_generated_source_builds_with_clang_too(tmp_path: pathlib.Path) -> None:
    """Vector extensions, the pool and the pragmas are portable GNU C, not gcc-only."""
    be = CBackend(compiler=_other_compiler(), cache_dir=tmp_path)
    model = light_model("shufflenet")  # depthwise, group conv, transposes, pools, concat, Gemm
    feeds = random_feeds(model)
    assert_close(run_c(model, feeds, be), run_onnxruntime(model, feeds), rtol=1e-4)
