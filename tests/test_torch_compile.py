"""``torch.compile(model, backend="codegraft")``: the entry point, a CNN and a transformer block."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest

from codegraft.backends.c import CBackend
from codegraft.frontend import dynamo

torch = pytest.importorskip("torch", reason="torch is an optional extra")

BATCHES = (1, 2, 4, 8)


def test_backend_name_works_without_importing_codegraft() -> None:
    script = textwrap.dedent(
        """
        import sys, torch
        net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).eval()
        compiled = torch.compile(net, backend="codegraft", options={"min_partition_size": 1})
        x = torch.randn(3, 8)
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), net(x))
        from codegraft.frontend.dynamo import compiled_graphs
        print(len(compiled_graphs()), "codegraft" in sys.modules)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-2:] == ["1", "True"]


@pytest.fixture
def c_compiles(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[int, ...]]]:
    """Every partition the c backend compiles (its first input's shape), in order."""
    seen: list[tuple[int, ...]] = []
    original = CBackend.compile

    def counting(self: CBackend, partition):  # type: ignore[no-untyped-def]
        seen.append(tuple(partition.model.graph.inputs[0].shape))
        return original(self, partition)

    monkeypatch.setattr(CBackend, "compile", counting)
    yield seen


def _check_dynamic(net: torch.nn.Module, shape: tuple[int, ...], compiles: list[tuple[int, ...]]) -> None:
    """dynamic=True over batches 1, 2, 4, 8 against eager; a second pass compiles nothing new."""
    torch.manual_seed(1)
    compiled = torch.compile(net, backend="codegraft", dynamic=True, options={"targets": ["c"]})
    before = len(dynamo.compiled_graphs())
    with torch.no_grad():
        for batch in BATCHES:
            x = torch.randn(batch, *shape)
            torch.testing.assert_close(compiled(x), net(x), rtol=1e-4, atol=1e-5)
        first_pass = len(compiles)
        for batch in BATCHES:
            x = torch.randn(batch, *shape)
            torch.testing.assert_close(compiled(x), net(x), rtol=1e-4, atol=1e-5)
    graphs = dynamo.compiled_graphs()[before:]
    assert 1 <= len(graphs) <= 2  # dynamo specialises batch 1; every other batch shares one graph
    assert all(exe.report().nodes_per_backend().get("c") for exe in graphs)
    assert first_pass > 0 and len(compiles) == first_pass  # every shape seen once: no compile on the second pass


def test_a_cnn_with_a_dynamic_batch(c_compiles: list[tuple[int, ...]]) -> None:
    from test_torch_export import _cnn

    _check_dynamic(_cnn(), (3, 32, 32), c_compiles)


def test_a_transformer_encoder_block_with_a_dynamic_batch(c_compiles: list[tuple[int, ...]]) -> None:
    torch.manual_seed(0)
    block = torch.nn.TransformerEncoderLayer(
        d_model=64, nhead=4, dim_feedforward=128, batch_first=True, activation="gelu", dropout=0.0
    ).eval()
    # Without grad, torch runs this block as one fused kernel (its "fast path"), which no exporter
    # can take apart; turned off, dynamo hands over the block's real graph.
    fastpath = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        _check_dynamic(block, (16, 64), c_compiles)
    finally:
        torch.backends.mha.set_fastpath_enabled(fastpath)


def test_a_graph_codegraft_cannot_take_runs_in_torch(caplog: pytest.LogCaptureFixture) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("no exporter for this")

    gm = torch.fx.symbolic_trace(torch.nn.Linear(4, 2))
    example = [torch.randn(3, 4)]
    original = dynamo._CompiledGraph._compile
    try:
        dynamo._CompiledGraph._compile = broken  # type: ignore[method-assign]
        run = dynamo.codegraft_backend(gm, example)
        assert run == gm.forward
        assert "runs in torch instead" in caplog.text
        with pytest.raises(RuntimeError, match="no exporter"):
            dynamo.codegraft_backend(gm, example, options={"strict": True})
    finally:
        dynamo._CompiledGraph._compile = original  # type: ignore[method-assign]
