/* test_edge.c — the connection layer: connections that trickle their headers
 * or body (deadlines, and room made for new clients at max_connections),
 * 503 refusals with OpenAI's body, 256 connections from one address on the
 * defaults, a 413 the client can read after sending its whole body, and
 * SIGHUP. Always the mock backend. */
#include "harness.h"

#include <check.h>
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

static struct it_server srv;

static void start_with(const char *const *more)
{
    ck_assert_msg(it_start(&srv, more), "server did not start");
}

/* Times the server's log holds needle. */
static int log_count(const char *needle)
{
    char *log = it_log(&srv);
    int k = 0;
    for (const char *p = log; p && (p = strstr(p, needle)); p += strlen(needle))
        k++;
    free(log);
    return k;
}

/* Seconds one GET /health takes; it must answer 200. */
static double health_s(void)
{
    struct it_resp r;
    double t0 = it_now();
    ck_assert(it_http(&srv, "GET", "/health", NULL, NULL, &r));
    double dt = it_now() - t0;
    ck_assert_int_eq(r.status, 200);
    it_resp_free(&r);
    return dt;
}

/* Whether the server closed fd (a read returns 0 or fails); reads and drops
 * what it sent before. Does not wait. */
static bool is_closed(int fd)
{
    char buf[4096];
    for (;;) {
        ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
        if (n > 0)
            continue;
        return n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK);
    }
}

/* The status and error body of a 503 refusal read from fd. */
static void check_refusal(int fd)
{
    char out[4096];
    ssize_t n = it_read_all(fd, out, sizeof out, 3.0);
    ck_assert_int_gt(n, 0);
    ck_assert_msg(strncmp(out, "HTTP/1.1 503 ", 13) == 0, "got %s", out);
    ck_assert_msg(strstr(out, "\r\nRetry-After: 1\r\n"), "got %s", out);
    ck_assert_msg(strstr(out, "\r\nContent-Type: application/json\r\n"), "got %s", out);
    const char *body = strstr(out, "\r\n\r\n");
    ck_assert_ptr_nonnull(body);
    json_t *j = json_loads(body + 4, 0, NULL);
    ck_assert_msg(j != NULL, "body is not JSON: %s", body + 4);
    json_t *e = json_object_get(j, "error");
    ck_assert_str_eq(json_string_value(json_object_get(e, "type")), "server_error");
    ck_assert(json_is_null(json_object_get(e, "param")));
    ck_assert_ptr_nonnull(json_string_value(json_object_get(e, "message")));
    json_decref(j);
}

/* ---- headers sent a byte at a time ---------------------------------------------------- */
enum { SLOW = 24 };

START_TEST(test_slow_headers)
{
    /* 24 connections that send their head a byte every 300 ms, against 16
     * connections at most and a 2 s header deadline: every one is closed
     * within the deadline of its first byte (each new one, and each probe,
     * takes the place of the oldest), and probes are answered throughout. */
    const char *more[] = {"--set", "limits.max_connections=16", "--set", "server.header_timeout=2",
                          NULL};
    start_with(more);
    static const char head[] = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: ";
    int fds[SLOW];
    double first[SLOW], closed_at[SLOW];
    for (int i = 0; i < SLOW; i++) {
        fds[i] = it_connect(&srv, 0);
        ck_assert_int_ge(fds[i], 0);
        ck_assert(it_send_all(fds[i], head, 1));
        first[i] = it_now();
        closed_at[i] = -1;
    }
    double t0 = it_now(), worst = 0;
    size_t sent = 1;
    int probes = 0;
    while (it_now() - t0 < 4.0) {
        usleep(300000);
        for (int i = 0; i < SLOW; i++) {
            if (closed_at[i] >= 0)
                continue;
            char c = sent < sizeof head - 1 ? head[sent] : 'a';
            if (is_closed(fds[i]) || send(fds[i], &c, 1, MSG_NOSIGNAL) != 1)
                closed_at[i] = it_now();
        }
        sent++;
        double dt = health_s();
        worst = dt > worst ? dt : worst;
        probes++;
    }
    int open_left = 0;
    for (int i = 0; i < SLOW; i++) {
        if (closed_at[i] < 0 && !is_closed(fds[i]))
            open_left++;
        else if (closed_at[i] >= 0)
            /* the deadline is 2 s from the first byte, checked 4 times a
             * second; the client sees it at its next send (300 ms) */
            ck_assert_msg(closed_at[i] - first[i] < 2.0 + 0.25 + 0.3 + 0.5,
                          "connection %d closed %.2f s after its first byte", i,
                          closed_at[i] - first[i]);
        close(fds[i]);
    }
    fprintf(stderr, "slow headers: %d probes, slowest %.1f ms\n", probes, worst * 1e3);
    ck_assert_int_eq(open_left, 0);
    ck_assert_msg(worst < 1.0, "a probe took %.0f ms", worst * 1e3);
    double by_deadline =
        it_metric(&srv, "int4serve_http_connections_closed_total{reason=\"header_timeout\"}");
    double evicted = it_metric(&srv, "int4serve_http_connections_closed_total{reason=\"evicted\"}");
    ck_assert_double_ge(by_deadline, 1);
    ck_assert_double_ge(evicted, SLOW - 16);
    ck_assert_double_ge(by_deadline + evicted, SLOW);
    ck_assert_double_eq(
        it_metric(&srv, "int4serve_http_connections_refused_total{limit=\"max_connections\"}"), 0);
    ck_assert_int_eq(it_stop(&srv, 0, 10.0), 0);
}
END_TEST

