"""Winograd F(2x2, 3x3): a 3x3 stride-1 Conv in 2.25x fewer multiply-adds.

NOTE: each 2x2 tile of the output is computed from the 4x4 input patch under it by
Lavin and Gray's minimal filtering algorithm (*Fast Algorithms for Convolutional Neural
Networks*, 2016): ``Y = A^T [(G g G^T) * (B^T d B)] A``.  The weights' transform ``G g G^T``
is done once, at compile time; the patches' ``B^T d B`` and the tiles' ``A^T m A`` are adds
and subtractions (``winograd.c``), and what is left is 16 independent products of
``[tiles x C]`` by ``[C x K]`` matrices: a 1x1 Conv in 16 groups, which the shared GEMM
engine (``gemm.py``) runs with its tiles, blocking, threads and packing.  So one ``g.Conv``
kernel is emitted as three parallel loops: transform in, grouped GEMM, transform out with
the kernel's fused epilogue (bias, residual, Relu) applied in place; where the weights are
small, the three run chunk by chunk of tile rows, so that the transformed values are read
back from the L2 (:func:`chunk_rows`).  Where chunks remain on several threads (the values
outgrow their L2s together), each thread takes chunks of its own L2's size and runs their three
loops itself (:func:`thread_chunk_rows`, ``cg_wino_chunk_task``): one parallel loop for the
kernel, not three per chunk, each fork and join costing more the more threads join (vgg19's
64 -> 64 at 224x224, 112 chunks: 336 loops).  At 2 threads, in one process against the
three loops per chunk: vgg19's 64 -> 64 at 224x224 and 128 -> 128 at 112x112 0.82-0.84x as
long, resnet50's 64 -> 64 at 56x56 0.91x, inception_v1's 64 -> 192 at 56x56 0.93x.

F(2x2, 3x3) and not a larger tile: its transforms' coefficients are 0, +-1 and +-1/2, so
its results are about as close to the exact convolution as the direct one's
(``tests/test_c_winograd.py``).  Simulated in float32 on a 256 -> 256 layer at 28x28 against
float64: the direct sum 2.1e-7 of the largest output at most, F(2x2, 3x3) 3.6e-7,
F(4x4, 3x3) (coefficients up to 8, 4x fewer multiply-adds) 5.5e-6, 26 times the direct
error on one layer, against the 1e-4 the backend is held to over whole deep networks.

Where it pays (:func:`winograd_pays`) was measured with the transforms included, inside the
models, on a Sapphire Rapids core (AVX-512) and on a Zen 3 core (AVX2), where it pays on far
more layers; ``bench/MANY_CORES.md`` has the figures.

Example: vgg19's 256 -> 256 3x3 at 56x56 is 28 x 28 tiles, 16 GEMMs of 784 x 256 x 256.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from codegraft.backends.c import _graph as g
from codegraft.backends.c._blocking import host_blocking, weights_outweigh
from codegraft.backends.c._c_files import c_file
from codegraft.backends.c._emit import Context
from codegraft.backends.c.ops.elementwise import VectorEpilogue
from codegraft.backends.c.ops.gemm import c_longs, choose_tile, gemm_function, pack_weights

# F(2x2, 3x3): out = A^T [(G g G^T) * (B^T d B)] A, element-wise product in the middle
B_T = np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], np.float64)
G = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]], np.float64)
A_T = np.array([[1, 1, 1, 0], [0, 1, -1, -1]], np.float64)
POINTS = 16  # 4 x 4 values per tile: the GEMM's groups

# Where the multiply-adds saved outweigh the transforms' traffic (each tile's 16 values per
# input and per output channel, written and read again).  C * K / (C + K) is the saving per
# unit of that traffic.  Inside whole models (1 thread, bench/MANY_CORES.md) layers below 60
# gained nothing or lost: densenet121's 128 -> 32 1.01-1.18x as long as the direct Conv,
# squeezenet's 32 -> 128 at 27x27 1.05x, inception_v1's 96 -> 128 1.11x - their input is in
# the caches already, and the direct Conv reads it there - where alone some took 0.64-0.97x.
# Above it, those values within (saving - 32) / 4 times the L2 (128 -> 128 at 56x56, 12.8 MB
# of them, 0.89x; at 112x112, 51 MB, 1.01x).
# Below it, layers whose transformed values fit in half the L2 and whose saving is at least
# SMALL_SAVING still paid (squeezenet's 48 -> 192 and 64 -> 256 at 13x13, 0.75 and 1 MB of
# them: 0.83x and 0.94x); densenet121's 128 -> 32 at 7x7 (0.3 MB, saving 26) did not.
LEAST_SAVING = 60
SMALL_SAVING = 32
SAVING_PER_L2 = 4  # above 32, each 4 of saving pays for the transformed values of one more L2
# The rules above are 16-wide vectors' (AVX-512).  With 8-wide ones (AVX2) a core does half the
# multiply-adds a cycle, so each one saved is worth twice the time against the same traffic:
# on a Zen 3 core (AVX2, 512 KB of L2, 32 MB of L3), every 3x3 layer of the six models forced
# to Winograd and timed in its model (1 thread; bench.winograd_layers) paid from a saving of
# 25.6 on, whatever its transformed values' size - densenet121's 128 -> 32 0.68-0.90x,
# squeezenet's 32 -> 128 at 27x27 0.83x and 48 -> 192, 64 -> 256 at 13x13 0.71-0.72x,
# inception_v1's 96 -> 128 at 27x27 0.71x, vgg19's 128 -> 128 at 112x112 (51 MB of values)
# 0.80x and 256 -> 256 at 56x56 0.57x - where the rules above kept them all direct (a 512 KB
# L2 holds little); squeezenet's 16 -> 64 at 55x55 (12.8) gained nothing (1.00x).  At 2
# threads the same (0.68-0.90x), but densenet121's 128 -> 32 at 14x14 0.98x and at 7x7 1.18x
# (16 layers of 0.04 ms).  Narrower vectors take this rule too (4-wide SSE and NEON: unmeasured).
NARROW_LEAST_SAVING = 20
# Tiles per transform task: a 14 x 14 map has only 7 tile rows to share out, and a task's
# values are then written (read) as one run of 2 x 16 x C floats
TILES_PER_TASK = 2


def winograd_pays(kernel: tuple[int, int], strides: tuple[int, int], dilations: tuple[int, int], group: int,
                  channels_in: int, channels_out: int, out_h: int, out_w: int, l2_bytes: int = 2 << 20,
                  vector_floats: int = 16) -> bool:
    """Whether a Conv runs as Winograd F(2x2, 3x3): a 3x3 kernel, stride and dilation 1, no
    groups; enough channels in and out for the products saved to pay for the transformed
    values' traffic (``LEAST_SAVING``, ``SAVING_PER_L2``, ``SMALL_SAVING``), or for the
    transforms alone where the weights are small enough for it to run in chunks of tile
    rows whose values stay in the L2 (:func:`chunk_rows`); and enough tiles that the
    transformed weights, 16/9 of the Conv's, are not what the time goes on (at least one
    tile per 16 output channels: resnet50's 512 -> 512 at 7 x 7 has 16).  With vectors narrower
    than 16 floats (AVX2), a saving of ``NARROW_LEAST_SAVING`` whatever the traffic.

    >>> winograd_pays((3, 3), (1, 1), (1, 1), 1, 256, 256, 56, 56)
    True
    >>> winograd_pays((3, 3), (2, 2), (1, 1), 1, 256, 256, 28, 28)  # strided: each tile's patch is 5 x 5
    False
    >>> winograd_pays((3, 3), (1, 1), (1, 1), 1, 64, 64, 56, 56)  # in chunks the L2 holds (chunk_rows)
    True
    >>> winograd_pays((3, 3), (1, 1), (1, 1), 1, 128, 32, 56, 56)  # too little saving
    False
    >>> winograd_pays((3, 3), (1, 1), (1, 1), 1, 128, 128, 56, 56)  # 12.8 MB transformed, 6.4x the L2
    True
    >>> winograd_pays((3, 3), (1, 1), (1, 1), 1, 512, 512, 7, 7)  # 16 tiles for 512 channels
    False
    >>> avx2 = dict(l2_bytes=512 << 10, vector_floats=8)  # a Zen 3 core
    >>> winograd_pays((3, 3), (1, 1), (1, 1), 1, 128, 32, 56, 56, **avx2), winograd_pays(
    ...     (3, 3), (1, 1), (1, 1), 1, 16, 64, 55, 55, **avx2)
    (True, False)
    """
    if not winograd_fits(kernel, strides, dilations, group, channels_out, out_h, out_w):
        return False
    saving = channels_in * channels_out / (channels_in + channels_out)
    if vector_floats < 16:
        return saving >= NARROW_LEAST_SAVING
    th, tw = winograd_geometry(out_h, out_w)
    transformed = 4 * POINTS * th * tw * (channels_in + channels_out)
    room = (saving - 32) / SAVING_PER_L2 * l2_bytes
    small = 2 * transformed <= l2_bytes or chunkable(channels_in, channels_out, l2_bytes)
    return saving >= LEAST_SAVING and transformed <= room or saving >= SMALL_SAVING and small


def winograd_fits(kernel: tuple[int, int], strides: tuple[int, int], dilations: tuple[int, int], group: int,
                  channels_out: int, out_h: int, out_w: int) -> bool:
    """Whether a Conv can run as Winograd F(2x2, 3x3) at all - a 3x3 kernel, stride and dilation
    1, no groups - with at least one tile per 16 output channels (:func:`winograd_pays` asks
    this, then whether it pays; ``bench.winograd_layers --every-3x3`` only this).

    >>> winograd_fits((3, 3), (1, 1), (1, 1), 1, 64, 56, 56), winograd_fits((3, 3), (2, 2), (1, 1), 1, 64, 28, 28)
    (True, False)
    """
    if kernel != (3, 3) or strides != (1, 1) or dilations != (1, 1) or group != 1 or min(out_h, out_w) < 2:
        return False
    th, tw = winograd_geometry(out_h, out_w)
    return POINTS * th * tw >= channels_out


def runs_as_winograd(conv: g.Conv, vector_floats: int) -> bool:
    """Whether ``conv`` (2-D, or 3-D of kernel depth 1) is emitted as Winograd F(2x2, 3x3) in code
    of ``vector_floats`` floats per register: where it pays on this machine, and its weights are
    finite (an Inf one would reach outputs it does not touch)."""
    window = conv.window
    if window is None or len(window.kernel) < 2:
        return False
    phys_out = conv.out.physical_shape
    return winograd_pays(
        (window.kernel[-2], window.kernel[-1]), (window.strides[-2], window.strides[-1]),
        (window.dilations[-2], window.dilations[-1]), conv.group, conv.inputs[0].physical_shape[-1],
        phys_out[-1], phys_out[-3], phys_out[-2], host_blocking(vector_floats).l2, vector_floats,
    ) and bool(np.isfinite(conv.weight).all())


def _tile_rows(conv: g.Conv) -> tuple[int, int, int, int]:
    """A Winograd Conv's tile rows (images x tile rows of each), tile columns, input and output channels."""
    phys_out = conv.out.physical_shape
    n, (out_h, out_w, k) = math.prod(phys_out[:-3]), phys_out[-3:]
    th, tw = winograd_geometry(out_h, out_w)
    return n * th, tw, conv.inputs[0].physical_shape[-1], k


