/* completion.c — POST /v1/completions: from the parsed request to engine
 * requests, and from engine events to the final JSON or the SSE stream.
 *
 * One HTTP request with P prompts and n choices becomes P engine requests
 * (struct srv_sub, ids r->id, r->id+1, ...); choice j of prompt p is choice
 * p*n + j of the response, as OpenAI numbers them. A non-streamed request
 * suspends its connection until the last engine event and then answers at
 * once; a streamed one queues an SSE response whose reader hands out what the
 * events appended and suspends the connection when it has nothing to send.
 *
 * echo. The prompt's text (as sent, or its ids decoded) comes first in each
 * choice's text. With logprobs too, the engine scores the prompt
 * (ENG_EV_PROMPT, before the first delta) and its tokens head each choice's
 * logprobs, the first with null logprob and null top_logprobs; streamed, the
 * echo is then sent when those arrive, in one event with them, instead of at
 * once. An echoed prompt token's text_offset is where its text starts in the
 * echoed prompt (see prompt_offsets); generated tokens continue after the
 * echoed prompt. */
#define INF_LOG_MODULE "srv"
#include "api/api.h"
#include "tokenizer/tokenizer.h"
#include "server/srv_impl.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define STREAM_BLOCK 16384
/* The most stream bytes kept for a client that does not read them (past what
 * the echo put there at the start); past it the request is cancelled and the
 * connection closed (docs/API.md, "Slow clients"). */
#define STREAM_BUFFER_MAX ((size_t)4 << 20)

struct srv_choice {
    struct srv_buf text; /* non-streamed: the whole generated text */
    enum eng_finish finish;
    struct api_token_logprob *lp; /* non-streamed logprobs, token texts in the arena */
    uint32_t n_lp, cap_lp;
    size_t chars_sent; /* streamed: code points sent so far (text_offset) */
    bool echo_sent;    /* streamed: the echoed prompt went out */
};

/* One prompt's logprobs (echo with logprobs), from its ENG_EV_PROMPT. */
struct srv_prompt_lp {
    struct api_token_logprob *toks; /* in the arena; NULL until the event */
    uint32_t *offs;                 /* text_offset of each token in the echoed prompt */
    uint32_t n;
};

struct srv_cmpl {
    struct inf_arena arena;   /* the parsed request, prompt texts, token texts */
    struct inf_arena scratch; /* one event's encodings */
    struct api_completion_req req;
    struct api_resp_head head;
    uint32_t n_subs, n_pending, n_choices;
    struct srv_sub *subs;
    struct srv_choice *choices;
    struct api_text *echo;     /* per prompt: the prompt text when echo */
    struct srv_prompt_lp *plp; /* per prompt: its logprobs when echo and logprobs */
    uint32_t prompt_tokens, completion_tokens;
    bool stream;
    bool over; /* the answer is decided (error or complete): later content is dropped */
    uint64_t submit_ns;
    struct srv_buf out; /* streamed bytes not yet handed to libmicrohttpd */
    size_t out_off;
    size_t out_allow; /* unsent bytes allowed: STREAM_BUFFER_MAX plus the echo's */
    bool out_end;
    bool dropped; /* the client was too slow: nothing more is queued */
    /* Preparation on a worker thread (prepare_work): its inputs, set on the
     * loop before, and its results, read on the loop after. */
    struct srv_work work;
    struct api_limits lim;
    tok_tokenizer_t *tok;
    uint32_t max_model_len;
    inf_status_t prep_st;
    struct api_fault prep_fault;
    struct inf_err prep_err;
    struct prep_prompt *pp; /* [n_prompts]: ids (malloc'd) and the output budget */
};

struct prep_prompt {
    int32_t *ids;
    int32_t n_ids;
    uint32_t max_new;
};

static tok_tokenizer_t *server_tok(struct srv_server *s)
{
    /* The engine's tokenizer: encode and decode are safe from several
     * threads at once (the worker pool's and the loop's). */
    return eng_engine_tokenizer(s->eng);
}

void srv_cmpl_free(struct srv_req *r)
{
    struct srv_cmpl *c = r->cmpl;
    if (!c)
        return;
    r->cmpl = NULL;
    for (uint32_t i = 0; i < c->n_subs; i++)
        srv_sub_unregister(r->srv, &c->subs[i]);
    for (uint32_t i = 0; i < c->n_choices; i++) {
        srv_buf_free(&c->choices[i].text);
        free(c->choices[i].lp);
    }
    if (c->pp)
        for (uint32_t i = 0; i < c->req.n_prompts; i++)
            free(c->pp[i].ids);
    free(c->pp);
    free(c->choices);
    free(c->subs);
    srv_buf_free(&c->out);
    inf_arena_fini(&c->scratch);
    inf_arena_fini(&c->arena);
    free(c);
}

static enum api_finish to_api_finish(enum eng_finish f)
{
    switch (f) {
    case ENG_FINISH_STOP:
        return API_FINISH_STOP;
    case ENG_FINISH_LENGTH:
        return API_FINISH_LENGTH;
    case ENG_FINISH_ABORT:
        return API_FINISH_ABORT;
    default:
        return API_FINISH_NONE;
    }
}

