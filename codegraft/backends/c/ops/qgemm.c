
/* MatMulInteger on 8-bit products (ops/quantize.py QuantMatMul): y = (a - a0) @ (w + d) as
   sum(a * w) - a0 * colsum(w) + d * (rowsum(a) - a0 * K), in int32, exact; then float, and the
   fused epilogue.  a holds uint8 values as exact floats (DynamicQuantizeLinear's output), a0
   one float or none; w is a constant int8 matrix packed [N / 64][K4 / 4][64][4] (four
   consecutive k of one column in one 32-bit lane) for VNNI, [N / 64][8][K4 / 4][8][4] (each
   group of 8 columns whole: _qpack.column_groups) for AVX2 and plain C, colsum its column sums, d an offset per
   column or none (a uint8 weight less its zero point spans up to 510 values: less d, int8).  With AVX-512 VNNI one vpdpbusd multiplies and adds 64
   byte pairs, four times a float FMA's products, from a quarter of the weight bytes; without
   it, on AVX2, exactly as ops/q8.c says (a quarter of VNNI's products an instruction); else (a
   library rebuilt for another CPU) the same sums in plain C. */
/* after ops/q8.c (_qpack.define_qgemm), which sets CG_Q8_VNNI or CG_Q8_AVX2 */

#define CG_QGEMM_ROWS 4
#define CG_QGEMM_COLS 64

typedef struct {
  const float* a; long M, K, K4; const float* a0;
  const int8_t* w; const int32_t* colsum; const int32_t* offset; long N;
  uint8_t* au8;  /* scratch: M x K4 bytes */
  int32_t* rowsum;  /* scratch: M sums of a */
  float* y; long ldy; cg_ep ep; const float* const* ops;
  /* a convolution's rows (ops/quantize.py QuantConv), or none: a's image channels-last
     {n, h, w, c, oh, ow, kh, kw, sh, sw, dh, dw, pad top, pad left}; each row of the GEMM is
     one output pixel's taps, k in (kh, kw, c) order, a pad tap a0 (so a - a0 is 0 there) */
  const long* conv; float shift;  /* added to each value: 128 for int8 data, held as uint8 */
  const int32_t* bias;  /* an int32 bias per column added to the sums, or none (QLinearConv's) */
} cg_qgemm_t;

/* n values (8-bit integers as exact floats, plus shift) as bytes, their sum added to *acc
   (lanes of int32 partial sums, reduced once a row) and *tail.  One pass on vectors: the
   packing read each row three times (0.03 of a 0.08 ms 64-channel 1x1 Conv). */
#ifdef CG_Q8_VNNI
typedef __m512i cg_qsum;
#define CG_QSUM_ZERO _mm512_setzero_si512()
#define CG_QSUM_TOTAL(s) _mm512_reduce_add_epi32(s)
#else
typedef int32_t cg_qsum;
#define CG_QSUM_ZERO 0
#define CG_QSUM_TOTAL(s) (s)
#endif
static inline void cg_qbytes(const float* a, uint8_t* to, long n, float shift, cg_qsum* acc, int32_t* tail) {
  long i = 0;
#ifdef CG_Q8_VNNI
  const __m512 sh = _mm512_set1_ps(shift);
  __m512i sum = *acc;
  for (; i + 16 <= n; i += 16) {
    const __m512i v = _mm512_cvtps_epi32(_mm512_add_ps(_mm512_loadu_ps(a + i), sh));
    _mm_storeu_si128((__m128i*)(to + i), _mm512_cvtepi32_epi8(v));
    sum = _mm512_add_epi32(sum, v);
  }
  *acc = sum;
#else
  (void)acc;
#endif
  int32_t rest = 0;
  for (; i < n; i++) {
    const int32_t v = (int32_t)(a[i] + shift);
    to[i] = (uint8_t)v;
    rest += v;
  }
  *tail += rest;
}

static void cg_qgemm_bytes(const void* ctx, long row) {
  const cg_qgemm_t* q = ctx;
  uint8_t* to = q->au8 + row * q->K4;
  cg_qsum acc = CG_QSUM_ZERO;
  int32_t tail = 0;
  cg_qbytes(q->a + row * q->K, to, q->K, q->shift, &acc, &tail);
  q->rowsum[row] = CG_QSUM_TOTAL(acc) + tail;
  for (long k = q->K; k < q->K4; k++) to[k] = 0;
}

