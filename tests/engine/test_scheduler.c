/* tests/engine/test_scheduler.c — the scheduler stepped by hand over the mock
 * model. Outputs are compared with a naive reference: the mock's logits
 * recomputed from the whole token history (no KV, no batch; with a sliding
 * window, from its last positions) and argmax. */
#include "engine/mock/mock.h"
#include "engine/sched/scheduler_impl.h"

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define VOCAB 512
#define MAXR 10016
#define MAXC 8

/* ---- event collection ------------------------------------------------------------------ */
struct ch_out {
    struct eng_strbuf text;
    int32_t *toks;
    int32_t n_toks;
    struct eng_token_info *info;
    enum eng_finish fin;
    int n_deltas, n_final;
    int first_delta_order; /* global order of this choice's first non-empty delta */
};

struct req_out {
    struct ch_out ch[MAXC];
    int n_done, n_error;
    bool event_after_end;
    inf_status_t status;
    int32_t prompt_tokens, completion_tokens;
    uint64_t queue_ns, ttft_ns;
    int first_token_step;
    struct eng_token_info *plp; /* the ENG_EV_PROMPT event's tokens */
    int32_t n_plp;
    int n_prompt_events;
    bool prompt_after_delta; /* an ENG_EV_PROMPT came after a DELTA */
};

static struct req_out outs[MAXR];
static int event_order;
static int cur_step;

static bool utf8_complete(const char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned char c = (unsigned char)s[i];
        size_t len = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 ? 2 : 0;
        if (!len || i + len > n)
            return false;
        for (size_t k = 1; k < len; k++)
            if (((unsigned char)s[i + k] & 0xC0) != 0x80)
                return false;
        i += len;
    }
    return true;
}

static void collect(void *user, struct eng_event *ev)
{
    (void)user;
    ck_assert_uint_lt(ev->req_id, MAXR);
    struct req_out *o = &outs[ev->req_id];
    if (o->n_done || o->n_error)
        o->event_after_end = true;
    if (ev->kind == ENG_EV_DELTA) {
        ck_assert_int_lt(ev->choice, MAXC);
        struct ch_out *c = &o->ch[ev->choice];
        ck_assert_msg(c->n_final == 0, "delta after the final delta of a choice");
        ck_assert_msg(utf8_complete(ev->text, ev->text_len), "delta splits a UTF-8 character");
        ck_assert_uint_eq(strlen(ev->text), ev->text_len);
        eng_strbuf_append(&c->text, ev->text, ev->text_len);
        if (ev->text_len && !c->first_delta_order)
            c->first_delta_order = ++event_order;
        c->toks = realloc(c->toks, sizeof *c->toks * (size_t)(c->n_toks + ev->n_tokens + 1));
        c->info = realloc(c->info, sizeof *c->info * (size_t)(c->n_toks + ev->n_tokens + 1));
        for (int i = 0; i < ev->n_tokens; i++) {
            c->info[c->n_toks] = ev->tokens[i];
            c->toks[c->n_toks++] = ev->tokens[i].id;
        }
        if (ev->n_tokens && !o->first_token_step)
            o->first_token_step = cur_step;
        c->n_deltas++;
        if (ev->finish != ENG_FINISH_NONE) {
            c->n_final++;
            c->fin = ev->finish;
        }
    } else if (ev->kind == ENG_EV_PROMPT) {
        o->n_prompt_events++;
        for (int c = 0; c < MAXC; c++)
            if (o->ch[c].n_deltas)
                o->prompt_after_delta = true;
        ck_assert_int_eq(ev->choice, 0);
        ck_assert_ptr_null(ev->text);
        free(o->plp);
        o->plp = ev->tokens;
        o->n_plp = ev->n_tokens;
        ev->tokens = NULL;
    } else if (ev->kind == ENG_EV_DONE) {
        o->n_done++;
        o->prompt_tokens = ev->prompt_tokens;
        o->completion_tokens = ev->completion_tokens;
        o->queue_ns = ev->queue_ns;
        o->ttft_ns = ev->ttft_ns;
    } else {
        o->n_error++;
        o->status = ev->status;
    }
    eng_event_destroy(ev);
}

static void outs_reset(void)
{
    for (int i = 0; i < MAXR; i++) {
        for (int c = 0; c < MAXC; c++) {
            eng_strbuf_fini(&outs[i].ch[c].text);
            free(outs[i].ch[c].toks);
            free(outs[i].ch[c].info);
        }
        free(outs[i].plp);
    }
    memset(outs, 0, sizeof outs);
    event_order = 0;
    cur_step = 0;
}

/* ---- harness ----------------------------------------------------------------------------- */
/* The "overlap" test case runs tests again with the mock sampling on its
 * "device" (eng_mock_config.device_sampling), so that the scheduler queues
 * decode steps ahead (struct eng_lm's submit); g_no_overlap keeps it from
 * doing so (the same sampling, one step at a time); g_fail_at injects a
 * device failure. */
static bool g_dev, g_no_overlap;
static int32_t g_fail_at;
/* The "prefix" test cases run with prefix caching on (g_prefix), its hash
 * replaced by g_hash when set. */
static bool g_prefix;
static uint64_t (*g_hash)(uint64_t parent, const int32_t *ids);
/* The "window" test cases run the mock with a sliding window (its logits
 * of the last g_window positions only, the reference's too), so that the
 * scheduler frees the blocks before every sequence's window. */
static int32_t g_window;

static void prefix_setup(void)
{
    g_prefix = true;
}

static void prefix_teardown(void)
{
    g_prefix = false;
    g_hash = NULL;
}

static void prefix_overlap_setup(void)
{
    g_prefix = true;
    g_dev = true;
}

static void prefix_overlap_teardown(void)
{
    prefix_teardown();
    g_dev = false;
}

static void overlap_setup(void)
{
    g_dev = true;
}

static void overlap_teardown(void)
{
    g_dev = false;
}

struct harness {
    struct eng_lm lm;
    eng_sched_t *s;
};

static void h_open_detok(struct harness *h, int32_t max_batch, int32_t budget, int32_t max_len,
                         int32_t kv_blocks, const struct eng_detok_ops *detok);

static void h_open(struct harness *h, int32_t max_batch, int32_t budget, int32_t max_len,
                   int32_t kv_blocks)
{
    h_open_detok(h, max_batch, budget, max_len, kv_blocks, &eng_mock_detok);
}

static void h_open_detok(struct harness *h, int32_t max_batch, int32_t budget, int32_t max_len,
                         int32_t kv_blocks, const struct eng_detok_ops *detok)
{
    outs_reset();
    struct eng_mock_config mc = {.vocab = VOCAB,
                                 .max_len = max_len,
                                 .fail_at_step = g_fail_at,
                                 .device_sampling = g_dev,
                                 .window = g_window};
    struct inf_err err;
    ck_assert_int_eq(eng_mock_create(&mc, &h->lm, &err), INF_OK);
    struct eng_sched_config sc = {
        .max_batch = max_batch,
        .max_batched_tokens = budget,
        .max_model_len = max_len,
        .kv_blocks = kv_blocks,
        .seed = 7,
        .no_overlap = g_no_overlap,
        .prefix_caching = g_prefix,
        .prefix_hash = g_hash,
    };
    inf_status_t st = eng_sched_create(&sc, &h->lm, detok, collect, NULL, &h->s, &err);
    ck_assert_msg(st == INF_OK, "%s", err.msg);
}

static void h_close(struct harness *h)
{
    eng_sched_destroy(h->s);
    h->lm.destroy(h->lm.self);
    outs_reset();
}

static int h_run(struct harness *h, int max_steps)
{
    int steps = 0;
    struct inf_err err;
    while (!eng_sched_idle(h->s)) {
        cur_step++;
        inf_status_t st = eng_sched_step(h->s, &err);
        ck_assert_msg(st == INF_OK, "step: %s", err.msg);
        ck_assert_int_lt(++steps, max_steps);
    }
    return steps;
}

static struct eng_request *mkreq(uint64_t id, const int32_t *prompt, int32_t n_prompt,
                                 int32_t max_tokens)
{
    struct eng_request *r = eng_request_create();
    ck_assert_ptr_nonnull(r);
    r->id = id;
    r->n_prompt = n_prompt;
    r->prompt = malloc(sizeof *r->prompt * (size_t)n_prompt);
    memcpy(r->prompt, prompt, sizeof *prompt * (size_t)n_prompt);
    r->max_tokens = max_tokens;
    r->sampling.temperature = 0.0f;
    return r;
}

static void add(struct harness *h, struct eng_request *r)
{
    struct inf_err err;
    inf_status_t st = eng_sched_add(h->s, r, inf_now_ns(), &err);
    ck_assert_msg(st == INF_OK, "add: %s", err.msg);
}

/* A prompt of n tokens that differs per seed: text-like bytes. */
static void mkprompt(int32_t *p, int32_t n, uint32_t seed)
{
    uint32_t x = seed * 2654435761u + 12345u;
    for (int32_t i = 0; i < n; i++) {
        x = x * 1103515245u + 12345u;
        p[i] = ENG_MOCK_BYTE0 + 'a' + (int32_t)((x >> 16) % 26);
    }
}

/* ---- the naive reference ---------------------------------------------------------------- */
struct ref {
    int32_t toks[4096];
    int32_t n;
    enum eng_finish fin;
    char *text;
    size_t len;
};

static int32_t argmax_row(const float *v, int32_t n)
{
    int32_t b = 0;
    for (int32_t i = 1; i < n; i++)
        if (v[i] > v[b])
            b = i;
    return b;
}

static void ref_greedy(const int32_t *prompt, int32_t n_prompt, int32_t max_tokens,
                       int32_t min_tokens, bool ignore_eos, int32_t max_len, struct ref *out)
{
    static int32_t hist[8192];
    static float lg[VOCAB];
    memcpy(hist, prompt, sizeof *prompt * (size_t)n_prompt);
    int32_t len = n_prompt;
    out->n = 0;
    out->fin = ENG_FINISH_NONE;
    while (out->fin == ENG_FINISH_NONE) {
        eng_mock_logits_window(VOCAB, hist, len, g_window, lg);
        if (out->n < min_tokens)
            lg[ENG_MOCK_EOS] = -INFINITY;
        int32_t t = argmax_row(lg, VOCAB);
        hist[len++] = t;
        out->toks[out->n++] = t;
        if (t == ENG_MOCK_EOS && !ignore_eos)
            out->fin = ENG_FINISH_STOP;
        else if (out->n >= max_tokens || len >= max_len)
            out->fin = ENG_FINISH_LENGTH;
    }
    out->text = eng_mock_decode(out->toks, out->n, &out->len);
}

static void ref_free(struct ref *r)
{
    free(r->text);
    r->text = NULL;
}

static void assert_matches(const struct req_out *o, int choice, const struct ref *r)
{
    const struct ch_out *c = &o->ch[choice];
    ck_assert_int_eq(c->n_final, 1);
    ck_assert_int_eq(c->fin, r->fin);
    ck_assert_int_eq(c->n_toks, r->n);
    for (int32_t i = 0; i < r->n; i++)
        ck_assert_int_eq(c->toks[i], r->toks[i]);
    ck_assert_uint_eq(c->text.len, r->len);
    ck_assert(memcmp(c->text.p ? c->text.p : "", r->text, r->len) == 0);
}

/* ---- the mock and its detokenizer ------------------------------------------------------- */
static char *detok_all(const int32_t *ids, int n, int *pushes_with_text)
{
    struct eng_strbuf sb = {0};
    eng_strbuf_append(&sb, "", 0);
    void *d = eng_mock_detok.open(NULL, NULL, 0);
    *pushes_with_text = 0;
    for (int i = 0; i < n; i++) {
        size_t before = sb.len;
        ck_assert_int_eq(eng_mock_detok.push(d, ids[i], &sb), INF_OK);
        ck_assert(utf8_complete(sb.p + before, sb.len - before));
        *pushes_with_text += sb.len > before;
    }
    ck_assert_int_eq(eng_mock_detok.flush(d, &sb), INF_OK);
    eng_mock_detok.close(d);
    return sb.p;
}

#define B(x) (ENG_MOCK_BYTE0 + (x))

