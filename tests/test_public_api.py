"""The curated facade: what ``codegraft`` exports, each documented, nothing private leaking."""

from __future__ import annotations

import codegraft as cg


def test_facade_exports_exist_and_are_documented() -> None:
    for name in cg.__all__:
        symbol = getattr(cg, name)
        assert symbol.__doc__, f"codegraft.{name} has no docstring"


def test_facade_is_curated() -> None:
    public = {n for n in dir(cg) if not n.startswith("_")}
    modules = {"backend", "backends", "errors", "frontend", "patterns", "passes", "testing"}
    # The other stage folders are visible as submodules once imported; their contents are not the API.
    stages = {"core", "plan", "lower", "runtime", "tune", "report", "compiler", "cli"}
    assert public - set(cg.__all__) - modules - stages == set()
