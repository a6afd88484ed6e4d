/* test_http.c — the daemon's HTTP surface: routes, methods, auth, request
 * ids, body limits, the bad-input matrix (answered while a stream runs on
 * unharmed) and the admission queue's 429. Always the mock backend, whatever
 * $INT4SERVE_IT_BACKEND says: the bad-input matrix counts on the mock's
 * 512-token vocabulary and max_model_len, and the queue tests on its pacing. */
#include "api/api.h"
#include "harness.h"

#include <check.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MODEL "mock-model"

static struct it_server srv;

static void start_with(const char *const *more)
{
    const char *args[40];
    int n = 0;
    args[n++] = "--set";
    args[n++] = "server.served_model_name=" MODEL;
    args[n++] = "--set";
    args[n++] = "model.max_model_len=256";
    for (int i = 0; more && more[i]; i++)
        args[n++] = more[i];
    args[n] = NULL;
    ck_assert_msg(it_start(&srv, args), "server did not start");
}

static void stop_clean(void)
{
    ck_assert_int_eq(it_stop(&srv, 0, 20.0), 0);
}

/* The error body: {"error":{"message":non-empty,"type":type,"param":param|null,"code":...}} */
static void check_error(const struct it_resp *r, long status, const char *type, const char *param)
{
    ck_assert_msg(r->status == status, "status %ld, want %ld; body %s", r->status, status, r->body);
    json_t *j = it_json(r);
    ck_assert_msg(j != NULL, "error body is not JSON: %s", r->body);
    json_t *e = json_object_get(j, "error");
    ck_assert_ptr_nonnull(e);
    ck_assert_int_eq(json_object_size(j), 1);
    const char *msg = json_string_value(json_object_get(e, "message"));
    ck_assert_msg(msg && *msg, "empty message: %s", r->body);
    ck_assert_str_eq(json_string_value(json_object_get(e, "type")), type);
    json_t *p = json_object_get(e, "param");
    ck_assert_ptr_nonnull(p);
    if (param)
        ck_assert_msg(json_is_string(p) && strcmp(json_string_value(p), param) == 0, "param: %s",
                      r->body);
    ck_assert_ptr_nonnull(json_object_get(e, "code"));
    json_decref(j);
}

