"""A corpus model compiled by this tree and by another checkout, timed against each other in one process.

Run from the repository root::

    .venv/bin/python -m bench.corpus_revisions --against-tree ../other-checkout --model nudenet_320n [--threads 2]

Each tree compiles the model (its free dimensions fixed to the corpus's sizes, so nothing is
compiled at run time by the loading tree) and saves an artifact; both artifacts are loaded
here and called alternately, call by call, so a noisy neighbour slows both alike.  Prints the
medians, their ratio and how far the two outputs differ.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnx

from bench.corpus import MODELS

_COMPILE = (
    "import sys, codegraft as cg; "
    "cg.compile(sys.argv[1], targets=sys.argv[2].split(','), threads=int(sys.argv[3])).save(sys.argv[4])"
)


def fixed_dims(proto: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> onnx.ModelProto:
    """A copy of ``proto`` whose inputs have the feeds' sizes (no free dimension left)."""
    fixed = onnx.ModelProto()
    fixed.CopyFrom(proto)
    for value in fixed.graph.input:
        if value.name in feeds:
            for dim, size in zip(value.type.tensor_type.shape.dim, feeds[value.name].shape, strict=False):
                dim.ClearField("dim_param")
                dim.dim_value = size
    return fixed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--against-tree", required=True, type=pathlib.Path, help="a checkout of the other revision")
    parser.add_argument("--model", required=True)
    parser.add_argument("--targets", default="c")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=60)
    args = parser.parse_args()
    model = next(m for m in MODELS if m.name == args.model)
    proto = model.load()
    feeds = model.feeds(proto)
    with tempfile.TemporaryDirectory(prefix="codegraft-revisions-") as temporary:
        _compare(pathlib.Path(temporary), proto, feeds, args)


def _compare(
    folder: pathlib.Path, proto: onnx.ModelProto, feeds: dict[str, np.ndarray], args: argparse.Namespace
) -> None:
    import codegraft as cg

    onnx.save(fixed_dims(proto, feeds), folder / "model.onnx")
    here = pathlib.Path(__file__).resolve().parent.parent
    for tree, name in ((args.against_tree.resolve(), "old.cgx"), (here, "new.cgx")):
        command = [sys.executable, "-c", _COMPILE, str(folder / "model.onnx"), args.targets, str(args.threads),
                   str(folder / name)]  # fmt: skip
        subprocess.run(command, env={**os.environ, "PYTHONPATH": str(tree)}, cwd=tree, check=True)
    new, old = cg.load_executable(folder / "new.cgx"), cg.load_executable(folder / "old.cgx")
    ours, theirs = new.run(feeds), old.run(feeds)
    off = max(float(np.abs(ours[k] - theirs[k]).max() / max(float(np.abs(theirs[k]).max()), 1e-6)) for k in theirs)
    times: dict[str, list[float]] = {"new": [], "old": []}
    for round_ in range(args.repeat + 2):
        for label, exe in (("new", new), ("old", old))[:: 1 if round_ % 2 else -1]:
            start = time.perf_counter()
            exe.run(feeds)
            if round_ >= 2:  # two warm-up rounds
                times[label].append(time.perf_counter() - start)
    new_ms, old_ms = (statistics.median(times[k]) * 1e3 for k in ("new", "old"))
    print(f"{args.model}, {args.threads} threads, targets {args.targets}: new {new_ms:.3f} ms, old {old_ms:.3f} ms, "
          f"new / old {new_ms / old_ms:.3f}; outputs differ by {off:.1e} relative")  # fmt: skip


if __name__ == "__main__":
    main()
