
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
   (plain C: a library rebuilt for a CPU with neither).  It follows how the weights were packed
   (CG_Q8_PACKED_VNNI, written before this file from the target's features: _qpack.define_q8),
   not the compiler's flags alone: an artifact built for a VNNI CPU and loaded on one without
   VNNI is rebuilt there from this source (_runtime.library_for_this_machine) with its weights
   still in VNNI's layout, which the AVX2 path read as garbage (3961 of 4000 outputs off).  There
   the VNNI path runs on the portable definitions of its intrinsics below: the same int32 sums,
   slower. */
#include <stdint.h>
#if CG_Q8_PACKED_VNNI
#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512F__)
#include <immintrin.h>
#elif defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include <math.h>
#include <string.h>

/* The intrinsics of the VNNI path (qgemm.c, qlstm.c) in portable C on GCC vector types, each
   computing what its instruction does: vpdpbusd adds four uint8 x int8 products a lane without
   saturating, vcvtps2dq rounds to nearest even (0x80000000 out of range), vpmovdb keeps each
   lane's low byte. */
typedef int32_t cg_emu_m512i __attribute__((vector_size(64), aligned(64)));
typedef float cg_emu_m512 __attribute__((vector_size(64), aligned(64)));
typedef uint32_t cg_emu_u32x16 __attribute__((vector_size(64)));
#define __m512i cg_emu_m512i
#define __m512 cg_emu_m512

static inline cg_emu_m512i cg_emu_setzero_si512(void) { return (cg_emu_m512i){0}; }
static inline cg_emu_m512i cg_emu_set1_epi32(int32_t x) { return (cg_emu_m512i){0} + x; }
static inline cg_emu_m512 cg_emu_set1_ps(float x) { return (cg_emu_m512){0} + x; }
static inline cg_emu_m512i cg_emu_loadu_si512(const void* p) {
  cg_emu_m512i v;
  memcpy(&v, p, 64);
  return v;
}
static inline cg_emu_m512 cg_emu_loadu_ps(const float* p) {
  cg_emu_m512 v;
  memcpy(&v, p, 64);
  return v;
}
static inline void cg_emu_storeu_si512(void* p, cg_emu_m512i v) { memcpy(p, &v, 64); }
static inline void cg_emu_store_ps(float* p, cg_emu_m512 v) { memcpy(p, &v, 64); }
static inline cg_emu_m512i cg_emu_add_epi32(cg_emu_m512i a, cg_emu_m512i b) {
  return (cg_emu_m512i)((cg_emu_u32x16)a + (cg_emu_u32x16)b); /* wrapping, as the instruction */
}
static inline cg_emu_m512i cg_emu_sub_epi32(cg_emu_m512i a, cg_emu_m512i b) {
  return (cg_emu_m512i)((cg_emu_u32x16)a - (cg_emu_u32x16)b);
}
static inline cg_emu_m512i cg_emu_mullo_epi32(cg_emu_m512i a, cg_emu_m512i b) {
  return (cg_emu_m512i)((cg_emu_u32x16)a * (cg_emu_u32x16)b);
}
static inline cg_emu_m512 cg_emu_add_ps(cg_emu_m512 a, cg_emu_m512 b) { return a + b; }
static inline cg_emu_m512 cg_emu_cvtepi32_ps(cg_emu_m512i a) { return __builtin_convertvector(a, cg_emu_m512); }
static inline cg_emu_m512i cg_emu_cvtps_epi32(cg_emu_m512 a) {
  cg_emu_m512i r;
  for (int i = 0; i < 16; ++i) {
    const float n = nearbyintf(a[i]);
    r[i] = (n >= -2147483648.0f && n < 2147483648.0f) ? (int32_t)n : INT32_MIN;
  }
  return r;
}
static inline __m128i cg_emu_cvtepi32_epi8(cg_emu_m512i a) {
  uint8_t bytes[16];
  for (int i = 0; i < 16; ++i) bytes[i] = (uint8_t)(uint32_t)a[i];
  __m128i r;
  memcpy(&r, bytes, 16);
  return r;
}
static inline int32_t cg_emu_reduce_add_epi32(cg_emu_m512i a) {
  uint32_t sum = 0;
  for (int i = 0; i < 16; ++i) sum += (uint32_t)a[i];
  return (int32_t)sum;
}
static inline cg_emu_m512i cg_emu_dpbusd_epi32(cg_emu_m512i acc, cg_emu_m512i u8, cg_emu_m512i s8) {
  uint8_t a[64];
  int8_t b[64];
  memcpy(a, &u8, 64);
  memcpy(b, &s8, 64);
  for (int lane = 0; lane < 16; ++lane) {
    int32_t dot = 0;
    for (int j = 0; j < 4; ++j) dot += (int32_t)a[4 * lane + j] * (int32_t)b[4 * lane + j];
    acc[lane] = (int32_t)((uint32_t)acc[lane] + (uint32_t)dot);
  }
  return acc;
}

#define _mm512_setzero_si512 cg_emu_setzero_si512
#define _mm512_set1_epi32 cg_emu_set1_epi32
#define _mm512_set1_ps cg_emu_set1_ps
#define _mm512_loadu_si512 cg_emu_loadu_si512
#define _mm512_load_si512 cg_emu_loadu_si512
#define _mm512_loadu_ps cg_emu_loadu_ps
#define _mm512_storeu_si512 cg_emu_storeu_si512
#define _mm512_store_si512 cg_emu_storeu_si512
#define _mm512_store_ps cg_emu_store_ps
#define _mm512_add_epi32 cg_emu_add_epi32
#define _mm512_sub_epi32 cg_emu_sub_epi32
#define _mm512_mullo_epi32 cg_emu_mullo_epi32
#define _mm512_add_ps cg_emu_add_ps
#define _mm512_cvtepi32_ps cg_emu_cvtepi32_ps
#define _mm512_cvtps_epi32 cg_emu_cvtps_epi32
#define _mm512_cvtepi32_epi8 cg_emu_cvtepi32_epi8
#define _mm512_reduce_add_epi32 cg_emu_reduce_add_epi32
#define _mm512_dpbusd_epi32 cg_emu_dpbusd_epi32
#else
#error "8-bit weights packed for AVX-512 VNNI: this partition can be rebuilt for an x86 CPU only"
#endif
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
