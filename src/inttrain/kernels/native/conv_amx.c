/* Int8 convolution on AMX tiles (Intel Sapphire Rapids and later): stride 1, no dilation, ungrouped -- every
 * forward convolution of a ResNet's 3x3 body and, through the sub-pixel form, their input gradients.
 *
 * Why native: on CPUs with AMX, bf16 autocast's convolutions run on AMX tiles, while conv.c's kernels run on
 * the AVX512-VNNI units (ResNet-20's 32-channel layer: bf16 0.57 ms forward, VNNI int8 1.79 ms).  oneDNN's AMX
 * int8 convolution is reachable from torch only through the quantized-inference ops, which reorder the
 * weights on every call (4% on a training step, measured).
 *
 * Implicit GEMM on the padded grid: x is copied once into xp uint8 [N][Hp][Wp][Ci] (q + 128, borders 128 =
 * code 0).  Output pixel (oh, ow) of an image is "grid pixel" q = oh * Wp + ow, and for kernel row kh its
 * inputs are the KW * Ci consecutive bytes at xp[oh + kh][ow] -- so the 16 rows of an A tile (16 consecutive
 * grid pixels) are 16 windows of one buffer at a stride of Ci bytes, loaded in place by one TILELOADD.  Grid
 * pixels with ow >= Wo (the right border) are computed and dropped: 94% of the work is kept at 32x32, 89% at
 * 16x16, 80% at 8x8.  A kernel row's KW * Ci bytes are cut into 64-byte steps; the weights are packed in VNNI
 * panels wb int8 [CoT][KH][KC][16][16][4] with zeros past KW * Ci, so the bytes a step reads past the window
 * meet zero weights.
 *
 *   y[q][co] = (sum_kh sum_e xp[q + kh Wp][e] * wb[co][kh][e] - 128 * sum(w[co])) * x_scale * w_scale[co]
 *
 * TDPBUSD multiplies unsigned x bytes by signed weights into int32 (exact: |u8 * s8| <= 2^15 and the caller
 * bounds Ci * KH * KW).  A unit of work is 4 accumulator tiles: 4 grid tiles x 1 channel tile (Co = 16) or
 * 2 x 2; the sums go through a 4 KB buffer to the float epilogue, which writes channels-last float32.
 */
#define _GNU_SOURCE /* syscall() under -std=c11 */
#include "amx_tiles.h"
#include "padded_copy.h"

#include <stdlib.h>

static int amx_state = -1; /* -1: not checked yet (the check is idempotent, so a race only repeats it) */

int inttrain_conv_has_amx(void) {
    if (amx_state < 0) amx_state = amx_check();
    return amx_state;
}

typedef struct {
    const uint8_t *xp;
    const int8_t *wb;
    const int32_t *corr;
    const float *scale;
    float *out;      /* float32 [N][Ho][Wo][Co], or bfloat16 (uint16) when out_bf16 */
    int64_t out_bf16;
    int64_t co, cot, kh, kc, hp, wp, ci, ho, wo, grid, tiles;
} amx_fwd_job;

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* Bytes of xp: the padded images, and the slack the last tiles of the last image read past them. */
int64_t inttrain_conv_amx_scratch(const int64_t *dims) {
    const int64_t n = dims[0], ci = dims[1], h = dims[2], w = dims[3], kh = dims[5], kw = dims[6], ho = dims[7];
    const int64_t hp = h + 2 * dims[9], wp = w + 2 * dims[10], tiles = ceil_div(ho * wp, 16);
    const int64_t reach = (ceil_div(tiles, 4) * 4 * 16 + (kh - 1) * wp) * ci + ceil_div(kw * ci, 64) * 64;
    const int64_t image = hp * wp * ci;
    return (n - 1) * image + (reach > image ? reach : image);
}

