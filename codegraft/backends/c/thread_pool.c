/* The thread pool every generated library carries; why it looks like this: _thread_pool.py. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>
#include <sched.h>
#include <time.h>
#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
#endif

typedef void (*cg_task)(const void* ctx, long i);
/* A loop's tasks are dealt out in contiguous shares, one per thread it may use; each thread
   drains its own share first, then the others' (a run at a time): see cg_drain. */
typedef struct { _Alignas(64) atomic_long next; long end; } cg_share_t;
#define CG_MAX_SHARES 64
typedef struct { cg_task fn; const void* ctx; long grain; int limit; int nshares; atomic_int joined; atomic_int open; cg_share_t* shares; } cg_job;

#define CG_SLOTS 8
#define CG_SPIN_MIN_NS 2000L     /* a freshly woken worker spins at least this long... */
#define CG_SPIN_MAX_NS 400000L   /* ...and at most this */
#define CG_PREEMPTED_NS 50000L   /* a gap this long between two clock reads: we lost the core */
#define CG_CLAIMS_PER_THREAD 8   /* tasks are claimed in runs: about this many claims per thread */
typedef struct { _Alignas(64) _Atomic(cg_job*) job; atomic_int active; } cg_slot_t;
static cg_slot_t cg_slots[CG_SLOTS];
static pthread_mutex_t cg_start_mu = PTHREAD_MUTEX_INITIALIZER;  /* starting and releasing the workers */
static atomic_int cg_started;   /* the workers run (started, not released since) */
static atomic_int cg_stopping;  /* cg_pool_release asks them to end */
static atomic_int cg_live;      /* workers not ended yet */
static _Alignas(64) atomic_uint cg_epoch;  /* bumped per published loop; the futex word */
static _Alignas(64) atomic_int cg_sleepers;
static _Alignas(64) atomic_int cg_caller_cpu = -1;  /* the CPU of the thread calling the partition: read by workers every loop */
static int cg_workers;
static _Thread_local int cg_want;  /* threads requested for the current call; 0: all */
static _Thread_local int cg_op_threads;  /* threads the cost model gave the current kernel; 0: no limit */
/* The slots this thread has joined and not left (bit s: slot s).  A branch of a stage, run on
   a worker, publishes its kernels' loops while it is still counted in the stage's slot; once
   the stage's caller has cleared that slot it is free, but a loop published there would wait
   for the slot's joiners to leave, its own thread among them: for ever. */
static _Thread_local unsigned cg_joined_slots;
static _Thread_local int cg_self;  /* 0: a caller; a worker's number from 1 */
/* The end of the share whose tasks this thread runs now: the tasks before it that follow the
   current one are this thread's next, unless another steals them (a GEMM's tiles prefetch
   the weights of the next range only where this thread runs it: gemm.py, FETCH_SETUP). */
static _Thread_local long cg_share_end;
#ifndef __linux__
static pthread_mutex_t cg_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cg_cv = PTHREAD_COND_INITIALIZER;
#endif

static inline void cg_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

static inline long cg_now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1000000000L + t.tv_nsec;
}

/* Sleep until cg_epoch moves from `seen` (spurious returns are fine: callers re-check). */
static void cg_sleep(unsigned seen) {
#ifdef __linux__
  syscall(SYS_futex, &cg_epoch, FUTEX_WAIT_PRIVATE, seen, (void*)0, (void*)0, 0);
#else
  pthread_mutex_lock(&cg_mu);
  while (atomic_load(&cg_epoch) == seen) pthread_cond_wait(&cg_cv, &cg_mu);
  pthread_mutex_unlock(&cg_mu);
#endif
}

static void cg_wake(int n) {
#ifdef __linux__
  syscall(SYS_futex, &cg_epoch, FUTEX_WAKE_PRIVATE, n, (void*)0, (void*)0, 0);
#else
  (void)n;
  pthread_mutex_lock(&cg_mu);
  pthread_cond_broadcast(&cg_cv);
  pthread_mutex_unlock(&cg_mu);
#endif
}

/* The share a thread drains first: the caller's is 0, a worker's follows from its number, so
   the same thread takes the same share of every loop of the same size. */
static int cg_own_share(const cg_job* j) {
  return cg_self == 0 || j->nshares == 1 ? 0 : 1 + (cg_self - 1) % (j->nshares - 1);
}

/* Claim runs of `grain` tasks, from this thread's own share, then from the others', until
   none are left.  Shares, not one counter: consecutive kernels split their rows alike, so
   each thread reads what it wrote itself a kernel before, from its own cache, instead of
   half of it from another core's (vgg19, squeezenet, densenet121 on two threads: 0.91-0.94x
   as long), and a thread's claims touch its own counter until it steals.  Runs, not single
   tasks, per atomic: a loop of 12,544 tiny tasks (a per-pixel transpose) on two threads
   otherwise spends its time moving a counter's cache line between cores. */