static void cg_qconv_bytes(const cg_qgemm_t* q, long first, long last) {
  const long *g = q->conv, h = g[1], w = g[2], c = g[3], oh = g[4], ow = g[5];
  const uint8_t pad = (uint8_t)(int32_t)q->a0[0];
  const int pointwise = g[6] == 1 && g[7] == 1 && g[8] == 1 && g[9] == 1 && !g[12] && !g[13];
  long img = first / (oh * ow), oy = first / ow % oh, ox = first % ow;  /* then counted, not divided */
  for (long row = first; row < last; row++) {
    uint8_t* to = q->au8 + row * q->K4;
    cg_qsum acc = CG_QSUM_ZERO;
    int32_t sum = 0;
    if (pointwise) {  /* a 1x1 Conv of stride 1 and no pads: row r reads pixel r */
      cg_qbytes(q->a + row * c, to, c, q->shift, &acc, &sum);
    } else {
      long k = 0;
      for (long ky = 0; ky < g[6]; ky++) {
        const long iy = oy * g[8] - g[12] + ky * g[10], ix0 = ox * g[9] - g[13];
        if (g[11] == 1 && iy >= 0 && iy < h && ix0 >= 0 && ix0 + g[7] <= w) {
          /* a kernel row inside the image: its taps are kw * C adjacent values (a 3-channel image) */
          cg_qbytes(q->a + ((img * h + iy) * w + ix0) * c, to + k, g[7] * c, q->shift, &acc, &sum);
          k += g[7] * c;
          continue;
        }
        for (long kx = 0; kx < g[7]; kx++, k += c) {
          const long ix = ix0 + kx * g[11];
          if (iy < 0 || iy >= h || ix < 0 || ix >= w) {
            memset(to + k, pad, (size_t)c);
            sum += (int32_t)pad * (int32_t)c;
            continue;
          }
          cg_qbytes(q->a + ((img * h + iy) * w + ix) * c, to + k, c, q->shift, &acc, &sum);
        }
      }
    }
    for (long i = q->K; i < q->K4; i++) to[i] = 0;
    q->rowsum[row] = CG_QSUM_TOTAL(acc) + sum;
    if (++ox == ow) {
      ox = 0;
      if (++oy == oh) oy = 0, img++;
    }
  }
}

