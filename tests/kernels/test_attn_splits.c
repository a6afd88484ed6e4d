/* Unit tests of krn_cuda_attn_splits_cap (kernels/attn_cuda.h): the most
 * splits a decode attention group may take so that a work list fills one
 * wave of resident blocks and never goes past it; and of the decode
 * configuration chosen by shape (krn_cuda_attn_impl_for), where built. */
#include "kernels/attn_cuda.h"

#include <check.h>
#include <stdint.h>

static struct krn_cuda_attn_config cfg_of(int32_t ctas, int32_t max_splits)
{
    struct krn_cuda_attn_config c = {.rows = 16,
                                     .tile = 64,
                                     .split_keys = 64,
                                     .max_splits = max_splits,
                                     .ctas_per_sm = ctas,
                                     .fused_combine = true};
    return c;
}

/* Every shape: at least 1, at most max_splits; below a wave of row sets the
 * items stay within the wave and one split more would pass it (unless the
 * cap is max_splits); from a wave of row sets on, no splits. */
START_TEST(test_within_one_wave)
{
    static const int32_t sms[] = {1, 7, 108, 132};
    static const int32_t ctas[] = {1, 2, 3};
    static const int32_t maxs[] = {1, 8, 256};
    for (size_t a = 0; a < sizeof sms / sizeof sms[0]; a++)
        for (size_t b = 0; b < sizeof ctas / sizeof ctas[0]; b++)
            for (size_t m = 0; m < sizeof maxs / sizeof maxs[0]; m++) {
                const struct krn_cuda_attn_config cfg = cfg_of(ctas[b], maxs[m]);
                const int64_t wave = (int64_t)sms[a] * ctas[b];
                for (int64_t n = 1; n <= 3 * wave + 5; n++) {
                    const int64_t cap = krn_cuda_attn_splits_cap(n, sms[a], &cfg);
                    ck_assert_int_ge(cap, 1);
                    ck_assert_int_le(cap, maxs[m]);
                    if (n >= wave) {
                        ck_assert_int_eq(cap, 1);
                        continue;
                    }
                    ck_assert_int_le(n * cap, wave);
                    if (cap < maxs[m])
                        ck_assert_int_gt(n * (cap + 1), wave);
                }
            }
}
END_TEST

/* The H200's Llama-2 decode steps (132 SMs, two blocks an SM, 32 row sets a
 * sequence): 1, 2, 4 and 8 rows get 8, 4, 2 and 1 splits a row set, 256
 * items each; rounding up gave 9, 5, 3 and 2 (288 to 512 items). */
START_TEST(test_llama2_buckets)
{
    const struct krn_cuda_attn_config cfg = cfg_of(2, 256);
    ck_assert_int_eq(krn_cuda_attn_splits_cap(32, 132, &cfg), 8);
    ck_assert_int_eq(krn_cuda_attn_splits_cap(64, 132, &cfg), 4);
    ck_assert_int_eq(krn_cuda_attn_splits_cap(128, 132, &cfg), 2);
    ck_assert_int_eq(krn_cuda_attn_splits_cap(256, 132, &cfg), 1);
    ck_assert_int_eq(krn_cuda_attn_splits_cap(512, 132, &cfg), 1);
    /* no row sets: nothing to split */
    ck_assert_int_eq(krn_cuda_attn_splits_cap(0, 132, &cfg), 1);
}
END_TEST

#ifdef INT4SERVE_HAVE_CUDA
/* The configuration by shape (no device needed): w4 s2 for head_dim 128
 * decode steps of 768 row sets and more (16 query rows of one KV head a
 * row set): Llama-2-7B (32 KV heads, no groups) from 24 rows, Llama-3-8B
 * (8 KV heads of 4 query heads) from 96; also 265 to 396 row sets (one
 * wave of w4 s2, two of w4 s3: Llama-3-8B's 48 rows); the default
 * elsewhere: up to 264 row sets and 397 to 767 (512 lost on w4 s2),
 * head_dim 64 and 256, prefill, shapes it cannot run. */
