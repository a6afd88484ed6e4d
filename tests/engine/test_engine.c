/* tests/engine/test_engine.c — the engine with its real thread over the mock
 * model: submission from several threads, the outbox and its notifications,
 * admission bound, cancel, drain, abort_all, the step-time test hook. */
#include "engine/eng.h"
#include "engine/backend.h"
#include "engine/mock/mock.h"
#include "engine/model.h"
#include "engine/sched/scheduler_lm.h"
#include "tokenizer/tokenizer.h"

#include <check.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define VOCAB 512
#define MAXR 300

/* ---- collecting events -------------------------------------------------------------------- */
struct out {
    char text[4096];
    size_t len;
    int32_t toks[1024];
    int32_t n_toks;
    float lp[1024], top_lp[1024]; /* choice 0: each token's logprob, its first alternative's */
    int32_t top_id[1024];
    int32_t toks1[1024]; /* choice 1 */
    int32_t n_toks1;
    float plp[256]; /* the ENG_EV_PROMPT event's logprobs */
    int32_t n_plp;
    enum eng_finish fin;
    int n_final, n_done, n_error, n_events;
    bool after_end;
    inf_status_t status;
    int32_t completion_tokens, prompt_tokens;
    uint64_t queue_ns, ttft_ns;
};

static struct out outs[MAXR];
static int dones; /* DONE or ERROR events seen */

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int notified;
static atomic_int n_notify;

static void on_notify(void *user)
{
    (void)user;
    atomic_fetch_add(&n_notify, 1);
    pthread_mutex_lock(&mu);
    notified = 1;
    pthread_cond_signal(&cv);
    pthread_mutex_unlock(&mu);
}

static void reset(void)
{
    memset(outs, 0, sizeof outs);
    dones = 0;
    notified = 0;
    atomic_store(&n_notify, 0);
}

static int take(eng_engine_t *eng)
{
    int n = 0;
    struct eng_event *ev = eng_events_take(eng);
    while (ev) {
        struct eng_event *next = (struct eng_event *)(void *)ev->node.next;
        ck_assert_uint_lt(ev->req_id, MAXR);
        struct out *o = &outs[ev->req_id];
        if (o->n_done || o->n_error)
            o->after_end = true;
        o->n_events++;
        if (ev->kind == ENG_EV_DELTA && ev->choice == 1) {
            for (int i = 0; i < ev->n_tokens; i++)
                o->toks1[o->n_toks1++] = ev->tokens[i].id;
        } else if (ev->kind == ENG_EV_DELTA) {
            ck_assert_int_eq(ev->choice, 0);
            ck_assert_uint_lt(o->len + ev->text_len, sizeof o->text);
            memcpy(o->text + o->len, ev->text, ev->text_len);
            o->len += ev->text_len;
            for (int i = 0; i < ev->n_tokens; i++) {
                o->lp[o->n_toks] = ev->tokens[i].logprob;
                o->top_id[o->n_toks] = ev->tokens[i].n_top ? ev->tokens[i].top_ids[0] : -1;
                o->top_lp[o->n_toks] = ev->tokens[i].n_top ? ev->tokens[i].top_logprobs[0] : 0;
                o->toks[o->n_toks++] = ev->tokens[i].id;
            }
            if (ev->finish != ENG_FINISH_NONE) {
                o->fin = ev->finish;
                o->n_final++;
            }
        } else if (ev->kind == ENG_EV_PROMPT) {
            ck_assert_int_le(ev->n_tokens, 256);
            for (int i = 0; i < ev->n_tokens; i++)
                o->plp[i] = ev->tokens[i].logprob;
            o->n_plp = ev->n_tokens;
        } else if (ev->kind == ENG_EV_DONE) {
            o->n_done++;
            o->completion_tokens = ev->completion_tokens;
            o->prompt_tokens = ev->prompt_tokens;
            o->queue_ns = ev->queue_ns;
            o->ttft_ns = ev->ttft_ns;
            dones++;
        } else {
            o->n_error++;
            o->status = ev->status;
            dones++;
        }
        eng_event_destroy(ev);
        ev = next;
        n++;
    }
    return n;
}

/* Take events until `want` requests have ended; fails after timeout_ms. */
static void pump(eng_engine_t *eng, int want, int timeout_ms)
{
    uint64_t deadline = inf_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    for (;;) {
        take(eng);
        if (dones >= want)
            return;
        ck_assert_msg(inf_now_ns() < deadline, "timed out with %d of %d requests ended", dones,
                      want);
        pthread_mutex_lock(&mu);
        if (!notified) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 50 * 1000000L;
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            pthread_cond_timedwait(&cv, &mu, &ts);
        }
        notified = 0;
        pthread_mutex_unlock(&mu);
    }
}

