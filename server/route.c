/* route.c — routing, authentication, and the small endpoints (/v1/models,
 * /health, /health/ready, /metrics, /tokenize, /detokenize). Runs inside the
 * access handler once a request's body is complete. */
#define INF_LOG_MODULE "srv"
#include "api/api.h"
#include "tokenizer/tokenizer.h"
#include "server/srv_impl.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

enum route_id {
    ROUTE_COMPLETIONS,
    ROUTE_MODELS,
    ROUTE_MODEL, /* /v1/models/{id} */
    ROUTE_HEALTH,
    ROUTE_READY,
    ROUTE_METRICS,
    ROUTE_TOKENIZE,
    ROUTE_DETOKENIZE,
};

struct route {
    const char *path;   /* the path, or its prefix when prefix */
    const char *method; /* the one method served; HEAD is accepted where GET is */
    enum route_id id;
    bool open;   /* served without the API key */
    bool prefix; /* path is a prefix: "/v1/models/" and the rest */
};

static const struct route ROUTES[] = {
    {"/v1/completions", "POST", ROUTE_COMPLETIONS, false, false},
    {"/v1/models", "GET", ROUTE_MODELS, false, false},
    {"/v1/models/", "GET", ROUTE_MODEL, false, true},
    {"/health", "GET", ROUTE_HEALTH, true, false},
    {"/health/ready", "GET", ROUTE_READY, true, false},
    {"/metrics", "GET", ROUTE_METRICS, true, false},
    {"/tokenize", "POST", ROUTE_TOKENIZE, false, false},
    {"/detokenize", "POST", ROUTE_DETOKENIZE, false, false},
};

/* Compare without an early exit, so the time taken does not tell how many
 * leading bytes of a guessed key were right. */
static bool key_equal(const char *given, size_t glen, const char *key)
{
    size_t klen = strlen(key);
    unsigned char diff = (unsigned char)(glen != klen);
    for (size_t i = 0; i < klen; i++)
        diff |= (unsigned char)(key[i] ^ (i < glen ? given[i] : 0));
    return diff == 0;
}

static bool authorized(struct srv_req *r)
{
    const char *key = r->srv->opt.api_key;
    if (!key || !*key)
        return true;
    const char *h = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "Authorization");
    if (!h || strncasecmp(h, "Bearer ", 7) != 0)
        return false;
    h += 7;
    while (*h == ' ')
        h++;
    size_t len = strlen(h);
    while (len && (h[len - 1] == ' ' || h[len - 1] == '\t'))
        len--;
    return key_equal(h, len, key);
}

static void respond_json_arena(struct srv_req *r, inf_status_t st, const char *body, size_t len,
                               const struct inf_err *err)
{
    if (st != INF_OK)
        srv_req_respond_error(r, 500, st, NULL, NULL, "%s",
                              err && err->msg[0] ? err->msg : inf_status_str(st));
    else
        srv_req_respond_body(r, 200, "application/json", body, len);
}

static void handle_models(struct srv_req *r)
{
    struct srv_server *s = r->srv;
    struct inf_arena a;
    inf_arena_init(&a, 1024);
    struct api_model_card card = {s->opt.model_name, s->started_unix,
                                  (uint32_t)s->info.max_model_len};
    char *out = NULL;
    size_t len = 0;
    struct inf_err err = {0};
    inf_status_t st = api_models_encode(&card, 1, &a, &out, &len, &err);
    respond_json_arena(r, st, out, len, &err);
    inf_arena_fini(&a);
}

/* GET /v1/models/{id} (OpenAI's retrieve): the served model, or 404
 * model_not_found. A model id may hold '/' ("meta-llama/Llama-3-8B"): the
 * whole rest of the path is the id. */
static void handle_model(struct srv_req *r, const char *id)
{
    struct srv_server *s = r->srv;
    if (strcmp(id, s->opt.model_name) != 0) {
        srv_req_respond_error(r, 404, INF_E_NOTFOUND, "model", "model_not_found",
                              "The model `%.128s` does not exist or you do not have access to it.",
                              id);
        return;
    }
    struct inf_arena a;
    inf_arena_init(&a, 1024);
    struct api_model_card card = {s->opt.model_name, s->started_unix,
                                  (uint32_t)s->info.max_model_len};
    char *out = NULL;
    size_t len = 0;
    struct inf_err err = {0};
    inf_status_t st = api_model_encode(&card, &a, &out, &len, &err);
    respond_json_arena(r, st, out, len, &err);
    inf_arena_fini(&a);
}

