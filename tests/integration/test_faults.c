/* test_faults.c — clients that go away, KV cache exhaustion, an engine that
 * fails mid-request (the mock's the mock_fail_step hook), and shutdown:
 * SIGTERM under load (drain), drain_timeout 0, a drain that times out, and
 * a second signal. Always the mock backend, whatever $INT4SERVE_IT_BACKEND
 * says: the engine failure needs the mock_fail_step hook, and the KV and
 * drain tests time their loads against the mock's step (the min_step_us hook
 * on a step that costs nothing otherwise). */
#include "harness.h"

#include <check.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static struct it_server srv;

static void start_with(const char *step_us, const char *const *more)
{
    it_hook("min_step_us", step_us);
    ck_assert_msg(it_start(&srv, more), "server did not start");
}

/* Open a connection and send a completions request; the caller reads/closes. */
static int send_raw(const char *body)
{
    int fd = it_send_completion(&srv, body, 0);
    ck_assert_int_ge(fd, 0);
    return fd;
}

static void assert_idle(void)
{
    ck_assert(it_wait_metric(&srv, "int4serve_num_requests_running", 0, 5.0));
    ck_assert(it_wait_metric(&srv, "int4serve_num_requests_waiting", 0, 5.0));
    ck_assert(it_wait_metric(&srv, "int4serve_kv_cache_blocks_used", 0, 5.0));
}

START_TEST(test_disconnect_mid_stream)
{
    start_with("4000", NULL);
    int fd = send_raw("{\"prompt\":[1,70,71],\"max_tokens\":2000,\"ignore_eos\":true,"
                      "\"stream\":true}");
    /* Read until a few deltas arrived, then hang up. */
    char buf[4096];
    size_t got = 0;
    int events = 0;
    while (events < 5) {
        struct pollfd p = {fd, POLLIN, 0};
        ck_assert_int_gt(poll(&p, 1, 5000), 0);
        ssize_t n = recv(fd, buf, sizeof buf - 1, 0);
        ck_assert_int_gt(n, 0);
        buf[n] = '\0';
        got += (size_t)n;
        for (char *q = buf; (q = strstr(q, "data: ")); q += 6)
            events++;
    }
    ck_assert(strstr(buf, "data: ") || got > 0);
    ck_assert_double_eq(it_metric(&srv, "int4serve_num_requests_running"), 1);
    close(fd);
    assert_idle();
    ck_assert(
        it_wait_metric(&srv, "int4serve_request_success_total{finished_reason=\"abort\"}", 1, 5.0));
    /* Far fewer tokens than asked for were generated. */
    ck_assert_double_lt(it_metric(&srv, "int4serve_generation_tokens_total"), 1000);
    ck_assert_int_eq(it_stop(&srv, 0, 10.0), 0);
}
END_TEST

START_TEST(test_disconnect_queued)
{
    const char *more[] = {"--max-batch", "1", NULL};
    start_with("4000", more);
    int a = send_raw("{\"prompt\":[1,70,71],\"max_tokens\":3000,\"ignore_eos\":true}");
    ck_assert(it_wait_metric(&srv, "int4serve_num_requests_running", 1, 5.0));
    int b = send_raw("{\"prompt\":[1,80,81],\"max_tokens\":3000,\"ignore_eos\":true}");
    ck_assert(it_wait_metric(&srv, "int4serve_num_requests_waiting", 1, 5.0));
    close(b);
    /* B leaves the queue while A still runs. */
    ck_assert(it_wait_metric(&srv, "int4serve_num_requests_waiting", 0, 5.0));
    ck_assert_double_eq(it_metric(&srv, "int4serve_num_requests_running"), 1);
    /* A non-streamed client that hangs up is noticed too. */
    close(a);
    assert_idle();
    ck_assert_double_lt(it_metric(&srv, "int4serve_generation_tokens_total"), 2000);
    ck_assert_int_eq(it_stop(&srv, 0, 10.0), 0);
}
END_TEST

