"""The ``dnnl`` backend against onnxruntime alone and OpenVINO alone, on the issue-13 models.

Run from the repository root::

    .venv/bin/python -m bench.dnnl_models [--runs 20] [--threads 2] [--write bench/DNNL_RESULTS.md]

Each model is an onnx wheel light model with random weights (``codegraft.testing.light_model``),
run whole by ``codegraft[dnnl]`` (one partition) and by the peers as their users run them
(default session options, the same thread count), in the same process, configurations
alternating in blocks (``codegraft.cli.bench.compare``); medians are reported with the
ratio to the best peer.  The load average before and after is recorded: on a shared machine
only the side-by-side ratios mean anything.
"""

from __future__ import annotations

import argparse
import datetime
import os
import pathlib
import sys
import tempfile

from codegraft.cli.bench import BenchTable, compare
from codegraft.testing import light_model

MODELS = ("resnet50", "densenet121", "inception_v1", "vgg19", "squeezenet")
CONFIGS = ("onnxruntime", "openvino", "codegraft[dnnl]")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=list(MODELS))
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--write", type=pathlib.Path, default=None, help="write the Markdown results here")
    args = parser.parse_args(argv)
    os.environ.setdefault("CODEGRAFT_CACHE_DIR", tempfile.mkdtemp(prefix="codegraft-bench-"))
    load_before = os.getloadavg()[0]
    tables = []
    for name in args.models:
        print(f"== {name}", file=sys.stderr, flush=True)
        table = compare(light_model(name), ["dnnl"], runs=args.runs, threads=args.threads, measured=False, name=name)
        print(table.render() + "\n", flush=True)
        tables.append(table)
    text = render(tables, args.threads, args.runs, (load_before, os.getloadavg()[0]))
    print(text)
    if args.write is not None:
        args.write.write_text(text)
    return 0


def render(tables: list[BenchTable], threads: int, runs: int, load: tuple[float, float]) -> str:
    """The ratio table (median / best peer median) as Markdown."""
    lines = [
        "# dnnl against the peers (`python -m bench.dnnl_models`)",
        "",
        f"{datetime.date.today()}; {threads} threads everywhere, median of {runs} runs per configuration, "
        f"configurations alternating; load average {load[0]:.1f} before, {load[1]:.1f} after "
        f"({os.cpu_count()} cores).",
        "",
        "| model | " + " | ".join(CONFIGS) + " | dnnl error vs onnxruntime |",
        "|---|" + "---:|" * (len(CONFIGS) + 1),
    ]
    for table in tables:
        rows = {row.config: row for row in table.rows}
        cells = [f"{rows[c].ratio:.2f}x" if c in rows else "" for c in CONFIGS]
        dnnl = rows.get("codegraft[dnnl]")
        error = f"{dnnl.max_rel_error:.1e}" if dnnl is not None else ""
        lines.append(f"| {table.model} | " + " | ".join(cells) + f" | {error} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