/* The text of one token for logprobs, copied into arena a. */
static struct api_text token_text(struct srv_server *s, int32_t id, struct inf_arena *a)
{
    struct api_text t = {"", 0};
    tok_tokenizer_t *tok = server_tok(s);
    char *txt = NULL;
    size_t len = 0;
    if (tok && tok_decode(tok, &id, 1, false, &txt, &len, NULL) == INF_OK) {
        char *cp = inf_arena_strndup(a, txt, len);
        free(txt);
        if (cp) {
            t.s = cp;
            t.len = len;
        }
        return t;
    }
    char *cp = inf_arena_sprintf(a, "<|id:%d|>", (int)id);
    if (cp) {
        t.s = cp;
        t.len = strlen(cp);
    }
    return t;
}

static bool fill_logprob(struct srv_server *s, const struct eng_token_info *ti,
                         struct api_token_logprob *out, struct inf_arena *a)
{
    out->token = token_text(s, ti->id, a);
    out->logprob = ti->logprob;
    out->n_top = 0;
    out->top = NULL;
    if (ti->n_top > 0) {
        struct api_top_logprob *top = inf_arena_calloc(a, (size_t)ti->n_top, sizeof *top);
        if (!top)
            return false;
        for (int32_t k = 0; k < ti->n_top && k < 5; k++) {
            top[k].token = token_text(s, ti->top_ids[k], a);
            top[k].logprob = ti->top_logprobs[k];
        }
        out->top = top;
        out->n_top = (uint32_t)(ti->n_top < 5 ? ti->n_top : 5);
    }
    return true;
}

/* Decoding work (tokens) prompt_offsets may spend on exact offsets: a prompt
 * of up to about 700 tokens. */
#define OFFSET_EXACT_WORK (1u << 18)

/* Where each of the n prompt tokens ti (texts t) starts in the echoed prompt,
 * in characters, at most limit (the echo's length): the length of the text
 * its predecessors decode to. The first lead tokens are not in the echoed
 * text (the BOS the tokenizer added to a text prompt, which is echoed as
 * sent) and count for nothing. Exact while the decoding work allows; past
 * it, the text an incremental decoder has settled, which for a token inside
 * a byte-fallback run is the run's start. Into arena a; NULL on out of
 * memory. */
static uint32_t *prompt_offsets(struct srv_server *s, const struct eng_token_info *ti,
                                const struct api_token_logprob *t, uint32_t n, uint32_t lead,
                                uint32_t limit, struct inf_arena *a)
{
    uint32_t *off = inf_arena_calloc(a, n ? n : 1, sizeof *off);
    int32_t *ids = inf_arena_calloc(a, n ? n : 1, sizeof *ids);
    if (!off || !ids)
        return NULL;
    for (uint32_t i = 0; i < n; i++)
        ids[i] = ti[i].id;
    tok_tokenizer_t *tok = server_tok(s);
    tok_stream_t *ts = NULL;
    if (!tok || tok_stream_create(tok, NULL, &ts, NULL) != INF_OK)
        ts = NULL;
    uint64_t settled = 0, work = 0;
    for (uint32_t i = lead < n ? lead : n; i < n; i++) {
        uint64_t at = settled;
        char *txt = NULL;
        size_t len = 0;
        if (tok && work + (i - lead) <= OFFSET_EXACT_WORK &&
            tok_decode(tok, ids + lead, i - lead, false, &txt, &len, NULL) == INF_OK) {
            at = api_utf8_chars(txt, len);
            work += i - lead;
        }
        free(txt);
        off[i] = at < limit ? (uint32_t)at : limit;
        const char *d = NULL;
        size_t dl = 0;
        if (ts && tok_stream_push(ts, ids[i], &d, &dl, NULL) == INF_OK)
            settled += api_utf8_chars(d, dl);
        else if (!ts) /* no decoder: the tokens' own texts, added up */
            settled += api_utf8_chars(t[i].token.s, t[i].token.len);
    }
    tok_stream_destroy(ts);
    return off;
}

/* Tokens the tokenizer puts before a text prompt's own (BOS), when ids
 * starts with them: what encoding the empty text gives. */
static uint32_t added_lead(struct srv_server *s, const struct eng_token_info *ti, uint32_t n)
{
    tok_tokenizer_t *tok = server_tok(s);
    struct tok_ids e = {0};
    struct tok_encode_opts o = tok_encode_defaults();
    o.add_special = true;
    uint32_t lead = 0;
    if (tok && tok_encode(tok, "", 0, &o, &e, NULL) == INF_OK && e.n <= n) {
        lead = (uint32_t)e.n;
        for (uint32_t i = 0; i < lead; i++)
            if (e.ids[i] != ti[i].id)
                lead = 0;
    }
    tok_ids_fini(&e);
    return lead;
}

