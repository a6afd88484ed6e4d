/* Shards of a canonical INT4 weight (engine/tp/shard.h) against the whole
 * weight, value for value: rows as they were; column ranges cut anywhere
 * (inside groups, at their edges, the last columns), every group size and
 * per-channel, symmetric and asymmetric: the lead columns and the padding
 * dequantize to 0, the range to W's values exactly, and the shards of a
 * split of K together give x . W^T of the whole (double sums). */
#include "engine/tp/shard.h"
#include "engine/weights/quant.h"

#include <check.h>
#include <math.h>
#include <stdlib.h>

static uint64_t rng = 11;

static float urand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((double)(rng >> 11) * 0x1p-53 * 2.0 - 1.0);
}

static void quantized(int32_t n, int32_t k, int32_t group, bool sym, struct krn_q4_weight *w)
{
    float *v = malloc((size_t)n * k * sizeof *v);
    for (int64_t i = 0; i < (int64_t)n * k; i++)
        v[i] = urand();
    ck_assert_int_eq(eng_q4_quantize(v, n, k, group, sym, w, NULL), INF_OK);
    free(v);
}

static void check_cols(const struct krn_q4_weight *w, int32_t c0, int32_t c1)
{
    struct krn_q4_weight s;
    int32_t lead = -1;
    ck_assert_int_eq(eng_q4_take_cols(w, c0, c1, &s, &lead, NULL), INF_OK);
    ck_assert_int_eq(lead, krn_q4_groups(w) == 1 ? 0 : c0 % w->group);
    ck_assert_int_eq(s.k, lead + c1 - c0);
    ck_assert_int_eq(s.kp % s.group, 0);
    ck_assert(krn_q4_groups(w) > 1 ? s.group == w->group : krn_q4_groups(&s) == 1);
    for (int32_t r = 0; r < w->n; r++)
        for (int32_t j = 0; j < s.kp; j++) {
            const float got = eng_q4_dequant_at(&s, r, j);
            const bool in = j >= lead && j < s.k;
            const float want = in ? eng_q4_dequant_at(w, r, c0 + j - lead) : 0.0f;
            ck_assert_msg(got == want, "row %d col %d of [%d, %d): %g, want %g", r, j, c0, c1,
                          (double)got, (double)want);
        }
    eng_q4_free(&s);
}

START_TEST(column_ranges)
{
    const int32_t groups[] = {32, 64, 128, 0};
    for (int gi = 0; gi < 4; gi++)
        for (int sym = 0; sym < 2; sym++) {
            struct krn_q4_weight w;
            quantized(6, 1408, groups[gi], sym, &w);
            /* the tp 4 split of 1408 (352 each: groups of 128 cut), odd cuts,
             * a group's edges, the last columns, one column */
            const int32_t cuts[][2] = {{0, 352},     {352, 704}, {704, 1056}, {1056, 1408},
                                       {5, 6},       {127, 129}, {128, 256},  {1, 1407},
                                       {1400, 1408}, {0, 1408}};
            for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++)
                check_cols(&w, cuts[i][0], cuts[i][1]);
            eng_q4_free(&w);
        }
    struct krn_q4_weight w, s;
    int32_t lead;
    quantized(2, 100, 32, false, &w); /* K not a multiple of the group */
    check_cols(&w, 70, 100);
    struct inf_err err;
    ck_assert_int_eq(eng_q4_take_cols(&w, 50, 50, &s, &lead, &err), INF_E_INVALID);
    ck_assert_int_eq(eng_q4_take_cols(&w, 0, 101, &s, &lead, &err), INF_E_INVALID);
    eng_q4_free(&w);
}
END_TEST

/* x . W^T of the whole against the shards of a 4-way split of K, each fed
 * its lead zero columns. */
