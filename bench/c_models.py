"""Whole-model latency of the ``c`` backend against onnxruntime, and the C_RESULTS.md table.

Run from the repository root::

    .venv/bin/python -m bench.c_models [--threads 1,4,16] [--models resnet50,vgg19] [--repeat R]
                                       [--idle MS] [--measure-threads] [--write bench/C_RESULTS.md]

On a machine with nothing installed but numpy, onnx, onnx-ir, onnxscript, onnxruntime and a C
compiler, from a plain copy of the repository: ``PYTHONPATH=. python3 -m bench.c_models
--threads 1,4,16``.

Each light model of the onnx wheel (random weights, see ``codegraft.testing.light_model``)
whose nodes are all supported is compiled as one ``c`` partition and timed against an
onnxruntime session of the same model (default session options: spinning on, as users run
it), same thread count, in the same process, alternating in blocks of calls (see
:func:`bench.c_ops.median_pair`).  With several thread counts (``--threads 1,4,16``) each
model is compiled and timed at each count, and a scaling table follows: the ratio
``c / onnxruntime`` per thread count and ``c``'s milliseconds, with models whose ``c`` time
grows from one thread count to the next flagged (issue 18: none may), each flagged step timed
a second time and reported as confirmed or not.  With ``--idle MS`` every timed call comes
after a quiet spell of MS (begun once the other engine's workers stopped spinning), as a
service's requests do, so each engine's workers have gone to sleep and the call includes
waking them.  With ``--measure-threads`` ``c`` is compiled with ``CBackend(measure_threads=True)``:
each kernel's thread count measured on this machine instead of estimated.  Targets (issue 4): resnet50,
vgg19 and squeezenet within 1.5x of onnxruntime.  With ``--write`` the per-op table of
``bench.c_ops`` is run too and both tables go into the results file.
"""

from __future__ import annotations

import argparse
import datetime
import logging
import os
import pathlib
import platform

import onnx_ir as ir

from bench.c_ops import (
    Row,
    compare,
    conv_cases,
    elementwise_cases,
    gemm_cases,
    measured_fma_gflops,
    other_cases,
    peak_gflops,
    table,
)
from codegraft.backends.c import CBackend
from codegraft.backends.c._toolchain import usable_cpus
from codegraft.testing import light_model

MODELS = [
    "resnet50", "vgg19", "squeezenet", "densenet121", "inception_v1", "inception_v2", "shufflenet", "bvlc_alexnet",
    "zfnet512",
]


# fp32 against onnxruntime on random inputs: over this, the timing is of a wrong result
MAX_ERROR = 1e-4

# Calls per side before switching, each block started once the other side's workers stopped
# spinning (bench.c_ops.settle), as in a program that runs one engine only; within a block
# each engine's own spinning between calls helps it, as it helps its users.
BLOCK = 5


def model_rows(threads: int, repeat: int, names: list[str] | None = None) -> list[Row]:
    """One row per supported model at one thread count."""
    return scaling_rows([threads], repeat, names)[threads]


def scaling_rows(counts: list[int], repeat: int, names: list[str] | None = None,
                 idle: float = 0.0, measure_threads: bool = False) -> dict[int, list[Row]]:
    """Rows per thread count: each model compiled (the plan depends on the count; with
    ``measure_threads``, measured on this machine: ``CBackend(measure_threads=True)``) and timed
    (with ``idle`` seconds before each call, call by call: see :func:`bench.c_ops.median_pair`)."""
    rows: dict[int, list[Row]] = {t: [] for t in counts}
    backend = CBackend()
    for name in names or MODELS:
        model = light_model(name)
        declined = [n.op_type for n in ir.from_proto(model).graph if not backend.supports(n)]
        if declined:
            print(f"skip {name}: {sorted(set(declined))} not supported")
            continue
        for threads in counts:
            row = compare(f"light_{name}", model, threads, repeat, block=1 if idle else BLOCK, idle=idle,
                          measure_threads=measure_threads)
            rows[threads].append(row)
            print(f"{row.name} T={threads}: c {row.c_ms:.2f} ms, onnxruntime {row.ort_ms:.2f} ms, "
                  f"ratio {row.ratio:.2f}, c off onnxruntime by {row.error:.1e} relative", flush=True)
    return rows


