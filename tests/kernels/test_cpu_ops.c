/* Every CPU kernel against a naive double-precision loop written here:
 * INT4 / fp32 / fp16 linear on every instruction set the CPU has (with the
 * repacked layout, padding, odd N, many M, and split ranges giving
 * bit-identical results; the AVX2 and AVX-512 kernels bit for bit the
 * portable loop on random shapes), RMSNorm with residual,
 * RoPE with llama3 scaling, paged attention with GQA in chunks (and within a
 * sliding window), SiLU*mul, embeddings
 * and row gathers, and the fp16 conversion for every bit pattern. */
#include "common/inf.h"
#include "kernels/activation.h"
#include "kernels/attention.h"
#include "kernels/embedding.h"
#include "kernels/fp8.h"
#include "kernels/linear.h"
#include "kernels/norm.h"
#include "kernels/q4.h"
#include "kernels/rope.h"

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 99;

static double urand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) * 0x1p-53 * 2.0 - 1.0;
}

static float *rvec(int64_t n, double amp)
{
    float *v = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++)
        v[i] = (float)(amp * urand());
    return v;
}

/* A canonical INT4 weight with random codes, scales and zeros; padding
 * columns hold the zero point as q4.h requires. */
static struct krn_q4_weight make_q4(int n, int k, int kp, int group)
{
    struct krn_q4_weight w = {.n = n, .k = k, .kp = kp, .group = group};
    int ng = kp / group;
    w.q = calloc((size_t)n * (size_t)kp / 2, 1);
    w.scale = malloc(sizeof(uint16_t) * (size_t)(n * ng));
    w.zero = malloc(sizeof(uint16_t) * (size_t)(n * ng));
    for (int i = 0; i < n * ng; i++) {
        w.scale[i] = inf_f32_to_f16((float)(0.01 + 0.02 * fabs(urand())));
        w.zero[i] = inf_f32_to_f16((float)(int)(8 + 7 * urand()));
    }
    for (int r = 0; r < n; r++)
        for (int c = 0; c < kp; c++) {
            int code =
                c < k ? (int)((rng >> 7) % 16) : (int)inf_f16_to_f32(w.zero[r * ng + c / group]);
            urand();
            uint8_t *b = &w.q[(size_t)r * (size_t)(kp / 2) + (size_t)(c / 2)];
            *b = (uint8_t)(c % 2 ? (*b & 0x0f) | (code << 4) : (*b & 0xf0) | code);
        }
    return w;
}

static double q4_at(const struct krn_q4_weight *w, int r, int c)
{
    int ng = w->kp / w->group;
    uint8_t b = w->q[(size_t)r * (size_t)(w->kp / 2) + (size_t)(c / 2)];
    int code = c % 2 ? b >> 4 : b & 15;
    return ((double)code - inf_f16_to_f32(w->zero[r * ng + c / w->group])) *
           inf_f16_to_f32(w->scale[r * ng + c / w->group]);
}

static void check_q4_linear(int n, int k, int kp, int group, int m)
{
    struct krn_q4_weight w = make_q4(n, k, kp, group);
    void *mem = aligned_alloc(64, (krn_cpu_q4_bytes(&w) + 63) / 64 * 64);
    struct krn_cpu_q4 cw;
    krn_cpu_q4_repack(&w, mem, &cw);
    int64_t ldx = k + 3, ldy = n + 2;
    float *x = rvec((int64_t)m * ldx, 1.0), *bias = rvec(n, 0.5);
    float *y = calloc((size_t)(m * ldy), sizeof(float)),
          *y2 = calloc((size_t)(m * ldy), sizeof(float));
    krn_cpu_linear_q4(&cw, bias, x, ldx, y, ldy, m, 0, n);
    /* split in two ranges: bit-identical */
    krn_cpu_linear_q4(&cw, bias, x, ldx, y2, ldy, m, 0, n / 2);
    krn_cpu_linear_q4(&cw, bias, x, ldx, y2, ldy, m, n / 2, n);
    for (int r = 0; r < m; r++)
        for (int o = 0; o < n; o++) {
            double s = bias[o], mag = fabs(bias[o]);
            for (int c = 0; c < k; c++) {
                s += q4_at(&w, o, c) * x[r * ldx + c];
                mag += fabs(q4_at(&w, o, c) * x[r * ldx + c]);
            }
            ck_assert_msg(fabs(y[r * ldy + o] - s) <= 1e-5 * mag + 1e-6,
                          "n=%d k=%d g=%d m=%d [%d][%d]: %g vs %g", n, k, group, m, r, o,
                          y[r * ldy + o], s);
            ck_assert(y[r * ldy + o] == y2[r * ldy + o]);
        }
    /* a row computed alone equals the same row in a batch */
    float *y1 = calloc((size_t)ldy, sizeof(float));
    krn_cpu_linear_q4(&cw, bias, x + (m - 1) * ldx, ldx, y1, ldy, 1, 0, n);
    ck_assert_int_eq(memcmp(y1, y + (m - 1) * ldy, sizeof(float) * (size_t)n), 0);
    free(y1);
    free(x), free(bias), free(y), free(y2), free(mem);
    free(w.q), free(w.scale), free(w.zero);
}

