"""Corpus models on codegraft's targets against onnxruntime alone, timed the way ``bench.c_models`` times.

Run from the repository root::

    .venv/bin/python -m bench.corpus_vs [--targets c] [--only nudenet,ppocr] [--threads 2] [--repeat 60]
        [--fixed-shapes] [--bind sr]

``bench.corpus`` checks every model and times three engines in three rounds; this one times
codegraft (compiled for ``--targets``, the host taking the rest) against onnxruntime with its
default session options in blocks of 5 calls per engine, each block started once the other
engine's workers stopped spinning (``bench.c_ops.median_pair``): onnxruntime's workers spin
for milliseconds after a call, and timed call by call they share the cores with the next
codegraft call (ddddocr_det read 1.53x that way, 1.02x in blocks).  To compare two revisions,
run it in both trees.
"""

from __future__ import annotations

import argparse
from functools import partial

from bench.c_ops import median_pair, ort_session
from bench.corpus import MODELS, fetch, missing


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--targets", default="c", help="codegraft's targets, comma-separated")
    parser.add_argument("--only", default="", help="models whose name contains this (comma-separated: any of these)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=60)
    parser.add_argument("--fixed-shapes", action="store_true",
                        help="compile for the sizes fed (input_shapes), as a deployment that knows them")  # fmt: skip
    parser.add_argument("--bind", default="", help="inputs bound to the values fed (input_values), comma-separated: sr")
    args = parser.parse_args()
    import codegraft as cg

    wanted = [w for w in args.only.split(",") if w] or [""]
    chosen = tuple(m for m in MODELS if any(w in m.name for w in wanted))
    if missing(chosen):
        fetch(chosen)
    targets = args.targets.split(",")
    print(f"codegraft ({', '.join(targets)}) against onnxruntime, {args.threads} threads, "
          f"median of {args.repeat} calls in blocks of 5")  # fmt: skip
    print("| model | codegraft ms | onnxruntime ms | codegraft / onnxruntime |")
    print("|---|---:|---:|---:|")
    for model in chosen:
        proto = model.load()
        feeds = model.feeds(proto)
        fixed = args.fixed_shapes or model.shapes_given  # rvm's states reuse a name for sizes that differ
        shapes = {name: array.shape for name, array in feeds.items()} if fixed else None
        values = {name: feeds[name] for name in args.bind.split(",") if name in feeds}
        exe = cg.compile(proto, targets=targets, threads=args.threads, input_shapes=shapes, input_values=values)
        session = ort_session(proto, args.threads)
        ours, theirs = median_pair(partial(exe.run, feeds), partial(session.run, None, feeds), args.repeat, block=5)
        print(f"| {model.name} | {ours:.3f} | {theirs:.3f} | {ours / theirs:.2f} |", flush=True)


if __name__ == "__main__":
    main()
