/* metrics.c — /metrics in Prometheus text (exposition format 0.0.4).
 *
 * The names follow vLLM's meanings with the prefix int4serve_: engine gauges
 * and counters come from eng_engine_stats; the latency histograms are
 * measured here, on the loop thread, with fixed buckets (vLLM's, plus a few
 * finer ones at the low end where a small model lives). */
#include "server/srv_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const double TTFT_BOUNDS[] = {0.001, 0.005, 0.01, 0.02,  0.04,  0.06,  0.08, 0.1,
                                     0.25,  0.5,   0.75, 1.0,   2.5,   5.0,   7.5,  10.0,
                                     20.0,  40.0,  80.0, 160.0, 640.0, 2560.0};
static const double ITL_BOUNDS[] = {0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1,
                                    0.15,  0.2,   0.3,  0.4,   0.5,  0.75,  1.0,
                                    2.5,   5.0,   7.5,  10.0,  20.0, 40.0,  80.0};
static const double E2E_BOUNDS[] = {0.01, 0.05, 0.1,   0.3,   0.5,   0.8,   1.0,   1.5,
                                    2.0,  2.5,  5.0,   10.0,  15.0,  20.0,  30.0,  40.0,
                                    50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0};

#define NB(a) ((int)(sizeof(a) / sizeof((a)[0])))

static void hist_init(struct srv_hist *h, const double *bounds, int n)
{
    memset(h, 0, sizeof *h);
    INF_ASSERT(n < SRV_HIST_MAX_BUCKETS);
    h->bounds = bounds;
    h->n_bounds = n;
}

void srv_metrics_init(struct srv_metrics *m)
{
    memset(m, 0, sizeof *m);
    hist_init(&m->ttft, TTFT_BOUNDS, NB(TTFT_BOUNDS));
    hist_init(&m->itl, ITL_BOUNDS, NB(ITL_BOUNDS));
    hist_init(&m->e2e, E2E_BOUNDS, NB(E2E_BOUNDS));
    hist_init(&m->queue, E2E_BOUNDS, NB(E2E_BOUNDS));
}

void srv_hist_observe(struct srv_hist *h, double v)
{
    if (!(v >= 0)) /* NaN or negative: a clock glitch, count it as 0 */
        v = 0;
    int i = 0;
    while (i < h->n_bounds && v > h->bounds[i])
        i++;
    h->counts[i]++;
    h->sum += v;
    h->count++;
}

static void put_hist(struct srv_buf *b, const char *name, const char *help,
                     const struct srv_hist *h)
{
    srv_buf_printf(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (int i = 0; i < h->n_bounds; i++) {
        cum += h->counts[i];
        srv_buf_printf(b, "%s_bucket{le=\"%g\"} %llu\n", name, h->bounds[i],
                       (unsigned long long)cum);
    }
    cum += h->counts[h->n_bounds];
    srv_buf_printf(b, "%s_bucket{le=\"+Inf\"} %llu\n", name, (unsigned long long)cum);
    srv_buf_printf(b, "%s_sum %.9g\n%s_count %llu\n", name, h->sum, name,
                   (unsigned long long)h->count);
}

static void put_scalar(struct srv_buf *b, const char *name, const char *type, const char *help,
                       double v)
{
    srv_buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name, type, name, v);
}

