/* Int8 convolution weight gradient on AVX512-VNNI: dW = sum over (n, oh, ow) of g * x.
 *
 * Why native: the weight gradient is a GEMM with a huge reduction (every output pixel of the
 * batch) and a small result (Co x Ci*KH*KW).  Library GEMMs see it either as KH*KW skinny GEMMs
 * or as one GEMM behind an im2col copy; both spend more time moving int8 codes than multiplying
 * them.  Here the result tile stays in registers while the codes stream through once per tile,
 * read in place: no im2col.
 *
 *   dW_int[co][j] = sum_p g[co][p] * xu8[j][p] - 128 * sum_p g[co][p]
 *
 * j = (ci, kh, kw) is a column of the weight, p = (n, oh, ow) a gradient pixel.  x arrives as the
 * forward convolution's shifted codes q + 128 (uint8, the operand VNNI wants unsigned) and
 * padding holds 128 (= code 0), so the correction is the same for every column: 128 times the
 * gradient's per-channel sum.  vpdpbusd multiplies 4 uint8 x codes by 4 int8 g codes and adds the
 * 4 products into one int32 lane; 16 lanes hold 16 output channels.
 *
 * Layouts (packed here from g and x in any strides, in the same threaded call):
 *   gp   int8  [N][CoT][Ho][Wo4][16][4]   g packed: 16 channels x 4 consecutive pixels of one row
 *                                          (CoT = ceil(Co/16), Wo4 = ceil(Wo/4), zeros outside)
 *   xph  uint8 [N][Ci][Hp][S][Wph]        x padded with 128 and split into S = stride_w phases,
 *                                          so that padded column S*ow + c is phase c % S, index
 *                                          ow + c / S: every tap reads 4 consecutive bytes.
 *   out  int64 [Co][Ci*KH*KW]             written (not accumulated).
 *
 * Overflow: |g * x| <= 128 * 255 < 2^15, so an int32 lane holds 2^16 products; images are
 * processed in chunks of at most 2^16 / (Ho * Wo4 * 4) and flushed to int64 after each.
 */
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "simd_quantize.h"

#define TILE_J 24 /* weight columns per register tile: 24 accumulators + g + broadcast */

int inttrain_has_vnni(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vnni");
}

typedef struct {
    const int8_t *g;    /* [N, Co, Ho, Wo] with strides gs; NULL when gf is given */
    const float *gf;    /* or the float gradient, quantized here (see inttrain_wgrad_f32) */
    const float *gscale; /* gf's scales: one per output channel, or one */
    int64_t gscale_per_channel, sr; /* sr: stochastic rounding with seed */
    uint32_t seed;
    float qmax;
    const uint8_t *x;   /* [N, Ci, H, W] with strides xs: q + 128, or q when x_signed */
    int64_t gs[4], xs[4];
    int8_t *gp;
    uint8_t *xph;
    int64_t *out, *gsum; /* gsum: this thread's [Co] partial */
    int64_t n, co, ci, kh, kw, h, w, pad_h, pad_w;
    int64_t ho, wo, wo4, hp, wph, stride_h, stride_w, dil_h, dil_w;
    int64_t vecs;     /* 16-channel groups per register tile: 1, or 2 when Co is a multiple of 32 */
    int64_t x_signed; /* x holds int8 codes q (not q + 128): flip the sign bit while packing */
    int64_t chunk; /* images per int32 flush */
    int64_t first_tile, last_tile, tiles_j, first_image, last_image;
} wgrad_job;

#define PACK_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))

/* The 16 codes of channels 16t .. 16t + 15 at pixel (n, oh, ow): int8 g read as it is, or float gf quantized
 * with the numerics of simd_quantize.h, the element index being that of the channels-last [N*Ho*Wo, Co]
 * matrix.  Channels past Co are 0. */
