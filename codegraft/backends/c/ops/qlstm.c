/* DynamicQuantizeLSTM's recurrence (ops/rnn.py QuantRecurrence): ${dirs} direction(s), batch ${B},
   ${len} of ${seq} steps, hidden ${H}, in onnxruntime's arithmetic (uni_directional_lstm.cc with
   8-bit weights).  xp[t][b][d][${GH}] holds each step's input projection, float(int32 sum) times
   (x scale * W scale), one 8-bit GEMM before this kernel.  Each step quantizes h_prev on its
   range, all rows together (cg_quant_range: DynamicQuantizeLinear's scale and zero point), sums
   (hq - zp) (R - R zero point) exactly in int32, and adds float(sum) * (h scale * R scale) to
   the projection: a multiply, then an add (onnxruntime's output processor, no FMA).  The gates
   follow onnxruntime's order of roundings: peephole product, then the bias Wb + Rb, then clip;
   sigmoid and tanh are MLAS's rational approximations as its FMA3 kernels compute them
   (bit for bit, hence fp-contract off here and fmaf where MLAS fuses).  r is R less its zero
   point as int8 (plus an int32 offset per column where a uint8 R spans more than int8), its
   columns in blocks of 16 hidden units (block j: gates i, o, f, c of units 16j..16j+15, zero
   past H), packed [d][block][K4 / 4][64][4] as ops/qgemm.c packs its 64-column blocks
   (vpdpbusd's order; on AVX2 without VNNI read as ops/q8.c reads it); colsum its column sums in
   ONNX's order.  y[row][d][b][H]: rows 0..seq-1 are Y (0 past len), then Y_h (row ${h_row}, -1:
   not written) and Y_c (row ${c_row}).  With fewer directions than threads (${per_step}), each
   step quantizes h_prev on the calling thread, then one parallel loop of a task per (direction,
   block of units): a block's sums need only its own columns, so its gates follow in the same
   task, and the only wait is the loop's end.  Otherwise a task per direction walks its steps
   (how every LSTM ran before: a forward one of batch 1, most, on a single thread). */
/* after ops/q8.c (ops/rnn.py), which sets CG_Q8_VNNI or CG_Q8_AVX2 */
/* no multiply and add contracted into an FMA (gcc: the pragma; clang: CG_NO_CONTRACT in each function) */
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")

typedef struct { const float* xp; const int8_t* r; const int32_t* colsum; const int32_t* offset; const float* rscale;
                 const float* bias; const float* peep; float* y; float* scratch;
                 long s; float scale[${dirs}]; int32_t zp[${dirs}]; int32_t rest[${dirs} * ${B}]; } ${name}_t;

/* onnxruntime's clip_add_bias / clip_ignore_bias: the bias first, then min(clip, x), max(-clip, x) */
static inline float ${name}_pre(float x, const float* bias, long i) {
  CG_NO_CONTRACT
#if ${has_bias}
  x = x + bias[i];
#endif
#if ${has_clip}
  x = x < ${clip} ? x : ${clip};
  x = x > -${clip} ? x : -${clip};
#endif
  return x;
}

/* the weights' layout (ops/_qpack.py: VNNI's 64 columns a k-step, or groups of 8 columns) is
   the one this build reads */
#if defined(CG_Q8_VNNI) == ${groups}
#error "qlstm: R packed for another 8-bit path than this build takes"
#endif