/* Poll stats until pred holds (up to 5 s). */
#define WAIT_FOR(eng, st, pred)                                                                    \
    do {                                                                                           \
        uint64_t until_ = inf_now_ns() + 5000000000ull;                                            \
        for (;;) {                                                                                 \
            eng_engine_stats((eng), &(st));                                                        \
            if (pred)                                                                              \
                break;                                                                             \
            ck_assert_msg(inf_now_ns() < until_, "timed out waiting for " #pred);                  \
            struct timespec ts_ = {0, 1000000L};                                                   \
            nanosleep(&ts_, NULL);                                                                 \
        }                                                                                          \
    } while (0)

/* The mock's forward that fails (mock_fail_step) for the next open_engine. */
static int32_t g_fail_step;

static eng_engine_t *open_engine(int32_t max_batch, int32_t max_queue, uint32_t min_step_us,
                                 int32_t max_len, int64_t kv_tokens)
{
    reset();
    struct eng_config cfg = {0};
    cfg.backend = ENG_BACKEND_MOCK;
    cfg.max_batch = max_batch;
    cfg.max_queue = max_queue;
    cfg.min_step_us = min_step_us;
    cfg.max_model_len = max_len;
    cfg.kv_cache_tokens = kv_tokens;
    cfg.mock_fail_step = g_fail_step;
    eng_engine_t *eng = NULL;
    struct inf_err err;
    inf_status_t st = eng_engine_create(&cfg, on_notify, NULL, &eng, &err);
    ck_assert_msg(st == INF_OK, "create: %s", err.msg);
    return eng;
}

static void mkprompt(int32_t *p, int32_t n, uint32_t seed)
{
    uint32_t x = seed * 2654435761u + 12345u;
    for (int32_t i = 0; i < n; i++) {
        x = x * 1103515245u + 12345u;
        p[i] = ENG_MOCK_BYTE0 + 'a' + (int32_t)((x >> 16) % 26);
    }
}

static struct eng_request *mkreq(uint64_t id, int32_t n_prompt, uint32_t seed, int32_t max_tokens)
{
    struct eng_request *r = eng_request_create();
    ck_assert_ptr_nonnull(r);
    r->id = id;
    r->n_prompt = n_prompt;
    r->prompt = malloc(sizeof *r->prompt * (size_t)n_prompt);
    mkprompt(r->prompt, n_prompt, seed);
    r->max_tokens = max_tokens;
    r->sampling.temperature = 0.0f;
    r->sampling.ignore_eos = true;
    return r;
}

static void submit_ok(eng_engine_t *eng, struct eng_request *r)
{
    struct inf_err err;
    inf_status_t st = eng_request_submit(eng, r, &err);
    ck_assert_msg(st == INF_OK, "submit: %s", err.msg);
}

/* Greedy reference from the mock's full-history logits. */
static int32_t ref_greedy(int32_t n_prompt, uint32_t seed, int32_t max_tokens, int32_t *out)
{
    int32_t hist[2048];
    float lg[VOCAB];
    mkprompt(hist, n_prompt, seed);
    int32_t len = n_prompt;
    for (int32_t k = 0; k < max_tokens; k++) {
        eng_mock_logits(VOCAB, hist, len, lg);
        int32_t b = 0;
        for (int32_t v = 1; v < VOCAB; v++)
            if (lg[v] > lg[b])
                b = v;
        hist[len++] = b;
        out[k] = b;
    }
    return max_tokens;
}

/* ---- tests --------------------------------------------------------------------------------- */
START_TEST(info_and_defaults)
{
    eng_engine_t *eng = open_engine(0, 0, 0, 0, 0);
    struct eng_info info;
    eng_engine_info(eng, &info);
    ck_assert_int_eq(info.vocab, VOCAB);
    ck_assert_int_eq(info.max_model_len, 4096);
    ck_assert_int_eq(info.bos_id, ENG_MOCK_BOS);
    ck_assert_str_eq(info.backend_name, "mock");
    ck_assert_int_eq(info.kv_capacity_tokens, 128 * 4096);
    ck_assert_int_eq(info.max_batched_tokens, 2048); /* 0: the default budget */
    struct eng_stats st;
    eng_engine_stats(eng, &st);
    ck_assert_int_eq(st.kv_blocks_total, 128 * 4096 / 16);
    ck_assert_int_eq(st.kv_blocks_used, 0);
    ck_assert(!st.failed);
    /* the mock's tokenizer: one byte token per byte, decoding back */
    tok_tokenizer_t *tok = eng_engine_tokenizer(eng);
    ck_assert_ptr_nonnull(tok);
    struct tok_ids ids = {0};
    struct inf_err err;
    ck_assert_int_eq(tok_encode(tok, "h\xC3\xA9 </s>", 8, NULL, &ids, &err), INF_OK);
    ck_assert_uint_eq(ids.n, 5);
    ck_assert_int_eq(ids.ids[0], ENG_MOCK_BYTE0 + 'h');
    ck_assert_int_eq(ids.ids[1], ENG_MOCK_BYTE0 + 0xC3);
    ck_assert_int_eq(ids.ids[2], ENG_MOCK_BYTE0 + 0xA9);
    ck_assert_int_eq(ids.ids[3], ENG_MOCK_BYTE0 + ' ');
    ck_assert_int_eq(ids.ids[4], ENG_MOCK_EOS);
    ck_assert_int_eq(tok_eos_id(tok), ENG_MOCK_EOS);
    ck_assert_int_eq(tok_bos_id(tok), ENG_MOCK_BOS);
    int32_t more[3] = {ENG_MOCK_BYTE0 + 'x', 300, ENG_MOCK_EOS};
    char *text = NULL;
    size_t tlen = 0;
    ck_assert_int_eq(tok_decode(tok, more, 3, true, &text, &tlen, &err), INF_OK);
    ck_assert_str_eq(text, "x t300");
    free(text);
    tok_ids_fini(&ids);
    eng_engine_destroy(eng);
    eng_engine_destroy(NULL);

    struct eng_config bad = {0};
    bad.backend = ENG_BACKEND_MOCK;
    bad.max_model_len = 1024;
    bad.kv_cache_tokens = 512;
    eng_engine_t *e2 = NULL;
    ck_assert_int_eq(eng_engine_create(&bad, NULL, NULL, &e2, &err), INF_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err.msg, "kv_cache_tokens"));
    ck_assert_ptr_null(e2);
}
END_TEST

struct submitter {
    eng_engine_t *eng;
    int first, count;
};

