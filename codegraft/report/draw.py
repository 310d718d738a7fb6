"""Pictures of a partitioned graph: nodes coloured by backend, partitions boxed.

NOTE: we write Graphviz DOT text ourselves (it is a small, stable format) and call the
``dot`` program only to lay it out, so :func:`to_dot` works everywhere and is what the tests
check; only :func:`render_svg` and the writers need Graphviz.  The input is a flat list of
:class:`DrawNode` (plain data, built from the report by :func:`nodes_from_report`), so the
drawing never reaches into the compiler.  Large graphs stay readable with
``collapse=True``: each partition becomes one box with its node count; :func:`draw` collapses
by default above :data:`COLLAPSE_ABOVE` nodes.  A node's DOT (and SVG) id is its name, the
name ``--json`` and ``--details`` print; its tooltip carries its values' shapes and every
target's reason for declining it, and each edge is labelled with the shape it carries.

Example::

    nodes = [DrawNode("conv", "Conv", "mine", "p0", ("x", "w"), ("y",)),
             DrawNode("soft", "Softmax", "onnxruntime", "p1", ("y",), ("z",))]
    options = DrawOptions(graph_inputs=("x",), graph_outputs=("z",))
    text = to_dot(nodes, options)
    write_html(nodes, "model.html", options)
"""

from __future__ import annotations

import html
import os
import pathlib
import re
import shutil
import subprocess
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol

from codegraft.core.dtypes import dtype_name
from codegraft.errors import CodegraftError

if TYPE_CHECKING:
    import onnx_ir as ir

    from codegraft.report.report import Report


class Drawable(Protocol):
    """A report over its model, as :class:`~codegraft.compiler.inspect.Inspection` holds them."""

    @property
    def report(self) -> Report: ...
    @property
    def model(self) -> ir.Model: ...

HOST_COLOUR = "#d9d9d9"
HOST_BORDER = "#999999"  # the host's fill is too pale to outline a box
# Colour-blind-friendly pastel fills (ColorBrewer Set3 order), one per non-host backend.
PALETTE = (
    "#8dd3c7",
    "#fdb462",
    "#80b1d3",
    "#fb8072",
    "#bebada",
    "#b3de69",
    "#fccde5",
    "#ffffb3",
)


# Above this many nodes an expanded drawing is a column too tall to read (vgg19: 13,600 px).
COLLAPSE_ABOVE = 300


class GraphvizNotFound(CodegraftError):
    """Graphviz's ``dot`` program is needed to lay out the picture and is not installed."""


@dataclass(frozen=True)
class DrawNode:
    """One node as drawn: where it runs and the names of the values it reads and writes.

    Example: ``DrawNode("n3", "Relu", "mine", "mine_0", ("a",), ("b",), composite="mine.conv_bias_act_0")``.
    """

    name: str
    op_type: str
    backend: str
    partition: str
    inputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    composite: str | None = None
    declined: tuple[tuple[str, str], ...] = ()  # (target, reason) of each target that declined it


@dataclass(frozen=True)
class DrawOptions:
    """How to draw: which backend is the host (grey), collapsed or not, the graph's inputs
    and outputs (drawn as ellipses), a title, whether constant-only nodes are drawn, and
    each value's type (``"float32[1, 64, 56, 56]"``) for tooltips and edge labels.

    Example: ``DrawOptions(collapse=True, graph_inputs=("x",), title="resnet50")``.
    """

    host: str = "onnxruntime"
    collapse: bool = False
    graph_inputs: tuple[str, ...] = ()
    graph_outputs: tuple[str, ...] = ()
    title: str = ""
    show_constants: bool = False
    value_types: Mapping[str, str] = field(default_factory=dict)


def backend_colours(nodes: Sequence[DrawNode], *, host: str = "onnxruntime") -> dict[str, str]:
    """Backend -> fill colour: the host grey, others from :data:`PALETTE` in order of appearance."""
    colours: dict[str, str] = {}
    for node in nodes:
        if node.backend not in colours:
            colours[node.backend] = (
                HOST_COLOUR if node.backend == host else PALETTE[sum(b != host for b in colours) % len(PALETTE)]
            )
    return colours


