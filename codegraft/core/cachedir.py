"""Where codegraft keeps what it caches on disk: one root, a folder per kind.

``$CODEGRAFT_CACHE_DIR`` when set, else ``~/.cache/codegraft``; under it ``compiled/``
(compiled partitions), ``c/`` (the C toolchain's libraries), ``placement/`` (measured
placement's timings).  Nothing here is created until a cache writes.

Example::

    cache_root()                  # PosixPath('/home/me/.cache/codegraft')
    cache_folder("compiled")      # PosixPath('/home/me/.cache/codegraft/compiled')
"""

from __future__ import annotations

import os
import pathlib

CACHE_ENV = "CODEGRAFT_CACHE_DIR"


def cache_root() -> pathlib.Path:
    """``$CODEGRAFT_CACHE_DIR``, else ``~/.cache/codegraft`` (read at each call: tests move it)."""
    root = os.environ.get(CACHE_ENV)
    return pathlib.Path(root) if root else pathlib.Path.home() / ".cache" / "codegraft"


def cache_folder(kind: str) -> pathlib.Path:
    """The folder of one kind of cache under :func:`cache_root` (not created)."""
    return cache_root() / kind


__all__ = ["CACHE_ENV", "cache_folder", "cache_root"]
