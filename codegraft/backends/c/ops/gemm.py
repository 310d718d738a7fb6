"""The GEMM engine Conv, Gemm and MatMul share: tile choice, weight packing, the micro-kernel.

NOTE: one register-blocked micro-kernel serves Conv, Gemm and MatMul.  It computes a tile
of ``P`` output rows (pixels) by ``NV`` SIMD vectors of output channels, reading each input
scalar once per tile and each packed weight vector once per tile; weights are packed at
compile time as ``[group][channel block][k][NV * VW]``.  A Conv's row ``r`` reads the
channels-last input at ``rows[r] + tapoff[t] + c`` for kernel tap ``t`` and channel ``c``;
a GEMM is the same with one tap.  Vectors are GCC vector extensions, so the same source
builds for AVX-512, AVX2 or plain SSE/NEON; the target flags pick the instructions.  Each
tile hands its result to the partition's fused epilogue (bias, BatchNorm, activation,
residual) before anything reaches the output.

Two ways to run the epilogue.  Generic: the tile stores its accumulators to an L1 buffer and
the driver calls the kernel's scalar epilogue function (``elementwise.emit_epilogue``) through
``cg_gemm_t.ep``; it serves every epilogue, and the ragged edges (a last tile of fewer than
``P`` rows, a last channel block only partly valid).  Registers: a Conv whose steps all have
a vector form (``elementwise.VECTOR_FORMS``: add, sub, Relu - resnet's bias + residual +
Relu) gets a second micro-kernel, ``cg_mkf_<nv>_<p>_f<signature>``, that applies the steps to
a full tile's accumulators and stores straight to the output; it also prefetches the tile's
residual and output rows, their only reads from beyond L2: spread one cache line per step
over its k-loop where they outnumber the core's fill buffers and the loop is long enough,
else all before it (``spread_prefetch``).  Row strides are
runtime values (``cg_gemm_t.rs``), so layers sharing steps and operand kinds share the C
(resnet50: 3 variants).  Results are bit-identical to the generic path (same operations per
element, no multiply so no FMA contraction).  Measured (resnet50, AVX2, 1 thread): the buffer
round trip itself costs nothing measurable - without the prefetch the register path was
0.999x main; the gain, when there is one, is the prefetch (0.95-1.0x main, see git log).

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
from codegraft.backends.c._fuse import Kernel, RowCol
from codegraft.backends.c.ops.elementwise import VectorEpilogue


def choose_tile(channels: int, rows: int, vector: int, depth: int = 0) -> tuple[int, int]:
    """``(NV, P)`` for ``channels`` outputs per group, ``rows`` output rows, ``depth`` (``_blocking.py``)."""
    return host_blocking(vector).tile(channels, rows, depth)


# A GEMM weight below this in magnitude is dropped (negligible_terms).
NEGLIGIBLE_WEIGHT = 2.0**-100


def negligible_terms(weight: np.ndarray) -> np.ndarray:
    """GEMM weights with each one below 2**-100 in magnitude set to zero (its sign kept).

    Why: trained weights decay toward zero, and a product of such a weight and an activation
    is subnormal (below 2**-126), for which an Intel core takes a microcode assist at every
    multiply-add that makes or reads one.  PP-OCRv4's English recogniser has a 1x1 Conv (480 ->
    480 channels, 240 pixels) with 44 dead output channels, 21120 weights below 1e-35: 5.5 ms
    instead of 0.35 for the same Conv over other weights.  With activations below 2**26 such a
    term is below 2**-74: nothing in a sum above 2**-50, and a channel made only of such terms
    is one that float32 cannot normalise back either (its squares underflow to zero).

    >>> negligible_terms(np.array([[1e-35, 0.5, -1e-36], [1e-35, 2e-35, 0.0]], np.float32)).tolist()
    [[0.0, 0.5, -0.0], [0.0, 0.0, 0.0]]
    """
    tiny = np.abs(weight) < NEGLIGIBLE_WEIGHT
    if not tiny.any():
        return weight
    return np.where(tiny, np.copysign(np.float32(0), weight), weight).astype(np.float32)


def pack_weights(weight: np.ndarray, groups: int, nv: int, vector: int) -> tuple[np.ndarray, int]:
    """``[M, K]`` weights (row m: output channel m) as ``[groups][nmb][K][nv * vector]``, their
    negligible terms dropped (:func:`negligible_terms`)."""
    weight = negligible_terms(np.asarray(weight, np.float32))
    m, k = weight.shape
    mg = m // groups
    width = nv * vector
    nmb = -(-mg // width)
    packed = np.zeros((groups, nmb * width, k), np.float32)
    packed[:, :mg, :] = weight.reshape(groups, mg, k)
    packed = packed.reshape(groups, nmb, width, k).transpose(0, 1, 3, 2)
    return np.ascontiguousarray(packed), nmb


def gemm_function(
    ctx: Context, nv: int, p: int, fused: VectorEpilogue | None = None, contiguous_input: int = 0,
    depth: int = 0, fetch_next: bool = False,
) -> str:
    """The name of the ``P x NV`` GEMM driver, its C added to ``ctx`` the first time it is needed.

    With ``fused`` (an epilogue all of whose steps have a vector form), the driver applies it
    to full tiles' accumulators in registers; one such driver per (tile, epilogue signature).
    ``contiguous_input``: the input's size in floats when its rows are one run of memory (a
    1x1 stride-1 Conv without pads or groups, a MatMul), else 0.  Over the L2, each tile
    prefetches the next one's rows as it runs (an ``_x`` variant: the other GEMMs' k-loops
    stay as they were); an input the L2 holds is read from there anyway and the prefetches
    only cost (squeezenet's 13x13 squeeze layers, 346 KB: 1.1-1.2x as long at 2 threads).
    ``depth`` (multiply-adds per output) says whether the register epilogue's prefetches are
    spread over the k-loop (``spread_prefetch``).  With ``fetch_next`` (a ``_w`` variant), the
    tiles of a range of channel blocks prefetch the next range's weights (:func:`fetches_next`).
    """
    vector = ctx.target.vector_floats
    # A tile's results for its range of channel blocks: at most half the L1 (blocks_per_task),
    # as a fixed-size array (a variable-length one costs the hot loop its frame-pointer register).
    floats = max(host_blocking(vector).l1d // 8, p * nv * vector)
    ahead = 4 * contiguous_input > host_blocking(vector).l2
    x = variant(ahead, fetch_next)
    steps = host_blocking(vector).k_steps(nv, p)
    ctx.define_once(f"cg_mk_{nv}_{p}{x}", lambda: microkernel(nv, p, ahead, fetch_next, steps))
    if fused is None:
        name = f"{nv}_{p}{x}"
        return ctx.define_once(f"cg_gemm_{name}", lambda: driver(nv, p, floats, name=name, ahead=ahead,
                                                                  fetch_next=fetch_next, steps=steps))
    # per-channel operands (row stride 0: a bias) stay in L1; the output is a stream too
    streams = 1 + sum(1 for kind, rs in zip(fused.operands, fused.row_strides, strict=True) if kind == "c" and rs)
    spread = spread_prefetch(streams, nv, p, vector, depth)
    name = f"{nv}_{p}{x}_f{fused.key}{'_s' if spread else ''}"
    return ctx.define_once(f"cg_gemm_{name}", lambda: driver(nv, p, floats, fused, name, ahead, spread, fetch_next,
                                                              steps))


def row_strides_arg(ctx: Context, ep: str, fused: VectorEpilogue | None) -> str:
    """The ``cg_gemm_t`` initializer's last field for a register epilogue: ``, <ep>_rs``, each
    operand's row stride, declared in the entry body; empty without one."""
    if fused is None:
        return ""
    ctx.body.append(f"  static const long {ep}_rs[] = {c_longs(list(fused.row_strides) or [0])};")
    return f", {ep}_rs"


def write_over_residual(ctx: Context, kernel: Kernel) -> None:
    """Let a GEMM kernel's output take the memory of a full-tensor epilogue operand (a
    residual) that nothing reads after it (``Context.write_over``): each element is read by
    the epilogue just before the same element is written.  Resnet50's residual layers then
    read and write one tensor instead of reading one and writing another."""
    out = kernel.out
    for operand, index in zip(kernel.operands, kernel.indexing, strict=True):
        same = operand.physical_shape == out.physical_shape and operand.perm == out.perm
        if same and index == RowCol(out.physical_shape[-1], 1) and ctx.write_over(out, operand):
            return


# the micro-kernels' last parameters: the next tile's rows (``ahead``), the next range's weights
AHEAD_ARGS = ", const char* ahead, long lines"
FETCH_ARGS = ", const char* wnext, long wlines"


def variant(ahead: bool, fetch_next: bool) -> str:
    """A micro-kernel's name suffix: ``_x`` prefetching the next tile's rows, ``_w`` the next
    range's weights."""
    return ("_x" if ahead else "") + ("_w" if fetch_next else "")


def c_longs(values: list[int]) -> str:
    """A C initializer list: ``{1, 2, 3}``."""
    return "{" + ", ".join(str(v) for v in values) + "}"


def driver(
    nv: int, p: int, buffer_floats: int, fused: VectorEpilogue | None = None, name: str = "", ahead: bool = False,
    spread: bool = False, fetch_next: bool = False, steps: int = 1,
) -> str:
    """The parallel driver ``cg_gemm_<name>`` of the ``P x NV`` tile (``buffer_floats``: room for
    a tile's results over its range of channel blocks); with ``fused``, its register-epilogue
    micro-kernel too, run on full tiles' full channel blocks; with ``ahead``, the tiles
    prefetch the next tile's (contiguous) input rows; with ``spread``, the register
    epilogue's residual and output lines are prefetched over the k-loop, else before it; with
    ``fetch_next``, each tile its share of the next range's weights (:data:`FETCH_SETUP`)."""
    mk = f"cg_mk_{nv}_{p}{variant(ahead, fetch_next)}"
    # the micro-kernels' last arguments: where the next tile's rows start and how many cache
    # lines they take, asked for by the first block's k-loop only; then this block's part of
    # the tile's share of the next range's weights
    more = (", ahead, mb ? 0 : lines" if ahead else "") + (
        ", wnext + (wlo + mb * wstep) * 64, cg_min(wstep, whi - wlo - mb * wstep)" if fetch_next else "")
    setup = (AHEAD_SETUP.replace("${P}", str(p)) if ahead else "") + (
        FETCH_SETUP.replace("${NV}", str(nv)) if fetch_next else "")
    template = {"NV": nv, "P": p, "BUF": buffer_floats, "MK": mk, "MORE": more, "SETUP": setup}
    if fused is None:
        return filled("ops/gemm_driver.c", NAME=name or f"{nv}_{p}", FUSED="", **template)
    width = f"{nv} * VW"
    # Into a bordered output (the next Conv's zero border: yrow, yimg), a full tile whose rows
    # run into the next row of output pixels once (not more: at most OW rows after it) stores
    # its rows from ``split`` on at ``y2``, that row's shift; other tiles that leave their
    # row of pixels take the buffer.  Resnet50's 1x1 layers before a 3x3 write so: at 14x14 in
    # tiles of 6 rows, 6 tiles in 11 leave their row (1024 -> 256 at 14x14 0.95-0.96x as long
    # with this, the whole model's kernels 0.994x at 1 thread; squeezenet's 0.983x).
    tile = (
        f"    long split = {p}; float* y2 = y;\n"
        f"    if (!whole && nr == {p} && {p} - (k->OW - ow0) <= k->OW) {{\n"
        f"      const long last = oh0 + 1 == k->OH;\n"
        f"      split = k->OW - ow0;\n"
        f"      y2 = k->y + ((n0 + last) * k->yimg + (last ? 0 : oh0 + 1) * k->yrow) * k->ldy;\n"
        f"    }}\n"
        f"    if (nr == {p} && (whole || split < {p})) {{  /* full tile: blocks of valid channels end in registers */\n"
        f"      long mb = 0;\n"
        f"      for (; mb < mb1 - mb0 && (mb + 1) * {width} <= nc; mb++)\n"
        f"        cg_mkf_{name}(rows, k->tapoff, k->ntaps, k->cg, k->cstride, wp + mb * K * {width}, k->ops, k->rs,\n"
        f"                      y, y2, split, k->ldy, k->rbase + r0, c0 + mb * {width}{more});\n"
        f"      if (mb < mb1 - mb0) {{  /* the ragged last block: buffer and scalar epilogue */\n"
        f"        {mk}(rows, k->tapoff, k->ntaps, k->cg, k->cstride, wp + mb * K * {width}, buf, ldt{more});\n"
        f"        const long cr = c0 + mb * {width}, ncr = nc - mb * {width};\n"
        f"        if (whole) k->ep(k->ops, y, k->ldy, buf, ldt, k->rbase + r0, nr, cr, ncr);\n"
        f"        else cg_gemm_store_rows(k, buf, ldt, r0, nr, cr, ncr, n0, oh0, ow0);\n"
        f"      }}\n"
        f"      continue;\n"
        f"    }}\n"
    )
    head = (
        f"static void cg_mkf_{name}(const float* const* rows, const long* tapoff, long ntaps, long cg, long cs,\n"
        "    const float* w, const float* const* ops, const long* rs, float* y, float* y2, long split, long ldy,\n"
        "    long row0, long c"
        f"{AHEAD_ARGS if ahead else ''}{FETCH_ARGS if fetch_next else ''}) {{"
    )
    store = []
    for i in range(p):
        store.append(f"  {{ const long row = row0 + {i}; float* yr = ({i} < split ? y : y2) + row * ldy + c;")
        for j, kind in enumerate(fused.operands):
            store.append(f"    const float* b{j} = ops[{j}] + row * rs[{j}]{' + c' if kind == 'c' else ''};")
        for j in range(nv):
            store.append(f"    {{ const vf acc = a{i}_{j};")
            for o, kind in enumerate(fused.operands):
                load = f"*(const vfu*)(b{o} + {j} * VW)" if kind == "c" else f"b{o}[0]"
                store.append(f"      const {'vf' if kind == 'c' else 'float'} i{o} = {load};")
            store += fused.lines("      ")
            store.append(f"      *(vfu*)(yr + {j} * VW) = {fused.result}; }}")
        store.append("  }")
    # The residual and output rows are the tile's only reads from beyond L2: ask for their
    # cache lines so they arrive while the k-loop runs.  Spread (spread_prefetch): the
    # lines are listed before the loop, which asks for one per step.  Else all before it.
    if spread:
        # per-channel operands (row stride 0, a bias) are in L1 anyway
        streams = sum(1 for kind in fused.operands if kind == "c") + 1
        head += f"\n  const float* pf[{streams * p * nv + steps - 1}]; long npf = 0, pfi = 0;"
    head += f"\n  for (long o = 0; o < {nv} * VW; o += 16) {{"
    for i in range(p):
        for o, kind in enumerate(fused.operands):
            if kind == "c" and spread:
                head += f"\n    if (rs[{o}]) pf[npf++] = ops[{o}] + (row0 + {i}) * rs[{o}] + c + o;"
            elif kind == "c":
                head += f"\n    __builtin_prefetch(ops[{o}] + (row0 + {i}) * rs[{o}] + c + o);"
        out = f"({i} < split ? y : y2) + (row0 + {i}) * ldy + c + o"
        if spread:
            head += f"\n    pf[npf++] = {out};"
        else:
            head += f"\n    __builtin_prefetch({out}, 1);"
    head += "\n  }"
    if spread and steps > 1:  # a prefetching pass of the k-loop may ask for steps - 1 more
        head += f"\n  for (long q = 0; q < {steps - 1}; q++) pf[npf + q] = y;"
    kernel = _tile(nv, p, head, store, spread=spread, ahead=ahead, fetch_next=fetch_next, steps=steps)
    return kernel + "\n" + filled("ops/gemm_driver.c", NAME=name, FUSED=tile, **template)


# The register epilogue's residual and output lines are prefetched one per k-loop step where
# they outnumber a core's fill buffers (FILL_BUFFERS: Intel's cores have 10-16, AMD's Zen 2-4
# 22-24) and its k-loop has at least SPREAD_STEPS_PER_LINE steps per line of the tile's
# accumulators, else all before it.
# All before it, the 48 lines of an AVX-512 6 x 4 tile with a residual made the loop wait:
# resnet50's 64 -> 256 residual layers (K = 64) ran 10-12% slower so.  Spread over a short
# loop, the list costs more than it saves: squeezenet's 3-channel stem (K = 27) ran 1.15-1.3x
# as long so (AVX-512 Xeon, in-process A/B).  The 12 lines of an AVX2 3 x 4 tile, spread, ran
# those residual layers 4-6% slower on a Zen 3 (resnet50 1.01x).
SPREAD_STEPS_PER_LINE = 2
FILL_BUFFERS = 12


def spread_prefetch(streams: int, nv: int, p: int, vector: int, depth: int) -> bool:
    """Whether a ``P x NV`` register-epilogue tile spreads the prefetches of its ``streams``
    full-tensor rows (residuals and the output) over a k-loop of ``depth`` steps (the rule above).

    >>> spread_prefetch(streams=2, nv=4, p=6, vector=16, depth=64)  # AVX-512, resnet50's 64 -> 256
    True
    >>> spread_prefetch(streams=2, nv=4, p=3, vector=8, depth=64)   # AVX2: 12 lines, all at once
    False
    """
    lines = streams * p * -(-nv * vector // 16)  # 16 floats a cache line
    return lines > FILL_BUFFERS and depth >= SPREAD_STEPS_PER_LINE * p * nv


# Per tile, before its micro-kernels (gemm_driver.c's SETUP hole, ``ahead`` variants): the
# next tile's rows, when it has any.  The hardware prefetcher, seeing P streams advance a
# float per k-step, falls behind where the inputs outweigh the weights (resnet50's 256 -> 64
# 1x1 at 56x56 ran 0.80-0.82x as long with this, its 512 -> 128 at 28x28 0.92-0.95x).
AHEAD_SETUP = """    const long next = cg_min(${P}, R - r0 - ${P});  /* rows of the next tile */
    const char* ahead = (const char*)(x + (r0 + ${P}) * k->pstride);
    const long lines = next > 0 ? (next * k->cg * 4 + 63) / 64 : 0;
"""


def microkernel(nv: int, p: int, ahead: bool = False, fetch_next: bool = False, steps: int = 1) -> str:
    """The ``P x NV`` register-blocked tile ``cg_mk_<nv>_<p>``, storing to a buffer (with
    ``ahead``: ``cg_mk_<nv>_<p>_x``, prefetching ``lines`` cache lines from ``ahead`` on; with
    ``fetch_next``: ``..._w``, then ``wlines`` lines from ``wnext`` on into the L2)."""
    head = (
        f"static void cg_mk_{nv}_{p}{variant(ahead, fetch_next)}(const float* const* rows,\n"
        "    const long* tapoff, long ntaps, long cg, long cs, const float* w, float* tile, long ldt"
        f"{AHEAD_ARGS if ahead else ''}{FETCH_ARGS if fetch_next else ''}) {{"
    )
    store = [f"  *(vf*)(tile + {i} * ldt + {j} * VW) = a{i}_{j};" for i in range(p) for j in range(nv)]
    return _tile(nv, p, head, store, ahead=ahead, fetch_next=fetch_next, steps=steps)


# The next range's weights are not read before this range's tiles are done: into the L2
# (prefetcht1), not the L1 the tile's rows and current weights use.
FETCH_LOCALITY = 2

# Per tile, before its micro-kernels (gemm_driver.c's SETUP hole, ``_w`` variants): the share
# of the next range of channel blocks' weights (of this group or the next) this tile asks
# for, ``[wlo, whi)`` in cache lines; block ``mb`` of the tile asks for ``wstep`` of them from
# ``wlo + mb * wstep`` on (micro-kernels' ``wnext`` and ``wlines``, a negative count none).
# None where the thread pool dealt the next range's tasks to another thread (its first task
# is past this thread's share, ``cg_share_end``): it reads them into its own L2 then, and the
# lines fetched here would only take memory bandwidth from it (resnet50's 7x7 stage at 2
# threads, ranges split between the threads: 1.04-1.11x as long fetching regardless).
FETCH_SETUP = """    const long wfirst = grp * k->nmb + mb1;  /* the next range's first block */
    const int wmine = (gr + 1) * job->chunks < cg_share_end;  /* this thread runs the next range */
    const long wblocks =
      wmine && wfirst < k->groups * k->nmb ? cg_min(k->blocks_per_task, k->nmb - wfirst % k->nmb) : 0;
    const long wtotal = wblocks * K * ${NV} * VW / 16;  /* its cache lines */
    const char* const wnext = (const char*)(k->wp + wfirst * K * ${NV} * VW);
    const long wlo = wtotal * tile / ntiles, whi = wtotal * (tile + 1) / ntiles, wstep = K / 2;
"""


def _tile(
    nv: int, p: int, head: str, store: list[str], spread: bool = False, ahead: bool = False, fetch_next: bool = False,
    steps: int = 1,
) -> str:
    """A tile's function: ``head``, the k-loop, then ``store`` (the accumulators are ``a<i>_<j>``).

    With ``spread``, each of the first ``npf`` k-steps prefetches the next of the addresses
    ``head`` put in ``pf`` (for writing: the output's lines are among them); with ``ahead``,
    each of the next ``lines`` steps the next cache line from ``ahead`` on.

    Accumulators are named scalars of vector type (not arrays) so the compiler keeps them
    in registers; the loop body is written out rather than left to the unroller.  The steps
    that prefetch run in loops of their own, so no loop body branches: a branch in it cost
    AVX2 cores (16 vector registers) an accumulator spilled to the stack.  With ``fetch_next``,
    each of the next ``wlines`` steps the next line from ``wnext`` on (into the L2).

    With ``steps`` above 1 (:meth:`Blocking.k_steps`: tall tiles, whose row pointers outnumber
    the general registers), each pass of the loop runs that many k-steps, their weight vectors
    loaded first and then each row's multiply-adds in turn, and the last ``cg % steps`` steps
    one by one (channels a stride apart, a Gemm's transposed A, all one by one): the row
    pointers the compiler keeps on the stack or in vector registers are then fetched once per
    ``steps`` steps, not once per step.  Each accumulator adds the same products in the same
    order, so the results are the same bits.  A prefetching pass asks for ``steps`` lines; the
    last one's may run past its list (``pf`` has room for it).
    """
    accs = [f"a{i}_{j}" for i in range(p) for j in range(nv)]
    lines = [
        head,
        "  vf " + ", ".join(f"{a} = {{0}}" for a in accs) + ";",
    ]
    # (bound of the steps, the prefetch each asks for) per loop, in order; the last runs to cg
    loops: list[tuple[str, str]] = []
    if spread:
        loops.append(("ca", "__builtin_prefetch(pf[pfi++], 1);"))
    if ahead:
        loops.append(("cb", "__builtin_prefetch(ahead); ahead += 64;"))
    if fetch_next:
        loops.append(("cw", f"__builtin_prefetch(wnext, 0, {FETCH_LOCALITY}); wnext += 64;"))
    loops.append(("cg", ""))
    if spread or ahead or fetch_next:
        lines.append("  long s = 0;  /* k-steps run, across taps: the prefetches' clock */")
    lines.append("  for (long t = 0; t < ntaps; t++) {")
    lines += [f"    const float* r{i} = rows[{i}] + tapoff[t];" for i in range(p)]
    first = "npf" if spread else "0"
    if spread:
        lines.append("    const long ca = cg_min(cg, npf - s > 0 ? npf - s : 0);")
    if ahead:
        lines.append(f"    const long cb = cg_min(cg, {first} + lines - s > 0 ? {first} + lines - s : 0);")
        first += " + lines"
    if fetch_next:
        lines.append(f"    const long cw = cg_min(cg, {first} + wlines - s > 0 ? {first} + wlines - s : 0);")
    for stride in ("1", "cs"):
        lines.append("    if (cs == 1) {" if stride == "1" else "    } else {")
        lines.append("      long c = 0;")
        # the channel-strided path (a Gemm's transposed A, rare) one step a pass, in less code
        run = steps if stride == "1" else 1
        for bound, prefetch in loops:
            if run == 1:
                lines.append(f"      for (; c < {bound}; c++, w += {nv} * VW) {{")
            elif bound == "cg":
                lines.append(f"      for (; c + {run} <= cg; c += {run}, w += {run * nv} * VW) {{")
            else:
                lines.append(f"      for (; c < {bound} && c + {run} <= cg; c += {run}, w += {run * nv} * VW) {{")
            lines += _steps(nv, p, run, stride, prefetch)
            lines.append("      }")
        if run > 1:
            lines.append(f"      for (; c < cg; c++, w += {nv} * VW) {{")
            lines += _steps(nv, p, 1, stride, "")
            lines.append("      }")
    lines.append("    }")
    if spread or ahead or fetch_next:
        lines.append("    s += cg;")
    lines.append("  }")
    lines += store
    lines.append("}")
    return "\n".join(lines)


def _steps(nv: int, p: int, steps: int, stride: str, prefetch: str) -> list[str]:
    """One pass of a tile's k-loop: ``steps`` k-steps from ``c`` on (the channel stride
    ``stride``: ``1`` or ``cs``), their weights ``w<q>_<j>``, each step asking for ``prefetch``."""
    def index(q: int) -> str:
        if stride == "1":
            return f"c + {q}" if q else "c"
        return f"(c + {q}) * cs" if q else "c * cs"

    names = [[f"w{j}" if steps == 1 else f"w{q}_{j}" for j in range(nv)] for q in range(steps)]
    lines = [f"        const vf {names[q][j]} = *(const vf*)(w + {q * nv + j} * VW);"
             for q in range(steps) for j in range(nv)]
    lines += [f"        {prefetch}"] * (steps if prefetch else 0)
    for i in range(p):
        lines.append("        {" if steps > 1 else f"        {{ const float x = r{i}[{index(0)}];")
        for q in range(steps):
            if steps > 1:
                lines.append(f"          const float x{q} = r{i}[{index(q)}];")
            x = "x" if steps == 1 else f"x{q}"
            lines += [f"          a{i}_{j} += {x} * {names[q][j]};" for j in range(nv)]
        lines.append("        }")
    return lines
