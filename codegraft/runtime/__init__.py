"""Run: the executable, its one-file artifact, and codegraft's own If/Loop runner.

In: steps (one per partition: its backend, inputs, outputs, blob), their loaded runnables and
the shared constants.  Out: an :class:`~codegraft.runtime.executable.Executable` that runs the
steps in order, profiles them and saves itself as a ``.cgx`` file (``artifact``) that
:func:`~codegraft.runtime.loader.load_executable` reads back without pickle or eval, its
header checked by ``artifact_schema`` and, with trusted keys, its ``signature`` first.
"""
