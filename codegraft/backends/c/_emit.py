"""The emission context: C text being built, the weight arena and the scratch plan.

NOTE: kernels ask for pointers (:meth:`Context.ptr`, :meth:`Context.weight`,
:meth:`Context.temp`) and get C symbol names back; the symbols are bound to addresses only
at the end, when every use is known.  That is what lets scratch memory be planned from
real lifetimes (two tensors share bytes when their kernels' ranges do not overlap) and
allocated once per loaded partition.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from codegraft.backends.c import _graph as g
from codegraft.backends.c._toolchain import Target

ALIGN = 16  # floats: 64 bytes, one AVX-512 vector and a cache line


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


@dataclass
class _Buffer:
    size: int
    first: int
    last: int
    offset: int = -1


@dataclass
class Context:
    """Accumulates one partition's C source, constants and scratch needs."""

    target: Target
    inputs: list[g.Tensor]
    outputs: list[g.Tensor]
    functions: list[str] = field(default_factory=list)
    body: list[str] = field(default_factory=list)
    position: int = 0
    op_threads: int = 1  # threads the cost model gave the kernel being emitted (see _thread_cost.py)
    winograd: bool = True  # 3x3 Convs may run as Winograd F(2x2, 3x3) where it pays (ops/winograd.py)
    _weights: list[np.ndarray] = field(default_factory=list)
    _weight_size: int = 0
    _weight_syms: dict[int, str] = field(default_factory=dict)
    _weight_decls: list[str] = field(default_factory=list)
    _weight_by_content: dict[tuple[int, bytes], str] = field(default_factory=dict)
    _buffers: dict[str, _Buffer] = field(default_factory=dict)
    _scratch_syms: dict[int, str] = field(default_factory=dict)
    _counter: int = 0
    _defined: set[str] = field(default_factory=set)
    # id(root tensor) -> the position of each kernel reading it (``_codegen.generate``)
    reads: dict[int, list[int]] = field(default_factory=dict)
    _sizes: dict[int, int] = field(default_factory=dict)  # id(root) -> floats, where not its size

    def define_once(self, name: str, source: Callable[[], str]) -> str:
        """``name``, after adding ``source()`` to the functions the first time ``name`` is asked for.

        For C shared by several kernels of a partition (a micro-kernel variant, say).
        """
        if name not in self._defined:
            self._defined.add(name)
            self.functions.append(source())
        return name

    def name(self, prefix: str) -> str:
        """A fresh C identifier."""
        self._counter += 1
        return f"{prefix}{self._counter}"

    def weight(self, array: np.ndarray) -> str:
        """Symbol of a float32 constant placed (64-byte aligned) in the weight arena.

        A constant equal to one placed before gets that one's symbol: a torch-traced RNN
        unrolls its cell, every step a Gemm of the same initializer (captcha_crnn: 20 copies of
        a 6.5 MB input weight, 131 MB streamed from memory per call instead of 6.5 cached).
        """
        data = np.ascontiguousarray(array, dtype=np.float32).reshape(-1)
        key = (data.size, hashlib.blake2b(data.view(np.uint8).data, digest_size=16).digest())
        known = self._weight_by_content.get(key)
        if known is not None:
            return known
        symbol = self.name("W")
        self._weight_by_content[key] = symbol
        self._weight_decls.append(f"  const float* {symbol} = w + {self._weight_size};")
        self._weights.append(data)
        pad = _aligned(data.size) - data.size
        if pad:
            self._weights.append(np.zeros(pad, np.float32))
        self._weight_size += data.size + pad
        return symbol

    def ptr(self, tensor: g.Tensor) -> str:
        """C expression for the first byte of ``tensor`` in its physical layout."""
        root = tensor.root()
        if root.const is not None:
            key = id(root)
            if key not in self._weight_syms:
                self._weight_syms[key] = self.weight(root.physical_const())
            return f"((float*){self._weight_syms[key]})"
        for index, t in enumerate(self.inputs):
            if t is root:
                return f"((float*)in[{index}])"
        for index, t in enumerate(self.outputs):
            if t is root:
                return f"out[{index}]"
        symbol = self._scratch_syms.get(id(root))
        if symbol is None:
            symbol = self.name("T")
            self._scratch_syms[id(root)] = symbol
            size = self._sizes.get(id(root), root.size)
            self._buffers[symbol] = _Buffer(_aligned(max(size, 1)), self.position, self.position)
        self._buffers[symbol].last = self.position
        return symbol

    def bordered_output(self, out: g.Tensor, border: tuple[int, int, int, int]) -> str:
        """C expression for where a channels-last 2-D ``out`` starts inside a zero border
        (``Kernel.border``: pad top, pad left, bordered height and width), its buffer
        reserved bordered and the border zeroed here (the kernel writes the inside next)."""
        n, h, w, c = out.physical_shape
        top, left, height, width = border
        root = out.root()
        assert root is out and id(root) not in self._scratch_syms
        self._sizes[id(root)] = n * height * width * c
        base = self.ptr(out)
        self.body.append(f"  cg_zero_border({base}, {n}, {height}, {width}, {c}, {top}, {left}, {h}, {w});")
        return f"({base} + {(top * width + left) * c})"

    def write_over(self, out: g.Tensor, operand: g.Tensor) -> bool:
        """Give ``out`` the memory of ``operand`` (same size, read element by element as ``out``
        is written) when the kernel being emitted is the operand's last reader: a residual
        Add's result overwrites the block input it adds, as onnxruntime's fused Conv + Sum
        does, so the kernel streams one tensor through the caches instead of two.

        Only scratch, on both sides (not a partition input, which belongs to the caller, nor
        an output, nor a constant), and only when nothing at this position (a concurrent
        branch) or later reads the operand.  Returns whether it did.
        """
        root, over = out.root(), operand.root()
        fixed = [*self.inputs, *self.outputs]
        if root is not out or over.const is not None or any(t is over or t is root for t in fixed):
            return False
        if id(root) in self._scratch_syms or over.size != root.size:
            return False
        steps = self.reads.get(id(over), [])
        if steps.count(self.position) != 1 or max(steps) != self.position:
            return False
        self._scratch_syms[id(root)] = self.ptr(operand)
        return True

    def temp(self, floats: int) -> str:
        """Scratch that lives only during the current kernel."""
        symbol = self.name("S")
        self._buffers[symbol] = _Buffer(_aligned(max(floats, 1)), self.position, self.position)
        return symbol

    # -- final assembly ------------------------------------------------------------------
    def plan_scratch(self) -> int:
        """Give every scratch buffer an offset; return the arena size in floats."""
        placed: list[_Buffer] = []
        for buffer in sorted(self._buffers.values(), key=lambda b: -b.size):
            overlapping = sorted(
                (p for p in placed if p.first <= buffer.last and buffer.first <= p.last), key=lambda p: p.offset
            )
            offset = 0
            for other in overlapping:
                if offset + buffer.size <= other.offset:
                    break
                offset = max(offset, other.offset + other.size)
            buffer.offset = offset
            placed.append(buffer)
        return max((b.offset + b.size for b in placed), default=0)

    def declarations(self) -> list[str]:
        """C declarations binding weight and scratch symbols (after :meth:`plan_scratch`)."""
        lines = list(self._weight_decls)
        lines += [f"  float* {s} = s + {b.offset};" for s, b in self._buffers.items()]
        return lines

    def weights(self) -> np.ndarray:
        """The weight arena, in the order the symbols were handed out."""
        if not self._weights:
            return np.zeros(0, np.float32)
        return np.concatenate(self._weights)
