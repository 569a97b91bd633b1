/* Int8 convolution kernels on AVX512-VNNI: the weight gradient (this comment), and the forward convolution
 * (further down; the input gradient runs it as a sub-pixel convolution).
 *
 * Weight gradient: dW = sum over (n, oh, ow) of g * x.
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
#define _GNU_SOURCE /* syscall() (amx_tiles.h) under -std=c11 */
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "amx_tiles.h"
#include "padded_copy.h"
#include "simd_quantize.h"
#include "tile_pixels.h"

#define TILE_J 24 /* weight columns per register tile: 24 accumulators + g + broadcast */

int inttrain_has_vnni(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vnni");
}

static int amx_state = -1; /* -1: not checked yet (the check is idempotent, so a race only repeats it) */

/* 1 when the AMX weight gradient can run (AMX-INT8, tile permission, and the VNNI packers' AVX512). */
int inttrain_conv_amx_ready(void) {
    if (amx_state < 0) amx_state = amx_check();
    return amx_state && inttrain_has_vnni();
}

typedef struct {
    const int8_t *g;    /* [N, Co, Ho, Wo] with strides gs; NULL when gf is given */
    const float *gf;    /* or the float gradient, quantized here (see inttrain_wgrad_f32) */
    int64_t gf_bf16;    /* gf points at bfloat16 values (read as their exact float32 upcast) */
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
    int64_t kq;   /* AMX kernel: grid pixels per image, a multiple of 64 */
    int32_t *part; /* AMX kernel: this thread's int32 sums of the current chunk */
    int64_t *acc;  /* AMX kernel: this thread's int64 sums */
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
    const uint16_t *gb = (const uint16_t *)(const void *)job->gf; /* when gf_bf16 */
    if (sc == 1 && live == 16) {
        if (job->gf_bf16) /* bfloat16 -> float32: the 16 bits become the high half */
            v = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const void *)(gb + at))), 16));
        else
            v = _mm512_loadu_ps(job->gf + at);
        s = job->gscale_per_channel ? _mm512_loadu_ps(job->gscale + 16 * t) : _mm512_set1_ps(job->gscale[0]);
    } else {
        float vb[16] = {0}, sb[16];
        for (int64_t l = 0; l < 16; ++l) {
            sb[l] = l < live && job->gscale_per_channel ? job->gscale[16 * t + l] : job->gscale[0];
            if (l < live && job->gf_bf16) {
                const uint32_t bits = (uint32_t)gb[at + l * sc] << 16;
                memcpy(&vb[l], &bits, 4);
            } else if (l < live) {
                vb[l] = job->gf[at + l * sc];
            }
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
/* The job's sizes and strides from the entry points' arguments (dims as documented below). */
static void setup_wgrad(wgrad_job *base, const int64_t *gs, const int64_t *xs, const int64_t *dims) {
    for (int i = 0; i < 4; ++i) base->gs[i] = gs[i], base->xs[i] = xs[i];
    base->n = dims[0], base->co = dims[1], base->ci = dims[2], base->kh = dims[3], base->kw = dims[4];
    base->h = dims[5], base->w = dims[6], base->ho = dims[7], base->wo = dims[8];
    base->pad_h = dims[9], base->pad_w = dims[10], base->stride_h = dims[11], base->stride_w = dims[12];
    base->dil_h = dims[13], base->dil_w = dims[14], base->wph = dims[15], base->x_signed = dims[16];
    base->wo4 = (base->wo + 3) / 4, base->hp = base->h + 2 * base->pad_h;
}

static int run_wgrad(wgrad_job base, const int64_t *gs, const int64_t *xs, const int64_t *dims, int64_t threads) {
    if (!inttrain_has_vnni()) return 1;
    setup_wgrad(&base, gs, xs, dims);
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

/* The operands of the int8-gradient entry points. */
static wgrad_job code_job(const int8_t *g, const void *x, int8_t *gp, uint8_t *xph, int64_t *out) {
    wgrad_job base;
    memset(&base, 0, sizeof base);
    base.g = g, base.x = x, base.gp = gp, base.xph = xph, base.out = out;
    return base;
}

/* The operands of the float-gradient entry points (the gradient quantized while it is packed). */
static wgrad_job float_job(const float *gf, const float *gscale, int64_t per_channel, int64_t qmax, int64_t sr,
                           int64_t seed, const void *x, int8_t *gp, uint8_t *xph, int64_t *out) {
    wgrad_job base;
    memset(&base, 0, sizeof base);
    /* per_channel bit 1: gf holds bfloat16 values (bit 0: one scale per output channel) */
    base.gf = gf, base.gscale = gscale, base.gscale_per_channel = per_channel & 1, base.qmax = (float)qmax;
    base.gf_bf16 = (per_channel >> 1) & 1;
    base.sr = sr, base.seed = (uint32_t)seed;
    base.x = x, base.gp = gp, base.xph = xph, base.out = out;
    return base;
}

/* dims: N, Co, Ci, KH, KW, H, W, Ho, Wo, pad_h, pad_w, stride_h, stride_w, dil_h, dil_w, wph, x_signed.
 * gp: int8 scratch of N * ceil(Co/16) * Ho * ceil(Wo/4) * 64 bytes; xph: uint8 scratch of
 * N * Ci * (H + 2 pad_h) * stride_w * wph bytes.  out: int64 [Co, Ci*KH*KW], the exact sums of g * q.
 * Returns 0 on success, 1 when the CPU lacks AVX512-VNNI, 2 when out of memory. */
int inttrain_wgrad_u8s8(const int8_t *g, const int64_t *gs, const void *x, const int64_t *xs, const int64_t *dims,
                        int8_t *gp, uint8_t *xph, int64_t *out, int64_t threads) {
    return run_wgrad(code_job(g, x, gp, xph, out), gs, xs, dims, threads);
}

/* inttrain_wgrad_u8s8 on a float32 gradient gf [N, Co, Ho, Wo] (strides gs), quantized while it is packed:
 * code = clamp(round(gf / s), -qmax, qmax) with s = gscale[co] (per_channel) or gscale[0], rounding to nearest
 * even, or stochastic (sr) with seed (simd_quantize.h); per_channel | 2: gf holds bfloat16 values (read as their
 * float32 upcast, exactly).  Saves the torch path's pass that writes the codes, and
 * its hash, which costs the compiled torch path more than the whole pack here.  qmax <= 127. */
int inttrain_wgrad_f32(const float *gf, const int64_t *gs, const float *gscale, int64_t per_channel, int64_t qmax,
                       int64_t sr, int64_t seed, const void *x, const int64_t *xs, const int64_t *dims, int8_t *gp,
                       uint8_t *xph, int64_t *out, int64_t threads) {
    return run_wgrad(float_job(gf, gscale, per_channel, qmax, sr, seed, x, gp, xph, out), gs, xs, dims, threads);
}

/* ---------------------------------------------------------------------------------------------------------
 * The same weight gradient on AMX tiles (stride 1, Ci a multiple of 16), for CPUs whose bf16 convolutions
 * run on AMX: there the VNNI kernel above is ~3x slower than bf16's weight gradient.
 *
 * The reduction runs over "grid" pixels q = oh * wph + ow of each image (the layout of pack_input's xph
 * rows): for tap (kh, kw), grid pixel q reads xph[ci][q + kh dh wph + kw dw], so 64 consecutive grid pixels
 * of one input channel are 64 consecutive bytes.  An A tile is 16 input channels (rows, at xph's channel
 * stride) x 64 grid pixels, read in place; a B tile is the gradient codes of the same 64 grid pixels x 16
 * output channels in VNNI order, packed here with zeros wherever ow >= Wo or oh >= Ho: the extra pixels an A
 * tile reads (the right border, and up to 63 past the last row) meet zero codes.  A C tile accumulates 16
 * input channels x 16 output channels of one tap: rows r = tap * (Ci / 16) + ci / 16 of an int32 matrix
 * part[16 R][16 CoT] that is flushed to int64 every chunk of images (2^16 products per int32 sum at most).
 *
 * Each thread packs and reduces its own images, so there is no barrier between packing and compute, and
 * the packed images are still in cache when the tiles read them; the threads' int64 sums are added at the
 * end.  Layout of gp here: [N][CoT][kq / 4][16][4], kq = Ho * wph rounded up to 64. */

/* Bytes of packed codes a weight-gradient chunk may hold: a quarter of a 2 MB L2, room for the sources. */
#define WGRAD_L2_BUDGET ((int64_t)512 * 1024)

#define AMX_TARGET __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx512vnni")))

/* Grid-layout gradient codes for images [first_image, last_image), and their per-channel sums. */
PACK_TARGET static void pack_gradient_grid(const wgrad_job *job) {
    const int64_t cot_n = (job->co + 15) / 16, kq = job->kq, grid = job->ho * job->wph;
    const __m512i dword_t = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    const __m512i ones = _mm512_set1_epi8(1);
    const __m512i byte_t = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15));
    for (int64_t n = job->first_image; n < job->last_image; ++n)
        for (int64_t t = 0; t < cot_n; ++t) {
            __m512i sums = _mm512_setzero_si512();
            int32_t lanes[16];
            int8_t *dst = job->gp + (n * cot_n + t) * kq * 16;
            int64_t oh = 0, ow = 0; /* grid pixel q = oh * wph + ow, walked along (no division per pixel) */
            for (int64_t q0 = 0; q0 < kq; q0 += 4, dst += 64) {
                __m512i v = _mm512_setzero_si512();
                for (int i = 0; i < 4; ++i) {
                    const int live = q0 + i < grid && ow < job->wo;
                    if (live) {
                        const __m128i c = pixel_codes(job, n, t, oh, ow);
                        v = i == 0 ? _mm512_inserti32x4(v, c, 0) : i == 1 ? _mm512_inserti32x4(v, c, 1)
                          : i == 2 ? _mm512_inserti32x4(v, c, 2) : _mm512_inserti32x4(v, c, 3);
                    }
                    if (++ow == job->wph) ow = 0, ++oh;
                }
                v = _mm512_shuffle_epi8(_mm512_permutexvar_epi32(dword_t, v), byte_t);
                _mm512_storeu_si512((void *)dst, v);
                sums = _mm512_dpbusd_epi32(sums, ones, v);
            }
            _mm512_storeu_si512((void *)lanes, sums);
            for (int64_t l = 0; l < 16 && 16 * t + l < job->co; ++l) job->gsum[16 * t + l] += lanes[l];
        }
}

/* OP (load or store) on a block's accumulator tiles 0-3 in part (c: its first cell, ldc: part's row length). */
#define WGRAD_C_TILES(OP, MR, NC)         \
    do {                                  \
        if ((NC) == 2) {                  \
            OP(0, c, ld);                 \
            OP(1, c + 16, ld);            \
            OP(2, c + 16 * ldc, ld);      \
            OP(3, c + 16 * ldc + 16, ld); \
        } else {                          \
            OP(0, c, ld);                 \
            if ((MR) == 4) {              \
                OP(1, c + 16 * ldc, ld);  \
                OP(2, c + 32 * ldc, ld);  \
                OP(3, c + 48 * ldc, ld);  \
            }                             \
        }                                 \
    } while (0)

/* Accumulator tiles for rows r0 .. r0 + MR - 1 x output-channel tiles c0 .. c0 + NC - 1 (MR * NC <= 4; C tiles
 * 0-3, A tiles 4-5, B tiles 6-7) over images [n0, n1): loaded from part, summed, stored back. */
#define WGRAD_AMX_BLOCK(NAME, MR, NC)                                                                          \
    AMX_TARGET static void NAME(const wgrad_job *job, const int64_t *aoff, int64_t r0, int64_t c0, int64_t n0,  \
                                int64_t n1, int32_t *part, int64_t ldc) {                                       \
        const int64_t s_ci = job->hp * job->wph, s_n = job->ci * s_ci, kq = job->kq, panel = kq * 16;          \
        const int64_t cot_n = (job->co + 15) / 16, ld = ldc * 4;                                               \
        int32_t *c = part + 16 * r0 * ldc + 16 * c0;                                                           \
        WGRAD_C_TILES(_tile_loadd, MR, NC);                                                                    \
        for (int64_t n = n0; n < n1; ++n) {                                                                    \
            const uint8_t *x = job->xph + n * s_n;                                                             \
            const int8_t *g = job->gp + (n * cot_n + c0) * panel;                                              \
            for (int64_t k0 = 0; k0 < kq; k0 += 64) {                                                          \
                /* each load right after the last multiply that reads its register's old contents: tile     \
                   registers are not renamed, so the load waits for that multiply only, not the next ones */  \
                if ((NC) == 2) {                                                                               \
                    _tile_loadd(4, x + aoff[r0] + k0, s_ci);                                                   \
                    _tile_loadd(6, g + 16 * k0, 64);                                                           \
                    _tile_dpbusd(0, 4, 6);                                                                     \
                    _tile_loadd(7, g + panel + 16 * k0, 64);                                                   \
                    _tile_dpbusd(1, 4, 7);                                                                     \
                    _tile_loadd(5, x + aoff[r0 + 1] + k0, s_ci);                                               \
                    _tile_dpbusd(2, 5, 6);                                                                     \
                    _tile_dpbusd(3, 5, 7);                                                                     \
                } else if ((MR) == 4) {                                                                        \
                    _tile_loadd(6, g + 16 * k0, 64);                                                           \
                    _tile_loadd(4, x + aoff[r0] + k0, s_ci);                                                   \
                    _tile_dpbusd(0, 4, 6);                                                                     \
                    _tile_loadd(5, x + aoff[r0 + 1] + k0, s_ci);                                               \
                    _tile_dpbusd(1, 5, 6);                                                                     \
                    _tile_loadd(4, x + aoff[r0 + 2] + k0, s_ci);                                               \
                    _tile_dpbusd(2, 4, 6);                                                                     \
                    _tile_loadd(5, x + aoff[r0 + 3] + k0, s_ci);                                               \
                    _tile_dpbusd(3, 5, 6);                                                                     \
                } else {                                                                                       \
                    _tile_loadd(6, g + 16 * k0, 64);                                                           \
                    _tile_loadd(4, x + aoff[r0] + k0, s_ci);                                                   \
                    _tile_dpbusd(0, 4, 6);                                                                     \
                }                                                                                              \
            }                                                                                                  \
        }                                                                                                      \
        WGRAD_C_TILES(_tile_stored, MR, NC);                                                                   \
    }

WGRAD_AMX_BLOCK(wgrad_amx_2x2, 2, 2)
WGRAD_AMX_BLOCK(wgrad_amx_4x1, 4, 1)
WGRAD_AMX_BLOCK(wgrad_amx_1x1, 1, 1)

/* Every accumulator tile of part over images [n0, n1): 2 x 2 blocks where two output-channel tiles pair up,
 * 4 x 1 blocks down the rest, single tiles for the last rows. */
AMX_TARGET static void wgrad_amx_blocks(const wgrad_job *job, const int64_t *aoff, int64_t rows, int64_t n0,
                                        int64_t n1, int32_t *part, int64_t ldc) {
    const int64_t cot_n = (job->co + 15) / 16, paired = cot_n / 2 * 2;
    for (int64_t c0 = 0; c0 < paired; c0 += 2) {
        int64_t r0 = 0;
        for (; r0 + 2 <= rows; r0 += 2) wgrad_amx_2x2(job, aoff, r0, c0, n0, n1, part, ldc);
        for (; r0 < rows; ++r0)
            for (int64_t c = c0; c < c0 + 2; ++c) wgrad_amx_1x1(job, aoff, r0, c, n0, n1, part, ldc);
    }
    for (int64_t c0 = paired; c0 < cot_n; ++c0) {
        int64_t r0 = 0;
        for (; r0 + 4 <= rows; r0 += 4) wgrad_amx_4x1(job, aoff, r0, c0, n0, n1, part, ldc);
        for (; r0 < rows; ++r0) wgrad_amx_1x1(job, aoff, r0, c0, n0, n1, part, ldc);
    }
}

/* One thread: pack and reduce images [first_image, last_image) in chunks, into its int64 sums job->acc. */
AMX_TARGET static void *run_amx_images(void *arg) {
    const wgrad_job *job = (const wgrad_job *)arg;
    const int64_t cit = job->ci / 16, taps = job->kh * job->kw, rows = taps * cit, ldc = 16 * ((job->co + 15) / 16);
    const int64_t s_ci = job->hp * job->wph, cells = 16 * rows * ldc;
    int64_t aoff[rows];
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t tap = r / cit, ky = tap / job->kw, kx = tap % job->kw;
        aoff[r] = 16 * (r % cit) * s_ci + ky * job->dil_h * job->wph + kx * job->dil_w;
    }
    amx_configure_16x64();
    for (int64_t n0 = job->first_image; n0 < job->last_image; n0 += job->chunk) {
        wgrad_job part = *job; /* this chunk's images */
        part.first_image = n0;
        part.last_image = n0 + job->chunk < job->last_image ? n0 + job->chunk : job->last_image;
        pack_gradient_grid(&part);
        pack_input(&part);
        memset(job->part, 0, sizeof(int32_t) * (size_t)cells);
        wgrad_amx_blocks(job, aoff, rows, part.first_image, part.last_image, job->part, ldc);
        for (int64_t i = 0; i < cells; ++i) job->acc[i] += job->part[i];
    }
    _tile_release();
    return NULL;
}

