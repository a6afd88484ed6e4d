/* engine/scheduler_sample.c — the scheduler's per-choice token choice:
 * logit bias, repetition / presence / frequency penalties, the min_tokens EOS
 * mask, then greedy or temperature sampling with top-k, top-p and min-p, from
 * a per-choice seeded RNG (xoshiro256**, seeded through splitmix64), and the
 * logprobs of the chosen token and of the top alternatives.
 *
 * Order (as vLLM): bias, penalties, mask; logprobs are taken here (the
 * model's distribution after those edits, before temperature); then
 * temperature, top-k, top-p, min-p, and one draw. */
#include "engine/scheduler_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

static uint64_t xoshiro_next(uint64_t s[4])
{
    uint64_t out = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return out;
}

/* Uniform in [0, 1) with 53 random bits. */
static double uniform(uint64_t s[4])
{
    return (double)(xoshiro_next(s) >> 11) * 0x1.0p-53;
}

inf_status_t eng_sample_init(struct eng_sample_state *st, const struct eng_sampling *sp,
                             int32_t vocab, uint64_t seed, const int32_t *prompt,
                             int32_t n_prompt)
{
    memset(st, 0, sizeof *st);
    st->vocab = vocab;
    uint64_t x = seed;
    for (int i = 0; i < 4; i++)
        st->rng[i] = splitmix64(&x);
    if (sp->presence_penalty != 0.0f || sp->frequency_penalty != 0.0f) {
        st->counts = calloc((size_t)vocab, sizeof *st->counts);
        if (!st->counts)
            return INF_E_NOMEM;
    }
    if (sp->repetition_penalty != 1.0f) {
        st->seen = calloc((size_t)vocab, 1);
        if (!st->seen) {
            free(st->counts);
            st->counts = NULL;
            return INF_E_NOMEM;
        }
        for (int32_t i = 0; i < n_prompt; i++)
            st->seen[prompt[i]] = 1;
    }
    return INF_OK;
}

void eng_sample_fini(struct eng_sample_state *st)
{
    free(st->counts);
    free(st->seen);
    st->counts = NULL;
    st->seen = NULL;
}

void eng_sample_accept(struct eng_sample_state *st, int32_t tok)
{
    if (st->counts)
        st->counts[tok]++;
    if (st->seen)
        st->seen[tok] = 1;
}

struct cand {
    int32_t id;
    float v;
};

static int cand_desc(const void *a, const void *b)
{
    const struct cand *x = a, *y = b;
    if (x->v != y->v)
        return x->v > y->v ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static int32_t argmax(const float *v, int32_t n)
{
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (v[i] > v[best])
            best = i;
    return best;
}

/* Draw from the distribution exp(v[i] - max) over n candidates. */
static int32_t draw(uint64_t rng[4], const struct cand *c, int32_t n)
{
    double sum = 0.0, mx = c[0].v;
    for (int32_t i = 1; i < n; i++)
        if (c[i].v > mx)
            mx = c[i].v;
    for (int32_t i = 0; i < n; i++)
        sum += exp((double)c[i].v - mx);
    double u = uniform(rng) * sum, acc = 0.0;
    for (int32_t i = 0; i < n; i++) {
        acc += exp((double)c[i].v - mx);
        if (u < acc)
            return c[i].id;
    }
    return c[n - 1].id;
}

int32_t eng_sample_token(struct eng_sample_state *st, const struct eng_sampling *sp,
                         float *logits, bool mask_eos, const int32_t *eos, int32_t n_eos,
                         struct eng_token_info *info)
{
    int32_t vocab = st->vocab;
    for (int32_t i = 0; i < sp->n_logit_bias; i++)
        logits[sp->logit_bias_ids[i]] += sp->logit_bias_vals[i];
    if (st->seen) {
        float rp = sp->repetition_penalty;
        for (int32_t i = 0; i < vocab; i++)
            if (st->seen[i])
                logits[i] = logits[i] > 0.0f ? logits[i] / rp : logits[i] * rp;
    }
    if (st->counts) {
        for (int32_t i = 0; i < vocab; i++)
            if (st->counts[i])
                logits[i] -= sp->presence_penalty + sp->frequency_penalty * (float)st->counts[i];
    }
    if (mask_eos)
        for (int32_t i = 0; i < n_eos; i++)
            if (eos[i] >= 0 && eos[i] < vocab)
                logits[eos[i]] = -INFINITY;

    /* log-softmax normaliser, for logprobs */
    double lse = 0.0;
    float mx = logits[argmax(logits, vocab)];
    if (sp->logprobs >= 0) {
        for (int32_t i = 0; i < vocab; i++)
            lse += exp((double)logits[i] - mx);
        lse = log(lse) + mx;
    }

    int32_t tok;
    if (sp->temperature == 0.0f) {
        tok = argmax(logits, vocab);
    } else {
        float inv_t = 1.0f / sp->temperature;
        bool filter = sp->top_k > 0 || sp->top_p < 1.0f || sp->min_p > 0.0f;
        struct cand *c = malloc(sizeof *c * (size_t)vocab);
        if (!c) {
            tok = argmax(logits, vocab); /* out of memory: degrade to greedy */
        } else {
            int32_t n = 0;
            for (int32_t i = 0; i < vocab; i++)
                if (logits[i] > -INFINITY)
                    c[n++] = (struct cand){i, logits[i] * inv_t};
            if (filter && n > 1) {
                qsort(c, (size_t)n, sizeof *c, cand_desc);
                if (sp->top_k > 0 && sp->top_k < n)
                    n = sp->top_k;
                double sum = 0.0;
                for (int32_t i = 0; i < n; i++)
                    sum += exp((double)c[i].v - c[0].v);
                if (sp->top_p < 1.0f) {
                    double acc = 0.0;
                    for (int32_t i = 0; i < n; i++) {
                        acc += exp((double)c[i].v - c[0].v) / sum;
                        if (acc >= sp->top_p) {
                            n = i + 1;
                            break;
                        }
                    }
                }
                if (sp->min_p > 0.0f) {
                    /* keep p >= min_p * p_max, i.e. v >= v_max + log(min_p) */
                    double floor_v = c[0].v + log((double)sp->min_p);
                    int32_t k = 1;
                    while (k < n && c[k].v >= floor_v)
                        k++;
                    n = k;
                }
            }
            tok = n > 0 ? draw(st->rng, c, n) : argmax(logits, vocab);
            free(c);
        }
    }

    memset(info, 0, sizeof *info);
    info->id = tok;
    if (sp->logprobs >= 0) {
        info->logprob = (float)((double)logits[tok] - lse);
        int32_t want = sp->logprobs < 5 ? sp->logprobs : 5;
        for (int32_t k = 0; k < want; k++) {
            int32_t best = -1;
            for (int32_t i = 0; i < vocab; i++) {
                bool taken = false;
                for (int32_t j = 0; j < k; j++)
                    taken |= info->top_ids[j] == i;
                if (!taken && (best < 0 || logits[i] > logits[best]))
                    best = i;
            }
            info->top_ids[k] = best;
            info->top_logprobs[k] = (float)((double)logits[best] - lse);
            info->n_top = k + 1;
        }
    }
    return tok;
}