PACK_TARGET static inline __m128i pixel_codes(const wgrad_job *job, int64_t n, int64_t t, int64_t oh, int64_t ow) {
    const int64_t sn = job->gs[0], sc = job->gs[1], sh = job->gs[2], sw = job->gs[3];
    const int64_t at = n * sn + 16 * t * sc + oh * sh + ow * sw, live = job->co - 16 * t < 16 ? job->co - 16 * t : 16;
    if (!job->gf) {
        if (sc == 1 && live == 16) return _mm_loadu_si128((const void *)(job->g + at));
        int8_t b[16] = {0};
        for (int64_t l = 0; l < live; ++l) b[l] = job->g[at + l * sc];
        return _mm_loadu_si128((const void *)b);
    }
    __m512 v, s;
    if (sc == 1 && live == 16) {
        v = _mm512_loadu_ps(job->gf + at);
        s = job->gscale_per_channel ? _mm512_loadu_ps(job->gscale + 16 * t) : _mm512_set1_ps(job->gscale[0]);
    } else {
        float vb[16] = {0}, sb[16];
        for (int64_t l = 0; l < 16; ++l) {
            sb[l] = l < live && job->gscale_per_channel ? job->gscale[16 * t + l] : job->gscale[0];
            if (l < live) vb[l] = job->gf[at + l * sc];
        }
        v = _mm512_loadu_ps(vb), s = _mm512_loadu_ps(sb); /* v = 0 gives code 0 in either rounding */
    }
    const __m512 qmax = _mm512_set1_ps(job->qmax);
    if (!job->sr) return codes16(v, s, NULL, qmax);
    const uint32_t idx0 = (uint32_t)(((n * job->ho + oh) * job->wo + ow) * job->co + 16 * t);
    const __m512 u = uniform16(idx0, job->seed);
    return codes16(v, s, &u, qmax);
}

/* g (or gf) -> gp for images [first_image, last_image), and the codes' per-channel sums. */
PACK_TARGET static void pack_gradient(const wgrad_job *job) {
    const int64_t cot_n = (job->co + 15) / 16, row_bytes = job->wo4 * 64;
    /* 4 pixels x 16 channels -> 16 channels x 4 pixels: one dword permute (pixel-major -> channel-group-major)
       and one in-lane byte shuffle. */
    const __m512i dword_t = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    const __m512i ones = _mm512_set1_epi8(1);
    const __m512i byte_t = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15));
    for (int64_t n = job->first_image; n < job->last_image; ++n) {
        for (int64_t t = 0; t < cot_n; ++t) {
            /* The per-channel sum rides along: a dot product of each packed block with all-ones. */
            __m512i sums = _mm512_setzero_si512();
            int32_t lanes[16];
            for (int64_t oh = 0; oh < job->ho; ++oh) {
                int8_t *dst = job->gp + ((n * cot_n + t) * job->ho + oh) * row_bytes;
                for (int64_t q = 0; q < job->wo4; ++q, dst += 64) {
                    __m512i v = _mm512_setzero_si512();
                    v = _mm512_inserti32x4(v, pixel_codes(job, n, t, oh, 4 * q), 0);
                    if (4 * q + 1 < job->wo) v = _mm512_inserti32x4(v, pixel_codes(job, n, t, oh, 4 * q + 1), 1);
                    if (4 * q + 2 < job->wo) v = _mm512_inserti32x4(v, pixel_codes(job, n, t, oh, 4 * q + 2), 2);
                    if (4 * q + 3 < job->wo) v = _mm512_inserti32x4(v, pixel_codes(job, n, t, oh, 4 * q + 3), 3);
                    v = _mm512_shuffle_epi8(_mm512_permutexvar_epi32(dword_t, v), byte_t);
                    _mm512_storeu_si512((void *)dst, v);
                    sums = _mm512_dpbusd_epi32(sums, ones, v);
                }
            }
            _mm512_storeu_si512((void *)lanes, sums); /* |sum| <= 128 Ho Wo per image: no int32 overflow */
            for (int64_t l = 0; l < 16 && 16 * t + l < job->co; ++l) job->gsum[16 * t + l] += lanes[l];
        }
    }
}

