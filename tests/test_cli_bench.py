"""Benchmarking from the CLI (issue 17): percentiles, duration and throughput modes, --json,
run --profile per partition and per op.  Timings are checked for shape and sense, never speed."""

from __future__ import annotations

import json
import pathlib
import threading
import time

import pytest
from typer.testing import CliRunner

import codegraft as cg
from codegraft.backends import get_backend
from codegraft.backends.c import CBackend
from codegraft.cli.main import app
from codegraft.runtime.latency import Latency, measure
from tests.c_backend_util import needs_compiler
from tests.cli_util import save_small_net, small_net

runner = CliRunner()


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    return save_small_net(tmp_path_factory.mktemp("bench"))


def test_latency_percentiles_of_known_samples() -> None:
    latency = Latency.of([float(v) for v in range(1, 101)], wall_s=2.0)
    assert (latency.runs, latency.min_ms, latency.p50_ms) == (100, 1.0, 50.5)
    assert latency.p90_ms == pytest.approx(90.1) and latency.p99_ms == pytest.approx(99.01)
    assert latency.throughput == 50.0
    assert "p99 99.010 ms" in latency.describe() and "(100 runs in 2.00 s)" in latency.describe()


def test_concurrent_requests_share_the_run_budget() -> None:
    seen: set[int] = set()

    def call() -> None:
        seen.add(threading.get_ident())
        time.sleep(0.001)

    latency = measure(call, runs=30, concurrency=3)
    assert latency.runs == 30 and latency.concurrency == 3 and len(seen) == 3
    timed = measure(call, duration=0.05)
    assert timed.runs >= 1 and timed.wall_s >= 0.05


def test_bench_json_has_percentiles_and_throughput(model: pathlib.Path, monkeypatch: pytest.MonkeyPatch,
                                                   tmp_path: pathlib.Path) -> None:
    monkeypatch.setenv("CODEGRAFT_CACHE_DIR", str(tmp_path))
    result = runner.invoke(app, ["bench", str(model), "-t", "c", "--runs", "6", "--no-measured", "--json",
                                 "--shape", "x=2x3x16x16", "--threads", "1"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["runs"] == 6 and data["inputs"] == ["x float32[2, 3, 16, 16] (random, --shape)"]
    rows = {row["config"]: row for row in data["rows"]}
    assert {"onnxruntime", "codegraft[c]", "codegraft[host]"} <= set(rows)
    for row in rows.values():
        assert not row["error"], row["error"]
        assert row["runs"] == 6
        assert 0 < row["min_ms"] <= row["median_ms"] <= row["p90_ms"] <= row["p99_ms"]
        assert row["throughput"] > 0 and row["max_rel_error"] < 1e-4


def test_bench_duration_and_concurrency(model: pathlib.Path, monkeypatch: pytest.MonkeyPatch,
                                        tmp_path: pathlib.Path) -> None:
    monkeypatch.setenv("CODEGRAFT_CACHE_DIR", str(tmp_path))
    result = runner.invoke(app, ["bench", str(model), "-t", "numpy_example", "--duration", "0.3", "--concurrency",
                                 "2", "--no-measured", "--threads", "1"])
    assert result.exit_code == 0, result.output
    assert "0.3 s per configuration, 2 concurrent requests, 1 thread(s)" in result.output
    assert "| configuration | runs | median ms | p90 ms | p99 ms | min ms | inferences/s | throughput vs best peer" in (
        result.output
    )
    assert "| codegraft[numpy_example] |" in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--runs", "0"], "runs must be an integer >= 1, got 0"),
        (["--duration", "0"], "duration must be > 0 seconds, got 0.0"),
        (["--concurrency", "0"], "concurrency must be an integer >= 1, got 0"),
        (["--threads", "0"], "threads must be an integer >= 1, got 0"),
    ],
)
def test_bench_bad_values_are_one_line(model: pathlib.Path, args: list[str], message: str) -> None:
    result = runner.invoke(app, ["bench", str(model), *args])
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output


def test_run_profile_says_how_many_runs_and_goes_down_to_ops(model: pathlib.Path, tmp_path: pathlib.Path) -> None:
    artifact = tmp_path / "host.cgx"
    assert runner.invoke(app, ["compile", str(model), "-o", str(artifact)]).exit_code == 0
    result = runner.invoke(app, ["run", str(artifact), "--random", "--profile", "--runs", "5"])
    assert result.exit_code == 0, result.output
    assert "median of 5 runs per partition (after 1 warm-up)" in result.output
    assert "end to end: p50 " in result.output and "(5 runs in " in result.output
    assert "per op, from the backends' own profilers (onnxruntime: 1 partition)" in result.output

    result = runner.invoke(app, ["run", str(artifact), "--random", "--profile", "--runs", "4", "--json"])
    data = json.loads(result.stdout)
    assert data["outputs"]["y"]["shape"] == [1, 10]
    profile = data["profile"]
    assert profile["runs"] == 4 and profile["latency"]["runs"] == 4
    assert profile["latency"]["min_ms"] <= profile["latency"]["p50_ms"] <= profile["latency"]["p99_ms"]
    op_types = {op["op_type"] for op in profile["ops"]}
    assert {"Conv", "Gemm"} <= op_types, op_types


def test_openvino_profile_per_op() -> None:
    pytest.importorskip("openvino", reason="openvino is not installed: pip install codegraft[openvino]")
    from codegraft.testing import random_feeds

    model = small_net()
    exe = cg.compile(model, targets=["openvino"])
    profile = exe.profile(random_feeds(model), repeat=3, ops=True)
    assert profile.runs == 3 and profile.latency is not None and profile.latency.runs == 3
    assert {op.op_type for _, op in profile.ops} >= {"Convolution"}
    assert all(op.ms >= 0 for _, op in profile.ops)


def test_c_profile_per_kernel_names_the_onnx_nodes() -> None:
    from codegraft.testing import random_feeds

    model = small_net()
    try:
        exe = cg.compile(model, targets=["c"], strict=True)
    except cg.BackendUnavailable as error:
        pytest.skip(str(error))
    profile = exe.profile(random_feeds(model), repeat=3, ops=True)
    ops = [op for _, op in profile.ops]
    # Kernels are named after the report's nodes (plus the layout transposes at the partition's edges).
    by_name = {op.name: op.op_type for op in ops}
    assert by_name["conv0"].startswith("Conv") and by_name["fc"].startswith("MatMul")
    assert {n.name for n in exe.report().nodes} >= {name for name in by_name if "Transpose" not in name}
    assert all(op.ms >= 0 for op in ops)
    assert "per op, from the backends' own profilers (c: 1 partition)" in str(profile)


@needs_compiler
@pytest.mark.parametrize("name", ["c", "c:measure-threads"])
def test_bench_gives_c_the_same_threads_as_the_peers(name: str) -> None:
    backend = get_backend(name, threads=3)
    assert isinstance(backend, CBackend) and backend.num_threads == 3
    assert backend.measure_threads == (name == "c:measure-threads") and backend.name == name
