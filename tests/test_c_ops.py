"""The ``c`` backend's shape: its C text ships with the package and keys its caches."""

from __future__ import annotations

import pathlib
import tomllib

from codegraft.backends.c import CBackend
from codegraft.backends.c._c_files import c_file
from codegraft.backends.c._toolchain import source_version

ROOT = pathlib.Path(__file__).resolve().parent.parent
C_DIR = ROOT / "codegraft" / "backends" / "c"


def _c_files() -> list[pathlib.Path]:
    return sorted(C_DIR.rglob("*.c"))


def test_every_c_file_is_package_data() -> None:
    """A ``.c`` file a wheel leaves out would be a FileNotFoundError at the first compile."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    patterns = config["tool"]["setuptools"]["package-data"]["codegraft"]
    package = ROOT / "codegraft"
    assert _c_files()
    for path in _c_files():
        relative = path.relative_to(package)
        assert any(relative.match(p) for p in patterns), f"{relative} is not in [tool.setuptools.package-data]"
        assert c_file(str(path.relative_to(C_DIR).as_posix())) == path.read_text(encoding="utf-8")


def test_the_backend_version_covers_the_c_text() -> None:
    """Editing a kernel's C must change ``CBackend.version`` (measured timings are cached by it)."""
    assert CBackend.version == source_version(C_DIR, "**/*.py", "**/*.c")
    assert CBackend.version != source_version(C_DIR, "**/*.py")
