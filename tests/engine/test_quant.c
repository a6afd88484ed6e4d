/* INT4 round-to-nearest quantization into the canonical form: the error
 * bound per element, padding that dequantizes to exactly 0, zero points,
 * fp16 storage, every group size, symmetric and asymmetric. */
#include "engine/weights/quant.h"

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 7;

static float urand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((double)(rng >> 11) * 0x1p-53 * 2.0 - 1.0);
}

static float *random_matrix(int n, int k, float offset)
{
    float *w = malloc(sizeof(float) * (size_t)n * (size_t)k);
    for (int i = 0; i < n * k; i++)
        w[i] = 0.05f * urand() + offset * (float)(i % 3);
    return w;
}

/* Code of (row, col) read straight from the bytes, as q4.h documents. */
static int code_at(const struct krn_q4_weight *q, int r, int c)
{
    uint8_t b = q->q[(size_t)r * (size_t)(q->kp / 2) + (size_t)(c / 2)];
    return c % 2 ? b >> 4 : b & 15;
}

static void check_bound(int n, int k, int group, bool sym, float offset)
{
    float *w = random_matrix(n, k, offset);
    struct krn_q4_weight q;
    struct inf_err err;
    ck_assert_int_eq(eng_q4_quantize(w, n, k, group, sym, &q, &err), INF_OK);
    int g = group ? group : k + (k & 1);
    ck_assert_int_eq(q.kp, (k + g - 1) / g * g);
    ck_assert_int_eq(q.group, g);
    ck_assert_int_eq(q.symmetric, sym);
    int ng = q.kp / g;
    float *deq = malloc(sizeof(float) * (size_t)n * (size_t)k);
    eng_q4_dequantize(&q, deq);
    for (int r = 0; r < n; r++) {
        for (int gi = 0; gi < ng; gi++) {
            float s = inf_f16_to_f32(q.scale[r * ng + gi]);
            float z = inf_f16_to_f32(q.zero[r * ng + gi]);
            ck_assert(s >= 0.0f);
            ck_assert_float_eq(z, rintf(z));
            ck_assert(z >= 0.0f && z <= 15.0f);
            if (sym)
                ck_assert_float_eq(z, 8.0f);
            /* |err| <= scale/2, plus the fp16 rounding of scale at the ends */
            double bound = s / 2.0 + 16.0 * s * 0x1p-11 + 1e-7;
            for (int c = gi * g; c < (gi + 1) * g; c++) {
                int code = code_at(&q, r, c);
                ck_assert(code >= 0 && code <= 15);
                double mine = ((double)code - z) * s;
                if (c >= k) {
                    ck_assert_int_eq(code, (int)z); /* padding */
                    ck_assert(eng_q4_dequant_at(&q, r, c) == 0.0f);
                    continue;
                }
                ck_assert_msg(fabs(deq[r * k + c] - mine) <= 1e-7 * fabs(mine) + 1e-12,
                              "dequantize disagrees with the stored form");
                double e = fabs(mine - w[r * k + c]);
                ck_assert_msg(e <= bound, "n=%d k=%d g=%d sym=%d [%d][%d]: err %g > %g", n, k,
                              group, sym, r, c, e, bound);
            }
        }
    }
    free(deq);
    eng_q4_free(&q);
    free(w);
}

START_TEST(bound_every_group_size)
{
    static const int groups[] = {32, 64, 128, 256, 0};
    for (int i = 0; i < 5; i++) {
        check_bound(7, 512, groups[i], false, 0.0f);
        check_bound(7, 512, groups[i], true, 0.0f);
        check_bound(5, 512, groups[i], false, 0.02f); /* skewed: asymmetric zeros != 8 */
    }
}
END_TEST

START_TEST(k288_group256_pads_to_512)
{
    check_bound(9, 288, 256, false, 0.0f);
    check_bound(9, 288, 256, true, 0.0f);
    float *w = random_matrix(3, 288, 0.0f);
    struct krn_q4_weight q;
    ck_assert_int_eq(eng_q4_quantize(w, 3, 288, 256, false, &q, NULL), INF_OK);
    ck_assert_int_eq(q.kp, 512);
    ck_assert_int_eq(krn_q4_groups(&q), 2);
    eng_q4_free(&q);
    free(w);
}
END_TEST

START_TEST(k288_group128_pads_to_384)
{
    check_bound(9, 288, 128, false, 0.0f);
    check_bound(9, 288, 128, true, 0.0f);
    ck_assert_int_eq(eng_q4_padded_k(288, 128), 384);
}
END_TEST

