/* test_metrics.c — the server's histograms and the Prometheus text of
 * /metrics, byte for byte on known values. */
#include "server/srv_impl.h"

#include <check.h>
#include <stdlib.h>
#include <string.h>

static bool has_line(const char *text, const char *line)
{
    size_t n = strlen(line);
    for (const char *p = text; (p = strstr(p, line)); p += n)
        if ((p == text || p[-1] == '\n') && p[n] == '\n')
            return true;
    return false;
}

START_TEST(test_hist_buckets)
{
    static const double bounds[] = {0.1, 0.5, 1.0};
    struct srv_hist h = {.bounds = bounds, .n_bounds = 3};
    srv_hist_observe(&h, 0.05); /* le 0.1 */
    srv_hist_observe(&h, 0.1);  /* a value on a bound counts in that bucket (le) */
    srv_hist_observe(&h, 0.3);  /* le 0.5 */
    srv_hist_observe(&h, 7.0);  /* +Inf */
    srv_hist_observe(&h, -1.0); /* a clock glitch: counted as 0 */
    ck_assert_uint_eq(h.counts[0], 3);
    ck_assert_uint_eq(h.counts[1], 1);
    ck_assert_uint_eq(h.counts[2], 0);
    ck_assert_uint_eq(h.counts[3], 1);
    ck_assert_uint_eq(h.count, 5);
    ck_assert_double_eq_tol(h.sum, 0.05 + 0.1 + 0.3 + 7.0, 1e-12);
}
END_TEST

START_TEST(test_render)
{
    struct srv_metrics m;
    srv_metrics_init(&m);
    srv_hist_observe(&m.ttft, 0.003);
    srv_hist_observe(&m.ttft, 0.2);
    srv_hist_observe(&m.e2e, 1.25);
    m.success[ENG_FINISH_STOP] = 3;
    m.success[ENG_FINISH_LENGTH] = 5;
    m.success[ENG_FINISH_ABORT] = 1;
    m.http_responses[2] = 9;
    m.http_responses[4] = 2;
    struct eng_stats st = {.running = 4,
                           .waiting = 2,
                           .kv_blocks_used = 25,
                           .kv_blocks_total = 100,
                           .prompt_tokens_total = 1234,
                           .generation_tokens_total = 5678,
                           .preemptions_total = 7,
                           .prefix_cache_queries_total = 2048,
                           .prefix_cache_hits_total = 1536,
                           .steps_total = 40,
                           .batched_steps_total = 30,
                           .steps_ahead_total = 12,
                           .max_running_seen = 4,
                           .kv_capacity_tokens = 4096,
                           .tp = 2};
    size_t len = 0;
    char *t = srv_metrics_render(&m, &st, &len);
    ck_assert_ptr_nonnull(t);
    ck_assert_uint_eq(strlen(t), len);
    ck_assert(has_line(t, "# TYPE int4serve_num_requests_running gauge"));
    ck_assert(has_line(t, "int4serve_num_requests_running 4"));
    ck_assert(has_line(t, "int4serve_num_requests_waiting 2"));
    ck_assert(has_line(t, "int4serve_kv_cache_usage_perc 0.25"));
    ck_assert(has_line(t, "int4serve_kv_cache_capacity_tokens 4096"));
    ck_assert(has_line(t, "int4serve_tensor_parallel_size 2"));
    ck_assert(has_line(t, "# TYPE int4serve_prompt_tokens_total counter"));
    ck_assert(has_line(t, "int4serve_prompt_tokens_total 1234"));
    ck_assert(has_line(t, "int4serve_generation_tokens_total 5678"));
    ck_assert(has_line(t, "int4serve_num_preemptions_total 7"));
    ck_assert(has_line(t, "# TYPE int4serve_prefix_cache_queries_total counter"));
    ck_assert(has_line(t, "int4serve_prefix_cache_queries_total 2048"));
    ck_assert(has_line(t, "# TYPE int4serve_prefix_cache_hits_total counter"));
    ck_assert(has_line(t, "int4serve_prefix_cache_hits_total 1536"));
    ck_assert(has_line(t, "int4serve_engine_batched_steps_total 30"));
    ck_assert(has_line(t, "int4serve_engine_steps_ahead_total 12"));
    ck_assert(has_line(t, "int4serve_request_success_total{finished_reason=\"stop\"} 3"));
    ck_assert(has_line(t, "int4serve_request_success_total{finished_reason=\"length\"} 5"));
    ck_assert(has_line(t, "int4serve_request_success_total{finished_reason=\"abort\"} 1"));
    ck_assert(has_line(t, "int4serve_http_responses_total{code=\"2xx\"} 9"));
    ck_assert(has_line(t, "int4serve_http_responses_total{code=\"4xx\"} 2"));
    /* cumulative buckets */
    ck_assert(has_line(t, "# TYPE int4serve_time_to_first_token_seconds histogram"));
    ck_assert(has_line(t, "int4serve_time_to_first_token_seconds_bucket{le=\"0.001\"} 0"));
    ck_assert(has_line(t, "int4serve_time_to_first_token_seconds_bucket{le=\"0.005\"} 1"));
    ck_assert(has_line(t, "int4serve_time_to_first_token_seconds_bucket{le=\"0.1\"} 1"));
    ck_assert(has_line(t, "int4serve_time_to_first_token_seconds_bucket{le=\"0.25\"} 2"));
    ck_assert(has_line(t, "int4serve_time_to_first_token_seconds_bucket{le=\"2560\"} 2"));
    ck_assert(has_line(t, "int4serve_time_to_first_token_seconds_bucket{le=\"+Inf\"} 2"));
    ck_assert(has_line(t, "int4serve_time_to_first_token_seconds_sum 0.203"));
    ck_assert(has_line(t, "int4serve_time_to_first_token_seconds_count 2"));
    ck_assert(has_line(t, "int4serve_e2e_request_latency_seconds_bucket{le=\"1\"} 0"));
    ck_assert(has_line(t, "int4serve_e2e_request_latency_seconds_bucket{le=\"1.5\"} 1"));
    ck_assert(has_line(t, "int4serve_inter_token_latency_seconds_count 0"));
    ck_assert(has_line(t, "int4serve_request_queue_time_seconds_count 0"));
    /* every line is a comment or "name[{labels}] value" */
    for (const char *p = t; *p;) {
        const char *e = strchr(p, '\n');
        ck_assert_ptr_nonnull(e);
        if (*p != '#')
            ck_assert_msg(strncmp(p, "int4serve_", 10) == 0 && memchr(p, ' ', (size_t)(e - p)),
                          "bad line %.*s", (int)(e - p), p);
        p = e + 1;
    }
    free(t);

    /* No KV blocks at all: usage 0, not NaN. */
    struct eng_stats empty = {0};
    t = srv_metrics_render(&m, &empty, &len);
    ck_assert(has_line(t, "int4serve_kv_cache_usage_perc 0"));
    free(t);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("server_metrics");
    TCase *tc = tcase_create("metrics");
    tcase_add_test(tc, test_hist_buckets);
    tcase_add_test(tc, test_render);
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
