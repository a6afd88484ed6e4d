/* engine/sched/scheduler.c — iteration-level (continuous) batching over a paged KV
 * cache.
 *
 * Model. A request has n choices; each live choice is one sequence: its
 * tokens (prompt + generated), how many of them have KV (n_computed) and its
 * block table. Every step runs, for each scheduled sequence, the chunk
 * tokens[n_computed .. n_computed+chunk); when the chunk reaches the end of
 * the tokens the last one gets logits and a new token is sampled. A decode is
 * simply a chunk of one token; chunked prefill is a long prompt taken a budget
 * at a time.
 *
 * Each step:
 *   1. running sequences, oldest first: decodes (one token each), then the
 *      running prefills in chunks, within max_batched_tokens;
 *   2. when a running sequence needs a KV block and none is free, the newest
 *      running sequence not yet scheduled in this step is preempted: its
 *      blocks are freed, it keeps its generated tokens and goes back to the
 *      front of the waiting queue, and is recomputed (prompt + generated) when
 *      readmitted. If it is itself the newest, it preempts itself. Requests
 *      are never dropped for lack of blocks;
 *   3. if nothing was preempted, waiting sequences are admitted from the front
 *      while the budget, max_batch and free blocks allow (their first chunk
 *      must fit in the free blocks, less a watermark of 1% of the pool kept
 *      for the running decodes);
 *   4. one model forward; sampling, detokenization, stop checks, events.
 *
 * Blocks. The pool is engine/sched/kv_cache.h's, used through its block calls
 * (reference-counted blocks); the scheduler keeps each sequence's block list
 * itself, since a sequence holds blocks only while running. Slot k of a step's
 * batch is the k-th sequence scheduled in it; its block_table row is that
 * sequence's block list.
 *
 * Sliding window (lm->window > 0). A query sees only the last window
 * positions, so the blocks wholly before the first key of a sequence's
 * next token are released as the sequence advances (seq_trim, before the
 * sequence grows in a step): a decoding sequence holds at most
 * ceil(window / ENG_KV_BLOCK) + 1 blocks (one more while a step is queued
 * ahead of the one in flight), a prefill chunk of c tokens about
 * (window + c) / ENG_KV_BLOCK + 1. Its block list keeps their places, -1 (the
 * attention never reads them). The blocks released are only those no step
 * in flight reads (before the first key of the token in flight), so
 * another sequence may take them at once. With the prefix cache, committed
 * blocks released this way stay cached like any block nobody holds (a
 * later request with the same head still finds the whole chain until they
 * are evicted), and the parent of the next block to commit stays held so
 * that the chain can go on; a preempted sequence recomputes from its
 * first position, or from its cached head, as without a window. Before
 * the fork of n > 1 choices, the blocks the children recompute from stay
 * held.
 *
 * Prefix cache (cfg.prefix_caching). A sequence admitted without blocks
 * (new, or back after preemption) first holds the longest run of committed
 * blocks its tokens start with, and its prefill starts after them; after
 * every step the blocks its computed positions fill are committed, prompt
 * and generated tokens alike, so the next request with the same head, a
 * second turn, or the sequence itself after a preemption, skips them. The
 * last token is always computed, for its logits; a request that scores its
 * prompt computes every position it scores. Nothing is ever written into a
 * committed or shared block (asserted for every token a step writes):
 * positions are written only past the committed run, into blocks of the
 * sequence's own.
 *
 * n > 1. The prompt is prefilled once (choice 0, which reserves n of the
 * max_batch slots). When its prefill ends, choices 1..n-1 are forked: they
 * share the prompt's full blocks (reference counted, read-only) and recompute
 * the last partial block (at most ENG_KV_BLOCK-1 prompt tokens) into a block of
 * their own, so no block is ever written by two sequences and no block copy
 * is needed. All n first tokens are sampled from the same logits, each with
 * its own RNG. A preempted choice recomputes alone into its own blocks.
 *
 * Sampling. One engine/sched/sampler.h sampler per choice (its own xoshiro256**
 * stream): choice i of a request with seed S samples with seed S + i; a
 * request without a seed gets S from the engine's base seed and a counter.
 * Greedy and seeded outputs do not depend on what else is in the batch.
 *
 * Text, stop strings, events and prompt logprobs: engine/sched/scheduler_output.c. */
#define INF_LOG_MODULE "eng"
#include "engine/sched/scheduler_state.h"
#include "engine/backend.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- blocks -------------------------------------------------------------------- */
/* Last block first, so that of a sequence's cached blocks its tail is
 * evicted first and its head, which more requests share, last. */
static void seq_release_blocks(eng_sched_t *s, struct seq *q)
{
    while (q->n_blocks > q->n_freed)
        eng_kv_block_unref(s->kv, q->blocks[--q->n_blocks]);
    q->n_blocks = 0;
    q->n_freed = 0;
    q->n_computed = 0;
    q->n_cached = 0;
}

/* With a sliding window: release q's blocks wholly before the first key
 * its next token (at n_computed) sees, first to last, except the parent of
 * its next block to commit (prefix_commit needs it cached) and, before the
 * fork of n > 1 choices, those the children's recompute from the prompt's
 * last full block sees (fork_choices). Every step in flight reads q only
 * from that first key on. */
static void seq_trim(eng_sched_t *s, struct seq *q)
{
    const int32_t w = s->lm->window;
    if (w <= 0)
        return;
    int32_t from = q->n_computed;
    const struct sreq *r = q->r;
    if (!r->forked && r->req->n > 1) {
        int32_t f = r->req->n_prompt / ENG_KV_BLOCK * ENG_KV_BLOCK;
        from = from < f ? from : f;
    }
    int32_t keep = eng_attn_first_key(w, from) / ENG_KV_BLOCK;
    if (eng_kv_cache_prefix_on(s->kv) && q->n_cached > 0 && keep > q->n_cached - 1)
        keep = q->n_cached - 1;
    if (keep > q->n_blocks)
        keep = q->n_blocks;
    for (; q->n_freed < keep; q->n_freed++) {
        eng_kv_block_unref(s->kv, q->blocks[q->n_freed]);
        q->blocks[q->n_freed] = -1;
    }
}

/* Tokens q could add at its current blocks plus every free block. */
static int32_t seq_fit(const eng_sched_t *s, const struct seq *q)
{
    return q->n_blocks * ENG_KV_BLOCK - q->n_computed +
           eng_kv_cache_free_blocks(s->kv) * ENG_KV_BLOCK;
}

