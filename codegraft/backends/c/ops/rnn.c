/* ${cell} recurrence (ops/rnn.py): ${dirs} direction(s), batch ${batch}, ${seq} steps, hidden ${H}.
   xp[t][b][d][${GH}] holds every step's input projection X W^T plus the biases folded into
   it (one GEMM before this kernel); this kernel adds h_prev R^T per step and applies the
   gates.  LSTM: rbh holds the peepholes P[d][3H] (i, o, f) when ${peep}; GRU: Rb of the h gate.
   R is packed at compile time in blocks of ${U} hidden units, rt[d][block][k][gate][u] =
   R[d][gate * H + 16 * block + u][k] (zero past H; a GRU without linear_before_reset: the z
   and r gates' [H][2][U] first, then the h gate's [H][U]), so a block's sums are ${NV}
   vectors of registers over k and all its units' gates need.  y[row][d][b][H]: rows
   0..seq-1 are Y, then Y_h (row ${h_row}, -1: not written) and Y_c (row ${c_row}).
   With ${per_step} (ops/rnn.py steps_shared_out: fewer sequences than threads), each step is a
   parallel loop of a task per (direction, block of units), every batch row in it (the block's
   weights read once a step, by the same thread every step: a thread's share of R stays in its
   caches); a GRU without linear_before_reset needs r * h_prev whole before its h gate: two
   loops a step.  Otherwise a task per (direction, row) walks all its steps.  h is
   double-buffered (a step reads h_prev whole and writes its units of the next).  Rows walk
   their own lengths (lens), backwards within them in reverse; Y is 0 past a row's length.
   The loops per step replaced one task per sequence always: a single thread for a forward
   layer of batch 1. */
typedef struct { const float* xp; const float* h0; const float* c0; const float* rt; const float* rbh; float* y;
                 float* scratch; long s; long len[${batch}]; } ${name}_t;

/* this row's state: h twice (the step's parity picks the one read), then c (LSTM) or, for a GRU
   without linear_before_reset, r * h_prev and z */
static inline float* ${name}_h(const ${name}_t* k, long d, long b, long parity) {
  return k->scratch + ((d * ${batch} + b) * 4 + parity) * ${Hp};
}

static inline float ${name}_clip(float x) {
#if ${has_clip}
  return cg_clamp(x, -${clip}, ${clip});
#else
  return x;
#endif
}

/* sums[v] = sum_k x[k] * w[k][v] for nv vectors of columns (k < H): nv chains of FMAs, kept in
   registers (inlined with a constant nv) */
static inline __attribute__((always_inline)) void ${name}_sums(const float* restrict x, const float* restrict w,
                                                               const long nv, float* restrict sums) {
  vf acc[${NV}];
#pragma GCC unroll 16
  for (long v = 0; v < nv; v++) acc[v] = (vf){0};
  for (long k = 0; k < ${H}; k++) {
    const vf xk = (vf){0} + x[k];
    const vf* row = (const vf*)(w + k * nv * VW);
#pragma GCC unroll 16
    for (long v = 0; v < nv; v++) acc[v] += xk * row[v];
  }
#pragma GCC unroll 16
  for (long v = 0; v < nv; v++) memcpy(sums + v * VW, &acc[v], sizeof(vf));
}

