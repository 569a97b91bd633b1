/* Exact int8 convolution forward on AVX2 (CPUs without AVX512-VNNI or AMX, e.g. AMD Zen 2 / Zen 3); the input
 * gradient runs it as a sub-pixel convolution (kernels/conv.py), as it runs conv.c's VNNI kernel.
 *
 * Why native: oneDNN's int8 convolution on such CPUs adds uint8 x int8 product pairs with the saturating
 * VPMADDUBSW (wrong sums: kernels/conv.py::onednn_int8_conv_exact), and the exact fallback, im2col + the AVX2
 * GEMM (gemm_avx2.c), spent more time copying the k_h x k_w times larger im2col matrix than multiplying
 * (ResNet-20's 16-channel 3x3 layer at batch 128: 25.9 ms forward against 10.3 ms for oneDNN's float32).
 *
 *   out[p][co] = float32(sum_{tap, ci} q[pixel(p, tap)][ci] * w[co][ci][tap]) * float32(x_scale * w_scale[co])
 *
 * Arithmetic: as gemm_avx2.c, codes sign-extended to int16 and VPMADDWD multiplies int16 pairs, adding each pair
 * into an int32 lane (exact; |q * w| <= 2^14, so sums of up to 131071 terms are exact).
 *
 * Layouts:
 *   xp   int16 [N][Hp][Wp][Ci2]          the codes q = xu8 - 128, zero padded (borders and, for odd Ci, one
 *                                        extra channel; Ci2 = Ci rounded up to even): every tap of every output
 *                                        pixel is an in-bounds read, and a channel pair is one int32 broadcast.
 *   wp   int16 [CoB][taps][Ci2/2][8][2]  8 output channels x one input channel pair: one ymm per
 *                                        (block, tap, pair); zeros past Co and Ci.
 *   out  float32 [N*Ho*Wo][Co]           channels-last.
 * Implicit GEMM: a register tile holds P output pixels x V blocks of 8 output channels; per (tap, channel pair)
 * it loads V weight vectors, broadcasts P code pairs and issues V*P VPMADDWD + VPADDD.  No im2col.
 *
 * The weight gradient (further down) has its own comment.
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "simd_quantize.h"
#include "tile_pixels.h"

#define AVX2 __attribute__((target("avx2")))

int inttrain_conv_avx2_ready(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") ? 1 : 0;
}

typedef struct {
    const int16_t *xp;
    const int16_t *wp;
    const float *scale; /* [CoB * 8]: x_scale * w_scale[co], rounded once to float32; zeros past Co */
    float *out;
    const int64_t *tap_off; /* [taps]: where each tap reads from a window's first code (no division per tap:
                               ResNet-20's 16-channel layer ran 20% slower computing it in the tile) */
    int64_t total, co, pairs, taps, hp, wpw, ho, wo, sh, sw, ci2;
} fwd_job;

static inline int32_t load_pair(const int16_t *at) {
    int32_t v;
    memcpy(&v, at, 4);
    return v;
}