/* Give q the blocks for positions [0, upto). Caller checked seq_fit. */
static void seq_grow(eng_sched_t *s, struct seq *q, int32_t upto)
{
    int32_t need = (upto + ENG_KV_BLOCK - 1) / ENG_KV_BLOCK;
    INF_ASSERT(need <= s->max_blocks);
    while (q->n_blocks < need) {
        int32_t b = eng_kv_block_alloc(s->kv);
        INF_ASSERT(b >= 0);
        q->blocks[q->n_blocks++] = b;
    }
}

/* ---- prefix cache ------------------------------------------------------------------- */
/* q, holding no block, is being admitted: hold the longest run of cached
 * blocks its tokens start with, as its first blocks, so that its prefill
 * starts after them. At most (len - 1) / ENG_KV_BLOCK blocks, so that at
 * least the last token is computed for its logits (a prompt cached whole
 * recomputes its last block, into a block of its own); for a request that
 * scores its prompt, none past the positions already scored (none before
 * its first prefill), whose logits are wanted. */
static void prefix_attach(eng_sched_t *s, struct seq *q)
{
    INF_ASSERT(q->n_blocks == 0 && q->n_computed == 0);
    if (!eng_kv_cache_prefix_on(s->kv))
        return;
    int32_t max = (q->len - 1) / ENG_KV_BLOCK;
    const struct sreq *r = q->r;
    if (r->want_plp && !r->plp_sent && q->choice == 0 && r->n_plp / ENG_KV_BLOCK < max)
        max = r->n_plp / ENG_KV_BLOCK;
    int32_t parent = -1;
    while (q->n_blocks < max) {
        int32_t b = eng_kv_prefix_find(s->kv, parent, q->tok + (size_t)q->n_blocks * ENG_KV_BLOCK);
        if (b < 0)
            break;
        eng_kv_block_ref(s->kv, b);
        q->blocks[q->n_blocks++] = b;
        parent = b;
    }
    q->n_cached = q->n_blocks;
    q->n_computed = q->n_blocks * ENG_KV_BLOCK;
}

/* q's blocks that its computed positions fill are committed, in order
 * (each block's parent, the one before it, is committed already). A block
 * whose content another sequence committed first is exchanged for that
 * one: the step queued ahead may still read q's own copy, which is the same
 * data, and a later step that reuses the freed block runs after it. */
static void prefix_commit(eng_sched_t *s, struct seq *q)
{
    if (!eng_kv_cache_prefix_on(s->kv))
        return;
    while ((q->n_cached + 1) * ENG_KV_BLOCK <= q->n_computed) {
        int32_t k = q->n_cached;
        /* held (seq_trim keeps it): a released parent would start a chain */
        INF_ASSERT(k == 0 || q->blocks[k - 1] >= 0);
        int32_t parent = k > 0 ? q->blocks[k - 1] : -1;
        q->blocks[k] =
            eng_kv_prefix_commit(s->kv, q->blocks[k], parent, q->tok + (size_t)k * ENG_KV_BLOCK);
        q->n_cached++;
    }
}

/* The blocks that positions [from, from + n) of q are written into are q's
 * alone and not cached: a shared or committed block is never written. */
static void assert_private(const eng_sched_t *s, const struct seq *q, int32_t from, int32_t n)
{
    for (int32_t b = from / ENG_KV_BLOCK; b <= (from + n - 1) / ENG_KV_BLOCK; b++)
        INF_ASSERT(b < q->n_blocks && eng_kv_block_refs(s->kv, q->blocks[b]) == 1 &&
                   !eng_kv_block_cached(s->kv, q->blocks[b]));
}

/* ---- sequences and queues --------------------------------------------------------- */
static struct seq *seq_new(eng_sched_t *s, struct sreq *r, int32_t choice)
{
    const struct eng_request *req = r->req;
    struct seq *q = calloc(1, sizeof *q);
    if (!q)
        return NULL;
    int64_t cap = (int64_t)req->n_prompt + req->max_tokens;
    if (cap > s->cfg.max_model_len)
        cap = s->cfg.max_model_len;
    q->cap = (int32_t)cap;
    q->tok = malloc(sizeof *q->tok * (size_t)q->cap);
    q->blocks = malloc(sizeof *q->blocks * (size_t)s->max_blocks);
    if (!q->tok || !q->blocks) {
        free(q->tok);
        free(q->blocks);
        free(q);
        return NULL;
    }
    memcpy(q->tok, req->prompt, sizeof *q->tok * (size_t)req->n_prompt);
    q->len = req->n_prompt;
    q->r = r;
    q->choice = choice;
    q->reserve = 1;
    return q;
}

static void wait_push_front(eng_sched_t *s, struct seq *q)
{
    q->wprev = NULL;
    q->wnext = s->whead;
    if (s->whead)
        s->whead->wprev = q;
    else
        s->wtail = q;
    s->whead = q;
    s->n_waiting++;
}

static void wait_push_back(eng_sched_t *s, struct seq *q)
{
    q->wnext = NULL;
    q->wprev = s->wtail;
    if (s->wtail)
        s->wtail->wnext = q;
    else
        s->whead = q;
    s->wtail = q;
    s->n_waiting++;
}

static void wait_remove(eng_sched_t *s, struct seq *q)
{
    if (q->wprev)
        q->wprev->wnext = q->wnext;
    else
        s->whead = q->wnext;
    if (q->wnext)
        q->wnext->wprev = q->wprev;
    else
        s->wtail = q->wprev;
    q->wprev = q->wnext = NULL;
    s->n_waiting--;
}

static void running_remove(eng_sched_t *s, struct seq *q)
{
    for (int32_t i = 0; i < s->n_running; i++) {
        if (s->running[i] == q) {
            memmove(&s->running[i], &s->running[i + 1],
                    sizeof *s->running * (size_t)(s->n_running - i - 1));
            s->n_running--;
            s->reserved -= q->reserve;
            q->running = false;
            return;
        }
    }
    INF_ASSERT(!"sequence not running");
}

static void running_append(eng_sched_t *s, struct seq *q)
{
    INF_ASSERT(s->n_running < s->cfg.max_batch);
    s->running[s->n_running++] = q;
    s->reserved += q->reserve;
    q->running = true;
}

