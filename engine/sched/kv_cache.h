#pragma once
/* engine/sched/kv_cache.h — engine-internal: the paged KV block allocator.
 *
 * Host-side bookkeeping only: which physical blocks of ENG_KV_BLOCK tokens
 * (engine/batch.h) are free, a reference count per block (a block may be
 * shared read-only, e.g. a prompt's full blocks by the n choices of one
 * request), and, per sequence slot, the ordered list of blocks that hold its
 * positions (its block table row). The KV data itself lives in the model's
 * pools on the backend. Blocks are handed out last-freed first, lowest ids
 * first from a fresh cache.
 *
 * Two levels over the one pool: the block calls (eng_kv_block_*) for a caller
 * that keeps its own block lists (the scheduler), and the slot calls
 * (eng_kv_seq_*) that keep them here (the model tests and tools).
 * Thread: engine (one owner). */
#include "common/inf.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct eng_kv_cache eng_kv_cache_t;

/* n_blocks physical blocks, n_slots sequence slots, each able to hold up to
 * max_blocks blocks (max_blocks * ENG_KV_BLOCK tokens). n_slots may be 0 for
 * a caller that uses only the block calls (max_blocks is then ignored). The
 * caller owns *out. Errors: INF_E_INVALID, INF_E_NOMEM. */
inf_status_t eng_kv_cache_create(int32_t n_blocks, int32_t n_slots, int32_t max_blocks,
                                 eng_kv_cache_t **out, struct inf_err *err);
void eng_kv_cache_destroy(eng_kv_cache_t *kv); /* NULL is a no-op */

int32_t eng_kv_cache_free_blocks(const eng_kv_cache_t *kv);
int32_t eng_kv_cache_n_blocks(const eng_kv_cache_t *kv);
int32_t eng_kv_cache_n_slots(const eng_kv_cache_t *kv);
int32_t eng_kv_cache_max_blocks(const eng_kv_cache_t *kv);

/* Take a free block with a reference count of 1; -1 when none is free. */
int32_t eng_kv_block_alloc(eng_kv_cache_t *kv);
/* One more holder of block b (which must be held): sharing. */
void eng_kv_block_ref(eng_kv_cache_t *kv, int32_t b);
/* One holder fewer of block b (which must be held); at 0 it is free again. */
void eng_kv_block_unref(eng_kv_cache_t *kv, int32_t b);

/* Blocks slot would need, beyond those it has, to hold n_tokens positions. */
int32_t eng_kv_seq_blocks_needed(const eng_kv_cache_t *kv, int32_t slot, int32_t n_tokens);

/* Make slot hold at least n_tokens positions, taking blocks from the free
 * list. All or nothing: on error the slot is unchanged.
 * Errors: INF_E_INVALID (slot), INF_E_CONTEXT (more than max_blocks),
 * INF_E_BUSY (not enough free blocks: the scheduler preempts). */
inf_status_t eng_kv_seq_reserve(eng_kv_cache_t *kv, int32_t slot, int32_t n_tokens,
                                struct inf_err *err);

/* Drop slot's hold on each of its blocks (last to first; a block nobody else
 * holds goes back to the free list); the slot becomes empty. */
void eng_kv_seq_free(eng_kv_cache_t *kv, int32_t slot);

/* Blocks held by slot (0 for an empty or out-of-range slot). */
int32_t eng_kv_seq_n_blocks(const eng_kv_cache_t *kv, int32_t slot);

/* The block tables, [n_slots][max_blocks], -1 where unused; valid until the
 * next reserve/free. Feed it to struct eng_batch.block_table. */
const int32_t *eng_kv_cache_block_table(const eng_kv_cache_t *kv);

#ifdef __cplusplus
}
#endif
