"""The system C compiler: discovery, target flags, CPU features and the on-disk library cache.

NOTE: the generated source is the same for every x86 target (it uses GCC vector
extensions, which the compiler lowers to AVX-512, AVX2 or SSE); only the compiler flags
differ.  So a blob built for AVX-512 can be rebuilt from its own source on a CPU without
it - the flags, not the source, carry the CPU features.  Libraries are cached on disk by
the hash of (source, flags, compiler), so compiling the same partition again is instant.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import platform
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from functools import cache, lru_cache

from codegraft.core.cachedir import cache_folder
from codegraft.errors import CodegraftError

# Feature sets we compile for, best first: (features the CPU must have, gcc flags).
VNNI = "avx512_vnni"  # the CPU flag of AVX-512's 8-bit dot products
_X86_TARGETS: tuple[tuple[frozenset[str], tuple[str, ...]], ...] = (
    (  # VNNI: MatMulInteger's 8-bit products four to a float FMA's one (ops/qgemm.c)
        frozenset({"avx2", "fma", "avx512f", "avx512dq", "avx512bw", "avx512vl", VNNI}),
        ("-mavx2", "-mfma", "-mavx512f", "-mavx512dq", "-mavx512bw", "-mavx512vl", "-mavx512vnni",
         "-mprefer-vector-width=512"),
    ),
    (
        frozenset({"avx2", "fma", "avx512f", "avx512dq", "avx512bw", "avx512vl"}),
        ("-mavx2", "-mfma", "-mavx512f", "-mavx512dq", "-mavx512bw", "-mavx512vl", "-mprefer-vector-width=512"),
    ),
    (frozenset({"avx2", "fma"}), ("-mavx2", "-mfma")),
    (frozenset(), ()),
)


def eight_bit_products(features: frozenset[str]) -> bool:
    """Whether code for a CPU with ``features`` sums 8-bit products in int32 faster than the float
    GEMM does: with AVX-512 VNNI (``ops/qgemm.c``), or AVX2 (``ops/q8.c``: vpmaddwd on widened
    bytes; dynamic-int8 T5 and pnm 0.60-0.81x as long as through the float GEMM on a Zen 3).

    >>> eight_bit_products(frozenset({"avx2", "fma"})), eight_bit_products(frozenset({"sse4_2"}))
    (True, False)
    """
    return VNNI in features or "avx2" in features


class CompilerNotFoundError(CodegraftError):
    """No usable C compiler: the partition cannot be built (codegraft falls back to the host)."""


@dataclass(frozen=True)
class Target:
    """What the code is compiled for: required CPU features, flags and SIMD width in floats."""

    features: frozenset[str]
    flags: tuple[str, ...]
    vector_floats: int


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity set where the OS has one (a container
    limited by a cpuset, ``taskset``), else every CPU.  ``os.cpu_count()`` counts the machine's:
    in a container given 16 of a 192-core host it says 192, and a pool sized by it would start
    191 workers to share 16 cores.

    >>> 1 <= usable_cpus() <= (os.cpu_count() or 1)
    True
    """
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


def cpu_features() -> frozenset[str]:
    """The SIMD features of this CPU (x86 ``/proc/cpuinfo`` flags; empty when unknown)."""
    return _cpu_features()


@lru_cache(maxsize=1)
def _cpu_features() -> frozenset[str]:
    try:
        text = pathlib.Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


@dataclass(frozen=True)
class CacheSizes:
    """Data cache sizes in bytes: L1d and L2 per core, L3 (last level) shared."""

    l1d: int = 32 << 10
    l2: int = 1 << 20
    l3: int = 32 << 20


def cache_sizes(root: pathlib.Path = pathlib.Path("/sys/devices/system/cpu/cpu0/cache")) -> CacheSizes:
    """This CPU's data caches as Linux reports them (``index*/level``, ``type``, ``size``).

    A level the OS does not report keeps the default of :class:`CacheSizes` (off Linux: all)::

        >>> cache_sizes(pathlib.Path("/nonexistent"))
        CacheSizes(l1d=32768, l2=1048576, l3=33554432)
    """
    found: dict[int, int] = {}
    for index in sorted(root.glob("index*")):
        try:
            level = int((index / "level").read_text())
            kind = (index / "type").read_text().strip()
            text = (index / "size").read_text().strip().upper()
        except (OSError, ValueError):
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if kind in ("Data", "Unified") and digits.isdigit():
            found[level] = int(digits) * scale
    default = CacheSizes()
    return CacheSizes(found.get(1, default.l1d), found.get(2, default.l2), found.get(3, found.get(2, default.l3)))


def host_target() -> Target:
    """The best target this CPU runs."""
    return target_for(cpu_features())


