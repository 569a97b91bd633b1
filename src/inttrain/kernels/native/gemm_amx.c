/* Exact int8 x int8 -> int32 GEMM on AMX tiles (Intel Sapphire Rapids and later).
 *
 * Why native: on CPUs with AMX, torch._int_mm still reaches oneDNN's legacy s8s8s32 GEMM, which runs on
 * AVX512-VNNI: 27.7 ms for 4096x1024x1024 at one thread, while bf16 autocast's matmul runs on AMX tiles.
 * oneDNN's AMX int8 matmul is reachable from torch only through the quantized-inference ops, whose weight
 * prepack is a single-threaded reorder (~12 ms for a 1024x1024 weight: training changes the weights every
 * step).  A plain tile GEMM does the same product in ~9 ms, packing included.
 *
 *   C[M][N] = sum_k A[M][K] * B[K][N]      A, B int8 (any strides), C int32 row-major (ldc)
 *
 * TDPBSSD multiplies a 16 x 64 int8 tile of A by a 64 x 16 tile of B held in "VNNI" order (16 rows of
 * 16 columns x 4 consecutive k) and adds into a 16 x 16 int32 tile: signed x signed, so no zero point and
 * no correction term.  Sums are exact while K <= 131071 (|a*b| <= 2^14; the caller splits longer K).
 *
 * Layouts (packed here, threaded):
 *   Ap int8 [Mp][Kp]            A's rows, K padded with zeros to a multiple of 64, M to a multiple of 32.
 *                               Skipped (A read in place) when A is row-major and M, K already are.
 *   Bp int8 [Np/16][Kp/4][16][4] B in VNNI panels of 16 columns, zeros outside.
 * inttrain_gemm_s8s8f32 dequantizes each 32 x 32 block while it is in L1 and writes float32 instead.
 * The compute runs 2x2 accumulator tiles (a 32 x 32 block of C) with two A and two B tiles per 64-deep
 * step: all 8 tile registers.  B is cut into column chunks of at most ~1 MB (kept in L2) and every row
 * block of A runs across a chunk before the next chunk starts.
 */
#define _GNU_SOURCE /* syscall() under -std=c11 */
#include "amx_tiles.h"

#define CHUNK_BYTES (1 << 20) /* B bytes per column chunk (L2) */

static int amx_state = -1; /* -1: not checked yet (the check is idempotent, so a race only repeats it) */

int inttrain_has_amx(void) {
    if (amx_state < 0) amx_state = amx_check();
    return amx_state;
}

static int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

/* Ap rows [m0, m1): A's row i, zero padded to kp columns (rows >= m are all zeros). */
static void pack_a_rows(const int8_t *a, int64_t m, int64_t k, int64_t sam, int64_t sak, int8_t *ap, int64_t kp,
                        int64_t m0, int64_t m1) {
    for (int64_t i = m0; i < m1; ++i) {
        int8_t *row = ap + i * kp;
        if (i >= m) {
            memset(row, 0, (size_t)kp);
            continue;
        }
        const int8_t *src = a + i * sam;
        if (sak == 1) {
            memcpy(row, src, (size_t)k);
        } else {
            for (int64_t kk = 0; kk < k; ++kk) row[kk] = src[kk * sak];
        }
        memset(row + k, 0, (size_t)(kp - k));
    }
}

