/* Resize of channels-last x[N][${h}][${w}][${c}] to y[N][${oh}][${ow}][${c}] (ops/resize.py).
   Output row oy reads input rows y0[oy] and y1[oy] (weight fy[oy] on the second), output
   column ox input columns x0[ox] and x1[ox] (fx[ox]); nearest reads y0 and x0 alone.  The
   tables were computed at compile time with onnxruntime's arithmetic.  One task per output
   row (linear) or per run of equal output rows (nearest). */
static const int ${name}_y0[${oh}] = {${y0}};
static const int ${name}_x0[${ow}] = {${x0}};
#if ${linear}
static const int ${name}_y1[${oh}] = {${y1}};
static const int ${name}_x1[${ow}] = {${x1}};
static const float ${name}_fy[${oh}] = {${fy}};
static const float ${name}_fx[${ow}] = {${fx}};
#endif
#if !${linear}
/* Nearest: consecutive output rows reading the same input row are equal; each task computes
   the first of such a run and copies it to the others (an 8x upsample gathers 1 row in 8). */
static const int ${name}_runs[${tasks_per_image} + 1] = {${runs}};
#endif
typedef struct { const float* x; float* y; } ${name}_t;
static void ${name}_row(const void* ctx, long task) {
  const ${name}_t* k = ctx;
  const float* image = k->x + task / ${tasks_per_image} * ${image};
#if ${linear}
  const long oy = task % ${oh};
  const float* r0 = image + ${name}_y0[oy] * ${row};
  float* yp = k->y + task * ${out_row};
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
  const long first = ${name}_runs[task % ${tasks_per_image}], end = ${name}_runs[task % ${tasks_per_image} + 1];
  const float* r0 = image + ${name}_y0[first] * ${row};
  float* const y0 = k->y + (task / ${tasks_per_image} * ${oh} + first) * ${out_row};
  float* yp = y0;
  for (long ox = 0; ox < ${ow}; ox++, yp += ${c}) memcpy(yp, r0 + ${name}_x0[ox] * ${c}, ${c} * sizeof(float));
  for (long oy = first + 1; oy < end; oy++) memcpy(y0 + (oy - first) * ${out_row}, y0, ${out_row} * sizeof(float));
#endif
}
static void ${name}(const float* x, float* y) {
  const ${name}_t k = {x, y};
  cg_parallel(${tasks}, ${name}_row, &k);
}