def to_dot(nodes: Sequence[DrawNode], options: DrawOptions = DrawOptions()) -> str:
    """The DOT text of the partitioned graph (no Graphviz needed).

    Each partition is a cluster labelled ``name · backend (n nodes)``, each composite a
    dotted cluster inside it.  With ``options.collapse`` each partition is a single box.
    Nodes computing only from constants (``Constant``, ``ConstantOfShape`` of a weight
    shape, ...) are counted but not drawn unless ``options.show_constants``: they are noise
    in a picture of where the work runs.
    """
    colours = backend_colours(nodes, host=options.host)
    lines = [
        "digraph codegraft {",
        f"  graph [rankdir=TB, fontname=Helvetica, fontsize=11, labelloc=t, label={_q(options.title)}];",
        '  node [shape=box, style="rounded,filled", fontname=Helvetica, fontsize=9, penwidth=0.6];',
        '  edge [color="#666666", arrowsize=0.5];',
    ]
    if options.collapse:
        lines += _collapsed(nodes, colours, options)
    else:
        lines += _expanded(nodes, colours, options)
    lines.append("}")
    return "\n".join(lines) + "\n"


def _expanded(nodes: Sequence[DrawNode], colours: dict[str, str], options: DrawOptions) -> list[str]:
    graph_inputs, graph_outputs, types = options.graph_inputs, options.graph_outputs, options.value_types
    lines: list[str] = []
    hidden = set() if options.show_constants else _constant_nodes(nodes, graph_inputs)
    ids = _node_ids(nodes, hidden, reserved={f"in{k}" for k in range(len(graph_inputs))}
                    | {f"out{k}" for k in range(len(graph_outputs))})
    by_partition: dict[str, list[int]] = defaultdict(list)
    for i, node in enumerate(nodes):
        by_partition[node.partition].append(i)
    for k, (partition, everyone) in enumerate(by_partition.items()):
        members = [i for i in everyone if i not in hidden]
        if not members:
            continue
        backend = nodes[members[0]].backend
        lines.append(f"  subgraph cluster_p{k} {{")
        hidden_here = len(everyone) - len(members)
        label = f"{partition} · {backend} ({_count(len(everyone), 'node')}"
        label += f", {_count(hidden_here, 'constant')} hidden)" if hidden_here else ")"
        border = HOST_BORDER if colours[backend] == HOST_COLOUR else colours[backend]
        lines.append(f'    graph [label={_q(label)}, style="rounded", color={_q(border)}, penwidth=2];')
        by_composite: dict[str | None, list[int]] = defaultdict(list)
        for i in members:
            by_composite[nodes[i].composite].append(i)
        for c, (composite, inside) in enumerate(by_composite.items()):
            indent = "    "
            if composite is not None:
                lines.append(f"    subgraph cluster_p{k}_c{c} {{")
                lines.append(f'      graph [label={_q(composite)}, style="dotted", color="#333333", penwidth=1];')
                indent = "      "
            for i in inside:
                lines.append(f"{indent}{ids[i]} {_node_attrs(nodes[i], colours, types)};")
            if composite is not None:
                lines.append("    }")
        lines.append("  }")
    producer = {v: i for i, node in enumerate(nodes) for v in node.outputs if i not in hidden}
    edges: dict[tuple[str, str], list[str]] = defaultdict(list)
    for k, value in enumerate(graph_inputs):
        lines.append(f"  in{k} [label={_q(value)}, shape=ellipse, style=solid];")
    inputs = {v: f"in{k}" for k, v in enumerate(graph_inputs)}
    for i, node in enumerate(nodes):
        if i in hidden:
            continue
        for value in node.inputs:
            if value in producer:
                edges[(ids[producer[value]], ids[i])].append(value)
            elif value in inputs:
                edges[(inputs[value], ids[i])].append(value)
    for k, value in enumerate(graph_outputs):
        lines.append(f"  out{k} [label={_q(value)}, shape=ellipse, style=solid];")
        if value in producer:
            edges[(ids[producer[value]], f"out{k}")].append(value)
        elif value in inputs:
            edges[(inputs[value], f"out{k}")].append(value)
    lines += [f"  {a} -> {b} {_edge_attrs(values, types)};" for (a, b), values in edges.items()]
    return lines


