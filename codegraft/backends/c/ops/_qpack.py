"""8-bit GEMM operands shared by QuantMatMul (``quantize.py``) and QuantConv (``qconv.py``):
the tile constants of ``qgemm.c`` and the weight's packing."""

from __future__ import annotations

import numpy as np

from codegraft.backends.c._c_files import c_file
from codegraft.backends.c._emit import Context

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


def define_qgemm(ctx: Context) -> str:
    """The name of the 8-bit GEMM (``qgemm.c``), its C and that of the AVX2 helpers it shares
    with the quantized LSTM (``q8.c``) added to ``ctx`` the first time."""
    ctx.define_once("cg_q8", lambda: c_file("ops/q8.c"))
    return ctx.define_once("cg_qgemm", lambda: c_file("ops/qgemm.c"))


def as_weight_bytes(ctx: Context, array: np.ndarray) -> str:
    """The symbol of an int8 or int32 constant placed in the (float) weight arena byte for byte."""
    return ctx.weight(np.ascontiguousarray(array).reshape(-1).view(np.float32))


__all__ = ["EIGHT_BIT_SPAN", "QGEMM_COLS", "QGEMM_DEPTH", "QGEMM_ROWS", "QGEMM_RUN", "as_weight_bytes", "define_qgemm",
           "int8_columns", "vnni_packed"]