/* ---- the stream ---------------------------------------------------------------------- */
static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    struct srv_req *r = cls;
    struct srv_cmpl *c = r->cmpl;
    (void)pos;
    if (c->dropped)
        return MHD_CONTENT_READER_END_WITH_ERROR;
    size_t avail = c->out.len - c->out_off;
    if (avail) {
        size_t n = avail < max ? avail : max;
        memcpy(buf, c->out.p + c->out_off, n);
        c->out_off += n;
        if (c->out_off == c->out.len) {
            c->out.len = c->out_off = 0;
        } else if (c->out_off >= 4 * STREAM_BLOCK && c->out_off * 2 >= c->out.len) {
            /* A client that reads, but behind: keep only what is unsent. */
            memmove(c->out.p, c->out.p + c->out_off, c->out.len - c->out_off + 1);
            c->out.len -= c->out_off;
            c->out_off = 0;
        }
        return (ssize_t)n;
    }
    if (c->out_end)
        return MHD_CONTENT_READER_END_OF_STREAM;
    /* Nothing to send yet: park the connection until the next event. */
    srv_req_suspend(r);
    return 0;
}

static void stream_put(struct srv_req *r, const char *s, size_t len)
{
    struct srv_cmpl *c = r->cmpl;
    if (c->dropped)
        return;
    if (!srv_buf_put(&c->out, s, len))
        inf_log(ERROR, "req=%s out of memory queueing stream data", srv_req_short_id(r));
}

static void stream_chunk(struct srv_req *r, uint32_t index, const char *text, size_t len,
                         const struct api_logprobs *lp, enum api_finish finish)
{
    struct srv_cmpl *c = r->cmpl;
    struct api_choice ch = {
        .index = index, .text = {text ? text : "", len}, .logprobs = lp, .finish = finish};
    char *out = NULL;
    size_t out_len = 0;
    if (api_chunk_encode(&c->head, &ch, &c->scratch, &out, &out_len, NULL) == INF_OK)
        stream_put(r, out, out_len);
    c->choices[index].chars_sent += api_utf8_chars(text ? text : "", len);
}

static void stream_end(struct srv_req *r)
{
    struct srv_cmpl *c = r->cmpl;
    if (c->req.include_usage) {
        struct api_usage u = {c->prompt_tokens, c->completion_tokens};
        char *out = NULL;
        size_t len = 0;
        if (api_chunk_usage_encode(&c->head, &u, &c->scratch, &out, &len, NULL) == INF_OK)
            stream_put(r, out, len);
    }
    stream_put(r, API_SSE_DONE, strlen(API_SSE_DONE));
    c->out_end = true;
}

static void stream_error(struct srv_req *r, inf_status_t st, const char *msg)
{
    struct srv_cmpl *c = r->cmpl;
    char *body = NULL;
    size_t len = 0;
    if (api_error_encode(st, msg, NULL, NULL, &c->scratch, &body, &len, NULL) == INF_OK) {
        stream_put(r, "data: ", 6);
        stream_put(r, body, len);
        stream_put(r, "\n\n", 2);
    }
    stream_put(r, API_SSE_DONE, strlen(API_SSE_DONE));
    c->out_end = true;
}

/* ---- cancel ------------------------------------------------------------------------------- */
void srv_cmpl_cancel(struct srv_req *r, const char *why)
{
    struct srv_cmpl *c = r->cmpl;
    if (!c || r->cancelled)
        return;
    r->cancelled = true;
    inf_log(INFO, "req=%s %s: cancelling", srv_req_short_id(r), why);
    for (uint32_t i = 0; i < c->n_subs; i++)
        if (c->subs[i].submitted && !c->subs[i].done)
            eng_request_cancel(r->srv->eng, c->subs[i].id);
}

/* A streamed request whose client left more than out_allow bytes unread:
 * cancel it in the engine and close the connection, rather than buffer
 * without bound (as a proxy drops a client that stopped reading). */
static void stream_check_backlog(struct srv_req *r)
{
    struct srv_cmpl *c = r->cmpl;
    size_t unsent = c->out.len - c->out_off;
    if (c->dropped || unsent <= c->out_allow)
        return;
    inf_log(WARN, "req=%s client too slow: %zu bytes unread, over the limit of %zu: closing",
            srv_req_short_id(r), unsent, c->out_allow);
    c->dropped = true;
    srv_buf_free(&c->out);
    c->out_off = 0;
    srv_cmpl_cancel(r, "client too slow");
    srv_req_close(r);
}

