"""The bench logic (``codegraft bench``) and the boundary model run end to end; no timing asserted."""

from __future__ import annotations

import pathlib

import pytest

from bench import boundary, zoo  # noqa: E402
from codegraft.cli.bench import compare  # noqa: E402


def test_compare_lists_every_configuration(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    pytest.importorskip("openvino", reason="openvino is not installed: pip install codegraft[openvino]")
    monkeypatch.setenv("CODEGRAFT_CACHE_DIR", str(tmp_path))
    progress: list[tuple[str, int, int]] = []
    model = zoo.mlp(batch=2, sizes=(16, 32, 8))
    table = compare(model, ["openvino"], runs=2, warmup=1, threads=1, progress=lambda *a: progress.append(a))
    configs = [r.config for r in table.rows]
    assert configs == ["onnxruntime", "openvino", "codegraft[openvino]", "codegraft[host]", "codegraft[measured]"]
    for row in table.rows:
        assert not row.error, row.error
        assert row.median_ms > 0 and row.ratio > 0
        assert row.max_rel_error < 1e-4
    best = table.best_peer()
    assert best is not None and best.ratio == 1.0
    assert progress[-1][1] == progress[-1][2]  # done == total at the end
    assert "codegraft[measured]" in table.render()


def test_a_target_that_cannot_run_is_a_row_not_a_crash() -> None:
    table = compare(zoo.mlp(batch=2, sizes=(16, 8)), ["no-such-backend"], runs=1, warmup=0, measured=False)
    row = table.row("codegraft[no-such-backend]")
    assert row is not None and "no-such-backend" in row.error
    assert "failed" in table.render()


def test_boundary_chain_is_one_partition_per_op() -> None:
    result = boundary.measure_pair(boundary.NumpyBackend(), boundary.NumpyBackend(), runs=3)
    assert result.crossings == boundary.CHAIN - 1


def test_c_models_scaling_table_flags_a_model_slower_with_more_threads() -> None:
    from bench.c_models import _counts, scaling_table, slower_steps
    from bench.c_ops import Row

    rows = {1: [Row("a", 10.0, 8.0), Row("b", 4.0, 4.0)], 4: [Row("a", 3.0, 3.0), Row("b", 5.0, 2.0, error=0.03)]}
    text = scaling_table(rows)
    assert "| a | 1.25x | 1.00x | 10 / 3 | 8 / 3 |" in text
    assert "| b | 1.00x | 2.50x | 4 / 5 | 4 / 2 |" in text
    assert "c slower with more threads: b (1->4 threads)" in text
    assert text.endswith("c off onnxruntime by over 0.0001 relative: b at 4 threads (3.0e-02)")
    assert slower_steps(rows) == [("b", 1, 4)]
    assert _counts("1,4,16") == [1, 4, 16]
    with pytest.raises(Exception, match="positive"):
        _counts("0,4")


def test_c_bench_measures_how_far_c_is_off_onnxruntime() -> None:
    import numpy as np
    import onnx

    from bench import c_ops
    from bench.c_ops import relative_error
    from codegraft.testing import light_model

    assert relative_error([np.array([1.0, 2.002])], [np.array([1.0, 2.0])]) == 0.001
    assert relative_error([np.zeros(3), np.ones(2)], [np.zeros(3), np.ones(2)]) == 0.0
    model = light_model("squeezenet")
    row = c_ops.compare("squeezenet", model, threads=1, repeat=1)
    assert 0 < row.error < 1e-5  # real numbers, and close
    wrong = onnx.ModelProto()
    wrong.CopyFrom(model)
    weight = next(t for t in wrong.graph.initializer if len(t.dims) == 4)
    weight.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(weight) * 1.01, weight.name))
    session = c_ops.ort_session(model, 1)  # onnxruntime on the original, c on the changed weights
    runnable, inputs, feeds = c_ops.on_c(wrong, 1)
    assert relative_error(runnable.run(inputs), session.run(None, feeds)) > 1e-3