#define FWD_TILE(NAME, V, P)                                                                                      \
    AVX2 static void NAME(const fwd_job *j, int64_t m0, int64_t cb0) {                                           \
        const int16_t *base[P];                                                                                   \
        int64_t at[P];                                                                                            \
        tile_pixel_offsets(m0, (P), j->total, j->ho, j->wo, j->hp, j->wpw, j->sh, j->sw, j->ci2, at);            \
        for (int p = 0; p < (P); ++p) base[p] = j->xp + at[p];                                                    \
        __m256i acc[V][P];                                                                                        \
        for (int v = 0; v < (V); ++v)                                                                             \
            for (int p = 0; p < (P); ++p) acc[v][p] = _mm256_setzero_si256();                                     \
        const int64_t pairs = j->pairs, block_stride = j->taps * pairs * 16;                                      \
        const int16_t *wt = j->wp + cb0 * block_stride;                                                           \
        for (int64_t t = 0; t < j->taps; ++t, wt += pairs * 16) {                                                 \
            const int64_t off = j->tap_off[t];                                                                    \
            for (int64_t c = 0; c < pairs; ++c) {                                                                 \
                __m256i w[V];                                                                                     \
                for (int v = 0; v < (V); ++v) w[v] = _mm256_loadu_si256((const void *)(wt + v * block_stride + 16 * c)); \
                for (int p = 0; p < (P); ++p) {                                                                   \
                    const __m256i xb = _mm256_set1_epi32(load_pair(base[p] + off + 2 * c));                       \
                    for (int v = 0; v < (V); ++v)                                                                 \
                        acc[v][p] = _mm256_add_epi32(acc[v][p], _mm256_madd_epi16(xb, w[v]));                     \
                }                                                                                                 \
            }                                                                                                     \
        }                                                                                                         \
        for (int v = 0; v < (V); ++v) {                                                                           \
            const int64_t c0 = 8 * (cb0 + v);                                                                     \
            const int64_t live = j->co - c0 < 8 ? j->co - c0 : 8;                                                 \
            const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)live),                                \
                                                    _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));                   \
            const __m256 sc = _mm256_loadu_ps(j->scale + c0);                                                     \
            for (int p = 0; p < (P) && m0 + p < j->total; ++p) {                                                  \
                const __m256 f = _mm256_mul_ps(_mm256_cvtepi32_ps(acc[v][p]), sc);                                \
                float *dst = j->out + (m0 + p) * j->co + c0;                                                      \
                if (live == 8)                                                                                    \
                    _mm256_storeu_ps(dst, f);                                                                     \
                else                                                                                              \
                    _mm256_maskstore_ps(dst, mask, f);                                                            \
            }                                                                                                     \
        }                                                                                                         \
    }

FWD_TILE(fwd_tile_v1, 1, 12)
FWD_TILE(fwd_tile_v2, 2, 6)

/* xp int16 [N][Hp][Wp][Ci2] from x uint8 channels-last [N][H][W][Ci]: q = x - 128, zeros around and past Ci. */
AVX2 static void pad_codes(const uint8_t *x, int64_t n, int64_t h, int64_t wd, int64_t ci, int64_t ci2, int64_t ph,
                           int64_t pw, int16_t *xp, int64_t threads) {
    const int64_t hp = h + 2 * ph, wpw = wd + 2 * pw;
#ifdef _OPENMP
#pragma omp parallel for num_threads((int)threads) schedule(static)
#endif
    for (int64_t r = 0; r < n * hp; ++r) {
        const int64_t img = r / hp, y = r % hp - ph;
        int16_t *dst = xp + r * wpw * ci2;
        if (y < 0 || y >= h) {
            memset(dst, 0, (size_t)(wpw * ci2) * 2);
            continue;
        }
        memset(dst, 0, (size_t)(pw * ci2) * 2);
        memset(dst + (pw + wd) * ci2, 0, (size_t)(pw * ci2) * 2);
        const uint8_t *src = x + (img * h + y) * wd * ci;
        int16_t *row = dst + pw * ci2;
        if (ci2 == ci) { /* one contiguous run of W * Ci codes */
            const int64_t len = wd * ci;
            const __m256i shift = _mm256_set1_epi16(128);
            int64_t i = 0;
            for (; i + 16 <= len; i += 16) {
                const __m256i v = _mm256_cvtepu8_epi16(_mm_loadu_si128((const void *)(src + i)));
                _mm256_storeu_si256((void *)(row + i), _mm256_sub_epi16(v, shift));
            }
            for (; i < len; ++i) row[i] = (int16_t)((int)src[i] - 128);
        } else {
            for (int64_t px = 0; px < wd; ++px) {
                for (int64_t c = 0; c < ci; ++c) row[px * ci2 + c] = (int16_t)((int)src[px * ci + c] - 128);
                for (int64_t c = ci; c < ci2; ++c) row[px * ci2 + c] = 0;
            }
        }
    }
}

/* Bytes of int16 scratch inttrain_conv_fwd_avx2 needs for xp (dims as below). */
int64_t inttrain_conv_avx2_scratch(const int64_t *dims) {
    const int64_t n = dims[0], ci = dims[1], h = dims[2], wd = dims[3], ph = dims[9], pw = dims[10];
    return n * (h + 2 * ph) * (wd + 2 * pw) * (ci + (ci & 1)) * 2;
}

/* dims: N, Ci, H, W, Co, KH, KW, Ho, Wo, pad_h, pad_w, stride_h, stride_w, dil_h, dil_w.
 * x: uint8 q + 128, channels-last [N][H][W][Ci]; w: int8 [Co][Ci][KH][KW] contiguous; w_scale: Co values, or one
 * (w_per_channel = 0); xp: inttrain_conv_avx2_scratch(dims) bytes; out: float32 [N][Ho][Wo][Co].
 * Returns 0 on success, 1 when the CPU lacks AVX2, 2 when out of memory, 3 on unsupported sizes. */
