/* inttrain micro runtime (see inttrain_rt.h): each function is the C twin of the NumPy code in
 * src/inttrain/micro, written for exactness first (int32 accumulators where §8 bounds them, int64
 * elsewhere) and for small RAM second (weight gradients are applied as they are formed, never stored). */
#include "inttrain_rt.h"

#define IT_CLAMP(v, lo, hi) ((v) < (lo) ? (lo) : ((v) > (hi) ? (hi) : (v)))

/* floor(x / 2**s) for 0 < s < 63 without relying on >> of a negative value (implementation-defined in C) */
static int64_t floor_shift(int64_t x, int32_t s)
{
    return x >= 0 ? (x >> s) : ~((~x) >> s);
}

/* Chris Wellons' lowbias32 integer hash */
static uint32_t lowbias32(uint32_t h)
{
    h ^= h >> 16;
    h *= 0x7FEB352Du;
    h ^= h >> 15;
    h *= 0x846CA68Bu;
    return h ^ (h >> 16);
}

#define IT_GOLDEN 0x9E3779B9u

int64_t it_shift_round(int64_t x, int32_t s, int mode, uint32_t at)
{
    int64_t q, r, half;
    if (s <= 0)
        return x;
    if (s >= 63)
        return 0;
    q = floor_shift(x, s);
    if (mode == IT_FLOOR)
        return q;
    r = x & (((int64_t)1 << s) - 1);             /* the s discarded bits, 0 <= r < 2**s */
    if (mode == IT_HSTOCH) {                     /* unbiased: up with probability r / 2**s over the hash */
        uint32_t u = lowbias32(((uint32_t)(uint64_t)x ^ (at * IT_GOLDEN)) ^ ((uint32_t)s * IT_GOLDEN));
        if (s <= 32)
            return q + ((uint64_t)(u >> (32 - s)) < (uint64_t)r);   /* 1 <= s: a shift of at most 31 */
        return q + ((uint64_t)u < ((uint64_t)r >> (s - 32)));
    }
    if (mode == IT_PSTOCH && s >= 2) {           /* NITI: round up iff top half of r > bottom half */
        int32_t m = s / 2;
        int64_t u = r >> (s - m), v = r & (((int64_t)1 << m) - 1);
        return q + (u > v);
    }
    half = (int64_t)1 << (s - 1);
    return q + ((r > half) || (r == half && (q & 1)));
}

int64_t it_shift_left_sat(int64_t x, int32_t k, int64_t limit)
{
    int64_t bound;
    if (k >= 62)
        return x > 0 ? limit : (x < 0 ? -limit : 0);
    bound = (limit >> k) + 1;                    /* clamp first: no int64 overflow */
    x = IT_CLAMP(x, -bound, bound) * ((int64_t)1 << k);
    return IT_CLAMP(x, -limit, limit);
}

int64_t it_shift(int64_t x, int32_t s, int mode, uint32_t at)
{
    return s >= 0 ? it_shift_round(x, s, mode, at) : it_shift_left_sat(x, -s, IT_I32_MAX);
}

int64_t it_rdiv(int64_t a, int64_t m)
{
    int64_t b = a + m / 2, q = b / m;            /* C division truncates; the spec floors */
    if (b % m != 0 && b < 0)
        q -= 1;
    return q;
}

int32_t it_bitlen(uint64_t v)
{
    int32_t n = 0;
    while (v) {
        n++;
        v >>= 1;
    }
    return n;
}

static int32_t requant_shift(uint64_t m)
{
    int32_t s = it_bitlen(m) - 7;
    return s > 0 ? s : 0;
}

static int32_t requant_shift16(uint64_t m)      /* 16-bit codes: max |code| 32767 */
{
    int32_t s = it_bitlen(m) - 15;
    return s > 0 ? s : 0;
}

int32_t it_view_shift(const it_wcode_t *w, uint32_t n)
{
#if IT_WEIGHT_BITS == 16 && IT_WEIGHT_VIEW_TENSOR
    uint64_t m = 0;
    uint32_t i;
    for (i = 0; i < n; i++) {
        uint64_t a = (uint64_t)(w[i] < 0 ? -(int32_t)w[i] : (int32_t)w[i]);
        m = a > m ? a : m;
    }
    return requant_shift(m);                     /* the tensor's largest code to 7 bits, as requantization (§2) */
#elif IT_WEIGHT_BITS == 16
    (void)w;
    (void)n;
    return 8;
#else
    (void)w;
    (void)n;
    return 0;
#endif
}

/* max |acc[i]| of n int32 accumulators (as uint64: |INT32_MIN| fits) */
static uint64_t amax32(const int32_t *acc, uint32_t n)
{
    uint64_t m = 0;
    uint32_t i;
    for (i = 0; i < n; i++) {
        uint64_t a = acc[i] < 0 ? (uint64_t)(-(int64_t)acc[i]) : (uint64_t)acc[i];
        if (a > m)
            m = a;
    }
    return m;
}

