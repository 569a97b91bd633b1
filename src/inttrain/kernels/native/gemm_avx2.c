/* Exact int8 x int8 -> int32 GEMM on AVX2 (CPUs without AVX512-VNNI or AMX, e.g. AMD Zen 2 / Zen 3).
 *
 * Why native: on such CPUs torch._int_mm (oneDNN's s8s8s32 GEMM) runs a reference loop: 8.4 s for
 * 4096x1024x1024 at one thread on a Zen 3, where the same float32 matmul takes 0.12 s.
 *
 *   C[M][N] = sum_k A[M][K] * B[K][N]      A, B int8 (any strides), C int32 row-major (ldc)
 *
 * Arithmetic: the codes are sign-extended to int16 and VPMADDWD multiplies int16 pairs and adds each pair
 * into an int32 lane (exact), VPADDD accumulates.  Not VPMADDUBSW: it saturates its int16 pair sums (the
 * error of oneDNN's AVX2 int8 convolution).  Sums are exact while K <= 131071 (|a*b| <= 2^14; the caller
 * splits longer K).
 *
 * Layouts (packed per job into the caller's workspace, a K block at a time):
 *   A block int16 [MC][KCP]               A's rows sign-extended, zero padded to an even length: the
 *                                         micro-kernel broadcasts one int32 = the pair (a[i][k], a[i][k+1]).
 *   B block int16 [NC/16][KCP/2][16][2]   panels of 16 columns holding k pairs: lane j of a k-pair row is
 *                                         (b[k][j], b[k+1][j]); zeros past K and N.
 * Micro-kernel: 6 rows x 16 columns of C in 12 ymm accumulators; per k pair 2 B loads, 6 broadcasts and
 * 12 VPMADDWD.  Loops per job (GotoBLAS order): 512-column chunk > K block (<= 384 deep; the packed B block,
 * <= 384 KB, stays in L2) > 96-row block of A (packed, <= 72 KB) > 16-column panel (<= 12 KB, L1) > 6 rows.
 * Threads: one job per thread; the jobs cut C into row pieces x column pieces and may cut K too (a weight
 * gradient's long reduction), whichever cut costs the least; K pieces after the first write partial sums
 * that are added into C at the end.  Every job packs its own operands, so the packing runs in parallel.
 */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define MR 6          /* rows of the micro-kernel */
#define NR 16         /* columns of a B panel */
#define KC_MAX 384    /* K block */
#define MC_MAX 96     /* rows of an A block */
#define NC_MAX 512    /* columns of a B block (with KC_MAX: 384 KB, in L2) */
#define MIN_WORK (1 << 18) /* multiply-adds a thread must get before another one is worth starting */
#define MAX_PARTIAL (1 << 24) /* int32 partial sums (64 MB) that cutting K may take */
#define AVX2 __attribute__((target("avx2")))

int inttrain_has_avx2(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") ? 1 : 0;
}

/* 1 when the CPU has an int8 dot-product instruction (AVX512-VNNI or AVX-VNNI): oneDNN's int8 GEMM behind
 * torch._int_mm is fast there, so this kernel is only the choice where it is 0. */
int inttrain_has_int8_dot(void) {
    __builtin_cpu_init();
    return (__builtin_cpu_supports("avx512vnni") || __builtin_cpu_supports("avxvnni")) ? 1 : 0;
}

static int64_t ceil_div(int64_t v, int64_t d) { return (v + d - 1) / d; }
static int64_t round_up(int64_t v, int64_t m) { return ceil_div(v, m) * m; }
static int64_t min64(int64_t x, int64_t y) { return x < y ? x : y; }

/* How the product is cut into jobs: pieces of rows x columns x depth, each job one of each. */
typedef struct {
    int64_t pm, pn, pk;       /* pieces along M, N, K */
    int64_t rows, cols, depth; /* their sizes (the last piece may be shorter) */
    int64_t kc, kcp, mc, nc;  /* K block, its padded length, rows of an A block, columns of a B block */
    int64_t a_bytes, b_bytes; /* one job's A and B blocks */
} gemm_plan;

