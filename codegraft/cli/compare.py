"""``codegraft compare``: run a model under several target configurations and check each
against plain onnxruntime, to see an accuracy bug and to locate it.

NOTE: the tolerance is the one every test here uses, relative to each value's scale:
a value passes when ``max|got - want| <= atol + rtol * max|want|`` (an element-wise test
would flag every near-zero element of a correct float32 result).  The reference for the
model's outputs is onnxruntime with graph optimisations off on the model as given.  With
``boundaries``, every value crossing a partition boundary is checked too, against onnxruntime
run on the model after codegraft's shared passes (the graph the partitions were cut from, so
every boundary value exists in it), marking each as an output (Polygraphy's ``mark all`` at
partition granularity).  The first failing value in schedule order names the partition and
node where the error appears: that partition's inputs were still within tolerance.

Example::

    result = compare_configs("model.onnx", [["c"], ["openvino"]], feeds, boundaries=True)
    print(result.render()); sys.exit(0 if result.ok else 1)
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np
import onnx

from codegraft.errors import CodegraftError, InputError

# progress(label, done, total)
Progress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class ValueCheck:
    """One value compared with the reference (``partition``/``node`` set for boundary values)."""

    name: str
    max_abs: float
    max_rel: float  # max|got - want| / max|want|
    ok: bool
    problem: str = ""  # a shape or dtype mismatch, or a missing value
    partition: str = ""
    backend: str = ""
    node: str = ""  # "name (OpType)" of the node producing the value

    def describe(self) -> str:
        where = f" from node {self.node}" if self.node else ""
        where += f" in partition {self.partition} ({self.backend})" if self.partition else ""
        if self.problem:
            return f"{self.name!r}{where}: {self.problem}"
        return f"{self.name!r}{where}: max abs error {self.max_abs:.3g}, max rel error {self.max_rel:.3g}"


@dataclass(frozen=True)
class ConfigResult:
    """One configuration (targets in order of preference) against the reference."""

    config: str  # "c", "c,openvino", ...
    partitions: str = ""  # "c x1, onnxruntime x2"
    outputs: tuple[ValueCheck, ...] = ()
    boundaries: tuple[ValueCheck, ...] = ()
    error: str = ""  # it could not compile or run
    # Inside the first failing partition: each node's outputs, the partition compiled alone on
    # its backend with every intermediate marked as an output (or why that could not be done).
    inside: tuple[ValueCheck, ...] = ()
    inside_error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error and all(c.ok for c in self.outputs) and all(c.ok for c in self.boundaries)

    def first_mismatch(self) -> ValueCheck | None:
        """The first boundary value out of tolerance, in schedule order (where the error appears)."""
        return next((c for c in self.boundaries if not c.ok), None)

    def first_node_mismatch(self) -> ValueCheck | None:
        """Inside the first failing partition, the first node output out of tolerance."""
        return next((c for c in self.inside if not c.ok), None)


@dataclass(frozen=True)
class Comparison:
    """Every configuration's result; ``ok`` when all are within tolerance."""

    model: str
    rtol: float
    atol: float
    inputs: tuple[str, ...]
    results: tuple[ConfigResult, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results)

    def to_json(self) -> str:
        data = asdict(self)
        data["ok"] = self.ok
        for result, entry in zip(self.results, data["results"], strict=True):
            entry["ok"] = result.ok
            first = result.first_mismatch()
            entry["first_mismatch"] = asdict(first) if first else None
            node = result.first_node_mismatch()
            entry["first_node_mismatch"] = asdict(node) if node else None
        return json.dumps(data, indent=1)

    def render(self) -> str:
        """Plain text: one line per configuration and output, then where each error appears."""
        lines = [
            f"{self.model}: each configuration against onnxruntime (rtol {self.rtol:g}, atol {self.atol:g}; "
            "a value passes when max|got - want| <= atol + rtol * max|want|)",
            "inputs: " + "; ".join(self.inputs),
            "",
            "| configuration | partitions | output | max abs error | max rel error | result |",
            "|---|---|---|---:|---:|---|",
        ]
        for r in self.results:
            if r.error:
                lines.append(f"| {r.config} | | | | | FAILED: {r.error} |")
                continue
            for c in r.outputs:
                verdict = "ok" if c.ok else f"MISMATCH{': ' + c.problem if c.problem else ''}"
                lines.append(
                    f"| {r.config} | {r.partitions} | {c.name} | {c.max_abs:.3g} | {c.max_rel:.3g} | {verdict} |"
                )
        for r in self.results:
            if not r.boundaries:
                continue
            bad = [c for c in r.boundaries if not c.ok]
            lines.append("")
            lines.append(
                f"{r.config}: {len(r.boundaries)} partition boundary value(s) checked, {len(bad)} out of tolerance"
            )
            first = r.first_mismatch()
            if first is not None:
                lines.append(f"  first error appears at {first.describe()}")
                lines.append(f"  (the inputs of partition {first.partition} were within tolerance)")
                node = r.first_node_mismatch()
                if node is not None:
                    lines.append(
                        f"  inside it, the first node out of tolerance: {node.describe()} (the partition compiled "
                        f"alone with {len(r.inside)} node output(s) marked, which can change what its backend fuses)"
                    )
                elif r.inside_error:
                    lines.append(f"  (no node-level check inside it: {r.inside_error})")
                elif r.inside:
                    lines.append(f"  (compiled alone with its {len(r.inside)} node outputs marked, every one is within "
                                 "tolerance: the error needs the partition as compiled whole, e.g. a fusion)")
        lines.append("")
        lines.append("all configurations match" if self.ok else "MISMATCH: some configuration differs from onnxruntime")
        return "\n".join(lines)