/* ---- the final answer ---------------------------------------------------------------------- */
static void respond_final(struct srv_req *r)
{
    struct srv_cmpl *c = r->cmpl;
    struct inf_arena *a = &c->scratch;
    struct api_choice *chs = inf_arena_calloc(a, c->n_choices, sizeof *chs);
    struct api_logprobs *lps = inf_arena_calloc(a, c->n_choices, sizeof *lps);
    if (!chs || !lps)
        goto nomem;
    for (uint32_t i = 0; i < c->n_choices; i++) {
        struct srv_choice *ch = &c->choices[i];
        const struct api_text *echo = c->req.echo ? &c->echo[i / c->req.n] : NULL;
        chs[i].index = i;
        chs[i].finish = to_api_finish(ch->finish);
        if (echo && echo->len) {
            char *t = inf_arena_alloc(a, echo->len + ch->text.len + 1);
            if (!t)
                goto nomem;
            memcpy(t, echo->s, echo->len);
            if (ch->text.len)
                memcpy(t + echo->len, ch->text.p, ch->text.len);
            t[echo->len + ch->text.len] = '\0';
            chs[i].text = (struct api_text){t, echo->len + ch->text.len};
        } else {
            chs[i].text = (struct api_text){ch->text.p ? ch->text.p : "", ch->text.len};
        }
        if (c->req.logprobs >= 0) {
            uint32_t off0 = echo ? (uint32_t)api_utf8_chars(echo->s, echo->len) : 0;
            const struct srv_prompt_lp *pl = echo ? &c->plp[i / c->req.n] : NULL;
            lps[i].tokens = ch->lp;
            lps[i].n_tokens = ch->n_lp;
            lps[i].text_offset0 = off0;
            if (pl && pl->toks) {
                /* The prompt's tokens, then the generated ones after the echo. */
                uint32_t total = pl->n + ch->n_lp;
                struct api_token_logprob *all = inf_arena_calloc(a, total, sizeof *all);
                uint32_t *offs = inf_arena_calloc(a, total, sizeof *offs);
                if (!all || !offs)
                    goto nomem;
                memcpy(all, pl->toks, pl->n * sizeof *all);
                memcpy(offs, pl->offs, pl->n * sizeof *offs);
                uint64_t off = off0;
                for (uint32_t k = 0; k < ch->n_lp; k++) {
                    all[pl->n + k] = ch->lp[k];
                    offs[pl->n + k] = (uint32_t)off;
                    off += api_utf8_chars(ch->lp[k].token.s, ch->lp[k].token.len);
                }
                lps[i].tokens = all;
                lps[i].n_tokens = total;
                lps[i].text_offsets = offs;
            }
            chs[i].logprobs = &lps[i];
        }
    }
    struct api_usage u = {c->prompt_tokens, c->completion_tokens};
    char *body = NULL;
    size_t len = 0;
    if (api_completion_encode(&c->head, chs, c->n_choices, &u, a, &body, &len, NULL) != INF_OK)
        goto nomem;
    srv_req_respond_body(r, 200, "application/json", body, len);
    inf_arena_reset(a);
    return;
nomem:
    inf_arena_reset(a);
    srv_req_respond_error(r, 500, INF_E_NOMEM, NULL, NULL, "out of memory");
}

static void observe_done(struct srv_req *r, const struct eng_event *ev)
{
    struct srv_server *s = r->srv;
    struct srv_cmpl *c = r->cmpl;
    double wait = (double)(c->submit_ns - r->arrival_ns) / 1e9;
    srv_hist_observe(&s->metrics.queue, (double)ev->queue_ns / 1e9);
    if (ev->completion_tokens > 0)
        srv_hist_observe(&s->metrics.ttft, wait + (double)ev->ttft_ns / 1e9);
    /* Inter-token latency: the time after the first token, spread over the
     * tokens that followed it, one observation per token (per choice). */
    double total = (double)(inf_now_ns() - c->submit_ns) / 1e9;
    double after = total - (double)ev->ttft_ns / 1e9;
    int32_t per_choice = c->req.n ? ev->completion_tokens / (int32_t)c->req.n : 0;
    if (per_choice > 1 && after > 0) {
        double itl = after / (double)(per_choice - 1);
        for (int32_t k = 0; k < (per_choice - 1) * (int32_t)c->req.n; k++)
            srv_hist_observe(&s->metrics.itl, itl);
    }
}

static void finish_request(struct srv_req *r)
{
    struct srv_server *s = r->srv;
    struct srv_cmpl *c = r->cmpl;
    r->in_engine = false;
    s->n_in_engine--;
    for (uint32_t i = 0; i < c->n_subs; i++)
        srv_sub_unregister(s, &c->subs[i]);
    srv_hist_observe(&s->metrics.e2e, (double)(inf_now_ns() - r->arrival_ns) / 1e9);
    if (!c->over) {
        c->over = true;
        for (uint32_t i = 0; i < c->n_choices; i++) {
            enum eng_finish f = c->choices[i].finish;
            if (f == ENG_FINISH_NONE)
                f = ENG_FINISH_ABORT;
            s->metrics.success[f]++;
        }
        if (c->stream) {
            stream_end(r);
            srv_req_resume(r);
        } else {
            respond_final(r);
        }
    }
    inf_log(DEBUG, "req=%s finished: %u prompt, %u completion tokens", srv_req_short_id(r),
            c->prompt_tokens, c->completion_tokens);
    srv_req_maybe_free(r);
    if (s->draining)
        srv_daemon_check_drained(s);
}