static void plan_pieces(int64_t m, int64_t n, int64_t k, int64_t pm, int64_t pn, int64_t pk, gemm_plan *p) {
    p->rows = round_up(ceil_div(m, pm), MR);
    p->cols = round_up(ceil_div(n, pn), NR);
    p->depth = round_up(ceil_div(k, pk), 16);
    p->pm = ceil_div(m, p->rows); /* the pieces that are not empty */
    p->pn = ceil_div(n, p->cols);
    p->pk = ceil_div(k, p->depth);
}

/* Estimated time of the largest job (multiply-adds, plus packing and the partial sums at their rough cost). */
static double plan_cost(int64_t m, int64_t n, int64_t k, int64_t threads, const gemm_plan *p) {
    const double rows = (double)min64(p->rows, m), cols = (double)round_up(min64(p->cols, n), NR),
                 depth = (double)min64(p->depth, k), chunks = (double)ceil_div((int64_t)cols, NC_MAX);
    double cost = rows * cols * depth + 2.0 * rows * depth * chunks + 4.0 * depth * cols;
    if (p->pk > 1) cost += 4.0 * (double)m * (double)n * (double)p->pk / (double)threads;
    return cost;
}

static void make_plan(int64_t m, int64_t n, int64_t k, int64_t threads, gemm_plan *best) {
    const double work = (double)m * (double)n * (double)k;
    if (threads > work / MIN_WORK) threads = (int64_t)(work / MIN_WORK);
    if (threads < 1) threads = 1;
    double best_cost = -1.0;
    for (int64_t pm = 1; pm <= threads; ++pm)
        for (int64_t pn = 1; pm * pn <= threads; ++pn) {
            if (threads % (pm * pn)) continue;
            gemm_plan p;
            plan_pieces(m, n, k, pm, pn, threads / (pm * pn), &p);
            if (p.pk > 1 && (double)(p.pk - 1) * (double)m * (double)n > MAX_PARTIAL) continue;
            const double cost = plan_cost(m, n, k, threads, &p);
            if (best_cost < 0 || cost < best_cost) {
                best_cost = cost;
                *best = p;
            }
        }
    const int64_t depth = min64(best->depth, k);
    best->kc = round_up(ceil_div(depth, ceil_div(depth, KC_MAX)), 2); /* equal K blocks */
    best->kcp = round_up(best->kc, 16);
    best->mc = min64(MC_MAX, min64(best->rows, m));
    best->nc = min64(NC_MAX, round_up(min64(best->cols, n), NR));
    best->a_bytes = round_up(best->mc * best->kcp * 2, 64);
    best->b_bytes = round_up(best->nc * best->kcp * 2, 64);
}

/* Interleave the low (high) elements of a and b: 16-, 32-, 64-bit elements within each 128-bit lane for w = 0, 1,
 * 2; the low (high) 128-bit halves for w = 3. */
AVX2 static inline __m256i unpack_lo(__m256i a, __m256i b, int w) {
    switch (w) {
    case 0: return _mm256_unpacklo_epi16(a, b);
    case 1: return _mm256_unpacklo_epi32(a, b);
    case 2: return _mm256_unpacklo_epi64(a, b);
    default: return _mm256_permute2x128_si256(a, b, 0x20);
    }
}

AVX2 static inline __m256i unpack_hi(__m256i a, __m256i b, int w) {
    switch (w) {
    case 0: return _mm256_unpackhi_epi16(a, b);
    case 1: return _mm256_unpackhi_epi32(a, b);
    case 2: return _mm256_unpackhi_epi64(a, b);
    default: return _mm256_permute2x128_si256(a, b, 0x31);
    }
}

/* 8 x 8 transpose: x[r] holds row r, afterwards column r.  w = 0: 16-bit elements, in each 128-bit lane
 * separately (two transposes at once); w = 1: 32-bit elements across the register.  Three rounds of unpacks. */
AVX2 static inline __attribute__((always_inline)) void transpose_8x8(__m256i x[8], const int w) {
    __m256i t[8], u[8];
    for (int r = 0; r < 8; r += 2) {
        t[r] = unpack_lo(x[r], x[r + 1], w);
        t[r + 1] = unpack_hi(x[r], x[r + 1], w);
    }
    for (int h = 0; h < 8; h += 4) {
        u[h] = unpack_lo(t[h], t[h + 2], w + 1);
        u[h + 1] = unpack_hi(t[h], t[h + 2], w + 1);
        u[h + 2] = unpack_lo(t[h + 1], t[h + 3], w + 1);
        u[h + 3] = unpack_hi(t[h + 1], t[h + 3], w + 1);
    }
    for (int c = 0; c < 4; ++c) { /* u[c] holds columns 2c, 2c+1 (w = 0) or c, c+4 (w = 1) of rows 0-3 */
        x[w ? c : 2 * c] = unpack_lo(u[c], u[c + 4], w + 2);
        x[w ? c + 4 : 2 * c + 1] = unpack_hi(u[c], u[c + 4], w + 2);
    }
}