int inttrain_conv_fwd_avx2(const uint8_t *x, const int8_t *w, float x_scale, const float *w_scale,
                           int64_t w_per_channel, const int64_t *dims, int16_t *xp, float *out, int64_t threads) {
    if (!inttrain_conv_avx2_ready()) return 1;
    const int64_t n = dims[0], ci = dims[1], h = dims[2], wd = dims[3], co = dims[4], kh = dims[5], kw = dims[6];
    const int64_t ho = dims[7], wo = dims[8], ph = dims[9], pw = dims[10];
    const int64_t ci2 = ci + (ci & 1), pairs = ci2 / 2, taps = kh * kw, cob = (co + 7) / 8;
    if (ci < 1 || co < 1 || ci2 * taps > 131071) return 3;
    threads = threads < 1 ? 1 : threads;
    int16_t *wp = calloc((size_t)(cob * taps * pairs * 16), sizeof(int16_t));
    float *scale = calloc((size_t)(cob * 8), sizeof(float));
    int64_t *tap_off = malloc((size_t)taps * sizeof(int64_t)); /* up to 64K taps: not on the stack */
    if (!wp || !scale || !tap_off) {
        free(wp), free(scale), free(tap_off);
        return 2;
    }
    for (int64_t o = 0; o < co; ++o) { /* wp[o / 8][tap][c / 2][o % 8][c % 2] = w[o][c][tap] */
        for (int64_t c = 0; c < ci; ++c)
            for (int64_t t = 0; t < taps; ++t)
                wp[(((o / 8) * taps + t) * pairs + c / 2) * 16 + (o % 8) * 2 + c % 2] = w[(o * ci + c) * taps + t];
        scale[o] = (float)((double)x_scale * (double)w_scale[w_per_channel ? o : 0]); /* rounded once */
    }
    pad_codes(x, n, h, wd, ci, ci2, ph, pw, xp, threads);
    for (int64_t t = 0; t < taps; ++t) tap_off[t] = ((t / kw) * dims[13] * (wd + 2 * pw) + (t % kw) * dims[14]) * ci2;
    fwd_job job = {xp, wp, scale, out, tap_off, n * ho * wo, co, pairs, taps, h + 2 * ph, wd + 2 * pw, ho, wo,
                   dims[11], dims[12], ci2};
    const int64_t vecs = cob % 2 == 0 ? 2 : 1, pix = vecs == 2 ? 6 : 12;
    const int64_t mtiles = (job.total + pix - 1) / pix, ctiles = cob / vecs, tiles = mtiles * ctiles;
#ifdef _OPENMP
#pragma omp parallel for num_threads((int)threads) schedule(static)
#endif
    for (int64_t t = 0; t < tiles; ++t) {
        const int64_t m0 = (t / ctiles) * pix, c0 = (t % ctiles) * vecs;
        if (vecs == 2)
            fwd_tile_v2(&job, m0, c0);
        else
            fwd_tile_v1(&job, m0, c0);
    }
    free(wp), free(scale), free(tap_off);
    return 0;
}

/* ---------------------------------------------------------------------------------------------------------
 * Weight gradient: dW[co][ci][tap] = sum over gradient pixels p of g[p][co] * q[pixel(p, tap)][ci].
 *
 * VPMADDWD adds the products of an int16 pair, so the pairs run along the reduction: two horizontally adjacent
 * gradient pixels (ow, ow + 1), whose input pixels at any tap are sw columns apart.  Per image chunk (sized to
 * stay in L2) each thread packs
 *   gq2  int16 [block][m][Ho][Wo2][rows][2]   (g[ow][co], g[ow + 1][co]) of a block's 6 (or 4) output channels:
 *                                       one int32 broadcast per (pair, channel); zeros past Wo and Co
 *                                       (Wo2 = ceil(Wo / 2), Co4 = Co rounded up to 4)
 *   xq2  int16 [Ci8 / 8][m][Hp][Wx][8][2]   (q[c][ci], q[c + sw][ci]) of the zero-padded input in planes of 8
 *                                       channels, zeros outside and past Ci (Ci8 = Ci rounded up to 8): one ymm
 *                                       load per (column, 8 channels)
 * and a register tile of 6 (or 4) output channels x V blocks of 8 input channels at one tap runs over every pixel
 * pair of the chunk: per pair V loads, 6 broadcasts, 6 V VPMADDWD; the taps of one block pair run back to back,
 * so their passes read the same panels.  No im2col.  Each chunk's int32 sums (at most 2^16 pairs of products
 * |g q| <= 2^14 per lane: exact) go into the thread's int64 sums, added up at the end; an image of more than
 * 65535 gradient pixel pairs is refused (the caller takes another kernel).
 */