/* Remove q from wherever it is, free its blocks and itself. */
void eng_sched_seq_drop(eng_sched_t *s, struct seq *q)
{
    if (q->running)
        running_remove(s, q);
    else
        wait_remove(s, q);
    seq_release_blocks(s, q);
    /* A step queued ahead may still hold q: its row is discarded. Its KV
     * writes land in blocks freed here, which any later owner rewrites
     * after it (one stream: later steps run after it). */
    for (int32_t k = 0; k < s->n_ah; k++)
        if (s->ah_seq[k] == q)
            s->ah_seq[k] = NULL;
    q->r->ch[q->choice].seq = NULL;
    free(q->tok);
    free(q->blocks);
    free(q);
}

static void preempt(eng_sched_t *s, struct seq *q)
{
    inf_log(DEBUG, "req=%llu choice=%d preempted at %d tokens", (unsigned long long)q->r->req->id,
            q->choice, q->len);
    running_remove(s, q);
    seq_release_blocks(s, q);
    wait_push_front(s, q);
    s->stats.preemptions_total++;
}

void eng_sched_req_free(eng_sched_t *s, struct sreq *r)
{
    for (int32_t i = 0; i < r->req->n; i++) {
        struct choice *c = &r->ch[i];
        if (c->seq)
            eng_sched_seq_drop(s, c->seq);
        if (c->detok)
            s->detok->close(c->detok);
        eng_sampler_destroy(c->smp);
        eng_strbuf_fini(&c->text);
        free(c->pend);
    }
    if (r->prev)
        r->prev->next = r->next;
    else
        s->reqs = r->next;
    if (r->next)
        r->next->prev = r->prev;
    free(r->ch);
    free(r->plp);
    eng_request_destroy(r->req);
    free(r);
}

static inf_status_t fork_choices(eng_sched_t *s, struct seq *parent, const float *row,
                                 const struct eng_sample_out *picks)
{
    struct sreq *r = parent->r;
    int32_t n = r->req->n, vocab = s->lm->vocab;
    int32_t full = parent->len / ENG_KV_BLOCK;
    INF_ASSERT(parent->len == r->req->n_prompt && parent->n_blocks >= full);

    inf_status_t st = INF_OK;
    for (int32_t j = 1; j < n; j++) {
        struct seq *q = seq_new(s, r, j);
        if (!q) {
            st = INF_E_NOMEM;
            break;
        }
        /* the parent's blocks before its window are gone (seq_trim kept
         * those the recompute from `full` sees) */
        for (int32_t b = 0; b < full; b++) {
            q->blocks[b] = parent->blocks[b];
            if (q->blocks[b] >= 0)
                eng_kv_block_ref(s->kv, q->blocks[b]);
        }
        q->n_freed = parent->n_freed < full ? parent->n_freed : full;
        q->n_blocks = full;
        q->n_computed = full * ENG_KV_BLOCK;
        q->n_cached = parent->n_cached < full ? parent->n_cached : full;
        r->ch[j].seq = q;
        /* The parent's reservation of n slots becomes one per choice. */
        parent->reserve--;
        s->reserved--;
        running_append(s, q);
    }
    r->forked = true;
    if (st != INF_OK)
        return st;
    /* Sample the children from copies (sampling edits the row), then the
     * parent; choice_end may free children but not r while the parent lives. */
    for (int32_t j = 1; j < n; j++) {
        struct seq *q = r->ch[j].seq;
        if (!q)
            continue;
        if (picks) {
            st = eng_sched_accept_pick(s, q, &picks[j]);
        } else {
            memcpy(s->scratch, row, sizeof *row * (size_t)vocab);
            st = eng_sched_sample_accept(s, q, s->scratch);
        }
        if (st != INF_OK)
            return st;
    }
    if (picks)
        return eng_sched_accept_pick(s, parent, &picks[0]);
    memcpy(s->scratch, row, sizeof *row * (size_t)vocab);
    return eng_sched_sample_accept(s, parent, s->scratch);
}

/* ---- scheduling ------------------------------------------------------------------------ */
/* Make room for at least one token of q (which sits at running[i]) by
 * preempting the newest running sequences not scheduled in this step.
 * Returns false when q itself had to be preempted or, for allow_self false,
 * when no other victim exists. */
static bool make_room(eng_sched_t *s, struct seq *q, bool allow_self, bool *preempted)
{
    while (seq_fit(s, q) <= 0) {
        struct seq *victim = NULL;
        for (int32_t k = s->n_running - 1; k >= 0; k--) {
            struct seq *v = s->running[k];
            if (v == q)
                break;
            if (v->sched_step != s->step_no) {
                victim = v;
                break;
            }
        }
        if (!victim) {
            if (!allow_self)
                return false;
            victim = q;
        }
        preempt(s, victim);
        *preempted = true;
        if (victim == q)
            return false;
    }
    return true;
}

static void schedule(eng_sched_t *s, struct seq *q, int32_t chunk, int32_t *n_step, int32_t *budget)
{
    s->plp_left -= eng_sched_plp_rows(q, q->n_computed, chunk);
    seq_grow(s, q, q->n_computed + chunk);
    q->sched_step = s->step_no;
    s->st_seq[*n_step] = q;
    s->st_chunk[*n_step] = chunk;
    (*n_step)++;
    *budget -= chunk;
}

