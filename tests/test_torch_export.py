"""PyTorch modules through ``cg.compile``: torch's dynamo exporter, names, dynamic shapes, fallback."""

from __future__ import annotations

import numpy as np
import pytest

import codegraft as cg
from codegraft.frontend import torch_export

torch = pytest.importorskip("torch", reason="torch is an optional extra")


class SmallCNN(torch.nn.Module):
    """torchvision-style: conv, batch norm, ReLU, max pool, strided conv, global pool, linear."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(16)
        self.conv2 = torch.nn.Conv2d(16, 32, 3, stride=2, padding=1)
        self.fc = torch.nn.Linear(32, 10)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        x = torch.nn.functional.max_pool2d(torch.relu(self.bn(self.conv1(image))), 2)
        x = torch.relu(self.conv2(x))
        return self.fc(torch.nn.functional.adaptive_avg_pool2d(x, 1).flatten(1))


def _cnn() -> SmallCNN:
    torch.manual_seed(0)
    net = SmallCNN().eval()
    with torch.no_grad():  # non-trivial running statistics, so batch norm is really checked
        net.bn.running_mean.uniform_(-0.5, 0.5)
        net.bn.running_var.uniform_(0.5, 1.5)
    return net


@pytest.fixture(scope="module")
def cnn_exe() -> tuple[SmallCNN, cg.Executable]:
    net = _cnn()
    exe = cg.compile(net, ["c"], example_inputs=(torch.randn(2, 3, 32, 32),), dynamic_shapes={"image": {0: "batch"}})
    return net, exe


def test_a_dynamic_batch_runs_at_any_batch_with_names_from_forward(cnn_exe: tuple[SmallCNN, cg.Executable]) -> None:
    net, exe = cnn_exe
    assert [s.name for s in exe.inputs] == ["image"] and exe.outputs == ("output",)
    assert exe.inputs[0].shape == ("batch", 3, 32, 32)
    assert "torch.onnx.export(dynamo=True)" in exe.report().notes[0]
    assert exe.report().nodes_per_backend() == {"c": len(exe.report().nodes)}  # the whole CNN on c
    for batch in (1, 2, 4, 8):
        x = torch.randn(batch, 3, 32, 32)
        got = exe(x)
        assert isinstance(got, torch.Tensor)
        with torch.no_grad():
            torch.testing.assert_close(got, net(x), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(exe.run(x.numpy())["output"], got.numpy(), rtol=1e-6)


def test_given_names_and_positional_dynamic_shapes() -> None:
    net = torch.nn.Linear(4, 3).eval()
    exe = cg.compile(net, example_inputs=(torch.randn(2, 4),), dynamic_shapes=({0: "rows"},),
                     input_names=["features"], output_names=["scores"])
    assert [s.name for s in exe.inputs] == ["features"] and exe.outputs == ("scores",)
    x = torch.randn(5, 4)
    with torch.no_grad():
        torch.testing.assert_close(exe.run({"features": x})["scores"], net(x))


def test_the_legacy_exporter_is_a_fallback_the_report_names(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("cannot trace this\nsecond line")

    monkeypatch.setattr(torch_export, "_export_dynamo", broken)
    net = _cnn()
    exe = cg.compile(net, example_inputs=(torch.randn(2, 3, 32, 32),), dynamic_shapes={"image": {0: "batch"}})
    assert exe.report().notes[0] == (
        "exported with the legacy TorchScript exporter: the dynamo exporter failed: cannot trace this"
    )
    assert [s.name for s in exe.inputs] == ["image"] and exe.outputs == ("output",)
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(exe(x), net(x), rtol=1e-4, atol=1e-5)


def test_dynamic_shapes_naming_an_unknown_input_is_a_clear_error() -> None:
    with pytest.raises(cg.ModelError, match=r"dynamic_shapes names \['x'\], which Linear.forward does not take"):
        cg.compile(torch.nn.Linear(4, 3), example_inputs=(torch.randn(2, 4),), dynamic_shapes={"x": {0: "n"}})


def test_a_transformer_encoder_layer_is_one_c_partition_at_any_batch() -> None:
    torch.manual_seed(0)
    block = torch.nn.TransformerEncoderLayer(64, 4, dim_feedforward=128, dropout=0.0, activation="gelu",
                                             batch_first=True).eval()
    exe = cg.compile(block, ["c"], example_inputs=(torch.randn(2, 16, 64),), dynamic_shapes={"src": {0: "batch"}})
    report = exe.report()
    assert report.partitions_per_backend() == {"c": 1}, report.decline_reasons()
    assert {n.op_type for n in report.nodes} >= {"Gather", "Shape", "Softmax", "LayerNormalization", "Gelu"}
    for batch in (1, 3):
        x = torch.randn(batch, 16, 64)
        with torch.no_grad():
            torch.testing.assert_close(exe(x), block(x), rtol=1e-4, atol=1e-5)
    assert not exe._runnables[0].failures  # every shape compiled on c, none fell back to the host
