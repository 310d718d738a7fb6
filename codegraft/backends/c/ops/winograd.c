/* Winograd F(2x2, 3x3) around the GEMM engine (ops/winograd.py).

   A 3x3 stride-1 Conv's output is cut into 2x2 tiles; tile (ty, tx) reads the 4x4 input patch
   at (2 ty - pt, 2 tx - pl), zeros outside the input.  cg_wino_in writes each patch's
   transform d -> B^T d B as 16 values per channel, v[N][TH][TW][16][C]; the GEMM engine then
   runs 16 independent [tiles x C] by [C x K] products, a grouped 1x1 Conv, into
   m[N][TH][TW][16][K]; cg_wino_out turns each tile's 16 values per channel into its 2x2
   outputs, m -> A^T m A, stores them where the Conv's output goes (a Concat slot or a zero
   border included: ldy, yrow, yimg as in cg_gemm_t) and runs the fused epilogue on them in
   place.  16 products per tile of 4 outputs instead of 36: 2.25x fewer multiply-adds.

   Tasks are (image, tile row, run of CT tile columns), every channel: a 14x14 map has only 7
   tile rows.  Both loops read and write VW channels at a time; a channel count that is not a
   multiple of VW ends in a scalar loop of the same arithmetic.

   An Inf or NaN in the input would reach every output of the tiles whose patches hold it
   (Inf - Inf, 0 * Inf), where the direct Conv gives it only to the outputs whose windows do:
   cg_wino_in sets *nonfinite when it reads one (x - x is 0 for every finite x, NaN else),
   and the kernel then runs the direct Conv instead (ops/conv.py). */

/* B^T d B of a 4x4 patch, 16 values of type T: rows first, then columns. */
#define CG_WINO_IN(T, d, out)                                                                   \
  do {                                                                                          \
    T t_[16];                                                                                   \
    for (int j = 0; j < 4; j++) {                                                               \
      t_[j] = d[j] - d[8 + j];                                                                  \
      t_[4 + j] = d[4 + j] + d[8 + j];                                                          \
      t_[8 + j] = d[8 + j] - d[4 + j];                                                          \
      t_[12 + j] = d[4 + j] - d[12 + j];                                                        \
    }                                                                                           \
    for (int i = 0; i < 4; i++) {                                                               \
      out[4 * i] = t_[4 * i] - t_[4 * i + 2];                                                   \
      out[4 * i + 1] = t_[4 * i + 1] + t_[4 * i + 2];                                           \
      out[4 * i + 2] = t_[4 * i + 2] - t_[4 * i + 1];                                           \
      out[4 * i + 3] = t_[4 * i + 1] - t_[4 * i + 3];                                           \
    }                                                                                           \
  } while (0)

/* A^T m A of a tile's 4x4 products: its 2x2 outputs, row-major. */
#define CG_WINO_OUT(T, m, out)                                                                  \
  do {                                                                                          \
    T s_[8];                                                                                    \
    for (int j = 0; j < 4; j++) {                                                               \
      s_[j] = m[j] + m[4 + j] + m[8 + j];                                                       \
      s_[4 + j] = m[4 + j] - m[8 + j] - m[12 + j];                                              \
    }                                                                                           \
    for (int i = 0; i < 2; i++) {                                                               \
      out[2 * i] = s_[4 * i] + s_[4 * i + 1] + s_[4 * i + 2];                                   \
      out[2 * i + 1] = s_[4 * i + 1] - s_[4 * i + 2] - s_[4 * i + 3];                           \
    }                                                                                           \
  } while (0)

typedef struct {
  const float* x; float* v; long N, H, W, C, TH, TW, pt, pl, CT, ncol, row0; const float* zeros; int* nonfinite;
} cg_wino_in_t;
static void cg_wino_in_task(const void* ctx, long task) {
  const cg_wino_in_t* k = ctx;
  const long col = task % k->ncol, row = k->row0 + task / k->ncol, n = row / k->TH, ty = row % k->TH;
  const long C = k->C, tx0 = col * k->CT, tx1 = cg_min(k->TW, tx0 + k->CT);
  const float* rows[4];
  for (int a = 0; a < 4; a++) {
    const long y = 2 * ty - k->pt + a;
    rows[a] = y >= 0 && y < k->H ? k->x + (n * k->H + y) * k->W * C : NULL;
  }
  float* v = k->v + ((row - k->row0) * k->TW + tx0) * 16 * C;
  vf seen = {0};  /* x - x summed over every value read: NaN once one is not finite */
  float seen_tail = 0.0f;
  for (long tx = tx0; tx < tx1; tx++, v += 16 * C) {
    const float* p[16];
    for (int b = 0; b < 4; b++) {
      const long xx = 2 * tx - k->pl + b;
      const int inside = xx >= 0 && xx < k->W;
      for (int a = 0; a < 4; a++) p[4 * a + b] = rows[a] && inside ? rows[a] + xx * C : k->zeros;
    }
    long c = 0;
    for (; c + VW <= C; c += VW) {
      vf d[16], out[16];
      for (int i = 0; i < 16; i++) {
        d[i] = *(const vfu*)(p[i] + c);
        seen += d[i] - d[i];
      }
      CG_WINO_IN(vf, d, out);
      for (int i = 0; i < 16; i++) *(vfu*)(v + i * C + c) = out[i];
    }
    for (; c < C; c++) {
      float d[16], out[16];
      for (int i = 0; i < 16; i++) {
        d[i] = p[i][c];
        seen_tail += d[i] - d[i];
      }
      CG_WINO_IN(float, d, out);
      for (int i = 0; i < 16; i++) v[i * C + c] = out[i];
    }
  }
  for (int lane = 0; lane < VW; lane++) seen_tail += seen[lane];
  if (seen_tail != 0.0f) __atomic_store_n(k->nonfinite, 1, __ATOMIC_RELAXED);
}
/* Tile rows row0 .. row0 + nrows - 1 of the N * TH (a chunk: v holds those rows only).
   zeros: C floats of 0, read for the patch positions outside the input.
   1 when x holds an Inf or a NaN (v is then not to be used), else 0. */
