"""The c backend's thread cost model: how many threads each resnet50 kernel gets at 4 and 16 threads.

Run with ``-s`` to see the decisions (kernel, MFLOP, MB, parallel units, estimated us on one
thread -> on the chosen count).  The machine is fixed (AVX-512, 1 MiB L2, 32 MiB L3: the cost
model's ``Machine`` and the blocking, ``xeon_blocking``) so the decisions do not depend on the
CPU running the test.
"""

from __future__ import annotations

import re

import onnx_ir as ir
import pytest

from codegraft.backends.c._blocking import Blocking, CpuDescription
from codegraft.backends.c._branches import Stage
from codegraft.backends.c._codegen import KernelThreads, generate
from codegraft.backends.c._thread_cost import Machine, Work, choose
from codegraft.backends.c._toolchain import target_for
from codegraft.testing import light_model

AVX512 = target_for(frozenset({"avx2", "fma", "avx512f", "avx512dq", "avx512bw", "avx512vl"}))
MACHINE = Machine.for_cpu(16, l2_bytes=1 << 20, l3_bytes=32 << 20)


pytestmark = pytest.mark.usefixtures("xeon_blocking")


@pytest.fixture(scope="module")
def resnet50(xeon_blocking: None) -> dict[int, tuple[tuple[KernelThreads, ...], str, tuple[Stage, ...]]]:
    model = ir.from_proto(light_model("resnet50"))
    plans = {}
    for threads in (4, 16):
        program = generate(model, AVX512, threads, MACHINE)
        plans[threads] = (program.threads, program.source, program.stages)
    return plans


def _show(threads: int, plan: tuple[KernelThreads, ...]) -> None:
    print(f"\nresnet50 at {threads} threads:")
    for k in plan:
        w, c = k.work, k.choice
        print(f"  {c.threads:2d} threads  {w.flops / 1e6:7.1f} MFLOP {w.bytes / 1e6:6.2f} MB {w.units:5d} units "
              f"{c.serial_us:7.0f} -> {c.parallel_us:6.0f} us  {k.kernel}")


def test_resnet50_big_convs_get_every_thread_small_kernels_few(resnet50: dict) -> None:
    at4, source4, stages4 = resnet50[4]
    at16, source16, stages16 = resnet50[16]
    _show(4, at4)
    _show(16, at16)
    assert len(at4) == len(at16) > 50
    # Kernels running side by side with another (issue 18: the downsampling shortcut next to
    # the block's first 1x1) share the threads; the stage's total is what compares.
    together = {k: sum(map(sum, s.threads)) for s in stages16 if s.concurrent for k in s.kernels}
    print("side by side at 16 threads:", [(s.kernels, s.threads) for s in stages16 if s.concurrent])
    assert not any(s.concurrent for s in stages4)
    for index, (k4, k16) in enumerate(zip(at4, at16, strict=True)):
        threads16 = together.get(index, k16.choice.threads)
        assert 1 <= k4.choice.threads <= 4 and 1 <= k16.choice.threads <= threads16 <= 16
        assert k4.choice.threads <= threads16, k4.kernel  # more cores never means fewer threads
        assert k16.choice.parallel_us <= k16.choice.serial_us
        if k16.work.gemm and k16.work.flops >= 100e6:  # the big convolutions: all threads
            assert k4.choice.threads == 4, k4.kernel
            # 15 where 16 would leave the slowest thread as many units as 15 do (132 units: 9 each)
            assert threads16 >= 15, k16.kernel
        if k16.choice.serial_us < 15:  # tiny kernels (the final pool): one thread or two
            assert k16.choice.threads <= 2, k16.kernel
        # (the input's layout change, ~38 us on one thread, takes 12: squeezenet's same transpose
        # on the 16-core Xeon ran fastest on 8, 0.016 ms, against 0.053 on one and 0.019 on 16)
    counts16 = sorted(k.choice.threads for k in at16)
    assert counts16[0] == 1 and counts16[-1] == 16
    assert any(1 < t < 15 for t in counts16)  # medium kernels: in between
    # The decision reaches the C: each kernel sets its limit before it runs.
    # (a line of its own: the library's C sets it too, commented, in cg_wino_chunk_task)
    assert len(re.findall(r"^ *cg_op_threads = \d+;$", source16, re.MULTILINE)) == len(at16)
    assert "cg_op_threads = 1;" in source16 and "cg_op_threads = 16;" in source16
    assert "cg_op_threads = 16;" not in source4


