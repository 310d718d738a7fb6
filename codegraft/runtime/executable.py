"""The executable: a static schedule of compiled partitions, and the runtime that runs it.

``run`` keeps all per-call state in local variables, so it is safe to call from several
threads at once (runnables are required to be thread-safe).  Each intermediate is dropped
right after its last reader has run.

A partition whose backend fails while it *runs* is handed to the host, for that call and every
call after, when the executable knows how to build the partition there (``host_fallbacks``)
and was not compiled ``strict``: the failure is logged once and recorded in the report, as a
failure to compile already is.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from codegraft.backend import Backend, OpTime, ProfilingRunnable, Runnable
from codegraft.errors import BackendError, CodegraftError, InputError
from codegraft.frontend.zipmap import OutputMap
from codegraft.lower.lowering import ShapeSpecialisingRunnable
from codegraft.report.report import Report
from codegraft.runtime.artifact import write_artifact
from codegraft.runtime.latency import Latency
from codegraft.runtime.loop_choice import LoopChoice, TellsChoices
from codegraft.runtime.step import Step, TensorSpec

# Builds the host's step and runnable for a partition whose backend failed at run time.
HostFallback = Callable[[], "tuple[Step, Runnable]"]

log = logging.getLogger("codegraft")




@dataclass(frozen=True)
class Profile:
    """One ``profile`` call: end-to-end latency percentiles over ``runs`` runs, the median
    time per partition (ms), and, for partitions whose backend can tell, per op."""

    partitions: tuple[tuple[str, str, float], ...]  # (partition, backend, median ms)
    total_ms: float  # sum of the partition medians
    runs: int = 0
    latency: Latency | None = None  # end to end, each run from the feeds to the last partition
    ops: tuple[tuple[str, OpTime], ...] = ()  # (partition, its op's mean time) from backend profilers

    # How many ops ``str`` lists (the slowest); ``ops`` and ``to_json`` have them all.
    SHOWN_OPS = 15

    def __str__(self) -> str:
        lines = []
        if self.latency is not None:
            lines += [f"end to end: {self.latency.describe()}", ""]
        lines.append(f"median of {self.runs} runs per partition (after 1 warm-up):")
        lines.append(f"{'partition':<24} {'backend':<12} {'ms':>9} {'share':>6}")
        for name, backend, ms in self.partitions:
            share = 100 * ms / self.total_ms if self.total_ms else 0.0
            lines.append(f"{name:<24} {backend:<12} {ms:9.3f} {share:5.1f}%")
        lines.append(f"{'total':<24} {'':<12} {self.total_ms:9.3f}")
        if self.ops:
            backend_of = {name: backend for name, backend, _ in self.partitions}
            profiled = Counter(backend_of.get(p, "?") for p in dict.fromkeys(p for p, _ in self.ops))
            where = "; ".join(f"{b}: {_plural(n, 'partition')}" for b, n in profiled.items())
            lines += ["", f"per op, from the backends' own profilers ({where}), slowest first:"]
            lines.append(f"{'partition':<24} {'op':<32} {'type':<20} {'ms':>9} {'share':>6}")
            part_ms = {name: ms for name, _, ms in self.partitions}
            for partition, op in sorted(self.ops, key=lambda item: -item[1].ms)[: self.SHOWN_OPS]:
                # the profiler's own sum, not the partition's wall time, so shares add up to 100%
                inside = sum(o.ms for p, o in self.ops if p == partition) or part_ms.get(partition, 0.0)
                share = 100 * op.ms / inside if inside else 0.0
                lines.append(f"{partition:<24} {op.name[:32]:<32} {op.op_type[:20]:<20} {op.ms:9.3f} {share:5.1f}%")
            if len(self.ops) > self.SHOWN_OPS:
                lines.append(f"... {len(self.ops) - self.SHOWN_OPS} more ops")
        return "\n".join(lines)

    def to_json(self) -> str:
        """The profile as JSON: latency, partitions and ops."""
        import json
        from dataclasses import asdict

        return json.dumps(
            {
                "runs": self.runs,
                "latency": asdict(self.latency) if self.latency is not None else None,
                "partitions": [{"partition": n, "backend": b, "median_ms": ms} for n, b, ms in self.partitions],
                "total_ms": self.total_ms,
                "ops": [{"partition": p, **asdict(op)} for p, op in self.ops],
            },
            indent=1,
        )


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


class Executable:
    """A compiled model: ``run`` it, read its ``report``, ``save`` it, ``profile`` it.

    Example::

        exe = codegraft.compile("model.onnx", targets=["c"])
        outputs = exe.run({"input": x})      # output name -> numpy array
        exe.save("model.cgx")
    """

    def __init__(
        self,
        *,
        inputs: Sequence[TensorSpec],
        outputs: Sequence[str],
        steps: Sequence[Step],
        runnables: Sequence[Runnable],
        constants: Mapping[str, np.ndarray],
        report: Report,
        backends: Mapping[str, Backend],
        host_fallbacks: Mapping[str, HostFallback] | None = None,
        strict: bool = False,
        output_maps: Sequence[OutputMap] = (),
        host_threads: int = 0,
    ) -> None:
        self.inputs = tuple(inputs)
        # the host's intra-op threads (0: all cores), kept by save() for the loader
        self.host_threads = host_threads
        self.outputs = tuple(outputs)
        # outputs built after the run from a computed tensor (a classifier's ZipMap)
        self.output_maps = {entry.name: entry for entry in output_maps}
        self.steps = tuple(steps)
        self._runnables = tuple(runnables)
        self._host_fallbacks = dict(host_fallbacks or {})
        self._strict = strict
        self._switch_lock = threading.Lock()
        self._failed_backends: set[str] = set()
        self.constants = dict(constants)
        self._report = report
        self._backends = dict(backends)
        self._input_by_name = {spec.name: spec for spec in self.inputs}
        self._expected = tuple(_Expected.of(spec) for spec in self.inputs)
        computed = {self.output_maps[n].tensor if n in self.output_maps else n for n in self.outputs}
        self._drop_after = _last_uses(self.steps, computed)
        for step, runnable in zip(self.steps, self._runnables, strict=True):
            if isinstance(runnable, ShapeSpecialisingRunnable):
                runnable.on_failure = self._shape_failed_to_compile
            if isinstance(runnable, TellsChoices):
                runnable.tell_choices(functools.partial(self._loop_chosen, step.name))

    # -- running ---------------------------------------------------------------------------
    def run(self, *inputs: object) -> dict[str, Any]:
        """Run the model; returns output name -> array.

        Inputs are a mapping (``run({"x": x})``) or positional in input order (``run(x, y)``).
        numpy arrays in, numpy arrays out; torch tensors in, torch tensors out (CPU memory is
        shared with the tensors both ways, not copied).
        """
        # the common call, a dict of numpy arrays that fit, checked in a few comparisons (no
        # torch tensors among them); anything else by the full path
        quick = self._validated_quickly(inputs[0]) if len(inputs) == 1 and type(inputs[0]) is dict else None
        if quick is None:
            feeds, as_torch = self._feeds(inputs)
            env = self._validated(feeds)
        else:
            env, as_torch = quick, False
        env.update(self.constants)
        for index, drop in enumerate(self._drop_after):
            env.update(self._run_step_at(index, env))
            for name in drop:
                del env[name]
        if not as_torch and not self.output_maps:
            return {name: env[name] for name in self.outputs}
        outputs: dict[str, Any] = {name: env[name] for name in self.outputs if name not in self.output_maps}
        if as_torch:
            outputs = {name: _to_torch(value) for name, value in outputs.items()}
        for name, entry in self.output_maps.items():
            outputs[name] = entry.build(env[entry.tensor])
        return {name: outputs[name] for name in self.outputs}

    def __call__(self, *inputs: object) -> Any:
        """``exe(x)``: the output itself for a single-output model, a tuple in output order otherwise.

        Takes what :meth:`run` takes and returns the same kind (numpy or torch).
        """
        outputs = self.run(*inputs)
        values = tuple(outputs[name] for name in self.outputs)
        return values[0] if len(values) == 1 else values

    def _feeds(self, inputs: tuple[object, ...]) -> tuple[Mapping[str, object], bool]:
        """The feeds as a mapping, and whether they were torch tensors (so outputs are too)."""
        if len(inputs) == 1 and isinstance(inputs[0], Mapping):
            feeds: Mapping[str, object] = inputs[0]
        elif len(inputs) == len(self.inputs):
            feeds = dict(zip([s.name for s in self.inputs], inputs, strict=True))
        else:
            raise InputError(
                f"the model takes {len(self.inputs)} input(s) ("
                + ", ".join(f"{s.name} {s.describe()}" for s in self.inputs)
                + f"): pass them in that order or as a mapping of name to array, got {len(inputs)} positional"
            )
        as_torch = any(_is_torch_tensor(v) for v in feeds.values())
        return feeds, as_torch

    def trace(self, feeds: Mapping[str, object]) -> dict[str, np.ndarray]:
        """Like :meth:`run`, but keeps every partition's outputs: each value crossing a
        partition boundary, by name, in schedule order (``codegraft compare --boundaries``)."""
        env = self._validated(feeds)
        env.update(self.constants)
        computed: dict[str, np.ndarray] = {}
        for index in range(len(self.steps)):
            results = self._run_step_at(index, env)
            env.update(results)
            computed.update(results)
        return computed

    def profile(self, feeds: Mapping[str, object], *, repeat: int = 10, ops: bool = False) -> Profile:
        """Time ``repeat`` runs on ``feeds`` after one warm-up: end-to-end percentiles and each
        partition's median; with ``ops``, also per op for partitions whose runnable is a
        :class:`~codegraft.backend.ProfilingRunnable` (``repeat`` more runs of each).

        Example: ``print(exe.profile({"x": x}, repeat=50, ops=True))``.
        """
        from codegraft.core.options import check_at_least

        check_at_least("repeat", repeat, 1)
        samples: list[list[float]] = [[] for _ in self.steps]
        totals: list[float] = []
        wall = 0.0
        env: dict[str, np.ndarray] = {}
        for run in range(repeat + 1):
            began = time.perf_counter()
            env = self._validated(feeds)
            env.update(self.constants)
            for index in range(len(self.steps)):
                start = time.perf_counter()
                results = self._run_step_at(index, env)
                samples[index].append(time.perf_counter() - start)
                env.update(results)
            if run:  # the first is the warm-up
                totals.append((time.perf_counter() - began) * 1e3)
                wall += totals[-1] / 1e3
        medians = [float(np.median(s[1:])) * 1e3 for s in samples]
        rows = tuple((s.name, s.backend, ms) for s, ms in zip(self.steps, medians, strict=True))
        per_op: list[tuple[str, OpTime]] = []
        if ops:
            for step, runnable in zip(self.steps, self._runnables, strict=True):
                if isinstance(runnable, ProfilingRunnable):
                    timed = runnable.profile_ops([env[name] for name in step.inputs], repeat)
                    per_op += [(step.name, op) for op in timed]
        return Profile(rows, sum(medians), repeat, Latency.of(totals, wall), tuple(per_op))

    def _run_step_at(self, index: int, env: Mapping[str, Any]) -> dict[str, Any]:
        """Run step ``index``; if its backend fails, hand it to the host (see the module note)."""
        step, runnable = self.steps[index], self._runnables[index]
        try:
            return _run_step(step, runnable, env)
        except BackendError as error:
            fallback = self._host_fallbacks.get(step.name)
            if self._strict or fallback is None:
                raise
            with self._switch_lock:
                if self.steps[index] is step:  # not already switched by another thread
                    self._switch_to_host(index, fallback, error)
        return _run_step(self.steps[index], self._runnables[index], env)

    def _switch_to_host(self, index: int, fallback: HostFallback, error: BackendError) -> None:
        failed = self.steps[index]
        host_step, host_runnable = fallback()
        self.steps = (*self.steps[:index], host_step, *self.steps[index + 1 :])
        self._runnables = (*self._runnables[:index], host_runnable, *self._runnables[index + 1 :])
        reason = f"failed at run time: {error}"
        first_line = str(error).strip().splitlines()[0]
        if failed.backend in self._failed_backends:  # one warning per backend, the rest in the report
            log.debug("%s failed at run time; %s runs it from now on: %s", failed.name, host_step.backend, first_line)
        else:
            self._failed_backends.add(failed.backend)
            log.warning(
                "%s failed at run time (%s); %s runs each of its failing partitions from now on "
                "(details in the report)",
                failed.backend, first_line, host_step.backend,
            )
        partitions = tuple(
            replace(p, backend=host_step.backend, requested_backend=failed.backend, fallback_error=reason)
            if p.name == failed.name else p
            for p in self._report.partitions
        )
        nodes = tuple(
            replace(n, backend=host_step.backend) if n.partition == failed.name else n for n in self._report.nodes
        )
        self._report = replace(self._report, partitions=partitions, nodes=nodes)

    def _shape_failed_to_compile(
        self, partition: str, shapes: tuple[tuple[int, ...], ...], host: str, error: str
    ) -> None:
        """A partition compiled per input shape failed at these shapes and runs on the host at
        them: the report says so (each time), the log once per backend, like any fallback."""
        where = ", ".join("x".join(map(str, shape)) or "scalar" for shape in shapes)
        with self._switch_lock:
            step = next((s for s in self.steps if s.name == partition), None)
            backend = step.backend if step is not None else "?"
            first_warning = backend not in self._failed_backends
            self._failed_backends.add(backend)
            reason = f"failed to compile for input shapes {where}, runs on {host} at those: {error}"
            partitions = tuple(
                replace(p, requested_backend=backend,
                        fallback_error=f"{p.fallback_error}; {reason}" if p.fallback_error else reason)
                if p.name == partition else p
                for p in self._report.partitions
            )  # fmt: skip
            self._report = replace(self._report, partitions=partitions)
        first_line = error.strip().splitlines()[0]
        if first_warning:
            log.warning(
                "%s (%s); %s runs each of its partitions that fail from now on (details in the report)",
                first_line, f"input shapes {where}", host,
            )  # fmt: skip
        else:
            log.debug("%s; running it on %s at input shapes %s", first_line, host, where)

    def _loop_chosen(self, partition: str, choice: LoopChoice) -> None:
        """A Loop chose its plan at new input shapes (see :mod:`codegraft.runtime.loop_choice`):
        the partition's report lists each choice once (a loaded artifact's report already lists
        those made before it was saved; it chooses again, alike)."""
        with self._switch_lock:
            if any(p.name == partition and str(choice) in p.loop_choices.split(" | ") for p in self._report.partitions):
                return
            partitions = tuple(
                replace(p, loop_choices=f"{p.loop_choices} | {choice}" if p.loop_choices else str(choice))
                if p.name == partition else p
                for p in self._report.partitions
            )  # fmt: skip
            self._report = replace(self._report, partitions=partitions)

    def _validated(self, feeds: Mapping[str, object]) -> dict[str, np.ndarray]:
        # The common call (numpy arrays of the right dtype, shape and bound value, nothing
        # extra) is checked in a few comparisons per input; anything else takes the full path,
        # which names what is wrong.  A model of ~50 us spent 17 of them here.
        quick = self._validated_quickly(feeds) if isinstance(feeds, dict) else None
        return quick if quick is not None else self._validated_slowly(feeds)

    def _validated_quickly(self, feeds: dict[str, object]) -> dict[str, np.ndarray] | None:
        """The feeds as the environment when they are the common call, else ``None``."""
        if len(feeds) != len(self._expected):
            return None
        env: dict[str, np.ndarray] = {}
        for expected in self._expected:
            array = feeds.get(expected.name)
            if type(array) is not np.ndarray or not expected.fits(array):
                return None
            env[expected.name] = array
        return env if self._named_dims_agree(env) else None

    def _named_dims_agree(self, env: dict[str, np.ndarray]) -> bool:
        bound: dict[str, int] = {}
        for expected in self._expected:
            for axis, name in expected.named:
                if bound.setdefault(name, env[expected.name].shape[axis]) != env[expected.name].shape[axis]:
                    return False
        return True

    def _validated_slowly(self, feeds: Mapping[str, object]) -> dict[str, np.ndarray]:
        if not isinstance(feeds, Mapping):
            raise InputError(f"feeds must be a mapping of input name to array, got {type(feeds).__name__}")
        unknown = sorted(set(feeds) - set(self._input_by_name))
        if unknown:
            raise InputError(
                f"unknown input {unknown[0]!r}; the model's inputs are: "
                + ", ".join(f"{s.name} {s.describe()}" for s in self.inputs)
            )
        env: dict[str, np.ndarray] = {}
        bound: dict[str, tuple[int, str]] = {}
        for spec in self.inputs:
            if spec.name not in feeds:
                raise InputError(f"missing input {spec.name!r}: expected {spec.describe()}")
            try:
                array = _to_numpy(feeds[spec.name])
            except (ValueError, TypeError) as error:  # a ragged list, or an object numpy cannot hold
                text = " ".join(str(error).split())
                raise InputError(f"input {spec.name!r} is not an array ({text}): expected {spec.describe()}") from None
            if spec.dtype and array.dtype != np.dtype(spec.dtype):
                raise InputError(
                    f"input {spec.name!r} has dtype {array.dtype}, expected {spec.dtype} ({spec.describe()})"
                )
            if spec.shape is not None:
                check_shape(spec, array.shape, bound)
            if spec.bound is not None and not np.array_equal(array, spec.bound):
                raise InputError(
                    f"input {spec.name!r} is {array.tolist()}, but the model was compiled with it bound to "
                    f"{spec.bound.tolist()} (input_values); compile again to run it with another value"
                )
            env[spec.name] = array
        return env

    # -- reporting and saving ----------------------------------------------------------------
    def report(self) -> Report:
        """Which node went where and why not elsewhere; ``print(exe.report())`` for tables."""
        return self._report

    def save(self, path: str | os.PathLike[str], *, signing_key: str | os.PathLike[str] | bytes | None = None) -> None:
        """Write the one-file artifact; :func:`codegraft.load_executable` reads it back.

        ``signing_key``: an Ed25519 private key (PEM file or bytes, e.g. from
        ``codegraft keygen``) to sign the artifact with, so a loader given the public key can
        refuse any other file.

        Example::

            exe.save("model.cgx", signing_key="release.key")
        """
        write_artifact(path, self, signing_key=signing_key)

    def __repr__(self) -> str:
        backends = ", ".join(f"{s.name}:{s.backend}" for s in self.steps)
        return f"<codegraft.Executable inputs={[s.name for s in self.inputs]} partitions=[{backends}]>"


def _run_step(step: Step, runnable: Runnable, env: Mapping[str, Any]) -> dict[str, Any]:
    """One partition's outputs by name; whatever goes wrong names the partition, not a frame
    deep in a runtime (and a partition returning another number of outputs than the schedule
    lists, e.g. from an edited artifact, is an error, not a silent mismatch)."""
    try:
        results = list(runnable.run([env[name] for name in step.inputs]))
    except CodegraftError:
        raise
    except Exception as error:
        message = f"partition {step.name} on {step.backend} failed: {type(error).__name__}: {error}"
        raise BackendError(message) from error
    if len(results) != len(step.outputs):
        raise BackendError(
            f"partition {step.name} on {step.backend} returned {len(results)} output(s); the schedule lists "
            f"{len(step.outputs)}: {list(step.outputs)}"
        )
    return dict(zip(step.outputs, results, strict=True))


def check_shape(spec: TensorSpec, shape: tuple[int, ...], bound: dict[str, tuple[int, str]]) -> None:
    """:class:`InputError` unless ``shape`` fits ``spec``: its rank, fixed sizes, and named
    dimensions agreeing across inputs (``bound``: name -> (size, input that set it))."""
    assert spec.shape is not None
    if len(shape) != len(spec.shape):
        raise InputError(
            f"input {spec.name!r} has rank {len(shape)} (shape {list(shape)}), expected rank "
            f"{len(spec.shape)}: {spec.describe()}"
        )
    for axis, (got, want) in enumerate(zip(shape, spec.shape, strict=True)):
        if isinstance(want, int) and got != want:
            raise InputError(
                f"input {spec.name!r} has size {got} on axis {axis} (shape {list(shape)}), "
                f"expected {want}: {spec.describe()}"
            )
        if isinstance(want, str):
            seen = bound.setdefault(want, (got, spec.name))
            if seen[0] != got:
                raise InputError(
                    f"input {spec.name!r} axis {axis} is {want}={got}, but input {seen[1]!r} "
                    f"set {want}={seen[0]} (where the model reuses the name {want!r} for sizes that differ, "
                    "compile with input_shapes giving each input its shape)"
                )


@dataclass(frozen=True)
class _Expected:
    """What :meth:`Executable._validated`'s fast path compares an input with."""

    name: str
    dtype: np.dtype | None
    rank: int | None
    fixed: tuple[tuple[int, int], ...]  # (axis, size)
    named: tuple[tuple[int, str], ...]  # (axis, dimension name)
    bound: list[object] | None  # the bound value as a nested list (a cheap comparison)

    @classmethod
    def of(cls, spec: TensorSpec) -> _Expected:
        shape = spec.shape
        return cls(
            spec.name,
            np.dtype(spec.dtype) if spec.dtype else None,
            None if shape is None else len(shape),
            () if shape is None else tuple((a, d) for a, d in enumerate(shape) if isinstance(d, int)),
            () if shape is None else tuple((a, d) for a, d in enumerate(shape) if isinstance(d, str)),
            None if spec.bound is None else spec.bound.tolist(),
        )

    def fits(self, array: np.ndarray) -> bool:
        if self.dtype is not None and array.dtype != self.dtype:
            return False
        shape = array.shape
        if self.rank is not None and (len(shape) != self.rank or any(shape[a] != d for a, d in self.fixed)):
            return False
        # a bound input's shape is fixed, so by here the array is as small as the bound value
        return self.bound is None or array.tolist() == self.bound


def _last_uses(steps: Sequence[Step], keep: set[str]) -> list[tuple[str, ...]]:
    """For each step, the values to drop once it has run (read for the last time)."""
    last: dict[str, int] = {}
    for index, step in enumerate(steps):
        for name in step.inputs:
            last[name] = index
    drop: list[list[str]] = [[] for _ in steps]
    for name, index in last.items():
        if name not in keep:
            drop[index].append(name)
    return [tuple(d) for d in drop]


def _is_torch_tensor(value: object) -> bool:
    return type(value).__module__.startswith("torch") and hasattr(value, "detach")


def _to_numpy(value: object) -> np.ndarray:
    """An array for ``value``; a CPU torch tensor shares its memory (no copy)."""
    if _is_torch_tensor(value):
        tensor = value.detach()  # type: ignore[attr-defined]
        if tensor.device.type != "cpu":
            tensor = tensor.cpu()
        return np.asarray(tensor.numpy())
    return np.asarray(value)


def _to_torch(array: np.ndarray) -> Any:
    import torch

    if not array.flags.writeable:  # a constant of the executable: torch wants writable memory
        return torch.from_numpy(array.copy())
    return torch.from_numpy(np.asarray(array))
