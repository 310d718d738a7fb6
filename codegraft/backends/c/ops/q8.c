
/* 8-bit products on AVX2 cores without VNNI (AMD Zen 2-3, Intel Haswell to Skylake), exact, with
   four consecutive k of one column in a 32-bit lane as vpdpbusd reads them (ops/_qpack.py):
   the int8 weights of four columns (16 bytes) widen to int16, the four uint8 activations of the
   step to int16 repeated, and one vpmaddwd multiplies the 16 pairs and adds them two by two into
   int32 lanes, two per column (k 0-1 and k 2-3): at most 255 * 128 * 2 a step, over at most 2**12
   steps (QGEMM_DEPTH / 4) below 2**31: no overflow, the same int32 sums as vpdpbusd.  Not
   vpmaddubsw, which onnxruntime's AVX2 kernel uses: its int16 pair sums saturate (255 * 127 * 2
   > 32767), 96 steps off on full-range weights.  About 4.6 products an instruction.  The
   quantized LSTM's recurrence (qlstm.c: a matrix-vector product, no rows to share a widened
   weight) does use vpmaddubsw, on h's nibbles, where pairs cannot saturate.  Both read each
   block's groups of 8 columns whole without VNNI (_qpack.column_groups).
   Which path qgemm.c and qlstm.c take is decided here, once: CG_Q8_VNNI, CG_Q8_AVX2 or neither
   (plain C: a library rebuilt for a CPU with neither). */
#include <stdint.h>
#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512F__)
#include <immintrin.h>
#define CG_Q8_VNNI 1
#elif defined(__AVX2__)
#include <immintrin.h>
#define CG_Q8_AVX2 1

/* the four bytes at x (one k-step of a row) as int16, [x0 x1 x2 x3] four times */
static inline __m256i cg_q8_step(const uint8_t* x) {
  int32_t f;
  memcpy(&f, x, 4);
  const __m256i spread = _mm256_setr_epi8(0, -128, 1, -128, 2, -128, 3, -128, 0, -128, 1, -128, 2, -128, 3, -128,
                                          0, -128, 1, -128, 2, -128, 3, -128, 0, -128, 1, -128, 2, -128, 3, -128);
  return _mm256_shuffle_epi8(_mm256_set1_epi32(f), spread);
}

/* one k-step of four columns (16 packed bytes at w) as int16 */
static inline __m256i cg_q8_columns4(const int8_t* w) {
  return _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)w));
}

/* acc += the step's products x * w, two lanes a column.  The add is written as asm on acc in
   place: from intrinsics gcc 12 gave each step's sums new registers and moved all eight back
   at the loop's end (9 moves for 8 multiplies a step), or kept some on the stack. */
static inline __m256i cg_q8_madd(__m256i acc, __m256i x, __m256i w) {
  const __m256i products = _mm256_madd_epi16(x, w);
  __asm__("vpaddd %1, %0, %0" : "+x"(acc) : "x"(products));
  return acc;
}

/* acc += x in int16 lanes, in place (as cg_q8_madd: gcc 12 otherwise moves the accumulators) */
static inline __m256i cg_q8_add16(__m256i acc, __m256i x) {
  __asm__("vpaddw %1, %0, %0" : "+x"(acc) : "x"(x));
  return acc;
}

/* eight columns' sums in order from the pair lanes of columns 0-3 (lo) and 4-7 (hi):
   hadd gives [0 1 4 5 | 2 3 6 7] */
static inline __m256i cg_q8_sums8(__m256i lo, __m256i hi) {
  return _mm256_permute4x64_epi64(_mm256_hadd_epi32(lo, hi), 0xD8);
}
#endif