START_TEST(mock_detok_utf8)
{
    int pushes;
    /* "é" is C3 A9: nothing after the lead byte, the character after the second */
    int32_t e_acute[] = {B('a'), B(0xC3), B(0xA9), B('b')};
    char *t = detok_all(e_acute, 4, &pushes);
    ck_assert_str_eq(t, "a\xC3\xA9"
                        "b");
    ck_assert_int_eq(pushes, 3);
    free(t);
    /* "€" E2 82 AC, EOS and BOS give no text */
    int32_t euro[] = {ENG_MOCK_BOS, B(0xE2), B(0x82), B(0xAC), ENG_MOCK_EOS};
    t = detok_all(euro, 5, &pushes);
    ck_assert_str_eq(t, "\xE2\x82\xAC");
    ck_assert_int_eq(pushes, 1);
    free(t);
    /* a lead byte cut short, a stray continuation, an overlong lead, a cut end */
    int32_t bad[] = {B(0xC3), B('x'), B(0x80), B(0xC0), B(0xE2), B(0x82)};
    t = detok_all(bad, 6, &pushes);
    ck_assert_str_eq(t, "\xEF\xBF\xBDx\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
    free(t);
    /* surrogates are refused (ED A0 80) */
    int32_t sur[] = {B(0xED), B(0xA0), B(0x80)};
    t = detok_all(sur, 3, &pushes);
    ck_assert_str_eq(t, "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
    free(t);
    /* pieces */
    int32_t pieces[] = {B('q'), 300, 259};
    t = detok_all(pieces, 3, &pushes);
    ck_assert_str_eq(t, "q t300 t259");
    free(t);
    int32_t ids[8];
    ck_assert_int_eq(eng_mock_encode("hé", 3, ids, 8), 3);
    ck_assert_int_eq(ids[0], B('h'));
    ck_assert_int_eq(ids[1], B(0xC3));
    ck_assert_int_eq(ids[2], B(0xA9));
}
END_TEST

START_TEST(mock_forward_reads_blocks)
{
    struct eng_lm lm;
    struct inf_err err;
    struct eng_mock_config mc = {.vocab = VOCAB, .max_len = 256};
    ck_assert_int_eq(eng_mock_create(&mc, &lm, &err), INF_OK);
    ck_assert_int_eq(lm.kv_reserve(lm.self, 8, &err), INF_OK);
    /* 20 tokens of slot 0 in blocks 5 and 2 (not contiguous), logits at the end */
    int32_t toks[20], pos[20], slot[20];
    uint8_t want[20] = {0};
    mkprompt(toks, 20, 3);
    for (int i = 0; i < 20; i++) {
        pos[i] = i;
        slot[i] = 0;
    }
    want[19] = 1;
    int32_t table[2] = {5, 2};
    struct eng_batch b = {20, toks, pos, slot, want, 1, table, 1, 2, NULL};
    float got[VOCAB], ref[VOCAB];
    ck_assert_int_eq(lm.forward(lm.self, &b, got, &err), INF_OK);
    eng_mock_logits(VOCAB, toks, 20, ref);
    for (int v = 0; v < VOCAB; v++)
        ck_assert_float_eq(got[v], ref[v]);
    /* a decode at position 20 reads the 20 positions back */
    int32_t t1 = B('z'), p1 = 20, s1 = 0;
    uint8_t w1 = 1;
    struct eng_batch d = {1, &t1, &p1, &s1, &w1, 1, table, 1, 2, NULL};
    ck_assert_int_eq(lm.forward(lm.self, &d, got, &err), INF_OK);
    int32_t all[21];
    memcpy(all, toks, sizeof toks);
    all[20] = t1;
    eng_mock_logits(VOCAB, all, 21, ref);
    for (int v = 0; v < VOCAB; v++)
        ck_assert_float_eq(got[v], ref[v]);
    /* the argmax is clear: more than 2 above every other logit */
    int32_t am = argmax_row(ref, VOCAB);
    for (int v = 0; v < VOCAB; v++)
        if (v != am)
            ck_assert_float_lt(ref[v] + 2.0f, ref[am] + 1e-6f);
    /* a table pointing at a block that was never written fails */
    int32_t fresh[2] = {7, 2};
    struct eng_batch bad = {1, &t1, &p1, &s1, &w1, 1, fresh, 1, 2, NULL};
    ck_assert_int_eq(lm.forward(lm.self, &bad, got, &err), INF_E_INTERNAL);
    lm.destroy(lm.self);
}
END_TEST

/* ---- scheduling ---------------------------------------------------------------------------- */
START_TEST(single_greedy_matches_reference)
{
    struct harness h;
    h_open(&h, 8, 64, 512, 64);
    int32_t p[37];
    for (int k = 0; k < 6; k++) {
        mkprompt(p, 37, (uint32_t)k);
        struct eng_request *r = mkreq((uint64_t)k + 1, p, 37, 80);
        r->stream = k % 2;
        add(&h, r);
        h_run(&h, 1000);
        struct ref ref;
        ref_greedy(p, 37, 80, 0, false, 512, &ref);
        assert_matches(&outs[k + 1], 0, &ref);
        ck_assert_int_eq(outs[k + 1].n_done, 1);
        ck_assert_int_eq(outs[k + 1].prompt_tokens, 37);
        ck_assert_int_eq(outs[k + 1].completion_tokens, ref.n);
        ck_assert(!outs[k + 1].event_after_end);
        if (k % 2 == 0)
            ck_assert_int_eq(outs[k + 1].ch[0].n_deltas, 1); /* non-streaming: one delta */
        ref_free(&ref);
    }
    struct eng_stats st;
    eng_sched_stats(h.s, &st);
    ck_assert_int_eq(st.kv_blocks_used, 0);
    ck_assert_int_eq(st.running, 0);
    h_close(&h);
}
END_TEST

START_TEST(batch_of_128_matches_alone)
{
    struct harness h;
    h_open(&h, 128, 4096, 256, 128 * 16);
    enum { N = 128 };
    static int32_t p[N][64];
    for (int k = 0; k < N; k++) {
        int32_t n = 5 + k % 50;
        mkprompt(p[k], n, (uint32_t)(1000 + k));
        struct eng_request *r = mkreq((uint64_t)k + 1, p[k], n, 40);
        r->stream = k % 3 == 0;
        r->sampling.ignore_eos = k % 4 == 0;
        add(&h, r);
    }
    int steps = h_run(&h, 1000);
    struct eng_stats st;
    eng_sched_stats(h.s, &st);
    ck_assert_int_eq(st.max_running_seen, N);
    /* 3468 prompt tokens in one step of 4096, then all decode together */
    ck_assert_int_eq(steps, 40);
    ck_assert_uint_ge(st.batched_steps_total + 1, st.steps_total);
    uint64_t prompt_total = 0;
    for (int k = 0; k < N; k++)
        prompt_total += (uint64_t)(5 + k % 50);
    ck_assert_uint_eq(st.prompt_tokens_total, prompt_total);
    for (int k = 0; k < N; k++) {
        struct ref ref;
        ref_greedy(p[k], 5 + k % 50, 40, 0, k % 4 == 0, 256, &ref);
        assert_matches(&outs[k + 1], 0, &ref);
        ck_assert_int_eq(outs[k + 1].n_done, 1);
        ref_free(&ref);
    }
    ck_assert_int_eq(st.kv_blocks_used, 0);
    h_close(&h);
}
END_TEST

START_TEST(random_traffic_invariants)
{
    /* Requests arrive over time with random lengths, n, streaming and
     * cancellations, on a KV pool small enough to preempt: every request
     * ends exactly once, every greedy choice that was not cancelled equals
     * the reference, and every block comes back. */
    struct harness h;
    h_open(&h, 16, 64, 128, 40);
    enum { N = 250 };
    static int32_t prompts[N][100];
    static int32_t plen[N], mtok[N], nch[N];
    static bool cancelled[N];
    uint32_t x = 12345;
#define RND(m) ((x = x * 1103515245u + 12345u), (int32_t)((x >> 16) % (uint32_t)(m)))
    int next = 0, steps = 0;
    struct inf_err err;
    while (next < N || !eng_sched_idle(h.s)) {
        for (int a = RND(4); a > 0 && next < N; a--, next++) {
            plen[next] = 1 + RND(100);
            mtok[next] = 1 + RND(40);
            nch[next] = 1 + (RND(4) == 0 ? 1 + RND(2) : 0);
            mkprompt(prompts[next], plen[next], (uint32_t)next * 7u + 1u);
            struct eng_request *r =
                mkreq((uint64_t)next + 1, prompts[next], plen[next], mtok[next]);
            r->n = nch[next];
            r->stream = RND(2);
            r->sampling.ignore_eos = RND(2);
            add(&h, r);
        }
        if (next > 0 && RND(10) == 0) {
            int victim = RND(next);
            if (outs[victim + 1].n_done == 0) {
                cancelled[victim] = true;
                eng_sched_cancel(h.s, (uint64_t)victim + 1);
            }
        }
        cur_step++;
        ck_assert_int_eq(eng_sched_step(h.s, &err), INF_OK);
        ck_assert_int_lt(++steps, 20000);
    }
#undef RND
    struct eng_stats st;
    eng_sched_stats(h.s, &st);
    ck_assert_int_eq(st.kv_blocks_used, 0);
    ck_assert_uint_gt(st.preemptions_total, 0);
    int checked = 0;
    for (int k = 0; k < N; k++) {
        const struct req_out *o = &outs[k + 1];
        ck_assert_int_eq(o->n_done, 1);
        ck_assert_int_eq(o->n_error, 0);
        ck_assert(!o->event_after_end);
        for (int c = 0; c < nch[k]; c++)
            ck_assert_int_eq(o->ch[c].n_final, 1);
        if (cancelled[k] && o->ch[0].fin == ENG_FINISH_ABORT)
            continue;
        /* ignore_eos is not recorded per request: compare under the one that
         * reproduces the finish reason */
        struct ref ref;
        bool ign = o->ch[0].fin == ENG_FINISH_LENGTH;
        ref_greedy(prompts[k], plen[k], mtok[k], 0, ign, 128, &ref);
        for (int c = 0; c < nch[k]; c++)
            if (o->ch[c].fin != ENG_FINISH_ABORT)
                assert_matches(o, c, &ref);
        ref_free(&ref);
        checked++;
    }
    ck_assert_int_gt(checked, N / 2);
    h_close(&h);
}
END_TEST

START_TEST(chunked_prefill_interleaves_decodes)
{
    struct harness h;
    h_open(&h, 8, 64, 1024, 256);
    int32_t shortp[10], longp[600];
    mkprompt(shortp, 10, 1);
    mkprompt(longp, 600, 2);
    struct eng_request *a = mkreq(1, shortp, 10, 30);
    a->sampling.ignore_eos = true;
    a->stream = true;
    add(&h, a);
    struct inf_err err;
    cur_step = 1;
    ck_assert_int_eq(eng_sched_step(h.s, &err), INF_OK); /* a's prefill and first token */
    struct eng_request *b = mkreq(2, longp, 600, 10);
    b->stream = true;
    add(&h, b);
    h_run(&h, 1000);
    /* 600 tokens at 63 per step (one budget token goes to a's decode): 10 steps,
     * during which a kept decoding; b's first token comes in the 11th step. */
    ck_assert_int_eq(outs[2].first_token_step, 1 + 10);
    ck_assert_int_eq(outs[1].ch[0].n_toks, 30);
    struct ref ra, rb;
    ref_greedy(shortp, 10, 30, 0, true, 1024, &ra);
    ref_greedy(longp, 600, 10, 0, false, 1024, &rb);
    assert_matches(&outs[1], 0, &ra);
    assert_matches(&outs[2], 0, &rb);
    ck_assert_int_gt(outs[1].ch[0].n_deltas, 10); /* streamed while b was prefilling */
    ref_free(&ra);
    ref_free(&rb);
    h_close(&h);
}
END_TEST

START_TEST(kv_exhaustion_preempts_and_recomputes)
{
    struct harness h;
    /* 24 blocks = 384 tokens; 12 sequences of 30 + 90 tokens need 8 blocks each */
    h_open(&h, 16, 256, 128, 24);
    enum { N = 12 };
    int32_t p[N][30];
    for (int k = 0; k < N; k++) {
        mkprompt(p[k], 30, (uint32_t)(50 + k));
        struct eng_request *r = mkreq((uint64_t)k + 1, p[k], 30, 90);
        r->sampling.ignore_eos = true;
        r->stream = k % 2 == 1;
        add(&h, r);
    }
    int max_used = 0;
    struct inf_err err;
    while (!eng_sched_idle(h.s)) {
        ck_assert_int_eq(eng_sched_step(h.s, &err), INF_OK);
        struct eng_stats st;
        eng_sched_stats(h.s, &st);
        ck_assert_int_le(st.kv_blocks_used, 24);
        if (st.kv_blocks_used > max_used)
            max_used = (int)st.kv_blocks_used;
    }
    struct eng_stats st;
    eng_sched_stats(h.s, &st);
    ck_assert_uint_gt(st.preemptions_total, 0);
    ck_assert_int_eq(max_used, 24);
    ck_assert_int_eq(st.kv_blocks_used, 0);
    for (int k = 0; k < N; k++) {
        struct ref ref;
        ref_greedy(p[k], 30, 90, 0, true, 128, &ref);
        assert_matches(&outs[k + 1], 0, &ref);
        ck_assert_int_eq(outs[k + 1].completion_tokens, 90);
        ref_free(&ref);
    }
    h_close(&h);
}
END_TEST

START_TEST(n3_shares_prompt_blocks)
{
    /* prompt lengths: a partial last block (recomputed by choices 1, 2) and
     * an exact multiple of the block (nothing to recompute) */
    int32_t lens[2] = {37, 32};
    for (int t = 0; t < 2; t++) {
        struct harness h;
        h_open(&h, 8, 256, 256, 64);
        int32_t p[64];
        mkprompt(p, lens[t], 9);
        struct eng_request *r = mkreq(1, p, lens[t], 50);
        r->n = 3;
        r->sampling.ignore_eos = true;
        add(&h, r);
        struct inf_err err;
        ck_assert_int_eq(eng_sched_step(h.s, &err), INF_OK); /* prefill + fork */
        struct eng_stats st;
        eng_sched_stats(h.s, &st);
        ck_assert_int_eq(st.running, 3);
        /* full prompt blocks once; each choice one block of its own */
        int full = lens[t] / 16;
        ck_assert_int_eq(st.kv_blocks_used, full + (lens[t] % 16 ? 1 : 0));
        h_run(&h, 1000);
        eng_sched_stats(h.s, &st);
        ck_assert_int_eq(st.kv_blocks_used, 0);
        struct ref ref;
        ref_greedy(p, lens[t], 50, 0, true, 256, &ref);
        for (int c = 0; c < 3; c++)
            assert_matches(&outs[1], c, &ref);
        ck_assert_int_eq(outs[1].n_done, 1);
        ck_assert_int_eq(outs[1].prompt_tokens, lens[t]);
        ck_assert_int_eq(outs[1].completion_tokens, 150);
        ref_free(&ref);
        h_close(&h);
    }
}
END_TEST

START_TEST(n3_sampled_choice_i_uses_seed_plus_i)
{
    int32_t p[21];
    mkprompt(p, 21, 77);
    struct harness h;
    h_open(&h, 8, 256, 256, 128);
    struct eng_request *r = mkreq(1, p, 21, 40);
    r->n = 3;
    r->sampling.temperature = 1.0f;
    r->sampling.has_seed = true;
    r->sampling.seed = 1234;
    r->sampling.ignore_eos = true;
    add(&h, r);
    for (int i = 0; i < 3; i++) {
        struct eng_request *q = mkreq(10 + (uint64_t)i, p, 21, 40);
        q->sampling.temperature = 1.0f;
        q->sampling.has_seed = true;
        q->sampling.seed = 1234 + (uint64_t)i;
        q->sampling.ignore_eos = true;
        add(&h, q);
    }
    h_run(&h, 1000);
    for (int i = 0; i < 3; i++) {
        const struct ch_out *a = &outs[1].ch[i], *b = &outs[10 + i].ch[0];
        ck_assert_int_eq(a->n_toks, 40);
        ck_assert_int_eq(b->n_toks, 40);
        ck_assert(memcmp(a->toks, b->toks, sizeof *a->toks * 40) == 0);
        ck_assert_str_eq(a->text.p, b->text.p);
    }
    /* different seeds differ somewhere in 40 sampled tokens */
    ck_assert(memcmp(outs[1].ch[0].toks, outs[1].ch[1].toks, sizeof(int32_t) * 40) != 0);
    h_close(&h);
}
END_TEST

START_TEST(seed_reproducible_in_any_batch)
{
    int32_t p[12];
    mkprompt(p, 12, 5);
    int32_t first[60];
    for (int run = 0; run < 2; run++) {
        struct harness h;
        h_open(&h, 16, 256, 256, 256);
        if (run == 1) /* the second time, among other requests */
            for (int k = 0; k < 6; k++) {
                int32_t o[9];
                mkprompt(o, 9, (uint32_t)(300 + k));
                struct eng_request *q = mkreq(20 + (uint64_t)k, o, 9, 50);
                q->sampling.temperature = 0.8f;
                add(&h, q);
            }
        struct eng_request *r = mkreq(1, p, 12, 60);
        r->sampling.temperature = 1.0f;
        r->sampling.top_p = 0.9f;
        r->sampling.top_k = 50;
        r->sampling.has_seed = true;
        r->sampling.seed = 42;
        r->sampling.ignore_eos = true;
        add(&h, r);
        h_run(&h, 1000);
        ck_assert_int_eq(outs[1].ch[0].n_toks, 60);
        if (run == 0)
            memcpy(first, outs[1].ch[0].toks, sizeof first);
        else
            ck_assert(memcmp(first, outs[1].ch[0].toks, sizeof first) == 0);
        h_close(&h);
    }
    /* and the sampled output is not simply the greedy one */
    struct ref ref;
    ref_greedy(p, 12, 60, 0, true, 256, &ref);
    ck_assert(memcmp(first, ref.toks, sizeof first) != 0);
    ref_free(&ref);
}
END_TEST

/* Find a prompt whose greedy output is long enough and has a 3-byte ASCII
 * substring at offset >= 6 (so the stop string spans three tokens). */
static void stop_case(int32_t *p, struct ref *ref, uint32_t *seed_out)
{
    for (uint32_t seed = 1; seed < 1000; seed++) {
        mkprompt(p, 20, seed);
        ref_greedy(p, 20, 60, 0, true, 512, ref);
        bool ascii = ref->len >= 20;
        for (int i = 0; ascii && i < 12; i++)
            ascii = ref->toks[i] != ENG_MOCK_EOS;
        for (size_t i = 6; ascii && i < 12; i++)
            ascii = (unsigned char)ref->text[i] < 0x80;
        if (ascii) {
            *seed_out = seed;
            return;
        }
        ref_free(ref);
    }
    ck_abort_msg("no prompt found");
}

START_TEST(stop_string_across_tokens)
{
    int32_t p[20];
    struct ref ref;
    uint32_t seed;
    stop_case(p, &ref, &seed);
    char stop[4];
    memcpy(stop, ref.text + 8, 3);
    stop[3] = '\0';
    size_t at = (size_t)(strstr(ref.text, stop) - ref.text); /* first occurrence */
    for (int stream = 0; stream < 2; stream++) {
        struct harness h;
        h_open(&h, 8, 256, 512, 128);
        struct eng_request *r = mkreq(1, p, 20, 60);
        r->sampling.ignore_eos = true;
        r->stream = stream;
        r->n_stop = 2;
        r->stop[0] = strdup("\x01never");
        r->stop[1] = strdup(stop);
        add(&h, r);
        h_run(&h, 1000);
        const struct ch_out *c = &outs[1].ch[0];
        ck_assert_int_eq(c->fin, ENG_FINISH_STOP);
        ck_assert_uint_eq(c->text.len, at);
        ck_assert(memcmp(c->text.p, ref.text, at) == 0);
        /* tokens: up to the one that completed the stop string (byte tokens) */
        ck_assert_int_eq(c->n_toks, (int32_t)(at + 3));
        ck_assert_int_eq(outs[1].completion_tokens, (int32_t)(at + 3));
        if (stream) /* text came out in several deltas, none with a piece of the stop */
            ck_assert_int_gt(c->n_deltas, 2);
        h_close(&h);
    }
    ref_free(&ref);
}
END_TEST

START_TEST(stop_string_multibyte)
{
    /* a stop string that is one two-byte character (two tokens of the mock) */
    int32_t p[20];
    struct ref ref;
    const char *hit = NULL;
    for (uint32_t seed = 1; seed < 2000 && !hit; seed++) {
        mkprompt(p, 20, seed);
        ref_greedy(p, 20, 80, 0, true, 512, &ref);
        hit = ref.len > 4 ? strstr(ref.text + 2, "\xC3") : NULL;
        if (!hit)
            ref_free(&ref);
    }
    ck_assert_ptr_nonnull(hit);
    char stop[3] = {hit[0], hit[1], 0};
    size_t at = (size_t)(strstr(ref.text, stop) - ref.text);
    for (int stream = 0; stream < 2; stream++) {
        struct harness h;
        h_open(&h, 8, 256, 512, 128);
        struct eng_request *r = mkreq(1, p, 20, 80);
        r->sampling.ignore_eos = true;
        r->stream = stream;
        r->n_stop = 1;
        r->stop[0] = strdup(stop);
        add(&h, r);
        h_run(&h, 1000);
        const struct ch_out *c = &outs[1].ch[0];
        ck_assert_int_eq(c->fin, ENG_FINISH_STOP);
        ck_assert_uint_eq(c->text.len, at);
        ck_assert(memcmp(c->text.p ? c->text.p : "", ref.text, at) == 0);
        h_close(&h);
    }
    ref_free(&ref);
}
END_TEST

START_TEST(stop_prefix_held_then_released)
{
    /* The stop string's first two bytes appear in the output but not its
     * third: the held-back text is released, and the output is complete. */
    int32_t p[20];
    struct ref ref;
    uint32_t seed;
    stop_case(p, &ref, &seed);
    char stop[4] = {ref.text[8], ref.text[9], '\x7f', 0};
    struct harness h;
    h_open(&h, 8, 256, 512, 128);
    struct eng_request *r = mkreq(1, p, 20, 60);
    r->sampling.ignore_eos = true;
    r->stream = true;
    r->n_stop = 1;
    r->stop[0] = strdup(stop);
    add(&h, r);
    struct inf_err err;
    /* after the step producing output byte 9, bytes 8..9 are held */
    for (int i = 0; i < 10; i++)
        ck_assert_int_eq(eng_sched_step(h.s, &err), INF_OK);
    struct eng_stats st;
    eng_sched_stats(h.s, &st);
    ck_assert_uint_eq(st.generation_tokens_total, 10);
    ck_assert_uint_eq(outs[1].ch[0].text.len, 8);
    ck_assert(memcmp(outs[1].ch[0].text.p, ref.text, 8) == 0);
    h_run(&h, 1000);
    assert_matches(&outs[1], 0, &ref);
    h_close(&h);
    ref_free(&ref);
}
END_TEST

/* A detokenizer whose every token is WIDE bytes of 'a': long texts from few
 * tokens. */
#define WIDE 4096
static void *wide_open(void *self, const int32_t *prompt, int32_t n_prompt)
{
    (void)self;
    (void)prompt;
    (void)n_prompt;
    return malloc(1);
}
static inf_status_t wide_push(void *st, int32_t tok, struct eng_strbuf *out)
{
    static char a[WIDE];
    (void)st;
    (void)tok;
    memset(a, 'a', sizeof a);
    return eng_strbuf_append(out, a, sizeof a);
}
static inf_status_t wide_flush(void *st, struct eng_strbuf *out)
{
    (void)st;
    (void)out;
    return INF_OK;
}
static const struct eng_detok_ops wide_detok = {NULL, wide_open, wide_push, wide_flush, free};

static double thread_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Seconds to generate n tokens of WIDE bytes each, not streamed, with the
 * stop strings given (none of which occurs). */
static double wide_run(int32_t n, const char *stop0, const char *stop1)
{
    struct harness h;
    h_open_detok(&h, 4, 256, 2048, 128, &wide_detok);
    int32_t p[4] = {ENG_MOCK_BYTE0 + 'x', ENG_MOCK_BYTE0 + 'y', ENG_MOCK_BYTE0 + 'z',
                    ENG_MOCK_BYTE0 + 'w'};
    struct eng_request *r = mkreq(1, p, 4, n);
    r->sampling.ignore_eos = true;
    r->stop[r->n_stop++] = strdup(stop0);
    if (stop1)
        r->stop[r->n_stop++] = strdup(stop1);
    add(&h, r);
    /* CPU time of this thread (the harness steps the scheduler here), so
     * other processes on a loaded machine do not count. */
    double t0 = thread_seconds();
    h_run(&h, n + 10);
    double t = thread_seconds() - t0;
    ck_assert_int_eq(outs[1].ch[0].n_toks, n);
    ck_assert_int_eq(outs[1].ch[0].fin, ENG_FINISH_LENGTH);
    ck_assert_uint_eq(outs[1].ch[0].text.len, (size_t)n * WIDE);
    h_close(&h);
    return t;
}

/* Looking for stop strings costs each token only its new text: a long stop
 * string beside a short one must not make every token search the whole
 * text again (quadratic in the output, on the engine thread that every
 * request shares). */
START_TEST(stop_search_is_incremental)
{
    enum { N = 2000 };
    size_t long_len = (size_t)N * WIDE + 1; /* longer than the whole text */
    char *longstop = malloc(long_len + 1);
    memset(longstop, 'b', long_len);
    longstop[long_len] = '\0';
    double short_only = wide_run(N, "zz", NULL);
    double both = wide_run(N, "zz", longstop);
    free(longstop);
    ck_assert_msg(both < 3 * short_only + 0.4, "with a long stop string %.3f s, without %.3f s",
                  both, short_only);
}
END_TEST

START_TEST(min_tokens_masks_eos_and_stops)
{
    /* a prompt whose greedy output ends with EOS early */
    int32_t p[16];
    struct ref ref;
    uint32_t seed;
    for (seed = 1; seed < 5000; seed++) {
        mkprompt(p, 16, seed);
        ref_greedy(p, 16, 200, 0, false, 512, &ref);
        if (ref.fin == ENG_FINISH_STOP && ref.n < 30)
            break;
        ref_free(&ref);
    }
    ck_assert_int_eq(ref.fin, ENG_FINISH_STOP);
    int32_t eos_at = ref.n;
    ref_free(&ref);

    struct harness h;
    h_open(&h, 8, 256, 512, 128);
    struct eng_request *r = mkreq(1, p, 16, 200);
    r->min_tokens = eos_at + 20;
    add(&h, r);
    /* without min_tokens: ends with EOS */
    struct eng_request *r2 = mkreq(2, p, 16, 200);
    add(&h, r2);
    h_run(&h, 1000);
    ref_greedy(p, 16, 200, eos_at + 20, false, 512, &ref);
    ck_assert_int_ge(ref.n, eos_at + 20);
    assert_matches(&outs[1], 0, &ref);
    ck_assert_int_eq(outs[2].ch[0].n_toks, eos_at);
    ck_assert_int_eq(outs[2].ch[0].toks[eos_at - 1], ENG_MOCK_EOS);
    ck_assert_int_eq(outs[2].ch[0].fin, ENG_FINISH_STOP);
    ref_free(&ref);

    /* a stop string that occurs within the first min_tokens is ignored there:
     * a prompt whose first 30 output tokens are ASCII bytes */
    for (seed = 1; seed < 5000; seed++) {
        mkprompt(p, 16, seed);
        ref_greedy(p, 16, 60, 0, true, 512, &ref);
        bool ok = ref.len >= 30;
        for (int i = 0; ok && i < 30; i++)
            ok = ref.toks[i] >= B(0x20) && ref.toks[i] < B(0x80);
        if (ok)
            break;
        ref_free(&ref);
    }
    char stop[2] = {ref.text[1], 0};
    const char *later = strchr(ref.text + 29, stop[0]);
    struct eng_request *r3 = mkreq(3, p, 16, 60);
    r3->sampling.ignore_eos = true;
    r3->min_tokens = 30;
    r3->n_stop = 1;
    r3->stop[0] = strdup(stop);
    add(&h, r3);
    h_run(&h, 1000);
    ck_assert((unsigned char)stop[0] < 0x80);
    if (later) {
        ck_assert_int_eq(outs[3].ch[0].fin, ENG_FINISH_STOP);
        ck_assert_uint_eq(outs[3].ch[0].text.len, (size_t)(later - ref.text));
    } else {
        ck_assert_int_eq(outs[3].ch[0].fin, ENG_FINISH_LENGTH);
    }
    ck_assert_int_ge(outs[3].ch[0].n_toks, 30);
    ref_free(&ref);
    h_close(&h);
}
END_TEST

START_TEST(max_tokens_and_context_limit)
{
    struct harness h;
    h_open(&h, 8, 256, 64, 32);
    int32_t p[64];
    mkprompt(p, 64, 8);
    struct eng_request *a = mkreq(1, p, 50, 100); /* context: 64 - 50 = 14 tokens */
    a->sampling.ignore_eos = true;
    add(&h, a);
    struct eng_request *b = mkreq(2, p, 20, 7);
    b->sampling.ignore_eos = true;
    add(&h, b);
    struct eng_request *c = mkreq(3, p, 63, 5); /* room for exactly one token */
    c->sampling.ignore_eos = true;
    add(&h, c);
    h_run(&h, 1000);
    ck_assert_int_eq(outs[1].ch[0].n_toks, 14);
    ck_assert_int_eq(outs[1].ch[0].fin, ENG_FINISH_LENGTH);
    ck_assert_int_eq(outs[2].ch[0].n_toks, 7);
    ck_assert_int_eq(outs[2].ch[0].fin, ENG_FINISH_LENGTH);
    ck_assert_int_eq(outs[3].ch[0].n_toks, 1);
    ck_assert_int_eq(outs[3].ch[0].fin, ENG_FINISH_LENGTH);
    struct ref ref;
    ref_greedy(p, 50, 100, 0, true, 64, &ref);
    assert_matches(&outs[1], 0, &ref);
    ref_free(&ref);
    /* a prompt that fills the context is refused */
    struct inf_err err;
    struct eng_request *d = mkreq(4, p, 64, 1);
    ck_assert_int_eq(eng_sched_add(h.s, d, 0, &err), INF_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err.msg, "prompt"));
    eng_request_destroy(d);
    h_close(&h);
}
END_TEST

START_TEST(cancel_running_and_queued)
{
    struct harness h;
    h_open(&h, 1, 64, 256, 32);
    int32_t p[40];
    mkprompt(p, 40, 4);
    struct eng_request *a = mkreq(1, p, 40, 100);
    a->sampling.ignore_eos = true;
    a->stream = true;
    add(&h, a);
    struct eng_request *b = mkreq(2, p, 30, 100);
    add(&h, b);
    struct inf_err err;
    for (int i = 0; i < 5; i++)
        ck_assert_int_eq(eng_sched_step(h.s, &err), INF_OK);
    struct eng_stats st;
    eng_sched_stats(h.s, &st);
    ck_assert_int_eq(st.running, 1);
    ck_assert_int_eq(st.waiting, 1);
    ck_assert_int_gt(st.kv_blocks_used, 0);
    ck_assert_uint_eq(eng_sched_dequeued(h.s), 1);
    eng_sched_cancel(h.s, 2); /* queued */
    ck_assert_int_eq(outs[2].n_done, 1);
    ck_assert_int_eq(outs[2].ch[0].fin, ENG_FINISH_ABORT);
    ck_assert_int_eq(outs[2].completion_tokens, 0);
    ck_assert_uint_eq(eng_sched_dequeued(h.s), 2);
    eng_sched_cancel(h.s, 1); /* running */
    ck_assert_int_eq(outs[1].n_done, 1);
    ck_assert_int_eq(outs[1].ch[0].fin, ENG_FINISH_ABORT);
    ck_assert_int_eq(outs[1].completion_tokens, 5);
    eng_sched_cancel(h.s, 99); /* unknown: ignored */
    eng_sched_stats(h.s, &st);
    ck_assert_int_eq(st.kv_blocks_used, 0);
    ck_assert_int_eq(st.running, 0);
    ck_assert_int_eq(st.waiting, 0);
    /* a step queued ahead (the device-sampling case: b waited for the one
     * slot) is collected by one more step, which finds nothing left to do */
    if (!eng_sched_idle(h.s)) {
        ck_assert(g_dev);
        ck_assert_int_eq(eng_sched_step(h.s, &err), INF_OK);
    }
    ck_assert(eng_sched_idle(h.s));
    ck_assert(!outs[1].event_after_end);
    /* abort_all ends a running request the same way */
    struct eng_request *c = mkreq(3, p, 40, 100);
    add(&h, c);
    ck_assert_int_eq(eng_sched_step(h.s, &err), INF_OK);
    eng_sched_abort_all(h.s);
    ck_assert_int_eq(outs[3].n_done, 1);
    ck_assert_int_eq(outs[3].ch[0].fin, ENG_FINISH_ABORT);
    eng_sched_stats(h.s, &st);
    ck_assert_int_eq(st.kv_blocks_used, 0);
    h_close(&h);
}
END_TEST

START_TEST(cancel_n3_after_fork)
{
    struct harness h;
    h_open(&h, 8, 256, 256, 64);
    int32_t p[40];
    mkprompt(p, 40, 6);
    struct eng_request *c = mkreq(1, p, 40, 100);
    c->n = 3;
    c->sampling.ignore_eos = true;
    add(&h, c);
    struct inf_err err;
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(eng_sched_step(h.s, &err), INF_OK);
    eng_sched_cancel(h.s, 1);
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(outs[1].ch[i].fin, ENG_FINISH_ABORT);
        ck_assert_int_eq(outs[1].ch[i].n_final, 1);
    }
    ck_assert_int_eq(outs[1].n_done, 1);
    ck_assert_int_eq(outs[1].completion_tokens, 9);
    struct eng_stats st;
    eng_sched_stats(h.s, &st);
    ck_assert_int_eq(st.kv_blocks_used, 0);
    h_close(&h);
}
END_TEST

