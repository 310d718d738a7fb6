/* ConvTranspose's second half (ops/conv.py): a gather of the 1x1 Conv's per-tap products.

   col[N][H][W][G][K][Cg] holds, for every input pixel, group gi, kernel tap t = ky * kw + kx
   and output channel c of the group, that pixel's contribution to the output pixel the tap
   reaches: (iy * sh + ky * dh - ph, ix * sw + kx * dw - pw).  One task per output row, which
   only it writes (no races): the row starts as the bias, then each kernel row ky whose input
   row iy exists adds, tap by tap, the run of input pixels whose taps land inside the row.
   No division per pixel: the inner loop is the channels of one pixel (contiguous in both).
   ``exact`` (kernel == stride, no dilation, no output_padding: every output pixel is reached
   by exactly one tap) stores instead of adding, with the bias, in one pass.  ``ep`` (or NULL):
   the fused elementwise steps after it (bias, BatchNormalization, activation), run on the
   finished row in place, pixel by pixel, or as one run of values when every operand is a
   scalar (``flat``: a one-channel output's loop is then long enough to vectorise).
   ``wt`` (depthwise: one input and one output channel per group), or NULL: ``col`` is then
   the input itself, [N][H][W][C], and a tap's contribution is col * wt[tap][c], multiplied
   here, vectorised across the channels (a 1x1 Conv of one channel per group and a loop over
   groups of one channel each took 2.8x onnxruntime's time: DeepFilterNet's decoders). */
typedef struct {
  const float* col; const float* bias; float* y;
  long N, H, W, G, Cg, OH, OW, kh, kw, sh, sw, ph, pw, dh, dw; int exact;
  cg_ep ep; const float* const* ops; int flat; const float* wt;
} cg_col2im_t;
static void cg_col2im_row(const void* ctx, long task) {
  const cg_col2im_t* k = ctx;
  const long n = task / k->OH, oy = task % k->OH, G = k->G, Cg = k->Cg, K = k->kh * k->kw, OW = k->OW;
  const long C = G * Cg, pixel = k->wt ? C : G * K * Cg;
  float* restrict yrow = k->y + (n * k->OH + oy) * OW * C;
  const float* restrict bias = k->bias;  /* zeros when the node has none */
  if (!k->exact) {
    for (long ox = 0; ox < OW; ox++)
      for (long c = 0; c < C; c++) yrow[ox * C + c] = bias[c];
  }
  for (long ky = 0; ky < k->kh; ky++) {
    const long num = oy + k->ph - ky * k->dh;
    if (num < 0 || num % k->sh) continue;
    const long iy = num / k->sh;
    if (iy >= k->H) continue;
    const float* src_row = k->col + (n * k->H + iy) * k->W * pixel;
    for (long kx = 0; kx < k->kw; kx++) {
      const long off = kx * k->dw - k->pw;  /* input pixel ix lands on ox = ix * sw + off */
      const long ix0 = off < 0 ? (-off + k->sw - 1) / k->sw : 0;
      const long ix1 = OW - 1 - off < 0 ? 0 : cg_min(k->W, (OW - 1 - off) / k->sw + 1);
      const float* restrict src = src_row + (k->wt ? 0 : (ky * k->kw + kx) * Cg);
      float* restrict dst = yrow + off * C;
      const long ds = k->sw * C;
      if (k->wt) {
        const float* restrict w = k->wt + (ky * k->kw + kx) * C;
        for (long ix = ix0; ix < ix1; ix++) {
          const float* restrict s = src + ix * pixel;
          float* restrict d = dst + ix * ds;
          if (k->exact)
            for (long c = 0; c < C; c++) d[c] = s[c] * w[c] + bias[c];
          else
            for (long c = 0; c < C; c++) d[c] += s[c] * w[c];
        }
      } else if (C == 1) {  /* one output channel (a text detector's probability map): no channel loop */
        if (k->exact)
          for (long ix = ix0; ix < ix1; ix++) dst[ix * ds] = src[ix * pixel] + bias[0];
        else
          for (long ix = ix0; ix < ix1; ix++) dst[ix * ds] += src[ix * pixel];
      } else if (G == 1) {
        for (long ix = ix0; ix < ix1; ix++) {
          const float* restrict s = src + ix * pixel;
          float* restrict d = dst + ix * ds;
          if (k->exact)
            for (long c = 0; c < C; c++) d[c] = s[c] + bias[c];
          else
            for (long c = 0; c < C; c++) d[c] += s[c];
        }
      } else {
        for (long ix = ix0; ix < ix1; ix++)
          for (long gi = 0; gi < G; gi++) {
            const float* restrict s = src + ix * pixel + gi * K * Cg;
            float* restrict d = dst + ix * ds + gi * Cg;
            if (k->exact)
              for (long c = 0; c < Cg; c++) d[c] = s[c] + bias[gi * Cg + c];
            else
              for (long c = 0; c < Cg; c++) d[c] += s[c];
          }
      }
    }
  }
  if (k->ep && k->flat)  /* scalar operands only: the row is one run of OW * C values */
    k->ep(k->ops, k->y, OW * C, yrow, OW * C, n * k->OH + oy, 1, 0, OW * C);
  else if (k->ep)
    k->ep(k->ops, k->y, C, yrow, C, (n * k->OH + oy) * OW, OW, 0, C);
}
static void cg_col2im(const float* col, const float* bias, float* y, long N, long H, long W, long G, long Cg,
                      long OH, long OW, long kh, long kw, long sh, long sw, long ph, long pw, long dh, long dw,
                      int exact, cg_ep ep, const float* const* ops, int flat, const float* wt) {
  const cg_col2im_t k = {col, bias, y, N, H, W, G, Cg, OH, OW, kh, kw, sh, sw, ph, pw, dh, dw, exact, ep, ops, flat,
                         wt};
  cg_parallel(N * OH, cg_col2im_row, &k);
}
