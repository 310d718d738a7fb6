/* onnxruntime's arithmetic where codegraft matches it bit for bit: MLAS's rational logistic
   and tanh (its FMA3 kernels, one value), ml_common.h's PROBIT and binary LOGISTIC.  Compiled
   with no multiply and add contracted into an FMA: gcc's fp-contract=off for the functions
   between push_options and pop_options (gcc does not inline them into a loop compiled with
   contraction, whose options differ), CG_NO_CONTRACT first in each body for clang.  Included
   once in a partition's C where a kernel calls them (_codegen.py: MLAS_MATH). */
/* No multiply and add contracted into an FMA in a function compiled between
   "#pragma GCC push_options" / "#pragma GCC optimize(\"fp-contract=off\")" and "pop_options"
   (gcc), with CG_NO_CONTRACT first in its body (clang): onnxruntime's arithmetic, rounded step by step. */
#ifndef CG_NO_CONTRACT
#ifdef __clang__
#define CG_NO_CONTRACT _Pragma("clang fp contract(off)")
#else
#define CG_NO_CONTRACT
#endif
#endif
/* ai.onnx.ml's PROBIT post transform as onnxruntime computes it (ml_common.h: sqrt(2) times
   its ErfInv approximation at 2v - 1, in float, step by step; not inlined into a loop that
   contracts). */
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
static inline __attribute__((unused)) float cg_probit(float val) {
  CG_NO_CONTRACT
  float x = 2.0f * val - 1.0f;
  const float sgn = x < 0.0f ? -1.0f : 1.0f;
  x = (1.0f - x) * (1.0f + x);
  const float lg = logf(x);
  const float v = 2.0f / ((float)M_PI * 0.147f) + 0.5f * lg;  /* (older onnxruntime: 3.14159f) */
  const float v2 = 1.0f / 0.147f * lg;
  const float v3 = -v + sqrtf(v * v - v2);
  return (float)M_SQRT2 * (sgn * sqrtf(v3));
}
/* ai.onnx.ml's LOGISTIC post transform: onnxruntime's MlasComputeLogistic, its FMA3 kernel
   (MlasComputeLogisticF32KernelFma3, one value; ops/qlstm.c's gates call it too), bit for bit. */
static inline __attribute__((unused)) float cg_mlas_logistic(float x) {
  CG_NO_CONTRACT
  x = x < -18.0f ? -18.0f : x;
  x = x > 18.0f ? 18.0f : x;
  const float x2 = x * x;
  float p = fmaf(x2, 4.37031012579801e-11f, 1.15627324459942e-07f);
  p = fmaf(x2, p, 6.08574864600143e-05f);
  p = fmaf(x2, p, 8.51377133304701e-03f);
  p = fmaf(x2, p, 2.48287947061529e-01f);
  float q = fmaf(x2, 6.10247389755681e-13f, 5.76102136993427e-09f);
  q = fmaf(x2, q, 6.29106785017040e-06f);
  q = fmaf(x2, q, 1.70198817374094e-03f);
  q = fmaf(x2, q, 1.16817656904453e-01f);
  q = fmaf(x2, q, 9.93151921023180e-01f);
  const float r = (x * p) / q + 0.5f;
  return r < 0.0f ? 0.0f : r;
}
/* ml_common.h's ComputeLogistic (libm's expf), onnxruntime's LOGISTIC of a binary
   LinearClassifier's one score */
static inline __attribute__((unused)) float cg_ml_logistic(float x) {
  CG_NO_CONTRACT
  const float v = 1.0f / (1.0f + expf(-fabsf(x)));
  return x < 0.0f ? 1.0f - v : v;
}
/* MlasComputeTanhF32KernelFma3, one value */
static inline __attribute__((unused)) float cg_mlas_tanh(float x) {
  CG_NO_CONTRACT
  x = x < -9.0f ? -9.0f : x;
  x = x > 9.0f ? 9.0f : x;
  const float x2 = x * x;
  float p = fmaf(x2, -2.76076847742355e-16f, 2.00018790482477e-13f);
  p = fmaf(x2, p, -8.60467152213735e-11f);
  p = fmaf(x2, p, 5.12229709037114e-08f);
  p = fmaf(x2, p, 1.48572235717979e-05f);
  p = fmaf(x2, p, 6.37261928875436e-04f);
  p = fmaf(x2, p, 4.89352455891786e-03f);
  float q = fmaf(x2, 1.19825839466702e-06f, 1.18534705686654e-04f);
  q = fmaf(x2, q, 2.26843463243900e-03f);
  q = fmaf(x2, q, 4.89352518554385e-03f);
  return (x * p) / q;
}

#pragma GCC pop_options
