/* A Linear layer's output gradient quantized two ways in two passes over memory.
 *
 * Why native: the backward of y = x W^T quantizes the output gradient dy twice, for the two integer
 * GEMMs that read it (see inttrain/autograd/linear.py):
 *
 *   dx = dy W     rows codes of   A = dy * row_mul   (row_mul[n]: the forward's weight scale of feature n),
 *                 one scale per row m (the GEMM's kept axis);
 *   dW = dy^T x   column codes of B = dy * col_mul   (col_mul[m]: the forward's scale of input row m),
 *                 one scale per column n.
 *
 * Each needs an amax reduction before its rounding pass, along different axes.  Compiled graphs run
 * them as separate loops over dy (and recompute whatever produced dy, e.g. a GELU backward, in each),
 * about five passes over a tensor that is often the largest of the step.  Here: pass 1 reads each row
 * once from memory, takes its amax, writes its row codes while the row is still in L1, and folds
 * |B| into a per-thread column maximum; pass 2 reads dy once more and writes the column codes.
 *
 * Numerics are those of inttrain.kernels.fused._quantize_matrix_impl bit for bit (tested):
 * s = amax / qmax (s = 1 where amax == 0), codes as in simd_quantize.h with idx = m * N + n.
 * amax is taken on float bit patterns with the sign cleared, an integer max that keeps NaN (its
 * pattern is above +inf's), so a non-finite gradient gives a non-finite scale as the torch path does.
 */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "simd_quantize.h"

int inttrain_has_avx512(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl");
}

#define TARGET __attribute__((target("avx512f,avx512bw,avx512vl")))

TARGET static inline __m512i absbits(__m512 v) {
    return _mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(0x7FFFFFFF));
}

static inline float scale_of(int32_t amax_bits, float qmax) {
    float amax;
    memcpy(&amax, &amax_bits, sizeof amax);
    return amax == 0.0f ? 1.0f : amax / qmax;
}

typedef struct {
    const float *dy, *row_mul, *col_mul;
    int64_t n, full;
    __mmask16 tail;
    float qmax;
    int8_t *q_rows, *q_cols;
    float *s_rows, *s_cols;
    int sum; /* also the column sums of dy (the bias gradient), in double per thread */
    int sr_rows, sr_cols;
    uint32_t seed_rows, seed_cols;
    int dy_bf16; /* dy holds bfloat16 values (read as their exact float32 upcast) */
} job_t;