static int cg_wino_in(const float* x, float* v, long N, long H, long W, long C, long TH, long TW, long pt, long pl,
                      long CT, const float* zeros, long row0, long nrows) {
  int nonfinite = 0;
  const cg_wino_in_t k = {x, v, N, H, W, C, TH, TW, pt, pl, CT, (TW + CT - 1) / CT, row0, zeros, &nonfinite};
  cg_parallel(nrows * k.ncol, cg_wino_in_task, &k);
  return __atomic_load_n(&nonfinite, __ATOMIC_RELAXED);
}

typedef struct {
  const float* m; float* y; long N, OH, OW, K, TH, TW, ldy, yrow, yimg, CT, ncol, row0; cg_ep ep; const float* const* ops;
} cg_wino_out_t;
static void cg_wino_out_task(const void* ctx, long task) {
  const cg_wino_out_t* k = ctx;
  const long col = task % k->ncol, row = k->row0 + task / k->ncol, n = row / k->TH, ty = row % k->TH;
  const long K = k->K, OW = k->OW, tx0 = col * k->CT, tx1 = cg_min(k->TW, tx0 + k->CT);
  const long oy0 = 2 * ty, rows = cg_min(2, k->OH - oy0);
  float* yr[2];  /* output rows oy0 and oy0 + 1 (the first again for an odd height's last tile row) */
  for (int i = 0; i < 2; i++) {
    const long oy = oy0 + (i < rows ? i : 0);
    yr[i] = k->y + ((n * k->OH + oy) * OW + n * k->yimg + oy * k->yrow) * k->ldy;
  }
  const float* m = k->m + ((row - k->row0) * k->TW + tx0) * 16 * K;
  for (long tx = tx0; tx < tx1; tx++, m += 16 * K) {
    const long ox = 2 * tx, cols = cg_min(2, OW - ox);
    long c = 0;
    for (; c + VW <= K; c += VW) {
      vf t[16], out[4];
      for (int i = 0; i < 16; i++) t[i] = *(const vfu*)(m + i * K + c);
      CG_WINO_OUT(vf, t, out);
      for (int i = rows - 1; i >= 0; i--)
        for (int j = cols - 1; j >= 0; j--) *(vfu*)(yr[i] + (ox + j) * k->ldy + c) = out[2 * i + j];
    }
    for (; c < K; c++) {
      float t[16], out[4];
      for (int i = 0; i < 16; i++) t[i] = m[i * K + c];
      CG_WINO_OUT(float, t, out);
      for (int i = rows - 1; i >= 0; i--)
        for (int j = cols - 1; j >= 0; j--) yr[i][(ox + j) * k->ldy + c] = out[2 * i + j];
    }
  }
  for (int i = 0; i < rows; i++) {  /* the fused steps, in place, on the rows just stored */
    const long oy = oy0 + i;
    const long ox0 = 2 * tx0, ox1 = cg_min(OW, 2 * tx1);
    k->ep(k->ops, k->y + (n * k->yimg + oy * k->yrow) * k->ldy, k->ldy, yr[i] + ox0 * k->ldy, k->ldy,
          (n * k->OH + oy) * OW + ox0, ox1 - ox0, 0, K);
  }
}
/* Tile rows row0 .. row0 + nrows - 1 (m holds those rows only). */
static void cg_wino_out(const float* m, float* y, long N, long OH, long OW, long K, long TH, long TW, long ldy,
                        long yrow, long yimg, long CT, cg_ep ep, const float* const* ops, long row0, long nrows) {
  const cg_wino_out_t k = {m, y, N, OH, OW, K, TH, TW, ldy, yrow, yimg, CT, (TW + CT - 1) / CT, row0, ep, ops};
  cg_parallel(nrows * k.ncol, cg_wino_out_task, &k);
}