char *srv_metrics_render(const struct srv_metrics *m, const struct eng_stats *st, size_t *len)
{
    struct srv_buf b = {0};
    put_scalar(&b, "int4serve_num_requests_running", "gauge",
               "Requests whose sequences are in the running batch.", st->running);
    put_scalar(&b, "int4serve_num_requests_waiting", "gauge", "Requests waiting to be admitted.",
               st->waiting);
    double usage =
        st->kv_blocks_total > 0 ? (double)st->kv_blocks_used / (double)st->kv_blocks_total : 0.0;
    put_scalar(&b, "int4serve_kv_cache_usage_perc", "gauge",
               "KV cache usage, as a fraction of the blocks (1 = full).", usage);
    put_scalar(&b, "int4serve_kv_cache_blocks_used", "gauge", "KV cache blocks in use.",
               (double)st->kv_blocks_used);
    put_scalar(&b, "int4serve_kv_cache_capacity_tokens", "gauge",
               "KV cache capacity in tokens (every rank holds its KV heads of them).",
               (double)st->kv_capacity_tokens);
    put_scalar(&b, "int4serve_kv_cache_element_bytes", "gauge",
               "Bytes of one KV cache element: 1 fp8 (e4m3), 2 fp16, 4 fp32; 0 without a model.",
               (double)st->kv_elem_bytes);
    put_scalar(&b, "int4serve_tensor_parallel_size", "gauge",
               "Tensor-parallel ranks the model is split over.", st->tp > 0 ? st->tp : 1);
    put_scalar(&b, "int4serve_prompt_tokens_total", "counter", "Prompt tokens processed.",
               (double)st->prompt_tokens_total);
    put_scalar(&b, "int4serve_generation_tokens_total", "counter", "Tokens generated.",
               (double)st->generation_tokens_total);
    put_scalar(&b, "int4serve_prefix_cache_queries_total", "counter",
               "Prefix cache queries, in prompt tokens looked up.",
               (double)st->prefix_cache_queries_total);
    put_scalar(&b, "int4serve_prefix_cache_hits_total", "counter",
               "Prefix cache hits, in prompt tokens found cached.",
               (double)st->prefix_cache_hits_total);
    put_scalar(&b, "int4serve_num_preemptions_total", "counter",
               "Sequences preempted (KV cache exhausted) and recomputed later.",
               (double)st->preemptions_total);
    put_scalar(&b, "int4serve_engine_steps_total", "counter", "Scheduler steps run.",
               (double)st->steps_total);
    put_scalar(&b, "int4serve_engine_batched_steps_total", "counter",
               "Scheduler steps that ran more than one sequence.", (double)st->batched_steps_total);
    put_scalar(&b, "int4serve_engine_steps_ahead_total", "counter",
               "Decode steps queued on the device before the step before them was back.",
               (double)st->steps_ahead_total);
    put_scalar(&b, "int4serve_engine_max_running", "gauge",
               "The largest number of sequences seen running in one step.", st->max_running_seen);
    put_scalar(&b, "int4serve_engine_failed", "gauge",
               "1 once the engine hit an unrecoverable device error.", st->failed ? 1 : 0);

    static const char *const reasons[] = {NULL, "stop", "length", "abort"};
    srv_buf_printf(&b, "# HELP int4serve_request_success_total Finished requests by finish "
                       "reason.\n# TYPE int4serve_request_success_total counter\n");
    for (int i = 1; i <= 3; i++)
        srv_buf_printf(&b, "int4serve_request_success_total{finished_reason=\"%s\"} %llu\n",
                       reasons[i], (unsigned long long)m->success[i]);
    put_scalar(&b, "int4serve_request_errors_total", "counter",
               "Requests the engine ended with an error.", (double)m->errors_total);
    srv_buf_printf(&b, "# HELP int4serve_http_responses_total HTTP responses by status class."
                       "\n# TYPE int4serve_http_responses_total counter\n");
    for (int i = 1; i <= 5; i++)
        srv_buf_printf(&b, "int4serve_http_responses_total{code=\"%dxx\"} %llu\n", i,
                       (unsigned long long)m->http_responses[i]);

    put_scalar(&b, "int4serve_http_connections_open", "gauge", "HTTP connections open now.",
               (double)m->conn_open);
    put_scalar(&b, "int4serve_http_connections_total", "counter",
               "HTTP connections accepted and served.", (double)m->conn_total);
    static const char *const refused[SRV_REFUSE_N] = {
        [SRV_REFUSE_MAX_CONNECTIONS] = "max_connections",
        [SRV_REFUSE_PER_IP] = "per_ip_connections",
    };
    srv_buf_printf(&b, "# HELP int4serve_http_connections_refused_total Connections answered "
                       "503 and closed at once, by the limit that refused them.\n"
                       "# TYPE int4serve_http_connections_refused_total counter\n");
    for (int i = 0; i < SRV_REFUSE_N; i++)
        srv_buf_printf(&b, "int4serve_http_connections_refused_total{limit=\"%s\"} %llu\n",
                       refused[i], (unsigned long long)m->conn_refused[i]);
    static const char *const closed[SRV_CLOSE_N] = {
        [SRV_CLOSE_HEADER_TIMEOUT] = "header_timeout",
        [SRV_CLOSE_BODY_TIMEOUT] = "body_timeout",
        [SRV_CLOSE_EVICTED] = "evicted",
    };
    srv_buf_printf(&b, "# HELP int4serve_http_connections_closed_total Connections the server "
                       "closed: a deadline missed, or idle or slow at max_connections.\n"
                       "# TYPE int4serve_http_connections_closed_total counter\n");
    for (int i = 0; i < SRV_CLOSE_N; i++)
        srv_buf_printf(&b, "int4serve_http_connections_closed_total{reason=\"%s\"} %llu\n",
                       closed[i], (unsigned long long)m->conn_closed[i]);

    put_hist(&b, "int4serve_time_to_first_token_seconds",
             "Time from the request's arrival to its first generated token.", &m->ttft);
    put_hist(&b, "int4serve_inter_token_latency_seconds",
             "Time between two generated tokens of one sequence.", &m->itl);
    put_hist(&b, "int4serve_e2e_request_latency_seconds",
             "Time from the request's arrival to its last token.", &m->e2e);
    put_hist(&b, "int4serve_request_queue_time_seconds",
             "Time a request waited before its first scheduler step.", &m->queue);
    if (!b.p) {
        *len = 0;
        return NULL;
    }
    *len = b.len;
    return b.p;
}
