
/* DynamicQuantizeLinear's scale and zero point of n floats, as onnxruntime computes them
   (qmath.h's GetQuantizationParameter for uint8): the range widened to include 0, the scale
   (max - min) / 255 (1 where the range is empty: an all-zero input), the zero point -min / scale
   clamped to [0, 255] and rounded half to even.  out = {scale, zero point}.  VW partial minima
   and maxima stay in vector registers: the compiler does not reorder a float reduction itself. */
static void cg_quant_range(const float* x, long n, float* out) {
  vf lo = (vf){0}, hi = (vf){0};
  long i = 0;
  for (; i + VW <= n; i += VW) {
    const vf v = *(const vfu*)(x + i);
    lo = cg_vpick(v < lo, v, lo);
    hi = cg_vpick(v > hi, v, hi);
  }
  float mn = 0.0f, mx = 0.0f;
  for (int l = 0; l < VW; l++) {
    mn = lo[l] < mn ? lo[l] : mn;
    mx = hi[l] > mx ? hi[l] : mx;
  }
  for (; i < n; i++) {
    mn = x[i] < mn ? x[i] : mn;
    mx = x[i] > mx ? x[i] : mx;
  }
  const float scale = mx == mn ? 1.0f : (mx - mn) / 255.0f;
  const float zero_point = 0.0f - mn / scale;
  out[0] = scale;
  out[1] = rintf(zero_point < 0.0f ? 0.0f : zero_point > 255.0f ? 255.0f : zero_point);
}
