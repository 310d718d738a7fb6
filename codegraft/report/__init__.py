"""Report: where each node ran and why not elsewhere, as tables, JSON and pictures.

In: the records the other stages fill in (nodes, partitions, passes, placements) and, for
drawing, the model.  Out: the :class:`~codegraft.report.report.Report` an executable carries
and stores in its artifact, and SVG/HTML/DOT drawings.  It imports no stage (its records are
plain data), so every stage may write to it.
"""