/* Step s of row b, direction d, for its ${U} hidden units of block j (phase 1: a GRU's h gate). */
static inline __attribute__((always_inline)) void ${name}_step(const ${name}_t* k, long d, long j, long b, long s,
                                                               int phase) {
  (void)phase;
  const long len = k->len[b];
  const int reverse = (${reverse_mask} >> d) & 1;
  const long u0 = ${U} * j, units = ${H} - u0 < ${U} ? ${H} - u0 : ${U};
  const float* rt = k->rt + (d * ${blocks} + j) * ${H} * ${GU};
  const long t = reverse ? len - 1 - s : s;
  const float* restrict xp = k->xp + (t * ${batch} + b) * ${dirs} * ${GH} + d * ${GH} + u0;
  const float* restrict h = ${name}_h(k, d, b, s & 1);  /* h_prev, whole */
  float* restrict hn = ${name}_h(k, d, b, (s + 1) & 1);
  float* restrict c = ${name}_h(k, d, b, 2);
  float* restrict y = k->y + ((t * ${dirs} + d) * ${batch} + b) * ${H} + u0;
  _Alignas(64) float g[${GU}];
#if ${lstm}
  /* gates i, o, f, c */
  ${name}_sums(h, rt, ${NV}, g);
  for (long u = 0; u < units; u++) {
    const long i = u0 + u;
    const float gi = xp[u] + g[u], go = xp[${H} + u] + g[${U} + u];
    const float gf = xp[2 * ${H} + u] + g[2 * ${U} + u], gc = xp[3 * ${H} + u] + g[3 * ${U} + u];
#if ${peep}
    /* i and f see the cell state before the step, o the one after it */
    const float* p = k->rbh + d * 3 * ${H};
    const float it = cg_sigmoid(${name}_clip(gi + p[i] * c[i]));
    const float ft = cg_sigmoid(${name}_clip(gf + p[2 * ${H} + i] * c[i]));
    const float ct = cg_tanh(${name}_clip(gc));
    const float cn = ft * c[i] + it * ct;
    const float ot = cg_sigmoid(${name}_clip(go + p[${H} + i] * cn));
#else
    const float it = cg_sigmoid(${name}_clip(gi)), ot = cg_sigmoid(${name}_clip(go));
    const float ft = cg_sigmoid(${name}_clip(gf)), ct = cg_tanh(${name}_clip(gc));
    const float cn = ft * c[i] + it * ct;
#endif
    c[i] = cn;
    hn[i] = ot * cg_tanh(cn);
    y[u] = hn[i];
  }
#elif ${rnn}
  /* h = tanh(x W^T + Wb + Rb + h_prev R^T) */
  ${name}_sums(h, rt, ${NV}, g);
  for (long u = 0; u < units; u++) {
    hn[u0 + u] = cg_tanh(${name}_clip(xp[u] + g[u]));
    y[u] = hn[u0 + u];
  }
#elif ${lbr}
  /* gates z, r, h; h~ = tanh(x W_h^T + Wb_h + r * (h_prev R_h^T + Rb_h)) */
  ${name}_sums(h, rt, ${NV}, g);
  const float* rbh = k->rbh + d * ${H};
  for (long u = 0; u < units; u++) {
    const long i = u0 + u;
    const float zt = cg_sigmoid(${name}_clip(xp[u] + g[u]));
    const float rt_ = cg_sigmoid(${name}_clip(xp[${H} + u] + g[${U} + u]));
    const float ht = cg_tanh(${name}_clip(xp[2 * ${H} + u] + rt_ * (g[2 * ${U} + u] + rbh[i])));
    hn[i] = (1.0f - zt) * ht + zt * h[i];
    y[u] = hn[i];
  }
#else
  /* gates z, r, h; h~ = tanh(x W_h^T + Wb_h + Rb_h + (r * h_prev) R_h^T): z and r first
     (r * h_prev into c, z after it), then, once every block has its r, the h gate */
  float* restrict z = c + ${Hp};
  if (phase == 0) {
    ${name}_sums(h, rt, ${NV} * 2 / 3, g);
    for (long u = 0; u < units; u++) {
      const long i = u0 + u;
      z[i] = cg_sigmoid(${name}_clip(xp[u] + g[u]));
      c[i] = cg_sigmoid(${name}_clip(xp[${H} + u] + g[${U} + u])) * h[i];
    }
  } else {
    ${name}_sums(c, rt + ${H} * 2 * ${U}, ${NV} / 3, g);
    for (long u = 0; u < units; u++) {
      const long i = u0 + u;
      const float ht = cg_tanh(${name}_clip(xp[2 * ${H} + u] + g[u]));
      hn[i] = (1.0f - z[i]) * ht + z[i] * h[i];
      y[u] = hn[i];
    }
  }
#endif
}

/* per_step: a task per (direction, block of units), every row that has not ended: a parallel
   loop per step.  Otherwise a task per (direction, row) walking all its steps, every block:
   where there are as many sequences as threads (a bidirectional layer on 2), no loop per step
   to wait for, and each thread's R is one direction's (it may stay in its L2). */