int32_t it_requant32(const int32_t *acc, uint32_t n, int8_t *out, int32_t exp, int mode)
{
    uint32_t i;
    int32_t s = requant_shift(amax32(acc, n));
    for (i = 0; i < n; i++) {
        int64_t v = it_shift_round(acc[i], s, mode, i);
        out[i] = (int8_t)IT_CLAMP(v, -127, 127);
    }
    return exp + s;
}

#if IT_ERROR_BITS == 16
static int32_t requant_shift_e(uint64_t m)
{
    return requant_shift16(m);
}
#else
static int32_t requant_shift_e(uint64_t m)
{
    return requant_shift(m);
}
#endif

int32_t it_requant32e(const int32_t *acc, uint32_t n, it_ecode_t *out, int32_t exp, int mode)
{
#if IT_ERROR_BITS == 16
    uint32_t i;
    int32_t s = requant_shift16(amax32(acc, n));
    for (i = 0; i < n; i++) {
        int64_t v = it_shift_round(acc[i], s, mode, i);
        out[i] = (it_ecode_t)IT_CLAMP(v, -IT_EMAX, IT_EMAX);
    }
    return exp + s;
#else
    return it_requant32(acc, n, out, exp, mode);
#endif
}

int32_t it_error_int8(const it_ecode_t *g, int32_t ge, uint32_t len, int8_t *g8, int mode)
{
    uint64_t m = 0;
    uint32_t i;
    int32_t s;
    for (i = 0; i < len; i++) {
        uint64_t a = (uint64_t)(g[i] < 0 ? -(int32_t)g[i] : (int32_t)g[i]);
        if (a > m)
            m = a;
    }
    s = requant_shift(m);                        /* micro's gemm_error: requantize(g, ge, mode) to 8 bits */
    for (i = 0; i < len; i++) {
        int64_t v = it_shift_round(g[i], s, mode, i);
        g8[i] = (int8_t)IT_CLAMP(v, -127, 127);
    }
    return ge + s;
}

void it_update(it_wcode_t *w, int32_t *mom, int64_t grad, int32_t s, int mode, int32_t mshift, uint32_t at)
{
    int64_t u = it_shift(grad, s, mode, at), v;
    if (mom) {
        v = *mom;
        v = v - it_shift_round(v, mshift, IT_RNE, 0) + u;
        v = IT_CLAMP(v, -(int64_t)IT_I32_MAX, (int64_t)IT_I32_MAX);
        *mom = (int32_t)v;
        u = v;
    }
    v = (int64_t)*w - u;
    *w = (it_wcode_t)IT_CLAMP(v, -IT_WMAX, IT_WMAX);
}

static int32_t linear_dot(const int8_t *xr, const it_wcode_t *wr, int32_t ws, uint32_t in)
{
    uint32_t i;
    int32_t sum = 0;
    for (i = 0; i < in; i++)
        sum += (int32_t)xr[i] * it_w8(wr[i], ws);
    return sum;
}

/* requantize a GEMM output without storing it: pass 1 finds max |acc|, pass 2 recomputes each dot product */
static int8_t requant_one(int32_t v, int32_t s, int mode, uint32_t at)
{
    int64_t r = it_shift_round(v, s, mode, at);
    return (int8_t)IT_CLAMP(r, -127, 127);
}

int32_t it_linear_fwd(const int8_t *x, int32_t xe, const it_wcode_t *w, int32_t ws, int32_t we8, uint32_t n,
                      uint32_t in, uint32_t out, int32_t *acc, int8_t *y, int mode)
{
    uint32_t b, o;
    uint64_t m = 0;
    int32_t s;
    if (acc) {                                   /* weight-stationary: one int8 view per weight, not per MAC */
        uint32_t i;
        memset(acc, 0, sizeof(int32_t) * n * out);
        for (o = 0; o < out; o++)
            for (i = 0; i < in; i++) {
                int32_t wv = it_w8(w[o * in + i], ws);
                if (wv)
                    for (b = 0; b < n; b++)
                        acc[b * out + o] += x[b * in + i] * wv;
            }
        return it_requant32(acc, n * out, y, xe + we8, mode);
    }
    for (b = 0; b < n; b++)
        for (o = 0; o < out; o++) {
            int32_t v = linear_dot(x + b * in, w + o * in, ws, in);
            uint64_t a = v < 0 ? (uint64_t)(-(int64_t)v) : (uint64_t)v;
            m = a > m ? a : m;
        }
    s = requant_shift(m);
    for (b = 0; b < n; b++)
        for (o = 0; o < out; o++)
            y[b * out + o] = requant_one(linear_dot(x + b * in, w + o * in, ws, in), s, mode, b * out + o);
    return xe + we8 + s;
}

int32_t it_linear_bwd_input(const int8_t *g, int32_t ge, const it_wcode_t *w, int32_t ws, int32_t we8, uint32_t n,
                            uint32_t in, uint32_t out, int32_t *acc, it_ecode_t *gx, int mode)
{
    uint32_t b, o, i;
    memset(acc, 0, sizeof(int32_t) * n * in);
    for (o = 0; o < out; o++)
        for (i = 0; i < in; i++) {
            int32_t wv = it_w8(w[o * in + i], ws);
            if (wv)
                for (b = 0; b < n; b++)
                    acc[b * in + i] += g[b * out + o] * wv;
        }
    return it_requant32e(acc, n * in, gx, ge + we8, mode);
}

