"""codegraft's version, in a module of its own so that the artifact writer can record it
without importing the facade (which imports the artifact writer)."""

__version__ = "0.1.0"
