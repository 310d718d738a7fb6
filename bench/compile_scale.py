"""Compile time at scale: ``codegraft inspect ladder.onnx -t c --json`` end to end, per stage.

The ladders are what exported sequence models look like to the pipeline: a chain of
Conv(1x1) -> Add(skip) -> Relu rungs with a Sigmoid gate (``x * sigmoid(x)``) every fourth
rung, ``nodes`` nodes in all, every one of them taken by the ``c`` backend.  Each size is
timed as a user runs it: a fresh process running the CLI (Python start-up and imports
included), ``--repeat`` times, the median reported, with the time per stage from the report
the command prints and the growth from one size to the next.

``--baseline DIR`` also times an older checkout (a folder holding its ``codegraft`` package)
on the same files, alternating run by run with this one, and prints both CPU and wall ratios;
the machine's load average is printed before and after, since a shared machine moves absolute
times (CPU seconds move least).  Each checkout runs from its own folder with its bytecode
cached, as an installed package runs (its first run writes the cache).

``--recompile`` times ``codegraft.compile`` of the onnx wheel's ``light_resnet50.onnx`` for
``c`` in one process, ``--repeat`` rounds alternating four kinds: cold (empty caches: the C
compiler runs), without the compiled-partition cache (C libraries cached: what a recompile
cost before it), a cache hit reading its entries from disk (as a new process does) and one
served from memory; wall and CPU time (the C compiler's included), medians.

Run: ``python -m bench.compile_scale [--sizes 1000 10000 100000] [--repeat 3] [--recompile]``
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = pathlib.Path(__file__).resolve().parent.parent


def ladder(nodes: int, *, channels: int = 4, size: int = 8, seed: int = 0) -> onnx.ModelProto:
    """A Conv/Add/Relu ladder with a Sigmoid gate every fourth rung, about ``nodes`` nodes."""
    rng = np.random.default_rng(seed)
    initializers: list[onnx.TensorProto] = []
    graph_nodes: list[onnx.NodeProto] = []
    previous = skip = "x"
    rung = 0
    while len(graph_nodes) < nodes:
        weight, bias = f"w{rung}", f"b{rung}"
        initializers.append(numpy_helper.from_array(
            (rng.standard_normal((channels, channels, 1, 1)) * 0.3).astype(np.float32), weight))
        initializers.append(numpy_helper.from_array((rng.standard_normal(channels) * 0.1).astype(np.float32), bias))
        graph_nodes += [
            helper.make_node("Conv", [previous, weight, bias], [f"c{rung}"], name=f"conv{rung}"),
            helper.make_node("Add", [f"c{rung}", skip], [f"a{rung}"], name=f"add{rung}"),
            helper.make_node("Relu", [f"a{rung}"], [f"r{rung}"], name=f"relu{rung}"),
        ]
        previous = f"r{rung}"
        if rung % 4 == 3:
            graph_nodes += [
                helper.make_node("Sigmoid", [previous], [f"s{rung}"], name=f"sigmoid{rung}"),
                helper.make_node("Mul", [previous, f"s{rung}"], [f"g{rung}"], name=f"gate{rung}"),
            ]
            previous = f"g{rung}"
        skip = previous
        rung += 1
    shape = [1, channels, size, size]
    graph = helper.make_graph(
        graph_nodes, "ladder", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info(previous, TensorProto.FLOAT, shape)], initializers,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def inspect_once(path: pathlib.Path, package_root: pathlib.Path) -> tuple[float, float, dict[str, float]]:
    """Wall and CPU seconds of one ``codegraft inspect PATH -t c --json`` in a fresh process,
    and its stages (CPU time moves less than wall time on a loaded machine)."""
    # as installed packages run: bytecode cached (a checkout's first run writes it)
    env = {**os.environ, "PYTHONPATH": str(package_root)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    code = (  # checkouts from before the stage folders have codegraft._cli
        "import sys\ntry:\n    from codegraft.cli.main import main\nexcept ImportError:\n"
        "    from codegraft._cli import main\nsys.argv[0] = 'codegraft'\nmain()"
    )
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", code, "inspect", str(path), "-t", "c", "--json"],
        # run from the checkout: ``python -c`` puts the working folder first on sys.path
        env=env, cwd=package_root, capture_output=True, text=True, check=False,
    )
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    if done.returncode != 0:
        raise RuntimeError(f"inspect of {path} failed under {package_root}: {done.stderr.strip()[-400:]}")
    report = json.loads(done.stdout)
    return seconds, cpu, {s["name"]: s["seconds"] for s in report.get("stages", ())}


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def scale(sizes: list[int], repeat: int, baseline: pathlib.Path | None, folder: pathlib.Path) -> None:
    print(f"load average before: {load()}")
    rows = []
    for size in sizes:
        path = folder / f"ladder_{size}.onnx"
        onnx.save(ladder(size), path)
        ours: list[float] = []
        cpus: list[float] = []
        theirs: list[float] = []
        their_cpus: list[float] = []
        stages: list[dict[str, float]] = []
        their_stages: list[dict[str, float]] = []
        for _ in range(repeat):  # alternate, so both see the same load
            seconds, cpu, stage = inspect_once(path, ROOT)
            ours.append(seconds)
            cpus.append(cpu)
            stages.append(stage)
            if baseline is not None:
                seconds, cpu, stage = inspect_once(path, baseline)
                theirs.append(seconds)
                their_cpus.append(cpu)
                their_stages.append(stage)
        median = statistics.median(ours)
        per_stage = {name: statistics.median(s[name] for s in stages) for name in stages[0]}
        cpu = statistics.median(cpus)
        base = (statistics.median(theirs), statistics.median(their_cpus)) if theirs else None
        rows.append((size, median, cpu, per_stage, base))
        print(f"{size:>7} nodes: median {median:.2f} s (min {min(ours):.2f}, CPU {cpu:.2f}) "
              + " ".join(f"{k} {v:.2f}" for k, v in per_stage.items()), flush=True)
        if base is not None:
            their_per_stage = {name: statistics.median(s[name] for s in their_stages) for name in their_stages[0]}
            print(f"{'':>7}  baseline: median {base[0]:.2f} s (min {min(theirs):.2f}, CPU {base[1]:.2f}) "
                  + " ".join(f"{k} {v:.2f}" for k, v in their_per_stage.items()), flush=True)
    print(f"load average after: {load()}\n")
    names = list(rows[0][3])
    header = "| nodes | end to end (s) | CPU (s) | " + " | ".join(names) + " | growth |"
    header += " baseline (s) | baseline CPU (s) | speed-up (wall, CPU) |" if baseline else ""
    print(header)
    print("|" + "---:|" * (header.count("|") - 1))
    previous: tuple[int, float] | None = None
    for size, median, cpu, per_stage, base in rows:
        growth = f"{size / previous[0]:.0f}x nodes: {median / previous[1]:.1f}x time" if previous else ""
        cells = [f"{size:,}", f"{median:.2f}", f"{cpu:.2f}", *(f"{per_stage.get(n, 0.0):.2f}" for n in names), growth]
        if baseline and base:
            cells += [f"{base[0]:.2f}", f"{base[1]:.2f}", f"{base[0] / median:.1f}x, {base[1] / cpu:.1f}x"]
        elif baseline:
            cells += ["", "", ""]
        print("| " + " | ".join(cells) + " |")
        previous = (size, median)


def recompile(times: int) -> None:
    """Cold, warm-libraries and cached compiles of light_resnet50 for c, alternating, in one process."""
    import gc

    import codegraft as cg
    from codegraft.lower.cache import compile_cache
    from codegraft.testing import light_model_path

    path = str(light_model_path("resnet50"))
    kinds = {
        "cold": "empty caches: the C compiler runs",
        "no partition cache": "C libraries cached, every partition lowered: a recompile before the cache",
        "cache hit, from disk": "entries read and checked, as in a new process",
        "cache hit, in memory": "entries this process read before",
    }
    wall: dict[str, list[float]] = {k: [] for k in kinds}
    cpu: dict[str, list[float]] = {k: [] for k in kinds}
    with tempfile.TemporaryDirectory() as root:
        warm_dir = pathlib.Path(root) / "warm"
        os.environ["CODEGRAFT_CACHE_DIR"] = str(warm_dir)
        os.environ.pop("CODEGRAFT_COMPILE_CACHE", None)
        cg.compile(path, targets=["c"])  # fills the warm folder
        print(f"load average before: {load()}")
        for attempt in range(times):
            for kind in kinds:
                folder = pathlib.Path(root) / f"cold{attempt}" if kind == "cold" else warm_dir
                os.environ["CODEGRAFT_CACHE_DIR"] = str(folder)
                cache = compile_cache()
                if kind == "cache hit, from disk" and cache is not None:
                    cache.forget()
                gc.collect()
                start, start_cpu = time.perf_counter(), _cpu_seconds()
                exe = cg.compile(path, targets=["c"], cache=kind != "no partition cache")
                wall[kind].append(time.perf_counter() - start)
                cpu[kind].append(_cpu_seconds() - start_cpu)
                print(f"light_resnet50 -> c, {kind}: {wall[kind][-1]:.2f} s (CPU {cpu[kind][-1]:.2f})  "
                      + " ".join(f"{s.name} {s.seconds:.2f}" for s in exe.report().stages), flush=True)
                del exe
        print(f"load average after: {load()}")
        hits = compile_cache()
        print(f"partition cache of the warm folder: {hits.stats if hits else 'off'}\n")
    print("| light_resnet50 -> c | median (s) | min (s) | CPU median (s) |")
    print("|---|---:|---:|---:|")
    for kind, what in kinds.items():
        print(f"| {kind} ({what}) | {statistics.median(wall[kind]):.2f} | {min(wall[kind]):.2f} "
              f"| {statistics.median(cpu[kind]):.2f} |")
    before = statistics.median(wall["no partition cache"])
    for kind in ("cache hit, from disk", "cache hit, in memory"):
        print(f"{kind} vs no partition cache: {before / statistics.median(wall[kind]):.1f}x faster "
              f"({times} alternating rounds)")


def _cpu_seconds() -> float:
    """User + system CPU of this process and of the children it waited for (the C compiler)."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=[1_000, 10_000, 100_000])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--baseline", type=pathlib.Path, help="a folder holding an older codegraft package")
    parser.add_argument("--recompile", action="store_true", help="time light_resnet50 compiles instead")
    parser.add_argument("--keep", type=pathlib.Path, help="write the ladders here (default: a temporary folder)")
    args = parser.parse_args()
    if args.recompile:
        recompile(args.repeat)
        return
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
        scale(args.sizes, args.repeat, args.baseline, args.keep)
        return
    with tempfile.TemporaryDirectory() as folder:
        scale(args.sizes, args.repeat, args.baseline, pathlib.Path(folder))


if __name__ == "__main__":
    main()
