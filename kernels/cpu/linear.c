/* kernels/cpu/linear.c — CPU linear layers (INT4 dequantized on the fly, fp32,
 * fp16). Contract and layout: kernels/linear.h.
 *
 * Loop order: tiles of MT rows of x; for each output column n, the 32-column
 * blocks of W[n] are turned into 32 fp32 weights once and applied to the MT
 * rows, accumulating into 32 lanes per row. The lanes are summed pairwise at
 * the end. The x tile (MT x k floats) stays in cache while n varies. */
#include "kernels/linear.h"

#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_AVX2_PATH 1
#endif

#define MT 8  /* rows of x per tile */
#define BK 32 /* columns per block */

/* The fp loops are compiled twice on x86-64, for the baseline and for
 * x86-64-v3 (8-wide lanes), picked at load time by the dynamic linker
 * (ifunc); both accumulate in the same order and fma contraction is off for
 * this file (kernels/CMakeLists.txt), so they give identical bits. The INT4
 * loop has a hand-written AVX2 + FMA path instead (the compiler's own
 * vectorization of the nibble unpack was slower than SSE2), chosen at run
 * time unless krn_cpu_simd(false) asked for the portable one. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define HOT __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define HOT
#endif

static bool krn_cpu_simd_on = true;

void krn_cpu_simd(bool on)
{
    krn_cpu_simd_on = on;
}

size_t krn_cpu_q4_bytes(const struct krn_q4_weight *src)
{
    size_t kr = (size_t)(src->kp + BK - 1) / BK * BK;
    size_t nb = (size_t)src->n * (kr / BK);
    size_t qb = ((size_t)src->n * kr / 2 + 63) / 64 * 64;
    return qb + 2 * ((nb * sizeof(float) + 63) / 64 * 64);
}

void krn_cpu_q4_repack(const struct krn_q4_weight *src, void *mem, struct krn_cpu_q4 *dst)
{
    int32_t kr = (src->kp + BK - 1) / BK * BK;
    size_t nb = (size_t)src->n * (size_t)(kr / BK);
    size_t qb = ((size_t)src->n * (size_t)kr / 2 + 63) / 64 * 64;
    dst->n = src->n;
    dst->k = src->k;
    dst->kr = kr;
    dst->q = mem;
    dst->scale = (float *)((char *)mem + qb);
    dst->mzs = (float *)((char *)mem + qb + (nb * sizeof(float) + 63) / 64 * 64);
    int32_t ng = krn_q4_groups(src);
    for (int32_t r = 0; r < src->n; r++) {
        uint8_t *qr = dst->q + (int64_t)r * (kr / 2);
        for (int32_t b = 0; b < kr / BK; b++) {
            int32_t c0 = b * BK;
            /* Columns past kp (per-channel rows not a multiple of 32) belong
             * to no group; they are never multiplied (x stops at k). */
            int32_t gi = c0 / src->group < ng ? c0 / src->group : ng - 1;
            float s = krn_half_to_float(src->scale[(int64_t)r * ng + gi]);
            float z = krn_half_to_float(src->zero[(int64_t)r * ng + gi]);
            dst->scale[(int64_t)r * (kr / BK) + b] = s;
            dst->mzs[(int64_t)r * (kr / BK) + b] = -z * s;
            for (int32_t j = 0; j < 16; j++) {
                int32_t ca = c0 + j, cb = c0 + 16 + j;
                int lo = ca < src->kp ? krn_q4_code(src, r, ca) : 0;
                int hi = cb < src->kp ? krn_q4_code(src, r, cb) : 0;
                qr[b * 16 + j] = (uint8_t)(lo | (hi << 4));
            }
        }
    }
}

static inline float lanes_sum(const float *a)
{
    float t[16];
    for (int i = 0; i < 16; i++)
        t[i] = a[i] + a[i + 16];
    for (int i = 0; i < 8; i++)
        t[i] += t[i + 8];
    for (int i = 0; i < 4; i++)
        t[i] += t[i + 4];
    return (t[0] + t[2]) + (t[1] + t[3]);
}

/* acc[r][0..31] += wb[0..31] * x[r][c0..c0+31] for the tile's rows; the last
 * block may be short (len < 32): lanes past len are left alone. */
static inline void block_fma(float (*acc)[BK], const float *wb, const float *x, int64_t ldx,
                             int32_t mt, int32_t c0, int32_t len)
{
    if (len == BK) {
        for (int32_t r = 0; r < mt; r++) {
            const float *xr = x + r * ldx + c0;
            for (int j = 0; j < BK; j++)
                acc[r][j] += wb[j] * xr[j];
        }
    } else {
        for (int32_t r = 0; r < mt; r++) {
            const float *xr = x + r * ldx + c0;
            for (int j = 0; j < len; j++)
                acc[r][j] += wb[j] * xr[j];
        }
    }
}

