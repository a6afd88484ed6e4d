/* test_generate.c — generation through the daemon (mock backend): the
 * single-token path, streaming against non-streamed output, 128 concurrent
 * greedy requests against the same requests alone, n choices and seeds, stop
 * strings spanning tokens, logprobs, echo (with the prompt's logprobs).
 * Always the mock backend, whatever $INT4SERVE_IT_BACKEND says: it checks
 * exact text of the mock's byte tokenizer and the mock's reference logits
 * (eng_mock_logits). test_cpu runs the model-independent checks on a real
 * backend. */
#include "engine/mock/mock.h"
#include "harness.h"
#include "it_check.h"

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct it_server srv;

static void start_default(void)
{
    ck_assert_msg(it_start(&srv, NULL), "server did not start");
}

static void stop_clean(void)
{
    ck_assert_int_eq(it_stop(&srv, 0, 20.0), 0);
}

static const char *finish_of(json_t *j, size_t i)
{
    json_t *ch = json_array_get(json_object_get(j, "choices"), i);
    return json_string_value(json_object_get(ch, "finish_reason"));
}

START_TEST(test_single_token)
{
    start_default();
    json_t *j =
        it_post_json_ok(&srv, "{\"prompt\":[1,72,105,33],\"max_tokens\":1,\"temperature\":0,"
                              "\"ignore_eos\":true}");
    ck_assert_int_eq(it_usage_of(j, "prompt_tokens"), 4);
    ck_assert_int_eq(it_usage_of(j, "completion_tokens"), 1);
    ck_assert_int_eq(it_usage_of(j, "total_tokens"), 5);
    ck_assert_int_eq(json_array_size(json_object_get(j, "choices")), 1);
    ck_assert_str_eq(finish_of(j, 0), "length");
    const char *text = it_choice_text(j, 0);
    ck_assert_ptr_nonnull(text);
    ck_assert_uint_ge(strlen(text), 1);

    struct it_resp r;
    ck_assert(it_post(&srv, "/v1/completions",
                      "{\"prompt\":[1,72,105,33],\"max_tokens\":1,\"temperature\":0,"
                      "\"ignore_eos\":true,\"stream\":true,"
                      "\"stream_options\":{\"include_usage\":true}}",
                      &r));
    ck_assert_int_eq(r.status, 200);
    char buf[64];
    ck_assert_str_eq(it_header(&r, "content-type", buf, sizeof buf), "text/event-stream");
    char **ev;
    size_t n = it_sse_split(r.body, r.len, &ev);
    /* one delta (with its finish), the usage chunk, [DONE] */
    ck_assert_uint_eq(n, 3);
    ck_assert_str_eq(ev[2], "[DONE]");
    json_t *d = json_loads(ev[0], 0, NULL);
    json_t *ch = json_array_get(json_object_get(d, "choices"), 0);
    ck_assert_str_eq(json_string_value(json_object_get(ch, "text")), text);
    ck_assert_str_eq(json_string_value(json_object_get(ch, "finish_reason")), "length");
    ck_assert(json_is_null(json_object_get(d, "usage")));
    json_decref(d);
    json_t *u = json_loads(ev[1], 0, NULL);
    ck_assert_int_eq(json_array_size(json_object_get(u, "choices")), 0);
    ck_assert_int_eq(it_usage_of(u, "prompt_tokens"), 4);
    ck_assert_int_eq(it_usage_of(u, "completion_tokens"), 1);
    ck_assert_int_eq(it_usage_of(u, "total_tokens"), 5);
    json_decref(u);
    it_strv_free(ev, n);
    it_resp_free(&r);
    json_decref(j);
    stop_clean();
}
END_TEST

