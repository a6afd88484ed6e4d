/* engine/sched/scheduler_output.c — the output side of the scheduler: what a
 * sampled token becomes (recorded, detokenized, checked against the ends),
 * the events that carry it, and the prompt's logprobs. The state is
 * engine/sched/scheduler_state.h's; the planning and the step are
 * engine/sched/scheduler.c's.
 *
 * Text. Each choice detokenizes incrementally. Text that could still be the
 * start of a stop string is held back; a stop string found ends the choice
 * and neither it nor anything after it is returned (OpenAI). Stop strings and
 * EOS count only once min_tokens tokens exist (EOS is masked before). Streaming
 * choices get a DELTA whenever text is released (or tokens with logprobs);
 * others one DELTA at their end. DONE follows the last choice's final DELTA.
 *
 * Prompt logprobs (eng_request.prompt_logprobs). While choice 0 prefills, the
 * batch also wants logits at every prompt position p < n_prompt - 1 not yet
 * scored (row p scores prompt[p+1]); they are turned into raw log-softmax
 * logprobs with top-n at once, and the whole list goes out in one
 * ENG_EV_PROMPT event just before the request's first token is sampled. The
 * logits buffer holds PROMPT_ROWS such rows per step beyond the one row per
 * sequence, so a scored prefill advances at most PROMPT_ROWS positions a step
 * (the oldest scored prefill first); a recompute after preemption scores
 * nothing again. */
#define INF_LOG_MODULE "eng"
#include "engine/sched/scheduler_state.h"
#include "engine/backend.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- byte strings -------------------------------------------------------------- */
inf_status_t eng_strbuf_append(struct eng_strbuf *sb, const char *s, size_t n)
{
    if (!inf_grow(&sb->p, &sb->cap, sb->len + n + 1, 32))
        return INF_E_NOMEM;
    if (n)
        memcpy(sb->p + sb->len, s, n);
    sb->len += n;
    sb->p[sb->len] = '\0';
    return INF_OK;
}

void eng_strbuf_fini(struct eng_strbuf *sb)
{
    free(sb->p);
    sb->p = NULL;
    sb->len = sb->cap = 0;
}

/* ---- events -------------------------------------------------------------------------- */
static void emit(eng_sched_t *s, struct eng_event *ev)
{
    s->emit(s->user, ev);
}

/* A DELTA carrying text[sent..end) and the pending tokens. */
static inf_status_t emit_delta(eng_sched_t *s, struct sreq *r, int32_t ci, size_t end,
                               enum eng_finish fin)
{
    struct choice *c = &r->ch[ci];
    struct eng_event *ev = calloc(1, sizeof *ev);
    if (!ev)
        return INF_E_NOMEM;
    size_t n = end - c->sent;
    ev->text = malloc(n + 1);
    if (!ev->text) {
        free(ev);
        return INF_E_NOMEM;
    }
    if (n)
        memcpy(ev->text, c->text.p + c->sent, n);
    ev->text[n] = '\0';
    ev->text_len = n;
    ev->kind = ENG_EV_DELTA;
    ev->req_id = r->req->id;
    ev->choice = ci;
    ev->finish = fin;
    ev->n_tokens = c->n_pend;
    ev->tokens = c->pend; /* ownership moves to the event */
    c->pend = NULL;
    c->n_pend = c->cap_pend = 0;
    c->sent = end;
    emit(s, ev);
    return INF_OK;
}

static void emit_done(eng_sched_t *s, struct sreq *r)
{
    struct eng_event *ev = calloc(1, sizeof *ev);
    if (!ev) {
        inf_log(ERROR, "req=%llu out of memory for its final event",
                (unsigned long long)r->req->id);
        return;
    }
    uint64_t now = inf_now_ns();
    ev->kind = ENG_EV_DONE;
    ev->req_id = r->req->id;
    ev->prompt_tokens = r->req->n_prompt;
    for (int32_t i = 0; i < r->req->n; i++)
        ev->completion_tokens += r->ch[i].n_gen;
    ev->queue_ns = (r->started ? r->t_first_sched : now) - r->t_submit;
    ev->ttft_ns = r->t_first_token ? r->t_first_token - r->t_submit : 0;
    emit(s, ev);
}

