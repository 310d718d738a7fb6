"""Per-op latency of the ``c`` backend against onnxruntime on the same one-op (or chain) model.

Run from the repository root::

    .venv/bin/python -m bench.c_ops [--threads N] [--repeat R] [--write bench/C_RESULTS.md]

Both run the same model with the same number of threads, in the same process, in
alternation, call by call (so a noisy neighbour slows both alike); the table gives medians
and the ratio ``c / onnxruntime`` (below 1: ``c`` is faster).  onnxruntime runs with all its
graph optimisations on and its default session options (spinning on, as its users run it),
``intra_op_num_threads`` set to the same count as ``c``'s threads (see :func:`ort_session`).
GEMM rows also give GFLOP/s and the fraction of this CPU's peak: a measured AVX-512 FMA
loop per core (see :func:`measured_fma_gflops`), next to the nominal cores x clock x FMA
units x SIMD lanes x 2 (:func:`peak_gflops`).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import pathlib
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from codegraft.backend import Partition
from codegraft.backends.c import CBackend
from codegraft.backends.c._runtime import CRunnable
from codegraft.backends.c._toolchain import Toolchain, cpu_features


@dataclass(frozen=True)
class Row:
    """One benchmark line."""

    name: str
    c_ms: float
    ort_ms: float
    flops: float = 0.0  # per call, for GEMM-like rows
    error: float = 0.0  # c against onnxruntime: largest |difference| / largest |onnxruntime output|

    @property
    def ratio(self) -> float:
        return self.c_ms / self.ort_ms


def settle(slice_s: float = 0.005, limit_s: float = 1.0) -> float:
    """Wait until no thread of this process is busy (the other engine's workers stopped spinning).

    onnxruntime's workers spin for tens of milliseconds after each ``run`` (default session
    options; ``c``'s for at most 0.4 ms): a block of the other engine's calls started inside that
    window shares the cores with them, which on 2 cores made ``c`` at 2 threads look slower
    than at 1 (squeezenet 9.4 ms against 5.5 alone).  Each side is timed as its users run it,
    alone, so a block starts once a slice of sleep costs this process under 10% of a core.
    Returns the seconds waited.
    """
    start = time.perf_counter()
    while time.perf_counter() - start < limit_s:
        cpu, wall = time.process_time(), time.perf_counter()
        time.sleep(slice_s)
        if time.process_time() - cpu < 0.1 * (time.perf_counter() - wall):
            break
    return time.perf_counter() - start


def median_pair(c_call: Callable[[], object], ort_call: Callable[[], object], repeat: int,
                block: int = 1, idle: float = 0.0) -> tuple[float, float]:
    """Medians (ms) of two callables timed alternately in blocks of ``block`` calls, after a warm-up.

    ``block=1`` alternates call by call: a burst of load from other jobs then hits both sides
    alike.  Larger blocks let each side's thread pool settle (onnxruntime's workers spin for a
    while after a call and would otherwise share the cores with the next ``c`` call).  With
    ``idle`` (seconds), each timed call comes after that long a quiet spell (once the other
    engine's workers stopped spinning: onnxruntime's spin for tens of ms, which would otherwise
    share the cores with the next ``c`` call), as a service's requests do.
    """
    for _ in range(2):
        c_call()
        ort_call()
    c_times: list[float] = []
    ort_times: list[float] = []
    for _ in range(max(1, -(-repeat // block))):
        for call, times in ((c_call, c_times), (ort_call, ort_times)):
            if block > 1:
                settle()
            for _ in range(block):
                if idle:  # quiet for that long: the other engine's workers stopped spinning first
                    settle()
                    time.sleep(idle)
                start = time.perf_counter()
                call()
                times.append(time.perf_counter() - start)
    return statistics.median(c_times) * 1e3, statistics.median(ort_times) * 1e3


def ort_session(model: onnx.ModelProto, threads: int) -> ort.InferenceSession:
    """onnxruntime as its users run it: default session options, ``threads`` intra-op threads.

    Its workers spin between calls by default; turning that off (as this bench once did) costs
    onnxruntime 13-27% and would flatter ``c`` (issue 18).
    """
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def on_c(
    model: onnx.ModelProto, threads: int, seed: int = 0, measure_threads: bool = False, winograd: bool = True
) -> tuple[CRunnable, list[np.ndarray], dict[str, np.ndarray]]:
    """``model`` compiled whole on ``c`` (``CBackend(measure_threads=..., winograd=...)``), with random
    inputs (standard normal, ``seed``) both in the partition's order and as onnxruntime feeds."""
    rng = np.random.default_rng(seed)
    inits = {t.name for t in model.graph.initializer}
    feeds = {
        i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
        for i in model.graph.input
        if i.name not in inits
    }
    backend = CBackend(num_threads=threads, measure_threads=measure_threads, winograd=winograd)
    partition = Partition("bench", ir.from_proto(model))
    runnable = backend.load(backend.compile(partition))
    return runnable, [feeds[n] for n in partition.input_names], feeds