START_TEST(test_stream_matches)
{
    start_default();
    for (int p = 0; p < 6; p++) {
        char body[256], sbody[300];
        snprintf(body, sizeof body, "{\"prompt\":[1,%d,%d,%d],\"max_tokens\":48,\"temperature\":0",
                 60 + p, 90 + p, 200 + p * 7);
        snprintf(sbody, sizeof sbody, "%s,\"stream\":true}", body);
        strcat(body, "}");
        json_t *j = it_post_json_ok(&srv, body);
        struct it_resp r;
        ck_assert(it_post(&srv, "/v1/completions", sbody, &r));
        ck_assert_int_eq(r.status, 200);
        char finish[32];
        char *st = it_stream_text(r.body, r.len, 0, finish, sizeof finish);
        ck_assert_str_eq(st, it_choice_text(j, 0));
        ck_assert_str_eq(finish, finish_of(j, 0));
        char **ev;
        size_t n = it_sse_split(r.body, r.len, &ev);
        ck_assert_str_eq(ev[n - 1], "[DONE]");
        for (size_t i = 0; i + 1 < n; i++)
            ck_assert_str_ne(ev[i], "[DONE]");
        /* without include_usage, no usage chunk: every event has one choice */
        for (size_t i = 0; i + 1 < n; i++) {
            json_t *c = json_loads(ev[i], 0, NULL);
            ck_assert_int_eq(json_array_size(json_object_get(c, "choices")), 1);
            json_decref(c);
        }
        it_strv_free(ev, n);
        free(st);
        it_resp_free(&r);
        json_decref(j);
    }
    stop_clean();
}
END_TEST

START_TEST(test_batched)
{
    /* A small step time makes the 128 requests overlap in the engine. */
    it_hook("min_step_us", "300");
    /* 128 connections from one address: over the default per-IP limit. */
    const char *more[] = {"--set", "limits.per_ip_connections=0", NULL};
    ck_assert_msg(it_start(&srv, more), "server did not start");
    enum { N = 128 };
    char *bodies[N];
    char *alone[N];
    for (int i = 0; i < N; i++) {
        bodies[i] = malloc(200);
        snprintf(bodies[i], 200,
                 "{\"prompt\":[1,%d,%d,%d],\"max_tokens\":20,\"temperature\":0,"
                 "\"ignore_eos\":true}",
                 3 + i, 131 + (i * 7) % 128, 259 + (i * 13) % 250);
        json_t *j = it_post_json_ok(&srv, bodies[i]);
        alone[i] = strdup(it_choice_text(j, 0));
        json_decref(j);
    }
    double steps0 = it_metric(&srv, "int4serve_engine_batched_steps_total");
    struct it_resp rs[N];
    ck_assert_int_eq(it_post_many(&srv, "/v1/completions", bodies, N, rs), 0);
    for (int i = 0; i < N; i++) {
        ck_assert_int_eq(rs[i].status, 200);
        json_t *j = it_json(&rs[i]);
        ck_assert_msg(strcmp(it_choice_text(j, 0), alone[i]) == 0,
                      "request %d: batched \"%s\" != alone \"%s\"", i, it_choice_text(j, 0),
                      alone[i]);
        ck_assert_int_eq(it_usage_of(j, "completion_tokens"), 20);
        json_decref(j);
        it_resp_free(&rs[i]);
    }
    /* The same 128 at once, streamed: 128 connections suspended and resumed
     * token by token, each stream whole and equal to the request alone. */
    for (int i = 0; i < N; i++) {
        size_t l = strlen(bodies[i]);
        bodies[i][l - 1] = '\0';
        strcat(bodies[i], ",\"stream\":true}");
    }
    ck_assert_int_eq(it_post_many(&srv, "/v1/completions", bodies, N, rs), 0);
    for (int i = 0; i < N; i++) {
        ck_assert_int_eq(rs[i].status, 200);
        char finish[32];
        char *t = it_stream_text(rs[i].body, rs[i].len, 0, finish, sizeof finish);
        ck_assert_msg(strcmp(t, alone[i]) == 0, "stream %d: \"%s\" != alone \"%s\"", i, t,
                      alone[i]);
        ck_assert_str_eq(finish, "length");
        ck_assert(strstr(rs[i].body, "data: [DONE]\n\n"));
        free(t);
        it_resp_free(&rs[i]);
        free(alone[i]);
        free(bodies[i]);
    }
    /* The engine ran shared batches: steps with more than one sequence, and
     * at some point many sequences at once. */
    ck_assert_double_gt(it_metric(&srv, "int4serve_engine_batched_steps_total"), steps0);
    ck_assert_double_ge(it_metric(&srv, "int4serve_engine_max_running"), 16);
    ck_assert_double_eq(it_metric(&srv, "int4serve_num_requests_running"), 0);
    ck_assert_double_eq(it_metric(&srv, "int4serve_kv_cache_blocks_used"), 0);
    stop_clean();
}
END_TEST

