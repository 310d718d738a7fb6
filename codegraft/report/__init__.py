"""Report: where each node ran and why not elsewhere, as tables, JSON, pictures and ONNX.

In: the report records the other stages fill in (nodes, partitions, passes, placements) and,
for drawing and export, the model and its plan.  Out: the
:class:`~codegraft.report.report.Report` an executable carries, ``inspect`` (the report without
compiling), SVG/HTML drawings and the partitioned model as ONNX for Netron.
"""
