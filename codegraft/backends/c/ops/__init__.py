"""The ``c`` backend's op table: every op it takes, described once, by family.

Each family module (``elementwise``, ``conv``, ``matmul``, ``pool``, ``resize``, ``rnn``,
``norm``, ``data``, ``views``, ``quantize``, ``qconv``) lists its ONNX ops (``ONNX``: check and lowering,
:class:`OnnxOp`) and the ops of the backend's graph it emits (``KERNELS``: layout rule and C
emitter, :class:`KernelOp`).  Support (``_support.py``), translation (``_translate.py``),
layout (``_layout.py``) and code generation (``_codegen.py``) read these two tables and
nothing else, so adding an op is an entry in one family module (see the backend's README,
"Adding an op").

Example::

    from codegraft.backends.c.ops import KERNEL_OPS, ONNX_OPS

    ONNX_OPS["Relu"].check(node)            # "" or why not
    KERNEL_OPS[type(op)].layout             # Layout.FOLLOW_INPUTS for an elementwise op
"""

from __future__ import annotations

from collections.abc import Iterable

from codegraft.backends.c import _graph as g
from codegraft.backends.c.ops import conv, data, elementwise, matmul, norm, pool, qconv, quantize, resize, rnn, views
from codegraft.backends.c.ops._spec import KernelOp, Layout, OnnxOp


def _by_op_type(*families: Iterable[OnnxOp]) -> dict[str, OnnxOp]:
    table: dict[str, OnnxOp] = {}
    for entry in (e for family in families for e in family):
        if entry.op_type in table:
            raise ValueError(f"ONNX op {entry.op_type} is described twice in the c backend's op table")
        table[entry.op_type] = entry
    return table


def _by_class(*families: Iterable[KernelOp]) -> dict[type[g.Op], KernelOp]:
    table: dict[type[g.Op], KernelOp] = {}
    for entry in (e for family in families for e in family):
        if entry.op in table:
            raise ValueError(f"{entry.op.__name__} is described twice in the c backend's op table")
        if (entry.emit is None) != (entry.layout is Layout.VIEW):
            raise ValueError(f"{entry.op.__name__}: only a view (Layout.VIEW) has no emitter")
        table[entry.op] = entry
    return table


ONNX_OPS = _by_op_type(
    elementwise.ONNX, conv.ONNX, matmul.ONNX, pool.ONNX, resize.ONNX, rnn.ONNX, norm.ONNX, data.ONNX, views.ONNX,
    quantize.ONNX, qconv.ONNX,
)
KERNEL_OPS = _by_class(
    elementwise.KERNELS, conv.KERNELS, matmul.KERNELS, pool.KERNELS, resize.KERNELS, rnn.KERNELS, norm.KERNELS,
    data.KERNELS, views.KERNELS, quantize.KERNELS, qconv.KERNELS,
)

__all__ = ["KERNEL_OPS", "ONNX_OPS", "KernelOp", "Layout", "OnnxOp"]