START_TEST(test_routes)
{
    start_with(NULL);
    struct it_resp r;
    char buf[128];

    ck_assert(it_http(&srv, "GET", "/health", NULL, NULL, &r));
    ck_assert_int_eq(r.status, 200);
    ck_assert_str_eq(r.body, "{\"status\":\"ok\"}");
    ck_assert_ptr_nonnull(it_header(&r, "x-request-id", buf, sizeof buf));
    ck_assert(strncmp(buf, "cmpl-", 5) == 0);
    /* cmpl- + 16 hex digits of a per-process random prefix + at least 8 of
     * the request number */
    ck_assert_uint_ge(strlen(buf), 5 + 16 + 8);
    ck_assert_uint_eq(strspn(buf + 5, "0123456789abcdef"), strlen(buf) - 5);
    char hid[128];
    snprintf(hid, sizeof hid, "%s", buf);
    it_resp_free(&r);
    ck_assert(it_http(&srv, "GET", "/health", NULL, NULL, &r));
    ck_assert_ptr_nonnull(it_header(&r, "x-request-id", buf, sizeof buf));
    ck_assert(strncmp(buf, hid, 5 + 16) == 0); /* same process, same prefix */
    ck_assert_str_ne(buf, hid);
    it_resp_free(&r);

    ck_assert(it_http(&srv, "GET", "/health/ready", NULL, NULL, &r));
    ck_assert_int_eq(r.status, 200);
    it_resp_free(&r);

    ck_assert(it_http(&srv, "GET", "/v1/models", NULL, NULL, &r));
    ck_assert_int_eq(r.status, 200);
    json_t *j = it_json(&r);
    ck_assert_str_eq(json_string_value(json_object_get(j, "object")), "list");
    json_t *m = json_array_get(json_object_get(j, "data"), 0);
    ck_assert_str_eq(json_string_value(json_object_get(m, "id")), MODEL);
    ck_assert_int_eq(json_integer_value(json_object_get(m, "max_model_len")), 256);
    ck_assert_int_eq(json_array_size(json_object_get(j, "data")), 1);
    json_decref(j);
    it_resp_free(&r);

    ck_assert(it_http(&srv, "GET", "/nope", NULL, NULL, &r));
    check_error(&r, 404, "invalid_request_error", NULL);
    ck_assert_ptr_nonnull(it_header(&r, "x-request-id", buf, sizeof buf));
    it_resp_free(&r);

    ck_assert(it_http(&srv, "GET", "/v1/completions", NULL, NULL, &r));
    check_error(&r, 405, "invalid_request_error", NULL);
    ck_assert_str_eq(it_header(&r, "allow", buf, sizeof buf), "POST");
    it_resp_free(&r);

    ck_assert(it_http(&srv, "POST", "/health", "{}", NULL, &r));
    check_error(&r, 405, "invalid_request_error", NULL);
    ck_assert_str_eq(it_header(&r, "allow", buf, sizeof buf), "GET, HEAD");
    it_resp_free(&r);

    /* The completion's id is the X-Request-Id, and ids differ per request. */
    ck_assert(it_post(&srv, "/v1/completions", "{\"prompt\":[1,70,71],\"max_tokens\":2}", &r));
    ck_assert_int_eq(r.status, 200);
    j = it_json(&r);
    ck_assert_str_eq(json_string_value(json_object_get(j, "id")),
                     it_header(&r, "x-request-id", buf, sizeof buf));
    ck_assert_str_eq(json_string_value(json_object_get(j, "object")), "text_completion");
    ck_assert_str_eq(json_string_value(json_object_get(j, "model")), MODEL);
    json_decref(j);
    char first[128];
    snprintf(first, sizeof first, "%s", buf);
    it_resp_free(&r);
    ck_assert(it_post(&srv, "/v1/completions", "{\"prompt\":[1,70,71],\"max_tokens\":2}", &r));
    ck_assert_str_ne(it_header(&r, "x-request-id", buf, sizeof buf), first);
    it_resp_free(&r);

    /* /metrics is Prometheus text with the engine's and the server's series. */
    ck_assert(it_http(&srv, "GET", "/metrics", NULL, NULL, &r));
    ck_assert_int_eq(r.status, 200);
    ck_assert(strstr(r.body, "# TYPE int4serve_time_to_first_token_seconds histogram\n"));
    ck_assert(strstr(r.body, "int4serve_request_success_total{finished_reason=\"length\"} 2\n"));
    ck_assert(strstr(r.body, "int4serve_generation_tokens_total 4\n"));
    ck_assert(strstr(r.body, "int4serve_prompt_tokens_total 6\n"));
    ck_assert(strstr(r.body, "int4serve_e2e_request_latency_seconds_count 2\n"));
    ck_assert(strstr(r.body, "int4serve_time_to_first_token_seconds_bucket{le=\"+Inf\"} 2\n"));
    it_resp_free(&r);
    stop_clean();
}
END_TEST

