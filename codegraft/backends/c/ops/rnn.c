/* ${cell} recurrence (ops/rnn.py): ${dirs} direction(s), batch ${batch}, ${seq} steps, hidden ${H}.
   xp[t][b][d][${GH}] holds every step's input projection X W^T plus the biases folded into
   it (one GEMM before this kernel); this kernel adds h_prev R^T per step and applies the
   gates.  LSTM: rbh holds the peepholes P[d][3H] (i, o, f) when ${peep}; GRU: Rb of the h gate.
   R is packed at compile time as rt[d][k][j] = R[d][j][k], so h_prev R^T is an
   axpy over contiguous rows of rt (vectorised).  GRU: the z and r gates' rows first
   ([H][2H]), then the h gate's ([H][H]).  y[row][d][b][H]: rows 0..seq-1 are Y, then Y_h
   (row ${h_row}, -1: not written) and Y_c (row ${c_row}).  One task per (direction, batch
   row): they are independent, each walks its steps in order (backwards in reverse), the
   first lens[b] of them where lens is given (Y is 0 past it). */
typedef struct { const float* xp; const float* h0; const float* c0; const float* rt; const float* rbh;
                 const float* lens; float* y; float* scratch; } ${name}_t;

/* g[j] += sum_k h[k] * rt[k * n + j] for j < n (k < ${H}). */
static inline void ${name}_gemv(const float* restrict h, const float* restrict rt, long n, float* restrict g) {
  long k = 0;
  for (; k + 4 <= ${H}; k += 4) {
    const float h0 = h[k], h1 = h[k + 1], h2 = h[k + 2], h3 = h[k + 3];
    const float* restrict r0 = rt + k * n;
    const float* restrict r1 = r0 + n;
    const float* restrict r2 = r1 + n;
    const float* restrict r3 = r2 + n;
    for (long j = 0; j < n; j++) g[j] += h0 * r0[j] + h1 * r1[j] + h2 * r2[j] + h3 * r3[j];
  }
  for (; k < ${H}; k++) {
    const float hk = h[k];
    const float* restrict r0 = rt + k * n;
    for (long j = 0; j < n; j++) g[j] += hk * r0[j];
  }
}

static inline float ${name}_clip(float x) {
#if ${has_clip}
  return cg_clamp(x, -${clip}, ${clip});
#else
  return x;
#endif
}

