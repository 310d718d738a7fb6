"""Micro-kernel and blocking parameters from the CPU present (issue 18): decisions for a few CPUs.

Nothing here depends on the CPU running the test: each case is a ``CpuDescription``.
"""

from __future__ import annotations

import pytest

from codegraft.backends.c._blocking import Blocking, CpuDescription, vector_floats
from codegraft.backends.c._toolchain import CacheSizes

AVX512 = frozenset({"avx2", "fma", "avx512f", "avx512dq", "avx512bw", "avx512vl", "sse4_2"})
AVX2 = frozenset({"avx2", "fma", "sse4_2"})

XEON = CpuDescription(AVX512, CacheSizes(32 << 10, 1 << 20, 32 << 20))  # 32K L1d, 1M L2, AVX-512
SAPPHIRE = CpuDescription(AVX512, CacheSizes(48 << 10, 2 << 20, 105 << 20))  # 48K L1d, 2M L2, AVX-512
ZEN2 = CpuDescription(AVX2, CacheSizes(32 << 10, 512 << 10, 16 << 20))  # 32K L1d, 512K L2, AVX2
OLD_X86 = CpuDescription(frozenset({"sse4_2"}), CacheSizes(32 << 10, 256 << 10, 8 << 20))  # SSE only
GRAVITON = CpuDescription(frozenset(), CacheSizes(64 << 10, 1 << 20, 32 << 20), "aarch64")  # NEON


def test_vector_width_and_registers_follow_the_features() -> None:
    assert [vector_floats(c) for c in (XEON, ZEN2, OLD_X86, GRAVITON)] == [16, 8, 4, 4]
    assert [Blocking.for_cpu(c).registers for c in (XEON, ZEN2, OLD_X86, GRAVITON)] == [32, 16, 16, 32]
    # AVX-512 without the BW/DQ/VL extensions we compile with: the AVX2 target.
    assert vector_floats(CpuDescription(frozenset({"avx2", "fma", "avx512f"}), XEON.caches)) == 8


def test_tile_rows_fill_three_quarters_of_the_register_file() -> None:
    xeon, zen2, graviton = (Blocking.for_cpu(c) for c in (XEON, ZEN2, GRAVITON))
    assert [xeon.rows_per_tile(nv) for nv in (4, 3, 2, 1)] == [6, 8, 12, 16]  # 24 accumulators of 32
    assert [zen2.rows_per_tile(nv) for nv in (4, 3, 2, 1)] == [3, 4, 6, 8]  # 12 of 16
    assert [graviton.rows_per_tile(nv) for nv in (4, 3, 2, 1)] == [6, 8, 12, 16]  # NEON: 32 registers
    for blocking in (xeon, zen2, graviton):
        for nv in (4, 3, 2, 1):
            assert blocking.rows_per_tile(nv) * nv <= 3 * blocking.registers // 4  # FMAs read weights from memory


def test_tile_width_keeps_the_weight_panel_in_l2() -> None:
    xeon, sapphire, zen2 = (Blocking.for_cpu(c) for c in (XEON, SAPPHIRE, ZEN2))
    # resnet50's 3x3 convolutions: 64..512 channels, K = 9 x channels.
    assert xeon.tile(64, 3136, depth=576) == (4, 6)
    assert xeon.tile(256, 196, depth=2304) == (4, 6)  # 590 KB panel: fits 3/4 of 1 MiB
    assert xeon.tile(512, 49, depth=4608) == (2, 10)  # 1.2 MB at NV = 4 would not (49 rows: 5 tiles of 10)
    assert sapphire.tile(512, 49, depth=4608) == (4, 5)  # 2 MiB of L2 keeps it (49 rows: 10 tiles of 5)
    assert zen2.tile(512, 49, depth=4608) == (2, 5)  # 8-float vectors, 512K L2: 295 KB at NV = 2
    assert zen2.tile(256, 196, depth=2304) == (4, 3)
    # Lanes wasted on the last block still decide first: 96 channels in 64-wide tiles waste 33%.
    assert xeon.tile(96, 1000, depth=64) == (3, 8)
    assert xeon.tile(16, 1000) == (1, 16)
    assert xeon.tile(256, 2) == (4, 2)  # never more rows than there are