/* 16 values of dy from element at (masked): float32, or bfloat16 widened (its 16 bits become the high half). */
TARGET static inline __m512 load_dy(const job_t *j, int64_t at, __mmask16 k) {
    if (j->dy_bf16) {
        const __m256i h = _mm256_maskz_loadu_epi16(k, (const uint16_t *)(const void *)j->dy + at);
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    return _mm512_maskz_loadu_ps(k, j->dy + at);
}

/* Pass 1 for row m: its amax and row codes (rows side), |B| folded into this thread's column max, and dy
 * added to this thread's column sums. */
TARGET static void first_pass(const job_t *j, int64_t m, int32_t *cmax, double *csum) {
    const int64_t N = j->n, row = m * N;
    const int rows = j->q_rows != NULL, cols = cmax != NULL;
    const __m512 cm = _mm512_set1_ps(cols && j->col_mul ? j->col_mul[m] : 1.0f);
    const __m512 qmax = _mm512_set1_ps(j->qmax);
    __m512i rmax = _mm512_setzero_si512();
    for (int64_t n = 0; n < N; n += 16) {
        const __mmask16 k = n < j->full ? (__mmask16)0xFFFF : j->tail;
        const __m512 v = load_dy(j, row + n, k);
        if (rows) {
            const __m512 a = j->row_mul ? _mm512_mul_ps(v, _mm512_maskz_loadu_ps(k, j->row_mul + n)) : v;
            rmax = _mm512_max_epi32(rmax, absbits(a));
        }
        if (cols) {
            const __m512i c = _mm512_maskz_loadu_epi32(k, cmax + n);
            _mm512_mask_storeu_epi32(cmax + n, k, _mm512_max_epi32(c, absbits(_mm512_mul_ps(v, cm))));
        }
        if (csum) {
            const __mmask8 lo = (__mmask8)k, hi = (__mmask8)(k >> 8);
            const __m512d a = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
            const __m512d b = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
            _mm512_mask_storeu_pd(csum + n, lo, _mm512_add_pd(_mm512_maskz_loadu_pd(lo, csum + n), a));
            _mm512_mask_storeu_pd(csum + n + 8, hi, _mm512_add_pd(_mm512_maskz_loadu_pd(hi, csum + n + 8), b));
        }
    }
    if (!rows)
        return;
    const float s = scale_of(_mm512_reduce_max_epi32(rmax), j->qmax);
    const __m512 sv = _mm512_set1_ps(s);
    j->s_rows[m] = s;
    for (int64_t n = 0; n < N; n += 16) {
        const __mmask16 k = n < j->full ? (__mmask16)0xFFFF : j->tail;
        const __m512 v = load_dy(j, row + n, k);
        const __m512 a = j->row_mul ? _mm512_mul_ps(v, _mm512_maskz_loadu_ps(k, j->row_mul + n)) : v;
        __m512 u = _mm512_setzero_ps();
        if (j->sr_rows)
            u = uniform16((uint32_t)(m * N + n), j->seed_rows);
        _mm_mask_storeu_epi8(j->q_rows + m * N + n, k, codes16(a, sv, j->sr_rows ? &u : NULL, qmax));
    }
}

/* Pass 2 for row m: its column codes (the column scales are final). */
TARGET static void second_pass(const job_t *j, int64_t m) {
    const int64_t N = j->n, row = m * N;
    const __m512 cm = _mm512_set1_ps(j->col_mul ? j->col_mul[m] : 1.0f);
    const __m512 qmax = _mm512_set1_ps(j->qmax);
    for (int64_t n = 0; n < N; n += 16) {
        const __mmask16 k = n < j->full ? (__mmask16)0xFFFF : j->tail;
        const __m512 b = _mm512_mul_ps(load_dy(j, row + n, k), cm);
        const __m512 s = _mm512_mask_loadu_ps(_mm512_set1_ps(1.0f), k, j->s_cols + n);
        __m512 u = _mm512_setzero_ps();
        if (j->sr_cols)
            u = uniform16((uint32_t)(m * N + n), j->seed_cols);
        _mm_mask_storeu_epi8(j->q_cols + m * N + n, k, codes16(b, s, j->sr_cols ? &u : NULL, qmax));
    }
}

/* dy: [M, N] row-major float32, or bfloat16 when dy_bf16.  Outputs with a NULL pointer are skipped (rows: q_rows/s_rows, columns:
 * q_cols/s_cols, col_sum: the float32 column sums of dy, summed in double).  colmax: int32 workspace of
 * threads * N; colsum: double workspace of threads * N (when col_sum is wanted).  Returns 0. */
int inttrain_quantize_rows_cols(const float *dy, int64_t m_rows, int64_t n_cols, const float *row_mul,
                                const float *col_mul, float qmax, int8_t *q_rows, float *s_rows, int8_t *q_cols,
                                float *s_cols, int64_t sr_rows, int64_t seed_rows, int64_t sr_cols,
                                int64_t seed_cols, int32_t *colmax, float *col_sum, double *colsum,
                                int64_t dy_bf16, int64_t threads) {
    const int64_t M = m_rows, N = n_cols;
    job_t j = {dy, row_mul, col_mul, N, N / 16 * 16, (__mmask16)((1u << (N % 16)) - 1u), qmax, q_rows, q_cols,
               s_rows, s_cols, col_sum != NULL, (int)sr_rows, (int)sr_cols, (uint32_t)seed_rows,
               (uint32_t)seed_cols, (int)dy_bf16};
    const int cols = q_cols != NULL;
#pragma omp parallel num_threads((int)threads)
    {
        const int t = omp_get_thread_num(), nt = omp_get_num_threads();
        int32_t *cmax = cols ? colmax + (int64_t)t * N : NULL;
        double *csum = j.sum ? colsum + (int64_t)t * N : NULL;
        if (cols)
            memset(cmax, 0, (size_t)N * sizeof *cmax);
        if (csum)
            memset(csum, 0, (size_t)N * sizeof *csum);
#pragma omp for schedule(static)
        for (int64_t m = 0; m < M; m++)
            first_pass(&j, m, cmax, csum);
        if (j.sum) {
#pragma omp for schedule(static)
            for (int64_t n = 0; n < N; n++) {
                double total = 0.0;
                for (int i = 0; i < nt; i++)
                    total += colsum[(int64_t)i * N + n];
                col_sum[n] = (float)total;
            }
        }
        if (cols) {
#pragma omp for schedule(static)
            for (int64_t n = 0; n < N; n++) {
                int32_t best = 0;
                for (int i = 0; i < nt; i++)
                    best = colmax[(int64_t)i * N + n] > best ? colmax[(int64_t)i * N + n] : best;
                s_cols[n] = scale_of(best, qmax);
            }
#pragma omp for schedule(static)
            for (int64_t m = 0; m < M; m++)
                second_pass(&j, m);
        }
    }
    return 0;
}
