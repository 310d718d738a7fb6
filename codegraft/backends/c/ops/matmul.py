"""Gemm and MatMul (batched, broadcast) on the shared GEMM engine.

NOTE: Gemm is a ``g.MatMul`` with ``trans_a``/``trans_b`` plus elementwise ops for alpha
and C (fused into the epilogue); a constant B is packed at compile time, a computed one
per call (``cg_pack``).  A batch that multiplies every A by the same B is one GEMM over
all rows.
"""

from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir

from codegraft.backends.c import _graph as g
from codegraft.backends.c._blocking import host_blocking, weights_outweigh
from codegraft.backends.c._emit import Context
from codegraft.backends.c._fuse import Kernel
from codegraft.backends.c._lowerer import Lowerer, LoweringError
from codegraft.backends.c._node import (
    attr_float,
    attr_floats,
    attr_int,
    attr_ints,
    attr_str,
    attr_strs,
    present,
    rank_of,
)
from codegraft.backends.c.ops._spec import KernelOp, Layout, OnnxOp, core_of
from codegraft.backends.c.ops.data import Gather
from codegraft.backends.c.ops.elementwise import emit_epilogue, vector_epilogue
from codegraft.backends.c.ops.gemm import (
    c_longs,
    choose_tile,
    gemm_function,
    pack_weights,
    row_strides_arg,
    write_over_residual,
)
from codegraft.backends.c.ops.norm import ArgExtreme, ml_rows
from codegraft.backends.c.ops.qconv import quantized_matmul

# -- Gemm ------------------------------------------------------------------------------------------


def _check_gemm(node: ir.Node) -> str:
    for index in (0, 1):
        rank = rank_of(node.inputs[index])
        if rank is not None and rank != 2:
            return f"input {index} has rank {rank}, expected 2"
    return ""


def _gemm(lw: Lowerer, node: ir.Node) -> None:
    quantized = quantized_matmul(lw, node)
    if quantized is not None:
        lw.bind(node.outputs[0], quantized)
        return
    a, b = lw.tensor(node.inputs[0]), lw.tensor(node.inputs[1])
    trans_a, trans_b = attr_int(node, "transA", 0) != 0, attr_int(node, "transB", 0) != 0
    rows = a.shape[1] if trans_a else a.shape[0]
    cols = b.shape[0] if trans_b else b.shape[1]
    out = lw.new((rows, cols))
    lw.ops.append(g.MatMul([a, b], out, trans_a=trans_a, trans_b=trans_b))
    alpha, beta = attr_float(node, "alpha", 1.0), attr_float(node, "beta", 1.0)
    if alpha != 1.0:
        out = lw.elementwise("mul", [out, lw.const(np.float32(alpha))])
    c_value = present(node, 2)
    if c_value is not None and beta != 0.0:
        c = lw.tensor(c_value)
        if c.const is not None:
            c = lw.const(c.const.astype(np.float32) * np.float32(beta))
        elif beta != 1.0:
            c = lw.elementwise("mul", [c, lw.const(np.float32(beta))])
        out = lw.elementwise("add", [out, c])
    lw.bind(node.outputs[0], out)


# -- MatMul ----------------------------------------------------------------------------------------


def _check_matmul(node: ir.Node) -> str:
    for index in (0, 1):
        if rank_of(node.inputs[index]) == 0:
            return "scalar operands are not valid"
    return ""


def _matmul(lw: Lowerer, node: ir.Node) -> None:
    quantized = quantized_matmul(lw, node)
    if quantized is not None:
        lw.bind(node.outputs[0], quantized)
        return
    bind_matmul(lw, node, lw.tensor(node.inputs[0]), lw.tensor(node.inputs[1]))