START_TEST(validation_names_the_field)
{
    struct harness h;
    h_open(&h, 4, 64, 128, 16);
    int32_t p[4] = {B('a'), B('b'), VOCAB, B('c')};
    struct inf_err err;
    struct eng_request *r = mkreq(1, p, 4, 5);
    ck_assert_int_eq(eng_sched_validate(h.s, r, &err), INF_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err.msg, "token id 512"));
    r->prompt[2] = B('x');
    ck_assert_int_eq(eng_sched_validate(h.s, r, &err), INF_OK);
    r->n = 5;
    ck_assert_int_eq(eng_sched_validate(h.s, r, &err), INF_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err.msg, "n:"));
    r->n = 1;
    r->min_tokens = 6;
    ck_assert_int_eq(eng_sched_validate(h.s, r, &err), INF_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err.msg, "min_tokens"));
    r->min_tokens = 0;
    r->sampling.logprobs = 6;
    ck_assert_int_eq(eng_sched_validate(h.s, r, &err), INF_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err.msg, "logprobs"));
    eng_request_destroy(r);
    /* the configuration is checked too */
    struct eng_sched_config sc = {
        .max_batch = 4, .max_batched_tokens = 64, .max_model_len = 128, .kv_blocks = 7};
    eng_sched_t *s2 = NULL;
    ck_assert_int_eq(eng_sched_create(&sc, &h.lm, &eng_mock_detok, collect, NULL, &s2, &err),
                     INF_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err.msg, "kv_cache_tokens"));
    h_close(&h);
}
END_TEST