/* Choose this step's sequences and chunks. Returns the number scheduled. */
static int32_t plan_step(eng_sched_t *s)
{
    int32_t budget = s->cfg.max_batched_tokens, n_step = 0;
    bool preempted = false;
    s->plp_left = PROMPT_ROWS;

    /* Running sequences, oldest first: decodes, then prefill chunks. */
    for (int pass = 0; pass < 2; pass++) {
        for (int32_t i = 0; i < s->n_running && budget > 0; i++) {
            struct seq *q = s->running[i];
            int32_t rem = q->len - q->n_computed;
            if (q->sched_step == s->step_no || (pass == 0) != (rem == 1))
                continue;
            seq_trim(s, q);
            if (!make_room(s, q, pass == 0, &preempted)) {
                if (!q->running)
                    i--; /* q left the array; the next one moved to i */
                continue;
            }
            int32_t chunk = rem < budget ? rem : budget;
            int32_t fit = seq_fit(s, q);
            if (chunk > fit)
                chunk = fit;
            chunk = eng_sched_plp_clamp(s, q, chunk);
            if (chunk <= 0)
                continue;
            schedule(s, q, chunk, &n_step, &budget);
        }
    }
    if (preempted)
        return n_step;

    /* Admission from the front of the waiting queue. */
    while (s->whead && budget > 0) {
        struct seq *q = s->whead;
        if (s->reserved + q->reserve > s->cfg.max_batch)
            break;
        prefix_attach(s, q);
        seq_trim(s, q); /* cached blocks before its window go back at once */
        int32_t rem = q->len - q->n_computed;
        int32_t chunk = rem < budget ? rem : budget;
        /* Keep a watermark of free blocks for the running decodes, so that
         * an admission is not preempted again at once. */
        int32_t fit = seq_fit(s, q) - s->watermark * ENG_KV_BLOCK;
        if (chunk > fit)
            chunk = fit;
        chunk = eng_sched_plp_clamp(s, q, chunk);
        if (chunk <= 0) {
            seq_release_blocks(s, q); /* the cached blocks it found wait with it */
            break;
        }
        wait_remove(s, q);
        if (!q->r->started) {
            /* counted as vLLM counts them: a request's first admission only
             * (not its recomputes after preemption), in tokens */
            s->stats.prompt_tokens_total += (uint64_t)q->r->req->n_prompt;
            if (eng_kv_cache_prefix_on(s->kv)) {
                s->stats.prefix_cache_queries_total += (uint64_t)q->len;
                s->stats.prefix_cache_hits_total += (uint64_t)q->n_computed;
            }
        }
        eng_sched_mark_dequeued(s, q->r);
        running_append(s, q);
        schedule(s, q, chunk, &n_step, &budget);
    }
    return n_step;
}

/* Row of the sampled rows for choice c of r whose next token is its
 * n_gen-th (from 0): its settings, the draw, the penalty history (into
 * hist), logits row lrow, and EOS banned before min_tokens. */
static void sample_row(const eng_sched_t *s, const struct sreq *r, struct choice *c, int32_t n_gen,
                       int32_t lrow, struct eng_sample_hist *hist, struct eng_sample_row *row)
{
    memset(row, 0, sizeof *row);
    eng_sampler_fill_row(c->smp, row, hist);
    row->logit_row = lrow;
    if (n_gen < r->req->min_tokens) {
        row->ban = s->lm->eos_ids;
        row->n_ban = s->lm->n_eos;
    }
}

/* q's row of a block table of cols columns (-1 past its blocks). */
static void table_row(const struct seq *q, int32_t cols, int32_t *row)
{
    for (int32_t b = 0; b < cols; b++)
        row[b] = b < q->n_blocks ? q->blocks[b] : -1;
}

/* The step's sampled rows, in batch order: one per sequence ending its
 * chunk, n for a request forking its choices (choice j's row at
 * st_row[k] + j), into s->rows; *n_rows_out of them. */
static inf_status_t fill_rows(eng_sched_t *s, int32_t n_step, int32_t *n_rows_out,
                              struct inf_err *err)
{
    size_t n_hist = 0;
    for (int32_t k = 0; k < n_step; k++) {
        struct seq *q = s->st_seq[k];
        if (q->n_computed + s->st_chunk[k] != q->len)
            continue;
        struct sreq *r = q->r;
        int32_t n = !r->forked && r->req->n > 1 ? r->req->n : 1;
        for (int32_t j = 0; j < n; j++)
            n_hist += (size_t)eng_sampler_hist_len(r->ch[n > 1 ? j : q->choice].smp);
    }
    if (n_hist > s->hist_cap) {
        size_t cap = s->hist_cap ? s->hist_cap : 1024;
        while (cap < n_hist)
            cap *= 2;
        struct eng_sample_hist *h = realloc(s->hist, cap * sizeof *h);
        if (!h)
            return inf_err_set(err, INF_E_NOMEM, "out of memory for sampling histories");
        s->hist = h;
        s->hist_cap = cap;
    }
    int32_t n_rows = 0, lrow = 0;
    size_t at = 0;
    for (int32_t k = 0; k < n_step; k++) {
        struct seq *q = s->st_seq[k];
        if (q->n_computed + s->st_chunk[k] != q->len)
            continue;
        struct sreq *r = q->r;
        int32_t n = !r->forked && r->req->n > 1 ? r->req->n : 1;
        s->st_row[k] = n_rows;
        for (int32_t j = 0; j < n; j++) {
            struct choice *c = &r->ch[n > 1 ? j : q->choice];
            struct eng_sample_row *row = &s->rows[n_rows++];
            sample_row(s, r, c, c->n_gen, lrow, s->hist + at, row);
            at += (size_t)row->n_hist;
        }
        lrow++;
    }
    *n_rows_out = n_rows;
    return INF_OK;
}

/* Whether q's token sampled in the step in flight is its last by length. */
static bool ends_by_length(const eng_sched_t *s, const struct seq *q)
{
    return q->r->ch[q->choice].n_gen + 1 >= q->r->req->max_tokens ||
           q->len + 1 >= s->cfg.max_model_len;
}

/* Whether q, decoding in the step in flight (its token at position
 * q->len - 1) and not ending there by length, can be in the step queued
 * behind it: its next token, at q->len, is fed on the device from the step
 * in flight, so nothing that token changes on the host may be needed to
 * build the step (penalty histories; the fork of n > 1 choices). An EOS or
 * a stop string cannot be known ahead: that row is simply discarded. */
static bool ahead_fits(const struct seq *q)
{
    const struct sreq *r = q->r;
    const struct choice *c = &r->ch[q->choice];
    return r->failed == INF_OK && r->forked && !c->ended && eng_sampler_hist_len(c->smp) == 0;
}

/* Queue the next decode step behind the one in flight (st_seq[0..n_step),
 * submitted, not collected), so that the device runs it while the host
 * takes the one in flight's results: when every running sequence decodes
 * in the step in flight, no waiting sequence would find a slot, none needs
 * the host's view of its new token (ahead_fits), and the pool has their
 * next blocks.
 * Sequences that end by length in the step in flight are left out; one that
 * ends otherwise wastes its row (seq_drop clears it from ah_seq). */
