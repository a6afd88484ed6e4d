#pragma once
/* Test helper (header only) of tests/engine/test_tp.c (CPU) and
 * tests/gpu/gpu_tp.c (CUDA): one run of a model as a struct eng_lm (one
 * backend or a group of ranks). A PROMPT-token prompt prefilled in one step
 * gives its teacher-forced log-softmax rows lp[PROMPT][VOCAB]; then NEW
 * greedy steps give ids[NEW] and, where margin is not NULL, the top-1 minus
 * top-2 logit of each step. The block table is the pool's first MAX_BLOCKS
 * blocks, in reverse order where reversed. The includer defines PROMPT,
 * NEW, VOCAB and MAX_BLOCKS (an enum) and TP_REQUIRE(ok, what, err), its
 * way to fail. */
#include "engine/batch.h"
#include "engine/sched/scheduler_lm.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

static void tp_run(struct eng_lm *lm, bool reversed, double *lp, int32_t *ids, float *margin)
{
    int32_t tok[PROMPT], pos[PROMPT], slot[PROMPT], bt[MAX_BLOCKS];
    uint8_t want[PROMPT];
    for (int32_t t = 0; t < PROMPT; t++) {
        tok[t] = (t * 37 + 5) % VOCAB;
        pos[t] = t;
        slot[t] = 0;
        want[t] = 1;
    }
    for (int32_t b = 0; b < MAX_BLOCKS; b++)
        bt[b] = reversed ? MAX_BLOCKS - 1 - b : b;
    float *logits = malloc((size_t)PROMPT * VOCAB * sizeof *logits);
    struct eng_batch b = {.n_tokens = PROMPT,
                          .tokens = tok,
                          .pos = pos,
                          .slot = slot,
                          .want_logits = want,
                          .n_logits = PROMPT,
                          .block_table = bt,
                          .n_slots = 1,
                          .max_blocks = MAX_BLOCKS};
    struct inf_err err = {0};
    TP_REQUIRE(lm->forward(lm->self, &b, logits, &err) == INF_OK, "prefill", &err);
    for (int32_t t = 0; t < PROMPT; t++) {
        const float *row = logits + (int64_t)t * VOCAB;
        double mx = row[0], sum = 0;
        for (int32_t v = 1; v < VOCAB; v++)
            mx = row[v] > mx ? row[v] : mx;
        for (int32_t v = 0; v < VOCAB; v++)
            sum += exp(row[v] - mx);
        for (int32_t v = 0; v < VOCAB; v++)
            lp[(int64_t)t * VOCAB + v] = row[v] - mx - log(sum);
    }
    const float *row = logits + (int64_t)(PROMPT - 1) * VOCAB;
    int32_t p = PROMPT;
    for (int32_t i = 0; i < NEW; i++) {
        int32_t best = 0, second = 1;
        for (int32_t v = 1; v < VOCAB; v++)
            if (row[v] > row[best]) {
                second = best;
                best = v;
            } else if (v != best && row[v] > row[second]) {
                second = v;
            }
        ids[i] = best;
        if (margin)
            margin[i] = row[best] - row[second];
        uint8_t one = 1;
        struct eng_batch d = {.n_tokens = 1,
                              .tokens = &ids[i],
                              .pos = &p,
                              .slot = slot,
                              .want_logits = &one,
                              .n_logits = 1,
                              .block_table = bt,
                              .n_slots = 1,
                              .max_blocks = MAX_BLOCKS};
        TP_REQUIRE(lm->forward(lm->self, &d, logits, &err) == INF_OK, "decode", &err);
        row = logits;
        p++;
    }
    free(logits);
}