/* inttrain_wgrad_amx_* share this: base has the operands set; dims as for inttrain_wgrad_u8s8. */
static int run_wgrad_amx(wgrad_job base, const int64_t *gs, const int64_t *xs, const int64_t *dims, int64_t threads) {
    if (!inttrain_conv_amx_ready()) return 1;
    setup_wgrad(&base, gs, xs, dims);
    if (base.stride_h != 1 || base.stride_w != 1 || base.ci % 16 != 0) return 3;
    base.kq = (base.ho * base.wph + 63) / 64 * 64;
    /* Images per chunk: each chunk's packed codes stay in L2 while every accumulator block streams them (with
       all images in one chunk, a 32-channel layer's 2.6 MB of packed codes were streamed from L3 once per
       block), and at most 2^16 / kq images keep the int32 sums exact. */
    const int64_t image_bytes = base.ci * base.hp * base.wph + ((base.co + 15) / 16) * base.kq * 16;
    const int64_t exact = ((int64_t)1 << 16) / base.kq > 0 ? ((int64_t)1 << 16) / base.kq : 1;
    const int64_t cached = WGRAD_L2_BUDGET / image_bytes > 0 ? WGRAD_L2_BUDGET / image_bytes : 1;
    base.chunk = exact < cached ? exact : cached;
    const int64_t taps = base.kh * base.kw, columns = base.ci * taps, rows = taps * (base.ci / 16);
    const int64_t ldc = 16 * ((base.co + 15) / 16), cells = 16 * rows * ldc;
    if (threads < 1) threads = 1;
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    if (threads > base.n && base.n > 0) threads = base.n;
    int64_t *sums = calloc((size_t)(threads * base.co), sizeof(int64_t));
    int64_t *acc = calloc((size_t)(threads * cells), sizeof(int64_t));
    int32_t *part = malloc(sizeof(int32_t) * (size_t)(threads * cells));
    if (!sums || !acc || !part) {
        free(sums), free(acc), free(part);
        return 2;
    }
    wgrad_job jobs[MAX_THREADS];
    for (int64_t t = 0; t < threads; ++t) {
        jobs[t] = base;
        jobs[t].gsum = sums + t * base.co, jobs[t].acc = acc + t * cells, jobs[t].part = part + t * cells;
        jobs[t].first_image = base.n * t / threads, jobs[t].last_image = base.n * (t + 1) / threads;
    }
    parallel(run_amx_images, jobs, threads);
    /* out[co][ci * taps + tap] = the threads' sums of row 16 r + ci % 16 (r = tap * Ci / 16 + ci / 16), column co,
       less 128 * sum(g[co]) (x was read as q + 128) */
    for (int64_t c = 0; c < base.co; ++c) {
        int64_t total = 0;
        for (int64_t t = 0; t < threads; ++t) total += sums[t * base.co + c];
        for (int64_t ci = 0; ci < base.ci; ++ci)
            for (int64_t tap = 0; tap < taps; ++tap) {
                const int64_t cell = (16 * (tap * (base.ci / 16) + ci / 16) + ci % 16) * ldc + c;
                int64_t v = -128 * total;
                for (int64_t t = 0; t < threads; ++t) v += acc[t * cells + cell];
                base.out[c * columns + ci * taps + tap] = v;
            }
    }
    free(sums), free(acc), free(part);
    return 0;
}