def _node_ids(nodes: Sequence[DrawNode], hidden: set[int], reserved: set[str]) -> dict[int, str]:
    """Each drawn node's DOT id: its name (the one the report prints), quoted where DOT needs
    it; ``#i`` for an unnamed node or a name already taken."""
    ids: dict[int, str] = {}
    taken = set(reserved)
    for i, node in enumerate(nodes):
        if i in hidden:
            continue
        name = node.name if node.name and node.name not in taken else f"#{i}"
        taken.add(name)
        ids[i] = _dot_id(name)
    return ids


_DOT_KEYWORDS = {"node", "edge", "graph", "digraph", "subgraph", "strict"}


def _dot_id(name: str) -> str:
    plain = re.fullmatch(r"[A-Za-z_][A-Za-z_0-9]*", name) and name.lower() not in _DOT_KEYWORDS
    return name if plain else _q(name)


def _edge_attrs(values: Sequence[str], types: Mapping[str, str]) -> str:
    """Label an edge with the shape it carries (or how many values); the tooltip names them."""
    tooltip = ", ".join(f"{v}: {types[v]}" if v in types else v for v in values)
    if len(values) > 1:
        label = f"{len(values)} values"
    elif values[0] in types:
        label = _short_shape(types[values[0]])
    else:
        label = ""
    attrs = f"tooltip={_q(tooltip)}"
    if label:
        attrs += f", label={_q(label)}, fontsize=7, fontcolor=\"#555555\""
    return f"[{attrs}]"


def _short_shape(value_type: str) -> str:
    """``float32[1, 64, 56, 56]`` -> ``1x64x56x56`` (the dtype is in the tooltip)."""
    match = re.fullmatch(r"[^\[]*\[(.*)\]", value_type)
    if match is None:
        return value_type
    return "x".join(d.strip() for d in match.group(1).split(",")) if match.group(1) else "scalar"


def _constant_nodes(nodes: Sequence[DrawNode], graph_inputs: Sequence[str]) -> set[int]:
    """Nodes whose every input is a constant: a weight (produced by no node and not a graph
    input) or the output of another such node.  Nodes come in graph (topological) order."""
    produced = {v for node in nodes for v in node.outputs}
    variable = set(graph_inputs)
    constant_values: set[str] = set()
    constant: set[int] = set()
    for i, node in enumerate(nodes):
        if all(v in constant_values or (v not in produced and v not in variable) for v in node.inputs):
            constant.add(i)
            constant_values.update(node.outputs)
    return constant


def _collapsed(nodes: Sequence[DrawNode], colours: dict[str, str], options: DrawOptions) -> list[str]:
    graph_inputs, graph_outputs = options.graph_inputs, options.graph_outputs
    lines: list[str] = []
    partitions: dict[str, int] = {}
    sizes: Counter[str] = Counter()
    backend_of: dict[str, str] = {}
    for node in nodes:
        partitions.setdefault(node.partition, len(partitions))
        sizes[node.partition] += 1
        backend_of[node.partition] = node.backend
    for partition, k in partitions.items():
        backend = backend_of[partition]
        label = f"{partition}\n{backend}\n{_count(sizes[partition], 'node')}"
        lines.append(f"  p{k} [label={_q(label)}, fillcolor={_q(colours[backend])}, fontsize=10];")
    where = {v: f"p{partitions[node.partition]}" for node in nodes for v in node.outputs}
    for k, value in enumerate(graph_inputs):
        lines.append(f"  in{k} [label={_q(value)}, shape=ellipse, style=solid];")
        where[value] = f"in{k}"
    crossing: dict[tuple[str, str], list[str]] = defaultdict(list)
    for node in nodes:
        target = f"p{partitions[node.partition]}"
        for value in dict.fromkeys(node.inputs):
            source = where.get(value)
            if source is not None and source != target and value not in crossing[(source, target)]:
                crossing[(source, target)].append(value)
    for k, value in enumerate(graph_outputs):
        lines.append(f"  out{k} [label={_q(value)}, shape=ellipse, style=solid];")
        if value in where:
            crossing[(where[value], f"out{k}")].append(value)
    for (a, b), values in crossing.items():
        lines.append(f"  {a} -> {b} {_edge_attrs(values, options.value_types)};")
    return lines


