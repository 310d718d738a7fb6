"""The compiled-partition cache (issue 15): a recompile loads what it compiled before, gives the
same outputs and report, misses whenever anything that shapes the blob changed, and never
uses a damaged entry."""

from __future__ import annotations

import dataclasses
import logging
import pathlib
import subprocess
import sys
from collections.abc import Iterator

import numpy as np
import onnx
import pytest
from typer.testing import CliRunner

import codegraft as cg
from codegraft.backends.c import CBackend
from codegraft.cli.main import app
from codegraft.lower.cache import SUFFIX, CachedPartition, CompileCache, compile_cache
from codegraft.testing import SubsetBackend
from tests.c_backend_util import needs_compiler
from tests.cli_util import small_net

pytestmark = needs_compiler

X = np.random.default_rng(7).standard_normal((2, 3, 16, 16)).astype(np.float32)


@pytest.fixture
def cache_dir(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> pathlib.Path:
    """The cache on (tests run with it off, see conftest), in a folder of this test's own."""
    monkeypatch.setenv("CODEGRAFT_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CODEGRAFT_COMPILE_CACHE", "1")
    return tmp_path / "compiled"


@pytest.fixture
def c_compiles(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The name of every partition the c backend really compiles, in order."""
    seen: list[str] = []
    original = CBackend.compile

    def counting(self: CBackend, partition: cg.Partition) -> bytes:
        seen.append(partition.name)
        return original(self, partition)

    monkeypatch.setattr(CBackend, "compile", counting)
    yield seen


def static_net(seed: int = 0) -> onnx.ModelProto:
    """``small_net`` with batch 2 fixed, so it compiles at once (not per shape at run time)."""
    model = small_net(seed)
    for value in (*model.graph.input, *model.graph.output):
        value.type.tensor_type.shape.dim[0].dim_value = 2
    return model


def _entries(folder: pathlib.Path) -> list[pathlib.Path]:
    return sorted(folder.glob(f"*{SUFFIX}"))


def _without_times(report: cg.Report) -> cg.Report:
    return dataclasses.replace(report, stages=())


def test_a_hit_gives_the_same_outputs_and_report_without_compiling(
    cache_dir: pathlib.Path, c_compiles: list[str]
) -> None:
    cold = cg.compile(static_net(), ["c"])
    assert c_compiles and len(_entries(cache_dir)) == len(c_compiles)
    compiled = len(c_compiles)
    hits = compile_cache().stats.hits  # type: ignore[union-attr]
    warm = cg.compile(static_net(), ["c"])
    assert len(c_compiles) == compiled  # nothing compiled again
    assert compile_cache().stats.hits == hits + compiled  # type: ignore[union-attr]
    assert _without_times(warm.report()) == _without_times(cold.report())
    assert str(warm.report()).split("time per stage")[0] == str(cold.report()).split("time per stage")[0]
    got, want = warm.run({"x": X}), cold.run({"x": X})
    assert all(np.array_equal(got[name], want[name]) for name in want)
    cg.testing.assert_close(got, cg.testing.run_onnxruntime(static_net(), {"x": X}))


def test_a_hit_in_another_process(cache_dir: pathlib.Path, tmp_path: pathlib.Path) -> None:
    path = tmp_path / "net.onnx"
    onnx.save(static_net(), path)
    script = (
        "import sys, codegraft as cg; from codegraft.lower.cache import compile_cache; "
        f"cg.compile({str(path)!r}, ['c']); s = compile_cache().stats; print(s.hits, s.misses)"
    )
    runs = [subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True) for _ in "ab"]
    (hits_a, misses_a), (hits_b, misses_b) = (map(int, r.stdout.split()) for r in runs)
    assert (hits_a, hits_b, misses_b) == (0, misses_a, 0) and misses_a > 0


def test_what_shapes_the_blob_is_in_the_key(
    cache_dir: pathlib.Path, c_compiles: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def compiles(model: onnx.ModelProto, backend: CBackend) -> int:
        before = len(c_compiles)
        cg.compile(model, [backend])
        return len(c_compiles) - before

    assert compiles(static_net(), CBackend(num_threads=1)) > 0
    assert compiles(static_net(), CBackend(num_threads=1)) == 0
    assert compiles(static_net(), CBackend(num_threads=2)) > 0  # threads
    assert compiles(static_net(seed=1), CBackend(num_threads=1)) > 0  # other weights
    monkeypatch.setattr(CBackend, "version", CBackend.version + "-next")
    assert compiles(static_net(), CBackend(num_threads=1)) > 0  # a newer code generator
    assert compiles(static_net(), CBackend(num_threads=1)) == 0


def test_precision_and_composites_are_in_the_key(cache_dir: pathlib.Path) -> None:
    cache, proto, backend = CompileCache(cache_dir), static_net(), CBackend()
    keys = {
        cache.key(backend, proto, name="p0"),
        cache.key(backend, proto, name="p1"),
        cache.key(backend, proto, name="p0", precision="float16"),
        cache.key(backend, proto, name="p0", samples=[{"x": X}]),
        cache.key(backend, proto, name="p0", samples=[{"x": X + 1}]),
    }
    assert len(keys) == 5 and None not in keys


def test_a_corrupted_entry_is_compiled_again(
    cache_dir: pathlib.Path, c_compiles: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    want = cg.compile(static_net(), ["c"]).run({"x": X})
    compiled = len(c_compiles)
    for entry in _entries(cache_dir):
        data = bytearray(entry.read_bytes())
        data[-100] ^= 0xFF  # one flipped byte in the blob
        entry.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="codegraft"):
        got = cg.compile(static_net(), ["c"]).run({"x": X})
    assert "corrupted" in caplog.text
    assert len(c_compiles) == 2 * compiled  # every partition compiled afresh
    assert all(np.array_equal(got[name], want[name]) for name in want)
    hits = compile_cache().stats.hits  # type: ignore[union-attr]
    cg.compile(static_net(), ["c"])  # the rewritten entries serve again
    assert compile_cache().stats.hits == hits + compiled  # type: ignore[union-attr]


@pytest.mark.parametrize("damage", ["truncated", "another key", "garbage header", "empty"])
def test_damaged_entries_are_misses(cache_dir: pathlib.Path, damage: str) -> None:
    cache = CompileCache(cache_dir)
    cache.put("k", CachedPartition(b"blob" * 100, "note"))
    assert cache.get("k") == CachedPartition(b"blob" * 100, "note")
    path = cache_dir / f"k{SUFFIX}"
    data = path.read_bytes()
    if damage == "truncated":
        path.write_bytes(data[:-1])
    elif damage == "another key":
        cache.put("other", CachedPartition(b"blob" * 100, "note"))
        (cache_dir / f"other{SUFFIX}").replace(path)
    elif damage == "garbage header":
        path.write_bytes(data[:16] + b"\xff" * (len(data) - 16))
    else:
        path.write_bytes(b"")
    assert cache.get("k") is None
    assert not path.exists() and cache.stats.rejected == 1


def test_a_cached_blob_that_does_not_load_is_compiled_again(
    cache_dir: pathlib.Path, c_compiles: list[str]
) -> None:
    want = cg.compile(static_net(), ["c"]).run({"x": X})
    compiled = len(c_compiles)
    cache = CompileCache(cache_dir)
    for entry in _entries(cache_dir):  # intact entries holding a blob c cannot load
        cache.put(entry.stem, CachedPartition(b"not a C blob", ""))
    got = cg.compile(static_net(), ["c"]).run({"x": X})
    assert len(c_compiles) == 2 * compiled
    assert all(np.array_equal(got[name], want[name]) for name in want)
    assert all(len(e.read_bytes()) > 1000 for e in _entries(cache_dir))  # replaced by the real blobs


def test_a_recompile_in_the_same_process_reads_no_file_unless_it_changed(
    cache_dir: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import codegraft.lower.cache as cache_module

    reads: list[str] = []
    original = cache_module._read

    def counting(file, key):  # type: ignore[no-untyped-def]
        reads.append(key)
        return original(file, key)

    monkeypatch.setattr(cache_module, "_read", counting)
    want = cg.compile(static_net(), ["c"]).run({"x": X})  # writes the entries, remembers them
    got = cg.compile(static_net(), ["c"]).run({"x": X})
    assert reads == [] and all(np.array_equal(got[name], want[name]) for name in want)
    entries = _entries(cache_dir)
    for entry in entries:
        entry.write_bytes(entry.read_bytes())  # same bytes, but written: read and checked again
    cg.compile(static_net(), ["c"])
    assert sorted(reads) == sorted(e.stem for e in entries)


def test_off_by_option_and_by_environment(
    cache_dir: pathlib.Path, c_compiles: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    cg.compile(static_net(), ["c"], cache=False)
    assert not _entries(cache_dir)
    monkeypatch.setenv("CODEGRAFT_COMPILE_CACHE", "0")
    cg.compile(static_net(), ["c"])
    assert not _entries(cache_dir)
    monkeypatch.setenv("CODEGRAFT_COMPILE_CACHE", "1")
    cg.compile(static_net(), ["c"])
    assert _entries(cache_dir)


def test_a_backend_without_a_fingerprint_is_never_cached(cache_dir: pathlib.Path) -> None:
    backend = SubsetBackend("acc", {"Conv", "Relu"})
    assert not hasattr(backend, "cache_fingerprint")
    cg.compile(static_net(), [backend])
    assert compile_cache().stats.misses == 0 and not _entries(cache_dir)  # type: ignore[union-attr]


def test_least_recently_used_entries_go_first(tmp_path: pathlib.Path) -> None:
    cache = CompileCache(tmp_path, max_bytes=2500)
    for key in "abc":
        cache.put(key, CachedPartition(bytes(1000)))
        assert cache.get("a") is not None  # "a" stays the most recently used
    assert sorted(p.stem for p in _entries(tmp_path)) == ["a", "c"]


def test_shapes_compiled_at_run_time_are_cached(cache_dir: pathlib.Path, c_compiles: list[str]) -> None:
    for _ in range(2):
        exe = cg.compile(small_net(), ["c"])  # dynamic batch: compiled per shape on first run
        exe.run({"x": X})
    assert len(c_compiles) == 1 and len(_entries(cache_dir)) == 1


def test_cli_cache_info_and_clear(cache_dir: pathlib.Path, tmp_path: pathlib.Path) -> None:
    runner = CliRunner()
    path = tmp_path / "net.onnx"
    onnx.save(static_net(), path)
    assert runner.invoke(app, ["compile", str(path), "-t", "c", "-o", str(tmp_path / "a.cgx")]).exit_code == 0
    entries = len(_entries(cache_dir))
    assert entries
    info = runner.invoke(app, ["cache", "info", "--json"])
    assert info.exit_code == 0, info.output
    assert f'"entries": {entries}' in info.output and '"compiled_enabled": true' in info.output
    cleared = runner.invoke(app, ["cache", "clear"])
    assert cleared.exit_code == 0 and f"removed {entries} file(s)" in cleared.output
    assert not _entries(cache_dir) and list((tmp_path / "c").glob("*.so"))  # C libraries kept
    assert runner.invoke(app, ["compile", str(path), "-t", "c", "-o", str(tmp_path / "b.cgx"), "--no-cache"]
                         ).exit_code == 0
    assert not _entries(cache_dir)
    assert runner.invoke(app, ["cache", "clear", "--all"]).exit_code == 0
    assert not list((tmp_path / "c").glob("*.so"))


def test_openvino_partitions_are_cached(cache_dir: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ov = pytest.importorskip("codegraft.backends.openvino")
    compiles: list[int | None] = []
    original = ov.OpenVINOBackend._compile

    def counting(self, partition):  # type: ignore[no-untyped-def]
        compiles.append(self.num_threads)
        return original(self, partition)

    monkeypatch.setattr(ov.OpenVINOBackend, "_compile", counting)
    cold = cg.compile(static_net(), [ov.OpenVINOBackend(num_threads=1)])
    warm = cg.compile(static_net(), [ov.OpenVINOBackend(num_threads=1)])
    assert compiles == [1]
    assert _without_times(warm.report()) == _without_times(cold.report())
    got, want = warm.run({"x": X}), cold.run({"x": X})
    assert all(np.array_equal(got[name], want[name]) for name in want)
    cg.compile(static_net(), [ov.OpenVINOBackend(num_threads=2)])
    assert compiles == [1, 2]


def test_dnnl_partitions_are_cached(cache_dir: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from codegraft.backends.dnnl import DnnlBackend

    backend = DnnlBackend()
    if backend.unavailable_reason():
        pytest.skip(f"dnnl backend unavailable: {backend.unavailable_reason()}")
    compiles: list[str] = []
    original = DnnlBackend.compile

    def counting(self: DnnlBackend, partition: cg.Partition) -> bytes:
        compiles.append(partition.name)
        return original(self, partition)

    monkeypatch.setattr(DnnlBackend, "compile", counting)
    cold = cg.compile(static_net(), [DnnlBackend()])
    first = len(compiles)
    warm = cg.compile(static_net(), [DnnlBackend()])
    assert first and len(compiles) == first and compile_cache().stats.hits == first  # type: ignore[union-attr]
    assert _without_times(warm.report()) == _without_times(cold.report())
    got, want = warm.run({"x": X}), cold.run({"x": X})
    assert all(np.array_equal(got[name], want[name]) for name in want)


@pytest.mark.heavy
def test_torch_compile_in_a_new_process_loads_its_partitions(cache_dir: pathlib.Path) -> None:
    pytest.importorskip("torch")
    script = (
        "import torch; from codegraft.lower.cache import compile_cache\n"
        "torch.manual_seed(0)\n"
        "net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(8, 4, 1))\n"
        "f = torch.compile(net.eval(), backend='codegraft', dynamic=True, options={'targets': ['c']})\n"
        "with torch.no_grad():\n"
        "    for batch in (2, 4):\n"
        "        x = torch.randn(batch, 3, 16, 16)\n"
        "        torch.testing.assert_close(f(x), net(x), rtol=1e-4, atol=1e-5)\n"
        "s = compile_cache().stats; print(s.hits, s.misses)\n"
    )
    runs = [subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600) for _ in "ab"]
    assert all(r.returncode == 0 for r in runs), runs[-1].stderr[-2000:]
    first, second = (tuple(map(int, r.stdout.split()[-2:])) for r in runs)
    assert first[0] == 0 and first[1] > 0 and second == (first[1], 0)  # every shape loaded, none compiled