/* ENG_EV_PROMPT: keep the prompt's logprobs for the final answer, or
 * stream the echo of every choice of this prompt with them. */
static void prompt_logprobs(struct srv_sub *sub, const struct eng_event *ev)
{
    struct srv_req *r = sub->r;
    struct srv_cmpl *c = r->cmpl;
    struct srv_server *s = r->srv;
    struct srv_prompt_lp *pl = &c->plp[sub->index];
    const struct api_text *echo = &c->echo[sub->index];
    uint32_t n = (uint32_t)ev->n_tokens;
    struct api_token_logprob *toks = inf_arena_calloc(&c->arena, n, sizeof *toks);
    if (!toks) {
        inf_log(ERROR, "req=%s out of memory for the prompt's logprobs", srv_req_short_id(r));
        return;
    }
    for (uint32_t k = 0; k < n; k++)
        if (!fill_logprob(s, &ev->tokens[k], &toks[k], &c->arena))
            return;
    bool text = c->req.prompts[sub->index].text.s != NULL;
    uint32_t lead = text && c->req.add_special_tokens ? added_lead(s, ev->tokens, n) : 0;
    uint32_t *offs = prompt_offsets(s, ev->tokens, toks, n, lead,
                                    (uint32_t)api_utf8_chars(echo->s, echo->len), &c->arena);
    if (!offs)
        return;
    pl->toks = toks;
    pl->offs = offs;
    pl->n = n;
    if (!c->stream)
        return;
    struct api_logprobs lp = {toks, n, 0, offs};
    for (uint32_t j = 0; j < c->req.n; j++) {
        uint32_t idx = sub->index * c->req.n + j;
        if (c->choices[idx].echo_sent)
            continue;
        stream_chunk(r, idx, echo->s, echo->len, &lp, API_FINISH_NONE);
        c->choices[idx].echo_sent = true;
    }
    inf_arena_reset(&c->scratch);
    stream_check_backlog(r);
    srv_req_resume(r);
}

void srv_cmpl_event(struct srv_sub *sub, struct eng_event *ev)
{
    struct srv_req *r = sub->r;
    struct srv_cmpl *c = r->cmpl;
    struct srv_server *s = r->srv;
    if (sub->done)
        return;
    switch (ev->kind) {
    case ENG_EV_DELTA: {
        if (ev->choice < 0 || (uint32_t)ev->choice >= c->req.n)
            break;
        uint32_t idx = sub->index * c->req.n + (uint32_t)ev->choice;
        struct srv_choice *ch = &c->choices[idx];
        if (ev->finish != ENG_FINISH_NONE)
            ch->finish = ev->finish;
        if (c->over || c->dropped)
            break;
        bool want_lp = c->req.logprobs >= 0 && ev->tokens && ev->n_tokens > 0;
        if (c->stream && c->req.echo && !ch->echo_sent) {
            /* The prompt was not scored (cancelled before it was): echo
             * its text alone. */
            const struct api_text *e = &c->echo[sub->index];
            stream_chunk(r, idx, e->s, e->len, NULL, API_FINISH_NONE);
            ch->echo_sent = true;
        }
        if (c->stream) {
            struct api_logprobs lp = {0};
            struct api_token_logprob *toks = NULL;
            if (want_lp) {
                toks = inf_arena_calloc(&c->scratch, (size_t)ev->n_tokens, sizeof *toks);
                for (int32_t k = 0; toks && k < ev->n_tokens; k++)
                    fill_logprob(s, &ev->tokens[k], &toks[k], &c->scratch);
                lp.tokens = toks;
                lp.n_tokens = toks ? (uint32_t)ev->n_tokens : 0;
                lp.text_offset0 = (uint32_t)ch->chars_sent;
            }
            if (ev->text_len || ev->finish != ENG_FINISH_NONE || want_lp)
                stream_chunk(r, idx, ev->text, ev->text_len, want_lp ? &lp : NULL,
                             to_api_finish(ev->finish));
            inf_arena_reset(&c->scratch);
            stream_check_backlog(r);
            srv_req_resume(r);
        } else {
            if (ev->text_len && !srv_buf_put(&ch->text, ev->text, ev->text_len))
                inf_log(ERROR, "req=%s out of memory", srv_req_short_id(r));
            if (want_lp) {
                if (ch->n_lp + (uint32_t)ev->n_tokens > ch->cap_lp) {
                    uint32_t cap = ch->cap_lp ? ch->cap_lp : 16;
                    while (cap < ch->n_lp + (uint32_t)ev->n_tokens)
                        cap *= 2;
                    struct api_token_logprob *p = realloc(ch->lp, cap * sizeof *p);
                    if (!p)
                        break;
                    ch->lp = p;
                    ch->cap_lp = cap;
                }
                for (int32_t k = 0; k < ev->n_tokens; k++)
                    if (fill_logprob(s, &ev->tokens[k], &ch->lp[ch->n_lp], &c->arena))
                        ch->n_lp++;
            }
        }
        break;
    }
    case ENG_EV_PROMPT:
        if (c->over || c->dropped || !c->req.echo || c->req.logprobs < 0 || !ev->tokens ||
            ev->n_tokens < 1)
            break;
        prompt_logprobs(sub, ev);
        break;
    case ENG_EV_DONE:
        sub->done = true;
        c->n_pending--;
        c->prompt_tokens += (uint32_t)ev->prompt_tokens;
        c->completion_tokens += (uint32_t)ev->completion_tokens;
        observe_done(r, ev);
        if (c->n_pending == 0)
            finish_request(r);
        break;
    case ENG_EV_ERROR:
        sub->done = true;
        c->n_pending--;
        s->metrics.errors_total++;
        inf_log(WARN, "req=%s engine error: %s", srv_req_short_id(r), ev->msg);
        if (!c->over) {
            c->over = true;
            if (c->stream) {
                stream_error(r, ev->status, ev->msg);
                srv_req_resume(r);
            } else {
                srv_req_respond_error(r, 0, ev->status, NULL, NULL, "%s", ev->msg);
            }
            srv_cmpl_cancel(r, "engine error on a sibling prompt");
        }
        if (c->n_pending == 0)
            finish_request(r);
        break;
    }
}

