"""The ``codegraft`` command: compile, run, inspect, compare, bench, backends, signing and the cache."""

from __future__ import annotations

import contextlib
import gc
import json
import pathlib
from collections.abc import Callable, Iterator
from typing import Annotated, Optional

import numpy as np
import typer
from rich.console import Console
from rich.progress import TaskID
from rich.table import Table

from codegraft.cli.cache import cache_app, clear_command, info_command
from codegraft.cli.sign import SignOption, TrustedKeysOption, keygen_command, sign_command, verify_command
from codegraft.core.gcpause import paused_gc
from codegraft.core.options import MIN_PARTITION_MACS

MIN_PARTITION_MACS_HELP = (
    "Accelerator partitions between host ones with fewer multiply-adds go to the host, and any such partition "
    "on a backend whose calls cost more than the host's (OpenVINO) (0: never)."
)

app = typer.Typer(
    name="codegraft",
    help="Partition ONNX models across accelerator backends; onnxruntime runs the rest.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
# markup=False: messages and names such as ``float32[batch, 3]`` are text, never rich markup.
console = Console(markup=False)
err_console = Console(stderr=True, markup=False)

TargetsOption = Annotated[
    Optional[list[str]],  # noqa: UP045 - typer needs Optional here
    typer.Option("--target", "-t", help="A target backend; repeat in order of preference."),
]


ShapesOption = Annotated[
    Optional[list[str]],  # noqa: UP045
    typer.Option("--shape", help="name=1x3x224x224: the shape of a random input; other inputs' free dimensions "
                 "take the sizes it names (batch), else 1."),
]
FixShapesOption = Annotated[
    Optional[list[str]],  # noqa: UP045
    typer.Option("--shape", help="name=1x512: compile for this input shape (free dimensions fixed, shape "
                 "arithmetic folded); a dimension's name fixed here holds in every input."),
]
BindValuesOption = Annotated[
    Optional[list[str]],  # noqa: UP045
    typer.Option("--value", help="name=16000 (or name=1,2,3): bind this input to this value (what it decides "
                 "folds away); the artifact refuses any other value."),
]
LoadInputsOption = Annotated[
    Optional[pathlib.Path],  # noqa: UP045
    typer.Option("--load-inputs", help="An .npz of inputs by name (from --save-inputs)."),
]
SaveInputsOption = Annotated[
    Optional[pathlib.Path],  # noqa: UP045
    typer.Option("--save-inputs", help="Write the inputs used to this .npz, to feed them again."),
]
SeedOption = Annotated[int, typer.Option(help="Seed of the random inputs.")]
QuietOption = Annotated[
    bool, typer.Option("--quiet", "-q", help="No progress bars (they show only on a terminal anyway)."),
]


def _version(value: bool) -> None:
    if not value:
        return
    import importlib.metadata

    import codegraft

    typer.echo(f"codegraft {codegraft.__version__}")
    for package in ("onnx", "onnx-ir", "onnxscript", "onnxruntime", "openvino", "numpy"):
        try:
            typer.echo(f"  {package} {importlib.metadata.version(package)}")
        except importlib.metadata.PackageNotFoundError:
            typer.echo(f"  {package} not installed")
    raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the versions and exit."),
    ] = False,
) -> None:
    """Partition ONNX models across accelerator backends; onnxruntime runs the rest."""


def _error_line(message: str) -> None:
    """One line on stderr: never wrapped (a pipe or a log keeps it whole), never markup."""
    from rich.text import Text

    # soft_wrap: one line however long (a terminal wraps it; a log or grep keeps it whole)
    text = Text.assemble(("error:", "bold red"), " ", " ".join(message.split()))
    err_console.print(text, soft_wrap=True, highlight=False)


def _fail(message: str) -> None:
    _error_line(message)
    raise typer.Exit(code=2)