def compare_configs(
    model: str | os.PathLike[str] | onnx.ModelProto,
    configs: Sequence[Sequence[str]],
    feeds: Mapping[str, np.ndarray],
    *,
    rtol: float = 1e-4,
    atol: float = 1e-5,
    boundaries: bool = False,
    inputs: Sequence[str] = (),
    progress: Progress | None = None,
    name: str | None = None,
    **compile_options: Any,
) -> Comparison:
    """Compile and run ``model`` once per configuration (a list of targets) and compare every
    output (and, with ``boundaries``, every partition boundary value) with onnxruntime.

    What each configuration's backends take is what is checked: light partitions between host
    ones stay on their backend (``min_partition_macs=0`` unless given).
    """
    from codegraft.core.options import check_at_least
    from codegraft.core.reference import run_reference

    compile_options.setdefault("min_partition_macs", 0)

    if rtol < 0 or atol < 0:
        raise CodegraftError(f"tolerances must be >= 0, got rtol={rtol}, atol={atol}")
    check_at_least("configurations", len(configs), 1)
    proto = model if isinstance(model, onnx.ModelProto) else _load(model)
    if name is None:
        name = (proto.graph.name or "model") if isinstance(model, onnx.ModelProto) else os.path.basename(model)
    total = 1 + len(configs) + (1 if boundaries else 0)
    done = 0

    def tick(label: str) -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(label, done, total)

    try:
        reference = run_reference(proto, feeds)
    except Exception as error:  # noqa: BLE001 - onnxruntime refusing these inputs is the user's to fix
        shapes = ", ".join(f"{n} {list(np.shape(v))}" for n, v in feeds.items())
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise InputError(
            f"onnxruntime (the reference) cannot run the model on these inputs ({shapes}): {first}; "
            "give the model's real sizes with --shape name=1x3x224x224"
        ) from error
    tick("onnxruntime (reference)")
    optimised = _OptimisedReference(proto) if boundaries else None
    results = []
    for targets in configs:
        label = ",".join(targets) or "host"
        results.append(_run_config(proto, list(targets), feeds, reference, optimised, rtol, atol, compile_options))
        tick(label)
    return Comparison(name, rtol, atol, tuple(inputs), tuple(results))


def _run_config(
    proto: onnx.ModelProto,
    targets: list[str],
    feeds: Mapping[str, np.ndarray],
    reference: Mapping[str, np.ndarray],
    optimised: _OptimisedReference | None,
    rtol: float,
    atol: float,
    compile_options: Mapping[str, Any],
) -> ConfigResult:
    import codegraft

    config = ",".join(targets) or "host"
    try:
        exe = codegraft.compile(proto, targets=targets, **compile_options)
        outputs = exe.run(feeds)
        trace = exe.trace(feeds) if optimised is not None else {}
    except Exception as error:  # noqa: BLE001 - a configuration that fails is a result, named
        return ConfigResult(config, error=f"{type(error).__name__}: {str(error).splitlines()[0][:300]}")
    counts: dict[str, int] = {}
    for step in exe.steps:
        counts[step.backend] = counts.get(step.backend, 0) + 1
    summary = ", ".join(f"{b} x{n}" for b, n in counts.items())
    checks = tuple(check_value(n, outputs.get(n), want, rtol, atol) for n, want in reference.items())
    boundary_checks: tuple[ValueCheck, ...] = ()
    if optimised is not None:
        wanted = [name for step in exe.steps for name in step.outputs]
        expected = optimised.values(wanted, feeds)
        found = []
        for step in exe.steps:
            for name in step.outputs:
                if name not in expected:
                    continue
                check = check_value(name, trace.get(name), expected[name], rtol, atol)
                found.append(_at(check, step.name, step.backend, optimised.producer(name)))
        boundary_checks = tuple(found)
    result = ConfigResult(config, summary, checks, boundary_checks)
    first = result.first_mismatch()
    if first is None or optimised is None:
        return result
    try:
        inside = _inside_partition(exe, first, optimised, feeds, rtol, atol, compile_options)
    except Exception as error:  # noqa: BLE001 - the partition-level answer stands; say why no deeper one
        return replace(result, inside_error=f"{type(error).__name__}: {str(error).splitlines()[0][:200]}")
    return replace(result, inside=inside)