static inf_status_t queue_ahead(eng_sched_t *s, int32_t n_step, struct inf_err *err)
{
    if (s->cfg.no_overlap || !s->lm->submit)
        return INF_OK;
    int32_t live = 0, n = 0, need = 0, cols = 1, freed = 0;
    for (int32_t k = 0; k < n_step; k++) {
        struct seq *q = s->st_seq[k];
        if (!q)
            continue;
        live++;
        if (s->st_chunk[k] != 1 || q->len - q->n_computed != 1)
            return INF_OK; /* a prefill chunk in flight */
        if (ends_by_length(s, q)) {
            freed += q->reserve;
            continue; /* left out */
        }
        if (!ahead_fits(q))
            return INF_OK;
        seq_trim(s, q);
        int32_t nb = q->len / ENG_KV_BLOCK + 1;
        need += nb > q->n_blocks ? nb - q->n_blocks : 0;
        cols = nb > cols ? nb : cols;
        n++;
    }
    if (n == 0 || live != s->n_running || need > eng_kv_cache_free_blocks(s->kv))
        return INF_OK;
    /* A waiting sequence that would find a slot once the step in flight is
     * taken is admitted by a step planned as usual; one that would not (the
     * batch full, a backlog) does not hold the decodes back. */
    if (s->whead && s->reserved - freed + s->whead->reserve <= s->cfg.max_batch)
        return INF_OK;
    int32_t j = 0;
    for (int32_t k = 0; k < n_step; k++) {
        struct seq *q = s->st_seq[k];
        if (!q || ends_by_length(s, q))
            continue;
        struct choice *c = &q->r->ch[q->choice];
        seq_grow(s, q, q->len + 1);
        assert_private(s, q, q->len, 1);
        s->b_tok[j] = 0;
        s->b_feed[j] = s->st_row[k];
        s->b_pos[j] = q->len;
        s->b_slot[j] = j;
        s->b_want[j] = 1;
        table_row(q, cols, s->b_table + (size_t)j * (size_t)cols);
        /* its token after the one in flight; no history (ahead_fits) */
        sample_row(s, q->r, c, c->n_gen + 1, j, NULL, &s->rows[j]);
        s->ah_seq[j++] = q;
    }
    const struct eng_batch batch = {
        .n_tokens = n,
        .tokens = s->b_tok,
        .pos = s->b_pos,
        .slot = s->b_slot,
        .want_logits = s->b_want,
        .n_logits = n,
        .block_table = s->b_table,
        .n_slots = n,
        .max_blocks = cols,
        .feed = s->b_feed,
    };
    inf_status_t st = s->lm->submit(s->lm->self, &batch, s->rows, n, err);
    if (st != INF_OK)
        return st;
    s->n_ah = n;
    s->stats.steps_ahead_total++;
    return INF_OK;
}

/* The results of the step st_seq[0..n_step) are in (picks when sampled on
 * the device, else logits): advance, sample, send events. Entries of NULL
 * are sequences that ended after the step was queued. */
static inf_status_t finish_step(eng_sched_t *s, int32_t n_step, bool dev)
{
    inf_status_t st;
    s->stats.steps_total++;
    if (n_step > 1)
        s->stats.batched_steps_total++;
    if (s->n_running > s->stats.max_running_seen)
        s->stats.max_running_seen = s->n_running;

    /* Advance, sample, and send events. A sequence ended here is freed, so
     * everything needed from st_seq[k] is read before its callback. */
    int32_t row = 0;
    for (int32_t k = 0; k < n_step; k++) {
        struct seq *q = s->st_seq[k];
        if (!q)
            continue;
        struct sreq *r = q->r;
        /* Scoring rows come first (they precede the chunk's last token).
         * Only a prefill of choice 0 before the fork has them, so r is the
         * only request of this sequence in the step and still alive. */
        int32_t prows = eng_sched_plp_rows(q, q->n_computed, s->st_chunk[k]);
        if (prows > 0) {
            int32_t plo = q->n_computed > r->n_plp ? q->n_computed : r->n_plp;
            for (int32_t i = 0; i < prows; i++, row++)
                eng_sched_plp_score(s, r, plo + i, s->logits + (size_t)row * (size_t)s->lm->vocab);
            r->n_plp = plo + prows;
        }
        q->n_computed += s->st_chunk[k];
        prefix_commit(s, q); /* before a fork shares the prompt's blocks */
        if (q->n_computed != q->len)
            continue;
        float *lg = dev ? NULL : s->logits + (size_t)row * (size_t)s->lm->vocab;
        row++;
        if (r->failed != INF_OK)
            continue;
        if (r->want_plp && !r->plp_sent) {
            st = eng_sched_emit_prompt(s, r);
            if (st != INF_OK) {
                r->failed = st;
                continue;
            }
        }
        const struct eng_sample_out *picks = dev ? &s->picks[s->st_row[k]] : NULL;
        if (!r->forked && r->req->n > 1)
            st = fork_choices(s, q, lg, picks);
        else {
            r->forked = true;
            st = dev ? eng_sched_accept_pick(s, q, picks) : eng_sched_sample_accept(s, q, lg);
        }
        if (st != INF_OK) {
            inf_log(WARN, "req=%llu ended: %s", (unsigned long long)r->req->id, inf_status_str(st));
            r->failed = st;
        }
    }
    /* Requests that failed in the loop above are ended only now: their other
     * sequences may still have been in st_seq (or in the step queued ahead,
     * which then discards their rows). */
    for (struct sreq *r = s->reqs, *next; r; r = next) {
        next = r->next;
        if (r->failed != INF_OK)
            eng_sched_req_error(s, r, r->failed,
                                r->failed == INF_E_NOMEM
                                    ? "out of memory"
                                    : "every token is excluded by the sampling settings");
    }
    return INF_OK;
}

/* The step queued ahead becomes the step in flight: queue the next one
 * behind it when possible, then collect it and take its results. */
static inf_status_t step_ahead(eng_sched_t *s, struct inf_err *err)
{
    const int32_t n = s->n_ah;
    struct seq **t = s->st_seq;
    s->st_seq = s->ah_seq;
    s->ah_seq = t;
    s->n_ah = 0;
    s->step_no++;
    for (int32_t k = 0; k < n; k++) {
        s->st_chunk[k] = 1;
        s->st_row[k] = k;
        if (s->st_seq[k])
            s->st_seq[k]->sched_step = s->step_no;
    }
    inf_status_t st = queue_ahead(s, n, err);
    if (st == INF_OK)
        st = s->lm->collect(s->lm->self, s->picks, err);
    if (st != INF_OK) {
        s->n_ah = 0; /* the model is unusable: nothing is collected again */
        return st;
    }
    return finish_step(s, n, true);
}

