"""Conv, Gemm and MatMul: weight packing at compile time and calls into the GEMM driver.

NOTE: packing happens here, in numpy, once per compile: the C code only ever sees weights
already in the micro-kernel's order (``[group][block][k][NV * VW]``), so nothing is
reshuffled per call.  The tile shape (``P`` rows x ``NV`` vectors) is chosen per op so
that narrow layers do not waste most of a vector and the accumulators fit the target's
register file (32 vector registers with AVX-512, 16 otherwise).
"""

from __future__ import annotations

import math

import numpy as np

from codegraft.backends.c import _graph as g
from codegraft.backends.c._blocking import host_blocking
from codegraft.backends.c._depthwise import DepthwiseShape, depthwise_function
from codegraft.backends.c._emit import Context
from codegraft.backends.c._fuse import Kernel
from codegraft.backends.c._kernels import microkernel
from codegraft.backends.c._ops_elementwise import emit_epilogue


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


class _Kernels:
    """Micro-kernel variants already emitted into this source."""

    def __init__(self) -> None:
        self.done: set[tuple[int, int]] = set()

    def need(self, ctx: Context, nv: int, p: int) -> str:
        if (nv, p) not in self.done:
            self.done.add((nv, p))
            ctx.functions.append(microkernel(nv, p))
        return f"cg_gemm_{nv}_{p}"


def _ints(values: list[int]) -> str:
    return "{" + ", ".join(str(v) for v in values) + "}"