void it_linear_bwd_update(const int8_t *g, int32_t ge, const int8_t *x, int32_t xe, it_wcode_t *w, int32_t *mom,
                          int32_t wexp, uint32_t n, uint32_t in, uint32_t out, int32_t lr_shift, int mode, int32_t mshift)
{
    uint32_t b, o, i;
    int32_t s = wexp + lr_shift - (ge + xe);     /* §7: GW = G.T @ X sits at exponent eg + ex */
    for (o = 0; o < out; o++)
        for (i = 0; i < in; i++) {
            int32_t sum = 0;
            for (b = 0; b < n; b++)
                sum += (int32_t)g[b * out + o] * x[b * in + i];
            it_update(&w[o * in + i], mom ? &mom[o * in + i] : 0, sum, s, mode, mshift, o * in + i);
        }
}

/* input row of output row oh and kernel row i, or -1 in the padding */
static int32_t conv_src(uint32_t o, uint32_t i, uint32_t s, uint32_t p, uint32_t len)
{
    int32_t v = (int32_t)(o * s + i) - (int32_t)p;
    return (v < 0 || v >= (int32_t)len) ? -1 : v;
}

static int32_t conv_dot(const it_conv_t *cv, const int8_t *x, const it_wcode_t *w, int32_t ws, uint32_t b, uint32_t o,
                        uint32_t a, uint32_t d)
{
    uint32_t c, i, j, k = cv->k;
    int32_t sum = 0;
    for (c = 0; c < cv->c; c++) {
        const int8_t *xp = x + (b * cv->c + c) * cv->h * cv->w;
        const it_wcode_t *wp = w + (o * cv->c + c) * k * k;
        for (i = 0; i < k; i++) {
            int32_t hh = conv_src(a, i, cv->s, cv->p, cv->h);
            if (hh < 0)
                continue;
            for (j = 0; j < k; j++) {
                int32_t ww = conv_src(d, j, cv->s, cv->p, cv->w);
                if (ww >= 0)
                    sum += (int32_t)xp[hh * cv->w + ww] * it_w8(wp[i * k + j], ws);
            }
        }
    }
    return sum;
}

/* Weight-stationary convolution sums, one int8 weight view per weight: forward (input_grad = 0) adds
 * x[b, c, hh, ww] * w8[o, c, i, j] into acc[b, o, a, d]; input_grad = 1 adds g[b, o, a, d] * w8[o, c, i, j] into
 * acc[b, c, hh, ww] (col2im), with hh = a*s + i - p, ww = d*s + j - p inside the image. acc is zeroed by the caller. */
static void conv_scatter(const it_conv_t *cv, const int8_t *src, const it_wcode_t *w, int32_t ws, uint32_t n,
                         int32_t *acc, int input_grad)
{
    uint32_t b, o, c, i, j, a, d, k = cv->k, hw = cv->h * cv->w, ohw = cv->oh * cv->ow;
    for (o = 0; o < cv->o; o++)
        for (c = 0; c < cv->c; c++)
            for (i = 0; i < k; i++)
                for (j = 0; j < k; j++) {
                    int32_t wv = it_w8(w[((o * cv->c + c) * k + i) * k + j], ws);
                    if (!wv)
                        continue;
                    for (b = 0; b < n; b++) {
                        uint32_t img = (b * cv->c + c) * hw, map = (b * cv->o + o) * ohw;
                        for (a = 0; a < cv->oh; a++) {
                            int32_t hh = conv_src(a, i, cv->s, cv->p, cv->h);
                            if (hh < 0)
                                continue;
                            for (d = 0; d < cv->ow; d++) {
                                int32_t ww = conv_src(d, j, cv->s, cv->p, cv->w);
                                if (ww < 0)
                                    continue;
                                if (input_grad)
                                    acc[img + (uint32_t)hh * cv->w + (uint32_t)ww] += src[map + a * cv->ow + d] * wv;
                                else
                                    acc[map + a * cv->ow + d] += src[img + (uint32_t)hh * cv->w + (uint32_t)ww] * wv;
                            }
                        }
                    }
                }
}

/* requantize one convolution output to 8-bit (y) or 16-bit (y16) codes, spec §2 */
static void conv_store(int8_t *y, int16_t *y16, uint32_t at, int32_t v, int32_t s, int mode)
{
    if (y16) {
        int64_t r = it_shift_round(v, s, mode, at);
        y16[at] = (int16_t)IT_CLAMP(r, -32767, 32767);
    } else {
        y[at] = requant_one(v, s, mode, at);
    }
}

