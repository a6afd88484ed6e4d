#pragma once
/* engine/sched/greedy.h — engine-internal: greedy generation straight through the
 * model (no scheduler, no sampler): n_seq prompts run together as the n_seq
 * slots of one batch, one prefill step then one decode step per token, over
 * a paged KV cache of its own (engine/sched/kv_cache.h). What the model tests, the
 * generate tool and the CPU decode benchmark run. Thread: engine (the
 * caller's thread owns the model for the call). */
#include "common/inf.h"
#include "engine/model.h"

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct eng_greedy {
    int32_t n_seq;                 /* sequences, >= 1 */
    const int32_t *const *prompts; /* [n_seq] prompt ids */
    const int32_t *n_prompt;       /* [n_seq] prompt lengths, >= 1 */
    int32_t n_new;                 /* ids generated per sequence, >= 1 */
    /* Sequence 0 wants logits at every position it feeds, not only its last. */
    bool all_logits0;
    /* Called after each step's forward, may be NULL: step (0 the prefill),
     * the step's logits [rows][vocab] in batch order (sequence by sequence;
     * rows of sequence 0: n_prompt[0] at step 0 with all_logits0, else 1),
     * and the nanoseconds the forward took. */
    void (*on_step)(void *user, int32_t step, const float *logits, uint64_t ns);
    void *user;
};

/* Size opts for g's shape: tokens one forward holds (the prefill of every
 * prompt, at least 64) and KV blocks (every sequence at its longest). Set
 * them before eng_model_load. */
void eng_greedy_size(struct eng_model_opts *opts, int32_t n_seq, int32_t max_prompt, int32_t n_new);

/* Run g: out[s * n_new + i] is the i-th id sequence s generates (the argmax,
 * lowest id on ties). The model needs eng_greedy_size's room.
 * Errors: INF_E_INVALID (g), INF_E_NOMEM, those of eng_model_forward and
 * eng_kv_seq_reserve (INF_E_BUSY when the model's KV pool is too small). */
inf_status_t eng_greedy_run(eng_model_t *m, const struct eng_greedy *g, int32_t *out,
                            struct inf_err *err);

#ifdef __cplusplus
}
#endif
