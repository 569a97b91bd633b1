/* inttrain micro runtime: the integer arithmetic of docs/integer-training.md in C99.
 * No malloc, no float, only <stdint.h> and <string.h>. Every buffer is the caller's (static in the
 * generated model). Copied unchanged next to each generated model; the weight code type comes from
 * model_config.h (IT_WEIGHT_BITS 8 or 16), and so does the error code type (IT_ERROR_BITS 8 or 16: the width of
 * the errors every backward hands the layer before it; 16-bit errors are rounded to int8 only as GEMM operands), and
 * the int8 weight view's shift (IT_WEIGHT_VIEW_TENSOR 0: a fixed 8; 1: each tensor's own, weight_view "tensor"). */
#ifndef INTTRAIN_RT_H
#define INTTRAIN_RT_H

#include <stdint.h>
#include <string.h>
#include "model_config.h"

#if IT_WEIGHT_BITS == 16
typedef int16_t it_wcode_t;
#define IT_WMAX 32767
#else
typedef int8_t it_wcode_t;
#define IT_WMAX 127
#endif

#ifndef IT_WEIGHT_VIEW_TENSOR
#define IT_WEIGHT_VIEW_TENSOR 0
#endif

#ifndef IT_ERROR_BITS
#define IT_ERROR_BITS 8
#endif
#if IT_ERROR_BITS == 16
typedef int16_t it_ecode_t;
#define IT_EMAX 32767
#else
typedef int8_t it_ecode_t;
#define IT_EMAX 127
#endif

enum { IT_RNE = 0, IT_PSTOCH = 1, IT_FLOOR = 2, IT_HSTOCH = 3 };
#define IT_I32_MAX 2147483647

/* §2: x / 2**s rounded (s >= 0; s >= 63 gives 0); ``at``: x's flat position in the array the NumPy engine
 * rounds at once (only IT_HSTOCH reads it: its random bits are hashed from x, at and s). */
int64_t it_shift_round(int64_t x, int32_t s, int mode, uint32_t at);
/* x * 2**k saturated to [-limit, limit] (k >= 0). */
int64_t it_shift_left_sat(int64_t x, int32_t k, int64_t limit);
/* multiply by 2**-s: rounding right shift for s >= 0, saturating (int32) left shift for s < 0. */
int64_t it_shift(int64_t x, int32_t s, int mode, uint32_t at);
/* round(a / m), halves up, with floor division (m >= 1): (a + m / 2) // m. */
int64_t it_rdiv(int64_t a, int64_t m);
int32_t it_bitlen(uint64_t v);
/* the shift s of the int8 view of a weight tensor of n master codes (§1), the view sitting s exponent steps above
 * the master codes: 8 for int16 codes (fixed view), or with IT_WEIGHT_VIEW_TENSOR the tensor's own
 * max(0, bitlen(max |W16|) - 7) (0..8); 0 for int8 codes */
int32_t it_view_shift(const it_wcode_t *w, uint32_t n);
/* the int8 weight view of one master code (§1): sat8(shift_round(W16, s, rne)) with s from it_view_shift (the
 * fixed view ignores s: always 8), or the int8 code itself */
static inline int8_t it_w8(it_wcode_t w, int32_t s)
{
#if IT_WEIGHT_BITS == 16 && IT_WEIGHT_VIEW_TENSOR
    int32_t u = (int32_t)w + 32768, q, r, half; /* 0..65535: plain shifts of a non-negative value */
    if (s <= 0)
        q = w;
    else {
        q = (u >> s) - (32768 >> s);             /* floor(w / 2**s): 32768 is a multiple of 2**s (s <= 8) */
        r = u & ((1 << s) - 1);
        half = 1 << (s - 1);
        q += (r > half) || (r == half && (q & 1));
    }
    return (int8_t)(q > 127 ? 127 : (q < -127 ? -127 : q));
#elif IT_WEIGHT_BITS == 16
    int32_t u = (int32_t)w + 32768;              /* 0..65535: plain shifts of a non-negative value */
    int32_t q = (u >> 8) - 128, r = u & 255;
    (void)s;
    q += (r > 128) || (r == 128 && (q & 1));
    return (int8_t)(q > 127 ? 127 : (q < -127 ? -127 : q));
#else
    (void)s;
    return w;
#endif
}

/* §2 requantization of n int32 accumulators at exponent exp into int8 codes; returns the new exponent */
int32_t it_requant32(const int32_t *acc, uint32_t n, int8_t *out, int32_t exp, int mode);
/* the same into error codes (it_ecode_t: int8 as it_requant32, or int16 with IT_ERROR_BITS 16) */
int32_t it_requant32e(const int32_t *acc, uint32_t n, it_ecode_t *out, int32_t exp, int mode);
/* an error as a GEMM operand: len error codes at exponent ge rounded to int8 codes g8 (16-bit errors; int8 ones
 * are copied unchanged); returns g8's exponent */
int32_t it_error_int8(const it_ecode_t *g, int32_t ge, uint32_t len, int8_t *g8, int mode);

/* §7 integer SGD on one weight code, gradient grad at exponent grad_exp, step shift s = E + lr_shift - grad_exp;
 * mom: the int32 momentum entry or NULL, mshift its shift */
void it_update(it_wcode_t *w, int32_t *mom, int64_t grad, int32_t s, int mode, int32_t mshift, uint32_t at);

/* Linear (§4): x (n, in), W (out, in) -> y (n, out); returns y's exponent. ws: W's view shift (it_view_shift, taken
 * in the forward; the input-gradient GEMM reuses it), we8 = W's exponent + ws: its view's exponent. The forwards take
 * acc == NULL to recompute each dot product in a second pass instead of holding the int32 accumulators (less RAM,
 * 2x MACs). */
