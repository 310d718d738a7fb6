"""The ``iree`` backend: compile/load/run against onnxruntime, targets, cross-compilation, fallback.

Fast tests use small graphs (an IREE compile of a few ops takes a second or two); whole
models are ``heavy`` (``pytest -m heavy``), since IREE takes 15-60 s of CPU per model.
"""

from __future__ import annotations

import json
import pathlib
import re
import subprocess
import sys

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("iree.compiler", reason="IREE is not installed: pip install 'codegraft[iree]'")

import codegraft as cg
from codegraft.backend import Backend, Partition
from codegraft.backends import get_backend, list_backends
from codegraft.backends.iree import IreeBackend, IreeBlob, IreeTarget
from codegraft.errors import BackendError, CodegraftError
from codegraft.testing import assert_close, light_model, random_feeds, run_onnxruntime

F = TensorProto.FLOAT
ROOT = pathlib.Path(__file__).resolve().parent.parent


def conv_model(batch: int | str = 1) -> onnx.ModelProto:
    """Conv + bias + Relu, then a GlobalAveragePool and a Gemm: a small CNN head."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3, "w"),
        numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b"),
        numpy_helper.from_array(rng.standard_normal((8, 5)).astype(np.float32), "fc"),
        numpy_helper.from_array(np.array([-1, 8], np.int64), "shape"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("GlobalAveragePool", ["r"], ["g"], name="gap"),
        helper.make_node("Reshape", ["g", "shape"], ["f"], name="flat"),
        helper.make_node("MatMul", ["f", "fc"], ["y"], name="fc"),
    ]
    graph = helper.make_graph(
        nodes, "head", [helper.make_tensor_value_info("x", F, [batch, 3, 16, 16])],
        [helper.make_tensor_value_info("y", F, [batch, 5])], inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def with_unsupported(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with a node IREE's survey declines in the middle (a domain IREE does not import)."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    nodes = list(model.graph.node)
    index = next(i for i, n in enumerate(nodes) if n.op_type == "Relu")
    nodes[index] = helper.make_node("Gelu", ["c"], ["r"], name="gelu_ms", domain="com.microsoft")
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    # as exporters write it: the contrib op's output shape, which onnx's inference cannot know
    model.graph.value_info.append(helper.make_tensor_value_info("r", F, [1, 8, 16, 16]))
    return model


def test_unknown_rank_is_declined(backend: IreeBackend) -> None:
    model = with_unsupported(conv_model())
    del model.graph.value_info[:]  # now nothing after the contrib op has a known rank
    exe = cg.compile(model, targets=[backend])
    placed = {n.name: n.backend for n in exe.report().nodes}
    assert placed["conv"] == "iree" and placed["gap"] == "onnxruntime"
    reasons = dict(next(n for n in exe.report().nodes if n.name == "gap").declined)
    assert re.search(r"\br\b", reasons["iree"])  # names the value without a type or rank


@pytest.fixture(scope="module")
def backend() -> IreeBackend:
    return IreeBackend()


def test_is_a_backend_found_by_name(backend: IreeBackend) -> None:
    assert isinstance(backend, Backend)
    assert get_backend("iree").name == "iree"
    assert get_backend("iree:cuda").name == "iree:cuda:sm_80"
    assert get_backend("iree:cuda:sm_89").name == "iree:cuda:sm_89"
    assert IreeBackend(device="cuda", arch="sm_80").name == "iree:cuda:sm_80"
    listed = {info.name: info for info in list_backends()}
    assert listed["iree"].available and listed["iree:cuda"].available
    assert "compile only" in listed["iree:cuda"].reason  # no GPU on this machine


def test_runtime_only_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without iree-base-compiler (a deploy machine): CPU modules still load; cuda says what is missing."""
    from codegraft.errors import BackendUnavailable

    monkeypatch.setattr(IreeBackend, "compiler_unavailable_reason", lambda self: "iree-base-compiler is not installed")
    cpu = get_backend("iree")
    assert "run only" in cpu.availability_note()  # type: ignore[attr-defined]
    assert not cpu.supports(ir.Node("", "Relu", inputs=[]))
    with pytest.raises(BackendUnavailable, match="no cuda device here.*cannot compile here"):
        get_backend("iree:cuda")


