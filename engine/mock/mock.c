/* engine/mock/mock.c — the deterministic mock model and its byte-level
 * detokenizer (contract in engine/mock/mock.h). */
#define INF_LOG_MODULE "eng"
#include "engine/mock/mock.h"

#include "engine/backend.h"
#include "engine/sched/sampler.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A submitted step's results (device sampling). */
struct mock_out {
    struct eng_sample_out *out;
    int32_t n, cap;
};

struct mock {
    int32_t vocab, max_len, window;
    int32_t fail_at_step;
    int64_t steps;
    int64_t computed; /* tokens whose KV the steps wrote */
    int32_t n_blocks;
    /* [n_blocks * ENG_KV_BLOCK] (token + 1) << 32 | position; 0 = never written */
    uint64_t *kv;
    /* device sampling: the results of the last two submitted steps; last:
     * the newest one's index; n_pending of them not collected yet */
    struct mock_out res[2];
    int32_t last, n_pending;
    int64_t n_submitted;
    float *lg; /* [cap_lg] logits of a step */
    size_t cap_lg;
    int32_t *toks; /* [cap_toks] a step's tokens, fed ones resolved */
    int32_t cap_toks;
};

static uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint64_t hash_step(uint64_t h, int32_t tok)
{
    return mix64(h ^ ((uint64_t)(uint32_t)tok * 0x100000001b3ull));
}

/* Bytes still owed by an unfinished UTF-8 character at the end of the
 * history hist[0..n) (only byte tokens count). */
static int utf8_pending(const int32_t *hist, int32_t n)
{
    int32_t i = n - 1, k = 0;
    while (i >= 0 && k < 3 && hist[i] >= ENG_MOCK_BYTE0 + 0x80 &&
           hist[i] <= ENG_MOCK_BYTE0 + 0xBF) {
        k++;
        i--;
    }
    if (i < 0 || hist[i] < ENG_MOCK_BYTE0 || hist[i] >= ENG_MOCK_PIECE0)
        return 0;
    int b = hist[i] - ENG_MOCK_BYTE0;
    int need = b >= 0xF0 ? 3 : b >= 0xE0 ? 2 : b >= 0xC0 ? 1 : 0;
    return need > k ? need - k : 0;
}

/* Logits from the history hash h at position pos; tail holds the last
 * (up to 3) tokens of the history, n_tail of them. */
static void fill_logits(int32_t vocab, uint64_t h, const int32_t *tail, int32_t n_tail, float *out)
{
    int32_t target;
    int pending = utf8_pending(tail, n_tail);
    uint64_t r = h % 1000;
    if (pending) {
        /* U+0800.. after an E2 lead: any continuation byte is valid */
        target = ENG_MOCK_BYTE0 + 0x80 + (int32_t)((h >> 24) % 64);
    } else if (r < 12) {
        target = ENG_MOCK_EOS;
    } else if (r < 40) {
        target = ENG_MOCK_BYTE0 + 0xC3; /* Latin-1 supplement: C3 80..BF */
    } else if (r < 50) {
        target = ENG_MOCK_BYTE0 + 0xE2; /* three-byte characters */
    } else if (r < 200) {
        target = ENG_MOCK_BYTE0 + ' ';
    } else {
        target = ENG_MOCK_BYTE0 + 'a' + (int32_t)((h >> 20) % 26);
    }
    for (int32_t v = 0; v < vocab; v++) {
        float spread = (float)(mix64(h ^ ((uint64_t)v << 32)) >> 40) * (2.0f / 16777216.0f);
        bool printable = v >= ENG_MOCK_BYTE0 + 0x20 && v <= ENG_MOCK_BYTE0 + 0x7E;
        out[v] = (printable ? 0.0f : -4.0f) + spread;
    }
    out[target] += 6.0f;
}

void eng_mock_logits(int32_t vocab, const int32_t *toks, int32_t n, float *out)
{
    eng_mock_logits_window(vocab, toks, n, 0, out);
}

