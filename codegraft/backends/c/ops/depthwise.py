"""A depthwise convolution (one input and one output channel per group) specialised per layer.

NOTE: every size is a compile-time constant in the generated C, so the compiler unrolls the
taps and pixels and keeps indices in immediates.  Channels are contiguous in NHWC, so the
SIMD vector runs across channels: a block of ``PB`` output pixels x one vector of channels
stays in registers over all taps.  For each kernel row the row's ``KW`` weight vectors are
loaded, then each input vector the block's windows cover is loaded once and multiplied into
every pixel whose window holds it (stride 1: ``PB + KW - 1`` loads for ``PB * KW``
multiply-adds), each pixel's taps still in ONNX's order.  Holding the weights rather than
the inputs lets ``PB`` be 8 on AVX2's 16 registers (8 independent FMA chains: two ports,
four cycles each) where holding the ``PB + KW - 1`` inputs allowed 4 pixels for 3x3 and 2
for 7x7, whose two chains left the FMA ports idle most of the time (384 channels 7x7 at
14x14: 0.46 ms -> 0.15, onnxruntime 0.35).
Padding is never materialised: a block touching the left or right border runs the same code
with a check per input column, and computes all ``PB`` pixels, storing those that exist.
Interior blocks prefetch the next block's pixels of the kernel rows no earlier output row
read (those come from the L3: 144 channels at 96x128, 3x3, took 1.8x as long without).
The fused epilogue (bias, BatchNorm, activation, residual) is a direct call to the
partition's static ``cg_ep`` function, which the compiler inlines.
"""

from __future__ import annotations

from dataclasses import dataclass

from codegraft.backends.c._c_files import filled


def pixels_per_block(s: DepthwiseShape, vector: int) -> int:
    """Output pixels a block holds: up to 8 whose accumulators, one kernel row's weights and the
    input vector being added fit the registers, one to spare; of those, the width that leaves
    fewest pixels computed past the row's end, the widest on a tie.

    Eight pixels keep eight independent multiply-add chains in flight (two FMA ports, four
    cycles each); with the inputs streamed, not held, a 7-wide kernel row still gets seven, and
    rows 12 and 7 wide take 6 and 7 rather than compute 16 and 8::

        >>> def pb(width: int, kernel: int) -> int:
        ...     shape = DepthwiseShape(1, width, width, 64, width, width, kernel, kernel, 1, 1, 1, 1, 1, 1)
        ...     return pixels_per_block(shape, vector=8)
        >>> pb(56, 3), pb(14, 7), pb(12, 3), pb(7, 3)
        (8, 7, 6, 7)
    """
    registers = 32 if vector >= 16 else 16  # AVX-512 has 32 vector registers, AVX2/SSE/NEON-as-compiled 16
    most = max(2, min(8, registers - 2 - s.kw))
    return min(range(most, min(4, most) - 1, -1), key=lambda pb: (-(-s.ow // pb) * pb, -pb))


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
    # Kernel rows that the output row before did not read (its rows are these less sh): a bit each.
    new_rows = sum(1 << i for i in range(s.kh) if s.sh % s.dh or i + s.sh // s.dh >= s.kh)
    return filled(
        "ops/depthwise.c", name=name, epilogue=epilogue, pb=pb, cv=cv, overlap=overlap, scalar_from=scalar_from,
        span=span, new_rows=new_rows, step=pb * s.sw, first_in=first_in, last_in=last_in,
        last_pixel=pb - 1, block=pb * s.c, h=s.h, w=s.w, c=s.c, oh=s.oh, ow=s.ow, kh=s.kh, kw=s.kw,
        sh=s.sh, sw=s.sw, dh=s.dh, dw=s.dw, pt=s.pt, pl=s.pl, row=s.w * s.c, image=s.h * s.w * s.c,
        rows=s.n * s.oh,
    )