static void handle_health(struct srv_req *r, bool ready)
{
    struct srv_server *s = r->srv;
    struct eng_stats st;
    eng_engine_stats(s->eng, &st);
    if (st.failed) {
        srv_req_respond_error(r, 503, INF_E_DEVICE, NULL, NULL, "the engine has failed");
        return;
    }
    if (ready && (!s->ready || s->draining)) {
        srv_req_respond_error(r, 503, INF_E_SHUTDOWN, NULL, NULL,
                              s->draining ? "the server is draining" : "the model is not ready");
        return;
    }
    static const char ok[] = "{\"status\":\"ok\"}";
    srv_req_respond_body(r, 200, "application/json", ok, sizeof ok - 1);
}

static void handle_metrics(struct srv_req *r)
{
    struct eng_stats st;
    eng_engine_stats(r->srv->eng, &st);
    size_t len = 0;
    char *text = srv_metrics_render(&r->srv->metrics, &st, &len);
    if (!text) {
        srv_req_respond_error(r, 500, INF_E_NOMEM, NULL, NULL, "out of memory");
        return;
    }
    srv_req_respond_body(r, 200, "text/plain; version=0.0.4; charset=utf-8", text, len);
    free(text);
}

/* /tokenize and /detokenize: parsing, the tokenizer and the answer's JSON
 * run on a worker thread (work.c); tok_job holds what it reads and writes. */
struct tok_job {
    struct srv_work work;
    bool detok;
    struct api_limits lim;
    tok_tokenizer_t *tok; /* NULL: the model has none */
    uint32_t max_model_len;
    struct inf_arena a;
    inf_status_t st;
    struct api_fault fault;
    struct inf_err err;
    char *out; /* the answer, in a */
    size_t len;
};

static void tok_job_work(struct srv_work *w)
{
    struct tok_job *j = (struct tok_job *)((char *)w - offsetof(struct tok_job, work));
    const struct srv_req *r = w->r;
    const char *body = r->body.p ? r->body.p : "";
    if (!j->detok) {
        struct api_tokenize_req q;
        struct tok_ids ids = {0};
        j->st = api_tokenize_parse(body, r->body.len, &j->lim, &j->a, &q, &j->fault, &j->err);
        if (j->st == INF_OK && !j->tok)
            j->st = inf_err_set(&j->err, INF_E_UNSUPPORTED, "this model has no tokenizer");
        if (j->st == INF_OK) {
            struct tok_encode_opts o = tok_encode_defaults();
            o.add_special = q.add_special_tokens;
            j->st = tok_encode(j->tok, q.prompt.s, q.prompt.len, &o, &ids, &j->err);
            if (j->st != INF_OK)
                j->fault.param = "prompt";
        }
        if (j->st == INF_OK)
            j->st = api_tokenize_encode(ids.ids, (uint32_t)ids.n, j->max_model_len, &j->a, &j->out,
                                        &j->len, &j->err);
        tok_ids_fini(&ids);
        return;
    }
    struct api_detokenize_req q;
    char *text = NULL;
    size_t tlen = 0;
    j->st = api_detokenize_parse(body, r->body.len, &j->lim, &j->a, &q, &j->fault, &j->err);
    if (j->st == INF_OK && !j->tok)
        j->st = inf_err_set(&j->err, INF_E_UNSUPPORTED, "this model has no tokenizer");
    if (j->st == INF_OK) {
        j->st = tok_decode(j->tok, q.ids, q.n_ids, false, &text, &tlen, &j->err);
        if (j->st != INF_OK) {
            if (j->st == INF_E_RANGE)
                j->st = INF_E_INVALID;
            j->fault.param = "tokens";
        }
    }
    if (j->st == INF_OK)
        j->st = api_detokenize_encode(text, tlen, &j->a, &j->out, &j->len, &j->err);
    free(text);
}

