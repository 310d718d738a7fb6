"""Where an IREE partition runs: the device, its architecture, the compiler flags and runtime driver.

NOTE: one spelling serves Python, the CLI and the artifact.  ``IreeTarget.parse("cuda:sm_80")``
and ``str(target)`` round-trip, and the backend's name is ``"iree"`` plus that spelling
(``"iree:cuda:sm_80"``), so an artifact names the exact target it was compiled for and
``get_backend`` rebuilds it from the name alone.

NVIDIA architectures: IREE 3.13's table of known CUDA targets (``KnownTargets.cpp``,
``getNVIDIAGPUTargetDetails``) stops at Ada (``sm_89``); ``sm_90``/``h100`` have no entry, so
``iree-compile`` fails with "missing GPU target in #hal.executable.target".  IREE ships PTX,
which the CUDA driver compiles for the GPU at load time, so ``sm_80`` code runs on Hopper
(without Hopper-only instructions); ``sm_80`` is the default.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass

from codegraft.errors import BackendError

# codegraft's device names -> (IREE's compiler device, IREE's runtime driver).
_DEVICES = {
    "cpu": ("local", "local-task"),
    "cuda": ("cuda", "cuda"),
    "hip": ("hip", "hip"),
    "vulkan": ("vulkan", "vulkan"),
}
_DEFAULT_ARCH = {"cpu": "host", "cuda": "sm_80", "hip": "gfx942", "vulkan": ""}
# The CUDA architectures IREE 3.13 knows (see the module note); newer GPUs run sm_80/sm_89 PTX.
KNOWN_CUDA_ARCHS = ("sm_60", "sm_61", "sm_62", "sm_70", "sm_72", "sm_75", "sm_80", "sm_86", "sm_87", "sm_89")


@dataclass(frozen=True)
class IreeTarget:
    """A device (``cpu``, ``cuda``, ``hip``, ``vulkan``) and an architecture for it.

    ``arch`` is the CPU name for ``cpu`` (``host``: this machine's CPU), the compute capability
    for ``cuda`` (``sm_80``), the gfx name for ``hip``.

    Example::

        IreeTarget.parse("cuda:sm_80").compiler_flags()   # ['--iree-hal-target-device=cuda', ...]
    """

    device: str = "cpu"
    arch: str = "host"

    @staticmethod
    def parse(spec: str | None) -> IreeTarget:
        """``"cuda"``, ``"cuda:sm_89"``, ``"cpu"``, ``""``/``None`` (the CPU): a clear error otherwise."""
        device, _, arch = (spec or "cpu").partition(":")
        device = device or "cpu"
        if device not in _DEVICES:
            raise BackendError(f"unknown IREE device {device!r}; known: {', '.join(_DEVICES)} (e.g. 'iree:cuda:sm_80')")
        target = IreeTarget(device, arch or _DEFAULT_ARCH[device])
        target.check()
        return target

    def check(self) -> None:
        """Refuse what IREE cannot compile, saying why (before a compiler error would)."""
        if self.device == "cuda" and self.arch not in KNOWN_CUDA_ARCHS:
            raise BackendError(
                f"IREE {_iree_version()} has no CUDA target {self.arch!r} (its known targets stop at sm_89); "
                "compile for sm_80 or sm_89: the CUDA driver runs that PTX on newer GPUs"
            )

    def __str__(self) -> str:
        return f"{self.device}:{self.arch}" if self.arch else self.device

    @property
    def driver(self) -> str:
        """The IREE runtime driver that runs this target's modules."""
        return _DEVICES[self.device][1]

    @property
    def is_host_cpu(self) -> bool:
        return self.device == "cpu"

    def compiler_flags(self) -> list[str]:
        """``iree-compile`` flags selecting this target."""
        device = _DEVICES[self.device][0]
        flags = [f"--iree-hal-target-device={device}"]
        if self.device == "cpu":
            flags += ["--iree-hal-local-target-device-backends=llvm-cpu", f"--iree-llvmcpu-target-cpu={self.arch}"]
        elif self.device == "cuda":
            flags.append(f"--iree-cuda-target={self.arch}")
        elif self.device == "hip":
            flags.append(f"--iree-rocm-target={self.arch}")
        elif self.arch:
            flags.append(f"--iree-vulkan-target={self.arch}")
        return flags


def host_cpu_features() -> frozenset[str]:
    """The CPU feature flags of this machine (``/proc/cpuinfo``), empty where unknown."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as handle:
            for line in handle:
                if line.startswith(("flags", "Features")):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


# The feature flags that decide which instructions LLVM may emit for ``-mcpu=host``; others
# (``hypervisor``, ``rdrand``...) differ between machines that run the same code.
_SIMD_PREFIXES = ("avx", "sse", "ssse", "fma", "f16c", "bmi", "amx", "asimd", "sve", "fp16", "dotprod")


def simd_features(flags: frozenset[str]) -> frozenset[str]:
    """The instruction-set flags among ``flags`` (see ``_SIMD_PREFIXES``)."""
    return frozenset(f for f in flags if f.startswith(_SIMD_PREFIXES))


def host_machine() -> str:
    return f"{platform.machine()}-{os.uname().sysname.lower()}" if hasattr(os, "uname") else platform.machine()


def _iree_version() -> str:
    try:
        from iree.compiler.version import VERSION
    except ImportError:
        return "(not installed)"
    return str(VERSION)