static inline void finish(float (*acc)[BK], const float *bias, float *y, int64_t ldy, int32_t mt,
                          int32_t n)
{
    for (int32_t r = 0; r < mt; r++) {
        float v = lanes_sum(acc[r]);
        y[r * ldy + n] = bias ? v + bias[n] : v;
    }
}

/* Unpack block b of a row into 32 weights: w = code * s + mz. */
static inline void unpack_block(const uint8_t *qb, float s, float mz, float *wb)
{
    for (int j = 0; j < 16; j++) {
        wb[j] = (float)(qb[j] & 0xf) * s + mz;
        wb[j + 16] = (float)(qb[j] >> 4) * s + mz;
    }
}

/* The three weight formats differ only in how a block of W[n] becomes 32
 * fp32 weights; linear_tiles is the one tile loop, inlined into each entry
 * point with its format fixed, so each gets its own specialized loop. */
#if defined(__GNUC__)
#define ALWAYS_INLINE static inline __attribute__((always_inline))
#else
#define ALWAYS_INLINE static inline
#endif

enum wfmt { W_Q4, W_F32, W_F16 };

/* Block b (len columns from b * BK) of row n of w as fp32: a pointer into w
 * (fp32) or into wb, where it was converted. */
ALWAYS_INLINE const float *weight_block(enum wfmt f, const void *w, int32_t k, int32_t n, int32_t b,
                                        int32_t len, float *wb)
{
    int32_t c0 = b * BK;
    if (f == W_Q4) {
        const struct krn_cpu_q4 *q = w;
        int64_t row = (int64_t)n * (q->kr / BK) + b;
        unpack_block(q->q + (int64_t)n * (q->kr / 2) + b * 16, q->scale[row], q->mzs[row], wb);
        return wb;
    }
    if (f == W_F32)
        return (const float *)w + (int64_t)n * k + c0;
    const uint16_t *wr = (const uint16_t *)w + (int64_t)n * k + c0;
    if (len == BK) {
        for (int j = 0; j < BK; j++)
            wb[j] = krn_half_to_float(wr[j]);
    } else {
        for (int j = 0; j < len; j++)
            wb[j] = krn_half_to_float(wr[j]);
    }
    return wb;
}

/* y[m][n0..n1) = x[m][0..k) . W[n]^T (+ bias), in tiles of MT rows. */
ALWAYS_INLINE void linear_tiles(enum wfmt f, const void *w, int32_t k, const float *bias,
                                const float *x, int64_t ldx, float *y, int64_t ldy, int32_t m,
                                int32_t n0, int32_t n1)
{
    float acc[MT][BK];
    float wb[BK];
    int32_t nblk = (k + BK - 1) / BK;
    for (int32_t m0 = 0; m0 < m; m0 += MT) {
        int32_t mt = m - m0 < MT ? m - m0 : MT;
        const float *xt = x + (int64_t)m0 * ldx;
        for (int32_t n = n0; n < n1; n++) {
            memset(acc, 0, sizeof acc);
            for (int32_t b = 0; b < nblk; b++) {
                int32_t c0 = b * BK, len = k - c0 < BK ? k - c0 : BK;
                block_fma(acc, weight_block(f, w, k, n, b, len, wb), xt, ldx, mt, c0, len);
            }
            finish(acc, bias, y + (int64_t)m0 * ldy, ldy, mt, n);
        }
    }
}

#ifdef HAVE_AVX2_PATH
/* The same computation with AVX2 + FMA: one 16-byte load gives the 32 codes
 * of a block; bytes 0..7 / 8..15 widen to columns 0..7 / 8..15 (low
 * nibbles) and 16..23 / 24..31 (high nibbles), so vector lane j is
 * accumulator lane j of the portable path. Dequantization and accumulation
 * are fused multiply-adds (one rounding each instead of two), so this path
 * and the portable one differ in the last bits; each is deterministic and
 * independent of m and of the column split (a row gets the same sequence of
 * operations whether it runs alone or paired). Rows go two at a time so the
 * accumulators stay in registers and each block is dequantized once per
 * pair. The short last block of a row uses the portable code. */
#define W8(c) _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(c)), s, z)

