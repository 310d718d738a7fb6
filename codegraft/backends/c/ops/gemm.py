"""The GEMM engine Conv, Gemm and MatMul share: tile choice, weight packing, the micro-kernel.

NOTE: one register-blocked micro-kernel serves Conv, Gemm and MatMul.  It computes a tile
of ``P`` output rows (pixels) by ``NV`` SIMD vectors of output channels, reading each input
scalar once per tile and each packed weight vector once per tile; weights are packed at
compile time as ``[group][channel block][k][NV * VW]``.  A Conv's row ``r`` reads the
channels-last input at ``rows[r] + tapoff[t] + c`` for kernel tap ``t`` and channel ``c``;
a GEMM is the same with one tap.  Vectors are GCC vector extensions, so the same source
builds for AVX-512, AVX2 or plain SSE/NEON; the target flags pick the instructions.  Each
tile hands its result to the partition's fused epilogue (bias, BatchNorm, activation,
residual) before anything reaches memory.

Packing happens in numpy, once per compile: the C code only ever sees weights already in
the micro-kernel's order (``[group][block][k][NV * VW]``), so nothing is reshuffled per
call.  The tile shape (``P`` rows x ``NV`` vectors) is chosen per op by ``_blocking.py``
(rows from the register file, width so the weight panel stays in L2), and so is how many
channel blocks each tile runs before the next (as many as keep their panels in L2: the
tile's inputs are then read once, not once per block).  The parallel driver around each
tile variant is ``gemm_driver.c``.
"""

from __future__ import annotations

import numpy as np

from codegraft.backends.c._blocking import host_blocking
from codegraft.backends.c._c_files import filled
from codegraft.backends.c._emit import Context


def choose_tile(channels: int, rows: int, vector: int, depth: int = 0) -> tuple[int, int]:
    """``(NV, P)`` for ``channels`` outputs per group, ``rows`` output rows, ``depth`` (``_blocking.py``)."""
    return host_blocking(vector).tile(channels, rows, depth)


def pack_weights(weight: np.ndarray, groups: int, nv: int, vector: int) -> tuple[np.ndarray, int]:
    """``[M, K]`` weights (row m: output channel m) as ``[groups][nmb][K][nv * vector]``."""
    m, k = weight.shape
    mg = m // groups
    width = nv * vector
    nmb = -(-mg // width)
    packed = np.zeros((groups, nmb * width, k), np.float32)
    packed[:, :mg, :] = weight.reshape(groups, mg, k)
    packed = packed.reshape(groups, nmb, width, k).transpose(0, 1, 3, 2)
    return np.ascontiguousarray(packed), nmb


def gemm_function(ctx: Context, nv: int, p: int) -> str:
    """The name of the ``P x NV`` GEMM driver, its C added to ``ctx`` the first time it is needed."""
    vector = ctx.target.vector_floats
    # A tile's results for its range of channel blocks: at most half the L1 (blocks_per_task),
    # as a fixed-size array (a variable-length one costs the hot loop its frame-pointer register).
    floats = max(host_blocking(vector).l1d // 8, p * nv * vector)
    return ctx.define_once(f"cg_gemm_{nv}_{p}", lambda: microkernel(nv, p, floats))


def c_longs(values: list[int]) -> str:
    """A C initializer list: ``{1, 2, 3}``."""
    return "{" + ", ".join(str(v) for v in values) + "}"


def microkernel(nv: int, p: int, buffer_floats: int) -> str:
    """The ``P x NV`` register-blocked tile and its parallel driver ``cg_gemm_<nv>_<p>``
    (``buffer_floats``: room for a tile's results over its range of channel blocks).

    Accumulators are named scalars of vector type (not arrays) so the compiler keeps them
    in registers; the loop body is written out rather than left to the unroller.
    """
    accs = [f"a{i}_{j}" for i in range(p) for j in range(nv)]
    lines = [
        f"static void cg_mk_{nv}_{p}(const float* const* rows, const long* tapoff, long ntaps, long cg, long cs,",
        "                          const float* w, float* tile, long ldt) {",
        "  vf " + ", ".join(f"{a} = {{0}}" for a in accs) + ";",
        "  for (long t = 0; t < ntaps; t++) {",
    ]
    lines += [f"    const float* r{i} = rows[{i}] + tapoff[t];" for i in range(p)]
    for stride in ("1", "cs"):
        index = "c" if stride == "1" else "c * cs"
        lines.append("    if (cs == 1) {" if stride == "1" else "    } else {")
        lines.append(f"      for (long c = 0; c < cg; c++, w += {nv} * VW) {{")
        lines += [f"        const vf w{j} = *(const vf*)(w + {j} * VW);" for j in range(nv)]
        for i in range(p):
            lines.append(f"        {{ const float x = r{i}[{index}];")
            lines += [f"          a{i}_{j} += x * w{j};" for j in range(nv)]
            lines.append("        }")
        lines.append("      }")
    lines += ["    }", "  }"]
    lines += [f"  *(vf*)(tile + {i} * ldt + {j} * VW) = a{i}_{j};" for i in range(p) for j in range(nv)]
    lines.append("}")
    lines.append(filled("ops/gemm_driver.c", NV=nv, P=p, BUF=buffer_floats))
    return "\n".join(lines)