def bind_matmul(lw: Lowerer, node: ir.Node, a: g.Tensor, b: g.Tensor) -> None:
    """``node``'s output bound to ``a @ b`` with numpy's MatMul semantics (MatMulInteger passes
    its operands less their zero points)."""
    a2 = lw.view(a, (1, a.shape[0])) if len(a.shape) == 1 else a
    b2 = lw.view(b, (b.shape[0], 1)) if len(b.shape) == 1 else b
    if a2.shape[-1] != b2.shape[-2]:
        raise LoweringError(f"inner dimensions differ: {a.shape} @ {b.shape}")
    batch = np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
    out = lw.new((*batch, a2.shape[-2], b2.shape[-1]))
    lw.ops.append(g.MatMul([a2, b2], out))
    shape = out.shape
    if len(a.shape) == 1:
        shape = shape[:-2] + shape[-1:]
    if len(b.shape) == 1:
        shape = shape[:-1]
    lw.bind(node.outputs[0], out if shape == out.shape else lw.view(out, shape))


# -- Einsum ----------------------------------------------------------------------------------------
# One or two operands, as transposes, sums and one batched MatMul: the letters both operands and
# the output have are the batch, those both operands have and the output lacks are contracted,
# the rest are each side's rows or columns.  (TF's EinsumDense exports attention this way:
# ``abcd,cde->abe``.)  A letter repeated within an operand (a diagonal) is declined.

_ELLIPSIS = "..."


def _einsum_terms(node: ir.Node) -> tuple[list[str], str] | str:
    """The operand terms and the output term of ``equation``, "..." as it was; or why not."""
    equation = "".join(attr_str(node, "equation", "").split())
    inputs_part, arrow, output = equation.partition("->")
    terms = inputs_part.split(",")
    if not arrow:  # implicit output: the letters seen once, in alphabetical order
        letters = "".join(t.replace(_ELLIPSIS, "") for t in terms)
        output = (_ELLIPSIS if any(_ELLIPSIS in t for t in terms) else "") + "".join(
            sorted(c for c in set(letters) if letters.count(c) == 1)
        )
    if len(terms) != len(node.inputs) or not 1 <= len(terms) <= 2:
        return f"equation {equation!r} with {len(node.inputs)} operands (one or two are supported)"
    for term in [*terms, output]:
        letters = term.replace(_ELLIPSIS, "", 1)
        if not all(c.isalpha() for c in letters):
            return f"equation {equation!r} is not understood"
        if len(set(letters)) != len(letters):
            return f"equation {equation!r} repeats a letter within a term (a diagonal), which is not supported"
    return terms, output


def _check_einsum(node: ir.Node) -> str:
    terms = _einsum_terms(node)
    if isinstance(terms, str):
        return terms
    if any(rank_of(v) is None for v in node.inputs):
        return "an operand's rank is unknown"
    return ""


def _spelled(term: str, rank: int, ellipsis_rank: int) -> str:
    """``term`` with "..." replaced by one character per dimension it covers, the same
    characters for the same (right-aligned) dimensions in every term."""
    if _ELLIPSIS not in term:
        if len(term) != rank:
            raise LoweringError(f"einsum term {term!r} does not match an operand of rank {rank}")
        return term
    covered = rank - (len(term) - len(_ELLIPSIS))
    if covered < 0:
        raise LoweringError(f"einsum term {term!r} does not match an operand of rank {rank}")
    marks = "".join(chr(0x100 + i) for i in range(ellipsis_rank - covered, ellipsis_rank))
    return term.replace(_ELLIPSIS, marks)


def _transposed(lw: Lowerer, x: g.Tensor, term: str, order: str) -> g.Tensor:
    perm = tuple(term.index(c) for c in order)
    if perm == tuple(range(len(perm))):
        return x
    if x.const is not None:
        return lw.const(np.transpose(x.const, perm))
    out = lw.new(tuple(x.shape[p] for p in perm))
    lw.ops.append(g.Transpose([x], out, perm=perm))
    return out