def _guard(func):  # type: ignore[no-untyped-def]
    """Turn every error into one clear line, not a stack trace.

    codegraft's own errors say what is wrong and where; anything else is a bug in codegraft,
    said as such on one line (``CODEGRAFT_DEBUG=1`` shows the traceback).
    """
    import functools
    import os

    from codegraft.errors import CodegraftError

    @functools.wraps(func)
    def wrapper(*args, **kwargs):  # type: ignore[no-untyped-def]
        try:
            return func(*args, **kwargs)
        except CodegraftError as error:
            _fail(str(error))
        except (typer.Exit, typer.Abort, KeyboardInterrupt):
            raise
        except Exception as error:
            if os.environ.get("CODEGRAFT_DEBUG"):
                raise
            _error_line(f"internal error (a bug in codegraft; CODEGRAFT_DEBUG=1 shows where): "
                        f"{type(error).__name__}: {error}")
            raise typer.Exit(code=3) from None

    return wrapper


# Set by main(): the process ends when the command returns (not so for a CliRunner in tests).
_process_ends_after_command = False


@contextlib.contextmanager
def _holding_a_whole_model() -> Iterator[None]:
    """Run a command that keeps a whole model's IR alive with the garbage collector paused.

    NOTE: the pipeline's stages pause collection already; between and after them, the first
    collection would walk the millions of IR objects they made (seconds on a 100k-node model)
    to find nothing to free, since the IR is alive until the command ends.  When the process
    ends with the command, what it made is frozen instead (never collected; the memory goes
    back with the process); in a longer-lived process the collector just resumes.
    """
    with paused_gc():
        try:
            yield
        finally:
            if _process_ends_after_command:
                gc.freeze()


@app.command("compile")
@_guard
def compile_command(
    model: Annotated[pathlib.Path, typer.Argument(help="The ONNX model.")],
    targets: TargetsOption = None,
    output: Annotated[
        Optional[pathlib.Path],  # noqa: UP045
        typer.Option("--output", "-o", help="Where to write the artifact (default: the model's name, .cgx, here)."),
    ] = None,
    min_partition_size: Annotated[int, typer.Option(help="Smaller accelerator partitions go to the host.")] = 1,
    min_partition_macs: Annotated[
        int, typer.Option(help=MIN_PARTITION_MACS_HELP),
    ] = MIN_PARTITION_MACS,
    precision: Annotated[str, typer.Option(help="float32, float16 or bfloat16 (int8: from Python).")] = "float32",
    placement: Annotated[str, typer.Option(help="first or measured.")] = "first",
    strict: Annotated[bool, typer.Option(help="Fail instead of falling back to the host.")] = False,
    threads: Annotated[
        int, typer.Option(help="Threads of the host and of every target that takes a count (0: all cores).")
    ] = 0,
    onnx_out: Annotated[
        Optional[pathlib.Path],  # noqa: UP045
        typer.Option("--onnx", help="Also write the partitioned model as ONNX (open it in Netron)."),
    ] = None,
    sign: SignOption = None,
    quiet: QuietOption = False,
    cache: Annotated[
        bool, typer.Option("--cache/--no-cache", help="Reuse partitions compiled before (see 'codegraft cache')."),
    ] = True,
    shapes: FixShapesOption = None,
    values: BindValuesOption = None,
) -> None:
    """Compile MODEL for the targets and write one artifact file."""
    import codegraft as cg
    from codegraft.cli.feeds import parse_shapes, parse_values

    input_shapes = parse_shapes(shapes or [])
    input_values = parse_values(values or [])
    with _stage_bars(quiet) as progress:
        exe = cg.compile(
            str(model), targets=targets or [], min_partition_size=min_partition_size,
            min_partition_macs=min_partition_macs, precision=precision,
            placement=placement, strict=strict, export_onnx=onnx_out, progress=progress, cache=cache,
            input_shapes=input_shapes, input_values=input_values, threads=threads,
        )
    output = output if output is not None else pathlib.Path(model.stem + ".cgx")
    exe.save(output, signing_key=sign)
    for table in exe.report().tables():
        console.print(table)
    console.print(f"wrote {output} ({output.stat().st_size / 1e6:.2f} MB)")