START_TEST(logprobs_of_the_chosen_token)
{
    struct harness h;
    h_open(&h, 4, 64, 128, 16);
    int32_t p[10];
    mkprompt(p, 10, 31);
    struct eng_request *r = mkreq(1, p, 10, 3);
    r->sampling.logprobs = 2;
    r->sampling.ignore_eos = true;
    r->stream = true;
    add(&h, r);
    h_run(&h, 100);
    const struct ch_out *c = &outs[1].ch[0];
    ck_assert_int_eq(c->n_toks, 3);
    int32_t hist[16];
    memcpy(hist, p, sizeof p);
    for (int i = 0; i < 3; i++) {
        float lg[VOCAB];
        eng_mock_logits(VOCAB, hist, 10 + i, lg);
        double mx = lg[argmax_row(lg, VOCAB)], sum = 0;
        for (int v = 0; v < VOCAB; v++)
            sum += exp(lg[v] - mx);
        int32_t am = argmax_row(lg, VOCAB);
        ck_assert_int_eq(c->toks[i], am);
        ck_assert_float_eq_tol(c->info[i].logprob, (float)(lg[am] - mx - log(sum)), 1e-4);
        ck_assert_int_eq(c->info[i].n_top, 2);
        ck_assert_int_eq(c->info[i].top_ids[0], am);
        ck_assert_float_eq_tol(c->info[i].top_logprobs[0], c->info[i].logprob, 1e-6);
        ck_assert_float_le(c->info[i].top_logprobs[1], c->info[i].top_logprobs[0]);
        hist[10 + i] = am;
    }
    h_close(&h);
}
END_TEST

/* The prompt's logprobs against a naive log-softmax of the mock's logits
 * over each prefix: the ENG_EV_PROMPT event of a request with
 * prompt_logprobs, once, before its first delta. */
static void assert_prompt_logprobs(const struct req_out *o, const int32_t *p, int32_t n,
                                   int32_t n_top)
{
    ck_assert_int_eq(o->n_prompt_events, 1);
    ck_assert(!o->prompt_after_delta);
    ck_assert_int_eq(o->n_plp, n);
    ck_assert_int_eq(o->plp[0].id, p[0]);
    ck_assert(isnan(o->plp[0].logprob));
    ck_assert_int_eq(o->plp[0].n_top, 0);
    for (int32_t i = 1; i < n; i++) {
        float lg[VOCAB];
        eng_mock_logits(VOCAB, p, i, lg); /* after p[i-1], history p[0..i) */
        double mx = -INFINITY, sum = 0;
        for (int v = 0; v < VOCAB; v++)
            mx = lg[v] > mx ? lg[v] : mx;
        for (int v = 0; v < VOCAB; v++)
            sum += exp((double)lg[v] - mx);
        double lse = mx + log(sum);
        const struct eng_token_info *t = &o->plp[i];
        ck_assert_int_eq(t->id, p[i]);
        ck_assert_double_eq_tol(t->logprob, lg[p[i]] - lse, 1e-4);
        ck_assert_int_eq(t->n_top, n_top);
        /* The n_top largest, by selection: most likely first, lowest id on ties. */
        bool used[VOCAB] = {false};
        for (int32_t k = 0; k < n_top; k++) {
            int best = -1;
            for (int v = 0; v < VOCAB; v++)
                if (!used[v] && (best < 0 || lg[v] > lg[best]))
                    best = v;
            used[best] = true;
            ck_assert_int_eq(t->top_ids[k], best);
            ck_assert_double_eq_tol(t->top_logprobs[k], lg[best] - lse, 1e-4);
        }
    }
}