/* One unit: grid tiles [t0, t0 + MP) of image img x channel tiles [c0, c0 + NC), MP * NC = 4. */
#define AMX_FWD_UNIT(NAME, MP, NC)                                                                            \
    __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx512bf16"))) static void NAME(const amx_fwd_job *j, int64_t img, \
                                                                          int64_t t0, int64_t c0) {           \
        const uint8_t *xi = j->xp + img * j->hp * j->wp * j->ci + t0 * 16 * j->ci;                            \
        const int64_t panel = j->kh * j->kc * 1024;                                                           \
        _tile_zero(0);                                                                                        \
        _tile_zero(1);                                                                                        \
        _tile_zero(2);                                                                                        \
        _tile_zero(3);                                                                                        \
        for (int64_t r = 0; r < j->kh; ++r)                                                                   \
            for (int64_t s = 0; s < j->kc; ++s) {                                                             \
                const uint8_t *a = xi + r * j->wp * j->ci + 64 * s;                                           \
                const int8_t *b = j->wb + c0 * panel + (r * j->kc + s) * 1024;                                \
                /* loads interleaved with the multiplies (tile registers are not renamed: a load waits for   \
                   the multiplies that read the register's old contents) */                                   \
                if ((MP) == 4) {                                                                              \
                    _tile_loadd(6, b, 64);                                                                    \
                    _tile_loadd(4, a, j->ci);                                                                 \
                    _tile_dpbusd(0, 4, 6);                                                                    \
                    _tile_loadd(5, a + 16 * j->ci, j->ci);                                                    \
                    _tile_dpbusd(1, 5, 6);                                                                    \
                    _tile_loadd(4, a + 32 * j->ci, j->ci);                                                    \
                    _tile_dpbusd(2, 4, 6);                                                                    \
                    _tile_loadd(5, a + 48 * j->ci, j->ci);                                                    \
                    _tile_dpbusd(3, 5, 6);                                                                    \
                } else {                                                                                      \
                    _tile_loadd(4, a, j->ci);                                                                 \
                    _tile_loadd(6, b, 64);                                                                    \
                    _tile_dpbusd(0, 4, 6);                                                                    \
                    _tile_loadd(7, b + panel, 64);                                                            \
                    _tile_dpbusd(1, 4, 7);                                                                    \
                    _tile_loadd(5, a + 16 * j->ci, j->ci);                                                    \
                    _tile_dpbusd(2, 5, 6);                                                                    \
                    _tile_dpbusd(3, 5, 7);                                                                    \
                }                                                                                             \
            }                                                                                                 \
        int32_t acc[(MP) * 16][(NC) * 16];                                                                    \
        if ((MP) == 4) {                                                                                      \
            _tile_stored(0, acc[0], 64);                                                                      \
            _tile_stored(1, acc[16], 64);                                                                     \
            _tile_stored(2, acc[32], 64);                                                                     \
            _tile_stored(3, acc[48], 64);                                                                     \
        } else {                                                                                              \
            _tile_stored(0, acc[0], 128);                                                                     \
            _tile_stored(1, &acc[0][16], 128);                                                                \
            _tile_stored(2, acc[16], 128);                                                                    \
            _tile_stored(3, &acc[16][16], 128);                                                               \
        }                                                                                                     \
        /* the grid position walks with p (a division per pixel had cost more than the tiles' multiplies) */   \
        int64_t q = t0 * 16, oh = q / j->wp, ow = q % j->wp;                                                  \
        for (int64_t p = 0; p < (MP) * 16 && q < j->grid; ++p, ++q) {                                        \
            if (ow < j->wo) {                                                                                 \
                const int64_t at = ((img * j->ho + oh) * j->wo + ow) * j->co;                               \
                for (int v = 0; v < (NC) && c0 + v < j->cot; ++v) {                                           \
                    const int64_t ch = 16 * (c0 + v), live = j->co - ch < 16 ? j->co - ch : 16;               \
                    const __mmask16 mask = (__mmask16)((1u << live) - 1u);                                    \
                    const __m512i s = _mm512_sub_epi32(_mm512_loadu_si512((const void *)&acc[p][16 * v]),     \
                                                       _mm512_loadu_si512((const void *)(j->corr + ch)));     \
                    const __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(s), _mm512_loadu_ps(j->scale + ch));    \
                    if (j->out_bf16) /* rounded to nearest even, as float32 -> bfloat16 in torch */            \
                        _mm256_mask_storeu_epi16((uint16_t *)(void *)j->out + at + ch, mask,                   \
                                                 (__m256i)_mm512_cvtneps_pbh(f));                             \
                    else                                                                                      \
                        _mm512_mask_storeu_ps(j->out + at + ch, mask, f);                                     \
                }                                                                                             \
            }                                                                                                 \
            if (++ow == j->wp) ow = 0, ++oh;                                                                  \
        }                                                                                                     \
    }

AMX_FWD_UNIT(amx_fwd_4x1, 4, 1)
AMX_FWD_UNIT(amx_fwd_2x2, 2, 2)