START_TEST(split_of_k_sums_to_the_whole)
{
    struct krn_q4_weight w;
    const int32_t n = 8, k = 1408, tp = 4;
    quantized(n, k, 128, false, &w);
    double *x = malloc((size_t)k * sizeof *x);
    for (int32_t j = 0; j < k; j++)
        x[j] = urand();
    for (int32_t r = 0; r < n; r++) {
        double whole = 0, parts = 0;
        for (int32_t j = 0; j < k; j++)
            whole += x[j] * eng_q4_dequant_at(&w, r, j);
        for (int32_t p = 0; p < tp; p++) {
            struct krn_q4_weight s;
            int32_t lead;
            const int32_t c0 = p * k / tp, c1 = (p + 1) * k / tp;
            ck_assert_int_eq(eng_q4_take_cols(&w, c0, c1, &s, &lead, NULL), INF_OK);
            for (int32_t j = 0; j < s.kp; j++) {
                const double xj = j >= lead && j < s.k ? x[c0 + j - lead] : 0.0;
                parts += xj * eng_q4_dequant_at(&s, r, j);
            }
            eng_q4_free(&s);
        }
        ck_assert_msg(fabs(whole - parts) <= 1e-9 * (fabs(whole) + 1), "row %d: %g against %g", r,
                      whole, parts);
    }
    free(x);
    eng_q4_free(&w);
}
END_TEST

/* An act-order weight's rank keeps every stored column whose input column
 * is its own and reads 0 in the others, so the ranks' layers sum to the
 * whole one column by column. */
START_TEST(act_order_mask)
{
    struct krn_q4_weight w;
    const int32_t n = 6, k = 1408, tp = 4;
    for (int sym = 0; sym < 2; sym++) {
        quantized(n, k, 128, sym, &w);
        w.perm = malloc((size_t)k * sizeof *w.perm);
        for (int32_t i = 0; i < k; i++)
            w.perm[i] = i;
        for (int32_t i = k - 1; i > 0; i--) { /* a shuffle */
            const int32_t j = (int32_t)((urand() + 1) * 0.5 * i), t = w.perm[i];
            w.perm[i] = w.perm[j < i ? j : i];
            w.perm[j < i ? j : i] = t;
        }
        double *sum = calloc((size_t)n * k, sizeof *sum);
        for (int32_t p = 0; p < tp; p++) {
            struct krn_q4_weight s;
            const int32_t c0 = p * k / tp, c1 = (p + 1) * k / tp;
            ck_assert_int_eq(eng_q4_mask_cols(&w, c0, c1, &s, NULL), INF_OK);
            ck_assert_int_eq(s.k, k);
            ck_assert_mem_eq(s.perm, w.perm, (size_t)k * sizeof *w.perm);
            for (int32_t r = 0; r < n; r++)
                for (int32_t i = 0; i < k; i++) {
                    const float v = eng_q4_dequant_at(&s, r, i);
                    const bool mine = w.perm[i] >= c0 && w.perm[i] < c1;
                    ck_assert(mine ? v == eng_q4_dequant_at(&w, r, i) : v == 0.0f);
                    sum[(int64_t)r * k + i] += v;
                }
            eng_q4_free(&s);
        }
        for (int32_t r = 0; r < n; r++)
            for (int32_t i = 0; i < k; i++)
                ck_assert(sum[(int64_t)r * k + i] == eng_q4_dequant_at(&w, r, i));
        free(sum);
        eng_q4_free(&w);
    }
}
END_TEST

START_TEST(row_ranges)
{
    struct krn_q4_weight w, s;
    quantized(40, 96, 32, false, &w);
    const struct eng_rows take[3] = {{4, 3}, {30, 10}, {0, 1}};
    ck_assert_int_eq(eng_q4_take_rows(&w, take, 3, &s, NULL), INF_OK);
    ck_assert_int_eq(s.n, 14);
    int32_t at = 0;
    for (int i = 0; i < 3; i++)
        for (int32_t r = take[i].first; r < take[i].first + take[i].count; r++, at++)
            for (int32_t j = 0; j < w.kp; j++)
                ck_assert(eng_q4_dequant_at(&s, at, j) == eng_q4_dequant_at(&w, r, j));
    eng_q4_free(&s);
    struct inf_err err;
    const struct eng_rows bad[1] = {{35, 6}};
    ck_assert_int_eq(eng_q4_take_rows(&w, bad, 1, &s, &err), INF_E_INVALID);
    ck_assert_int_eq(eng_q4_take_rows(&w, take, 0, &s, &err), INF_E_INVALID);
    eng_q4_free(&w);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("shard");
    TCase *t = tcase_create("q4");
    tcase_add_test(t, column_ranges);
    tcase_add_test(t, split_of_k_sums_to_the_whole);
    tcase_add_test(t, row_ranges);
    tcase_add_test(t, act_order_mask);
    suite_add_tcase(s, t);
    SRunner *r = srunner_create(s);
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
