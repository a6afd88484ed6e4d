/* engine/sched/sampler.c — logits processing and sampling (engine/sched/sampler.h). */
#define INF_LOG_MODULE "eng"
#include "engine/sched/sampler.h"
#include "engine/backend.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct eng_sampler {
    struct eng_sampler_params p;
    struct eng_logit_bias *bias;
    int32_t vocab;
    uint64_t rng[4];
    uint8_t *in_prompt; /* [vocab] */
    int32_t *count;     /* [vocab] occurrences in the output */
    float *w;           /* [vocab] processed logits */
    int32_t *idx;       /* [vocab] candidate ids */
    int32_t *bias_ids;  /* logit_bias split in two arrays (the device path) */
    float *bias_vals;
    int32_t *seen; /* [vocab] ids in the prompt or the output, first seen first */
    int32_t n_seen;
};

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

/* xoshiro256** */
static uint64_t rng_next(uint64_t *s)
{
    uint64_t r = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return r;
}

/* Uniform in [0, 1) with 53 random bits. */
static double rng_uniform(uint64_t *s)
{
    return (double)(rng_next(s) >> 11) * 0x1p-53;
}

void eng_sampler_params_default(struct eng_sampler_params *s)
{
    memset(s, 0, sizeof *s);
    s->temperature = 0.0f;
    s->top_p = 1.0f;
    s->repetition_penalty = 1.0f;
}

inf_status_t eng_sampler_create(const struct eng_sampler_params *p, int32_t vocab,
                                eng_sampler_t **out, struct inf_err *err)
{
    *out = NULL;
    if (vocab <= 0)
        return inf_err_set(err, INF_E_INVALID, "vocabulary size must be > 0");
    if (!(p->temperature >= 0.0f) || !isfinite(p->temperature))
        return inf_err_set(err, INF_E_INVALID, "temperature must be >= 0, got %g",
                           (double)p->temperature);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return inf_err_set(err, INF_E_INVALID, "top_p must be in (0, 1], got %g", (double)p->top_p);
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
        return inf_err_set(err, INF_E_INVALID, "min_p must be in [0, 1], got %g", (double)p->min_p);
    if (!(p->repetition_penalty > 0.0f) || !isfinite(p->repetition_penalty))
        return inf_err_set(err, INF_E_INVALID, "repetition_penalty must be > 0, got %g",
                           (double)p->repetition_penalty);
    if (!(fabsf(p->presence_penalty) <= 2.0f))
        return inf_err_set(err, INF_E_INVALID, "presence_penalty must be in [-2, 2], got %g",
                           (double)p->presence_penalty);
    if (!(fabsf(p->frequency_penalty) <= 2.0f))
        return inf_err_set(err, INF_E_INVALID, "frequency_penalty must be in [-2, 2], got %g",
                           (double)p->frequency_penalty);
    if (p->n_logprobs < 0 || p->n_logprobs > ENG_MAX_LOGPROBS)
        return inf_err_set(err, INF_E_INVALID, "logprobs must be in [0, %d], got %d",
                           ENG_MAX_LOGPROBS, p->n_logprobs);
    if (p->n_logit_bias < 0 || (p->n_logit_bias > 0 && !p->logit_bias))
        return inf_err_set(err, INF_E_INVALID, "logit_bias is malformed");
    for (int32_t i = 0; i < p->n_logit_bias; i++)
        if (p->logit_bias[i].token < 0 || p->logit_bias[i].token >= vocab ||
            !isfinite(p->logit_bias[i].bias))
            return inf_err_set(err, INF_E_INVALID, "logit_bias token %d is not in the vocabulary",
                               p->logit_bias[i].token);
    eng_sampler_t *s = calloc(1, sizeof *s);
    if (!s)
        goto fail;
    s->p = *p;
    s->vocab = vocab;
    if (p->n_logit_bias > 0) {
        s->bias = malloc((size_t)p->n_logit_bias * sizeof *s->bias);
        if (!s->bias)
            goto fail;
        memcpy(s->bias, p->logit_bias, (size_t)p->n_logit_bias * sizeof *s->bias);
        s->bias_ids = malloc((size_t)p->n_logit_bias * sizeof *s->bias_ids);
        s->bias_vals = malloc((size_t)p->n_logit_bias * sizeof *s->bias_vals);
        if (!s->bias_ids || !s->bias_vals)
            goto fail;
        for (int32_t i = 0; i < p->n_logit_bias; i++) {
            s->bias_ids[i] = p->logit_bias[i].token;
            s->bias_vals[i] = p->logit_bias[i].bias;
        }
    }
    s->p.logit_bias = s->bias;
    s->in_prompt = calloc((size_t)vocab, 1);
    s->count = calloc((size_t)vocab, sizeof(int32_t));
    s->w = malloc((size_t)vocab * sizeof(float));
    s->idx = malloc((size_t)vocab * sizeof(int32_t));
    s->seen = malloc((size_t)vocab * sizeof(int32_t));
    if (!s->in_prompt || !s->count || !s->w || !s->idx || !s->seen)
        goto fail;
    uint64_t x = p->seed;
    for (int i = 0; i < 4; i++)
        s->rng[i] = splitmix64(&x);
    *out = s;
    return INF_OK;
fail:
    eng_sampler_destroy(s);
    return inf_err_set(err, INF_E_NOMEM, "out of memory for a sampler");
}

