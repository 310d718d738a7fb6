"""Micro-kernel and blocking parameters from the CPU present: vector width, registers, caches.

NOTE: the GEMM micro-kernel (``_kernels.py``) keeps a tile of ``P`` output rows x ``NV``
vectors of accumulators in registers, and a GEMM's tasks are runs of consecutive tiles of
one weight panel (``[K][NV * VW]`` packed floats).  Nothing here is tuned on one machine;
each parameter follows from what bounds it:

- **vector width** (floats per SIMD register) from the features the target is compiled for:
  16 with AVX-512, 8 with AVX2 + FMA, 4 otherwise (SSE, NEON, GCC's portable vectors);
- **tile rows** from the register file (32 vector registers with AVX-512 and on AArch64, 16
  otherwise): about three quarters of it hold accumulators (``P * NV``), the rest the
  broadcast input and weight vectors (an FMA may also read its weights from memory), and
  ``P`` stays at most half the file so one-vector tiles do not starve the loads -
  ``P = min(regs / 2, (3 regs / 4) / NV)``;
- **tile width** ``NV`` from the L2: the weight panel (``K x NV x VW`` floats) is re-read by
  every tile of a task, so it must stay in the core's L2 next to the streaming input rows:
  the widest ``NV`` (4, 3, 2, 1) whose panel fits in three quarters of the L2 (the rest for
  the rows and the tile) and that wastes at most 15% of its lanes on the last block of
  channels (a 3x3 convolution over 512 channels, K = 4608, takes NV = 2 on a 1 MiB-L2
  AVX-512 Xeon where a 2 MiB L2 keeps NV = 4).  Narrower tiles with more rows load about as
  much per multiply-add (``1/P`` weights + ``1/NV`` inputs).  Where no width of 2-4 vectors
  wastes little (groups of 34 or 68 channels), the tile of least :meth:`Blocking.tile_cost`
  (issue slots, padded lanes and rows counted) among 1-4 vectors and the 5-6-vector single
  blocks: 68 channels as 4 rows x 5 vectors rather than 16 x 1 (with 34 as 8 x 3, shufflenet
  14-24% faster on an AVX-512 Xeon);
- **channel blocks per tile** from the L2 and L1: a tile runs as many of its group's
  channel blocks, one after the other, as keep their weight panels in half the L2
  (:meth:`Blocking.blocks_per_task`), so its input rows are read from memory once (then
  from L1) instead of once per block, and the epilogue stores whole output rows in one
  call.  That is every block of a 1x1 convolution over 64-256 channels (resnet50's
  expansions: 1.4x faster than one block per task on an AVX2 Zen's 56x56 layers) and one
  block of a 3x3 over 512 (a 2.4 MB weight set).  Half, not the 3/4 a single panel may
  take: the panels of several blocks, re-read by every tile, share the L2 with the input
  rows and outputs streaming through it; on an AVX-512 Xeon with 1.25 MiB of L2, 1x1
  layers whose weights outweigh their rows (squeezenet's 512 -> 1000 classifier, resnet50's
  256 -> 1024 at 14x14) ran 0.86-0.89x as long with half.  A quarter where all the weights
  outgrow half the L2: the next range's are then prefetched into it beside the current one's;
- **tiles per task** from the core's FMA rate: a task is at least ~5 us of work, so claiming
  it from the pool's counter (one contended atomic) and warming its panel stay a few percent;
  the thread cost model's balance rule (8 tasks per thread) halves it from there.  The L2
  does not bound it: the panel, touched by every tile, is what the LRU keeps, the rows
  stream through once whatever the task's length.  (The L1 bounds nothing here: the kernel
  reuses inputs and weights from registers, not from L1.)

Example (a 3x3 convolution over 256 channels on an AVX-512 Xeon with 1 MiB of L2)::

    >>> xeon = Blocking.for_cpu(CpuDescription.avx512_xeon())
    >>> xeon.vector_floats, xeon.registers, xeon.tile(256, 196, depth=2304)
    (16, 32, (4, 6))
    >>> xeon.tile(512, 49, depth=4608)  # its 1.2 MB panel at NV = 4 would not stay in L2
    (2, 10)
    >>> xeon.tile(4096, 1, depth=25088)  # one row: the panel streams through once, any width
    (4, 1)
    >>> xeon.tiles_per_task(ntiles=1046, blocks=1, rows=6, cols=64, depth=64, threads=1)
    10
"""