/* dst[j][i] = src[i][j] for a 16 x 16 byte block (row strides ss, ds): four rounds of unpacks. */
static inline void transpose_16x16(const int8_t *src, int64_t ss, int8_t *dst, int64_t ds) {
    __m128i r[16], t[16];
    for (int i = 0; i < 16; ++i) r[i] = _mm_loadu_si128((const __m128i *)(src + i * ss));
    for (int i = 0; i < 8; ++i) { /* byte pairs of rows 2i, 2i+1 */
        t[2 * i] = _mm_unpacklo_epi8(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm_unpackhi_epi8(r[2 * i], r[2 * i + 1]);
    }
    for (int q = 0; q < 4; ++q) { /* 4 rows x 4 columns */
        r[4 * q] = _mm_unpacklo_epi16(t[4 * q], t[4 * q + 2]);
        r[4 * q + 1] = _mm_unpackhi_epi16(t[4 * q], t[4 * q + 2]);
        r[4 * q + 2] = _mm_unpacklo_epi16(t[4 * q + 1], t[4 * q + 3]);
        r[4 * q + 3] = _mm_unpackhi_epi16(t[4 * q + 1], t[4 * q + 3]);
    }
    for (int h = 0; h < 2; ++h) /* 8 rows x 2 columns */
        for (int s = 0; s < 4; ++s) {
            t[8 * h + 2 * s] = _mm_unpacklo_epi32(r[8 * h + s], r[8 * h + 4 + s]);
            t[8 * h + 2 * s + 1] = _mm_unpackhi_epi32(r[8 * h + s], r[8 * h + 4 + s]);
        }
    for (int u = 0; u < 8; ++u) { /* 16 rows x 1 column */
        _mm_storeu_si128((__m128i *)(dst + (2 * u) * ds), _mm_unpacklo_epi64(t[u], t[8 + u]));
        _mm_storeu_si128((__m128i *)(dst + (2 * u + 1) * ds), _mm_unpackhi_epi64(t[u], t[8 + u]));
    }
}

/* A column-major (sam == 1: A's rows are the columns of a row-major [K][M] matrix S with row stride sak, e.g.
 * a weight gradient's dy^T): Ap rows [m0, m1) = S^T, in 16 x 16 blocks whose source rows are whole lines. */
static void pack_a_transposed(const int8_t *a, int64_t m, int64_t k, int64_t sak, int8_t *ap, int64_t kp,
                              int64_t m0, int64_t m1) {
    for (int64_t k0 = 0; k0 < kp; k0 += 16)
        for (int64_t i0 = m0; i0 < m1; i0 += 16) {
            if (k0 + 16 <= k && i0 + 16 <= m) {
                transpose_16x16(a + k0 * sak + i0, sak, ap + i0 * kp + k0, kp);
                continue;
            }
            for (int64_t i = i0; i < i0 + 16 && i < m1; ++i)
                for (int64_t kk = k0; kk < k0 + 16; ++kk) ap[i * kp + kk] = (i < m && kk < k) ? a[i + kk * sak] : 0;
        }
}

/* Bp panels [nb0, nb1) of 16 columns: panel[k4][j][t] = B[4 k4 + t][16 nb + j], zeros outside B. */
static void pack_b_panels(const int8_t *b, int64_t k, int64_t n, int64_t sbk, int64_t sbn, int8_t *bp, int64_t kp,
                          int64_t nb0, int64_t nb1) {
    for (int64_t nb = nb0; nb < nb1; ++nb) {
        int8_t *panel = bp + nb * kp * 16;
        const int64_t c0 = nb * 16, full_cols = c0 + 16 <= n;
        for (int64_t k4 = 0; k4 < kp / 4; ++k4) {
            int8_t *dst = panel + k4 * 64;
            const int64_t r0 = 4 * k4;
            if (full_cols && r0 + 4 <= k && sbn == 1) { /* 4 rows of 16 bytes -> 16 groups of 4 */
                const __m128i x0 = _mm_loadu_si128((const __m128i *)(b + r0 * sbk + c0));
                const __m128i x1 = _mm_loadu_si128((const __m128i *)(b + (r0 + 1) * sbk + c0));
                const __m128i x2 = _mm_loadu_si128((const __m128i *)(b + (r0 + 2) * sbk + c0));
                const __m128i x3 = _mm_loadu_si128((const __m128i *)(b + (r0 + 3) * sbk + c0));
                const __m128i lo01 = _mm_unpacklo_epi8(x0, x1), hi01 = _mm_unpackhi_epi8(x0, x1);
                const __m128i lo23 = _mm_unpacklo_epi8(x2, x3), hi23 = _mm_unpackhi_epi8(x2, x3);
                _mm_storeu_si128((__m128i *)dst, _mm_unpacklo_epi16(lo01, lo23));
                _mm_storeu_si128((__m128i *)(dst + 16), _mm_unpackhi_epi16(lo01, lo23));
                _mm_storeu_si128((__m128i *)(dst + 32), _mm_unpacklo_epi16(hi01, hi23));
                _mm_storeu_si128((__m128i *)(dst + 48), _mm_unpackhi_epi16(hi01, hi23));
            } else if (full_cols && r0 + 4 <= k && sbk == 1) { /* 4 consecutive k of a column are one int32 */
                for (int64_t j = 0; j < 16; ++j) memcpy(dst + 4 * j, b + (c0 + j) * sbn + r0, 4);
            } else {
                for (int64_t j = 0; j < 16; ++j)
                    for (int64_t t = 0; t < 4; ++t) {
                        const int64_t kk = r0 + t, col = c0 + j;
                        dst[4 * j + t] = (kk < k && col < n) ? b[kk * sbk + col * sbn] : 0;
                    }
            }
        }
    }
}

/* One 32 x 32 block of C: rows [i0, i0+32) of A (row stride lda), panels p, p+1 of Bp. */
__attribute__((target("amx-tile,amx-int8"))) static void block_32x32(const int8_t *a0, int64_t lda,
                                                                      const int8_t *b0, int64_t kp, int32_t *c,
                                                                      int64_t ldc) {
    const int8_t *a1 = a0 + 16 * lda, *b1 = b0 + kp * 16;
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t k0 = 0; k0 < kp; k0 += 64) {
        _tile_loadd(4, a0 + k0, lda);
        _tile_loadd(6, b0 + k0 * 16, 64);
        _tile_loadd(5, a1 + k0, lda);
        _tile_loadd(7, b1 + k0 * 16, 64);
        _tile_dpbssd(0, 4, 6);
        _tile_dpbssd(1, 4, 7);
        _tile_dpbssd(2, 5, 6);
        _tile_dpbssd(3, 5, 7);
    }
    _tile_stored(0, c, ldc * 4);
    _tile_stored(1, c + 16, ldc * 4);
    _tile_stored(2, c + 16 * ldc, ldc * 4);
    _tile_stored(3, c + 16 * ldc + 16, ldc * 4);
}