START_TEST(test_slow_headers_logged_once)
{
    /* Many connections closed at the deadline: one line in full, then one
     * line with the count (written when the daemon stops, before 10 s). */
    const char *more[] = {"--set", "server.header_timeout=1", NULL};
    start_with(more);
    enum { N = 12 };
    int fds[N];
    for (int i = 0; i < N; i++) {
        fds[i] = it_connect(&srv, 0);
        ck_assert_int_ge(fds[i], 0);
        ck_assert(it_send_all(fds[i], "GET /health HTTP/1.1\r\n", 22));
    }
    ck_assert(it_wait_metric(
        &srv, "int4serve_http_connections_closed_total{reason=\"header_timeout\"}", N, 5.0));
    for (int i = 0; i < N; i++) {
        ck_assert(is_closed(fds[i]));
        close(fds[i]);
    }
    kill(srv.pid, SIGTERM);
    ck_assert_int_eq(it_wait_exit(&srv, 10.0), 0);
    ck_assert_int_eq(log_count("did not complete its request headers within 1 s"), 1);
    char want[128];
    snprintf(want, sizeof want, "connections closed at the header deadline: %d more in the last",
             N - 1);
    ck_assert_int_eq(log_count(want), 1);
    it_cleanup(&srv);
}
END_TEST

START_TEST(test_keepalive_first_byte)
{
    /* On a kept-alive connection the header deadline runs from the next
     * request's first byte, not from the end of the one before: idle for
     * longer than the deadline, the connection stays; a head then sent a
     * byte at a time is closed within the deadline. */
    const char *more[] = {"--set", "server.header_timeout=1", NULL};
    start_with(more);
    int fd = it_connect(&srv, 0);
    ck_assert_int_ge(fd, 0);
    static const char req[] = "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    ck_assert(it_send_all(fd, req, sizeof req - 1));
    char out[2048];
    struct pollfd p = {fd, POLLIN, 0};
    ck_assert_int_eq(poll(&p, 1, 2000), 1);
    ssize_t n = recv(fd, out, sizeof out - 1, 0);
    ck_assert_int_gt(n, 0);
    out[n] = '\0';
    ck_assert(strncmp(out, "HTTP/1.1 200", 12) == 0);
    usleep(1800000);
    ck_assert(!is_closed(fd));
    double t0 = it_now(), closed = -1;
    for (size_t i = 0; i < sizeof req - 5 && closed < 0; i++) {
        if (is_closed(fd) || send(fd, req + i, 1, MSG_NOSIGNAL) != 1)
            closed = it_now() - t0;
        usleep(200000);
    }
    ck_assert_msg(closed >= 0.7 && closed < 1.0 + 0.25 + 0.2 + 0.5, "closed after %.2f s", closed);
    close(fd);
    ck_assert_int_eq(it_stop(&srv, 0, 10.0), 0);
}
END_TEST