def emit_conv(ctx: Context, kernel: Kernel, variants: _Kernels) -> None:
    conv = kernel.core
    assert isinstance(conv, g.Conv) and conv.window is not None
    x = conv.inputs[0]
    phys_in, phys_out = x.physical_shape, kernel.out.physical_shape
    n, c = phys_in[0], phys_in[-1]
    spatial, out_spatial = list(phys_in[1:-1]), list(phys_out[1:-1])
    win = conv.window
    kernel_dims, strides, dilations = list(win.kernel), list(win.strides), list(win.dilations)
    pads_b, pads_e = list(win.pads_begin), list(win.pads_end)
    if len(spatial) == 1:  # 1-D: a 2-D conv with one row
        spatial, out_spatial = [1, *spatial], [1, *out_spatial]
        kernel_dims, strides, dilations = [1, *kernel_dims], [1, *strides], [1, *dilations]
        pads_b, pads_e = [0, *pads_b], [0, *pads_e]
    h, w_ = spatial
    hp, wp = h + pads_b[0] + pads_e[0], w_ + pads_b[1] + pads_e[1]
    m = phys_out[-1]
    group = conv.group
    cg, mg = c // group, m // group
    taps = [
        (i * dilations[0] * wp + j * dilations[1]) * c for i in range(kernel_dims[0]) for j in range(kernel_dims[1])
    ]
    ep = emit_epilogue(ctx, kernel)
    src = ctx.ptr(x)
    weight = conv.weight.reshape(m, -1)  # OHWI: row m is (kh, kw, c) in tap order
    if kernel.slot is None:
        y, ldy = ctx.ptr(kernel.out), m
    else:  # write our channels straight into the Concat's output
        target, first = kernel.slot
        y, ldy = f"({ctx.ptr(target)} + {first})", target.physical_shape[-1]
    if cg == 1 and mg == 1:  # depthwise (never given a Concat slot, see _fuse.py)
        assert kernel.slot is None
        shape = DepthwiseShape(n, h, w_, c, out_spatial[0], out_spatial[1], kernel_dims[0], kernel_dims[1],
                               strides[0], strides[1], dilations[0], dilations[1], pads_b[0], pads_b[1])
        fn = ctx.name("dw")
        ctx.functions.append(depthwise_function(fn, shape, ep, ctx.target.vector_floats))
        dw = ctx.weight(np.ascontiguousarray(weight.T))
        ctx.body.append(f"  {fn}({src}, {dw}, {y}, {ep}_ops);")
        return
    if any(pads_b) or any(pads_e):
        padded = ctx.temp(n * hp * wp * c)
        ctx.body.append(f"  cg_pad({src}, {padded}, {n}, {h}, {w_}, {c}, {pads_b[0]}, {pads_b[1]}, {hp}, {wp});")
        src = padded
    run = cg
    if group == 1 and dilations[1] == 1:
        # A kernel row's taps are adjacent in channels-last memory: read them as one run of
        # kw * C values (same order as the packed weights), so the inner loop is long even
        # for 3-channel images.
        taps, run = [i * dilations[0] * wp * c for i in range(kernel_dims[0])], kernel_dims[1] * c
    tap_sym = ctx.name("tap")
    ctx.body.append(f"  static const long {tap_sym}[] = {_ints(taps)};")
    rows = n * out_spatial[0] * out_spatial[1]
    nv, p = choose_tile(mg, rows, ctx.target.vector_floats, len(taps) * run)
    packed, nmb = pack_weights(weight, group, nv, ctx.target.vector_floats)
    wsym = ctx.weight(packed)
    driver = variants.need(ctx, nv, p)
    per_task = host_blocking(ctx.target.vector_floats).tiles_per_task(
        -(-rows // p), group * nmb, p, nv * ctx.target.vector_floats, len(taps) * run, ctx.op_threads)
    job = ctx.name("job")
    ctx.body.append(
        f"  {{ const cg_gemm_t {job} = {{{src}, {c}, 1, {run}, {n}, {hp}, {wp}, {out_spatial[0]}, {out_spatial[1]}, "
        f"{strides[0]}, {strides[1]}, {len(taps)}, {tap_sym}, {group}, {mg}, {nmb}, {wsym}, {y}, {ldy}, 0, "
        f"{ep}, {ep}_ops, {per_task}}};\n    {driver}(&{job}); }}"
    )


def emit_matmul(ctx: Context, kernel: Kernel, variants: _Kernels) -> None:
    mm = kernel.core
    assert isinstance(mm, g.MatMul)
    a, b = mm.inputs
    out = kernel.out
    rows, cols = out.shape[-2], out.shape[-1]
    depth = a.shape[-2] if mm.trans_a else a.shape[-1]
    batch = out.shape[:-2]
    if batch and not mm.trans_a and math.prod(b.shape[:-2]) == 1 and a.shape[:-2] == batch:
        # Every batch multiplies the same B: one GEMM over all rows, not a batch of small ones
        # (a sequence-first [S, 1, K] input would otherwise be S row-vector products).
        rows, batch = rows * math.prod(batch), ()
    nbatch = math.prod(batch)
    # Which A / B batch each output batch reads (numpy broadcasting of the batch axes).
    if batch:
        a_index = np.broadcast_to(np.arange(math.prod(a.shape[:-2])).reshape(a.shape[:-2] or ()), batch).reshape(-1)
        b_index = np.broadcast_to(np.arange(math.prod(b.shape[:-2])).reshape(b.shape[:-2] or ()), batch).reshape(-1)
    else:
        a_index, b_index = np.zeros(1, np.int64), np.zeros(1, np.int64)
    nv, p = choose_tile(cols, rows, ctx.target.vector_floats, depth)
    width = nv * ctx.target.vector_floats
    nmb = -(-cols // width)
    block = nmb * depth * width  # packed floats per B batch
    ep = emit_epilogue(ctx, kernel)
    driver = variants.need(ctx, nv, p)
    if b.const is not None:
        matrices = b.const.astype(np.float32).reshape(-1, *b.shape[-2:])
        if not mm.trans_b:
            matrices = matrices.transpose(0, 2, 1)  # -> [batch][N][K]
        wsym = ctx.weight(np.concatenate([pack_weights(mat, 1, nv, ctx.target.vector_floats)[0].reshape(-1)
                                          for mat in matrices]))
    else:
        nb = math.prod(b.shape[:-2])
        wsym = ctx.temp(nb * block)
        sk, sn = (1, depth) if mm.trans_b else (cols, 1)
        bptr = ctx.ptr(b)
        ctx.body.append(
            f"  for (long bi = 0; bi < {nb}; bi++) cg_pack({bptr} + bi * {depth * cols}, {depth}, {cols}, {sk}, {sn}, "
            f"{wsym} + bi * {block}, {nmb}, {width});"
        )
    pstride, cstride = (1, rows) if mm.trans_a else (depth, 1)
    per_task = host_blocking(ctx.target.vector_floats).tiles_per_task(-(-rows // p), nmb, p, width, depth,
                                                                      ctx.op_threads)
    job = ctx.name("job")
    aoff, boff = ctx.name("aoff"), ctx.name("boff")
    ctx.body.append(f"  static const long {aoff}[] = {_ints([int(i) * rows * depth for i in a_index])};")
    ctx.body.append(f"  static const long {boff}[] = {_ints([int(i) * block for i in b_index])};")
    ctx.body.append(f"  static const long {job}_tap[] = {{0}};")
    ctx.body.append(
        f"  for (long bi = 0; bi < {nbatch}; bi++) {{\n"
        f"    const cg_gemm_t {job} = {{{ctx.ptr(a)} + {aoff}[bi], {pstride}, {cstride}, {depth}, 1, 1, {rows}, 1, "
        f"{rows}, 1, 1, 1, {job}_tap, 1, {cols}, {nmb}, {wsym} + {boff}[bi], {ctx.ptr(out)}, {cols}, bi * {rows}, "
        f"{ep}, {ep}_ops, {per_task}}};\n    {driver}(&{job});\n  }}"
    )