@app.command("run")
@_guard
def run_command(
    artifact: Annotated[pathlib.Path, typer.Argument(help="An artifact from 'codegraft compile'.")],
    random: Annotated[bool, typer.Option("--random", help="Feed random inputs of the declared shapes.")] = False,
    inputs: Annotated[
        Optional[list[str]],  # noqa: UP045
        typer.Option("--input", "-i", help="name=file.npy; repeat per input."),
    ] = None,
    shapes: ShapesOption = None,
    load_inputs: LoadInputsOption = None,
    save_inputs: SaveInputsOption = None,
    seed: SeedOption = 0,
    save_outputs: Annotated[
        Optional[pathlib.Path],  # noqa: UP045
        typer.Option("--save", help="Folder to write each output as <name>.npy."),
    ] = None,
    profile: Annotated[
        bool, typer.Option(help="Also time it: latency percentiles, time per partition and (where the backend's "
                           "profiler can tell) per op."),
    ] = False,
    runs: Annotated[int, typer.Option(help="Timed runs for --profile.")] = 20,
    as_json: Annotated[bool, typer.Option("--json", help="Print outputs (and the profile) as JSON.")] = False,
    trusted_keys: TrustedKeysOption = None,
    threads: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option(help="Threads of the host and of every backend that takes a count (0: all cores; "
                     "default: as compiled)."),
    ] = None,
) -> None:
    """Run an artifact on random inputs, .npy files or a saved .npz."""
    import codegraft as cg
    from codegraft.cli.feeds import save_inputs as write_inputs
    from codegraft.core.options import check_at_least

    with _step(f"loading {artifact}"):
        exe = cg.load_executable(artifact, trusted_keys=trusted_keys or None, threads=threads)
    feeds, chosen = _feeds(exe.inputs, random, inputs or [], shapes or [], load_inputs, seed)
    if chosen:
        err_console.print("inputs: " + "; ".join(chosen), highlight=False)
    if save_inputs is not None:
        err_console.print(f"wrote {write_inputs(save_inputs, feeds)}", highlight=False)
    if profile:
        check_at_least("runs", runs, 1)
    with _step("running"):
        outputs = exe.run(feeds)
    result = None
    if profile:
        with _step(f"profiling: {runs} runs, then per op"):
            result = exe.profile(feeds, repeat=runs, ops=True)
    if as_json:
        summary = {name: _summary(value) for name, value in outputs.items()}
        profiled = json.loads(result.to_json()) if result is not None else None
        typer.echo(json.dumps({"inputs": chosen, "outputs": summary, "profile": profiled}, indent=1))
        _save_outputs(outputs, save_outputs)
        return
    table = Table(title=f"outputs of {artifact}")
    for column in ("output", "dtype", "shape", "min", "max", "mean"):
        table.add_column(column)
    for name, value in outputs.items():
        stats = _summary(value)
        if isinstance(value, list):  # a ZipMap's maps
            table.add_row(name, "maps", f"[{len(value)}]", "", "", "")
            continue
        table.add_row(name, str(value.dtype), str(list(value.shape)),
                      *(f"{stats[k]:.4g}" if k in stats else "" for k in ("min", "max", "mean")))
    console.print(table)
    _save_outputs(outputs, save_outputs)
    if result is not None:
        typer.echo(str(result))


def _summary(value: np.ndarray | list[dict[object, float]]) -> dict[str, object]:
    if isinstance(value, list):  # a classifier's ZipMap: one {label: probability} per row
        return {"maps": len(value), "labels": [str(k) for k in (value[0] if value else {})]}
    stats: dict[str, object] = {"dtype": str(value.dtype), "shape": list(value.shape)}
    if value.size and np.issubdtype(value.dtype, np.number):
        stats.update(min=float(value.min()), max=float(value.max()), mean=float(value.mean()))
    return stats


def _save_outputs(outputs: dict[str, np.ndarray], folder: pathlib.Path | None) -> None:
    from codegraft.errors import CodegraftError

    if folder is None:
        return
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for name, value in outputs.items():
            if isinstance(value, list):  # a ZipMap's maps, as JSON (labels as text)
                rows = [{str(k): v for k, v in row.items()} for row in value]
                (folder / f"{name.replace('/', '_')}.json").write_text(json.dumps(rows), encoding="utf-8")
                continue
            np.save(folder / f"{name.replace('/', '_')}.npy", value, allow_pickle=False)
    except (OSError, ValueError) as error:
        reason = getattr(error, "strerror", None) or error
        raise CodegraftError(f"cannot write the outputs into {folder}: {reason}") from None