START_TEST(test_slow_body)
{
    const char *more[] = {"--set", "server.body_timeout=1", NULL};
    start_with(more);
    int fd = it_connect(&srv, 0);
    ck_assert_int_ge(fd, 0);
    static const char head[] = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                               "Content-Type: application/json\r\nContent-Length: 200\r\n\r\n{";
    ck_assert(it_send_all(fd, head, sizeof head - 1));
    double t0 = it_now(), closed = -1;
    for (int i = 0; i < 40 && closed < 0; i++) {
        usleep(100000);
        if (is_closed(fd) || send(fd, " ", 1, MSG_NOSIGNAL) != 1)
            closed = it_now() - t0;
    }
    ck_assert_msg(closed >= 0.8 && closed < 1.0 + 0.25 + 0.1 + 0.5, "closed after %.2f s", closed);
    close(fd);
    ck_assert_double_eq(
        it_metric(&srv, "int4serve_http_connections_closed_total{reason=\"body_timeout\"}"), 1);
    ck_assert_int_eq(it_stop(&srv, 0, 10.0), 0);
}
END_TEST

/* ---- refusals --------------------------------------------------------------------------- */
START_TEST(test_full_of_work)
{
    /* Four connections, each with a request being answered: nothing can
     * make room, so a fifth is answered 503 with OpenAI's body. (No
     * /metrics scrape while they run: it would be the fifth.) */
    it_hook("min_step_us", "5000");
    const char *more[] = {"--set", "limits.max_connections=4", NULL};
    start_with(more);
    int busy[4];
    for (int i = 0; i < 4; i++) {
        busy[i] = it_send_completion(
            &srv, "{\"prompt\":[1,7],\"max_tokens\":2000,\"ignore_eos\":true,\"stream\":true}", 0);
        ck_assert_int_ge(busy[i], 0);
        /* its stream has begun: the request is being answered */
        char buf[512];
        struct pollfd p = {busy[i], POLLIN, 0};
        ck_assert_int_eq(poll(&p, 1, 5000), 1);
        ck_assert_int_gt(recv(busy[i], buf, sizeof buf, 0), 0);
    }
    int fd = it_connect(&srv, 0);
    ck_assert_int_ge(fd, 0);
    static const char req[] = "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    ck_assert(it_send_all(fd, req, sizeof req - 1));
    check_refusal(fd);
    close(fd);
    for (int i = 0; i < 4; i++)
        close(busy[i]);
    usleep(300000);
    ck_assert(it_wait_metric(&srv, "int4serve_num_requests_running", 0, 5.0));
    ck_assert_double_eq(
        it_metric(&srv, "int4serve_http_connections_refused_total{limit=\"max_connections\"}"), 1);
    health_s();
    ck_assert_int_eq(it_stop(&srv, 0, 10.0), 0);
}
END_TEST

START_TEST(test_per_ip_refusal)
{
    const char *more[] = {"--set", "limits.per_ip_connections=2", NULL};
    start_with(more);
    usleep(100000); /* the start-up probe's connection is gone */
    int a = it_connect(&srv, 0), b = it_connect(&srv, 0);
    ck_assert(a >= 0 && b >= 0);
    usleep(100000);
    int c = it_connect(&srv, 0);
    ck_assert_int_ge(c, 0);
    static const char req[] = "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    ck_assert(it_send_all(c, req, sizeof req - 1));
    check_refusal(c);
    close(c);
    close(a);
    close(b);
    usleep(100000);
    health_s(); /* room again */
    ck_assert_double_eq(
        it_metric(&srv, "int4serve_http_connections_refused_total{limit=\"per_ip_connections\"}"),
        1);
    ck_assert_int_eq(it_stop(&srv, 0, 10.0), 0);
}
END_TEST

START_TEST(test_many_from_one_address)
{
    /* The defaults serve 300 connections at once from one address (a load
     * balancer, or wrk on the same host). */
    enum { N = 300 };
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    if (rl.rlim_cur < N + 64) {
        rl.rlim_cur = rl.rlim_max < N + 64 ? rl.rlim_max : N + 64;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    start_with(NULL);
    int fds[N];
    static const char req[] = "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    for (int i = 0; i < N; i++) {
        fds[i] = it_connect(&srv, 0);
        ck_assert_int_ge(fds[i], 0);
    }
    for (int i = 0; i < N; i++)
        ck_assert(it_send_all(fds[i], req, sizeof req - 1));
    int ok = 0;
    for (int i = 0; i < N; i++) {
        char out[1024];
        struct pollfd p = {fds[i], POLLIN, 0};
        if (poll(&p, 1, 5000) == 1) {
            ssize_t n = recv(fds[i], out, sizeof out - 1, 0);
            if (n > 12 && strncmp(out, "HTTP/1.1 200", 12) == 0)
                ok++;
        }
    }
    ck_assert_int_eq(ok, N);
    ck_assert_double_eq(it_metric(&srv, "int4serve_http_connections_open"), N + 1);
    for (int i = 0; i < N; i++)
        close(fds[i]);
    ck_assert_int_eq(it_stop(&srv, 0, 10.0), 0);
}
END_TEST

