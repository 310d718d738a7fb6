import os

from hypothesis import settings

# The compiled-partition cache stays off in tests (a test counting compiles, or patching a code
# generator, must not be served a partition another test compiled); tests/test_compile_cache.py
# turns it on in a folder of its own.
os.environ["CODEGRAFT_COMPILE_CACHE"] = "0"

settings.register_profile("ci", deadline=None, derandomize=True, print_blob=True)
settings.register_profile("dev", deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")
