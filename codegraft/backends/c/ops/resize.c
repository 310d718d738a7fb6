/* Resize of channels-last x[N][${h}][${w}][${c}] to y[N][${oh}][${ow}][${c}] (ops/resize.py).
   Output row oy reads input rows y0[oy] and y1[oy] (weight fy[oy] on the second), output
   column ox input columns x0[ox] and x1[ox] (fx[ox]); nearest reads y0 and x0 alone.  The
   tables were computed at compile time with onnxruntime's arithmetic.  One task per output row. */
static const int ${name}_y0[${oh}] = {${y0}};
static const int ${name}_x0[${ow}] = {${x0}};
#if ${linear}
static const int ${name}_y1[${oh}] = {${y1}};
static const int ${name}_x1[${ow}] = {${x1}};
static const float ${name}_fy[${oh}] = {${fy}};
static const float ${name}_fx[${ow}] = {${fx}};
#endif
typedef struct { const float* x; float* y; } ${name}_t;
static void ${name}_row(const void* ctx, long task) {
  const ${name}_t* k = ctx;
  const long n = task / ${oh}, oy = task % ${oh};
  const float* image = k->x + n * ${image};
  const float* r0 = image + ${name}_y0[oy] * ${row};
  float* yp = k->y + task * ${out_row};
#if ${linear}
  const float* r1 = image + ${name}_y1[oy] * ${row};
  const float fy = ${name}_fy[oy], gy = 1.0f - fy;
  for (long ox = 0; ox < ${ow}; ox++, yp += ${c}) {
    const float fx = ${name}_fx[ox], gx = 1.0f - fx;
    const float w00 = gy * gx, w01 = gy * fx, w10 = fy * gx, w11 = fy * fx;
    const float *a = r0 + ${name}_x0[ox] * ${c}, *b = r0 + ${name}_x1[ox] * ${c};
    const float *d = r1 + ${name}_x0[ox] * ${c}, *e = r1 + ${name}_x1[ox] * ${c};
    for (long ch = 0; ch < ${c}; ch++) yp[ch] = w00 * a[ch] + w01 * b[ch] + w10 * d[ch] + w11 * e[ch];
  }
#else
  for (long ox = 0; ox < ${ow}; ox++, yp += ${c}) memcpy(yp, r0 + ${name}_x0[ox] * ${c}, ${c} * sizeof(float));
#endif
}
static void ${name}(const float* x, float* y) {
  const ${name}_t k = {x, y};
  cg_parallel(${rows}, ${name}_row, &k);
}