START_TEST(prompt_logprobs_match_naive_log_softmax)
{
    struct harness h;
    /* A 150-token prompt in chunks of at most 32 (and 64 scored rows a
     * step), next to plain requests; n 2 shares the prompt. */
    h_open(&h, 8, 32, 512, 128);
    int32_t p[150], q[40], one[1] = {B('Q')};
    mkprompt(p, 150, 71);
    mkprompt(q, 40, 72);
    struct eng_request *a = mkreq(1, p, 150, 5);
    a->sampling.logprobs = 3;
    a->sampling.ignore_eos = true;
    a->prompt_logprobs = true;
    a->n = 2;
    add(&h, a);
    struct eng_request *b = mkreq(2, q, 40, 5); /* no prompt logprobs */
    b->sampling.logprobs = 1;
    b->sampling.ignore_eos = true;
    add(&h, b);
    struct eng_request *c = mkreq(3, one, 1, 4); /* nothing to score but the first token */
    c->sampling.logprobs = 0;
    c->sampling.ignore_eos = true;
    c->prompt_logprobs = true;
    c->stream = true;
    add(&h, c);
    struct eng_request *d = mkreq(4, q, 40, 4); /* prompt_logprobs without logprobs: none */
    d->prompt_logprobs = true;
    d->sampling.ignore_eos = true;
    add(&h, d);
    h_run(&h, 200);

    assert_prompt_logprobs(&outs[1], p, 150, 3);
    assert_prompt_logprobs(&outs[3], one, 1, 0);
    ck_assert_int_eq(outs[2].n_prompt_events, 0);
    ck_assert_int_eq(outs[4].n_prompt_events, 0);
    /* Scoring the prompt changes nothing of what is generated. */
    struct ref ref;
    ref_greedy(p, 150, 5, 0, true, 512, &ref);
    assert_matches(&outs[1], 0, &ref);
    assert_matches(&outs[1], 1, &ref);
    ref_free(&ref);
    ref_greedy(q, 40, 5, 0, true, 512, &ref);
    assert_matches(&outs[2], 0, &ref);
    ref_free(&ref);
    ref_greedy(one, 1, 4, 0, true, 512, &ref);
    assert_matches(&outs[3], 0, &ref);
    ref_free(&ref);
    h_close(&h);
}
END_TEST

START_TEST(prompt_logprobs_once_across_preemption)
{
    struct harness h;
    /* 16 blocks hold one sequence of 256 tokens: A (100 + 150) and B
     * (120 + 60, scored) cannot both finish without B being preempted. */
    h_open(&h, 4, 16, 256, 16);
    int32_t pa[100], pb[120];
    mkprompt(pa, 100, 81);
    mkprompt(pb, 120, 82);
    struct eng_request *a = mkreq(1, pa, 100, 150);
    a->sampling.ignore_eos = true;
    add(&h, a);
    struct eng_request *b = mkreq(2, pb, 120, 60);
    b->sampling.ignore_eos = true;
    b->sampling.logprobs = 2;
    b->prompt_logprobs = true;
    add(&h, b);
    h_run(&h, 2000);
    struct eng_stats st;
    eng_sched_stats(h.s, &st);
    ck_assert_uint_gt(st.preemptions_total, 0);
    assert_prompt_logprobs(&outs[2], pb, 120, 2);
    struct ref ref;
    ref_greedy(pb, 120, 60, 0, true, 256, &ref);
    assert_matches(&outs[2], 0, &ref);
    ref_free(&ref);
    ref_greedy(pa, 100, 150, 0, true, 256, &ref);
    assert_matches(&outs[1], 0, &ref);
    ref_free(&ref);
    h_close(&h);
}
END_TEST

START_TEST(sampling_settings_reach_the_sampler)
{
    struct harness h;
    h_open(&h, 4, 64, 128, 16);
    int32_t p[10];
    mkprompt(p, 10, 12);
    /* a bias of +100 on 'q' wins every greedy step */
    struct eng_request *r = mkreq(1, p, 10, 6);
    r->sampling.n_logit_bias = 1;
    r->sampling.logit_bias_ids = malloc(sizeof(int32_t));
    r->sampling.logit_bias_vals = malloc(sizeof(float));
    r->sampling.logit_bias_ids[0] = B('q');
    r->sampling.logit_bias_vals[0] = 100.0f;
    add(&h, r);
    h_run(&h, 100);
    ck_assert_str_eq(outs[1].ch[0].text.p, "qqqqqq");
    struct eng_stats st;
    eng_sched_stats(h.s, &st);
    ck_assert_int_eq(st.kv_blocks_used, 0);
    /* out-of-range settings are refused at submission, by name */
    struct inf_err err;
    struct eng_request *y = mkreq(3, p, 10, 6);
    y->sampling.presence_penalty = 2.5f;
    ck_assert_int_eq(eng_sched_add(h.s, y, 0, &err), INF_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err.msg, "presence_penalty"));
    y->sampling.presence_penalty = 0.0f;
    y->sampling.top_p = 0.0f;
    ck_assert_int_eq(eng_sched_add(h.s, y, 0, &err), INF_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err.msg, "top_p"));
    y->sampling.top_p = 1.0f;
    y->sampling.n_logit_bias = 1;
    y->sampling.logit_bias_ids = calloc(1, sizeof(int32_t));
    y->sampling.logit_bias_vals = malloc(sizeof(float));
    y->sampling.logit_bias_vals[0] = -INFINITY;
    ck_assert_int_eq(eng_sched_add(h.s, y, 0, &err), INF_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err.msg, "logit_bias"));
    ck_assert_ptr_nonnull(strstr(err.msg, "finite"));
    eng_request_destroy(y);
    h_close(&h);
}
END_TEST

/* ---- decode steps queued ahead (the "overlap" case) ------------------------------------- */
START_TEST(overlap_queues_decode_steps_ahead)
{
    /* Greedy requests of different lengths decoding together, on the
     * device-sampling mock: the scheduler queues each decode step behind
     * the one in flight; outputs equal the reference. */
    struct harness h;
    h_open(&h, 8, 256, 512, 256);
    enum { N = 8 };
    int32_t p[N][40];
    for (int k = 0; k < N; k++) {
        mkprompt(p[k], 10 + 3 * k, (uint32_t)(300 + k));
        struct eng_request *r = mkreq((uint64_t)k + 1, p[k], 10 + 3 * k, 20 + 9 * k);
        r->sampling.ignore_eos = k % 2 == 0;
        r->stream = k % 3 == 0;
        add(&h, r);
    }
    int steps = h_run(&h, 1000);
    struct eng_stats st;
    eng_sched_stats(h.s, &st);
    /* one step of prefills (each with its first token), then a decode step
     * a token of the longest; each after the first decode step was queued
     * ahead */
    int32_t longest = 0;
    for (int k = 0; k < N; k++)
        longest = outs[k + 1].completion_tokens > longest ? outs[k + 1].completion_tokens : longest;
    ck_assert_int_ge(longest, 74); /* request 7 (ignore_eos) */
    ck_assert_int_eq(steps, longest);
    ck_assert_uint_eq(st.steps_ahead_total, (uint64_t)steps - 2);
    for (int k = 0; k < N; k++) {
        struct ref ref;
        ref_greedy(p[k], 10 + 3 * k, 20 + 9 * k, 0, k % 2 == 0, 512, &ref);
        assert_matches(&outs[k + 1], 0, &ref);
        ck_assert_int_eq(outs[k + 1].n_done, 1);
        ck_assert(!outs[k + 1].event_after_end);
        ref_free(&ref);
    }
    ck_assert_int_eq(st.kv_blocks_used, 0);
    h_close(&h);
}
END_TEST

/* One run of a mixed workload (sampled with seeds, stop strings, min_tokens,
 * logit_bias, penalties, n = 2, late arrivals) on the device-sampling mock;
 * outs keeps the results. */
static uint64_t mixed_run(bool overlap)
{
    g_no_overlap = !overlap;
    struct harness h;
    h_open(&h, 6, 64, 256, 64);
    g_no_overlap = false;
    enum { N = 14 };
    static int32_t p[N][50];
    int added = 0, steps = 0;
    struct inf_err err;
    while (added < N || !eng_sched_idle(h.s)) {
        if (added < N && (steps % 7 == 0 || added < 4)) {
            int k = added++;
            int32_t n = 3 + (k * 11) % 45;
            mkprompt(p[k], n, (uint32_t)(700 + k));
            struct eng_request *r = mkreq((uint64_t)k + 1, p[k], n, 10 + (k * 13) % 50);
            r->stream = k % 2 == 0;
            if (k % 3 == 1) {
                r->sampling.temperature = 0.8f;
                r->sampling.seed = 1000 + k;
                r->sampling.has_seed = true;
            }
            if (k % 4 == 2) {
                r->n_stop = 1;
                r->stop[0] = strdup(" ");
            }
            if (k % 5 == 3)
                r->min_tokens = 8;
            if (k == 5) {
                r->sampling.n_logit_bias = 1;
                r->sampling.logit_bias_ids = malloc(sizeof(int32_t));
                r->sampling.logit_bias_vals = malloc(sizeof(float));
                r->sampling.logit_bias_ids[0] = B('k');
                r->sampling.logit_bias_vals[0] = 1.5f;
            }
            if (k == 9)
                r->sampling.presence_penalty = 0.5f;
            if (k == 11)
                r->n = 2;
            add(&h, r);
        }
        cur_step++;
        ck_assert_msg(eng_sched_step(h.s, &err) == INF_OK, "step: %s", err.msg);
        ck_assert_int_lt(++steps, 2000);
    }
    struct eng_stats st;
    eng_sched_stats(h.s, &st);
    ck_assert_int_eq(st.kv_blocks_used, 0);
    /* the results stay in outs; only the scheduler goes */
    eng_sched_destroy(h.s);
    h.lm.destroy(h.lm.self);
    return st.steps_ahead_total;
}

START_TEST(overlap_matches_one_step_at_a_time)
{
    enum { N = 14 };
    static struct req_out one[N + 1];
    ck_assert_uint_eq(mixed_run(false), 0);
    memcpy(one, outs, sizeof one);
    memset(outs, 0, sizeof one); /* the texts and tokens now belong to one */
    ck_assert_uint_gt(mixed_run(true), 20);
    for (int k = 1; k <= N; k++) {
        int nch = k == 12 ? 2 : 1;
        ck_assert_int_eq(outs[k].n_done, 1);
        ck_assert_int_eq(outs[k].n_error, 0);
        ck_assert_int_eq(outs[k].completion_tokens, one[k].completion_tokens);
        for (int c = 0; c < nch; c++) {
            const struct ch_out *a = &one[k].ch[c], *b = &outs[k].ch[c];
            ck_assert_int_eq(b->fin, a->fin);
            ck_assert_int_eq(b->n_toks, a->n_toks);
            for (int32_t i = 0; i < a->n_toks; i++)
                ck_assert_int_eq(b->toks[i], a->toks[i]);
            ck_assert_uint_eq(b->text.len, a->text.len);
            ck_assert(memcmp(b->text.p ? b->text.p : "", a->text.p ? a->text.p : "", a->text.len) ==
                      0);
        }
    }
    for (int k = 0; k <= N; k++)
        for (int c = 0; c < MAXC; c++) {
            eng_strbuf_fini(&one[k].ch[c].text);
            free(one[k].ch[c].toks);
            free(one[k].ch[c].info);
        }
    outs_reset();
}
END_TEST

START_TEST(overlap_with_a_backlog)
{
    /* More requests than max_batch: while the batch is full and no running
     * sequence ends by length in the step in flight, the waiting ones
     * cannot be admitted anyway, so decode steps are still queued ahead;
     * every request is served and equals the reference. */
    struct harness h;
    h_open(&h, 4, 256, 512, 256);
    enum { N = 12 };
    int32_t p[N][30];
    for (int k = 0; k < N; k++) {
        mkprompt(p[k], 12 + k, (uint32_t)(500 + k));
        struct eng_request *r = mkreq((uint64_t)k + 1, p[k], 12 + k, 15 + 7 * (k % 4));
        r->sampling.ignore_eos = k % 3 != 0;
        add(&h, r);
    }
    int steps = h_run(&h, 2000);
    struct eng_stats st;
    eng_sched_stats(h.s, &st);
    ck_assert_int_eq(st.max_running_seen, 4);
    /* at least half of the steps went ahead, backlog or not */
    ck_assert_uint_ge(2 * st.steps_ahead_total, (uint64_t)steps);
    for (int k = 0; k < N; k++) {
        struct ref ref;
        ref_greedy(p[k], 12 + k, 15 + 7 * (k % 4), 0, k % 3 != 0, 512, &ref);
        assert_matches(&outs[k + 1], 0, &ref);
        ck_assert_int_eq(outs[k + 1].n_done, 1);
        ref_free(&ref);
    }
    ck_assert_int_eq(st.kv_blocks_used, 0);
    h_close(&h);
}
END_TEST