void eng_mock_logits_window(int32_t vocab, const int32_t *toks, int32_t n, int32_t window,
                            float *out)
{
    uint64_t h = 0;
    for (int32_t i = window > 0 && n > window ? n - window : 0; i < n; i++)
        h = hash_step(h, toks[i]);
    h = mix64(h ^ (uint64_t)(n - 1));
    int32_t from = n > 3 ? n - 3 : 0;
    if (window > 0 && n - window > from)
        from = n - window;
    fill_logits(vocab, h, toks + from, n - from, out);
}

static inf_status_t mock_kv_reserve(void *self, int32_t n_blocks, struct inf_err *err)
{
    struct mock *m = self;
    free(m->kv);
    m->kv = calloc((size_t)n_blocks * ENG_KV_BLOCK, sizeof *m->kv);
    if (!m->kv)
        return inf_err_set(err, INF_E_NOMEM, "out of memory for the mock KV cache");
    m->n_blocks = n_blocks;
    return INF_OK;
}

/* The KV cell of position pos in slot's block table, or NULL when the table
 * has no valid block there. */
static uint64_t *kv_cell(struct mock *m, const struct eng_batch *b, int32_t slot, int32_t pos)
{
    int32_t col = pos / ENG_KV_BLOCK;
    if (col >= b->max_blocks)
        return NULL;
    int32_t blk = b->block_table[(size_t)slot * (size_t)b->max_blocks + (size_t)col];
    if (blk < 0 || blk >= m->n_blocks)
        return NULL;
    return &m->kv[(size_t)blk * ENG_KV_BLOCK + (size_t)(pos % ENG_KV_BLOCK)];
}

static inf_status_t mock_forward(void *self, const struct eng_batch *b, float *logits,
                                 struct inf_err *err)
{
    struct mock *m = self;
    if (!m->kv)
        return inf_err_set(err, INF_E_INTERNAL, "mock: no KV reserved");
    if (m->fail_at_step > 0 && ++m->steps >= m->fail_at_step)
        return inf_err_set(err, INF_E_DEVICE, "mock: injected device failure");
    int32_t row = 0;
    for (int32_t i = 0; i < b->n_tokens; i++) {
        int32_t tok = b->tokens[i], pos = b->pos[i], slot = b->slot[i];
        if (tok < 0 || tok >= m->vocab || pos < 0 || pos >= m->max_len || slot < 0 ||
            slot >= b->n_slots)
            return inf_err_set(err, INF_E_INTERNAL, "mock: bad batch entry %d", i);
        uint64_t *cell = kv_cell(m, b, slot, pos);
        if (!cell)
            return inf_err_set(err, INF_E_INTERNAL, "mock: no block for position %d", pos);
        *cell = ((uint64_t)(tok + 1) << 32) | (uint32_t)pos;
        if (!b->want_logits[i]) {
            /* with a window, every token's keys are checked as a real
             * model's attention would read them (a freed block shows) */
            for (int32_t p = m->window > 0 ? eng_attn_first_key(m->window, pos) : pos; p < pos;
                 p++) {
                const uint64_t *c = kv_cell(m, b, slot, p);
                if (!c || (*c >> 32) == 0 || (uint32_t)*c != (uint32_t)p)
                    return inf_err_set(err, INF_E_INTERNAL,
                                       "mock: slot %d reads position %d that holds no KV", slot, p);
            }
            continue;
        }
        /* Read the whole history back through the block table. */
        uint64_t h = 0;
        int32_t tail[3] = {0, 0, 0}, n_tail = 0;
        for (int32_t p = eng_attn_first_key(m->window, pos); p <= pos; p++) {
            const uint64_t *c = kv_cell(m, b, slot, p);
            if (!c || (*c >> 32) == 0 || (uint32_t)*c != (uint32_t)p)
                return inf_err_set(err, INF_E_INTERNAL,
                                   "mock: slot %d reads position %d that holds no KV", slot, p);
            int32_t t = (int32_t)(*c >> 32) - 1;
            h = hash_step(h, t);
            if (p >= pos - 2)
                tail[n_tail++] = t;
        }
        h = mix64(h ^ (uint64_t)pos);
        if (row >= b->n_logits)
            return inf_err_set(err, INF_E_INTERNAL, "mock: more logits wanted than n_logits");
        fill_logits(m->vocab, h, tail, n_tail, logits + (size_t)row * (size_t)m->vocab);
        row++;
    }
    if (row != b->n_logits)
        return inf_err_set(err, INF_E_INTERNAL, "mock: n_logits %d, want_logits has %d",
                           b->n_logits, row);
    m->computed += b->n_tokens;
    return INF_OK;
}