static void ${name}_task(const void* ctx, long task) {
  const ${name}_t* k = ctx;
  const long d = task / ${batch}, b = task % ${batch};
  const int reverse = (${reverse_mask} >> d) & 1;
  const float* rt = k->rt + d * ${GH} * ${H};
  float* restrict g = k->scratch + task * ${scratch};
  float* restrict h = g + ${GH};
  float* restrict c = h + ${H};  /* LSTM: the cell state; GRU: r * h_prev or h_prev R_h^T */
  const long state = (d * ${batch} + b) * ${H};
  if (k->h0) memcpy(h, k->h0 + state, ${H} * sizeof(float)); else memset(h, 0, ${H} * sizeof(float));
#if ${lstm}
  if (k->c0) memcpy(c, k->c0 + state, ${H} * sizeof(float)); else memset(c, 0, ${H} * sizeof(float));
#endif
  /* this row's length (lens: exact floats): its steps, backwards within it in reverse */
  long len = ${seq};
  if (k->lens) {
    const float given = k->lens[b];
    if (!(given >= 0.0f && given <= (float)${seq})) {
#if ${check_lens}
      cg_int_overflow = 1;  /* out of range: the host reports it */
#endif
      return;
    }
    len = (long)given;
  }
  for (long t = len; t < ${seq}; t++) memset(k->y + ((t * ${dirs} + d) * ${batch} + b) * ${H}, 0, ${H} * sizeof(float));
  for (long s = 0; s < len; s++) {
    const long t = reverse ? len - 1 - s : s;
    const float* restrict xp = k->xp + (t * ${batch} + b) * ${dirs} * ${GH} + d * ${GH};
    float* restrict y = k->y + ((t * ${dirs} + d) * ${batch} + b) * ${H};
#if ${lstm}
    /* gates i, o, f, c */
    memcpy(g, xp, ${GH} * sizeof(float));
    ${name}_gemv(h, rt, ${GH}, g);
#if ${peep}
    /* i and f see the cell state before the step, o the one after it */
    const float* p = k->rbh + d * 3 * ${H};
    for (long i = 0; i < ${H}; i++) {
      const float it = cg_sigmoid(${name}_clip(g[i] + p[i] * c[i]));
      const float ft = cg_sigmoid(${name}_clip(g[2 * ${H} + i] + p[2 * ${H} + i] * c[i]));
      const float ct = cg_tanh(${name}_clip(g[3 * ${H} + i]));
      const float cn = ft * c[i] + it * ct;
      const float ot = cg_sigmoid(${name}_clip(g[${H} + i] + p[${H} + i] * cn));
      c[i] = cn;
      h[i] = ot * cg_tanh(cn);
      y[i] = h[i];
    }
#else
    for (long i = 0; i < ${H}; i++) {
      const float it = cg_sigmoid(${name}_clip(g[i]));
      const float ot = cg_sigmoid(${name}_clip(g[${H} + i]));
      const float ft = cg_sigmoid(${name}_clip(g[2 * ${H} + i]));
      const float ct = cg_tanh(${name}_clip(g[3 * ${H} + i]));
      const float cn = ft * c[i] + it * ct;
      c[i] = cn;
      h[i] = ot * cg_tanh(cn);
      y[i] = h[i];
    }
#endif
#elif ${rnn}
    /* h = tanh(x W^T + Wb + Rb + h_prev R^T) */
    memcpy(g, xp, ${H} * sizeof(float));
    ${name}_gemv(h, rt, ${H}, g);
    for (long i = 0; i < ${H}; i++) {
      h[i] = cg_tanh(${name}_clip(g[i]));
      y[i] = h[i];
    }
#else
    /* gates z, r, h */
    memcpy(g, xp, 2 * ${H} * sizeof(float));
    ${name}_gemv(h, rt, 2 * ${H}, g);
#if ${lbr}
    /* h~ = tanh(x W_h^T + Wb_h + r * (h_prev R_h^T + Rb_h)) */
    memset(c, 0, ${H} * sizeof(float));
    ${name}_gemv(h, rt + 2 * ${H} * ${H}, ${H}, c);
    const float* rbh = k->rbh + d * ${H};
    for (long i = 0; i < ${H}; i++) {
      const float zt = cg_sigmoid(${name}_clip(g[i]));
      const float rt_ = cg_sigmoid(${name}_clip(g[${H} + i]));
      const float ht = cg_tanh(${name}_clip(xp[2 * ${H} + i] + rt_ * (c[i] + rbh[i])));
      h[i] = (1.0f - zt) * ht + zt * h[i];
      y[i] = h[i];
    }
#else
    /* h~ = tanh(x W_h^T + Wb_h + Rb_h + (r * h_prev) R_h^T) */
    for (long i = 0; i < ${H}; i++) c[i] = cg_sigmoid(${name}_clip(g[${H} + i])) * h[i];
    memcpy(g + 2 * ${H}, xp + 2 * ${H}, ${H} * sizeof(float));
    ${name}_gemv(c, rt + 2 * ${H} * ${H}, ${H}, g + 2 * ${H});
    for (long i = 0; i < ${H}; i++) {
      const float zt = cg_sigmoid(${name}_clip(g[i]));
      const float ht = cg_tanh(${name}_clip(g[2 * ${H} + i]));
      h[i] = (1.0f - zt) * ht + zt * h[i];
      y[i] = h[i];
    }
#endif
#endif
  }
#if ${h_row} >= 0
  memcpy(k->y + ((${h_row} * ${dirs} + d) * ${batch} + b) * ${H}, h, ${H} * sizeof(float));
#endif
#if ${c_row} >= 0
  memcpy(k->y + ((${c_row} * ${dirs} + d) * ${batch} + b) * ${H}, c, ${H} * sizeof(float));
#endif
}

static void ${name}(const float* xp, const float* h0, const float* c0, const float* rt, const float* rbh,
                    const float* lens, float* y, float* scratch) {
  const ${name}_t k = {xp, h0, c0, rt, rbh, lens, y, scratch};
  cg_parallel(${tasks}, ${name}_task, &k);
}
