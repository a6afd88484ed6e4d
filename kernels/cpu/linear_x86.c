/* kernels/cpu/linear_x86.c — the x86-64 paths of the CPU linear layers,
 * chosen at run time by kernels/cpu/linear.c. They follow the arithmetic
 * of kernels/linear.h lane for lane, so they give the portable loop's bits.
 *
 * AVX-512: one zmm register is one slice (16 lanes); the four accumulators
 * of each of up to LIN_MT rows of x stay in registers (16 of the 32), and
 * every weight slice is produced once for all of them. An INT4 slice costs
 * two instructions: the chunk's 16 code words shifted right by 4j give each
 * lane's code in its low four bits, which vpermps uses as an index into the
 * group's 16 dequantized values (a table made once per chunk with one
 * fused multiply-subtract, code * scale - zero * scale, exact). fp16
 * weights are widened with vcvtph2ps; fp32 ones are read directly.
 *
 * AVX2: a slice is two ymm halves, so the four accumulators of one row fill
 * 8 of the 16 registers. An INT4 slice's codes are masked out of the words,
 * converted and scaled with a fused multiply-subtract (the same exact
 * value); with several rows of x, each chunk of weights is expanded once
 * into a buffer on the stack and every row streams it. */
#include "kernels/cpu/linear_impl.h"

#ifdef LIN_HAVE_X86
#include <immintrin.h>
#include <string.h>

#define AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,fma,f16c")))
#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define AI static inline __attribute__((always_inline))

enum wfmt { W_Q4, W_F32, W_F16 };

/* ---- AVX-512 ----------------------------------------------------------------- */

/* The fixed reduction (kernels/linear.h) of one row's accumulators. */
AVX512 AI float hsum512(__m512 a0, __m512 a1, __m512 a2, __m512 a3)
{
    __m512 t = _mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3));
    __m256 u = _mm256_add_ps(_mm512_castps512_ps256(t), _mm512_extractf32x8_ps(t, 1));
    __m128 v = _mm_add_ps(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1));
    v = _mm_add_ps(v, _mm_movehl_ps(v, v)); /* lanes 0, 1: l + 2 */
    v = _mm_add_ss(v, _mm_movehdup_ps(v));  /* lane 0: 0 + 1 */
    return _mm_cvtss_f32(v);
}

/* x slice s of row r (masked past k when tail). */
AVX512 AI __m512 x512(const float *x, int64_t ldx, int r, int32_t s, bool tail, __mmask16 tm)
{
    const float *p = x + r * ldx + 16 * s;
    return tail ? _mm512_maskz_loadu_ps(tm, p) : _mm512_loadu_ps(p);
}

/* The accumulators are named variables, not an array, so that they stay in
 * registers: acc<r><a> is accumulator a of row r. */
#define ROW_FMA(r, a, wv, s, tail)                                                                 \
    if (MT > r)                                                                                    \
    acc##r##a = _mm512_fmadd_ps(wv, x512(x, ldx, r, s, tail, tm), acc##r##a)
#define ALL_FMA(a, wv, s, tail)                                                                    \
    do {                                                                                           \
        ROW_FMA(0, a, wv, s, tail);                                                                \
        ROW_FMA(1, a, wv, s, tail);                                                                \
        ROW_FMA(2, a, wv, s, tail);                                                                \
        ROW_FMA(3, a, wv, s, tail);                                                                \
    } while (0)
/* Slice j of an INT4 chunk into accumulator a (= j % 4): the table of its
 * group indexed by the low nibble of each word, then the next nibble down. */
#define Q4_TAB(j)                                                                                  \
    (TPC == 1   ? tab0                                                                             \
     : TPC == 2 ? ((j) < 4 ? tab0 : tab1)                                                          \
     : (j) < 2  ? tab0                                                                             \
     : (j) < 4  ? tab1                                                                             \
     : (j) < 6  ? tab2                                                                             \
                : tab3)