/* Loop index _i as an instruction set: false (and a line saying so) when
 * the CPU lacks it. */
static bool use_isa(int i)
{
    enum krn_cpu_isa want = (enum krn_cpu_isa)i;
    if (krn_cpu_isa_set(want) != want) {
        printf("SKIPPED: %s kernels (the CPU lacks them)\n", krn_cpu_isa_name(want));
        return false;
    }
    return true;
}

START_TEST(linear_q4_matches_naive)
{
    static const int ms[] = {1, 3, 9, 17};
    /* every instruction set the CPU has, the portable loop included */
    if (!use_isa(_i))
        return;
    for (int i = 0; i < 4; i++) {
        check_q4_linear(7, 100, 128, 32, ms[i]);  /* K padded within a group */
        check_q4_linear(5, 288, 512, 256, ms[i]); /* K 288 at group 256 */
        check_q4_linear(9, 288, 384, 128, ms[i]); /* K 288 at group 128 */
        check_q4_linear(3, 101, 102, 102, ms[i]); /* per-channel, K odd */
        check_q4_linear(33, 256, 256, 64, ms[i]);
    }
}
END_TEST

START_TEST(linear_fp_matches_naive)
{
    if (!use_isa(_i))
        return;
    int n = 11, k = 77, m = 10;
    float *w = rvec((int64_t)n * k, 0.3), *x = rvec((int64_t)m * k, 1.0);
    uint16_t *wh = malloc(sizeof(uint16_t) * (size_t)(n * k));
    for (int i = 0; i < n * k; i++)
        wh[i] = inf_f32_to_f16(w[i]);
    float *y = calloc((size_t)(m * n), sizeof(float)), *yh = calloc((size_t)(m * n), sizeof(float));
    krn_cpu_linear_f32(w, k, NULL, x, k, y, n, m, 0, n);
    krn_cpu_linear_f16(wh, k, NULL, x, k, yh, n, m, 0, n);
    for (int r = 0; r < m; r++)
        for (int o = 0; o < n; o++) {
            double s = 0, sh = 0;
            for (int c = 0; c < k; c++) {
                s += (double)w[o * k + c] * x[r * k + c];
                sh += (double)inf_f16_to_f32(wh[o * k + c]) * x[r * k + c];
            }
            ck_assert_msg(fabs(y[r * n + o] - s) < 1e-5, "f32 %g vs %g", y[r * n + o], s);
            ck_assert_msg(fabs(yh[r * n + o] - sh) < 1e-5, "f16 %g vs %g", yh[r * n + o], sh);
        }
    free(w), free(x), free(wh), free(y), free(yh);
}
END_TEST

/* x with NaN past column k of each row (a kernel that reads there poisons
 * its outputs). */
static float *poisoned_x(int m, int k, int64_t ldx)
{
    float *x = rvec((int64_t)m * ldx, 1.5);
    for (int r = 0; r < m; r++)
        for (int64_t c = k; c < ldx; c++)
            x[r * ldx + c] = NAN;
    return x;
}

