"""Time per stage of a compile or an inspect, told to a progress listener as it goes.

A stage is what a user waits for on a long model: ``import``, ``passes``, ``annotate``,
``partition``, ``lower``.  Each is timed (wall clock) for the report's "time per stage"
table, and whoever watches (the CLI's progress bars on a terminal) hears
``progress(stage, done, total)`` when a stage starts, advances and ends.

Example::

    stages = Stages(progress=lambda stage, done, total: print(stage, done, total))
    with stages.stage("annotate", total=len(nodes)) as annotating:
        for i, node in enumerate(nodes):
            ...
            annotating.advance(i + 1)
    stages.times  # (("annotate", 0.8),)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from types import TracebackType

__all__ = ["Progress", "Stage", "Stages"]

# progress(stage, done, total): ``done == total`` once the stage has ended.
Progress = Callable[[str, int, int], None]

# A stage tells its listener at most about this many times between its start and its end.
_UPDATES_PER_STAGE = 100


class Stages:
    """The stages of one run, in the order they started, with their wall-clock seconds.

    A stage run twice adds up under its name.
    """

    def __init__(self, progress: Progress | None = None) -> None:
        self.progress = progress
        self._seconds: dict[str, float] = {}

    def stage(self, name: str, total: int = 1) -> Stage:
        """Start stage ``name`` of ``total`` steps; end it with ``end()`` or a ``with`` block."""
        self._seconds.setdefault(name, 0.0)
        return Stage(self, name, max(total, 1))

    def _add(self, name: str, seconds: float) -> None:
        self._seconds[name] = self._seconds.get(name, 0.0) + seconds

    @property
    def times(self) -> tuple[tuple[str, float], ...]:
        """``(stage, seconds)`` in the order the stages first started."""
        return tuple(self._seconds.items())


class Stage:
    """One running stage: ``advance(done)`` as it goes, ``end()`` (or leave the ``with``)."""

    def __init__(self, stages: Stages, name: str, total: int) -> None:
        self._stages, self.name, self.total = stages, name, total
        self._step = max(total // _UPDATES_PER_STAGE, 1)
        self._next_update = self._step
        self._start = time.perf_counter()
        self._ended = False
        if stages.progress is not None:
            stages.progress(name, 0, total)

    def advance(self, done: int) -> None:
        """``done`` of ``total`` steps are done (told to the listener now and then)."""
        progress = self._stages.progress
        if progress is not None and done >= self._next_update:
            self._next_update = done + self._step
            progress(self.name, min(done, self.total), self.total)

    def end(self) -> None:
        if self._ended:
            return
        self._ended = True
        self._stages._add(self.name, time.perf_counter() - self._start)
        if self._stages.progress is not None:
            self._stages.progress(self.name, self.total, self.total)

    def __enter__(self) -> Stage:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.end()
