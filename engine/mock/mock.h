#pragma once
/* engine/mock/mock.h — engine-internal: a deterministic stand-in for the model, so
 * the scheduler and the server can be tested without model cost.
 *
 * Vocabulary: 0 <unk>, 1 <s> (BOS), 2 </s> (EOS), 3..258 the bytes 0x00..0xFF,
 * and ids 259..vocab-1 the pieces " t<id>". Text is byte-level: a byte token
 * is its byte; the detokenizer assembles UTF-8 characters and answers a
 * malformed sequence with U+FFFD.
 *
 * Logits. The logits after the token at position p are a function of every
 * token at positions 0..p (a hash of the whole history and p): a fixed
 * pseudo-random spread in [0, 2) over printable ASCII bytes, -4 + spread
 * elsewhere, and +6 on one argmax token. The argmax is EOS with probability
 * about 1.2%, otherwise mostly lowercase letters and spaces, sometimes a
 * two- or three-byte UTF-8 character over consecutive tokens.
 *
 * Paged KV. The mock keeps its "KV" as the token id (and position) stored in
 * the cache blocks, and reads the history back through the block table when
 * it computes logits. A step that reads a position that was never written,
 * or whose stored position differs, fails with INF_E_INTERNAL; a block shared
 * or overwritten by mistake changes the outputs. So scheduling, preemption or
 * recompute bugs show up as errors or wrong text.
 *
 * The engine's mock backend ignores model_dir; eng_config's test hooks set
 * the rest: mock_vocab the vocabulary, max_model_len the length,
 * mock_fail_step the fault hook below, mock_device_sampling its
 * device_sampling, and min_step_us (any backend) a minimum step time. */
#include "engine/sched/scheduler_impl.h"
#include "tokenizer/tokenizer.h"

#define ENG_MOCK_BOS 1
#define ENG_MOCK_EOS 2
#define ENG_MOCK_BYTE0 3    /* id of byte 0x00 */
#define ENG_MOCK_PIECE0 259 /* first " t<id>" piece */

struct eng_mock_config {
    int32_t vocab;        /* 0 = 512; at least 259 */
    int32_t max_len;      /* 0 = 4096 */
    int32_t fail_at_step; /* test hook: forward call number n (from 1) and every later one
                           * fail with INF_E_DEVICE; 0 = never */
    /* Sample "on the device" as a GPU model does (struct eng_lm's
     * forward_sample, submit and collect, with the batch's feed): greedy,
     * or by temperature from the row's draw u over the whole softmax;
     * ban and logit_bias applied; logprobs and top-n logprobs as the host
     * sampler's (of the banned row before the bias); top-k, top-p, min-p
     * and penalties ignored. Submitted
     * steps are computed at once and their results kept until collected. */
    bool device_sampling;
    /* Sliding window (struct eng_lm's window; 0: none): a token's logits
     * depend on the last `window` positions only (eng_mock_logits_window),
     * and only those are read back through the block table, for every
     * token of a step (a read of a freed block fails the step), so that the
     * scheduler may free the blocks before them. */
    int32_t window;
};

/* Fill lm with a new mock model (lm->destroy frees it).
 * Errors: INF_E_INVALID (sizes), INF_E_NOMEM. Thread: any. */
inf_status_t eng_mock_create(const struct eng_mock_config *cfg, struct eng_lm *lm,
                             struct inf_err *err);
/* A tokenizer.json tokenizer with the mock's vocabulary (BPE without merges,
 * byte fallback, <unk> <s> </s> special), so the server can encode text for
 * the mock: each byte of the text becomes its byte token.
 * Errors: INF_E_NOMEM, and those of tok_load_json. Thread: any. */
inf_status_t eng_mock_tokenizer(int32_t vocab, tok_tokenizer_t **out, struct inf_err *err);
/* The mock's byte-level incremental detokenizer (self unused). */
extern const struct eng_detok_ops eng_mock_detok;
/* Byte-level encoding of text: id = byte + 3. Writes at most cap ids and
 * returns len (the number needed). Thread: any. */
int32_t eng_mock_encode(const char *text, size_t len, int32_t *out, int32_t cap);
/* Decode ids to text as the detokenizer would over a whole sequence; the
 * result is malloc'd and NUL-terminated (NULL on out of memory). */
char *eng_mock_decode(const int32_t *ids, int32_t n, size_t *len);
/* Tokens whose KV lm's steps have written so far (a prefix cache hit is
 * not computed, so it does not count). lm must be a mock. */
int64_t eng_mock_tokens_computed(const struct eng_lm *lm);
/* The reference: logits [vocab] after the token toks[n-1] of a sequence
 * whose whole history is toks[0..n). No KV involved. */
void eng_mock_logits(int32_t vocab, const int32_t *toks, int32_t n, float *out);
/* The same for a mock with a sliding window: only toks[n - window .. n)
 * count (the whole history when window <= 0 or n <= window). */
void eng_mock_logits_window(int32_t vocab, const int32_t *toks, int32_t n, int32_t window,
                            float *out);