/* The AVX2 and AVX-512 kernels against the portable loop on random shapes:
 * odd K, K not a multiple of the group or of 16, every group size and
 * per-channel, M = 1 and up to 9 rows (several tiles), strided x and y,
 * with and without bias, column ranges that start and end anywhere. They
 * follow the same arithmetic (kernels/linear.h), so the results must be
 * bit for bit the portable loop's. */
START_TEST(linear_isas_bit_identical)
{
    if (!use_isa(_i + 1))
        return;
    const enum krn_cpu_isa isa = (enum krn_cpu_isa)(_i + 1);
    static const int groups[] = {32, 64, 128, 256, 0};
    static const int ms[] = {1, 2, 3, 4, 5, 7, 9};
    for (int it = 0; it < 120; it++) {
        const int n = 1 + (int)((rng >> 9) % 70), g = groups[(rng >> 21) % 5];
        urand();
        const int k = 1 + (int)((rng >> 9) % 700), m = ms[(rng >> 33) % 7];
        urand();
        const int kp = g ? (k + g - 1) / g * g : k, group = g ? g : kp;
        const int64_t ldx = k + (int64_t)((rng >> 13) % 6), ldy = n + (int64_t)((rng >> 29) % 4);
        const int n0 = (int)((rng >> 40) % (uint64_t)n),
                  n1 = n0 + 1 + (int)((rng >> 45) % (uint64_t)(n - n0));
        urand();
        struct krn_q4_weight w = make_q4(n, k, kp, group);
        void *mem = aligned_alloc(64, (krn_cpu_q4_bytes(&w) + 63) / 64 * 64);
        struct krn_cpu_q4 cw;
        krn_cpu_q4_repack(&w, mem, &cw);
        float *wf = rvec((int64_t)n * k, 0.3), *x = poisoned_x(m, k, ldx);
        float *bias = it % 2 ? rvec(n, 0.5) : NULL;
        uint16_t *wh = malloc(sizeof(uint16_t) * (size_t)n * (size_t)k);
        for (int64_t i = 0; i < (int64_t)n * k; i++)
            wh[i] = inf_f32_to_f16(wf[i]);
        size_t ybytes = sizeof(float) * (size_t)(m * ldy);
        float *want = malloc(ybytes), *got = malloc(ybytes);
        for (int f = 0; f < 3; f++) {
            for (int pass = 0; pass < 2; pass++) {
                float *y = pass ? got : want;
                memset(y, 0, ybytes);
                krn_cpu_isa_set(pass ? isa : KRN_ISA_PORTABLE);
                if (f == 0)
                    krn_cpu_linear_q4(&cw, bias, x, ldx, y, ldy, m, n0, n1);
                else if (f == 1)
                    krn_cpu_linear_f32(wf, k, bias, x, ldx, y, ldy, m, n0, n1);
                else
                    krn_cpu_linear_f16(wh, k, bias, x, ldx, y, ldy, m, n0, n1);
            }
            for (int r = 0; r < m; r++)
                for (int o = n0; o < n1; o++) {
                    float a = want[r * ldy + o], b = got[r * ldy + o];
                    ck_assert_msg(!isnan(a) && memcmp(&a, &b, sizeof a) == 0,
                                  "%s %s n=%d k=%d g=%d m=%d [%d][%d]: %a vs %a",
                                  krn_cpu_isa_name(isa),
                                  f == 0   ? "q4"
                                  : f == 1 ? "f32"
                                           : "f16",
                                  n, k, group, m, r, o, b, a);
                }
        }
        free(want), free(got), free(wf), free(wh), free(x), free(bias), free(mem);
        free(w.q), free(w.scale), free(w.zero);
    }
    krn_cpu_isa_set(KRN_ISA_AVX512);
}
END_TEST

START_TEST(half_to_float_every_pattern)
{
    for (uint32_t h = 0; h < 65536; h++) {
        float a = krn_half_to_float((uint16_t)h), b = inf_f16_to_f32((uint16_t)h);
        if (isnan(b))
            ck_assert(isnan(a));
        else
            ck_assert_msg(a == b && signbit(a) == signbit(b), "0x%04x: %g vs %g", h, a, b);
    }
}
END_TEST

