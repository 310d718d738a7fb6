"""LSTM, GRU and RNN: the input projection on the GEMM engine, the recurrence in hand-written C.

NOTE: ``X W^T`` for every time step and both directions is one ``g.MatMul`` (X viewed as
``[seq * batch, input]``, the weights of all directions side by side, the biases folded into
its epilogue); the recurrence (``rnn.c``) then adds ``h_prev R^T`` per step, against R
packed at compile time in blocks of hidden units (``_pack``: a block's columns are all its
units' gates, summed in registers), and applies the gates with the backend's
``cg_sigmoid``/``cg_tanh``.  Where the sequences (direction, batch row) are fewer than the
kernel's threads (:func:`steps_shared_out`), each step is a parallel loop of a task per
(direction, block); otherwise a task per sequence walks its steps in order (its R may stay in
its core's L2).  The kernel writes one buffer ``[seq + states, dirs, batch, hidden]``: Y, then
Y_h and Y_c when they are used, taken apart by slices (a graph op has one output).

Taken: ``layout=0``, every direction, the default activations, ``clip``, ``sequence_lens``
absent, constant or computed (each batch row walks its own length, backwards within it in
reverse; Y is 0 past it and Y_h is the state at its end, as onnxruntime computes them; a
length outside ``[0, seq]`` at run time sends the call to the host, which reports it), initial
states absent, constant or computed; LSTM with constant peepholes; GRU with either
``linear_before_reset``.  Declined: ``input_forget=1``, other activations, ``layout=1``,
W/R/B/P not constant.

onnxruntime's com.microsoft DynamicQuantizeLSTM (8-bit W and R) is its own kernel
(``qlstm.c``, :class:`QuantRecurrence`), bit for bit onnxruntime's: X quantized at once and
multiplied on 8-bit products (``quantize.py``'s QuantRange and QuantMatMul), then per step
h_prev quantized on its own range, its int32 sums with R scaled and added, the gates with
MLAS's sigmoid and tanh.  One batch row, or 2-4 of a hidden size above 256 (below, ``_batch_reason``).

Example (gates per cell: LSTM i, o, f, c; GRU z, r, h; RNN one)::

    >>> gate_count("LSTM"), gate_count("GRU"), gate_count("RNN")
    (4, 3, 1)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from codegraft.backends.c import _graph as g
from codegraft.backends.c._c_files import c_file, filled
from codegraft.backends.c._emit import Context
from codegraft.backends.c._fuse import Kernel
from codegraft.backends.c._lowerer import Lowerer, LoweringError
from codegraft.backends.c._node import attr_float, attr_int, attr_str, is_constant, present, rank_of
from codegraft.backends.c.ops._qpack import define_q8, vnni_build
from codegraft.backends.c.ops._spec import KernelOp, Layout, OnnxOp, core_of
from codegraft.backends.c.ops.data import slice_op
from codegraft.backends.c.ops.elementwise import c_float
from codegraft.backends.c.ops.quantize import (
    QGEMM_COLS,
    QuantMatMul,
    QuantRange,
    as_weight_bytes,
    int8_columns,
    qgemm_packed,
)
from codegraft.core.attributes import attributes_of

_DEFAULT_ACTIVATIONS = {"LSTM": ("sigmoid", "tanh", "tanh"), "GRU": ("sigmoid", "tanh"), "RNN": ("tanh",)}
_DIRECTIONS = {"forward": (False,), "reverse": (True,), "bidirectional": (False, True)}


def gate_count(cell: str) -> int:
    return {"LSTM": 4, "GRU": 3}.get(cell, 1)


@dataclass(eq=False)
class _Cells(g.Op):
    """What every recurrence kernel shares: its sizes, directions, peepholes and clip, which
    initial states it reads and where it writes Y_h and Y_c (``out``'s rows; -1: not written)."""

    seq: int = 1
    batch: int = 1
    hidden: int = 1
    reverse: tuple[bool, ...] = (False,)
    peepholes: np.ndarray | None = None
    clip: float | None = None
    has_h0: bool = False
    has_c0: bool = False
    h_row: int = -1
    c_row: int = -1


@dataclass(eq=False)
class Recurrence(_Cells):
    """The recurrence of an LSTM, GRU or RNN over a precomputed input projection.

    ``inputs``: the projection ``[seq * batch, dirs * gates * hidden]``, then the initial
    ``h`` and (LSTM) ``c`` when given (``has_h0``/``has_c0``), then the computed sequence
    lengths ``[batch]`` (``has_lens``; constant ones are ``lens``).  ``out``: ``[rows, dirs, batch,
    hidden]``, Y in the first ``seq`` rows, Y_h in row ``h_row`` and Y_c in ``c_row`` (-1: not
    written).  ``r``: R, ``[dirs, gates * hidden, hidden]`` (packed for the vector width when
    emitted).  ``peepholes``: an LSTM's P, ``[dirs, 3 * hidden]`` (i, o, f).
    """

    cell: str = "LSTM"
    r: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    rbh: np.ndarray | None = None  # GRU with linear_before_reset: Rb of the h gate, [dirs, hidden]
    has_lens: bool = False
    lens: np.ndarray | None = None  # constant sequence lengths, [batch]

    def checks_at_run_time(self) -> bool:
        return self.has_lens  # a computed length out of range hands the call to the host


def _used(node: ir.Node, index: int) -> bool:
    if index >= len(node.outputs):
        return False
    value = node.outputs[index]
    return bool(value.name) and (bool(value.uses()) or value.is_graph_output())


def check_rnn(node: ir.Node) -> str:
    return _check_cell(node, node.op_type)


def _check_cell(node: ir.Node, cell: str) -> str:
    if attr_int(node, "layout", 0) != 0:
        return "layout=1 (batch first) is not supported"
    direction = attr_str(node, "direction", "forward")
    if direction not in _DIRECTIONS:
        return f"direction={direction} is not supported"
    activations = attributes_of(node).get("activations")
    if activations is not None:
        names = tuple(a.lower() for a in activations.as_strings())
        if names != _DEFAULT_ACTIVATIONS[cell] * len(_DIRECTIONS[direction]):
            return f"activations {list(names)} are not supported (only the defaults)"
    if cell == "LSTM":
        if attr_int(node, "input_forget", 0) != 0:
            return "input_forget=1 is not supported"
    for index, what in ((1, "W"), (2, "R"), (3, "B"), (7, "P")):
        value = present(node, index) if index < 7 or cell == "LSTM" else None
        if (value is not None or index < 3) and not is_constant(value):
            return f"{what} must be a constant initializer"
    lens = present(node, 4)
    if lens is not None and is_constant(lens):
        seq = None if node.inputs[0] is None or node.inputs[0].shape is None else node.inputs[0].shape[0]
        values = np.asarray(lens.const_value.numpy()) if lens.const_value is not None else np.zeros(0)
        if isinstance(seq, int) and (np.any(values > seq) or np.any(values < 0)):
            return f"sequence_lens {values.tolist()} do not fit {seq} steps"
    return ""


def _rnn(lw: Lowerer, node: ir.Node) -> None:
    cell = node.op_type
    gates = gate_count(cell)
    x = lw.tensor(node.inputs[0])
    if len(x.shape) != 3:
        raise LoweringError(f"X must be [seq, batch, input], got {x.shape}")
    seq, batch, width = x.shape
    w = lw.known(present(node, 1), "W").astype(np.float32)
    r = lw.known(present(node, 2), "R").astype(np.float32)
    reverse = _DIRECTIONS[attr_str(node, "direction", "forward")]
    dirs = len(reverse)
    hidden = r.shape[-1]
    gh = gates * hidden
    if w.shape != (dirs, gh, width) or r.shape != (dirs, gh, hidden):
        raise LoweringError(f"W {w.shape} / R {r.shape} do not fit X {x.shape} and {dirs} direction(s)")
    lens_value = present(node, 4)
    lens = None if lens_value is None else lw.tensor(lens_value)
    if lens is not None and lens.shape != (batch,):
        raise LoweringError(f"sequence_lens is {lens.shape}, expected ({batch},)")
    known_lens = None if lens is None or lens.const is None else np.asarray(lens.const, np.float32)
    if known_lens is not None and (np.any(known_lens > seq) or np.any(known_lens < 0)):
        raise LoweringError(f"sequence_lens {known_lens.tolist()} do not fit {seq} steps")
    if known_lens is not None and np.all(known_lens == seq):
        known_lens = None  # every row walks the whole sequence
    linear_before_reset = cell == "GRU" and attr_int(node, "linear_before_reset", 0) != 0
    b_value = present(node, 3)
    rbh = None
    bias = np.zeros((dirs, gh), np.float32)
    if b_value is not None:
        b = lw.known(b_value, "B").astype(np.float32).reshape(dirs, 2 * gh)
        wb, rb = b[:, :gh], b[:, gh:].copy()
        if linear_before_reset:  # Rb of the h gate is added to h_prev R_h^T, inside r * (...)
            rbh = rb[:, 2 * hidden :].copy()
            rb[:, 2 * hidden :] = 0.0
        bias = wb + rb
    if linear_before_reset and rbh is None:
        rbh = np.zeros((dirs, hidden), np.float32)
    p_value = present(node, 7) if cell == "LSTM" else None
    peepholes = None if p_value is None else lw.known(p_value, "P").astype(np.float32).reshape(dirs, 3 * hidden)

    # Input projection of every step and direction: [seq * batch, input] @ [input, dirs * gh] + bias.
    proj = lw.new((seq * batch, dirs * gh), "xproj")
    lw.ops.append(g.MatMul([lw.view(x, (seq * batch, width)), lw.const(w.reshape(dirs * gh, width).T.copy())], proj))
    if b_value is not None and np.any(bias != 0):
        proj = lw.elementwise("add", [proj, lw.const(bias.reshape(dirs * gh))])

    inputs = [proj]
    h0, c0 = present(node, 5), present(node, 6) if cell == "LSTM" else None
    for value in (h0, c0):
        if value is not None:
            state = lw.tensor(value)
            if state.shape != (dirs, batch, hidden):
                raise LoweringError(f"an initial state is {state.shape}, expected {(dirs, batch, hidden)}")
            inputs.append(state)
    computed_lens = lens is not None and lens.const is None
    if computed_lens:
        assert lens is not None
        inputs.append(lens)
    want_h, want_c = _used(node, 1), cell == "LSTM" and _used(node, 2)
    h_row = seq if want_h else -1
    c_row = seq + int(want_h) if want_c else -1
    rows = seq + int(want_h) + int(want_c)
    out = lw.new((rows, dirs, batch, hidden), "rnn")
    lw.ops.append(Recurrence(
        inputs, out, cell=cell, seq=seq, batch=batch, hidden=hidden, reverse=reverse, r=r, rbh=rbh,
        peepholes=peepholes,
        clip=attr_float(node, "clip", 0.0) if "clip" in attributes_of(node) else None,
        has_h0=h0 is not None, has_c0=c0 is not None, h_row=h_row, c_row=c_row, has_lens=computed_lens,
        lens=known_lens,
    ))  # fmt: skip
    if _used(node, 0):
        lw.bind(node.outputs[0], out if rows == seq else slice_op(lw, out, {0: (0, seq, 1)}))
    for row, index in ((h_row, 1), (c_row, 2)):
        if row >= 0:
            lw.bind(node.outputs[index], lw.view(slice_op(lw, out, {0: (row, row + 1, 1)}), (dirs, batch, hidden)))


def float_units(vector_floats: int) -> int:
    """Hidden units a float recurrence task (``rnn.c``) takes: two vectors of each gate's columns,
    so an LSTM's sums are 8 chains of FMAs, at least 16 units.

    >>> float_units(8), float_units(16), float_units(4)
    (16, 32, 16)
    """
    return max(16, 2 * vector_floats)


def steps_shared_out(sequences: int, threads: int) -> bool:
    """Whether a recurrence runs a parallel loop per step (tasks of hidden units) rather than a
    task per sequence walking all its steps (float: a direction and batch row; quantized: a
    direction, its rows quantized together): where there are
    fewer sequences than threads, or too few to share out evenly.  One thread walks each sequence
    whole (its R read every step may stay in the L2; interleaving a bidirectional layer's two
    directions every step made pyannote's LSTMs 5-13% slower).

    >>> steps_shared_out(1, 2), steps_shared_out(2, 2), steps_shared_out(2, 1), steps_shared_out(3, 2)
    (True, False, False, True)
    """
    return threads > 1 and sequences % threads != 0 and sequences < 4 * threads


def _pack(r: np.ndarray, cell: str, hidden: int, units: int, linear_before_reset: bool) -> np.ndarray:
    """One direction's R ``[gates * hidden, hidden]`` as ``rnn.c`` reads it: per block of
    ``units`` hidden units, ``[k][gate][unit]`` = ``R[gate * hidden + unit][k]`` (zero past
    ``hidden``); a GRU without ``linear_before_reset``: the z and r gates' ``[k][2][unit]``,
    then the h gate's ``[k][unit]`` (its sums read r * h_prev, not h_prev).

    >>> r = np.arange(4, dtype=np.float32).reshape(4, 1)  # an LSTM of one hidden unit: R[gate][k]
    >>> _pack(r, "LSTM", 1, 2, False).tolist()  # one block of 2 units ([k][gate][unit]), the second past H
    [0.0, 0.0, 1.0, 0.0, 2.0, 0.0, 3.0, 0.0]
    """
    gates, blocks = gate_count(cell), unit_blocks(hidden, units)
    padded = np.zeros((gates, blocks * units, hidden), np.float32)
    padded[:, :hidden] = r.reshape(gates, hidden, hidden)
    per_block = padded.reshape(gates, blocks, units, hidden).transpose(1, 3, 0, 2)  # [block][k][gate][unit]
    if cell == "GRU" and not linear_before_reset:
        zr, h = per_block[:, :, :2].reshape(blocks, -1), per_block[:, :, 2:].reshape(blocks, -1)
        return np.concatenate([zr, h], axis=1).reshape(-1)
    return np.ascontiguousarray(per_block).reshape(-1)


def emit_rnn(ctx: Context, kernel: Kernel) -> None:
    op = core_of(kernel, Recurrence)
    gates = gate_count(op.cell)
    gh = gates * op.hidden
    dirs = len(op.reverse)
    units = float_units(ctx.target.vector_floats)
    hp = -(-op.hidden // 16) * 16
    name = ctx.name("rnn")
    ctx.functions.append(filled(
        "ops/rnn.c", name=name, cell=op.cell, lstm=int(op.cell == "LSTM"), rnn=int(op.cell == "RNN"),
        lbr=int(op.rbh is not None), peep=int(op.peepholes is not None),
        dirs=dirs, batch=op.batch, seq=op.seq, H=op.hidden, GH=gh, h_row=op.h_row, c_row=op.c_row,
        has_clip=int(op.clip is not None), clip=c_float(op.clip or 0.0), U=units, GU=gates * units,
        NV=gates * units // ctx.target.vector_floats, blocks=unit_blocks(op.hidden, units), Hp=hp,
        per_step=int(steps_shared_out(dirs * op.batch, ctx.op_threads)),
        reverse_mask=sum(1 << d for d, back in enumerate(op.reverse) if back), check_lens=int(op.has_lens),
    ))  # fmt: skip
    states = iter(op.inputs[1:])
    h0 = ctx.ptr(next(states)) if op.has_h0 else "(const float*)0"
    c0 = ctx.ptr(next(states)) if op.has_c0 else "(const float*)0"
    lens = ctx.ptr(next(states)) if op.has_lens else ctx.weight(op.lens) if op.lens is not None else "(const float*)0"
    # GRU: Rb of the h gate; LSTM: the peepholes (one per cell: the kernel's "extra" weights)
    extra = op.rbh if op.rbh is not None else op.peepholes
    extra_ptr = ctx.weight(extra) if extra is not None else "(const float*)0"
    rt = np.concatenate([_pack(op.r[d], op.cell, op.hidden, units, op.rbh is not None) for d in range(dirs)])
    ctx.body.append(
        f"  {name}({ctx.ptr(op.inputs[0])}, {h0}, {c0}, {ctx.weight(rt)}, {extra_ptr}, {lens}, {ctx.ptr(op.out)}, "
        f"{ctx.temp(dirs * op.batch * 4 * hp)});"
    )


def recurrence_loops(op: Recurrence) -> int:
    """Parallel loops the recurrence runs: one a step, two for a GRU without linear_before_reset."""
    return op.seq * (2 if op.cell == "GRU" and op.rbh is None else 1)


def recurrence_flops(op: Recurrence) -> float:
    """Multiply-adds of ``h_prev R^T`` and the gate math, every step, direction and batch row."""
    gh = gate_count(op.cell) * op.hidden
    return float(op.seq * op.batch * len(op.reverse) * (2 * gh * op.hidden + 30 * op.hidden))


# -- DynamicQuantizeLSTM (com.microsoft) -----------------------------------------------------------
# onnxruntime's LSTM on 8-bit weights (quantize_dynamic's form of an LSTM): W [dirs, input, 4H]
# and R [dirs, H, 4H] int8 or uint8 (transposed against ONNX's LSTM), a scale and a zero point
# per direction ([dirs]) or per column ([dirs, 4H]), inputs 8-11.  onnxruntime quantizes X
# (its first max(sequence_lens) steps, all rows at once) and, at every step, h_prev, each on its
# own range as DynamicQuantizeLinear does, sums the 8-bit products in int32 and scales the sums
# by (activation scale * weight scale).  Here: X as DynamicQuantizeLinear -> QuantMatMul -> Mul
# by the scales (ops/quantize.py), the recurrence in ``qlstm.c`` (QuantRecurrence).  The batch:
# onnxruntime quantizes h_prev over the rows each of its threads takes (uni_directional_lstm.cc's
# batch_parallel_: more than 4 rows, or 2-4 of a hidden size up to 256, split among its threads),
# so there its result depends on its thread count; one row, or 2-4 rows of a larger hidden size
# (quantized together, every step) are taken.

_EIGHT_BITS = frozenset({ir.DataType.INT8, ir.DataType.UINT8})


def _batch_reason(batch: int, hidden: int, lens: bool) -> str:
    """``""`` where onnxruntime quantizes h_prev over all ``batch`` rows at once, else why not."""
    if batch == 1:
        return ""
    if batch > 4 or hidden <= 256:
        return (f"batch {batch} of hidden size {hidden}: onnxruntime splits its rows among its threads "
                "and quantizes h over each thread's rows, so its result depends on its thread count")  # fmt: skip
    return f"batch {batch} with sequence_lens is not supported (only one row)" if lens else ""


@dataclass(eq=False)
class QuantRecurrence(_Cells):
    """DynamicQuantizeLSTM's recurrence over its input projection.

    ``inputs``: the projection ``[len * batch, dirs * 4 * hidden]`` (float(int32 sum) *
    scales), then the initial ``h`` and ``c`` when given.  ``out``: ``[rows, dirs, batch,
    hidden]`` as :class:`Recurrence` writes it.  ``r``: per direction, R less its zero point as int8
    ``[hidden, 4 * hidden]`` (``offset``: int32 per column added back, or ``None``);
    ``rscale``: R's scale per column ``[dirs, 4 * hidden]``; ``bias``: Wb + Rb ``[dirs, 4 *
    hidden]``; ``peepholes``: ``[dirs, 3 * hidden]``; ``batch``: the rows quantized together at
    each step.
    """

    steps: int = 1  # the steps walked (a constant sequence length), Y is 0 past them
    r: tuple[np.ndarray, ...] = ()
    offset: np.ndarray | None = None
    rscale: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    bias: np.ndarray | None = None


def _per_direction(node: ir.Node, index: int, dirs: int, hidden: int, what: str) -> str:
    value = present(node, index)
    if not is_constant(value):
        return f"{what} must be a constant initializer"
    assert value is not None and value.shape is not None
    if tuple(value.shape) not in ((dirs,), (dirs, 4 * hidden)):
        return f"{what} has shape {list(value.shape)}, expected [{dirs}] or [{dirs}, {4 * hidden}]"
    return ""


def check_dynamic_quantize_lstm(node: ir.Node) -> str:
    reason = _check_cell(node, "LSTM")
    if reason:
        return reason
    x = node.inputs[0]
    batch = None if x is None or x.shape is None or len(x.shape) != 3 else x.shape[1]
    dirs = len(_DIRECTIONS[attr_str(node, "direction", "forward")])
    for index, what in ((1, "W"), (2, "R")):
        value = node.inputs[index]
        if value is None or value.dtype not in _EIGHT_BITS or rank_of(value) != 3:
            return f"{what} must be an int8 or uint8 tensor of rank 3"
    r_value = node.inputs[2]
    assert r_value is not None and r_value.const_value is not None
    hidden = int(r_value.const_value.numpy().shape[1])
    if isinstance(batch, int):
        reason = _batch_reason(batch, hidden, present(node, 4) is not None)
        if reason:
            return reason
    for index, what in ((8, "W's scale"), (9, "W's zero point"), (10, "R's scale"), (11, "R's zero point")):
        reason = _per_direction(node, index, dirs, hidden, what)
        if reason:
            return reason
    for weight, zero, what in ((1, 9, "W"), (2, 11, "R")):
        value, zero_value = node.inputs[weight], node.inputs[zero]
        assert value is not None and zero_value is not None and zero_value.const_value is not None
        if zero_value.dtype != value.dtype:
            return f"{what}'s zero point is not of {what}'s type"
        zp = zero_value.const_value.numpy()
        # (onnxruntime refuses these; it reads one zero point per direction)
        if zp.ndim == 2 and value.dtype == ir.DataType.INT8 and zp.any():
            return f"{what}'s zero points per column must be 0 for int8 weights"
        if zp.ndim == 2 and np.any(zp != zp.reshape(-1)[0]):
            return f"{what}'s zero points per column must all be equal"
    lens = present(node, 4)
    if lens is not None:
        if not is_constant(lens):
            return "sequence_lens must be a constant (the steps X's quantization spans)"
        assert lens.const_value is not None
        values = lens.const_value.numpy().reshape(-1)
        seq = None if x is None or x.shape is None else x.shape[0]
        if values.size != 1 or values[0] < 1 or (isinstance(seq, int) and values[0] > seq):
            return f"sequence_lens {values.tolist()} is not one length within the sequence"
    return ""


def _less_zero_point(weight: np.ndarray, zero: np.ndarray, direction: int) -> np.ndarray:
    """One direction's 8-bit weight ``[K, N]`` as int32 less its zero point (onnxruntime
    reads the direction's first one: they are all equal, or the check declined the node)."""
    return weight[direction].astype(np.int32) - int(zero.reshape(zero.shape[0], -1)[direction, 0])


def _dynamic_quantize_lstm(lw: Lowerer, node: ir.Node) -> None:
    x = lw.tensor(node.inputs[0])
    if len(x.shape) != 3:
        raise LoweringError(f"X must be [seq, batch, input], got {x.shape}")
    seq, batch, width = x.shape
    reverse = _DIRECTIONS[attr_str(node, "direction", "forward")]
    dirs = len(reverse)
    w, r = lw.known(node.inputs[1], "W"), lw.known(node.inputs[2], "R")
    hidden = r.shape[1]
    gh = 4 * hidden
    if w.shape != (dirs, width, gh) or r.shape != (dirs, hidden, gh):
        raise LoweringError(f"W {w.shape} / R {r.shape} do not fit X {x.shape} and {dirs} direction(s)")
    reason = _batch_reason(batch, hidden, present(node, 4) is not None)
    if reason:
        raise LoweringError(reason)
    scales = [lw.known(node.inputs[i], what).astype(np.float32) for i, what in ((8, "W's scale"), (10, "R's scale"))]
    zeros = [lw.known(node.inputs[i], what) for i, what in ((9, "W's zero point"), (11, "R's zero point"))]
    wscale, rscale = (np.broadcast_to(s.reshape(dirs, -1), (dirs, gh)).astype(np.float32) for s in scales)
    steps = seq
    lens_value = present(node, 4)
    if lens_value is not None:
        steps = int(lw.known(lens_value, "sequence_lens").reshape(-1)[0])
        if not 1 <= steps <= seq:
            raise LoweringError(f"sequence_lens {steps} does not fit {seq} steps")

    # X's first ``steps`` rows quantized at once, their 8-bit products with W summed in int32
    rows = lw.view(x if steps == seq else slice_op(lw, x, {0: (0, steps, 1)}), (steps * batch, width))
    params = lw.new((2,), "qparams")
    lw.ops.append(QuantRange([rows], params))
    scale = lw.view(slice_op(lw, params, {0: (0, 1, 1)}), ())
    zero_point = lw.view(slice_op(lw, params, {0: (1, 2, 1)}), ())
    quantized = lw.elementwise("quantize_u8", [rows, scale, zero_point])
    found = int8_columns(np.concatenate([_less_zero_point(w, zeros[0], d) for d in range(dirs)], axis=1))
    if found is None:
        raise LoweringError("W less its zero point does not fit 8 bits")
    sums = lw.new((steps * batch, dirs * gh), "xsums")
    lw.ops.append(QuantMatMul([quantized, zero_point], sums, weight=found[0], offset=found[1]))
    # float(sum) * (x scale * W scale): the scales' product first, as onnxruntime's output processor
    multiplier = lw.elementwise("mul", [scale, lw.const(wscale.reshape(-1))])
    proj = lw.elementwise("mul", [sums, multiplier])

    packed, offsets = [], []
    for d in range(dirs):
        found = int8_columns(_less_zero_point(r, zeros[1], d))
        if found is None:
            raise LoweringError("R less its zero point does not fit 8 bits")
        packed.append(found[0])
        offsets.append(found[1])
    b_value = present(node, 3)
    bias = None
    if b_value is not None:
        b = lw.known(b_value, "B").astype(np.float32).reshape(dirs, 2 * gh)
        bias = b[:, :gh] + b[:, gh:]  # Wb + Rb in float32, added to the gates after the products
    p_value = present(node, 7)
    peepholes = None if p_value is None else lw.known(p_value, "P").astype(np.float32).reshape(dirs, 3 * hidden)
    inputs = [proj]
    h0, c0 = present(node, 5), present(node, 6)
    for value in (h0, c0):
        if value is not None:
            state = lw.tensor(value)
            if state.shape != (dirs, batch, hidden):
                raise LoweringError(f"an initial state is {state.shape}, expected {(dirs, batch, hidden)}")
            inputs.append(state)
    want_h, want_c = _used(node, 1), _used(node, 2)
    h_row = seq if want_h else -1
    c_row = seq + int(want_h) if want_c else -1
    out_rows = seq + int(want_h) + int(want_c)
    out = lw.new((out_rows, dirs, batch, hidden), "qlstm")
    offset = np.stack(offsets)
    lw.ops.append(QuantRecurrence(
        inputs, out, seq=seq, steps=steps, batch=batch, hidden=hidden, reverse=reverse, r=tuple(packed),
        offset=offset if offset.any() else None, rscale=rscale, bias=bias, peepholes=peepholes,
        clip=attr_float(node, "clip", 0.0) if "clip" in attributes_of(node) else None,
        has_h0=h0 is not None, has_c0=c0 is not None, h_row=h_row, c_row=c_row,
    ))  # fmt: skip
    if _used(node, 0):
        lw.bind(node.outputs[0], out if out_rows == seq else slice_op(lw, out, {0: (0, seq, 1)}))
    for row, index in ((h_row, 1), (c_row, 2)):
        if row >= 0:
            lw.bind(node.outputs[index], lw.view(slice_op(lw, out, {0: (row, row + 1, 1)}), (dirs, batch, hidden)))


UNITS_PER_BLOCK = QGEMM_COLS // 4  # hidden units a qlstm.c task takes: their four gates fill one block


def unit_blocks(hidden: int, units: int = UNITS_PER_BLOCK) -> int:
    """A recurrence's parallel units per direction and step: blocks of ``units`` hidden units
    (the quantized one's: 16).

    >>> unit_blocks(768), unit_blocks(20), unit_blocks(400, 32)
    (48, 2, 13)
    """
    return -(-hidden // units)


def by_unit_blocks(r: np.ndarray, hidden: int) -> np.ndarray:
    """One direction's R ``[K, 4 * hidden]`` (gates i, o, f, c side by side) with its columns in
    blocks of 16 units: block ``j`` holds the four gates of units ``16j..16j+15`` (zero past
    ``hidden``), so a task's 64 columns are all the sums its units' gates need.

    >>> by_unit_blocks(np.arange(8, dtype=np.int8).reshape(1, 8), hidden=2)[0, [0, 1, 16, 17, 32, 48, 49]]
    array([0, 1, 2, 3, 4, 6, 7], dtype=int8)
    """
    blocks, depth = unit_blocks(hidden), r.shape[0]
    padded = np.zeros((depth, 4, blocks * UNITS_PER_BLOCK), r.dtype)
    padded[:, :, :hidden] = r.reshape(depth, 4, hidden)
    return padded.reshape(depth, 4, blocks, UNITS_PER_BLOCK).transpose(0, 2, 1, 3).reshape(depth, -1)


def emit_quant_rnn(ctx: Context, kernel: Kernel) -> None:
    op = core_of(kernel, QuantRecurrence)
    hidden, dirs = op.hidden, len(op.reverse)
    gh = 4 * hidden
    k4, blocks = -(-hidden // 4) * 4, unit_blocks(hidden)
    hp, ghp = -(-op.batch * hidden // 16) * 16, -(-gh // 16) * 16
    # per direction: h and c of every row, every row's bytes of h (K4 each) and their nibbles
    # (AVX2), then (a task per direction) every row's int32 sums, 64-byte apart
    hq_floats = -(-3 * op.batch * k4 // 64) * 16
    scratch = 2 * hp + hq_floats + op.batch * blocks * QGEMM_COLS
    ctx.define_once("cg_quant_range", lambda: c_file("ops/quantize.c"))
    define_q8(ctx)
    name = ctx.name("qlstm")
    ctx.functions.append(filled(
        "ops/qlstm.c", name=name, dirs=dirs, seq=op.seq, len=op.steps, B=op.batch, H=hidden, GH=gh, Hp=hp,
        GHp=ghp, K4=k4, blocks=blocks, h_row=op.h_row, c_row=op.c_row, has_bias=int(op.bias is not None),
        has_clip=int(op.clip is not None), clip=c_float(op.clip or 0.0), peep=int(op.peepholes is not None),
        scratch=scratch, hq_floats=hq_floats, reverse_mask=sum(1 << d for d, back in enumerate(op.reverse) if back),
        per_step=int(steps_shared_out(dirs, ctx.op_threads)),  # the batch rows are quantized together
        groups=int(not vnni_build(ctx.target.features)),
    ))  # fmt: skip
    states = iter(op.inputs[1:])
    h0 = ctx.ptr(next(states)) if op.has_h0 else "(const float*)0"
    c0 = ctx.ptr(next(states)) if op.has_c0 else "(const float*)0"
    r = as_weight_bytes(ctx, np.stack([qgemm_packed(by_unit_blocks(m, hidden), ctx.target.features) for m in op.r]))
    colsum = as_weight_bytes(ctx, np.stack([m.sum(axis=0, dtype=np.int64).astype(np.int32) for m in op.r]))
    offset = f"(const int32_t*){as_weight_bytes(ctx, op.offset.astype(np.int32))}" if op.offset is not None else "0"
    bias = ctx.weight(op.bias) if op.bias is not None else "(const float*)0"
    peep = ctx.weight(op.peepholes) if op.peepholes is not None else "(const float*)0"
    ctx.body.append(
        f"  {name}({ctx.ptr(op.inputs[0])}, {h0}, {c0}, (const int8_t*){r}, (const int32_t*){colsum}, {offset}, "
        f"{ctx.weight(op.rscale)}, {bias}, {peep}, {ctx.ptr(op.out)}, {ctx.temp(dirs * scratch)});"
    )


def quant_recurrence_flops(op: QuantRecurrence) -> float:
    """Products of ``h_prev R`` (8-bit, four to a float FMA's one) and the gate math, every step and direction."""
    gh = 4 * op.hidden
    return float(op.steps * op.batch * len(op.reverse) * (0.5 * gh * op.hidden + 60 * op.hidden))


ONNX = (
    # (sequence_lens, int32, reaches the kernel as exact floats)
    OnnxOp("LSTM", _rnn, check_rnn, converted=frozenset({4})),
    OnnxOp("GRU", _rnn, check_rnn, converted=frozenset({4})),
    OnnxOp("RNN", _rnn, check_rnn, converted=frozenset({4})),
    # (W, R, their scales and zero points and sequence_lens are read at compile time)
    OnnxOp("DynamicQuantizeLSTM", _dynamic_quantize_lstm, check_dynamic_quantize_lstm,
           non_data=frozenset({1, 2, 4, 8, 9, 10, 11}), contrib=True),
)

KERNELS = (KernelOp(Recurrence, Layout.PLAIN, emit_rnn), KernelOp(QuantRecurrence, Layout.PLAIN, emit_quant_rnn))