START_TEST(overlap_cancel_while_a_step_is_ahead)
{
    /* Cancelling a request whose row is in the step queued ahead: its row
     * is dropped, the others go on, every block comes back. */
    struct harness h;
    h_open(&h, 4, 64, 256, 64);
    int32_t p[3][20];
    for (int k = 0; k < 3; k++) {
        mkprompt(p[k], 20, (uint32_t)(900 + k));
        struct eng_request *r = mkreq((uint64_t)k + 1, p[k], 20, 40);
        r->sampling.ignore_eos = true;
        add(&h, r);
    }
    struct inf_err err;
    for (int i = 0; i < 6; i++)
        ck_assert_int_eq(eng_sched_step(h.s, &err), INF_OK);
    struct eng_stats st;
    eng_sched_stats(h.s, &st);
    ck_assert_uint_gt(st.steps_ahead_total, 0);
    eng_sched_cancel(h.s, 2);
    ck_assert_int_eq(outs[2].n_done, 1);
    ck_assert_int_eq(outs[2].ch[0].fin, ENG_FINISH_ABORT);
    ck_assert_int_eq(outs[2].completion_tokens, 6);
    h_run(&h, 1000);
    ck_assert(!outs[2].event_after_end);
    for (int k = 0; k < 3; k += 2) {
        struct ref ref;
        ref_greedy(p[k], 20, 40, 0, true, 256, &ref);
        assert_matches(&outs[k + 1], 0, &ref);
        ref_free(&ref);
    }
    /* everything cancelled with a step ahead: one more step collects it */
    struct eng_request *r = mkreq(9, p[0], 20, 40);
    r->sampling.ignore_eos = true;
    add(&h, r);
    for (int i = 0; i < 4; i++)
        ck_assert_int_eq(eng_sched_step(h.s, &err), INF_OK);
    eng_sched_abort_all(h.s);
    ck_assert_int_eq(outs[9].ch[0].fin, ENG_FINISH_ABORT);
    h_run(&h, 10);
    ck_assert(eng_sched_idle(h.s));
    eng_sched_stats(h.s, &st);
    ck_assert_int_eq(st.kv_blocks_used, 0);
    h_close(&h);
}
END_TEST

START_TEST(overlap_device_failure)
{
    /* A device failure with a step queued ahead: the step fails, every
     * request ends with an error, and the scheduler is idle again. */
    g_fail_at = 8;
    struct harness h;
    h_open(&h, 4, 64, 256, 64);
    g_fail_at = 0;
    int32_t p[20];
    mkprompt(p, 20, 77);
    for (int k = 0; k < 3; k++) {
        struct eng_request *r = mkreq((uint64_t)k + 1, p, 20, 40);
        r->sampling.ignore_eos = true;
        add(&h, r);
    }
    struct inf_err err;
    inf_status_t st = INF_OK;
    for (int i = 0; i < 20 && st == INF_OK; i++)
        st = eng_sched_step(h.s, &err);
    ck_assert_int_eq(st, INF_E_DEVICE);
    eng_sched_fail_all(h.s, INF_E_DEVICE, "the engine failed");
    ck_assert(eng_sched_idle(h.s));
    for (int k = 1; k <= 3; k++)
        ck_assert_int_eq(outs[k].n_error, 1);
    h_close(&h);
}
END_TEST

/* ---- prefix caching -------------------------------------------------------------------- */
/* Tokens the mock computed since the last call. */
static int64_t computed_since(struct harness *h, int64_t *last)
{
    int64_t now = eng_mock_tokens_computed(&h->lm), d = now - *last;
    *last = now;
    return d;
}

static void run_greedy_and_check(struct harness *h, uint64_t id, const int32_t *p, int32_t n,
                                 int32_t max_tokens, int32_t max_len)
{
    struct eng_request *r = mkreq(id, p, n, max_tokens);
    r->sampling.ignore_eos = true;
    add(h, r);
    h_run(h, 1000);
    struct ref ref;
    ref_greedy(p, n, max_tokens, 0, true, max_len, &ref);
    assert_matches(&outs[id], 0, &ref);
    ck_assert_int_eq(outs[id].n_done, 1);
    ref_free(&ref);
}

START_TEST(prefix_hit_skips_computation)
{
    /* Requests whose tokens start with cached blocks compute only the rest
     * (the mock counts what its steps compute), and answer as the
     * reference does. */
    struct harness h;
    h_open(&h, 8, 256, 512, 128);
    static int32_t a[100], q[200];
    mkprompt(a, 100, 1);
    int64_t last = 0;
    run_greedy_and_check(&h, 1, a, 100, 30, 512);
    ck_assert_int_eq(computed_since(&h, &last), 100 + 29);
    struct eng_stats st;
    eng_sched_stats(h.s, &st);
    ck_assert_uint_eq(st.prefix_cache_queries_total, 100);
    ck_assert_uint_eq(st.prefix_cache_hits_total, 0);
    ck_assert_int_eq(st.kv_blocks_cached, 129 / 16); /* prompt and generated blocks */
    ck_assert_int_eq(st.kv_blocks_used, 0);

    /* {tokens of a, new tokens after them, the hit expected} */
    static const int32_t cases[][3] = {
        {96, 20, 96},  /* six blocks of a, then its own */
        {100, 0, 96},  /* a's prompt whole: its last block is computed again */
        {96, 0, 80},   /* six blocks exactly: the sixth computed for the logits */
        {10, 40, 0},   /* less than a block in common */
        {100, 30, 128} /* a's prompt and its 30 generated tokens (a second turn) */
    };
    uint64_t hits = 0, queries = 100;
    for (int c = 0; c < 5; c++) {
        int32_t n = cases[c][0] + cases[c][1];
        memcpy(q, a, sizeof *q * (size_t)cases[c][0]);
        if (c == 4)
            memcpy(q + 100, outs[1].ch[0].toks, sizeof *q * 30);
        else
            mkprompt(q + cases[c][0], cases[c][1], (uint32_t)(50 + c));
        run_greedy_and_check(&h, (uint64_t)c + 2, q, n, 5, 512);
        ck_assert_int_eq(computed_since(&h, &last), n - cases[c][2] + 4);
        hits += (uint64_t)cases[c][2];
        queries += (uint64_t)n;
        eng_sched_stats(h.s, &st);
        ck_assert_uint_eq(st.prefix_cache_hits_total, hits);
        ck_assert_uint_eq(st.prefix_cache_queries_total, queries);
        ck_assert_int_eq(st.kv_blocks_used, 0);
    }
    ck_assert_uint_eq(st.prompt_tokens_total, queries);
    h_close(&h);
}
END_TEST

/* The results of every request of outs[1..n] as text, floats exactly. */
static void snapshot(int n, struct eng_strbuf *sb)
{
    char line[256];
    for (int k = 1; k <= n; k++) {
        const struct req_out *o = &outs[k];
        int len = snprintf(line, sizeof line, "req %d done %d err %d usage %d %d plp %d\n", k,
                           o->n_done, o->n_error, o->prompt_tokens, o->completion_tokens, o->n_plp);
        eng_strbuf_append(sb, line, (size_t)len);
        for (int32_t i = 0; i < o->n_plp; i++) {
            const struct eng_token_info *t = &o->plp[i];
            len = snprintf(line, sizeof line, " p %d %a %d %d %a\n", t->id, t->logprob, t->n_top,
                           t->n_top ? t->top_ids[0] : -1, t->n_top ? t->top_logprobs[0] : 0.0f);
            eng_strbuf_append(sb, line, (size_t)len);
        }
        for (int c = 0; c < MAXC; c++) {
            const struct ch_out *ch = &o->ch[c];
            if (!ch->n_final)
                continue;
            len = snprintf(line, sizeof line, " choice %d fin %d toks %d text %zu\n", c, ch->fin,
                           ch->n_toks, ch->text.len);
            eng_strbuf_append(sb, line, (size_t)len);
            eng_strbuf_append(sb, ch->text.p ? ch->text.p : "", ch->text.len);
            for (int32_t i = 0; i < ch->n_toks; i++) {
                const struct eng_token_info *t = &ch->info[i];
                len = snprintf(line, sizeof line, " t %d %a %d", t->id, t->logprob, t->n_top);
                eng_strbuf_append(sb, line, (size_t)len);
                for (int32_t j = 0; j < t->n_top; j++) {
                    len = snprintf(line, sizeof line, " %d %a", t->top_ids[j], t->top_logprobs[j]);
                    eng_strbuf_append(sb, line, (size_t)len);
                }
                eng_strbuf_append(sb, "\n", 1);
            }
        }
    }
}

/* A workload sharing four "system prompts": greedy and seeded sampling,
 * logprobs, prompt logprobs, n = 3, stop strings, min_tokens, streaming,
 * arrivals over time, on a pool small enough to preempt. Its results as
 * text in sb; the stats in *st. */
static void shared_run(bool prefix, struct eng_strbuf *sb, struct eng_stats *st)
{
    enum { N = 48 };
    static int32_t sys[4][130], p[N][170];
    static const int32_t sys_len[4] = {20, 48, 75, 130};
    for (int i = 0; i < 4; i++)
        mkprompt(sys[i], sys_len[i], (uint32_t)(4000 + i));
    bool saved = g_prefix;
    g_prefix = prefix;
    struct harness h;
    h_open(&h, 8, 64, 256, 32);
    g_prefix = saved;
    int added = 0, steps = 0;
    struct inf_err err;
    while (added < N || !eng_sched_idle(h.s)) {
        if (added < N && (added < 3 || steps % 2 == 0)) {
            int k = added++;
            int32_t ls = sys_len[k % 4], lx = (k * 7) % 30, n = ls + lx;
            memcpy(p[k], sys[k % 4], sizeof(int32_t) * (size_t)ls);
            mkprompt(p[k] + ls, lx, (uint32_t)(4100 + k));
            struct eng_request *r = mkreq((uint64_t)k + 1, p[k], n, 8 + (k * 5) % 40);
            r->stream = k % 2;
            r->sampling.ignore_eos = k % 3 == 0;
            if (k % 3 == 1) {
                r->sampling.temperature = 0.9f;
                r->sampling.has_seed = true;
                r->sampling.seed = 100 + (uint64_t)k;
            }
            if (k % 5 == 2)
                r->sampling.logprobs = 2;
            if (k % 7 == 3) {
                r->prompt_logprobs = true;
                r->sampling.logprobs = 1;
            }
            if (k % 6 == 4)
                r->n = 3;
            if (k % 4 == 1) {
                r->n_stop = 1;
                r->stop[0] = strdup(" ");
            }
            if (k % 8 == 5)
                r->min_tokens = 4;
            add(&h, r);
        }
        cur_step++;
        ck_assert_msg(eng_sched_step(h.s, &err) == INF_OK, "step: %s", err.msg);
        ck_assert_int_lt(++steps, 5000);
    }
    eng_sched_stats(h.s, st);
    ck_assert_int_eq(st->kv_blocks_used, 0);
    snapshot(N, sb);
    h_close(&h);
}

START_TEST(prefix_on_matches_off)
{
    struct eng_strbuf off = {0}, on = {0};
    struct eng_stats st_off, st_on;
    shared_run(false, &off, &st_off);
    shared_run(true, &on, &st_on);
    ck_assert_uint_eq(st_off.prefix_cache_queries_total, 0);
    ck_assert_uint_eq(st_off.prefix_cache_hits_total, 0);
    ck_assert_int_eq(st_off.kv_blocks_cached, 0);
    ck_assert_uint_eq(st_on.prefix_cache_queries_total, st_on.prompt_tokens_total);
    ck_assert_uint_gt(st_on.prefix_cache_hits_total, st_on.prompt_tokens_total / 2);
    ck_assert_uint_gt(st_off.preemptions_total, 0);
    ck_assert_uint_eq(off.len, on.len);
    ck_assert(memcmp(off.p, on.p, off.len) == 0);
    eng_strbuf_fini(&off);
    eng_strbuf_fini(&on);
}
END_TEST

START_TEST(prefix_eviction_under_pressure)
{
    /* 24 blocks. Four prompts of 100 tokens (two tokens generated each)
     * leave six committed blocks each: the fourth needs one block more
     * than is free of cached content, and takes the one freed longest
     * ago, the tail of the first prompt. */
    struct harness h;
    h_open(&h, 4, 256, 128, 24);
    static int32_t p[4][100];
    for (int k = 0; k < 4; k++)
        mkprompt(p[k], 100, (uint32_t)(600 + k));
    struct eng_stats st;
    for (int k = 0; k < 4; k++) {
        run_greedy_and_check(&h, (uint64_t)k + 1, p[k], 100, 2, 128);
        eng_sched_stats(h.s, &st);
        ck_assert_int_eq(st.kv_blocks_cached, k < 3 ? 6 * (k + 1) : 23);
    }
    ck_assert_uint_eq(st.prefix_cache_hits_total, 0);
    /* the first prompt again: five of its blocks are left */
    int64_t last = eng_mock_tokens_computed(&h.lm);
    run_greedy_and_check(&h, 5, p[0], 100, 2, 128);
    ck_assert_int_eq(computed_since(&h, &last), 100 - 80 + 1);
    eng_sched_stats(h.s, &st);
    ck_assert_uint_eq(st.prefix_cache_hits_total, 80);
    /* it took the next block freed longest ago: the second prompt's tail */
    run_greedy_and_check(&h, 6, p[1], 100, 2, 128);
    eng_sched_stats(h.s, &st);
    ck_assert_uint_eq(st.prefix_cache_hits_total, 80 + 80);
    /* the newest is whole */
    run_greedy_and_check(&h, 7, p[3], 100, 2, 128);
    eng_sched_stats(h.s, &st);
    ck_assert_uint_eq(st.prefix_cache_hits_total, 80 + 80 + 96);
    ck_assert_int_le(st.kv_blocks_cached, 24);
    ck_assert_int_eq(st.kv_blocks_used, 0);
    h_close(&h);
}
END_TEST

