"""The public face of codegraft.passes: what the core and backends import."""

from __future__ import annotations

import inspect

import codegraft.passes as passes


def test_everything_listed_is_importable() -> None:
    for name in passes.__all__:
        assert getattr(passes, name) is not None, name


def test_signatures_the_core_calls() -> None:
    assert list(inspect.signature(passes.run_common_passes).parameters) == ["model", "options", "after_each"]
    assert list(inspect.signature(passes.to_nhwc).parameters) == ["model"]
    checked = inspect.signature(passes.convert_precision_checked).parameters
    assert list(checked)[:5] == ["model", "precision", "sample_feeds", "evaluate", "tolerance"]
    assert list(inspect.signature(passes.convert_precision).parameters) == ["model", "precision", "keep_float32_ops"]
    assert list(inspect.signature(passes.sample_feeds_for).parameters)[:3] == ["model", "n", "seed"]
    assert list(inspect.signature(passes.quantize_int8).parameters) == ["model", "calibration", "options"]


def test_result_types_are_frozen() -> None:
    import dataclasses

    for cls in (
        passes.LayoutResult,
        passes.PassOptions,
        passes.PassRecord,
        passes.PipelineResult,
        passes.PrecisionResult,
        passes.ConversionResult,
        passes.MovedOp,
        passes.KeptOp,
        passes.QuantizeOptions,
        passes.QuantizeResult,
    ):
        assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen, cls  # type: ignore[attr-defined]
