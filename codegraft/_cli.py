"""The console script's old entry point, kept for environments installed before the move.

NOTE: ``pip install -e .`` writes ``codegraft = codegraft.cli.main:main`` into existing virtual
environments; pyproject now names :mod:`codegraft.cli.main`, and this shim keeps those
environments working without a reinstall.
"""

from codegraft.cli.main import app, main

__all__ = ["app", "main"]

if __name__ == "__main__":  # python -m codegraft.cli.main
    main()
