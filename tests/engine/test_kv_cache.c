/* Paged KV block allocator: reserve/free, all-or-nothing, limits, tables. */
#include "engine/batch.h"
#include "engine/sched/kv_cache.h"

#include <check.h>
#include <stdlib.h>
#include <string.h>

START_TEST(reserve_and_free)
{
    eng_kv_cache_t *kv;
    struct inf_err err;
    ck_assert_int_eq(eng_kv_cache_create(10, 3, 4, &kv, &err), INF_OK);
    ck_assert_int_eq(eng_kv_cache_free_blocks(kv), 10);
    ck_assert_int_eq(eng_kv_seq_blocks_needed(kv, 0, 17), 2);
    ck_assert_int_eq(eng_kv_seq_reserve(kv, 0, 17, &err), INF_OK);
    ck_assert_int_eq(eng_kv_seq_n_blocks(kv, 0), 2);
    ck_assert_int_eq(eng_kv_seq_reserve(kv, 0, 32, &err), INF_OK); /* still 2 */
    ck_assert_int_eq(eng_kv_seq_n_blocks(kv, 0), 2);
    ck_assert_int_eq(eng_kv_seq_reserve(kv, 1, 64, &err), INF_OK);
    ck_assert_int_eq(eng_kv_cache_free_blocks(kv), 4);
    const int32_t *bt = eng_kv_cache_block_table(kv);
    /* lowest ids first, every block used once, unused entries -1 */
    ck_assert_int_eq(bt[0], 0);
    ck_assert_int_eq(bt[1], 1);
    ck_assert_int_eq(bt[2], -1);
    int used[10] = {0};
    for (int i = 0; i < 3 * 4; i++)
        if (bt[i] >= 0)
            used[bt[i]]++;
    for (int i = 0; i < 6; i++)
        ck_assert_int_eq(used[i], 1);
    /* all or nothing */
    ck_assert_int_eq(eng_kv_seq_reserve(kv, 2, 16 * 5, &err), INF_E_CONTEXT);
    ck_assert_int_eq(eng_kv_seq_reserve(kv, 0, 16 * 4, &err), INF_OK);
    ck_assert_int_eq(eng_kv_seq_reserve(kv, 2, 16 * 3, &err), INF_E_BUSY);
    ck_assert_int_eq(eng_kv_seq_n_blocks(kv, 2), 0);
    ck_assert_int_eq(eng_kv_cache_free_blocks(kv), 2);
    /* freeing returns blocks; the last freed is reused first */
    int32_t first = bt[1 * 4 + 0];
    eng_kv_seq_free(kv, 1);
    ck_assert_int_eq(eng_kv_cache_free_blocks(kv), 6);
    ck_assert_int_eq(bt[4], -1);
    ck_assert_int_eq(eng_kv_seq_reserve(kv, 2, 1, &err), INF_OK);
    ck_assert_int_eq(bt[2 * 4], first); /* slot 1's first block went back last */
    ck_assert_int_eq(eng_kv_seq_reserve(kv, 3, 1, &err), INF_E_INVALID);
    eng_kv_seq_free(kv, 7); /* out of range: no-op */
    eng_kv_cache_destroy(kv);
    eng_kv_cache_destroy(NULL);
    ck_assert_int_eq(eng_kv_cache_create(0, 1, 1, &kv, &err), INF_E_INVALID);
}
END_TEST

START_TEST(lifo_reuse)
{
    eng_kv_cache_t *kv;
    ck_assert_int_eq(eng_kv_cache_create(8, 2, 8, &kv, NULL), INF_OK);
    ck_assert_int_eq(eng_kv_seq_reserve(kv, 0, 3 * ENG_KV_BLOCK, NULL), INF_OK);
    const int32_t *bt = eng_kv_cache_block_table(kv);
    int32_t b2 = bt[2];
    ck_assert_int_eq(b2, 2);
    eng_kv_seq_free(kv, 0);
    ck_assert_int_eq(eng_kv_seq_reserve(kv, 1, 1, NULL), INF_OK);
    /* blocks were pushed back last-to-first, so block 0 is on top */
    ck_assert_int_eq(bt[8], 0);
    ck_assert_int_eq(eng_kv_cache_n_blocks(kv), 8);
    ck_assert_int_eq(eng_kv_cache_n_slots(kv), 2);
    ck_assert_int_eq(eng_kv_cache_max_blocks(kv), 8);
    eng_kv_cache_destroy(kv);
}
END_TEST

START_TEST(shared_blocks)
{
    eng_kv_cache_t *kv;
    struct inf_err err;
    /* block calls only: no slots */
    ck_assert_int_eq(eng_kv_cache_create(3, 0, 0, &kv, &err), INF_OK);
    ck_assert_int_eq(eng_kv_cache_n_slots(kv), 0);
    ck_assert_int_eq(eng_kv_seq_reserve(kv, 0, 1, &err), INF_E_INVALID);
    ck_assert_int_eq(eng_kv_block_alloc(kv), 0);
    ck_assert_int_eq(eng_kv_block_alloc(kv), 1);
    ck_assert_int_eq(eng_kv_cache_free_blocks(kv), 1);
    /* block 0 held twice: the first release keeps it */
    eng_kv_block_ref(kv, 0);
    eng_kv_block_unref(kv, 0);
    ck_assert_int_eq(eng_kv_cache_free_blocks(kv), 1);
    eng_kv_block_unref(kv, 0);
    ck_assert_int_eq(eng_kv_cache_free_blocks(kv), 2);
    ck_assert_int_eq(eng_kv_block_alloc(kv), 0); /* last freed, first reused */
    ck_assert_int_eq(eng_kv_block_alloc(kv), 2);
    ck_assert_int_eq(eng_kv_block_alloc(kv), -1);
    ck_assert_int_eq(eng_kv_cache_free_blocks(kv), 0);
    eng_kv_cache_destroy(kv);
    ck_assert_int_eq(eng_kv_cache_create(3, -1, 1, &kv, &err), INF_E_INVALID);
}
END_TEST

START_TEST(slot_shares_block)
{
    /* a block a slot holds and another holder shares outlives the slot */
    eng_kv_cache_t *kv;
    ck_assert_int_eq(eng_kv_cache_create(4, 1, 4, &kv, NULL), INF_OK);
    ck_assert_int_eq(eng_kv_seq_reserve(kv, 0, 2 * ENG_KV_BLOCK, NULL), INF_OK);
    const int32_t *bt = eng_kv_cache_block_table(kv);
    int32_t b0 = bt[0];
    eng_kv_block_ref(kv, b0);
    eng_kv_seq_free(kv, 0);
    ck_assert_int_eq(eng_kv_cache_free_blocks(kv), 3);
    eng_kv_block_unref(kv, b0);
    ck_assert_int_eq(eng_kv_cache_free_blocks(kv), 4);
    ck_assert_int_eq(eng_kv_block_alloc(kv), b0);
    eng_kv_cache_destroy(kv);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("kv_cache");
    TCase *t = tcase_create("blocks");
    tcase_add_test(t, reserve_and_free);
    tcase_add_test(t, lifo_reuse);
    suite_add_tcase(s, t);
    TCase *sh = tcase_create("sharing");
    tcase_add_test(sh, shared_blocks);
    tcase_add_test(sh, slot_shares_block);
    suite_add_tcase(s, sh);
    SRunner *r = srunner_create(s);
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