def _node_attrs(node: DrawNode, colours: dict[str, str], types: Mapping[str, str]) -> str:
    label = node.op_type if not node.name or node.name == node.op_type else f"{node.op_type}\n{node.name}"
    tooltip = f"{node.name} ({node.op_type}) on {node.backend}, partition {node.partition}"
    if node.composite:
        tooltip += f", composite {node.composite}"
    for heading, values in (("in", node.inputs), ("out", node.outputs)):
        for value in values:
            tooltip += f"\n{heading}: {value} {types.get(value, '')}".rstrip()
    for target, reason in node.declined:
        tooltip += f"\nnot {target}: {reason}"
    attrs = f"label={_q(label)}, fillcolor={_q(colours[node.backend])}, tooltip={_q(tooltip)}"
    if node.name:
        attrs += f", id={_q(node.name)}"
    return f"[{attrs}]"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _q(text: str) -> str:
    """A DOT quoted string: escape backslashes and quotes, keep newlines as ``\\n``."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def dot_program() -> str:
    """Path of Graphviz's ``dot``, or :class:`GraphvizNotFound` saying how to get it."""
    found = shutil.which("dot")
    if found is None:
        raise GraphvizNotFound(
            "drawing needs Graphviz's `dot` program, which is not on PATH. Install Graphviz: "
            "`apt-get install graphviz` (Debian/Ubuntu), `dnf install graphviz` (Fedora), "
            "`brew install graphviz` (macOS), `conda install graphviz`, or "
            "https://graphviz.org/download/ - or write the DOT text instead (to_dot(), "
            "or a path ending in .dot)."
        )
    return found


def render_svg(dot_text: str) -> str:
    """Lay out DOT text with Graphviz and return the SVG document."""
    done = subprocess.run(
        [dot_program(), "-Tsvg"],
        input=dot_text.encode(),
        capture_output=True,
        check=False,
    )
    if done.returncode != 0:
        raise CodegraftError(f"graphviz failed ({done.returncode}): {done.stderr.decode(errors='replace').strip()}")
    return done.stdout.decode()


def write_svg(
    nodes: Sequence[DrawNode], path: str | os.PathLike[str], options: DrawOptions = DrawOptions()
) -> pathlib.Path:
    """Write the picture as SVG (needs Graphviz).  Returns the path written."""
    svg = render_svg(to_dot(nodes, options))
    out = pathlib.Path(path)
    out.write_text(svg, encoding="utf-8")
    return out


def write_html(
    nodes: Sequence[DrawNode], path: str | os.PathLike[str], options: DrawOptions = DrawOptions()
) -> pathlib.Path:
    """Write one self-contained HTML page: a legend (backend, nodes, partitions) and the SVG."""
    svg = _strip_prolog(render_svg(to_dot(nodes, options)))
    out = pathlib.Path(path)
    out.write_text(html_page(nodes, svg, host=options.host, title=options.title), encoding="utf-8")
    return out