typedef struct {
    const uint8_t *x;   /* channels-last [N][H][W][Ci]: q + 128 (uint8), or q when x_signed */
    const int8_t *g;    /* channels-last [N][Ho][Wo][Co]; NULL when gf is given */
    const void *gf;     /* or the float gradient, channels-last, quantized while it is packed */
    const float *gscale; /* gf's scales: one per output channel, or one */
    int64_t gf_bf16, per_channel, sr; /* gf holds bfloat16; one scale per channel; stochastic rounding */
    uint32_t seed;
    float qmax;
    int64_t n, co, ci, kh, kw, h, w, ho, wo, ph, pw, sh, sw, dh, dw, x_signed;
    int64_t co4, ci8, wo2, hp, wx, chunk; /* derived in wgrad_geometry */
} wgrad_avx2;

static void wgrad_geometry(wgrad_avx2 *j) {
    j->co4 = (j->co + 3) / 4 * 4, j->ci8 = (j->ci + 7) / 8 * 8, j->wo2 = (j->wo + 1) / 2;
    j->hp = j->h + 2 * j->ph;
    j->wx = 2 * (j->wo2 - 1) * j->sw + (j->kw - 1) * j->dw + 1; /* the columns a pair's first pixel reads */
    const int64_t per_image = (j->hp * j->wx * j->ci8 + j->ho * j->wo2 * j->co4) * 4; /* bytes of xq2 + gq2 */
    int64_t chunk = ((int64_t)256 * 1024) / (per_image > 0 ? per_image : 1);
    const int64_t pairs_max = 65535 / (j->ho * j->wo2 > 0 ? j->ho * j->wo2 : 1); /* int32: 2^16 pairs a lane */
    chunk = chunk < pairs_max ? chunk : pairs_max;
    j->chunk = chunk < 1 ? 1 : chunk;
}

static void wgrad_from_dims(wgrad_avx2 *j, const int64_t *dims) {
    j->n = dims[0], j->co = dims[1], j->ci = dims[2], j->kh = dims[3], j->kw = dims[4], j->h = dims[5];
    j->w = dims[6], j->ho = dims[7], j->wo = dims[8], j->ph = dims[9], j->pw = dims[10], j->sh = dims[11];
    j->sw = dims[12], j->dh = dims[13], j->dw = dims[14], j->x_signed = dims[15];
    wgrad_geometry(j);
}

/* Bytes of scratch for all threads (xq2 + gq2 of one chunk and a pair's codes, each) and of the threads' int64
 * partial sums, for dims as inttrain_wgrad_avx2's. */
void inttrain_wgrad_avx2_scratch(const int64_t *dims, int64_t threads, int64_t *out) {
    wgrad_avx2 j;
    wgrad_from_dims(&j, dims);
    const int64_t per_thread = (j.chunk * (j.hp * j.wx * j.ci8 + j.ho * j.wo2 * j.co4) * 2 + (j.co4 + 8) * 2) * 2;
    out[0] = per_thread * (threads < 1 ? 1 : threads);
    out[1] = (threads < 1 ? 1 : threads) * j.co4 * j.kh * j.kw * j.ci8 * 8;
}

/* The chunk's packed input: xq2[ci / 8][img][y][c][ci % 8][2] = (q[y][c][ci], q[y][c + sw][ci]) on the padded
 * grid, one plane of 8 channels after another (a tile's pass reads whole cache lines of its channels). */