def one_loop_below(conv: g.Conv, l2_bytes: int) -> int:
    """The least thread count above one at which a Conv that :func:`runs_as_winograd` is no
    longer in chunks (:func:`chunk_rows`): below it, on two threads or more, its chunks run
    whole on one thread each, one parallel loop (``Work.one_loop_below``); 0 where it never is.
    """
    rows, tw, c, k = _tile_rows(conv)
    threads = 2
    while chunk_rows(rows, tw, c, k, threads, l2_bytes) < rows:
        threads += 1
    return threads if threads > 2 else 0


def winograd_work(conv: g.Conv, vector: int) -> tuple[float, float, int]:
    """The flops (GEMM and transforms), the bytes moved beyond the input and output (the
    transformed weights, values written and read again) and the GEMM's tiles of a Conv that
    :func:`runs_as_winograd`, for the thread cost model."""
    rows, tw, c, k = _tile_rows(conv)
    tiles = rows * tw
    flops = 2.0 * POINTS * tiles * c * k + 32.0 * tiles * (c + k)
    moved = 4.0 * (POINTS * c * k + 2 * POINTS * tiles * (c + k))
    nv, p = choose_tile(k, tiles, vector, c)
    return flops, moved, POINTS * -(-k // (nv * vector)) * -(-tiles // p)


# Chunks of tile rows (chunk_rows), where the 16 products' weights take at most
# CHUNK_WEIGHTS_L2 of the L2.  Unchunked, a 64 -> 64 layer at 56x56 (6.4 MB of values
# written and read back) lost to the direct Conv (1.19x as long alone).  In the models
# (bench.winograd_layers, Winograd / direct at 1 / 2 threads): resnet50's 64 -> 64 at 56x56
# 0.75-0.77x / 0.84-0.90x and 128 -> 128 at 28x28 0.65x / 0.74x (0.82x / 0.75x unchunked),
# vgg19's 64 -> 64 at 224x224 0.73-0.76x / 0.70-0.75x, 128 -> 128 at 112x112 0.70x / 0.59x,
# inception_v1's 64 -> 192 at 55x55 0.71x / 0.66x and 96 -> 128 at 27x27 0.76x / 0.84x.
CHUNK_L2 = 0.75  # the weights and a thread's share of a chunk's values
CHUNK_WEIGHTS_L2 = 0.5  # the most the weights may take


def chunkable(channels_in: int, channels_out: int, l2_bytes: int) -> bool:
    """Whether the 16 products' weights are small enough to stay in the L2 across chunks."""
    return 4 * POINTS * channels_in * channels_out <= CHUNK_WEIGHTS_L2 * l2_bytes


def chunk_rows(rows: int, tile_cols: int, channels_in: int, channels_out: int, threads: int, l2_bytes: int) -> int:
    """Tile rows per chunk: the three loops (transform in, GEMM, transform out) run chunk by
    chunk, so the transformed values are read back from the L2 rather than from memory, where
    the weights are small enough to stay in the L2 across chunks (else one chunk, the whole):
    each thread's share of a chunk's values and the 16 products' weights within ``CHUNK_L2``
    of its L2.  Not where each thread's share of all the values fits in its L2 anyway: the
    chunks' smaller GEMMs only cost there (squeezenet's 64 -> 256 at 13x13, 1 MB of values,
    in 3 chunks: 1.13x as long as in one).

    >>> chunk_rows(28, 28, 64, 64, threads=1, l2_bytes=2 << 20)  # resnet50's 64 -> 64 at 56x56
    5
    >>> chunk_rows(7, 7, 64, 256, threads=1, l2_bytes=2 << 20)  # squeezenet's 64 -> 256: 1 MB of values
    7
    >>> chunk_rows(28, 28, 64, 64, threads=16, l2_bytes=2 << 20)  # 16 L2s hold them all
    28
    >>> chunk_rows(56, 56, 128, 128, threads=1, l2_bytes=2 << 20)  # vgg19's 128 -> 128 at 112x112
    1
    >>> chunk_rows(7, 7, 256, 256, threads=1, l2_bytes=2 << 20)  # 4 MB of weights: one chunk
    7
    """
    weights = 4 * POINTS * channels_in * channels_out
    per_row = 4 * POINTS * tile_cols * (channels_in + channels_out)
    threads = max(1, threads)
    if not chunkable(channels_in, channels_out, l2_bytes) or rows * per_row <= threads * l2_bytes:
        return rows
    most = max(1, int(threads * (CHUNK_L2 * l2_bytes - weights)) // per_row)
    return -(-rows // -(-rows // most))  # as even as the rows allow


def thread_chunk_rows(rows: int, tile_cols: int, channels_in: int, channels_out: int, threads: int,
                      l2_bytes: int) -> int:
    """Tile rows per chunk where the chunks are shared out among ``threads``, each run whole by
    one thread (``cg_wino_chunk_task``): at most what one thread's L2 holds (:func:`chunk_rows`
    for one thread), in a number of chunks that is a multiple of ``threads`` where the rows
    allow, so no thread runs one more chunk than the others.

    >>> thread_chunk_rows(28, 28, 64, 64, threads=2, l2_bytes=2 << 20)  # resnet50's 64 -> 64 at 56x56
    5
    >>> thread_chunk_rows(28, 28, 64, 64, threads=4, l2_bytes=2 << 20)  # 7 chunks of 4 rows, not 6 of 5
    4
    """
    one = chunk_rows(rows, tile_cols, channels_in, channels_out, 1, l2_bytes)
    threads = max(1, threads)
    fitting = -(-rows // one)  # chunks of one L2
    chunks = min(rows, -(-fitting // threads) * threads)
    return -(-rows // chunks)


def winograd_weights(weight: np.ndarray) -> np.ndarray:
    """The ``[16 * K, C]`` weights of the grouped GEMM from a Conv's OHWI ``[K, 3, 3, C]``:
    row ``p * K + k`` is ``G g G^T`` at point ``p`` (row-major over the 4 x 4 tile) for output
    channel ``k``, computed in float64.

    >>> w = np.zeros((1, 3, 3, 1), np.float32); w[0, 1, 1, 0] = 1.0  # the identity filter
    >>> winograd_weights(w).reshape(4, 4).tolist()[1]
    [0.0, 0.25, -0.25, 0.0]
    """
    k, c = weight.shape[0], weight.shape[-1]
    points = np.einsum("ia,kabc,jb->ijkc", G, weight.astype(np.float64), G)
    return np.ascontiguousarray(points.reshape(POINTS * k, c).astype(np.float32))


def winograd_geometry(out_h: int, out_w: int) -> tuple[int, int]:
    """Tile rows and columns covering an ``out_h x out_w`` output."""
    return -(-out_h // 2), -(-out_w // 2)


@dataclass(frozen=True)
class WinogradWeights:
    """Where a Winograd kernel's transformed weights are and how they are packed."""

    symbol: str
    channels_in: int
    channels_out: int
    blocks: int
    width: int

    def unpack(self, ctx: Context, blocks: int, width: int) -> str:
        """A scratch buffer, filled at run time with the direct Conv's weights packed in
        ``blocks`` of ``width`` output channels (``cg_wino_unpack``): the kernel's fallback."""
        packed = ctx.temp(blocks * 9 * self.channels_in * width)
        ctx.body.append(f"  cg_wino_unpack({self.symbol}, {self.channels_in}, {self.channels_out}, {self.blocks}, "
                        f"{self.width}, {packed}, {blocks}, {width});")
        return packed


def emit_winograd(
    ctx: Context, src: str, shape: tuple[int, int, int, int], source_pads: tuple[int, int], weight: np.ndarray,
    out_hw: tuple[int, int], y: str, ldy: int, yrow: int, yimg: int, ep: str,
) -> WinogradWeights:
    """The C of a Winograd Conv: ``src`` channels-last ``shape`` (N, H, W, C), its data at
    ``source_pads`` (top, left) inside the padded frame (0, 0 when the buffer is bordered
    already), OHWI ``weight``, results to ``y`` (``ldy``, ``yrow``, ``yimg`` as the GEMM
    engine's) through the kernel's epilogue ``ep``.  It leaves an ``else {`` open, for the
    caller's direct Conv, run instead when the input holds an Inf or a NaN (``winograd.c``),
    whose weights :meth:`WinogradWeights.unpack` builds from the transformed ones."""
    n, h, w, c = shape
    m = weight.shape[0]
    oh, ow = out_hw
    th, tw = winograd_geometry(oh, ow)
    vector = ctx.target.vector_floats
    ctx.define_once("cg_wino_in", lambda: c_file("ops/winograd.c"))
    rows = n * th
    l2 = host_blocking(vector).l2
    chunk = chunk_rows(rows, tw, c, m, ctx.op_threads, l2)
    # Chunks on several threads: each thread its own, its three loops inline (cg_wino_chunk_task)
    slots = ctx.op_threads if ctx.op_threads > 1 and chunk < rows else 1
    if slots > 1:
        chunk = thread_chunk_rows(rows, tw, c, m, slots, l2)
    tiles = chunk * tw  # the GEMM's rows per chunk
    v, products = ctx.temp(slots * tiles * POINTS * c), ctx.temp(slots * tiles * POINTS * m)
    zeros = ctx.weight(np.zeros(c, np.float32))
    nv, p = choose_tile(m, tiles, vector, c)
    packed, nmb = pack_weights(winograd_weights(weight), POINTS, nv, vector)
    # a plain store, from the registers of full tiles: no epilogue step, no operand
    gemm_threads = 1 if slots > 1 else ctx.op_threads
    split = host_blocking(vector).split(nmb, POINTS, -(-tiles // p), c, nv * vector, p, gemm_threads,
                                        weights_outweigh_input=weights_outweigh(packed.size, tiles * POINTS * c))
    driver = gemm_function(ctx, nv, p, VectorEpilogue((), (), ()), depth=c, fetch_next=split.fetch_next)
    symbol = ctx.weight(packed)
    job, tap, seen, row0 = ctx.name("job"), ctx.name("tap"), ctx.name("nonfinite"), ctx.name("row")
    ctx.body.append(f"  static const long {tap}[] = {c_longs([0])};")  # also the epilogue's (no) row strides
    # The chunk's tiles are the GEMM's rows, one after the other: an image of 1 x nr x TW.
    gemm_job = (
        f"cg_gemm_t {job} = {{{v}, {POINTS * c}, 1, {c}, 1, {chunk}, {tw}, {chunk}, {tw}, 1, 1, 1, {tap}, "
        f"{POINTS}, {m}, {nmb}, {symbol}, {products}, {POINTS * m}, 0, cg_wino_store, NULL, "
        f"{split.runs}, {split.blocks_per_task}, {int(split.rows_outer)}, 0, 0, {tap}}};"
    )
    if slots > 1:
        busy, chunks = ctx.temp(slots), ctx.name("chunks")
        ctx.body.append(
            f"  int {seen} = 0;\n"
            f"  {{ const {gemm_job}\n"
            f"    memset({busy}, 0, sizeof(int) * {slots});\n"
            f"    const cg_wino_chunks_t {chunks} = {{{src}, {n}, {h}, {w}, {c}, {th}, {tw}, {source_pads[0]}, "
            f"{source_pads[1]}, {TILES_PER_TASK}, {zeros}, &{job}, {driver}, {y}, {oh}, {ow}, {m}, {ldy}, {yrow}, "
            f"{yimg}, {ep}, {ep}_ops, {v}, {products}, {tiles * POINTS * c}, {tiles * POINTS * m}, (int*){busy}, "
            f"{slots}, {rows}, {chunk}, &{seen}}};\n"
            f"    cg_parallel({-(-rows // chunk)}, cg_wino_chunk_task, &{chunks}); }}\n"
            f"  if (!{seen}) {{"
        )
    else:
        ctx.body.append(
            f"  int {seen} = 0;\n"
            f"  {{ {gemm_job}\n"
            f"    for (long {row0} = 0; {row0} < {rows}; {row0} += {chunk}) {{\n"
            f"      const long nr = cg_min({chunk}, {rows} - {row0});\n"
            f"      if (cg_wino_in({src}, {v}, {n}, {h}, {w}, {c}, {th}, {tw}, {source_pads[0]}, {source_pads[1]}, "
            f"{TILES_PER_TASK}, {zeros}, {row0}, nr)) {{ {seen} = 1; break; }}\n"
            f"      {job}.Hp = {job}.OH = nr;\n"
            f"      {driver}(&{job});\n"
            f"      cg_wino_out({products}, {y}, {n}, {oh}, {ow}, {m}, {th}, {tw}, {ldy}, {yrow}, {yimg}, "
            f"{TILES_PER_TASK}, {ep}, {ep}_ops, {row0}, nr);\n"
            f"    }} }}\n"
            f"  if (!{seen}) {{"
        )
    ctx.body.append("  } else {  /* an Inf or a NaN in the input: the direct Conv, as onnxruntime spreads them */")
    return WinogradWeights(symbol, c, m, nmb, nv * vector)
