"""C text kept in ``.c`` files beside the Python that fills it in.

NOTE: the files are package data (``pyproject.toml``), read through :mod:`importlib.resources`
so an installed wheel finds them, and part of ``CBackend.version`` so caches keyed by it
notice a changed kernel.  ``${name}`` marks a value the code generator fills in
(:class:`string.Template`): a ``.c`` file reads as C with holes, not as a Python string.

Example::

    filled("gemm_driver.c", NV=2, P=6)   # the driver of the 6 x 2-vector micro-kernel
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from string import Template

_PACKAGE = __name__.rpartition(".")[0]


@cache
def c_file(name: str) -> str:
    """The text of ``name``, a ``/``-separated path relative to the ``c`` backend's folder."""
    return resources.files(_PACKAGE).joinpath(*name.split("/")).read_text(encoding="utf-8")


@cache
def _template(name: str) -> Template:
    return Template(c_file(name))


def filled(file: str, /, **values: object) -> str:
    """``file``'s text with each ``${key}`` replaced by ``values[key]``; a missing key is a ``KeyError``."""
    return _template(file).substitute(values)