# (cpu, channels, rows, depth, the tile): how few lanes a tile pads against where its panel
# sits and what its k-step issues (Blocking.tile: FULL_L2_PANEL_COST, FEWER_LANES).
PADDING_CASES = {
    # uvdoc's 5x5 Conv over 128 channels (K = 3200): at 4 vectors the panel takes 80% of the
    # L2, at 3 the tiles pad 128 channels to 144 (11% of the lanes): the wider one.
    "full-l2-panel-avx2": ("zen2", 128, 1395, 3200, (4, 3)),
    "full-l2-panel-avx512": ("xeon", 128, 1395, 3200, (4, 6)),
    # 160 channels (K = 4000): 3 vectors pad 4.7%, under what a full L2 costs.
    "small-saving": ("zen2", 160, 1600, 4000, (3, 4)),
    # K = 4608: 4 vectors' 590 KB outgrow the L2; 2 vectors pad nothing and fit.
    "beyond-l2": ("zen2", 128, 1395, 4608, (2, 6)),
    # A 3x3 over 512 channels on the Xeon: 3 vectors' 884 KB panel fits the L2 but pads 3%,
    # 2 vectors pad none: the narrower stays.
    "narrower-pads-none": ("xeon", 512, 49, 4608, (2, 10)),
    # AVX2: 3 x 4 and 4 x 3 both issue 12 multiply-adds and 7 loads a step.  144 channels are
    # 6 blocks of 24 (none padded) rather than 5 of 32 (10% padded); 136 in 6 of 24 (5.6%)
    # rather than 5 of 32 (15%), inception_v1's 112 in 5 of 24 (6.7%) rather than 4 of 32 (12.5%).
    "twin-144": ("zen2", 144, 3136, 24, (3, 4)),
    "twin-136": ("zen2", 136, 49, 136, (3, 4)),
    "twin-112": ("zen2", 112, 169, 512, (3, 4)),
    # Too little saved: 1000 channels pad 2.3% at 4 vectors, 0.8% at 3; 208 pad 7.1% and 3.7%.
    "twin-saves-little-1000": ("zen2", 1000, 169, 512, (4, 3)),
    "twin-saves-little-208": ("zen2", 208, 169, 512, (4, 3)),
    # Not the same step: one row (4 and 3 multiply-adds a step), or AVX-512's 8 x 3 (11 loads
    # a step against 6 x 4's 10).
    "one-row": ("zen2", 144, 1, 512, (4, 1)),
    "avx512-widest-fits": ("xeon", 144, 3136, 24, (3, 8)),  # 144 = 3 x 48
    "avx512-no-twin": ("xeon", 240, 3136, 24, (4, 6)),  # 6.25% padded at 4 vectors, none at 3: kept
}


@pytest.mark.parametrize("case", PADDING_CASES.values(), ids=PADDING_CASES.keys())
def test_tile_width_pads_few_lanes(case: tuple[str, int, int, int, tuple[int, int]]) -> None:
    cpu, channels, rows, depth, expected = case
    blocking = Blocking.for_cpu({"zen2": ZEN2, "xeon": XEON}[cpu])
    assert blocking.tile(channels, rows, depth=depth) == expected


def test_channels_no_width_fits_take_the_tile_the_cost_model_prefers() -> None:
    xeon, zen2 = (Blocking.for_cpu(c) for c in (XEON, ZEN2))
    # shufflenet's groups of 34 and 68 channels: every width of 2-4 vectors wastes > 15%.
    # Before, these fell back to 1-vector tiles (more loads than FMAs); 25% of shufflenet.
    assert xeon.tile(68, 196, depth=68) == (5, 4)  # one 80-lane block, 4 rows
    assert xeon.tile(34, 784, depth=34) == (3, 8)  # one 48-lane block
    assert xeon.tile(24, 12544, depth=27) == (2, 12)
    assert zen2.tile(34, 784, depth=34) == (3, 4)  # 5 x 8 lanes would leave 2-row tiles: not offered
    assert xeon.tile(16, 1000) == (1, 16)  # one vector holds them all: nothing cheaper
    # The cost counts padded lanes and rows, and loads against FMAs.
    assert xeon.tile_cost(5, 68, 196) < xeon.tile_cost(1, 68, 196)
    assert xeon.tile_cost(4, 64, 12) == 2 * xeon.tile_cost(4, 64, 6)  # per tile of P rows
    assert xeon.tile_cost(4, 64, 7) < xeon.tile_cost(4, 64, 12)  # 7 rows: 2 tiles of 4, not 6 + a padded 1
    # Wide single-block tiles must still keep their weight panel in L2.
    assert xeon.tile(68, 196, depth=68 * 9 * 20) == (1, 14)  # 196 rows: 14 tiles of 14


