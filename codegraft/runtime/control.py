"""Running control flow: If and Loop nodes whose bodies are compiled executables.

NOTE: see :mod:`codegraft.plan.control` for which nodes come here and why.  A
:class:`ControlGroupRunnable` runs a partition of such nodes in order, calling each body's
:class:`~codegraft.runtime.executable.Executable` with its formal inputs and the outer-scope
values it reads; :mod:`codegraft.runtime.control_blob` stores it in the artifact.  A Loop whose
body's work was unknown at compile time also has the host's plan of it, chosen or not per input
shapes at the first call (:mod:`codegraft.runtime.loop_choice`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from codegraft.errors import InputError
from codegraft.runtime.executable import Executable
from codegraft.runtime.loop_choice import LoopChoice, LoopPlans


@dataclass(frozen=True)
class Body:
    """One compiled subgraph: the executable, its formal inputs and outer-scope inputs.

    ``executable`` is ``None`` for a branch that cannot run at the shapes the model was
    compiled for (``unrunnable`` says why): with ``input_shapes`` fixed, Silero VAD's 8 kHz
    branch gets 512 samples, and its LSTM an input of the wrong rank.  onnxruntime fails on
    that branch only when it is taken; so does this, naming it.
    """

    attribute: str
    formal: tuple[str, ...]
    outer: tuple[str, ...]
    executable: Executable | None
    unrunnable: str = ""


@dataclass(frozen=True)
class ControlNode:
    """An If or Loop node with compiled bodies (and, for a Loop whose body's work was unknown at
    compile time, the host's plan of the whole node, ``whole``)."""

    name: str
    op: str
    inputs: tuple[str, ...]  # "" for an omitted optional input
    outputs: tuple[str, ...]
    bodies: dict[str, Body]
    whole: LoopPlans | None = None


class ControlGroupRunnable:
    """Runs a partition of If/Loop nodes in order (stateless per call: thread-safe)."""

    def __init__(self, nodes: Sequence[ControlNode], inputs: Sequence[str], outputs: Sequence[str]) -> None:
        self.nodes = tuple(nodes)
        self.inputs = tuple(inputs)
        self.outputs = tuple(outputs)

    @property
    def loop_plans(self) -> tuple[LoopPlans, ...]:
        """The Loops here whose plan each call's input shapes choose."""
        return tuple(node.whole for node in self.nodes if node.whole is not None)

    def tell_choices(self, on_choice: Callable[[LoopChoice], None]) -> None:
        """Have each choice of a Loop's plan told to ``on_choice`` (the executable's report)."""
        for plans in self.loop_plans:
            plans.on_choice = on_choice

    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        env = dict(zip(self.inputs, inputs, strict=True))
        for node in self.nodes:
            results = _run_if(node, env) if node.op == "If" else _run_loop(node, env)
            env.update(zip(node.outputs, results, strict=True))
        return [env[name] for name in self.outputs]


def _call(
    node: ControlNode, body: Body, env: dict[str, np.ndarray], formal: Sequence[np.ndarray] = ()
) -> list[np.ndarray]:
    if body.executable is None:
        raise InputError(
            f"{node.op} {node.name!r} took its {body.attribute}, which cannot run at the input shapes the model "
            f"was compiled for ({body.unrunnable}); compile with the shapes this call needs"
        )
    feeds = dict(zip(body.formal, formal, strict=True))
    feeds.update((name, env[name]) for name in body.outer)
    results = body.executable.run(feeds)
    return [results[name] for name in body.executable.outputs]


def _scalar(node: ControlNode, what: str, value: np.ndarray) -> Any:
    """The one value of a trip count or condition.  The spec says a scalar; exporters also write
    a shape-[1] tensor (Paddle's Loop trip count), which onnxruntime takes, so this does too."""
    array = np.asarray(value)
    if array.size != 1:
        raise InputError(f"{node.op} {node.name!r}: its {what} must hold one value, got shape {list(array.shape)}")
    return array.reshape(()).item()


def _declared_scalar_shape(body: Body, index: int) -> tuple[int, ...]:
    """``()``, or ``(1,)`` where the body declares its iteration number or condition with rank 1
    (Paddle's exporter does); onnxruntime feeds a tensor of the declared rank, and so does this."""
    if body.executable is None or index >= len(body.formal):
        return ()
    spec = next((spec for spec in body.executable.inputs if spec.name == body.formal[index]), None)
    return (1,) * len(spec.shape) if spec is not None and spec.shape is not None and len(spec.shape) == 1 else ()


def _run_if(node: ControlNode, env: dict[str, np.ndarray]) -> list[np.ndarray]:
    branch = "then_branch" if _scalar(node, "cond", env[node.inputs[0]]) else "else_branch"
    return _call(node, node.bodies[branch], env)


def _run_loop(node: ControlNode, env: dict[str, np.ndarray]) -> list[np.ndarray]:
    if node.whole is not None:  # its plan chosen at these input shapes (see runtime.loop_choice)
        whole = node.whole.on_host(env)
        if whole is not None:
            return node.whole.run_whole(env, whole)
    body = node.bodies["body"]
    trip, cond_name, *initial = node.inputs
    max_trips = int(_scalar(node, "M", env[trip])) if trip else None
    keep_going = bool(_scalar(node, "cond", env[cond_name])) if cond_name else True
    carried = [env[name] for name in initial]
    scans: list[list[np.ndarray]] = []
    iteration = 0
    iteration_shape, cond_shape = _declared_scalar_shape(body, 0), _declared_scalar_shape(body, 1)
    while keep_going and (max_trips is None or iteration < max_trips):
        formal = [
            np.full(iteration_shape, iteration, np.int64),
            np.full(cond_shape, keep_going, np.bool_),
            *carried,
        ]
        results = _call(node, body, env, formal)
        keep_going = bool(_scalar(node, "body's cond output", results[0]))
        carried = results[1 : 1 + len(initial)]
        step_scans = results[1 + len(initial) :]
        if not scans:
            scans = [[] for _ in step_scans]
        for collected, value in zip(scans, step_scans, strict=True):
            collected.append(value)
        iteration += 1
    scan_count = len(node.outputs) - len(initial)
    stacked = [np.stack(values) for values in scans] if scans else [np.zeros((0,), np.float32)] * scan_count
    return [*carried, *stacked]


__all__ = ["Body", "ControlGroupRunnable", "ControlNode"]
