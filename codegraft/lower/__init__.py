"""Lower one partition onto its backend: layout and precision applied, compiled, loaded.

In: a partition as a standalone ONNX model, its backend and a
:class:`~codegraft.lower.lowering.LoweringRequest` (name, composites, precision, samples).
Out: the backend's blob and a loaded :class:`~codegraft.backend.Runnable`, or a
:class:`BackendError`; a backend that needs static shapes gets a runnable that specialises the
partition to each new input shape at run time.
"""