AVX2 static void pack_input_pairs(const wgrad_avx2 *j, int64_t img0, int64_t m, int16_t *xq2) {
    const int64_t ci = j->ci, ci8 = j->ci8, wp = j->w + 2 * j->pw, plane = m * j->hp * j->wx * 16;
    const __m128i bias = _mm_set1_epi16((short)(j->x_signed ? 0 : 128));
    for (int64_t r = 0; r < m * j->hp; ++r) {
        const int64_t img = img0 + r / j->hp, y = r % j->hp - j->ph;
        const uint8_t *src = j->x + (img * j->h + y) * j->w * ci;
        for (int64_t c = 0; c < j->wx; ++c) {
            int16_t *dst = xq2 + (r * j->wx + c) * 16; /* in plane 0; plane k at + k * plane */
            const int64_t x0 = c - j->pw, x1 = c + j->sw - j->pw; /* input columns of the pair */
            const int row_in = y >= 0 && y < j->h;
            const int in0 = row_in && c < wp && x0 >= 0 && x0 < j->w;
            const int in1 = row_in && c + j->sw < wp && x1 >= 0 && x1 < j->w;
            if (ci % 8 == 0 && in0 && in1) {
                const uint8_t *a = src + x0 * ci, *b = src + x1 * ci;
                for (int64_t k = 0; k < ci; k += 8) {
                    __m128i va = _mm_cvtepu8_epi16(_mm_loadl_epi64((const void *)(a + k)));
                    __m128i vb = _mm_cvtepu8_epi16(_mm_loadl_epi64((const void *)(b + k)));
                    if (j->x_signed) { /* int8 codes: sign-extend instead */
                        va = _mm_srai_epi16(_mm_slli_epi16(va, 8), 8), vb = _mm_srai_epi16(_mm_slli_epi16(vb, 8), 8);
                    } else {
                        va = _mm_sub_epi16(va, bias), vb = _mm_sub_epi16(vb, bias);
                    }
                    int16_t *d = dst + (k / 8) * plane;
                    _mm_storeu_si128((void *)d, _mm_unpacklo_epi16(va, vb));
                    _mm_storeu_si128((void *)(d + 8), _mm_unpackhi_epi16(va, vb));
                }
                continue;
            }
            for (int64_t k = 0; k < ci8; ++k) {
                int16_t v0 = 0, v1 = 0;
                if (k < ci && in0) v0 = j->x_signed ? (int16_t)(int8_t)src[x0 * ci + k] : (int16_t)(src[x0 * ci + k] - 128);
                if (k < ci && in1) v1 = j->x_signed ? (int16_t)(int8_t)src[x1 * ci + k] : (int16_t)(src[x1 * ci + k] - 128);
                dst[(k / 8) * plane + 2 * (k % 8)] = v0, dst[(k / 8) * plane + 2 * (k % 8) + 1] = v1;
            }
        }
    }
}

/* The codes of channels c0 .. c0 + 7 of gradient pixel `pixel` (its index in [N*Ho*Wo]), quantized from gf with
 * simd_quantize.h's numerics (the element index that of the channels-last [N*Ho*Wo, Co] matrix); 0 past Co. */
AVX2 static __m128i float_codes8(const wgrad_avx2 *j, int64_t pixel, int64_t c0) {
    const int64_t at = pixel * j->co + c0, live = j->co - c0 < 8 ? j->co - c0 : 8;
    __m256 v, s;
    if (live == 8) {
        if (j->gf_bf16) /* bfloat16 -> float32: the 16 bits become the high half */
            v = _mm256_castsi256_ps(_mm256_slli_epi32(
                _mm256_cvtepu16_epi32(_mm_loadu_si128((const void *)((const uint16_t *)j->gf + at))), 16));
        else
            v = _mm256_loadu_ps((const float *)j->gf + at);
        s = j->per_channel ? _mm256_loadu_ps(j->gscale + c0) : _mm256_set1_ps(j->gscale[0]);
    } else {
        float vb[8] = {0}, sb[8];
        for (int64_t l = 0; l < 8; ++l) {
            sb[l] = l < live && j->per_channel ? j->gscale[c0 + l] : j->gscale[0];
            if (l < live && j->gf_bf16) {
                const uint32_t bits = (uint32_t)((const uint16_t *)j->gf)[at + l] << 16;
                memcpy(&vb[l], &bits, 4);
            } else if (l < live) {
                vb[l] = ((const float *)j->gf)[at + l];
            }
        }
        v = _mm256_loadu_ps(vb), s = _mm256_loadu_ps(sb); /* v = 0 gives code 0 in either rounding */
    }
    const __m256 qmax = _mm256_set1_ps(j->qmax);
    __m256i c;
    if (j->sr) {
        const __m256 u = uniform8((uint32_t)at, j->seed);
        c = codes8(v, s, &u, qmax);
    } else {
        c = codes8(v, s, NULL, qmax);
    }
    /* int32 lanes in [-127, 127] -> 8 int16 */
    return _mm_packs_epi32(_mm256_castsi256_si128(c), _mm256_extracti128_si256(c, 1));
}