/* 16 rows of 16 bytes -> their transpose (four rounds of interleaving). */
__attribute__((target("sse2"))) static void transpose16(__m128i r[16]) {
    __m128i t[16];
    for (int i = 0; i < 8; ++i) {
        t[i] = _mm_unpacklo_epi8(r[2 * i], r[2 * i + 1]);
        t[i + 8] = _mm_unpackhi_epi8(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; ++i) {
        r[i] = _mm_unpacklo_epi16(t[2 * i], t[2 * i + 1]);
        r[i + 4] = _mm_unpackhi_epi16(t[2 * i], t[2 * i + 1]);
        r[i + 8] = _mm_unpacklo_epi16(t[8 + 2 * i], t[8 + 2 * i + 1]);
        r[i + 12] = _mm_unpackhi_epi16(t[8 + 2 * i], t[8 + 2 * i + 1]);
    }
    for (int b = 0; b < 16; b += 4)
        for (int i = 0; i < 2; ++i) {
            t[b + i] = _mm_unpacklo_epi32(r[b + 2 * i], r[b + 2 * i + 1]);
            t[b + i + 2] = _mm_unpackhi_epi32(r[b + 2 * i], r[b + 2 * i + 1]);
        }
    /* t[4g + 2h + i]: columns 4g + 2h and 4g + 2h + 1, rows 8i..8i+7: pair the row halves */
    for (int c = 0; c < 16; c += 2) {
        r[c] = _mm_unpacklo_epi64(t[c], t[c + 1]);
        r[c + 1] = _mm_unpackhi_epi64(t[c], t[c + 1]);
    }
}

/* The first cnt bytes of v to dst (byte-masked stores are slow on some CPUs: fixed-size pieces). */
__attribute__((target("sse2"))) static inline void store_bytes(uint8_t *dst, __m128i v, int64_t cnt) {
    if (cnt == 16) {
        _mm_storeu_si128((void *)dst, v);
        return;
    }
    uint8_t tmp[16];
    _mm_storeu_si128((void *)tmp, v);
    int64_t k = 0;
    if (cnt >= 8) memcpy(dst, tmp, 8), k = 8;
    if (cnt - k >= 4) memcpy(dst + k, tmp + k, 4), k += 4;
    for (; k < cnt; ++k) dst[k] = tmp[k];
}

/* x -> xph (padded with 128, W split into stride_w phases) for images [first_image, last_image). */
__attribute__((target("ssse3"))) static void pack_input(const wgrad_job *job) {
    const int64_t s_w = job->stride_w, wph = job->wph, s_row = s_w * wph, s_ci = job->hp * s_row;
    /* channels-last x: 16 pixels x 16 channels at a time through a register transpose */
    const int blocked = job->xs[1] == 1 && job->ci % 16 == 0;
    const uint8_t flip_byte = job->x_signed ? 0x80 : 0;
    const __m128i flip = _mm_set1_epi8((char)flip_byte);
    const __m128i split = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    for (int64_t n = job->first_image; n < job->last_image; ++n) {
        uint8_t *img = job->xph + n * job->ci * s_ci;
        memset(img, 128, (size_t)(job->ci * s_ci));
        for (int64_t y = 0; y < job->h; ++y) {
            const uint8_t *src = job->x + n * job->xs[0] + y * job->xs[2];
            int64_t done = 0;
            if (blocked) {
                for (; done < job->w; done += 16 < job->w - done ? 16 : job->w - done) {
                    const int64_t cnt = job->w - done < 16 ? job->w - done : 16; /* a short last block */
                    for (int64_t c0 = 0; c0 < job->ci; c0 += 16) {
                        __m128i r[16];
                        for (int i = 0; i < 16; ++i)
                            r[i] = i < cnt ? _mm_xor_si128(flip, _mm_loadu_si128((const void *)(src + (done + i) * job->xs[3] + c0)))
                                           : _mm_setzero_si128();
                        transpose16(r);
                        for (int i = 0; i < 16; ++i) {
                            uint8_t *row = img + (c0 + i) * s_ci + (y + job->pad_h) * s_row;
                            if (s_w == 1) {
                                store_bytes(row + done + job->pad_w, r[i], cnt);
                                continue;
                            }
                            if (s_w == 2 && cnt == 16) { /* even-k bytes to one phase, odd-k to the other */
                                __m128i v = _mm_shuffle_epi8(r[i], split);
                                for (int64_t e = 0; e < 2; ++e) {
                                    int64_t col = done + job->pad_w + e;
                                    _mm_storel_epi64((void *)(row + (col % 2) * wph + col / 2),
                                                     e ? _mm_srli_si128(v, 8) : v);
                                }
                                continue;
                            }
                            uint8_t bytes[16];
                            _mm_storeu_si128((void *)bytes, r[i]);
                            for (int k = 0; k < cnt; ++k) {
                                int64_t col = done + k + job->pad_w;
                                row[(col % s_w) * wph + col / s_w] = bytes[k];
                            }
                        }
                    }
                }
            }
            if (done == job->w) continue;
            for (int64_t c = 0; c < job->ci; ++c) {
                uint8_t *row = img + c * s_ci + (y + job->pad_h) * s_row;
                const uint8_t *s = src + c * job->xs[1];
                for (int64_t phase = 0; phase < s_w; ++phase) {
                    /* input columns xx >= done with (xx + pad_w) % s_w == phase, at (xx + pad_w) / s_w */
                    int64_t first = done + ((phase - job->pad_w - done) % s_w + s_w) % s_w;
                    uint8_t *dst = row + phase * wph + (first + job->pad_w) / s_w;
                    for (int64_t xx = first; xx < job->w; xx += s_w) *dst++ = s[xx * job->xs[3]] ^ flip_byte;
                }
            }
        }
    }
}

/* One register tile: V groups of 16 channels from channel 16*V*grp, x columns [j0, j0 + nj) (nj <= J), over
 * images [n0, n1).  V = 2 spends each broadcast of x on two vpdpbusd (32 channels): fewer loads per multiply. */
#define WGRAD_TILE(NAME, V, J)                                                                              \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni"))) static void NAME(                                \
        const wgrad_job *job, int64_t grp, int64_t j0, int64_t nj, int64_t n0, int64_t n1, __m512i *result) { \
        const int64_t s_w = job->stride_w, wph = job->wph;                                                  \
        const int64_t s_row = s_w * wph, s_ci = job->hp * s_row, s_n = job->ci * s_ci;                     \
        const int64_t cot_n = (job->co + 15) / 16, row_bytes = job->wo4 * 64;                              \
        int64_t off[J];                                                                                     \
        for (int64_t t = 0; t < nj; ++t) {                                                                  \
            int64_t j = j0 + t, kk = job->kh * job->kw;                                                     \
            int64_t c = j / kk, r = j % kk, ky = r / job->kw, kx = r % job->kw;                             \
            int64_t col = kx * job->dil_w;                                                                  \
            off[t] = c * s_ci + ky * job->dil_h * s_row + (col % s_w) * wph + col / s_w;                    \
        }                                                                                                   \
        for (int64_t t = nj; t < (J); ++t) off[t] = off[0]; /* unused columns: any valid address */        \
        __m512i acc[(V) * (J)]; /* local, so the compiler keeps the tile in registers */                   \
        for (int t = 0; t < (V) * (J); ++t) acc[t] = _mm512_setzero_si512();                                \
        const int64_t next = job->ho * row_bytes; /* from one 16-channel group to the next */              \
        for (int64_t n = n0; n < n1; ++n) {                                                                 \
            const int8_t *g_img = job->gp + ((n * cot_n + (V) * grp) * job->ho) * row_bytes;                \
            const uint8_t *x_img = job->xph + n * s_n;                                                      \
            for (int64_t oh = 0; oh < job->ho; ++oh) {                                                      \
                const int8_t *g_row = g_img + oh * row_bytes;                                               \
                const uint8_t *x_row = x_img + oh * job->stride_h * s_row;                                  \
                for (int64_t q = 0; q < job->wo4; ++q) {                                                    \
                    __m512i g0 = _mm512_loadu_si512((const void *)(g_row + q * 64)), g1 = g0;              \
                    if ((V) == 2) g1 = _mm512_loadu_si512((const void *)(g_row + next + q * 64));          \
                    const uint8_t *xq = x_row + 4 * q;                                                      \
                    _Pragma("GCC unroll 24") for (int t = 0; t < (J); ++t) {                                \
                        int32_t four;                                                                       \
                        memcpy(&four, xq + off[t], 4);                                                      \
                        __m512i b = _mm512_set1_epi32(four);                                                \
                        acc[t] = _mm512_dpbusd_epi32(acc[t], b, g0);                                        \
                        if ((V) == 2) acc[(J) + t] = _mm512_dpbusd_epi32(acc[(J) + t], b, g1);              \
                    }                                                                                       \
                }                                                                                           \
            }                                                                                               \
        }                                                                                                   \
        for (int t = 0; t < (V) * (J); ++t) result[t] = acc[t];                                             \
    }