static void *submit_thread(void *arg)
{
    struct submitter *sb = arg;
    for (int k = sb->first; k < sb->first + sb->count; k++) {
        struct eng_request *r = mkreq((uint64_t)k + 1, 8 + k % 40, (uint32_t)k, 24);
        r->stream = k % 2;
        struct inf_err err;
        if (eng_request_submit(sb->eng, r, &err) != INF_OK) {
            eng_request_destroy(r);
            return (void *)1;
        }
    }
    return NULL;
}

START_TEST(concurrent_128_from_four_threads)
{
    /* 2 ms steps, so submissions from four threads land in the first steps */
    eng_engine_t *eng = open_engine(128, 256, 2000, 256, 0);
    pthread_t th[4];
    struct submitter sb[4];
    for (int t = 0; t < 4; t++) {
        sb[t] = (struct submitter){eng, t * 32, 32};
        ck_assert_int_eq(pthread_create(&th[t], NULL, submit_thread, &sb[t]), 0);
    }
    for (int t = 0; t < 4; t++) {
        void *rc;
        pthread_join(th[t], &rc);
        ck_assert_ptr_null(rc);
    }
    pump(eng, 128, 20000);
    for (int k = 0; k < 128; k++) {
        struct out *o = &outs[k + 1];
        int32_t ref[24];
        ref_greedy(8 + k % 40, (uint32_t)k, 24, ref);
        ck_assert_int_eq(o->n_done, 1);
        ck_assert_int_eq(o->n_final, 1);
        ck_assert_int_eq(o->fin, ENG_FINISH_LENGTH);
        ck_assert_int_eq(o->n_toks, 24);
        ck_assert(memcmp(o->toks, ref, sizeof ref) == 0);
        char *text = eng_mock_decode(ref, 24, NULL);
        ck_assert_uint_eq(o->len, strlen(text));
        ck_assert(memcmp(o->text, text, o->len) == 0);
        free(text);
        ck_assert_int_eq(o->completion_tokens, 24);
        ck_assert_int_eq(o->prompt_tokens, 8 + k % 40);
        ck_assert_uint_le(o->queue_ns, o->ttft_ns);
        ck_assert_uint_gt(o->ttft_ns, 0);
        ck_assert(!o->after_end);
    }
    struct eng_stats st;
    WAIT_FOR(eng, st, st.running == 0);
    ck_assert_int_eq(st.max_running_seen, 128);
    ck_assert_uint_gt(st.batched_steps_total, 20);
    ck_assert_uint_eq(st.generation_tokens_total, 128 * 24);
    ck_assert_int_eq(st.kv_blocks_used, 0);
    eng_engine_destroy(eng);
}
END_TEST

START_TEST(notify_only_when_outbox_becomes_nonempty)
{
    eng_engine_t *eng = open_engine(8, 16, 0, 256, 0);
    struct eng_request *r = mkreq(1, 10, 3, 20);
    r->stream = true;
    submit_ok(eng, r);
    struct eng_stats st;
    WAIT_FOR(eng, st, st.generation_tokens_total == 20 && st.running == 0);
    /* every event went into an outbox nobody emptied: one notification */
    ck_assert_int_eq(atomic_load(&n_notify), 1);
    int n = take(eng);
    ck_assert_int_ge(n, 3);
    ck_assert_int_eq(outs[1].n_done, 1);
    ck_assert_int_eq(outs[1].n_toks, 20);
    ck_assert(!outs[1].after_end); /* DONE came last: FIFO */
    ck_assert_ptr_null(eng_events_take(eng));
    /* emptied: the next event notifies again */
    submit_ok(eng, mkreq(2, 10, 4, 5));
    pump(eng, 2, 5000);
    ck_assert_int_ge(atomic_load(&n_notify), 2);
    eng_engine_destroy(eng);
}
END_TEST

START_TEST(queue_full_answers_busy)
{
    eng_engine_t *eng = open_engine(1, 2, 1000, 1024, 0);
    submit_ok(eng, mkreq(1, 10, 1, 900));
    struct eng_stats st;
    WAIT_FOR(eng, st, st.running == 1);
    submit_ok(eng, mkreq(2, 10, 2, 5));
    submit_ok(eng, mkreq(3, 10, 3, 5));
    struct eng_request *d = mkreq(4, 10, 4, 5);
    struct inf_err err;
    ck_assert_int_eq(eng_request_submit(eng, d, &err), INF_E_BUSY);
    ck_assert_int_eq(err.code, INF_E_BUSY);
    eng_request_destroy(d); /* the caller kept it */
    eng_request_cancel(eng, 1);
    pump(eng, 3, 10000);
    ck_assert_int_eq(outs[1].fin, ENG_FINISH_ABORT);
    ck_assert_int_eq(outs[2].fin, ENG_FINISH_LENGTH);
    ck_assert_int_eq(outs[3].fin, ENG_FINISH_LENGTH);
    /* room again */
    submit_ok(eng, mkreq(5, 10, 5, 3));
    pump(eng, 4, 5000);
    ck_assert_int_eq(outs[5].n_toks, 3);
    eng_engine_destroy(eng);
}
END_TEST