int64_t eng_mock_tokens_computed(const struct eng_lm *lm)
{
    const struct mock *m = lm->self;
    return m->computed;
}

/* Sample row r of logits lg (edited) as mock.h describes. */
static struct eng_sample_out mock_sample(int32_t vocab, float *lg, const struct eng_sample_row *r)
{
    for (int32_t i = 0; i < r->n_ban; i++)
        lg[r->ban[i]] = -INFINITY;
    /* logprobs: of the banned row before the bias, as the host sampler's */
    const double lse = eng_sampler_log_sum_exp(lg, vocab);
    struct eng_sample_out o = {.token = -1};
    o.n_top = r->n_logprobs < vocab ? r->n_logprobs : vocab;
    if (o.n_top > ENG_SAMPLE_TOP)
        o.n_top = ENG_SAMPLE_TOP;
    if (o.n_top > 0) {
        eng_sampler_top_n(lg, vocab, o.n_top, o.top_ids);
        for (int32_t i = 0; i < o.n_top; i++)
            o.top_logprobs[i] = (float)((double)lg[o.top_ids[i]] - lse);
    }
    for (int32_t i = 0; i < r->n_bias; i++)
        lg[r->bias_ids[i]] += r->bias_vals[i];
    const float t = r->temperature > 0.0f ? r->temperature : 1.0f;
    float mx = -INFINITY;
    int32_t am = -1;
    for (int32_t v = 0; v < vocab; v++)
        if (lg[v] > mx) {
            mx = lg[v];
            am = v;
        }
    if (am < 0)
        return o; /* every token excluded */
    double sum = 0.0;
    for (int32_t v = 0; v < vocab; v++)
        sum += exp((double)(lg[v] - mx) / t);
    int32_t pick = am;
    if (r->temperature > 0.0f) {
        double acc = 0.0, target = r->u * sum;
        for (int32_t v = 0; v < vocab; v++) {
            double p = exp((double)(lg[v] - mx) / t);
            if (p == 0.0)
                continue;
            pick = v;
            acc += p;
            if (acc > target)
                break;
        }
    }
    o.token = pick;
    float raw = lg[pick]; /* its value before the bias */
    for (int32_t i = 0; i < r->n_bias; i++)
        if (r->bias_ids[i] == pick)
            raw -= r->bias_vals[i];
    o.logprob = (float)((double)raw - lse);
    return o;
}

