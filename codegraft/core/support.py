"""The basic answer every stage passes around: :class:`Support`, yes or no with the reason.

NOTE: this module imports nothing else of codegraft, like onnxscript's rewriter keeps its
shared types in ``_basics.py``: the vendor contract (:mod:`codegraft.backend`) and the
pattern language (:mod:`codegraft.patterns`) both need ``Support``, and neither may import
the other's way round, so no import cycle can start here.  Users reach it as
``codegraft.Support`` or ``codegraft.backend.Support``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Support:
    """A backend's answer for one node or one composite: yes, or no with the reason.

    Example: ``Support.no("Conv: group=32 not supported")``.
    """

    ok: bool
    reason: str = ""

    @staticmethod
    def yes() -> Support:
        return _YES

    @staticmethod
    def no(reason: str) -> Support:
        return Support(False, reason)

    def __bool__(self) -> bool:
        return self.ok


_YES = Support(True)

__all__ = ["Support"]