START_TEST(cancel_running_and_queued)
{
    eng_engine_t *eng = open_engine(1, 8, 1000, 1024, 0);
    struct eng_request *a = mkreq(1, 40, 1, 900);
    a->stream = true;
    submit_ok(eng, a);
    submit_ok(eng, mkreq(2, 40, 2, 900));
    struct eng_stats st;
    WAIT_FOR(eng, st, st.running == 1 && st.waiting == 1 && st.generation_tokens_total >= 3);
    ck_assert_int_gt(st.kv_blocks_used, 0);
    eng_request_cancel(eng, 2); /* queued */
    pump(eng, 1, 5000);
    ck_assert_int_eq(outs[2].n_done, 1);
    ck_assert_int_eq(outs[2].fin, ENG_FINISH_ABORT);
    ck_assert_int_eq(outs[2].completion_tokens, 0);
    ck_assert_int_eq(outs[1].n_done, 0);
    eng_request_cancel(eng, 1);  /* running */
    eng_request_cancel(eng, 77); /* unknown */
    pump(eng, 2, 5000);
    ck_assert_int_eq(outs[1].fin, ENG_FINISH_ABORT);
    ck_assert_int_gt(outs[1].completion_tokens, 2);
    ck_assert_int_lt(outs[1].completion_tokens, 900);
    WAIT_FOR(eng, st, st.running == 0 && st.kv_blocks_used == 0 && st.waiting == 0);
    eng_engine_destroy(eng);
}
END_TEST

START_TEST(drain_refuses_new_and_finishes_running)
{
    eng_engine_t *eng = open_engine(4, 8, 500, 1024, 0);
    submit_ok(eng, mkreq(1, 10, 1, 50));
    eng_engine_drain(eng);
    struct eng_request *b = mkreq(2, 10, 2, 5);
    struct inf_err err;
    ck_assert_int_eq(eng_request_submit(eng, b, &err), INF_E_SHUTDOWN);
    eng_request_destroy(b);
    pump(eng, 1, 10000);
    ck_assert_int_eq(outs[1].fin, ENG_FINISH_LENGTH);
    ck_assert_int_eq(outs[1].n_toks, 50);
    eng_engine_destroy(eng);
}
END_TEST

START_TEST(abort_all_ends_everything)
{
    eng_engine_t *eng = open_engine(2, 8, 1000, 1024, 0);
    for (int k = 1; k <= 4; k++)
        submit_ok(eng, mkreq((uint64_t)k, 20, (uint32_t)k, 900));
    struct eng_stats st;
    WAIT_FOR(eng, st, st.running == 2 && st.waiting == 2);
    eng_engine_abort_all(eng);
    pump(eng, 4, 5000);
    for (int k = 1; k <= 4; k++) {
        ck_assert_int_eq(outs[k].n_done, 1);
        ck_assert_int_eq(outs[k].n_final, 1);
        ck_assert_int_eq(outs[k].fin, ENG_FINISH_ABORT);
    }
    WAIT_FOR(eng, st, st.running == 0 && st.waiting == 0 && st.kv_blocks_used == 0);
    eng_engine_destroy(eng);
}
END_TEST

START_TEST(min_step_time_hook)
{
    eng_engine_t *eng = open_engine(4, 8, 5000, 256, 0);
    uint64_t t0 = inf_now_ns();
    submit_ok(eng, mkreq(1, 10, 1, 10));
    pump(eng, 1, 5000);
    uint64_t dt = inf_now_ns() - t0;
    ck_assert_int_eq(outs[1].n_toks, 10);
    /* ten steps of at least 5 ms; the last token comes out at the start of
     * the tenth step's sleep */
    ck_assert_uint_ge(dt, 45000000ull);
    eng_engine_destroy(eng);
    /* and off: the same ten steps of the mock take well under that */
    eng = open_engine(4, 8, 0, 256, 0);
    t0 = inf_now_ns();
    submit_ok(eng, mkreq(1, 10, 1, 10));
    pump(eng, 1, 5000);
    ck_assert_uint_lt(inf_now_ns() - t0, 45000000ull);
    eng_engine_destroy(eng);
}
END_TEST

START_TEST(invalid_and_destroy_in_flight)
{
    eng_engine_t *eng = open_engine(4, 8, 1000, 256, 0);
    struct eng_request *r = mkreq(1, 10, 1, 5);
    r->prompt[3] = VOCAB + 5;
    struct inf_err err;
    ck_assert_int_eq(eng_request_submit(eng, r, &err), INF_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err.msg, "token id"));
    r->prompt[3] = 7;
    r->n_prompt = 0;
    ck_assert_int_eq(eng_request_submit(eng, r, &err), INF_E_INVALID);
    eng_request_destroy(r);
    /* requests running and queued, events never taken: destroy frees all */
    for (int k = 1; k <= 8; k++) {
        struct eng_request *q = mkreq((uint64_t)k, 30, (uint32_t)k, 500);
        q->n = k % 3 + 1;
        submit_ok(eng, q);
    }
    struct eng_stats st;
    WAIT_FOR(eng, st, st.generation_tokens_total > 4);
    eng_engine_destroy(eng);
}
END_TEST

START_TEST(device_failure_is_sticky)
{
    g_fail_step = 4;
    eng_engine_t *eng = open_engine(4, 8, 0, 256, 0);
    g_fail_step = 0;
    for (int k = 1; k <= 3; k++) {
        struct eng_request *r = mkreq((uint64_t)k, 10, (uint32_t)k, 50);
        r->stream = true;
        submit_ok(eng, r);
    }
    pump(eng, 3, 5000);
    for (int k = 1; k <= 3; k++) {
        ck_assert_int_eq(outs[k].n_error, 1);
        ck_assert_int_eq(outs[k].status, INF_E_DEVICE);
        ck_assert_int_eq(outs[k].n_done, 0);
        ck_assert_int_eq(outs[k].n_final, 0);
        ck_assert(!outs[k].after_end);
    }
    struct eng_stats st;
    WAIT_FOR(eng, st, st.failed && st.running == 0 && st.kv_blocks_used == 0);
    /* later requests are answered with the same error */
    submit_ok(eng, mkreq(9, 10, 9, 5));
    pump(eng, 4, 5000);
    ck_assert_int_eq(outs[9].n_error, 1);
    ck_assert_int_eq(outs[9].status, INF_E_DEVICE);
    eng_engine_destroy(eng);
}
END_TEST