#define Q4_STEP(j, a, guard)                                                                       \
    if (guard) {                                                                                   \
        const __m512 wv = _mm512_permutexvar_ps(v, Q4_TAB(j));                                     \
        v = _mm512_srli_epi32(v, 4);                                                               \
        ALL_FMA(a, wv, s0 + (j), tailc && s0 + (j) >= nfull);                                      \
    }
#define Q4_CHUNK(guarded)                                                                          \
    do {                                                                                           \
        Q4_STEP(0, 0, !(guarded) || 0 < nj);                                                       \
        Q4_STEP(1, 1, !(guarded) || 1 < nj);                                                       \
        Q4_STEP(2, 2, !(guarded) || 2 < nj);                                                       \
        Q4_STEP(3, 3, !(guarded) || 3 < nj);                                                       \
        Q4_STEP(4, 0, !(guarded) || 4 < nj);                                                       \
        Q4_STEP(5, 1, !(guarded) || 5 < nj);                                                       \
        Q4_STEP(6, 2, !(guarded) || 6 < nj);                                                       \
        Q4_STEP(7, 3, !(guarded) || 7 < nj);                                                       \
    } while (0)
/* fp weights: slice s (masked past k when tail). */
#define FP_SLICE(s, tail)                                                                          \
    (f == W_F32                                                                                    \
         ? ((tail) ? _mm512_maskz_loadu_ps(tm, wf + 16 * (s)) : _mm512_loadu_ps(wf + 16 * (s)))    \
         : _mm512_cvtph_ps((tail) ? _mm256_maskz_loadu_epi16(tm, wh + 16 * (s))                    \
                                  : _mm256_loadu_si256((const __m256i *)(wh + 16 * (s)))))
#define FP_STEP(s, a, tail)                                                                        \
    do {                                                                                           \
        const __m512 wv = FP_SLICE(s, tail);                                                       \
        ALL_FMA(a, wv, s, tail);                                                                   \
    } while (0)

/* One output n for MT rows of x: y[r][n]. */
AVX512 AI void tile512(const int f, const int MT, const int TPC, const void *w, int32_t k,
                       int32_t n, const float *bias, const float *x, int64_t ldx, float *y,
                       int64_t ldy)
{
    const __m512 z = _mm512_setzero_ps();
    __m512 acc00 = z, acc01 = z, acc02 = z, acc03 = z, acc10 = z, acc11 = z, acc12 = z, acc13 = z;
    __m512 acc20 = z, acc21 = z, acc22 = z, acc23 = z, acc30 = z, acc31 = z, acc32 = z, acc33 = z;
    const int32_t nfull = k >> 4, ns = (k + 15) >> 4;
    const __mmask16 tm = (__mmask16)((1u << (k & 15)) - 1u);
    if (f == W_Q4) {
        const struct krn_cpu_q4 *q = w;
        const uint8_t *qr = q->q + (int64_t)n * (q->kc / 2);
        const float *sz = q->sz + (int64_t)n * (q->kc / KRN_CPU_Q4_CHUNK) * TPC * 2;
        const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        for (int32_t s0 = 0; s0 < ns; s0 += 8, qr += 64, sz += 2 * TPC) {
            __m512i v = _mm512_load_si512((const void *)qr);
            __m512 tab0, tab1 = z, tab2 = z, tab3 = z;
            tab0 = _mm512_fmsub_ps(iota, _mm512_set1_ps(sz[0]), _mm512_set1_ps(sz[1]));
            if (TPC > 1)
                tab1 = _mm512_fmsub_ps(iota, _mm512_set1_ps(sz[2]), _mm512_set1_ps(sz[3]));
            if (TPC > 2) {
                tab2 = _mm512_fmsub_ps(iota, _mm512_set1_ps(sz[4]), _mm512_set1_ps(sz[5]));
                tab3 = _mm512_fmsub_ps(iota, _mm512_set1_ps(sz[6]), _mm512_set1_ps(sz[7]));
            }
            const int32_t nj = ns - s0;
            if (s0 + 8 <= nfull) {
                const bool tailc = false;
                Q4_CHUNK(false);
            } else {
                const bool tailc = true;
                Q4_CHUNK(true);
            }
        }
    } else {
        const float *wf = (const float *)w + (int64_t)n * k;
        const uint16_t *wh = (const uint16_t *)w + (int64_t)n * k;
        int32_t s = 0;
        for (; s + 4 <= nfull; s += 4) {
            FP_STEP(s, 0, false);
            FP_STEP(s + 1, 1, false);
            FP_STEP(s + 2, 2, false);
            FP_STEP(s + 3, 3, false);
        }
        /* up to four slices left, the last maybe cut at k */
        if (s < ns)
            FP_STEP(s, 0, s >= nfull);
        if (s + 1 < ns)
            FP_STEP(s + 1, 1, s + 1 >= nfull);
        if (s + 2 < ns)
            FP_STEP(s + 2, 2, s + 2 >= nfull);
        if (s + 3 < ns)
            FP_STEP(s + 3, 3, s + 3 >= nfull);
    }
    (void)acc10, (void)acc11, (void)acc12, (void)acc13, (void)acc20, (void)acc21, (void)acc22;
    (void)acc23, (void)acc30, (void)acc31, (void)acc32, (void)acc33;
    float v0 = hsum512(acc00, acc01, acc02, acc03);
    y[n] = bias ? v0 + bias[n] : v0;
    if (MT > 1) {
        float v1 = hsum512(acc10, acc11, acc12, acc13);
        y[ldy + n] = bias ? v1 + bias[n] : v1;
    }
    if (MT > 2) {
        float v2 = hsum512(acc20, acc21, acc22, acc23);
        y[2 * ldy + n] = bias ? v2 + bias[n] : v2;
    }
    if (MT > 3) {
        float v3 = hsum512(acc30, acc31, acc32, acc33);
        y[3 * ldy + n] = bias ? v3 + bias[n] : v3;
    }
}