def test_cost_model_prefers_fewer_threads_when_sync_outweighs_work() -> None:
    small = Work(flops=2e5, bytes=4e4, units=512, gemm=True)  # ~2 us of work: waking anyone costs more
    big = Work(flops=2e9, bytes=8e6, units=4096, gemm=True)
    assert choose(small, 16, MACHINE).threads == 1
    assert choose(big, 16, MACHINE).threads == 16
    assert choose(big, 1, MACHINE).threads == 1
    assert choose(Work(flops=2e9, bytes=8e6, units=3, gemm=True), 16, MACHINE).threads == 3  # 3 tasks: 3 threads


def test_gemm_split_follows_the_threads_an_op_gets() -> None:
    blocking = Blocking.for_cpu(CpuDescription.avx512_xeon())  # 48 multiply-adds per ns: 240k per 5 us task
    # 1000 tiles of 6 x 64 x 64 = 24,576 multiply-adds, 1 channel block: 10 tiles per task by size...
    assert blocking.tiles_per_task(1000, 1, 6, 64, 64, 1) == 10
    # ...halved until every thread has 8 tasks: 16 threads need 128 tasks.
    per_task = blocking.tiles_per_task(1000, 1, 6, 64, 64, 16)
    assert -(-1000 // per_task) >= 128
    assert blocking.tiles_per_task(5, 4, 6, 64, 4096, 16) == 1


def test_cache_sizes_are_read_from_the_os(tmp_path) -> None:
    from codegraft.backends.c._toolchain import CacheSizes, cache_sizes

    for name, level, kind, size in [("index0", 1, "Data", "48K"), ("index1", 1, "Instruction", "32K"),
                                    ("index2", 2, "Unified", "2048K"), ("index3", 3, "Unified", "105M")]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "level").write_text(f"{level}\n")
        (tmp_path / name / "type").write_text(f"{kind}\n")
        (tmp_path / name / "size").write_text(f"{size}\n")
    assert cache_sizes(tmp_path) == CacheSizes(l1d=48 << 10, l2=2 << 20, l3=105 << 20)
    assert cache_sizes(tmp_path / "missing") == CacheSizes()


def test_kernels_that_only_move_data_count_their_moves_and_scale_by_their_size() -> None:
    """Transposes and concats count their element moves as flops, as elementwise kernels do:
    each thread takes the same share of every loop, so it finds most of its share in its own
    cache (once the shuffles were kept on one thread, their input in the other cores' caches;
    with shares, two threads took 0.6-0.7x as long).  Shufflenet at 16 threads: its large
    channel shuffle (56 x 56 x 112) gets several threads, its 7 x 7 ones (a few microseconds)
    one; densenet121's concats take more than one."""
    plan = generate(ir.from_proto(light_model("shufflenet")), AVX512, 16, MACHINE).threads
    shuffles = {k.node: k for k in plan if k.kernel.startswith("Transpose") and "data" not in k.node}
    assert len(shuffles) >= 10 and all(k.work.flops > 0 for k in shuffles.values())
    largest = max(shuffles.values(), key=lambda k: k.work.bytes)
    smallest = min(shuffles.values(), key=lambda k: k.work.bytes)
    assert largest.choice.threads > 2 and smallest.choice.threads == 1
    dense = generate(ir.from_proto(light_model("densenet121")), AVX512, 16, MACHINE).threads
    concats = [k for k in dense if k.kernel.startswith("Concat")]
    assert len(concats) > 50 and all(k.work.flops > 0 for k in concats)
    assert sum(k.choice.threads > 1 for k in concats) > len(concats) // 2


def test_a_global_pool_counts_its_input_and_its_channel_blocks() -> None:
    """A GlobalAveragePool sums every input value, one task per image and 64 channels
    (``cg_global_pool``): counted as an elementwise kernel of its output (1,000 values, one
    unit), squeezenet's pool over 13 x 13 x 1000 stayed on one thread, and at 2 threads took
    0.074 ms there against 0.033 in a one-thread build (its input written by both cores)."""
    for threads in (2, 16):
        plan = generate(ir.from_proto(light_model("squeezenet")), AVX512, threads, MACHINE).threads
        (pool,) = [k for k in plan if k.kernel.startswith("GlobalAveragePool")]
        assert pool.work.flops == 13 * 13 * 1000 and pool.work.units == 16
        assert pool.choice.threads > 1
