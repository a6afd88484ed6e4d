/* kernels/cpu/linear.c — CPU linear layers: the INT4 repack, the choice of
 * instruction set, and the portable C loops that define the arithmetic
 * (kernels/linear.h) and serve CPUs without AVX2. The x86-64 paths, which
 * give the same bits, are in kernels/cpu/linear_x86.c.
 *
 * The portable loops take each output element on its own: 64 partial sums
 * in an array, one fmaf per product (a single rounding, as the vector FMA
 * does), then the fixed reduction. fmaf is one instruction on CPUs with
 * FMA (aarch64, x86-64 built for it); elsewhere libm computes it exactly,
 * slower. */
#include "kernels/cpu/linear_impl.h"

#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>
#ifdef LIN_HAVE_X86
#include <cpuid.h>
#endif

/* ---- repack ---------------------------------------------------------------- */

/* Scale pairs per chunk for a group of `group` columns out of kp. */
static int32_t tpc_of(const struct krn_q4_weight *src)
{
    if (src->group >= src->kp || src->group >= KRN_CPU_Q4_CHUNK)
        return 1;
    return KRN_CPU_Q4_CHUNK / src->group; /* 64: 2, 32: 4 */
}

static size_t q_bytes(const struct krn_q4_weight *src, int32_t kc)
{
    return ((size_t)src->n * (size_t)kc / 2 + 63) / 64 * 64;
}

static int32_t kc_of(const struct krn_q4_weight *src)
{
    return (src->k + KRN_CPU_Q4_CHUNK - 1) / KRN_CPU_Q4_CHUNK * KRN_CPU_Q4_CHUNK;
}

size_t krn_cpu_q4_bytes(const struct krn_q4_weight *src)
{
    int32_t kc = kc_of(src);
    size_t pairs = (size_t)src->n * (size_t)(kc / KRN_CPU_Q4_CHUNK) * (size_t)tpc_of(src);
    return q_bytes(src, kc) + (pairs * 2 * sizeof(float) + 63) / 64 * 64;
}

void krn_cpu_q4_repack(const struct krn_q4_weight *src, void *mem, struct krn_cpu_q4 *dst)
{
    const int32_t kc = kc_of(src), nch = kc / KRN_CPU_Q4_CHUNK, tpc = tpc_of(src);
    const int32_t ng = krn_q4_groups(src);
    dst->n = src->n;
    dst->k = src->k;
    dst->kc = kc;
    dst->tpc = tpc;
    dst->q = mem;
    dst->sz = (float *)((char *)mem + q_bytes(src, kc));
    for (int32_t r = 0; r < src->n; r++) {
        uint8_t *qr = dst->q + (int64_t)r * (kc / 2);
        float *sz = dst->sz + (int64_t)r * nch * tpc * 2;
        memset(qr, 0, (size_t)kc / 2);
        for (int32_t c = 0; c < nch; c++) {
            for (int32_t t = 0; t < tpc; t++) {
                /* Columns past kp belong to no group (their x is never
                 * read); they take the last group's pair. */
                int32_t col = c * KRN_CPU_Q4_CHUNK + t * (KRN_CPU_Q4_CHUNK / tpc);
                int32_t g = col / src->group < ng ? col / src->group : ng - 1;
                float s = krn_half_to_float(src->scale[(int64_t)r * ng + g]);
                float z = krn_half_to_float(src->zero[(int64_t)r * ng + g]);
                sz[(c * tpc + t) * 2] = s;
                sz[(c * tpc + t) * 2 + 1] = z * s; /* exact: two 11-bit mantissas */
            }
            for (int32_t j = 0; j < 8; j++)
                for (int32_t l = 0; l < 16; l++) {
                    int32_t col = c * KRN_CPU_Q4_CHUNK + 16 * j + l;
                    int code = col < src->kp ? krn_q4_code(src, r, col) : 0;
                    qr[64 * c + 4 * l + j / 2] |= (uint8_t)(code << (4 * (j & 1)));
                }
        }
    }
}