/* acc[n] = sum_k hq[k] * r[k][n] for one packed block of 64 columns (K4 bytes of hq, zero past H) */
static inline void ${name}_block(const uint8_t* hq, const int8_t* w, int32_t* acc) {
#if defined(CG_Q8_VNNI)
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
  for (long s = 0; s < ${K4} / 4; s++) {
    int32_t f;
    memcpy(&f, hq + 4 * s, 4);
    const __m512i x = _mm512_set1_epi32(f);
    const int8_t* ws = w + s * 256;
    a0 = _mm512_dpbusd_epi32(a0, x, _mm512_load_si512((const void*)ws));
    a1 = _mm512_dpbusd_epi32(a1, x, _mm512_load_si512((const void*)(ws + 64)));
    a2 = _mm512_dpbusd_epi32(a2, x, _mm512_load_si512((const void*)(ws + 128)));
    a3 = _mm512_dpbusd_epi32(a3, x, _mm512_load_si512((const void*)(ws + 192)));
  }
  _mm512_storeu_si512((void*)acc, a0);
  _mm512_storeu_si512((void*)(acc + 16), a1);
  _mm512_storeu_si512((void*)(acc + 32), a2);
  _mm512_storeu_si512((void*)(acc + 48), a3);
#elif defined(CG_Q8_AVX2)
  /* vpmaddubsw, exact on nibbles: h's bytes split in two (lo = q & 15, hi = q >> 4, written by
     ${name}_quantize after hq), so a pair of products is at most 15 * 128 * 2 = 3840 and never
     saturates int16 (onnxruntime's AVX2 kernel multiplies the whole bytes and does); 8 steps of
     pairs summed in int16 (30720 < 32767), then lo + 16 * hi widened into int32 by vpmaddwd.
     A pair lane holds k 0-1 or 2-3 of a column (the VNNI packing), so the int32 lanes come out in
     column order.  18 instructions for 128 products, against 30 for ops/q8.c's widened weights
     (the GEMM tiles keep those: their weights serve 4 rows, a gemv's one). */
  const uint8_t* lo = hq + ${B} * ${K4};
  const uint8_t* hi = lo + ${B} * ${K4};
  const __m256i ones = _mm256_set1_epi16(1), sixteens = _mm256_set1_epi16(16);
  for (int half = 0; half < 2; half++) {
    const int8_t* wh = w + half * ${K4} * 32;  /* its 4 groups of 8 columns (ops/_qpack.column_groups) */
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (long s0 = 0; s0 < ${K4} / 4; s0 += 8) {
      const long end = s0 + 8 < ${K4} / 4 ? s0 + 8 : ${K4} / 4;
      __m256i l0 = _mm256_setzero_si256(), l1 = l0, l2 = l0, l3 = l0, h0 = l0, h1 = l0, h2 = l0, h3 = l0;
      for (long s = s0; s < end; s++) {
        int32_t fl, fh;
        memcpy(&fl, lo + 4 * s, 4);
        memcpy(&fh, hi + 4 * s, 4);
        const __m256i xl = _mm256_set1_epi32(fl), xh = _mm256_set1_epi32(fh);
        const int8_t* ws = wh + s * 32;
        const __m256i w0 = _mm256_load_si256((const __m256i*)ws);
        const __m256i w1 = _mm256_load_si256((const __m256i*)(ws + ${K4} * 8));
        const __m256i w2 = _mm256_load_si256((const __m256i*)(ws + ${K4} * 16));
        const __m256i w3 = _mm256_load_si256((const __m256i*)(ws + ${K4} * 24));
        l0 = cg_q8_add16(l0, _mm256_maddubs_epi16(xl, w0));
        h0 = cg_q8_add16(h0, _mm256_maddubs_epi16(xh, w0));
        l1 = cg_q8_add16(l1, _mm256_maddubs_epi16(xl, w1));
        h1 = cg_q8_add16(h1, _mm256_maddubs_epi16(xh, w1));
        l2 = cg_q8_add16(l2, _mm256_maddubs_epi16(xl, w2));
        h2 = cg_q8_add16(h2, _mm256_maddubs_epi16(xh, w2));
        l3 = cg_q8_add16(l3, _mm256_maddubs_epi16(xl, w3));
        h3 = cg_q8_add16(h3, _mm256_maddubs_epi16(xh, w3));
      }
      a0 = _mm256_add_epi32(a0, _mm256_add_epi32(_mm256_madd_epi16(l0, ones), _mm256_madd_epi16(h0, sixteens)));
      a1 = _mm256_add_epi32(a1, _mm256_add_epi32(_mm256_madd_epi16(l1, ones), _mm256_madd_epi16(h1, sixteens)));
      a2 = _mm256_add_epi32(a2, _mm256_add_epi32(_mm256_madd_epi16(l2, ones), _mm256_madd_epi16(h2, sixteens)));
      a3 = _mm256_add_epi32(a3, _mm256_add_epi32(_mm256_madd_epi16(l3, ones), _mm256_madd_epi16(h3, sixteens)));
    }
    int32_t* out = acc + half * 32;
    _mm256_storeu_si256((__m256i*)out, a0);
    _mm256_storeu_si256((__m256i*)(out + 8), a1);
    _mm256_storeu_si256((__m256i*)(out + 16), a2);
    _mm256_storeu_si256((__m256i*)(out + 24), a3);
  }
#else
  /* the AVX2 layout: groups of 8 columns */
  for (int c = 0; c < 64; c++) acc[c] = 0;
  for (long s = 0; s < ${K4} / 4; s++) {
    const uint8_t* x = hq + 4 * s;
    for (int c = 0; c < 64; c++) {
      const int8_t* wc = w + (c / 8) * ${K4} * 8 + s * 32 + (c % 8) * 4;
      acc[c] += x[0] * wc[0] + x[1] * wc[1] + x[2] * wc[2] + x[3] * wc[3];
    }
  }
#endif
}

/* The gates of `units` hidden units from u0 of one row, from their 64 columns' sums (inlined
   twice: 16 units, a count the compiler can vectorize for, and the last block's rest) */