static inf_status_t mock_submit(void *self, const struct eng_batch *b,
                                const struct eng_sample_row *rows, int32_t n_rows,
                                struct inf_err *err)
{
    struct mock *m = self;
    if (m->n_pending == 2)
        return inf_err_set(err, INF_E_INTERNAL, "mock: a third step submitted before a collect");
    const struct mock_out *prev = m->n_submitted > 0 ? &m->res[m->last] : NULL;
    if (b->n_tokens > m->cap_toks) {
        int32_t *t = realloc(m->toks, sizeof *t * (size_t)b->n_tokens);
        if (!t)
            return inf_err_set(err, INF_E_NOMEM, "out of memory");
        m->toks = t;
        m->cap_toks = b->n_tokens;
    }
    for (int32_t i = 0; i < b->n_tokens; i++) {
        m->toks[i] = b->tokens[i];
        if (!b->feed || b->feed[i] < 0)
            continue;
        if (!prev || b->feed[i] >= prev->n)
            return inf_err_set(err, INF_E_INTERNAL, "mock: token %d fed from row %d of %d", i,
                               b->feed[i], prev ? prev->n : 0);
        int32_t t = prev->out[b->feed[i]].token;
        m->toks[i] = t >= 0 ? t : 0; /* that row failed: its request ends, the row is dropped */
    }
    size_t need = (size_t)b->n_logits * (size_t)m->vocab;
    if (need > m->cap_lg) {
        float *lg = realloc(m->lg, sizeof *lg * need);
        if (!lg)
            return inf_err_set(err, INF_E_NOMEM, "out of memory");
        m->lg = lg;
        m->cap_lg = need;
    }
    struct eng_batch fb = *b;
    fb.tokens = m->toks;
    fb.feed = NULL;
    inf_status_t st = mock_forward(m, &fb, m->lg, err);
    if (st != INF_OK)
        return st;
    int32_t slot = m->n_submitted > 0 ? m->last ^ 1 : 0;
    struct mock_out *o = &m->res[slot];
    if (n_rows > o->cap) {
        struct eng_sample_out *p = realloc(o->out, sizeof *p * (size_t)n_rows);
        if (!p)
            return inf_err_set(err, INF_E_NOMEM, "out of memory");
        o->out = p;
        o->cap = n_rows;
    }
    for (int32_t i = 0; i < n_rows; i++) {
        if (rows[i].logit_row < 0 || rows[i].logit_row >= b->n_logits)
            return inf_err_set(err, INF_E_INTERNAL, "mock: sampled row %d: logits row %d", i,
                               rows[i].logit_row);
        o->out[i] =
            mock_sample(m->vocab, m->lg + (size_t)rows[i].logit_row * (size_t)m->vocab, &rows[i]);
    }
    o->n = n_rows;
    m->last = slot;
    m->n_pending++;
    m->n_submitted++;
    return INF_OK;
}

static inf_status_t mock_collect(void *self, struct eng_sample_out *out, struct inf_err *err)
{
    struct mock *m = self;
    if (m->n_pending == 0)
        return inf_err_set(err, INF_E_INTERNAL, "mock: collect without a submitted step");
    const struct mock_out *o = &m->res[m->n_pending == 2 ? m->last ^ 1 : m->last];
    if (o->n > 0)
        memcpy(out, o->out, sizeof *out * (size_t)o->n);
    m->n_pending--;
    return INF_OK;
}

static inf_status_t mock_forward_sample(void *self, const struct eng_batch *b,
                                        const struct eng_sample_row *rows, int32_t n_rows,
                                        struct eng_sample_out *out, struct inf_err *err)
{
    struct mock *m = self;
    if (m->n_pending > 0)
        return inf_err_set(err, INF_E_INTERNAL, "mock: forward_sample with a step submitted");
    inf_status_t st = mock_submit(self, b, rows, n_rows, err);
    return st != INF_OK ? st : mock_collect(self, out, err);
}

static void mock_destroy(void *self)
{
    struct mock *m = self;
    if (!m)
        return;
    free(m->kv);
    free(m->res[0].out);
    free(m->res[1].out);
    free(m->lg);
    free(m->toks);
    free(m);
}

