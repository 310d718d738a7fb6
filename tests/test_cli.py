"""The command line: compile, run, inspect, backends; errors as one clear line."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import numpy as np
import onnx
import pytest
from typer.testing import CliRunner

import codegraft as cg
from codegraft.cli.main import app
from codegraft.testing import light_model, light_model_path

runner = CliRunner()


def test_compile_then_run(tmp_path: pathlib.Path) -> None:
    model = tmp_path / "m.onnx"
    onnx.save(light_model("squeezenet"), model)
    artifact = tmp_path / "m.cgx"
    netron = tmp_path / "partitioned.onnx"
    result = runner.invoke(
        # (--min-partition-macs 0: the example's elementwise partitions between host ones stay on it)
        app, ["compile", str(model), "-t", "numpy_example", "-o", str(artifact), "--onnx", str(netron),
              "--min-partition-macs", "0", "--threads", "2"],
    )
    assert result.exit_code == 0, result.output
    assert artifact.exists() and "partitions" in result.output
    assert cg.load_executable(artifact).host_threads == 2  # the host keeps --threads after a reload
    exported = onnx.load(netron)
    onnx.checker.check_model(exported)
    backends = {p.value for n in exported.graph.node for p in n.metadata_props if p.key == "codegraft.backend"}
    assert backends == {"numpy_example", "onnxruntime"}

    result = runner.invoke(app, ["run", str(artifact), "--random", "--save", str(tmp_path / "out"), "--profile",
                                 "--threads", "1"])
    assert result.exit_code == 0, result.output
    saved = list((tmp_path / "out").glob("*.npy"))
    assert len(saved) == 1 and np.load(saved[0]).shape == (1, 1000, 1, 1)
    assert "total" in result.output

    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    name = onnx.load(model).graph.input[0].name
    result = runner.invoke(app, ["run", str(artifact), "--input", f"{name}={tmp_path / 'x.npy'}"])
    assert result.exit_code == 0, result.output


def test_run_errors_are_one_line(tmp_path: pathlib.Path) -> None:
    result = runner.invoke(app, ["run", str(tmp_path / "missing.cgx"), "--random"])
    assert result.exit_code == 2
    assert "error: cannot read artifact" in result.output and "Traceback" not in result.output


def test_compile_unknown_target_is_a_clear_error() -> None:
    result = runner.invoke(app, ["compile", str(light_model_path("squeezenet")), "-t", "nope"])
    assert result.exit_code == 2 and "unknown backend 'nope'" in result.output


def test_compile_negative_threads_is_a_clear_error() -> None:
    result = runner.invoke(app, ["compile", str(light_model_path("squeezenet")), "--threads", "-1"])
    assert result.exit_code == 2 and "threads" in result.output and "Traceback" not in result.output


def test_inspect_json_and_netron_export(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "partitioned.onnx"
    result = runner.invoke(
        app, ["inspect", str(light_model_path("squeezenet")), "-t", "numpy_example", "--json", "--onnx", str(out)]
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout[: result.stdout.rindex("}") + 1])
    assert {n["backend"] for n in data["nodes"]} == {"numpy_example", "onnxruntime"}
    conv = next(n for n in data["nodes"] if n["op_type"] == "Conv")
    assert conv["declined"] == [["numpy_example", "Conv not implemented"]]
    exported = onnx.load(out)
    onnx.checker.check_model(exported)
    assert len(exported.functions) == len(data["partitions"])


def test_backends_lists_builtins() -> None:
    result = runner.invoke(app, ["backends", "--json"])
    assert result.exit_code == 0
    names = {b["name"] for b in json.loads(result.output)}
    assert {"onnxruntime", "openvino", "c", "c:measure-threads"} <= names


def test_backends_exits_without_leak_reports() -> None:
    # the real console script: its process ends with the command, IREE's runtime objects with it
    pytest.importorskip("iree.runtime")
    done = subprocess.run([sys.executable, "-m", "codegraft.cli.main", "backends"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "leaked" not in done.stderr, done.stderr[:500]
