#pragma once
/* engine/sched/scheduler_state.h — the scheduler's own state, shared by its
 * two files: engine/sched/scheduler.c (sequences, blocks, planning, the step,
 * requests) and engine/sched/scheduler_output.c (what a sampled token
 * becomes: text, stop strings, events, prompt logprobs). Nothing outside
 * those two files includes it. Thread: engine (the scheduler's). */
#include "engine/sched/kv_cache.h"
#include "engine/sched/sampler.h"
#include "engine/sched/scheduler_impl.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct eng_sample_out; /* engine/backend.h */

struct sreq;

struct seq {
    struct sreq *r;
    int32_t choice;
    int32_t *tok; /* [cap] prompt + generated */
    int32_t len, cap;
    int32_t n_computed;        /* tokens with KV */
    int32_t n_cached;          /* its first blocks, committed to the prefix cache */
    int32_t *blocks;           /* [max_blocks] physical block ids, -1 before n_freed */
    int32_t n_blocks;          /* blocks[0..n_blocks): a block per ENG_KV_BLOCK positions */
    int32_t n_freed;           /* its first blocks, released: before its window (seq_trim) */
    int32_t reserve;           /* max_batch slots held while running: n before the fork, else 1 */
    bool running;              /* else waiting */
    uint64_t sched_step;       /* step number it was last scheduled in */
    struct seq *wprev, *wnext; /* waiting queue */
};

struct choice {
    struct seq *seq; /* NULL before the fork and after the end */
    eng_sampler_t *smp;
    void *detok;
    struct eng_strbuf text; /* all decoded text (truncated at a stop string) */
    size_t sent;            /* bytes of text already in DELTA events */
    size_t searched;        /* text length already searched: no stop string ends within */
    int32_t n_gen;
    size_t min_mark; /* text length before the min_tokens-th token: stops ending here are ignored */
    struct eng_token_info *pend; /* tokens not yet in a DELTA */
    int32_t n_pend, cap_pend;
    enum eng_finish finish;
    bool ended;
};

/* Logits rows per step for prompt logprobs, beyond one per sequence. */
#define PROMPT_ROWS 64

struct sreq {
    struct eng_request *req;
    uint64_t t_submit, t_first_sched, t_first_token;
    bool started;        /* left the admission queue */
    bool forked;         /* choices 1..n-1 exist (or n == 1 and prefill done) */
    inf_status_t failed; /* set during a step; the request is ended after it */
    int32_t n_open;
    bool want_plp;                 /* prompt_logprobs with logprobs >= 0 */
    bool plp_sent;                 /* its ENG_EV_PROMPT went out */
    int32_t n_plp;                 /* prompt positions scored: plp[1..n_plp] are filled */
    struct eng_token_info *plp;    /* [n_prompt] until sent */
    struct choice *ch;             /* [req->n] */
    size_t stop_len[ENG_MAX_STOP]; /* strlen of each stop string, taken once */
    struct sreq *prev, *next;
};

struct eng_sched {
    struct eng_sched_config cfg;
    struct eng_lm *lm;
    const struct eng_detok_ops *detok;
    eng_emit_fn emit;
    void *user;
    int32_t max_blocks; /* blocks one sequence can need */
    int32_t watermark;  /* free blocks admission leaves: 1% of the pool */
    uint64_t seed_counter;

    eng_kv_cache_t *kv; /* the block pool (no slots: lists are in struct seq) */

    struct seq **running; /* [max_batch], oldest first */
    int32_t n_running;
    int32_t reserved; /* sum of reserve over running */
    struct seq *whead, *wtail;
    int32_t n_waiting;
    struct sreq *reqs;

    /* step buffers */
    uint64_t step_no;
    struct seq **st_seq;             /* [max_batch] */
    int32_t *st_chunk;               /* [max_batch] */
    int32_t *b_tok, *b_pos, *b_slot; /* [max_batched_tokens] */
    uint8_t *b_want;
    int32_t *b_table; /* [max_batch * max_blocks] */
    float *logits;    /* [(max_batch + PROMPT_ROWS) * vocab] */
    int32_t plp_left; /* prompt-logprob rows still free in the step being planned */
    float *scratch;   /* [vocab] */
    /* sampling on the device (lm->forward_sample) */
    struct eng_sample_row *rows;  /* [max_batch] */
    struct eng_sample_out *picks; /* [max_batch] */
    int32_t *st_row;              /* [max_batch] first row of st_seq[k] */
    struct eng_sample_hist *hist; /* penalty histories of a step (grows) */
    size_t hist_cap;
    /* the decode step queued ahead (queue_ahead), in flight behind the one
     * being collected */
    struct seq **ah_seq; /* [max_batch] its sequences, a sampled row each, in
                          * row order; NULL where one has ended since */
    int32_t n_ah;        /* its rows; 0: none queued */
    int32_t *b_feed;     /* [max_batch] */

    uint64_t dequeued;
    struct eng_stats stats;
};

/* ---- scheduler.c ---------------------------------------------------------------- */
/* Remove q from wherever it is (running, waiting, the step queued ahead),
 * free its blocks and itself. */
void eng_sched_seq_drop(eng_sched_t *s, struct seq *q);
/* Free r, its remaining sequences and choices, without events. */
void eng_sched_req_free(eng_sched_t *s, struct sreq *r);

/* ---- scheduler_output.c ------------------------------------------------------------ */
/* r has left the admission queue (first admitted, or ended while waiting). */
void eng_sched_mark_dequeued(eng_sched_t *s, struct sreq *r);
/* End the whole request with an ERROR event (no further DELTA) and free it. */
void eng_sched_req_error(eng_sched_t *s, struct sreq *r, inf_status_t code, const char *msg);
/* End choice ci with fin: its final DELTA, then DONE and the request freed
 * after the last choice. Returns true when r was freed. When the DELTA
 * cannot be built (out of memory) r is only marked failed and false is
 * returned: the caller may be in the middle of a step whose list still
 * holds r's other sequences, so r is ended by the step's end (or by
 * eng_sched_cancel, outside a step). */
bool eng_sched_choice_end(eng_sched_t *s, struct sreq *r, int32_t ci, enum eng_finish fin);
/* Take pick as the next token of q: record, detokenize, check the ends, send
 * events. A pick of -1 (every token excluded) answers INF_E_INVALID;
 * otherwise errors are INF_E_NOMEM. */
inf_status_t eng_sched_accept_pick(eng_sched_t *s, struct seq *q,
                                   const struct eng_sample_out *pick);
/* Sample the next token of q on the host from row (edited: EOS is masked
 * while min_tokens is not reached) and take it as eng_sched_accept_pick. */
inf_status_t eng_sched_sample_accept(eng_sched_t *s, struct seq *q, float *row);
/* Logits rows q's chunk at [c0, c0 + chunk) needs to score prompt tokens:
 * positions from max(c0, n_plp) up to n_prompt - 1 (excluded), of choice 0
 * only. */
int32_t eng_sched_plp_rows(const struct seq *q, int32_t c0, int32_t chunk);
/* chunk, shortened so that its scoring rows fit in what the step has left
 * (0 when nothing fits). */
int32_t eng_sched_plp_clamp(const eng_sched_t *s, const struct seq *q, int32_t chunk);
/* Score prompt[p + 1] from the logits row lg read at position p. */
void eng_sched_plp_score(const eng_sched_t *s, struct sreq *r, int32_t p, const float *lg);
/* Send r's prompt logprobs (all scored by now). Errors: INF_E_NOMEM. */
inf_status_t eng_sched_emit_prompt(eng_sched_t *s, struct sreq *r);
