"""The C thread pool every generated library carries: a parallel-for without a barrier.

NOTE: why not OpenMP.  An OpenMP loop ends in a barrier that waits for *every* thread of
the team, including one the OS has not scheduled yet; on a machine where another process
(or onnxruntime's own spinning pool, in the partition just before ours) holds a core,
each of a model's hundreds of loops then waits a scheduler tick, and a 20 ms model takes
hundreds.  Here the calling thread claims tasks from an atomic counter with the workers and
waits only for tasks a worker has actually started: a worker that wakes late finds no work
and costs nothing.  Workers spin briefly between loops (loops of one call follow each
other closely; after a few pauses they yield the core instead of burning it, which matters
on a machine shared with other work), then sleep on a condition variable.  Each kernel runs on at most
``cg_op_threads`` threads, set before it by the generated code from the cost model of
``_thread_cost.py``: a kernel given one thread runs inline and wakes nobody.  One loop at a time per library: a
second caller that finds the pool busy runs its loop on its own thread.

The handshake between the caller retiring a job and a worker joining it is the classic
store-then-load on two sequentially consistent atomics (``current`` and ``active``): either
the worker sees the job gone, or the caller sees the worker and waits for it.
"""

from __future__ import annotations

POOL = r"""
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>
#include <sched.h>

typedef void (*cg_task)(const void* ctx, long i);
typedef struct { cg_task fn; const void* ctx; long ntasks; atomic_long next; int limit; } cg_job;

static pthread_once_t cg_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t cg_busy = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t cg_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cg_cv = PTHREAD_COND_INITIALIZER;
static _Atomic(cg_job*) cg_current;
static atomic_int cg_active, cg_sleepers;
static atomic_long cg_seq;  /* bumped per job: jobs reuse one stack address */
static int cg_workers;
static _Thread_local int cg_want;  /* threads requested for the current call; 0: all */
static _Thread_local int cg_op_threads;  /* threads the cost model gave the current kernel; 0: no limit */

static inline void cg_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

/* Wait politely: a few pause instructions, then give the core away (on a busy machine the
   thread we wait for may need this very core to finish). */
static inline void cg_backoff(int spin) {
  if (spin < 64) cg_relax();
  else sched_yield();
}

static void cg_drain(cg_job* j) {
  long i;
  while ((i = atomic_fetch_add(&j->next, 1)) < j->ntasks) j->fn(j->ctx, i);
}

static void* cg_worker(void* arg) {
  const int id = (int)(long)arg;
  long last = 0;  /* sequence number of the last job this worker joined */
  for (;;) {
    cg_job* j = atomic_load(&cg_current);
    for (int spin = 0; (!j || atomic_load(&cg_seq) == last) && spin < 2000; spin++) {
      cg_backoff(spin);
      j = atomic_load(&cg_current);
    }
    if (!j || atomic_load(&cg_seq) == last) {
      pthread_mutex_lock(&cg_mu);
      atomic_fetch_add(&cg_sleepers, 1);
      while (!(j = atomic_load(&cg_current)) || atomic_load(&cg_seq) == last) pthread_cond_wait(&cg_cv, &cg_mu);
      atomic_fetch_sub(&cg_sleepers, 1);
      pthread_mutex_unlock(&cg_mu);
    }
    atomic_fetch_add(&cg_active, 1);
    if (atomic_load(&cg_current) == j) {  /* still published: the job cannot end before we leave */
      const long seq = atomic_load(&cg_seq);
      if (seq != last) {
        last = seq;
        if (id < j->limit) cg_drain(j);
      }
    }
    atomic_fetch_sub(&cg_active, 1);
  }
  return 0;
}

static void cg_start(void) {
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  if (cores > 256) cores = 256;
  for (long id = 1; id < cores; id++) {
    pthread_t thread;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&thread, &attr, cg_worker, (void*)id) == 0) cg_workers++;
    pthread_attr_destroy(&attr);
  }
}

/* Run fn(ctx, i) for i in [0, ntasks), spread over the pool. */
static void cg_parallel(long ntasks, cg_task fn, const void* ctx) {
  int limit = cg_want > 0 ? cg_want : 1 << 30;
  if (cg_op_threads > 0 && cg_op_threads < limit) limit = cg_op_threads;  /* one thread: nobody is woken */
  if (ntasks > 1 && limit != 1) pthread_once(&cg_once, cg_start);
  if (ntasks <= 1 || limit == 1 || cg_workers == 0 || pthread_mutex_trylock(&cg_busy) != 0) {
    for (long i = 0; i < ntasks; i++) fn(ctx, i);
    return;
  }
  cg_job job = {fn, ctx, ntasks, 0, limit};
  atomic_fetch_add(&cg_seq, 1);
  atomic_store(&cg_current, &job);
  if (atomic_load(&cg_sleepers) > 0) {
    pthread_mutex_lock(&cg_mu);
    pthread_cond_broadcast(&cg_cv);
    pthread_mutex_unlock(&cg_mu);
  }
  cg_drain(&job);
  atomic_store(&cg_current, (cg_job*)0);
  for (int spin = 0; atomic_load(&cg_active) > 0; spin++) cg_backoff(spin);
  pthread_mutex_unlock(&cg_busy);
}
"""
