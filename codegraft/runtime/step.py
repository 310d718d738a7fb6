"""What the artifact stores per model input and per partition: :class:`TensorSpec`, :class:`Step`.

Plain data, shared by the executable that runs steps and the artifact that stores them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from codegraft.backend import Composite

Dim = int | str | None


@dataclass(frozen=True)
class TensorSpec:
    """A model input: its name, numpy dtype name and shape (``str``/``None`` dims are free).

    ``bound``: the value it was bound to at compile time (``input_values``); it must be fed
    that value.
    """

    name: str
    dtype: str
    shape: tuple[Dim, ...] | None
    bound: np.ndarray | None = field(default=None, compare=False)

    def describe(self) -> str:
        dtype = self.dtype or "any"
        if self.shape is None:
            return f"{dtype}[?]"
        described = f"{dtype}[{', '.join('?' if d is None else str(d) for d in self.shape)}]"
        return described if self.bound is None else f"{described} = {self.bound.tolist()}"


@dataclass(frozen=True)
class Step:
    """One partition in the schedule, as stored in the artifact.

    ``blob`` is the backend's compiled partition; ``template`` the partition's ONNX, kept
    only for partitions compiled per input shape at run time (``blob`` is then ``None``).
    """

    name: str
    backend: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    blob: bytes | None
    template: bytes | None = None
    native_code: bool = False
    composites: tuple[Composite, ...] = ()
    precision: str = "float32"


__all__ = ["Dim", "Step", "TensorSpec"]
