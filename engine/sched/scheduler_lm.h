#pragma once
/* engine/sched/scheduler_lm.h — engine-internal: the real model (engine/model.h on
 * a backend) and the tokenizer's streaming detokenizer
 * (tokenizer/tokenizer.h) behind the scheduler's interfaces. Thread: engine
 * (create may run on the thread that creates the engine). */
#include "engine/sched/scheduler_impl.h"
#include "tokenizer/tokenizer.h"

struct eng_lm_model_opts {
    const char *dir;                    /* checkpoint folder */
    enum eng_quantization quantization; /* engine/eng.h */
    int32_t group_size;                 /* 0 = the model's default, -1 = per-channel */
    bool symmetric;
    bool fuse_qkv;
    const char *const *keep_fp16; /* substrings of tensor names, or fnmatch patterns */
    int32_t n_keep_fp16;
    int32_t max_tokens;    /* tokens of one step (the scheduler's budget) */
    int32_t kv_blocks;     /* KV pool of the model, in blocks; 0: none until kv_reserve */
    int32_t max_batch;     /* sequences of one step (block tables planned at load; 0: grow) */
    int32_t max_model_len; /* tokens of one sequence (idem) */
    bool eager;            /* no decode graphs (eng_config's enforce_eager) */
};

/* The opts of cfg's model (dir, quantization, fp16 layers, max_tokens from
 * max_batched_tokens); kv_blocks from kv_cache_tokens; block tables planned
 * from max_batch and max_model_len when both are set. */
struct eng_config;
void eng_lm_model_opts_from_config(const struct eng_config *cfg, struct eng_lm_model_opts *o);

/* Load the model onto be and fill lm. On INF_OK lm owns be (lm->destroy
 * frees the model, then be); on error the caller keeps be. lm->kv_reserve
 * keeps pools of the size asked and (re)takes them at any other size.
 * Errors: those of eng_model_load. */
struct eng_backend;
inf_status_t eng_lm_model_create(const struct eng_lm_model_opts *o, struct eng_backend *be,
                                 struct eng_lm *lm, struct inf_err *err);
/* fnmatch(3) patterns made from keep_fp16's names, alive as long as the
 * model that reads them. */
struct eng_lm_keep {
    char **p;
    int32_t n;
};
void eng_lm_keep_fini(struct eng_lm_keep *k);

/* The model of o onto be, as rank tp_rank of tp_size (0, 1: the whole
 * model; a rank other than the first computes no logits); the patterns go
 * into *keep (released with eng_lm_keep_fini after the model, and by this
 * call on error). Errors: those of eng_model_load. */
typedef struct eng_model eng_model_t;
inf_status_t eng_lm_model_load(const struct eng_lm_model_opts *o, struct eng_backend *be,
                               int32_t tp_rank, int32_t tp_size, struct eng_lm_keep *keep,
                               eng_model_t **out, struct inf_err *err);
/* lm's description of model m on be (name, vocabulary, length, BOS/EOS,
 * kv_id for a group of tp_size ranks); its ops are the caller's. */
void eng_lm_describe(struct eng_lm *lm, const struct eng_lm_model_opts *o, const eng_model_t *m,
                     const struct eng_backend *be, int32_t tp_size);

/* The model behind an lm made by eng_lm_model_create (for inspection). */
struct eng_model;
const struct eng_model *eng_lm_model(const struct eng_lm *lm);
/* Detokenizer ops over tok (which must outlive every state they open). */
void eng_lm_detok_ops(tok_tokenizer_t *tok, struct eng_detok_ops *ops);