START_TEST(test_n_and_seed)
{
    start_default();
    const char *body = "{\"prompt\":[1,300,301],\"max_tokens\":16,\"n\":3,\"temperature\":1.0,"
                       "\"seed\":42,\"ignore_eos\":true}";
    json_t *a = it_post_json_ok(&srv, body);
    json_t *b = it_post_json_ok(&srv, body);
    json_t *chs = json_object_get(a, "choices");
    ck_assert_int_eq(json_array_size(chs), 3);
    for (size_t i = 0; i < 3; i++) {
        json_t *ch = json_array_get(chs, i);
        ck_assert_int_eq(json_integer_value(json_object_get(ch, "index")), (int)i);
        ck_assert_str_eq(it_choice_text(a, i), it_choice_text(b, i));
        ck_assert_str_eq(finish_of(a, i), "length");
    }
    ck_assert_int_eq(it_usage_of(a, "completion_tokens"), 48);
    ck_assert_int_eq(it_usage_of(a, "prompt_tokens"), 3);
    ck_assert_msg(strcmp(it_choice_text(a, 0), it_choice_text(a, 1)) != 0 ||
                      strcmp(it_choice_text(a, 1), it_choice_text(a, 2)) != 0,
                  "three sampled choices are identical");
    /* best_of equal to n changes nothing. */
    json_t *bo =
        it_post_json_ok(&srv, "{\"prompt\":[1,300,301],\"max_tokens\":16,\"n\":3,\"best_of\":3,"
                              "\"temperature\":1.0,\"seed\":42,\"ignore_eos\":true}");
    for (size_t i = 0; i < 3; i++)
        ck_assert_str_eq(it_choice_text(bo, i), it_choice_text(a, i));
    json_decref(bo);

    /* The same seed streamed gives the same three texts. */
    struct it_resp r;
    ck_assert(it_post(&srv, "/v1/completions",
                      "{\"prompt\":[1,300,301],\"max_tokens\":16,\"n\":3,\"temperature\":1.0,"
                      "\"seed\":42,\"ignore_eos\":true,\"stream\":true}",
                      &r));
    for (size_t i = 0; i < 3; i++) {
        char finish[32];
        char *t = it_stream_text(r.body, r.len, i, finish, sizeof finish);
        ck_assert_str_eq(t, it_choice_text(a, i));
        ck_assert_str_eq(finish, "length");
        free(t);
    }
    it_resp_free(&r);

    /* Two prompts, n=2: choices numbered prompt*n + j. */
    json_t *m =
        it_post_json_ok(&srv, "{\"prompt\":[[1,300,301],[1,72,105,33]],\"max_tokens\":5,\"n\":2,"
                              "\"temperature\":0,\"ignore_eos\":true}");
    ck_assert_int_eq(json_array_size(json_object_get(m, "choices")), 4);
    json_t *one =
        it_post_json_ok(&srv, "{\"prompt\":[1,72,105,33],\"max_tokens\":5,\"temperature\":0,"
                              "\"ignore_eos\":true}");
    ck_assert_str_eq(it_choice_text(m, 2), it_choice_text(one, 0));
    ck_assert_str_eq(it_choice_text(m, 3), it_choice_text(one, 0));
    ck_assert_int_eq(it_usage_of(m, "prompt_tokens"), 7);
    ck_assert_int_eq(it_usage_of(m, "completion_tokens"), 20);
    json_decref(one);
    json_decref(m);
    json_decref(a);
    json_decref(b);
    stop_clean();
}
END_TEST

static bool plain(char c)
{
    return (c >= 'a' && c <= 'z') || c == ' ';
}

