/* The dispatcher of concurrent stages (independent branches side by side); see _branches.py. */
typedef void (*cg_branch_fn)(const float* const* in, float* const* out, const float* w, float* s, long branch);
typedef struct {
  cg_branch_fn fn; const float* const* in; float* const* out; const float* w; float* s; int want;
} cg_stage_t;
static void cg_stage_task(const void* ctx, long i) {
  const cg_stage_t* k = ctx;
  const int want = cg_want, op = cg_op_threads;
  cg_want = k->want;  /* a branch on a worker honours the caller's thread limit */
  k->fn(k->in, k->out, k->w, k->s, i);
  cg_want = want;
  cg_op_threads = op;
}
/* Run branches 0..n-1 of fn side by side (one after the other when per-kernel timers are on). */
static void cg_stage(long n, cg_branch_fn fn, const float* const* in, float* const* out, const float* w, float* s) {
  if (cg_timing) {
    for (long i = 0; i < n; i++) fn(in, out, w, s, i);
    return;
  }
  const cg_stage_t k = {fn, in, out, w, s, cg_want};
  cg_op_threads = (int)n;
  cg_parallel(n, cg_stage_task, &k);
}