inf_status_t eng_sched_step(eng_sched_t *s, struct inf_err *err)
{
    if (s->n_ah > 0)
        return step_ahead(s, err);
    if (eng_sched_idle(s))
        return INF_OK;
    s->step_no++;
    int32_t n_step = plan_step(s);
    if (n_step == 0)
        return INF_OK;

    /* The batch: slot k is the k-th scheduled sequence. */
    int32_t nt = 0, n_logits = 0, n_end = 0, cols = 1;
    for (int32_t k = 0; k < n_step; k++)
        if (s->st_seq[k]->n_blocks > cols)
            cols = s->st_seq[k]->n_blocks;
    for (int32_t k = 0; k < n_step; k++) {
        struct seq *q = s->st_seq[k];
        int32_t chunk = s->st_chunk[k];
        bool ends = q->n_computed + chunk == q->len;
        n_end += ends;
        /* Scoring rows: positions [plo, plo + prows) of this chunk. */
        int32_t prows = eng_sched_plp_rows(q, q->n_computed, chunk);
        int32_t plo = q->n_computed > q->r->n_plp ? q->n_computed : q->r->n_plp;
        assert_private(s, q, q->n_computed, chunk);
        for (int32_t j = 0; j < chunk; j++) {
            int32_t p = q->n_computed + j;
            s->b_tok[nt] = q->tok[p];
            s->b_pos[nt] = p;
            s->b_slot[nt] = k;
            s->b_want[nt] = (ends && j == chunk - 1) || (p >= plo && p < plo + prows);
            n_logits += s->b_want[nt];
            nt++;
        }
        table_row(q, cols, s->b_table + (size_t)k * (size_t)cols);
    }
    struct eng_batch batch = {
        .n_tokens = nt,
        .tokens = s->b_tok,
        .pos = s->b_pos,
        .slot = s->b_slot,
        .want_logits = s->b_want,
        .n_logits = n_logits,
        .block_table = s->b_table,
        .n_slots = n_step,
        .max_blocks = cols,
    };
    /* Sampling on the device when the model can and no prompt position is
     * scored (scoring needs the whole logits rows on the host); when the
     * model takes a step in two halves, the next decode step is queued
     * between them. */
    const bool dev = s->lm->forward_sample != NULL && n_logits == n_end;
    inf_status_t st;
    if (dev) {
        int32_t n_rows = 0;
        st = fill_rows(s, n_step, &n_rows, err);
        if (st == INF_OK && s->lm->submit) {
            st = s->lm->submit(s->lm->self, &batch, s->rows, n_rows, err);
            if (st == INF_OK)
                st = queue_ahead(s, n_step, err);
            if (st == INF_OK)
                st = s->lm->collect(s->lm->self, s->picks, err);
            if (st != INF_OK)
                s->n_ah = 0; /* the model is unusable: nothing is collected again */
        } else if (st == INF_OK) {
            st = s->lm->forward_sample(s->lm->self, &batch, s->rows, n_rows, s->picks, err);
        }
    } else {
        st = s->lm->forward(s->lm->self, &batch, s->logits, err);
    }
    if (st != INF_OK)
        return st;
    return finish_step(s, n_step, dev);
}

/* ---- requests ---------------------------------------------------------------------------- */
inf_status_t eng_sched_validate(const eng_sched_t *s, const struct eng_request *req,
                                struct inf_err *err)
{
    const struct eng_sampling *sp = &req->sampling;
    int32_t vocab = s->lm->vocab;
    if (req->n_prompt < 1 || !req->prompt)
        return inf_err_set(err, INF_E_INVALID, "prompt: at least one token is required");
    if (req->n_prompt >= s->cfg.max_model_len)
        return inf_err_set(err, INF_E_INVALID,
                           "prompt: %d tokens leave no room in the context of %d tokens",
                           req->n_prompt, s->cfg.max_model_len);
    for (int32_t i = 0; i < req->n_prompt; i++)
        if (req->prompt[i] < 0 || req->prompt[i] >= vocab)
            return inf_err_set(err, INF_E_INVALID,
                               "prompt: token id %d at index %d is outside [0, %d)", req->prompt[i],
                               i, vocab);
    if (req->n < 1 || req->n > s->cfg.max_batch || req->n > 64)
        return inf_err_set(err, INF_E_INVALID, "n: must be in [1, %d], got %d",
                           s->cfg.max_batch < 64 ? s->cfg.max_batch : 64, req->n);
    if (req->max_tokens < 1)
        return inf_err_set(err, INF_E_INVALID, "max_tokens: must be at least 1, got %d",
                           req->max_tokens);
    if (req->min_tokens < 0 || req->min_tokens > req->max_tokens)
        return inf_err_set(err, INF_E_INVALID, "min_tokens: must be in [0, max_tokens], got %d",
                           req->min_tokens);
    if (req->n_stop < 0 || req->n_stop > ENG_MAX_STOP)
        return inf_err_set(err, INF_E_INVALID, "stop: at most %d strings", ENG_MAX_STOP);
    for (int32_t i = 0; i < req->n_stop; i++)
        if (!req->stop[i] || !req->stop[i][0])
            return inf_err_set(err, INF_E_INVALID, "stop: strings must not be empty");
    if (!(sp->temperature >= 0.0f))
        return inf_err_set(err, INF_E_INVALID, "temperature: must be >= 0");
    if (!(sp->top_p > 0.0f && sp->top_p <= 1.0f))
        return inf_err_set(err, INF_E_INVALID, "top_p: must be in (0, 1]");
    if (sp->top_k == 0 || sp->top_k < -1)
        return inf_err_set(err, INF_E_INVALID, "top_k: must be -1 or at least 1, got %d",
                           sp->top_k);
    if (!(sp->min_p >= 0.0f && sp->min_p <= 1.0f))
        return inf_err_set(err, INF_E_INVALID, "min_p: must be in [0, 1]");
    if (!(sp->repetition_penalty > 0.0f))
        return inf_err_set(err, INF_E_INVALID, "repetition_penalty: must be > 0");
    if (!(sp->presence_penalty >= -2.0f && sp->presence_penalty <= 2.0f))
        return inf_err_set(err, INF_E_INVALID, "presence_penalty: must be in [-2, 2]");
    if (!(sp->frequency_penalty >= -2.0f && sp->frequency_penalty <= 2.0f))
        return inf_err_set(err, INF_E_INVALID, "frequency_penalty: must be in [-2, 2]");
    if (sp->logprobs < -1 || sp->logprobs > 5)
        return inf_err_set(err, INF_E_INVALID, "logprobs: must be in [0, 5], got %d", sp->logprobs);
    if (sp->n_logit_bias < 0 ||
        (sp->n_logit_bias > 0 && (!sp->logit_bias_ids || !sp->logit_bias_vals)))
        return inf_err_set(err, INF_E_INVALID, "logit_bias: malformed");
    for (int32_t i = 0; i < sp->n_logit_bias; i++) {
        if (sp->logit_bias_ids[i] < 0 || sp->logit_bias_ids[i] >= vocab)
            return inf_err_set(err, INF_E_INVALID, "logit_bias: token id %d is outside [0, %d)",
                               sp->logit_bias_ids[i], vocab);
        if (!isfinite(sp->logit_bias_vals[i]))
            return inf_err_set(err, INF_E_INVALID,
                               "logit_bias: the value for token %d must be finite",
                               sp->logit_bias_ids[i]);
    }
    return INF_OK;
}

static uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* The sampler of choice i: the request's settings, seed + i. */
static inf_status_t choice_sampler(const eng_sched_t *s, const struct eng_request *req,
                                   uint64_t seed, eng_sampler_t **out, struct inf_err *err)
{
    const struct eng_sampling *sp = &req->sampling;
    struct eng_logit_bias *bias = NULL;
    if (sp->n_logit_bias > 0) {
        bias = malloc(sizeof *bias * (size_t)sp->n_logit_bias);
        if (!bias)
            return inf_err_set(err, INF_E_NOMEM, "out of memory");
        for (int32_t k = 0; k < sp->n_logit_bias; k++)
            bias[k] = (struct eng_logit_bias){sp->logit_bias_ids[k], sp->logit_bias_vals[k]};
    }
    struct eng_sampler_params pp;
    eng_sampler_params_default(&pp);
    pp.temperature = sp->temperature;
    pp.top_k = sp->top_k > 0 ? sp->top_k : 0;
    pp.top_p = sp->top_p;
    pp.min_p = sp->min_p;
    pp.repetition_penalty = sp->repetition_penalty;
    pp.presence_penalty = sp->presence_penalty;
    pp.frequency_penalty = sp->frequency_penalty;
    pp.logit_bias = bias;
    pp.n_logit_bias = sp->n_logit_bias;
    pp.seed = seed;
    pp.n_logprobs = sp->logprobs > 0 ? sp->logprobs : 0;
    inf_status_t st = eng_sampler_create(&pp, s->lm->vocab, out, err); /* copies the bias */
    free(bias);
    if (st == INF_OK)
        eng_sampler_add_prompt(*out, req->prompt, req->n_prompt);
    return st;
}

inf_status_t eng_sched_add(eng_sched_t *s, struct eng_request *req, uint64_t t_submit,
                           struct inf_err *err)
{
    inf_status_t st = eng_sched_validate(s, req, err);
    if (st != INF_OK)
        return st;
    struct sreq *r = calloc(1, sizeof *r);
    if (!r)
        return inf_err_set(err, INF_E_NOMEM, "out of memory");
    r->ch = calloc((size_t)req->n, sizeof *r->ch);
    if (!r->ch) {
        st = inf_err_set(err, INF_E_NOMEM, "out of memory");
        goto fail_r;
    }
    r->req = req;
    for (int32_t i = 0; i < req->n_stop; i++)
        r->stop_len[i] = strlen(req->stop[i]);
    r->t_submit = t_submit;
    r->n_open = req->n;
    r->want_plp = req->prompt_logprobs && req->sampling.logprobs >= 0;
    if (r->want_plp) {
        r->plp = calloc((size_t)req->n_prompt, sizeof *r->plp);
        if (!r->plp) {
            st = inf_err_set(err, INF_E_NOMEM, "out of memory");
            goto fail_ch;
        }
        r->plp[0].id = req->prompt[0];
        r->plp[0].logprob = NAN; /* the first token has no context */
    }
    uint64_t seed =
        req->sampling.has_seed ? req->sampling.seed : mix64(s->cfg.seed ^ mix64(++s->seed_counter));
    for (int32_t i = 0; i < req->n; i++) {
        struct choice *c = &r->ch[i];
        c->detok = s->detok->open(s->detok->self, req->prompt, req->n_prompt);
        if (!c->detok) {
            st = inf_err_set(err, INF_E_NOMEM, "out of memory");
            goto fail_ch;
        }
        st = choice_sampler(s, req, seed + (uint64_t)i, &c->smp, err);
        if (st != INF_OK)
            goto fail_ch;
    }
    struct seq *q = seq_new(s, r, 0);
    if (!q) {
        st = inf_err_set(err, INF_E_NOMEM, "out of memory");
        goto fail_ch;
    }
    q->reserve = req->n;
    r->ch[0].seq = q;
    r->next = s->reqs;
    if (s->reqs)
        s->reqs->prev = r;
    s->reqs = r;
    wait_push_back(s, q);
    return INF_OK;

fail_ch:
    for (int32_t i = 0; i < req->n; i++) {
        if (r->ch[i].detok)
            s->detok->close(r->ch[i].detok);
        eng_sampler_destroy(r->ch[i].smp);
    }
    free(r->plp);
    free(r->ch);
fail_r:
    free(r);
    return st;
}

void eng_sched_cancel(eng_sched_t *s, uint64_t id)
{
    struct sreq *r = s->reqs;
    while (r && r->req->id != id)
        r = r->next;
    if (!r)
        return;
    eng_sched_mark_dequeued(s, r);
    int32_t n = r->req->n;
    for (int32_t i = 0; i < n; i++)
        if (eng_sched_choice_end(s, r, i, ENG_FINISH_ABORT))
            return;
    /* Not freed: a final DELTA could not be built. Outside a step, end it now. */
    eng_sched_req_error(s, r, r->failed != INF_OK ? r->failed : INF_E_INTERNAL, "out of memory");
}

void eng_sched_abort_all(eng_sched_t *s)
{
    while (s->reqs)
        eng_sched_cancel(s, s->reqs->req->id);
}