START_TEST(test_auth)
{
    const char *more[] = {"--api-key", "s3cret-key", NULL};
    start_with(more);
    struct it_resp r;
    const char *body = "{\"prompt\":[1,70],\"max_tokens\":1}";
    ck_assert(it_http(&srv, "GET", "/v1/models", NULL, NULL, &r));
    check_error(&r, 401, "invalid_request_error", NULL);
    json_t *j = it_json(&r);
    ck_assert_str_eq(json_string_value(json_object_get(json_object_get(j, "error"), "code")),
                     "invalid_api_key");
    json_decref(j);
    it_resp_free(&r);

    const char *wrong[] = {"Authorization: Bearer s3cret-kez", NULL};
    const char *prefix[] = {"Authorization: Bearer s3cret", NULL};
    const char *right[] = {"Authorization: Bearer s3cret-key", NULL};
    ck_assert(it_http(&srv, "POST", "/v1/completions", body, wrong, &r));
    ck_assert_int_eq(r.status, 401);
    it_resp_free(&r);
    ck_assert(it_http(&srv, "POST", "/v1/completions", body, prefix, &r));
    ck_assert_int_eq(r.status, 401);
    it_resp_free(&r);
    ck_assert(it_http(&srv, "POST", "/v1/completions", body, NULL, &r));
    ck_assert_int_eq(r.status, 401);
    it_resp_free(&r);
    ck_assert(it_http(&srv, "POST", "/v1/completions", body, right, &r));
    ck_assert_int_eq(r.status, 200);
    it_resp_free(&r);
    ck_assert(it_http(&srv, "GET", "/v1/models", NULL, right, &r));
    ck_assert_int_eq(r.status, 200);
    it_resp_free(&r);
    /* Health and metrics stay open. */
    ck_assert(it_http(&srv, "GET", "/health", NULL, NULL, &r));
    ck_assert_int_eq(r.status, 200);
    it_resp_free(&r);
    ck_assert(it_http(&srv, "GET", "/health/ready", NULL, NULL, &r));
    ck_assert_int_eq(r.status, 200);
    it_resp_free(&r);
    ck_assert(it_http(&srv, "GET", "/metrics", NULL, NULL, &r));
    ck_assert_int_eq(r.status, 200);
    it_resp_free(&r);
    stop_clean();
}
END_TEST

START_TEST(test_content_length)
{
    const char *more[] = {"--set", "limits.body_limit=4096", NULL};
    start_with(more);
    char out[8192];

    /* 10^12 announced: 413 at once, before any body byte is sent. */
    const char *huge =
        "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
        "\r\nContent-Length: 1000000000000\r\n\r\n";
    double t0 = it_now();
    ssize_t n = it_raw(&srv, huge, strlen(huge), out, sizeof out, 5.0);
    ck_assert_int_gt(n, 0);
    ck_assert_msg(strncmp(out, "HTTP/1.1 413", 12) == 0, "got %s", out);
    ck_assert_msg(strstr(out, "\"type\":\"invalid_request_error\""), "got %s", out);
    /* The server closed the connection rather than wait for the body. */
    ck_assert_double_lt(it_now() - t0, 4.0);

    /* Non-numeric Content-Length, and one over 64 bits: libmicrohttpd
     * answers these itself, before any callback that could write OpenAI's
     * body runs (docs/API.md, "Known limitations"), so only the status is
     * ours to check. */
    const char *bad =
        "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 12abc\r\n\r\n"
        "{\"prompt\":1}";
    n = it_raw(&srv, bad, strlen(bad), out, sizeof out, 5.0);
    ck_assert_msg(n > 0 && strncmp(out, "HTTP/1.1 400", 12) == 0, "got %s", out);
    const char *over64 = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                         "Content-Length: 99999999999999999999999\r\n\r\n";
    n = it_raw(&srv, over64, strlen(over64), out, sizeof out, 5.0);
    ck_assert_msg(n > 0 && strncmp(out, "HTTP/1.1 413", 12) == 0, "got %s", out);

    /* A real body one byte over the limit, with an honest Content-Length. */
    char *big = malloc(4097 + 256);
    int h = snprintf(
        big, 256,
        "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 4097\r\n\r\n");
    memset(big + h, ' ', 4097);
    n = it_raw(&srv, big, (size_t)h + 4097, out, sizeof out, 5.0);
    ck_assert_msg(n > 0 && strncmp(out, "HTTP/1.1 413", 12) == 0, "got %s", out);

    /* A chunked body that grows over the limit: read and dropped, then 413. */
    char *chunked = malloc(8192);
    h = snprintf(
        chunked, 8192,
        "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n"
        "Connection: close\r\n\r\n1400\r\n");
    memset(chunked + h, ' ', 0x1400);
    h += 0x1400;
    h += snprintf(chunked + h, 8192 - (size_t)h, "\r\n0\r\n\r\n");
    n = it_raw(&srv, chunked, (size_t)h, out, sizeof out, 5.0);
    ck_assert_msg(n > 0 && strncmp(out, "HTTP/1.1 413", 12) == 0, "got %s", out);
    free(big);
    free(chunked);

    /* The server still answers. */
    struct it_resp r;
    ck_assert(it_post(&srv, "/v1/completions", "{\"prompt\":[1,70],\"max_tokens\":1}", &r));
    ck_assert_int_eq(r.status, 200);
    it_resp_free(&r);
    stop_clean();
}
END_TEST