/* ---- a 413 the client reads --------------------------------------------------------------- */
START_TEST(test_413_after_whole_body)
{
    /* A client that sends its whole 3 MB body before it reads (Python's
     * http.client does) gets the 413: the server answers at once, then
     * reads the rest and drops it instead of resetting the connection. */
    const char *more[] = {"--set", "limits.body_limit=4096", NULL};
    start_with(more);
    enum { BODY = 3 << 20 };
    for (int round = 0; round < 3; round++) {
        int fd = it_connect(&srv, 0);
        ck_assert_int_ge(fd, 0);
        char head[256];
        int h = snprintf(head, sizeof head,
                         "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                         "application/json\r\nContent-Length: %d\r\n\r\n",
                         BODY);
        char *body = malloc(BODY);
        memset(body, ' ', BODY);
        ck_assert(it_send_all(fd, head, (size_t)h));
        ck_assert_msg(it_send_all(fd, body, BODY), "the server reset the connection mid-body");
        free(body);
        char out[4096];
        ssize_t n = it_read_all(fd, out, sizeof out, 5.0);
        close(fd);
        ck_assert_msg(n > 0 && strncmp(out, "HTTP/1.1 413 ", 13) == 0, "round %d: got %s", round,
                      out);
        const char *b = strstr(out, "\r\n\r\n");
        ck_assert_ptr_nonnull(b);
        json_t *j = json_loads(b + 4, 0, NULL);
        ck_assert_msg(j != NULL, "body %s", b + 4);
        ck_assert_str_eq(json_string_value(json_object_get(json_object_get(j, "error"), "type")),
                         "invalid_request_error");
        json_decref(j);
    }
    health_s();
    ck_assert_int_eq(it_stop(&srv, 0, 10.0), 0);
}
END_TEST

/* ---- SIGHUP ------------------------------------------------------------------------------- */
struct bg {
    struct it_resp r;
    bool ok;
};

static void *run_one(void *arg)
{
    struct bg *b = arg;
    b->ok = it_post(&srv, "/v1/completions",
                    "{\"prompt\":[1,9],\"max_tokens\":60,\"ignore_eos\":true}", &b->r);
    return NULL;
}

START_TEST(test_sighup_drains)
{
    /* SIGHUP drains like SIGTERM: the running request finishes whole and
     * the daemon exits 0. */
    it_hook("min_step_us", "10000");
    start_with(NULL);
    struct bg b = {0};
    pthread_t th;
    pthread_create(&th, NULL, run_one, &b);
    ck_assert(it_wait_metric(&srv, "int4serve_num_requests_running", 1, 5.0));
    kill(srv.pid, SIGHUP);
    pthread_join(th, NULL);
    ck_assert(b.ok);
    ck_assert_int_eq(b.r.status, 200);
    json_t *j = it_json(&b.r);
    ck_assert_int_eq(
        json_integer_value(json_object_get(json_object_get(j, "usage"), "completion_tokens")), 60);
    json_decref(j);
    it_resp_free(&b.r);
    ck_assert_int_eq(it_wait_exit(&srv, 10.0), 0);
    ck_assert_int_eq(log_count("(SIGHUP): draining 1 request(s)"), 1);
    it_cleanup(&srv);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("integration_edge");
    TCase *tc = tcase_create("deadlines");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_slow_headers);
    tcase_add_test(tc, test_slow_headers_logged_once);
    tcase_add_test(tc, test_keepalive_first_byte);
    tcase_add_test(tc, test_slow_body);
    suite_add_tcase(s, tc);
    tc = tcase_create("refusals");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_full_of_work);
    tcase_add_test(tc, test_per_ip_refusal);
    tcase_add_test(tc, test_many_from_one_address);
    tcase_add_test(tc, test_413_after_whole_body);
    suite_add_tcase(s, tc);
    tc = tcase_create("signals");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_sighup_drains);
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
