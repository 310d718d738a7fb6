"""The fuzz run (issue 11): malformed models, odd feeds, corrupted and edited artifacts, and
random command lines; every case in a worker subprocess so a crash is counted, not fatal.

The default suite runs a quick sample (about a minute); ``pytest -m fuzz`` (or ``make fuzz``)
runs the long one.  To replay a failing case from its printed descriptor::

    .venv/bin/python tests/fuzz_harness.py '{"kind": "model", "seed": 17}'
"""

from __future__ import annotations

import os
import time

import pytest
from fuzz_harness import FAILURES, make_cases, run_cases, summary


def _fuzz(count: int, seed: int) -> None:
    started = time.perf_counter()
    outcomes = run_cases(make_cases(count, seed=seed))
    report = summary(outcomes, time.perf_counter() - started)
    print(report)
    assert len(outcomes) == count
    failures = [o for o in outcomes if o.status in FAILURES]
    assert not failures, report
    # the fuzzer must reach past the front door: some cases run, some are refused
    statuses = {o.status for o in outcomes}
    assert {"ok", "error"} <= statuses, report


def test_fuzz_quick() -> None:
    _fuzz(20, seed=int(os.environ.get("CODEGRAFT_FUZZ_SEED", "0")))


@pytest.mark.fuzz
def test_fuzz_long() -> None:
    _fuzz(int(os.environ.get("CODEGRAFT_FUZZ_CASES", "600")), seed=int(os.environ.get("CODEGRAFT_FUZZ_SEED", "1")))


def test_a_crash_is_counted_not_fatal() -> None:
    import fuzz_harness

    outcomes = fuzz_harness.run_cases([{"kind": "crash-self", "seed": 0}, {"kind": "feed", "seed": 3}])
    assert [o.status for o in outcomes][0] == "crash"
    assert outcomes[1].status in ("ok", "error")