/* Chunks shared out among threads (ops/winograd.py: thread_chunk_rows): each task is a chunk of
   tile rows whose three loops run inline on the thread that took it, in a pair of buffers (v,
   m: slot s at v + s * vslot, m + s * mslot) it holds for the while, so the transformed values
   stay in that core's L2 and the kernel is one parallel loop, not three per chunk.  busy: a
   flag per slot, zero before the loop; a loop runs on at most that many threads. */
typedef struct {
  const float* x; long N, H, W, C, TH, TW, pt, pl, CT; const float* zeros;
  const cg_gemm_t* gemm; void (*driver)(const cg_gemm_t*);
  float* y; long OH, OW, K, ldy, yrow, yimg; cg_ep ep; const float* const* ops;
  float* v; float* m; long vslot, mslot; int* busy; int slots; long rows, chunk; int* nonfinite;
} cg_wino_chunks_t;
static void cg_wino_chunk_task(const void* ctx, long task) {
  const cg_wino_chunks_t* k = ctx;
  const int outer = cg_op_threads;
  cg_op_threads = 1;  /* the chunk's loops run here: nobody is woken */
  int slot = 0;
  for (;; slot = (slot + 1) % k->slots) {
    int free_ = 0;
    if (__atomic_compare_exchange_n(&k->busy[slot], &free_, 1, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED)) break;
  }
  float* v = k->v + slot * k->vslot;
  float* m = k->m + slot * k->mslot;
  const long row0 = task * k->chunk, nr = cg_min(k->chunk, k->rows - row0);
  const int nonfinite = cg_wino_in(k->x, v, k->N, k->H, k->W, k->C, k->TH, k->TW, k->pt, k->pl, k->CT, k->zeros,
                                   row0, nr);
  if (nonfinite) {
    __atomic_store_n(k->nonfinite, 1, __ATOMIC_RELAXED);  /* the caller runs the direct Conv */
  } else {
    cg_gemm_t job = *k->gemm;
    job.x = v;
    job.y = m;
    job.Hp = job.OH = nr;
    k->driver(&job);
    cg_wino_out(m, k->y, k->N, k->OH, k->OW, k->K, k->TH, k->TW, k->ldy, k->yrow, k->yimg, k->CT, k->ep, k->ops,
                row0, nr);
  }
  __atomic_store_n(&k->busy[slot], 0, __ATOMIC_RELEASE);
  cg_op_threads = outer;
}

/* The direct Conv's packed weights [nmb][9 C][NW] (zeros past K, OHWI order along 9 C) from
   the transformed ones u, packed [16][nmbu][C][UW]: the fallback's, built only when it runs,
   so the library carries one copy of the weights.  g = L u L^T with L = {{1, 0, 0, 0},
   {0, 1, -1, 0}, {0, 0, 0, 1}} (L G = I): rows 0 and 3 of G g G^T are g's first and last rows,
   rows 1 and 2 sum and subtract to its middle one.  Within an ulp or two of the weights
   given (u was rounded to float once).  One task per block of NW output channels. */
typedef struct { const float* u; long C, K, nmbu, uw, nw; float* packed; } cg_wino_unpack_t;
static float cg_wino_u(const cg_wino_unpack_t* q, int point, long k, long c) {
  return q->u[((point * q->nmbu + k / q->uw) * q->C + c) * q->uw + k % q->uw];
}
static void cg_wino_unpack_block(const void* ctx, long mb) {
  const cg_wino_unpack_t* q = ctx;
  static const int rows[3][2] = {{0, -1}, {1, 2}, {3, -1}};  /* L's +1 and -1 columns, per row */
  for (int a = 0; a < 3; a++)
    for (int b = 0; b < 3; b++)
      for (long c = 0; c < q->C; c++) {
        float* dst = q->packed + (mb * 9 * q->C + (a * 3 + b) * q->C + c) * q->nw;
        for (long j = 0; j < q->nw; j++) {
          const long k = mb * q->nw + j;
          float g = 0.0f;
          for (int i = 0; k < q->K && i < 2 && rows[a][i] >= 0; i++)
            for (int l = 0; l < 2 && rows[b][l] >= 0; l++) {
              const float u = cg_wino_u(q, rows[a][i] * 4 + rows[b][l], k, c);
              g += (i == l) ? u : -u;
            }
          dst[j] = g;
        }
      }
}
static void cg_wino_unpack(const float* u, long C, long K, long nmbu, long uw, float* packed, long nmb, long nw) {
  const cg_wino_unpack_t q = {u, C, K, nmbu, uw, nw, packed};
  cg_parallel(nmb, cg_wino_unpack_block, &q);
}

/* The GEMM's epilogue between the transforms: a plain store of the tile's results. */
static void cg_wino_store(const float* const* ops, float* y, long ldy, const float* t, long ldt, long r0, long nr,
                          long c0, long nc) {
  (void)ops;
  for (long r = 0; r < nr; r++) memcpy(y + (r0 + r) * ldy + c0, t + r * ldt, sizeof(float) * nc);
}
