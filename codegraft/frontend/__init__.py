"""Frontends: what a user hands to ``compile`` in, one normalised ``onnx_ir.Model`` out.

In: a file, bytes, an ``onnx.ModelProto`` or ``onnx_ir.Model``, a PyTorch module (exported by
:mod:`~codegraft.frontend.torch_export`), an FX graph from ``torch.compile``.  Out: one
``onnx_ir.Model``, checked, shapes inferred, every value named, constants lifted to initializers
(:func:`codegraft.frontend.model.import_model`); bad input is a
:class:`~codegraft.errors.ModelError` naming what is wrong.  The shared passes
(:mod:`codegraft.passes`) then optimise it.
"""