/* The naive RMSNorm of rows of dim (x0 + d, strides 64 and 60) against
 * krn_cpu_rmsnorm_add's x and out (stride 55), out[i] reading column
 * perm[i] (perm NULL: i). */
static void check_norm(const float *x0, const float *d, const float *w, const int32_t *perm,
                       const float *x, const float *out, int dim, int rows)
{
    for (int r = 0; r < rows; r++) {
        double ss = 0, v[64];
        for (int i = 0; i < dim; i++) {
            v[i] = (double)x0[r * 64 + i] + d[r * 60 + i];
            ss += v[i] * v[i];
            ck_assert(fabs(x[r * 64 + i] - v[i]) < 1e-6);
        }
        for (int i = 0; i < dim; i++) {
            const int c = perm ? perm[i] : i;
            ck_assert(fabs(out[r * 55 + i] - v[c] / sqrt(ss / dim + 1e-5) * w[i]) < 1e-5);
        }
        ck_assert(x[r * 64 + 60] == x0[r * 64 + 60]); /* beyond dim untouched */
    }
}

START_TEST(rmsnorm_add_matches_naive)
{
    int dim = 50, rows = 4;
    float *x = rvec(rows * 64, 2.0), *d = rvec(rows * 60, 1.0), *w = rvec(dim, 1.0);
    float *x0 = malloc(sizeof(float) * rows * 64), *out = calloc(rows * 55, sizeof(float));
    memcpy(x0, x, sizeof(float) * rows * 64);
    krn_cpu_rmsnorm_add(x, 64, d, 60, w, NULL, 1e-5f, out, 55, dim, 0, rows);
    check_norm(x0, d, w, NULL, x, out, dim, rows);
    /* no delta: x unchanged */
    memcpy(x, x0, sizeof(float) * rows * 64);
    krn_cpu_rmsnorm_add(x, 64, NULL, 0, w, NULL, 1e-5f, out, 55, dim, 1, 2);
    ck_assert_int_eq(memcmp(x, x0, sizeof(float) * rows * 64), 0);
    /* a column order (an act-order linear's input): out[i] is the
     * normalized x[perm[i]] times w[i], the residual in its own order */
    int32_t perm[50];
    for (int i = 0; i < dim; i++)
        perm[i] = (i * 17 + 5) % dim; /* 17 is prime to 50: a permutation */
    krn_cpu_rmsnorm_add(x, 64, d, 60, w, perm, 1e-5f, out, 55, dim, 0, rows);
    check_norm(x0, d, w, perm, x, out, dim, rows);
    free(x), free(d), free(w), free(x0), free(out);
}
END_TEST

static double ref_inv_freq(int i, int hd, double theta, bool l3)
{
    double f = 1.0 / pow(theta, 2.0 * i / hd);
    if (!l3)
        return f;
    double factor = 8, lo = 1, hi = 4, orig = 8192;
    double wl = 2 * M_PI / f;
    if (wl > orig / lo)
        return f / factor;
    if (wl < orig / hi)
        return f;
    double sm = (orig / wl - lo) / (hi - lo);
    return (1 - sm) * f / factor + sm * f;
}

