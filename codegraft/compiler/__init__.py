"""Compile: the driver that runs the stages in order and assembles the executable.

In: a model source, targets and :class:`~codegraft.core.options.CompileOptions`.  Out: an
:class:`~codegraft.runtime.executable.Executable` whose report says where each node went.
``driver`` imports, runs the passes, plans, then ``steps`` turns every planned partition into
a step (compiled, deferred per shape, or fallen back to the host with the error recorded).
``inspect`` makes the same plan and reports it without compiling anything.
"""