/* Output channel blocks of the tiles: 6 channels (12 accumulators) while more than 8 are left (or a multiple of 6),
 * then 4; Co4 - co0 stays a multiple of 2 and ends at 0. */
static int64_t block_rows(int64_t left) { return left % 6 == 0 || left > 8 ? 6 : 4; }

/* One pixel pair's interleaved codes (co4 int16 pairs) -> the blocks' panels: block [co0, co0 + rows) of the
 * chunk's `pairs` pairs is the panel gq2[co0 * pairs * 2 ..] of [pair][rows][2]. */
static void scatter_pair(const wgrad_avx2 *j, const int16_t *pair_codes, int64_t pair, int64_t pairs, int16_t *gq2) {
    for (int64_t co0 = 0, rows; co0 < j->co4; co0 += rows) {
        rows = block_rows(j->co4 - co0);
        memcpy(gq2 + (co0 * pairs + pair * rows) * 2, pair_codes + co0 * 2, (size_t)rows * 4);
    }
}

/* The chunk's packed gradient: for pair p = (img, oh, ow / 2), the codes (g[oh][ow][co], g[oh][ow + 1][co]) of
 * each block's channels (zeros past Wo and Co), quantized from gf while packing when it is given; `codes`: room
 * for one pair's, rounded up to whole 8-channel stores ((Co4 + 8) * 2 int16). */
AVX2 static void pack_gradient_pairs(const wgrad_avx2 *j, int64_t img0, int64_t m, int16_t *gq2, int16_t *codes) {
    const int64_t co = j->co, co4 = j->co4, pairs = m * j->ho * j->wo2; /* codes: one pair's, (co4 + 8) * 2 int16 (8-channel stores) */
    for (int64_t r = 0; r < m * j->ho; ++r) {
        const int64_t pixel0 = (img0 * j->ho + r) * j->wo;
        for (int64_t p = 0; p < j->wo2; ++p) {
            const int second = 2 * p + 1 < j->wo;
            if (j->gf) {
                for (int64_t c0 = 0; c0 < co4; c0 += 8) {
                    const __m128i a = float_codes8(j, pixel0 + 2 * p, c0);
                    const __m128i b = second ? float_codes8(j, pixel0 + 2 * p + 1, c0) : _mm_setzero_si128();
                    _mm_storeu_si128((void *)(codes + 2 * c0), _mm_unpacklo_epi16(a, b));
                    _mm_storeu_si128((void *)(codes + 2 * c0 + 8), _mm_unpackhi_epi16(a, b));
                }
            } else {
                const int8_t *a = j->g + (pixel0 + 2 * p) * co, *b = a + co;
                int64_t k = 0;
                if (second)
                    for (; k + 8 <= co; k += 8) {
                        const __m128i va = _mm_cvtepi8_epi16(_mm_loadl_epi64((const void *)(a + k)));
                        const __m128i vb = _mm_cvtepi8_epi16(_mm_loadl_epi64((const void *)(b + k)));
                        _mm_storeu_si128((void *)(codes + 2 * k), _mm_unpacklo_epi16(va, vb));
                        _mm_storeu_si128((void *)(codes + 2 * k + 8), _mm_unpackhi_epi16(va, vb));
                    }
                for (; k < co4; ++k) {
                    codes[2 * k] = k < co ? a[k] : 0;
                    codes[2 * k + 1] = k < co && second ? b[k] : 0;
                }
            }
            scatter_pair(j, codes, r * j->wo2 + p, pairs, gq2);
        }
    }
}