START_TEST(rope_matches_naive)
{
    for (int l3 = 0; l3 < 2; l3++) {
        int hd = 64, nh = 3, rows = 5;
        float inv[32];
        double theta = l3 ? 500000.0 : 10000.0;
        krn_rope_inv_freq((float)theta, l3, 8.0f, 1.0f, 4.0f, 8192, hd, inv);
        bool saw_scaled = false, saw_kept = false, saw_mixed = false;
        for (int i = 0; i < hd / 2; i++) {
            double want = ref_inv_freq(i, hd, theta, l3);
            ck_assert_msg(fabs(inv[i] - want) <= 2e-6 * want, "inv_freq[%d] %g vs %g", i, inv[i],
                          want);
            double plain = ref_inv_freq(i, hd, theta, false);
            saw_kept |= fabs(want - plain) < 1e-12 * plain;
            saw_scaled |= fabs(want - plain / 8) < 1e-12 * plain;
            saw_mixed |=
                !(fabs(want - plain) < 1e-12 * plain) && !(fabs(want - plain / 8) < 1e-12 * plain);
        }
        if (l3)
            ck_assert(saw_kept && saw_scaled && saw_mixed); /* all three llama3 regions */
        float *x = rvec(rows * 200, 1.0), *x0 = malloc(sizeof(float) * rows * 200);
        memcpy(x0, x, sizeof(float) * rows * 200);
        int32_t pos[5] = {0, 1, 7, 100, 3000};
        krn_cpu_rope(x, 200, nh, hd, pos, inv, 0, rows);
        for (int r = 0; r < rows; r++)
            for (int h = 0; h < nh; h++)
                for (int i = 0; i < hd / 2; i++) {
                    double a = pos[r] * (double)inv[i];
                    double p = x0[r * 200 + h * hd + i], q = x0[r * 200 + h * hd + i + hd / 2];
                    /* fp32 angle: tolerance grows with the position */
                    double tol = 1e-5 + 4e-7 * pos[r] * inv[i];
                    ck_assert(fabs(x[r * 200 + h * hd + i] - (p * cos(a) - q * sin(a))) < tol);
                    ck_assert(fabs(x[r * 200 + h * hd + i + hd / 2] - (q * cos(a) + p * sin(a))) <
                              tol);
                }
        ck_assert(x[199] == x0[199]);
        free(x), free(x0);
    }
}
END_TEST

/* An E4M3 code's value from the format's definition, written here apart
 * from kernels/fp8.h: sign, exponent field E (bias 7), mantissa M. */
static double e4m3_value(uint8_t c)
{
    const int E = (c >> 3) & 15, M = c & 7;
    const double v = E == 0 ? (M / 8.0) * pow(2.0, -6) : (1.0 + M / 8.0) * pow(2.0, E - 7);
    return (c & 0x80) ? -v : v;
}

/* The paged attention on fp32 pools, or (fp8) on E4M3 pools with a K and a
 * V scale, against a double-precision softmax over the values the pools
 * hold (the fp32 rows, or each code's value from its definition times its
 * scale). */
