"""The examples in docstrings run: every module of ``codegraft`` and ``bench`` that has one.

Docstring examples are the first thing a reader copies; untested, they drift from the code.
"""

from __future__ import annotations

import doctest
import importlib
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _modules_with_examples() -> list[str]:
    names = []
    for package in ("codegraft", "bench"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if ">>> " in path.read_text(encoding="utf-8"):
                names.append(".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"))
    return names


@pytest.mark.parametrize("name", _modules_with_examples())
def test_docstring_examples_run(name: str) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, verbose=False)
    assert result.attempted > 0 and result.failed == 0, f"{name}: {result.failed} of {result.attempted} examples fail"
