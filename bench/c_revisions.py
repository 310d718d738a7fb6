"""The ``c`` backend of this tree against itself at an earlier git revision, in one process.

Run from the repository root::

    .venv/bin/python -m bench.c_revisions --against main [--threads 1,2] [--models squeezenet,resnet50]
                                          [--repeat 40] [--busy 1] [--idle 50]

Each light model (random weights, ``codegraft.testing.light_model``) is compiled by this
tree's ``c`` backend and, in a subprocess importing the other revision's ``codegraft`` (from
``git archive``), by the old one; both blobs are then loaded side by side in *this* process
(two libraries, two thread pools) and timed alternately in blocks of calls, so a burst of load
from other jobs hits both alike.  Printed per model and thread count: median wall ms of each,
the ratio new / old (below 1: faster now), and the CPU time per call of each (a pool that
spins where it should sleep burns CPU here even when its wall time looks fine).  Outputs of
the two are compared (they must agree to 1e-4 relative).

``--busy N`` starts N processes that spin on a core for the whole run: the machine is then
oversubscribed at 2 threads on 2 cores, which is where a pool's waiting strategy shows.
``--pair`` runs a second copy of the bench at the same time, and both switch between new and
old on the same wall-clock slots (``--slot`` seconds), so two processes running the *same*
variant compete for the cores, as two services on one machine would (calls that straddle a
slot boundary are not counted).
"""

from __future__ import annotations

import argparse
import functools
import json
import multiprocessing
import os
import pathlib
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable

import numpy as np
import onnx
import onnx_ir as ir

from codegraft.backend import Partition
from codegraft.backends.c import CBackend
from codegraft.testing import light_model

ROOT = pathlib.Path(__file__).resolve().parent.parent

# Compiles each model file given on the command line with the old revision's backend.
_OLD_COMPILER = """
import json, pathlib, sys
import onnx, onnx_ir as ir
from codegraft.backend import Partition
from codegraft.backends.c import CBackend
import codegraft
assert pathlib.Path(codegraft.__file__).is_relative_to(pathlib.Path(sys.argv[2])), codegraft.__file__
jobs = json.loads(sys.argv[1])
for model_path, threads, out in jobs:
    backend = CBackend(num_threads=threads, cache_dir=pathlib.Path(out).parent / "cache-old")
    blob = backend.compile(Partition("bench", ir.from_proto(onnx.load(model_path))))
    pathlib.Path(out).write_bytes(blob)
"""


