
/* A task is a run of consecutive row tiles for one (group, channel block): rows are walked
   incrementally (no divisions per row) and the packed weights stay in cache across tiles. */
typedef struct { const cg_gemm_t* k; long per_task, chunks; } cg_gemm_${NV}_${P}_job;
static void cg_gemm_${NV}_${P}_task(const void* ctx, long task) {
  const cg_gemm_${NV}_${P}_job* job = ctx;
  const cg_gemm_t* k = job->k;
  const long R = k->N * k->OH * k->OW;
  const long ntiles = (R + ${P} - 1) / ${P};
  const long K = k->ntaps * k->cg;
  const long chunk = task % job->chunks, gm = task / job->chunks, mb = gm % k->nmb, grp = gm / k->nmb;
  const long t0 = chunk * job->per_task, t1 = cg_min(ntiles, t0 + job->per_task);
  const float* wp = k->wp + (grp * k->nmb + mb) * K * ${NV} * VW;
  const long c0 = grp * k->mg + mb * ${NV} * VW;
  const long nc = cg_min(${NV} * VW, k->mg - mb * ${NV} * VW);
  const float* x = k->x + grp * k->cg * k->cstride;
  long r = t0 * ${P}, ow = r % k->OW, rest = r / k->OW, oh = rest % k->OH, n = rest / k->OH;
  const float* rows[${P}];
  float buf[${P} * ${NV} * VW] __attribute__((aligned(64)));
  for (long tile = t0; tile < t1; tile++) {
    const long r0 = tile * ${P}, nr = cg_min(${P}, R - r0);
    for (int p = 0; p < ${P}; p++) {
      if (p >= nr) { rows[p] = rows[nr - 1]; continue; }
      rows[p] = x + ((n * k->Hp + oh * k->sh) * k->Wp + ow * k->sw) * k->pstride;
      if (++ow == k->OW) { ow = 0; if (++oh == k->OH) { oh = 0; n++; } }
    }
    cg_mk_${NV}_${P}(rows, k->tapoff, k->ntaps, k->cg, k->cstride, wp, buf);
    k->ep(k->ops, k->y, k->ldy, buf, ${NV} * VW, k->rbase + r0, nr, c0, nc);
  }
}
static void cg_gemm_${NV}_${P}(const cg_gemm_t* k) {
  const long ntiles = (k->N * k->OH * k->OW + ${P} - 1) / ${P};
  const long blocks = k->groups * k->nmb;
  /* the split was chosen at compile time for the threads this op gets (_thread_cost.py) */
  const long per_task = cg_min(ntiles, k->per_task < 1 ? 1 : k->per_task);
  const cg_gemm_${NV}_${P}_job job = {k, per_task, (ntiles + per_task - 1) / per_task};
  cg_parallel(blocks * job.chunks, cg_gemm_${NV}_${P}_task, &job);
}