/* ---- the real model on the CPU backend ----------------------------------------------------- */
/* A tiny synthetic checkpoint made by the project's int4serve-mkmodel. */
static char model_dir[256];
static const char *g_mk_extra = ""; /* more int4serve-mkmodel arguments for make_model */

static void make_model(void)
{
    const char *bdir = getenv("INT4SERVE_BUILD_DIR");
    ck_assert_msg(bdir != NULL, "INT4SERVE_BUILD_DIR is not set");
    snprintf(model_dir, sizeof model_dir, "/tmp/int4serve-test-engine-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(model_dir));
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "'%s/tools/mkmodel/int4serve-mkmodel' --preset tiny --layers 2 --max-pos 512 "
             "--seed 3 %s --out '%s/m' >/dev/null",
             bdir, g_mk_extra, model_dir);
    ck_assert_msg(system(cmd) == 0, "mkmodel failed: %s", cmd);
    strcat(model_dir, "/m");
}

static void remove_model(void)
{
    char cmd[600];
    char *slash = strrchr(model_dir, '/');
    *slash = '\0';
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", model_dir);
    ck_assert_int_eq(system(cmd), 0);
}

static bool g_prefix; /* engine.prefix_caching of the next open_cpu */
static bool g_kv_fp8; /* engine.kv_cache_dtype = "fp8" for the next open_cpu */

/* budget: max_batched_tokens (0: the backend's default) */
static eng_engine_t *open_cpu_budget(int32_t max_batch, int64_t kv_tokens, int32_t budget)
{
    reset();
    struct eng_config cfg = {0};
    cfg.backend = ENG_BACKEND_CPU;
    cfg.model_dir = model_dir;
    cfg.threads = 1;
    cfg.max_batch = max_batch;
    cfg.max_batched_tokens = budget;
    cfg.max_model_len = 160;
    cfg.kv_cache_tokens = kv_tokens;
    cfg.quantization = ENG_QUANTIZATION_INT4;
    cfg.group_size = 32;
    cfg.fuse_qkv = true;
    cfg.max_queue = 64;
    cfg.prefix_caching = g_prefix;
    cfg.kv_cache_dtype = g_kv_fp8 ? ENG_KV_FP8 : ENG_KV_AUTO;
    eng_engine_t *eng = NULL;
    struct inf_err err;
    inf_status_t st = eng_engine_create(&cfg, on_notify, NULL, &eng, &err);
    ck_assert_msg(st == INF_OK, "create: %s", err.msg);
    return eng;
}

static eng_engine_t *open_cpu(int32_t max_batch, int64_t kv_tokens)
{
    return open_cpu_budget(max_batch, kv_tokens, 128);
}

static const char *const texts[] = {
    "The quick brown fox",
    "Once upon a time there was a little",
    "hello",
    "1 2 3 4 5 6 7 8 9",
    "In a hole in the ground there lived a hobbit. Not a nasty, dirty, wet hole",
    "caf\xC3\xA9 na\xC3\xAFve",
};
#define N_TEXTS 6

static struct eng_request *text_req(eng_engine_t *eng, uint64_t id, int t, int32_t max_tokens)
{
    tok_tokenizer_t *tok = eng_engine_tokenizer(eng);
    ck_assert_ptr_nonnull(tok);
    struct tok_ids ids = {0};
    struct inf_err err;
    ck_assert_int_eq(tok_encode(tok, texts[t], strlen(texts[t]), NULL, &ids, &err), INF_OK);
    struct eng_request *r = eng_request_create();
    r->id = id;
    r->n_prompt = (int32_t)ids.n;
    r->prompt = malloc(sizeof(int32_t) * ids.n);
    memcpy(r->prompt, ids.ids, sizeof(int32_t) * ids.n);
    tok_ids_fini(&ids);
    r->max_tokens = max_tokens;
    r->sampling.temperature = 0.0f;
    r->sampling.ignore_eos = true;
    return r;
}

/* max_batched_tokens 0: the CPU backend names no budget of its own, so the
 * engine's 2048; a max_batch above that wins (mock backend). */
START_TEST(default_step_budget)
{
    make_model();
    eng_engine_t *eng = open_cpu_budget(8, 0, 0);
    struct eng_info info;
    eng_engine_info(eng, &info);
    ck_assert_int_eq(info.max_batched_tokens, 2048);
    eng_engine_destroy(eng);
    remove_model();
    eng = open_engine(3000, 0, 0, 64, 0);
    eng_engine_info(eng, &info);
    ck_assert_int_eq(info.max_batched_tokens, 3000);
    eng_engine_destroy(eng);
}
END_TEST