static void cg_qgemm_tile(const cg_qgemm_t* q, long r0, long block) {
  const long nr = cg_min(CG_QGEMM_ROWS, q->M - r0), c0 = block * CG_QGEMM_COLS;
  const long nc = cg_min(CG_QGEMM_COLS, q->N - c0), steps = q->K4 / 4;
  const int8_t* w = q->w + block * q->K4 * CG_QGEMM_COLS;
  const uint8_t* rows[CG_QGEMM_ROWS];
  for (long r = 0; r < CG_QGEMM_ROWS; r++) rows[r] = q->au8 + (r0 + (r < nr ? r : nr - 1)) * q->K4;
  int32_t sums[CG_QGEMM_ROWS][CG_QGEMM_COLS] __attribute__((aligned(64)));
#ifdef CG_Q8_VNNI
  /* 16 accumulators named, not an array: GCC keeps an indexed array of vectors in memory */
  __m512i c00 = _mm512_setzero_si512(), c01 = c00, c02 = c00, c03 = c00, c10 = c00, c11 = c00, c12 = c00,
          c13 = c00, c20 = c00, c21 = c00, c22 = c00, c23 = c00, c30 = c00, c31 = c00, c32 = c00, c33 = c00;
  const uint8_t *x0 = rows[0], *x1 = rows[1], *x2 = rows[2], *x3 = rows[3];
  for (long s = 0; s < steps; s++) {
    const int8_t* ws = w + s * 4 * CG_QGEMM_COLS;
    const __m512i w0 = _mm512_load_si512((const void*)ws), w1 = _mm512_load_si512((const void*)(ws + 64));
    const __m512i w2 = _mm512_load_si512((const void*)(ws + 128)), w3 = _mm512_load_si512((const void*)(ws + 192));
    int32_t f0, f1, f2, f3;
    memcpy(&f0, x0 + 4 * s, 4); memcpy(&f1, x1 + 4 * s, 4); memcpy(&f2, x2 + 4 * s, 4); memcpy(&f3, x3 + 4 * s, 4);
    __m512i b = _mm512_set1_epi32(f0);
    c00 = _mm512_dpbusd_epi32(c00, b, w0); c01 = _mm512_dpbusd_epi32(c01, b, w1);
    c02 = _mm512_dpbusd_epi32(c02, b, w2); c03 = _mm512_dpbusd_epi32(c03, b, w3);
    b = _mm512_set1_epi32(f1);
    c10 = _mm512_dpbusd_epi32(c10, b, w0); c11 = _mm512_dpbusd_epi32(c11, b, w1);
    c12 = _mm512_dpbusd_epi32(c12, b, w2); c13 = _mm512_dpbusd_epi32(c13, b, w3);
    b = _mm512_set1_epi32(f2);
    c20 = _mm512_dpbusd_epi32(c20, b, w0); c21 = _mm512_dpbusd_epi32(c21, b, w1);
    c22 = _mm512_dpbusd_epi32(c22, b, w2); c23 = _mm512_dpbusd_epi32(c23, b, w3);
    b = _mm512_set1_epi32(f3);
    c30 = _mm512_dpbusd_epi32(c30, b, w0); c31 = _mm512_dpbusd_epi32(c31, b, w1);
    c32 = _mm512_dpbusd_epi32(c32, b, w2); c33 = _mm512_dpbusd_epi32(c33, b, w3);
  }
  {
    /* sum - a0 * colsum + d * (rowsum - a0 * K), converted to float, on vectors */
    const int32_t a0 = q->a0 ? (int32_t)q->a0[0] : 0;
    const int32_t* cs = q->colsum + c0;
    float t[CG_QGEMM_ROWS * CG_QGEMM_COLS] __attribute__((aligned(64)));
    if (nc == CG_QGEMM_COLS) {
      const __m512i a0v = _mm512_set1_epi32(a0);
      __m512i k0 = _mm512_mullo_epi32(a0v, _mm512_loadu_si512((const void*)cs));
      __m512i k1 = _mm512_mullo_epi32(a0v, _mm512_loadu_si512((const void*)(cs + 16)));
      __m512i k2 = _mm512_mullo_epi32(a0v, _mm512_loadu_si512((const void*)(cs + 32)));
      __m512i k3 = _mm512_mullo_epi32(a0v, _mm512_loadu_si512((const void*)(cs + 48)));
      if (q->bias) {  /* less the bias: sum - (a0 * colsum - bias) */
        const int32_t* b = q->bias + c0;
        k0 = _mm512_sub_epi32(k0, _mm512_loadu_si512((const void*)b));
        k1 = _mm512_sub_epi32(k1, _mm512_loadu_si512((const void*)(b + 16)));
        k2 = _mm512_sub_epi32(k2, _mm512_loadu_si512((const void*)(b + 32)));
        k3 = _mm512_sub_epi32(k3, _mm512_loadu_si512((const void*)(b + 48)));
      }
      __m512i d0 = _mm512_setzero_si512(), d1 = d0, d2 = d0, d3 = d0;
      if (q->offset) {
        d0 = _mm512_loadu_si512((const void*)(q->offset + c0));
        d1 = _mm512_loadu_si512((const void*)(q->offset + c0 + 16));
        d2 = _mm512_loadu_si512((const void*)(q->offset + c0 + 32));
        d3 = _mm512_loadu_si512((const void*)(q->offset + c0 + 48));
      }
#define CG_QGEMM_ROW(r, x0, x1, x2, x3)                                                              \
      if (r < nr) {                                                                                  \
        const __m512i rest = _mm512_set1_epi32(q->rowsum[r0 + r] - a0 * (int32_t)q->K);               \
        float* tr = t + r * CG_QGEMM_COLS;                                                           \
        _mm512_store_ps(tr, _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_sub_epi32(x0, k0), _mm512_mullo_epi32(d0, rest)))); \
        _mm512_store_ps(tr + 16, _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_sub_epi32(x1, k1), _mm512_mullo_epi32(d1, rest)))); \
        _mm512_store_ps(tr + 32, _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_sub_epi32(x2, k2), _mm512_mullo_epi32(d2, rest)))); \
        _mm512_store_ps(tr + 48, _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_sub_epi32(x3, k3), _mm512_mullo_epi32(d3, rest)))); \
      }
      CG_QGEMM_ROW(0, c00, c01, c02, c03)
      CG_QGEMM_ROW(1, c10, c11, c12, c13)
      CG_QGEMM_ROW(2, c20, c21, c22, c23)
      CG_QGEMM_ROW(3, c30, c31, c32, c33)
