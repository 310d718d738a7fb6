"""codegraft: bring your own code generator to a deep-learning compiler.

The public API::

    import codegraft as cg

    exe = cg.compile("model.onnx", targets=["c"])   # ordered by preference; the host takes the rest
    out = exe.run({"input": x})                     # output name -> numpy array
    print(exe.report())                             # which node went where, and why not elsewhere
    exe.save("model.cgx")
    exe2 = cg.load_executable("model.cgx")

Vendors implement :class:`Backend` (see :mod:`codegraft.backend`).
"""

from codegraft._version import __version__ as __version__
from codegraft.backend import Backend, Capabilities, Composite, CompositeRule, Partition, Runnable, Support
from codegraft.backends import BackendInfo, get_backend, list_backends
from codegraft.compiler.driver import compile
from codegraft.core.options import CompileOptions
from codegraft.errors import (
    ArtifactError,
    BackendError,
    BackendUnavailable,
    CodegraftError,
    InputError,
    ModelError,
    OptionError,
    SignatureError,
)
from codegraft.report.report import NodeReport, PartitionReport, Report
from codegraft.runtime.executable import Executable, Profile, TensorSpec
from codegraft.runtime.loader import load_executable
from codegraft.runtime.signature import generate_key

__all__ = [
    "ArtifactError",
    "Backend",
    "BackendError",
    "BackendInfo",
    "BackendUnavailable",
    "Capabilities",
    "CodegraftError",
    "CompileOptions",
    "Composite",
    "CompositeRule",
    "Executable",
    "InputError",
    "ModelError",
    "NodeReport",
    "OptionError",
    "Partition",
    "PartitionReport",
    "Profile",
    "Report",
    "Runnable",
    "SignatureError",
    "Support",
    "TensorSpec",
    "compile",
    "generate_key",
    "get_backend",
    "list_backends",
    "load_executable",
]
