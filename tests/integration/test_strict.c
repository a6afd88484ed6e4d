/* test_strict.c — what a request's head must be: framing that a proxy could
 * read otherwise (two lengths, a length with chunks, no Host), header names,
 * the Host values served (DNS rebinding), the Content-Type of a body (a
 * browser's "simple" cross-origin POST), CORS only for listed origins;
 * GET /v1/models/{id}; a client's X-Request-Id; and a large prompt
 * tokenized off the loop. Always the mock backend. */
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

#define MODEL "mock-model"

static struct it_server srv;

static void start_with(const char *const *more)
{
    const char *args[40];
    int n = 0;
    args[n++] = "--set";
    args[n++] = "server.served_model_name=" MODEL;
    for (int i = 0; more && more[i]; i++)
        args[n++] = more[i];
    args[n] = NULL;
    ck_assert_msg(it_start(&srv, args), "server did not start");
}

/* The answer to a raw request: status, and the error body's message when
 * want_json (the body must then be OpenAI's error object). */
static long raw_status(const char *req, bool want_json, char *msg, size_t cap)
{
    static char out[16384];
    ssize_t n = it_raw(&srv, req, strlen(req), out, sizeof out, 3.0);
    ck_assert_msg(n > 12 && strncmp(out, "HTTP/1.", 7) == 0, "no answer to %.60s: %s", req, out);
    long status = strtol(out + 9, NULL, 10);
    if (want_json) {
        ck_assert_msg(strstr(out, "\r\nContent-Type: application/json\r\n"), "got %s", out);
        const char *b = strstr(out, "\r\n\r\n");
        ck_assert_ptr_nonnull(b);
        json_t *j = json_loads(b + 4, 0, NULL);
        ck_assert_msg(j != NULL, "not JSON: %s", b + 4);
        json_t *e = json_object_get(j, "error");
        ck_assert_str_eq(json_string_value(json_object_get(e, "type")), "invalid_request_error");
        if (msg)
            snprintf(msg, cap, "%s", json_string_value(json_object_get(e, "message")));
        json_decref(j);
    }
    return status;
}

/* ---- framing ---------------------------------------------------------------------------- */
struct frame_case {
    const char *req;
    long status;
    const char *msg; /* a part of the message */
};

