"""Running a Loop whose body's work was unknown at compile time: its plan chosen per input shapes.

NOTE: see :mod:`codegraft.plan.loop_choice` for why such a Loop keeps two plans.  A
:class:`LoopPlans` holds the second one (the Loop node as a model of its own, for the host to run
whole) and decides, once per distinct shapes of that model's inputs, which plan runs: the body's
multiply-adds for the targets at those shapes (:func:`~codegraft.plan.loop_choice.body_work_at`)
against :data:`~codegraft.plan.control.LOOP_BODY_MIN_MACS`, the rule compile time applies where
it can count.  A count that fails or stays unknown picks the host, as the rule did before there
was a choice; the host's plan is built at the first call that picks it.  Each choice is logged
and told to ``on_choice`` (the executable puts it in its report).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
import onnx
import onnx_ir as ir

from codegraft.backend import Backend, Partition, Runnable
from codegraft.plan.control import LOOP_BODY_MIN_MACS
from codegraft.plan.loop_choice import body_work_at

log = logging.getLogger("codegraft")


@dataclass(frozen=True)
class LoopChoice:
    """One choice: the Loop, its inputs' shapes, the body's work there and the plan taken."""

    loop: str
    shapes: tuple[tuple[int, ...], ...]
    work: int | None
    on_host: bool
    min_work: int
    error: str = ""

    def __str__(self) -> str:
        where = ", ".join("x".join(map(str, shape)) or "scalar" for shape in self.shapes)
        if self.error:
            why = f"its body's work could not be counted ({self.error})"
        elif self.work is None:
            why = "its body's work is unknown even at these sizes"
        else:
            relation = "fewer than" if self.on_host else "at least"
            why = f"its body gives the targets {self.work:,} multiply-adds per iteration, {relation} {self.min_work:,}"
        plan = "the whole Loop runs on the host" if self.on_host else "its compiled body runs step by step"
        return f"{self.loop} at input shapes {where}: {why}; {plan}"


@runtime_checkable
class TellsChoices(Protocol):
    """A runnable holding Loops whose plan each call's input shapes choose (a control group)."""

    def tell_choices(self, on_choice: Callable[[LoopChoice], None]) -> None: ...


class LoopPlans:
    """The host's plan of one Loop and the choice between it and the compiled body (thread-safe).

    ``model`` is the node as a model of its own
    (:func:`~codegraft.plan.loop_choice.node_model`), its graph inputs ``inputs`` (names in the
    control group's values); the body's work is counted for ``targets`` (the artifact keeps
    their names, so that a loaded one counts for the same), and ``host`` runs the whole Loop.
    """

    on_choice: Callable[[LoopChoice], None] | None = None

    def __init__(
        self,
        loop: str,
        model: bytes,
        inputs: Sequence[str],
        targets: Sequence[Backend],
        host: Backend,
    ) -> None:
        self.loop = loop
        self.model = model
        self.inputs = tuple(inputs)
        self.targets = tuple(targets)
        self._host = host
        self._lock = threading.Lock()
        self._whole: Runnable | None = None
        self.choices: dict[tuple[tuple[int, ...], ...], LoopChoice] = {}

    def on_host(self, env: Mapping[str, np.ndarray]) -> Runnable | None:
        """The host's runnable of the whole Loop if these values' shapes choose it, else ``None``."""
        key = tuple([np.shape(env[name]) for name in self.inputs])
        choice = self.choices.get(key)
        if choice is None:
            with self._lock:
                choice = self.choices.get(key)
                made = choice is None
                if choice is None:
                    choice = self._choose(key)
                    if choice.on_host and self._whole is None:
                        self._whole = self._build_whole()
                    self.choices[key] = choice
            if made:
                log.info("%s", choice)
                if self.on_choice is not None:
                    self.on_choice(choice)
        return self._whole if choice.on_host else None

    def run_whole(self, env: Mapping[str, np.ndarray], runnable: Runnable) -> list[np.ndarray]:
        """The Loop's outputs, computed by the host's plan."""
        return list(runnable.run([env[name] for name in self.inputs]))

    def _choose(self, key: tuple[tuple[int, ...], ...]) -> LoopChoice:
        try:
            work = body_work_at(self.model, key, self.targets)
        except Exception as error:  # noqa: BLE001 - any failure to count keeps the host's plan, as before
            first = (str(error).strip().splitlines() or [type(error).__name__])[0]
            return LoopChoice(self.loop, key, None, True, LOOP_BODY_MIN_MACS, first)
        on_host = work is None or work < LOOP_BODY_MIN_MACS
        return LoopChoice(self.loop, key, work, on_host, LOOP_BODY_MIN_MACS)

    def _build_whole(self) -> Runnable:
        blob = self._host.compile(Partition(self.loop, ir.from_proto(onnx.ModelProto.FromString(self.model))))
        return self._host.load(blob)


__all__ = ["LoopChoice", "LoopPlans", "TellsChoices"]
