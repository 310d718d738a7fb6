"""The ``codegraft`` command: compile, run, inspect, backends, bench."""

from __future__ import annotations

import json
import pathlib
from typing import Annotated, Optional

import numpy as np
import typer
from rich.console import Console
from rich.table import Table

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


def _fail(message: str) -> None:
    from rich.text import Text

    err_console.print(Text.assemble(("error:", "bold red"), " ", message), highlight=False)
    raise typer.Exit(code=2)


def _guard(func):  # type: ignore[no-untyped-def]
    """Turn codegraft's own errors into one clear line, not a stack trace."""
    import functools

    from codegraft.errors import CodegraftError

    @functools.wraps(func)
    def wrapper(*args, **kwargs):  # type: ignore[no-untyped-def]
        try:
            return func(*args, **kwargs)
        except CodegraftError as error:
            _fail(str(error))

    return wrapper


@app.command("compile")
@_guard
def compile_command(
    model: Annotated[pathlib.Path, typer.Argument(help="The ONNX model.")],
    targets: TargetsOption = None,
    output: Annotated[pathlib.Path, typer.Option("--output", "-o", help="Where to write the artifact.")] = pathlib.Path(
        "model.cgx"
    ),
    min_partition_size: Annotated[int, typer.Option(help="Smaller accelerator partitions go to the host.")] = 1,
    precision: Annotated[str, typer.Option(help="float32, float16, bfloat16")] = "float32",
    placement: Annotated[str, typer.Option(help="first or measured")] = "first",
    strict: Annotated[bool, typer.Option(help="Fail instead of falling back to the host.")] = False,
    onnx_out: Annotated[
        Optional[pathlib.Path],  # noqa: UP045
        typer.Option("--onnx", help="Also write the partitioned model as ONNX (open it in Netron)."),
    ] = None,
) -> None:
    """Compile MODEL for the targets and write one artifact file."""
    import codegraft as cg

    exe = cg.compile(
        str(model), targets=targets or [], min_partition_size=min_partition_size, precision=precision,
        placement=placement, strict=strict, export_onnx=onnx_out,
    )
    exe.save(output)
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
    save_outputs: Annotated[
        Optional[pathlib.Path],  # noqa: UP045
        typer.Option("--save", help="Folder to write each output as <name>.npy."),
    ] = None,
    profile: Annotated[bool, typer.Option(help="Also print time per partition.")] = False,
) -> None:
    """Run an artifact on random inputs or on .npy files."""
    import codegraft as cg

    exe = cg.load_executable(artifact)
    feeds = _feeds(exe, random, inputs or [])
    outputs = exe.run(feeds)
    table = Table(title=f"outputs of {artifact}")
    for column in ("output", "dtype", "shape", "min", "max", "mean"):
        table.add_column(column)
    for name, value in outputs.items():
        numeric = value.size and np.issubdtype(value.dtype, np.number)
        stats = (f"{value.min():.4g}", f"{value.max():.4g}", f"{value.mean():.4g}") if numeric else ("", "", "")
        table.add_row(name, str(value.dtype), str(list(value.shape)), *stats)
        if save_outputs is not None:
            save_outputs.mkdir(parents=True, exist_ok=True)
            np.save(save_outputs / f"{name.replace('/', '_')}.npy", value, allow_pickle=False)
    console.print(table)
    if profile:
        console.print(str(exe.profile(feeds)), highlight=False)


def _feeds(exe, random: bool, specs: list[str]) -> dict[str, np.ndarray]:  # type: ignore[no-untyped-def]
    from codegraft.errors import InputError

    feeds: dict[str, np.ndarray] = {}
    for spec in specs:
        name, sep, file = spec.partition("=")
        if not sep:
            raise InputError(f"--input {spec!r}: expected name=file.npy")
        try:
            feeds[name] = np.load(file, allow_pickle=False)
        except (OSError, ValueError) as error:
            raise InputError(f"--input {name}: cannot read {file}: {error}") from None
    if random:
        rng = np.random.default_rng(0)
        for spec in exe.inputs:
            if spec.name in feeds:
                continue
            shape = [d if isinstance(d, int) else 1 for d in (spec.shape or ())]
            dtype = np.dtype(spec.dtype)
            if np.issubdtype(dtype, np.floating):
                feeds[spec.name] = rng.standard_normal(shape).astype(dtype)
            else:
                feeds[spec.name] = rng.integers(0, 4, size=shape).astype(dtype)
    if not feeds and exe.inputs:
        raise InputError("give --random or --input name=file.npy for: " + ", ".join(s.name for s in exe.inputs))
    return feeds


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
) -> None:
    """Show where each node would run and why, without compiling."""
    from codegraft._inspect import inspect_model

    inspection = inspect_model(str(model), targets or [], min_partition_size=min_partition_size)
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
            from codegraft._inspect import draw_report

            draw_report(inspection, path, fmt=fmt, collapse=collapse)
            err_console.print(f"wrote {path}")


@app.command("bench")
@_guard
def bench_command(
    model: Annotated[pathlib.Path, typer.Argument(help="The ONNX model.")],
    targets: TargetsOption = None,
    runs: Annotated[int, typer.Option(help="Timed runs per configuration (median reported).")] = 20,
    threads: Annotated[int, typer.Option(help="Threads for every configuration alike.")] = 2,
    measured: Annotated[bool, typer.Option(help="Also time measured placement over all targets.")] = True,
) -> None:
    """Time MODEL under onnxruntime alone, OpenVINO alone and codegraft with each target."""
    from rich.markup import escape
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from codegraft._bench import compare

    with Progress(TextColumn("{task.description:<40}"), BarColumn(), TimeElapsedColumn(), console=err_console) as bar:
        task = bar.add_task("measuring", total=1)

        def progress(label: str, done: int, total: int) -> None:
            bar.update(task, description=escape(label), completed=done, total=total)

        table = compare(str(model), targets or [], runs=runs, threads=threads, measured=measured, progress=progress)
    typer.echo(table.render())


@app.command("backends")
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


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