typedef struct {
    const int8_t *a, *b;
    int64_t m, n, k, sam, sak, sbk, sbn;
} gemm_operands;

/* A block: rows [i0, i0 + rows) x k [k0, k0 + len) of A as int16 rows of length lda, a zero after an odd len. */
AVX2 static void pack_a(const gemm_operands *g, int64_t i0, int64_t rows, int64_t k0, int64_t len, int16_t *ap,
                        int64_t lda) {
    const int64_t sam = g->sam, sak = g->sak;
    int64_t done = 0; /* rows packed by the transposing path */
    if (sam == 1 && sak != 1) { /* A's rows are columns of a row-major [K][M] matrix: 16 rows x 8 k at a time */
        for (; done + 16 <= rows; done += 16) {
            int64_t kk = 0;
            for (; kk + 8 <= len; kk += 8) {
                __m256i x[8];
                for (int r = 0; r < 8; ++r)
                    x[r] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(g->a + i0 + done + (k0 + kk + r) * sak)));
                transpose_8x8(x, 0);
                for (int r = 0; r < 8; ++r) {
                    _mm_storeu_si128((__m128i *)(ap + (done + r) * lda + kk), _mm256_castsi256_si128(x[r]));
                    _mm_storeu_si128((__m128i *)(ap + (done + 8 + r) * lda + kk), _mm256_extracti128_si256(x[r], 1));
                }
            }
            for (int64_t r = done; r < done + 16; ++r) {
                for (int64_t t = kk; t < len; ++t) ap[r * lda + t] = g->a[i0 + r + (k0 + t) * sak];
                if (len & 1) ap[r * lda + len] = 0;
            }
        }
    }
    for (int64_t r = done; r < rows; ++r) {
        const int8_t *src = g->a + (i0 + r) * sam + k0 * sak;
        int16_t *dst = ap + r * lda;
        int64_t kk = 0;
        if (sak == 1)
            for (; kk + 16 <= len; kk += 16)
                _mm256_storeu_si256((__m256i *)(dst + kk), _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(src + kk))));
        for (; kk < len; ++kk) dst[kk] = src[kk * sak];
        if (len & 1) dst[len] = 0;
    }
}

/* Panel k pairs [q0, pairs) of B's columns [c0, c0 + width) one element at a time (any strides), zeros outside B. */
static void pack_b_scalar(const gemm_operands *g, int64_t k0, int64_t len, int64_t c0, int64_t width, int16_t *panel,
                          int64_t q0, int64_t pairs) {
    for (int64_t q = q0; q < pairs; ++q)
        for (int64_t j = 0; j < NR; ++j)
            for (int64_t t = 0; t < 2; ++t) {
                const int64_t kk = 2 * q + t;
                panel[q * 32 + 2 * j + t] = (kk < len && j < width) ? g->b[(k0 + kk) * g->sbk + (c0 + j) * g->sbn] : 0;
            }
}

