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
 * Prefix cache (eng_kv_cache_enable_prefix). A full block can be committed:
 * until it is evicted it holds the KV of its ENG_KV_BLOCK token ids after the
 * committed block before it (its parent; none for a sequence's first
 * block), so a sequence with the same tokens from position 0 can hold it
 * instead of computing it again. Committed blocks are found by a hash
 * chained over the parent's hash and the block's ids (the chain starts at a
 * salt that names what fills the blocks: model, KV dtype), and every hit is
 * confirmed against the ids the block keeps and the identity of its parent,
 * so two prefixes whose hashes collide never share a block. A committed
 * block nobody holds stays cached, on a least-recently-freed list, and is
 * evicted (uncommitted) only when a block is needed and no block that caches
 * nothing is free. Nothing is ever written into a committed block: the
 * caller commits a block only once all its positions are written.
 *
 * Two levels over the one pool: the block calls (eng_kv_block_*) for a caller
 * that keeps its own block lists (the scheduler), and the slot calls
 * (eng_kv_seq_*) that keep them here (the model tests and tools).
 * Thread: engine (one owner). */
#include "common/inf.h"

#include <stdbool.h>
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

/* Blocks nobody holds, committed ones (evictable) included. */
int32_t eng_kv_cache_free_blocks(const eng_kv_cache_t *kv);
int32_t eng_kv_cache_n_blocks(const eng_kv_cache_t *kv);
int32_t eng_kv_cache_n_slots(const eng_kv_cache_t *kv);
int32_t eng_kv_cache_max_blocks(const eng_kv_cache_t *kv);

/* Take a free block with a reference count of 1; -1 when none is free. A
 * block that caches nothing is taken first; else the committed block freed
 * longest ago is evicted (it leaves the prefix cache) and taken. */
int32_t eng_kv_block_alloc(eng_kv_cache_t *kv);
/* One more holder of block b, which must be held (sharing) or be committed
 * (a prefix hit: a block nobody held leaves the eviction list). */
void eng_kv_block_ref(eng_kv_cache_t *kv, int32_t b);
/* One holder fewer of block b (which must be held); at 0 it is free again:
 * a committed block at the recent end of the eviction list, any other one
 * on the free stack. */
void eng_kv_block_unref(eng_kv_cache_t *kv, int32_t b);
/* Holders of block b (0 for a free or cached block nobody holds). */
int32_t eng_kv_block_refs(const eng_kv_cache_t *kv, int32_t b);

/* ---- prefix cache ----------------------------------------------------------------
 * The chain hash of a block of ENG_KV_BLOCK ids after a block whose hash is
 * parent (the salt for a sequence's first block). */
typedef uint64_t (*eng_kv_hash_fn)(uint64_t parent, const int32_t *ids);
uint64_t eng_kv_block_hash(uint64_t parent, const int32_t *ids);

/* Turn the prefix cache on, its chain starting at salt; fn replaces
 * eng_kv_block_hash (a test hook that forces collisions; NULL: the chain
 * hash). Only on a cache that holds no block. Errors: INF_E_INVALID (blocks
 * held), INF_E_NOMEM. */
inf_status_t eng_kv_cache_enable_prefix(eng_kv_cache_t *kv, uint64_t salt, eng_kv_hash_fn fn,
                                        struct inf_err *err);
bool eng_kv_cache_prefix_on(const eng_kv_cache_t *kv);
/* Committed blocks (held or not). */
int32_t eng_kv_cache_cached_blocks(const eng_kv_cache_t *kv);
/* Whether block b is committed. */
bool eng_kv_block_cached(const eng_kv_cache_t *kv, int32_t b);

/* The committed block that holds ids[0..ENG_KV_BLOCK) after parent (-1 for
 * a sequence's first block, else a committed block), or -1. Takes no
 * reference (eng_kv_block_ref does). -1 when the prefix cache is off. */
int32_t eng_kv_prefix_find(const eng_kv_cache_t *kv, int32_t parent, const int32_t *ids);
/* Commit block b (held by the caller, every position written with
 * ids[0..ENG_KV_BLOCK)) after parent (-1, or a committed block). Returns the
 * block the caller holds from now on in b's place: b, now committed; or an
 * already committed block with the same content, whose reference the
 * caller then holds instead of b's (b is released). Returns b unchanged
 * when the prefix cache is off. */
int32_t eng_kv_prefix_commit(eng_kv_cache_t *kv, int32_t b, int32_t parent, const int32_t *ids);

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