/* ---- instruction set --------------------------------------------------------- */

static atomic_int isa_now = -1; /* -1: not chosen yet */

#ifdef LIN_HAVE_X86
/* F16C from CPUID leaf 1 (ECX bit 29): clang before 15 has no "f16c" for
 * __builtin_cpu_supports. */
static bool has_f16c(void)
{
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}
#endif

static enum krn_cpu_isa isa_best(void)
{
#ifdef LIN_HAVE_X86
    __builtin_cpu_init();
    const bool f16c = has_f16c();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("fma") && f16c)
        return KRN_ISA_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c)
        return KRN_ISA_AVX2;
#endif
    return KRN_ISA_PORTABLE;
}

enum krn_cpu_isa krn_cpu_isa_get(void)
{
    int v = atomic_load_explicit(&isa_now, memory_order_relaxed);
    if (v < 0) {
        /* every thread that races here computes the same value */
        v = (int)isa_best();
        atomic_store_explicit(&isa_now, v, memory_order_relaxed);
    }
    return (enum krn_cpu_isa)v;
}

enum krn_cpu_isa krn_cpu_isa_set(enum krn_cpu_isa isa)
{
    enum krn_cpu_isa best = isa_best();
    enum krn_cpu_isa v = isa < best ? isa : best;
    atomic_store_explicit(&isa_now, (int)v, memory_order_relaxed);
    return v;
}

const char *krn_cpu_isa_name(enum krn_cpu_isa isa)
{
    switch (isa) {
    case KRN_ISA_AVX512:
        return "avx512";
    case KRN_ISA_AVX2:
        return "avx2";
    default:
        return "portable";
    }
}

/* ---- the portable loops ------------------------------------------------------- */

enum wfmt { W_Q4, W_F32, W_F16 };

/* The fixed reduction of 64 partial sums. */
static float reduce64(float p[4][16])
{
    float t[16];
    for (int l = 0; l < 16; l++)
        t[l] = (p[0][l] + p[1][l]) + (p[2][l] + p[3][l]);
    for (int l = 0; l < 8; l++)
        t[l] += t[l + 8];
    for (int l = 0; l < 4; l++)
        t[l] += t[l + 4];
    for (int l = 0; l < 2; l++)
        t[l] += t[l + 2];
    return t[0] + t[1];
}

/* Slice s of row n as 16 fp32 weights (len of them: the last slice is cut
 * at k). */
static void weight_slice(enum wfmt f, const void *w, int32_t k, int32_t n, int32_t s, int32_t len,
                         float *wb)
{
    int64_t at = (int64_t)n * k + 16 * s;
    if (f == W_F32) {
        memcpy(wb, (const float *)w + at, (size_t)len * sizeof(float));
    } else if (f == W_F16) {
        for (int32_t l = 0; l < len; l++)
            wb[l] = krn_half_to_float(((const uint16_t *)w)[at + l]);
    } else {
        const struct krn_cpu_q4 *q = w;
        int32_t c = s / 8, j = s % 8;
        const uint8_t *b = q->q + (int64_t)n * (q->kc / 2) + 64 * c + j / 2;
        const float *sz =
            q->sz + (((int64_t)n * (q->kc / KRN_CPU_Q4_CHUNK) + c) * q->tpc + j * q->tpc / 8) * 2;
        for (int32_t l = 0; l < len; l++) {
            int code = (b[4 * l] >> (4 * (j & 1))) & 15;
            wb[l] = (float)code * sz[0] - sz[1]; /* exact (kernels/linear.h) */
        }
    }
}

/* Rows of x in tiles of LIN_MT; each weight slice is expanded once per
 * tile. */