START_TEST(test_stop)
{
    start_default();
    const char *base = "{\"prompt\":[1,66,67,68],\"max_tokens\":60,\"temperature\":0,"
                       "\"ignore_eos\":true";
    char body[512];
    snprintf(body, sizeof body, "%s}", base);
    json_t *j = it_post_json_ok(&srv, body);
    const char *t = it_choice_text(j, 0);
    /* A 3-byte stop string (three tokens of the byte-level mock) that first
     * occurs at position i >= 4. */
    size_t len = strlen(t), at = 0;
    char stop[4] = {0};
    for (size_t i = 4; i + 3 <= len; i++) {
        if (!plain(t[i]) || !plain(t[i + 1]) || !plain(t[i + 2]))
            continue;
        memcpy(stop, t + i, 3);
        if ((size_t)(strstr(t, stop) - t) == i) {
            at = i;
            break;
        }
    }
    ck_assert_msg(at > 0, "no usable stop string in \"%s\"", t);
    snprintf(body, sizeof body, "%s,\"stop\":[\"%s\",\"never-seen\"]}", base, stop);
    json_t *s = it_post_json_ok(&srv, body);
    ck_assert_uint_eq(strlen(it_choice_text(s, 0)), at);
    ck_assert(strncmp(it_choice_text(s, 0), t, at) == 0);
    ck_assert_str_eq(finish_of(s, 0), "stop");
    json_decref(s);

    snprintf(body, sizeof body, "%s,\"stop\":\"%s\",\"stream\":true}", base, stop);
    struct it_resp r;
    ck_assert(it_post(&srv, "/v1/completions", body, &r));
    char finish[32];
    char *st = it_stream_text(r.body, r.len, 0, finish, sizeof finish);
    ck_assert_uint_eq(strlen(st), at);
    ck_assert(strncmp(st, t, at) == 0);
    ck_assert_str_eq(finish, "stop");
    free(st);
    it_resp_free(&r);
    json_decref(j);
    stop_clean();
}
END_TEST

START_TEST(test_logprobs)
{
    start_default();
    json_t *j =
        it_post_json_ok(&srv, "{\"prompt\":[1,72,105,33],\"max_tokens\":8,\"temperature\":0,"
                              "\"ignore_eos\":true,\"logprobs\":2}");
    json_t *lp = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "logprobs");
    json_t *toks = json_object_get(lp, "tokens");
    json_t *tlp = json_object_get(lp, "token_logprobs");
    json_t *top = json_object_get(lp, "top_logprobs");
    json_t *off = json_object_get(lp, "text_offset");
    ck_assert_int_eq(json_array_size(toks), 8);
    ck_assert_int_eq(json_array_size(tlp), 8);
    ck_assert_int_eq(json_array_size(top), 8);
    ck_assert_int_eq(json_array_size(off), 8);
    ck_assert_int_eq(json_integer_value(json_array_get(off, 0)), 0);
    for (size_t i = 0; i < 8; i++) {
        double v = json_real_value(json_array_get(tlp, i));
        ck_assert_double_le(v, 0.0);
        json_t *alts = json_array_get(top, i);
        ck_assert_uint_ge(json_object_size(alts), 1);
        ck_assert_uint_le(json_object_size(alts), 2);
        /* greedy: the chosen token has the best log-probability */
        const char *k;
        json_t *val;
        double best = -INFINITY;
        json_object_foreach(alts, k, val) if (json_real_value(val) > best) best =
            json_real_value(val);
        ck_assert_double_eq_tol(v, best, 1e-6);
        if (i > 0)
            ck_assert_int_ge(json_integer_value(json_array_get(off, i)),
                             json_integer_value(json_array_get(off, i - 1)));
    }

    /* Streamed: the same token log-probabilities, chunk by chunk. */
    struct it_resp r;
    ck_assert(it_post(&srv, "/v1/completions",
                      "{\"prompt\":[1,72,105,33],\"max_tokens\":8,\"temperature\":0,"
                      "\"ignore_eos\":true,\"logprobs\":2,\"stream\":true}",
                      &r));
    char **ev;
    size_t n = it_sse_split(r.body, r.len, &ev);
    size_t k = 0;
    for (size_t i = 0; i + 1 < n; i++) {
        json_t *c = json_loads(ev[i], 0, NULL);
        json_t *clp = json_object_get(json_array_get(json_object_get(c, "choices"), 0), "logprobs");
        json_t *ctlp = json_object_get(clp, "token_logprobs");
        for (size_t q = 0; q < json_array_size(ctlp); q++, k++)
            ck_assert_double_eq_tol(json_real_value(json_array_get(ctlp, q)),
                                    json_real_value(json_array_get(tlp, k)), 1e-6);
        json_decref(c);
    }
    ck_assert_uint_eq(k, 8);
    it_strv_free(ev, n);
    it_resp_free(&r);
    json_decref(j);
    stop_clean();
}
END_TEST