void eng_sampler_destroy(eng_sampler_t *s)
{
    if (!s)
        return;
    free(s->bias);
    free(s->bias_ids);
    free(s->bias_vals);
    free(s->in_prompt);
    free(s->count);
    free(s->w);
    free(s->idx);
    free(s->seen);
    free(s);
}

void eng_sampler_add_prompt(eng_sampler_t *s, const int32_t *ids, int32_t n)
{
    for (int32_t i = 0; i < n; i++)
        if (ids[i] >= 0 && ids[i] < s->vocab && !s->in_prompt[ids[i]]) {
            if (s->count[ids[i]] == 0)
                s->seen[s->n_seen++] = ids[i];
            s->in_prompt[ids[i]] = 1;
        }
}

void eng_sampler_accept(eng_sampler_t *s, int32_t token)
{
    if (token >= 0 && token < s->vocab) {
        if (s->count[token] == 0 && !s->in_prompt[token])
            s->seen[s->n_seen++] = token;
        s->count[token]++;
    }
}

static bool penalized(const struct eng_sampler_params *p)
{
    return p->repetition_penalty != 1.0f || p->presence_penalty != 0.0f ||
           p->frequency_penalty != 0.0f;
}

int32_t eng_sampler_hist_len(const eng_sampler_t *s)
{
    return penalized(&s->p) ? s->n_seen : 0;
}

void eng_sampler_fill_row(eng_sampler_t *s, struct eng_sample_row *row,
                          struct eng_sample_hist *hist)
{
    const struct eng_sampler_params *p = &s->p;
    row->temperature = p->temperature;
    row->top_k = p->top_k;
    row->top_p = p->top_p;
    row->min_p = p->min_p;
    row->repetition_penalty = p->repetition_penalty;
    row->presence_penalty = p->presence_penalty;
    row->frequency_penalty = p->frequency_penalty;
    /* The draw eng_sampler_sample would make, from the same generator. */
    row->u = p->temperature != 0.0f ? rng_uniform(s->rng) : 0.0;
    row->n_logprobs = p->n_logprobs;
    row->n_bias = p->n_logit_bias;
    row->bias_ids = s->bias_ids;
    row->bias_vals = s->bias_vals;
    row->n_hist = eng_sampler_hist_len(s);
    row->hist = row->n_hist ? hist : NULL;
    for (int32_t i = 0; i < row->n_hist; i++) {
        int32_t t = s->seen[i];
        hist[i] = (struct eng_sample_hist){t, s->count[t], s->in_prompt[t]};
    }
}

double eng_sampler_log_sum_exp(const float *v, int32_t n)
{
    double mx = -INFINITY;
    for (int32_t t = 0; t < n; t++)
        mx = v[t] > mx ? v[t] : mx;
    double sum = 0.0;
    if (isfinite(mx))
        for (int32_t t = 0; t < n; t++)
            sum += exp((double)v[t] - mx);
    return mx + log(sum);
}

