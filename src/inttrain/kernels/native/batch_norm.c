/* Training batch-norm backward whose input is kept as uint8 codes (int8 dataflow), in two passes.
 *
 * Why native: the compiled pass (inttrain.kernels.dataflow_passes._bn_backward_impl) reads the codes with
 * Inductor's partial-vector uint8 load, which on AVX2 goes through a stack copy for every 8 codes (AVX512 has
 * a masked load): measured on a Zen 3 core, 9.4 ms for 131072 x 16 values against 3.1 ms for the same pass
 * reading float32 input.  Here the codes are widened in registers.
 *
 * Rows are channels-last [M, C]: x[m, c] = scale[c] * (codes[m, c] - 128) is batch norm's input, and
 *   xhat = (x - mean) * invstd,  db = sum_m g,  dw = sum_m g * xhat,
 *   dx   = (weight * invstd) * (g - db / M - xhat * dw / M)
 * -- the formulas of _bn_backward_impl (and torch.native_batch_norm_backward).  Sums are taken per thread in
 * float32 over blocks of rows and added in double, so their error does not grow with M; the last bits differ
 * from the compiled pass's summation order.  Channel counts that are multiples of 8 take AVX2 intrinsics where
 * the CPU has them (the same operations in the same order: the same bits); the scalar loops are compiled for
 * AVX512, AVX2 and baseline x86-64 (target_clones): the loader picks the widest the CPU has.
 */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#define BLOCK_ROWS 256 /* rows summed in float32 before a block's sums go into the double totals */
#define AVX2 __attribute__((target("avx2")))

/* Eight codes at p, minus the zero point 128, as float32 lanes. */
AVX2 static inline __m256 codes8(const uint8_t *p) {
    const __m256i q = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const void *)p));
    return _mm256_cvtepi32_ps(_mm256_sub_epi32(q, _mm256_set1_epi32(128)));
}

/* block_sums for C a multiple of 8 on AVX2: eight channels in registers, rows inner; the same operations in
 * the same order as the scalar loop, so the same sums bit for bit.  Why: the scalar loop keeps its sums in
 * memory that the compiler must assume g may alias, and at 16 channels it was 7x slower per value than at 32
 * (4.7 ms for 131072 x 16 values on a Zen 3 core). */
AVX2 static void block_sums8_avx2(const uint8_t *codes, const float *g, int64_t lo, int64_t hi, int64_t c,
                                  const float *a, const float *b, double *sum_g, double *sum_gx) {
    for (int64_t r0 = lo; r0 < hi; r0 += BLOCK_ROWS) {
        const int64_t r1 = r0 + BLOCK_ROWS < hi ? r0 + BLOCK_ROWS : hi;
        for (int64_t j = 0; j < c; j += 8) {
            const __m256 aj = _mm256_loadu_ps(a + j), bj = _mm256_loadu_ps(b + j);
            __m256 sg = _mm256_setzero_ps(), sgx = _mm256_setzero_ps();
            for (int64_t r = r0; r < r1; r++) {
                const __m256 gr = _mm256_loadu_ps(g + r * c + j);
                const __m256 xhat = _mm256_add_ps(_mm256_mul_ps(codes8(codes + r * c + j), aj), bj);
                sg = _mm256_add_ps(sg, gr);
                sgx = _mm256_add_ps(sgx, _mm256_mul_ps(gr, xhat));
            }
            float lg[8], lgx[8];
            _mm256_storeu_ps(lg, sg), _mm256_storeu_ps(lgx, sgx);
            for (int l = 0; l < 8; l++) {
                sum_g[j + l] += lg[l];
                sum_gx[j + l] += lgx[l];
            }
        }
    }
}

/* block_dx for C a multiple of 8 on AVX2 (the scalar loop's operations, in its order). */
AVX2 static void block_dx8_avx2(const uint8_t *codes, const float *g, int64_t lo, int64_t hi, int64_t c,
                                const float *a, const float *b, const float *k, const float *mean_g,
                                const float *mean_gx, float *dx) {
    for (int64_t r = lo; r < hi; r++)
        for (int64_t j = 0; j < c; j += 8) {
            const __m256 xhat = _mm256_add_ps(_mm256_mul_ps(codes8(codes + r * c + j), _mm256_loadu_ps(a + j)),
                                              _mm256_loadu_ps(b + j));
            const __m256 centred = _mm256_sub_ps(_mm256_loadu_ps(g + r * c + j), _mm256_loadu_ps(mean_g + j));
            const __m256 out = _mm256_sub_ps(centred, _mm256_mul_ps(xhat, _mm256_loadu_ps(mean_gx + j)));
            _mm256_storeu_ps(dx + r * c + j, _mm256_mul_ps(_mm256_loadu_ps(k + j), out));
        }
}