def _inside_partition(
    exe: Any,
    first: ValueCheck,
    optimised: _OptimisedReference,
    feeds: Mapping[str, np.ndarray],
    rtol: float,
    atol: float,
    compile_options: Mapping[str, Any],
) -> tuple[ValueCheck, ...]:
    """Polygraphy's ``mark all`` inside one partition: compile its nodes alone on its backend
    with every node output a model output, feed it the reference values of its inputs, and
    check each output against the reference."""
    import codegraft

    step = next(s for s in exe.steps if s.name == first.partition)
    members = [n.name for n in exe.report().nodes if n.partition == step.name]
    produced = optimised.node_outputs(members)
    sub, fed = optimised.extract(step.inputs, [value for value, _ in produced])
    expected = {**feeds, **optimised.values([*fed, *(value for value, _ in produced)], feeds)}
    options = {**compile_options, "min_partition_size": 1, "min_partition_macs": 0}
    got = codegraft.compile(sub, targets=[step.backend], **options).run({name: expected[name] for name in fed})
    return tuple(
        _at(check_value(value, got.get(value), expected[value], rtol, atol), step.name, step.backend, node)
        for value, node in produced
        if value in expected
    )


def _at(check: ValueCheck, partition: str, backend: str, node: str) -> ValueCheck:
    return ValueCheck(check.name, check.max_abs, check.max_rel, check.ok, check.problem, partition, backend, node)


def check_value(name: str, got: np.ndarray | None, want: np.ndarray, rtol: float, atol: float) -> ValueCheck:
    """``got`` against ``want`` with the scale-relative tolerance of the module note."""
    nan = float("nan")
    if got is None:
        return ValueCheck(name, nan, nan, False, "missing")
    got = np.asarray(got)
    if got.shape != want.shape:
        return ValueCheck(name, nan, nan, False, f"shape {list(got.shape)}, expected {list(want.shape)}")
    if got.dtype != want.dtype:
        return ValueCheck(name, nan, nan, False, f"dtype {got.dtype}, expected {want.dtype}")
    if want.size == 0:
        return ValueCheck(name, 0.0, 0.0, True)
    if not np.issubdtype(want.dtype, np.number) or np.issubdtype(want.dtype, np.integer):
        same = bool(np.array_equal(got, want))
        return ValueCheck(name, 0.0 if same else 1.0, 0.0 if same else 1.0, same, "" if same else "values differ")
    got64, want64 = got.astype(np.float64), want.astype(np.float64)
    if not np.array_equal(np.isnan(got64), np.isnan(want64)):
        return ValueCheck(name, nan, nan, False, "NaN where the reference has none (or the reverse)")
    finite = ~np.isnan(want64)
    diff = np.abs(got64[finite] - want64[finite])
    max_abs = float(diff.max()) if diff.size else 0.0
    scale = float(np.abs(want64[finite]).max()) if diff.size else 0.0
    max_rel = max_abs / max(scale, 1e-12)
    return ValueCheck(name, max_abs, max_rel, bool(max_abs <= atol + rtol * scale))


class _OptimisedReference:
    """onnxruntime on the model after codegraft's shared passes, any value marked as an output."""

    def __init__(self, proto: onnx.ModelProto) -> None:
        import onnx_ir as ir

        from codegraft.compiler.driver import run_common_passes
        from codegraft.core.options import CompileOptions
        from codegraft.frontend.model import import_model

        model = import_model(proto)
        run_common_passes(model, CompileOptions())
        self._model = model
        self._values = {v.name: v for node in model.graph for v in node.outputs if v.name}
        self._producers = {
            v.name: f"{node.name} ({node.op_type})" for node in model.graph for v in node.outputs if v.name
        }
        self._ir = ir

    def producer(self, name: str) -> str:
        return self._producers.get(name, "")

    def node_outputs(self, nodes: Sequence[str]) -> list[tuple[str, str]]:
        """(value, "node (Op)") for every output of the named nodes, in graph order."""
        wanted = set(nodes)
        return [
            (v.name, f"{node.name} ({node.op_type})")
            for node in self._model.graph
            if node.name in wanted
            for v in node.outputs
            if v.name
        ]

    def extract(self, inputs: Sequence[str], outputs: Sequence[str]) -> tuple[onnx.ModelProto, list[str]]:
        """The sub-model computing ``outputs`` from ``inputs`` (constants stay constants);
        returns it and the inputs it takes."""
        import onnx.utils

        proto = self._ir.to_proto(self._model)
        constants = {t.name for t in proto.graph.initializer}
        fed = [name for name in dict.fromkeys(inputs) if name not in constants]
        sub = onnx.utils.Extractor(proto).extract_model(fed, list(outputs))
        return sub, fed

    def values(self, names: Sequence[str], feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        from codegraft.core.reference import run_reference

        proto = self._ir.to_proto(self._model)
        present = {o.name for o in proto.graph.output}
        typed = {v.name: v for v in proto.graph.value_info}
        for name in dict.fromkeys(names):
            if name in present or name not in self._values:
                continue
            info = typed.get(name) or onnx.ValueInfoProto(name=name)
            proto.graph.output.append(info)
        return run_reference(proto, feeds)


def _load(path: str | os.PathLike[str]) -> onnx.ModelProto:
    from codegraft.frontend.model import _to_proto

    return _to_proto(path, None)


__all__ = ["Comparison", "ConfigResult", "ValueCheck", "check_value", "compare_configs"]