static inline __attribute__((always_inline)) void ${name}_gates(const ${name}_t* k, long d, long b, long t, long u0,
                                                                long units, const int32_t* acc) {
  CG_NO_CONTRACT
  float* restrict h = k->scratch + d * ${scratch};  /* [B][H] */
  float* restrict c = h + ${Hp};                     /* [B][H] */
  const int32_t* colsum = k->colsum + d * ${GH};
  const int32_t* offset = k->offset ? k->offset + d * ${GH} : 0;
  const float* rscale = k->rscale + d * ${GH};
  const float* bias = k->bias ? k->bias + d * ${GH} : 0;
  const float* p = k->peep ? k->peep + d * 3 * ${H} : 0;
  const float scale = k->scale[d];
  const int32_t zp = k->zp[d], rest = k->rest[d * ${B} + b];
  const float* restrict xp = k->xp + ((t * ${B} + b) * ${dirs} + d) * ${GH};
  float g[4][16];
  for (int gate = 0; gate < 4; gate++)
    for (long u = 0; u < units; u++) {
      const long n = gate * ${H} + u0 + u;
      const int32_t sum = acc[16 * gate + u] - zp * colsum[n] + (offset ? offset[n] * rest : 0);
      const float product = (float)sum * (scale * rscale[n]);
      g[gate][u] = xp[n] + product;
    }
  /* gates i, o, f, c */
  float* restrict hb = h + b * ${H};
  float* restrict cb = c + b * ${H};
  float* restrict y = k->y + ((t * ${dirs} + d) * ${B} + b) * ${H};
  for (long u = 0; u < units; u++) {
    const long i = u0 + u;
    float gi = g[0][u], gf = g[2][u], go = g[1][u];
#if ${peep}
    gi = gi + cb[i] * p[i];
    gf = gf + cb[i] * p[2 * ${H} + i];
#endif
    const float it = cg_mlas_logistic(${name}_pre(gi, bias, i));
    const float ft = cg_mlas_logistic(${name}_pre(gf, bias, 2 * ${H} + i));
    const float ct = cg_mlas_tanh(${name}_pre(g[3][u], bias, 3 * ${H} + i));
    const float first = cb[i] * ft, second = it * ct;
    const float cn = first + second;
#if ${peep}
    go = go + cn * p[${H} + i];
#endif
    const float ot = cg_mlas_logistic(${name}_pre(go, bias, ${H} + i));
    cb[i] = cn;
    hb[i] = cg_mlas_tanh(cn) * ot;
    y[i] = hb[i];
  }
}

/* One step of 16 hidden units (block j) of direction d, every row: their 64 columns' sums (R is
   packed a block per 16 units: columns i, o, f, c of units 16j..16j+15), then their gates.  It
   writes only its units of h and c; every task reads h_prev as the bytes quantized before the loop. */
/* step s of direction d for the 16 units of block j, every row */
static void ${name}_units(const ${name}_t* k, long d, long j, long s) {
  const long t = (${reverse_mask} >> d) & 1 ? ${len} - 1 - s : s;
  const uint8_t* hq = (const uint8_t*)(k->scratch + d * ${scratch} + 2 * ${Hp});  /* [B][K4] */
  const int8_t* r = k->r + (d * ${blocks} + j) * ${K4} * 64;
  const long u0 = 16 * j;
  /* the gates' per-column values, 16 units of each gate (a line apiece, four spread lines an array
     per task, gone from the caches while R streams through them), asked for before the sums */
  for (long gate = 0; gate < 4; gate++) {
    const long n = d * ${GH} + gate * ${H} + u0;
    __builtin_prefetch(k->colsum + n);
    __builtin_prefetch(k->rscale + n);
    if (k->bias) __builtin_prefetch(k->bias + n);
    for (long b = 0; b < ${B}; b++) __builtin_prefetch(k->xp + ((t * ${B} + b) * ${dirs} + d) * ${GH} + gate * ${H} + u0);
  }
  for (long b = 0; b < ${B}; b++) {
    _Alignas(64) int32_t acc[64];
    ${name}_block(hq + b * ${K4}, r, acc);
    if (${H} - u0 >= 16) ${name}_gates(k, d, b, t, u0, 16, acc);
    else ${name}_gates(k, d, b, t, u0, ${H} - u0, acc);
  }
}

/* every row's h_prev of direction d quantized on their one range, as onnxruntime's quantized
   ComputeGemm does: the bytes, and the scale, zero point and row sums the sums need */