static void cg_drain(cg_job* j) {
  const int own = cg_own_share(j);
  const long outer_end = cg_share_end;  /* a loop run by a task of another loop (_branches.py) */
  for (int k = 0; k < j->nshares; k++) {
    cg_share_t* share = &j->shares[(own + k) % j->nshares];
    cg_share_end = share->end;
    long i;
    while ((i = atomic_fetch_add(&share->next, j->grain)) < share->end) {
      const long end = i + j->grain < share->end ? i + j->grain : share->end;
      if (end == share->end) atomic_fetch_sub(&j->open, 1);
      for (; i < end; i++) j->fn(j->ctx, i);
    }
  }
  cg_share_end = outer_end;
}

/* Join every published loop that still has tasks and room for one more thread; 1 if any work was done. */
static int cg_join_any(void) {
  int worked = 0;
  for (int s = 0; s < CG_SLOTS; s++) {
    cg_slot_t* slot = &cg_slots[s];
    if (!atomic_load_explicit(&slot->job, memory_order_relaxed)) continue;
    atomic_fetch_add(&slot->active, 1);
    cg_job* j = atomic_load(&slot->job);  /* still published: the job cannot end before we leave */
    if (j && atomic_load(&j->open) > 0 && atomic_fetch_add(&j->joined, 1) < j->limit - 1) {
      cg_joined_slots |= 1u << s;
      cg_drain(j);
      cg_joined_slots &= ~(1u << s);
      worked = 1;
    }
    atomic_fetch_sub(&slot->active, 1);
  }
  return worked;
}

/* Workers keep off the CPU of the thread that calls the partition.  Linux may place a woken
   thread on its waker's CPU rather than on an idle one (on a VM, a virtual CPU the host
   descheduled during an idle spell looks unavailable): the two then share one core in 4 ms
   slices while another idles (perf sched: the woken worker waited up to 3 ms for the
   caller's slice), and a call takes longer than on one thread (squeezenet at 2 threads: 10.5
   ms after 50 ms idle, 4.5 ms called back to back, 8.4 ms on one thread).  Each call notes
   its caller's CPU (cg_note_caller, from cg_entry); a worker whose affinity does not yet
   leave that CPU out takes it out (the kernel moves the worker if it is there) and gives back
   the one it left out before.  One CPU only: the scheduler stays free to spread workers over
   the rest, and processes sharing a machine are not stacked on the same cores as they would
   be if each pinned its workers. */
static void cg_note_caller(void) {
#ifdef __linux__
  const int cpu = sched_getcpu();
  if (atomic_load_explicit(&cg_caller_cpu, memory_order_relaxed) != cpu)
    atomic_store_explicit(&cg_caller_cpu, cpu, memory_order_relaxed);
#endif
}

static _Thread_local int cg_avoided = -1;  /* the caller's CPU this worker last looked at */
static _Thread_local int cg_taken = -1;    /* the CPU its affinity leaves out; -1: none */

static void cg_avoid_caller_cpu(void) {
#ifdef __linux__
  const int caller = atomic_load_explicit(&cg_caller_cpu, memory_order_relaxed);
  if (caller < 0 || caller == cg_avoided) return;
  cg_avoided = caller;  /* once per caller CPU, whatever comes of it: no system call per loop */
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) != 0) return;
  const int before = cg_taken;
  if (cg_taken >= 0) CPU_SET(cg_taken, &set);  /* give back only what was taken out */
  cg_taken = -1;
  if (CPU_ISSET(caller, &set)) {
    CPU_CLR(caller, &set);
    if (CPU_COUNT(&set) > 0) cg_taken = caller;
    else CPU_SET(caller, &set);  /* the caller's CPU is all this worker may use */
  }
  if (cg_taken != before && sched_setaffinity(0, sizeof set, &set) != 0) cg_taken = before;
#endif
}

static void* cg_worker(void* arg) {
  cg_self = (int)(long)arg;
  long budget = 50000;  /* ns of spinning before sleeping; adapted below */
  for (;;) {
    if (atomic_load(&cg_stopping)) break;  /* released: every wake-up comes back here */
    cg_avoid_caller_cpu();
    const unsigned seen = atomic_load(&cg_epoch);
    if (cg_join_any()) continue;
    /* Spin on the epoch, a few pauses between clock reads. */
    long start = cg_now_ns(), last = start, now = start;
    int moved = 0;
    while (now - start < budget) {
      for (int i = 0; i < 16 && !moved; i++) {
        cg_relax();
        moved = atomic_load_explicit(&cg_epoch, memory_order_relaxed) != seen;
      }
      if (moved) break;
      now = cg_now_ns();
      if (now - last > CG_PREEMPTED_NS) { budget = CG_SPIN_MIN_NS; break; }  /* oversubscribed: sleep now */
      last = now;
    }
    if (moved) continue;
    if (budget > CG_SPIN_MIN_NS) budget /= 2;  /* spun for nothing */
    atomic_fetch_add(&cg_sleepers, 1);
    const long asleep = cg_now_ns();
    while (atomic_load(&cg_epoch) == seen) cg_sleep(seen);
    atomic_fetch_sub(&cg_sleepers, 1);
    /* Woken soon after giving up: the next loop was close, so spin long enough to have caught
       it next time (twice the gap, at least twice the last budget).  Neither a preemption nor
       a quiet spell can leave the budget stuck low: one short gap restores it. */
    const long slept = cg_now_ns() - asleep;
    if (slept < CG_SPIN_MAX_NS) budget = 2 * (slept > budget ? slept : budget);
    if (budget > CG_SPIN_MAX_NS) budget = CG_SPIN_MAX_NS;
  }
  atomic_fetch_sub(&cg_live, 1);
  return 0;
}