void eng_sched_mark_dequeued(eng_sched_t *s, struct sreq *r)
{
    if (!r->started) {
        r->started = true;
        r->t_first_sched = inf_now_ns();
        s->dequeued++;
    }
}

/* End the whole request with an ERROR event (no further DELTA). */
void eng_sched_req_error(eng_sched_t *s, struct sreq *r, inf_status_t code, const char *msg)
{
    eng_sched_mark_dequeued(s, r);
    struct eng_event *ev = calloc(1, sizeof *ev);
    if (ev) {
        ev->kind = ENG_EV_ERROR;
        ev->req_id = r->req->id;
        ev->status = code;
        snprintf(ev->msg, sizeof ev->msg, "%s", msg);
        emit(s, ev);
    } else {
        inf_log(ERROR, "req=%llu out of memory for its error event",
                (unsigned long long)r->req->id);
    }
    eng_sched_req_free(s, r);
}

/* End choice ci with fin: final DELTA with everything not yet sent; DONE and
 * the request freed after the last choice. Returns true when r was freed.
 * When the DELTA cannot be built (out of memory) r is only marked failed and
 * true is not returned: the caller may be in the middle of a step whose list
 * still holds r's other sequences, so r is ended by the step's end (or by
 * eng_sched_cancel, outside a step). */
bool eng_sched_choice_end(eng_sched_t *s, struct sreq *r, int32_t ci, enum eng_finish fin)
{
    struct choice *c = &r->ch[ci];
    if (c->ended)
        return false;
    if (c->seq)
        eng_sched_seq_drop(s, c->seq);
    c->ended = true;
    c->finish = fin;
    if (emit_delta(s, r, ci, c->text.len, fin) != INF_OK) {
        r->failed = INF_E_NOMEM;
        return false;
    }
    if (--r->n_open == 0) {
        emit_done(s, r);
        eng_sched_req_free(s, r);
        return true;
    }
    return false;
}

/* ---- text and stop strings -------------------------------------------------------- */
/* Bytes at the end of text[sent..) that are a proper prefix of some stop
 * string, and so cannot be released yet. */
static size_t stop_holdback(const struct sreq *r, const struct choice *c)
{
    const struct eng_request *req = r->req;
    size_t avail = c->text.len - c->sent, hold = 0;
    for (int32_t i = 0; i < req->n_stop; i++) {
        size_t sl = r->stop_len[i];
        for (size_t k = sl - 1 < avail ? sl - 1 : avail; k > hold; k--) {
            if (memcmp(c->text.p + c->text.len - k, req->stop[i], k) == 0) {
                hold = k;
                break;
            }
        }
    }
    return hold;
}

/* Earliest stop string starting at or after sent and ending after min_mark:
 * its offset, or -1. When there is none, later searches look, for each stop
 * string, only where it could end in text added since, so a token costs its
 * new text and not the whole text again. */
static int64_t stop_find(const struct sreq *r, struct choice *c)
{
    const struct eng_request *req = r->req;
    int64_t best = -1;
    if (!c->text.p)
        return -1;
    for (int32_t i = 0; i < req->n_stop; i++) {
        size_t sl = r->stop_len[i];
        size_t from = c->sent;
        if (c->searched >= sl && c->searched - sl + 1 > from)
            from = c->searched - sl + 1;
        if (c->min_mark >= sl && c->min_mark - sl + 1 > from)
            from = c->min_mark - sl + 1;
        if (from >= c->text.len || c->text.len - from < sl)
            continue;
        const char *hay = c->text.p + from;
        const char *hit = memmem(hay, c->text.len - from, req->stop[i], sl);
        if (hit) {
            int64_t at = (int64_t)from + (hit - hay);
            if (best < 0 || at < best)
                best = at;
        }
    }
    if (best < 0)
        c->searched = c->text.len;
    return best;
}