def scaling_table(rows: dict[int, list[Row]]) -> str:
    """``| model | T=1 | T=4 | ... | c ms at 1 / 4 / ... threads | onnxruntime ms ... |`` plus flags.

    Example (issue 18's layout)::

        | model | T=1 | T=4 | T=16 | c ms at 1 / 4 / 16 threads | onnxruntime ms at 1 / 4 / 16 threads |
        | light_resnet50 | 1.20x | 1.58x | 1.26x | 150 / 39.4 / 12.8 | 125 / 24.9 / 10.2 |
    """
    counts = list(rows)
    at = " / ".join(map(str, counts))
    lines = [
        f"| model | {' | '.join(f'T={t}' for t in counts)} | c ms at {at} threads | onnxruntime ms at {at} threads |",
        "|---|" + "---:|" * (len(counts) + 2),
    ]
    for i, name in enumerate(row.name for row in rows[counts[0]]):
        line = [rows[t][i] for t in counts]
        c_ms = " / ".join(f"{r.c_ms:.3g}" for r in line)
        ort_ms = " / ".join(f"{r.ort_ms:.3g}" for r in line)
        lines.append(f"| {name} | {' | '.join(f'{r.ratio:.2f}x' for r in line)} | {c_ms} | {ort_ms} |")
    slower = [f"{name} ({a}->{b} threads)" for name, a, b in slower_steps(rows)]
    wrong = [f"{r.name} at {t} threads ({r.error:.1e})" for t in counts for r in rows[t] if r.error > MAX_ERROR]
    lines.append("")
    lines.append(f"c slower with more threads: {', '.join(slower) if slower else 'none'}")
    lines.append(f"c off onnxruntime by over {MAX_ERROR:g} relative: {', '.join(wrong) if wrong else 'none'}")
    return "\n".join(lines)


def slower_steps(rows: dict[int, list[Row]]) -> list[tuple[str, int, int]]:
    """``(model, fewer, more)`` for each step up in threads where ``c``'s time grew."""
    counts = list(rows)
    steps = []
    for i, name in enumerate(row.name for row in rows[counts[0]]):
        for a, b in zip(counts[:-1], counts[1:], strict=True):
            if rows[b][i].c_ms > rows[a][i].c_ms:
                steps.append((name, a, b))
    return steps


def second_timing(steps: list[tuple[str, int, int]], repeat: int, idle: float = 0.0,
                  measure_threads: bool = False) -> list[str]:
    """Each flagged step timed again (both thread counts, freshly compiled): on a shared machine
    a burst of other work during one count's block can flag a model that is not slower.
    Both timings are printed; a step counts as confirmed only if the second one agrees."""
    lines = []
    for name, a, b in steps:
        again = scaling_rows([a, b], repeat, [name.removeprefix("light_")], idle, measure_threads)
        ta, tb = again[a][0].c_ms, again[b][0].c_ms
        verdict = "confirmed" if tb > ta else "not confirmed"
        lines.append(f"second timing of {name}: c {ta:.3g} ms at {a} threads, {tb:.3g} ms at {b} ({verdict})")
    return lines


def _counts(text: str) -> list[int]:
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--threads: expected counts like 1,4,16, got {text!r}") from None
    if not counts or any(c < 1 for c in counts):
        raise argparse.ArgumentTypeError(f"--threads: counts must be positive integers, got {text!r}")
    return counts


