/* The padded copy both convolution forward kernels read (conv.c on VNNI, conv_amx.c on AMX tiles). */
#ifndef INTTRAIN_PADDED_COPY_H
#define INTTRAIN_PADDED_COPY_H

#include <stdint.h>
#include <string.h>

/* xp uint8 [N][H + 2 ph][W + 2 pw][Ci] = x uint8 [N][H][W][Ci] (channels-last codes q + 128) with borders of 128
 * (= code 0), so that every tap of every output pixel is an in-bounds read and needs no correction. */
static void pad_channels_last_u8(const uint8_t *x, int64_t n, int64_t h, int64_t wd, int64_t ci, int64_t ph,
                                 int64_t pw, uint8_t *xp, int64_t threads) {
    const int64_t hp = h + 2 * ph, wpw = wd + 2 * pw;
#ifdef _OPENMP
#pragma omp parallel for num_threads((int)(threads < 1 ? 1 : threads)) schedule(static)
#endif
    for (int64_t r = 0; r < n * hp; ++r) {
        const int64_t img = r / hp, y = r % hp - ph;
        uint8_t *dst = xp + r * wpw * ci;
        if (y < 0 || y >= h) {
            memset(dst, 128, (size_t)(wpw * ci));
            continue;
        }
        memset(dst, 128, (size_t)(pw * ci));
        memcpy(dst + pw * ci, x + (img * h + y) * wd * ci, (size_t)(wd * ci));
        memset(dst + (pw + wd) * ci, 128, (size_t)(pw * ci));
    }
}

#endif
