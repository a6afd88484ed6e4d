#pragma once
/* engine/scheduler_sampler.h — engine-internal: the scheduler's view of
 * engine/sampler.h, one sampler per choice.
 *
 * Plain types only: this header includes neither engine/eng.h nor
 * engine/sampler.h (both define a `struct eng_sampling`), so the scheduler
 * can use it next to eng.h and engine/scheduler_sampler.c next to sampler.h.
 * Thread: engine (one owner per sampler). */
#include "common/inf.h"

#include <stdint.h>

#define ENG_SCHED_MAX_TOP 5

typedef struct eng_sched_sampler eng_sched_sampler_t;

struct eng_sched_sampler_params {
    float temperature; /* 0 = greedy */
    float top_p, min_p;
    int32_t top_k; /* -1 = off */
    float presence_penalty, frequency_penalty, repetition_penalty;
    int32_t n_logit_bias;
    const int32_t *logit_bias_ids;
    const float *logit_bias_vals;
    uint64_t seed;
    int32_t logprobs; /* -1 none, else 0..ENG_SCHED_MAX_TOP alternatives */
};

struct eng_sched_pick {
    int32_t id;
    float logprob; /* raw log-softmax of the model's logits */
    int32_t n_top;
    int32_t top_ids[ENG_SCHED_MAX_TOP];
    float top_logprobs[ENG_SCHED_MAX_TOP];
};

/* A sampler seeded with p->seed that knows the prompt (repetition penalty).
 * Errors: INF_E_INVALID (a value out of range, named), INF_E_NOMEM. */
inf_status_t eng_sched_sampler_create(const struct eng_sched_sampler_params *p, int32_t vocab,
                                      const int32_t *prompt, int32_t n_prompt,
                                      eng_sched_sampler_t **out, struct inf_err *err);
void eng_sched_sampler_destroy(eng_sched_sampler_t *s); /* NULL is a no-op */
/* Choose a token from logits[vocab] and record it as generated.
 * Errors: INF_E_INVALID when every token is excluded. */
inf_status_t eng_sched_sampler_pick(eng_sched_sampler_t *s, const float *logits,
                                    struct eng_sched_pick *out, struct inf_err *err);