def _summed(lw: Lowerer, x: g.Tensor, term: str, keep: str) -> tuple[g.Tensor, str]:
    """``x`` summed over the letters of ``term`` not in ``keep``."""
    from codegraft.backends.c.ops.norm import ReduceMean

    axes = tuple(i for i, c in enumerate(term) if c not in keep)
    if not axes:
        return x, term
    kept = "".join(c for c in term if c in keep)
    full = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
    out = lw.new(full)
    lw.ops.append(ReduceMean([x], out, axes=axes, kind="sum"))
    return lw.view(out, tuple(d for i, d in enumerate(x.shape) if i not in axes)), kept


def _einsum(lw: Lowerer, node: ir.Node) -> None:
    parsed = _einsum_terms(node)
    if isinstance(parsed, str):
        raise LoweringError(parsed)
    operands = [lw.tensor(v) for v in node.inputs]
    ellipsis_rank = max(
        (len(x.shape) - (len(t) - len(_ELLIPSIS)) for x, t in zip(operands, parsed[0], strict=True) if _ELLIPSIS in t),
        default=0,
    )
    terms = [_spelled(t, len(x.shape), ellipsis_rank) for x, t in zip(operands, parsed[0], strict=True)]
    output = parsed[1].replace(_ELLIPSIS, "".join(chr(0x100 + i) for i in range(ellipsis_rank)))
    sizes: dict[str, int] = {}
    for x, term in zip(operands, terms, strict=True):
        for c, d in zip(term, x.shape, strict=True):
            if sizes.get(c, d) != d and 1 not in (d, sizes[c]):
                raise LoweringError(f"einsum letter {c!r} has sizes {sizes[c]} and {d}")
            sizes[c] = max(d, sizes.get(c, d))
    if len(operands) == 1:
        x, term = _summed(lw, operands[0], terms[0], output)
        lw.bind(node.outputs[0], _transposed(lw, x, term, output))
        return
    # a letter only one operand has and the output lacks is summed out of that operand first
    a, ta = _summed(lw, operands[0], terms[0], output + terms[1])
    b, tb = _summed(lw, operands[1], terms[1], output + terms[0])
    batch = "".join(c for c in output if c in ta and c in tb)
    contracted = "".join(c for c in ta if c in tb and c not in output)
    rows = "".join(c for c in ta if c not in tb)
    cols = "".join(c for c in tb if c not in ta)
    a = _transposed(lw, a, ta, batch + rows + contracted)
    b = _transposed(lw, b, tb, batch + contracted + cols)
    nb = len(batch)
    depth = math.prod(sizes[c] for c in contracted)
    a3 = lw.view(a, (*a.shape[:nb], math.prod(a.shape[nb : nb + len(rows)]), depth))
    b3 = lw.view(b, (*b.shape[:nb], depth, math.prod(b.shape[nb + len(contracted) :])))
    out = lw.new((*np.broadcast_shapes(a3.shape[:nb], b3.shape[:nb]), a3.shape[-2], b3.shape[-1]))
    lw.ops.append(g.MatMul([a3, b3], out))
    product = lw.view(out, (*out.shape[:nb], *(sizes[c] for c in rows), *(sizes[c] for c in cols)))
    lw.bind(node.outputs[0], _transposed(lw, product, batch + rows + cols, output))


# -- the kernel both become ------------------------------------------------------------------------