static void ${name}_quantize(${name}_t* k, long d) {
  CG_NO_CONTRACT
  const float* h = k->scratch + d * ${scratch};
  uint8_t* hq = (uint8_t*)(h + 2 * ${Hp});
  float qp[2];
  cg_quant_range(h, ${B} * ${H}, qp);
  const float scale = qp[0], zero = qp[1];
  const int32_t zp = (int32_t)zero;
  for (long b = 0; b < ${B}; b++) {
    int32_t rowsum = 0;
    for (long i = 0; i < ${H}; i++) {
      const float v = h[b * ${H} + i] / scale;
      const uint8_t q = (uint8_t)(rintf(v < -zero ? -zero : v > 255.0f - zero ? 255.0f - zero : v) + zero);
      hq[b * ${K4} + i] = q;
#if defined(CG_Q8_AVX2)
      hq[(${B} + b) * ${K4} + i] = q & 15;
      hq[(2 * ${B} + b) * ${K4} + i] = q >> 4;
#endif
      rowsum += q;
    }
    k->rest[d * ${B} + b] = rowsum - zp * ${H};
  }
  k->scale[d] = scale;
  k->zp[d] = zp;
}

/* per_step (ops/rnn.py steps_shared_out: fewer directions than threads): a task per (direction,
   block), step k->s, its h_prev quantized before the loop.  Otherwise a task per direction
   walking all its steps: no loop per step to wait for, and each thread's R is one direction's
   (interleaving two directions' R every step made the bidirectional int8 LSTMs 4-16% slower). */
static void ${name}_task(const void* ctx, long task) {
#if ${per_step}
  const ${name}_t* k = ctx;
  ${name}_units(k, task / ${blocks}, task % ${blocks}, k->s);
#else
  /* every block's sums, then every unit's gates: R streams through without the gates' reads
     between its blocks (a block at a time, sums then gates, ran 4-10% longer on one thread) */
  ${name}_t* k = (${name}_t*)ctx;  /* its own direction's scale, zero point and row sums */
  const long d = task;
  const uint8_t* hq = (const uint8_t*)(k->scratch + d * ${scratch} + 2 * ${Hp});
  int32_t* acc = (int32_t*)(k->scratch + d * ${scratch} + 2 * ${Hp} + ${hq_floats});  /* [B][blocks][64] */
  for (long s = 0; s < ${len}; s++) {
    const long t = (${reverse_mask} >> d) & 1 ? ${len} - 1 - s : s;
    ${name}_quantize(k, d);
    for (long j = 0; j < ${blocks}; j++)
      for (long b = 0; b < ${B}; b++)
        ${name}_block(hq + b * ${K4}, k->r + (d * ${blocks} + j) * ${K4} * 64, acc + (b * ${blocks} + j) * 64);
    for (long b = 0; b < ${B}; b++)
      for (long j = 0; j < ${blocks}; j++) {
        const long u0 = 16 * j;
        if (${H} - u0 >= 16) ${name}_gates(k, d, b, t, u0, 16, acc + (b * ${blocks} + j) * 64);
        else ${name}_gates(k, d, b, t, u0, ${H} - u0, acc + (b * ${blocks} + j) * 64);
      }
  }
#endif
}

static void ${name}(const float* xp, const float* h0, const float* c0, const int8_t* r, const int32_t* colsum,
                    const int32_t* offset, const float* rscale, const float* bias, const float* peep, float* y,
                    float* scratch) {
  ${name}_t k = {xp, r, colsum, offset, rscale, bias, peep, y, scratch, 0, {0}, {0}, {0}};
  const long rows = ${B} * ${H};
  for (long d = 0; d < ${dirs}; d++) {
    float* h = scratch + d * ${scratch};
    float* c = h + ${Hp};
    if (h0) memcpy(h, h0 + d * rows, rows * sizeof(float)); else memset(h, 0, rows * sizeof(float));
    if (c0) memcpy(c, c0 + d * rows, rows * sizeof(float)); else memset(c, 0, rows * sizeof(float));
    memset(c + ${Hp}, 0, 3 * ${B} * ${K4});  /* h's bytes, then (AVX2) their low and high nibbles */
    for (long t = ${len}; t < ${seq}; t++) memset(y + (t * ${dirs} + d) * rows, 0, rows * sizeof(float));
  }
#if ${per_step}
  for (long s = 0; s < ${len}; s++) {
    for (long d = 0; d < ${dirs}; d++) ${name}_quantize(&k, d);
    k.s = s;
    /* the step's blocks of units shared out among the threads: each reads all of h_prev's bytes
       and its own 64 columns of R (the same ones every step: a thread's share of R stays in its caches) */
    cg_parallel(${dirs} * ${blocks}, ${name}_task, &k);
  }
#else
  cg_parallel(${dirs}, ${name}_task, &k);
#endif
  for (long d = 0; d < ${dirs}; d++) {
    const float* h = scratch + d * ${scratch};
#if ${h_row} >= 0
    memcpy(y + (${h_row} * ${dirs} + d) * rows, h, rows * sizeof(float));
#endif
#if ${c_row} >= 0
    memcpy(y + (${c_row} * ${dirs} + d) * rows, h + ${Hp}, rows * sizeof(float));
#endif
  }
}
#pragma GCC pop_options