inf_status_t eng_mock_create(const struct eng_mock_config *cfg, struct eng_lm *lm,
                             struct inf_err *err)
{
    int32_t vocab = cfg->vocab ? cfg->vocab : 512;
    int32_t max_len = cfg->max_len ? cfg->max_len : 4096;
    if (vocab < ENG_MOCK_PIECE0 || vocab > (1 << 24))
        return inf_err_set(err, INF_E_INVALID, "mock: vocab must be in [%d, %d], got %d",
                           ENG_MOCK_PIECE0, 1 << 24, vocab);
    if (max_len < 2 || max_len > (1 << 20))
        return inf_err_set(err, INF_E_INVALID, "mock: max_len must be in [2, %d], got %d", 1 << 20,
                           max_len);
    struct mock *m = calloc(1, sizeof *m);
    if (!m)
        return inf_err_set(err, INF_E_NOMEM, "out of memory");
    m->vocab = vocab;
    m->max_len = max_len;
    m->fail_at_step = cfg->fail_at_step;
    m->window = cfg->window > 0 ? cfg->window : 0;
    memset(lm, 0, sizeof *lm);
    lm->self = m;
    lm->name = "mock";
    lm->vocab = vocab;
    lm->max_len = max_len;
    lm->window = m->window;
    lm->bos_id = ENG_MOCK_BOS;
    lm->n_eos = 1;
    lm->eos_ids[0] = ENG_MOCK_EOS;
    lm->kv_id = 0x6d6f636bull; /* "mock": its KV is the ids themselves */
    lm->kv_reserve = mock_kv_reserve;
    lm->forward = mock_forward;
    if (cfg->device_sampling) {
        lm->forward_sample = mock_forward_sample;
        lm->submit = mock_submit;
        lm->collect = mock_collect;
    }
    lm->destroy = mock_destroy;
    return INF_OK;
}

/* ---- byte-level detokenizer ----------------------------------------------------------- */
struct mdetok {
    unsigned char buf[4];
    int n, need;
};

static const char REPLACEMENT[] = "\xEF\xBF\xBD";

static void *mdetok_open(void *self, const int32_t *prompt, int32_t n_prompt)
{
    (void)self;
    (void)prompt;
    (void)n_prompt;
    return calloc(1, sizeof(struct mdetok));
}

static void mdetok_close(void *st)
{
    free(st);
}

/* Bytes a lead byte announces after itself, or -1 for a byte that cannot
 * start a character. */
static int lead_need(unsigned b)
{
    if (b < 0x80)
        return 0;
    if (b >= 0xC2 && b <= 0xDF)
        return 1;
    if (b >= 0xE0 && b <= 0xEF)
        return 2;
    if (b >= 0xF0 && b <= 0xF4)
        return 3;
    return -1;
}

/* Whether b may follow the bytes in d (second-byte limits of RFC 3629). */
static bool cont_ok(const struct mdetok *d, unsigned b)
{
    if (b < 0x80 || b > 0xBF)
        return false;
    if (d->n == 1) {
        switch (d->buf[0]) {
        case 0xE0:
            return b >= 0xA0;
        case 0xED:
            return b <= 0x9F;
        case 0xF0:
            return b >= 0x90;
        case 0xF4:
            return b <= 0x8F;
        default:
            break;
        }
    }
    return true;
}

static inf_status_t mdetok_byte(struct mdetok *d, unsigned b, struct eng_strbuf *out)
{
    inf_status_t st;
    if (d->n > 0) {
        if (cont_ok(d, b)) {
            d->buf[d->n++] = (unsigned char)b;
            if (--d->need == 0) {
                st = eng_strbuf_append(out, (const char *)d->buf, (size_t)d->n);
                d->n = 0;
                return st;
            }
            return INF_OK;
        }
        d->n = d->need = 0;
        st = eng_strbuf_append(out, REPLACEMENT, 3);
        if (st != INF_OK)
            return st;
    }
    int need = lead_need(b);
    if (need < 0)
        return eng_strbuf_append(out, REPLACEMENT, 3);
    if (need == 0) {
        char c = (char)b;
        return eng_strbuf_append(out, &c, 1);
    }
    d->buf[0] = (unsigned char)b;
    d->n = 1;
    d->need = need;
    return INF_OK;
}

static inf_status_t mdetok_flush(void *st, struct eng_strbuf *out)
{
    struct mdetok *d = st;
    if (d->n == 0)
        return INF_OK;
    d->n = d->need = 0;
    return eng_strbuf_append(out, REPLACEMENT, 3);
}