def html_page(nodes: Sequence[DrawNode], svg: str, *, host: str = "onnxruntime", title: str = "") -> str:
    """The HTML page around an SVG picture, with the legend."""
    colours = backend_colours(nodes, host=host)
    node_counts = Counter(n.backend for n in nodes)
    partitions = {(n.backend, n.partition) for n in nodes}
    part_counts = Counter(b for b, _ in partitions)
    rows = "\n".join(
        f'<tr><td><span class="swatch" style="background:{colour}"></span>{html.escape(backend)}'
        f"{' (host)' if backend == host else ''}</td>"
        f"<td>{node_counts[backend]}</td><td>{part_counts[backend]}</td></tr>"
        for backend, colour in colours.items()
    )
    heading = html.escape(title or "codegraft partitions")
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{heading}</title>
<style>
 body {{ font-family: Helvetica, Arial, sans-serif; margin: 1.5em; }}
 table {{ border-collapse: collapse; margin-bottom: 1em; }}
 td, th {{ padding: 0.2em 0.8em; text-align: left; border-bottom: 1px solid #ddd; }}
 .swatch {{ display: inline-block; width: 1em; height: 1em; margin-right: 0.5em;
           vertical-align: middle; border: 1px solid #999; }}
 .picture svg {{ max-width: 100%; height: auto; }}
</style>
</head>
<body>
<h1>{heading}</h1>
<table class="legend">
<tr><th>backend</th><th>nodes</th><th>partitions</th></tr>
{rows}
</table>
<p>Boxes are partitions, dotted boxes composites (fused groups). Hover a node for details.</p>
<div class="picture">
{svg}
</div>
</body>
</html>
"""


def _strip_prolog(svg: str) -> str:
    """The ``<svg>`` element alone (no XML declaration or DOCTYPE), to inline in HTML."""
    start = svg.find("<svg")
    return svg[start:] if start >= 0 else svg


def nodes_from_report(report: Report, graph: ir.Graph) -> list[DrawNode]:
    """The report's nodes with their value names taken from ``graph`` (the compiled graph).

    Report nodes are matched to graph nodes by position when the two agree on op types,
    else by name; a node not found in ``graph`` is drawn without edges.
    """
    graph_nodes = list(graph)
    positional = len(graph_nodes) == len(report.nodes) and all(
        g.op_type == r.op_type for g, r in zip(graph_nodes, report.nodes, strict=True)
    )
    by_name = {n.name: n for n in graph_nodes if n.name}
    drawn = []
    for i, info in enumerate(report.nodes):
        node = graph_nodes[i] if positional else by_name.get(info.name)
        inputs = tuple(v.name or "" for v in node.inputs if v is not None) if node is not None else ()
        outputs = tuple(v.name or "" for v in node.outputs) if node is not None else ()
        drawn.append(
            DrawNode(
                info.name,
                info.op_type,
                info.backend,
                info.partition,
                inputs,
                outputs,
                info.composite,
                info.declined,
            )
        )
    return drawn


def value_types(graph: ir.Graph) -> dict[str, str]:
    """Each named value's dtype and shape as ``float32[1, 64, 56, 56]`` where known."""
    values: list[ir.Value] = [*graph.inputs, *graph.outputs]
    values += [v for node in graph for v in node.outputs]
    types: dict[str, str] = {}
    for value in values:
        if value.name and value.type is not None and value.shape is not None:
            dims = ", ".join(str(d) if isinstance(d, int) else str(d.value or "?") for d in value.shape)
            types[value.name] = f"{dtype_name(value.dtype)}[{dims}]"
    return types


def draw(
    report: Report,
    model: ir.Model,
    path: str | os.PathLike[str],
    *,
    fmt: Literal["svg", "html", "dot"] | str | None = None,
    collapse: bool | None = None,
) -> pathlib.Path:
    """Draw a report over its model to ``path`` as SVG, HTML or DOT (``fmt`` or the suffix).

    ``collapse`` (one box per partition) defaults to models over :data:`COLLAPSE_ABOVE` nodes.

    Example: ``draw(exe.report(), model, "out.html", collapse=True)``.
    """
    out = pathlib.Path(path)
    kind = (fmt or out.suffix.lstrip(".") or "svg").lower()
    graph = model.graph
    nodes = nodes_from_report(report, graph)
    options = DrawOptions(
        host=report.host,
        collapse=len(nodes) > COLLAPSE_ABOVE if collapse is None else collapse,
        value_types=value_types(graph),
        graph_inputs=tuple(v.name or "" for v in graph.inputs),
        graph_outputs=tuple(v.name or "" for v in graph.outputs),
        title=_title(model, report),
    )
    if kind == "dot":
        out.write_text(to_dot(nodes, options), encoding="utf-8")
        return out
    if kind == "svg":
        return write_svg(nodes, out, options)
    if kind == "html":
        return write_html(nodes, out, options)
    raise CodegraftError(f"cannot draw as {kind!r}: use svg, html or dot")


def draw_inspection(
    inspection: Drawable,
    path: str | os.PathLike[str],
    *,
    fmt: Literal["svg", "html", "dot"] | str | None = None,
    collapse: bool | None = None,
) -> pathlib.Path:
    """:func:`draw` for ``codegraft inspect``: its report over its (optimised) model."""
    return draw(inspection.report, inspection.model, path, fmt=fmt, collapse=collapse)


def _title(model: ir.Model, report: Report) -> str:
    name = model.graph.name or "model"
    targets = ", ".join(report.targets) or "no targets"
    return re.sub(r"\s+", " ", f"{name}: {targets} (host {report.host})")


__all__ = [
    "COLLAPSE_ABOVE",
    "DrawNode",
    "DrawOptions",
    "Drawable",
    "GraphvizNotFound",
    "backend_colours",
    "dot_program",
    "draw",
    "draw_inspection",
    "html_page",
    "nodes_from_report",
    "render_svg",
    "to_dot",
    "value_types",
    "write_html",
    "write_svg",
]
