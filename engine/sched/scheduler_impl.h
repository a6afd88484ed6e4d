#pragma once
/* engine/sched/scheduler_impl.h — engine-internal: the continuous-batching scheduler
 * and the small interfaces it runs against (a language model over paged KV
 * blocks, an incremental detokenizer). Sampling is engine/sched/sampler.h's.
 *
 * The scheduler is single-threaded: everything here runs on the engine thread
 * (engine/engine.c), or on a test's thread that drives it step by step. */
#include "common/inf.h"
#include "engine/batch.h"
#include "engine/eng.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- a growing byte string ---------------------------------------------------- */
struct eng_strbuf {
    char *p; /* NUL-terminated when non-NULL */
    size_t len, cap;
};
/* Append n bytes. INF_E_NOMEM on allocation failure (sb unchanged). */
inf_status_t eng_strbuf_append(struct eng_strbuf *sb, const char *s, size_t n);
void eng_strbuf_fini(struct eng_strbuf *sb);

/* ---- the language model, as the scheduler sees it ------------------------------
 * forward() runs one step (engine/batch.h) and writes fp32 logits
 * [b->n_logits][vocab], one row per token with want_logits set, in batch
 * order. The model keeps its KV in n_blocks physical blocks of ENG_KV_BLOCK
 * tokens (kv_reserve is called once, before the first step); the scheduler
 * owns the block tables and never lets two sequences write one block. */
#define ENG_LM_MAX_EOS 8
struct eng_sample_row; /* engine/backend.h */
struct eng_sample_out;
struct eng_lm {
    void *self;
    const char *name; /* "mock", "cpu", ... */
    int32_t vocab;
    int32_t max_len; /* positions the model supports */
    int32_t window;  /* sliding-window attention: keys a query sees, its own
                        included (engine/backend.h eng_attn_first_key); the
                        scheduler frees the blocks before every sequence's
                        window. 0: none */
    int32_t bos_id;  /* -1 none */
    int32_t n_eos;
    int32_t eos_ids[ENG_LM_MAX_EOS];
    /* What fills the KV blocks besides the token ids: a hash of the model
     * (its shapes, weights' source and quantization) and of the KV dtype,
     * so that blocks of one model or dtype never pass for another's in the
     * prefix cache. 0: unknown. */
    uint64_t kv_id;
    /* Reserve KV for n_blocks blocks. Errors: INF_E_NOMEM, INF_E_DEVICE. */
    inf_status_t (*kv_reserve)(void *self, int32_t n_blocks, struct inf_err *err);
    /* One step. Errors: INF_E_DEVICE (sticky), INF_E_INTERNAL. */
    inf_status_t (*forward)(void *self, const struct eng_batch *b, float *logits,
                            struct inf_err *err);
    /* Optional: one step that samples on the device: rows[i] (in order of
     * logit_row, the index among the step's tokens wanting logits) gives
     * out[i]; only the results come back. NULL: the scheduler samples
     * forward's logits on the host. Errors: those of forward. */
    inf_status_t (*forward_sample)(void *self, const struct eng_batch *b,
                                   const struct eng_sample_row *rows, int32_t n_rows,
                                   struct eng_sample_out *out, struct inf_err *err);
    /* Optional, with forward_sample: the same step in two halves, so that
     * the next step can be queued while this one runs. submit() queues the
     * step (b may have a feed, engine/batch.h) and returns; collect() waits
     * for the oldest step submitted and not yet collected and writes its
     * out[n_rows] (n_rows as submitted). At most two steps are submitted
     * and not collected; a failed submit or collect leaves the model
     * unusable (INF_E_DEVICE is sticky). NULL: forward_sample only. */
    inf_status_t (*submit)(void *self, const struct eng_batch *b, const struct eng_sample_row *rows,
                           int32_t n_rows, struct inf_err *err);
    inf_status_t (*collect)(void *self, struct eng_sample_out *out, struct inf_err *err);
    /* Optional: run once before serving what the first steps would set up
     * lazily (decode graphs, kernel loading; engine/model.h
     * eng_model_warm_up), with the KV pool reserved and still empty. NULL:
     * nothing to warm. */
    inf_status_t (*warm_up)(void *self, int32_t max_rows, int32_t prompt_tokens, int32_t *n_graphs,
                            int32_t *n_prompt, struct inf_err *err);
    void (*destroy)(void *self);
};

