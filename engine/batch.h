#pragma once
/* engine/batch.h — engine-internal: one forward step, as the scheduler fills it
 * and the model (engine/model.c, or the mock) consumes it.
 *
 * A step mixes prefill chunks and single-token decodes of many sequences. Each
 * token belongs to a sequence slot; slots index the block tables of the paged
 * KV cache (blocks of ENG_KV_BLOCK tokens). The tokens of one slot are
 * contiguous in the batch and their positions are consecutive. Before the
 * step, slot s holds pos[first token of s] tokens of KV; the step writes the
 * KV of its tokens, then attends causally over everything up to each token.
 */
#include <stdint.h>

#define ENG_KV_BLOCK 16

struct eng_batch {
    int32_t n_tokens;            /* tokens in this step, >= 1 */
    const int32_t *tokens;       /* [n_tokens] token ids, 0 <= id < vocab */
    const int32_t *pos;          /* [n_tokens] position of each token in its sequence */
    const int32_t *slot;         /* [n_tokens] sequence slot of each token */
    const uint8_t *want_logits;  /* [n_tokens] 1 where logits are wanted */
    int32_t n_logits;            /* number of 1s in want_logits */
    const int32_t *block_table;  /* [n_slots][max_blocks] physical block ids, -1 unused */
    int32_t n_slots;             /* rows of block_table */
    int32_t max_blocks;          /* columns of block_table */
    /* NULL, or [n_tokens]: -1, or the index of a sampled row of the step
     * submitted just before this one (struct eng_lm's submit), whose token
     * is this token's id (tokens[i] is then ignored: the id is read on the
     * device, where that step sampled it). Only a model that samples on
     * its device takes it. */
    const int32_t *feed;
};