/* Per-channel sums of g and g * xhat over rows [lo, hi), added into sum_g / sum_gx (double, C each). */
CLONES static void block_sums(const uint8_t *codes, const float *g, int64_t lo, int64_t hi, int64_t c,
                              const float *a, const float *b, float *acc_g, float *acc_gx, double *sum_g,
                              double *sum_gx) {
    for (int64_t r0 = lo; r0 < hi; r0 += BLOCK_ROWS) {
        const int64_t r1 = r0 + BLOCK_ROWS < hi ? r0 + BLOCK_ROWS : hi;
        memset(acc_g, 0, (size_t)c * sizeof(float));
        memset(acc_gx, 0, (size_t)c * sizeof(float));
        for (int64_t r = r0; r < r1; r++) {
            const uint8_t *q = codes + r * c;
            const float *gr = g + r * c;
            for (int64_t j = 0; j < c; j++) {
                const float xhat = ((float)q[j] - 128.0f) * a[j] + b[j];
                acc_g[j] += gr[j];
                acc_gx[j] += gr[j] * xhat;
            }
        }
        for (int64_t j = 0; j < c; j++) {
            sum_g[j] += acc_g[j];
            sum_gx[j] += acc_gx[j];
        }
    }
}

/* dx for rows [lo, hi): dx = k * (g - mean_g - xhat * mean_gx), xhat = (code - 128) * a + b. */
CLONES static void block_dx(const uint8_t *codes, const float *g, int64_t lo, int64_t hi, int64_t c,
                            const float *a, const float *b, const float *k, const float *mean_g,
                            const float *mean_gx, float *dx) {
    for (int64_t r = lo; r < hi; r++) {
        const uint8_t *q = codes + r * c;
        const float *gr = g + r * c;
        float *out = dx + r * c;
        for (int64_t j = 0; j < c; j++) {
            const float xhat = ((float)q[j] - 128.0f) * a[j] + b[j];
            out[j] = k[j] * (gr[j] - mean_g[j] - xhat * mean_gx[j]);
        }
    }
}

/* codes [m, c] uint8, g [m, c] float32, scale / mean / invstd / weight [c] float32.  Writes dx [m, c], dw [c],
 * db [c].  Returns 0, or -1 when scratch memory could not be had. */
int inttrain_bn_backward_u8(const uint8_t *codes, const float *g, int64_t m, int64_t c, const float *scale,
                            const float *mean, const float *invstd, const float *weight, float *dx, float *dw,
                            float *db, int64_t threads) {
    if (threads < 1) threads = 1;
    /* per channel: a, b (xhat = q * a + b), k, mean_g, mean_gx; per thread: two float blocks, two double sums */
    float *chan = malloc((size_t)c * 5 * sizeof(float));
    float *acc = malloc((size_t)threads * c * 2 * sizeof(float));
    double *sums = calloc((size_t)threads * c * 2, sizeof(double));
    int rc = 0;
    if (!chan || !acc || !sums) {
        rc = -1;
        goto done;
    }
    float *a = chan, *b = chan + c, *k = chan + 2 * c, *mean_g = chan + 3 * c, *mean_gx = chan + 4 * c;
    for (int64_t j = 0; j < c; j++) {
        a[j] = scale[j] * invstd[j];
        b[j] = -mean[j] * invstd[j];
        k[j] = weight[j] * invstd[j];
    }
    const int64_t blocks = (m + BLOCK_ROWS - 1) / BLOCK_ROWS;
    __builtin_cpu_init();
    const int vector8 = c % 8 == 0 && __builtin_cpu_supports("avx2");
#pragma omp parallel num_threads((int)threads)
    {
        const int t = omp_get_thread_num(), nt = omp_get_num_threads();
        const int64_t lo = blocks * t / nt * BLOCK_ROWS, hi0 = blocks * (t + 1) / nt * BLOCK_ROWS;
        const int64_t hi = hi0 < m ? hi0 : m;
        if (vector8)
            block_sums8_avx2(codes, g, lo, hi, c, a, b, sums + (int64_t)t * 2 * c, sums + (int64_t)t * 2 * c + c);
        else
            block_sums(codes, g, lo, hi, c, a, b, acc + (int64_t)t * 2 * c, acc + (int64_t)t * 2 * c + c,
                       sums + (int64_t)t * 2 * c, sums + (int64_t)t * 2 * c + c);
#pragma omp barrier
#pragma omp single
        {
            for (int64_t j = 0; j < c; j++) {
                double sg = 0.0, sgx = 0.0;
                for (int u = 0; u < nt; u++) {
                    sg += sums[(int64_t)u * 2 * c + j];
                    sgx += sums[(int64_t)u * 2 * c + c + j];
                }
                db[j] = (float)sg;
                dw[j] = (float)sgx;
                mean_g[j] = db[j] / (float)m;
                mean_gx[j] = dw[j] / (float)m;
            }
        }
        const int64_t rlo = m * t / nt, rhi = m * (t + 1) / nt;
        if (vector8)
            block_dx8_avx2(codes, g, rlo, rhi, c, a, b, k, mean_g, mean_gx, dx);
        else
            block_dx(codes, g, rlo, rhi, c, a, b, k, mean_g, mean_gx, dx);
    }
done:
    free(chan);
    free(acc);
    free(sums);
    return rc;
}