def test_clear_errors_for_targets() -> None:
    with pytest.raises(BackendError, match="no CUDA target 'sm_90'.*sm_89"):
        get_backend("iree:cuda:sm_90")
    with pytest.raises(BackendError, match="unknown IREE device 'tpu'"):
        get_backend("iree:tpu")
    with pytest.raises(BackendError, match="takes no options"):
        get_backend("onnxruntime:fast")
    assert IreeTarget.parse("cuda:sm_89") == IreeTarget("cuda", "sm_89")
    assert str(IreeTarget.parse(None)) == "cpu:host"
    assert "--iree-rocm-target=gfx942" in IreeTarget.parse("hip").compiler_flags()


def test_small_model_matches_onnxruntime(backend: IreeBackend) -> None:
    model = conv_model()
    feeds = random_feeds(model)
    exe = cg.compile(model, targets=[backend])
    assert [s.backend for s in exe.steps] == ["iree"]
    assert_close(exe.run(feeds), run_onnxruntime(model, feeds), rtol=1e-4)


def test_dynamic_batch_compiled_once(backend: IreeBackend) -> None:
    model = conv_model(batch="n")
    exe = cg.compile(model, targets=[backend])
    (step,) = exe.steps
    assert step.blob is not None and step.template is None  # not specialised per shape
    for batch in (1, 3):
        x = np.random.default_rng(batch).standard_normal((batch, 3, 16, 16)).astype(np.float32)
        assert_close(exe.run({"x": x}), run_onnxruntime(model, {"x": x}), rtol=1e-4)


def test_declined_node_splits_with_host(backend: IreeBackend) -> None:
    model = with_unsupported(conv_model())
    feeds = random_feeds(model)
    exe = cg.compile(model, targets=[backend])
    placed = {n.name: n.backend for n in exe.report().nodes}
    assert placed["gelu_ms"] == "onnxruntime"
    assert placed["conv"] == placed["fc"] == "iree"
    assert [s.backend for s in exe.steps] == ["iree", "onnxruntime", "iree"]
    reasons = dict(next(n for n in exe.report().nodes if n.name == "gelu_ms").declined)
    assert "not imported by IREE" in reasons["iree"]
    assert_close(exe.run(feeds), run_onnxruntime(model, feeds), rtol=1e-4)


def test_compile_failure_falls_back_to_host() -> None:
    broken = IreeBackend(extra_flags=("--iree-no-such-flag",))
    model = conv_model()
    exe = cg.compile(model, targets=[broken])
    (part,) = exe.report().partitions
    assert part.backend == "onnxruntime" and part.requested_backend == "iree"
    assert "iree-compile" in part.fallback_error
    feeds = random_feeds(model)
    assert_close(exe.run(feeds), run_onnxruntime(model, feeds), rtol=1e-4)
    with pytest.raises(CodegraftError, match="iree failed to compile"):
        cg.compile(model, targets=[broken], strict=True)