def _feeds(  # type: ignore[no-untyped-def]
    specs, random: bool, files: list[str], shape_specs: list[str], load: pathlib.Path | None, seed: int
) -> tuple[dict[str, np.ndarray], list[str]]:
    """Feeds from --input files, --load-inputs, and (--random) random data of --shape shapes."""
    from codegraft.cli.feeds import load_inputs, make_feeds, parse_shapes
    from codegraft.errors import InputError

    given: dict[str, np.ndarray] = load_inputs(load) if load is not None else {}
    for spec in files:
        name, sep, file = spec.partition("=")
        if not sep:
            raise InputError(f"--input {spec!r}: expected name=file.npy")
        try:
            given[name] = np.load(file, allow_pickle=False)
        except (OSError, ValueError) as error:
            raise InputError(f"--input {name}: cannot read {file}: {error}") from None
    shapes = parse_shapes(shape_specs)
    feeds, chosen = make_feeds(specs, shapes=shapes, given=given, random=random or bool(shapes), seed=seed)
    missing = [s.name for s in specs if s.name not in feeds]
    if missing:
        raise InputError("give --random, --load-inputs file.npz or --input name=file.npy for: " + ", ".join(missing))
    return feeds, chosen


@app.command("inspect")
@_guard
def inspect_command(
    model: Annotated[pathlib.Path, typer.Argument(help="The ONNX model.")],
    targets: TargetsOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    details: Annotated[bool, typer.Option(help="List every node.")] = False,
    svg: Annotated[Optional[pathlib.Path], typer.Option(help="Draw the partitioned graph as SVG.")] = None,  # noqa: UP045
    html: Annotated[Optional[pathlib.Path], typer.Option(help="Draw it as an HTML page.")] = None,  # noqa: UP045
    collapse: Annotated[
        Optional[bool],  # noqa: UP045
        typer.Option("--collapse/--expand", help="One box per partition (default: above 300 nodes) or every node."),
    ] = None,
    onnx_out: Annotated[
        Optional[pathlib.Path],  # noqa: UP045
        typer.Option("--onnx", help="Write the partitioned model as ONNX (open it in Netron)."),
    ] = None,
    min_partition_size: Annotated[int, typer.Option(help="Smaller accelerator partitions go to the host.")] = 1,
    min_partition_macs: Annotated[
        int, typer.Option(help=MIN_PARTITION_MACS_HELP),
    ] = MIN_PARTITION_MACS,
    quiet: QuietOption = False,
    shapes: FixShapesOption = None,
    values: BindValuesOption = None,
) -> None:
    """Show where each node would run and why, without compiling."""
    from codegraft.cli.feeds import parse_shapes, parse_values
    from codegraft.compiler.inspect import inspect_model

    with _holding_a_whole_model():
        with _stage_bars(quiet) as progress:
            inspection = inspect_model(
                str(model), targets or [], min_partition_size=min_partition_size,
                min_partition_macs=min_partition_macs, progress=progress,
                input_shapes=parse_shapes(shapes or []), input_values=parse_values(values or []),
            )
        report = inspection.report
        if as_json:
            typer.echo(report.to_json())
        else:
            for table in report.tables(details=details):
                console.print(table)
        if onnx_out is not None:
            import onnx

            onnx.save(inspection.partitioned_onnx(), onnx_out)
            err_console.print(f"wrote {onnx_out} (partitions as local functions; open it in Netron)")
        for path, fmt in ((svg, "svg"), (html, "html")):
            if path is not None:
                from codegraft.compiler.inspect import draw_report
                from codegraft.report.draw import COLLAPSE_ABOVE

                draw_report(inspection, path, fmt=fmt, collapse=collapse)
                nodes = len(inspection.report.nodes)
                note = f" (one box per partition: {nodes} nodes; --expand draws each)" if (
                    collapse is None and nodes > COLLAPSE_ABOVE) else ""
                err_console.print(f"wrote {path}{note}", highlight=False)