/* ---- the request ------------------------------------------------------------------------------
 */
static void respond_status(struct srv_req *r, inf_status_t st, const struct api_fault *f,
                           const struct inf_err *err)
{
    srv_req_respond_error(r, 0, st, f ? f->param : NULL, f ? f->code : NULL, "%s",
                          err && err->msg[0] ? err->msg : inf_status_str(st));
}

/* Tokenize prompt p (or copy its ids) into a malloc'd array.
 * Thread: a worker (prepare_work). */
static inf_status_t prompt_ids(struct srv_cmpl *c, const struct api_prompt *p, int32_t **ids,
                               int32_t *n, struct inf_err *err)
{
    if (!p->text.s) {
        *ids = malloc((size_t)p->n_ids * sizeof **ids);
        if (!*ids)
            return inf_err_set(err, INF_E_NOMEM, "out of memory");
        memcpy(*ids, p->ids, (size_t)p->n_ids * sizeof **ids);
        *n = (int32_t)p->n_ids;
        return INF_OK;
    }
    tok_tokenizer_t *tok = c->tok;
    if (!tok)
        return inf_err_set(err, INF_E_UNSUPPORTED,
                           "this model has no tokenizer: send the prompt as token ids");
    struct tok_ids out = {0};
    struct tok_encode_opts o = tok_encode_defaults();
    o.add_special = c->req.add_special_tokens;
    inf_status_t st = tok_encode(tok, p->text.s, p->text.len, &o, &out, err);
    if (st != INF_OK) {
        tok_ids_fini(&out);
        return st;
    }
    if (out.n == 0) {
        tok_ids_fini(&out);
        return inf_err_set(err, INF_E_INVALID, "the prompt is empty once tokenized");
    }
    if (out.n > INT32_MAX) {
        tok_ids_fini(&out);
        return inf_err_set(err, INF_E_CONTEXT, "the prompt is too long");
    }
    *ids = out.ids; /* the list's storage is a plain malloc'd array */
    *n = (int32_t)out.n;
    return INF_OK;
}

static struct eng_request *build_request(struct srv_req *r, const struct srv_sub *sub, int32_t *ids,
                                         int32_t n_ids, uint32_t max_new)
{
    struct srv_cmpl *c = r->cmpl;
    const struct api_completion_req *q = &c->req;
    struct eng_request *e = eng_request_create();
    if (!e)
        return NULL;
    e->id = sub->id;
    e->prompt = ids;
    e->n_prompt = n_ids;
    e->max_tokens = (int32_t)max_new;
    e->min_tokens = (int32_t)(q->min_tokens < max_new ? q->min_tokens : max_new);
    e->n = (int32_t)q->n;
    e->stream = q->stream;
    e->echo = q->echo;
    e->prompt_logprobs = q->echo && q->logprobs >= 0;
    struct eng_sampling *sp = &e->sampling;
    sp->temperature = q->temperature;
    sp->top_p = q->top_p;
    sp->top_k = q->top_k;
    sp->min_p = q->min_p;
    sp->presence_penalty = q->presence_penalty;
    sp->frequency_penalty = q->frequency_penalty;
    sp->repetition_penalty = q->repetition_penalty;
    sp->has_seed = q->has_seed;
    sp->seed = (uint64_t)q->seed;
    sp->logprobs = q->logprobs;
    sp->ignore_eos = q->ignore_eos;
    if (q->n_bias) {
        sp->logit_bias_ids = malloc(q->n_bias * sizeof *sp->logit_bias_ids);
        sp->logit_bias_vals = malloc(q->n_bias * sizeof *sp->logit_bias_vals);
        if (!sp->logit_bias_ids || !sp->logit_bias_vals)
            goto fail;
        memcpy(sp->logit_bias_ids, q->bias_ids, q->n_bias * sizeof *sp->logit_bias_ids);
        memcpy(sp->logit_bias_vals, q->bias_values, q->n_bias * sizeof *sp->logit_bias_vals);
        sp->n_logit_bias = (int32_t)q->n_bias;
    }
    for (uint32_t i = 0; i < q->n_stop && i < ENG_MAX_STOP; i++) {
        e->stop[i] = malloc(q->stop[i].len + 1);
        if (!e->stop[i])
            goto fail;
        memcpy(e->stop[i], q->stop[i].s, q->stop[i].len + 1);
        e->n_stop = (int32_t)i + 1;
    }
    return e;
fail:
    e->prompt = NULL; /* the caller still owns ids */
    eng_request_destroy(e);
    return NULL;
}