from __future__ import annotations

import platform
from dataclasses import dataclass
from functools import cache
from typing import NamedTuple

from codegraft.backends.c._thread_cost import Machine
from codegraft.backends.c._toolchain import _X86_TARGETS, CacheSizes, cache_sizes, cpu_features

# Weights this many times the input make a multi-threaded GEMM split its channels, not its
# rows (Blocking.split): resnet50's 256 -> 1024 at 14x14 (5x) ran 1.05-1.07x as long split so,
# its 7x7 stage (10-94x) 0.79-0.91x (2 threads, AVX-512 Xeon).
WEIGHTS_OVER_INPUT = 8


def weights_outweigh(weight_floats: int, input_floats: int) -> bool:
    """Whether a GEMM's weights dwarf its input enough to split its channels across threads
    (``WEIGHTS_OVER_INPUT``, :meth:`Blocking.split`)."""
    return weight_floats > WEIGHTS_OVER_INPUT * input_floats


# The L2 is shared by this many ranges' weights where the next is prefetched beside the
# current (Blocking.blocks_per_task): two, each in a quarter, the other half for the rows.
FETCHING_SHARE = 4
# General registers a tile's k-loop takes beside its row pointers (Blocking.k_steps): the weights,
# the step, its bound, the channel stride, the stack or frame pointer, and one spare.
LOOP_POINTERS = 6
# What a tile's weight panel costs when it fills 3/4 to all of the L2, as a share of the tile's
# lanes (Blocking.tile): a wider tile whose panel does pays where it pads that many fewer lanes.
# On a Zen 3 core (AVX2, 512 KiB L2), alone, in one process: a 5x5 Conv over 128 channels at
# 45x31 (K = 3200, 400 KB at 4 vectors) and a 7x7 over 64 at 56x56 ran 0.91x as long as 4 x 3
# tiles than as 3 x 4 ones padding 11% of their lanes; a 5x5 over 160 channels at 40x40 (a
# 500 KB panel, 4.7% padded at 3 vectors) 1.01x.
FULL_L2_PANEL_COST = 0.05
# Where a narrower tile issues the same step (Blocking._same_step), the share of lanes it must
# pad less to be taken: its extra channel blocks each read the tile's input rows once more
# (squeezenet's 512 -> 1000 classifier, 2.3% against 0.8% padded, ran 1.04x as long cold as 3
# x 4 tiles).  Zen 3, one layer alone, 3 x 4 against 4 x 3 tiles in one process at 1 / 2
# threads: 512 -> 112 and 512 -> 144 at 13x13 (inception_v1) 0.91 / 0.92 and 0.94, 24 -> 144
# at 96x128 and 480 -> 112 at 24x32 (EfficientNet) 0.95 / 0.89 and 0.94 / 0.91, 240 -> 240 at
# 24x24 (PP-OCR) 0.94 / 0.96, shufflenet's 544 -> 544 in 4 groups at 7x7 0.97 / 0.81.
FEWER_LANES = 0.05
TASK_NS = 5000.0  # a task's least work: claiming it (one contended atomic) and warming up stay small


class GemmSplit(NamedTuple):
    """How a GEMM's work is cut into tasks (:meth:`Blocking.split`)."""

    blocks_per_task: int  # channel blocks each tile runs, one after the other
    tiles_per_task: int  # consecutive row tiles per task (about: the runs below are even)
    rows_outer: bool  # tasks ordered by rows first, every group and range of a row run in turn
    runs: int  # the row tiles cut in this many runs of even length, one a task per group and range
    fetch_next: bool = False  # each range's tiles prefetch the next range's weights (Blocking.fetches_next)


@dataclass(frozen=True)
class CpuDescription:
    """What the blocking depends on: SIMD features, data caches and the architecture."""

    features: frozenset[str]
    caches: CacheSizes
    arch: str = "x86_64"

    @staticmethod
    def host() -> CpuDescription:
        """This machine (``/proc/cpuinfo`` flags, ``/sys`` cache sizes)."""
        return _host()

    @staticmethod
    def avx512_xeon() -> CpuDescription:
        """A server Xeon: AVX-512, 32 KiB L1d, 1 MiB L2 per core."""
        return CpuDescription(frozenset(_X86_TARGETS[0][0]), CacheSizes(32 << 10, 1 << 20, 32 << 20))