static bool is_eos(const struct eng_lm *lm, int32_t tok)
{
    for (int32_t i = 0; i < lm->n_eos; i++)
        if (lm->eos_ids[i] == tok)
            return true;
    return false;
}

/* tok was sampled for sequence q: record it, detokenize, check the ends,
 * send events. */
static inf_status_t on_token(eng_sched_t *s, struct seq *q, int32_t tok,
                             const struct eng_token_info *info)
{
    struct sreq *r = q->r;
    const struct eng_request *req = r->req;
    int32_t ci = q->choice;
    struct choice *c = &r->ch[ci];
    inf_status_t st;

    INF_ASSERT(q->len < q->cap);
    q->tok[q->len++] = tok;
    c->n_gen++;
    s->stats.generation_tokens_total++;
    if (!r->t_first_token)
        r->t_first_token = inf_now_ns();

    if (c->n_pend == c->cap_pend) {
        int32_t cap = c->cap_pend ? c->cap_pend * 2 : 8;
        struct eng_token_info *p = realloc(c->pend, sizeof *p * (size_t)cap);
        if (!p)
            return INF_E_NOMEM;
        c->pend = p;
        c->cap_pend = cap;
    }
    c->pend[c->n_pend++] = *info;

    enum eng_finish fin = ENG_FINISH_NONE;
    if (is_eos(s->lm, tok) && !req->sampling.ignore_eos) {
        fin = ENG_FINISH_STOP;
    } else {
        st = s->detok->push(c->detok, tok, &c->text);
        if (st != INF_OK)
            return st;
        if (c->n_gen >= req->max_tokens || q->len >= s->cfg.max_model_len)
            fin = ENG_FINISH_LENGTH;
    }
    if (fin != ENG_FINISH_NONE) {
        st = s->detok->flush(c->detok, &c->text);
        if (st != INF_OK)
            return st;
    }
    if (c->n_gen < req->min_tokens)
        c->min_mark = c->text.len;
    else if (req->n_stop > 0) {
        int64_t at = stop_find(r, c);
        if (at >= 0) {
            c->text.len = (size_t)at;
            c->text.p[at] = '\0';
            fin = ENG_FINISH_STOP;
        }
    }
    if (fin != ENG_FINISH_NONE) {
        eng_sched_choice_end(s, r, ci, fin);
        return INF_OK;
    }
    if (req->stream) {
        size_t end = c->text.len - stop_holdback(r, c);
        if (end > c->sent || (req->sampling.logprobs >= 0 && c->n_pend > 0))
            return emit_delta(s, r, ci, end, ENG_FINISH_NONE);
    }
    return INF_OK;
}

/* Take pick as the next token of q. A pick of -1 (every token excluded)
 * answers INF_E_INVALID. */
inf_status_t eng_sched_accept_pick(eng_sched_t *s, struct seq *q, const struct eng_sample_out *pick)
{
    struct sreq *r = q->r;
    struct choice *c = &r->ch[q->choice];
    if (pick->token < 0)
        return INF_E_INVALID;
    eng_sampler_accept(c->smp, pick->token);
    struct eng_token_info info = {.id = pick->token};
    if (r->req->sampling.logprobs >= 0) {
        info.logprob = pick->logprob;
        for (int32_t i = 0; i < pick->n_top && i < 5; i++) {
            info.top_ids[i] = pick->top_ids[i];
            info.top_logprobs[i] = pick->top_logprobs[i];
            info.n_top = i + 1;
        }
    }
    return on_token(s, q, pick->token, &info);
}

/* Sample the next token of q on the host from row (which may be edited: EOS
 * is masked while min_tokens is not reached) and take it. */