/* The prompt's text for echo: as sent, or the ids decoded. false when ids
 * cannot be decoded (no tokenizer). Thread: a worker (prepare_work). */
static bool echo_text(struct srv_cmpl *c, const struct api_prompt *p, struct api_text *out)
{
    *out = (struct api_text){"", 0};
    if (p->text.s) {
        *out = p->text;
        return true;
    }
    tok_tokenizer_t *tok = c->tok;
    char *txt = NULL;
    size_t len = 0;
    if (!tok || tok_decode(tok, p->ids, p->n_ids, false, &txt, &len, NULL) != INF_OK)
        return false;
    char *cp = inf_arena_strndup(&c->arena, txt, len);
    free(txt);
    if (!cp)
        return false;
    *out = (struct api_text){cp, len};
    return true;
}

/* Parse the body, tokenize every prompt and check it against the context,
 * decode id prompts for echo. Thread: a worker; it owns c's arena and
 * results until prepare_done. */
static void prepare_work(struct srv_work *w)
{
    struct srv_cmpl *c = (struct srv_cmpl *)((char *)w - offsetof(struct srv_cmpl, work));
    struct srv_req *r = w->r;
    struct inf_err *err = &c->prep_err;
    struct api_fault *fault = &c->prep_fault;
    c->prep_st = api_completion_parse(r->body.p ? r->body.p : "", r->body.len, &c->lim, &c->arena,
                                      &c->req, fault, err);
    if (c->prep_st != INF_OK)
        return;
    const struct api_completion_req *q = &c->req;
    c->pp = calloc(q->n_prompts, sizeof *c->pp);
    c->echo = inf_arena_calloc(&c->arena, q->n_prompts, sizeof *c->echo);
    if (!c->pp || !c->echo) {
        c->prep_st = inf_err_set(err, INF_E_NOMEM, "out of memory");
        return;
    }
    for (uint32_t i = 0; i < q->n_prompts; i++) {
        struct prep_prompt *p = &c->pp[i];
        c->prep_st = prompt_ids(c, &q->prompts[i], &p->ids, &p->n_ids, err);
        if (c->prep_st != INF_OK) {
            *fault = (struct api_fault){"prompt", NULL};
            return;
        }
        c->prep_st = api_check_context((uint32_t)p->n_ids, q->max_tokens, c->max_model_len,
                                       &p->max_new, fault, err);
        if (c->prep_st != INF_OK)
            return;
        if (q->echo && !echo_text(c, &q->prompts[i], &c->echo[i])) {
            c->prep_st = inf_err_set(err, INF_E_UNSUPPORTED,
                                     "echo of a token-id prompt needs the model's tokenizer");
            *fault = (struct api_fault){"echo", NULL};
            return;
        }
    }
}

static void prepare_done(struct srv_work *w);

void srv_cmpl_handle(struct srv_req *r)
{
    struct srv_server *s = r->srv;

    if (s->draining) {
        srv_req_respond_error(r, 503, INF_E_SHUTDOWN, NULL, NULL, "the server is shutting down");
        return;
    }
    struct srv_cmpl *c = calloc(1, sizeof *c);
    if (!c) {
        srv_req_respond_error(r, 500, INF_E_NOMEM, NULL, NULL, "out of memory");
        return;
    }
    r->cmpl = c;
    inf_arena_init(&c->arena, 8192);
    inf_arena_init(&c->scratch, 8192);
    api_limits_init(&c->lim, s->opt.model_name, (uint32_t)s->info.vocab,
                    (uint32_t)s->info.max_model_len);
    /* Every prompt takes a place in the engine's admission queue: more than
     * it holds could never be admitted together (a 429 would lie). */
    if (c->lim.max_prompts > (uint32_t)s->max_queue)
        c->lim.max_prompts = (uint32_t)s->max_queue;
    c->tok = server_tok(s);
    c->max_model_len = (uint32_t)s->info.max_model_len;
    srv_req_work(r, &c->work, prepare_work, prepare_done);
}

