
typedef struct { const float* x; const float* w; float* y; const float* const* ops; } ${name}_t;
static inline __attribute__((always_inline)) void ${name}_vectors(const float* xr, const float* w, float* acc, long ih0,
                                                              long ow0, long np, const int interior, const long c) {
  {
    vf a[${pb}];
    #pragma GCC unroll ${pb}
    for (int p = 0; p < ${pb}; p++) a[p] = (vf){0};
    #pragma GCC unroll ${kh}
    for (long i = 0; i < ${kh}; i++) {
      const long ih = ih0 + i * ${dh};
      if (ih < 0 || ih >= ${h}) continue;
      const float* rp = xr + ih * ${row} + c;
      const long iw0 = ow0 * ${sw} - ${pl};
      vf wr[${kw}];
      #pragma GCC unroll ${kw}
      for (int j = 0; j < ${kw}; j++) wr[j] = *(const vfu*)(w + (i * ${kw} + j) * ${c} + c);
      if (interior && ((${new_rows} >> i) & 1)) {  /* this row's pixels of the next block: from L3 */
        #pragma GCC unroll ${step}
        for (int q = 0; q < ${step}; q++) __builtin_prefetch(rp + (iw0 + ${span} + q) * ${c});
      }
      /* Each input vector is loaded once and added into every pixel whose window holds it: per
         pixel the taps still come in the order j = 0, 1, ..., as ONNX's loop takes them. */
      #pragma GCC unroll ${span}
      for (int q = 0; q < ${span}; q++) {
        if (!interior && (iw0 + q < 0 || iw0 + q >= ${w})) continue;
        const vf x = *(const vfu*)(rp + (iw0 + q) * ${c});
        #pragma GCC unroll ${pb}
        for (int p = 0; p < ${pb}; p++) {
          const int t = q - p * ${sw};  /* j * dw for the tap of pixel p that reads x */
          if (t >= 0 && t % ${dw} == 0 && t / ${dw} < ${kw}) a[p] += x * wr[t / ${dw}];
        }
      }
    }
    #pragma GCC unroll ${pb}
    for (int p = 0; p < ${pb}; p++)
      if (interior || p < np) *(vfu*)(acc + p * ${c} + c) = a[p];
  }
}
static inline __attribute__((always_inline)) void ${name}_block(const float* xr, const float* w, float* acc, long ih0,
                                                            long ow0, long np, const int interior) {
  for (long c = 0; c < ${cv}; c += VW) ${name}_vectors(xr, w, acc, ih0, ow0, np, interior, c);
  /* Channels past the last whole vector: one more vector ending at the last channel, over
     channels computed already (each channel is its own sum, so they get the same values). */
  if (${overlap} >= 0) ${name}_vectors(xr, w, acc, ih0, ow0, np, interior, ${overlap});
  for (long p = 0; p < np; p++)
    for (long c = ${scalar_from}; c < ${c}; c++) {
      float sum = 0.0f;
      for (long i = 0; i < ${kh}; i++) {
        const long ih = ih0 + i * ${dh};
        if (ih < 0 || ih >= ${h}) continue;
        for (long j = 0; j < ${kw}; j++) {
          const long iw = (ow0 + p) * ${sw} - ${pl} + j * ${dw};
          if (iw >= 0 && iw < ${w}) sum += xr[(ih * ${w} + iw) * ${c} + c] * w[(i * ${kw} + j) * ${c} + c];
        }
      }
      acc[p * ${c} + c] = sum;
    }
}
static void ${name}_row(const void* ctx, long task) {
  const ${name}_t* k = ctx;
  const long n = task / ${oh}, oh = task % ${oh};
  const float* xr = k->x + n * ${image};
  const long ih0 = oh * ${sh} - ${pt};
  float acc[${block}] __attribute__((aligned(64)));
  /* The channel count as the epilogue sees it.  Knowing 8 or 16 (AVX2 and AVX-512 alike), gcc
     unrolls the epilogue's channel loop and vectorises across the block's pixels instead, a
     permute per value: there the count is hidden from it. */
  long channels = ${c};
  if (${c} <= 16) __asm__("" : "+r"(channels));
  for (long ow0 = 0; ow0 < ${ow}; ow0 += ${pb}) {
    const long np = cg_min(${pb}, ${ow} - ow0);
    if (np == ${pb} && ow0 >= ${first_in} && ow0 + ${last_pixel} <= ${last_in})
      ${name}_block(xr, k->w, acc, ih0, ow0, ${pb}, 1);
    else
      ${name}_block(xr, k->w, acc, ih0, ow0, np, 0);
    ${epilogue}(k->ops, k->y, ${c}, acc, ${c}, task * ${ow} + ow0, np, 0, channels);
  }
}
static void ${name}(const float* x, const float* w, float* y, const float* const* ops) {
  const ${name}_t k = {x, w, y, ops};
  cg_parallel(${rows}, ${name}_row, &k);
}