START_TEST(cpu_model_batched_equals_alone)
{
    make_model();
    eng_engine_t *eng = open_cpu(8, 0);
    struct eng_info info;
    eng_engine_info(eng, &info);
    ck_assert_str_eq(info.backend_name, "cpu");
    ck_assert_int_eq(info.max_model_len, 160);
    static struct out alone[N_TEXTS];
    for (int t = 0; t < N_TEXTS; t++) {
        struct eng_request *r = text_req(eng, 1, t, 12);
        r->stream = t % 2;
        submit_ok(eng, r);
        pump(eng, 1, 60000);
        alone[t] = outs[1];
        reset();
    }
    /* all at once, plus an n = 2 request sharing its prompt blocks */
    for (int t = 0; t < N_TEXTS; t++)
        submit_ok(eng, text_req(eng, (uint64_t)t + 1, t, 12));
    struct eng_request *two = text_req(eng, 20, 4, 12);
    two->n = 2;
    submit_ok(eng, two);
    pump(eng, N_TEXTS + 1, 120000);
    tok_tokenizer_t *tok = eng_engine_tokenizer(eng);
    for (int t = 0; t < N_TEXTS; t++) {
        struct out *o = &outs[t + 1];
        ck_assert_int_eq(alone[t].n_toks, 12);
        ck_assert_int_eq(o->n_toks, 12);
        ck_assert_msg(memcmp(o->toks, alone[t].toks, sizeof(int32_t) * 12) == 0,
                      "text %d: batched output differs from alone", t);
        ck_assert_uint_eq(o->len, alone[t].len);
        ck_assert(memcmp(o->text, alone[t].text, o->len) == 0);
        /* the streamed / final text is the tokenizer's decode of the tokens */
        char *dec = NULL;
        size_t dlen = 0;
        struct inf_err err;
        /* ids past the tokenizer (the model's vocabulary padding) give no text */
        int32_t known[12], n_known = 0;
        for (int i = 0; i < 12; i++)
            if (o->toks[i] < tok_vocab_size(tok))
                known[n_known++] = o->toks[i];
        ck_assert_int_eq(tok_decode(tok, known, (size_t)n_known, true, &dec, &dlen, &err), INF_OK);
        ck_assert_uint_eq(dlen, o->len);
        ck_assert(memcmp(dec, o->text, dlen) == 0);
        free(dec);
    }
    /* both choices of the n = 2 request (choice 1 recomputed the prompt's
     * last partial block over shared full blocks) equal the request alone */
    ck_assert_int_eq(outs[20].n_toks, 12);
    ck_assert_int_eq(outs[20].n_toks1, 12);
    ck_assert(memcmp(outs[20].toks, alone[4].toks, sizeof(int32_t) * 12) == 0);
    ck_assert(memcmp(outs[20].toks1, alone[4].toks, sizeof(int32_t) * 12) == 0);
    ck_assert_int_eq(outs[20].n_done, 1);
    ck_assert_int_eq(outs[20].completion_tokens, 24);
    struct eng_stats st;
    WAIT_FOR(eng, st, st.running == 0);
    ck_assert_uint_gt(st.batched_steps_total, 5);
    ck_assert_int_eq(st.kv_blocks_used, 0);
    eng_engine_destroy(eng);
    remove_model();
}
END_TEST

/* texts[0..3] run one at a time, then all four at once: each output of
 * n greedy tokens equals its own alone. */
static void together_equals_alone(eng_engine_t *eng, int32_t n)
{
    static struct out alone[4];
    for (int t = 0; t < 4; t++) {
        submit_ok(eng, text_req(eng, 1, t, n));
        pump(eng, 1, 60000);
        alone[t] = outs[1];
        reset();
    }
    for (int t = 0; t < 4; t++)
        submit_ok(eng, text_req(eng, (uint64_t)t + 1, t, n));
    pump(eng, 4, 120000);
    for (int t = 0; t < 4; t++) {
        ck_assert_int_eq(outs[t + 1].n_toks, n);
        ck_assert_msg(memcmp(outs[t + 1].toks, alone[t].toks, sizeof(int32_t) * (size_t)n) == 0,
                      "text %d: output with the others differs from alone", t);
    }
}

START_TEST(cpu_model_preemption_keeps_outputs)
{
    make_model();
    /* 160 tokens of KV (one sequence's worth) for four sequences of ~70 */
    eng_engine_t *eng = open_cpu(4, 160);
    together_equals_alone(eng, 40);
    struct eng_stats st;
    WAIT_FOR(eng, st, st.running == 0);
    ck_assert_uint_gt(st.preemptions_total, 0);
    ck_assert_int_eq(st.kv_blocks_used, 0);
    eng_engine_destroy(eng);
    remove_model();
}
END_TEST

/* An fp8 (E4M3) KV cache: a quarter of the fp32 cache's bytes a token on
 * the CPU backend, so its automatic pool (256 MiB) holds at least twice the
 * tokens (four times, up to max_batch full sequences); info and /metrics
 * name it. */
START_TEST(cpu_model_fp8_capacity)
{
    make_model();
    g_kv_fp8 = false;
    eng_engine_t *eng = open_cpu_budget(1024, 0, 1024);
    struct eng_info i32, i8;
    eng_engine_info(eng, &i32);
    eng_engine_destroy(eng);
    g_kv_fp8 = true;
    eng = open_cpu_budget(1024, 0, 1024);
    eng_engine_info(eng, &i8);
    struct eng_stats st;
    eng_engine_stats(eng, &st);
    eng_engine_destroy(eng);
    g_kv_fp8 = false;
    ck_assert_str_eq(i32.kv_dtype, "fp32");
    ck_assert_int_eq(i32.kv_elem_bytes, 4);
    ck_assert_str_eq(i8.kv_dtype, "fp8 e4m3");
    ck_assert_int_eq(i8.kv_elem_bytes, 1);
    ck_assert_int_eq(st.kv_elem_bytes, 1);
    ck_assert_int_eq(st.kv_capacity_tokens, i8.kv_capacity_tokens);
    const int64_t want = 1024 * 160; /* max_batch full sequences */
    ck_assert_msg(i32.kv_capacity_tokens < want, "fp32 pool %lld not limited by its bytes",
                  (long long)i32.kv_capacity_tokens);
    /* four times the bytes' tokens, within the rounding to blocks */
    const int64_t four = 4 * i32.kv_capacity_tokens;
    ck_assert_int_ge(i8.kv_capacity_tokens, four - 64 < want ? four - 64 : want);
    ck_assert_int_le(i8.kv_capacity_tokens, four + 64);
    ck_assert_int_ge(i8.kv_capacity_tokens, 2 * i32.kv_capacity_tokens);
    remove_model();
}
END_TEST

