/* The local communicator (engine/tp/comm.h): an all-reduce over threads gives
 * every rank the sum in rank order, bit for bit the same on all ranks and
 * equal to a plain loop; strided rows keep their padding; many collectives
 * in a row reuse the slots safely; a collective larger than the room taken
 * at creation grows it; an aborted group lets no rank wait; a group of one
 * is a no-op. */
#include "engine/tp/comm.h"

#include <check.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { M = 5, COLS = 37, LD = 41, ROUNDS = 300 };

struct rank_job {
    eng_comm_t *c;
    float x[M * LD];
    inf_status_t big;
    int bad_rounds;
};

static float value(int rank, int round, int i)
{
    /* values whose sum depends on the order (different magnitudes) */
    uint32_t h = (uint32_t)(rank * 7919 + round * 104729 + i * 31) * 2654435761u;
    return (float)((h >> 8) & 0xffff) * (rank % 2 ? 1e-3f : 1e3f) / 65536.0f - 0.25f;
}

static void fill(struct rank_job *j, int round)
{
    for (int r = 0; r < M; r++)
        for (int c = 0; c < LD; c++)
            j->x[r * LD + c] = c < COLS ? value(eng_comm_rank(j->c), round, r * COLS + c) : -7.0f;
}

static int g_size;

static void *run(void *arg)
{
    struct rank_job *j = arg;
    for (int round = 0; round < ROUNDS; round++) {
        fill(j, round);
        if (eng_comm_all_reduce_f32(j->c, j->x, LD, M, COLS, NULL) != INF_OK) {
            j->bad_rounds++;
            continue;
        }
        for (int r = 0; r < M; r++)
            for (int c = 0; c < LD; c++) {
                float want = -7.0f;
                if (c < COLS) {
                    want = value(0, round, r * COLS + c);
                    for (int k = 1; k < g_size; k++)
                        want += value(k, round, r * COLS + c);
                }
                if (memcmp(&want, &j->x[r * LD + c], sizeof want) != 0) {
                    j->bad_rounds++;
                    r = M;
                    break;
                }
            }
    }
    /* a larger collective than the room taken at creation: the room grows */
    static float big[(M + 40) * COLS];
    for (int i = 0; i < (M + 40) * COLS; i++)
        big[i] = 0; /* every rank writes its own copy below */
    float *mine = malloc(sizeof big);
    for (int i = 0; i < (M + 40) * COLS; i++)
        mine[i] = (float)(eng_comm_rank(j->c) + 1);
    j->big = eng_comm_all_reduce_f32(j->c, mine, COLS, M + 40, COLS, NULL);
    for (int i = 0; i < (M + 40) * COLS && j->big == INF_OK; i++)
        if (mine[i] != (float)(g_size * (g_size + 1) / 2))
            j->big = INF_E_INTERNAL;
    free(mine);
    return NULL;
}

START_TEST(all_reduce_over_threads)
{
    for (int size = 1; size <= 4; size++) {
        g_size = size;
        eng_comm_t *ranks[4];
        ck_assert_int_eq(eng_comm_local_create(size, (size_t)M * COLS, ranks, NULL), INF_OK);
        struct rank_job jobs[4];
        pthread_t th[4];
        for (int r = 0; r < size; r++) {
            memset(&jobs[r], 0, sizeof jobs[r]);
            jobs[r].c = ranks[r];
            ck_assert_int_eq(eng_comm_rank(ranks[r]), r);
            ck_assert_int_eq(eng_comm_size(ranks[r]), size);
            pthread_create(&th[r], NULL, run, &jobs[r]);
        }
        for (int r = 0; r < size; r++) {
            pthread_join(th[r], NULL);
            ck_assert_msg(jobs[r].bad_rounds == 0, "size %d rank %d: %d rounds wrong", size, r,
                          jobs[r].bad_rounds);
            ck_assert_int_eq(jobs[r].big, INF_OK);
        }
        for (int r = 0; r < size; r++)
            eng_comm_destroy(ranks[r]);
    }
}
END_TEST

START_TEST(bad_arguments)
{
    eng_comm_t *ranks[2];
    struct inf_err err;
    ck_assert_int_eq(eng_comm_local_create(0, 16, ranks, &err), INF_E_INVALID);
    ck_assert_int_eq(eng_comm_local_create(1, 16, ranks, &err), INF_OK);
    float x[4] = {1, 2, 3, 4};
    ck_assert_int_eq(eng_comm_all_reduce_f32(ranks[0], x, 1, 2, 2, &err), INF_E_INVALID);
    ck_assert_int_eq(eng_comm_all_reduce_f32(ranks[0], x, 2, 2, 2, &err), INF_OK);
    ck_assert(x[0] == 1 && x[3] == 4); /* one rank: the sum is itself */
    eng_comm_destroy(ranks[0]);
    eng_comm_destroy(NULL);
}
END_TEST

static void *wait_reduce(void *arg)
{
    eng_comm_t *c = arg;
    float x[4] = {0};
    return (void *)(intptr_t)eng_comm_all_reduce_f32(c, x, 4, 1, 4, NULL);
}

/* Rank 1 waits in a collective rank 0 never reaches; the abort lets it out. */
START_TEST(abort_frees_the_waiting)
{
    eng_comm_t *ranks[2];
    ck_assert_int_eq(eng_comm_local_create(2, 0, ranks, NULL), INF_OK);
    pthread_t th;
    pthread_create(&th, NULL, wait_reduce, ranks[1]);
    usleep(20000);
    eng_comm_abort(ranks[0]);
    void *ret;
    pthread_join(th, &ret);
    ck_assert_int_eq((int)(intptr_t)ret, INF_E_INTERNAL);
    float x[4] = {0};
    ck_assert_int_eq(eng_comm_all_reduce_f32(ranks[0], x, 4, 1, 4, NULL), INF_E_INTERNAL);
    eng_comm_destroy(ranks[0]);
    eng_comm_destroy(ranks[1]);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("comm");
    TCase *t = tcase_create("local");
    tcase_set_timeout(t, 60);
    tcase_add_test(t, all_reduce_over_threads);
    tcase_add_test(t, bad_arguments);
    tcase_add_test(t, abort_frees_the_waiting);
    suite_add_tcase(s, t);
    SRunner *r = srunner_create(s);
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
