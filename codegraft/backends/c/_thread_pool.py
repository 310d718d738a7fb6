"""The C thread pool every generated library carries: a parallel-for without a barrier.

NOTE: why not OpenMP.  An OpenMP loop ends in a barrier that waits for *every* thread of
the team, including one the OS has not scheduled yet; on a machine where another process
(or onnxruntime's own spinning pool, in the partition just before ours) holds a core,
each of a model's hundreds of loops then waits a scheduler tick, and a 20 ms model takes
hundreds.  Here the calling thread claims tasks with the workers and waits only for tasks
a worker has actually started: a worker that wakes late finds no work and costs nothing.

Shares and runs (issue 18).  A loop's tasks are dealt out in contiguous shares, one per
thread it may use, each with its own counter: the caller drains share 0, a worker the share
its number gives it, and whoever runs out of its own steals from the others' (so a late
worker's share is done by the others, as before).  The same thread thus takes the same rows
of every kernel that splits its rows alike, and finds in its own cache what it wrote a
kernel before; from one shared counter two threads took alternate runs, and half of each
kernel's input came from the other core's cache: vgg19 at two threads 0.94x as long with
shares, squeezenet and densenet121 0.91x, resnet50 unchanged (``bench.c_revisions``).
Until it steals, a thread's claims touch only its own counter, which 16 threads no longer
contend for.  Tasks are claimed in runs of about ``ntasks / (8 x threads)``: one claim per
task moved a counter's cache line between cores on every task of a 12,544-task transpose,
which made it slower on two threads than on one.

Waking (issue 18).  A loop is *published* in one of a few job slots and announced by
bumping one futex word (``cg_epoch``); only as many sleeping workers as the loop can use
are woken, with one ``futex_wake`` per loop, not per task.  Idle workers first spin on that
word with ``pause`` for a budget of microseconds, then sleep on it.  The budget adapts per
worker: it doubles when a worker had just fallen asleep when the next loop came (loops of
one call follow each other closely), halves when it spun for nothing, and drops to its minimum
when the worker finds itself preempted while spinning (a gap between two clock reads far
longer than the pauses between them: another runnable thread wanted this core, so the
machine is oversubscribed and spinning only steals from it); the next wake-up after a
short sleep restores it to twice that gap.  So a quiet machine gets spinning latency, a
busy one gets sleeping workers.  The caller never waits for a worker
that has not started a task.

Where a woken worker runs.  Linux may put a woken thread on its waker's CPU rather than an
idle one (on a VM, a virtual CPU the host descheduled during an idle spell looks
unavailable); caller and worker then share one core in scheduler slices while another
idles (``perf sched``: the woken worker waited up to 3 ms for the caller's slice), and the
call takes longer than on one thread: squeezenet at 2 threads took 10.5 ms after 50 ms
idle, 4.5 ms called back to back, 8.4 ms on one thread.  So each call notes its caller's CPU
(``cg_note_caller`` in ``cg_entry``), and the workers leave that one CPU out of their
affinity (``cg_avoid_caller_cpu``; they follow when the caller moves).  After idle spells
squeezenet and shufflenet at 2 threads ran 0.53-0.56x as long as before, back to back the
same.  Moving a worker off only when it found itself there (its affinity restored at once)
did half as well: it had first to wait for the caller's slice to run at all.  Pinning each
worker to a core of its own (TVM's and OpenVINO's default) did as well on that VM, but
processes sharing a machine, each pinning its workers to the same cores, would queue on
them while other cores idle; leaving out one CPU keeps the scheduler free to spread them.

Each kernel runs on at most ``cg_op_threads`` threads, set before it by the generated code
from the cost model of ``_thread_cost.py``: a kernel given one thread runs inline and wakes
nobody.  Several loops may be live at once (independent branches run side by side, see
``_branches.py``: a branch running on a worker publishes its own kernels' loops in another
slot, and idle workers join them up to each loop's limit); with every slot taken, a loop
runs on its caller's thread.

Workers start with a library's first parallel loop and sleep between calls until the process
ends, unless ``cg_pool_release`` ends them (``CRunnable.release_threads``; measuring threads
per kernel does so for the builds it timed): it raises a flag and bumps and wakes the futex
word until every worker has seen it, and the next parallel loop starts them again.

The handshake between a caller retiring a job and a worker joining it is the classic
store-then-load on two sequentially consistent atomics per slot (the slot pointer and its
``active`` count): either the worker sees the slot empty, or the caller sees the worker and
waits for it.  The same pattern guards sleeping: a worker counts itself in ``cg_sleepers``
and then re-reads ``cg_epoch``; a publisher bumps ``cg_epoch`` and then reads
``cg_sleepers``, so no wake-up is lost.
"""

from __future__ import annotations

from codegraft.backends.c._c_files import c_file

POOL = c_file("thread_pool.c")