inf_status_t eng_sched_sample_accept(eng_sched_t *s, struct seq *q, float *row)
{
    struct sreq *r = q->r;
    struct choice *c = &r->ch[q->choice];
    if (c->n_gen < r->req->min_tokens)
        for (int32_t i = 0; i < s->lm->n_eos; i++)
            row[s->lm->eos_ids[i]] = -INFINITY;
    struct eng_sample pick;
    inf_status_t st = eng_sampler_sample(c->smp, row, &pick, NULL);
    if (st != INF_OK)
        return st;
    struct eng_sample_out o = {.token = pick.token, .logprob = pick.logprob, .n_top = pick.n_top};
    for (int32_t i = 0; i < pick.n_top && i < ENG_SAMPLE_TOP; i++) {
        o.top_ids[i] = pick.top_ids[i];
        o.top_logprobs[i] = pick.top_logprobs[i];
    }
    return eng_sched_accept_pick(s, q, &o);
}

/* The prefill of choice 0 of an n > 1 request has ended: start choices
 * 1..n-1 sharing the full prompt blocks, and sample every first token from
 * row on the host, or take picks[j] for choice j (sampled on the device).
 * Returns an error only for out of memory (the caller ends r). */
/* ---- prompt logprobs ------------------------------------------------------------------- */
/* Logits rows q's chunk at [c0, c0 + chunk) needs to score prompt tokens:
 * positions from max(c0, n_plp) up to n_prompt - 1 (excluded), of choice 0
 * only. */
int32_t eng_sched_plp_rows(const struct seq *q, int32_t c0, int32_t chunk)
{
    const struct sreq *r = q->r;
    if (!r->want_plp || q->choice != 0)
        return 0;
    int32_t lo = c0 > r->n_plp ? c0 : r->n_plp;
    int32_t hi = c0 + chunk < r->req->n_prompt - 1 ? c0 + chunk : r->req->n_prompt - 1;
    return hi > lo ? hi - lo : 0;
}

/* chunk, shortened so that its scoring rows fit in what the step has left
 * (0 when nothing fits). */
int32_t eng_sched_plp_clamp(const eng_sched_t *s, const struct seq *q, int32_t chunk)
{
    if (eng_sched_plp_rows(q, q->n_computed, chunk) <= s->plp_left)
        return chunk;
    int32_t lo = q->n_computed > q->r->n_plp ? q->n_computed : q->r->n_plp;
    return lo + s->plp_left - q->n_computed;
}

/* Score prompt[p + 1] from the logits row lg read at position p: raw
 * log-softmax and the top alternatives, as the sampler reports them for
 * generated tokens (most likely first, lowest id on ties). */
void eng_sched_plp_score(const eng_sched_t *s, struct sreq *r, int32_t p, const float *lg)
{
    int32_t V = s->lm->vocab, tok = r->req->prompt[p + 1];
    const double lse = eng_sampler_log_sum_exp(lg, V);
    struct eng_token_info *ti = &r->plp[p + 1];
    memset(ti, 0, sizeof *ti);
    ti->id = tok;
    ti->logprob = (float)((double)lg[tok] - lse);
    int32_t k = r->req->sampling.logprobs;
    if (k > 5)
        k = 5;
    if (k > V)
        k = V;
    for (int32_t i = 0; i < k; i++) {
        int32_t best = -1;
        for (int32_t v = 0; v < V; v++) {
            bool taken = false;
            for (int32_t j = 0; j < i && !taken; j++)
                taken = ti->top_ids[j] == v;
            if (!taken && (best < 0 || lg[v] > lg[best]))
                best = v;
        }
        ti->top_ids[i] = best;
        ti->top_logprobs[i] = (float)((double)lg[best] - lse);
    }
    ti->n_top = k;
}

/* Send r's prompt logprobs (all scored by now). Errors: INF_E_NOMEM. */
inf_status_t eng_sched_emit_prompt(eng_sched_t *s, struct sreq *r)
{
    INF_ASSERT(r->n_plp == r->req->n_prompt - 1);
    struct eng_event *ev = calloc(1, sizeof *ev);
    if (!ev)
        return INF_E_NOMEM;
    ev->kind = ENG_EV_PROMPT;
    ev->req_id = r->req->id;
    ev->choice = 0;
    ev->n_tokens = r->req->n_prompt;
    ev->tokens = r->plp; /* ownership moves to the event */
    r->plp = NULL;
    r->plp_sent = true;
    emit(s, ev);
    return INF_OK;
}