static int32_t conv_fwd(const it_conv_t *cv, const int8_t *x, int32_t xe, const it_wcode_t *w, int32_t ws,
                        int32_t we8, uint32_t n, int32_t *acc, int8_t *y, int16_t *y16, int mode)
{
    uint32_t b, o, a, d, at = 0, len = n * cv->o * cv->oh * cv->ow;
    uint64_t m = 0;
    int32_t s = 0, pass;
    if (acc) {
        memset(acc, 0, sizeof(int32_t) * len);
        conv_scatter(cv, x, w, ws, n, acc, 0);
        if (!y16)
            return it_requant32(acc, len, y, xe + we8, mode);
        for (at = 0; at < len; at++) {
            uint64_t av = acc[at] < 0 ? (uint64_t)(-(int64_t)acc[at]) : (uint64_t)acc[at];
            m = av > m ? av : m;
        }
        s = requant_shift16(m);
        for (at = 0; at < len; at++)
            conv_store(y, y16, at, acc[at], s, mode);
        return xe + we8 + s;
    }
    for (pass = 0; pass < 2; pass++, at = 0) {   /* no acc: pass 0 max |A|, pass 1 recompute */
        for (b = 0; b < n; b++)
            for (o = 0; o < cv->o; o++)
                for (a = 0; a < cv->oh; a++)
                    for (d = 0; d < cv->ow; d++, at++) {
                        int32_t v = conv_dot(cv, x, w, ws, b, o, a, d);
                        uint64_t av = v < 0 ? (uint64_t)(-(int64_t)v) : (uint64_t)v;
                        if (pass == 0)
                            m = av > m ? av : m;
                        else
                            conv_store(y, y16, at, v, s, mode);
                    }
        if (pass == 0)
            s = y16 ? requant_shift16(m) : requant_shift(m);
    }
    return xe + we8 + s;
}

int32_t it_conv_fwd(const it_conv_t *cv, const int8_t *x, int32_t xe, const it_wcode_t *w, int32_t ws, int32_t we8,
                    uint32_t n, int32_t *acc, int8_t *y, int mode)
{
    return conv_fwd(cv, x, xe, w, ws, we8, n, acc, y, 0, mode);
}

int32_t it_conv_fwd16(const it_conv_t *cv, const int8_t *x, int32_t xe, const it_wcode_t *w, int32_t ws, int32_t we8,
                      uint32_t n, int32_t *acc, int16_t *y, int mode)
{
    return conv_fwd(cv, x, xe, w, ws, we8, n, acc, 0, y, mode);
}

int32_t it_conv_bwd_input(const it_conv_t *cv, const int8_t *g, int32_t ge, const it_wcode_t *w, int32_t ws,
                          int32_t we8, uint32_t n, int32_t *acc, it_ecode_t *gx, int mode)
{
    memset(acc, 0, sizeof(int32_t) * n * cv->c * cv->h * cv->w);
    conv_scatter(cv, g, w, ws, n, acc, 1);
    return it_requant32e(acc, n * cv->c * cv->h * cv->w, gx, ge + we8, mode);
}

void it_conv_bwd_update(const it_conv_t *cv, const int8_t *g, int32_t ge, const int8_t *x, int32_t xe, it_wcode_t *w,
                        int32_t *mom, int32_t wexp, uint32_t n, int32_t lr_shift, int mode, int32_t mshift)
{
    uint32_t b, o, a, d, c, i, j, k = cv->k, idx = 0;
    int32_t s = wexp + lr_shift - (ge + xe);
    for (o = 0; o < cv->o; o++)
        for (c = 0; c < cv->c; c++)
            for (i = 0; i < k; i++)
                for (j = 0; j < k; j++, idx++) {
                    int32_t sum = 0;
                    for (b = 0; b < n; b++) {
                        const int8_t *gp = g + (b * cv->o + o) * cv->oh * cv->ow;
                        const int8_t *xp = x + (b * cv->c + c) * cv->h * cv->w;
                        for (a = 0; a < cv->oh; a++) {
                            int32_t hh = conv_src(a, i, cv->s, cv->p, cv->h);
                            if (hh < 0)
                                continue;
                            for (d = 0; d < cv->ow; d++) {
                                int32_t ww = conv_src(d, j, cv->s, cv->p, cv->w);
                                if (ww >= 0)
                                    sum += (int32_t)gp[a * cv->ow + d] * xp[hh * cv->w + ww];
                            }
                        }
                    }
                    it_update(&w[idx], mom ? &mom[idx] : 0, sum, s, mode, mshift, idx);
                }
}

void it_relu_fwd(const int8_t *x, uint32_t len, int8_t *y)
{
    uint32_t i;
    for (i = 0; i < len; i++)
        y[i] = x[i] > 0 ? x[i] : 0;
}

void it_relu_bwd(const int8_t *y, const it_ecode_t *g, uint32_t len, it_ecode_t *gx)
{
    uint32_t i;
    for (i = 0; i < len; i++)
        gx[i] = y[i] != 0 ? g[i] : 0;            /* x > 0 exactly where the output is non-zero */
}