/* The dequantizing epilogue: C'[i][j] = (float32(sum) * row_scale[i]) * col_scale[j] in float32, the order
 * in which torch evaluates acc.float() * sa * sb (a scale is one value unless its flag bit is set). */
typedef struct {
    float *c;
    const float *row_scale, *col_scale;
    int64_t per_row, per_col;
} gemm_epilogue;

/* Rows [i0, i0 + 32) x columns [j0, j0 + 32) of the 32 x 32 int32 block e (row length 32), clipped to m x n. */
__attribute__((target("avx512f"))) static void dequantize_block(const int32_t *e, const gemm_epilogue *ep,
                                                                  int64_t i0, int64_t j0, int64_t m, int64_t n,
                                                                  int64_t ldc) {
    const int64_t cols = n - j0 < 32 ? n - j0 : 32;
    const __mmask16 lo = (__mmask16)(cols >= 16 ? 0xFFFF : (1u << cols) - 1u);
    const __mmask16 hi = (__mmask16)(cols >= 32 ? 0xFFFF : cols > 16 ? (1u << (cols - 16)) - 1u : 0);
    const __m512 c0 = ep->per_col ? _mm512_maskz_loadu_ps(lo, ep->col_scale + j0) : _mm512_set1_ps(ep->col_scale[0]);
    const __m512 c1 = ep->per_col ? _mm512_maskz_loadu_ps(hi, ep->col_scale + j0 + 16) : c0;
    for (int64_t i = i0; i < i0 + 32 && i < m; ++i) {
        const __m512 r = _mm512_set1_ps(ep->row_scale[ep->per_row ? i : 0]);
        const int32_t *src = e + (i - i0) * 32;
        float *dst = ep->c + i * ldc + j0;
        const __m512 f0 = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_loadu_si512(src)), r), c0);
        const __m512 f1 = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_loadu_si512(src + 16)), r), c1);
        _mm512_mask_storeu_ps(dst, lo, f0);
        _mm512_mask_storeu_ps(dst + 16, hi, f1);
    }
}

__attribute__((target("amx-tile,amx-int8,avx512f"))) static void compute(const int8_t *ap, int64_t lda,
                                                                          const int8_t *bp, int32_t *c, int64_t m,
                                                                          int64_t n, int64_t mp, int64_t np,
                                                                          int64_t kp, int64_t ldc, int64_t threads,
                                                                          const gemm_epilogue *ep) {
    int64_t chunk = (CHUNK_BYTES / kp) / 32 * 32; /* columns per chunk */
    if (chunk < 32) chunk = 32;
    const int64_t chunks = (np + chunk - 1) / chunk, mblocks = mp / 32;
#pragma omp parallel num_threads((int)threads)
    {
        amx_configure_16x64();
        int32_t edge[32 * 32];
        for (int64_t ch = 0; ch < chunks; ++ch)
            /* the threads split the rows of A and share one chunk of B: one copy of it in a shared L2 */
#pragma omp for schedule(static)
            for (int64_t mb = 0; mb < mblocks; ++mb) {
                const int64_t i0 = mb * 32, n_end = (ch + 1) * chunk < np ? (ch + 1) * chunk : np;
                for (int64_t j0 = ch * chunk; j0 < n_end; j0 += 32) {
                    const int8_t *a0 = ap + i0 * lda, *b0 = bp + (j0 / 16) * kp * 16;
                    if (ep) { /* through a local tile into the float epilogue (the int32 block stays in L1) */
                        block_32x32(a0, lda, b0, kp, edge, 32);
                        dequantize_block(edge, ep, i0, j0, m, n, ldc);
                    } else if (i0 + 32 <= m && j0 + 32 <= n) {
                        block_32x32(a0, lda, b0, kp, c + i0 * ldc + j0, ldc);
                    } else { /* an edge block: through a local tile, then the part inside C */
                        block_32x32(a0, lda, b0, kp, edge, 32);
                        for (int64_t i = i0; i < i0 + 32 && i < m; ++i)
                            for (int64_t j = j0; j < j0 + 32 && j < n; ++j) c[i * ldc + j] = edge[(i - i0) * 32 + j - j0];
                    }
                }
            }
        _tile_release();
    }
}