WGRAD_TILE(wgrad_tile_v1, 1, TILE_J)
WGRAD_TILE(wgrad_tile_v2, 2, TILE_J / 2)

static void *run_pack(void *arg) {
    pack_gradient((const wgrad_job *)arg);
    pack_input((const wgrad_job *)arg);
    return NULL;
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni"))) static void *run_tiles(void *arg) {
    const wgrad_job *job = (const wgrad_job *)arg;
    const int64_t columns = job->ci * job->kh * job->kw, width = TILE_J / job->vecs;
    __m512i acc[TILE_J];
    int32_t lanes[16];
    for (int64_t n0 = 0; n0 < job->n; n0 += job->chunk) {
        int64_t n1 = n0 + job->chunk < job->n ? n0 + job->chunk : job->n;
        for (int64_t tile = job->first_tile; tile < job->last_tile; ++tile) {
            int64_t grp = tile / job->tiles_j, j0 = (tile % job->tiles_j) * width;
            int64_t nj = columns - j0 < width ? columns - j0 : width;
            if (job->vecs == 2)
                wgrad_tile_v2(job, grp, j0, nj, n0, n1, acc);
            else
                wgrad_tile_v1(job, grp, j0, nj, n0, n1, acc);
            for (int64_t v = 0; v < job->vecs; ++v)
                for (int64_t t = 0; t < nj; ++t) {
                    const int64_t c0 = 16 * (job->vecs * grp + v);
                    _mm512_storeu_si512((void *)lanes, acc[v * width + t]);
                    for (int64_t l = 0; l < 16 && c0 + l < job->co; ++l) job->out[(c0 + l) * columns + j0 + t] += lanes[l];
                }
        }
    }
    return NULL;
}