/* Every unit of the forward convolution, spread over the threads (each configures its own tiles). */
__attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx512bf16"))) static void run_fwd_units(const amx_fwd_job *job, int64_t n,
                                                                                int64_t threads) {
    const int wide = job->cot >= 2; /* 2 x 2 units; else 4 grid tiles x 1 channel tile */
    const int64_t mp = wide ? 2 : 4, nc = wide ? 2 : 1;
    const int64_t mblocks = ceil_div(job->tiles, mp), cblocks = ceil_div(job->cot, nc), units = n * mblocks * cblocks;
#pragma omp parallel num_threads((int)threads)
    {
        amx_configure_16x64();
#pragma omp for schedule(static)
        for (int64_t u = 0; u < units; ++u) {
            const int64_t img = u / (mblocks * cblocks), rest = u % (mblocks * cblocks);
            const int64_t t0 = (rest / cblocks) * mp, c0 = (rest % cblocks) * nc;
            if (wide)
                amx_fwd_2x2(job, img, t0, c0);
            else
                amx_fwd_4x1(job, img, t0, c0);
        }
        _tile_release();
    }
}

/* dims: N, Ci, H, W, Co, KH, KW, Ho, Wo, pad_h, pad_w, stride_h, stride_w, dil_h, dil_w (as conv.c's forward).
 * x: uint8 q + 128, channels-last [N][H][W][Ci]; w: int8 [Co][Ci][KH][KW] contiguous; w_scale: Co values, or
 * one (w_per_channel bit 0 clear); out: float32 [N][Ho][Wo][Co], or bfloat16 when w_per_channel bit 1 is set
 * (each value the float32 result rounded to nearest even); xp: inttrain_conv_amx_scratch(dims) bytes.
 * Returns 0 on success, 1 without AMX, 2 when out of memory, 3 on unsupported sizes (stride or dilation not 1,
 * a reduction int32 cannot hold), 4 when bfloat16 output is asked for on a CPU without AVX512-BF16. */
int inttrain_conv_fwd_amx_u8s8(const uint8_t *x, const int8_t *w, float x_scale, const float *w_scale,
                               int64_t w_per_channel, const int64_t *dims, uint8_t *xp, float *out, int64_t threads) {
    if (!inttrain_conv_has_amx()) return 1;
    const int64_t out_bf16 = (w_per_channel >> 1) & 1; /* bit 1: write bfloat16 (needs AVX512-BF16) */
    w_per_channel &= 1;
    __builtin_cpu_init();
    if (out_bf16 && !__builtin_cpu_supports("avx512bf16")) return 4;
    const int64_t n = dims[0], ci = dims[1], h = dims[2], wd = dims[3], co = dims[4], kh = dims[5], kw = dims[6];
    const int64_t ho = dims[7], wo = dims[8], ph = dims[9], pw = dims[10];
    if (dims[11] != 1 || dims[12] != 1 || dims[13] != 1 || dims[14] != 1 || co < 1 || ci < 1) return 3;
    if (ci * kh * kw > 65793 || ho != h + 2 * ph - kh + 1 || wo != wd + 2 * pw - kw + 1) return 3;
    if (threads < 1) threads = 1;
    const int64_t hp = h + 2 * ph, wp = wd + 2 * pw, cot = ceil_div(co, 16), kc = ceil_div(kw * ci, 64);
    int8_t *wb = calloc((size_t)((cot + 1) * kh * kc * 1024), 1); /* + a zero panel: 2 x 2 units at odd CoT */
    int32_t *corr = calloc((size_t)(cot * 16), sizeof(int32_t));
    float *scale = calloc((size_t)(cot * 16), sizeof(float));
    if (!wb || !corr || !scale) {
        free(wb), free(corr), free(scale);
        return 2;
    }
    /* wb[o / 16][r][e / 64][(e % 64) / 4][o % 16][e % 4] = w[o][e % ci][r][e / ci], e = kw * Ci + ci */
    for (int64_t o = 0; o < co; ++o) {
        int32_t sum = 0;
        for (int64_t r = 0; r < kh; ++r)
            for (int64_t e = 0; e < kw * ci; ++e) {
                const int8_t v = w[((o * ci + e % ci) * kh + r) * kw + e / ci];
                sum += v;
                wb[(((o / 16) * kh + r) * kc + e / 64) * 1024 + ((e % 64) / 4) * 64 + (o % 16) * 4 + e % 4] = v;
            }
        corr[o] = 128 * sum;
        scale[o] = (float)((double)x_scale * (double)w_scale[w_per_channel ? o : 0]); /* rounded once */
    }
    const int64_t image = hp * wp * ci, total = inttrain_conv_amx_scratch(dims);
    pad_channels_last_u8(x, n, h, wd, ci, ph, pw, xp, threads);
    memset(xp + n * image, 128, (size_t)(total - n * image)); /* slack: read, multiplied, dropped */
    const int64_t grid = ho * wp, tiles = ceil_div(grid, 16);
    amx_fwd_job job = {xp, wb, corr, scale, out, out_bf16, co, cot, kh, kc, hp, wp, ci, ho, wo, grid, tiles};
    run_fwd_units(&job, n, threads);
    free(wb), free(corr), free(scale);
    return 0;
}