static void paged_attention_case(bool fp8)
{
    /* 150 positions: three chunks, the last cut; scattered physical blocks */
    enum { BLK = 16, NB = 13, NKV = 2, HD = 8, NH = 6, CTX = 150, NCH = 3, RS = HD + 2 };
    const float ks = 0.0125f, vs = 0.375f; /* K values up to 80 codes, V up to ~3 */
    int64_t row = NKV * HD;
    const size_t es = fp8 ? 1 : sizeof(float);
    void *kp = calloc((size_t)(NB * BLK * row), es), *vp = calloc((size_t)(NB * BLK * row), es);
    int32_t blocks[10] = {7, 2, 5, 12, 0, 9, 3, 11, 1, 6};
    float *K = rvec(CTX * row, 1.0), *Vv = rvec(CTX * row, 1.0), *q = rvec(NH * HD, 1.5);
    if (fp8) {
        K[5 * row + 1] = 1000.0f * ks; /* beyond 448 x k_scale: saturates */
        Vv[7 * row + 2] = -600.0f * vs;
    }
    for (int p = 0; p < CTX; p++) {
        if (fp8)
            krn_cpu_kv_write_e4m3(kp, vp, blocks, BLK, NKV, HD, p, K + p * row, Vv + p * row, ks,
                                  vs);
        else
            krn_cpu_kv_write(kp, vp, blocks, BLK, NKV, HD, p, K + p * row, Vv + p * row);
    }
    /* what the pools hold, position by position, as doubles */
    double *Kh = malloc(sizeof(double) * CTX * row), *Vh = malloc(sizeof(double) * CTX * row);
    for (int p = 0; p < CTX; p++)
        for (int64_t e = 0; e < row; e++) {
            const int64_t at = ((int64_t)blocks[p / BLK] * BLK + p % BLK) * row + e;
            if (fp8) {
                const uint8_t kc = ((uint8_t *)kp)[at], vc = ((uint8_t *)vp)[at];
                ck_assert_int_eq(kc, krn_e4m3_encode(K[p * row + e] / ks));
                ck_assert_int_eq(vc, krn_e4m3_encode(Vv[p * row + e] / vs));
                Kh[p * row + e] = e4m3_value(kc) * ks;
                Vh[p * row + e] = e4m3_value(vc) * vs;
                /* nearest code: within half a step of 1/16 relative (3 mantissa bits) */
                const double kx = K[p * row + e] / ks;
                if (fabs(kx) <= 448 && fabs(kx) >= 0x1p-6)
                    ck_assert(fabs(e4m3_value(kc) - kx) <= fabs(kx) / 16);
            } else {
                Kh[p * row + e] = ((float *)kp)[at];
                Vh[p * row + e] = ((float *)vp)[at];
                ck_assert(Kh[p * row + e] == K[p * row + e]);
            }
        }
    if (fp8) {
        ck_assert(Kh[5 * row + 1] == 448.0 * ks);
        ck_assert(Vh[7 * row + 2] == -448.0 * vs);
    }
    const struct krn_kv_pools pools =
        fp8 ? (struct krn_kv_pools){.k8 = kp, .v8 = vp, .k_scale = ks, .v_scale = vs}
            : (struct krn_kv_pools){.k = kp, .v = vp};
    float scratch[NH * (KRN_ATTN_CHUNK + NCH * RS)], out[NH * HD];
    static const int ctxs[] = {1, 13, 64, 65, 128, 150};
    for (int ci = 0; ci < 6; ci++) {
        const int n_ctx = ctxs[ci], nch = krn_attn_chunks(n_ctx);
        for (int h = 0; h < NH; h++) {
            int kvh = h / (NH / NKV);
            /* one head alone, and the head in ranges of every size: the same bits */
            krn_cpu_attn_heads(q, &pools, blocks, BLK, NH, NKV, HD, h, h + 1, 0, n_ctx, 0.35f,
                               scratch, out);
            for (int h1 = h + 1; h1 <= NH; h1 += 2) {
                float wide[NH * HD];
                krn_cpu_attn_heads(q, &pools, blocks, BLK, NH, NKV, HD, h > 0 ? h - 1 : 0, h1, 0,
                                   n_ctx, 0.35f, scratch, wide);
                ck_assert_int_eq(memcmp(wide + h * HD, out + h * HD, sizeof(float) * HD), 0);
            }
            /* its chunks one by one, each with another range of heads, then the
             * combine: the same bits */
            float rec[NCH * NH * RS], scores[NH * KRN_ATTN_CHUNK], alone[HD];
            for (int c = 0; c < nch; c++) {
                int h0 = c % 2 ? 0 : h, p0 = c * KRN_ATTN_CHUNK;
                int p1 = n_ctx - p0 < KRN_ATTN_CHUNK ? n_ctx : p0 + KRN_ATTN_CHUNK;
                krn_cpu_attn_chunk(q, &pools, blocks, BLK, NH, NKV, HD, h0, NH, p0, p1, 0.35f,
                                   scores, rec + (c * NH + h0) * RS, RS);
            }
            krn_cpu_attn_combine(rec + h * RS, NH * RS, nch, HD, alone);
            ck_assert_int_eq(memcmp(alone, out + h * HD, sizeof alone), 0);
            double s[CTX], mx = -1e300, sum = 0;
            for (int p = 0; p < n_ctx; p++) {
                double d = 0;
                for (int e = 0; e < HD; e++)
                    d += (double)q[h * HD + e] * Kh[p * row + kvh * HD + e];
                s[p] = 0.35 * d;
                mx = fmax(mx, s[p]);
            }
            for (int p = 0; p < n_ctx; p++)
                sum += (s[p] = exp(s[p] - mx));
            for (int e = 0; e < HD; e++) {
                double a = 0;
                for (int p = 0; p < n_ctx; p++)
                    a += s[p] / sum * Vh[p * row + kvh * HD + e];
                ck_assert_msg(fabs(out[h * HD + e] - a) < 1e-5 * (fp8 ? 4 : 1),
                              "fp8=%d h=%d ctx=%d: %g vs %g", fp8, h, n_ctx, out[h * HD + e], a);
            }
        }
    }
    free(kp), free(vp), free(K), free(Vv), free(q), free(Kh), free(Vh);
}