START_TEST(prefix_10000_requests_no_leak)
{
    /* 10,000 requests from six shared prefixes with random suffixes,
     * lengths, n, streaming, prompt logprobs and cancellations, arriving
     * over time on a pool that preempts and evicts all along: every request
     * ends once, every greedy choice not cancelled equals the reference,
     * and every block comes back (nothing held, the free count is the
     * pool's). */
    enum { N = 10000, MAXP = 170 };
    struct harness h;
    h_open(&h, 16, 128, 256, 60);
    static int32_t sys[6][150], prompts[N][MAXP];
    static int32_t plen[N], mtok[N], nch[N];
    static bool cancelled[N], ign[N], greedy[N];
    static const int32_t sys_len[6] = {16, 33, 64, 80, 111, 150};
    for (int i = 0; i < 6; i++)
        mkprompt(sys[i], sys_len[i], (uint32_t)(7000 + i));
    uint32_t x = 4242;
#define RND(m) ((x = x * 1103515245u + 12345u), (int32_t)((x >> 16) % (uint32_t)(m)))
    int next = 0, steps = 0;
    struct inf_err err;
    struct eng_stats st;
    while (next < N || !eng_sched_idle(h.s)) {
        for (int a = RND(3); a > 0 && next < N; a--, next++) {
            int i = RND(6);
            int32_t shared = RND(4) == 0 ? RND(sys_len[i] + 1) : sys_len[i];
            int32_t suffix = RND(30) + (shared == 0);
            if (shared + suffix > MAXP)
                suffix = MAXP - shared;
            memcpy(prompts[next], sys[i], sizeof(int32_t) * (size_t)shared);
            mkprompt(prompts[next] + shared, suffix, (uint32_t)next * 13u + 5u);
            plen[next] = shared + suffix;
            mtok[next] = 1 + RND(40);
            nch[next] = RND(10) == 0 ? 2 + RND(2) : 1;
            ign[next] = RND(2);
            greedy[next] = RND(5) != 0;
            struct eng_request *r =
                mkreq((uint64_t)next + 1, prompts[next], plen[next], mtok[next]);
            r->n = nch[next];
            r->stream = RND(2);
            r->sampling.ignore_eos = ign[next];
            if (!greedy[next]) {
                r->sampling.temperature = 1.0f;
                /* no byte 0x00: the collected texts hold no NUL */
                r->sampling.n_logit_bias = 1;
                r->sampling.logit_bias_ids = malloc(sizeof(int32_t));
                r->sampling.logit_bias_vals = malloc(sizeof(float));
                r->sampling.logit_bias_ids[0] = B(0);
                r->sampling.logit_bias_vals[0] = -100.0f;
                r->sampling.has_seed = true;
                r->sampling.seed = (uint64_t)next;
            }
            if (RND(30) == 0) {
                r->prompt_logprobs = true;
                r->sampling.logprobs = 1;
            }
            add(&h, r);
        }
        if (next > 0 && RND(6) == 0) {
            int victim = next - 1 - RND(next < 64 ? next : 64);
            if (outs[victim + 1].n_done == 0) {
                cancelled[victim] = true;
                eng_sched_cancel(h.s, (uint64_t)victim + 1);
            }
        }
        cur_step++;
        ck_assert_msg(eng_sched_step(h.s, &err) == INF_OK, "step: %s", err.msg);
        ck_assert_int_lt(++steps, 200000);
        if (steps % 64 == 0) {
            eng_sched_stats(h.s, &st);
            ck_assert_int_le(st.kv_blocks_used, 60);
            ck_assert_int_le(st.kv_blocks_cached, 60);
        }
    }
#undef RND
    eng_sched_stats(h.s, &st);
    ck_assert_int_eq(st.kv_blocks_used, 0); /* the free count is back at the pool's 60 */
    ck_assert_int_eq(st.running, 0);
    ck_assert_int_eq(st.waiting, 0);
    ck_assert_uint_gt(st.preemptions_total, 100);
    ck_assert_uint_gt(st.prefix_cache_hits_total, st.prefix_cache_queries_total / 4);
    ck_assert_int_gt(st.kv_blocks_cached, 0);
    int checked = 0, n_cancelled = 0;
    for (int k = 0; k < N; k++) {
        const struct req_out *o = &outs[k + 1];
        ck_assert_int_eq(o->n_done, 1);
        ck_assert_int_eq(o->n_error, 0);
        ck_assert(!o->event_after_end);
        n_cancelled += cancelled[k];
        if (!greedy[k])
            continue;
        struct ref ref;
        ref_greedy(prompts[k], plen[k], mtok[k], 0, ign[k], 256, &ref);
        for (int c = 0; c < nch[k]; c++) {
            ck_assert_int_eq(o->ch[c].n_final, 1);
            if (o->ch[c].fin != ENG_FINISH_ABORT) {
                assert_matches(o, c, &ref);
                checked++;
            }
        }
        ref_free(&ref);
    }
    ck_assert_int_gt(n_cancelled, 500);
    ck_assert_int_gt(checked, N / 2);
    h_close(&h);
}
END_TEST

static uint64_t collide_all(uint64_t parent, const int32_t *ids)
{
    (void)parent;
    (void)ids;
    return 7;
}

START_TEST(prefix_forced_collision_does_not_alias)
{
    /* Every block hashes alike: only prefixes that truly agree are shared,
     * and every answer is the reference's (a block read under another
     * prefix would change the mock's logits). */
    g_hash = collide_all;
    struct harness h;
    h_open(&h, 8, 256, 256, 64);
    static int32_t a[64], b[64], c[64], d[64];
    mkprompt(a, 64, 11);
    mkprompt(b, 64, 12);
    memcpy(c, a, sizeof(int32_t) * 48); /* a's first three blocks, b's last */
    memcpy(c + 48, b + 48, sizeof(int32_t) * 16);
    memcpy(d, b, sizeof(int32_t) * 32); /* b's first two blocks, a's third and fourth */
    memcpy(d + 32, a + 32, sizeof(int32_t) * 32);
    const int32_t *ps[5] = {a, b, c, d, a};
    const uint64_t want[5] = {0, 0, 48, 32, 48};
    uint64_t hits = 0;
    struct eng_stats st;
    for (int k = 0; k < 5; k++) {
        run_greedy_and_check(&h, (uint64_t)k + 1, ps[k], 64, 6, 256);
        hits += want[k];
        eng_sched_stats(h.s, &st);
        ck_assert_uint_eq(st.prefix_cache_hits_total, hits);
    }
    /* and all at once, prefilled together */
    for (int k = 0; k < 5; k++) {
        struct eng_request *r = mkreq((uint64_t)k + 11, ps[k], 64, 6);
        r->sampling.ignore_eos = true;
        add(&h, r);
    }
    h_run(&h, 1000);
    for (int k = 0; k < 5; k++) {
        struct ref ref;
        ref_greedy(ps[k], 64, 6, 0, true, 256, &ref);
        assert_matches(&outs[k + 11], 0, &ref);
        ref_free(&ref);
    }
    eng_sched_stats(h.s, &st);
    ck_assert_int_eq(st.kv_blocks_used, 0);
    h_close(&h);
}
END_TEST

START_TEST(prefix_n3_and_prompt_logprobs)
{
    struct harness h;
    h_open(&h, 8, 256, 256, 64);
    static int32_t p[70];
    mkprompt(p, 70, 21);
    run_greedy_and_check(&h, 1, p, 70, 3, 256);
    /* n = 3 on the cached prompt: the three share its blocks */
    struct eng_request *r = mkreq(2, p, 70, 20);
    r->n = 3;
    r->sampling.ignore_eos = true;
    add(&h, r);
    struct inf_err err;
    ck_assert_int_eq(eng_sched_step(h.s, &err), INF_OK); /* 6 tokens, then the fork */
    struct eng_stats st;
    eng_sched_stats(h.s, &st);
    ck_assert_int_eq(st.running, 3);
    ck_assert_uint_eq(st.prefix_cache_hits_total, 64);
    ck_assert_int_eq(st.kv_blocks_used, 5); /* four cached blocks, the parent's last */
    h_run(&h, 1000);
    struct ref ref;
    ref_greedy(p, 70, 20, 0, true, 256, &ref);
    for (int c = 0; c < 3; c++)
        assert_matches(&outs[2], c, &ref);
    ref_free(&ref);
    /* prompt logprobs: every position is computed for its logits (no hit),
     * and they equal the naive log-softmax */
    r = mkreq(3, p, 70, 4);
    r->prompt_logprobs = true;
    r->sampling.logprobs = 2;
    r->sampling.ignore_eos = true;
    r->n = 2;
    add(&h, r);
    int64_t last = eng_mock_tokens_computed(&h.lm);
    h_run(&h, 1000);
    eng_sched_stats(h.s, &st);
    ck_assert_uint_eq(st.prefix_cache_hits_total, 64);
    ck_assert_int_ge(computed_since(&h, &last), 70);
    assert_prompt_logprobs(&outs[3], p, 70, 2);
    ref_greedy(p, 70, 4, 0, true, 256, &ref);
    assert_matches(&outs[3], 0, &ref);
    assert_matches(&outs[3], 1, &ref);
    ref_free(&ref);
    /* what it computed is cached for the next one */
    run_greedy_and_check(&h, 4, p, 70, 3, 256);
    eng_sched_stats(h.s, &st);
    ck_assert_uint_eq(st.prefix_cache_hits_total, 128);
    ck_assert_int_eq(st.kv_blocks_used, 0);
    h_close(&h);
}
END_TEST

/* The KV exhaustion workload (12 sequences of 30 + 90 tokens in 24 blocks):
 * the tokens the mock computed, outputs checked against the reference. */
static int64_t exhaustion_run(bool prefix, uint64_t *preemptions)
{
    bool saved = g_prefix;
    g_prefix = prefix;
    struct harness h;
    h_open(&h, 16, 256, 128, 24);
    g_prefix = saved;
    enum { N = 12 };
    static int32_t p[N][30];
    for (int k = 0; k < N; k++) {
        mkprompt(p[k], 30, (uint32_t)(50 + k));
        struct eng_request *r = mkreq((uint64_t)k + 1, p[k], 30, 90);
        r->sampling.ignore_eos = true;
        add(&h, r);
    }
    h_run(&h, 5000);
    for (int k = 0; k < N; k++) {
        struct ref ref;
        ref_greedy(p[k], 30, 90, 0, true, 128, &ref);
        assert_matches(&outs[k + 1], 0, &ref);
        ref_free(&ref);
    }
    struct eng_stats st;
    eng_sched_stats(h.s, &st);
    ck_assert_int_eq(st.kv_blocks_used, 0);
    *preemptions = st.preemptions_total;
    int64_t computed = eng_mock_tokens_computed(&h.lm);
    h_close(&h);
    return computed;
}

START_TEST(prefix_preemption_recomputes_less)
{
    /* A preempted sequence's committed blocks (prompt and generated) stay
     * cached while it waits: its recompute starts after them. */
    uint64_t pre_off, pre_on;
    int64_t off = exhaustion_run(false, &pre_off);
    int64_t on = exhaustion_run(true, &pre_on);
    ck_assert_uint_gt(pre_off, 0);
    ck_assert_uint_gt(pre_on, 0);
    ck_assert_int_lt(on, off);
    /* no sharing between these prompts: without preemption each computes
     * 30 + 89 tokens; caching saves most of what the recomputes cost */
    ck_assert_int_ge(on, 12 * (30 + 89));
    ck_assert_int_lt(on - 12 * (30 + 89), (off - 12 * (30 + 89)) / 2);
}
END_TEST

/* ---- sliding window ------------------------------------------------------------------ */
static void window_setup(void)
{
    g_window = 40;
}

static void window_teardown(void)
{
    g_window = 0;
    g_prefix = false;
    g_dev = false;
}

static void window_overlap_setup(void)
{
    g_window = 40;
    g_dev = true;
}

static void window_prefix_setup(void)
{
    g_window = 40;
    g_prefix = true;
}

static void window_prefix_overlap_setup(void)
{
    g_window = 40;
    g_prefix = true;
    g_dev = true;
}

/* Blocks a decoding sequence may hold at window w: every block its window's
 * keys touch, one more while a step is queued ahead (it grows for the next
 * token before the one in flight is computed). */