void it_maxpool_fwd(const int8_t *x, uint32_t planes, uint32_t h, uint32_t w, uint32_t k, int8_t *y, uint8_t *arg)
{
    uint32_t p, a, d, i, j, oh = h / k, ow = w / k;
    for (p = 0; p < planes; p++)
        for (a = 0; a < oh; a++)
            for (d = 0; d < ow; d++) {
                const int8_t *xp = x + p * h * w + a * k * w + d * k;
                int8_t best = xp[0];
                uint8_t at = 0;
                for (i = 0; i < k; i++)
                    for (j = 0; j < k; j++)
                        if (xp[i * w + j] > best) {     /* strict: the first maximum in row-major order wins */
                            best = xp[i * w + j];
                            at = (uint8_t)(i * k + j);
                        }
                y[(p * oh + a) * ow + d] = best;
                arg[(p * oh + a) * ow + d] = at;
            }
}

void it_maxpool_bwd(const it_ecode_t *g, const uint8_t *arg, uint32_t planes, uint32_t h, uint32_t w, uint32_t k,
                    it_ecode_t *gx)
{
    uint32_t p, a, d, oh = h / k, ow = w / k;
    memset(gx, 0, sizeof(it_ecode_t) * planes * h * w);
    for (p = 0; p < planes; p++)
        for (a = 0; a < oh; a++)
            for (d = 0; d < ow; d++) {
                uint32_t at = arg[(p * oh + a) * ow + d];
                gx[p * h * w + (a * k + at / k) * w + d * k + at % k] = g[(p * oh + a) * ow + d];
            }
}

int32_t it_avgpool_fwd(const int8_t *x, int32_t xe, uint32_t planes, uint32_t h, uint32_t w, uint32_t kh, uint32_t kw,
                       int32_t *acc, int8_t *y, int mode)
{
    uint32_t p, a, d, i, j, oh = h / kh, ow = w / kw, cnt = kh * kw;
    int32_t t = it_bitlen(cnt - 1);              /* 2**t >= cnt: the mean in steps of 2**-t (§4.4) */
    int32_t *ap = acc;
    for (p = 0; p < planes; p++)
        for (a = 0; a < oh; a++)
            for (d = 0; d < ow; d++) {
                int64_t sum = 0;
                for (i = 0; i < kh; i++)
                    for (j = 0; j < kw; j++)
                        sum += x[p * h * w + (a * kh + i) * w + d * kw + j];
                *ap++ = (int32_t)(cnt == (1u << t) ? sum : it_rdiv(sum * ((int64_t)1 << t), cnt));
            }
    return it_requant32(acc, planes * oh * ow, y, xe - t, mode);
}

int32_t it_avgpool_bwd(const it_ecode_t *g, int32_t ge, uint32_t planes, uint32_t h, uint32_t w, uint32_t kh,
                       uint32_t kw, it_ecode_t *gx, int mode)
{
    uint32_t p, a, d, i, j, oh = h / kh, ow = w / kw, cnt = kh * kw, len = planes * oh * ow;
    int32_t t = it_bitlen(cnt - 1), s = 0;
    int pow2 = cnt == (1u << t);
    if (!pow2) {                                 /* B = rdiv(G << t, cnt), requantized: first max |B| */
        uint64_t m = 0;
        for (i = 0; i < len; i++) {
            int64_t v = it_rdiv((int64_t)g[i] * ((int64_t)1 << t), cnt);
            uint64_t av = (uint64_t)(v < 0 ? -v : v);
            if (av > m)
                m = av;
        }
        s = requant_shift_e(m);
    }
    memset(gx, 0, sizeof(it_ecode_t) * planes * h * w);
    for (p = 0; p < planes; p++)
        for (a = 0; a < oh; a++)
            for (d = 0; d < ow; d++) {
                int64_t v = g[(p * oh + a) * ow + d];
                if (!pow2) {
                    v = it_shift_round(it_rdiv(v * ((int64_t)1 << t), cnt), s, mode, (p * oh + a) * ow + d);
                    v = IT_CLAMP(v, -IT_EMAX, IT_EMAX);
                }
                for (i = 0; i < kh; i++)
                    for (j = 0; j < kw; j++)
                        gx[p * h * w + (a * kh + i) * w + d * kw + j] = (it_ecode_t)v;
            }
    return ge - t + s;
}

int32_t it_add_aligned(const int8_t *a, int32_t ea, const int8_t *b, int32_t eb, uint32_t len, int32_t *acc,
                       int8_t *y, int mode)
{
    uint32_t i;
    int32_t e = ea > eb ? ea : eb;
    for (i = 0; i < len; i++)
        acc[i] = (int32_t)(it_shift_round(a[i], e - ea, mode, i) + it_shift_round(b[i], e - eb, mode, i));
    return it_requant32(acc, len, y, e, mode);
}

int32_t it_add_aligned_bwd(const it_ecode_t *a, int32_t ea, const it_ecode_t *b, int32_t eb, uint32_t len,
                           int32_t *acc, it_ecode_t *y, int mode)
{
    uint32_t i;
    int32_t e = ea > eb ? ea : eb;
    for (i = 0; i < len; i++)
        acc[i] = (int32_t)(it_shift_round(a[i], e - ea, mode, i) + it_shift_round(b[i], e - eb, mode, i));
    return it_requant32e(acc, len, y, e, mode);
}

