"""Pausing the cyclic garbage collector during graph-sized passes.

NOTE: importing, optimising, annotating or partitioning a 100k-node graph allocates millions
of small objects while millions of IR objects are alive; the allocation bursts trigger full
collections that walk them all (a quarter of an ``inspect`` of a 20k-node model).  What these
stages allocate is either kept (the IR: cycles, but alive) or freed by reference counting; the
little cyclic garbage a pass leaves (a removed node and its values) waits for the first
collection after the pause, so pausing collection for their duration is safe.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import wraps
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")


@contextmanager
def paused_gc() -> Iterator[None]:
    """Disable the cyclic collector inside the block (re-entrant; restores the old state)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def without_gc(func: Callable[P, R]) -> Callable[P, R]:
    """Decorator form of :func:`paused_gc`."""

    @wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        with paused_gc():
            return func(*args, **kwargs)

    return wrapper