/* ---- the bad-input matrix, while a stream runs --------------------------------------- */
struct bg_stream {
    struct it_resp r;
    bool ok;
    volatile bool done;
};

static void *run_stream(void *arg)
{
    struct bg_stream *b = arg;
    b->ok =
        it_post(&srv, "/v1/completions",
                "{\"prompt\":[1,80,81,82],\"max_tokens\":240,\"ignore_eos\":true,"
                "\"temperature\":0,\"stream\":true,\"stream_options\":{\"include_usage\":true}}",
                &b->r);
    b->done = true;
    return NULL;
}

struct bad_case {
    const char *body;
    long status;
    const char *param; /* NULL: not checked */
};

START_TEST(test_bad_inputs)
{
    /* A slow engine step keeps the stream running through the whole matrix. */
    it_hook("min_step_us", "8000");
    start_with(NULL);
    struct bg_stream bg = {0};
    pthread_t th;
    pthread_create(&th, NULL, run_stream, &bg);
    while (it_metric(&srv, "int4serve_num_requests_running") < 1)
        ;

    char ids300[4096];
    int o = snprintf(ids300, sizeof ids300, "{\"prompt\":[1");
    for (int i = 0; i < 299; i++)
        o += snprintf(ids300 + o, sizeof ids300 - (size_t)o, ",%d", 100 + i % 50);
    snprintf(ids300 + o, sizeof ids300 - (size_t)o, "]}");

    const struct bad_case cases[] = {
        {"", 400, NULL},
        {"{\"prompt\":[1,2", 400, NULL},
        {"42", 400, NULL},
        {"null", 400, NULL},
        {"\"str\"", 400, NULL},
        {"[1]", 400, NULL},
        {"{\"prompt\":[1],\"prompt\":[2]}", 400, NULL},
        {"{}", 400, "prompt"},
        {"{\"prompt\":\"\"}", 400, "prompt"},
        {"{\"prompt\":[]}", 400, "prompt"},
        {"{\"prompt\":[[]]}", 400, "prompt"},
        {ids300, 400, NULL},
        {"{\"prompt\":[1,2,3],\"max_tokens\":-1}", 400, "max_tokens"},
        {"{\"prompt\":[1,2,3],\"max_tokens\":2147483647}", 400, NULL},
        {"{\"prompt\":[1,2,3],\"max_tokens\":9223372036854775807}", 400, NULL},
        {"{\"prompt\":[1,2,3],\"max_tokens\":16.0}", 400, "max_tokens"},
        {"{\"prompt\":[1,2,3],\"max_tokens\":\"16\"}", 400, "max_tokens"},
        {"{\"prompt\":[1,2,3],\"n\":0}", 400, "n"},
        {"{\"prompt\":[1,2,3],\"n\":1000000}", 400, "n"},
        {"{\"prompt\":[1,2,3],\"n\":3,\"best_of\":2}", 400, "best_of"},
        {"{\"prompt\":[1,2,3],\"n\":2,\"best_of\":4}", 400, "best_of"},
        {"{\"prompt\":[1,2,3],\"logprobs\":6}", 400, "logprobs"},
        {"{\"prompt\":[1,2,3],\"logprobs\":-1}", 400, "logprobs"},
        {"{\"prompt\":[1,2,3],\"top_p\":1.5}", 400, "top_p"},
        {"{\"prompt\":[1,2,3],\"logit_bias\":{\"512\":1}}", 400, "logit_bias"},
        {"{\"prompt\":[1,2,512]}", 400, "prompt"},
        {"{\"prompt\":[1,-2,3]}", 400, "prompt"},
        {"{\"prompt\":[1,2,3],\"stream\":\"yes\"}", 400, "stream"},
        {"{\"prompt\":[1,2,3],\"max_tokens\":4,\"min_tokens\":5}", 400, "min_tokens"},
        {"{\"prompt\":[1,2,3],\"model\":\"other\"}", 404, "model"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct it_resp r;
        ck_assert(it_post(&srv, "/v1/completions", cases[i].body, &r));
        if (r.status != cases[i].status)
            ck_abort_msg("case %zu (%.80s): status %ld, want %ld: %s", i, cases[i].body, r.status,
                         cases[i].status, r.body);
        check_error(&r, cases[i].status, "invalid_request_error", cases[i].param);
        it_resp_free(&r);
    }

    /* The context check's exact message: 250 prompt tokens + 7 > 256. */
    char fit[4096];
    o = snprintf(fit, sizeof fit, "{\"prompt\":[1");
    for (int i = 0; i < 249; i++)
        o += snprintf(fit + o, sizeof fit - (size_t)o, ",%d", 100 + i % 50);
    char *tail = fit + o;
    struct it_resp r;
    snprintf(tail, sizeof fit - (size_t)o, "],\"max_tokens\":7}");
    ck_assert(it_post(&srv, "/v1/completions", fit, &r));
    check_error(&r, 400, "invalid_request_error", NULL);
    json_t *j = it_json(&r);
    json_t *e = json_object_get(j, "error");
    ck_assert_str_eq(json_string_value(json_object_get(e, "message")),
                     "This model's maximum context length is 256 tokens. However, you requested "
                     "257 tokens (250 in the messages, 7 in the completion). Please reduce the "
                     "length of the messages or completion.");
    ck_assert_str_eq(json_string_value(json_object_get(e, "code")), "context_length_exceeded");
    ck_assert(json_is_null(json_object_get(e, "param")));
    json_decref(j);
    it_resp_free(&r);
    bool overlapped = !bg.done;
    /* One token less fits. */
    snprintf(tail, sizeof fit - (size_t)o, "],\"max_tokens\":6,\"ignore_eos\":true}");
    ck_assert(it_post(&srv, "/v1/completions", fit, &r));
    ck_assert_int_eq(r.status, 200);
    j = it_json(&r);
    ck_assert_int_eq(
        json_integer_value(json_object_get(json_object_get(j, "usage"), "completion_tokens")), 6);
    json_decref(j);
    it_resp_free(&r);

    /* The stream was still running through the matrix, and finished whole. */
    pthread_join(th, NULL);
    ck_assert_msg(overlapped, "the stream ended before the matrix did");
    ck_assert(bg.ok);
    ck_assert_int_eq(bg.r.status, 200);
    char **ev;
    size_t n = it_sse_split(bg.r.body, bg.r.len, &ev);
    ck_assert_uint_ge(n, 3);
    ck_assert_str_eq(ev[n - 1], "[DONE]");
    json_t *u = json_loads(ev[n - 2], 0, NULL);
    json_t *usage = json_object_get(u, "usage");
    ck_assert_int_eq(json_integer_value(json_object_get(usage, "completion_tokens")), 240);
    ck_assert_int_eq(json_integer_value(json_object_get(usage, "prompt_tokens")), 4);
    json_decref(u);
    it_strv_free(ev, n);
    char finish[32];
    free(it_stream_text(bg.r.body, bg.r.len, 0, finish, sizeof finish));
    ck_assert_str_eq(finish, "length");
    it_resp_free(&bg.r);
    stop_clean();
}
END_TEST

START_TEST(test_queue_full)
{
    /* One running sequence, two waiting: the rest of 24 at once get 429. */
    it_hook("min_step_us", "2000");
    const char *more[] = {
        "--max-batch",        "1", "--set", "engine.max_batched_tokens=64", "--set",
        "limits.max_queue=2", NULL};
    start_with(more);
    enum { N = 24 };
    char *bodies[N];
    struct it_resp rs[N];
    for (int i = 0; i < N; i++) {
        bodies[i] = malloc(128);
        snprintf(bodies[i], 128, "{\"prompt\":[1,%d],\"max_tokens\":20,\"ignore_eos\":true}",
                 100 + i);
    }
    ck_assert_int_eq(it_post_many(&srv, "/v1/completions", bodies, N, rs), 0);
    int ok = 0, busy = 0;
    for (int i = 0; i < N; i++) {
        if (rs[i].status == 200) {
            json_t *j = it_json(&rs[i]);
            json_t *u = json_object_get(j, "usage");
            ck_assert_int_eq(json_integer_value(json_object_get(u, "completion_tokens")), 20);
            json_decref(j);
            ok++;
        } else {
            /* OpenAI's 429 body for too many requests, and a Retry-After. */
            check_error(&rs[i], 429, "requests", NULL);
            json_t *j = it_json(&rs[i]);
            json_t *e = json_object_get(j, "error");
            ck_assert_str_eq(json_string_value(json_object_get(e, "code")), "rate_limit_exceeded");
            ck_assert(json_is_null(json_object_get(e, "param")));
            ck_assert_str_eq(json_string_value(json_object_get(e, "message")),
                             "the server is busy (admission queue full): retry later");
            json_decref(j);
            char buf[32];
            ck_assert_ptr_nonnull(it_header(&rs[i], "retry-after", buf, sizeof buf));
            ck_assert_str_eq(buf, "1");
            busy++;
        }
        it_resp_free(&rs[i]);
        free(bodies[i]);
    }
    ck_assert_int_ge(ok, 2); /* at least what the queue holds */
    ck_assert_int_gt(busy, 0);
    ck_assert_int_eq(ok + busy, N);
    /* One 429 line in full; the others as one count, written at the end of
     * the interval or when the daemon stops. */
    kill(srv.pid, SIGTERM);
    ck_assert_int_eq(it_wait_exit(&srv, 20.0), 0);
    char *log = it_log(&srv);
    int lines = 0;
    for (const char *p = log; (p = strstr(p, " -> 429 ")); p++)
        lines++;
    ck_assert_int_eq(lines, 1);
    char want[96];
    snprintf(want, sizeof want, "429 answers (admission queue full): %d more in the last",
             busy - 1);
    ck_assert_msg(busy == 1 || strstr(log, want), "log lacks '%s': %s", want, log);
    free(log);
    it_cleanup(&srv);
}
END_TEST

/* A request with more prompts than the admission queue holds can never be
 * admitted: it is a bad request (400 naming 'prompt'), not a 429 that asks
 * the client to retry what can never succeed. One that fits is served. */
START_TEST(test_prompts_over_queue)
{
    /* One sequence runs at a time, so the prompts of one request wait
     * together: four of them never fit a queue of two. */
    it_hook("min_step_us", "2000");
    const char *more[] = {"--max-batch", "1", "--set", "limits.max_queue=2", NULL};
    start_with(more);
    struct it_resp r;
    ck_assert(it_post(&srv, "/v1/completions",
                      "{\"prompt\":[[1,5],[1,6],[1,7],[1,8]],\"max_tokens\":2}", &r));
    check_error(&r, 400, "invalid_request_error", "prompt");
    json_t *j = it_json(&r);
    const char *msg = json_string_value(json_object_get(json_object_get(j, "error"), "message"));
    ck_assert_msg(strstr(msg, "at most 2 prompts") != NULL, "message: %s", msg);
    json_decref(j);
    it_resp_free(&r);
    ck_assert(it_post(&srv, "/v1/completions",
                      "{\"prompt\":[[1,5],[1,6]],\"max_tokens\":2,\"ignore_eos\":true}", &r));
    ck_assert_int_eq(r.status, 200);
    j = it_json(&r);
    ck_assert_int_eq(json_array_size(json_object_get(j, "choices")), 2);
    json_decref(j);
    it_resp_free(&r);
    stop_clean();
}
END_TEST

/* systemd readiness: READY=1 once serving, STOPPING=1 on SIGTERM, as
 * datagrams to the socket NOTIFY_SOCKET names. */
START_TEST(test_sd_notify)
{
    char path[108];
    snprintf(path, sizeof path, "/tmp/int4serve-notify-%d.sock", (int)getpid());
    unlink(path);
    int fd = socket(AF_UNIX, SOCK_DGRAM, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    setenv("NOTIFY_SOCKET", path, 1);
    start_with(NULL);
    unsetenv("NOTIFY_SOCKET");
    char msg[64];
    struct pollfd p = {fd, POLLIN, 0};
    ck_assert_int_eq(poll(&p, 1, 2000), 1);
    ssize_t n = recv(fd, msg, sizeof msg - 1, 0);
    ck_assert_int_gt(n, 0);
    msg[n] = '\0';
    ck_assert_str_eq(msg, "READY=1");
    kill(srv.pid, SIGTERM);
    ck_assert_int_eq(poll(&p, 1, 2000), 1);
    n = recv(fd, msg, sizeof msg - 1, 0);
    ck_assert_int_gt(n, 0);
    msg[n] = '\0';
    ck_assert_str_eq(msg, "STOPPING=1");
    ck_assert_int_eq(it_wait_exit(&srv, 10.0), 0);
    close(fd);
    unlink(path);
    it_cleanup(&srv);
}
END_TEST

static int connect_raw(void)
{
    int fd = it_connect(&srv, 0);
    ck_assert_int_ge(fd, 0);
    return fd;
}

/* Seconds until the server closes fd (reads return 0), up to limit. */
static double closed_after(int fd, double limit)
{
    double t0 = it_now();
    char buf[512];
    while (it_now() - t0 < limit) {
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, 50) == 1 && recv(fd, buf, sizeof buf, 0) <= 0)
            return it_now() - t0;
    }
    return INFINITY;
}