/* Rows in tiles of LIN_MT (the last tile shorter), outputs n0..n1 each. */
AVX512 AI void lin512(const int f, const int TPC, const void *w, int32_t k, const float *bias,
                      const float *x, int64_t ldx, float *y, int64_t ldy, int32_t m, int32_t n0,
                      int32_t n1)
{
    for (int32_t m0 = 0; m0 < m; m0 += LIN_MT) {
        const float *xt = x + (int64_t)m0 * ldx;
        float *yt = y + (int64_t)m0 * ldy;
        switch (m - m0 < LIN_MT ? m - m0 : LIN_MT) {
        case 1:
            for (int32_t n = n0; n < n1; n++)
                tile512(f, 1, TPC, w, k, n, bias, xt, ldx, yt, ldy);
            break;
        case 2:
            for (int32_t n = n0; n < n1; n++)
                tile512(f, 2, TPC, w, k, n, bias, xt, ldx, yt, ldy);
            break;
        case 3:
            for (int32_t n = n0; n < n1; n++)
                tile512(f, 3, TPC, w, k, n, bias, xt, ldx, yt, ldy);
            break;
        default:
            for (int32_t n = n0; n < n1; n++)
                tile512(f, 4, TPC, w, k, n, bias, xt, ldx, yt, ldy);
            break;
        }
    }
}

AVX512 void lin_q4_avx512(const struct krn_cpu_q4 *w, const float *bias, const float *x,
                          int64_t ldx, float *y, int64_t ldy, int32_t m, int32_t n0, int32_t n1)
{
    if (w->tpc == 4)
        lin512(W_Q4, 4, w, w->k, bias, x, ldx, y, ldy, m, n0, n1);
    else if (w->tpc == 2)
        lin512(W_Q4, 2, w, w->k, bias, x, ldx, y, ldy, m, n0, n1);
    else
        lin512(W_Q4, 1, w, w->k, bias, x, ldx, y, ldy, m, n0, n1);
}