START_TEST(test_impl_by_shape)
{
    const int32_t w4s2 = krn_cuda_attn_impl_for(128, true, 24, 32, 32);
    ck_assert_int_ne(w4s2, KRN_ATTN_AUTO);
    ck_assert_str_eq(krn_cuda_attn_impl_name(w4s2), "tc-decode w4 s2");
    ck_assert_int_eq(krn_cuda_attn_impl_for(128, true, 32, 32, 32), w4s2);
    ck_assert_int_eq(krn_cuda_attn_impl_for(128, true, 128, 32, 32), w4s2);
    ck_assert_int_eq(krn_cuda_attn_impl_for(96, true, 64, 32, 32), w4s2); /* padded to 128 */
    ck_assert_int_eq(krn_cuda_attn_impl_for(128, true, 23, 32, 32), KRN_ATTN_AUTO);
    ck_assert_int_eq(krn_cuda_attn_impl_for(128, true, 16, 32, 32), KRN_ATTN_AUTO);
    ck_assert_int_eq(krn_cuda_attn_impl_for(128, true, 1, 32, 32), KRN_ATTN_AUTO);
    /* Llama-3-8B: 8 row sets a token */
    ck_assert_int_eq(krn_cuda_attn_impl_for(128, true, 128, 32, 8), w4s2);
    ck_assert_int_eq(krn_cuda_attn_impl_for(128, true, 96, 32, 8), w4s2);
    ck_assert_int_eq(krn_cuda_attn_impl_for(128, true, 64, 32, 8), KRN_ATTN_AUTO);
    ck_assert_int_eq(krn_cuda_attn_impl_for(128, true, 48, 32, 8), w4s2); /* one wave of it */
    ck_assert_int_eq(krn_cuda_attn_impl_for(128, true, 49, 32, 8), w4s2);
    ck_assert_int_eq(krn_cuda_attn_impl_for(128, true, 50, 32, 8), KRN_ATTN_AUTO);
    ck_assert_int_eq(krn_cuda_attn_impl_for(128, true, 34, 32, 8), w4s2);
    ck_assert_int_eq(krn_cuda_attn_impl_for(128, true, 33, 32, 8), KRN_ATTN_AUTO);
    ck_assert_int_eq(krn_cuda_attn_impl_for(128, true, 32, 32, 8), KRN_ATTN_AUTO);
    /* groups of 32 query heads: two row sets a KV head */
    ck_assert_int_eq(krn_cuda_attn_impl_for(128, true, 128, 64, 2), KRN_ATTN_AUTO);
    ck_assert_int_eq(krn_cuda_attn_impl_for(128, true, 192, 64, 2), w4s2);
    /* head_dim 64: w4 s3 instead of w8 s2 above 264 row sets (Llama-3.2-1B
     * shaped: 8 KV heads of 4, from 34 rows) */
    const int32_t w4s3 = krn_cuda_attn_impl_for(64, true, 48, 32, 8);
    ck_assert_int_ne(w4s3, KRN_ATTN_AUTO);
    ck_assert_str_eq(krn_cuda_attn_impl_name(w4s3), "tc-decode w4 s3");
    ck_assert_int_eq(krn_cuda_attn_impl_for(64, true, 34, 32, 8), w4s3);
    ck_assert_int_eq(krn_cuda_attn_impl_for(64, true, 64, 32, 8), w4s3);
    ck_assert_int_eq(krn_cuda_attn_impl_for(64, true, 128, 32, 8), w4s3);
    ck_assert_int_eq(krn_cuda_attn_impl_for(64, true, 128, 32, 32), w4s3);
    ck_assert_int_eq(krn_cuda_attn_impl_for(64, true, 33, 32, 8), KRN_ATTN_AUTO);
    ck_assert_int_eq(krn_cuda_attn_impl_for(64, true, 32, 32, 8), KRN_ATTN_AUTO);
    ck_assert_int_eq(krn_cuda_attn_impl_for(64, true, 8, 32, 8), KRN_ATTN_AUTO);
    ck_assert_int_eq(krn_cuda_attn_impl_for(64, true, 1, 32, 8), KRN_ATTN_AUTO);
    ck_assert_int_eq(krn_cuda_attn_impl_for(256, true, 128, 32, 32), KRN_ATTN_AUTO);
    ck_assert_int_eq(krn_cuda_attn_impl_for(128, false, 128, 32, 32), KRN_ATTN_AUTO);
    ck_assert_int_eq(krn_cuda_attn_impl_for(12, true, 128, 32, 32), KRN_ATTN_AUTO);
    ck_assert_int_eq(krn_cuda_attn_impl_for(128, true, 128, 32, 0), KRN_ATTN_AUTO);
    ck_assert_int_eq(krn_cuda_attn_impl_for(128, true, 128, 30, 8), KRN_ATTN_AUTO);
    ck_assert_int_eq(krn_cuda_attn_impl_for(128, true, 0, 32, 32), KRN_ATTN_AUTO);
}
END_TEST
#endif

static Suite *suite(void)
{
    Suite *s = suite_create("attn_splits");
    TCase *tc = tcase_create("cap");
    tcase_add_test(tc, test_within_one_wave);
    tcase_add_test(tc, test_llama2_buckets);
#ifdef INT4SERVE_HAVE_CUDA
    tcase_add_test(tc, test_impl_by_shape);
#endif
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
