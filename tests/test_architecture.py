"""The package's shape: no import cycles, and no stage importing a later one.

Every ``import`` and ``from ... import`` in ``codegraft/`` counts, wherever it stands: at the
top, inside a function, under ``TYPE_CHECKING``.  An import hidden in a function still makes
the two modules depend on each other; it only moves the failure to run time.
"""

from __future__ import annotations

import ast
import pathlib
from collections import defaultdict

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "codegraft"

# Stages in dependency order: a module may import its own stage and earlier ones, never a
# later one.  The order follows the flow of a model (frontend, passes, plan, lower, runtime)
# except where a stage serves others: the report's records are filled in by planning,
# lowering and the runtime, and measured placement (tune) times candidates through lower.
STAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("core", ("codegraft.core", "codegraft.errors", "codegraft._version")),
    ("patterns", ("codegraft.patterns",)),
    ("contract", ("codegraft.backend",)),
    ("passes", ("codegraft.passes",)),
    ("frontend", ("codegraft.frontend",)),
    ("backends", ("codegraft.backends",)),
    ("report", ("codegraft.report",)),
    ("plan", ("codegraft.plan",)),
    ("lower", ("codegraft.lower",)),
    ("runtime", ("codegraft.runtime",)),
    ("tune", ("codegraft.tune",)),
    ("compiler", ("codegraft.compiler",)),
    ("facade", ("codegraft",)),
    ("testing", ("codegraft.testing",)),
    # Entry points drive the whole compiler: the command line, and torch.compile's backend
    # (which stays in frontend/ because installed environments name it in their entry points).
    ("entry points", ("codegraft.cli", "codegraft._cli", "codegraft.frontend.dynamo")),
)


def _module_name(path: pathlib.Path, package: pathlib.Path) -> str:
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_module(name: str, package: pathlib.Path) -> bool:
    base = package.parent / name.replace(".", "/")
    return base.with_suffix(".py").exists() or (base / "__init__.py").exists()


def import_graph(package: pathlib.Path = PACKAGE) -> dict[str, set[str]]:
    """Module -> the codegraft modules it imports (``from pkg import mod`` counts as ``pkg.mod``)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for path in sorted(package.rglob("*.py")):
        name = _module_name(path, package)
        owner = name if path.name == "__init__.py" else name.rpartition(".")[0]
        graph[name]  # noqa: B018 - every module is a node, importing something or not
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = owner.split(".")[: len(owner.split(".")) - node.level + 1]
                    source = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    source = node.module or ""
                targets = [
                    f"{source}.{alias.name}" if _is_module(f"{source}.{alias.name}", package) else source
                    for alias in node.names
                ]
            else:
                continue
            graph[name].update(t for t in targets if t == "codegraft" or t.startswith("codegraft."))
        graph[name].discard(name)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def stage_of(module: str) -> int:
    """Index in :data:`STAGES` of the stage holding ``module`` (longest prefix wins)."""
    best, best_length = -1, -1
    for position, (_, prefixes) in enumerate(STAGES):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best_length:
                best, best_length = position, len(prefix)
    return best


def test_no_import_cycles() -> None:
    found = cycles(import_graph())
    assert not found, "import cycles (imports inside functions count): " + "; ".join(" <-> ".join(c) for c in found)


def test_every_module_belongs_to_a_stage() -> None:
    assert [m for m in import_graph() if stage_of(m) < 0] == []


def test_no_stage_imports_a_later_one() -> None:
    backwards = [
        f"{module} ({STAGES[stage_of(module)][0]}) imports {target} ({STAGES[stage_of(target)][0]})"
        for module, targets in sorted(import_graph().items())
        for target in sorted(targets)
        if stage_of(target) > stage_of(module)
    ]
    assert backwards == []


def test_the_basic_types_import_nothing_of_codegraft() -> None:
    assert import_graph()["codegraft.core.support"] == set()


@pytest.mark.parametrize(
    ("graph", "expected"),
    [
        ({"a": {"b"}, "b": {"a"}}, [["a", "b"]]),
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
        ({"a": {"b"}, "b": set()}, []),
    ],
)
def test_cycle_finder_finds_cycles(graph: dict[str, set[str]], expected: list[list[str]]) -> None:
    assert cycles(graph) == expected


def test_imports_inside_functions_and_type_checking_are_seen(tmp_path: pathlib.Path) -> None:
    # The kind of import that hid the old cycles (artifact <-> control <-> executable).
    package = tmp_path / "codegraft"
    (package / "plan").mkdir(parents=True)
    (package / "runtime").mkdir()
    for folder in (package, package / "plan", package / "runtime"):
        (folder / "__init__.py").write_text("")
    (package / "plan" / "annotate.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from codegraft.runtime import step\n"
        "def f():\n    from codegraft.runtime.artifact import write\n    from .extract import g\n"
    )
    (package / "plan" / "extract.py").write_text("def g(): pass\n")
    (package / "runtime" / "step.py").write_text("")
    (package / "runtime" / "artifact.py").write_text("import codegraft.plan.annotate\n")
    graph = import_graph(package)
    assert graph["codegraft.plan.annotate"] == {
        "codegraft.runtime.step", "codegraft.runtime.artifact", "codegraft.plan.extract"
    }
    assert cycles(graph) == [["codegraft.plan.annotate", "codegraft.runtime.artifact"]]
    assert stage_of("codegraft.runtime.artifact") > stage_of("codegraft.plan.annotate")
