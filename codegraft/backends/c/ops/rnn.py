"""LSTM, GRU and RNN: the input projection on the GEMM engine, the recurrence in hand-written C.

NOTE: ``X W^T`` for every time step and both directions is one ``g.MatMul`` (X viewed as
``[seq * batch, input]``, the weights of all directions side by side, the biases folded into
its epilogue); the recurrence (``rnn.c``) then adds ``h_prev R^T`` per step, against R
packed transposed at compile time, and applies the gates with the backend's
``cg_sigmoid``/``cg_tanh``.  One task per (direction, batch row): they are independent and
each walks its steps in order.  The kernel writes one buffer ``[seq + states, dirs, batch,
hidden]``: Y, then Y_h and Y_c when they are used, taken apart by slices (a graph op has one
output).

Taken: ``layout=0``, every direction, the default activations, ``clip``, ``sequence_lens``
absent, constant or computed (each batch row walks its own length, backwards within it in
reverse; Y is 0 past it and Y_h is the state at its end, as onnxruntime computes them; a
length outside ``[0, seq]`` at run time sends the call to the host, which reports it), initial
states absent, constant or computed; LSTM with constant peepholes; GRU with either
``linear_before_reset``.  Declined: ``input_forget=1``, other activations, ``layout=1``,
W/R/B/P not constant.

Example (gates per cell: LSTM i, o, f, c; GRU z, r, h; RNN one)::

    >>> gate_count("LSTM"), gate_count("GRU"), gate_count("RNN")
    (4, 3, 1)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from codegraft.backends.c import _graph as g
from codegraft.backends.c._c_files import filled
from codegraft.backends.c._emit import Context
from codegraft.backends.c._fuse import Kernel
from codegraft.backends.c._lowerer import Lowerer, LoweringError
from codegraft.backends.c._node import attr_float, attr_int, attr_str, is_constant, present
from codegraft.backends.c.ops._spec import KernelOp, Layout, OnnxOp, core_of
from codegraft.backends.c.ops.data import slice_op
from codegraft.backends.c.ops.elementwise import c_float
from codegraft.core.attributes import attributes_of

_DEFAULT_ACTIVATIONS = {"LSTM": ("sigmoid", "tanh", "tanh"), "GRU": ("sigmoid", "tanh"), "RNN": ("tanh",)}
_DIRECTIONS = {"forward": (False,), "reverse": (True,), "bidirectional": (False, True)}


def gate_count(cell: str) -> int:
    return {"LSTM": 4, "GRU": 3}.get(cell, 1)


@dataclass(eq=False)
class Recurrence(g.Op):
    """The recurrence of an LSTM, GRU or RNN over a precomputed input projection.

    ``inputs``: the projection ``[seq * batch, dirs * gates * hidden]``, then the initial
    ``h`` and (LSTM) ``c`` when given (``has_h0``/``has_c0``), then the computed sequence
    lengths ``[batch]`` (``has_lens``; constant ones are ``lens``).  ``out``: ``[rows, dirs, batch,
    hidden]``, Y in the first ``seq`` rows, Y_h in row ``h_row`` and Y_c in ``c_row`` (-1: not
    written).  ``rt``: R per direction, transposed (GRU: z and r gates, then h).  ``peepholes``:
    an LSTM's P, ``[dirs, 3 * hidden]`` (i, o, f).
    """

    cell: str = "LSTM"
    seq: int = 1
    batch: int = 1
    hidden: int = 1
    reverse: tuple[bool, ...] = (False,)
    rt: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    rbh: np.ndarray | None = None  # GRU with linear_before_reset: Rb of the h gate, [dirs, hidden]
    peepholes: np.ndarray | None = None
    clip: float | None = None
    has_h0: bool = False
    has_c0: bool = False
    h_row: int = -1
    c_row: int = -1
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
    cell = node.op_type
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
    rt = np.concatenate([_pack(r[d], cell, hidden) for d in range(dirs)])
    out = lw.new((rows, dirs, batch, hidden), "rnn")
    lw.ops.append(Recurrence(
        inputs, out, cell=cell, seq=seq, batch=batch, hidden=hidden, reverse=reverse, rt=rt, rbh=rbh,
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


def _pack(r: np.ndarray, cell: str, hidden: int) -> np.ndarray:
    """One direction's R ``[gates * hidden, hidden]`` as the kernel reads it: transposed, so
    row ``k`` holds what ``h_prev[k]`` multiplies (GRU: the z and r gates, then the h gate)."""
    if cell != "GRU":
        return np.ascontiguousarray(r.T).reshape(-1)
    return np.concatenate([np.ascontiguousarray(r[: 2 * hidden].T).reshape(-1),
                           np.ascontiguousarray(r[2 * hidden :].T).reshape(-1)])


def emit_rnn(ctx: Context, kernel: Kernel) -> None:
    op = core_of(kernel, Recurrence)
    gh = gate_count(op.cell) * op.hidden
    dirs = len(op.reverse)
    tasks = dirs * op.batch
    scratch = -(-(gh + 2 * op.hidden) // 16) * 16  # per task: gates, h, c (or GRU's h gate), 64-byte apart
    name = ctx.name("rnn")
    ctx.functions.append(filled(
        "ops/rnn.c", name=name, cell=op.cell, lstm=int(op.cell == "LSTM"), rnn=int(op.cell == "RNN"),
        lbr=int(op.rbh is not None), peep=int(op.peepholes is not None),
        dirs=dirs, batch=op.batch, seq=op.seq, H=op.hidden, GH=gh, h_row=op.h_row, c_row=op.c_row,
        has_clip=int(op.clip is not None), clip=c_float(op.clip or 0.0), tasks=tasks, scratch=scratch,
        reverse_mask=sum(1 << d for d, back in enumerate(op.reverse) if back), check_lens=int(op.has_lens),
    ))  # fmt: skip
    states = iter(op.inputs[1:])
    h0 = ctx.ptr(next(states)) if op.has_h0 else "(const float*)0"
    c0 = ctx.ptr(next(states)) if op.has_c0 else "(const float*)0"
    lens = ctx.ptr(next(states)) if op.has_lens else ctx.weight(op.lens) if op.lens is not None else "(const float*)0"
    # GRU: Rb of the h gate; LSTM: the peepholes (one per cell: the kernel's "extra" weights)
    extra = op.rbh if op.rbh is not None else op.peepholes
    extra_ptr = ctx.weight(extra) if extra is not None else "(const float*)0"
    ctx.body.append(
        f"  {name}({ctx.ptr(op.inputs[0])}, {h0}, {c0}, {ctx.weight(op.rt)}, {extra_ptr}, {lens}, {ctx.ptr(op.out)}, "
        f"{ctx.temp(tasks * scratch)});"
    )


def recurrence_flops(op: Recurrence) -> float:
    """Multiply-adds of ``h_prev R^T`` and the gate math, every step, direction and batch row."""
    gh = gate_count(op.cell) * op.hidden
    return float(op.seq * op.batch * len(op.reverse) * (2 * gh * op.hidden + 30 * op.hidden))


ONNX = (
    # (sequence_lens, int32, reaches the kernel as exact floats)
    OnnxOp("LSTM", _rnn, check_rnn, converted=frozenset({4})),
    OnnxOp("GRU", _rnn, check_rnn, converted=frozenset({4})),
    OnnxOp("RNN", _rnn, check_rnn, converted=frozenset({4})),
)

KERNELS = (KernelOp(Recurrence, Layout.PLAIN, emit_rnn),)
