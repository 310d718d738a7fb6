"""Every benchmark zoo model is valid ONNX and runs in onnxruntime with finite outputs."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

# bench/ is a directory of scripts beside the package, not installed with it.
from bench import zoo
from codegraft.testing import random_feeds, run_onnxruntime


# torch_encoder exports a torch module (tens of seconds); tests/test_torch_export.py covers that path.
@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.heavy) if n == "torch_encoder" else n for n in zoo.names()]
)
def test_zoo_model_is_valid_and_runs(name: str) -> None:
    model = zoo.build(name)
    onnx.checker.check_model(model, full_check=True)
    outputs = run_onnxruntime(model, random_feeds(model))
    for value in outputs.values():
        assert np.all(np.isfinite(value))
        assert float(np.std(value)) > 1e-3  # random weights give varied, non-degenerate outputs


def test_zoo_is_deterministic() -> None:
    assert zoo.mlp().SerializeToString() == zoo.mlp().SerializeToString()


def test_unknown_zoo_model() -> None:
    with pytest.raises(KeyError, match="known: transformer"):
        zoo.build("nope")