/* rdiv(2**shift, r): the fixed-point reciprocal of a channel's range (0 for a dead channel, r == 0), §4.2 */
static int64_t range_reciprocal(uint32_t r, int32_t shift)
{
    return r ? it_rdiv((int64_t)1 << shift, (int64_t)r) : 0;
}

int32_t it_bn_fwd(const it_bn_t *bn, const int8_t *x, const int16_t *x16, uint32_t n, const it_wcode_t *gamma,
                  int32_t gexp, const it_wcode_t *beta, int32_t bexp, int8_t *xh, uint16_t *range, uint8_t *live,
                  int8_t *y, int mode)
{
    uint32_t c, b, j, hw = bn->hw, m_count = n * hw;
    int32_t sg = it_view_shift(gamma, bn->c), sb = it_view_shift(beta, bn->c);  /* each tensor's own view (§1) */
    int32_t eg8 = gexp + sg, eb8 = bexp + sb, eo = eg8 - 7 + bn->gain_shift, s;
    int32_t wide = x16 ? 8 : 0;                 /* 16-bit input: 8 more bits of reciprocal (spec §4.2) */
    uint64_t amax = 0;
    for (c = 0; c < bn->c; c++) {               /* pass 1: statistics, Xh, max |A| */
        int64_t sum = 0, mu, bal, inv;
        int32_t mn = 32767, mx = -32767, g8 = it_w8(gamma[c], sg);
        for (b = 0; b < n; b++)
            for (j = 0; j < hw; j++) {
                uint32_t at = (b * bn->c + c) * hw + j;
                int32_t v = x16 ? x16[at] : x[at];
                sum += v;
                mn = v < mn ? v : mn;
                mx = v > mx ? v : mx;
            }
        mu = it_rdiv(sum, m_count);
        range[c] = (uint16_t)(mx > mn ? mx - mn : 0);  /* <= 254 for int8 inputs, 65534 for 16-bit ones */
        live[c] = mx > mn;
        inv = range_reciprocal(range[c], 23 + wide);
        bal = it_shift(it_w8(beta[c], sb), eo - eb8, mode, c);
        for (b = 0; b < n; b++)
            for (j = 0; j < hw; j++) {
                uint32_t at = (b * bn->c + c) * hw + j;
                int64_t xv = x16 ? x16[at] : x[at];
                int64_t v = it_shift_round((xv - mu) * inv, 16 + wide, mode, c * m_count + b * hw + j), a;  /* 128 (x - mu) / r */
                xh[at] = (int8_t)IT_CLAMP(v, -127, 127);
                a = (int64_t)xh[at] * g8 + bal;
                if ((uint64_t)(a < 0 ? -a : a) > amax)
                    amax = (uint64_t)(a < 0 ? -a : a);
            }
    }
    s = requant_shift(amax);
    for (c = 0; c < bn->c; c++) {               /* pass 2: y = R_f(A) (recomputed: no int64 buffer) */
        int64_t bal = it_shift(it_w8(beta[c], sb), eo - eb8, mode, c);
        int32_t g8 = it_w8(gamma[c], sg);
        for (b = 0; b < n; b++)
            for (j = 0; j < hw; j++) {
                uint32_t at = (b * bn->c + c) * hw + j;
                int64_t v = it_shift_round((int64_t)xh[at] * g8 + bal, s, mode, at);
                y[at] = (int8_t)IT_CLAMP(v, -127, 127);
            }
    }
    return eo + s;
}

/* the gradient sums of channel c: sum G, sum G Xh, sum Xh^2, max |Xh| */
static void bn_sums(const it_bn_t *bn, const it_ecode_t *g, const int8_t *xh, uint32_t n, uint32_t c, int64_t *dbeta,
                    int64_t *dgamma, int64_t *sxx, int64_t *amx)
{
    uint32_t b, j, hw = bn->hw;
    *dbeta = *dgamma = *sxx = *amx = 0;
    for (b = 0; b < n; b++)
        for (j = 0; j < hw; j++) {
            uint32_t at = (b * bn->c + c) * hw + j;
            *dbeta += g[at];
            *dgamma += (int64_t)g[at] * xh[at];
            *sxx += (int64_t)xh[at] * xh[at];
            if (xh[at] > *amx || -xh[at] > *amx)
                *amx = xh[at] > 0 ? xh[at] : -xh[at];
        }
}

#if IT_ERROR_BITS == 16
/* the shift that narrows a channel vector of int64 gradient sums to int32 (micro: requantize(sum, e, mode, 32)) */
static int32_t narrow_shift(uint64_t m)
{
    int32_t s = it_bitlen(m) - 31;
    return s > 0 ? s : 0;
}

static int64_t narrow(int64_t v, int32_t s, int mode, uint32_t at)
{
    v = it_shift_round(v, s, mode, at);
    return IT_CLAMP(v, -(int64_t)IT_I32_MAX, (int64_t)IT_I32_MAX);
}
#endif