def test_task_size_follows_the_fma_rate_and_the_threads() -> None:
    xeon, zen2 = Blocking.for_cpu(XEON), Blocking.for_cpu(ZEN2)
    # A 1x1 convolution over 64 channels at 56x56: tiles of 6 x 64 x 64 (AVX-512), 3 x 32 x 64 (AVX2).
    assert xeon.tiles_per_task(523, 1, 6, 64, 64, 1) == 10  # 240k multiply-adds: ~5 us at 48 per ns
    assert zen2.tiles_per_task(1046, 2, 3, 32, 64, 1) == 20  # 120k at 24 per ns
    # More threads: halved until each has 8 tasks.
    for threads in (2, 4, 16):
        per_task = xeon.tiles_per_task(523, 1, 6, 64, 64, threads)
        assert -(-523 // per_task) >= 8 * threads or per_task == 1
    assert xeon.tiles_per_task(523, 1, 6, 64, 64, 16) < xeon.tiles_per_task(523, 1, 6, 64, 64, 4)
    # A deep layer: one tile is already more than 5 us of work.
    assert xeon.tiles_per_task(9, 8, 6, 64, 4608, 1) == 1


def test_a_tile_runs_the_channel_blocks_whose_weights_stay_in_l2() -> None:
    xeon, zen2 = Blocking.for_cpu(XEON), Blocking.for_cpu(ZEN2)
    # resnet50's 1x1 expansion 64 -> 256 at 56x56 (AVX2 tiles: 3 rows x 32 channels): its 64 KB of
    # weights fit, so every one of the 8 blocks runs on a tile before the next tile.
    assert zen2.blocks_per_task(8, 64, 32, 3, 1046) == 8
    # 256 -> 128 at 14x14: 256 KB of weights, 32 KB per block; half of a 512K L2 holds 8 blocks.
    assert zen2.blocks_per_task(8, 256, 32, 3, 66) == 8
    # 256 -> 1024: 1 MB of weights, more than half the L2: the next range's weights are
    # prefetched into it beside the current range's, so a range takes a quarter: 4 blocks.
    assert zen2.blocks_per_task(32, 256, 32, 3, 66) == 4
    # So do groups whose weights together outgrow half the L2 (Winograd's 16 products).
    assert zen2.blocks_per_task(8, 256, 32, 3, 66, groups=16) == 4
    # A 3x3 over 512 channels: one block's panel (590 KB at 32 wide) already fills the L2.
    assert zen2.blocks_per_task(16, 4608, 32, 3, 17) == 1
    assert xeon.blocks_per_task(8, 4608, 64, 6, 9) == 1
    # One tile (a row-vector product): its weights are read once whatever the order.
    assert xeon.blocks_per_task(64, 4096, 64, 1, 1) == 1
    # The tile's results (rows x width per block) stay within half the L1.
    assert zen2.blocks_per_task(1000, 8, 32, 3, 100) == (32 << 10) // 2 // (4 * 3 * 32)


def test_weight_heavy_gemms_split_channels_across_threads_not_rows() -> None:
    """Every core running a range's row tiles loads that range's weights: where the weights
    dwarf the input, tasks are whole ranges of channel blocks, at least two per thread."""
    xeon = Blocking.for_cpu(XEON)
    # resnet50's 512 -> 2048 at 7x7: 32 blocks of 64 channels, 10 row tiles of 5
    for threads in (2, 4, 16):
        split = xeon.split(32, 1, 10, 512, 64, 5, threads, weights_outweigh_input=True)
        bpt, per_task = split.blocks_per_task, split.tiles_per_task
        assert per_task == 10 and -(-32 // bpt) >= 2 * threads
    # 2048 -> 512: 8 blocks; at 16 threads too few for two each, so the rows split as before
    assert xeon.split(8, 1, 10, 2048, 64, 5, 4, weights_outweigh_input=True)[1] == 10
    assert xeon.split(8, 1, 10, 2048, 64, 5, 16, weights_outweigh_input=True)[1] < 10
    # one thread, or a layer whose input outweighs its weights: the row split
    assert xeon.split(32, 1, 10, 512, 64, 5, 1, weights_outweigh_input=True)[1] < 10
    assert xeon.split(4, 1, 523, 64, 64, 6, 16, weights_outweigh_input=False)[1] < 523


def test_ranges_prefetch_the_next_ranges_weights_where_they_come_from_beyond_the_l2() -> None:
    """The first tile of a range of channel blocks reads the range's weights from memory
    unless the tiles of the range before asked for them: they do where there is a next range
    run after theirs and the weights outgrow half the L2."""
    xeon = Blocking.for_cpu(XEON)  # 1 MiB of L2
    # resnet50's 2048 -> 512 at 7x7 (4 MB) and 512 -> 512 3x3 at 7x7 (9.4 MB), any threads
    for threads in (1, 2, 16):
        assert xeon.split(8, 1, 10, 2048, 64, 5, threads, weights_outweigh_input=True).fetch_next
        assert xeon.split(8, 1, 10, 4608, 32, 10, threads, weights_outweigh_input=True).fetch_next
    # 64 -> 256 1x1 at 56x56: 64 KB of weights, one range: nothing to fetch
    assert not xeon.split(4, 1, 523, 64, 64, 6, 1, weights_outweigh_input=False).fetch_next
    # shufflenet's grouped 1x1 (77 KB) rows first: every range stays in L2
    assert not xeon.split(1, 3, 131, 80, 80, 6, 2, weights_outweigh_input=False).fetch_next
    # the blocks_per_task of a 256 -> 1024 at 14x14 (1 MB): two ranges, the weights beyond half the L2
    split = xeon.split(16, 1, 33, 256, 64, 6, 1, weights_outweigh_input=False)
    assert split.blocks_per_task < 16 and split.fetch_next


def test_gemm_tasks_go_rows_first_where_every_groups_weights_fit_in_half_the_l2() -> None:
    """The pool deals each thread a contiguous share of a GEMM's tasks: rows first where all
    the weights stay in L2 anyway (a thread's share is then rows of every group, as the
    kernels around it split), range by range where a range's weights fill the L2."""
    xeon = Blocking.for_cpu(XEON)  # 1 MiB of L2
    # shufflenet's 240 -> 240 1x1 in 3 groups (80 a group): 77 KB of weights
    assert xeon.split(1, 3, 131, 80, 80, 6, 2, weights_outweigh_input=False).rows_outer
    # alexnet's 5x5 conv in 2 groups, 48 -> 128 each: 1.2 MB together, though each fits
    assert not xeon.split(2, 2, 122, 1200, 64, 6, 2, weights_outweigh_input=False).rows_outer
    # a 3x3 over 256 channels (2.4 MB): range by range
    assert not xeon.split(4, 1, 523, 2304, 64, 6, 2, weights_outweigh_input=False).rows_outer
    # rows first, the runs of tiles come in multiples of the threads: each thread's share is
    # whole runs, every group of a run on one thread (shufflenet's 24 -> 112 in 4 groups at
    # 56 x 56, 262 tiles: 0.24 -> 0.15 ms at 2 threads; in runs of 53, one run's groups
    # were split between the two threads)
    for threads in (2, 3, 4, 16):
        split = xeon.split(1, 4, 262, 6, 32, 12, threads, weights_outweigh_input=False)
        assert split.rows_outer and split.runs % threads == 0 and split.runs <= 262, (threads, split)
    # group by group, the runs are as the task length gives them
    split = xeon.split(4, 1, 523, 2304, 64, 6, 2, weights_outweigh_input=False)
    assert split.runs == -(-523 // split.tiles_per_task)


def test_one_thread_goes_rows_first_where_a_grouped_gemms_input_outgrows_half_the_l2() -> None:
    """Group by group, each group's pass reads every input row from beyond the L2 again (and
    the groups' channels share cache lines); rows first reads each row once.  On one thread
    that pays only where the input outgrows half the L2 (shufflenet's 136 -> 136 in 4 groups
    at 28x28 on a 512 KiB-L2 Zen: 426 KB), not where it stays (272 -> 272 at 14x14: 213 KB)."""
    zen2 = Blocking.for_cpu(ZEN2)
    assert zen2.split(2, 4, 196, 34, 24, 4, 1, False, input_floats=28 * 28 * 136).rows_outer
    assert not zen2.split(3, 4, 49, 68, 24, 4, 1, False, input_floats=14 * 14 * 272).rows_outer
    assert not zen2.split(2, 4, 196, 34, 24, 4, 1, False).rows_outer  # input size not given
    # one group and one range: nothing to order, the flag stays as before
    assert not zen2.split(2, 1, 1046, 64, 32, 3, 1, False, input_floats=56 * 56 * 64).rows_outer
    # on a 1 MiB-L2 Xeon the same 426 KB stays in the L2: group by group
    xeon = Blocking.for_cpu(XEON)
    assert not xeon.split(1, 4, 98, 34, 48, 8, 1, False, input_floats=28 * 28 * 136).rows_outer
