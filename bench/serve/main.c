/* int4serve-bench-serve — N completions requests at concurrency C against a
 * running server, prompt of P tokens (token ids, or text), O output tokens
 * each (ignore_eos), streamed. Prints output tokens/s, time to first token
 * and inter-token latency (p50, p99), and the error count.
 *
 *   int4serve-bench-serve --url http://127.0.0.1:8000 -n 256 -c 32 -p 128 -o 128
 *
 * Times are taken on arrival of each server-sent event. The server sends an
 * event for a token only when the token adds text (a token without text, or
 * the first bytes of a UTF-8 character, rides with the next event), and a
 * stream without logprobs does not say how many tokens an event covers, so:
 *   TTFT  from sending to the first event carrying text;
 *   ITL   per text event: the gap between two consecutive events of one
 *         request carrying text (one token each when every token has text);
 *   TPOT  per request: (last event - first text event) / (completion_tokens
 *         - 1), completion_tokens from the usage; a per-token time whatever
 *         the tokenizer (exact when the first token has text).
 * The report prints these definitions and the ratio of text events to output
 * tokens: near 1, ITL is per token.
 *
 * --shared-prefix S starts every prompt with the same S token ids (drawn once
 * from the seed) before its own P: the load of a common system prompt,
 *
 *   int4serve-bench-serve -n 512 -c 32 --shared-prefix 1024 -p 32 -o 64
 *
 * and the report adds what the server's /metrics counted of its prefix
 * cache during the run (int4serve_prefix_cache_{queries,hits}_total). */
#include <curl/curl.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct opts {
    const char *url, *model, *api_key, *text;
    int n, c, p, o;
    int shared; /* ids every prompt starts with */
    bool stream;
    unsigned seed;
};

struct dvec {
    double *v;
    size_t n, cap;
};