static void cg_start(void) {
  /* the CPUs this process may use (a cpuset container, taskset), not the machine's */
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
#ifdef __linux__
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof allowed, &allowed) == 0 && CPU_COUNT(&allowed) > 0) cores = CPU_COUNT(&allowed);
#endif
  if (cores > 256) cores = 256;
  for (long id = 1; id < cores; id++) {
    pthread_t thread;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    atomic_fetch_add(&cg_live, 1);
    if (pthread_create(&thread, &attr, cg_worker, (void*)id) == 0) cg_workers++;
    else atomic_fetch_sub(&cg_live, 1);
    pthread_attr_destroy(&attr);
  }
}

/* The workers start with the first parallel loop, and again with the first one after a release. */
static void cg_ensure_started(void) {
  if (atomic_load_explicit(&cg_started, memory_order_acquire)) return;
  pthread_mutex_lock(&cg_start_mu);
  if (!atomic_load(&cg_started)) {
    cg_start();
    atomic_store_explicit(&cg_started, 1, memory_order_release);
  }
  pthread_mutex_unlock(&cg_start_mu);
}

/* End the workers (they sleep forever otherwise: a library that is not called again, such as
   the builds measure_threads times, keeps one per core but one).  A loop running meanwhile
   finishes on its caller's thread; the next parallel loop starts the workers again. */
void cg_pool_release(void) {
  pthread_mutex_lock(&cg_start_mu);
  if (atomic_load(&cg_started)) {
    atomic_store(&cg_stopping, 1);
    /* a worker may read the epoch after the first bump and go to sleep on it: bump and wake
       until every one has seen cg_stopping */
    while (atomic_load(&cg_live) > 0) {
      atomic_fetch_add(&cg_epoch, 1);
      cg_wake(1 << 30);
      sched_yield();
    }
    cg_workers = 0;
    atomic_store(&cg_stopping, 0);
    atomic_store(&cg_started, 0);
  }
  pthread_mutex_unlock(&cg_start_mu);
}

/* Run fn(ctx, i) for i in [0, ntasks), spread over the pool. */
static void cg_parallel(long ntasks, cg_task fn, const void* ctx) {
  int limit = cg_want > 0 ? cg_want : 1 << 30;
  if (cg_op_threads > 0 && cg_op_threads < limit) limit = cg_op_threads;  /* one thread: nobody is woken */
  if (ntasks > 1 && limit != 1) cg_ensure_started();
  cg_slot_t* slot = 0;
  cg_share_t shares[CG_MAX_SHARES];
  cg_job job = {fn, ctx, 1, limit, 1, 0, 1, shares};
  if (ntasks > 1 && limit != 1 && cg_workers > 0) {  /* deal the shares, then publish */
    const long threads = limit < cg_workers + 1 ? limit : cg_workers + 1;
    const long grain = ntasks / (threads * CG_CLAIMS_PER_THREAD);
    long nshares = threads < ntasks ? threads : ntasks;
    if (nshares > CG_MAX_SHARES) nshares = CG_MAX_SHARES;
    for (long s = 0; s < nshares; s++) {
      atomic_init(&shares[s].next, ntasks * s / nshares);
      shares[s].end = ntasks * (s + 1) / nshares;
    }
    job.grain = grain > 1 ? grain : 1;
    job.nshares = (int)nshares;
    atomic_init(&job.open, (int)nshares);
    for (int s = 0; s < CG_SLOTS && !slot; s++) {
      if (cg_joined_slots & (1u << s)) continue;  /* we are among its joiners: see cg_joined_slots */
      cg_job* empty = 0;
      if (atomic_compare_exchange_strong(&cg_slots[s].job, &empty, &job)) slot = &cg_slots[s];
    }
  }
  if (!slot) {  /* one thread, or every slot taken: run here */
    const long outer_end = cg_share_end;
    cg_share_end = ntasks;
    for (long i = 0; i < ntasks; i++) fn(ctx, i);
    cg_share_end = outer_end;
    return;
  }
  atomic_fetch_add(&cg_epoch, 1);
  if (atomic_load(&cg_sleepers) > 0) {
    long helpers = (ntasks < limit ? ntasks : limit) - 1;
    cg_wake(helpers > cg_workers ? cg_workers : (int)helpers);
  }
  cg_drain(&job);
  atomic_store(&slot->job, (cg_job*)0);
  for (int spin = 0; atomic_load(&slot->active) > 0; spin++) {
    if (spin < 64) cg_relax();
    else sched_yield();  /* the worker we wait for may need this very core */
  }
}
