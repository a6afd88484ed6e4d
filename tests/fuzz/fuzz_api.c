/* fuzz_api — the request parsers of api/ (completions, tokenize, detokenize)
 * on arbitrary bytes, and the encoders on the same bytes as text. Checks the
 * contracts, not just the absence of crashes: a refusal has a status, a
 * message and a valid error body; an acceptance holds only in-range values;
 * every encoded body is valid JSON that reads back to the text (with invalid
 * UTF-8 replaced). */
#include "api/api.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(c)                                                                                   \
    do {                                                                                           \
        if (!(c))                                                                                  \
            abort();                                                                               \
    } while (0)

static void check_json(const char *s, size_t len)
{
    json_error_t je;
    json_t *j = json_loadb(s, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &je);
    /* A token whose text holds U+0000 is a valid key jansson will not read. */
    CHECK(j != NULL || json_error_code(&je) == json_error_null_byte_in_key);
    json_decref(j);
}

static void check_refusal(inf_status_t st, const struct api_fault *f, const struct inf_err *e,
                          struct inf_arena *a)
{
    CHECK(st == e->code);
    CHECK(e->msg[0] != '\0');
    int http = api_status_http(st);
    CHECK(http == 400 || http == 404 || (st == INF_E_NOMEM && http == 500));
    char *body;
    size_t len;
    CHECK(api_error_encode(st, e->msg, f->param, f->code, a, &body, &len, NULL) == INF_OK);
    check_json(body, len);
}

static void check_completion(const uint8_t *data, size_t size, const struct api_limits *lim,
                             struct inf_arena *a)
{
    struct api_completion_req r;
    struct api_fault f;
    struct inf_err e;
    inf_err_clear(&e);
    inf_status_t st = api_completion_parse((const char *)data, size, lim, a, &r, &f, &e);
    if (st != INF_OK) {
        check_refusal(st, &f, &e, a);
        return;
    }
    CHECK(r.n_prompts >= 1 && r.n_prompts <= lim->max_prompts);
    for (uint32_t i = 0; i < r.n_prompts; i++) {
        const struct api_prompt *p = &r.prompts[i];
        CHECK((p->text.s != NULL) != (p->ids != NULL));
        if (p->text.s)
            CHECK(p->text.len >= 1 && p->text.s[p->text.len] == '\0');
        for (uint32_t k = 0; k < p->n_ids; k++)
            CHECK(p->ids[k] >= 0 && (uint32_t)p->ids[k] < lim->vocab);
        if (p->ids)
            CHECK(p->n_ids >= 1);
    }
    CHECK(r.max_tokens == API_MAX_TOKENS_AUTO || r.max_tokens >= 1);
    CHECK(r.temperature >= 0 && r.temperature <= 2);
    CHECK(r.top_p > 0 && r.top_p <= 1);
    CHECK(r.top_k == API_TOP_K_OFF || (r.top_k >= 1 && (uint32_t)r.top_k <= lim->vocab));
    CHECK(r.min_p >= 0 && r.min_p <= 1);
    CHECK(r.n >= 1 && r.n <= lim->max_n && r.best_of >= r.n && r.best_of <= lim->max_n);
    CHECK(r.n_stop <= lim->max_stop);
    for (uint32_t i = 0; i < r.n_stop; i++)
        CHECK(r.stop[i].len >= 1);
    CHECK(!r.include_usage || r.stream);
    CHECK(r.logprobs == API_LOGPROBS_OFF ||
          (r.logprobs >= 0 && (uint32_t)r.logprobs <= lim->max_logprobs));
    CHECK(fabsf(r.presence_penalty) <= 2 && fabsf(r.frequency_penalty) <= 2);
    CHECK(r.repetition_penalty > 0 && r.repetition_penalty <= 2);
    for (uint32_t i = 0; i < r.n_bias; i++)
        CHECK(r.bias_ids[i] >= 0 && (uint32_t)r.bias_ids[i] < lim->vocab &&
              fabsf(r.bias_values[i]) <= 100);
    CHECK(r.max_tokens == API_MAX_TOKENS_AUTO || r.min_tokens <= r.max_tokens);
    CHECK(!r.model || strcmp(r.model, lim->model) == 0);