int32_t it_bn_bwd(const it_bn_t *bn, const it_ecode_t *g, int32_t ge, int32_t xe, uint32_t n, const int8_t *xh,
                  const uint16_t *range, const uint8_t *live, it_wcode_t *gamma, int32_t *gmom, int32_t gexp,
                  it_wcode_t *beta, int32_t *bmom, int32_t bexp, int32_t *acc, it_ecode_t *gx, int32_t lr_shift,
                  int bwd_mode, int upd_mode, int32_t mshift)
{
    uint32_t c, b, j, hw = bn->hw, m_count = n * hw;
    int32_t kmin = 0, any = 0, gs = it_view_shift(gamma, bn->c);   /* gamma's view shift before its update (below),
                                                                      as the forward took it */
#if IT_ERROR_BITS == 16
    /* 16-bit errors: the sums are int64, narrowed to int32 gradients by one shift per vector (rarely non-zero),
     * and h keeps 6 bits of fraction instead of 14 (spec §4.2) */
    const int32_t frac = 6;
    int32_t sb, sg;
    uint64_t mbeta = 0, mgamma = 0;
    for (c = 0; c < bn->c; c++) {   /* the sums again below rather than kept: no 2 x C int64 of scratch RAM */
        int64_t dbeta, dgamma, sxx, amx;
        bn_sums(bn, g, xh, n, c, &dbeta, &dgamma, &sxx, &amx);
        dbeta = dbeta < 0 ? -dbeta : dbeta;
        dgamma = dgamma < 0 ? -dgamma : dgamma;
        mbeta = (uint64_t)dbeta > mbeta ? (uint64_t)dbeta : mbeta;
        mgamma = (uint64_t)dgamma > mgamma ? (uint64_t)dgamma : mgamma;
    }
    sb = narrow_shift(mbeta);
    sg = narrow_shift(mgamma);
#else
    const int32_t frac = 14;
#endif
    for (c = 0; c < bn->c; c++)
        if (live[c] && (!any || it_bitlen(range[c]) < kmin)) {
            kmin = it_bitlen(range[c]);
            any = 1;
        }
    for (c = 0; c < bn->c; c++) {
        int64_t dbeta, dgamma, sxx, amx;
        bn_sums(bn, g, xh, n, c, &dbeta, &dgamma, &sxx, &amx);
        if (gx) {                                /* uses gamma before its update, as the forward did */
            /* projection of G on Xh: rdiv(sum(G Xh) 2^frac, sum(Xh^2)), capped to 2^21 / max|Xh| (spec §4.2) */
#if IT_ERROR_BITS == 16
            int64_t mb = it_rdiv(dbeta * 64, m_count), pg = it_rdiv(dgamma * 64, sxx > 0 ? sxx : 1);
#else
            int64_t mb = it_rdiv(dbeta * 128, m_count) * 128, pg = it_rdiv(dgamma * 16384, sxx > 0 ? sxx : 1);
#endif
            int64_t cap = ((int64_t)1 << 21) / (amx > 0 ? amx : 1);
            int32_t g8 = it_w8(gamma[c], gs);
            int64_t f = range_reciprocal(range[c], kmin + 15);    /* 2**(kmin - 1) / r <= 1 in Q16 */
            pg = pg > cap ? cap : (pg < -cap ? -cap : pg);
            for (b = 0; b < n; b++)
                for (j = 0; j < hw; j++) {
                    uint32_t at = (b * bn->c + c) * hw + j;
                    int64_t h = (int64_t)g[at] * ((int64_t)1 << frac) - mb - (int64_t)xh[at] * pg;
                    acc[at] = (int32_t)it_shift_round(g8 * h * f, 16, bwd_mode, c * m_count + b * hw + j);  /* f = 0: dead */
                }
        }
#if IT_ERROR_BITS == 16
        it_update(&gamma[c], gmom ? &gmom[c] : 0, narrow(dgamma, sg, bwd_mode, c),
                  gexp + lr_shift - (ge - 7 + bn->gain_shift + sg), upd_mode, mshift, c);
        it_update(&beta[c], bmom ? &bmom[c] : 0, narrow(dbeta, sb, bwd_mode, c), bexp + lr_shift - (ge + sb), upd_mode,
                  mshift, c);
#else
        it_update(&gamma[c], gmom ? &gmom[c] : 0, dgamma, gexp + lr_shift - (ge - 7 + bn->gain_shift), upd_mode,
                  mshift, c);
        it_update(&beta[c], bmom ? &bmom[c] : 0, dbeta, bexp + lr_shift - ge, upd_mode, mshift, c);
#endif
    }
    if (!gx)
        return 0;
    return it_requant32e(acc, m_count * bn->c, gx, ge - frac + gexp + gs - xe - kmin + 1 + bn->gain_shift,
                         bwd_mode);
}

