#include "common/inf.h"

#include <check.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

START_TEST(status_strings)
{
    ck_assert_str_eq(inf_status_str(INF_OK), "ok");
    ck_assert_str_eq(inf_status_str(INF_E_INVALID), "invalid argument");
    ck_assert_str_eq(inf_status_name(INF_E_CONTEXT), "E_CONTEXT");
    ck_assert_str_eq(inf_status_str((inf_status_t)-999), "unknown status");
    struct inf_err err;
    ck_assert_int_eq(inf_err_set(&err, INF_E_RANGE, "t=%g", 2.5), INF_E_RANGE);
    ck_assert_int_eq(err.code, INF_E_RANGE);
    ck_assert_str_eq(err.msg, "t=2.5");
    ck_assert_int_eq(inf_err_set(NULL, INF_E_IO, "x"), INF_E_IO);
    inf_err_clear(&err);
    ck_assert_int_eq(err.code, INF_OK);
    ck_assert_str_eq(err.msg, "");
}
END_TEST

START_TEST(arena_alloc)
{
    struct inf_arena a;
    inf_arena_init(&a, 64);
    char *p[100];
    for (int i = 0; i < 100; i++) {
        p[i] = inf_arena_sprintf(&a, "item-%d", i);
        ck_assert_ptr_nonnull(p[i]);
        ck_assert_uint_eq((uintptr_t)p[i] % 16, 0);
    }
    for (int i = 0; i < 100; i++) {
        char want[32];
        snprintf(want, sizeof want, "item-%d", i);
        ck_assert_str_eq(p[i], want);
    }
    unsigned char *big = inf_arena_calloc(&a, 1000, 10);
    ck_assert_ptr_nonnull(big);
    for (int i = 0; i < 10000; i++)
        ck_assert_uint_eq(big[i], 0);
    ck_assert_ptr_null(inf_arena_calloc(&a, SIZE_MAX / 2, 4));
    inf_arena_reset(&a);
    ck_assert_uint_eq(a.used_total, 0);
    ck_assert_str_eq(inf_arena_strdup(&a, "again"), "again");
    inf_arena_fini(&a);
    inf_arena_fini(NULL);
}
END_TEST

struct item {
    struct inf_qnode node;
    int producer, seq;
};

#define PER_PRODUCER 20000

static void *producer(void *arg)
{
    inf_queue_t *q = ((void **)arg)[0];
    int id = (int)(intptr_t)((void **)arg)[1];
    for (int i = 0; i < PER_PRODUCER; i++) {
        struct item *it = malloc(sizeof *it);
        it->producer = id;
        it->seq = i;
        ck_assert_int_eq(inf_queue_push(q, &it->node, NULL), INF_OK);
    }
    return NULL;
}

START_TEST(queue_two_producers)
{
    inf_queue_t *q = inf_queue_create(0);
    pthread_t t[2];
    void *args[2][2] = {{q, (void *)0}, {q, (void *)1}};
    for (int i = 0; i < 2; i++)
        pthread_create(&t[i], NULL, producer, args[i]);
    int next[2] = {0, 0};
    int got = 0;
    while (got < 2 * PER_PRODUCER) {
        struct inf_qnode *n = inf_queue_pop(q, 1000);
        ck_assert_ptr_nonnull(n);
        struct item *it = (struct item *)n;
        /* FIFO per producer: nothing lost, nothing reordered. */
        ck_assert_int_eq(it->seq, next[it->producer]);
        next[it->producer]++;
        free(it);
        got++;
    }
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    ck_assert_int_eq(next[0], PER_PRODUCER);
    ck_assert_int_eq(next[1], PER_PRODUCER);
    ck_assert_ptr_null(inf_queue_pop(q, 0));
    inf_queue_destroy(q);
}
END_TEST

START_TEST(queue_capacity_and_close)
{
    inf_queue_t *q = inf_queue_create(2);
    struct item a, b, c;
    bool was_empty;
    ck_assert_int_eq(inf_queue_push(q, &a.node, &was_empty), INF_OK);
    ck_assert(was_empty);
    ck_assert_int_eq(inf_queue_push(q, &b.node, &was_empty), INF_OK);
    ck_assert(!was_empty);
    ck_assert_int_eq(inf_queue_push(q, &c.node, NULL), INF_E_BUSY);
    struct inf_qnode *all = inf_queue_take_all(q);
    ck_assert_ptr_eq(all, &a.node);
    ck_assert_ptr_eq(all->next, &b.node);
    ck_assert_ptr_null(all->next->next);
    ck_assert_uint_eq(inf_queue_len(q), 0);
    inf_queue_close(q);
    ck_assert_int_eq(inf_queue_push(q, &c.node, NULL), INF_E_SHUTDOWN);
    ck_assert_ptr_null(inf_queue_pop(q, -1)); /* closed and empty: no wait */
    inf_queue_destroy(q);
}
END_TEST

START_TEST(half_round_trip)
{
    ck_assert_uint_eq(inf_f32_to_f16(1.0f), 0x3c00);
    ck_assert_uint_eq(inf_f32_to_f16(-2.0f), 0xc000);
    ck_assert_uint_eq(inf_f32_to_f16(65504.0f), 0x7bff);
    ck_assert_uint_eq(inf_f32_to_f16(1e6f), 0x7c00);
    ck_assert_uint_eq(inf_f32_to_f16(5.9604645e-08f), 0x0001);
    ck_assert(fabsf(inf_f16_to_f32(0x0001) - 5.9604645e-08f) < 1e-12f);
    ck_assert(isnan(inf_f16_to_f32(inf_f32_to_f16(NAN))));
    /* Every finite half survives half -> float -> half. */
    for (uint32_t h = 0; h < 0x10000; h++) {
        if ((h & 0x7c00) == 0x7c00)
            continue;
        ck_assert_uint_eq(inf_f32_to_f16(inf_f16_to_f32((uint16_t)h)), h);
    }
    /* Ties go to even: 1 + 2^-11 is halfway between 1 and 1 + 2^-10. */
    ck_assert_uint_eq(inf_f32_to_f16(1.0f + 0x1p-11f), 0x3c00);
    ck_assert_uint_eq(inf_f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02);
    ck_assert_uint_eq(inf_f32_to_bf16(1.0f), 0x3f80);
    ck_assert(inf_bf16_to_f32(0x4049) == 3.140625f);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("common");
    TCase *tc = tcase_create("status");
    tcase_add_test(tc, status_strings);
    suite_add_tcase(s, tc);
    tc = tcase_create("arena");
    tcase_add_test(tc, arena_alloc);
    suite_add_tcase(s, tc);
    tc = tcase_create("queue");
    tcase_add_test(tc, queue_two_producers);
    tcase_add_test(tc, queue_capacity_and_close);
    tcase_set_timeout(tc, 60);
    suite_add_tcase(s, tc);
    tc = tcase_create("half");
    tcase_add_test(tc, half_round_trip);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