@app.command("bench")
@_guard
def bench_command(
    model: Annotated[pathlib.Path, typer.Argument(help="The ONNX model.")],
    targets: TargetsOption = None,
    runs: Annotated[int, typer.Option(help="Timed runs per configuration.")] = 20,
    duration: Annotated[
        Optional[float],  # noqa: UP045
        typer.Option(help="Time each configuration for this many seconds instead of a count of runs."),
    ] = None,
    concurrency: Annotated[
        int, typer.Option(help="Concurrent requests (threads calling run): >1 measures throughput."),
    ] = 1,
    threads: Annotated[int, typer.Option(help="Threads for every configuration alike.")] = 2,
    measured: Annotated[bool, typer.Option(help="Also time measured placement over all targets.")] = True,
    shapes: ShapesOption = None,
    load_inputs: LoadInputsOption = None,
    seed: SeedOption = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the results as JSON.")] = False,
) -> None:
    """Time MODEL under onnxruntime alone, OpenVINO alone and codegraft with each target:
    latency percentiles, min and throughput."""
    from codegraft.cli.bench import compare
    from codegraft.cli.feeds import model_input_specs
    from codegraft.frontend.model import _to_proto, check_model_proto
    from codegraft.runtime.latency import check_mode

    check_mode(None if duration is not None else runs, duration, concurrency)  # bad values: one line, now
    proto = _to_proto(str(model), None)
    check_model_proto(proto, str(model))  # what compile would refuse, refused before onnxruntime sees it
    feeds, chosen = _feeds(model_input_specs(proto), True, [], shapes or [], load_inputs, seed)
    with _progress_bar() as progress:
        table = compare(
            proto, targets or [], runs=runs, threads=threads, measured=measured, progress=progress, name=model.name,
            duration=duration, concurrency=concurrency, feeds=feeds, inputs=chosen,
        )
    typer.echo(table.to_json() if as_json else table.render())


@app.command("compare")
@_guard
def compare_command(
    model: Annotated[pathlib.Path, typer.Argument(help="The ONNX model.")],
    targets: Annotated[
        Optional[list[str]],  # noqa: UP045
        typer.Option("--target", "-t", help="A configuration to check: a target, or targets joined by commas "
                     "in order of preference (c,openvino); repeat to check several."),
    ] = None,
    rtol: Annotated[float, typer.Option(help="Relative tolerance (to each value's largest magnitude).")] = 1e-4,
    atol: Annotated[float, typer.Option(help="Absolute tolerance.")] = 1e-5,
    boundaries: Annotated[
        bool, typer.Option("--boundaries", help="Also check every value crossing a partition boundary and name the "
                           "first partition and node where the error appears."),
    ] = False,
    shapes: ShapesOption = None,
    load_inputs: LoadInputsOption = None,
    save_inputs: SaveInputsOption = None,
    seed: SeedOption = 0,
    precision: Annotated[str, typer.Option(help="float32, float16 or bfloat16.")] = "float32",
    min_partition_size: Annotated[int, typer.Option(help="Smaller accelerator partitions go to the host.")] = 1,
    as_json: Annotated[bool, typer.Option("--json", help="Print the comparison as JSON.")] = False,
) -> None:
    """Run MODEL under each configuration and under onnxruntime; compare outputs (exit 1 on a mismatch)."""
    from codegraft.cli.compare import compare_configs
    from codegraft.cli.feeds import model_input_specs
    from codegraft.cli.feeds import save_inputs as write_inputs
    from codegraft.core.options import CompileOptions
    from codegraft.frontend.model import _to_proto, check_model_proto

    CompileOptions(precision=precision, min_partition_size=min_partition_size)  # bad values: one line, now
    configs = [[t.strip() for t in spec.split(",") if t.strip()] for spec in (targets or [])] or [[]]
    proto = _to_proto(str(model), None)
    check_model_proto(proto, str(model))  # what compile would refuse, refused before onnxruntime sees it
    feeds, chosen = _feeds(model_input_specs(proto), True, [], shapes or [], load_inputs, seed)
    if save_inputs is not None:
        err_console.print(f"wrote {write_inputs(save_inputs, feeds)}", highlight=False)
    with _progress_bar() as progress:
        result = compare_configs(
            proto, configs, feeds, rtol=rtol, atol=atol, boundaries=boundaries, inputs=chosen, progress=progress,
            name=model.name, precision=precision, min_partition_size=min_partition_size,
        )
    typer.echo(result.to_json() if as_json else result.render())
    if not result.ok:
        raise typer.Exit(code=1)


