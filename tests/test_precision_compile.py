"""Lower precision through compile: converted per partition, self-checked, reported; int8 QDQ."""

from __future__ import annotations

import numpy as np
import pytest

import codegraft as cg
from codegraft.testing import SubsetBackend, assert_close, light_model, random_feeds, run_onnxruntime


def test_float16_partition_is_checked_and_reported() -> None:
    model = light_model("squeezenet")
    acc = SubsetBackend("acc", {"Conv", "Relu", "Concat", "MaxPool"})
    exe = cg.compile(model, targets=[acc], precision="float16", min_partition_size=4)
    notes = [p.conversion_note for p in exe.report().partitions if p.backend == "acc"]
    assert notes and all(n.startswith("float16, error") for n in notes), notes
    feeds = random_feeds(model)
    # Stated tolerance for float16: 1e-2 relative to the output's scale.
    assert_close(exe.run(feeds), run_onnxruntime(model, feeds), rtol=1e-2)


def test_host_stays_float32_unless_targeted() -> None:
    model = light_model("squeezenet")
    acc = SubsetBackend("acc", {"Conv"})
    exe = cg.compile(model, targets=[acc], precision="float16", min_partition_size=4)
    host_notes = [p.conversion_note for p in exe.report().partitions if p.backend == "onnxruntime"]
    assert host_notes and not any(host_notes)
    feeds = random_feeds(model)
    assert_close(exe.run(feeds), run_onnxruntime(model, feeds), rtol=1e-2)


def test_lower_precision_no_target_declares_is_an_error() -> None:
    model = light_model("squeezenet")
    with pytest.raises(cg.OptionError, match=r"precision 'bfloat16' is declared by none of the targets "
                       r"\(numpy_example runs float32\)"):
        cg.compile(model, targets=["numpy_example"], precision="bfloat16")
    with pytest.raises(cg.OptionError, match=r"\(none given\).*-t onnxruntime runs float16"):
        cg.compile(model, targets=[], precision="float16")


def test_precision_some_targets_lack_is_noted() -> None:
    model = light_model("squeezenet")
    exe = cg.compile(model, targets=[SubsetBackend("acc", {"Conv"}), "numpy_example"], precision="float16")
    notes = {p.conversion_note for p in exe.report().partitions if p.backend == "numpy_example"}
    assert notes == {"float16 not declared by numpy_example: runs float32"}
    assert "float16 is not declared by numpy_example: its partitions run float32" in exe.report().notes
    assert "float16 is not declared by numpy_example" in str(exe.report())


def test_int8_quantizes_with_calibration_and_keeps_units_whole() -> None:
    model = light_model("squeezenet")
    calibration = [random_feeds(model, seed=s) for s in range(4)]
    fp32_only = SubsetBackend("fp32", {"Conv", "Relu", "Concat", "MaxPool"})
    fp32_only.capabilities = cg.Capabilities()  # float32 only: declines QDQ
    exe = cg.compile(model, targets=[fp32_only], precision="int8", sample_inputs=calibration)
    report = exe.report()
    assert any(p.name == "quantize_int8" for p in report.passes)
    dq = [n for n in report.nodes if n.op_type == "DequantizeLinear"]
    assert dq and all(n.backend == "onnxruntime" for n in dq)
    assert all(("fp32", "DequantizeLinear: int8 not declared by fp32") in n.declined for n in dq)
    feeds = random_feeds(model, seed=9)
    expected = run_onnxruntime(model, feeds)
    (name,) = expected
    got = exe.run(feeds)[name]
    error = np.max(np.abs(got - expected[name])) / np.max(np.abs(expected[name]))
    assert error < 5e-2  # stated int8 tolerance


def test_int8_without_calibration_is_a_clear_error() -> None:
    import pytest

    with pytest.raises(cg.ModelError, match="int8.* needs calibration data"):
        cg.compile(light_model("squeezenet"), precision="int8")


def test_openvino_runs_bfloat16_by_hint_and_checks_itself() -> None:
    import pytest

    if not any(i.name == "openvino" and i.available for i in cg.list_backends()):
        pytest.skip("openvino is not installed")
    model = light_model("squeezenet")
    exe = cg.compile(model, targets=["openvino"], precision="bfloat16", strict=True)
    (note,) = {p.conversion_note for p in exe.report().partitions if p.backend == "openvino"}
    assert note.startswith("bfloat16 (openvino precision hint), error")
    feeds = random_feeds(model)
    # Stated tolerance for bfloat16 (8 bits of mantissa): 3e-2 relative to the output's scale.
    assert_close(exe.run(feeds), run_onnxruntime(model, feeds), rtol=3e-2)


def test_nhwc_backend_reports_the_edge_conversions_left() -> None:
    import pytest

    if not any(i.name == "c" and i.available for i in cg.list_backends()):
        pytest.skip("the c backend is unavailable here (no C compiler)")
    exe = cg.compile(light_model("resnet50"), targets=["c"], strict=True)
    (note,) = {p.conversion_note for p in exe.report().partitions if p.backend == "c"}
    # One transpose at the input edge, not one per conv (53 convs, BatchNormalization folded in).
    assert note.startswith("NHWC: 55 ops converted, 1 transposes and 0 reshapes left at edges"), note