/* The scratch sizes of the AMX entry points (dims as below): out[0] = gp bytes, out[1] = xph bytes (the
 * padded planes of pack_input, plus the 64 + dil_w (KW - 1) bytes the last tiles read past them). */
void inttrain_wgrad_amx_scratch(const int64_t *dims, int64_t *out) {
    const int64_t n = dims[0], co = dims[1], ci = dims[2], kw = dims[4], h = dims[5], ho = dims[7];
    const int64_t wph = dims[15], kq = (ho * wph + 63) / 64 * 64;
    out[0] = n * ((co + 15) / 16) * kq * 16;
    out[1] = n * ci * (h + 2 * dims[9]) * wph + 64 + dims[14] * (kw - 1);
}

/* inttrain_wgrad_u8s8 and inttrain_wgrad_f32 on AMX tiles: same arguments, scratch sizes from
 * inttrain_wgrad_amx_scratch.  Returns 0, 1 without AMX, 2 when out of memory, 3 when stride != 1 or
 * Ci % 16 != 0 (use the VNNI kernel). */
int inttrain_wgrad_u8s8_amx(const int8_t *g, const int64_t *gs, const void *x, const int64_t *xs,
                            const int64_t *dims, int8_t *gp, uint8_t *xph, int64_t *out, int64_t threads) {
    return run_wgrad_amx(code_job(g, x, gp, xph, out), gs, xs, dims, threads);
}