/* B block: k [k0, k0 + len) x columns [j0, j0 + cols) of B as panels of kcp / 2 k-pair rows, zeros outside B. */
AVX2 static void pack_b(const gemm_operands *g, int64_t k0, int64_t len, int64_t j0, int64_t cols, int16_t *bp,
                        int64_t kcp) {
    const int64_t sbk = g->sbk, sbn = g->sbn, pairs = ceil_div(len, 2), full = cols / NR, panels = ceil_div(cols, NR);
    int64_t done = 0; /* k pairs of the full panels packed by a vector path */
    if (sbn == 1) { /* row-major: interleave two rows' bytes, then sign-extend; row by row, as B lies in memory */
        for (; 2 * done + 2 <= len; ++done) {
            const int8_t *r0 = g->b + (k0 + 2 * done) * sbk + j0;
            for (int64_t p = 0; p < full; ++p) {
                const __m128i x0 = _mm_loadu_si128((const __m128i *)(r0 + p * NR));
                const __m128i x1 = _mm_loadu_si128((const __m128i *)(r0 + sbk + p * NR));
                int16_t *dst = bp + p * kcp * NR + done * 32;
                _mm256_storeu_si256((__m256i *)dst, _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(x0, x1)));
                _mm256_storeu_si256((__m256i *)(dst + 16), _mm256_cvtepi8_epi16(_mm_unpackhi_epi8(x0, x1)));
            }
        }
    } else if (sbk == 1) { /* column-major: a column's 16 k are 8 pairs; 8 columns x 8 pairs transposed */
        for (; 2 * done + 16 <= len; done += 8)
            for (int64_t p = 0; p < full; ++p)
                for (int h = 0; h < 2; ++h) {
                    __m256i x[8];
                    for (int j = 0; j < 8; ++j)
                        x[j] = _mm256_cvtepi8_epi16(
                            _mm_loadu_si128((const __m128i *)(g->b + (j0 + p * NR + 8 * h + j) * sbn + k0 + 2 * done)));
                    transpose_8x8(x, 1);
                    for (int r = 0; r < 8; ++r)
                        _mm256_storeu_si256((__m256i *)(bp + p * kcp * NR + (done + r) * 32 + 16 * h), x[r]);
                }
    }
    for (int64_t p = 0; p < panels; ++p) /* what is left: the last k pairs, a partial panel, other strides */
        pack_b_scalar(g, k0, len, j0 + p * NR, min64(NR, cols - p * NR), bp + p * kcp * NR, p < full ? done : 0, pairs);
}

/* C[rows][cols] (+)= the sums in tile (rows of NR). */
AVX2 static void store_tile(const int32_t *tile, int64_t rows, int32_t *c, int64_t ldc, int64_t cols, int accumulate) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7); /* only the columns inside C */
    const __m256i m0 = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)cols), lane);
    const __m256i m1 = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)cols - 8), lane);
    for (int64_t r = 0; r < rows; ++r) {
        int *dst = (int *)(c + r * ldc);
        __m256i lo = _mm256_loadu_si256((const __m256i *)(tile + r * NR));
        __m256i hi = _mm256_loadu_si256((const __m256i *)(tile + r * NR + 8));
        if (cols == NR) {
            if (accumulate) {
                lo = _mm256_add_epi32(lo, _mm256_loadu_si256((const __m256i *)dst));
                hi = _mm256_add_epi32(hi, _mm256_loadu_si256((const __m256i *)(dst + 8)));
            }
            _mm256_storeu_si256((__m256i *)dst, lo);
            _mm256_storeu_si256((__m256i *)(dst + 8), hi);
            continue;
        }
        if (accumulate) {
            lo = _mm256_add_epi32(lo, _mm256_maskload_epi32(dst, m0));
            hi = _mm256_add_epi32(hi, _mm256_maskload_epi32(dst + 8, m1));
        }
        _mm256_maskstore_epi32(dst, m0, lo);
        _mm256_maskstore_epi32(dst + 8, m1, hi);
    }
}

/* One k pair of row r: broadcast the pair (a[r][2q], a[r][2q+1]) and multiply-add it with both halves of B. */
#define MICRO_ROW(r)                                                                                                   \
    if (mr > r) {                                                                                                      \
        int32_t pair;                                                                                                  \
        memcpy(&pair, a + r * lda + 2 * q, sizeof pair);                                                               \
        const __m256i x = _mm256_set1_epi32(pair);                                                                     \
        lo##r = _mm256_add_epi32(lo##r, _mm256_madd_epi16(x, b0));                                                     \
        hi##r = _mm256_add_epi32(hi##r, _mm256_madd_epi16(x, b1));                                                     \
    }

/* C[mr rows][cols] (+)= A block rows (stride lda) x one B panel, over `pairs` k pairs; mr a constant <= MR.
 * The accumulators are named variables (an array of them is kept on the stack by GCC 12). */