static char *detokenize(const char *ids_json)
{
    char body[512];
    snprintf(body, sizeof body, "{\"tokens\":%s}", ids_json);
    struct it_resp r;
    ck_assert(it_post(&srv, "/detokenize", body, &r));
    ck_assert_msg(r.status == 200, "detokenize: %ld %s", r.status, r.body);
    json_t *j = it_json(&r);
    char *t = strdup(json_string_value(json_object_get(j, "prompt")));
    json_decref(j);
    it_resp_free(&r);
    return t;
}

START_TEST(test_echo)
{
    start_default();
    /* Token ids: the echoed prompt is their decoding, then the completion. */
    char *ptext = detokenize("[1,72,105,33]");
    json_t *plain =
        it_post_json_ok(&srv, "{\"prompt\":[1,72,105,33],\"max_tokens\":6,\"temperature\":0,"
                              "\"ignore_eos\":true}");
    json_t *echo =
        it_post_json_ok(&srv, "{\"prompt\":[1,72,105,33],\"max_tokens\":6,\"temperature\":0,"
                              "\"ignore_eos\":true,\"echo\":true}");
    char want[512];
    snprintf(want, sizeof want, "%s%s", ptext, it_choice_text(plain, 0));
    ck_assert_str_eq(it_choice_text(echo, 0), want);
    ck_assert_int_eq(it_usage_of(echo, "completion_tokens"), 6);
    struct it_resp r;
    ck_assert(it_post(&srv, "/v1/completions",
                      "{\"prompt\":[1,72,105,33],\"max_tokens\":6,\"temperature\":0,"
                      "\"ignore_eos\":true,\"echo\":true,\"stream\":true}",
                      &r));
    char finish[32];
    char *st = it_stream_text(r.body, r.len, 0, finish, sizeof finish);
    ck_assert_str_eq(st, want);
    free(st);
    it_resp_free(&r);
    json_decref(plain);
    json_decref(echo);
    free(ptext);

    /* A text prompt is echoed as sent; its token count is /tokenize's. */
    ck_assert(it_post(&srv, "/tokenize", "{\"prompt\":\"Hi there!\"}", &r));
    ck_assert_int_eq(r.status, 200);
    json_t *tk = it_json(&r);
    int64_t count = json_integer_value(json_object_get(tk, "count"));
    ck_assert_int_eq(count, (int64_t)json_array_size(json_object_get(tk, "tokens")));
    ck_assert_int_gt(count, 0);
    it_resp_free(&r);
    plain = it_post_json_ok(&srv, "{\"prompt\":\"Hi there!\",\"max_tokens\":5,\"temperature\":0,"
                                  "\"ignore_eos\":true}");
    echo = it_post_json_ok(&srv, "{\"prompt\":\"Hi there!\",\"max_tokens\":5,\"temperature\":0,"
                                 "\"ignore_eos\":true,\"echo\":true}");
    snprintf(want, sizeof want, "Hi there!%s", it_choice_text(plain, 0));
    ck_assert_str_eq(it_choice_text(echo, 0), want);
    ck_assert_int_eq(it_usage_of(plain, "prompt_tokens"), count);
    /* The same ids sent as ids give the same completion. */
    char *ids = json_dumps(json_object_get(tk, "tokens"), JSON_COMPACT);
    char body[1024];
    snprintf(body, sizeof body,
             "{\"prompt\":%s,\"max_tokens\":5,\"temperature\":0,\"ignore_eos\":true}", ids);
    json_t *byid = it_post_json_ok(&srv, body);
    ck_assert_str_eq(it_choice_text(byid, 0), it_choice_text(plain, 0));
    char *back = detokenize(ids);
    ck_assert_msg(strstr(back, "Hi there!") != NULL, "detokenized \"%s\"", back);
    free(back);
    free(ids);
    json_decref(byid);
    json_decref(tk);
    json_decref(plain);
    json_decref(echo);

    /* Bad tokenize/detokenize bodies are answered with the key named. */
    ck_assert(it_post(&srv, "/detokenize", "{\"tokens\":[1,99999]}", &r));
    ck_assert_int_eq(r.status, 400);
    it_resp_free(&r);
    ck_assert(it_post(&srv, "/tokenize", "{\"prompt\":42}", &r));
    ck_assert_int_eq(r.status, 400);
    it_resp_free(&r);
    stop_clean();
}
END_TEST

