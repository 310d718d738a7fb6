"""A depthwise convolution (one input and one output channel per group) specialised per layer.

NOTE: every size is a compile-time constant in the generated C, so the compiler unrolls the
channel vectors and taps and keeps indices in immediates.  Channels are contiguous in NHWC,
so the SIMD vector runs across channels: a block of ``PB`` output pixels (as many as the
registers hold) x one vector of
channels stays in registers over all taps.  Padding is never materialised: rows outside
the input are skipped, and only blocks touching the left/right border take the checked
path; interior blocks load each input vector of a kernel row once and reuse it for every
pixel/tap pair that reads it (stride 1: ``PB + KW - 1`` loads instead of ``PB * KW``).
The fused epilogue (bias, BatchNorm, activation, residual) is a direct call to the
partition's static ``cg_ep`` function, which the compiler inlines.
"""

from __future__ import annotations

from dataclasses import dataclass


def pixels_per_block(s: DepthwiseShape, vector: int) -> int:
    """The widest block (of 8, 6, 4, 2 pixels) whose accumulators, loaded inputs and weight fit the registers."""
    registers = 32 if vector >= 16 else 16  # AVX-512 has 32 vector registers, AVX2/SSE/NEON-as-compiled 16
    for pb in (8, 6, 4, 2):
        span = (pb - 1) * s.sw + (s.kw - 1) * s.dw + 1
        if span + pb + 1 <= registers - 2:
            return pb
    return 2


@dataclass(frozen=True)
class DepthwiseShape:
    n: int
    h: int
    w: int
    c: int
    oh: int
    ow: int
    kh: int
    kw: int
    sh: int
    sw: int
    dh: int
    dw: int
    pt: int  # top padding
    pl: int  # left padding


def depthwise_function(name: str, s: DepthwiseShape, epilogue: str, vector: int) -> str:
    """C for ``name(x, w, y, ops)``: ``w`` is ``[kh][kw][c]``; ``y`` is NHWC with ``c`` channels."""
    pb = pixels_per_block(s, vector)
    cv = s.c // vector * vector
    span = (pb - 1) * s.sw + (s.kw - 1) * s.dw + 1  # input pixels one interior block reads per kernel row
    # Output columns whose whole window is inside the row: ow * sw - pl >= 0 and ow * sw - pl + (kw-1)*dw < w.
    first_in = -(-s.pl // s.sw)
    last_in = (s.w - 1 - (s.kw - 1) * s.dw + s.pl) // s.sw  # may be < first_in
    return f"""
typedef struct {{ const float* x; const float* w; float* y; const float* const* ops; }} {name}_t;
static inline __attribute__((always_inline)) void {name}_block(const float* xr, const float* w, float* acc, long ih0,
                                                            long ow0, long np, const int interior) {{
  for (long c = 0; c < {cv}; c += VW) {{
    vf a[{pb}];
    #pragma GCC unroll {pb}
    for (int p = 0; p < {pb}; p++) a[p] = (vf){{0}};
    #pragma GCC unroll {s.kh}
    for (long i = 0; i < {s.kh}; i++) {{
      const long ih = ih0 + i * {s.dh};
      if (ih < 0 || ih >= {s.h}) continue;
      const float* rp = xr + ih * {s.w * s.c} + c;
      const long iw0 = ow0 * {s.sw} - {s.pl};
      if (interior) {{
        vf in[{span}];
        #pragma GCC unroll {span}
        for (int q = 0; q < {span}; q++) in[q] = *(const vfu*)(rp + (iw0 + q) * {s.c});
        #pragma GCC unroll {s.kw}
        for (int j = 0; j < {s.kw}; j++) {{
          const vf wv = *(const vfu*)(w + (i * {s.kw} + j) * {s.c} + c);
          #pragma GCC unroll {pb}
          for (int p = 0; p < {pb}; p++) a[p] += in[p * {s.sw} + j * {s.dw}] * wv;
        }}
      }} else {{
        #pragma GCC unroll {s.kw}
        for (int j = 0; j < {s.kw}; j++) {{
          const vf wv = *(const vfu*)(w + (i * {s.kw} + j) * {s.c} + c);
          for (int p = 0; p < np; p++) {{
            const long iw = iw0 + p * {s.sw} + j * {s.dw};
            if (iw >= 0 && iw < {s.w}) a[p] += *(const vfu*)(rp + iw * {s.c}) * wv;
          }}
        }}
      }}
    }}
    #pragma GCC unroll {pb}
    for (int p = 0; p < {pb}; p++) *(vfu*)(acc + p * {s.c} + c) = a[p];
  }}
  for (long p = 0; p < np; p++)
    for (long c = {cv}; c < {s.c}; c++) {{
      float sum = 0.0f;
      for (long i = 0; i < {s.kh}; i++) {{
        const long ih = ih0 + i * {s.dh};
        if (ih < 0 || ih >= {s.h}) continue;
        for (long j = 0; j < {s.kw}; j++) {{
          const long iw = (ow0 + p) * {s.sw} - {s.pl} + j * {s.dw};
          if (iw >= 0 && iw < {s.w}) sum += xr[(ih * {s.w} + iw) * {s.c} + c] * w[(i * {s.kw} + j) * {s.c} + c];
        }}
      }}
      acc[p * {s.c} + c] = sum;
    }}
}}
static void {name}_row(const void* ctx, long task) {{
  const {name}_t* k = ctx;
  const long n = task / {s.oh}, oh = task % {s.oh};
  const float* xr = k->x + n * {s.h * s.w * s.c};
  const long ih0 = oh * {s.sh} - {s.pt};
  float acc[{pb * s.c}] __attribute__((aligned(64)));
  for (long ow0 = 0; ow0 < {s.ow}; ow0 += {pb}) {{
    const long np = cg_min({pb}, {s.ow} - ow0);
    if (np == {pb} && ow0 >= {first_in} && ow0 + {pb - 1} <= {last_in})
      {name}_block(xr, k->w, acc, ih0, ow0, {pb}, 1);
    else
      {name}_block(xr, k->w, acc, ih0, ow0, np, 0);
    {epilogue}(k->ops, k->y, {s.c}, acc, {s.c}, task * {s.ow} + ow0, np, 0, {s.c});
  }}
}}
static void {name}(const float* x, const float* w, float* y, const float* const* ops) {{
  const {name}_t k = {{x, w, y, ops}};
  cg_parallel({s.n * s.oh}, {name}_row, &k);
}}
"""