def target_for(features: frozenset[str]) -> Target:
    """The best target a CPU with ``features`` runs (portable baseline off x86)."""
    if platform.machine().lower() not in {"x86_64", "amd64"}:
        return Target(frozenset(), (), 4)
    for needed, flags in _X86_TARGETS:
        if needed <= features:
            width = 16 if "avx512f" in needed else 8 if "avx2" in needed else 4
            return Target(needed, flags, width)
    raise AssertionError("unreachable: the last x86 target needs nothing")


@dataclass(frozen=True)
class Toolchain:
    """A C compiler and where its libraries are cached.

    ``compiler`` is a path or name (default: ``cc``, ``gcc`` or ``clang``, whichever is
    found first); ``cache_dir`` defaults to ``$CODEGRAFT_CACHE_DIR/c`` or
    ``~/.cache/codegraft/c``.  ``link_flags`` go after the source (include and library
    folders, ``-l`` libraries: the ``dnnl`` backend links oneDNN this way); they are part
    of the cache key.
    """

    compiler: str | None = None
    cache_dir: pathlib.Path | None = None
    link_flags: tuple[str, ...] = ()

    def resolved_compiler(self) -> str:
        """Absolute path of the compiler, or :class:`CompilerNotFoundError`."""
        names = [self.compiler] if self.compiler else ["cc", "gcc", "clang"]
        for name in names:
            path = shutil.which(name)
            if path:
                return path
        raise CompilerNotFoundError(
            f"no C compiler found (looked for {', '.join(names)} on PATH); "
            "install gcc or clang, or pass CBackend(compiler=...)"
        )

    def resolved_cache_dir(self) -> pathlib.Path:
        """The cache folder (created on first use)."""
        root = self.cache_dir if self.cache_dir is not None else cache_folder("c")
        root.mkdir(parents=True, exist_ok=True)
        return root

    def fingerprint(self) -> str:
        """The compiler (path and version) and flags that shape a library, for cache keys;
        :class:`CompilerNotFoundError` without a compiler."""
        compiler = self.resolved_compiler()
        return "\0".join((compiler, _version(compiler), *_base_flags(compiler), *self.link_flags))

    def build(self, source: str, target: Target) -> bytes:
        """Compile ``source`` into a shared library for ``target``; cached by hash."""
        compiler = self.resolved_compiler()
        flags = _base_flags(compiler) + target.flags
        key = hashlib.sha256(
            "\0".join((source, compiler, *flags, *self.link_flags, _version(compiler))).encode()
        ).hexdigest()
        cached = self.resolved_cache_dir() / f"{key}.so"
        if cached.exists():
            return cached.read_bytes()
        with tempfile.TemporaryDirectory(prefix="codegraft-c-") as tmp:
            src = pathlib.Path(tmp) / "partition.c"
            lib = pathlib.Path(tmp) / "partition.so"
            src.write_text(source)
            cmd = [compiler, *flags, str(src), "-o", str(lib), *self.link_flags, "-lm"]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0:
                raise CodegraftError(f"C compilation failed ({' '.join(cmd)}):\n{done.stderr[-4000:]}")
            data = lib.read_bytes()
        store_library(self.resolved_cache_dir(), key, data)
        return data


def source_version(folder: pathlib.Path, *patterns: str) -> str:
    """A version string that changes whenever a file of ``folder`` matching ``patterns`` does.

    Backends that generate code key caches by it (measured placement's timings), so a cache
    never serves numbers of an older generator.  Example: ``source_version(here, "*.py")``.
    """
    digest = hashlib.sha256()
    for source in sorted({path for pattern in patterns for path in folder.glob(pattern)}):
        digest.update(source.read_bytes())
    return f"1+{digest.hexdigest()[:12]}"


def store_library(cache_dir: pathlib.Path, key: str, data: bytes) -> pathlib.Path:
    """Write a library under ``cache_dir/<key>.so`` atomically (parallel builds race here)."""
    path = cache_dir / f"{key}.so"
    if not path.exists():
        fd, tmp = tempfile.mkstemp(dir=cache_dir, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    return path


def _base_flags(compiler: str) -> tuple[str, ...]:
    # -fno-math-errno lets sqrtf inline; no -ffast-math: results must match onnxruntime.
    # -fno-trapping-math: nothing reads floating-point exception flags, and without it gcc 12
    # will not if-convert the selects in cg_exp/cg_erf (it may not compute both sides), so no
    # loop calling them vectorises (Gelu 128x1024: 6x onnxruntime's time before, scalar code).
    # NaN and Inf are still IEEE (no -ffinite-math-only).
    # Threads come from the library's own pool (pthreads), not OpenMP: see _thread_pool.py.
    return ("-O3", "-shared", "-fPIC", "-std=gnu11", "-pthread", "-fno-math-errno", "-fno-trapping-math")


@cache
def _version(compiler: str) -> str:
    done = subprocess.run([compiler, "--version"], capture_output=True, text=True)
    return done.stdout.splitlines()[0] if done.stdout else compiler