START_TEST(test_kv_exhaustion)
{
    /* 16 blocks of 16 tokens; 8 sequences growing to 64 tokens need 32. */
    const char *more[] = {"--max-batch", "8",
                          "--set",       "engine.kv_cache_tokens=256",
                          "--set",       "model.max_model_len=128",
                          NULL};
    /* Steps slow enough that all 8 are admitted before the first finishes. */
    start_with("1000", more);
    enum { N = 8 };
    char *bodies[N], *alone[N];
    struct it_resp rs[N];
    for (int i = 0; i < N; i++) {
        bodies[i] = malloc(160);
        snprintf(bodies[i], 160,
                 "{\"prompt\":[1,%d,%d,%d],\"max_tokens\":60,\"temperature\":0,"
                 "\"ignore_eos\":true}",
                 40 + i, 90 + i, 300 + i);
        struct it_resp r;
        ck_assert(it_post(&srv, "/v1/completions", bodies[i], &r));
        ck_assert_int_eq(r.status, 200);
        json_t *j = it_json(&r);
        alone[i] = strdup(it_choice_text(j, 0));
        json_decref(j);
        it_resp_free(&r);
    }
    ck_assert_double_eq(it_metric(&srv, "int4serve_num_preemptions_total"), 0);
    ck_assert_int_eq(it_post_many(&srv, "/v1/completions", bodies, N, rs), 0);
    for (int i = 0; i < N; i++) {
        ck_assert_int_eq(rs[i].status, 200);
        json_t *j = it_json(&rs[i]);
        ck_assert_str_eq(it_choice_text(j, 0), alone[i]);
        ck_assert_int_eq(
            json_integer_value(json_object_get(json_object_get(j, "usage"), "completion_tokens")),
            60);
        json_decref(j);
        it_resp_free(&rs[i]);
        free(bodies[i]);
        free(alone[i]);
    }
    ck_assert_double_gt(it_metric(&srv, "int4serve_num_preemptions_total"), 0);
    assert_idle();
    ck_assert_int_eq(it_stop(&srv, 0, 10.0), 0);
}
END_TEST

/* ---- engine failure ---------------------------------------------------------------------------
 */
/* OpenAI's body for the engine's failure: 500-class, server_error. */
static void check_engine_error(json_t *j)
{
    ck_assert_ptr_nonnull(j);
    ck_assert_uint_eq(json_object_size(j), 1);
    json_t *e = json_object_get(j, "error");
    ck_assert_uint_eq(json_object_size(e), 4);
    ck_assert_str_eq(json_string_value(json_object_get(e, "message")), "the engine failed");
    ck_assert_str_eq(json_string_value(json_object_get(e, "type")), "server_error");
    ck_assert(json_is_null(json_object_get(e, "param")));
    ck_assert(json_is_null(json_object_get(e, "code")));
}

/* After the failure: /health and /health/ready answer 503 with OpenAI's
 * body, new completions 500; /metrics still answers and says so. */
static void check_failed_server(void)
{
    struct it_resp r;
    const char *paths[] = {"/health", "/health/ready"};
    for (int i = 0; i < 2; i++) {
        ck_assert(it_http(&srv, "GET", paths[i], NULL, NULL, &r));
        ck_assert_msg(r.status == 503, "%s: %ld %s", paths[i], r.status, r.body);
        json_t *j = it_json(&r);
        json_t *e = json_object_get(j, "error");
        ck_assert_str_eq(json_string_value(json_object_get(e, "message")), "the engine has failed");
        ck_assert_str_eq(json_string_value(json_object_get(e, "type")), "server_error");
        json_decref(j);
        it_resp_free(&r);
    }
    ck_assert(it_post(&srv, "/v1/completions", "{\"prompt\":[1,2],\"max_tokens\":2}", &r));
    ck_assert_int_eq(r.status, 500);
    json_t *j = it_json(&r);
    check_engine_error(j);
    json_decref(j);
    it_resp_free(&r);
    ck_assert_double_eq(it_metric(&srv, "int4serve_engine_failed"), 1);
    ck_assert_double_ge(it_metric(&srv, "int4serve_request_errors_total"), 1);
}