/* ---- incremental detokenization ----------------------------------------------------
 * One state per choice. push() appends to out the text that tok completes;
 * what it appends never ends inside a UTF-8 character (incomplete bytes are
 * held). flush() appends whatever is held at the end of the sequence
 * (malformed bytes as U+FFFD). Special tokens (BOS, EOS) produce no text. */
struct eng_detok_ops {
    void *self;
    /* New state for a choice continuing prompt (used as left context).
     * NULL on out of memory. */
    void *(*open)(void *self, const int32_t *prompt, int32_t n_prompt);
    inf_status_t (*push)(void *st, int32_t tok, struct eng_strbuf *out);
    inf_status_t (*flush)(void *st, struct eng_strbuf *out);
    void (*close)(void *st);
};

/* ---- the scheduler -------------------------------------------------------------------- */
typedef struct eng_sched eng_sched_t;

struct eng_sched_config {
    int32_t max_batch;          /* running sequences at once */
    int32_t max_batched_tokens; /* tokens in one step */
    int32_t max_model_len;      /* prompt + generated tokens of one sequence */
    int32_t kv_blocks;          /* physical blocks of ENG_KV_BLOCK tokens */
    uint64_t seed;              /* base of the seeds of requests without one */
    /* Do not queue a decode step ahead (struct eng_lm's submit): each step
     * is planned only once the one before is back. */
    bool no_overlap;
    /* Share full KV blocks between sequences whose tokens agree up to their
     * end (engine/sched/kv_cache.h's prefix cache): a sequence admitted
     * holds the cached blocks its tokens start with and computes from
     * there; its own blocks are committed as they fill. */
    bool prefix_caching;
    /* Test hook: the chain hash of the prefix cache (NULL:
     * eng_kv_block_hash), e.g. one that makes every block collide. */
    uint64_t (*prefix_hash)(uint64_t parent, const int32_t *ids);
};

/* Receives every event; takes ownership of ev. Called on the scheduler's thread. */
typedef void (*eng_emit_fn)(void *user, struct eng_event *ev);

/* lm and detok stay owned by the caller and must outlive the scheduler.
 * Calls lm->kv_reserve. Errors: INF_E_INVALID (config named), INF_E_NOMEM. */
inf_status_t eng_sched_create(const struct eng_sched_config *cfg, struct eng_lm *lm,
                              const struct eng_detok_ops *detok, eng_emit_fn emit, void *user,
                              eng_sched_t **out, struct inf_err *err);
/* Frees every request still held, without events. NULL no-op. */
void eng_sched_destroy(eng_sched_t *s);

/* Check req against the model and the limits (ids in range, n, lengths).
 * Reads only what create fixed, so Thread: any.
 * Errors: INF_E_INVALID naming the field. */
inf_status_t eng_sched_validate(const eng_sched_t *s, const struct eng_request *req,
                                struct inf_err *err);
/* Append req to the waiting queue. On INF_OK the scheduler owns req.
 * t_submit is inf_now_ns() at submission (for queue_ns / ttft_ns).
 * Errors: those of eng_sched_validate, INF_E_NOMEM. */
inf_status_t eng_sched_add(eng_sched_t *s, struct eng_request *req, uint64_t t_submit,
                           struct inf_err *err);
/* End request id with ENG_FINISH_ABORT (a final delta per open choice, then
 * DONE) and free its sequences and blocks now. Unknown ids are ignored. */
void eng_sched_cancel(eng_sched_t *s, uint64_t id);
/* eng_sched_cancel for every request. */
void eng_sched_abort_all(eng_sched_t *s);
/* End every request with an ENG_EV_ERROR event carrying code and msg. */
void eng_sched_fail_all(eng_sched_t *s, inf_status_t code, const char *msg);
/* True when no request is waiting or running. */
bool eng_sched_idle(const eng_sched_t *s);
/* One iteration: cancel-free bookkeeping, admission, preemption, one model
 * forward, sampling, detokenization, stop checks, events. Does nothing when
 * idle. On a model error the requests of the step are not ended: the caller
 * decides (the engine fails them all). Errors: those of lm->forward,
 * INF_E_NOMEM. */
inf_status_t eng_sched_step(eng_sched_t *s, struct inf_err *err);
/* Counters and gauges (the engine adds `failed`). */
void eng_sched_stats(const eng_sched_t *s, struct eng_stats *st);
/* Requests that have left the admission queue (first admitted, or ended
 * while waiting) since creation: the engine's max_queue accounting. */
uint64_t eng_sched_dequeued(const eng_sched_t *s);