static int32_t window_blocks(int32_t w)
{
    return (w + 15) / 16 + 1 + (g_dev ? 1 : 0);
}

START_TEST(window_bounds_blocks_and_reuses_them)
{
    /* Four sequences of 50 + 700 tokens need 47 blocks each without a
     * window; with g_window 40 each holds at most window_blocks(40) while
     * it decodes, so all four run at once in a pool of 24 blocks without a
     * preemption, the pool's blocks taken again and again; the outputs are
     * the windowed reference's and nothing is held at the end. */
    struct harness h;
    h_open(&h, 8, 256, 1024, 24);
    enum { N = 4 };
    int32_t p[N][50];
    for (int k = 0; k < N; k++) {
        mkprompt(p[k], 50, (uint32_t)(300 + k));
        struct eng_request *r = mkreq((uint64_t)k + 1, p[k], 50, 700);
        r->sampling.ignore_eos = true;
        r->stream = k % 2 == 0;
        add(&h, r);
    }
    struct inf_err err;
    int steps = 0, max_used = 0;
    while (!eng_sched_idle(h.s)) {
        ck_assert_int_eq(eng_sched_step(h.s, &err), INF_OK);
        struct eng_stats st;
        eng_sched_stats(h.s, &st);
        if (++steps > 2) /* past the prefill (50 tokens: 4 blocks) */
            ck_assert_int_le(st.kv_blocks_used, N * window_blocks(g_window));
        max_used = st.kv_blocks_used > max_used ? (int)st.kv_blocks_used : max_used;
        ck_assert_int_lt(steps, 2000);
    }
    struct eng_stats st;
    eng_sched_stats(h.s, &st);
    ck_assert_uint_eq(st.preemptions_total, 0);
    ck_assert_int_eq(st.max_running_seen, N);
    ck_assert_int_ge(max_used, N * 3);
    ck_assert_int_eq(st.kv_blocks_used, 0);
    for (int k = 0; k < N; k++) {
        struct ref ref;
        ref_greedy(p[k], 50, 700, 0, true, 1024, &ref);
        assert_matches(&outs[k + 1], 0, &ref);
        ref_free(&ref);
    }
    h_close(&h);
}
END_TEST

START_TEST(window_long_prompt_in_chunks)
{
    /* A prompt of 900 tokens in chunks of 64 through a pool of 12 blocks
     * (192 tokens): each chunk needs only its window's blocks and its own. */
    struct harness h;
    h_open(&h, 4, 64, 1024, 12);
    static int32_t p[900];
    mkprompt(p, 900, 77);
    struct eng_request *r = mkreq(1, p, 900, 60);
    r->sampling.ignore_eos = true;
    add(&h, r);
    struct inf_err err;
    while (!eng_sched_idle(h.s)) {
        ck_assert_int_eq(eng_sched_step(h.s, &err), INF_OK);
        struct eng_stats st;
        eng_sched_stats(h.s, &st);
        ck_assert_int_le(st.kv_blocks_used, (g_window + 64 + 15) / 16 + 1 + (g_dev ? 1 : 0));
    }
    struct ref ref;
    ref_greedy(p, 900, 60, 0, true, 1024, &ref);
    assert_matches(&outs[1], 0, &ref);
    ref_free(&ref);
    struct eng_stats st;
    eng_sched_stats(h.s, &st);
    ck_assert_int_eq(st.kv_blocks_used, 0);
    h_close(&h);
}
END_TEST

START_TEST(window_n3_fork_keeps_the_recompute_window)
{
    /* A window of 5 and a 47-token prompt in chunks of 40: the last chunk
     * starts at 40, past the prompt's last full block (32), from which the
     * forked choices recompute; their window reaches back to 28, which
     * must still be held when they fork (the mock fails a read of a freed
     * position). */
    g_window = 5;
    struct harness h;
    h_open(&h, 8, 40, 256, 64);
    int32_t p[47];
    mkprompt(p, 47, 21);
    struct eng_request *r = mkreq(1, p, 47, 30);
    r->n = 3;
    r->sampling.ignore_eos = true;
    add(&h, r);
    h_run(&h, 1000);
    struct ref ref;
    ref_greedy(p, 47, 30, 0, true, 256, &ref);
    for (int c = 0; c < 3; c++)
        assert_matches(&outs[1], c, &ref);
    struct eng_stats st;
    eng_sched_stats(h.s, &st);
    ck_assert_int_eq(st.kv_blocks_used, 0);
    ref_free(&ref);
    h_close(&h);
}
END_TEST

START_TEST(window_prefix_hits_after_the_head_is_released)
{
    /* With the prefix cache: a 300-token prompt's blocks are committed as
     * they fill and released as the window passes them, yet stay cached
     * (nobody holds them, none was needed for anything else), so the same
     * prompt again hits its 18 full blocks, computes 12 tokens, and gives
     * the same answer; a preemption-free run leaves nothing held. */
    struct harness h;
    h_open(&h, 4, 512, 1024, 64);
    static int32_t a[300];
    mkprompt(a, 300, 5);
    int64_t last = 0;
    run_greedy_and_check(&h, 1, a, 300, 20, 1024);
    ck_assert_int_eq(computed_since(&h, &last), 300 + 19);
    struct eng_stats st;
    eng_sched_stats(h.s, &st);
    ck_assert_int_eq(st.kv_blocks_used, 0);
    ck_assert_int_eq(st.kv_blocks_cached, 319 / 16);
    run_greedy_and_check(&h, 2, a, 300, 20, 1024);
    ck_assert_int_eq(computed_since(&h, &last), 300 - 288 + 19);
    eng_sched_stats(h.s, &st);
    ck_assert_uint_eq(st.prefix_cache_hits_total, 288);
    ck_assert_int_eq(st.kv_blocks_used, 0);
    h_close(&h);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("scheduler");
    TCase *tc = tcase_create("mock");
    tcase_add_test(tc, mock_detok_utf8);
    tcase_add_test(tc, mock_forward_reads_blocks);
    suite_add_tcase(s, tc);
    tc = tcase_create("batching");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, single_greedy_matches_reference);
    tcase_add_test(tc, batch_of_128_matches_alone);
    tcase_add_test(tc, chunked_prefill_interleaves_decodes);
    tcase_add_test(tc, random_traffic_invariants);
    tcase_add_test(tc, kv_exhaustion_preempts_and_recomputes);
    suite_add_tcase(s, tc);
    tc = tcase_create("choices");
    tcase_add_test(tc, n3_shares_prompt_blocks);
    tcase_add_test(tc, n3_sampled_choice_i_uses_seed_plus_i);
    tcase_add_test(tc, seed_reproducible_in_any_batch);
    tcase_add_test(tc, logprobs_of_the_chosen_token);
    tcase_add_test(tc, prompt_logprobs_match_naive_log_softmax);
    tcase_add_test(tc, prompt_logprobs_once_across_preemption);
    tcase_add_test(tc, sampling_settings_reach_the_sampler);
    suite_add_tcase(s, tc);
    tc = tcase_create("stops");
    tcase_add_test(tc, stop_string_across_tokens);
    tcase_add_test(tc, stop_prefix_held_then_released);
    tcase_add_test(tc, stop_string_multibyte);
    tcase_add_test(tc, min_tokens_masks_eos_and_stops);
    tcase_add_test(tc, stop_search_is_incremental);
    tcase_add_test(tc, max_tokens_and_context_limit);
    suite_add_tcase(s, tc);
    tc = tcase_create("cancel");
    tcase_add_test(tc, cancel_running_and_queued);
    tcase_add_test(tc, cancel_n3_after_fork);
    tcase_add_test(tc, validation_names_the_field);
    suite_add_tcase(s, tc);
    /* the same scheduling with decode steps queued ahead */
    tc = tcase_create("overlap");
    tcase_set_timeout(tc, 120);
    tcase_add_checked_fixture(tc, overlap_setup, overlap_teardown);
    tcase_add_test(tc, overlap_queues_decode_steps_ahead);
    tcase_add_test(tc, overlap_matches_one_step_at_a_time);
    tcase_add_test(tc, overlap_with_a_backlog);
    tcase_add_test(tc, overlap_cancel_while_a_step_is_ahead);
    tcase_add_test(tc, overlap_device_failure);
    tcase_add_test(tc, single_greedy_matches_reference);
    tcase_add_test(tc, batch_of_128_matches_alone);
    tcase_add_test(tc, chunked_prefill_interleaves_decodes);
    tcase_add_test(tc, random_traffic_invariants);
    tcase_add_test(tc, kv_exhaustion_preempts_and_recomputes);
    tcase_add_test(tc, n3_shares_prompt_blocks);
    tcase_add_test(tc, stop_string_across_tokens);
    tcase_add_test(tc, stop_prefix_held_then_released);
    tcase_add_test(tc, stop_string_multibyte);
    tcase_add_test(tc, min_tokens_masks_eos_and_stops);
    tcase_add_test(tc, max_tokens_and_context_limit);
    tcase_add_test(tc, cancel_running_and_queued);
    tcase_add_test(tc, cancel_n3_after_fork);
    suite_add_tcase(s, tc);
    /* a sliding window: its own cases, and the scheduling cases again, one
     * step at a time and queued ahead, with the prefix cache off and on */
    for (int v = 0; v < 4; v++) {
        static const char *names[] = {"window", "window_overlap", "window_prefix",
                                      "window_prefix_overlap"};
        static void (*const setups[])(void) = {window_setup, window_overlap_setup,
                                               window_prefix_setup, window_prefix_overlap_setup};
        tc = tcase_create(names[v]);
        tcase_set_timeout(tc, 300);
        tcase_add_checked_fixture(tc, setups[v], window_teardown);
        tcase_add_test(tc, window_bounds_blocks_and_reuses_them);
        tcase_add_test(tc, window_long_prompt_in_chunks);
        tcase_add_test(tc, window_n3_fork_keeps_the_recompute_window);
        tcase_add_test(tc, kv_exhaustion_preempts_and_recomputes);
        tcase_add_test(tc, single_greedy_matches_reference);
        tcase_add_test(tc, batch_of_128_matches_alone);
        tcase_add_test(tc, chunked_prefill_interleaves_decodes);
        tcase_add_test(tc, random_traffic_invariants);
        tcase_add_test(tc, n3_shares_prompt_blocks);
        tcase_add_test(tc, stop_string_across_tokens);
        tcase_add_test(tc, min_tokens_masks_eos_and_stops);
        tcase_add_test(tc, max_tokens_and_context_limit);
        tcase_add_test(tc, cancel_running_and_queued);
        tcase_add_test(tc, cancel_n3_after_fork);
        if (v >= 2) {
            /* the other prefix cases count hits and blocks as without a
             * window: released early, a sequence's head is evicted first */
            tcase_add_test(tc, window_prefix_hits_after_the_head_is_released);
            tcase_add_test(tc, prefix_forced_collision_does_not_alias);
        }
        suite_add_tcase(s, tc);
    }
    /* prefix caching on: its own cases, and the scheduling cases again */
    for (int dev = 0; dev < 2; dev++) {
        tc = tcase_create(dev ? "prefix_overlap" : "prefix");
        tcase_set_timeout(tc, 300);
        if (dev)
            tcase_add_checked_fixture(tc, prefix_overlap_setup, prefix_overlap_teardown);
        else
            tcase_add_checked_fixture(tc, prefix_setup, prefix_teardown);
        tcase_add_test(tc, prefix_hit_skips_computation);
        tcase_add_test(tc, prefix_on_matches_off);
        tcase_add_test(tc, prefix_eviction_under_pressure);
        tcase_add_test(tc, prefix_10000_requests_no_leak);
        tcase_add_test(tc, prefix_forced_collision_does_not_alias);
        tcase_add_test(tc, prefix_n3_and_prompt_logprobs);
        tcase_add_test(tc, prefix_preemption_recomputes_less);
        tcase_add_test(tc, single_greedy_matches_reference);
        tcase_add_test(tc, batch_of_128_matches_alone);
        tcase_add_test(tc, chunked_prefill_interleaves_decodes);
        tcase_add_test(tc, random_traffic_invariants);
        tcase_add_test(tc, kv_exhaustion_preempts_and_recomputes);
        tcase_add_test(tc, n3_shares_prompt_blocks);
        tcase_add_test(tc, stop_string_across_tokens);
        tcase_add_test(tc, min_tokens_masks_eos_and_stops);
        tcase_add_test(tc, max_tokens_and_context_limit);
        tcase_add_test(tc, cancel_running_and_queued);
        tcase_add_test(tc, cancel_n3_after_fork);
        if (!dev) {
            tcase_add_test(tc, seed_reproducible_in_any_batch);
            tcase_add_test(tc, prompt_logprobs_match_naive_log_softmax);
            tcase_add_test(tc, prompt_logprobs_once_across_preemption);
        }
        suite_add_tcase(s, tc);
    }
    return s;
}

int main(void)
{
    inf_log_set_level(INF_LOG_WARN);
    SRunner *sr = srunner_create(suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