/* A sliding window of 32: kv_cache_tokens 0 counts a sequence as its
 * window's blocks and two more (64 tokens, not max_model_len's 160), plus
 * one step's prefill chunk (max_batched_tokens 128), so the automatic pool
 * of max_batch 4 is 384 tokens; four requests of about 110 positions each
 * run in it at once with the outputs they have alone. */
START_TEST(cpu_model_window_capacity)
{
    g_mk_extra = "--arch mistral --sliding-window 32";
    make_model();
    g_mk_extra = "";
    eng_engine_t *eng = open_cpu(4, 0);
    struct eng_info info;
    eng_engine_info(eng, &info);
    ck_assert_int_eq(info.kv_capacity_tokens, 4 * 64 + 128);
    together_equals_alone(eng, 90);
    struct eng_stats st;
    WAIT_FOR(eng, st, st.running == 0);
    ck_assert_int_eq(st.kv_blocks_used, 0);
    eng_engine_destroy(eng);
    remove_model();
    /* the same model without its window: max_batch full sequences */
    make_model();
    eng = open_cpu(4, 0);
    eng_engine_info(eng, &info);
    ck_assert_int_eq(info.kv_capacity_tokens, 4 * 160);
    eng_engine_destroy(eng);
    remove_model();
}
END_TEST

/* Preemption and recompute on an fp8 KV cache: a recomputed prefix writes
 * the same codes, so every output equals the request run alone. */
START_TEST(cpu_model_fp8_preemption_keeps_outputs)
{
    make_model();
    g_kv_fp8 = true;
    eng_engine_t *eng = open_cpu(4, 160);
    together_equals_alone(eng, 40);
    struct eng_stats st;
    WAIT_FOR(eng, st, st.running == 0);
    ck_assert_uint_gt(st.preemptions_total, 0);
    ck_assert_int_eq(st.kv_blocks_used, 0);
    eng_engine_destroy(eng);
    g_kv_fp8 = false;
    remove_model();
}
END_TEST

/* A prompt of a shared head (texts[4] twice) and texts[t]: the head holds
 * full blocks whatever the tokenizer. */
static struct eng_request *shared_req(eng_engine_t *eng, uint64_t id, int t, int32_t max_tokens)
{
    struct eng_request *head = text_req(eng, id, 4, max_tokens);
    struct eng_request *tail = text_req(eng, id, t, max_tokens);
    int32_t n = 2 * head->n_prompt + tail->n_prompt;
    int32_t *p = malloc(sizeof *p * (size_t)n);
    memcpy(p, head->prompt, sizeof *p * (size_t)head->n_prompt);
    memcpy(p + head->n_prompt, head->prompt, sizeof *p * (size_t)head->n_prompt);
    memcpy(p + 2 * head->n_prompt, tail->prompt, sizeof *p * (size_t)tail->n_prompt);
    free(head->prompt);
    head->prompt = p;
    head->n_prompt = n;
    head->sampling.logprobs = 3;
    eng_request_destroy(tail);
    return head;
}

/* Requests sharing a head, one at a time and then all at once (n = 2 on
 * one, prompt logprobs on another), on the CPU model: their outputs in
 * runs[t] (one at a time) and runs[N_TEXTS + t] (together). */
static void shared_cpu_run(bool prefix, struct out *runs, struct eng_stats *st)
{
    g_prefix = prefix;
    eng_engine_t *eng = open_cpu(8, 0);
    g_prefix = false;
    for (int t = 0; t < N_TEXTS; t++) {
        submit_ok(eng, shared_req(eng, 1, t, 10));
        pump(eng, 1, 60000);
        runs[t] = outs[1];
        reset();
    }
    for (int t = 0; t < N_TEXTS; t++) {
        struct eng_request *r = shared_req(eng, (uint64_t)t + 1, t, 10);
        r->n = t == 2 ? 2 : 1;
        r->prompt_logprobs = t == 3;
        r->stream = t % 2;
        submit_ok(eng, r);
    }
    pump(eng, N_TEXTS, 120000);
    for (int t = 0; t < N_TEXTS; t++)
        runs[N_TEXTS + t] = outs[t + 1];
    WAIT_FOR(eng, *st, st->running == 0);
    eng_engine_destroy(eng);
}

START_TEST(cpu_model_prefix_caching_same_outputs)
{
    /* Prefix caching changes what is computed, never what comes out: the
     * same tokens, logprobs and prompt logprobs, bit for bit. */
    make_model();
    static struct out off[2 * N_TEXTS], on[2 * N_TEXTS];
    struct eng_stats st_off, st_on;
    shared_cpu_run(false, off, &st_off);
    shared_cpu_run(true, on, &st_on);
    remove_model();
    ck_assert_uint_eq(st_off.prefix_cache_hits_total, 0);
    ck_assert_uint_eq(st_on.prefix_cache_queries_total, st_on.prompt_tokens_total);
    ck_assert_uint_gt(st_on.prefix_cache_hits_total, st_on.prompt_tokens_total / 2);
    ck_assert_int_eq(st_on.kv_blocks_used, 0);
    for (int k = 0; k < 2 * N_TEXTS; k++) {
        const struct out *a = &off[k], *b = &on[k];
        ck_assert_int_eq(a->n_done, 1);
        ck_assert_int_eq(b->n_done, 1);
        ck_assert_int_eq(a->n_toks, 10);
        ck_assert_int_eq(b->n_toks, 10);
        ck_assert_msg(memcmp(a->toks, b->toks, sizeof(int32_t) * 10) == 0, "request %d", k);
        ck_assert_msg(memcmp(a->lp, b->lp, sizeof(float) * 10) == 0, "request %d logprobs", k);
        ck_assert(memcmp(a->top_id, b->top_id, sizeof(int32_t) * 10) == 0);
        ck_assert(memcmp(a->top_lp, b->top_lp, sizeof(float) * 10) == 0);
        ck_assert_uint_eq(a->len, b->len);
        ck_assert(memcmp(a->text, b->text, a->len) == 0);
        ck_assert_int_eq(a->n_toks1, b->n_toks1);
        ck_assert(memcmp(a->toks1, b->toks1, sizeof(int32_t) * (size_t)a->n_toks1) == 0);
        ck_assert_int_eq(a->n_plp, b->n_plp);
        /* element 0 is NaN (no context): compared from 1 */
        if (a->n_plp > 1)
            ck_assert(memcmp(a->plp + 1, b->plp + 1, sizeof(float) * (size_t)(a->n_plp - 1)) == 0);
    }
    ck_assert_int_eq(on[N_TEXTS + 2].n_toks1, 10);
    ck_assert_int_gt(on[N_TEXTS + 3].n_plp, 40);
}
END_TEST