/* acc[co0 .. co0 + P)[tap][ci0 .. ci0 + 8 V) += the chunk's sums, over its m images. */
#define WGRAD_TILE(NAME, P, V)                                                                                    \
    AVX2 static void NAME(const wgrad_avx2 *j, const int16_t *xq2, const int16_t *gq2, int64_t m, int64_t co0,  \
                          int64_t tap, int64_t ci0, int64_t *acc) {                                              \
        __m256i s[P][V];                                                                                          \
        for (int r = 0; r < (P); ++r)                                                                             \
            for (int v = 0; v < (V); ++v) s[r][v] = _mm256_setzero_si256();                                       \
        const int64_t ky = tap / j->kw, kx = tap % j->kw, xstep = 2 * j->sw * 16, plane = m * j->hp * j->wx * 16; \
        const int16_t *xplane = xq2 + (ci0 / 8) * plane;                                                          \
        const int16_t *gr = gq2 + co0 * m * j->ho * j->wo2 * 2; /* the block's panel, pairs in order */          \
        for (int64_t r = 0; r < m * j->ho; ++r) {                                                                 \
            const int64_t img = r / j->ho, oh = r % j->ho;                                                        \
            const int16_t *xr = xplane + ((img * j->hp + oh * j->sh + ky * j->dh) * j->wx + kx * j->dw) * 16;     \
            for (int64_t p = 0; p < j->wo2; ++p, xr += xstep, gr += (P) * 2) {                                    \
                __m256i xv[V];                                                                                    \
                for (int v = 0; v < (V); ++v) xv[v] = _mm256_loadu_si256((const void *)(xr + v * plane));        \
                for (int q = 0; q < (P); ++q) {                                                                   \
                    const __m256i gb = _mm256_set1_epi32(load_pair(gr + 2 * q));                                  \
                    for (int v = 0; v < (V); ++v) s[q][v] = _mm256_add_epi32(s[q][v], _mm256_madd_epi16(gb, xv[v])); \
                }                                                                                                 \
            }                                                                                                     \
        }                                                                                                         \
        const int64_t taps = j->kh * j->kw;                                                                       \
        for (int q = 0; q < (P); ++q)                                                                             \
            for (int v = 0; v < (V); ++v) {                                                                       \
                int32_t lanes[8];                                                                                 \
                _mm256_storeu_si256((void *)lanes, s[q][v]);                                                      \
                int64_t *dst = acc + ((co0 + q) * taps + tap) * j->ci8 + ci0 + 8 * v;                             \
                for (int l = 0; l < 8; ++l) dst[l] += lanes[l];                                                   \
            }                                                                                                     \
    }

WGRAD_TILE(wgrad_tile_6x1, 6, 1)
WGRAD_TILE(wgrad_tile_6x2, 6, 2)
WGRAD_TILE(wgrad_tile_4x1, 4, 1)
WGRAD_TILE(wgrad_tile_4x2, 4, 2)
WGRAD_TILE(wgrad_tile_4x3, 4, 3)

/* The chunk's sums of output channels [co0, co0 + rows): input channel blocks outside, taps inside, so that a
 * block's codes are read from L1 by all the taps' passes. */
static void wgrad_block(const wgrad_avx2 *j, const int16_t *xq2, const int16_t *gq2, int64_t m, int64_t co0,
                        int64_t rows, int64_t *acc) {
    const int64_t taps = j->kh * j->kw;
    for (int64_t ci0 = 0, width; ci0 < j->ci8; ci0 += width) {
        const int64_t left = (j->ci8 - ci0) / 8;
        width = rows == 6 ? (left >= 2 ? 16 : 8) : (left >= 3 && left != 4 ? 24 : left >= 2 ? 16 : 8);
        for (int64_t tap = 0; tap < taps; ++tap) {
            if (rows == 6 && width == 16) wgrad_tile_6x2(j, xq2, gq2, m, co0, tap, ci0, acc);
            else if (rows == 6) wgrad_tile_6x1(j, xq2, gq2, m, co0, tap, ci0, acc);
            else if (width == 24) wgrad_tile_4x3(j, xq2, gq2, m, co0, tap, ci0, acc);
            else if (width == 16) wgrad_tile_4x2(j, xq2, gq2, m, co0, tap, ci0, acc);
            else wgrad_tile_4x1(j, xq2, gq2, m, co0, tap, ci0, acc);
        }
    }
}

