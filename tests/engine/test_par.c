/* The thread pool (engine/par.h): every item of a run is handed out exactly
 * once, in chunks of at most grain, whatever the pool size; eng_par_each
 * runs once on every thread with its index; a pool runs job after job,
 * while its threads spin and after they sleep; NULL runs on the caller. */
#include "engine/par.h"

#include <check.h>
#include <pthread.h>
#include <stdio.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct count_job {
    atomic_int *hits; /* per item */
    int64_t grain;
    atomic_int chunks, bad_chunks;
};

static void count_run(void *arg, int64_t i0, int64_t i1)
{
    struct count_job *j = arg;
    atomic_fetch_add(&j->chunks, 1);
    if (i1 <= i0 || i1 - i0 > j->grain)
        atomic_fetch_add(&j->bad_chunks, 1);
    for (int64_t i = i0; i < i1; i++)
        atomic_fetch_add(&j->hits[i], 1);
}

static void check_run(eng_par_t *p, int64_t n, int64_t grain)
{
    struct count_job j = {.hits = calloc((size_t)(n ? n : 1), sizeof(atomic_int)),
                          .grain = grain < 1 ? 1 : grain};
    atomic_init(&j.chunks, 0);
    atomic_init(&j.bad_chunks, 0);
    eng_par_run(p, n, grain, count_run, &j);
    for (int64_t i = 0; i < n; i++)
        ck_assert_msg(atomic_load(&j.hits[i]) == 1, "item %lld run %d times", (long long)i,
                      atomic_load(&j.hits[i]));
    ck_assert_int_eq(atomic_load(&j.bad_chunks), 0);
    int64_t g = grain < 1 ? 1 : grain;
    ck_assert_int_eq(atomic_load(&j.chunks), (int)((n + g - 1) / g));
    free(j.hits);
}

START_TEST(every_item_once)
{
    static const int32_t sizes[] = {1, 2, 3, 8};
    for (int si = 0; si < 4; si++) {
        eng_par_t *p = NULL;
        ck_assert_int_eq(eng_par_create(sizes[si], &p, NULL), INF_OK);
        ck_assert_int_eq(eng_par_size(p), sizes[si]);
        for (int rep = 0; rep < 20; rep++) { /* one pool, many jobs */
            check_run(p, 1000, 7);
            check_run(p, 5, 16);
            check_run(p, 0, 4);
            check_run(p, 97, 1);
            check_run(p, 64, 0);
        }
        eng_par_destroy(p);
    }
    check_run(NULL, 33, 5);
    ck_assert_int_eq(eng_par_size(NULL), 1);
    eng_par_destroy(NULL);
}
END_TEST

struct each_job {
    atomic_int seen[16];
    atomic_int calls, bad_n;
    int64_t want_n;
};

static void each_run(void *arg, int64_t id, int64_t n)
{
    struct each_job *j = arg;
    atomic_fetch_add(&j->calls, 1);
    if (n != j->want_n || id < 0 || id >= n)
        atomic_fetch_add(&j->bad_n, 1);
    else
        atomic_fetch_add(&j->seen[id], 1);
}

static void check_each(eng_par_t *p)
{
    struct each_job j = {.want_n = eng_par_size(p)};
    atomic_init(&j.calls, 0);
    atomic_init(&j.bad_n, 0);
    for (int i = 0; i < 16; i++)
        atomic_init(&j.seen[i], 0);
    eng_par_each(p, each_run, &j);
    ck_assert_int_eq(atomic_load(&j.bad_n), 0);
    ck_assert_int_eq(atomic_load(&j.calls), (int)j.want_n);
    for (int i = 0; i < j.want_n; i++)
        ck_assert_int_eq(atomic_load(&j.seen[i]), 1);
}

/* eng_par_each: every thread once with its own index, job after job (the
 * workers still spinning) and after they went to sleep; mixed with
 * eng_par_run; the hand-off count of the profile. */
START_TEST(each_thread_once)
{
    static const int32_t sizes[] = {1, 2, 3, 8};
    for (int si = 0; si < 4; si++) {
        eng_par_t *p = NULL;
        ck_assert_int_eq(eng_par_create(sizes[si], &p, NULL), INF_OK);
        eng_par_profile(p, true);
        for (int rep = 0; rep < 200; rep++) {
            check_each(p);
            if (rep % 50 == 0)
                check_run(p, 100, 3);
            if (rep % 67 == 0) {
                struct timespec ts = {0, 2000000}; /* past the spin: the workers sleep */
                nanosleep(&ts, NULL);
            }
        }
        uint64_t runs, wait_ns;
        eng_par_stats(p, &runs, &wait_ns);
        ck_assert_int_eq((int)runs, sizes[si] > 1 ? 204 : 0);
        eng_par_profile(p, false);
        eng_par_stats(p, &runs, &wait_ns);
        ck_assert_int_eq((int)runs, 0);
        eng_par_destroy(p);
    }
    struct each_job j = {.want_n = 1};
    eng_par_each(NULL, each_run, &j);
    ck_assert_int_eq(atomic_load(&j.seen[0]), 1);
}
END_TEST

struct who_job {
    pthread_t caller;
    atomic_int runs[4], on_caller[4];
};

static void who_run(void *arg, int64_t id, int64_t n)
{
    struct who_job *j = arg;
    (void)n;
    atomic_fetch_add(&j->runs[id], 1);
    if (pthread_equal(pthread_self(), j->caller))
        atomic_fetch_add(&j->on_caller[id], 1);
}

/* A part whose thread has not started it when the caller is done with its
 * own runs on the caller, once: a fresh pool's threads sleep until woken,
 * and these parts are over before a thread is up, so most of them are the
 * caller's. Every part runs exactly once either way. */
START_TEST(late_parts_run_on_the_caller)
{
    int stolen = 0;
    for (int rep = 0; rep < 50; rep++) {
        eng_par_t *p = NULL;
        ck_assert_int_eq(eng_par_create(4, &p, NULL), INF_OK);
        for (int job = 0; job < 3; job++) {
            struct who_job j = {.caller = pthread_self()};
            for (int i = 0; i < 4; i++) {
                atomic_init(&j.runs[i], 0);
                atomic_init(&j.on_caller[i], 0);
            }
            eng_par_each(p, who_run, &j);
            for (int i = 0; i < 4; i++)
                ck_assert_int_eq(atomic_load(&j.runs[i]), 1);
            ck_assert_int_eq(atomic_load(&j.on_caller[0]), 1);
            for (int i = 1; i < 4; i++)
                stolen += atomic_load(&j.on_caller[i]);
        }
        eng_par_destroy(p);
    }
    printf("late_parts_run_on_the_caller: %d of 450 worker parts ran on the caller\n", stolen);
}
END_TEST

START_TEST(thread_counts)
{
    ck_assert_int_eq(eng_par_threads(3), 3);
    ck_assert_int_eq(eng_par_threads(1000), 1000);
    ck_assert_int_eq(eng_par_threads(ENG_PAR_MAX + 5), ENG_PAR_MAX);
    int32_t all = eng_par_threads(0);
    ck_assert(all >= 1 && all <= ENG_PAR_MAX);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("par");
    TCase *t = tcase_create("run");
    tcase_set_timeout(t, 60);
    tcase_add_test(t, every_item_once);
    tcase_add_test(t, each_thread_once);
    tcase_add_test(t, late_parts_run_on_the_caller);
    tcase_add_test(t, thread_counts);
    suite_add_tcase(s, t);
    SRunner *r = srunner_create(s);
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
