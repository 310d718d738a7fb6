
/* A task is a run of consecutive row tiles of one group and one range of channel blocks
   (``blocks_per_task`` of them, _blocking.py): each tile runs every block of the range into
   one buffer, so its input rows are read from memory once and then from L1, the range's
   packed weights stay in L2 across the tiles, and the epilogue stores the tile's rows in one
   call.  Rows are walked incrementally (no divisions per row).  The FUSED hole is empty, or a
   register epilogue's full-tile path, the SETUP hole empty or the next tile's prefetch
   (gemm.py: driver, AHEAD_SETUP).  Tasks go group by group and range by range, or, where every
   group's weights fit in half the L2 (rows_outer, _blocking.py: split), rows first: the thread
   pool deals each thread a contiguous share of them. */
typedef struct { const cg_gemm_t* k; long chunks, ranges; } cg_gemm_${NAME}_job;
static void cg_gemm_${NAME}_task(const void* ctx, long task) {
  const cg_gemm_${NAME}_job* job = ctx;
  const cg_gemm_t* k = job->k;
  const long R = k->N * k->OH * k->OW;
  const long ntiles = (R + ${P} - 1) / ${P};
  const long K = k->ntaps * k->cg;
  const long sets = k->groups * job->ranges;
  const long chunk = k->rows_outer ? task / sets : task % job->chunks;
  const long gr = k->rows_outer ? task % sets : task / job->chunks, range = gr % job->ranges, grp = gr / job->ranges;
  const long t0 = chunk * ntiles / job->chunks, t1 = (chunk + 1) * ntiles / job->chunks;
  const long mb0 = range * k->blocks_per_task, mb1 = cg_min(k->nmb, mb0 + k->blocks_per_task);
  const long ldt = (mb1 - mb0) * ${NV} * VW;
  const long c0 = grp * k->mg + mb0 * ${NV} * VW, nc = cg_min(ldt, k->mg - mb0 * ${NV} * VW);
  const float* wp = k->wp + (grp * k->nmb + mb0) * K * ${NV} * VW;
  const float* x = k->x + grp * k->cg * k->cstride;
  long r = t0 * ${P}, ow = r % k->OW, rest = r / k->OW, oh = rest % k->OH, n = rest / k->OH;
  const float* rows[${P}];
  float buf[${BUF}] __attribute__((aligned(64)));  /* >= ${P} * ldt (blocks_per_task) */
  for (long tile = t0; tile < t1; tile++) {
    const long r0 = tile * ${P}, nr = cg_min(${P}, R - r0);
    /* Into a bordered output (yrow/yimg) a tile's rows are one run when they stay in one row
       of pixels: shift y by the rows skipped before it; else each run is stored apart. */
    const long n0 = n, oh0 = oh, ow0 = ow;
    float* const y = k->y + (n0 * k->yimg + oh0 * k->yrow) * k->ldy;
    const int whole = ow0 + nr <= k->OW || (k->yrow == 0 && k->yimg == 0);
${SETUP}    for (int p = 0; p < ${P}; p++) {
      if (p >= nr) { rows[p] = rows[nr - 1]; continue; }
      rows[p] = x + ((n * k->Hp + oh * k->sh) * k->Wp + ow * k->sw) * k->pstride;
      if (++ow == k->OW) { ow = 0; if (++oh == k->OH) { oh = 0; n++; } }
    }
${FUSED}    for (long mb = 0; mb < mb1 - mb0; mb++)
      ${MK}(rows, k->tapoff, k->ntaps, k->cg, k->cstride, wp + mb * K * ${NV} * VW, buf + mb * ${NV} * VW, ldt${MORE});
    if (whole) k->ep(k->ops, y, k->ldy, buf, ldt, k->rbase + r0, nr, c0, nc);
    else cg_gemm_store_rows(k, buf, ldt, r0, nr, c0, nc, n0, oh0, ow0);
  }
}
static void cg_gemm_${NAME}(const cg_gemm_t* k) {
  const long ntiles = (k->N * k->OH * k->OW + ${P} - 1) / ${P};
  const long ranges = (k->nmb + k->blocks_per_task - 1) / k->blocks_per_task;  /* blocks_per_task >= 1 */
  /* the split was chosen at compile time for the threads this op gets (_thread_cost.py) */
  const long chunks = cg_min(ntiles, k->runs < 1 ? 1 : k->runs);
  const cg_gemm_${NAME}_job job = {k, chunks, ranges};
  cg_parallel(k->groups * ranges * job.chunks, cg_gemm_${NAME}_task, &job);
}
