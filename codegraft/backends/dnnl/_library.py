"""Finding oneDNN: the shared library and C headers the pip wheels install.

NOTE: ``onednn-cpu-gomp`` puts ``libdnnl.so.3`` under the environment's ``lib/`` and
``onednn-devel-cpu-gomp`` the headers under ``include/`` (outside site-packages), so we ask
the distributions' own file lists where they are rather than guess paths.
"""

from __future__ import annotations

import ctypes
import os
import pathlib
from dataclasses import dataclass
from functools import cache
from importlib import metadata

RUNTIME_DIST = "onednn-cpu-gomp"
HEADERS_DIST = "onednn-devel-cpu-gomp"
INSTALL_HINT = "pip install 'codegraft[dnnl]'"


@dataclass(frozen=True)
class OneDNN:
    """Where oneDNN is: ``lib/libdnnl.so.3`` and ``include/oneapi/dnnl/dnnl.h``."""

    library: pathlib.Path
    include_dir: pathlib.Path
    version: str

    def link_flags(self) -> tuple[str, ...]:
        """Compiler flags that build a partition against this oneDNN (rpath included)."""
        lib_dir = str(self.library.parent)
        return (f"-I{self.include_dir}", f"-L{lib_dir}", f"-Wl,-rpath,{lib_dir}", "-ldnnl", "-lgomp")

    def load_globally(self) -> None:
        """Load libdnnl before a partition library, so it resolves wherever the rpath points.

        GNU OpenMP's threads spin at barriers by default; on a machine whose cores are shared
        (other processes, or onnxruntime's own pool in the same process) a spinning thread
        holds the core its partner needs.  Measured on the shared 2-core VM (load 24):
        squeezenet 1,924 ms per call spinning, 103 ms passive.  So unless the user chose a
        policy, OpenMP threads sleep when idle; libgomp reads this once, when it is loaded.
        """
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        _load(str(self.library))


class OneDNNNotFound(Exception):
    """oneDNN's runtime or headers are not installed; the message says what to install."""


def find_onednn() -> OneDNN:
    """The installed oneDNN, or :class:`OneDNNNotFound` naming the missing wheel."""
    library = _file_of(RUNTIME_DIST, "libdnnl.so.3")
    header = _file_of(HEADERS_DIST, "oneapi/dnnl/dnnl.h")
    if library is None or header is None:
        missing = RUNTIME_DIST if library is None else HEADERS_DIST
        raise OneDNNNotFound(f"oneDNN is not installed ({missing} not found): {INSTALL_HINT}")
    return OneDNN(library, header.parent.parent.parent, metadata.version(RUNTIME_DIST))


def _file_of(dist_name: str, suffix: str) -> pathlib.Path | None:
    try:
        files = metadata.distribution(dist_name).files or []
    except metadata.PackageNotFoundError:
        return None
    for entry in files:
        if str(entry).endswith(suffix):
            path = pathlib.Path(str(entry.locate())).resolve()
            if path.exists():
                return path
    return None


@cache
def _load(path: str) -> ctypes.CDLL:
    return ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