def test_measured_placement_times_iree(backend: IreeBackend, tmp_path: pathlib.Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CODEGRAFT_CACHE_DIR", str(tmp_path))
    model = conv_model()
    exe = cg.compile(model, targets=[backend, "onnxruntime"], placement="measured")
    timed = {name for decision in exe.report().placements for name, _ in decision.timings_us}
    assert {"iree", "onnxruntime"} <= timed
    feeds = random_feeds(model)
    assert_close(exe.run(feeds), run_onnxruntime(model, feeds), rtol=1e-4)


def test_artifact_round_trip(backend: IreeBackend, tmp_path: pathlib.Path) -> None:
    model = conv_model()
    feeds = random_feeds(model)
    exe = cg.compile(model, targets=[backend])
    exe.save(tmp_path / "m.cgx")
    loaded = cg.load_executable(tmp_path / "m.cgx")
    assert [s.backend for s in loaded.steps] == ["iree"]
    assert_close(loaded.run(feeds), exe.run(feeds), rtol=0)


def test_cross_compiled_cuda_artifact_says_so_here(tmp_path: pathlib.Path) -> None:
    model = conv_model()
    exe = cg.compile(model, targets=["iree:cuda"])
    assert [s.backend for s in exe.steps] == ["iree:cuda:sm_80"]  # compiled for the GPU, no host fallback
    blob = IreeBlob.decode(exe.steps[0].blob or b"")
    assert blob.target == "cuda:sm_80" and not blob.cpu_features
    exe.save(tmp_path / "gpu.cgx")
    with pytest.raises(CodegraftError, match="compiled for IREE cuda:sm_80 and cannot run here") as caught:
        cg.load_executable(tmp_path / "gpu.cgx").run(random_feeds(model))
    assert "\n" not in str(caught.value)
    cli = subprocess.run(
        [sys.executable, "-m", "codegraft.cli.main", "run", str(tmp_path / "gpu.cgx"), "--random"],
        capture_output=True, text=True, cwd=ROOT,
    )
    assert cli.returncode == 2 and "Traceback" not in cli.stderr
    assert "cannot run here" in cli.stderr


def test_blob_checks(backend: IreeBackend) -> None:
    partition = Partition("p", ir.from_proto(onnx.shape_inference.infer_shapes(conv_model())))
    blob = IreeBlob.decode(backend.compile(partition))
    assert blob.function == "main" and blob.input_names == ("x",) and blob.output_names == ("y",)
    encoded = blob.encode()
    with pytest.raises(BackendError, match="truncated"):
        backend.load(encoded[:-10])
    with pytest.raises(BackendError, match="not an iree blob"):
        backend.load(b"XXXX" + encoded[4:])
    from dataclasses import replace

    with pytest.raises(BackendError, match="compiled by IREE 2.0.0"):
        backend.load(replace(blob, iree_version="2.0.0").encode())
    with pytest.raises(BackendError, match="which this CPU lacks"):
        backend.load(replace(blob, cpu_features=(*blob.cpu_features, "avx99")).encode())


def test_support_answers_come_from_the_survey(backend: IreeBackend) -> None:
    survey = json.loads((ROOT / "codegraft" / "backends" / "iree" / "support.json").read_text())
    assert survey["cases"], "support.json is empty: run python -m bench.iree_support"
    model = ir.from_proto(onnx.shape_inference.infer_shapes(conv_model()))
    assert all(backend.supports(node) for node in model.graph)
    failed_alone = [c for c in survey["cases"] if c["error"] and len(c["ops"]) == 1]
    for case in failed_alone:
        op = case["ops"][0].split("/")[0]
        node = ir.Node("", op, inputs=[])
        if not any(op == k.split("/")[0] for c in survey["cases"] if not c["error"] for k in c["ops"]):
            assert not backend.supports(node), op


def test_gpu_check_script_on_the_cpu_path(tmp_path: pathlib.Path) -> None:
    """bench/gpu_check.py end to end with device=cpu: prepare here, then check (what the GPU box runs)."""
    from bench import gpu_check

    table = (("head_b2", "head", 2),)
    gpu_check.prepare(tmp_path, "iree", [], build=lambda _, batch: conv_model(batch), table=table)
    assert gpu_check.check(tmp_path, runs=3) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    assert [r["case"] for r in results] == ["head_b2"]
    assert all(r["ok"] and r["iree_ms"] > 0 for r in results)
    if "torch_rel_error" in results[0]:  # torch importable: the same weights in torch eager
        assert results[0]["torch_rel_error"] < 1e-4


@pytest.mark.heavy
def test_gpu_check_batches_light_models() -> None:
    from bench import gpu_check

    model = gpu_check.with_batch(light_model("resnet50"), 32)
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_value == 32
    assert [d.dim_value for d in model.graph.output[0].type.tensor_type.shape.dim] == [32, 1000]


@pytest.mark.heavy
@pytest.mark.parametrize("name", ["squeezenet", "resnet50", "densenet121", "inception_v1", "shufflenet",
                                  "bvlc_alexnet", "vgg19", "zfnet512", "inception_v2"])
def test_light_model_matches_onnxruntime(backend: IreeBackend, name: str) -> None:
    model = light_model(name)
    feeds = random_feeds(model)
    exe = cg.compile(model, targets=[backend])
    assert {s.backend for s in exe.steps} == {"iree"}, exe.report()
    assert_close(exe.run(feeds), run_onnxruntime(model, feeds), rtol=1e-4)


@pytest.mark.heavy
def test_transformer_block_matches_onnxruntime(backend: IreeBackend) -> None:
    from bench.zoo import build

    model = build("transformer")
    feeds = random_feeds(model)
    exe = cg.compile(model, targets=[backend])
    assert {s.backend for s in exe.steps} == {"iree"}, exe.report()
    assert_close(exe.run(feeds), run_onnxruntime(model, feeds), rtol=1e-4)