# A step that took longer than this says so when it ends (vgg19 loads in ~5 s).
SLOW_STEP_S = 1.0


@contextlib.contextmanager
def _step(label: str) -> Iterator[None]:
    """A spinner with the elapsed time while ``label`` runs (on a terminal), and one line
    saying how long it took when that was more than :data:`SLOW_STEP_S`."""
    import time

    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    start = time.perf_counter()
    if err_console.is_terminal:  # elsewhere (a pipe, a log) a live display only leaves blank lines
        columns = (SpinnerColumn(), TextColumn("{task.description}", markup=False), TimeElapsedColumn())
        with Progress(*columns, console=err_console, transient=True) as bar:
            bar.add_task(label, total=None)
            yield
    else:
        yield
    took = time.perf_counter() - start
    if took > SLOW_STEP_S:
        err_console.print(f"{label}: {took:.1f} s", highlight=False)


@contextlib.contextmanager
def _stage_bars(quiet: bool) -> Iterator[Callable[[str, int, int], None] | None]:
    """One bar per stage (import, passes, annotate, ...) on stderr while a compile or an inspect
    runs, each with its elapsed time; none when stderr is not a terminal or with --quiet."""
    if quiet or not err_console.is_terminal:
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description:<10}", markup=False), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    with Progress(*columns, console=err_console) as bars:
        tasks: dict[str, TaskID] = {}

        def progress(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = bars.add_task(stage, total=total)
            bars.update(tasks[stage], completed=done, total=total)

        yield progress


@contextlib.contextmanager
def _progress_bar() -> Iterator[Callable[[str, int, int], None]]:
    """A progress bar on stderr; yields progress(label, done, total)."""
    from rich.markup import escape
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description:<40}"), BarColumn(), TimeElapsedColumn(), console=err_console) as bar:
        task = bar.add_task("starting", total=1)

        def progress(label: str, done: int, total: int) -> None:
            bar.update(task, description=escape(label), completed=done, total=total)

        yield progress


@app.command("backends")
@_guard
def backends_command(
    as_json: Annotated[bool, typer.Option("--json", help="Print as JSON.")] = False,
) -> None:
    """List installed backends, and why any is unavailable."""
    from codegraft.backends import list_backends

    infos = list_backends()
    if as_json:
        typer.echo(json.dumps([info.__dict__ for info in infos], indent=1))
        return
    table = Table(title="codegraft backends")
    for column in ("backend", "from", "available", "why not"):
        table.add_column(column)
    for info in infos:
        table.add_row(info.name, info.origin, "yes" if info.available else "no", info.reason)
    console.print(table)


for _name, _command in (("keygen", keygen_command), ("sign", sign_command), ("verify", verify_command)):
    app.command(_name)(_guard(_command))
cache_app.command("info")(_guard(info_command))
cache_app.command("clear")(_guard(clear_command))
app.add_typer(cache_app, name="cache")


def main() -> None:
    """Console-script entry point: usage errors, too, are one line (not click's box)."""
    import sys

    global _process_ends_after_command
    _process_ends_after_command = True

    usage_errors: tuple[type[Exception], ...] = (typer.TyperException,)  # typer >= 0.20 vendors click
    aborts: tuple[type[BaseException], ...] = (typer.Abort,)
    try:
        import click

        usage_errors, aborts = (*usage_errors, click.ClickException), (*aborts, click.Abort)
    except ImportError:
        pass
    try:
        code = app(standalone_mode=False)
    except usage_errors as error:
        ctx = getattr(error, "ctx", None)
        hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
        message = error.format_message()  # type: ignore[attr-defined]
        if message:  # empty when the help was shown instead (no arguments at all)
            _error_line(message + hint)
        code = getattr(error, "exit_code", 2)
    except aborts:
        _error_line("aborted")
        code = 1
    # The process ends here: let it end without the final garbage collection walking every
    # object the command left (the IR of a 100k-node model is millions of objects in cycles;
    # that walk took ~4 s of a 100k-node ``inspect``).  Frozen objects are never collected,
    # and the memory goes back to the system with the process.
    gc.freeze()
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