#define MAX_THREADS 64

/* fn(jobs[t]) for every t, in parallel.  With OpenMP this is torch's own thread team: inside a torch process
 * libgomp.so.1 is the one torch loaded, whose threads are spinning right after the previous torch op; threads
 * of our own would compete with them for the cores (measured: 2.7 ms instead of 1.1 ms on 2 cores).  Without
 * OpenMP, pthreads, and a thread that cannot start has its share run here. */
static void parallel(void *(*fn)(void *), wgrad_job *jobs, int64_t threads) {
#ifdef _OPENMP
#pragma omp parallel for num_threads((int)threads) schedule(static, 1)
    for (int64_t t = 0; t < threads; ++t) fn(&jobs[t]);
#else
    pthread_t ids[MAX_THREADS];
    int started[MAX_THREADS] = {0};
    for (int64_t t = 1; t < threads; ++t) started[t] = pthread_create(&ids[t], NULL, fn, &jobs[t]) == 0;
    fn(&jobs[0]);
    for (int64_t t = 1; t < threads; ++t) {
        if (started[t])
            pthread_join(ids[t], NULL);
        else
            fn(&jobs[t]);
    }
#endif
}

/* The shared body of both entry points: base has the operands set; dims as documented below. */
static int run_wgrad(wgrad_job base, const int64_t *gs, const int64_t *xs, const int64_t *dims, int64_t threads) {
    if (!inttrain_has_vnni()) return 1;
    for (int i = 0; i < 4; ++i) base.gs[i] = gs[i], base.xs[i] = xs[i];
    base.n = dims[0], base.co = dims[1], base.ci = dims[2], base.kh = dims[3], base.kw = dims[4];
    base.h = dims[5], base.w = dims[6], base.ho = dims[7], base.wo = dims[8];
    base.pad_h = dims[9], base.pad_w = dims[10], base.stride_h = dims[11], base.stride_w = dims[12];
    base.dil_h = dims[13], base.dil_w = dims[14], base.wph = dims[15], base.x_signed = dims[16];
    base.wo4 = (base.wo + 3) / 4, base.hp = base.h + 2 * base.pad_h;
    int64_t pixels = base.ho * base.wo4 * 4;
    base.chunk = pixels > 0 && ((int64_t)1 << 16) / pixels > 0 ? ((int64_t)1 << 16) / pixels : 1;
    const int64_t columns = base.ci * base.kh * base.kw;
    base.vecs = base.co % 32 == 0 ? 2 : 1; /* 32-channel tiles where the channels fill them */
    base.tiles_j = (columns + TILE_J / base.vecs - 1) / (TILE_J / base.vecs);
    const int64_t tiles = ((base.co + 15) / 16 / base.vecs) * base.tiles_j;
    int64_t *out = base.out;
    memset(out, 0, sizeof(int64_t) * base.co * columns);
    if (threads < 1) threads = 1;
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    if (threads > tiles) threads = tiles;
    if (threads > base.n && base.n > 0) threads = base.n;
    int64_t *sums = calloc((size_t)(threads * base.co), sizeof(int64_t));
    if (!sums) return 2;
    wgrad_job jobs[MAX_THREADS];
    for (int64_t t = 0; t < threads; ++t) {
        jobs[t] = base;
        jobs[t].gsum = sums + t * base.co;
        jobs[t].first_tile = tiles * t / threads, jobs[t].last_tile = tiles * (t + 1) / threads;
        jobs[t].first_image = base.n * t / threads, jobs[t].last_image = base.n * (t + 1) / threads;
    }
    parallel(run_pack, jobs, threads);
    parallel(run_tiles, jobs, threads);
    /* x was read as q + 128 (padding too): remove 128 * sum(g) from every column of a channel. */
    for (int64_t c = 0; c < base.co; ++c) {
        int64_t total = 0;
        for (int64_t t = 0; t < threads; ++t) total += sums[t * base.co + c];
        for (int64_t j = 0; j < columns; ++j) out[c * columns + j] -= 128 * total;
    }
    free(sums);
    return 0;
}

