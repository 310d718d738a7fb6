/* ConvTranspose's second half (ops/conv.py): a gather of the 1x1 Conv's per-tap products.

   col[N][H][W][G][K][Cg] holds, for every input pixel, group gi, kernel tap t = ky * kw + kx
   and output channel c of the group, that pixel's contribution to the output pixel the tap
   reaches.  Output pixel (oy, ox) of channel gi * Cg + c sums the taps whose input pixel
   exists: iy = (oy + ph - ky * dh) / sh when that divides exactly and 0 <= iy < H (x alike),
   plus the bias.  Gathering per output pixel (not scattering per input pixel) keeps the tasks,
   one per output row, free of races.  The first tap found writes bias + value, later ones
   add, so with kernel == stride and no pads (one tap per pixel) a pixel is one pass. */
typedef struct {
  const float* col; const float* bias; float* y;
  long N, H, W, G, Cg, OH, OW, kh, kw, sh, sw, ph, pw, dh, dw;
} cg_col2im_t;
static void cg_col2im_row(const void* ctx, long task) {
  const cg_col2im_t* k = ctx;
  const long n = task / k->OH, oy = task % k->OH, G = k->G, Cg = k->Cg, K = k->kh * k->kw;
  const long C = G * Cg, pixel = G * K * Cg;
  long rows[k->kh], row_taps[k->kh], nrows = 0;
  for (long ky = 0; ky < k->kh; ky++) {
    const long num = oy + k->ph - ky * k->dh;
    if (num < 0 || num % k->sh) continue;
    const long iy = num / k->sh;
    if (iy >= k->H) continue;
    rows[nrows] = iy;
    row_taps[nrows++] = ky;
  }
  float* yrow = k->y + (n * k->OH + oy) * k->OW * C;
  for (long ox = 0; ox < k->OW; ox++) {
    float* restrict yp = yrow + ox * C;
    int first = 1;
    for (long kx = 0; kx < k->kw; kx++) {
      const long num = ox + k->pw - kx * k->dw;
      if (num < 0 || num % k->sw) continue;
      const long ix = num / k->sw;
      if (ix >= k->W) continue;
      for (long r = 0; r < nrows; r++) {
        const long t = row_taps[r] * k->kw + kx;
        const float* src = k->col + ((n * k->H + rows[r]) * k->W + ix) * pixel + t * Cg;
        for (long gi = 0; gi < G; gi++) {
          const float* restrict s = src + gi * K * Cg;
          float* restrict d = yp + gi * Cg;
          if (first) {
            if (k->bias) {
              const float* restrict b = k->bias + gi * Cg;
              for (long c = 0; c < Cg; c++) d[c] = s[c] + b[c];
            } else {
              for (long c = 0; c < Cg; c++) d[c] = s[c];
            }
          } else {
            for (long c = 0; c < Cg; c++) d[c] += s[c];
          }
        }
        first = 0;
      }
    }
    if (first) {  /* no tap reaches this pixel (strides above the kernel's extent, pads) */
      if (k->bias) {
        for (long c = 0; c < C; c++) yp[c] = k->bias[c];
      } else {
        for (long c = 0; c < C; c++) yp[c] = 0.0f;
      }
    }
  }
}
static void cg_col2im(const float* col, const float* bias, float* y, long N, long H, long W, long G, long Cg,
                      long OH, long OW, long kh, long kw, long sh, long sw, long ph, long pw, long dh, long dw) {
  const cg_col2im_t k = {col, bias, y, N, H, W, G, Cg, OH, OW, kh, kw, sh, sw, ph, pw, dh, dw};
  cg_parallel(N * OH, cg_col2im_row, &k);
}
