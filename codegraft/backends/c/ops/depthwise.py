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

from codegraft.backends.c._c_files import filled


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
    """C for ``name(x, w, y, ops)`` (``depthwise.c``): ``w`` is ``[kh][kw][c]``; ``y`` is NHWC with ``c`` channels."""
    pb = pixels_per_block(s, vector)
    cv = s.c // vector * vector
    # A remainder of channels (shufflenet's 116 and 136 on AVX-512) runs as one vector overlapping
    # the last whole one rather than lane by lane: scalar, it took about as long as the vectors.
    overlap = s.c - vector if cv < s.c and s.c >= vector else -1
    scalar_from = s.c if overlap >= 0 else cv
    span = (pb - 1) * s.sw + (s.kw - 1) * s.dw + 1  # input pixels one interior block reads per kernel row
    # Output columns whose whole window is inside the row: ow * sw - pl >= 0 and ow * sw - pl + (kw-1)*dw < w.
    first_in = -(-s.pl // s.sw)
    last_in = (s.w - 1 - (s.kw - 1) * s.dw + s.pl) // s.sw  # may be < first_in
    return filled(
        "ops/depthwise.c", name=name, epilogue=epilogue, pb=pb, cv=cv, overlap=overlap, scalar_from=scalar_from,
        span=span, first_in=first_in, last_in=last_in,
        last_pixel=pb - 1, block=pb * s.c, h=s.h, w=s.w, c=s.c, oh=s.oh, ow=s.ow, kh=s.kh, kw=s.kw,
        sh=s.sh, sw=s.sw, dh=s.dh, dw=s.dw, pt=s.pt, pl=s.pl, row=s.w * s.c, image=s.h * s.w * s.c,
        rows=s.n * s.oh,
    )
