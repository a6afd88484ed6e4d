#pragma once
/* engine/sched/sampler.h — engine-internal: turning one row of logits into a token.
 *
 * Per request, in this order (vLLM's):
 *   1. logprobs are taken from the RAW logits (log-softmax of the model's
 *      output before any processing), vLLM's default `raw_logprobs`;
 *   2. logit_bias is added;
 *   3. repetition_penalty (> 1 discourages) divides positive and multiplies
 *      negative logits of every token seen in the prompt or the output;
 *      frequency_penalty * count and presence_penalty * (count > 0) are
 *      subtracted for tokens of the output only;
 *   4. temperature 0 → greedy: the largest logit, lowest id on ties;
 *      otherwise logits / temperature, then min_p (drop tokens whose
 *      probability is below min_p * the largest), top_k (keep the k largest),
 *      top_p (keep the smallest prefix of the sorted distribution whose mass
 *      reaches top_p), and one draw from what is left.
 * The draw uses the request's own xoshiro256** generator seeded through
 * splitmix64 from `seed`: the same seed and the same logits give the same
 * tokens, whatever else runs in the batch. Thread: engine (one owner per
 * sampler). */
#include "common/inf.h"

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ENG_MAX_LOGPROBS 20

struct eng_logit_bias {
    int32_t token;
    float bias;
};

struct eng_sampler_params {
    float temperature;                       /* >= 0; 0 is greedy */
    int32_t top_k;                           /* <= 0: off */
    float top_p;                             /* (0, 1]; 1: off */
    float min_p;                             /* [0, 1]; 0: off */
    float repetition_penalty;                /* > 0; 1: off */
    float presence_penalty;                  /* [-2, 2] */
    float frequency_penalty;                 /* [-2, 2] */
    const struct eng_logit_bias *logit_bias; /* copied by create */
    int32_t n_logit_bias;
    uint64_t seed;
    int32_t n_logprobs; /* top alternatives to report, 0..ENG_MAX_LOGPROBS */
};

/* Neutral settings: greedy, no penalties, seed 0, no logprobs. */
void eng_sampler_params_default(struct eng_sampler_params *s);

struct eng_sample {
    int32_t token;
    float logprob;                     /* of token, raw log-softmax */
    int32_t n_top;                     /* = n_logprobs */
    int32_t top_ids[ENG_MAX_LOGPROBS]; /* most likely first, lowest id on ties */
    float top_logprobs[ENG_MAX_LOGPROBS];
};

typedef struct eng_sampler eng_sampler_t;

/* A sampler for one request over a vocabulary of vocab tokens; its work
 * arrays are allocated here, once. Errors: INF_E_INVALID (a value out of
 * range, named), INF_E_NOMEM. The caller owns *out. */
inf_status_t eng_sampler_create(const struct eng_sampler_params *params, int32_t vocab,
                                eng_sampler_t **out, struct inf_err *err);
void eng_sampler_destroy(eng_sampler_t *s); /* NULL is a no-op */

/* Tokens of the prompt (for repetition_penalty). Out-of-range ids are ignored. */
void eng_sampler_add_prompt(eng_sampler_t *s, const int32_t *ids, int32_t n);
/* Record a generated token (for all penalties). */
void eng_sampler_accept(eng_sampler_t *s, int32_t token);

/* ---- the device path (backends with a sample slot, engine/backend.h) ----
 * Penalty history entries eng_sampler_fill_row will write (0 without
 * penalties). */
int32_t eng_sampler_hist_len(const eng_sampler_t *s);
/* Fill row with the settings, the history (into hist, eng_sampler_hist_len
 * entries) and the uniform draw that eng_sampler_sample would use next: the
 * generator advances exactly as it would (one draw when temperature > 0), so
 * a row sampled on the device continues the same stream. The bias arrays
 * point into the sampler; logit_row and ban are left to the caller. */
struct eng_sample_row;
struct eng_sample_hist;
void eng_sampler_fill_row(eng_sampler_t *s, struct eng_sample_row *row,
                          struct eng_sample_hist *hist);
/* log(sum(exp(v[i]))) over v[0..n), in double, from the largest value
 * (-inf when every value is -inf): the raw log-softmax's normalizer of the
 * logprobs. */
double eng_sampler_log_sum_exp(const float *v, int32_t n);
/* The n ids of v's largest values in descending order, the lowest id first
 * on ties (the top-n logprobs' order). n small: an insertion list. */
void eng_sampler_top_n(const float *v, int32_t vocab, int32_t n, int32_t *ids);

/* Choose a token from logits[vocab] (left unchanged). Does not accept it:
 * call eng_sampler_accept. Errors: INF_E_INVALID when every token is
 * excluded (e.g. all logits -inf). */
inf_status_t eng_sampler_sample(eng_sampler_t *s, const float *logits, struct eng_sample *out,
                                struct inf_err *err);

#ifdef __cplusplus
}
#endif