START_TEST(k100_group32_odd_n)
{
    check_bound(13, 100, 32, false, 0.0f);
    check_bound(13, 100, 32, true, 0.01f);
    ck_assert_int_eq(eng_q4_padded_k(100, 32), 128);
    /* per-channel with odd K: one group per row, rounded up to even */
    check_bound(3, 101, 0, false, 0.0f);
    ck_assert_int_eq(eng_q4_padded_k(101, 0), 102);
}
END_TEST

START_TEST(grid_values_are_exact)
{
    /* Values already on an fp16-exact grid come back bit for bit. */
    float w[64];
    for (int i = 0; i < 64; i++)
        w[i] = (float)((i % 16) - 3) * 0.125f;
    struct krn_q4_weight q;
    ck_assert_int_eq(eng_q4_quantize(w, 2, 32, 32, false, &q, NULL), INF_OK);
    ck_assert_float_eq(inf_f16_to_f32(q.scale[0]), 0.125f);
    ck_assert_float_eq(inf_f16_to_f32(q.zero[0]), 3.0f);
    for (int i = 0; i < 64; i++)
        ck_assert_float_eq(eng_q4_dequant_at(&q, i / 32, i % 32), w[i]);
    eng_q4_free(&q);
}
END_TEST

START_TEST(symmetric_uses_absmax_over_7)
{
    float w[32] = {0};
    w[3] = -1.75f;
    w[9] = 0.5f;
    struct krn_q4_weight q;
    ck_assert_int_eq(eng_q4_quantize(w, 1, 32, 32, true, &q, NULL), INF_OK);
    ck_assert_float_eq(inf_f16_to_f32(q.scale[0]), 0.25f);
    ck_assert_int_eq(code_at(&q, 0, 3), 1);  /* 8 - 7 */
    ck_assert_int_eq(code_at(&q, 0, 9), 10); /* 8 + 2 */
    ck_assert_int_eq(code_at(&q, 0, 0), 8);
    ck_assert_float_eq(eng_q4_dequant_at(&q, 0, 3), -1.75f);
    eng_q4_free(&q);
}
END_TEST

START_TEST(zero_rows_and_bad_input)
{
    float w[64] = {0};
    struct krn_q4_weight q;
    struct inf_err err;
    ck_assert_int_eq(eng_q4_quantize(w, 2, 32, 32, false, &q, &err), INF_OK);
    ck_assert_uint_eq(q.scale[0], 0);
    for (int c = 0; c < 32; c++)
        ck_assert(eng_q4_dequant_at(&q, 1, c) == 0.0f);
    ck_assert_uint_eq(eng_q4_bytes(&q), 2 * 16 + 2 * 2 + 2 * 2);
    eng_q4_free(&q);
    eng_q4_free(&q); /* twice is harmless */
    ck_assert_int_eq(eng_q4_quantize(w, 2, 32, 48, false, &q, &err), INF_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err.msg, "48"));
    ck_assert_ptr_null(q.q);
    ck_assert_int_eq(eng_q4_quantize(w, 0, 32, 32, false, &q, &err), INF_E_INVALID);
    w[5] = NAN;
    ck_assert_int_eq(eng_q4_quantize(w, 2, 32, 32, false, &q, &err), INF_E_RANGE);
    ck_assert_ptr_nonnull(strstr(err.msg, "[0][5]"));
    w[5] = 1e30f;
    ck_assert_int_eq(eng_q4_quantize(w, 2, 32, 32, false, &q, &err), INF_E_RANGE);
    ck_assert(!eng_q4_group_valid(16));
    ck_assert(eng_q4_group_valid(0));
}
END_TEST

/* The quantizer as first written (one element at a time, nibbles set one
 * by one): the reference the row-wise, vectorized one must equal byte for
 * byte. */