int inttrain_wgrad_f32_amx(const float *gf, const int64_t *gs, const float *gscale, int64_t per_channel,
                           int64_t qmax, int64_t sr, int64_t seed, const void *x, const int64_t *xs,
                           const int64_t *dims, int8_t *gp, uint8_t *xph, int64_t *out, int64_t threads) {
    return run_wgrad_amx(float_job(gf, gscale, per_channel, qmax, sr, seed, x, gp, xph, out), gs, xs, dims, threads);
}

/* ---------------------------------------------------------------------------------------------------------
 * Int8 convolution forward (also the input gradient: kernels/conv.py runs it as a stride-1 sub-pixel
 * convolution), implicit GEMM on AVX512-VNNI, exact:
 *
 *   y[m][co] = scale[co] * (sum_{tap, ci} xu8[pixel(m) + tap][ci] * w[co][ci][tap] - 128 * wsum[co])
 *
 * Why native: oneDNN's int8 convolution needs its weights reordered by qconv_prepack, single-threaded and
 * ~8 ns per weight element, on every call -- and training changes the weights every step (41 prepacks per
 * ResNet-20 step: ~9 ms of ~125).  Here the weights are packed in the same call in microseconds.
 *
 * m runs over the flattened output pixels (n, oh, ow); x is read from a copy padded with 128 (= code 0),
 * so every tap of every pixel is an in-bounds load at base(m) + offset(tap) and the 128 correction is the
 * same for all pixels.  A register tile holds P pixels x V*16 output channels; each step broadcasts 4
 * consecutive input-channel bytes of one pixel and multiplies them by 4 x 16 packed weights (vpdpbusd).
 *
 * Layouts: xp uint8 [N][Hp][Wp][Ci] (channels-last, padded; Ci % 4 == 0); wp int8 [CoT][KH*KW][Ci/4][16][4];
 * out float32 [N*Ho*Wo][Co] (channels-last), each value float32(sum) * float32(x_scale * w_scale[co]) in float32
 * arithmetic: the sum rounded to float32 (exact below 2^24), the scale product rounded once from double.  That
 * is within an ulp of the int64 reference's one rounding of sum * scale in double, and 2-3x cheaper in the
 * epilogue than converting through double (a 16x16 tile: ~20% of a 16-channel layer's time).  |x * w| <=
 * 255 * 128, so int32 lanes hold reductions of up to 65793 terms (the caller checks Ci*KH*KW).
 */