START_TEST(cpu_model_keep_fp16_names)
{
    make_model();
    /* a bare name keeps every tensor containing it; a pattern is a pattern */
    const char *keep[2] = {"lm_head", "model.layers.1.mlp.*"};
    struct eng_lm_model_opts o = {
        .dir = model_dir,
        .quantization = ENG_QUANTIZATION_INT4,
        .group_size = 32,
        .fuse_qkv = false,
        .keep_fp16 = keep,
        .n_keep_fp16 = 2,
        .max_tokens = 64,
        .kv_blocks = 16,
    };
    struct eng_lm lm;
    struct inf_err err;
    struct eng_backend *be = NULL;
    struct eng_backend_cpu_opts bo = {.n_threads = 1};
    ck_assert_int_eq(eng_backend_cpu_create(&bo, &be, &err), INF_OK);
    inf_status_t st = eng_lm_model_create(&o, be, &lm, &err);
    ck_assert_msg(st == INF_OK, "%s", err.msg);
    const eng_model_t *m = eng_lm_model(&lm);
    int n_fp = 0, n_q = 0;
    for (int32_t i = 0; i < eng_model_layer_count(m); i++) {
        const struct eng_layer_info *li = eng_model_layer_info(m, i);
        bool want_fp = strstr(li->name, "lm_head") || strstr(li->name, "model.layers.1.mlp.");
        ck_assert_msg(li->quantized == !want_fp, "%s", li->name);
        n_fp += want_fp;
        n_q += !want_fp;
    }
    ck_assert_int_eq(n_fp, 4); /* lm_head, layer 1 gate, up, down */
    ck_assert_int_gt(n_q, 8);
    lm.destroy(lm.self);

    /* cuda where it cannot run (a build without CUDA, or no GPU) is refused
     * by name; where a GPU is usable, tests/gpu/gpu_engine.c covers it. */
    struct eng_config cfg = {0};
    eng_engine_t *eng = NULL;
    struct eng_backend *gpu = NULL;
    if (eng_backend_cuda_create(NULL, &gpu, &err) == INF_OK) {
        eng_backend_destroy(gpu);
    } else {
        ck_assert_int_eq(err.code, INF_E_UNSUPPORTED);
        cfg.backend = ENG_BACKEND_CUDA;
        cfg.model_dir = model_dir;
        ck_assert_int_eq(eng_engine_create(&cfg, NULL, NULL, &eng, &err), INF_E_UNSUPPORTED);
        ck_assert_ptr_nonnull(strstr(err.msg, "cuda"));
    }
    cfg.backend = ENG_BACKEND_CPU;
    cfg.model_dir = NULL;
    ck_assert_int_eq(eng_engine_create(&cfg, NULL, NULL, &eng, &err), INF_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err.msg, "model"));
    cfg.model_dir = "/nonexistent/int4serve-model";
    ck_assert_int_ne(eng_engine_create(&cfg, NULL, NULL, &eng, &err), INF_OK);
    ck_assert_ptr_null(eng);
    remove_model();
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("engine");
    TCase *tc = tcase_create("lifecycle");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, info_and_defaults);
    tcase_add_test(tc, invalid_and_destroy_in_flight);
    tcase_add_test(tc, min_step_time_hook);
    suite_add_tcase(s, tc);
    tc = tcase_create("traffic");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, concurrent_128_from_four_threads);
    tcase_add_test(tc, notify_only_when_outbox_becomes_nonempty);
    tcase_add_test(tc, queue_full_answers_busy);
    tcase_add_test(tc, cancel_running_and_queued);
    tcase_add_test(tc, drain_refuses_new_and_finishes_running);
    tcase_add_test(tc, abort_all_ends_everything);
    tcase_add_test(tc, device_failure_is_sticky);
    suite_add_tcase(s, tc);
    tc = tcase_create("cpu_model");
    tcase_set_timeout(tc, 240);
    tcase_add_test(tc, default_step_budget);
    tcase_add_test(tc, cpu_model_batched_equals_alone);
    tcase_add_test(tc, cpu_model_preemption_keeps_outputs);
    tcase_add_test(tc, cpu_model_fp8_capacity);
    tcase_add_test(tc, cpu_model_window_capacity);
    tcase_add_test(tc, cpu_model_fp8_preemption_keeps_outputs);
    tcase_add_test(tc, cpu_model_prefix_caching_same_outputs);
    tcase_add_test(tc, cpu_model_keep_fp16_names);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    inf_log_set_level(INF_LOG_WARN);
    SRunner *sr = srunner_create(suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
