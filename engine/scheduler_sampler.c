/* engine/scheduler_sampler.c — engine/sampler.h behind the plain interface of
 * engine/scheduler_sampler.h. */
#include "engine/scheduler_sampler.h"
#include "engine/sampler.h"

#include <stdlib.h>

struct eng_sched_sampler {
    eng_sampler_t *s;
    int32_t logprobs;
};

inf_status_t eng_sched_sampler_create(const struct eng_sched_sampler_params *p, int32_t vocab,
                                      const int32_t *prompt, int32_t n_prompt,
                                      eng_sched_sampler_t **out, struct inf_err *err)
{
    struct eng_sched_sampler *x = calloc(1, sizeof *x);
    struct eng_logit_bias *bias = NULL;
    if (!x)
        return inf_err_set(err, INF_E_NOMEM, "out of memory");
    if (p->n_logit_bias > 0) {
        bias = malloc(sizeof *bias * (size_t)p->n_logit_bias);
        if (!bias) {
            free(x);
            return inf_err_set(err, INF_E_NOMEM, "out of memory");
        }
        for (int32_t i = 0; i < p->n_logit_bias; i++)
            bias[i] = (struct eng_logit_bias){p->logit_bias_ids[i], p->logit_bias_vals[i]};
    }
    struct eng_sampler_params sp;
    eng_sampler_params_default(&sp);
    sp.temperature = p->temperature;
    sp.top_k = p->top_k > 0 ? p->top_k : 0;
    sp.top_p = p->top_p;
    sp.min_p = p->min_p;
    sp.repetition_penalty = p->repetition_penalty;
    sp.presence_penalty = p->presence_penalty;
    sp.frequency_penalty = p->frequency_penalty;
    sp.logit_bias = bias;
    sp.n_logit_bias = p->n_logit_bias;
    sp.seed = p->seed;
    sp.n_logprobs = p->logprobs > 0 ? p->logprobs : 0;
    x->logprobs = p->logprobs;
    inf_status_t st = eng_sampler_create(&sp, vocab, &x->s, err); /* copies the bias */
    free(bias);
    if (st != INF_OK) {
        free(x);
        return st;
    }
    eng_sampler_add_prompt(x->s, prompt, n_prompt);
    *out = x;
    return INF_OK;
}

void eng_sched_sampler_destroy(eng_sched_sampler_t *s)
{
    if (!s)
        return;
    eng_sampler_destroy(s->s);
    free(s);
}

inf_status_t eng_sched_sampler_pick(eng_sched_sampler_t *s, const float *logits,
                                    struct eng_sched_pick *out, struct inf_err *err)
{
    struct eng_sample r;
    inf_status_t st = eng_sampler_sample(s->s, logits, &r, err);
    if (st != INF_OK)
        return st;
    eng_sampler_accept(s->s, r.token);
    out->id = r.token;
    out->logprob = s->logprobs >= 0 ? r.logprob : 0.0f;
    out->n_top = 0;
    for (int32_t i = 0; i < r.n_top && i < ENG_SCHED_MAX_TOP; i++) {
        out->top_ids[i] = r.top_ids[i];
        out->top_logprobs[i] = r.top_logprobs[i];
        out->n_top = i + 1;
    }
    return INF_OK;
}