def old_blobs(revision: str, jobs: list[tuple[str, int, str]], folder: pathlib.Path) -> None:
    """Compile ``(model file, threads, blob file)`` jobs with ``codegraft`` as of ``revision``."""
    archive = folder / "old.tar"
    with archive.open("wb") as f:
        subprocess.run(["git", "-C", str(ROOT), "archive", revision, "codegraft"], stdout=f, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(folder / "old", filter="data")
    env = {**os.environ, "PYTHONPATH": str(folder / "old")}
    # Run in the old tree's folder: `python -c` puts the working directory before PYTHONPATH,
    # and from the repository root that imported *this* tree's codegraft as "old".
    subprocess.run([sys.executable, "-c", _OLD_COMPILER, json.dumps(jobs), str(folder / "old")], env=env,
                   cwd=folder / "old", check=True)


def alternate(calls: dict[str, Callable[[], object]], repeat: int, block: int,
              slot: float | None = None, idle: float = 0.0) -> dict[str, tuple[float, float]]:
    """Median wall ms and median CPU ms per call of each callable, timed in alternating blocks
    (or, with ``slot``, each in its own wall-clock slots of that many seconds, in turn); with
    ``idle``, each timed call comes that many seconds after the one before, as a service's
    calls come between idle spells (the pool's workers asleep by then)."""
    for call in calls.values():
        call()
        call()
    wall: dict[str, list[float]] = {name: [] for name in calls}
    cpu: dict[str, list[float]] = {name: [] for name in calls}
    names = list(calls)
    if slot is not None:
        while min(len(v) for v in wall.values()) < repeat:
            index = int(time.time() / slot)
            name = names[index % len(names)]
            w0, c0 = time.perf_counter(), time.process_time()
            calls[name]()
            w1, c1 = time.perf_counter(), time.process_time()
            if int(time.time() / slot) == index:
                wall[name].append(w1 - w0)
                cpu[name].append(c1 - c0)
    for _ in range(0 if slot is not None else max(1, -(-repeat // block))):
        for name, call in calls.items():
            for _ in range(block):
                if idle:
                    time.sleep(idle)
                w0, c0 = time.perf_counter(), time.process_time()
                call()
                wall[name].append(time.perf_counter() - w0)
                cpu[name].append(time.process_time() - c0)
    return {name: (statistics.median(wall[name]) * 1e3, statistics.median(cpu[name]) * 1e3) for name in calls}


def meet(folder: pathlib.Path, what: str, role: str) -> None:
    """Wait until the paired process is ready for ``what`` too (both leave a file, then poll)."""
    (folder / f"{what}-{role}").touch()
    other = folder / f"{what}-{'b' if role == 'a' else 'a'}"
    while not other.exists():
        time.sleep(0.05)


def _spin() -> None:
    while True:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", required=True, help="git revision to compare with (e.g. main, HEAD~3)")
    parser.add_argument("--threads", default="1,2", help="thread counts, comma-separated")
    parser.add_argument("--models", default="squeezenet,resnet50,inception_v1,densenet121")
    parser.add_argument("--repeat", type=int, default=40)
    parser.add_argument("--block", type=int, default=5)
    parser.add_argument("--busy", type=int, default=0, help="processes spinning on a core meanwhile")
    parser.add_argument("--idle", type=float, default=0.0, help="ms of idleness before each timed call")
    parser.add_argument("--pair", action="store_true", help="run a second copy at once, same variant in step")
    parser.add_argument("--slot", type=float, default=None, help="seconds per variant slot (default 1 with --pair)")
    parser.add_argument("--rendezvous", type=pathlib.Path, default=None, help=argparse.SUPPRESS)  # --pair's copy
    args = parser.parse_args()
    counts = [int(t) for t in args.threads.split(",")]
    if args.pair and args.slot is None:
        args.slot = 1.0
    partner = None
    role = "b" if args.rendezvous else "a"
    if args.pair:  # the copy does not pair again; both time in the same slots, starting together
        args.rendezvous = pathlib.Path(tempfile.mkdtemp(prefix="codegraft-pair-"))
        argv = [a for a in sys.argv[1:] if a != "--pair"] + ([] if "--slot" in sys.argv else ["--slot", str(args.slot)])
        argv += ["--rendezvous", str(args.rendezvous)]
        partner = subprocess.Popen([sys.executable, "-m", "bench.c_revisions", *argv], cwd=ROOT,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    names = args.models.split(",")
    with tempfile.TemporaryDirectory(prefix="codegraft-revs-") as tmp:
        folder = pathlib.Path(tmp)
        jobs = []
        for name in names:
            onnx.save(light_model(name), folder / f"{name}.onnx")
            jobs += [(str(folder / f"{name}.onnx"), t, str(folder / f"{name}-{t}.blob")) for t in counts]
        old_blobs(args.against, jobs, folder)
        hogs = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(args.busy)]
        for hog in hogs:
            hog.start()
        try:
            how = f"in {args.slot} s slots" if args.slot else f"blocks of {args.block}"
            how += f", {args.idle:g} ms idle before each call" if args.idle else ""
            print(f"new = this tree, old = {args.against}; median of {args.repeat} calls, {how}; "
                  f"{args.busy} spinning process(es){', a paired copy' if args.pair else ''}; "
                  f"load average before: {os.getloadavg()[0]:.2f}")
            print("| model | threads | new ms | old ms | new / old | new CPU ms | old CPU ms |")
            print("|---|---:|---:|---:|---:|---:|---:|")
            for name in names:
                model = onnx.load(folder / f"{name}.onnx")
                partition = Partition("bench", ir.from_proto(model))
                rng = np.random.default_rng(0)
                dims = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input}
                inputs = [rng.standard_normal(dims[n]).astype(np.float32) for n in partition.input_names]
                for threads in counts:
                    backend = CBackend(num_threads=threads, cache_dir=folder / "cache-new")
                    new = backend.load(backend.compile(partition))
                    old = backend.load((folder / f"{name}-{threads}.blob").read_bytes())
                    for a, b in zip(new.run(inputs), old.run(inputs), strict=True):
                        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4 * float(np.abs(b).max()))
                    if args.rendezvous is not None:
                        meet(args.rendezvous, f"{name}-{threads}", role)
                    times = alternate({"new": functools.partial(new.run, inputs),
                                       "old": functools.partial(old.run, inputs)}, args.repeat, args.block,
                                      args.slot, args.idle / 1e3)
                    (nw, nc), (ow, oc) = times["new"], times["old"]
                    print(f"| {name} | {threads} | {nw:.2f} | {ow:.2f} | {nw / ow:.3f} | {nc:.2f} | {oc:.2f} |",
                          flush=True)
        finally:
            for hog in hogs:
                hog.kill()
            if partner is not None:
                lines = partner.communicate()[0].splitlines()
                print("the paired copy:\n" + "\n".join(lines[-2 - len(names) * len(counts):]))


if __name__ == "__main__":
    main()
