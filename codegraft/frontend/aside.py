"""Work on a second core while this one goes on: the import's check and shape inference.

Importing a large model does two independent things: onnx's checker and shape inference (C++,
holding the GIL: a thread cannot overlap them) and onnx-ir's ``from_proto`` building the IR
(Python).  Only the value types join them.  On a machine with a core to spare, a forked
child checks the model and infers its shapes while the parent builds the IR from the same
(copy-on-write) protobuf; the parent then reads the child's verdict and the inferred types
through a pipe.  On a 100k-node graph that took the import from ~4.5 to ~3 s on two cores.

What the caller sees is what it would see doing both in turn: the child's error (the checker's
refusal, a failed shape inference) comes first, whatever the parent met meanwhile; a child
that dies (a crash in onnx's C++ on a model it should have refused) is a clear
:class:`~codegraft.errors.ModelError` instead of the death of the caller's process.

Linux only (``fork``; elsewhere, or with one core, or for a small graph, :func:`start`
returns ``None`` and the caller does both in turn).  The child only runs the given function
(onnx's C++, protobuf and codegraft's own checks) and ``os._exit``: no ``atexit`` handler, no
buffered file and no other thread of the parent runs there.  Should it still get stuck (on
a lock another thread held at the fork), the caller stops it after a generous wait and does
the work itself.  ``CODEGRAFT_PARALLEL_IMPORT=0`` turns it off.
"""

from __future__ import annotations

import faulthandler
import os
import select
import signal
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import onnx

from codegraft.errors import ModelError

# Below this many nodes a fork (~5-20 ms with a large heap) is not worth it: the check and
# inference of a 5,000-node graph take ~0.1 s.
MIN_NODES = 5_000

_OK, _REFUSED, _FAILED = b"K", b"E", b"X"


@dataclass
class Pending:
    """The child's work, until :meth:`result` collects it (or :meth:`cancel` stops it)."""

    pid: int
    reader: int
    where: str
    collected: bool = False

    def result(self, timeout: float | None = None) -> bytes | None:
        """What the child's function returned; raises its :class:`ModelError`, or one saying
        how it died.  None when it has not answered within ``timeout`` seconds: it is stopped,
        and the caller does the work itself (a child stuck on a lock another thread of the
        parent held at the fork must not hang the caller)."""
        if timeout is not None:
            poll = select.poll()  # (not select(): a server may hold more than 1,024 files)
            poll.register(self.reader, select.POLLIN)
            if not poll.poll(max(0, int(timeout * 1000))):
                self.cancel()
                return None
        self.collected = True
        with os.fdopen(self.reader, "rb") as pipe:
            payload = pipe.read()
        _, status = os.waitpid(self.pid, 0)
        kind, body = payload[:1], payload[1:]
        if kind == _OK:
            return body
        if kind == _REFUSED:
            raise ModelError(body.decode("utf-8", "replace"))
        if kind == _FAILED:
            raise ModelError(f"{self.where}: checking the model failed: {body.decode('utf-8', 'replace')}")
        code = os.waitstatus_to_exitcode(status)
        how = f"signal {_signal_name(-code)}" if code < 0 else f"exit status {code}"
        raise ModelError(f"{self.where}: onnx's checker or shape inference crashed on this model ({how})")

    def cancel(self) -> None:
        """Stop the child and reap it, unless :meth:`result` collected it already."""
        if self.collected:
            return
        self.collected = True
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.close(self.reader)
        os.waitpid(self.pid, 0)


def start(model: onnx.ModelProto, where: str, work: Callable[[onnx.ModelProto], bytes]) -> Pending | None:
    """Run ``work(model)`` in a forked child, or return None when that does not pay here.

    ``work`` raises :class:`ModelError` to refuse the model; the bytes it returns come back
    through :meth:`Pending.result`.
    """
    if not _worth_it(model):
        return None
    reader, writer = os.pipe()
    try:
        with warnings.catch_warnings():
            # Python 3.12 warns about fork in a process with threads (numpy's BLAS pool is
            # one); the child touches none of them (see the module docstring).
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
    except OSError:
        os.close(reader)
        os.close(writer)
        return None
    if pid == 0:  # the child: never returns into the caller's code
        try:
            os.close(reader)
            faulthandler.disable()  # a crash here is reported by the parent, in one line
            try:
                payload = _OK + work(model)
            except ModelError as error:
                payload = _REFUSED + str(error).encode("utf-8", "replace")
            except BaseException as error:  # a bug of ours: said, not swallowed
                payload = _FAILED + f"{type(error).__name__}: {error}".encode("utf-8", "replace")
            with os.fdopen(writer, "wb") as pipe:
                pipe.write(payload)
        finally:
            os._exit(0)
    os.close(writer)
    return Pending(pid, reader, where)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


def _worth_it(model: onnx.ModelProto) -> bool:
    if not sys.platform.startswith("linux") or not hasattr(os, "fork"):
        return False
    if os.environ.get("CODEGRAFT_PARALLEL_IMPORT", "1") == "0":
        return False
    if len(model.graph.node) < MIN_NODES:
        return False
    return len(os.sched_getaffinity(0)) >= 2