AVX512 void lin_f32_avx512(const float *w, int32_t k, const float *bias, const float *x,
                           int64_t ldx, float *y, int64_t ldy, int32_t m, int32_t n0, int32_t n1)
{
    lin512(W_F32, 1, w, k, bias, x, ldx, y, ldy, m, n0, n1);
}

AVX512 void lin_f16_avx512(const uint16_t *w, int32_t k, const float *bias, const float *x,
                           int64_t ldx, float *y, int64_t ldy, int32_t m, int32_t n0, int32_t n1)
{
    lin512(W_F16, 1, w, k, bias, x, ldx, y, ldy, m, n0, n1);
}

/* ---- AVX2 -------------------------------------------------------------------- */

/* The fixed reduction of one row's accumulators, each a pair of halves
 * (lanes 0-7 in l, 8-15 in h). */
AVX2 AI float hsum256(__m256 a0l, __m256 a0h, __m256 a1l, __m256 a1h, __m256 a2l, __m256 a2h,
                      __m256 a3l, __m256 a3h)
{
    __m256 tl = _mm256_add_ps(_mm256_add_ps(a0l, a1l), _mm256_add_ps(a2l, a3l));
    __m256 th = _mm256_add_ps(_mm256_add_ps(a0h, a1h), _mm256_add_ps(a2h, a3h));
    __m256 u = _mm256_add_ps(tl, th); /* l + 8 */
    __m128 v = _mm_add_ps(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1));
    v = _mm_add_ps(v, _mm_movehl_ps(v, v));
    v = _mm_add_ss(v, _mm_movehdup_ps(v));
    return _mm_cvtss_f32(v);
}

/* Lanes [lo, lo + 8) of a 16-float slice at p cut at len (zeros past it). */
AVX2 AI __m256 load8(const float *p, int32_t len, int lo)
{
    if (len >= 16)
        return _mm256_loadu_ps(p + lo);
    const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_maskload_ps(p + lo, _mm256_cmpgt_epi32(_mm256_set1_epi32(len - lo), iota));
}

/* Slice j of an INT4 chunk as two halves in wl, wh: each word's low nibble,
 * converted and scaled exactly (code * scale - zero * scale); then the
 * words move down one nibble. */
#define Q4_HALVES(j)                                                                               \
    const __m256 sc = _mm256_set1_ps(sz[2 * ((j)*TPC / 8)]);                                       \
    const __m256 zs = _mm256_set1_ps(sz[2 * ((j)*TPC / 8) + 1]);                                   \
    const __m256 wl = _mm256_fmsub_ps(_mm256_cvtepi32_ps(_mm256_and_si256(vl, m15)), sc, zs);      \
    const __m256 wh = _mm256_fmsub_ps(_mm256_cvtepi32_ps(_mm256_and_si256(vh, m15)), sc, zs);      \
    vl = _mm256_srli_epi32(vl, 4);                                                                 \
    vh = _mm256_srli_epi32(vh, 4)
/* One row (x) into accumulator a: acc<a>l, acc<a>h; guarded: the chunk may
 * end early and its last slice may be cut at k. */
#define Q4_ROW_STEP(j, a, guarded)                                                                 \
    if (!(guarded) || s0 + (j) < ns) {                                                             \
        Q4_HALVES(j);                                                                              \
        const int32_t s = s0 + (j), len = (guarded) ? k - 16 * s : 16;                             \
        acc##a##l = _mm256_fmadd_ps(wl, load8(x + 16 * s, len, 0), acc##a##l);                     \
        acc##a##h = _mm256_fmadd_ps(wh, load8(x + 16 * s, len, 8), acc##a##h);                     \
    }