static void ref_quantize(const float *w, int n, int k, int group, bool sym, struct krn_q4_weight *q)
{
    int kp = eng_q4_padded_k(k, group), g = group ? group : kp, ng = kp / g;
    ck_assert_int_eq(eng_q4_alloc(n, k, kp, g, sym, q, NULL), INF_OK);
    for (int r = 0; r < n; r++)
        for (int gi = 0; gi < ng; gi++) {
            int c0 = gi * g, c1 = c0 + g < k ? c0 + g : k;
            float lo = 0.0f, hi = 0.0f;
            for (int c = c0; c < c1; c++) {
                lo = w[r * k + c] < lo ? w[r * k + c] : lo;
                hi = w[r * k + c] > hi ? w[r * k + c] : hi;
            }
            float amax = -lo > hi ? -lo : hi; /* +0 for an all-zero group */
            float scale = sym ? amax / 7.0f : (hi - lo) / 15.0f, zero = sym ? 8.0f : 0.0f;
            uint16_t sh = inf_f32_to_f16(scale);
            float sc = inf_f16_to_f32(sh);
            if (!sym && sc > 0.0f) {
                zero = rintf(-lo / sc); /* -0 when lo is 0, kept as such */
                zero = zero < 0.0f ? 0.0f : zero > 15.0f ? 15.0f : zero;
            }
            q->scale[r * ng + gi] = sh;
            q->zero[r * ng + gi] = inf_f32_to_f16(zero);
            for (int c = c0; c < c0 + g; c++) {
                int code = (int)zero;
                if (c < k && sc > 0.0f) {
                    float qv = rintf(w[r * k + c] / sc) + zero;
                    code = qv < 0.0f ? 0 : qv > 15.0f ? 15 : (int)qv;
                }
                uint8_t *b = &q->q[(size_t)r * (size_t)(kp / 2) + (size_t)(c / 2)];
                *b = (uint8_t)(c % 2 ? (*b & 0x0f) | (code << 4) : (*b & 0xf0) | code);
            }
        }
}

/* Same shape and bytes; the first difference goes to stderr. */
static bool same_q4(const struct krn_q4_weight *a, const struct krn_q4_weight *b)
{
    size_t ng = (size_t)a->n * (size_t)(a->kp / a->group), nq = (size_t)a->n * (size_t)(a->kp / 2);
    if (a->n != b->n || a->k != b->k || a->kp != b->kp || a->group != b->group ||
        a->symmetric != b->symmetric)
        return false;
    for (size_t i = 0; i < nq; i++)
        if (a->q[i] != b->q[i]) {
            fprintf(stderr, "q byte %zu: %02x vs %02x\n", i, a->q[i], b->q[i]);
            return false;
        }
    for (size_t i = 0; i < ng; i++)
        if (a->scale[i] != b->scale[i] || a->zero[i] != b->zero[i]) {
            fprintf(stderr, "group %zu: scale %04x vs %04x, zero %04x vs %04x\n", i, a->scale[i],
                    b->scale[i], a->zero[i], b->zero[i]);
            return false;
        }
    return true;
}

/* eng_q4_quantize, and eng_q4_quantize_rows over ranges of every size, give
 * the reference bytes (with zeros, negative zeros, all-zero groups, tails
 * shorter than the 8-lane loop and per-channel rows longer than 256). */
