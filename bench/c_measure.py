"""What ``CBackend(measure_threads=True)`` finds for a light model on this machine.

Run from the repository root::

    .venv/bin/python -m bench.c_measure [--model squeezenet,shufflenet] [--threads 16] [--rounds 7]

For each model, the measurement ``c:measure-threads`` makes at compile time
(``codegraft/backends/c/_thread_measure.py``), printed: every kernel's median ms with all
kernels at 1, 2, 4, ... threads, the count it picked and the cost model's, then each whole-model
plan timed (the cost model's, the picked counts, with and without branches side by side, the
cost model's for fewer threads) and the one kept.  Where the picked counts and the cost
model's differ, the rows say which kernels the cost model misjudges on this machine; where a
plan for fewer threads is kept, the model was slower on all of them.
"""

from __future__ import annotations

import argparse

import onnx_ir as ir

from codegraft.backends.c._codegen import generate
from codegraft.backends.c._thread_measure import measure
from codegraft.backends.c._toolchain import Toolchain, host_target, usable_cpus
from codegraft.testing import light_model


def report(name: str, threads: int, rounds: int) -> str:
    """The measurement of light model ``name`` up to ``threads`` threads, as Markdown."""
    model = ir.from_proto(light_model(name))
    target = host_target()
    found = measure(model, target, threads, Toolchain(), rounds)
    kernels = generate(model, target, threads).threads
    names = [f"{k.node} ({k.kernel.split(' => ')[0]})" for k in kernels]
    differ = [i for i, (a, b) in enumerate(zip(found.picked, found.estimated, strict=True)) if a != b]
    lines = [f"## {name}, measured up to {threads} threads", "", found.table(names)]
    if differ:
        lines += ["", "kernels whose picked count is not the cost model's: "
                  + ", ".join(f"{names[i]} {found.estimated[i]} -> {found.picked[i]}" for i in differ)]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="squeezenet,shufflenet", help="comma-separated light models")
    parser.add_argument("--threads", type=int, default=usable_cpus(), help="the most threads (default: every CPU)")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    if args.threads < 1:
        parser.error(f"--threads must be at least 1, got {args.threads}")
    for name in args.model.split(","):
        print(report(name.strip(), args.threads, args.rounds), flush=True)
        print()


if __name__ == "__main__":
    main()
