"""Issue 17's bugs: markup in errors, bench --runs 0, option values validated, drawing ids."""

from __future__ import annotations

import json
import pathlib
import re

import numpy as np
import pytest
from typer.testing import CliRunner

import codegraft as cg
from codegraft.cli.main import app
from tests.cli_util import save_small_net, small_net

runner = CliRunner()


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> tuple[pathlib.Path, pathlib.Path]:
    folder = tmp_path_factory.mktemp("small")
    model = save_small_net(folder)
    artifact = folder / "small.cgx"
    result = runner.invoke(app, ["compile", str(model), "-o", str(artifact)])
    assert result.exit_code == 0, result.output
    return model, artifact


def _one_line(text: str) -> str:
    return " ".join(text.split())


Small = tuple[pathlib.Path, pathlib.Path]


def test_square_brackets_in_errors_are_printed(small: Small, tmp_path: pathlib.Path) -> None:
    _, artifact = small
    bad = tmp_path / "bad.npy"
    np.save(bad, np.zeros((1, 3, 64, 64), np.float32))
    result = runner.invoke(app, ["run", str(artifact), "-i", f"x={bad}"])
    assert result.exit_code == 2
    assert "expected 16: float32[batch, 3, 16, 16]" in _one_line(result.output), result.output
    assert "\n\n" not in result.output and not result.output.startswith("\n")  # no live display off a terminal

    np.save(bad, np.zeros((1, 3, 16, 16), np.float64))
    result = runner.invoke(app, ["run", str(artifact), "-i", f"x={bad}"])
    assert "expected float32 (float32[batch, 3, 16, 16])" in _one_line(result.output), result.output

    result = runner.invoke(app, ["run", str(artifact), "-i", f"nope={bad}"])
    assert "inputs are: x float32[batch, 3, 16, 16]" in _one_line(result.output), result.output


def test_bench_runs_zero_is_a_clear_error(small: tuple[pathlib.Path, pathlib.Path]) -> None:
    model, _ = small
    result = runner.invoke(app, ["bench", str(model), "--runs", "0"])
    assert result.exit_code == 2, result.output
    assert "runs must be an integer >= 1, got 0" in result.output and "Traceback" not in result.output
    with pytest.raises(cg.OptionError, match="runs must be an integer >= 1"):
        from codegraft.cli.bench import compare

        compare(small_net(), [], runs=0)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--precision", "banana"], "precision 'banana' is not one of: float32, float16, bfloat16, int8"),
        (["--precision", "fp16"], "precision 'fp16' is not one of: float32, float16, bfloat16, int8"),
        (["--placement", "fastest"], "placement 'fastest' is not one of: first, measured"),
        (["--min-partition-size", "-3"], "min_partition_size must be an integer >= 1, got -3"),
        (["--min-partition-macs", "-1"], "min_partition_macs must be an integer >= 0 (0: never), got -1"),
        (["--precision", "float16", "-t", "c"], "precision 'float16' is declared by none of the targets (c runs "
                                                "float32, int8)"),
    ],
)
def test_bad_option_values_are_rejected(small: tuple[pathlib.Path, pathlib.Path], tmp_path: pathlib.Path,
                                        args: list[str], message: str) -> None:
    model, _ = small
    result = runner.invoke(app, ["compile", str(model), "-o", str(tmp_path / "x.cgx"), *args])
    assert result.exit_code == 2, result.output
    assert message in _one_line(result.output)
    assert not (tmp_path / "x.cgx").exists()


@pytest.mark.parametrize(
    ("keyword", "value", "message"),
    [
        ("precision", "banana", "precision 'banana' is not one of: float32, float16, bfloat16, int8"),
        ("placement", "fastest", "placement 'fastest' is not one of: first, measured"),
        ("min_partition_size", -3, "min_partition_size must be an integer >= 1, got -3"),
        ("min_partition_macs", -1, "min_partition_macs must be an integer >= 0 (0: never), got -1"),
        ("threads", -1, "threads must be an integer >= 0 (0: all cores), got -1"),
    ],
)
def test_bad_option_values_are_rejected_in_python(keyword: str, value: object, message: str) -> None:
    with pytest.raises(cg.OptionError, match=re.escape(message)):
        cg.compile(small_net(), **{keyword: value})
    with pytest.raises(ValueError, match=re.escape(message)):
        cg.CompileOptions(**{keyword: value})  # type: ignore[arg-type]