START_TEST(test_connection_limits)
{
    const char *more[] = {"--set", "limits.connection_timeout=1", "--set",
                          "limits.per_ip_connections=2", NULL};
    start_with(more);
    usleep(100000); /* the start-up probe's connection is gone */
    /* An idle connection is closed after the timeout. */
    int idle = connect_raw();
    double t = closed_after(idle, 5.0);
    ck_assert_double_ge(t, 0.5);
    ck_assert_double_lt(t, 4.0);
    close(idle);
    /* A third connection from one address is refused (answered 503 and
     * closed at once; test_edge.c checks the answer). */
    int a = connect_raw(), b = connect_raw();
    usleep(100000);
    int c = connect_raw();
    ck_assert_double_lt(closed_after(c, 0.8), 0.8);
    close(a);
    close(b);
    close(c);
    usleep(100000);
    struct it_resp r;
    ck_assert(it_http(&srv, "GET", "/health", NULL, NULL, &r));
    ck_assert_int_eq(r.status, 200);
    it_resp_free(&r);
    stop_clean();
}
END_TEST

/* A request head larger than limits.connection_memory is refused (431) and
 * the server goes on; one that fits is served. */
START_TEST(test_header_memory)
{
    const char *more[] = {"--set", "limits.connection_memory=16KiB", NULL};
    start_with(more);
    char *big = malloc(20001 + 16);
    memcpy(big, "X-Big: ", 7);
    memset(big + 7, 'a', 20000 - 7);
    big[20000] = '\0';
    const char *h1[] = {big, NULL};
    struct it_resp r;
    ck_assert(it_http(&srv, "GET", "/health", NULL, h1, &r));
    ck_assert_msg(r.status == 431, "status %ld", r.status);
    it_resp_free(&r);
    big[4000] = '\0'; /* a 4 KB header fits */
    ck_assert(it_http(&srv, "GET", "/health", NULL, h1, &r));
    ck_assert_int_eq(r.status, 200);
    it_resp_free(&r);
    free(big);
    stop_clean();
}
END_TEST

