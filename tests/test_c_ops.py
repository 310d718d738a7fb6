"""The ``c`` backend's shape: one op table that every step reads; C text that ships with the package."""

from __future__ import annotations

import ast
import pathlib
import tomllib

import onnx
import onnx_ir as ir
import pytest
from c_backend_util import check, make_model, needs_compiler
from onnx import helper

from codegraft.backends.c import CBackend
from codegraft.backends.c import _graph as g
from codegraft.backends.c._c_files import c_file
from codegraft.backends.c._node import FOLDABLE, SHAPE_OPS
from codegraft.backends.c._toolchain import source_version
from codegraft.backends.c.ops import KERNEL_OPS, ONNX_OPS, Layout, OnnxOp
from codegraft.backends.c.ops.elementwise import _BINARY_KIND, _VARIADIC_KIND, EXPRESSIONS, UNARY, Unary

ROOT = pathlib.Path(__file__).resolve().parent.parent
C_DIR = ROOT / "codegraft" / "backends" / "c"


def _c_files() -> list[pathlib.Path]:
    return sorted(C_DIR.rglob("*.c"))


def test_every_c_file_is_package_data() -> None:
    """A ``.c`` file a wheel leaves out would be a FileNotFoundError at the first compile."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    patterns = config["tool"]["setuptools"]["package-data"]["codegraft"]
    package = ROOT / "codegraft"
    assert _c_files()
    for path in _c_files():
        relative = path.relative_to(package)
        assert any(relative.match(p) for p in patterns), f"{relative} is not in [tool.setuptools.package-data]"
        assert c_file(str(path.relative_to(C_DIR).as_posix())) == path.read_text(encoding="utf-8")


def test_the_backend_version_covers_the_c_text() -> None:
    """Editing a kernel's C must change ``CBackend.version`` (measured timings are cached by it)."""
    assert CBackend.version == source_version(C_DIR, "**/*.py", "**/*.c")
    assert CBackend.version != source_version(C_DIR, "**/*.py")


# -- the op table: each op described once -------------------------------------------------

OPS_DIR = C_DIR / "ops"
# The steps that read the table, and the op classes each builds itself (layout's conversions).
DRIVERS: dict[str, set[str]] = {"_support.py": set(), "_translate.py": set(), "_layout.py": {"Transpose", "Copy"}}


def _op_classes() -> list[type[g.Op]]:
    found, todo = [], [g.Op]
    while todo:
        cls = todo.pop()
        todo += cls.__subclasses__()
        found.append(cls)
    # A private base (rnn's ``_Cells``) only shares fields between op classes; it is never lowered to.
    return [c for c in found if c not in (g.Op, g.SpatialOp) and not c.__name__.startswith("_")]


def test_every_op_class_has_a_layout_rule_and_an_emitter() -> None:
    """An op class of ``_graph.py`` or a family without its table entry fails here, not at a user's compile."""
    classes = _op_classes()
    assert {g.Conv, g.MatMul, g.Elementwise, g.View} <= set(classes)
    for cls in classes:
        entry = KERNEL_OPS.get(cls)
        assert entry is not None, f"{cls.__name__} has no KernelOp in the c backend's op table"
        assert (entry.emit is None) == (entry.layout is Layout.VIEW), cls.__name__
        if entry.layout is Layout.CHANNELS_LAST:
            assert issubclass(cls, g.SpatialOp), f"{cls.__name__} runs channels-last but is not a SpatialOp"


def test_every_op_supports_may_accept_is_lowered_or_folded() -> None:
    """``supports`` says yes only to table entries (checked and lowered there) or to ops folded at compile time."""
    accepted_by_table = set(ONNX_OPS)
    for name in {s.name for s in onnx.defs.get_all_schemas()}:
        node = ir.Node("", name, inputs=[])
        verdict = CBackend().supports(node) if name not in accepted_by_table else None
        if verdict is not None and name not in SHAPE_OPS | FOLDABLE:
            assert not verdict and verdict.reason == f"{name}: not implemented by the C backend", name
    for op_type, entry in ONNX_OPS.items():
        assert entry.op_type == op_type and callable(entry.check) and callable(entry.lower)
    assert {op for op, e in ONNX_OPS.items() if e.nhwc} == {
        "Conv", "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "BatchNormalization", "Resize"
    }


def test_every_elementwise_kind_a_lowering_builds_has_an_expression() -> None:
    """``lw.elementwise("<kind>", ...)`` anywhere in a lowering needs ``EXPRESSIONS["<kind>"]``."""
    kinds = {*_BINARY_KIND.values(), *_VARIADIC_KIND.values(), *(op.kind for op in UNARY)}
    for path in [*OPS_DIR.glob("*.py"), C_DIR / "_lowerer.py"]:
        for call in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "elementwise":
                literals = [n.value for n in ast.walk(call.args[0]) if isinstance(n, ast.Constant)]
                kinds.update(v for v in literals if isinstance(v, str))
    assert {"add", "mul", "clip", "where", "gelu_tanh"} <= kinds
    assert kinds - {"powc"} <= set(EXPRESSIONS), kinds - {"powc"} - set(EXPRESSIONS)


def test_the_steps_read_the_table_and_name_no_op() -> None:
    """Support, translation and layout hold no per-op list or isinstance chain of their own."""
    op_names = set(ONNX_OPS) | {cls.__name__ for cls in _op_classes()}
    for name, builds in DRIVERS.items():
        tree = ast.parse((C_DIR / name).read_text(encoding="utf-8"))
        strings = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
        attributes = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        named = (strings | attributes) & op_names - builds
        assert not named, f"{name} names {sorted(named)}: describe them in their family's entry in ops/ instead"


@needs_compiler
def test_adding_an_op_is_one_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Softsign, which the backend lacks, taken end to end from one Unary entry (as the README shows)."""
    softsign = Unary("Softsign", "{a} / (1.0f + fabsf({a}))")
    node = helper.make_node("Softsign", ["x"], ["y"])
    model = make_model([node], {"x": (2, 3, 17)}, ["y"])
    assert not CBackend().supports(ir.from_proto(model).graph.node(0))
    # The tables are built from the family's UNARY tuple at import; the entry adds to both.
    monkeypatch.setitem(ONNX_OPS, softsign.op_type, OnnxOp(softsign.op_type, softsign.lower))
    monkeypatch.setitem(EXPRESSIONS, softsign.kind, softsign.c)
    assert CBackend().supports(ir.from_proto(model).graph.node(0))
    assert check(model) < 1e-5