AVX2 static inline __attribute__((always_inline)) void micro_kernel(const int mr, int64_t pairs, const int16_t *a,
                                                                     int64_t lda, const int16_t *b, int32_t *c,
                                                                     int64_t ldc, int64_t cols, int accumulate) {
    __m256i lo0 = _mm256_setzero_si256(), lo1 = lo0, lo2 = lo0, lo3 = lo0, lo4 = lo0, lo5 = lo0;
    __m256i hi0 = lo0, hi1 = lo0, hi2 = lo0, hi3 = lo0, hi4 = lo0, hi5 = lo0;
    for (int r = 0; r < mr; ++r) { /* C's rows are far apart (no hardware prefetch): ask for them now */
        _mm_prefetch((const char *)(c + r * ldc), _MM_HINT_T0);
        _mm_prefetch((const char *)(c + r * ldc + NR - 1), _MM_HINT_T0);
    }
    for (int64_t q = 0; q < pairs; ++q) {
        const __m256i b0 = _mm256_loadu_si256((const __m256i *)(b + 32 * q));
        const __m256i b1 = _mm256_loadu_si256((const __m256i *)(b + 32 * q + 16));
        MICRO_ROW(0) MICRO_ROW(1) MICRO_ROW(2) MICRO_ROW(3) MICRO_ROW(4) MICRO_ROW(5)
    }
    int32_t tile[MR * NR];
    __m256i *t = (__m256i *)tile;
    _mm256_storeu_si256(t, lo0);
    _mm256_storeu_si256(t + 1, hi0);
    if (mr > 1) _mm256_storeu_si256(t + 2, lo1), _mm256_storeu_si256(t + 3, hi1);
    if (mr > 2) _mm256_storeu_si256(t + 4, lo2), _mm256_storeu_si256(t + 5, hi2);
    if (mr > 3) _mm256_storeu_si256(t + 6, lo3), _mm256_storeu_si256(t + 7, hi3);
    if (mr > 4) _mm256_storeu_si256(t + 8, lo4), _mm256_storeu_si256(t + 9, hi4);
    if (mr > 5) _mm256_storeu_si256(t + 10, lo5), _mm256_storeu_si256(t + 11, hi5);
    store_tile(tile, mr, c, ldc, cols, accumulate);
}
#undef MICRO_ROW

AVX2 static void micro_tile(int64_t rows, int64_t pairs, const int16_t *a, int64_t lda, const int16_t *b, int32_t *c,
                            int64_t ldc, int64_t cols, int accumulate) {
    switch (rows) { /* one unrolled kernel per row count, the accumulators in registers */
    case 6: micro_kernel(6, pairs, a, lda, b, c, ldc, cols, accumulate); break;
    case 5: micro_kernel(5, pairs, a, lda, b, c, ldc, cols, accumulate); break;
    case 4: micro_kernel(4, pairs, a, lda, b, c, ldc, cols, accumulate); break;
    case 3: micro_kernel(3, pairs, a, lda, b, c, ldc, cols, accumulate); break;
    case 2: micro_kernel(2, pairs, a, lda, b, c, ldc, cols, accumulate); break;
    default: micro_kernel(1, pairs, a, lda, b, c, ldc, cols, accumulate); break;
    }
}

/* One job: C[i0:i1, j0:j1] = A[i0:i1, k0:k1] @ B[k0:k1, j0:j1] into c (row stride ldc, indexed from (0, 0)). */
static void run_job(const gemm_operands *g, const gemm_plan *p, int64_t i0, int64_t i1, int64_t j0, int64_t j1,
                    int64_t k0, int64_t k1, int16_t *ap, int16_t *bp, int32_t *c, int64_t ldc) {
    for (int64_t jc = j0; jc < j1; jc += p->nc) {
        const int64_t nc = min64(p->nc, j1 - jc);
        for (int64_t pc = k0; pc < k1; pc += p->kc) {
            const int64_t len = min64(p->kc, k1 - pc), pairs = ceil_div(len, 2);
            pack_b(g, pc, len, jc, nc, bp, p->kcp);
            for (int64_t ic = i0; ic < i1; ic += p->mc) {
                const int64_t mc = min64(p->mc, i1 - ic);
                pack_a(g, ic, mc, pc, len, ap, p->kcp);
                for (int64_t jr = 0; jr < nc; jr += NR)
                    for (int64_t ir = 0; ir < mc; ir += MR)
                        micro_tile(min64(MR, mc - ir), pairs, ap + ir * p->kcp, p->kcp, bp + (jr / NR) * p->kcp * NR,
                                   c + (ic + ir) * ldc + jc + jr, ldc, min64(NR, nc - jr), pc > k0);
            }
        }
    }
}