def test_c_layers_groups_a_models_convolutions_by_shape() -> None:
    import numpy as np

    from bench.c_layers import describe, distinct_convs, layer_model
    from codegraft.testing import light_model

    layers = distinct_convs(light_model("squeezenet"))
    assert len(layers) == 18 and sum(layer.count for layer in layers) == 26  # 8 fire modules, 3 convs each, + 2
    assert describe(layers[0]) == "3->64 3x3 @224x224 s2"
    twice = [describe(layer) for layer in layers if layer.count == 2]
    assert twice[:2] == ["16->64 1x1 @55x55 s1", "16->64 3x3 @55x55 s1"]
    model = layer_model(layers[0], np.random.default_rng(0))
    assert [n.op_type for n in model.graph.node] == ["Conv", "Relu"]
    assert [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim] == [1, 3, 224, 224]


def test_c_kernel_timers_can_time_a_first_call_as_it_comes() -> None:
    """``bench.c_layers`` flushes the caches and times the next call: no untimed warm-up run."""
    import numpy as np
    import onnx_ir as ir

    from bench.c_layers import distinct_convs, layer_model
    from codegraft.backend import Partition
    from codegraft.backends.c import CBackend
    from codegraft.testing import light_model

    model = layer_model(distinct_convs(light_model("squeezenet"))[1], np.random.default_rng(0))
    backend = CBackend(num_threads=1)
    runnable = backend.load(backend.compile(Partition("layer", ir.from_proto(model))))
    x = np.random.default_rng(1).standard_normal((1, 64, 55, 55)).astype(np.float32)
    kernels = runnable.profile_ops([x], 1, warm_up=False)
    assert [k.op_type.split()[0] for k in kernels].count("Conv") == 1 and all(k.ms > 0 for k in kernels)


def test_c_layers_traces_onnxruntime_nodes_back_to_their_convs() -> None:
    """onnxruntime fuses resnet50's Conv + BatchNormalization (+ Add) + Relu into nodes named after
    their last output; ``bench.c_layers --in-model`` finds each one's Conv, every Conv once."""
    import json
    import pathlib
    import tempfile

    import numpy as np
    import onnxruntime as ort

    from bench.c_layers import conv_keys, conv_of_ort_nodes
    from codegraft.testing import light_model

    model = light_model("resnet50")
    with tempfile.TemporaryDirectory() as folder:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.enable_profiling = True
        options.profile_file_prefix = str(pathlib.Path(folder) / "p")
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        session.run(None, {model.graph.input[0].name: np.zeros((1, 3, 224, 224), np.float32)})
        events = json.loads(pathlib.Path(session.end_profiling()).read_text())
    names = [e["name"].removesuffix("_kernel_time") for e in events
             if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and e["args"].get("op_name") == "Conv"]
    assert len(names) == 53 and not set(names) & set(conv_keys(model))  # all renamed by the fusions
    traced = conv_of_ort_nodes(model, names)
    assert sorted(traced.values()) == sorted(conv_keys(model))


def test_c_layers_leaves_nodes_onnxruntime_ran_apart_from_their_conv_alone() -> None:
    """Shufflenet's residual Sum and Relu after a grouped Conv are nodes of their own in
    onnxruntime: their few microseconds are not the Conv's (they once overwrote its time, and
    its grouped layers read 1.5-2.1x of onnxruntime instead of 0.9-1.4x)."""
    from bench.c_layers import conv_of_ort_nodes
    from codegraft.testing import light_model

    model = light_model("shufflenet")
    kinds = {n.name: n.op_type for n in model.graph.node}
    assert (kinds["n110"], kinds["n112"], kinds["n113"]) == ("Conv", "Sum", "Relu")
    assert conv_of_ort_nodes(model, ["n110", "n112", "n113", "r165_nchwc"]) == {"n110": "n110", "r165_nchwc": "n163"}


