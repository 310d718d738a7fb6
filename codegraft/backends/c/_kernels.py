"""Hand-written C kernels shared by every partition: the GEMM/conv driver, pools, softmax.

NOTE: one register-blocked micro-kernel serves Conv, Gemm and MatMul.  It computes a tile
of ``P`` output rows (pixels) by ``NV`` SIMD vectors of output channels, reading each input
scalar once per tile and each packed weight vector once per tile; weights are packed at
compile time as ``[group][channel block][k][NV * VW]``.  A Conv's row ``r`` reads the
channels-last input at ``rows[r] + tapoff[t] + c`` for kernel tap ``t`` and channel ``c``;
a GEMM is the same with one tap.  Vectors are GCC vector extensions, so the same source
builds for AVX-512, AVX2 or plain SSE/NEON; the target flags pick the instructions.  Each
tile hands its result to the partition's fused epilogue (bias, BatchNorm, activation,
residual) before anything reaches memory.
"""

from __future__ import annotations

from codegraft.backends.c._c_files import c_file, filled

PRELUDE = c_file("prelude.c")


def transpose_block(vector: int) -> str:
    """``cg_transpose_block``: a ``VW x VW`` block transposed in registers.

    Row ``i`` of the block is ``x[i * ldx ...]``; column ``j`` goes to ``y[j * ldy ...]``.
    Each stage swaps the off-diagonal ``d x d`` sub-blocks of every ``2d x 2d`` block with
    two-vector shuffles; log2(VW) stages make the transpose.
    """
    lines = [
        "static inline void cg_transpose_block(const float* x, long ldx, float* y, long ldy) {",
        "  vf r[VW];",
        "  for (int i = 0; i < VW; i++) r[i] = *(const vfu*)(x + i * ldx);",
    ]
    d = vector // 2
    while d >= 1:
        low = [vector + k - d if k & d else k for k in range(vector)]
        high = [vector + k if k & d else k + d for k in range(vector)]
        for i in range(vector):
            if i & d:
                continue
            lines.append(f"  {{ const vf a = r[{i}], b = r[{i + d}];")
            lines.append(f"    r[{i}] = CG_SHUFFLE(a, b, {', '.join(map(str, low))});")
            lines.append(f"    r[{i + d}] = CG_SHUFFLE(a, b, {', '.join(map(str, high))}); }}")
        d //= 2
    lines.append("  for (int j = 0; j < VW; j++) *(vfu*)(y + j * ldy) = r[j];")
    lines.append("}")
    return "\n".join(lines)


SHUFFLE = c_file("shuffle.c")  # two-vector shuffles, spelled as the compiler wants


def microkernel(nv: int, p: int) -> str:
    """The ``P x NV`` register-blocked tile and its parallel driver ``cg_gemm_<nv>_<p>``.

    Accumulators are named scalars of vector type (not arrays) so the compiler keeps them
    in registers; the loop body is written out rather than left to the unroller.
    """
    accs = [f"a{i}_{j}" for i in range(p) for j in range(nv)]
    lines = [
        f"static void cg_mk_{nv}_{p}(const float* const* rows, const long* tapoff, long ntaps, long cg, long cs,",
        "                          const float* w, float* tile) {",
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
    lines += [f"  *(vf*)(tile + {(i * nv + j)} * VW) = a{i}_{j};" for i in range(p) for j in range(nv)]
    lines.append("}")
    lines.append(filled("gemm_driver.c", NV=nv, P=p))
    return "\n".join(lines)



ENTRY_OPEN = """
void cg_entry(const float* const* in, float* const* out, const float* w, float* s, int nthreads) {
  cg_want = nthreads;
"""