static void linear_portable(enum wfmt f, const void *w, int32_t k, const float *bias,
                            const float *x, int64_t ldx, float *y, int64_t ldy, int32_t m,
                            int32_t n0, int32_t n1)
{
    float p[LIN_MT][4][16], wb[16];
    const int32_t ns = (k + 15) / 16;
    for (int32_t m0 = 0; m0 < m; m0 += LIN_MT) {
        const int32_t mt = m - m0 < LIN_MT ? m - m0 : LIN_MT;
        for (int32_t n = n0; n < n1; n++) {
            memset(p, 0, sizeof p);
            for (int32_t s = 0; s < ns; s++) {
                const int32_t len = k - 16 * s < 16 ? k - 16 * s : 16;
                weight_slice(f, w, k, n, s, len, wb);
                for (int32_t r = 0; r < mt; r++) {
                    const float *xs = x + (int64_t)(m0 + r) * ldx + 16 * s;
                    float *acc = p[r][s % 4];
                    for (int32_t l = 0; l < len; l++)
                        acc[l] = fmaf(wb[l], xs[l], acc[l]);
                }
            }
            for (int32_t r = 0; r < mt; r++) {
                float v = reduce64(p[r]);
                y[(int64_t)(m0 + r) * ldy + n] = bias ? v + bias[n] : v;
            }
        }
    }
}

/* ---- entry points --------------------------------------------------------------- */

void krn_cpu_linear_q4(const struct krn_cpu_q4 *w, const float *bias, const float *x, int64_t ldx,
                       float *y, int64_t ldy, int32_t m, int32_t n0, int32_t n1)
{
#ifdef LIN_HAVE_X86
    switch (krn_cpu_isa_get()) {
    case KRN_ISA_AVX512:
        lin_q4_avx512(w, bias, x, ldx, y, ldy, m, n0, n1);
        return;
    case KRN_ISA_AVX2:
        lin_q4_avx2(w, bias, x, ldx, y, ldy, m, n0, n1);
        return;
    default:
        break;
    }
#endif
    linear_portable(W_Q4, w, w->k, bias, x, ldx, y, ldy, m, n0, n1);
}

void krn_cpu_gather_cols(const float *x, int64_t ldx, const int32_t *perm, int32_t k, float *xg,
                         int64_t ldg, int32_t m)
{
    for (int32_t r = 0; r < m; r++)
        for (int32_t i = 0; i < k; i++)
            xg[r * ldg + i] = x[r * ldx + perm[i]];
}

void krn_cpu_linear_f32(const float *w, int32_t k, const float *bias, const float *x, int64_t ldx,
                        float *y, int64_t ldy, int32_t m, int32_t n0, int32_t n1)
{
#ifdef LIN_HAVE_X86
    switch (krn_cpu_isa_get()) {
    case KRN_ISA_AVX512:
        lin_f32_avx512(w, k, bias, x, ldx, y, ldy, m, n0, n1);
        return;
    case KRN_ISA_AVX2:
        lin_f32_avx2(w, k, bias, x, ldx, y, ldy, m, n0, n1);
        return;
    default:
        break;
    }
#endif
    linear_portable(W_F32, w, k, bias, x, ldx, y, ldy, m, n0, n1);
}

void krn_cpu_linear_f16(const uint16_t *w, int32_t k, const float *bias, const float *x,
                        int64_t ldx, float *y, int64_t ldy, int32_t m, int32_t n0, int32_t n1)
{
#ifdef LIN_HAVE_X86
    switch (krn_cpu_isa_get()) {
    case KRN_ISA_AVX512:
        lin_f16_avx512(w, k, bias, x, ldx, y, ldy, m, n0, n1);
        return;
    case KRN_ISA_AVX2:
        lin_f16_avx2(w, k, bias, x, ldx, y, ldy, m, n0, n1);
        return;
    default:
        break;
    }
#endif
    linear_portable(W_F16, w, k, bias, x, ldx, y, ldy, m, n0, n1);
}
