import os
from collections.abc import Iterator

import pytest
from hypothesis import settings

# The compiled-partition cache stays off in tests (a test counting compiles, or patching a code
# generator, must not be served a partition another test compiled); tests/test_compile_cache.py
# turns it on in a folder of its own.
os.environ["CODEGRAFT_COMPILE_CACHE"] = "0"

settings.register_profile("ci", deadline=None, derandomize=True, print_blob=True)
settings.register_profile("dev", deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


@pytest.fixture(scope="module")
def xeon_blocking() -> Iterator[None]:
    """The ``c`` backend's blocking (tiles, Winograd, chunks: ``host_blocking``) as on an AVX-512
    Xeon with 1 MiB of L2, whatever CPU runs the tests: plans checked against a fixed ``Machine``
    (tests/test_c_threads.py) would otherwise follow this CPU's caches (a 512 KB L2 Zen 3 gave
    resnet50's 64 -> 64 at 56x56 12 threads of 16, in chunks)."""
    from codegraft.backends.c import _blocking

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_blocking, "_host", _blocking.CpuDescription.avx512_xeon)
        _blocking.host_blocking.cache_clear()
        yield
    _blocking.host_blocking.cache_clear()