/* A completion over prompt ids a, a+1, ... (n of them); extra is more JSON. */
static void post_ids(int a, int n, const char *extra)
{
    char body[2048];
    int len = snprintf(body, sizeof body, "{\"prompt\":[");
    for (int i = 0; i < n; i++)
        len += snprintf(body + len, sizeof body - (size_t)len, "%s%d", i ? "," : "", a + i % 90);
    snprintf(body + len, sizeof body - (size_t)len, "],\"max_tokens\":2%s}", extra);
    struct it_resp r;
    ck_assert(it_post(&srv, "/v1/completions", body, &r));
    ck_assert_msg(r.status == 200, "status %ld: %s", r.status, r.body);
    it_resp_free(&r);
}

/* The server's log, once it holds needle (up to 5 s); NULL if it never does. */
static char *log_with(const char *needle)
{
    for (int i = 0; i < 100; i++) {
        char *log = it_log(&srv);
        if (log && strstr(log, needle))
            return log;
        free(log);
        usleep(50 * 1000);
    }
    return NULL;
}

START_TEST(test_prefix_cache_metrics)
{
    /* /metrics counts the prefix cache in prompt tokens: a 40-token prompt
     * again hits its first two blocks (the last token is always computed);
     * one with prompt logprobs (echo) computes every position. The stats
     * line gives the hit rate. */
    const char *every_second[] = {"--set", "engine.stats_log_interval=1", NULL};
    start_with(every_second);
    post_ids(70, 40, "");
    post_ids(70, 40, "");
    ck_assert(it_wait_metric(&srv, "int4serve_prefix_cache_queries_total", 80, 5));
    ck_assert(it_metric(&srv, "int4serve_prefix_cache_hits_total") == 32);
    post_ids(70, 40, ",\"echo\":true,\"logprobs\":1");
    ck_assert(it_wait_metric(&srv, "int4serve_prefix_cache_queries_total", 120, 5));
    ck_assert(it_metric(&srv, "int4serve_prefix_cache_hits_total") == 32);
    post_ids(70, 20, ""); /* one cached block of the 20 tokens */
    ck_assert(it_wait_metric(&srv, "int4serve_prefix_cache_hits_total", 48, 5));
    struct it_resp r;
    ck_assert(it_http(&srv, "GET", "/metrics", NULL, NULL, &r));
    ck_assert(strstr(r.body, "# TYPE int4serve_prefix_cache_queries_total counter\n"));
    ck_assert(strstr(r.body, "# TYPE int4serve_prefix_cache_hits_total counter\n"));
    ck_assert(strstr(r.body, "int4serve_prefix_cache_queries_total 140\n"));
    it_resp_free(&r);
    char *log = log_with("prefix cache hit rate");
    ck_assert_msg(log != NULL, "no stats line with the hit rate");
    ck_assert(strstr(log, "stats: prompt "));
    free(log);
    stop_clean();

    /* off: nothing is looked up */
    const char *off[] = {"--set", "engine.prefix_caching=false", "--set",
                         "engine.stats_log_interval=1", NULL};
    start_with(off);
    post_ids(70, 40, "");
    post_ids(70, 40, "");
    ck_assert(it_wait_metric(&srv, "int4serve_prompt_tokens_total", 80, 5));
    ck_assert(it_metric(&srv, "int4serve_prefix_cache_queries_total") == 0);
    ck_assert(it_metric(&srv, "int4serve_prefix_cache_hits_total") == 0);
    log = log_with("prefix cache off");
    ck_assert_msg(log != NULL, "no stats line saying the prefix cache is off");
    free(log);
    stop_clean();
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("integration_http");
    TCase *tc = tcase_create("routes");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_routes);
    tcase_add_test(tc, test_auth);
    tcase_add_test(tc, test_sd_notify);
    tcase_add_test(tc, test_prefix_cache_metrics);
    suite_add_tcase(s, tc);
    tc = tcase_create("limits");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_content_length);
    tcase_add_test(tc, test_queue_full);
    tcase_add_test(tc, test_prompts_over_queue);
    tcase_add_test(tc, test_connection_limits);
    tcase_add_test(tc, test_header_memory);
    suite_add_tcase(s, tc);
    tc = tcase_create("bad_inputs");
    tcase_set_timeout(tc, 90);
    tcase_add_test(tc, test_bad_inputs);
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