/* C rows [i0, i1) += the partial sums of the K pieces after the first (each [M][N], row-major). */
AVX2 static void add_partials(int32_t *c, int64_t ldc, const int32_t *partial, int64_t m, int64_t n, int64_t parts,
                              int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i)
        for (int64_t s = 0; s < parts; ++s) {
            const int32_t *src = partial + s * m * n + i * n;
            int32_t *dst = c + i * ldc;
            int64_t j = 0;
            for (; j + 8 <= n; j += 8)
                _mm256_storeu_si256((__m256i *)(dst + j), _mm256_add_epi32(_mm256_loadu_si256((const __m256i *)(dst + j)),
                                                                            _mm256_loadu_si256((const __m256i *)(src + j))));
            for (; j < n; ++j) dst[j] += src[j];
        }
}

/* Workspace sizes for inttrain_gemm_avx2_s8s8s32 with these dims (m, n, k, ...) and threads: out[0] = ap bytes
 * (the jobs' A blocks and the partial sums of a cut K), out[1] = bp bytes (the jobs' B blocks). */
void inttrain_gemm_avx2_workspace(const int64_t *dims, int64_t threads, int64_t *out) {
    const int64_t m = dims[0], n = dims[1], k = dims[2];
    if (m < 1 || n < 1 || k < 1) {
        out[0] = out[1] = 0;
        return;
    }
    gemm_plan p;
    make_plan(m, n, k, threads < 1 ? 1 : threads, &p);
    const int64_t jobs = p.pm * p.pn * p.pk;
    out[0] = jobs * p.a_bytes + round_up((p.pk - 1) * m * n * 4, 64);
    out[1] = jobs * p.b_bytes;
}

/* C = A @ B exactly (see the top of the file).  dims: m, n, k, sam, sak, sbk, sbn, ldc (as gemm_amx.c's
 * inttrain_gemm_s8s8s32).  ap, bp: workspaces of inttrain_gemm_avx2_workspace's sizes for the same dims and
 * threads.  Returns 0, or 1 without AVX2. */
int inttrain_gemm_avx2_s8s8s32(const int8_t *a, const int8_t *b, int32_t *c, const int64_t *dims, int8_t *ap,
                               int8_t *bp, int64_t threads) {
    const gemm_operands g = {a, b, dims[0], dims[1], dims[2], dims[3], dims[4], dims[5], dims[6]};
    const int64_t m = g.m, n = g.n, k = g.k, ldc = dims[7];
    if (!inttrain_has_avx2()) return 1;
    if (m < 1 || n < 1) return 0;
    if (k < 1) {
        for (int64_t i = 0; i < m; ++i) memset(c + i * ldc, 0, (size_t)n * sizeof *c);
        return 0;
    }
    if (threads < 1) threads = 1;
    gemm_plan p;
    make_plan(m, n, k, threads, &p);
    const int64_t jobs = p.pm * p.pn * p.pk;
    int32_t *partial = (int32_t *)(ap + jobs * p.a_bytes);
#pragma omp parallel num_threads((int)min64(threads, jobs))
    {
#pragma omp for schedule(static, 1)
        for (int64_t job = 0; job < jobs; ++job) {
            const int64_t im = job % p.pm, jn = (job / p.pm) % p.pn, kp = job / (p.pm * p.pn);
            int32_t *dst = kp ? partial + (kp - 1) * m * n : c;
            run_job(&g, &p, im * p.rows, min64(m, (im + 1) * p.rows), jn * p.cols, min64(n, (jn + 1) * p.cols),
                    kp * p.depth, min64(k, (kp + 1) * p.depth), (int16_t *)(ap + job * p.a_bytes),
                    (int16_t *)(bp + job * p.b_bytes), dst, kp ? n : ldc);
        }
        if (p.pk > 1) {
#pragma omp for schedule(static)
            for (int64_t i0 = 0; i0 < m; i0 += 16) add_partials(c, ldc, partial, m, n, p.pk - 1, i0, min64(m, i0 + 16));
        }
    }
    return 0;
}
