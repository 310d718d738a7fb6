"""Per-kernel timers in every generated library, off unless asked for.

NOTE: each kernel of the entry point ends with ``CG_TICK(i)``: one predictable branch on a
flag when timers are off (the normal case), a ``clock_gettime`` and an add when on.  The
kernels run on the pool but the entry point waits for each before the next starts, so the
time between two ticks on the calling thread is that kernel's wall time.  The library
exports the kernel names and kinds, so the runtime needs nothing from the blob to read them
(libraries built before the timers simply lack the symbols: no per-op profile for them).
"""

from __future__ import annotations

from codegraft.backends.c._c_files import filled


def timer_source(names: list[str], kinds: list[str]) -> str:
    """The C definitions: names, counters, ``CG_TICK`` and the exported accessors."""
    count = max(len(names), 1)
    listed = ", ".join(c_string(n) for n in names) or '""'
    typed = ", ".join(c_string(k) for k in kinds) or '""'
    return filled("timers.c", kernels=len(names), count=count, names=listed, kinds=typed)


def c_string(text: str) -> str:
    """A C string literal for ``text`` (UTF-8; anything not plain printable ASCII as octal)."""
    out = []
    for byte in text.encode("utf-8"):
        char = chr(byte)
        if char in '"\\?' or not 32 <= byte < 127:  # '?' as octal too: no trigraphs
            out.append(f"\\{byte:03o}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'