static void dvec_push(struct dvec *d, double x)
{
    if (d->n == d->cap) {
        d->cap = d->cap ? d->cap * 2 : 1024;
        d->v = realloc(d->v, d->cap * sizeof *d->v);
        if (!d->v) {
            fprintf(stderr, "out of memory\n");
            exit(1);
        }
    }
    d->v[d->n++] = x;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(struct dvec *d, double q)
{
    if (!d->n)
        return NAN;
    qsort(d->v, d->n, sizeof *d->v, cmp_double);
    size_t i = (size_t)ceil(q * (double)d->n) - 1;
    if (i >= d->n)
        i = d->n - 1;
    return d->v[i];
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

struct slot {
    CURL *h;
    char *body;
    char *buf; /* unparsed bytes of the stream */
    size_t len, cap;
    double t_send, t_first, t_last_text;
    double t_last; /* the last event with a choice (text or finish) */
    bool got_first, got_done;
    long completion_tokens;
    long text_events;
    bool failed;
};

static struct dvec ttft, itl, tpot;
static long total_tokens, total_text_events;

static void on_event(struct slot *s, const char *data, size_t len)
{
    if (len == 6 && memcmp(data, "[DONE]", 6) == 0) {
        s->got_done = true;
        return;
    }
    json_t *j = json_loadb(data, len, JSON_ALLOW_NUL, NULL);
    if (!j) {
        if (!s->failed)
            fprintf(stderr, "error: an event is not JSON: %.200s\n", data);
        s->failed = true;
        return;
    }
    json_t *u = json_object_get(j, "usage");
    if (json_is_object(u))
        s->completion_tokens = (long)json_integer_value(json_object_get(u, "completion_tokens"));
    if (json_object_get(j, "error")) {
        if (!s->failed)
            fprintf(stderr, "error event: %.300s\n", data);
        s->failed = true;
    }
    json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
    const char *text = json_string_value(json_object_get(ch, "text"));
    if (ch) {
        double t = now_s();
        if (text && *text) {
            if (!s->got_first) {
                dvec_push(&ttft, t - s->t_send);
                s->t_first = t;
                s->got_first = true;
            } else {
                dvec_push(&itl, t - s->t_last_text);
            }
            s->t_last_text = t;
            s->text_events++;
        }
        s->t_last = t;
    }
    json_decref(j);
}

static size_t on_data(char *ptr, size_t size, size_t nmemb, void *user)
{
    struct slot *s = user;
    size_t n = size * nmemb;
    if (s->len + n + 1 > s->cap) {
        s->cap = (s->len + n + 1) * 2;
        s->buf = realloc(s->buf, s->cap);
        if (!s->buf)
            return 0;
    }
    memcpy(s->buf + s->len, ptr, n);
    s->len += n;
    s->buf[s->len] = '\0';
    char *p = s->buf;
    char *e;
    while ((e = strstr(p, "\n\n"))) {
        if (e - p >= 6 && strncmp(p, "data: ", 6) == 0)
            on_event(s, p + 6, (size_t)(e - p - 6));
        p = e + 2;
    }
    size_t rest = s->len - (size_t)(p - s->buf);
    memmove(s->buf, p, rest);
    s->len = rest;
    s->buf[rest] = '\0';
    return n;
}

static int *shared_ids; /* [o.shared] */

static char *make_body(const struct opts *o, unsigned *rng)
{
    json_t *j = json_object();
    if (o->model)
        json_object_set_new(j, "model", json_string(o->model));
    if (o->text) {
        json_object_set_new(j, "prompt", json_string(o->text));
    } else {
        json_t *ids = json_array();
        for (int i = 0; i < o->shared; i++)
            json_array_append_new(ids, json_integer(shared_ids[i]));
        for (int i = 0; i < o->p; i++) {
            *rng = *rng * 1103515245u + 12345u;
            /* ids 3..258: present in any vocabulary this server loads */
            json_array_append_new(ids, json_integer(3 + (int)((*rng >> 16) % 256)));
        }
        json_object_set_new(j, "prompt", ids);
    }
    json_object_set_new(j, "max_tokens", json_integer(o->o));
    json_object_set_new(j, "ignore_eos", json_true());
    json_object_set_new(j, "temperature", json_real(0.0));
    json_object_set_new(j, "stream", json_boolean(o->stream));
    if (o->stream) {
        json_t *so = json_object();
        json_object_set_new(so, "include_usage", json_true());
        json_object_set_new(j, "stream_options", so);
    }
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    return s;
}

/* The sum of the /metrics samples named name (no labels), or -1 when the
 * server does not answer or has none. */
struct membuf {
    char *p;
    size_t len;
};

static size_t on_metrics(char *ptr, size_t size, size_t nmemb, void *user)
{
    struct membuf *b = user;
    size_t n = size * nmemb;
    char *q = realloc(b->p, b->len + n + 1);
    if (!q)
        return 0;
    memcpy(q + b->len, ptr, n);
    b->p = q;
    b->len += n;
    b->p[b->len] = '\0';
    return n;
}

static bool prefix_counters(const char *base, const char *auth, double *queries, double *hits)
{
    char url[1024];
    snprintf(url, sizeof url, "%s/metrics", base);
    struct membuf b = {0};
    CURL *h = curl_easy_init();
    struct curl_slist *hl = auth ? curl_slist_append(NULL, auth) : NULL;
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hl);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_metrics);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT, 10L);
    long code = 0;
    bool ok = curl_easy_perform(h) == CURLE_OK &&
              curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code) == CURLE_OK && code == 200;
    curl_easy_cleanup(h);
    curl_slist_free_all(hl);
    const char *q = ok && b.p ? strstr(b.p, "\nint4serve_prefix_cache_queries_total ") : NULL;
    const char *k = ok && b.p ? strstr(b.p, "\nint4serve_prefix_cache_hits_total ") : NULL;
    if (q && k) {
        *queries = strtod(strchr(q + 1, ' ') + 1, NULL);
        *hits = strtod(strchr(k + 1, ' ') + 1, NULL);
    }
    free(b.p);
    return q && k;
}

static void usage(void)
{
    fprintf(stderr,
            "usage: int4serve-bench-serve [--url URL] [-n N] [-c C] [-p P | --text STR] [-o O]\n"
            "                             [--shared-prefix S]\n"
            "                             [--model NAME] [--api-key KEY] [--no-stream] [--seed S]\n"
            "  --url URL      server base URL (default http://127.0.0.1:8000)\n"
            "  -n N           requests in all (default 64)\n"
            "  -c C           requests in flight at once (default 8)\n"
            "  -p P           prompt length in token ids (default 32), after the shared ones\n"
            "  --shared-prefix S  the same S token ids first in every prompt (default 0)\n"
            "  --text STR     send STR as the prompt instead of token ids\n"
            "  -o O           output tokens per request, ignore_eos (default 32)\n"
            "  --no-stream    non-streamed requests (no TTFT/ITL, throughput only)\n");
}

