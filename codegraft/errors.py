"""Errors codegraft raises on purpose, each naming what is wrong and where."""

from __future__ import annotations


class CodegraftError(Exception):
    """Base class of every error codegraft raises on purpose."""


class ModelError(CodegraftError):
    """The model could not be read or is not valid ONNX (names the file or the node)."""


class InputError(CodegraftError):
    """A feed given to ``Executable.run`` does not match the model's inputs."""


class OptionError(CodegraftError, ValueError):
    """An option has a value outside its allowed set or range; the message lists what is allowed.

    It is also a :class:`ValueError`, so ``except ValueError`` catches it too.
    """


class ArtifactError(CodegraftError):
    """An artifact file is truncated, corrupted, of another format version, or unloadable."""


class SignatureError(ArtifactError):
    """An artifact is unsigned, signed by a key not trusted, or changed after it was signed
    (raised only when trusted keys are given; nothing in the file has been used by then)."""


class BackendError(CodegraftError):
    """A backend is unknown, unavailable, or failed while ``strict=True``."""


class BackendUnavailable(BackendError):
    """Raised by a backend factory when the backend cannot run here, with the reason.

    Example::

        def make_backend() -> Backend:
            if shutil.which("mycc") is None:
                raise BackendUnavailable("the 'mycc' compiler is not on PATH")
            return MyBackend()
    """