typedef struct {
    const uint8_t *xp;
    const int8_t *wp;
    const int32_t *corr; /* [CoT*16]: 128 * wsum */
    const float *scale; /* [CoT*16]: x_scale * w_scale[co], rounded once to float32 */
    float *out;
    int64_t total, co, ci4, taps, kw, hp, wp_w, ho, wo, sh, sw, dh, dw, ci;
} fwd_job;

#define FWD_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))

#define FWD_TILE(NAME, V, P)                                                                                     \
    FWD_TARGET static void NAME(const fwd_job *j, int64_t m0, int64_t cot0) {                                 \
        const uint8_t *base[P];                                                                                  \
        int64_t at[P];                                                                                           \
        tile_pixel_offsets(m0, (P), j->total, j->ho, j->wo, j->hp, j->wp_w, j->sh, j->sw, j->ci, at);           \
        for (int p = 0; p < (P); ++p) base[p] = j->xp + at[p];                                                   \
        __m512i acc[V][P];                                                                                       \
        for (int v = 0; v < (V); ++v)                                                                            \
            for (int p = 0; p < (P); ++p) acc[v][p] = _mm512_setzero_si512();                                    \
        const int64_t cot_stride = j->taps * j->ci4 * 64;                                                        \
        for (int64_t t = 0; t < j->taps; ++t) {                                                                  \
            const int64_t off = ((t / j->kw) * j->dh * j->wp_w + (t % j->kw) * j->dw) * j->ci;                   \
            const int8_t *wt = j->wp + cot0 * cot_stride + t * j->ci4 * 64;                                      \
            for (int64_t c = 0; c < j->ci4; ++c) {                                                               \
                __m512i w[V];                                                                                    \
                for (int v = 0; v < (V); ++v) w[v] = _mm512_loadu_si512((const void *)(wt + v * cot_stride + 64 * c)); \
                for (int p = 0; p < (P); ++p) {                                                                  \
                    int32_t four;                                                                                \
                    memcpy(&four, base[p] + off + 4 * c, 4);                                                     \
                    const __m512i xb = _mm512_set1_epi32(four);                                                  \
                    for (int v = 0; v < (V); ++v) acc[v][p] = _mm512_dpbusd_epi32(acc[v][p], xb, w[v]);          \
                }                                                                                                \
            }                                                                                                    \
        }                                                                                                        \
        for (int v = 0; v < (V); ++v) {                                                                          \
            const int64_t c0 = 16 * (cot0 + v);                                                                  \
            const int64_t live = j->co - c0 < 16 ? j->co - c0 : 16;                                              \
            const __mmask16 mask = (__mmask16)((1u << live) - 1u);                                               \
            const __m512i corr = _mm512_loadu_si512((const void *)(j->corr + c0));                               \
            const __m512 sc = _mm512_loadu_ps(j->scale + c0);                                                    \
            for (int p = 0; p < (P) && m0 + p < j->total; ++p) {                                                 \
                const __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc[v][p], corr)), sc);       \
                _mm512_mask_storeu_ps(j->out + (m0 + p) * j->co + c0, mask, f);                                  \
            }                                                                                                    \
        }                                                                                                        \
    }