#undef CG_QGEMM_ROW
      q->ep(q->ops, q->y, q->ldy, t, CG_QGEMM_COLS, r0, nr, c0, nc);
      return;
    }
  }
  _mm512_store_si512((void*)(sums[0]), c00); _mm512_store_si512((void*)(sums[0] + 16), c01);
  _mm512_store_si512((void*)(sums[0] + 32), c02); _mm512_store_si512((void*)(sums[0] + 48), c03);
  _mm512_store_si512((void*)(sums[1]), c10); _mm512_store_si512((void*)(sums[1] + 16), c11);
  _mm512_store_si512((void*)(sums[1] + 32), c12); _mm512_store_si512((void*)(sums[1] + 48), c13);
  _mm512_store_si512((void*)(sums[2]), c20); _mm512_store_si512((void*)(sums[2] + 16), c21);
  _mm512_store_si512((void*)(sums[2] + 32), c22); _mm512_store_si512((void*)(sums[2] + 48), c23);
  _mm512_store_si512((void*)(sums[3]), c30); _mm512_store_si512((void*)(sums[3] + 16), c31);
  _mm512_store_si512((void*)(sums[3] + 32), c32); _mm512_store_si512((void*)(sums[3] + 48), c33);
#elif defined(CG_Q8_AVX2)
  /* eight columns at a time (ops/q8.c), each row's pair sums in two accumulators: 8 of them,
     the two columns' weights and a row's step in 11 of the 16 vector registers */
  const uint8_t *x0 = rows[0], *x1 = rows[1], *x2 = rows[2], *x3 = rows[3];
  for (long cb = 0; cb < nc; cb += 8) {
    __m256i p00 = _mm256_setzero_si256(), p01 = p00, p10 = p00, p11 = p00, p20 = p00, p21 = p00, p30 = p00,
            p31 = p00;
    const int8_t* wg = w + cb * steps * 4;  /* the group's 8 columns, every step: contiguous */
    for (long s = 0; s < steps; s++) {
      const int8_t* ws = wg + s * 32;
      const __m256i w0 = cg_q8_columns4(ws), w1 = cg_q8_columns4(ws + 16);
      __m256i x = cg_q8_step(x0 + 4 * s);
      p00 = cg_q8_madd(p00, x, w0); p01 = cg_q8_madd(p01, x, w1);
      x = cg_q8_step(x1 + 4 * s);
      p10 = cg_q8_madd(p10, x, w0); p11 = cg_q8_madd(p11, x, w1);
      x = cg_q8_step(x2 + 4 * s);
      p20 = cg_q8_madd(p20, x, w0); p21 = cg_q8_madd(p21, x, w1);
      x = cg_q8_step(x3 + 4 * s);
      p30 = cg_q8_madd(p30, x, w0); p31 = cg_q8_madd(p31, x, w1);
    }
    _mm256_store_si256((__m256i*)(sums[0] + cb), cg_q8_sums8(p00, p01));
    _mm256_store_si256((__m256i*)(sums[1] + cb), cg_q8_sums8(p10, p11));
    _mm256_store_si256((__m256i*)(sums[2] + cb), cg_q8_sums8(p20, p21));
    _mm256_store_si256((__m256i*)(sums[3] + cb), cg_q8_sums8(p30, p31));
  }
#else
  for (int r = 0; r < CG_QGEMM_ROWS; r++)
    for (int c = 0; c < CG_QGEMM_COLS; c++) sums[r][c] = 0;
  for (long s = 0; s < steps; s++)
    for (int r = 0; r < CG_QGEMM_ROWS; r++) {
      const uint8_t* x = rows[r] + s * 4;
      for (int c = 0; c < CG_QGEMM_COLS; c++) {
        const int8_t* wc = w + (c / 8) * steps * 32 + s * 32 + (c % 8) * 4;  /* the AVX2 layout */
        sums[r][c] += x[0] * wc[0] + x[1] * wc[1] + x[2] * wc[2] + x[3] * wc[3];
      }
    }
