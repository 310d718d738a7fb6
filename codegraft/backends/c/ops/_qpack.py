"""8-bit GEMM operands shared by QuantMatMul (``quantize.py``) and QuantConv (``qconv.py``):
the tile constants of ``qgemm.c`` and the weight's packing."""

from __future__ import annotations

import numpy as np

from codegraft.backends.c._c_files import c_file
from codegraft.backends.c._emit import Context
from codegraft.backends.c._toolchain import VNNI

EIGHT_BIT_SPAN = 255  # the largest |x - zero point| of two 8-bit values of one type
QGEMM_ROWS, QGEMM_COLS, QGEMM_RUN = 4, 64, 16  # a tile, and tiles to a task (CG_QGEMM_* in qgemm.c)
QGEMM_DEPTH = 1 << 14  # 255 * 255 * 2**14 < 2**31: no int32 sum overflows


def int8_columns(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """An integer ``[K, N]`` matrix (an 8-bit weight less its zero point) as int8 values plus
    an int32 offset per column (0 where the values fit int8 already; a uint8 weight's column
    spans 255 values at most, so less the middle of its range it fits); ``None`` where not."""
    if not weight.size:
        return None
    weight = weight.astype(np.int32)
    offset = np.zeros(weight.shape[1], np.int32)
    if weight.min() < -128 or weight.max() > 127:
        low, high = weight.min(axis=0), weight.max(axis=0)
        offset = ((low + high + 1) // 2).astype(np.int32)
    shifted = weight - offset.reshape(1, -1)
    if shifted.min() < -128 or shifted.max() > 127:
        return None
    return shifted.astype(np.int8), offset


def vnni_packed(weight: np.ndarray) -> np.ndarray:
    """An int8 ``[K, N]`` weight as the 8-bit kernels read it: zero-padded to ``K4`` (a multiple
    of 4) rows and whole blocks of ``QGEMM_COLS`` columns, laid out [block][k / 4][column][k % 4]:
    four consecutive k of a column in one 32-bit lane (vpdpbusd)."""
    depth, cols = weight.shape
    k4, blocks = -(-depth // 4) * 4, -(-cols // QGEMM_COLS)
    padded = np.zeros((k4, blocks * QGEMM_COLS), np.int8)
    padded[:depth, :cols] = weight
    return padded.reshape(k4 // 4, 4, blocks, QGEMM_COLS).transpose(2, 0, 3, 1)


def vnni_build(features: frozenset[str]) -> bool:
    """Whether a build for these CPU features takes ``q8.c``'s VNNI path (``CG_Q8_VNNI``), which
    reads :func:`vnni_packed`'s layout; the others read :func:`column_groups`'."""
    return {VNNI, "avx512bw", "avx512f"} <= features


def column_groups(packed: np.ndarray) -> np.ndarray:
    """Blocks of :func:`vnni_packed` ``[..., block, K4 / 4, 64, 4]`` as the AVX2 (and plain C)
    8-bit sums read them, ``[..., block, 8, K4 / 4, 8, 4]``: each group of 8 columns whole, so a
    pass over 8 columns streams contiguous bytes (read from the VNNI layout, a pass took 32 bytes
    of every 256, and the next pass the next 32).

    >>> groups = column_groups(np.arange(2 * 64 * 4).reshape(1, 2, 64, 4))  # one block, two k-steps
    >>> groups[0, 1, 0, 0, 0], groups[0, 0, 1, 0, 0]  # column 8 at step 0; column 0 at step 1
    (np.int64(32), np.int64(256))
    """
    lead, (blocks, steps) = packed.shape[:-4], packed.shape[-4:-2]
    grouped = packed.reshape(*lead, blocks, steps, QGEMM_COLS // 8, 8, 4)
    return np.ascontiguousarray(np.moveaxis(grouped, -3, -4))


def qgemm_packed(weight: np.ndarray, features: frozenset[str]) -> np.ndarray:
    """An int8 ``[K, N]`` weight in the layout a build for ``features`` reads (:func:`vnni_build`)."""
    packed = vnni_packed(weight)
    return packed if vnni_build(features) else column_groups(packed)


def define_q8(ctx: Context) -> None:
    """The 8-bit paths' common C (``q8.c``) added to ``ctx`` the first time, after the layout its
    weights are packed in (``CG_Q8_PACKED_VNNI``, :func:`vnni_build` of the target): ``q8.c``
    takes the path that reads it whatever CPU the source is later rebuilt for."""
    packed = int(vnni_build(ctx.target.features))
    ctx.define_once("cg_q8", lambda: f"#define CG_Q8_PACKED_VNNI {packed}\n" + c_file("ops/q8.c"))


def define_qgemm(ctx: Context) -> str:
    """The name of the 8-bit GEMM (``qgemm.c``), its C and that of the AVX2 helpers it shares
    with the quantized LSTM (``q8.c``) added to ``ctx`` the first time."""
    define_q8(ctx)
    return ctx.define_once("cg_qgemm", lambda: c_file("ops/qgemm.c"))


def as_weight_bytes(ctx: Context, array: np.ndarray) -> str:
    """The symbol of an int8 or int32 constant placed in the (float) weight arena byte for byte."""
    return ctx.weight(np.ascontiguousarray(array).reshape(-1).view(np.float32))


__all__ = ["EIGHT_BIT_SPAN", "QGEMM_COLS", "QGEMM_DEPTH", "QGEMM_ROWS", "QGEMM_RUN", "as_weight_bytes", "define_q8",
           "define_qgemm", "column_groups", "int8_columns", "qgemm_packed", "vnni_build", "vnni_packed"]