def compare(name: str, model: onnx.ModelProto, threads: int, repeat: int, flops: float = 0.0,
            block: int = 1, idle: float = 0.0, measure_threads: bool = False) -> Row:
    """Compile ``model`` whole on ``c`` (:func:`on_c`) and time it against onnxruntime on the
    same feeds (:func:`median_pair`'s ``block`` and ``idle``)."""
    runnable, inputs, feeds = on_c(model, threads, measure_threads=measure_threads)
    session = ort_session(model, threads)
    error = relative_error(runnable.run(inputs), session.run(None, feeds))
    c_ms, ort_ms = median_pair(lambda: runnable.run(inputs), lambda: session.run(None, feeds), repeat, block, idle)
    return Row(name, c_ms, ort_ms, flops, error)


def relative_error(got: Sequence[np.ndarray], want: Sequence[object]) -> float:
    """The largest ``|got - want|`` over the largest ``|want|``, over all outputs (a speed figure
    of wrong results is worthless: the benches print this beside every timing).

    >>> relative_error([np.array([1.0, 2.002])], [np.array([1.0, 2.0])])
    0.001
    """
    worst = 0.0
    for a, b in zip(got, want, strict=True):
        b = np.asarray(b, np.float64)
        scale = float(np.abs(b).max()) if b.size else 0.0
        diff = float(np.abs(np.asarray(a, np.float64) - b).max()) if b.size else 0.0
        worst = max(worst, diff / scale if scale else diff)
    return round(worst, 12)