    /* The context check on every prompt length that matters. */
    uint32_t max_new;
    struct inf_err ce;
    struct api_fault cf;
    for (uint32_t plen = 0; plen <= lim->max_model_len + 1; plen += lim->max_model_len / 4) {
        inf_status_t cs =
            api_check_context(plen, r.max_tokens, lim->max_model_len, &max_new, &cf, &ce);
        if (cs == INF_OK)
            CHECK(max_new >= 1 && (uint64_t)plen + max_new <= lim->max_model_len);
        else
            CHECK(cs == INF_E_CONTEXT && strcmp(cf.code, "context_length_exceeded") == 0);
    }
}

/* Encode the input as text in a chunk, a final response and a detokenize
 * body; each must parse, and the text must read back whole when it was
 * valid UTF-8 to begin with. */
static void check_encoders(const uint8_t *data, size_t size, struct inf_arena *a)
{
    const char *s = (const char *)data;
    struct api_resp_head h = {"fuzz", 0, "m"};
    struct api_top_logprob top = {{s, size}, -1.0f};
    struct api_token_logprob t = {{s, size}, -0.5f, &top, 1};
    struct api_logprobs lp = {&t, 1, 3, NULL};
    struct api_choice c = {
        .index = 0, .text = {s, size}, .logprobs = &lp, .finish = API_FINISH_STOP};
    struct api_usage u = {1, 2};
    char *out;
    size_t len;
    CHECK(api_chunk_encode(&h, &c, a, &out, &len, NULL) == INF_OK);
    CHECK(len > 8 && memcmp(out, "data: ", 6) == 0 && memcmp(out + len - 2, "\n\n", 2) == 0);
    check_json(out + 6, len - 8);
    CHECK(api_completion_encode(&h, &c, 1, &u, a, &out, &len, NULL) == INF_OK);
    check_json(out, len);

    CHECK(api_detokenize_encode(s, size, a, &out, &len, NULL) == INF_OK);
    json_error_t je;
    json_t *j = json_loadb(out, len, JSON_ALLOW_NUL, &je);
    CHECK(j != NULL);
    json_t *p = json_object_get(j, "prompt");
    CHECK(json_is_string(p));
    /* Valid UTF-8 comes back byte for byte; anything else gets U+FFFDs, one
     * character each, which api_utf8_chars counts the same way. */
    json_t *raw = json_stringn(s, size);
    if (raw) {
        CHECK(json_string_length(p) == size && memcmp(json_string_value(p), s, size) == 0);
        json_decref(raw);
    }
    CHECK(api_utf8_chars(json_string_value(p), json_string_length(p)) == api_utf8_chars(s, size));
    json_decref(j);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct api_limits lim;
    api_limits_init(&lim, "tiny-llama", 32000, 2048);
    struct inf_arena a;
    inf_arena_init(&a, 0);

    check_completion(data, size, &lim, &a);

    struct api_fault f;
    struct inf_err e;
    struct api_tokenize_req tr;
    inf_status_t st = api_tokenize_parse((const char *)data, size, &lim, &a, &tr, &f, &e);
    if (st != INF_OK)
        check_refusal(st, &f, &e, &a);
    else
        CHECK(tr.prompt.s != NULL && tr.prompt.s[tr.prompt.len] == '\0');

    struct api_detokenize_req dr;
    st = api_detokenize_parse((const char *)data, size, &lim, &a, &dr, &f, &e);
    if (st != INF_OK) {
        check_refusal(st, &f, &e, &a);
    } else {
        for (uint32_t i = 0; i < dr.n_ids; i++)
            CHECK(dr.ids[i] >= 0 && (uint32_t)dr.ids[i] < lim.vocab);
    }

    check_encoders(data, size, &a);
    inf_arena_fini(&a);
    return 0;
}
