/* Cubic resize of channels-last x[N][H][W][${c}] to y[N][${oh}][${ow}][${c}] (ops/resize.py).
   Output row oy blends input rows ry[oy][0..3] by weights wy[oy][..], then divides by their
   sum ty[oy] (only where exclude_outside made it other than 1); each of those rows is first
   blended across input columns rx[ox][0..3] by weights wx[ox][..], already divided by their
   sum.  The tables were computed at compile time in onnxruntime's arithmetic, and the sums
   run in its order (ResizeBiCubic).  One task per output row. */
static const int ${name}_ry[${oh}][4] = {${ry}};
static const float ${name}_wy[${oh}][4] = {${wy}};
static const float ${name}_ty[${oh}] = {${ty}};
static const int ${name}_rx[${ow}][4] = {${rx}};
static const float ${name}_wx[${ow}][4] = {${wx}};
typedef struct { const float* x; float* y; } ${name}_t;
static void ${name}_row(const void* ctx, long task) {
  const ${name}_t* k = ctx;
  const long oy = task % ${oh};
  const float* image = k->x + task / ${oh} * ${image};
  const float* r[4];
  for (int i = 0; i < 4; i++) r[i] = image + ${name}_ry[oy][i] * ${row};
  const float* wy = ${name}_wy[oy];
  const float ty = ${name}_ty[oy];
  (void)ty;
  float* yp = k->y + task * ${out_row};
  for (long ox = 0; ox < ${ow}; ox++, yp += ${c}) {
    const int* rx = ${name}_rx[ox];
    const float* wx = ${name}_wx[ox];
    for (long ch = 0; ch < ${c}; ch++) {
      float result = 0.0f;
      for (int i = 0; i < 4; i++) {
        float across = 0.0f;
        for (int j = 0; j < 4; j++) across += wx[j] * r[i][rx[j] * ${c} + ch];
#if ${renormalized}
        result += across * wy[i] / ty;
#else
        result += across * wy[i];
#endif
      }
      yp[ch] = result;
    }
  }
}
static void ${name}(const float* x, float* y) {
  const ${name}_t k = {x, y};
  cg_parallel(${tasks}, ${name}_row, &k);
}
