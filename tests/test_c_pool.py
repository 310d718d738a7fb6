"""The c backend's thread pool on its own (``thread_pool.c``), through a small C harness.

Every task of a loop runs exactly once, whatever the task count and thread limit, and tasks
are claimed in runs (issue 18: a per-pixel transpose of 12,544 one-block tasks claimed one
by one took 0.1 ms on two threads against 0.02 ms on one, the counter's cache line moving
between cores on every claim).
"""

from __future__ import annotations

import ctypes
import os
import pathlib

import numpy as np
import pytest
from c_backend_util import _CACHE, needs_compiler

from codegraft.backends.c._thread_pool import POOL
from codegraft.backends.c._toolchain import Toolchain, host_target

# Each task records which thread ran it and bumps its own counter; a task's slow path (a few
# hundred pauses) gives the workers time to join, so both threads really take part.
HARNESS = """
static _Thread_local long my_id = -1;
static atomic_long next_id;
typedef struct { int* runs; int* who; long spin; } ctx_t;
static void task(const void* c, long i) {
  const ctx_t* k = c;
  if (my_id < 0) my_id = atomic_fetch_add(&next_id, 1);
  for (long s = 0; s < k->spin; s++) cg_relax();
  __atomic_fetch_add(&k->runs[i], 1, __ATOMIC_RELAXED);
  k->who[i] = (int)my_id;
}
int pool_loop(long ntasks, int want, int op_threads, long spin, int* runs, int* who) {
  const ctx_t k = {runs, who, spin};
  cg_want = want;
  cg_op_threads = op_threads;
  cg_parallel(ntasks, task, &k);
  return cg_workers;
}
"""


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    library = Toolchain(cache_dir=_CACHE).build(POOL + HARNESS, host_target())
    path = pathlib.Path(tmp_path_factory.mktemp("pool")) / "pool.so"
    path.write_bytes(library)
    lib = ctypes.CDLL(str(path))
    lib.pool_loop.restype = ctypes.c_int
    lib.pool_loop.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_int, ctypes.c_long,
                              ctypes.c_void_p, ctypes.c_void_p]
    return lib


def _loop(lib: ctypes.CDLL, ntasks: int, want: int, op_threads: int, spin: int = 0) -> tuple[np.ndarray, np.ndarray]:
    runs = np.zeros(max(ntasks, 1), np.int32)
    who = np.full(max(ntasks, 1), -1, np.int32)
    lib.pool_loop(ntasks, want, op_threads, spin, runs.ctypes.data, who.ctypes.data)
    return runs[:ntasks], who[:ntasks]


@needs_compiler
@pytest.mark.parametrize("ntasks", [0, 1, 2, 7, 64, 1000, 12544])
@pytest.mark.parametrize(("want", "op_threads"), [(1, 0), (2, 0), (0, 0), (0, 2), (4, 3)])
def test_every_task_runs_once(pool: ctypes.CDLL, ntasks: int, want: int, op_threads: int) -> None:
    for _ in range(3):
        runs, _who = _loop(pool, ntasks, want, op_threads)
        assert (runs == 1).all(), f"{ntasks} tasks: counts {np.unique(runs, return_counts=True)}"


@needs_compiler
def test_tasks_are_claimed_in_runs(pool: ctypes.CDLL) -> None:
    """On two threads, a loop of many small tasks changes hands at most once per claimed run."""
    ntasks = 12544
    switches = []
    for _ in range(5):
        runs, who = _loop(pool, ntasks, 2, 0, spin=200)
        assert (runs == 1).all()
        switches.append(int(np.count_nonzero(np.diff(who))))
    # runs of ntasks / (2 threads * 8 claims each) = 784 tasks: at most ~16 hand-overs per
    # loop; claimed one by one, two busy threads interleave thousands of times.
    assert max(switches) <= 2 * 8 + 2, switches


LEAVE = """
int leave_caller_cpu(int* before, int* after, int* allowed_before, int* allowed_after) {
  cpu_set_t set;
  sched_getaffinity(0, sizeof set, &set);
  *allowed_before = CPU_COUNT(&set);
  *before = sched_getcpu();
  atomic_store(&cg_caller_cpu, *before);  /* as if this thread were a worker woken on its waker's CPU */
  cg_leave_caller_cpu();
  *after = sched_getcpu();
  sched_getaffinity(0, sizeof set, &set);
  *allowed_after = CPU_COUNT(&set);
  return 0;
}
"""


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2 if hasattr(os, "sched_getaffinity") else True,
                    reason="needs Linux and two CPUs")
def test_a_worker_woken_on_its_wakers_cpu_moves_off_it_and_stays_unpinned(tmp_path: pathlib.Path) -> None:
    """Linux may put a woken worker on its waker's busy CPU while another idles (seen on a VM
    after an idle spell: squeezenet at 2 threads took longer than on one); the worker then
    leaves that CPU, and its affinity is the whole set again afterwards (nothing stays pinned,
    so processes sharing a machine are not stacked on the same cores)."""
    library = Toolchain(cache_dir=_CACHE).build(POOL + LEAVE, host_target())
    path = tmp_path / "leave.so"
    path.write_bytes(library)
    lib = ctypes.CDLL(str(path))
    values = [ctypes.c_int() for _ in range(4)]
    lib.leave_caller_cpu(*(ctypes.byref(v) for v in values))
    before, after, allowed_before, allowed_after = (v.value for v in values)
    assert after != before
    assert allowed_after == allowed_before == len(os.sched_getaffinity(0))