static inf_status_t mdetok_push(void *st, int32_t tok, struct eng_strbuf *out)
{
    struct mdetok *d = st;
    if (tok < ENG_MOCK_BYTE0)
        return INF_OK; /* <unk>, BOS, EOS: no text */
    if (tok < ENG_MOCK_PIECE0)
        return mdetok_byte(d, (unsigned)(tok - ENG_MOCK_BYTE0), out);
    inf_status_t s = mdetok_flush(d, out);
    if (s != INF_OK)
        return s;
    char piece[24];
    int n = snprintf(piece, sizeof piece, " t%d", (int)tok);
    return eng_strbuf_append(out, piece, (size_t)n);
}

const struct eng_detok_ops eng_mock_detok = {
    .self = NULL,
    .open = mdetok_open,
    .push = mdetok_push,
    .flush = mdetok_flush,
    .close = mdetok_close,
};

int32_t eng_mock_encode(const char *text, size_t len, int32_t *out, int32_t cap)
{
    for (size_t i = 0; i < len && (int64_t)i < cap; i++)
        out[i] = ENG_MOCK_BYTE0 + (unsigned char)text[i];
    return (int32_t)len;
}

char *eng_mock_decode(const int32_t *ids, int32_t n, size_t *len)
{
    struct eng_strbuf sb = {0};
    struct mdetok d = {0};
    if (eng_strbuf_append(&sb, "", 0) != INF_OK)
        return NULL;
    for (int32_t i = 0; i < n; i++) {
        if (mdetok_push(&d, ids[i], &sb) != INF_OK) {
            eng_strbuf_fini(&sb);
            return NULL;
        }
    }
    if (mdetok_flush(&d, &sb) != INF_OK) {
        eng_strbuf_fini(&sb);
        return NULL;
    }
    if (len)
        *len = sb.len;
    return sb.p;
}

inf_status_t eng_mock_tokenizer(int32_t vocab, tok_tokenizer_t **out, struct inf_err *err)
{
    static const char head[] =
        "{\"version\":\"1.0\",\"added_tokens\":["
        "{\"id\":0,\"content\":\"<unk>\",\"single_word\":false,\"lstrip\":false,"
        "\"rstrip\":false,\"normalized\":false,\"special\":true},"
        "{\"id\":1,\"content\":\"<s>\",\"single_word\":false,\"lstrip\":false,"
        "\"rstrip\":false,\"normalized\":false,\"special\":true},"
        "{\"id\":2,\"content\":\"</s>\",\"single_word\":false,\"lstrip\":false,"
        "\"rstrip\":false,\"normalized\":false,\"special\":true}],"
        "\"normalizer\":null,\"pre_tokenizer\":null,\"post_processor\":null,"
        "\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"ByteFallback\"},"
        "{\"type\":\"Fuse\"}]},"
        "\"model\":{\"type\":\"BPE\",\"dropout\":null,\"unk_token\":\"<unk>\","
        "\"continuing_subword_prefix\":null,\"end_of_word_suffix\":null,\"fuse_unk\":false,"
        "\"byte_fallback\":true,\"vocab\":{\"<unk>\":0,\"<s>\":1,\"</s>\":2";
    static const char config[] = "{\"bos_token\":\"<s>\",\"eos_token\":\"</s>\"}";
    struct eng_strbuf sb = {0};
    char item[48];
    inf_status_t st = eng_strbuf_append(&sb, head, sizeof head - 1);
    for (int32_t id = ENG_MOCK_BYTE0; st == INF_OK && id < vocab; id++) {
        int n = id < ENG_MOCK_PIECE0
                    ? snprintf(item, sizeof item, ",\"<0x%02X>\":%d", id - ENG_MOCK_BYTE0, (int)id)
                    : snprintf(item, sizeof item, ",\" t%d\":%d", (int)id, (int)id);
        st = eng_strbuf_append(&sb, item, (size_t)n);
    }
    if (st == INF_OK)
        st = eng_strbuf_append(&sb, "},\"merges\":[]}}", 15);
    if (st != INF_OK) {
        eng_strbuf_fini(&sb);
        return inf_err_set(err, INF_E_NOMEM, "out of memory");
    }
    st = tok_load_json(sb.p, sb.len, config, sizeof config - 1, out, err);
    eng_strbuf_fini(&sb);
    return st;
}