int32_t it_linear_fwd(const int8_t *x, int32_t xe, const it_wcode_t *w, int32_t ws, int32_t we8, uint32_t n,
                      uint32_t in, uint32_t out, int32_t *acc, int8_t *y, int mode);
/* the backward GEMMs take int8 errors g (16-bit errors through it_error_int8 first); gx: error codes */
int32_t it_linear_bwd_input(const int8_t *g, int32_t ge, const it_wcode_t *w, int32_t ws, int32_t we8, uint32_t n,
                            uint32_t in, uint32_t out, int32_t *acc, it_ecode_t *gx, int mode);
void it_linear_bwd_update(const int8_t *g, int32_t ge, const int8_t *x, int32_t xe, it_wcode_t *w, int32_t *mom,
                          int32_t wexp, uint32_t n, uint32_t in, uint32_t out, int32_t lr_shift, int mode, int32_t mshift);

/* Conv2d (§4): square kernel k, stride s, zero padding p; x (n, c, h, w) -> y (n, o, oh, ow) */
typedef struct { uint32_t c, h, w, o, k, s, p, oh, ow; } it_conv_t;
int32_t it_conv_fwd(const it_conv_t *cv, const int8_t *x, int32_t xe, const it_wcode_t *w, int32_t ws, int32_t we8,
                    uint32_t n, int32_t *acc, int8_t *y, int mode);
/* the same with 16-bit output codes (a conv2d with out_bits 16, feeding a batch norm) */
int32_t it_conv_fwd16(const it_conv_t *cv, const int8_t *x, int32_t xe, const it_wcode_t *w, int32_t ws, int32_t we8,
                      uint32_t n, int32_t *acc, int16_t *y, int mode);
int32_t it_conv_bwd_input(const it_conv_t *cv, const int8_t *g, int32_t ge, const it_wcode_t *w, int32_t ws,
                          int32_t we8, uint32_t n, int32_t *acc, it_ecode_t *gx, int mode);
void it_conv_bwd_update(const it_conv_t *cv, const int8_t *g, int32_t ge, const int8_t *x, int32_t xe, it_wcode_t *w,
                        int32_t *mom, int32_t wexp, uint32_t n, int32_t lr_shift, int mode, int32_t mshift);

/* ReLU on codes */
void it_relu_fwd(const int8_t *x, uint32_t len, int8_t *y);
void it_relu_bwd(const int8_t *y, const it_ecode_t *g, uint32_t len, it_ecode_t *gx);

/* Pools over planes (n*c planes of h x w), window kh x kw, stride = window, trailing rows/cols dropped */
void it_maxpool_fwd(const int8_t *x, uint32_t planes, uint32_t h, uint32_t w, uint32_t k, int8_t *y, uint8_t *arg);
void it_maxpool_bwd(const it_ecode_t *g, const uint8_t *arg, uint32_t planes, uint32_t h, uint32_t w, uint32_t k,
                    it_ecode_t *gx);
int32_t it_avgpool_fwd(const int8_t *x, int32_t xe, uint32_t planes, uint32_t h, uint32_t w, uint32_t kh, uint32_t kw,
                       int32_t *acc, int8_t *y, int mode);
int32_t it_avgpool_bwd(const it_ecode_t *g, int32_t ge, uint32_t planes, uint32_t h, uint32_t w, uint32_t kh,
                       uint32_t kw, it_ecode_t *gx, int mode);

/* §4.1 exponent-aligning add: a + b -> y (len codes); returns y's exponent */
int32_t it_add_aligned(const int8_t *a, int32_t ea, const int8_t *b, int32_t eb, uint32_t len, int32_t *acc,
                       int8_t *y, int mode);
/* the same on error codes (a residual's backward) */
int32_t it_add_aligned_bwd(const it_ecode_t *a, int32_t ea, const it_ecode_t *b, int32_t eb, uint32_t len,
                           int32_t *acc, it_ecode_t *y, int mode);

/* §4.2 integer range batch norm over n samples of c channels with hw values each */
typedef struct { uint32_t c, hw; int32_t gain_shift; } it_bn_t;   /* output x 2**gain_shift (spec §4.2) */
/* x: int8 input codes, or 0 and x16: 16-bit ones; gamma and beta each viewed at its own it_view_shift */
int32_t it_bn_fwd(const it_bn_t *bn, const int8_t *x, const int16_t *x16, uint32_t n, const it_wcode_t *gamma,
                  int32_t gexp, const it_wcode_t *beta, int32_t bexp, int8_t *xh, uint16_t *range, uint8_t *live,
                  int8_t *y, int mode);
/* input error (when gx != NULL, with gamma's view as the forward took it: its shift is taken before the update)
 * and the update of gamma and beta; returns gx's exponent */
int32_t it_bn_bwd(const it_bn_t *bn, const it_ecode_t *g, int32_t ge, int32_t xe, uint32_t n, const int8_t *xh,
                  const uint16_t *range, const uint8_t *live, it_wcode_t *gamma, int32_t *gmom, int32_t gexp,
                  it_wcode_t *beta, int32_t *bmom, int32_t bexp, int32_t *acc, it_ecode_t *gx, int32_t lr_shift,
                  int bwd_mode, int upd_mode, int32_t mshift);

/* §6 softmax cross-entropy error: logits (n, classes) at exponent e -> err (n, classes) at -(IT_ERROR_BITS - 1)
 * (int8 codes at -7, or int16 ones at -15: probabilities in Q15) */
void it_softmax_xent_grad(const int8_t *logits, int32_t e, const int32_t *labels, uint32_t n, uint32_t classes,
                          it_ecode_t *err);
/* index of the first largest code of each row */
void it_argmax(const int8_t *logits, uint32_t n, uint32_t classes, int32_t *pred);

#endif