/* Back on the loop: answer a fault, or submit every prompt. */
static void prepare_done(struct srv_work *w)
{
    struct srv_cmpl *c = (struct srv_cmpl *)((char *)w - offsetof(struct srv_cmpl, work));
    struct srv_req *r = w->r;
    struct srv_server *s = r->srv;
    struct inf_err err = c->prep_err;
    struct api_fault fault = c->prep_fault;
    inf_status_t st = c->prep_st;

    if (r->client_gone)
        return; /* nobody waits: srv_cmpl_free releases what was made */
    if (st != INF_OK) {
        respond_status(r, st, &fault, &err);
        return;
    }
    if (s->draining) {
        srv_req_respond_error(r, 503, INF_E_SHUTDOWN, NULL, NULL, "the server is shutting down");
        return;
    }
    for (uint32_t i = 0; i < c->req.n_ignored; i++)
        inf_log(DEBUG, "req=%s ignoring unknown key \"%s\"", srv_req_short_id(r),
                c->req.ignored[i]);
    const struct api_completion_req *q = &c->req;
    c->stream = q->stream;
    c->n_subs = q->n_prompts;
    c->n_choices = q->n_prompts * q->n;
    c->subs = calloc(c->n_subs, sizeof *c->subs);
    c->choices = calloc(c->n_choices, sizeof *c->choices);
    c->plp = inf_arena_calloc(&c->arena, c->n_subs, sizeof *c->plp);
    if (!c->subs || !c->choices || !c->plp) {
        srv_req_respond_error(r, 500, INF_E_NOMEM, NULL, NULL, "out of memory");
        return;
    }
    c->head.id = srv_req_short_id(r); /* the encoder writes "cmpl-" itself */
    c->head.created = (int64_t)time(NULL);
    c->head.model = s->opt.model_name;

    struct eng_request **reqs = calloc(c->n_subs, sizeof *reqs);
    if (!reqs) {
        srv_req_respond_error(r, 500, INF_E_NOMEM, NULL, NULL, "out of memory");
        return;
    }
    for (uint32_t i = 0; i < c->n_subs; i++) {
        struct srv_sub *sub = &c->subs[i];
        sub->r = r;
        sub->index = i;
        sub->id = i == 0 ? r->id : ++s->next_id;
        reqs[i] = build_request(r, sub, c->pp[i].ids, c->pp[i].n_ids, c->pp[i].max_new);
        if (!reqs[i]) {
            st = inf_err_set(&err, INF_E_NOMEM, "out of memory");
            fault = (struct api_fault){0};
            goto fail;
        }
        c->pp[i].ids = NULL; /* the engine request owns them */
    }

    /* Submit. The engine owns each request it accepts. */
    c->submit_ns = inf_now_ns();
    for (uint32_t i = 0; i < c->n_subs; i++) {
        struct srv_sub *sub = &c->subs[i];
        srv_sub_register(s, sub);
        st = eng_request_submit(s->eng, reqs[i], &err);
        if (st != INF_OK) {
            srv_sub_unregister(s, sub);
            fault = (struct api_fault){0};
            if (st == INF_E_BUSY)
                snprintf(err.msg, sizeof err.msg,
                         "the server is busy (admission queue full): retry later");
            goto fail_submitted;
        }
        reqs[i] = NULL;
        sub->submitted = true;
        c->n_pending++;
    }
    free(reqs);
    r->in_engine = true;
    s->n_in_engine++;
    inf_log(DEBUG, "req=%s submitted: %u prompt(s), n=%u, stream=%d", srv_req_short_id(r),
            c->n_subs, q->n, (int)q->stream);

    if (!c->stream) {
        srv_req_suspend(r);
        return;
    }
    /* Echo now, unless the prompt's logprobs are to come with it. */
    if (q->echo && q->logprobs < 0)
        for (uint32_t i = 0; i < c->n_choices; i++) {
            const struct api_text *e = &c->echo[i / q->n];
            if (e->len)
                stream_chunk(r, i, e->s, e->len, NULL, API_FINISH_NONE);
            c->choices[i].echo_sent = true;
        }
    inf_arena_reset(&c->scratch);
    c->out_allow = STREAM_BUFFER_MAX + c->out.len;
    struct MHD_Response *resp =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, STREAM_BLOCK, stream_read, r, NULL);
    if (resp) {
        MHD_add_response_header(resp, "Content-Type", "text/event-stream");
        MHD_add_response_header(resp, "Cache-Control", "no-cache");
    }
    srv_req_respond(r, 200, resp);
    return;

fail_submitted:
    /* Some prompts are in the engine: cancel them; the error answers now and
     * the request lives on until their last events. */
    c->over = true;
    respond_status(r, st, &fault, &err);
    if (c->n_pending) {
        r->in_engine = true;
        s->n_in_engine++;
        srv_cmpl_cancel(r, "a sibling prompt was refused");
    }
    for (uint32_t i = 0; i < c->n_subs; i++)
        eng_request_destroy(reqs[i]);
    free(reqs);
    return;
fail:
    respond_status(r, st, &fault, &err);
    for (uint32_t i = 0; i < c->n_subs; i++)
        eng_request_destroy(reqs[i]);
    free(reqs);
}