/* dims: N, Co, Ci, KH, KW, H, W, Ho, Wo, pad_h, pad_w, stride_h, stride_w, dil_h, dil_w, wph, x_signed.
 * gp: int8 scratch of N * ceil(Co/16) * Ho * ceil(Wo/4) * 64 bytes; xph: uint8 scratch of
 * N * Ci * (H + 2 pad_h) * stride_w * wph bytes.  out: int64 [Co, Ci*KH*KW], the exact sums of g * q.
 * Returns 0 on success, 1 when the CPU lacks AVX512-VNNI, 2 when out of memory. */
int inttrain_wgrad_u8s8(const int8_t *g, const int64_t *gs, const void *x, const int64_t *xs, const int64_t *dims,
                        int8_t *gp, uint8_t *xph, int64_t *out, int64_t threads) {
    wgrad_job base;
    memset(&base, 0, sizeof base);
    base.g = g, base.x = x, base.gp = gp, base.xph = xph, base.out = out;
    return run_wgrad(base, gs, xs, dims, threads);
}

/* inttrain_wgrad_u8s8 on a float32 gradient gf [N, Co, Ho, Wo] (strides gs), quantized while it is packed:
 * code = clamp(round(gf / s), -qmax, qmax) with s = gscale[co] (per_channel) or gscale[0], rounding to nearest
 * even, or stochastic (sr) with seed (simd_quantize.h).  Saves the torch path's pass that writes the codes, and
 * its hash, which costs the compiled torch path more than the whole pack here.  qmax <= 127. */
int inttrain_wgrad_f32(const float *gf, const int64_t *gs, const float *gscale, int64_t per_channel, int64_t qmax,
                       int64_t sr, int64_t seed, const void *x, const int64_t *xs, const int64_t *dims, int8_t *gp,
                       uint8_t *xph, int64_t *out, int64_t threads) {
    wgrad_job base;
    memset(&base, 0, sizeof base);
    base.gf = gf, base.gscale = gscale, base.gscale_per_channel = per_channel, base.qmax = (float)qmax;
    base.sr = sr, base.seed = (uint32_t)seed;
    base.x = x, base.gp = gp, base.xph = xph, base.out = out;
    return run_wgrad(base, gs, xs, dims, threads);
}