void eng_sched_fail_all(eng_sched_t *s, inf_status_t code, const char *msg)
{
    while (s->reqs)
        eng_sched_req_error(s, s->reqs, code, msg);
}

bool eng_sched_idle(const eng_sched_t *s)
{
    return s->n_running == 0 && s->n_waiting == 0 && s->n_ah == 0;
}

void eng_sched_stats(const eng_sched_t *s, struct eng_stats *st)
{
    *st = s->stats;
    st->running = s->n_running;
    st->waiting = s->n_waiting;
    st->kv_blocks_total = s->cfg.kv_blocks;
    st->kv_blocks_used = s->cfg.kv_blocks - eng_kv_cache_free_blocks(s->kv);
    st->kv_blocks_cached = eng_kv_cache_cached_blocks(s->kv);
    st->failed = false;
}

uint64_t eng_sched_dequeued(const eng_sched_t *s)
{
    return s->dequeued;
}

/* ---- lifetime ------------------------------------------------------------------------------ */
inf_status_t eng_sched_create(const struct eng_sched_config *cfg, struct eng_lm *lm,
                              const struct eng_detok_ops *detok, eng_emit_fn emitfn, void *user,
                              eng_sched_t **out, struct inf_err *err)
{
    if (cfg->max_batch < 1)
        return inf_err_set(err, INF_E_INVALID, "max_batch: must be at least 1, got %d",
                           cfg->max_batch);
    if (cfg->max_batched_tokens < cfg->max_batch)
        return inf_err_set(err, INF_E_INVALID,
                           "max_batched_tokens: must be at least max_batch (%d), got %d",
                           cfg->max_batch, cfg->max_batched_tokens);
    if (cfg->max_model_len < 2 || cfg->max_model_len > lm->max_len)
        return inf_err_set(err, INF_E_INVALID, "max_model_len: must be in [2, %d], got %d",
                           lm->max_len, cfg->max_model_len);
    int32_t max_blocks = (cfg->max_model_len + ENG_KV_BLOCK - 1) / ENG_KV_BLOCK;
    /* With a sliding window a sequence holds its window's blocks and the
     * next one (its chunks are cut to what is free: seq_trim, seq_fit). */
    int32_t need = max_blocks;
    if (lm->window > 0 && (lm->window + ENG_KV_BLOCK - 1) / ENG_KV_BLOCK + 2 < need)
        need = (lm->window + ENG_KV_BLOCK - 1) / ENG_KV_BLOCK + 2;
    if (cfg->kv_blocks < need)
        return inf_err_set(err, INF_E_INVALID,
                           "kv_cache_tokens: %d tokens cannot hold one sequence of "
                           "max_model_len %d",
                           cfg->kv_blocks * ENG_KV_BLOCK, cfg->max_model_len);

    eng_sched_t *s = calloc(1, sizeof *s);
    if (!s)
        return inf_err_set(err, INF_E_NOMEM, "out of memory");
    s->cfg = *cfg;
    s->lm = lm;
    s->detok = detok;
    s->emit = emitfn;
    s->user = user;
    s->max_blocks = max_blocks;
    s->watermark = cfg->kv_blocks / 100;
    size_t mb = (size_t)cfg->max_batch;
    size_t nt = (size_t)cfg->max_batched_tokens, vocab = (size_t)lm->vocab;
    s->running = calloc(mb, sizeof *s->running);
    s->st_seq = calloc(mb, sizeof *s->st_seq);
    s->st_chunk = calloc(mb, sizeof *s->st_chunk);
    s->b_tok = malloc(sizeof *s->b_tok * nt);
    s->b_pos = malloc(sizeof *s->b_pos * nt);
    s->b_slot = malloc(sizeof *s->b_slot * nt);
    s->b_want = malloc(nt);
    s->b_table = malloc(sizeof *s->b_table * mb * (size_t)max_blocks);
    s->logits = malloc(sizeof *s->logits * (mb + PROMPT_ROWS) * vocab);
    s->scratch = malloc(sizeof *s->scratch * vocab);
    s->rows = malloc(sizeof *s->rows * mb);
    s->picks = malloc(sizeof *s->picks * mb);
    s->st_row = malloc(sizeof *s->st_row * mb);
    s->ah_seq = calloc(mb, sizeof *s->ah_seq);
    s->b_feed = malloc(sizeof *s->b_feed * mb);
    if (!s->ah_seq || !s->b_feed || !s->running || !s->st_seq || !s->st_chunk || !s->b_tok ||
        !s->b_pos || !s->b_slot || !s->b_want || !s->b_table || !s->logits || !s->scratch ||
        !s->rows || !s->picks || !s->st_row) {
        eng_sched_destroy(s);
        return inf_err_set(err, INF_E_NOMEM, "out of memory for the scheduler");
    }
    inf_status_t st = eng_kv_cache_create(cfg->kv_blocks, 0, 0, &s->kv, err);
    if (st == INF_OK && cfg->prefix_caching) {
        /* The chain of block hashes starts at what the blocks' content
         * depends on besides the ids: the model and its KV dtype. */
        uint64_t salt =
            mix64(lm->kv_id ^ mix64((uint64_t)(uint32_t)lm->vocab << 32 | (uint32_t)lm->max_len));
        for (const char *c = lm->name; c && *c; c++)
            salt = mix64(salt ^ (unsigned char)*c);
        st = eng_kv_cache_enable_prefix(s->kv, salt, cfg->prefix_hash, err);
    }
    if (st == INF_OK)
        st = lm->kv_reserve(lm->self, cfg->kv_blocks, err);
    if (st != INF_OK) {
        eng_sched_destroy(s);
        return st;
    }
    *out = s;
    return INF_OK;
}

void eng_sched_destroy(eng_sched_t *s)
{
    if (!s)
        return;
    while (s->reqs)
        eng_sched_req_free(s, s->reqs);
    eng_kv_cache_destroy(s->kv);
    free(s->running);
    free(s->st_seq);
    free(s->st_chunk);
    free(s->b_tok);
    free(s->b_pos);
    free(s->b_slot);
    free(s->b_want);
    free(s->b_table);
    free(s->logits);
    free(s->scratch);
    free(s->rows);
    free(s->picks);
    free(s->st_row);
    free(s->ah_seq);
    free(s->b_feed);
    free(s->hist);
    free(s);
}
