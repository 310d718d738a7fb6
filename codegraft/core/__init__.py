"""What every stage shares: the basic :class:`~codegraft.core.support.Support` type, dtypes,
random inputs, the onnxruntime reference run, node facts, shared names and CompileOptions.

In: nothing of codegraft but :mod:`codegraft.errors` (``support`` imports nothing at all).
Out: small helpers and plain data that any stage may import; since nothing here imports a
stage, no import cycle can start here.
"""