static void ${name}_task(const void* ctx, long task) {
  const ${name}_t* k = ctx;
#if ${per_step}
  const long d = task / ${blocks}, j = task % ${blocks};
  for (long b = 0; b < ${batch}; b++)
    if (k->s < k->len[b]) ${name}_step(k, d, j, b, k->s, 0);
#else
  const long d = task / ${batch}, b = task % ${batch};
  for (long s = 0; s < k->len[b]; s++) {
    for (long j = 0; j < ${blocks}; j++) ${name}_step(k, d, j, b, s, 0);
#if !${lstm} && !${rnn} && !${lbr}
    for (long j = 0; j < ${blocks}; j++) ${name}_step(k, d, j, b, s, 1);
#endif
  }
#endif
}

#if ${per_step} && !${lstm} && !${rnn} && !${lbr}
static void ${name}_task_h(const void* ctx, long task) {
  const ${name}_t* k = ctx;
  const long d = task / ${blocks}, j = task % ${blocks};
  for (long b = 0; b < ${batch}; b++)
    if (k->s < k->len[b]) ${name}_step(k, d, j, b, k->s, 1);
}
#endif

static void ${name}(const float* xp, const float* h0, const float* c0, const float* rt, const float* rbh,
                    const float* lens, float* y, float* scratch) {
  ${name}_t k = {xp, h0, c0, rt, rbh, y, scratch, 0, {0}};
  long most = 0;
  for (long b = 0; b < ${batch}; b++) {
    /* this row's length (lens: exact floats) */
    long len = ${seq};
    if (lens) {
      const float given = lens[b];
      if (!(given >= 0.0f && given <= (float)${seq})) {
#if ${check_lens}
        cg_int_overflow = 1;  /* out of range: the host reports it */
#endif
        return;
      }
      len = (long)given;
    }
    k.len[b] = len;
    most = len > most ? len : most;
  }
  for (long d = 0; d < ${dirs}; d++)
    for (long b = 0; b < ${batch}; b++) {
      const long state = (d * ${batch} + b) * ${H};
      float* h = ${name}_h(&k, d, b, 0);
      if (h0) memcpy(h, h0 + state, ${H} * sizeof(float)); else memset(h, 0, ${H} * sizeof(float));
#if ${lstm}
      float* c = ${name}_h(&k, d, b, 2);
      if (c0) memcpy(c, c0 + state, ${H} * sizeof(float)); else memset(c, 0, ${H} * sizeof(float));
#endif
      for (long t = k.len[b]; t < ${seq}; t++) memset(y + ((t * ${dirs} + d) * ${batch} + b) * ${H}, 0, ${H} * sizeof(float));
    }
#if ${per_step}
  for (long s = 0; s < most; s++) {
    k.s = s;
    cg_parallel(${dirs} * ${blocks}, ${name}_task, &k);
#if !${lstm} && !${rnn} && !${lbr}
    cg_parallel(${dirs} * ${blocks}, ${name}_task_h, &k);
#endif
  }
#else
  (void)most;
  cg_parallel(${dirs} * ${batch}, ${name}_task, &k);
#endif
  /* Y_h and Y_c: the state at the row's end; 0 for a row of no steps, as onnxruntime gives
     (not the initial state) */
  for (long d = 0; d < ${dirs}; d++)
    for (long b = 0; b < ${batch}; b++) {
      (void)d, (void)b;
#if ${h_row} >= 0
      float* yh = y + ((${h_row} * ${dirs} + d) * ${batch} + b) * ${H};
      if (k.len[b]) memcpy(yh, ${name}_h(&k, d, b, k.len[b] & 1), ${H} * sizeof(float));
      else memset(yh, 0, ${H} * sizeof(float));
#endif
#if ${c_row} >= 0
      float* yc = y + ((${c_row} * ${dirs} + d) * ${batch} + b) * ${H};
      if (k.len[b]) memcpy(yc, ${name}_h(&k, d, b, 2), ${H} * sizeof(float));
      else memset(yc, 0, ${H} * sizeof(float));
#endif
    }
}