START_TEST(rows_match_reference_any_split)
{
    static const struct {
        int n, k, group;
    } shapes[] = {{37, 288, 128}, {16, 100, 32}, {9, 4096, 256}, {5, 300, 0}, {33, 70, 64}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (int sym = 0; sym < 2; sym++) {
            int n = shapes[si].n, k = shapes[si].k, group = shapes[si].group;
            float *w = random_matrix(n, k, 0.01f * (float)sym);
            for (int c = 0; c < k; c++) /* a row of zeros and -0 */
                w[c] = (c & 1) ? -0.0f : 0.0f;
            w[k + 3] = -0.0f;
            struct krn_q4_weight ref, whole, rows;
            ref_quantize(w, n, k, group, sym, &ref);
            ck_assert_int_eq(eng_q4_quantize(w, n, k, group, sym, &whole, NULL), INF_OK);
            ck_assert_msg(same_q4(&whole, &ref), "shape %zu sym %d: whole differs", si, sym);
            for (int step = 1; step <= 7; step += 3) {
                int kp = eng_q4_padded_k(k, group);
                ck_assert_int_eq(eng_q4_alloc(n, k, kp, group ? group : kp, sym, &rows, NULL),
                                 INF_OK);
                for (int r0 = n; r0 > 0;) { /* last rows first */
                    int len = r0 < step ? r0 : step;
                    r0 -= len;
                    ck_assert_int_eq(
                        eng_q4_quantize_rows(w + (size_t)r0 * (size_t)k, r0, len, &rows, NULL),
                        INF_OK);
                }
                ck_assert_msg(same_q4(&rows, &ref), "shape %zu sym %d step %d differs", si, sym,
                              step);
                eng_q4_free(&rows);
            }
            eng_q4_free(&ref);
            eng_q4_free(&whole);
            free(w);
        }
}
END_TEST

START_TEST(rows_errors)
{
    float *w = random_matrix(4, 64, 0.0f);
    struct krn_q4_weight q;
    struct inf_err err;
    ck_assert_int_eq(eng_q4_alloc(4, 64, 64, 32, false, &q, NULL), INF_OK);
    ck_assert_int_eq(eng_q4_quantize_rows(w, 3, 2, &q, &err), INF_E_INVALID);
    w[64 + 40] = NAN; /* row 1 of w, quantized as row 2 */
    ck_assert_int_eq(eng_q4_quantize_rows(w, 1, 2, &q, &err), INF_E_RANGE);
    ck_assert_str_eq(err.msg, "weight [2][40] is not finite");
    w[64 + 40] = 0.0f;
    w[64 + 5] = -INFINITY;
    ck_assert_int_eq(eng_q4_quantize_rows(w, 1, 2, &q, &err), INF_E_RANGE);
    ck_assert_str_eq(err.msg, "weight [2][5] is not finite");
    eng_q4_free(&q);
    free(w);
}
END_TEST

/* eng_q4_gemm_repack on pools of 1, 2, 3 and 5 threads writes the bytes of
 * krn_int4_gemm_repack. */
START_TEST(gemm_repack_any_thread_count)
{
    static const struct {
        int n, k, group;
    } shapes[] = {{1000, 300, 128}, {64, 4096, 32}, {257, 100, 0}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        float *w = random_matrix(shapes[si].n, shapes[si].k, 0.02f);
        struct krn_q4_weight q;
        ck_assert_int_eq(
            eng_q4_quantize(w, shapes[si].n, shapes[si].k, shapes[si].group, false, &q, NULL),
            INF_OK);
        struct krn_int4_gemm_layout lay;
        ck_assert_int_eq(krn_int4_gemm_layout_make(&q, &lay, NULL), INF_OK);
        uint8_t *want = malloc(lay.bytes), *got = malloc(lay.bytes);
        ck_assert_int_eq(krn_int4_gemm_repack(&q, &lay, want, lay.bytes, NULL), INF_OK);
        static const int threads[] = {1, 2, 3, 5};
        for (int ti = 0; ti < 4; ti++) {
            eng_par_t *par = NULL;
            ck_assert_int_eq(eng_par_create(threads[ti], &par, NULL), INF_OK);
            ck_assert_int_eq(eng_par_size(par), threads[ti]);
            memset(got, 0xee, lay.bytes);
            ck_assert_int_eq(eng_q4_gemm_repack(&q, &lay, got, lay.bytes, par, NULL), INF_OK);
            ck_assert_msg(memcmp(got, want, lay.bytes) == 0, "shape %zu, %d threads differ", si,
                          threads[ti]);
            eng_par_destroy(par);
        }
        /* an error from a worker comes back */
        struct inf_err err;
        eng_par_t *par = NULL;
        ck_assert_int_eq(eng_par_create(3, &par, NULL), INF_OK);
        q.zero[q.n * (q.kp / q.group) - 1] = inf_f32_to_f16(2.5f);
        ck_assert_int_eq(eng_q4_gemm_repack(&q, &lay, got, lay.bytes, par, &err),
                         INF_E_UNSUPPORTED);
        ck_assert_ptr_nonnull(strstr(err.msg, "zero point 2.5"));
        eng_par_destroy(par);
        free(want);
        free(got);
        eng_q4_free(&q);
        free(w);
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("quant");
    TCase *t = tcase_create("bounds");
    tcase_add_test(t, bound_every_group_size);
    tcase_add_test(t, k288_group256_pads_to_512);
    tcase_add_test(t, k288_group128_pads_to_384);
    tcase_add_test(t, k100_group32_odd_n);
    suite_add_tcase(s, t);
    t = tcase_create("exact");
    tcase_add_test(t, grid_values_are_exact);
    tcase_add_test(t, symmetric_uses_absmax_over_7);
    tcase_add_test(t, zero_rows_and_bad_input);
    suite_add_tcase(s, t);
    t = tcase_create("rows");
    tcase_set_timeout(t, 60);
    tcase_add_test(t, rows_match_reference_any_split);
    tcase_add_test(t, rows_errors);
    tcase_add_test(t, gemm_repack_any_thread_count);
    suite_add_tcase(s, t);
    SRunner *r = srunner_create(s);
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