FWD_TILE(fwd_tile_v1, 1, 16)
FWD_TILE(fwd_tile_v2, 2, 12)
FWD_TILE(fwd_tile_v4, 4, 6)

/* Row width (dwords) of the lane kernel's repacked input: the padded row, and the last 16-pixel block's reach. */
int64_t inttrain_conv_lane_width(int64_t w, int64_t pad_w, int64_t wo, int64_t kw, int64_t dil_w) {
    const int64_t padded = w + 2 * pad_w, reach = 16 * ((wo + 15) / 16) + dil_w * (kw - 1);
    return padded > reach ? padded : reach;
}

/* Few output channels (Co <= 16), stride 1: the tile above would broadcast every input byte quad for a single
 * multiply (load-bound).  Here the lanes are 16 consecutive output pixels of a row instead: one load of 16
 * pixels x 4 channels feeds 16 multiplies, one per output channel, each with its 4 weight bytes broadcast from
 * memory.  x is repacked to xt int32 [N][Hp][Ci/4][Wt] (4 channel bytes of a padded pixel per dword, padding
 * 0x80808080), so each tap of a row of pixels is one unaligned 64-byte load; the 16 x 16 result is transposed
 * back to channels-last in registers. */

typedef struct {
    const int32_t *xt;
    const int32_t *wb;  /* [taps][Ci/4][16]: w[co][4 c4 .. 4 c4 + 3][tap], zero past Co */
    const int32_t *corr;
    const float *scale;
    float *out;
    int64_t co, ci4, taps, kw, hp, wt, ho, wo, dh, dw;
} lane_job;

FWD_TARGET static inline void transpose16x16_ps(__m512 r[16]) {
    __m512 t[16], u[16];
    for (int k = 0; k < 8; ++k) {
        t[2 * k] = _mm512_unpacklo_ps(r[2 * k], r[2 * k + 1]);
        t[2 * k + 1] = _mm512_unpackhi_ps(r[2 * k], r[2 * k + 1]);
    }
    for (int m = 0; m < 4; ++m) { /* u[4m + c], lane L: column 4L + c of rows 4m .. 4m + 3 */
        u[4 * m] = _mm512_shuffle_ps(t[4 * m], t[4 * m + 2], 0x44);
        u[4 * m + 1] = _mm512_shuffle_ps(t[4 * m], t[4 * m + 2], 0xEE);
        u[4 * m + 2] = _mm512_shuffle_ps(t[4 * m + 1], t[4 * m + 3], 0x44);
        u[4 * m + 3] = _mm512_shuffle_ps(t[4 * m + 1], t[4 * m + 3], 0xEE);
    }
    for (int c = 0; c < 4; ++c) { /* a 4 x 4 transpose of 128-bit lanes among u[c], u[4 + c], u[8 + c], u[12 + c] */
        const __m512 p = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x88), q = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xDD);
        const __m512 rr = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x88);
        const __m512 s = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xDD);
        r[c] = _mm512_shuffle_f32x4(p, rr, 0x88), r[4 + c] = _mm512_shuffle_f32x4(q, s, 0x88);
        r[8 + c] = _mm512_shuffle_f32x4(p, rr, 0xDD), r[12 + c] = _mm512_shuffle_f32x4(q, s, 0xDD);
    }
}

FWD_TARGET static void lane_tile(const lane_job *j, int64_t row, int64_t block) {
    const int64_t img = row / j->ho, oh = row % j->ho, ow0 = 16 * block;
    __m512i acc[16];
    for (int c = 0; c < 16; ++c) acc[c] = _mm512_setzero_si512();
    for (int64_t t = 0; t < j->taps; ++t) {
        const int32_t *src = j->xt + ((img * j->hp + oh + (t / j->kw) * j->dh) * j->ci4) * j->wt + ow0 + (t % j->kw) * j->dw;
        const int32_t *wv = j->wb + t * j->ci4 * 16;
        for (int64_t c4 = 0; c4 < j->ci4; ++c4, src += j->wt, wv += 16) {
            const __m512i xv = _mm512_loadu_si512((const void *)src);
            for (int c = 0; c < 16; ++c) acc[c] = _mm512_dpbusd_epi32(acc[c], xv, _mm512_set1_epi32(wv[c]));
        }
    }
    __m512 f[16];
    for (int c = 0; c < 16; ++c) {
        const __m512i s = _mm512_sub_epi32(acc[c], _mm512_set1_epi32(j->corr[c]));
        f[c] = _mm512_mul_ps(_mm512_cvtepi32_ps(s), _mm512_set1_ps(j->scale[c]));
    }
    transpose16x16_ps(f); /* f[p]: the 16 channels of pixel ow0 + p */
    const __mmask16 mask = (__mmask16)((1u << j->co) - 1u);
    float *dst = j->out + (row * j->wo + ow0) * j->co;
    for (int64_t p = 0; p < 16 && ow0 + p < j->wo; ++p) _mm512_mask_storeu_ps(dst + p * j->co, mask, f[p]);
}