/* Workspace sizes for inttrain_gemm_s8s8s32: out[0] = Ap bytes (0 when A is read in place), out[1] = Bp bytes. */
void inttrain_gemm_amx_workspace(int64_t m, int64_t n, int64_t k, int64_t sam, int64_t sak, int64_t *out) {
    const int64_t kp = round_up(k, 64), mp = round_up(m, 32), np = round_up(n, 32);
    const int in_place = sak == 1 && k % 64 == 0 && m % 32 == 0 && sam >= k;
    out[0] = in_place ? 0 : mp * kp;
    out[1] = np * kp;
}

/* Packs A and B, then multiplies; ep NULL: int32 C, else the float epilogue writes ep->c. */
static int gemm(const int8_t *a, const int8_t *b, int32_t *c, const int64_t *dims, int8_t *ap, int8_t *bp,
                int64_t threads, const gemm_epilogue *ep) {
    const int64_t m = dims[0], n = dims[1], k = dims[2], sam = dims[3], sak = dims[4], sbk = dims[5],
                  sbn = dims[6], ldc = dims[7];
    if (!inttrain_has_amx()) return 1;
    if (threads < 1) threads = 1;
    if (m == 0 || n == 0) return 0;
    const int64_t kp = round_up(k, 64), mp = round_up(m, 32), np = round_up(n, 32);
    int64_t sizes[2];
    inttrain_gemm_amx_workspace(m, n, k, sam, sak, sizes);
    const int8_t *a_rows = a;
    int64_t lda = sam;
    const int64_t mblocks64 = (mp + 63) / 64, panels = np / 16;
#pragma omp parallel num_threads((int)threads)
    {
        if (sizes[0]) {
#pragma omp for schedule(static) nowait
            for (int64_t blk = 0; blk < mblocks64; ++blk) {
                const int64_t m0 = blk * 64, m1 = m0 + 64 < mp ? m0 + 64 : mp;
                if (sam == 1 && sak != 1)
                    pack_a_transposed(a, m, k, sak, ap, kp, m0, m1);
                else
                    pack_a_rows(a, m, k, sam, sak, ap, kp, m0, m1);
            }
        }
#pragma omp for schedule(static)
        for (int64_t nb = 0; nb < panels; ++nb) pack_b_panels(b, k, n, sbk, sbn, bp, kp, nb, nb + 1);
    }
    if (sizes[0]) {
        a_rows = ap;
        lda = kp;
    }
    compute(a_rows, lda, bp, c, m, n, mp, np, kp, ldc, threads, ep);
    return 0;
}

/* C = A @ B exactly (see the top of the file).  dims: m, n, k, sam, sak, sbk, sbn, ldc.  ap: workspace of
 * inttrain_gemm_amx_workspace's size (unused when that is 0), bp likewise.  Returns 0, or 1 without AMX. */
int inttrain_gemm_s8s8s32(const int8_t *a, const int8_t *b, int32_t *c, const int64_t *dims, int8_t *ap, int8_t *bp,
                          int64_t threads) {
    return gemm(a, b, c, dims, ap, bp, threads, NULL);
}

/* C = (float32(A @ B) * row_scale) * col_scale, float32 row-major (ldc = dims[7]), without an int32 C in memory:
 * a weight gradient's dequantization.  scale_flags bit 0: one row scale per row of C (else row_scale[0] for
 * all), bit 1: one column scale per column.  Otherwise as inttrain_gemm_s8s8s32. */
int inttrain_gemm_s8s8f32(const int8_t *a, const int8_t *b, float *c, const int64_t *dims, int8_t *ap, int8_t *bp,
                          int64_t threads, const float *row_scale, const float *col_scale, int64_t scale_flags) {
    const gemm_epilogue ep = {c, row_scale, col_scale, scale_flags & 1, (scale_flags >> 1) & 1};
    return gemm(a, b, NULL, dims, ap, bp, threads, &ep);
}
