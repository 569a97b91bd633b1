/* Shared by conv.c and quantize.c: 16 float32 values -> 16 int8 codes, with the numerics of
 * inttrain.kernels.fused._quantize_matrix_impl bit for bit:
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

/* The stochastic-rounding uniforms of elements idx0 .. idx0 + 15. */
QUANTIZE_TARGET static inline __m512 uniform16(uint32_t idx0, uint32_t seed) {
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512i h = _mm512_add_epi32(_mm512_set1_epi32((int)idx0), lane);
    h = _mm512_add_epi32(_mm512_mullo_epi32(h, _mm512_set1_epi32((int)0x9E3779B9u)), _mm512_set1_epi32((int)seed));
    h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 16));
    h = _mm512_mullo_epi32(h, _mm512_set1_epi32(0x7FEB352D));
    h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 15));
    h = _mm512_mullo_epi32(h, _mm512_set1_epi32((int)0x846CA68Bu));
    h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 16));
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(h, 8)), _mm512_set1_ps(1.0f / 16777216.0f));
}

/* v / s rounded and clamped to [-qmax, qmax], as int8; u: the stochastic-rounding uniforms or NULL. */
QUANTIZE_TARGET static inline __m128i codes16(__m512 v, __m512 s, const __m512 *u, __m512 qmax) {
    __m512 r = _mm512_div_ps(v, s);
    if (u)
        r = _mm512_roundscale_ps(_mm512_add_ps(r, *u), _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    else
        r = _mm512_roundscale_ps(r, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    r = _mm512_min_ps(_mm512_max_ps(r, _mm512_sub_ps(_mm512_setzero_ps(), qmax)), qmax);
    return _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(r));
}

#endif
