/* Shared by conv.c, quantize.c (16 lanes, AVX512) and conv_avx2.c (8 lanes, AVX2): float32 values -> codes, with
 * the numerics of inttrain.kernels.fused._quantize_matrix_impl bit for bit:
 *   code = clamp(round(v / s), -qmax, qmax),
 * round = nearest-even, or floor(v / s + u) for stochastic rounding, where u is the counter hash of
 * inttrain.numerics.hashing: lowbias32(idx * 0x9E3779B9 + seed) >> 8, times 2^-24, idx = the element's
 * index in the row-major [rows, channels] matrix the torch path quantizes.
 */
#ifndef INTTRAIN_SIMD_QUANTIZE_H
#define INTTRAIN_SIMD_QUANTIZE_H
#include <immintrin.h>
#include <stdint.h>

#define QUANTIZE_TARGET __attribute__((target("avx512f,avx512bw,avx512vl")))
#define QUANTIZE_AVX2_TARGET __attribute__((target("avx2")))

/* One template for both widths, so that the two cannot drift apart: PFX is _mm512 or _mm256, I/F the integer
 * and float vector types, XOR the integer xor, LANES the lane indices 0, 1, ... */
#define DEFINE_UNIFORM(NAME, TARGET, PFX, I, F, XOR, LANES)                                                      \
    /* The stochastic-rounding uniforms of elements idx0, idx0 + 1, ... */                                    \
    TARGET static inline F NAME(uint32_t idx0, uint32_t seed) {                                                 \
        I h = PFX##_add_epi32(PFX##_set1_epi32((int)idx0), LANES);                                              \
        h = PFX##_add_epi32(PFX##_mullo_epi32(h, PFX##_set1_epi32((int)0x9E3779B9u)), PFX##_set1_epi32((int)seed)); \
        h = XOR(h, PFX##_srli_epi32(h, 16));                                                                    \
        h = PFX##_mullo_epi32(h, PFX##_set1_epi32(0x7FEB352D));                                                 \
        h = XOR(h, PFX##_srli_epi32(h, 15));                                                                    \
        h = PFX##_mullo_epi32(h, PFX##_set1_epi32((int)0x846CA68Bu));                                           \
        h = XOR(h, PFX##_srli_epi32(h, 16));                                                                    \
        return PFX##_mul_ps(PFX##_cvtepi32_ps(PFX##_srli_epi32(h, 8)), PFX##_set1_ps(1.0f / 16777216.0f));     \
    }

/* v / s rounded (ROUND: the width's round-to-integer) and clamped to [-qmax, qmax] as int32 lanes; u: the
 * stochastic-rounding uniforms or NULL.  max/min return their second operand for NaN, in both widths. */
#define DEFINE_ROUNDED(NAME, TARGET, PFX, I, F, ROUND)                                                          \
    TARGET static inline I NAME(F v, F s, const F *u, F qmax) {                                                \
        F r = PFX##_div_ps(v, s);                                                                               \
        if (u)                                                                                                  \
            r = ROUND(PFX##_add_ps(r, *u), _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);                          \
        else                                                                                                    \
            r = ROUND(r, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);                                        \
        r = PFX##_min_ps(PFX##_max_ps(r, PFX##_sub_ps(PFX##_setzero_ps(), qmax)), qmax);                        \
        return PFX##_cvtps_epi32(r);                                                                            \
    }

DEFINE_UNIFORM(uniform16, QUANTIZE_TARGET, _mm512, __m512i, __m512, _mm512_xor_si512,
               _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15))
DEFINE_ROUNDED(rounded16, QUANTIZE_TARGET, _mm512, __m512i, __m512, _mm512_roundscale_ps)
DEFINE_UNIFORM(uniform8, QUANTIZE_AVX2_TARGET, _mm256, __m256i, __m256, _mm256_xor_si256,
               _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7))
DEFINE_ROUNDED(codes8, QUANTIZE_AVX2_TARGET, _mm256, __m256i, __m256, _mm256_round_ps) /* conv_avx2.c packs them */

/* 16 codes as int8. */
QUANTIZE_TARGET static inline __m128i codes16(__m512 v, __m512 s, const __m512 *u, __m512 qmax) {
    return _mm512_cvtsepi32_epi8(rounded16(v, s, u, qmax));
}

#endif