def emit_matmul(ctx: Context, kernel: Kernel) -> None:
    mm = core_of(kernel, g.MatMul)
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
    write_over_residual(ctx, kernel)
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
    blocking = host_blocking(ctx.target.vector_floats)
    split = blocking.split(nmb, 1, -(-rows // p), depth, width, p, ctx.op_threads,
                           weights_outweigh_input=weights_outweigh(depth * cols, rows * depth))
    # An epilogue of steps with vector forms (bias, residual, Relu, SiLU, HardSwish) runs on full
    # tiles' registers, as a Conv's does.
    fused = vector_epilogue(kernel)
    driver = gemm_function(ctx, nv, p, fused, contiguous_input=0 if mm.trans_a else rows * depth, depth=depth,
                           fetch_next=split.fetch_next and b.const is not None)
    rs_arg = row_strides_arg(ctx, ep, fused)
    job = ctx.name("job")
    aoff, boff = ctx.name("aoff"), ctx.name("boff")
    ctx.body.append(f"  static const long {aoff}[] = {c_longs([int(i) * rows * depth for i in a_index])};")
    ctx.body.append(f"  static const long {boff}[] = {c_longs([int(i) * block for i in b_index])};")
    ctx.body.append(f"  static const long {job}_tap[] = {{0}};")
    ctx.body.append(
        f"  for (long bi = 0; bi < {nbatch}; bi++) {{\n"
        f"    const cg_gemm_t {job} = {{{ctx.ptr(a)} + {aoff}[bi], {pstride}, {cstride}, {depth}, 1, 1, {rows}, 1, "
        f"{rows}, 1, 1, 1, {job}_tap, 1, {cols}, {nmb}, {wsym} + {boff}[bi], {ctx.ptr(out)}, {cols}, bi * {rows}, "
        f"{ep}, {ep}_ops, {split.runs}, {split.blocks_per_task}, {int(split.rows_outer)}, 0, 0{rs_arg}}};\n"
        f"    {driver}(&{job});\n  }}"
    )


# -- ai.onnx.ml: LinearRegressor and LinearClassifier ---------------------------------------------
# What onnxruntime's linearregressor.cc and linearclassifier.cc compute: the input (rank 1 is one
# row) times the coefficients read as [targets, features], the first targets * features of them
# as onnxruntime reads them whatever their count (its logreg_iris sample declares 2 features for
# 3 x 4 coefficients), plus the intercepts, then ml_common.h's batched_update_scores_inplace.

_TRANSFORMS = ("NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO", "PROBIT")


def _targets(node: ir.Node) -> int:
    if node.op_type == "LinearRegressor":
        return attr_int(node, "targets", 1)
    return len(attr_floats(node, "intercepts") or [])  # onnxruntime's class count


def _check_linear(node: ir.Node) -> str:
    transform = attr_str(node, "post_transform", "NONE")
    if transform not in _TRANSFORMS:
        return f"post_transform={transform!r} is not one of {', '.join(_TRANSFORMS)}"
    rank = rank_of(node.inputs[0])
    if rank not in (1, 2):
        return "the input rank is unknown" if rank is None else f"a rank-{rank} input (onnxruntime reads 2 axes)"
    targets, coefficients = _targets(node), attr_floats(node, "coefficients") or []
    if targets < 1:
        return "no targets (a LinearClassifier's classes are its intercepts)"
    features = node.inputs[0].shape.dims[-1]  # type: ignore[union-attr]
    if isinstance(features, int) and targets * features > len(coefficients):
        return f"{len(coefficients)} coefficients for {targets} targets of {features} features"
    if node.op_type == "LinearClassifier":
        return _check_classifier(node, targets, transform)
    return ""


def _check_classifier(node: ir.Node, classes: int, transform: str) -> str:
    if attr_strs(node, "classlabels_strings"):
        return "string class labels (a string label stays on the host)"
    labels = attr_ints(node, "classlabels_ints") or []
    if classes == 1 and labels and len(labels) != 2:
        return f"{len(labels)} class labels for one set of coefficients (onnxruntime wants 2)"
    if classes == 1 and labels and transform == "PROBIT":
        return "PROBIT of one set of coefficients with 2 labels (onnxruntime leaves half the scores unwritten)"
    if classes > 1 and len(labels) != classes:
        return f"{len(labels)} class labels for {classes} classes"
    if any(abs(label) > 1 << 24 for label in labels):
        return "class labels beyond 2**24, which float32 cannot hold exactly"
    return ""


def _scores(lw: Lowerer, node: ir.Node) -> g.Tensor:
    """``x @ coefficients.T + intercepts``, ``[rows, targets]``: onnxruntime's Gemm."""
    x = lw.tensor(node.inputs[0])
    if len(x.shape) == 1:
        x = lw.view(x, (1, x.shape[0]))
    rows, features = x.shape
    targets = _targets(node)
    coefficients = np.asarray(attr_floats(node, "coefficients") or [], np.float32)
    if targets * features > coefficients.size:
        raise LoweringError(f"{coefficients.size} coefficients for {targets} targets of {features} features")
    out = lw.new((rows, targets))
    weight = lw.const(coefficients[: targets * features].reshape(targets, features))
    lw.ops.append(g.MatMul([x, weight], out, trans_b=True))
    intercepts = attr_floats(node, "intercepts") or []
    if len(intercepts) == targets:  # (LinearRegressor's are used only then, as onnxruntime's)
        out = lw.elementwise("add", [out, lw.const(np.asarray(intercepts, np.float32))])
    return out


def _post_transform(lw: Lowerer, scores: g.Tensor, transform: str) -> g.Tensor:
    """onnxruntime's ``batched_update_scores_inplace`` without a second class: PROBIT (its
    ErfInv approximation) of any scores; the others only where a row has 2 scores or more."""
    rows, targets = scores.shape
    if transform == "PROBIT":
        return lw.elementwise("probit", [scores])
    if targets == 1 or transform == "NONE":
        return scores
    if transform == "LOGISTIC":  # MlasComputeLogistic
        return lw.elementwise("mlas_logistic", [scores])
    return ml_rows(lw, scores, rows, targets, transform.lower())


def _linear_regressor(lw: Lowerer, node: ir.Node) -> None:
    lw.bind(node.outputs[0], _post_transform(lw, _scores(lw, node), attr_str(node, "post_transform", "NONE")))


def _linear_classifier(lw: Lowerer, node: ir.Node) -> None:
    """The label from the raw scores (the first largest; of one score, above 0 the second label,
    else the first), int64 as an exact float; the scores transformed, or for one set of
    coefficients and two labels ``[1 - p, p]``, ``p`` the score after LOGISTIC and untransformed
    otherwise, as onnxruntime 1.32 writes them (its source before applied no transform there)."""
    scores = _scores(lw, node)
    rows, classes = scores.shape
    labels = attr_ints(node, "classlabels_ints") or []
    transform = attr_str(node, "post_transform", "NONE")
    if classes == 1:
        negative, positive = labels if len(labels) == 2 else (0, 1)
        above = lw.elementwise("greater", [scores, lw.const(np.float32(0.0))])
        label = lw.elementwise("where", [above, lw.const(np.float32(positive)), lw.const(np.float32(negative))])
        if len(labels) == 2:
            p = lw.elementwise("ml_logistic", [scores]) if transform == "LOGISTIC" else scores
            complement = lw.elementwise("sub", [lw.const(np.float32(1.0)), p])
            probabilities = lw.elementwise("where", [lw.const(np.array([0.0, 1.0])), p, complement])
        else:
            probabilities = _post_transform(lw, scores, transform)
    else:
        label = lw.new((rows, 1))
        lw.ops.append(ArgExtreme([scores], label, outer=rows, n=classes, inner=1))
        if labels != list(range(classes)):
            picked = lw.new((rows,))
            lw.ops.append(Gather([lw.const(np.asarray(labels)), lw.view(label, (rows,))], picked, axis=0))
            label = picked
        probabilities = _post_transform(lw, scores, transform)
    lw.bind(node.outputs[0], lw.view(label, (rows,)))
    lw.bind(node.outputs[1], probabilities)


# -- the family's entries in the op table ----------------------------------------------------------


ONNX = (
    OnnxOp("Gemm", _gemm, _check_gemm),
    OnnxOp("MatMul", _matmul, _check_matmul),
    OnnxOp("Einsum", _einsum, _check_einsum),
    # ai.onnx.ml (LinearClassifier of int32/int64 features too, converted as onnxruntime converts them)
    OnnxOp("LinearRegressor", _linear_regressor, _check_linear, ml=True),
    OnnxOp("LinearClassifier", _linear_classifier, _check_linear, converted=frozenset({0}), index_output=True, ml=True),
)


KERNELS = (KernelOp(g.MatMul, Layout.PLAIN, emit_matmul),)
