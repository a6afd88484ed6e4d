#pragma once
/* engine/tp/group.h — engine-internal: a tensor-parallel group of ranks as
 * the scheduler's one language model (struct eng_lm).
 *
 * Each rank holds its shard of the model (engine/model.h tp_rank /
 * tp_size) on its own backend, and a thread of its own: the scheduler runs
 * once, and every step goes to every rank at once (rank 0 on the engine
 * thread, the others on theirs); the ranks meet in their backends'
 * all_reduce (engine/tp/comm.h). Rank 0 alone computes the logits (every
 * rank holds the same hidden state after each all-reduce). A rank that
 * fails aborts the group's collectives, so no rank waits for ever; the
 * group then answers every later step with the failure. Thread: engine. */
#include "engine/sched/scheduler_lm.h"

#include <stdint.h>

struct eng_backend;

/* The group of tp ranks over backends[0..tp) (already made, rank r's
 * communicating through comms[r]), loading o's model onto each. On INF_OK
 * lm owns the backends and the communicators (lm->destroy frees them);
 * on error the caller keeps them. Errors: those of eng_model_load (a tp
 * the model's heads or MLP do not divide: INF_E_INVALID, naming the
 * count), INF_E_NOMEM. */
typedef struct eng_comm eng_comm_t;
inf_status_t eng_tp_group_create(const struct eng_lm_model_opts *o, struct eng_backend **backends,
                                 eng_comm_t **comms, int32_t tp, struct eng_lm *lm,
                                 struct inf_err *err);