@cache
def _host() -> CpuDescription:
    return CpuDescription(cpu_features(), cache_sizes(), platform.machine().lower())


@dataclass(frozen=True)
class Blocking:
    """Tile shape and task size rules for one CPU (see the module note)."""

    vector_floats: int
    registers: int
    l1d: int
    l2: int
    macs_per_ns: float  # one core's FMA rate as the thread cost model estimates it
    general_registers: int = 16  # x86-64's; AArch64 has 31

    @staticmethod
    def for_cpu(cpu: CpuDescription) -> Blocking:
        """The rules for ``cpu``."""
        return Blocking.for_width(vector_floats(cpu), cpu)

    @staticmethod
    def for_width(width: int, cpu: CpuDescription) -> Blocking:
        """The rules for code compiled with ``width`` floats per register on ``cpu``."""
        wide = width >= 16 or cpu.arch in ("aarch64", "arm64")
        rate = Machine.for_cpu(width, cpu.caches.l2, cpu.caches.l3).gemm_flops_per_ns / 2  # the cost model's
        general = 31 if cpu.arch in ("aarch64", "arm64") else 16
        return Blocking(width, 32 if wide else 16, cpu.caches.l1d, cpu.caches.l2, rate, general)

    def rows_per_tile(self, nv: int) -> int:
        """``P`` for tiles of ``nv`` vectors: ~3/4 of the registers as accumulators, at most half."""
        return max(1, min(self.registers // 2, (3 * self.registers // 4) // nv))

    def k_steps(self, nv: int, p: int) -> int:
        """The k-steps each pass of a ``P x NV`` tile's loop runs (``gemm.py``: ``_tile``).

        One, unless the tile's ``P`` row pointers and the loop's own (``LOOP_POINTERS``)
        outnumber the general registers by more than one per 8 of a step's ``P x NV``
        multiply-adds: the compiler then keeps the pointers beyond the registers on the stack
        or in vector registers and moves them back at every step, and the moves take the FMA
        ports (an AVX-512 16 x 1 tile: 6 moves per 16 multiply-adds, 84-93 GFLOP/s on a Sapphire
        Rapids core).  Then the most steps (8, 4 or 2) whose weight vectors fit in the vector
        registers beside the accumulators and a spare, so the moves come once per pass: 113-117
        GFLOP/s with 8 (a loop of one tile, caches warm); squeezenet's 128 -> 16 and 64 -> 16
        1x1 layers at 55x55 0.76-0.91x as long in the model.  A 12 x 2 tile's two moves per 24
        gained nothing so::

            >>> xeon = Blocking.for_cpu(CpuDescription.avx512_xeon())
            >>> xeon.k_steps(1, 16), xeon.k_steps(1, 13), xeon.k_steps(2, 12), xeon.k_steps(4, 6)
            (8, 8, 1, 1)
        """
        spilled = p + LOOP_POINTERS - self.general_registers
        if 8 * spilled <= p * nv:
            return 1
        return next((steps for steps in (8, 4, 2) if (p + steps) * nv < self.registers), 1)

    def balanced_rows(self, nv: int, rows: int) -> int:
        """``P`` for ``rows`` rows in tiles of ``nv`` vectors: between half and all of
        :meth:`rows_per_tile`, the one computing the fewest rows, each tile counting 2.5
        rows more for its own work (row pointers, the epilogue call, and above all one more
        pass over its weight panel).  A ragged last tile costs as much as a full one.  Fitted
        on an AVX-512 Xeon, three layers timed side by side with caches flushed: 49 rows
        as 10 tiles of 5 rather than 9 of 6 (resnet50's 7x7 1x1 layers, 0.89-0.93x), 169 as
        17 of 10 rather than 15 of 12 (0.95x), but 196 rows of a 3x3 over 512 channels as 25
        tiles of 8 rather than 28 of 7 (0.91x: 3 fewer passes over an 884 KB panel)::

            >>> xeon = Blocking.for_cpu(CpuDescription.avx512_xeon())
            >>> [xeon.balanced_rows(4, r) for r in (49, 196, 3136)], xeon.balanced_rows(3, 196)
            ([5, 6, 6], 8)
        """
        most = max(1, min(self.rows_per_tile(nv), rows))
        return min(range((most + 1) // 2, most + 1), key=lambda p: (-(-rows // p) * (2 * p + 5), -p))

    def tile(self, channels: int, rows: int, depth: int = 0) -> tuple[int, int]:
        """``(NV, P)`` for ``channels`` outputs per group over ``rows`` output rows, ``depth`` deep.

        The widest ``NV`` (4, 3, 2) that wastes at most 15% of its lanes on the last block and
        whose ``depth x NV x VW`` panel fits in 3/4 of the L2 (``depth`` 0: unknown, not
        checked), or whose ``rows`` fit in one tile (the panel is then read once anyway);
        or a wider one whose panel fits in the whole L2 where that saves at least
        :data:`FULL_L2_PANEL_COST` of its lanes (128 channels of a 5x5 Conv, K = 3200, on an
        AVX-512 Xeon: 4 vectors and an 800 KB panel, not 3 that pad 128 channels to 144);
        or a narrower one of the same step (:meth:`_same_step`: AVX2's 3 x 4 for its 4 x 3)
        where that pads :data:`FEWER_LANES` fewer lanes (144 channels: 6 blocks of 24, not 5
        of 32 with the last 16 lanes empty).  When none does (a group of 34 or 68 channels:
        shufflenet), the tile of least :meth:`tile_cost` among widths 1-4 and the widths 5-6
        that hold every channel in one block::

            >>> xeon = Blocking.for_cpu(CpuDescription.avx512_xeon())
            >>> xeon.tile(128, 1395, depth=3200), xeon.tile(144, 1395, depth=3200)
            ((4, 6), (3, 8))
        """
        waste = {nv: self._wasted_lanes(nv, channels) for nv in (4, 3, 2)}
        for candidate in (4, 3, 2):
            if self._panel_fits(candidate, rows, depth) and waste[candidate] <= 0.15:
                wider = [nv for nv in (4, 3) if nv > candidate and self._panel_bytes(nv, depth) <= self.l2
                         and waste[nv] + FULL_L2_PANEL_COST <= waste[candidate]]
                twins = [nv for nv in (3, 2) if nv < candidate and self._same_step(nv, candidate, rows)
                         and self._panel_fits(nv, rows, depth) and waste[nv] + FEWER_LANES <= waste[candidate]]
                nv = wider[0] if wider else twins[0] if twins else candidate
                return nv, self.balanced_rows(nv, rows)
        # Widths 5-6 only where they still get 4 rows (32 registers): tiles of 2 rows pay the
        # driver's per-tile work every other row (AVX2, 34 channels: 2 x 5 no faster than 8 x 1).
        widths = [nv for nv in range(1, 7)
                  if nv <= 4 or (channels <= nv * self.vector_floats and self.rows_per_tile(nv) >= 4)]
        fitting = [nv for nv in widths if nv == 1 or self._panel_fits(nv, rows, depth)]
        nv = min(fitting, key=lambda nv: (self.tile_cost(nv, channels, rows), -nv))
        return nv, self.balanced_rows(nv, rows)

    def _same_step(self, narrow: int, wide: int, rows: int) -> bool:
        """Whether a tile of ``narrow`` vectors over ``rows`` rows issues as many multiply-adds a
        k-step as one of ``wide`` and loads no more (AVX2's 3 x 4 and 4 x 3: 12 and 7; not
        AVX-512's 8 x 3 and 6 x 4, 24 and 11 against 10, nor 1-row tiles)."""
        p_narrow, p_wide = self.balanced_rows(narrow, rows), self.balanced_rows(wide, rows)
        return p_narrow * narrow == p_wide * wide and p_narrow + narrow <= p_wide + wide

    def _wasted_lanes(self, nv: int, channels: int) -> float:
        """The share of a ``nv``-vector tiling's lanes past ``channels`` (in its last block)."""
        width = nv * self.vector_floats
        blocks = -(-channels // width)
        return (blocks * width - channels) / (blocks * width)

    def _panel_bytes(self, nv: int, depth: int) -> int:
        """The bytes of one channel block's weights: ``depth`` steps of ``nv`` vectors of floats."""
        return 4 * depth * nv * self.vector_floats

    def _panel_fits(self, nv: int, rows: int, depth: int) -> bool:
        # With one tile of rows (a batch-1 fully connected layer) the panel is read once
        # whatever its size: nothing to keep in L2, and a narrow tile would leave the
        # kernel one FMA chain per row (vgg19's 25088 x 4096 layer: 14 -> 19 ms at NV = 1).
        single_tile = rows <= self.rows_per_tile(nv)
        return single_tile or self._panel_bytes(nv, depth) <= 3 * self.l2 // 4

    def tile_cost(self, nv: int, channels: int, rows: int) -> float:
        """Issue slots per multiply-add step of a ``P x nv`` tiling of ``channels x rows``.

        Each step of a tile's k-loop issues ``P x nv`` FMAs and ``P + nv`` loads (the
        broadcast inputs and the weight vectors), and takes at least the FMA latency (~4
        cycles, 8 FMAs on two ports) whatever its size; a load weighs 1.5 FMA slots, a guess
        on the side of fewer loads (a 16 x 1 tile, as many loads as FMAs, ran shufflenet's
        grouped 1x1 layers at 28% of the FMA peak); every block and row tile, ragged ones
        included, costs a whole tile.  On AVX-512, 16 rows of 68 channels cost 80 slots as four
        tiles of 4 rows x 5 vectors, 128 as five 1-vector blocks of 16 rows; with 34 channels
        as 8 x 3 rather than 16 x 1 too, shufflenet ran 14-24% faster::

            >>> xeon = Blocking.for_cpu(CpuDescription.avx512_xeon())
            >>> xeon.tile(68, 196), xeon.tile(34, 784), xeon.tile(64, 3136)
            ((5, 4), (3, 8), (4, 6))
        """
        p = self.balanced_rows(nv, rows)
        blocks = -(-channels // (nv * self.vector_floats))
        return blocks * -(-rows // p) * max(p * nv, 1.5 * (p + nv), 8)

    def beyond_half_l2(self, groups: int, nmb: int, depth: int, width: int) -> bool:
        """Whether the weights of ``groups x nmb`` channel blocks (``depth x width`` floats
        each) take more than half the L2: then ranges of blocks prefetch the next one beside
        them (:meth:`fetches_next`, :meth:`blocks_per_task`), and tasks do not go rows first
        (:meth:`split`)."""
        return 4 * groups * nmb * depth * width > self.l2 // 2

    def blocks_per_task(self, nmb: int, depth: int, width: int, rows: int, ntiles: int, groups: int = 1) -> int:
        """How many of a group's ``nmb`` channel blocks (``width`` floats each) each tile of
        ``rows`` rows runs, one after the other, before the next tile (``ntiles`` in all), of
        ``groups`` groups.

        As many as keep their packed weights (``depth x width`` floats each) in half the L2
        (see the module note) and the tile's results (``rows x width`` each) in half the L1;
        1 when there is a single tile (its weights are read once whatever the order).  Where
        all the weights outgrow half the L2, the tiles prefetch the next range's weights into
        it as they run (:meth:`fetches_next`), so this range and the next share that half: a
        quarter each.  Squeezenet's 512 -> 1000 classifier (2 MB) and resnet50's 7x7 stage ran
        0.88-0.92x as long so, in the models at 1 thread (2 MiB-L2 Sapphire Rapids)::

            >>> xeon = Blocking.for_cpu(CpuDescription.avx512_xeon())  # 1 MiB of L2
            >>> xeon.blocks_per_task(4, 512, 64, 6, 29), xeon.blocks_per_task(16, 512, 64, 6, 29)
            (4, 2)
        """
        if ntiles <= 1:
            return 1
        share = FETCHING_SHARE if self.beyond_half_l2(groups, nmb, depth, width) else 2
        by_l2 = (self.l2 // share) // max(1, 4 * depth * width)
        by_l1 = (self.l1d // 2) // max(1, 4 * rows * width)
        return max(1, min(nmb, by_l2, by_l1))

    def split(self, nmb: int, groups: int, ntiles: int, depth: int, width: int, rows: int, threads: int,
              weights_outweigh_input: bool, input_floats: int = 0) -> GemmSplit:
        """How a GEMM over ``groups x nmb`` channel blocks (``width`` floats, ``depth`` deep)
        and ``ntiles`` row tiles of ``rows`` is cut into tasks for ``threads``.

        Tasks normally split the rows (:meth:`tiles_per_task`) within ranges of channel blocks
        (:meth:`blocks_per_task`).  But every core running a range's row tiles loads that
        range's weights into its own L2, from memory at batch 1: where the weights outweigh
        the input (:func:`weights_outweigh`) and there are at least two
        blocks per thread, tasks are whole ranges of channel blocks instead, two per thread or
        more (each range's weights read by one core; the input, the smaller, by every core).
        Resnet50's 7x7 stage on two cores was 1.41-1.52x of onnxruntime in the model with the
        rows split (1.17-1.22x at 1 thread), 0.79-0.91x as long with this::

            >>> xeon = Blocking.for_cpu(CpuDescription.avx512_xeon())
            >>> xeon.split(32, 1, 10, 512, 64, 5, 2, weights_outweigh_input=True)  # 512 -> 2048 at 7x7
            GemmSplit(blocks_per_task=2, tiles_per_task=10, rows_outer=False, runs=1, fetch_next=True)
            >>> xeon.split(32, 1, 10, 512, 64, 5, 2, weights_outweigh_input=False)
            GemmSplit(blocks_per_task=2, tiles_per_task=1, rows_outer=False, runs=10, fetch_next=True)

        The thread pool deals each thread a contiguous share of the tasks (``thread_pool.c``).
        Tasks go group by group and range by range, each range's weights kept in L2 across
        its rows, unless there are several threads and every group's and range's weights fit
        in half the L2 together: then rows go first (``rows_outer``), so a thread's share is
        rows of every group, the rows the kernels before and after it split alike, and what
        it reads was written on its own core.  Shufflenet's grouped 1x1 layers, group by
        group, ran slower on two threads than on one (each thread read every row), and the
        whole model 0.85-0.88x as long rows first (on one thread 1.013x: there it stays group
        by group).  Rows first, the runs of tiles are a multiple of the threads, so no
        thread's share ends inside a run with its groups split between two threads (its 24 ->
        112 layer in 4 groups at 56 x 56, in 5 runs on 2 threads: 0.24 ms; in 6: 0.15 ms)::

            >>> xeon.split(1, 3, 131, 80, 80, 6, 2, weights_outweigh_input=False).rows_outer  # 240 -> 240, 3 groups
            True

        On one thread too where the input (``input_floats``, 0: not known) outgrows half the
        L2: group by group, each group's pass reads every row from beyond the L2 again, and
        a group's channels share their cache lines with the next group's.  Shufflenet's
        grouped 1x1 layers on a 512 KiB-L2 Zen 3, in the model: 136 -> 136 at 28x28 (426 KB
        in) 0.91-0.97x as long rows first, 24 -> 112 at 56x56 0.82-0.95x, 112 -> 112 at 28x28
        0.89-0.91x; its 272 -> 272 at 14x14 (213 KB) and 544 -> 544 at 7x7, whose inputs stay
        in the L2, 1.00-1.02x alone and up to 1.2x in the model, so they stay group by group::

            >>> zen3 = Blocking.for_cpu(CpuDescription(frozenset({"avx2", "fma"}), CacheSizes(32 << 10, 512 << 10, 0)))
            >>> zen3.split(2, 4, 196, 34, 24, 4, 1, False, input_floats=28 * 28 * 136).rows_outer
            True
            >>> zen3.split(3, 4, 49, 68, 24, 4, 1, False, input_floats=14 * 14 * 272).rows_outer
            False
        """
        bpt = self.blocks_per_task(nmb, depth, width, rows, ntiles, groups)
        several = groups * -(-nmb // bpt) > 1  # groups or ranges to order
        streams = threads > 1 or (several and 4 * input_floats > self.l2 // 2)
        rows_outer = streams and not self.beyond_half_l2(groups, nmb, depth, width)
        if threads > 1 and weights_outweigh_input and groups * nmb >= 2 * threads:
            while bpt > 1 and groups * -(-nmb // bpt) < 2 * threads:
                bpt -= 1
            fetch = self.fetches_next(nmb, groups, bpt, depth, width, rows_outer, ntiles)
            return GemmSplit(bpt, ntiles, rows_outer, 1, fetch)
        per_task = self.tiles_per_task(ntiles, groups * -(-nmb // bpt), rows, width * bpt, depth, threads)
        runs = -(-ntiles // per_task)
        if rows_outer and runs > 1:
            runs = min(ntiles, -(-runs // threads) * threads)
        fetch = self.fetches_next(nmb, groups, bpt, depth, width, rows_outer, ntiles)
        return GemmSplit(bpt, per_task, rows_outer, runs, fetch)

    def fetches_next(
        self, nmb: int, groups: int, bpt: int, depth: int, width: int, rows_outer: bool, ntiles: int,
    ) -> bool:
        """Whether the tiles of each range of channel blocks prefetch the next range's weights
        (``gemm.py``: ``FETCH_SETUP``): where there is a next range, run after this one (not
        rows first), and there are several tiles, so the weights are re-read from the L2 (with
        one row tile, a batch-1 fully connected layer, they stream once: the hardware's
        prefetcher keeps up with that, and vgg19's 25088 -> 4096 ran 1.02-1.07x as long with
        this), and either the weights are more than half the L2 or a range's weights are at
        least half the L1.  At batch 1 in a model a kernel's weights come from beyond the L2
        whatever their size (the kernels before it filled the L2 with their own); a range's
        first tile waits on them, unless they are so few that its first steps have them in
        time (shufflenet's grouped 1x1 layers, a few KB per group: no gain to pay the loop for).

        Without, the first tile of each range waits on its weights from memory: resnet50's
        7x7 stage reads 4-9 MB per layer for 49 rows of output, and Winograd's 16 products are
        16 groups of weights.  In the models at 1 thread (2-core Sapphire Rapids VM, in-model
        A/B): resnet50's 7x7 stage 0.88-0.94x as long, its 256 -> 256 Winograd layers at 14x14
        0.83-0.86x, vgg19's Winograd layers 0.83-0.92x (whole kernels 0.962x and 0.916x); with
        the ranges of half the L1 or more too, squeezenet's 48 -> 192 and 64 -> 256 Winograd
        layers (36 and 64 KB per product) 0.76-0.88x in four runs::

            >>> xeon = Blocking.for_cpu(CpuDescription.avx512_xeon())
            >>> xeon.fetches_next(4, 16, 4, 64, 64, rows_outer=False, ntiles=5)  # 64 -> 256 Winograd, 13x13
            True
            >>> xeon.fetches_next(1, 4, 1, 34, 48, rows_outer=False, ntiles=131)  # 6 KB per group
            False
        """
        ranges = groups * -(-nmb // bpt)
        from_beyond = self.beyond_half_l2(groups, nmb, depth, width) or 4 * bpt * depth * width >= self.l1d // 2
        return ranges > 1 and ntiles > 1 and not rows_outer and from_beyond

    def tiles_per_task(self, ntiles: int, blocks: int, rows: int, cols: int, depth: int, threads: int) -> int:
        """Consecutive tiles per GEMM task (``rows x cols`` tiles, ``depth`` multiply-adds deep).

        At least ~5 us of FMA work, halved until each of ``threads`` has 8 of the ``blocks x
        ceil(ntiles / result)`` tasks.
        """
        per_task = max(1, min(ntiles, -(-int(TASK_NS * self.macs_per_ns) // max(1, rows * cols * depth))))
        while per_task > 1 and blocks * -(-ntiles // per_task) < 8 * threads:
            per_task = (per_task + 1) // 2
        return per_task


def vector_floats(cpu: CpuDescription) -> int:
    """Floats per SIMD register of the best target ``cpu`` runs (the same choice as ``target_for``)."""
    if cpu.arch not in ("x86_64", "amd64"):
        return 4
    for needed, _flags in _X86_TARGETS:
        if needed <= cpu.features:
            return 16 if "avx512f" in needed else 8 if "avx2" in needed else 4
    return 4


@cache
def host_blocking(vector: int) -> Blocking:
    """This machine's rules for code compiled with ``vector`` floats per register."""
    return Blocking.for_width(vector, CpuDescription.host())