#endif
  /* in int32: |a0|, |d| <= 255, |colsum| <= 128 K, |rowsum| <= 255 K, K <= 2**14: no overflow */
  const int32_t a0 = q->a0 ? (int32_t)q->a0[0] : 0;
  float t[CG_QGEMM_ROWS * CG_QGEMM_COLS] __attribute__((aligned(64)));
  for (long r = 0; r < nr; r++) {
    const int32_t rest = q->rowsum[r0 + r] - a0 * (int32_t)q->K;
    for (long c = 0; c < nc; c++)
      t[r * CG_QGEMM_COLS + c] = (float)(sums[r][c] - a0 * q->colsum[c0 + c] + (q->offset ? q->offset[c0 + c] * rest : 0)
                                         + (q->bias ? q->bias[c0 + c] : 0));
  }
  q->ep(q->ops, q->y, q->ldy, t, CG_QGEMM_COLS, r0, nr, c0, nc);
}

/* A task is one block of 64 columns over a run of up to CG_QGEMM_RUN row tiles: the block's
   weights (K4 x 64 bytes) are read from memory once, then from L1 or L2, by every tile of the
   run (ddddocr's 16-row, 8210-column classifier read its 4 MB of weights four times, once per
   row tile, when a task was one tile). */
#define CG_QGEMM_RUN 16
static void cg_qgemm_task(const void* ctx, long task) {
  const cg_qgemm_t* q = ctx;
  const long tiles = (q->M + CG_QGEMM_ROWS - 1) / CG_QGEMM_ROWS, runs = (tiles + CG_QGEMM_RUN - 1) / CG_QGEMM_RUN;
  const long block = task / runs, first = (task % runs) * CG_QGEMM_RUN, last = cg_min(tiles, first + CG_QGEMM_RUN);
  for (long tile = first; tile < last; tile++) cg_qgemm_tile(q, tile * CG_QGEMM_ROWS, block);
}

/* The bytes of CG_QGEMM_PACK rows a task: one task a row cost more in the pool than the
   copying of a 64-channel row (a 40 x 40 image: 1600 tasks). */
#define CG_QGEMM_PACK 32
static void cg_qgemm_pack(const void* ctx, long task) {
  const cg_qgemm_t* q = ctx;
  const long last = cg_min(q->M, (task + 1) * CG_QGEMM_PACK);
  if (q->conv) cg_qconv_bytes(q, task * CG_QGEMM_PACK, last);
  else
    for (long row = task * CG_QGEMM_PACK; row < last; row++) cg_qgemm_bytes(q, row);
}

/* A convolution's task when it has runs enough for the threads: one run of row tiles, its
   bytes packed by the task itself, over every block of columns (a conv's weights, up to 1 MB in
   a ResNet, stay in L2 across the blocks): one parallel region a layer instead of two, whose
   barrier a busy core held up (sscd: 53 Convs). */
static void cg_qconv_run(const void* ctx, long run) {
  const cg_qgemm_t* q = ctx;
  const long first = run * CG_QGEMM_RUN * CG_QGEMM_ROWS, last = cg_min(q->M, first + CG_QGEMM_RUN * CG_QGEMM_ROWS);
  cg_qconv_bytes(q, first, last);
  for (long block = 0; block * CG_QGEMM_COLS < q->N; block++)
    for (long r0 = first; r0 < last; r0 += CG_QGEMM_ROWS) cg_qgemm_tile(q, r0, block);
}

static void cg_qgemm(const cg_qgemm_t* q) {
  const long row_runs = (q->M + CG_QGEMM_RUN * CG_QGEMM_ROWS - 1) / (CG_QGEMM_RUN * CG_QGEMM_ROWS);
  if (q->conv && row_runs >= 4) {
    cg_parallel(row_runs, cg_qconv_run, q);
    return;
  }
  cg_parallel((q->M + CG_QGEMM_PACK - 1) / CG_QGEMM_PACK, cg_qgemm_pack, q);
  const long tiles = (q->M + CG_QGEMM_ROWS - 1) / CG_QGEMM_ROWS, runs = (tiles + CG_QGEMM_RUN - 1) / CG_QGEMM_RUN;
  cg_parallel(runs * ((q->N + CG_QGEMM_COLS - 1) / CG_QGEMM_COLS), cg_qgemm_task, q);
}