START_TEST(test_engine_failure)
{
    /* Step 1 prefills, 2 and 3 decode, the 4th forward fails. */
    it_hook("mock_fail_step", "4");
    start_with("0", NULL);
    struct it_resp r;
    ck_assert(it_http(&srv, "GET", "/health", NULL, NULL, &r));
    ck_assert_int_eq(r.status, 200);
    it_resp_free(&r);
    ck_assert(it_post(&srv, "/v1/completions",
                      "{\"prompt\":[1,70,71],\"max_tokens\":50,\"ignore_eos\":true}", &r));
    ck_assert_msg(r.status == 500, "status %ld: %s", r.status, r.body);
    char buf[64];
    ck_assert_str_eq(it_header(&r, "content-type", buf, sizeof buf), "application/json");
    json_t *j = it_json(&r);
    check_engine_error(j);
    json_decref(j);
    it_resp_free(&r);
    check_failed_server();
    ck_assert_int_eq(it_stop(&srv, 0, 10.0), 0);
}
END_TEST

START_TEST(test_engine_failure_stream)
{
    /* Streamed, the status (200) is sent before the failure: the stream
     * carries an error event, then [DONE] (vLLM's way). */
    it_hook("mock_fail_step", "4");
    start_with("0", NULL);
    struct it_resp r;
    ck_assert(it_post(&srv, "/v1/completions",
                      "{\"prompt\":[1,70,71],\"max_tokens\":50,\"ignore_eos\":true,"
                      "\"temperature\":0,\"stream\":true}",
                      &r));
    ck_assert_int_eq(r.status, 200);
    char **ev;
    size_t n = it_sse_split(r.body, r.len, &ev);
    ck_assert_uint_ge(n, 2);
    ck_assert_str_eq(ev[n - 1], "[DONE]");
    json_t *j = json_loads(ev[n - 2], 0, NULL);
    check_engine_error(j);
    json_decref(j);
    /* Before it, only deltas of the three tokens generated, none finished. */
    for (size_t i = 0; i + 2 < n; i++) {
        json_t *d = json_loads(ev[i], 0, NULL);
        json_t *ch = json_array_get(json_object_get(d, "choices"), 0);
        ck_assert_ptr_nonnull(ch);
        ck_assert(json_is_null(json_object_get(ch, "finish_reason")));
        json_decref(d);
    }
    ck_assert_uint_le(n, 5);
    it_strv_free(ev, n);
    it_resp_free(&r);
    check_failed_server();
    ck_assert_int_eq(it_stop(&srv, 0, 10.0), 0);
}
END_TEST

/* ---- shutdown ---------------------------------------------------------------------------- */
enum { LOAD = 8 };

struct load {
    char *bodies[LOAD];
    struct it_resp rs[LOAD];
    int errors;
};

static void *run_load(void *arg)
{
    struct load *l = arg;
    l->errors = it_post_many(&srv, "/v1/completions", l->bodies, LOAD, l->rs);
    return NULL;
}

static void load_start(struct load *l, pthread_t *th, int max_tokens)
{
    for (int i = 0; i < LOAD; i++) {
        l->bodies[i] = malloc(200);
        snprintf(l->bodies[i], 200,
                 "{\"prompt\":[1,%d,%d],\"max_tokens\":%d,\"ignore_eos\":true%s}", 50 + i, 60 + i,
                 max_tokens, i % 2 ? ",\"stream\":true" : "");
    }
    pthread_create(th, NULL, run_load, l);
    ck_assert(it_wait_metric(&srv, "int4serve_num_requests_running", LOAD, 10.0));
}

/* Every response is 200 and ends with finish (and, streamed, [DONE]). */
static void load_check(struct load *l, const char *finish, int tokens)
{
    ck_assert_int_eq(l->errors, 0);
    for (int i = 0; i < LOAD; i++) {
        ck_assert_msg(l->rs[i].status == 200, "request %d: %ld %s", i, l->rs[i].status,
                      l->rs[i].body);
        char got[32];
        if (i % 2) {
            free(it_stream_text(l->rs[i].body, l->rs[i].len, 0, got, sizeof got));
            const char *end = l->rs[i].body + l->rs[i].len - strlen("data: [DONE]\n\n");
            ck_assert_str_eq(end, "data: [DONE]\n\n");
        } else {
            json_t *j = it_json(&l->rs[i]);
            json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
            snprintf(got, sizeof got, "%s",
                     json_string_value(json_object_get(ch, "finish_reason")));
            if (tokens >= 0)
                ck_assert_int_eq(json_integer_value(json_object_get(json_object_get(j, "usage"),
                                                                    "completion_tokens")),
                                 tokens);
            json_decref(j);
        }
        ck_assert_msg(strcmp(got, finish) == 0, "request %d finished \"%s\", want \"%s\"", i, got,
                      finish);
        it_resp_free(&l->rs[i]);
        free(l->bodies[i]);
    }
}