int main(int argc, char **argv)
{
    struct opts o = {.url = "http://127.0.0.1:8000",
                     .n = 64,
                     .c = 8,
                     .p = 32,
                     .o = 32,
                     .stream = true,
                     .seed = 1};
    static const struct option lo[] = {{"url", required_argument, 0, 'u'},
                                       {"model", required_argument, 0, 'm'},
                                       {"api-key", required_argument, 0, 'k'},
                                       {"text", required_argument, 0, 't'},
                                       {"no-stream", no_argument, 0, 'S'},
                                       {"seed", required_argument, 0, 's'},
                                       {"help", no_argument, 0, 'h'},
                                       {"shared-prefix", required_argument, 0, 'P'},
                                       {0, 0, 0, 0}};
    int ch;
    while ((ch = getopt_long(argc, argv, "n:c:p:o:h", lo, NULL)) != -1) {
        switch (ch) {
        case 'u':
            o.url = optarg;
            break;
        case 'm':
            o.model = optarg;
            break;
        case 'k':
            o.api_key = optarg;
            break;
        case 't':
            o.text = optarg;
            break;
        case 'S':
            o.stream = false;
            break;
        case 's':
            o.seed = (unsigned)strtoul(optarg, NULL, 10);
            break;
        case 'n':
            o.n = atoi(optarg);
            break;
        case 'c':
            o.c = atoi(optarg);
            break;
        case 'p':
            o.p = atoi(optarg);
            break;
        case 'o':
            o.o = atoi(optarg);
            break;
        case 'P':
            o.shared = atoi(optarg);
            break;
        default:
            usage();
            return ch == 'h' ? 0 : 2;
        }
    }
    if (o.n < 1 || o.c < 1 || o.p < 1 || o.o < 1 || o.shared < 0 || (o.shared && o.text)) {
        usage();
        return 2;
    }
    if (o.shared) {
        /* its own stream of the seed, so the suffixes are those of a run
         * without it */
        shared_ids = malloc(sizeof *shared_ids * (size_t)o.shared);
        if (!shared_ids) {
            fprintf(stderr, "out of memory\n");
            return 1;
        }
        unsigned srng = o.seed ^ 0x5eedu;
        for (int i = 0; i < o.shared; i++) {
            srng = srng * 1103515245u + 12345u;
            shared_ids[i] = 3 + (int)((srng >> 16) % 256);
        }
    }
    if (o.c > o.n)
        o.c = o.n;
    curl_global_init(CURL_GLOBAL_DEFAULT);
    char url[1024], auth[512];
    snprintf(url, sizeof url, "%s/v1/completions", o.url);
    struct curl_slist *hl = curl_slist_append(NULL, "Content-Type: application/json");
    hl = curl_slist_append(hl, "Expect:");
    if (o.api_key) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", o.api_key);
        hl = curl_slist_append(hl, auth);
    }
    CURLM *m = curl_multi_init();
    struct slot *slots = calloc((size_t)o.c, sizeof *slots);
    unsigned rng = o.seed;
    int sent = 0, done = 0, errors = 0, running = 0;
    double q0 = 0, h0 = 0;
    bool have_pc = prefix_counters(o.url, o.api_key ? auth : NULL, &q0, &h0);
    double t0 = now_s();

    for (;;) {
        for (int i = 0; i < o.c && sent < o.n; i++) {
            struct slot *s = &slots[i];
            if (s->h)
                continue;
            free(s->body);
            char *keep = s->buf;
            size_t kcap = s->cap;
            memset(s, 0, sizeof *s);
            s->buf = keep;
            s->cap = kcap;
            s->body = make_body(&o, &rng);
            s->h = curl_easy_init();
            curl_easy_setopt(s->h, CURLOPT_URL, url);
            curl_easy_setopt(s->h, CURLOPT_POSTFIELDS, s->body);
            curl_easy_setopt(s->h, CURLOPT_HTTPHEADER, hl);
            curl_easy_setopt(s->h, CURLOPT_WRITEFUNCTION, on_data);
            curl_easy_setopt(s->h, CURLOPT_WRITEDATA, s);
            curl_easy_setopt(s->h, CURLOPT_PRIVATE, s);
            curl_easy_setopt(s->h, CURLOPT_NOSIGNAL, 1L);
            curl_easy_setopt(s->h, CURLOPT_TIMEOUT, 600L);
            s->t_send = now_s();
            curl_multi_add_handle(m, s->h);
            sent++;
        }
        if (done == o.n)
            break;
        curl_multi_perform(m, &running);
        CURLMsg *msg;
        int left, freed = 0;
        while ((msg = curl_multi_info_read(m, &left))) {
            if (msg->msg != CURLMSG_DONE)
                continue;
            struct slot *s = NULL;
            curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&s);
            long code = 0;
            curl_easy_getinfo(msg->easy_handle, CURLINFO_RESPONSE_CODE, &code);
            if (!o.stream && msg->data.result == CURLE_OK && code == 200) {
                json_t *j = json_loadb(s->buf, s->len, JSON_ALLOW_NUL, NULL);
                s->completion_tokens = (long)json_integer_value(
                    json_object_get(json_object_get(j, "usage"), "completion_tokens"));
                s->got_done = j != NULL;
                json_decref(j);
            }
            if (msg->data.result != CURLE_OK || code != 200 || s->failed || !s->got_done) {
                errors++;
                if (errors <= 3)
                    fprintf(stderr, "error: %s, HTTP %ld\n",
                            msg->data.result != CURLE_OK ? curl_easy_strerror(msg->data.result)
                                                         : "bad response",
                            code);
            } else {
                total_tokens += s->completion_tokens;
                total_text_events += s->text_events;
                if (o.stream && s->got_first && s->completion_tokens > 1)
                    dvec_push(&tpot, (s->t_last - s->t_first) / (double)(s->completion_tokens - 1));
            }
            curl_multi_remove_handle(m, s->h);
            curl_easy_cleanup(s->h);
            s->h = NULL;
            s->len = 0;
            done++;
            freed++;
        }
        /* A finished request's slot is refilled at once (the top of the
         * loop); waiting here first would hold it empty until the poll's
         * timeout when nothing else is in flight (C = 1: 50 ms a request). */
        if (done < o.n && !(freed && sent < o.n))
            curl_multi_poll(m, NULL, 0, 50, NULL);
    }
    double wall = now_s() - t0;
    if (o.shared)
        printf("requests %d  concurrency %d  prompt %d tokens (%d shared + %d)  output %d  "
               "stream %s\n",
               o.n, o.c, o.shared + o.p, o.shared, o.p, o.o, o.stream ? "yes" : "no");
    else
        printf("requests %d  concurrency %d  prompt %d%s  output %d  stream %s\n", o.n, o.c,
               o.text ? 0 : o.p, o.text ? " (text)" : " tokens", o.o, o.stream ? "yes" : "no");
    printf("duration %.3f s  requests/s %.2f  output tokens %ld  output tokens/s %.1f\n", wall,
           (double)(o.n - errors) / wall, total_tokens, (double)total_tokens / wall);
    if (o.stream) {
        printf("TTFT ms  p50 %.2f  p99 %.2f   (sent -> first event carrying text)\n",
               pct(&ttft, 0.50) * 1e3, pct(&ttft, 0.99) * 1e3);
        printf("ITL  ms  p50 %.3f  p99 %.3f   (per text event: gap between consecutive events "
               "carrying text)\n",
               pct(&itl, 0.50) * 1e3, pct(&itl, 0.99) * 1e3);
        printf("TPOT ms  p50 %.3f  p99 %.3f   (per request: (last event - first text event) / "
               "(completion_tokens - 1))\n",
               pct(&tpot, 0.50) * 1e3, pct(&tpot, 0.99) * 1e3);
        printf("text events per output token %.3f   (%ld / %ld; below 1, tokens without text "
               "share events and ITL spans several tokens)\n",
               total_tokens ? (double)total_text_events / (double)total_tokens : 0.0,
               total_text_events, total_tokens);
    }
    double q1 = 0, h1 = 0;
    if (have_pc && prefix_counters(o.url, o.api_key ? auth : NULL, &q1, &h1))
        printf("prefix cache  hits %.0f of %.0f prompt tokens  %.1f%%   (the server's /metrics "
               "over the run)\n",
               h1 - h0, q1 - q0, q1 > q0 ? 100.0 * (h1 - h0) / (q1 - q0) : 0.0);
    printf("errors %d\n", errors);
    for (int i = 0; i < o.c; i++) {
        free(slots[i].body);
        free(slots[i].buf);
    }
    free(slots);
    free(shared_ids);
    free(ttft.v);
    free(itl.v);
    free(tpot.v);
    curl_slist_free_all(hl);
    curl_multi_cleanup(m);
    curl_global_cleanup();
    return errors ? 1 : 0;
}