def test_c_layers_in_model_times_every_conv() -> None:
    from bench.c_layers import conv_keys, time_in_model
    from codegraft.testing import light_model

    model = light_model("squeezenet")
    times = time_in_model(model, threads=1, repeat=1)
    assert set(times) == set(conv_keys(model)) and len(times) == 26
    assert all(c_ms > 0 and ort_ms > 0 for c_ms, ort_ms in times.values())


def test_c_layers_marks_the_convolutions_run_side_by_side() -> None:
    """At 16 threads squeezenet's expand convolutions run side by side (concurrent stages);
    the in-model table marks them, since their timers overlap.  At one thread none do."""
    from bench.c_layers import conv_keys, side_by_side
    from codegraft.testing import light_model

    model = light_model("squeezenet")
    together = side_by_side(model, 16)
    assert together and together <= set(conv_keys(model))
    assert side_by_side(model, 1) == set()


def test_c_kernels_times_every_kernel_at_each_thread_count_and_flags_the_slower() -> None:
    from bench.c_kernels import KernelRow, kernel_rows, table

    rows = kernel_rows("squeezenet", [1, 2], repeat=1)
    assert len(rows) > 26 and all(len(r.ms) == 2 and min(r.ms) > 0 for r in rows)
    assert any(r.kind.startswith("Conv") and r.threads == (1, 2) for r in rows)
    made = [KernelRow("a", "Conv", (2.0, 1.0), (1, 2), False), KernelRow("b", "Pool", (0.1, 0.3), (1, 2), True)]
    text = table(made, [1, 2], top=5)
    assert "| Conv | a | 1 / 2 | 2.000 / 1.000 | 2.00 |  |" in text
    assert "| Pool * | b | 1 / 2 | 0.100 / 0.300 | 0.33 | slower |" in text
    assert text.endswith("kernels slower with more threads: 1 of 2, 0.30 ms at 2 threads")
    # the cost model against the clock: its estimate for every kernel at each count
    assert all(len(r.estimated_us) == 2 and min(r.estimated_us) > 0 for r in rows)
    assert "| GEMM on one thread | " in table(rows, [1, 2], top=5)


def test_c_measure_reports_every_kernel_and_what_was_kept() -> None:
    from bench import c_measure
    from tests.c_backend_util import compiler_available

    if not compiler_available():
        pytest.skip("no C compiler")
    text = c_measure.report("squeezenet", threads=2, rounds=2)
    rows = [line for line in text.splitlines() if line.startswith("| n")]
    assert text.startswith("## squeezenet, measured up to 2 threads") and "| 1 thr ms | 2 thr ms |" in text
    assert len(rows) >= 26  # every convolution of squeezenet, named after its ONNX node
    assert "kept: " in text or "every kernel picked the cost model's count" in text


def test_corpus_vs_times_a_model_against_onnxruntime(monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    from bench import corpus_vs
    from tests.c_backend_util import compiler_available

    if not compiler_available():
        pytest.skip("no C compiler")
    monkeypatch.setattr("sys.argv", ["corpus_vs", "--only", "light_squeezenet", "--repeat", "5"])
    corpus_vs.main()
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| light_squeezenet |")]
    assert len(rows) == 1
    ours, theirs, ratio = (float(cell) for cell in rows[0].strip("| ").split(" | ")[1:])
    assert ours > 0 and theirs > 0 and ratio == pytest.approx(ours / theirs, abs=0.01)


def test_corpus_revisions_times_two_trees_artifacts_in_one_process(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from bench import corpus_revisions
    from tests.c_backend_util import compiler_available

    if not compiler_available():
        pytest.skip("no C compiler")
    root = pathlib.Path(__file__).resolve().parent.parent
    argv = ["corpus_revisions", "--against-tree", str(root), "--model", "light_squeezenet", "--repeat", "3"]
    monkeypatch.setattr("sys.argv", argv)
    corpus_revisions.main()
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("light_squeezenet, 2 threads, targets c: new ") and "outputs differ by 0.0e+00" in line