START_TEST(test_sigterm_drains)
{
    start_with("3000", NULL);
    struct load l = {0};
    pthread_t th;
    load_start(&l, &th, 150);
    kill(srv.pid, SIGTERM);
    usleep(50000);
    /* New work is refused while the running requests finish. */
    struct it_resp r;
    ck_assert(it_post(&srv, "/v1/completions", "{\"prompt\":[1,2],\"max_tokens\":2}", &r));
    ck_assert_int_eq(r.status, 503);
    json_t *j = it_json(&r);
    ck_assert_ptr_nonnull(json_object_get(j, "error"));
    json_decref(j);
    it_resp_free(&r);
    ck_assert(it_http(&srv, "GET", "/health/ready", NULL, NULL, &r));
    ck_assert_int_eq(r.status, 503);
    it_resp_free(&r);
    ck_assert(it_http(&srv, "GET", "/health", NULL, NULL, &r));
    ck_assert_int_eq(r.status, 200);
    it_resp_free(&r);
    pthread_join(th, NULL);
    load_check(&l, "length", 150);
    ck_assert_int_eq(it_wait_exit(&srv, 10.0), 0);
    char *log = it_log(&srv);
    ck_assert_msg(strstr(log, "stopped cleanly"), "log: %s", log);
    free(log);
    it_cleanup(&srv);
}
END_TEST

START_TEST(test_drain_zero)
{
    const char *more[] = {"--set", "limits.drain_timeout=0", NULL};
    start_with("3000", more);
    struct load l = {0};
    pthread_t th;
    load_start(&l, &th, 3000);
    double t0 = it_now();
    kill(srv.pid, SIGTERM);
    pthread_join(th, NULL);
    load_check(&l, "abort", -1);
    ck_assert_int_eq(it_wait_exit(&srv, 5.0), 0);
    ck_assert_double_lt(it_now() - t0, 3.0);
    it_cleanup(&srv);
}
END_TEST

START_TEST(test_drain_timeout)
{
    const char *more[] = {"--set", "limits.drain_timeout=0.6", NULL};
    start_with("3000", more);
    struct load l = {0};
    pthread_t th;
    load_start(&l, &th, 3000);
    double t0 = it_now();
    kill(srv.pid, SIGTERM);
    pthread_join(th, NULL);
    double dt = it_now() - t0;
    load_check(&l, "abort", -1);
    ck_assert_int_eq(it_wait_exit(&srv, 5.0), 0);
    ck_assert_double_ge(dt, 0.5);
    ck_assert_double_lt(dt, 4.0);
    it_cleanup(&srv);
}
END_TEST

START_TEST(test_second_signal)
{
    start_with("3000", NULL); /* drain_timeout 30 s */
    struct load l = {0};
    pthread_t th;
    load_start(&l, &th, 3000);
    kill(srv.pid, SIGTERM);
    usleep(200000);
    ck_assert_double_eq(it_metric(&srv, "int4serve_num_requests_running"), LOAD);
    double t0 = it_now();
    kill(srv.pid, SIGINT);
    pthread_join(th, NULL);
    load_check(&l, "abort", -1);
    ck_assert_int_eq(it_wait_exit(&srv, 5.0), 0);
    ck_assert_double_lt(it_now() - t0, 3.0);
    it_cleanup(&srv);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("integration_faults");
    TCase *tc = tcase_create("disconnect");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_disconnect_mid_stream);
    tcase_add_test(tc, test_disconnect_queued);
    suite_add_tcase(s, tc);
    tc = tcase_create("kv");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_kv_exhaustion);
    suite_add_tcase(s, tc);
    tc = tcase_create("engine");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_engine_failure);
    tcase_add_test(tc, test_engine_failure_stream);
    suite_add_tcase(s, tc);
    tc = tcase_create("shutdown");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_sigterm_drains);
    tcase_add_test(tc, test_drain_zero);
    tcase_add_test(tc, test_drain_timeout);
    tcase_add_test(tc, test_second_signal);
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