void eng_sampler_top_n(const float *v, int32_t vocab, int32_t n, int32_t *ids)
{
    int32_t have = 0;
    for (int32_t t = 0; t < vocab; t++) {
        if (have == n && !(v[t] > v[ids[n - 1]]))
            continue;
        int32_t at = have < n ? have++ : n - 1;
        while (at > 0 && v[t] > v[ids[at - 1]]) {
            ids[at] = ids[at - 1];
            at--;
        }
        ids[at] = t;
    }
}

static int cmp_desc(const void *a, const void *b, void *vals)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    const float *v = vals;
    float vx = v[x], vy = v[y];
    if (vx != vy)
        return vx > vy ? -1 : 1;
    return x < y ? -1 : x > y;
}

inf_status_t eng_sampler_sample(eng_sampler_t *s, const float *logits, struct eng_sample *out,
                                struct inf_err *err)
{
    const struct eng_sampler_params *p = &s->p;
    int32_t V = s->vocab;
    float *w = s->w;

    /* 1. raw log-softmax for logprobs */
    const double lse = eng_sampler_log_sum_exp(logits, V);

    /* 2-3. bias and penalties */
    memcpy(w, logits, (size_t)V * sizeof(float));
    for (int32_t i = 0; i < p->n_logit_bias; i++)
        w[p->logit_bias[i].token] += p->logit_bias[i].bias;
    if (penalized(p)) {
        for (int32_t t = 0; t < V; t++) {
            if (p->repetition_penalty != 1.0f && (s->in_prompt[t] || s->count[t] > 0))
                w[t] = w[t] > 0.0f ? w[t] / p->repetition_penalty : w[t] * p->repetition_penalty;
            if (s->count[t] > 0)
                w[t] -= p->frequency_penalty * (float)s->count[t] + p->presence_penalty;
        }
    }

    int32_t tok = -1;
    if (p->temperature == 0.0f) {
        float best = -INFINITY;
        for (int32_t t = 0; t < V; t++)
            if (w[t] > best) {
                best = w[t];
                tok = t;
            }
    } else {
        /* 4. temperature, min_p, top_k, top_p over the candidates */
        float wmax = -INFINITY;
        for (int32_t t = 0; t < V; t++) {
            w[t] /= p->temperature;
            wmax = w[t] > wmax ? w[t] : wmax;
        }
        int32_t nc = 0;
        float cut = p->min_p > 0.0f ? wmax + logf(p->min_p) : -INFINITY;
        for (int32_t t = 0; t < V; t++)
            if (w[t] > -INFINITY && w[t] >= cut)
                s->idx[nc++] = t;
        if (nc > 0 && (p->top_k > 0 || p->top_p < 1.0f)) {
            qsort_r(s->idx, (size_t)nc, sizeof(int32_t), cmp_desc, w);
            if (p->top_k > 0 && p->top_k < nc)
                nc = p->top_k;
            if (p->top_p < 1.0f) {
                double tot = 0.0;
                for (int32_t i = 0; i < nc; i++)
                    tot += exp((double)w[s->idx[i]] - wmax);
                double acc = 0.0;
                int32_t keep = nc;
                for (int32_t i = 0; i < nc; i++) {
                    acc += exp((double)w[s->idx[i]] - wmax) / tot;
                    if (acc >= p->top_p) {
                        keep = i + 1;
                        break;
                    }
                }
                nc = keep;
            }
        }
        if (nc > 0) {
            double tot = 0.0;
            for (int32_t i = 0; i < nc; i++)
                tot += exp((double)w[s->idx[i]] - wmax);
            double r = rng_uniform(s->rng) * tot, acc = 0.0;
            tok = s->idx[nc - 1];
            for (int32_t i = 0; i < nc; i++) {
                acc += exp((double)w[s->idx[i]] - wmax);
                if (r < acc) {
                    tok = s->idx[i];
                    break;
                }
            }
        }
    }
    if (tok < 0)
        return inf_err_set(err, INF_E_INVALID, "every token is excluded by the sampling settings");
    out->token = tok;
    out->logprob = (float)((double)logits[tok] - lse);
    out->n_top = p->n_logprobs < V ? p->n_logprobs : V;
    if (out->n_top > 0) {
        eng_sampler_top_n(logits, V, out->n_top, out->top_ids);
        for (int32_t i = 0; i < out->n_top; i++)
            out->top_logprobs[i] = (float)((double)logits[out->top_ids[i]] - lse);
    }
    return INF_OK;
}
