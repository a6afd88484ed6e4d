/* response.c — the completion response, its server-sent-event chunks, and the
 * usage chunk. Keys in OpenAI's order, compact, numbers in their shortest
 * exact form. */
#include "api/api_impl.h"

#include <string.h>

static const char *finish_name(enum api_finish f)
{
    switch (f) {
    case API_FINISH_STOP:
        return "stop";
    case API_FINISH_LENGTH:
        return "length";
    case API_FINISH_ABORT:
        return "abort";
    case API_FINISH_NONE:
    default:
        return NULL;
    }
}

static void put_text(struct jw *w, const struct api_text *t)
{
    jw_str(w, t->s ? t->s : "", t->s ? t->len : 0);
}

static bool same_text(const struct api_text *a, const struct api_text *b)
{
    size_t la = a->s ? a->len : 0, lb = b->s ? b->len : 0;
    return la == lb && (la == 0 || memcmp(a->s, b->s, la) == 0);
}

/* {"tokens":[...],"token_logprobs":[...],"top_logprobs":[...],"text_offset":[...]} */
static void put_logprobs(struct jw *w, const struct api_logprobs *lp)
{
    jw_lit(w, "{\"tokens\":[");
    for (uint32_t i = 0; i < lp->n_tokens; i++) {
        if (i)
            jw_raw(w, ",", 1);
        put_text(w, &lp->tokens[i].token);
    }
    jw_lit(w, "],\"token_logprobs\":[");
    for (uint32_t i = 0; i < lp->n_tokens; i++) {
        if (i)
            jw_raw(w, ",", 1);
        jw_f32(w, lp->tokens[i].logprob);
    }
    jw_lit(w, "],\"top_logprobs\":[");
    for (uint32_t i = 0; i < lp->n_tokens; i++) {
        const struct api_token_logprob *t = &lp->tokens[i];
        if (i)
            jw_raw(w, ",", 1);
        if (!t->top) {
            jw_lit(w, "null");
            continue;
        }
        jw_raw(w, "{", 1);
        bool first = true;
        for (uint32_t j = 0; j < t->n_top; j++) {
            /* A JSON object has one value per key: the first spelling wins. */
            bool dup = false;
            for (uint32_t k = 0; k < j && !dup; k++)
                dup = same_text(&t->top[k].token, &t->top[j].token);
            if (dup)
                continue;
            if (!first)
                jw_raw(w, ",", 1);
            first = false;
            put_text(w, &t->top[j].token);
            jw_raw(w, ":", 1);
            jw_f32(w, t->top[j].logprob);
        }
        jw_raw(w, "}", 1);
    }
    jw_lit(w, "],\"text_offset\":[");
    uint64_t off = lp->text_offset0;
    for (uint32_t i = 0; i < lp->n_tokens; i++) {
        if (i)
            jw_raw(w, ",", 1);
        jw_u64(w, lp->text_offsets ? lp->text_offsets[i] : off);
        const struct api_text *t = &lp->tokens[i].token;
        off += t->s ? api_utf8_chars(t->s, t->len) : 0;
    }
    jw_lit(w, "]}");
}

static void put_choice(struct jw *w, const struct api_choice *c)
{
    jw_lit(w, "{\"index\":");
    jw_u64(w, c->index);
    jw_lit(w, ",\"text\":");
    put_text(w, &c->text);
    jw_lit(w, ",\"logprobs\":");
    if (c->logprobs)
        put_logprobs(w, c->logprobs);
    else
        jw_lit(w, "null");
    jw_lit(w, ",\"finish_reason\":");
    jw_cstr(w, finish_name(c->finish));
    jw_raw(w, "}", 1);
}

static void put_head(struct jw *w, const struct api_resp_head *h)
{
    jw_lit(w, "{\"id\":\"cmpl-");
    if (h->id)
        jw_esc(w, h->id, strlen(h->id));
    jw_raw(w, "\"", 1);
    jw_lit(w, ",\"object\":\"text_completion\",\"created\":");
    jw_i64(w, h->created);
    jw_lit(w, ",\"model\":");
    jw_cstr(w, h->model);
}

static void put_usage(struct jw *w, const struct api_usage *u)
{
    jw_lit(w, "{\"prompt_tokens\":");
    jw_u64(w, u->prompt_tokens);
    jw_lit(w, ",\"completion_tokens\":");
    jw_u64(w, u->completion_tokens);
    jw_lit(w, ",\"total_tokens\":");
    jw_u64(w, (uint64_t)u->prompt_tokens + u->completion_tokens);
    jw_raw(w, "}", 1);
}

inf_status_t api_completion_encode(const struct api_resp_head *h, const struct api_choice *choices,
                                   uint32_t n_choices, const struct api_usage *usage,
                                   struct inf_arena *a, char **out, size_t *out_len,
                                   struct inf_err *err)
{
    struct jw w;
    jw_init(&w);
    put_head(&w, h);
    jw_lit(&w, ",\"choices\":[");
    for (uint32_t i = 0; i < n_choices; i++) {
        if (i)
            jw_raw(&w, ",", 1);
        put_choice(&w, &choices[i]);
    }
    jw_lit(&w, "],\"usage\":");
    put_usage(&w, usage);
    jw_raw(&w, "}", 1);
    return jw_finish(&w, a, out, out_len, err);
}

inf_status_t api_chunk_encode(const struct api_resp_head *h, const struct api_choice *choice,
                              struct inf_arena *a, char **out, size_t *out_len, struct inf_err *err)
{
    struct jw w;
    jw_init(&w);
    jw_lit(&w, "data: ");
    put_head(&w, h);
    jw_lit(&w, ",\"choices\":[");
    put_choice(&w, choice);
    jw_lit(&w, "],\"usage\":null}\n\n");
    return jw_finish(&w, a, out, out_len, err);
}

inf_status_t api_chunk_usage_encode(const struct api_resp_head *h, const struct api_usage *usage,
                                    struct inf_arena *a, char **out, size_t *out_len,
                                    struct inf_err *err)
{
    struct jw w;
    jw_init(&w);
    jw_lit(&w, "data: ");
    put_head(&w, h);
    jw_lit(&w, ",\"choices\":[],\"usage\":");
    put_usage(&w, usage);
    jw_lit(&w, "}\n\n");
    return jw_finish(&w, a, out, out_len, err);
}