START_TEST(test_framing)
{
    start_with(NULL);
#define H "Host: 127.0.0.1\r\n"
#define CT "Content-Type: application/json\r\n"
#define BODY "{\"prompt\":[1,7],\"max_tokens\":1}"
    static const struct frame_case cases[] = {
        {"POST /v1/completions HTTP/1.1\r\n" H CT
         "Content-Length: 31\r\nContent-Length: 5\r\n\r\n" BODY,
         400, "Content-Length headers with different values"},
        {"POST /v1/completions HTTP/1.1\r\n" H CT "Content-Length: 31\r\nTransfer-Encoding: "
         "chunked\r\n\r\n1f\r\n" BODY "\r\n0\r\n\r\n",
         400, "both Content-Length and Transfer-Encoding"},
        {"POST /v1/completions HTTP/1.1\r\n" H CT "Transfer-Encoding: chunked\r\nContent-Length: "
         "31\r\n\r\n" BODY,
         400, "both Content-Length and Transfer-Encoding"},
        {"POST /v1/completions HTTP/1.1\r\n" H CT "Transfer-Encoding: gzip, chunked\r\n\r\n", 400,
         "is not supported"},
        {"POST /v1/completions HTTP/1.1\r\n" H CT
         "Transfer-Encoding: chunked\r\nTransfer-Encoding: "
         "chunked\r\n\r\n",
         400, "is not supported"},
        {"POST /v1/completions HTTP/1.0\r\n" CT "Transfer-Encoding: chunked\r\n\r\n", 400,
         "HTTP/1.0"},
        {"GET /health HTTP/1.1\r\n\r\n", 400, "needs a Host header"},
        {"GET /health HTTP/1.1\r\n" H "Host: 127.0.0.2\r\n\r\n", 400, "more than one Host"},
        {"POST /v1/completions HTTP/1.1\r\n" H CT "Content-Length : 31\r\n\r\n" BODY, 400,
         "is not a valid field name"},
        {"GET /health HTTP/1.1\r\n" H "X\"y: 1\r\n\r\n", 400, "is not a valid field name"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char msg[512] = "";
        long st = raw_status(cases[i].req, true, msg, sizeof msg);
        ck_assert_msg(st == cases[i].status, "case %zu: status %ld", i, st);
        ck_assert_msg(strstr(msg, cases[i].msg), "case %zu: message %s", i, msg);
    }
    /* What stays accepted: the same length twice, chunks alone, HTTP/1.0
     * without Host. */
    ck_assert_int_eq(raw_status("POST /v1/completions HTTP/1.1\r\n" H CT "Content-Length: 31\r\n"
                                "Content-Length: 31\r\nConnection: close\r\n\r\n" BODY,
                                false, NULL, 0),
                     200);
    ck_assert_int_eq(raw_status("POST /v1/completions HTTP/1.1\r\n" H CT "Transfer-Encoding: "
                                "chunked\r\nConnection: close\r\n\r\n1f\r\n" BODY "\r\n0\r\n\r\n",
                                false, NULL, 0),
                     200);
    ck_assert_int_eq(raw_status("GET /health HTTP/1.0\r\n\r\n", false, NULL, 0), 200);
#undef BODY
    ck_assert_int_eq(it_stop(&srv, 0, 10.0), 0);
}
END_TEST

/* ---- Host -------------------------------------------------------------------------------- */
static long get_with_host(const char *host)
{
    char req[512];
    snprintf(req, sizeof req, "GET /v1/models HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n",
             host);
    return raw_status(req, false, NULL, 0);
}

START_TEST(test_hosts_loopback)
{
    /* Listening on 127.0.0.1: only loopback names are served, so a page
     * whose name was rebound to 127.0.0.1 cannot read the answers. */
    start_with(NULL);
    char port[80];
    snprintf(port, sizeof port, "127.0.0.1:%d", srv.port);
    ck_assert_int_eq(get_with_host(port), 200);
    ck_assert_int_eq(get_with_host("localhost"), 200);
    ck_assert_int_eq(get_with_host("LocalHost.:8000"), 200);
    ck_assert_int_eq(get_with_host("a.localhost"), 200);
    ck_assert_int_eq(get_with_host("[::1]:8000"), 200);
    char msg[256];
    ck_assert_int_eq(raw_status("GET /v1/models HTTP/1.1\r\nHost: attacker.example:8000\r\n\r\n",
                                true, msg, sizeof msg),
                     400);
    ck_assert_str_eq(msg, "the host \"attacker.example\" is not served here "
                          "(server.allowed_hosts)");
    ck_assert_int_eq(get_with_host("127.0.0.1.attacker.example"), 400);
    ck_assert_int_eq(get_with_host("localhost.attacker.example"), 400);
    ck_assert_int_eq(get_with_host("::1"), 400); /* an IPv6 address must be bracketed */
    ck_assert_int_eq(get_with_host("127.0.0.1:80x"), 400);
    ck_assert_int_eq(it_stop(&srv, 0, 10.0), 0);
}
END_TEST

START_TEST(test_hosts_listed)
{
    const char *more[] = {"--set", "server.allowed_hosts=api.example.com,.corp.example,127.0.0.1",
                          NULL};
    start_with(more);
    ck_assert_int_eq(get_with_host("api.example.com"), 200);
    ck_assert_int_eq(get_with_host("API.example.com:443"), 200);
    ck_assert_int_eq(get_with_host("corp.example"), 200);
    ck_assert_int_eq(get_with_host("x.y.corp.example"), 200);
    ck_assert_int_eq(get_with_host("xcorp.example"), 400);
    ck_assert_int_eq(get_with_host("localhost"), 400);
    ck_assert_int_eq(it_stop(&srv, 0, 10.0), 0);
}
END_TEST

START_TEST(test_hosts_any)
{
    /* Listening on every address: Host is the operator's business. */
    const char *more[] = {"--host", "0.0.0.0", NULL};
    start_with(more);
    ck_assert_int_eq(get_with_host("anything.example"), 200);
    ck_assert_int_eq(it_stop(&srv, 0, 10.0), 0);
}
END_TEST

/* ---- Content-Type and CORS ------------------------------------------------------------ */
static struct it_resp post_ct(const char *path, const char *ctype, const char *body,
                              const char *origin)
{
    /* libcurl adds "Content-Type: application/json" to it_http's bodies:
     * raw requests say what they want. */
    char req[2048];
    snprintf(req, sizeof req,
             "POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\n%s%s%s%s%s%sContent-Length: %zu\r\n"
             "Connection: close\r\n\r\n%s",
             path, ctype ? "Content-Type: " : "", ctype ? ctype : "", ctype ? "\r\n" : "",
             origin ? "Origin: " : "", origin ? origin : "", origin ? "\r\n" : "", strlen(body),
             body);
    static char out[16384];
    struct it_resp r = {0};
    ssize_t n = it_raw(&srv, req, strlen(req), out, sizeof out, 3.0);
    ck_assert_int_gt(n, 12);
    r.status = strtol(out + 9, NULL, 10);
    const char *b = strstr(out, "\r\n\r\n");
    ck_assert_ptr_nonnull(b);
    r.headers = strndup(out, (size_t)(b - out) + 2);
    for (char *p = r.headers, *line = r.headers; *p; p++) {
        if (*p == '\n')
            line = p + 1;
        else if (*p >= 'A' && *p <= 'Z' && !memchr(line, ':', (size_t)(p - line)))
            *p = (char)(*p - 'A' + 'a'); /* names only, as it_http does */
    }
    r.body = strdup(b + 4);
    r.len = strlen(r.body);
    return r;
}

START_TEST(test_content_type)
{
    start_with(NULL);
    const char *body = "{\"prompt\":[1,7],\"max_tokens\":1}";
    static const char *const refused[] = {"text/plain",
                                          "text/plain;charset=UTF-8",
                                          "application/x-www-form-urlencoded",
                                          "multipart/form-data; boundary=x",
                                          "application/jsonx",
                                          NULL};
    for (int i = 0; i < 6; i++) {
        struct it_resp r = post_ct("/v1/completions", refused[i], body, NULL);
        ck_assert_msg(r.status == 415, "%s: status %ld", refused[i] ? refused[i] : "none",
                      r.status);
        json_t *j = it_json(&r);
        json_t *e = json_object_get(j, "error");
        ck_assert_str_eq(json_string_value(json_object_get(e, "type")), "invalid_request_error");
        ck_assert(strstr(json_string_value(json_object_get(e, "message")),
                         "Content-Type: application/json"));
        json_decref(j);
        it_resp_free(&r);
    }
    static const char *const accepted[] = {"application/json", "Application/JSON; charset=utf-8",
                                           "application/vnd.api+json"};
    for (int i = 0; i < 3; i++) {
        struct it_resp r = post_ct("/v1/completions", accepted[i], body, NULL);
        ck_assert_msg(r.status == 200, "%s: status %ld", accepted[i], r.status);
        it_resp_free(&r);
    }
    struct it_resp r = post_ct("/tokenize", "text/plain", "{\"prompt\":\"a\"}", NULL);
    ck_assert_int_eq(r.status, 415);
    it_resp_free(&r);
    /* An empty body is still the handler's 400. */
    r = post_ct("/v1/completions", NULL, "", NULL);
    ck_assert_int_eq(r.status, 400);
    it_resp_free(&r);
    ck_assert_int_eq(it_stop(&srv, 0, 10.0), 0);
}
END_TEST

START_TEST(test_no_cors_by_default)
{
    start_with(NULL);
    struct it_resp r = post_ct("/v1/completions", "application/json",
                               "{\"prompt\":[1,7],\"max_tokens\":1}", "https://app.example");
    ck_assert_int_eq(r.status, 200);
    ck_assert_ptr_null(strstr(r.headers, "access-control-"));
    it_resp_free(&r);
    const char *pre[] = {"Origin: https://app.example", "Access-Control-Request-Method: POST",
                         NULL};
    ck_assert(it_http(&srv, "OPTIONS", "/v1/completions", NULL, pre, &r));
    ck_assert_int_eq(r.status, 405);
    ck_assert_ptr_null(strstr(r.headers, "access-control-"));
    it_resp_free(&r);
    ck_assert_int_eq(it_stop(&srv, 0, 10.0), 0);
}
END_TEST

START_TEST(test_cors_listed)
{
    const char *more[] = {"--set", "server.cors_origins=https://app.example", NULL};
    start_with(more);
    char buf[256];
    struct it_resp r = post_ct("/v1/completions", "application/json",
                               "{\"prompt\":[1,7],\"max_tokens\":1}", "https://app.example");
    ck_assert_int_eq(r.status, 200);
    ck_assert_str_eq(it_header(&r, "access-control-allow-origin", buf, sizeof buf),
                     "https://app.example");
    ck_assert_str_eq(it_header(&r, "vary", buf, sizeof buf), "Origin");
    ck_assert_ptr_nonnull(it_header(&r, "access-control-expose-headers", buf, sizeof buf));
    it_resp_free(&r);
    r = post_ct("/v1/completions", "application/json", "{\"prompt\":[1,7],\"max_tokens\":1}",
                "https://other.example");
    ck_assert_int_eq(r.status, 200);
    ck_assert_ptr_null(strstr(r.headers, "access-control-"));
    it_resp_free(&r);
    /* The preflight: 204 for the listed origin, without the API key. */
    const char *pre[] = {"Origin: https://app.example", "Access-Control-Request-Method: POST",
                         "Access-Control-Request-Headers: content-type, authorization", NULL};
    ck_assert(it_http(&srv, "OPTIONS", "/v1/completions", NULL, pre, &r));
    ck_assert_int_eq(r.status, 204);
    ck_assert_str_eq(it_header(&r, "access-control-allow-origin", buf, sizeof buf),
                     "https://app.example");
    ck_assert_str_eq(it_header(&r, "access-control-allow-methods", buf, sizeof buf),
                     "POST, OPTIONS");
    ck_assert_str_eq(it_header(&r, "access-control-allow-headers", buf, sizeof buf),
                     "content-type, authorization");
    it_resp_free(&r);
    const char *bad[] = {"Origin: https://other.example", "Access-Control-Request-Method: POST",
                         NULL};
    ck_assert(it_http(&srv, "OPTIONS", "/v1/completions", NULL, bad, &r));
    ck_assert_int_eq(r.status, 403);
    ck_assert_ptr_null(strstr(r.headers, "access-control-allow-origin"));
    it_resp_free(&r);
    ck_assert_int_eq(it_stop(&srv, 0, 10.0), 0);
}
END_TEST

/* ---- /v1/models/{id} and X-Request-Id ---------------------------------------------------- */
START_TEST(test_model_retrieve)
{
    const char *more[] = {"--set", "model.max_model_len=256", NULL};
    start_with(more);
    struct it_resp list, one;
    ck_assert(it_http(&srv, "GET", "/v1/models", NULL, NULL, &list));
    ck_assert(it_http(&srv, "GET", "/v1/models/" MODEL, NULL, NULL, &one));
    ck_assert_int_eq(one.status, 200);
    /* The same object as the list's item, byte for byte. */
    json_t *j = it_json(&list);
    char *item = json_dumps(json_array_get(json_object_get(j, "data"), 0),
                            JSON_COMPACT | JSON_PRESERVE_ORDER);
    ck_assert_str_eq(one.body, item);
    free(item);
    json_decref(j);
    json_t *o = it_json(&one);
    ck_assert_str_eq(json_string_value(json_object_get(o, "id")), MODEL);
    ck_assert_str_eq(json_string_value(json_object_get(o, "object")), "model");
    ck_assert_int_eq(json_integer_value(json_object_get(o, "max_model_len")), 256);
    json_decref(o);
    it_resp_free(&list);
    it_resp_free(&one);
    ck_assert(it_http(&srv, "GET", "/v1/models/gpt-4", NULL, NULL, &one));
    ck_assert_int_eq(one.status, 404);
    o = it_json(&one);
    json_t *e = json_object_get(o, "error");
    ck_assert_str_eq(json_string_value(json_object_get(e, "code")), "model_not_found");
    ck_assert_str_eq(json_string_value(json_object_get(e, "param")), "model");
    ck_assert_str_eq(json_string_value(json_object_get(e, "message")),
                     "The model `gpt-4` does not exist or you do not have access to it.");
    json_decref(o);
    it_resp_free(&one);
    ck_assert(it_http(&srv, "POST", "/v1/models/" MODEL, "{}", NULL, &one));
    ck_assert_int_eq(one.status, 405);
    it_resp_free(&one);
    ck_assert_int_eq(it_stop(&srv, 0, 10.0), 0);
    /* An id with a slash, as a Hugging Face name: the rest of the path. */
    const char *slash[] = {"--set", "server.served_model_name=org/llama-3", NULL};
    ck_assert(it_start(&srv, slash));
    ck_assert(it_http(&srv, "GET", "/v1/models/org/llama-3", NULL, NULL, &one));
    ck_assert_int_eq(one.status, 200);
    it_resp_free(&one);
    ck_assert(it_http(&srv, "GET", "/v1/models/org%2Fllama-3", NULL, NULL, &one));
    ck_assert_int_eq(one.status, 200);
    it_resp_free(&one);
    ck_assert(it_http(&srv, "GET", "/v1/models/org", NULL, NULL, &one));
    ck_assert_int_eq(one.status, 404);
    it_resp_free(&one);
    ck_assert_int_eq(it_stop(&srv, 0, 10.0), 0);
}
END_TEST

START_TEST(test_request_id)
{
    start_with(NULL);
    const char *given[] = {"X-Request-Id: trace-7f3a.b_c:1/2+3=4@5~6", NULL};
    struct it_resp r;
    char buf[256];
    ck_assert(
        it_http(&srv, "POST", "/v1/completions", "{\"prompt\":[1,7],\"max_tokens\":2}", given, &r));
    ck_assert_int_eq(r.status, 200);
    ck_assert_str_eq(it_header(&r, "x-request-id", buf, sizeof buf), "trace-7f3a.b_c:1/2+3=4@5~6");
    json_t *j = it_json(&r);
    ck_assert_str_eq(json_string_value(json_object_get(j, "id")),
                     "cmpl-trace-7f3a.b_c:1/2+3=4@5~6");
    json_decref(j);
    it_resp_free(&r);
    /* Also on errors and in a stream. */
    ck_assert(it_http(&srv, "POST", "/v1/completions", "{}", given, &r));
    ck_assert_int_eq(r.status, 400);
    ck_assert_str_eq(it_header(&r, "x-request-id", buf, sizeof buf), "trace-7f3a.b_c:1/2+3=4@5~6");
    it_resp_free(&r);
    ck_assert(it_http(&srv, "POST", "/v1/completions",
                      "{\"prompt\":[1,7],\"max_tokens\":2,\"stream\":true}", given, &r));
    ck_assert(strstr(r.body, "\"id\":\"cmpl-trace-7f3a.b_c:1/2+3=4@5~6\""));
    it_resp_free(&r);
    /* Unusable ids (a blank, a quote, too long) are replaced by one of ours. */
    char longid[200] = "X-Request-Id: ";
    memset(longid + 14, 'a', 129);
    longid[14 + 129] = '\0';
    const char *bad[][2] = {
        {"X-Request-Id: has space", NULL}, {"X-Request-Id: q\"uote", NULL}, {longid, NULL}};
    for (int i = 0; i < 3; i++) {
        ck_assert(it_http(&srv, "GET", "/health", NULL, bad[i], &r));
        ck_assert_ptr_nonnull(it_header(&r, "x-request-id", buf, sizeof buf));
        ck_assert_msg(strncmp(buf, "cmpl-", 5) == 0, "case %d: %s", i, buf);
        ck_assert_uint_eq(strspn(buf + 5, "0123456789abcdef"), strlen(buf) - 5);
        it_resp_free(&r);
    }
    kill(srv.pid, SIGTERM);
    ck_assert_int_eq(it_wait_exit(&srv, 10.0), 0);
    char *log = it_log(&srv);
    ck_assert_msg(strstr(log, "req=trace-7f3a.b_c:1/2+3=4@5~6 POST /v1/completions -> 200"),
                  "log: %s", log);
    free(log);
    it_cleanup(&srv);
}
END_TEST

/* ---- a large prompt ------------------------------------------------------------------------ */
struct big_post {
    char *body;
    int rounds;
    long status;
    volatile bool done;
};

static void *post_big(void *arg)
{
    struct big_post *b = arg;
    for (int i = 0; i < b->rounds; i++) {
        struct it_resp r;
        if (!it_post(&srv, "/v1/completions", b->body, &r))
            break;
        b->status = r.status;
        it_resp_free(&r);
    }
    b->done = true;
    return NULL;
}

START_TEST(test_large_prompt_off_loop)
{
    /* A 6 MB text prompt takes the parser and the tokenizer some 300 ms.
     * Done on the loop, that held every other connection: nearly every
     * round made a probe wait 50 ms or more. On a worker thread probes
     * answer in a few milliseconds meanwhile; a loaded machine may still
     * hold one or two back, hence the allowance. */
    const char *more[] = {"--set", "limits.body_limit=8MiB", NULL};
    start_with(more);
    enum { TEXT = 6 << 20, ROUNDS = 8 };
    struct big_post b = {.rounds = ROUNDS};
    b.body = malloc(TEXT + 64);
    int o = snprintf(b.body, 64, "{\"prompt\":\"");
    for (int i = 0; i < TEXT; i++)
        b.body[o + i] = (char)('a' + i % 26);
    snprintf(b.body + o + TEXT, 64, "\",\"max_tokens\":1}");
    pthread_t th;
    pthread_create(&th, NULL, post_big, &b);
    double worst = 0, sum = 0;
    int probes = 0, slow = 0;
    usleep(20000);
    while (!b.done) {
        struct it_resp r;
        double t0 = it_now();
        ck_assert(it_http(&srv, "GET", "/health", NULL, NULL, &r));
        double dt = it_now() - t0;
        ck_assert_int_eq(r.status, 200);
        it_resp_free(&r);
        worst = dt > worst ? dt : worst;
        slow += dt >= 0.05;
        sum += dt;
        probes++;
        usleep(2000);
    }
    pthread_join(th, NULL);
    free(b.body);
    fprintf(stderr, "large prompt: %d probes, mean %.1f ms, slowest %.1f ms, %d of 50 ms or more\n",
            probes, sum / probes * 1e3, worst * 1e3, slow);
    /* the prompt is tokenized, then found longer than the context */
    ck_assert_int_eq(b.status, 400);
    ck_assert_int_gt(probes, 10);
    ck_assert_msg(slow <= 2 && worst < 1.0, "%d probes took 50 ms or more, the slowest %.1f ms",
                  slow, worst * 1e3);
    ck_assert_int_eq(it_stop(&srv, 0, 10.0), 0);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("integration_strict");
    TCase *tc = tcase_create("framing");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_framing);
    tcase_add_test(tc, test_hosts_loopback);
    tcase_add_test(tc, test_hosts_listed);
    tcase_add_test(tc, test_hosts_any);
    suite_add_tcase(s, tc);
    tc = tcase_create("browsers");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_content_type);
    tcase_add_test(tc, test_no_cors_by_default);
    tcase_add_test(tc, test_cors_listed);
    suite_add_tcase(s, tc);
    tc = tcase_create("routes");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_model_retrieve);
    tcase_add_test(tc, test_request_id);
    tcase_add_test(tc, test_large_prompt_off_loop);
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