/* One channels-last row of wd pixels -> dst[c4][xc] (row stride wt): a 16-pixel gather per channel quad. */
FWD_TARGET static void repack_row(const uint8_t *src, int64_t wd, int64_t ci4, int32_t *dst, int64_t wt) {
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i fill = _mm512_set1_epi32((int32_t)0x80808080u);
    const __m512i quad_major = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    for (int64_t xc0 = 0; xc0 < wd; xc0 += 16) {
        const int64_t live = wd - xc0 < 16 ? wd - xc0 : 16;
        if (ci4 == 4 && live == 16) { /* 16 channels: a 16 x 4 dword transpose in registers (no gathers) */
            __m512i b[4];
            for (int k = 0; k < 4; ++k) /* pixels 4k .. 4k + 3 -> 128-bit lane c4: their quads c4 */
                b[k] = _mm512_permutexvar_epi32(quad_major, _mm512_loadu_si512((const void *)(src + (xc0 + 4 * k) * 16)));
            const __m512i t0 = _mm512_shuffle_i32x4(b[0], b[1], 0x44), t1 = _mm512_shuffle_i32x4(b[0], b[1], 0xEE);
            const __m512i t2 = _mm512_shuffle_i32x4(b[2], b[3], 0x44), t3 = _mm512_shuffle_i32x4(b[2], b[3], 0xEE);
            _mm512_storeu_si512((void *)(dst + xc0), _mm512_shuffle_i32x4(t0, t2, 0x88));
            _mm512_storeu_si512((void *)(dst + wt + xc0), _mm512_shuffle_i32x4(t0, t2, 0xDD));
            _mm512_storeu_si512((void *)(dst + 2 * wt + xc0), _mm512_shuffle_i32x4(t1, t3, 0x88));
            _mm512_storeu_si512((void *)(dst + 3 * wt + xc0), _mm512_shuffle_i32x4(t1, t3, 0xDD));
            continue;
        }
        const __mmask16 mask = (__mmask16)((1u << live) - 1u);
        const __m512i idx = _mm512_mullo_epi32(_mm512_add_epi32(_mm512_set1_epi32((int32_t)xc0), lane),
                                               _mm512_set1_epi32((int32_t)ci4));
        for (int64_t c4 = 0; c4 < ci4; ++c4) {
            const __m512i v = _mm512_mask_i32gather_epi32(fill, mask, _mm512_add_epi32(idx, _mm512_set1_epi32((int32_t)c4)),
                                                          (const void *)src, 4);
            _mm512_mask_storeu_epi32(dst + c4 * wt + xc0, mask, v);
        }
    }
}

static void conv_fwd_lanes(const uint8_t *x, const int8_t *wp, const int32_t *corr, const float *scale,
                           const int64_t *dims, int32_t *xt, float *out, int64_t threads) {
    const int64_t n = dims[0], ci = dims[1], h = dims[2], wd = dims[3], co = dims[4], kh = dims[5], kw = dims[6];
    const int64_t ho = dims[7], wo = dims[8], ph = dims[9], pw = dims[10], dh = dims[13], dw = dims[14];
    const int64_t ci4 = ci / 4, taps = kh * kw, hp = h + 2 * ph, blocks = (wo + 15) / 16;
    const int64_t wt = inttrain_conv_lane_width(wd, pw, wo, kw, dw);
#ifdef _OPENMP
#pragma omp parallel for num_threads((int)threads) schedule(static)
#endif
    for (int64_t r = 0; r < n * hp; ++r) { /* repack: padded pixel (y, xc) channels 4 c4 .. -> xt[r][c4][xc] */
        const int64_t img = r / hp, y = r % hp - ph;
        int32_t *dst = xt + r * ci4 * wt;
        for (int64_t i = 0; i < ci4 * wt; ++i) dst[i] = (int32_t)0x80808080u;
        if (y < 0 || y >= h) continue;
        repack_row(x + (img * h + y) * wd * ci, wd, ci4, dst + pw, wt);
    }
    lane_job job = {xt, (const int32_t *)(const void *)wp, corr, scale, out, co, ci4, taps, kw, hp, wt, ho, wo, dh, dw};
#ifdef _OPENMP
#pragma omp parallel for num_threads((int)threads) schedule(static)
#endif
    for (int64_t t = 0; t < n * ho * blocks; ++t) lane_tile(&job, t / blocks, t % blocks);
}

/* dims: N, Ci, H, W, Co, KH, KW, Ho, Wo, pad_h, pad_w, stride_h, stride_w, dil_h, dil_w.
 * x: uint8 q + 128, channels-last [N][H][W][Ci], Ci % 4 == 0; w: int8 [Co][Ci][KH][KW] contiguous;
 * w_scale: Co values, or one (w_per_channel = 0); out: float32 [N][Ho][Wo][Co].
 * xp: scratch of N * (H + 2 pad_h) * (W + 2 pad_w) * Ci bytes (unused when there is no padding); for Co <= 16 at
 * stride 1, of N * (H + 2 pad_h) * Ci * inttrain_conv_lane_width(...) bytes, always used.
 * Returns 0 on success, 1 when the CPU lacks AVX512-VNNI, 2 when out of memory, 3 on unsupported sizes. */