def test_drawing_ids_are_the_report_names(small: tuple[pathlib.Path, pathlib.Path], tmp_path: pathlib.Path) -> None:
    from codegraft.compiler.inspect import inspect_model
    from codegraft.report.draw import draw_inspection

    model, _ = small
    result = runner.invoke(app, ["inspect", str(model), "-t", "numpy_example", "--json"])
    names = {n["name"] for n in json.loads(result.stdout)["nodes"]}
    dot = draw_inspection(inspect_model(str(model), ["numpy_example"]), tmp_path / "m.dot").read_text()
    drawn = set(re.findall(r'^\s+(\w+) \[label=.*fillcolor', dot, flags=re.MULTILINE))
    assert drawn == names and len(names) == 8
    # Tooltips carry the values' shapes and the targets' reasons; edges their shapes.
    conv = next(line for line in dot.splitlines() if line.strip().startswith("conv0 ["))
    assert "in: x float32[batch, 3, 16, 16]" in conv and "not numpy_example: Conv not implemented" in conv
    assert re.search(r'conv0 -> relu0 \[tooltip="c0: float32\[batch, 8, 16, 16\]", label="batchx8x16x16"', dot)


def test_version_names_codegraft_and_its_runtimes() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output.startswith(f"codegraft {cg.__version__}\n") and "onnxruntime " in result.output


def test_compile_names_the_artifact_after_the_model(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = save_small_net(tmp_path, "resnet_like.onnx")
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["compile", str(model)])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "resnet_like.cgx").exists() and "wrote resnet_like.cgx" in result.output


def test_slow_load_and_run_say_how_long(small: Small, monkeypatch: pytest.MonkeyPatch) -> None:
    from codegraft.cli import main as cli_main

    _, artifact = small
    monkeypatch.setattr(cli_main, "SLOW_STEP_S", 0.0)
    result = runner.invoke(app, ["run", str(artifact), "--random"])
    assert result.exit_code == 0, result.output
    assert re.search(rf"loading {re.escape(str(artifact))}: \d+\.\d s", result.output)
    assert re.search(r"running: \d+\.\d s", result.output)


@pytest.mark.skipif(__import__("shutil").which("dot") is None, reason="Graphviz's dot is not installed")
def test_inspect_svg_ids_tooltips_and_edge_shapes(small: Small, tmp_path: pathlib.Path) -> None:
    model, _ = small
    svg_path = tmp_path / "m.svg"
    result = runner.invoke(app, ["inspect", str(model), "-t", "numpy_example", "--svg", str(svg_path)])
    assert result.exit_code == 0, result.output
    svg = svg_path.read_text()
    assert 'id="conv0"' in svg and "<title>conv0</title>" in svg
    assert "in: x float32[batch, 3, 16, 16]" in svg and "not numpy_example: Conv not implemented" in svg
    assert ">batchx8x16x16<" in svg


@pytest.mark.skipif(__import__("shutil").which("dot") is None, reason="Graphviz's dot is not installed")
def test_inspect_says_a_big_model_is_drawn_collapsed(tmp_path: pathlib.Path) -> None:
    import onnx
    import onnx.parser

    body = "\n".join(f"  v{i + 1} = Relu(v{i})" for i in range(310))
    model = tmp_path / "chain.onnx"
    onnx.save(onnx.parser.parse_model(
        f'<ir_version: 8, opset_import: ["" : 18]>\ng (float[1,4] v0) => (float[1,4] v310) {{\n{body}\n}}'
    ), model)
    result = runner.invoke(app, ["inspect", str(model), "--svg", str(tmp_path / "c.svg")])
    assert result.exit_code == 0, result.output
    assert "(one box per partition: 310 nodes; --expand draws each)" in " ".join(result.output.split())
    result = runner.invoke(app, ["inspect", str(model), "--expand", "--svg", str(tmp_path / "e.svg")])
    assert "one box" not in result.output and (tmp_path / "e.svg").read_text().count('class="node"') > 300