/* dims: N, Co, Ci, KH, KW, H, W, Ho, Wo, pad_h, pad_w, stride_h, stride_w, dil_h, dil_w, x_signed.
 * g: int8 channels-last [N][Ho][Wo][Co]; x: channels-last [N][H][W][Ci], uint8 q + 128 or (x_signed) int8 q;
 * scratch, partial: inttrain_wgrad_avx2_scratch's bytes; out: int64 [Co][Ci][KH][KW], written.
 * Returns 0 on success, 1 when the CPU lacks AVX2, 3 when an image has more than 65535 gradient pixel pairs. */
static int run_wgrad_avx2(wgrad_avx2 job, const int64_t *dims, int16_t *scratch, int64_t *partial, int64_t *out,
                          int64_t threads) {
    if (!inttrain_conv_avx2_ready()) return 1;
    wgrad_from_dims(&job, dims);
    if (job.ho * job.wo2 > 65535) return 3; /* one image's pairs would overflow an int32 lane */
    threads = threads < 1 ? 1 : threads;
    const int64_t taps = job.kh * job.kw, part = job.co4 * taps * job.ci8;
    const int64_t per_thread = job.chunk * (job.hp * job.wx * job.ci8 + job.ho * job.wo2 * job.co4) * 2 + (job.co4 + 8) * 2;
    const int64_t chunks = (job.n + job.chunk - 1) / job.chunk;
    memset(partial, 0, (size_t)(threads * part) * sizeof(int64_t));
#ifdef _OPENMP
#pragma omp parallel for num_threads((int)threads) schedule(static)
#endif
    for (int64_t c = 0; c < chunks; ++c) {
#ifdef _OPENMP
        const int t = omp_get_thread_num();
#else
        const int t = 0;
#endif
        int16_t *xq2 = scratch + t * per_thread, *gq2 = xq2 + job.chunk * job.hp * job.wx * job.ci8 * 2;
        int64_t *acc = partial + t * part;
        const int64_t img0 = c * job.chunk, m = job.n - img0 < job.chunk ? job.n - img0 : job.chunk;
        pack_input_pairs(&job, img0, m, xq2);
        pack_gradient_pairs(&job, img0, m, gq2, gq2 + job.chunk * job.ho * job.wo2 * job.co4 * 2);
        for (int64_t co0 = 0, rows; co0 < job.co4; co0 += rows) {
            rows = block_rows(job.co4 - co0);
            wgrad_block(&job, xq2, gq2, m, co0, rows, acc);
        }
    }
    for (int64_t o = 0; o < job.co; ++o) /* the threads' sums, [Co4][taps][Ci8] -> [Co][Ci][taps] */
        for (int64_t k = 0; k < job.ci; ++k)
            for (int64_t tap = 0; tap < taps; ++tap) {
                int64_t s = 0;
                for (int64_t t = 0; t < threads; ++t) s += partial[t * part + (o * taps + tap) * job.ci8 + k];
                out[(o * job.ci + k) * taps + tap] = s;
            }
    return 0;
}

int inttrain_wgrad_avx2(const int8_t *g, const void *x, const int64_t *dims, int16_t *scratch, int64_t *partial,
                        int64_t *out, int64_t threads) {
    wgrad_avx2 job;
    memset(&job, 0, sizeof job);
    job.g = g, job.x = x;
    return run_wgrad_avx2(job, dims, scratch, partial, out, threads);
}

/* inttrain_wgrad_avx2 on a float32 gradient gf, channels-last [N][Ho][Wo][Co], quantized while it is packed:
 * code = clamp(round(gf / s), -qmax, qmax), s = gscale[co] (flags bit 0) or gscale[0], rounded to nearest even
 * or stochastically (sr) with seed -- conv.c's inttrain_wgrad_f32 numerics, bit for bit; flags bit 1: gf holds
 * bfloat16 values (read as their float32 upcast, exactly).  qmax <= 127. */
int inttrain_wgrad_f32_avx2(const void *gf, const float *gscale, int64_t flags, int64_t qmax, int64_t sr, int64_t seed,
                            const void *x, const int64_t *dims, int16_t *scratch, int64_t *partial, int64_t *out,
                            int64_t threads) {
    wgrad_avx2 job;
    memset(&job, 0, sizeof job);
    job.gf = gf, job.gscale = gscale, job.per_channel = flags & 1, job.gf_bf16 = (flags >> 1) & 1;
    job.qmax = (float)qmax, job.sr = sr, job.seed = (uint32_t)seed, job.x = x;
    return run_wgrad_avx2(job, dims, scratch, partial, out, threads);
}