#define Q4_ROW_CHUNK(guarded)                                                                      \
    do {                                                                                           \
        __m256i vl = _mm256_load_si256((const __m256i *)qc);                                       \
        __m256i vh = _mm256_load_si256((const __m256i *)(qc + 32));                                \
        Q4_ROW_STEP(0, 0, guarded);                                                                \
        Q4_ROW_STEP(1, 1, guarded);                                                                \
        Q4_ROW_STEP(2, 2, guarded);                                                                \
        Q4_ROW_STEP(3, 3, guarded);                                                                \
        Q4_ROW_STEP(4, 0, guarded);                                                                \
        Q4_ROW_STEP(5, 1, guarded);                                                                \
        Q4_ROW_STEP(6, 2, guarded);                                                                \
        Q4_ROW_STEP(7, 3, guarded);                                                                \
    } while (0)
/* Into the buffer: slice j of the chunk at wb + 16 j. */
#define Q4_BUF_STEP(j)                                                                             \
    if ((j) < nj) {                                                                                \
        Q4_HALVES(j);                                                                              \
        _mm256_store_ps(wb + 16 * (j), wl);                                                        \
        _mm256_store_ps(wb + 16 * (j) + 8, wh);                                                    \
    }

/* Slices [0, nj) of INT4 chunk qc (pairs sz) expanded into wb. */
AVX2 AI void q4_chunk256(const int TPC, const uint8_t *qc, const float *sz, int32_t nj, float *wb)
{
    const __m256i m15 = _mm256_set1_epi32(15);
    __m256i vl = _mm256_load_si256((const __m256i *)qc);
    __m256i vh = _mm256_load_si256((const __m256i *)(qc + 32));
    Q4_BUF_STEP(0);
    Q4_BUF_STEP(1);
    Q4_BUF_STEP(2);
    Q4_BUF_STEP(3);
    Q4_BUF_STEP(4);
    Q4_BUF_STEP(5);
    Q4_BUF_STEP(6);
    Q4_BUF_STEP(7);
}

/* Slices [0, nj) of fp row w (len at most k - 16 j) expanded into wb. */
AVX2 AI void fp_chunk256(const int f, const void *w, int32_t nj, int32_t len, float *wb)
{
    for (int32_t j = 0; j < nj; j++, len -= 16) {
        __m256 lo, hi;
        if (f == W_F32) {
            const float *p = (const float *)w + 16 * j;
            lo = load8(p, len, 0);
            hi = load8(p, len, 8);
        } else {
            const uint16_t *p = (const uint16_t *)w + 16 * j;
            _Alignas(16) uint16_t t[16];
            if (len < 16) {
                memset(t, 0, sizeof t);
                memcpy(t, p, (size_t)len * 2);
                p = t;
            }
            lo = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
            hi = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 8)));
        }
        _mm256_store_ps(wb + 16 * j, lo);
        _mm256_store_ps(wb + 16 * j + 8, hi);
    }
}

/* One row of x, INT4: the codes go straight into the accumulators. */
AVX2 AI void q4_row256(const int TPC, const struct krn_cpu_q4 *q, const float *bias, const float *x,
                       float *y, int32_t n0, int32_t n1)
{
    const int32_t k = q->k, ns = (k + 15) >> 4, nch = q->kc / KRN_CPU_Q4_CHUNK;
    const __m256i m15 = _mm256_set1_epi32(15);
    for (int32_t n = n0; n < n1; n++) {
        const uint8_t *qc = q->q + (int64_t)n * (q->kc / 2);
        const float *sz = q->sz + (int64_t)n * nch * TPC * 2;
        __m256 acc0l = _mm256_setzero_ps(), acc0h = acc0l, acc1l = acc0l, acc1h = acc0l;
        __m256 acc2l = acc0l, acc2h = acc0l, acc3l = acc0l, acc3h = acc0l;
        int32_t s0 = 0;
        for (; s0 + 8 <= (k >> 4); s0 += 8, qc += 64, sz += 2 * TPC)
            Q4_ROW_CHUNK(false);
        if (s0 < ns)
            Q4_ROW_CHUNK(true);
        float v = hsum256(acc0l, acc0h, acc1l, acc1h, acc2l, acc2h, acc3l, acc3h);
        y[n] = bias ? v + bias[n] : v;
    }
}