int inttrain_conv_fwd_u8s8(const uint8_t *x, const int8_t *w, float x_scale, const float *w_scale,
                           int64_t w_per_channel, const int64_t *dims, uint8_t *xp, float *out, int64_t threads) {
    if (!inttrain_has_vnni()) return 1;
    const int64_t n = dims[0], ci = dims[1], h = dims[2], wd = dims[3], co = dims[4], kh = dims[5], kw = dims[6];
    const int64_t ho = dims[7], wo = dims[8], ph = dims[9], pw = dims[10];
    if (ci % 4 != 0 || ci * kh * kw > 65793 || co < 1) return 3;
    const int64_t hp = h + 2 * ph, wpw = wd + 2 * pw, ci4 = ci / 4, taps = kh * kw, cot = (co + 15) / 16;
    int8_t *wp = calloc((size_t)(cot * taps * ci4 * 64), 1);
    int32_t *corr = calloc((size_t)(cot * 16), sizeof(int32_t));
    float *scale = calloc((size_t)(cot * 16), sizeof(float));
    if (!wp || !corr || !scale) {
        free(wp), free(corr), free(scale);
        return 2;
    }
    /* pack the weights: wp[t16][tap][c4][lane][k] = w[16 t16 + lane][4 c4 + k][tap] (for Co <= 16 this is the lane
       kernel's [tap][c4][co] dwords too) */
    for (int64_t o = 0; o < co; ++o) {
        int32_t sum = 0;
        for (int64_t c = 0; c < ci; ++c)
            for (int64_t t = 0; t < taps; ++t) {
                const int8_t v = w[(o * ci + c) * taps + t];
                sum += v;
                wp[(((o / 16) * taps + t) * ci4 + c / 4) * 64 + (o % 16) * 4 + c % 4] = v;
            }
        corr[o] = 128 * sum;
        scale[o] = (float)((double)x_scale * (double)w_scale[w_per_channel ? o : 0]); /* rounded once */
    }
    if (co <= 16 && dims[11] == 1 && dims[12] == 1) { /* few channels: pixels in the lanes */
        conv_fwd_lanes(x, wp, corr, scale, dims, (int32_t *)(void *)xp, out, threads < 1 ? 1 : threads);
        free(wp), free(corr), free(scale);
        return 0;
    }
    const uint8_t *src = x;
    if (ph || pw) { /* the padded copy: borders 128, rows copied */
        pad_channels_last_u8(x, n, h, wd, ci, ph, pw, xp, threads);
        src = xp;
    }
    fwd_job job = {src, wp, corr, scale, out, n * ho * wo, co, ci4, taps, kw, hp, wpw, ho, wo,
                   dims[11], dims[12], dims[13], dims[14], ci};
    const int64_t vecs = co % 64 == 0 ? 4 : co % 32 == 0 ? 2 : 1, pix = vecs == 4 ? 6 : vecs == 2 ? 12 : 16;
    const int64_t mtiles = (job.total + pix - 1) / pix, ctiles = cot / vecs + (cot % vecs != 0);
    const int64_t tiles = mtiles * ctiles;
#ifdef _OPENMP
#pragma omp parallel for num_threads((int)(threads < 1 ? 1 : threads)) schedule(static)
#endif
    for (int64_t t = 0; t < tiles; ++t) {
        const int64_t m0 = (t / ctiles) * pix, c0 = (t % ctiles) * vecs;
        if (vecs == 4)
            fwd_tile_v4(&job, m0, c0);
        else if (vecs == 2)
            fwd_tile_v2(&job, m0, c0);
        else
            fwd_tile_v1(&job, m0, c0);
    }
    free(wp), free(corr), free(scale);
    return 0;
}

/* ---------------------------------------------------------------------------------------------------------
 * Recombining wide-code convolutions (kernels/conv_wide.py): a 9..16-bit convolution is the sum of int8
 * convolutions of the codes' int8 halves, weighted by powers of 256.  Each part is the float32 integer sum of one
 * such convolution (exact below 2^24), rows of `cols` channels at a row stride of lds[p] floats.  One pass
 * makes out[r, c] = (float)((sum_p weights[p] * part_p[r, c]) * ((double)scale[c] * base)): the sum is exact in
 * double (below 2^53), and the one rounding to float32 is the int64 reference's (kernels/conv_reference.py).
 * torch's in-place float64 ops took two passes per part plus the scaling and the final cast. */
#define COMBINE_BLOCK 512
int inttrain_wide_combine(const float *const *parts, const int64_t *lds, const double *weights, int64_t nparts,
                          int64_t rows, int64_t cols, const float *scale, int64_t per_channel, double base,
                          float *out, int64_t threads) {
#pragma omp parallel for num_threads((int)threads) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        double acc[COMBINE_BLOCK];
        for (int64_t c0 = 0; c0 < cols; c0 += COMBINE_BLOCK) {
            int64_t n = cols - c0 < COMBINE_BLOCK ? cols - c0 : COMBINE_BLOCK;
            for (int64_t c = 0; c < n; c++) acc[c] = 0.0;
            for (int64_t p = 0; p < nparts; p++) {
                const float *src = parts[p] + r * lds[p] + c0;
                double w = weights[p];
                for (int64_t c = 0; c < n; c++) acc[c] += w * (double)src[c];
            }
            float *dst = out + r * cols + c0;
            for (int64_t c = 0; c < n; c++)
                dst[c] = (float)(acc[c] * ((double)scale[per_channel ? c0 + c : 0] * base));
        }
    }
    return 0;
}
