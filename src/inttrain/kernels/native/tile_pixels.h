/* The output pixels of a forward convolution's register tile (conv.c on VNNI, conv_avx2.c on AVX2). */
#ifndef INTTRAIN_TILE_PIXELS_H
#define INTTRAIN_TILE_PIXELS_H

#include <stdint.h>

/* offsets[p] = where output pixel m0 + p's window starts in the padded channels-last input [N][Hp][Wp][C] (in
 * elements), for p < count; pixels past the end (m0 + p >= total) repeat the last one, whose results the caller
 * does not store.  One division for the tile's first pixel, then steps (divisions per pixel cost ~10% on 1x1
 * layers). */
static inline void tile_pixel_offsets(int64_t m0, int count, int64_t total, int64_t ho, int64_t wo, int64_t hp,
                                      int64_t wp, int64_t sh, int64_t sw, int64_t c, int64_t *offsets) {
    const int64_t plane = ho * wo;
    int64_t img = m0 / plane, oh = (m0 % plane) / wo, ow = (m0 % plane) % wo;
    for (int p = 0; p < count; ++p) {
        offsets[p] = ((img * hp + oh * sh) * wp + ow * sw) * c;
        if (m0 + p + 1 < total && ++ow == wo) {
            ow = 0;
            if (++oh == ho) oh = 0, ++img;
        }
    }
}

#endif