def _load() -> str:
    try:
        return " / ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        return "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=_counts, default=[usable_cpus()],
                        help="thread counts, comma-separated (e.g. 1,4,16); --write uses the last")
    parser.add_argument("--models", default=None, help=f"comma-separated subset of {','.join(MODELS)}")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--write", type=pathlib.Path, default=None, help="write the Markdown results here")
    parser.add_argument("--idle", type=float, default=0.0,
                        help="ms of quiet before each timed call, as between a service's requests")
    parser.add_argument("--measure-threads", action="store_true",
                        help="c's threads per kernel measured on this machine at compile time, not estimated")
    args = parser.parse_args()
    names = args.models.split(",") if args.models else None
    unknown = sorted(set(names or []) - set(MODELS))
    if unknown:
        parser.error(f"--models: unknown {unknown}; choose from {', '.join(MODELS)}")
    load_before = _load()
    if args.idle:
        print(f"each call after {args.idle:g} ms of quiet (both engines' workers asleep by then)")
    if args.measure_threads:
        print("c: CBackend(measure_threads=True), each kernel's threads measured on this machine")
        logging.basicConfig(format="%(message)s")
        logging.getLogger("codegraft").setLevel(logging.INFO)  # what each measurement kept
    scaling = scaling_rows(args.threads, args.repeat, names, args.idle / 1e3, args.measure_threads)
    args.threads = args.threads[-1]
    models = scaling[args.threads]
    print(table(models))
    if len(scaling) > 1:
        print(scaling_table(scaling))
        for line in second_timing(slower_steps(scaling), args.repeat, args.idle / 1e3, args.measure_threads):
            print(line)
    if args.write is None:
        return
    peak, how = peak_gflops(args.threads)
    # One core's FMA rate, measured alone (robust when other jobs share the machine), times threads.
    per_core = measured_fma_gflops(1)
    gemm = gemm_cases() + conv_cases()
    single = [compare(name, model, 1, args.repeat * 2, flops) for name, model, flops in gemm]
    ops = [compare(name, model, args.threads, args.repeat * 2, flops)
           for name, model, flops in gemm + elementwise_cases() + other_cases()]
    text = [
        "# `c` backend: latency against onnxruntime",
        "",
        f"Generated by `python -m bench.c_models --write {args.write}` on "
        f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, {platform.machine()}, "
        f"{args.threads} threads for both sides unless stated, median of {args.repeat} (models) / "
        f"{args.repeat * 2} (ops) calls, c and onnxruntime (default session options) alternating "
        f"in blocks of {BLOCK} calls (models) / call by call (ops).  "
        f"Load average (1/5/15 min) before: {load_before}; after: {_load()} - this machine is shared "
        "with other jobs, so absolute times move between runs; the ratios, measured side by side, "
        "are the figures to read.",
        "",
        "## Models (one `c` partition each, every node on `c`)",
        "",
        "Targets (issue 4): resnet50, vgg19 and squeezenet within 1.5x of onnxruntime.",
        "",
        table(models),
        "",
        "## GEMM and convolution, one thread",
        "",
        "One thread on each side: on a shared machine this is the cleanest measure of the kernels.",
        "",
        table(single, per_core),
        "",
        f"## Ops and fused chains, {args.threads} threads",
        "",
        "One partition per row; the NCHW <-> NHWC conversions at the partition's edges are included "
        "(inside a model they happen once per partition, not per op), which is most of the cost of "
        "the pool and depthwise rows.",
        "",
        table(ops, per_core * args.threads if per_core else peak),
        "",
        "Peak FLOP/s: measured with an AVX-512 FMA loop (12 independent chains) on one thread: "
        f"{f'{per_core:.0f} GFLOP/s per core' if per_core else 'n/a'}; '% of peak' divides by that "
        "times the thread count.  For reference, the nominal figure: "
        f"{how} (the clock a VM's /proc/cpuinfo reports is the base clock; the cores run faster).",
        "",
    ]
    args.write.write_text("\n".join(text))
    print(f"wrote {args.write}")


if __name__ == "__main__":
    main()