/* The naive reference for a prompt token's logprob: log-softmax of the
 * mock's logits after hist[0..n), at token tok (the server's mock has 512
 * tokens). */
#define MOCK_VOCAB 512
static double ref_logprob(const int32_t *hist, int32_t n, int32_t tok, int32_t *top, int n_top,
                          double *top_lp)
{
    float lg[MOCK_VOCAB];
    eng_mock_logits(MOCK_VOCAB, hist, n, lg);
    double mx = -INFINITY, sum = 0;
    for (int v = 0; v < MOCK_VOCAB; v++)
        mx = lg[v] > mx ? lg[v] : mx;
    for (int v = 0; v < MOCK_VOCAB; v++)
        sum += exp((double)lg[v] - mx);
    double lse = mx + log(sum);
    bool used[MOCK_VOCAB] = {false};
    for (int k = 0; k < n_top; k++) {
        int best = -1;
        for (int v = 0; v < MOCK_VOCAB; v++)
            if (!used[v] && (best < 0 || lg[v] > lg[best]))
                best = v;
        used[best] = true;
        top[k] = best;
        top_lp[k] = lg[best] - lse;
    }
    return lg[tok] - lse;
}

static json_t *choice_lp(json_t *j, size_t i)
{
    return json_object_get(json_array_get(json_object_get(j, "choices"), i), "logprobs");
}

static int64_t int_at(json_t *lp, const char *key, size_t i)
{
    return json_integer_value(json_array_get(json_object_get(lp, key), i));
}

/* echo with logprobs: the prompt's tokens head the logprobs arrays (the
 * first with null), with the values of a naive log-softmax of the mock's
 * logits, then the generated tokens exactly as without echo. */