/* fp slice s of row wr into accumulator a; the last maybe cut at k. */
#define FP_ROW_STEP(s, a, len)                                                                     \
    do {                                                                                           \
        __m256 wl, wh;                                                                             \
        if (f == W_F32) {                                                                          \
            wl = load8((const float *)wr + 16 * (s), len, 0);                                      \
            wh = load8((const float *)wr + 16 * (s), len, 8);                                      \
        } else {                                                                                   \
            const uint16_t *p = (const uint16_t *)wr + 16 * (s);                                   \
            _Alignas(16) uint16_t t[16];                                                           \
            if ((len) < 16) {                                                                      \
                memset(t, 0, sizeof t);                                                            \
                memcpy(t, p, (size_t)(len)*2);                                                     \
                p = t;                                                                             \
            }                                                                                      \
            wl = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));                             \
            wh = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 8)));                       \
        }                                                                                          \
        acc##a##l = _mm256_fmadd_ps(wl, load8(x + 16 * (s), len, 0), acc##a##l);                   \
        acc##a##h = _mm256_fmadd_ps(wh, load8(x + 16 * (s), len, 8), acc##a##h);                   \
    } while (0)

/* One row of x, fp weights. */
AVX2 AI void fp_row256(const int f, const void *w, int32_t k, const float *bias, const float *x,
                       float *y, int32_t n0, int32_t n1)
{
    const int32_t nfull = k >> 4, ns = (k + 15) >> 4;
    for (int32_t n = n0; n < n1; n++) {
        const void *wr = f == W_F32 ? (const void *)((const float *)w + (int64_t)n * k)
                                    : (const void *)((const uint16_t *)w + (int64_t)n * k);
        __m256 acc0l = _mm256_setzero_ps(), acc0h = acc0l, acc1l = acc0l, acc1h = acc0l;
        __m256 acc2l = acc0l, acc2h = acc0l, acc3l = acc0l, acc3h = acc0l;
        int32_t s = 0;
        for (; s + 4 <= nfull; s += 4) {
            FP_ROW_STEP(s, 0, 16);
            FP_ROW_STEP(s + 1, 1, 16);
            FP_ROW_STEP(s + 2, 2, 16);
            FP_ROW_STEP(s + 3, 3, 16);
        }
        if (s < ns)
            FP_ROW_STEP(s, 0, k - 16 * s);
        if (s + 1 < ns)
            FP_ROW_STEP(s + 1, 1, k - 16 * (s + 1));
        if (s + 2 < ns)
            FP_ROW_STEP(s + 2, 2, k - 16 * (s + 2));
        if (s + 3 < ns)
            FP_ROW_STEP(s + 3, 3, k - 16 * (s + 3));
        float v = hsum256(acc0l, acc0h, acc1l, acc1h, acc2l, acc2h, acc3l, acc3h);
        y[n] = bias ? v + bias[n] : v;
    }
}

#define KB 1024 /* columns of a weight row expanded at a time (8 chunks) */

/* Any rows, any format: each block of KB columns of W[n] is expanded into
 * wb once; every row loads its accumulators, streams the block and stores
 * them back (the operations of q4_row256, in its order). */