START_TEST(paged_attention_matches_naive)
{
    paged_attention_case(false);
}
END_TEST

START_TEST(paged_attention_fp8_matches_naive)
{
    paged_attention_case(true);
}
END_TEST

/* Positions k_lo..n_ctx-1 only (a sliding window), from fp32 or E4M3
 * pools: at block sizes 1, 3, 16 and 32, the table's entries wholly before
 * k_lo point at a block of NaN (a freed block, rewritten by its next
 * owner; the E4M3 NaN code 0x7f), which a read would show; GQA of three
 * heads a KV head. The naive reference reads what the pools hold. */
static void window_case(bool fp8)
{
    enum { NKV = 2, HD = 8, NH = 6, CTX = 200, MAXCH = 5, RS = HD + 2 };
    const int64_t row = NKV * HD;
    const float ks = 0.05f, vs = 0.03f;
    static const int blks[] = {1, 3, 16, 32};
    float *K = rvec(CTX * row, 1.0), *Vv = rvec(CTX * row, 1.0), *q = rvec(NH * HD, 1.5);
    if (fp8) /* the values the pools hold */
        for (int64_t i = 0; i < CTX * row; i++) {
            K[i] = (float)(e4m3_value(krn_e4m3_encode(K[i] / ks)) * ks);
            Vv[i] = (float)(e4m3_value(krn_e4m3_encode(Vv[i] / vs)) * vs);
        }
    const size_t es = fp8 ? 1 : sizeof(float);
    for (int bi = 0; bi < 4; bi++) {
        const int blk = blks[bi], nb = (CTX + blk - 1) / blk + 1; /* the last: NaN */
        const size_t n_el = (size_t)(nb * blk * row);
        void *kp = malloc(es * n_el), *vp = malloc(es * n_el);
        int32_t *blocks = malloc(sizeof(int32_t) * (size_t)nb);
        static const int ctxs[] = {1, 17, 64, 65, 129, 200};
        static const int wins[] = {1, 2, 16, 33, 64, 100, 199, 200, 500};
        for (int ci = 0; ci < 6; ci++)
            for (int wi = 0; wi < 9; wi++) {
                for (size_t i = 0; i < n_el; i++) { /* poison */
                    if (fp8)
                        ((uint8_t *)kp)[i] = ((uint8_t *)vp)[i] = 0x7f;
                    else
                        ((float *)kp)[i] = ((float *)vp)[i] = NAN;
                }
                const int n_ctx = ctxs[ci], w = wins[wi];
                const int k_lo = n_ctx - w > 0 ? n_ctx - w : 0;
                for (int b = 0; b < nb - 1; b++) /* reversed: a block's rows come from far away */
                    blocks[b] = b < k_lo / blk ? nb - 1 : nb - 2 - b;
                for (int p = 0; p < CTX; p++) {
                    if (p / blk < k_lo / blk)
                        continue;
                    if (fp8)
                        krn_cpu_kv_write_e4m3(kp, vp, blocks, blk, NKV, HD, p, K + p * row,
                                              Vv + p * row, ks, vs);
                    else
                        krn_cpu_kv_write(kp, vp, blocks, blk, NKV, HD, p, K + p * row,
                                         Vv + p * row);
                }
                float scratch[NH * (KRN_ATTN_CHUNK + MAXCH * RS)], out[NH * HD];
                ck_assert_int_le(krn_attn_chunks_from(k_lo, n_ctx), MAXCH);
                const struct krn_kv_pools pools =
                    fp8 ? (struct krn_kv_pools){.k8 = kp, .v8 = vp, .k_scale = ks, .v_scale = vs}
                        : (struct krn_kv_pools){.k = kp, .v = vp};
                krn_cpu_attn_heads(q, &pools, blocks, blk, NH, NKV, HD, 0, NH, k_lo, n_ctx, 0.35f,
                                   scratch, out);
                for (int h = 0; h < NH; h++) {
                    const int kvh = h / (NH / NKV);
                    double sc[CTX], mx = -1e300, sum = 0;
                    for (int p = k_lo; p < n_ctx; p++) {
                        double d = 0;
                        for (int e = 0; e < HD; e++)
                            d += (double)q[h * HD + e] * K[p * row + kvh * HD + e];
                        sc[p] = 0.35 * d;
                        mx = fmax(mx, sc[p]);
                    }
                    for (int p = k_lo; p < n_ctx; p++)
                        sum += (sc[p] = exp(sc[p] - mx));
                    for (int e = 0; e < HD; e++) {
                        double a = 0;
                        for (int p = k_lo; p < n_ctx; p++)
                            a += sc[p] / sum * Vv[p * row + kvh * HD + e];
                        ck_assert_msg(fabs(out[h * HD + e] - a) < 1e-5,
                                      "%s block %d ctx %d window %d h %d: %g vs %g",
                                      fp8 ? "fp8" : "fp32", blk, n_ctx, w, h, out[h * HD + e], a);
                    }
                }
            }
        free(kp), free(vp), free(blocks);
    }
    free(K), free(Vv), free(q);
}

