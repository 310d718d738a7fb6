"""Tune: measured placement, where several backends could run a region, time it on each.

In: the model, its :class:`~codegraft.plan.annotate.Annotation`, the targets and the host.
Out: a backend for every unit and the placement records behind the choice (for the report).
Candidates are compiled and timed through :mod:`codegraft.lower`, which is why this stage
comes after it; timings are cached on disk.
"""
