"""C backend on the onnx wheel's own conformance data (pytorch-converted and pytorch-operator).

Every case whose nodes the backend takes runs against the outputs stored with it; a case
with an unsupported node is skipped with the backend's reason, so a new decline shows up.
"""

from __future__ import annotations

import pathlib

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from c_backend_util import backend, needs_compiler
from onnx import numpy_helper

from codegraft.backend import Partition

pytestmark = needs_compiler
DATA = pathlib.Path(onnx.__file__).parent / "backend" / "test" / "data"
CASES = sorted(p for kind in ("pytorch-converted", "pytorch-operator") for p in (DATA / kind).glob("test_*"))


def _tensors(folder: pathlib.Path, prefix: str) -> list[np.ndarray]:
    files = sorted(folder.glob(f"{prefix}_*.pb"), key=lambda p: int(p.stem.split("_")[-1]))
    return [numpy_helper.to_array(onnx.load_tensor(str(f))) for f in files]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_onnx_conformance_case(case: pathlib.Path) -> None:
    model = ir.from_proto(onnx.load(str(case / "model.onnx")))
    data = sorted(case.glob("test_data_set_*"))[0]
    # Old-IR models list their initializers as graph inputs too (defaults a caller may
    # override); no test data feeds them, so they are the constant weights an exporter means.
    given = len(list(data.glob("input_*.pb")))
    for value in model.graph.inputs[given:]:
        if value.const_value is None:
            break
    else:
        while len(model.graph.inputs) > given:  # (pop: onnx-ir 1.1's slice deletion leaves them marked as inputs)
            model.graph.inputs.pop()
    be = backend()
    declined = [(n.op_type, be.supports(n).reason) for n in model.graph if not be.supports(n)]
    if declined:
        pytest.skip(f"declined: {declined[0][1]}")
    inputs, expected = _tensors(data, "input"), _tensors(data, "output")
    if any(a.dtype != np.float32 for a in inputs + expected):
        pytest.skip("not float32")
    for value, array in zip(model.graph.inputs, inputs, strict=False):
        value.shape = ir.Shape(array.shape)
    # graph inputs without test data are initializers given as inputs (old IR): feed their defaults
    feeds = inputs + [v.const_value.numpy() for v in model.graph.inputs[len(inputs) :]]  # type: ignore[union-attr]
    outputs = be.load(be.compile(Partition("p", model))).run(feeds)
    for got, want in zip(outputs, expected, strict=True):
        assert got.shape == want.shape
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        got, want = np.nan_to_num(got), np.nan_to_num(want)
        scale = max(float(np.max(np.abs(want))) if want.size else 0.0, 1e-6)
        assert float(np.max(np.abs(got - want), initial=0.0)) <= 1e-4 * scale + 1e-5