START_TEST(paged_attention_window_matches_naive)
{
    window_case(false);
    window_case(true);
}
END_TEST

START_TEST(silu_mul_matches_naive)
{
    float *g = rvec(3 * 40, 6.0), *u = rvec(3 * 40, 2.0), out[3 * 33];
    krn_cpu_silu_mul(g, 40, u, 40, out, 33, 30, 0, 3);
    for (int r = 0; r < 3; r++)
        for (int i = 0; i < 30; i++) {
            double gv = g[r * 40 + i];
            double want = gv / (1 + exp(-gv)) * u[r * 40 + i];
            ck_assert(fabs(out[r * 33 + i] - want) < 1e-5 * (1 + fabs(want)));
        }
    free(g), free(u);
}
END_TEST

START_TEST(embedding_and_gather)
{
    float *t = rvec(10 * 12, 1.0);
    uint16_t th[120];
    for (int i = 0; i < 120; i++)
        th[i] = inf_f32_to_f16(t[i]);
    int32_t ids[4] = {9, 0, 3, 9};
    float o[4 * 14], oh[4 * 14];
    krn_cpu_embed_f32(t, 12, ids, o, 14, 0, 4);
    krn_cpu_embed_f16(th, 12, ids, oh, 14, 0, 4);
    for (int r = 0; r < 4; r++)
        for (int i = 0; i < 12; i++) {
            ck_assert(o[r * 14 + i] == t[ids[r] * 12 + i]);
            ck_assert(oh[r * 14 + i] == inf_f16_to_f32(th[ids[r] * 12 + i]));
        }
    int32_t idx[2] = {2, 0};
    float g[2 * 12];
    krn_cpu_rows_gather(o, 14, idx, g, 12, 12, 0, 2);
    ck_assert_int_eq(memcmp(g, o + 2 * 14, 12 * sizeof(float)), 0);
    ck_assert_int_eq(memcmp(g + 12, o, 12 * sizeof(float)), 0);
    free(t);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("kernels_cpu");
    TCase *t = tcase_create("linear");
    tcase_set_timeout(t, 60);
    tcase_add_loop_test(t, linear_q4_matches_naive, KRN_ISA_PORTABLE, KRN_ISA_AVX512 + 1);
    tcase_add_loop_test(t, linear_fp_matches_naive, KRN_ISA_PORTABLE, KRN_ISA_AVX512 + 1);
    tcase_add_loop_test(t, linear_isas_bit_identical, 0, 2);
    tcase_add_test(t, half_to_float_every_pattern);
    suite_add_tcase(s, t);
    t = tcase_create("rows");
    tcase_add_test(t, rmsnorm_add_matches_naive);
    tcase_add_test(t, rope_matches_naive);
    tcase_add_test(t, silu_mul_matches_naive);
    tcase_add_test(t, embedding_and_gather);
    suite_add_tcase(s, t);
    t = tcase_create("attention");
    tcase_add_test(t, paged_attention_matches_naive);
    tcase_add_test(t, paged_attention_window_matches_naive);
    tcase_add_test(t, paged_attention_fp8_matches_naive);
    suite_add_tcase(s, t);
    SRunner *r = srunner_create(s);
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