static const int32_t EXP2_LUT[256] = {     /* round(2**(i/256) * 2**15), §6; sum 12085828 */
    32768, 32857, 32946, 33035, 33125, 33215, 33305, 33395, 33486, 33576, 33667, 33759,
    33850, 33942, 34034, 34126, 34219, 34312, 34405, 34498, 34591, 34685, 34779, 34874,
    34968, 35063, 35158, 35253, 35349, 35445, 35541, 35637, 35734, 35831, 35928, 36025,
    36123, 36221, 36319, 36417, 36516, 36615, 36715, 36814, 36914, 37014, 37114, 37215,
    37316, 37417, 37518, 37620, 37722, 37824, 37927, 38030, 38133, 38236, 38340, 38444,
    38548, 38653, 38757, 38863, 38968, 39074, 39180, 39286, 39392, 39499, 39606, 39714,
    39821, 39929, 40037, 40146, 40255, 40364, 40473, 40583, 40693, 40804, 40914, 41025,
    41136, 41248, 41360, 41472, 41584, 41697, 41810, 41923, 42037, 42151, 42265, 42380,
    42495, 42610, 42726, 42841, 42958, 43074, 43191, 43308, 43425, 43543, 43661, 43780,
    43898, 44017, 44137, 44256, 44376, 44497, 44617, 44738, 44859, 44981, 45103, 45225,
    45348, 45471, 45594, 45718, 45842, 45966, 46091, 46216, 46341, 46467, 46593, 46719,
    46846, 46973, 47100, 47228, 47356, 47484, 47613, 47742, 47871, 48001, 48131, 48262,
    48393, 48524, 48655, 48787, 48920, 49052, 49185, 49319, 49452, 49586, 49721, 49856,
    49991, 50126, 50262, 50399, 50535, 50672, 50810, 50947, 51085, 51224, 51363, 51502,
    51642, 51782, 51922, 52063, 52204, 52346, 52488, 52630, 52773, 52916, 53059, 53203,
    53347, 53492, 53637, 53782, 53928, 54074, 54221, 54368, 54515, 54663, 54811, 54960,
    55109, 55258, 55408, 55558, 55709, 55860, 56012, 56163, 56316, 56468, 56622, 56775,
    56929, 57083, 57238, 57393, 57549, 57705, 57861, 58018, 58176, 58333, 58491, 58650,
    58809, 58968, 59128, 59289, 59449, 59611, 59772, 59934, 60097, 60260, 60423, 60587,
    60751, 60916, 61081, 61247, 61413, 61579, 61746, 61914, 62081, 62250, 62419, 62588,
    62757, 62928, 63098, 63269, 63441, 63613, 63785, 63958, 64132, 64306, 64480, 64655,
    64830, 65006, 65182, 65359
};

void it_softmax_xent_grad(const int8_t *logits, int32_t e, const int32_t *labels, uint32_t n, uint32_t classes,
                          it_ecode_t *err)
{
    uint32_t b, i;
    for (b = 0; b < n; b++) {
        const int8_t *q = logits + b * classes;
        it_ecode_t *out = err + b * classes;
        int32_t mx = -127;
        int64_t sum = 0;
        for (i = 0; i < classes; i++)
            mx = q[i] > mx ? q[i] : mx;
        for (i = 0; i < classes; i++) {          /* S = sum E_i (E_i recomputed below: no buffer) */
            int64_t zl = (int64_t)(q[i] - mx) * 369, t, ip;
            t = e <= 0 ? it_shift_round(zl, -e, IT_RNE, 0) : it_shift_left_sat(zl, e, 63 * 256);
            t = t < -63 * 256 ? -63 * 256 : t;
            ip = floor_shift(t, 8);
            sum += it_shift_round(EXP2_LUT[t & 255], (int32_t)(-ip > 20 ? 20 : -ip), IT_RNE, 0);
        }
        for (i = 0; i < classes; i++) {
            int64_t zl = (int64_t)(q[i] - mx) * 369, t, ip, ev, p;
            t = e <= 0 ? it_shift_round(zl, -e, IT_RNE, 0) : it_shift_left_sat(zl, e, 63 * 256);
            t = t < -63 * 256 ? -63 * 256 : t;
            ip = floor_shift(t, 8);
            ev = it_shift_round(EXP2_LUT[t & 255], (int32_t)(-ip > 20 ? 20 : -ip), IT_RNE, 0);
#if IT_ERROR_BITS == 16
            p = (ev * 65536 + sum) / (2 * sum);  /* round(32768 E / S), halves up; all positive */
            if ((int32_t)i == labels[b])
                p -= 32768;
#else
            p = (ev * 256 + sum) / (2 * sum);    /* round(128 E / S), halves up; all positive */
            if ((int32_t)i == labels[b])
                p -= 128;
#endif
            out[i] = (it_ecode_t)IT_CLAMP(p, -IT_EMAX, IT_EMAX);
        }
    }
}

void it_argmax(const int8_t *logits, uint32_t n, uint32_t classes, int32_t *pred)
{
    uint32_t b, i;
    for (b = 0; b < n; b++) {
        const int8_t *q = logits + b * classes;
        uint32_t best = 0;
        for (i = 1; i < classes; i++)
            if (q[i] > q[best])
                best = i;
        pred[b] = (int32_t)best;
    }
}
