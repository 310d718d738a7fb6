"""Per-kernel timers in every generated library, off unless asked for.

NOTE: each kernel of the entry point ends with ``CG_TICK(i)``: one predictable branch on a
flag when timers are off (the normal case), a ``clock_gettime`` and an add when on.  The
kernels run on the pool but the entry point waits for each before the next starts, so the
time between two ticks on the calling thread is that kernel's wall time.  The library
exports the kernel names and kinds, so the runtime needs nothing from the blob to read them
(libraries built before the timers simply lack the symbols: no per-op profile for them).
"""

from __future__ import annotations


def timer_source(names: list[str], kinds: list[str]) -> str:
    """The C definitions: names, counters, ``CG_TICK`` and the exported accessors."""
    count = max(len(names), 1)
    listed = ", ".join(c_string(n) for n in names) or '""'
    typed = ", ".join(c_string(k) for k in kinds) or '""'
    return f"""
#include <time.h>
#define CG_KERNELS {len(names)}
static const char* const cg_kernel_names[{count}] = {{{listed}}};
static const char* const cg_kernel_kinds[{count}] = {{{typed}}};
static double cg_kernel_ns[{count}];
static int cg_timing;
static struct timespec cg_tick_last;
static inline void cg_tick_start(void) {{ if (cg_timing) clock_gettime(CLOCK_MONOTONIC, &cg_tick_last); }}
static inline void cg_tick(int i) {{
  if (!cg_timing) return;
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  cg_kernel_ns[i] += (double)(now.tv_sec - cg_tick_last.tv_sec) * 1e9 + (double)(now.tv_nsec - cg_tick_last.tv_nsec);
  cg_tick_last = now;
}}
int cg_kernel_count(void) {{ return CG_KERNELS; }}
const char* cg_kernel_name(int i) {{ return cg_kernel_names[i]; }}
const char* cg_kernel_kind(int i) {{ return cg_kernel_kinds[i]; }}
double cg_kernel_time_ns(int i) {{ return cg_kernel_ns[i]; }}
void cg_set_timing(int on) {{ cg_timing = on; memset(cg_kernel_ns, 0, sizeof cg_kernel_ns); }}
"""


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