static void tok_job_done(struct srv_work *w)
{
    struct tok_job *j = (struct tok_job *)((char *)w - offsetof(struct tok_job, work));
    struct srv_req *r = w->r;
    if (!r->client_gone && j->st == INF_OK)
        srv_req_respond_body(r, 200, "application/json", j->out, j->len);
    else if (!r->client_gone)
        srv_req_respond_error(r, 0, j->st, j->fault.param, j->fault.code, "%s",
                              j->err.msg[0] ? j->err.msg : inf_status_str(j->st));
    inf_arena_fini(&j->a);
    free(j);
}

static void handle_tokenize(struct srv_req *r, bool detok)
{
    struct srv_server *s = r->srv;
    struct tok_job *j = calloc(1, sizeof *j);
    if (!j) {
        srv_req_respond_error(r, 500, INF_E_NOMEM, NULL, NULL, "out of memory");
        return;
    }
    j->detok = detok;
    api_limits_init(&j->lim, s->opt.model_name, (uint32_t)s->info.vocab,
                    (uint32_t)s->info.max_model_len);
    j->tok = eng_engine_tokenizer(s->eng);
    j->max_model_len = (uint32_t)s->info.max_model_len;
    inf_arena_init(&j->a, 4096);
    srv_req_work(r, &j->work, tok_job_work, tok_job_done);
}

void srv_route(struct srv_req *r)
{
    const struct route *rt = NULL;
    for (size_t i = 0; i < sizeof ROUTES / sizeof ROUTES[0]; i++) {
        size_t n = strlen(ROUTES[i].path);
        if (ROUTES[i].prefix ? strncmp(r->url, ROUTES[i].path, n) == 0 && r->url[n]
                             : strcmp(r->url, ROUTES[i].path) == 0)
            rt = &ROUTES[i];
    }
    /* A browser's preflight carries no API key: answered before the key is
     * checked. */
    if (rt && srv_cors_preflight(r, rt->method))
        return;
    bool open = rt && rt->open;
    if (!open && !authorized(r)) {
        srv_req_respond_error(r, 401, INF_E_AUTH, NULL, "invalid_api_key",
                              "Incorrect API key provided.");
        return;
    }
    if (!rt) {
        srv_req_respond_error(r, 404, INF_E_NOTFOUND, NULL, NULL, "no route for %s %s", r->method,
                              r->url);
        return;
    }
    bool head_ok = strcmp(rt->method, "GET") == 0 && strcmp(r->method, "HEAD") == 0;
    if (strcmp(r->method, rt->method) != 0 && !head_ok) {
        struct inf_arena a;
        inf_arena_init(&a, 1024);
        char *body = NULL;
        size_t len = 0;
        char msg[128];
        snprintf(msg, sizeof msg, "method %s is not allowed on %s (allowed: %s)", r->method, r->url,
                 rt->method);
        struct MHD_Response *resp = NULL;
        if (api_error_encode(INF_E_METHOD, msg, NULL, NULL, &a, &body, &len, NULL) == INF_OK)
            resp = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_COPY);
        inf_arena_fini(&a);
        if (resp) {
            MHD_add_response_header(resp, "Content-Type", "application/json");
            MHD_add_response_header(resp, "Allow",
                                    strcmp(rt->method, "GET") == 0 ? "GET, HEAD" : rt->method);
        }
        inf_log(INFO, "req=%s %s %s -> 405", srv_req_short_id(r), r->method, r->url);
        srv_req_respond(r, 405, resp);
        return;
    }
    if (strcmp(rt->method, "POST") == 0 && !srv_guard_content_type(r))
        return;
    switch (rt->id) {
    case ROUTE_COMPLETIONS:
        srv_cmpl_handle(r);
        break;
    case ROUTE_MODELS:
        handle_models(r);
        break;
    case ROUTE_MODEL:
        handle_model(r, r->url + strlen(rt->path));
        break;
    case ROUTE_HEALTH:
        handle_health(r, false);
        break;
    case ROUTE_READY:
        handle_health(r, true);
        break;
    case ROUTE_METRICS:
        handle_metrics(r);
        break;
    case ROUTE_TOKENIZE:
    case ROUTE_DETOKENIZE:
        if (r->srv->draining) {
            srv_req_respond_error(r, 503, INF_E_SHUTDOWN, NULL, NULL,
                                  "the server is shutting down");
            break;
        }
        handle_tokenize(r, rt->id == ROUTE_DETOKENIZE);
        break;
    }
}