AVX2 AI void lin256(const int f, const int TPC, const void *w, int32_t k, const float *bias,
                    const float *x, int64_t ldx, float *y, int64_t ldy, int32_t m, int32_t n0,
                    int32_t n1)
{
    const int32_t ns = (k + 15) >> 4;
    _Alignas(32) float wb[KB];
    _Alignas(32) float accs[LIN_MT][8][8];
    for (int32_t m0 = 0; m0 < m; m0 += LIN_MT) {
        const int32_t mt = m - m0 < LIN_MT ? m - m0 : LIN_MT;
        for (int32_t n = n0; n < n1; n++) {
            memset(accs, 0, sizeof accs);
            for (int32_t s0 = 0; s0 < ns; s0 += KB / 16) {
                const int32_t s1 = ns - s0 < KB / 16 ? ns : s0 + KB / 16;
                for (int32_t c0 = s0; c0 < s1; c0 += 8) {
                    const int32_t nj = s1 - c0 < 8 ? s1 - c0 : 8;
                    float *dst = wb + 16 * (c0 - s0);
                    if (f == W_Q4) {
                        const struct krn_cpu_q4 *q = w;
                        const int32_t nch = q->kc / KRN_CPU_Q4_CHUNK, c = c0 / 8;
                        q4_chunk256(TPC, q->q + (int64_t)n * (q->kc / 2) + 64 * c,
                                    q->sz + ((int64_t)n * nch + c) * TPC * 2, nj, dst);
                    } else {
                        const int64_t at = (int64_t)n * k + 16 * c0;
                        fp_chunk256(f,
                                    f == W_F32 ? (const void *)((const float *)w + at)
                                               : (const void *)((const uint16_t *)w + at),
                                    nj, k - 16 * c0, dst);
                    }
                }
                for (int32_t r = 0; r < mt; r++) {
                    const float *xr = x + (int64_t)(m0 + r) * ldx;
                    __m256 a[8];
                    for (int i = 0; i < 8; i++)
                        a[i] = _mm256_load_ps(accs[r][i]);
                    for (int32_t s = s0; s < s1; s++) {
                        const int32_t len = k - 16 * s, i = 2 * (s & 3);
                        const float *ws = wb + 16 * (s - s0);
                        a[i] =
                            _mm256_fmadd_ps(_mm256_load_ps(ws), load8(xr + 16 * s, len, 0), a[i]);
                        a[i + 1] = _mm256_fmadd_ps(_mm256_load_ps(ws + 8),
                                                   load8(xr + 16 * s, len, 8), a[i + 1]);
                    }
                    for (int i = 0; i < 8; i++)
                        _mm256_store_ps(accs[r][i], a[i]);
                }
            }
            for (int32_t r = 0; r < mt; r++) {
                __m256 a[8];
                for (int i = 0; i < 8; i++)
                    a[i] = _mm256_load_ps(accs[r][i]);
                float v = hsum256(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]);
                y[(int64_t)(m0 + r) * ldy + n] = bias ? v + bias[n] : v;
            }
        }
    }
}

AVX2 void lin_q4_avx2(const struct krn_cpu_q4 *w, const float *bias, const float *x, int64_t ldx,
                      float *y, int64_t ldy, int32_t m, int32_t n0, int32_t n1)
{
    if (m == 1) {
        if (w->tpc == 4)
            q4_row256(4, w, bias, x, y, n0, n1);
        else if (w->tpc == 2)
            q4_row256(2, w, bias, x, y, n0, n1);
        else
            q4_row256(1, w, bias, x, y, n0, n1);
    } else if (w->tpc == 4) {
        lin256(W_Q4, 4, w, w->k, bias, x, ldx, y, ldy, m, n0, n1);
    } else if (w->tpc == 2) {
        lin256(W_Q4, 2, w, w->k, bias, x, ldx, y, ldy, m, n0, n1);
    } else {
        lin256(W_Q4, 1, w, w->k, bias, x, ldx, y, ldy, m, n0, n1);
    }
}

AVX2 void lin_f32_avx2(const float *w, int32_t k, const float *bias, const float *x, int64_t ldx,
                       float *y, int64_t ldy, int32_t m, int32_t n0, int32_t n1)
{
    if (m == 1)
        fp_row256(W_F32, w, k, bias, x, y, n0, n1);
    else
        lin256(W_F32, 1, w, k, bias, x, ldx, y, ldy, m, n0, n1);
}

AVX2 void lin_f16_avx2(const uint16_t *w, int32_t k, const float *bias, const float *x, int64_t ldx,
                       float *y, int64_t ldy, int32_t m, int32_t n0, int32_t n1)
{
    if (m == 1)
        fp_row256(W_F16, w, k, bias, x, y, n0, n1);
    else
        lin256(W_F16, 1, w, k, bias, x, ldx, y, ldy, m, n0, n1);
}
#endif