__attribute__((target("avx2,fma"))) static inline void
q4_rows_avx2(const uint8_t *qr, const float *sr, const float *zr, int32_t nfull, const float *x0,
             const float *x1, float *acc0, float *acc1)
{
    const __m128i m4 = _mm_set1_epi8(0x0f);
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    __m256 b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    for (int32_t b = 0; b < nfull; b++) {
        __m128i v = _mm_loadu_si128((const __m128i *)(qr + b * 16));
        __m128i lo = _mm_and_si128(v, m4), hi = _mm_and_si128(_mm_srli_epi16(v, 4), m4);
        __m256 s = _mm256_set1_ps(sr[b]), z = _mm256_set1_ps(zr[b]);
        __m256 w0 = W8(lo), w1 = W8(_mm_srli_si128(lo, 8)), w2 = W8(hi),
               w3 = W8(_mm_srli_si128(hi, 8));
        const float *xb = x0 + b * BK;
        a0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xb), a0);
        a1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xb + 8), a1);
        a2 = _mm256_fmadd_ps(w2, _mm256_loadu_ps(xb + 16), a2);
        a3 = _mm256_fmadd_ps(w3, _mm256_loadu_ps(xb + 24), a3);
        if (x1) {
            xb = x1 + b * BK;
            b0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xb), b0);
            b1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xb + 8), b1);
            b2 = _mm256_fmadd_ps(w2, _mm256_loadu_ps(xb + 16), b2);
            b3 = _mm256_fmadd_ps(w3, _mm256_loadu_ps(xb + 24), b3);
        }
    }
    _mm256_storeu_ps(acc0, a0);
    _mm256_storeu_ps(acc0 + 8, a1);
    _mm256_storeu_ps(acc0 + 16, a2);
    _mm256_storeu_ps(acc0 + 24, a3);
    if (x1) {
        _mm256_storeu_ps(acc1, b0);
        _mm256_storeu_ps(acc1 + 8, b1);
        _mm256_storeu_ps(acc1 + 16, b2);
        _mm256_storeu_ps(acc1 + 24, b3);
    }
}
#undef W8

__attribute__((target("avx2,fma"))) static void linear_q4_avx2(const struct krn_cpu_q4 *w,
                                                               const float *bias, const float *x,
                                                               int64_t ldx, float *y, int64_t ldy,
                                                               int32_t m, int32_t n0, int32_t n1)
{
    float acc[MT][BK];
    float wb[BK];
    int32_t nfull = w->k / BK, nblk = (w->k + BK - 1) / BK;
    for (int32_t m0 = 0; m0 < m; m0 += MT) {
        int32_t mt = m - m0 < MT ? m - m0 : MT;
        const float *xt = x + (int64_t)m0 * ldx;
        for (int32_t n = n0; n < n1; n++) {
            const uint8_t *qr = w->q + (int64_t)n * (w->kr / 2);
            const float *sr = w->scale + (int64_t)n * (w->kr / BK);
            const float *zr = w->mzs + (int64_t)n * (w->kr / BK);
            for (int32_t r = 0; r < mt; r += 2)
                q4_rows_avx2(qr, sr, zr, nfull, xt + r * ldx,
                             r + 1 < mt ? xt + (r + 1) * ldx : NULL, acc[r],
                             r + 1 < mt ? acc[r + 1] : NULL);
            for (int32_t b = nfull; b < nblk; b++) { /* the short last block */
                unpack_block(qr + b * 16, sr[b], zr[b], wb);
                block_fma(acc, wb, xt, ldx, mt, b * BK, w->k - b * BK);
            }
            finish(acc, bias, y + (int64_t)m0 * ldy, ldy, mt, n);
        }
    }
}
#endif

void krn_cpu_linear_q4(const struct krn_cpu_q4 *w, const float *bias, const float *x, int64_t ldx,
                       float *y, int64_t ldy, int32_t m, int32_t n0, int32_t n1)
{
#ifdef HAVE_AVX2_PATH
    if (krn_cpu_simd_on && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        linear_q4_avx2(w, bias, x, ldx, y, ldy, m, n0, n1);
        return;
    }
#endif
    linear_tiles(W_Q4, w, w->k, bias, x, ldx, y, ldy, m, n0, n1);
}

void krn_cpu_gather_cols(const float *x, int64_t ldx, const int32_t *perm, int32_t k, float *xg,
                         int64_t ldg, int32_t m)
{
    for (int32_t r = 0; r < m; r++)
        for (int32_t i = 0; i < k; i++)
            xg[r * ldg + i] = x[r * ldx + perm[i]];
}

HOT void krn_cpu_linear_f32(const float *w, int32_t k, const float *bias, const float *x,
                            int64_t ldx, float *y, int64_t ldy, int32_t m, int32_t n0, int32_t n1)
{
    linear_tiles(W_F32, w, k, bias, x, ldx, y, ldy, m, n0, n1);
}

HOT void krn_cpu_linear_f16(const uint16_t *w, int32_t k, const float *bias, const float *x,
                            int64_t ldx, float *y, int64_t ldy, int32_t m, int32_t n0, int32_t n1)
{
    linear_tiles(W_F16, w, k, bias, x, ldx, y, ldy, m, n0, n1);
}