def _model(nodes: Sequence[onnx.NodeProto], inputs: dict[str, Sequence[int]], inits: dict[str, np.ndarray],
           opset: int = 17) -> onnx.ModelProto:
    graph = helper.make_graph(
        list(nodes), "bench",
        [helper.make_tensor_value_info(k, TensorProto.FLOAT, list(v)) for k, v in inputs.items()],
        [helper.make_tensor_value_info(nodes[-1].output[0], TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _rand(*shape: int) -> np.ndarray:
    return np.random.default_rng(1).uniform(-0.5, 0.5, size=shape).astype(np.float32)


def gemm_cases() -> list[tuple[str, onnx.ModelProto, float]]:
    cases = []
    for m, k, n in ((256, 256, 256), (512, 512, 512), (1024, 1024, 1024), (3136, 64, 256), (1, 2048, 1000)):
        node = helper.make_node("MatMul", ["a", "b"], ["y"])
        cases.append((f"MatMul {m}x{k} @ {k}x{n}", _model([node], {"a": (m, k)}, {"b": _rand(k, n)}), 2.0 * m * k * n))
    return cases


def conv_cases() -> list[tuple[str, onnx.ModelProto, float]]:
    cases = []
    for cin, cout, size, k, group, label in (
        (64, 64, 56, 3, 1, "3x3 64->64 @56"),
        (256, 64, 56, 1, 1, "1x1 256->64 @56"),
        (256, 256, 14, 3, 1, "3x3 256->256 @14"),
        (3, 64, 224, 7, 1, "7x7/2 3->64 @224"),
        (32, 32, 112, 3, 32, "depthwise 3x3 32 @112"),
    ):
        stride = 2 if k == 7 else 1
        nodes = [
            helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[k // 2] * 4, strides=[stride, stride], group=group),
            helper.make_node("Relu", ["c"], ["y"]),
        ]
        model = _model(nodes, {"x": (1, cin, size, size)}, {"w": _rand(cout, cin // group, k, k), "b": _rand(cout)})
        out = size // stride
        cases.append((f"Conv+bias+Relu {label}", model, 2.0 * cout * (cin // group) * k * k * out * out))
    return cases


def elementwise_cases() -> list[tuple[str, onnx.ModelProto, float]]:
    shape = (1, 64, 112, 112)
    chain = [
        helper.make_node("Add", ["x", "b"], ["t0"]),
        helper.make_node("Mul", ["t0", "s"], ["t1"]),
        helper.make_node("Relu", ["t1"], ["t2"]),
        helper.make_node("Sub", ["t2", "x"], ["y"]),
    ]
    per_channel = {"b": _rand(64, 1, 1), "s": _rand(64, 1, 1)}
    gelu = [
        helper.make_node("Div", ["x", "r2"], ["g0"]),
        helper.make_node("Erf", ["g0"], ["g1"]),
        helper.make_node("Add", ["g1", "one"], ["g2"]),
        helper.make_node("Mul", ["x", "g2"], ["g3"]),
        helper.make_node("Mul", ["g3", "half"], ["y"]),
    ]
    consts = {"r2": np.array(np.sqrt(2.0)), "one": np.array(1.0), "half": np.array(0.5)}
    hswish = [
        helper.make_node("HardSigmoid", ["x"], ["h0"], alpha=1 / 6, beta=0.5),
        helper.make_node("Mul", ["x", "h0"], ["h1"]),
        helper.make_node("Add", ["h1", "x"], ["y"]),
    ]
    return [
        ("chain Add+Mul+Relu+Sub (per-channel) 1x64x112x112", _model(chain, {"x": shape}, per_channel), 0.0),
        ("chain GELU (Div, Erf, Add, Mul, Mul) 1x64x112x112", _model(gelu, {"x": shape}, consts), 0.0),
        ("chain HardSigmoid+Mul+Add 1x64x112x112", _model(hswish, {"x": shape}, {}), 0.0),
        ("Relu alone 1x64x112x112", _model([helper.make_node("Relu", ["x"], ["y"])], {"x": shape}, {}), 0.0),
    ]


def other_cases() -> list[tuple[str, onnx.ModelProto, float]]:
    pool = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    gap = helper.make_node("GlobalAveragePool", ["x"], ["y"])
    softmax = helper.make_node("Softmax", ["x"], ["y"], axis=-1)
    return [
        ("MaxPool 3x3/2 1x64x112x112", _model([pool], {"x": (1, 64, 112, 112)}, {}), 0.0),
        ("GlobalAveragePool 1x2048x7x7", _model([gap], {"x": (1, 2048, 7, 7)}, {}), 0.0),
        ("Softmax 256x1000", _model([softmax], {"x": (256, 1000)}, {}), 0.0),
    ]


def peak_gflops(threads: int) -> tuple[float, str]:
    """Theoretical float32 peak: threads x GHz x FMA pipes x lanes x 2, with how it was computed.

    Two 512-bit FMA pipes per core (Zen 4/5 server parts and Xeon with two AVX-512 FMA
    units), two 256-bit pipes with AVX2 only; the clock is the one ``/proc/cpuinfo`` reports.
    """
    ghz = 0.0
    for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("cpu MHz"):
            ghz = float(line.split(":")[1]) / 1000
            break
    lanes = 16 if "avx512f" in cpu_features() else 8
    peak = threads * ghz * 2 * lanes * 2
    return peak, f"{threads} cores x {ghz:.2f} GHz x 2 FMA pipes x {lanes} lanes x 2 flops = {peak:.0f} GFLOP/s"


_FMA_LOOP = """
#include <omp.h>
double fma_peak(long iters, int threads) {
  double t0 = omp_get_wtime();
  #pragma omp parallel num_threads(threads)
  for (long i = 0; i < iters; i++)
    __asm__ volatile(
      "vfmadd231ps %%zmm14, %%zmm15, %%zmm0\\n\\t" "vfmadd231ps %%zmm14, %%zmm15, %%zmm1\\n\\t"
      "vfmadd231ps %%zmm14, %%zmm15, %%zmm2\\n\\t" "vfmadd231ps %%zmm14, %%zmm15, %%zmm3\\n\\t"
      "vfmadd231ps %%zmm14, %%zmm15, %%zmm4\\n\\t" "vfmadd231ps %%zmm14, %%zmm15, %%zmm5\\n\\t"
      "vfmadd231ps %%zmm14, %%zmm15, %%zmm6\\n\\t" "vfmadd231ps %%zmm14, %%zmm15, %%zmm7\\n\\t"
      "vfmadd231ps %%zmm14, %%zmm15, %%zmm8\\n\\t" "vfmadd231ps %%zmm14, %%zmm15, %%zmm9\\n\\t"
      "vfmadd231ps %%zmm14, %%zmm15, %%zmm10\\n\\t" "vfmadd231ps %%zmm14, %%zmm15, %%zmm11\\n\\t"
      ::: "xmm0","xmm1","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7","xmm8","xmm9","xmm10","xmm11");
  return (double)iters * 12 * 16 * 2 * threads / (omp_get_wtime() - t0) / 1e9;
}
"""


def measured_fma_gflops(threads: int) -> float | None:
    """Best of five runs of an AVX-512 FMA loop (12 independent chains) on ``threads`` threads."""
    if "avx512f" not in cpu_features():
        return None
    with tempfile.TemporaryDirectory() as tmp:
        src, lib = pathlib.Path(tmp) / "fma.c", pathlib.Path(tmp) / "fma.so"
        src.write_text(_FMA_LOOP)
        compiler = Toolchain().resolved_compiler()
        flags = ["-O2", "-fopenmp", "-mavx512f", "-shared", "-fPIC"]
        subprocess.run([compiler, *flags, str(src), "-o", str(lib)], check=True)
        fn = ctypes.CDLL(str(lib)).fma_peak
        fn.restype, fn.argtypes = ctypes.c_double, [ctypes.c_long, ctypes.c_int]
        return max(fn(20_000_000, threads) for _ in range(7))


def table(rows: Sequence[Row], peak: float | None = None) -> str:
    lines = ["| case | c (ms) | onnxruntime (ms) | c / ort | c GFLOP/s | % of peak |", "|---|---:|---:|---:|---:|---:|"]
    for row in rows:
        gflops = row.flops / row.c_ms / 1e6 if row.flops else 0.0
        share = f"{100 * gflops / peak:.0f}%" if gflops and peak else ""
        lines.append(f"| {row.name} | {row.c_ms:.3f} | {row.ort_ms:.3f} | {row.ratio:.2f} | "
                     f"{f'{gflops:.0f}' if gflops else ''} | {share} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--repeat", type=int, default=30)
    args = parser.parse_args()
    peak, how = peak_gflops(args.threads)
    measured = measured_fma_gflops(args.threads)
    rows = [compare(name, model, args.threads, args.repeat, flops)
            for name, model, flops in gemm_cases() + conv_cases() + elementwise_cases() + other_cases()]
    print(f"threads: {args.threads}; peak: {how}; measured FMA loop: {measured and f'{measured:.0f} GFLOP/s'}")
    print(table(rows, peak))


if __name__ == "__main__":
    main()