START_TEST(test_echo_logprobs)
{
    it_hook("mock_vocab", "512");
    start_default();
    static const int32_t prompt[] = {1, 72, 105, 33};
    const char *base = "{\"prompt\":[1,72,105,33],\"max_tokens\":4,\"temperature\":0,"
                       "\"ignore_eos\":true,\"logprobs\":2";
    char body[512];
    snprintf(body, sizeof body, "%s}", base);
    json_t *plain = it_post_json_ok(&srv, body);
    snprintf(body, sizeof body, "%s,\"echo\":true,\"n\":2}", base);
    json_t *echo = it_post_json_ok(&srv, body);
    char *ptext = detokenize("[1,72,105,33]");
    size_t pchars = strlen(ptext); /* ASCII: "<s>" and three bytes */
    json_t *glp = choice_lp(plain, 0);
    for (size_t c = 0; c < 2; c++) {
        json_t *lp = choice_lp(echo, c);
        json_t *toks = json_object_get(lp, "tokens");
        json_t *tlp = json_object_get(lp, "token_logprobs");
        json_t *top = json_object_get(lp, "top_logprobs");
        ck_assert_uint_eq(json_array_size(toks), 8);
        ck_assert_uint_eq(json_array_size(tlp), 8);
        ck_assert_uint_eq(json_array_size(top), 8);
        ck_assert_uint_eq(json_array_size(json_object_get(lp, "text_offset")), 8);
        /* The prompt: each token's text as /detokenize gives it, where it
         * starts in the echoed text, and its logprob given what precedes. */
        ck_assert(json_is_null(json_array_get(tlp, 0)));
        ck_assert(json_is_null(json_array_get(top, 0)));
        size_t off = 0;
        for (int i = 0; i < 4; i++) {
            char one[32];
            snprintf(one, sizeof one, "[%d]", (int)prompt[i]);
            char *t = detokenize(one);
            ck_assert_str_eq(json_string_value(json_array_get(toks, (size_t)i)), t);
            ck_assert_int_eq(int_at(lp, "text_offset", (size_t)i), (int64_t)off);
            off += strlen(t);
            free(t);
            if (i == 0)
                continue;
            int32_t ids[2];
            double tl[2];
            double want = ref_logprob(prompt, i, prompt[i], ids, 2, tl);
            ck_assert_double_eq_tol(json_real_value(json_array_get(tlp, (size_t)i)), want, 1e-4);
            json_t *alts = json_array_get(top, (size_t)i);
            ck_assert_uint_eq(json_object_size(alts), 2);
            for (int k = 0; k < 2; k++) {
                snprintf(one, sizeof one, "[%d]", (int)ids[k]);
                char *t2 = detokenize(one);
                json_t *v = json_object_get(alts, t2);
                ck_assert_msg(v != NULL, "top_logprobs[%d] lacks \"%s\"", i, t2);
                ck_assert_double_eq_tol(json_real_value(v), tl[k], 1e-4);
                free(t2);
            }
        }
        /* Then the generated tokens, as without echo, after the echoed text. */
        for (size_t g = 0; g < 4; g++) {
            ck_assert_str_eq(json_string_value(json_array_get(toks, 4 + g)),
                             json_string_value(json_array_get(json_object_get(glp, "tokens"), g)));
            ck_assert_double_eq_tol(
                json_real_value(json_array_get(tlp, 4 + g)),
                json_real_value(json_array_get(json_object_get(glp, "token_logprobs"), g)), 1e-6);
            ck_assert_int_eq(int_at(lp, "text_offset", 4 + g),
                             (int64_t)pchars + int_at(glp, "text_offset", g));
        }
    }

    /* Streamed: the first event is the echo with the prompt's logprobs. */
    struct it_resp r;
    snprintf(body, sizeof body, "%s,\"echo\":true,\"stream\":true}", base);
    ck_assert(it_post(&srv, "/v1/completions", body, &r));
    ck_assert_int_eq(r.status, 200);
    char **ev;
    size_t n = it_sse_split(r.body, r.len, &ev);
    ck_assert_uint_ge(n, 3);
    json_t *first = json_loads(ev[0], 0, NULL);
    json_t *ch0 = json_array_get(json_object_get(first, "choices"), 0);
    ck_assert_str_eq(json_string_value(json_object_get(ch0, "text")), ptext);
    json_t *flp = json_object_get(ch0, "logprobs");
    json_t *elp = choice_lp(echo, 0);
    ck_assert_uint_eq(json_array_size(json_object_get(flp, "tokens")), 4);
    ck_assert(json_is_null(json_array_get(json_object_get(flp, "token_logprobs"), 0)));
    for (size_t i = 1; i < 4; i++)
        ck_assert_double_eq_tol(
            json_real_value(json_array_get(json_object_get(flp, "token_logprobs"), i)),
            json_real_value(json_array_get(json_object_get(elp, "token_logprobs"), i)), 1e-6);
    for (size_t i = 0; i < 4; i++)
        ck_assert_int_eq(int_at(flp, "text_offset", i), int_at(elp, "text_offset", i));
    json_decref(first);
    /* The generated tokens follow, their offsets after the echo. */
    size_t k = 4;
    for (size_t i = 1; i + 1 < n; i++) {
        json_t *c = json_loads(ev[i], 0, NULL);
        json_t *clp = json_object_get(json_array_get(json_object_get(c, "choices"), 0), "logprobs");
        for (size_t q = 0; q < json_array_size(json_object_get(clp, "tokens")); q++, k++) {
            ck_assert_double_eq_tol(
                json_real_value(json_array_get(json_object_get(clp, "token_logprobs"), q)),
                json_real_value(json_array_get(json_object_get(elp, "token_logprobs"), k)), 1e-6);
            ck_assert_int_eq(int_at(clp, "text_offset", q), int_at(elp, "text_offset", k));
        }
        json_decref(c);
    }
    ck_assert_uint_eq(k, 8);
    ck_assert_str_eq(ev[n - 1], "[DONE]");
    it_strv_free(ev, n);
    it_resp_free(&r);

    /* n 2 streamed: each choice's first event is the echo with the prompt's
     * logprobs. */
    snprintf(body, sizeof body, "%s,\"echo\":true,\"stream\":true,\"n\":2}", base);
    ck_assert(it_post(&srv, "/v1/completions", body, &r));
    ck_assert_int_eq(r.status, 200);
    n = it_sse_split(r.body, r.len, &ev);
    bool seen[2] = {false, false};
    for (size_t i = 0; i + 1 < n; i++) {
        json_t *c = json_loads(ev[i], 0, NULL);
        json_t *ch = json_array_get(json_object_get(c, "choices"), 0);
        json_int_t idx = json_integer_value(json_object_get(ch, "index"));
        ck_assert(idx == 0 || idx == 1);
        if (!seen[idx]) {
            seen[idx] = true;
            ck_assert_str_eq(json_string_value(json_object_get(ch, "text")), ptext);
            json_t *clp = json_object_get(ch, "logprobs");
            ck_assert_uint_eq(json_array_size(json_object_get(clp, "tokens")), 4);
            ck_assert(json_is_null(json_array_get(json_object_get(clp, "token_logprobs"), 0)));
            ck_assert_double_eq_tol(
                json_real_value(json_array_get(json_object_get(clp, "token_logprobs"), 3)),
                json_real_value(json_array_get(json_object_get(elp, "token_logprobs"), 3)), 1e-6);
        }
        json_decref(c);
    }
    ck_assert(seen[0] && seen[1]);
    it_strv_free(ev, n);
    it_resp_free(&r);

    /* A text prompt is echoed as sent, a special token written in it too:
     * the offsets count it where it stands. */
    json_t *tx = it_post_json_ok(&srv, "{\"prompt\":\"<s>Hi\",\"max_tokens\":2,\"temperature\":0,"
                                       "\"ignore_eos\":true,\"logprobs\":1,\"echo\":true}");
    json_t *tlp = choice_lp(tx, 0);
    ck_assert_uint_eq(json_array_size(json_object_get(tlp, "tokens")), 5);
    ck_assert_str_eq(json_string_value(json_array_get(json_object_get(tlp, "tokens"), 0)), "<s>");
    ck_assert_str_eq(json_string_value(json_array_get(json_object_get(tlp, "tokens"), 1)), "H");
    static const int32_t hi[] = {ENG_MOCK_BOS, ENG_MOCK_BYTE0 + 'H', ENG_MOCK_BYTE0 + 'i'};
    int32_t ids[1];
    double tl[1];
    ck_assert_double_eq_tol(
        json_real_value(json_array_get(json_object_get(tlp, "token_logprobs"), 2)),
        ref_logprob(hi, 2, hi[2], ids, 1, tl), 1e-4);
    static const int64_t want_off[] = {0, 3, 4, 5};
    for (size_t i = 0; i < 4; i++)
        ck_assert_int_eq(int_at(tlp, "text_offset", i), want_off[i]);
    ck_assert_int_eq(strncmp(it_choice_text(tx, 0), "<s>Hi", 5), 0);
    json_decref(tx);

    json_decref(plain);
    json_decref(echo);
    free(ptext);
    stop_clean();
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("integration_generate");
    TCase *tc = tcase_create("paths");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_single_token);
    tcase_add_test(tc, test_stream_matches);
    suite_add_tcase(s, tc);
    tc = tcase_create("batched");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_batched);
    suite_add_tcase(s, tc);
    tc = tcase_create("options");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_n_and_seed);
    tcase_add_test(tc, test_stop);
    tcase_add_test(tc, test_logprobs);
    tcase_add_test(tc, test_echo);
    tcase_add_test(tc, test_echo_logprobs);
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
