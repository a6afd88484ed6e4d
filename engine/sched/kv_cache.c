/* engine/sched/kv_cache.c — paged KV block allocator and prefix cache
 * (engine/sched/kv_cache.h).
 *
 * A block is in exactly one of three places: held (ref > 0), on the free
 * stack (ref 0, caching nothing), or on the eviction list (ref 0,
 * committed). Committed blocks, held or not, are also in the hash table:
 * buckets of singly linked chains through chain[], so that equal hashes
 * (collisions, or a hash function forced to collide) simply share a chain
 * and are told apart by their ids and parents. */
#define INF_LOG_MODULE "eng"
#include "engine/sched/kv_cache.h"
#include "engine/batch.h"

#include <stdlib.h>
#include <string.h>

struct prefix {
    uint64_t salt;
    eng_kv_hash_fn hash_fn;
    uint64_t *hash;       /* [n_blocks] chain hash of a committed block */
    int32_t *ids;         /* [n_blocks][ENG_KV_BLOCK] the ids it holds the KV of */
    int32_t *parent;      /* [n_blocks] the committed block before it, -1 first */
    uint32_t *parent_gen; /* [n_blocks] gen[parent] when it was committed */
    uint32_t *gen;        /* [n_blocks] bumped each time the block leaves the cache, so
                           * that a child committed after a parent since evicted (and
                           * its id reused) never passes for the new block's child */
    uint8_t *cached;      /* [n_blocks] committed */
    int32_t *chain;       /* [n_blocks] next committed block of the same bucket, -1 */
    int32_t *bucket;      /* [mask + 1] first committed block, -1 */
    uint64_t mask;
    int32_t *prev, *next; /* [n_blocks] eviction list, -1 at the ends */
    int32_t head, tail;   /* freed longest ago (evicted first), most recently */
    int32_t n_lru;        /* blocks on the eviction list */
    int32_t n_cached;     /* committed blocks */
};

struct eng_kv_cache {
    int32_t n_blocks, n_slots, max_blocks;
    int32_t *free_list; /* stack of free block ids that cache nothing, [n_blocks] */
    int32_t n_free;
    int32_t *ref;      /* [n_blocks] holders of each block, 0 when free */
    int32_t *table;    /* [n_slots][max_blocks] */
    int32_t *count;    /* [n_slots] blocks held */
    struct prefix *pc; /* NULL: the prefix cache is off */
};

static void prefix_free(struct prefix *pc)
{
    if (!pc)
        return;
    free(pc->hash);
    free(pc->ids);
    free(pc->parent);
    free(pc->parent_gen);
    free(pc->gen);
    free(pc->cached);
    free(pc->chain);
    free(pc->bucket);
    free(pc->prev);
    free(pc->next);
    free(pc);
}

inf_status_t eng_kv_cache_create(int32_t n_blocks, int32_t n_slots, int32_t max_blocks,
                                 eng_kv_cache_t **out, struct inf_err *err)
{
    *out = NULL;
    if (n_slots == 0)
        max_blocks = 1; /* block calls only: a one-entry table nobody reads */
    if (n_blocks <= 0 || n_slots < 0 || max_blocks <= 0)
        return inf_err_set(err, INF_E_INVALID, "KV cache needs blocks, slots and max_blocks > 0");
    /* calloc(0) may answer NULL: keep every array at least one entry long. */
    size_t n_rows = n_slots > 0 ? (size_t)n_slots : 1;
    eng_kv_cache_t *kv = calloc(1, sizeof *kv);
    if (!kv)
        goto fail;
    kv->free_list = malloc((size_t)n_blocks * sizeof(int32_t));
    kv->ref = calloc((size_t)n_blocks, sizeof(int32_t));
    kv->table = malloc(n_rows * (size_t)max_blocks * sizeof(int32_t));
    kv->count = calloc(n_rows, sizeof(int32_t));
    if (!kv->free_list || !kv->ref || !kv->table || !kv->count)
        goto fail;
    kv->n_blocks = n_blocks;
    kv->n_slots = n_slots;
    kv->max_blocks = max_blocks;
    /* Lowest ids on top of the stack first. */
    for (int32_t i = 0; i < n_blocks; i++)
        kv->free_list[i] = n_blocks - 1 - i;
    kv->n_free = n_blocks;
    for (int64_t i = 0; i < (int64_t)n_rows * max_blocks; i++)
        kv->table[i] = -1;
    *out = kv;
    return INF_OK;
fail:
    eng_kv_cache_destroy(kv);
    return inf_err_set(err, INF_E_NOMEM, "out of memory for the KV block tables");
}

void eng_kv_cache_destroy(eng_kv_cache_t *kv)
{
    if (!kv)
        return;
    free(kv->free_list);
    free(kv->ref);
    free(kv->table);
    free(kv->count);
    prefix_free(kv->pc);
    free(kv);
}

int32_t eng_kv_cache_free_blocks(const eng_kv_cache_t *kv)
{
    return kv->n_free + (kv->pc ? kv->pc->n_lru : 0);
}

int32_t eng_kv_cache_n_blocks(const eng_kv_cache_t *kv)
{
    return kv->n_blocks;
}

int32_t eng_kv_cache_n_slots(const eng_kv_cache_t *kv)
{
    return kv->n_slots;
}

int32_t eng_kv_cache_max_blocks(const eng_kv_cache_t *kv)
{
    return kv->max_blocks;
}

/* ---- the eviction list and the hash table ------------------------------------------ */
static void lru_remove(struct prefix *pc, int32_t b)
{
    if (pc->prev[b] >= 0)
        pc->next[pc->prev[b]] = pc->next[b];
    else
        pc->head = pc->next[b];
    if (pc->next[b] >= 0)
        pc->prev[pc->next[b]] = pc->prev[b];
    else
        pc->tail = pc->prev[b];
    pc->prev[b] = pc->next[b] = -1;
    pc->n_lru--;
}

static void lru_push(struct prefix *pc, int32_t b)
{
    pc->prev[b] = pc->tail;
    pc->next[b] = -1;
    if (pc->tail >= 0)
        pc->next[pc->tail] = b;
    else
        pc->head = b;
    pc->tail = b;
    pc->n_lru++;
}

/* b leaves the prefix cache: out of its bucket, its identity retired. */
static void uncommit(struct prefix *pc, int32_t b)
{
    int32_t *at = &pc->bucket[pc->hash[b] & pc->mask];
    while (*at != b) {
        INF_ASSERT(*at >= 0);
        at = &pc->chain[*at];
    }
    *at = pc->chain[b];
    pc->chain[b] = -1;
    pc->cached[b] = 0;
    pc->gen[b]++;
    pc->n_cached--;
}

/* ---- blocks ------------------------------------------------------------------------ */
int32_t eng_kv_block_alloc(eng_kv_cache_t *kv)
{
    int32_t b;
    if (kv->n_free > 0) {
        b = kv->free_list[--kv->n_free];
    } else if (kv->pc && kv->pc->n_lru > 0) {
        b = kv->pc->head;
        lru_remove(kv->pc, b);
        uncommit(kv->pc, b);
    } else {
        return -1;
    }
    INF_ASSERT(kv->ref[b] == 0);
    kv->ref[b] = 1;
    return b;
}

void eng_kv_block_ref(eng_kv_cache_t *kv, int32_t b)
{
    INF_ASSERT(b >= 0 && b < kv->n_blocks);
    if (kv->ref[b] == 0) {
        INF_ASSERT(kv->pc && kv->pc->cached[b]);
        lru_remove(kv->pc, b);
    }
    kv->ref[b]++;
}

void eng_kv_block_unref(eng_kv_cache_t *kv, int32_t b)
{
    INF_ASSERT(b >= 0 && b < kv->n_blocks && kv->ref[b] > 0);
    if (--kv->ref[b] > 0)
        return;
    if (kv->pc && kv->pc->cached[b])
        lru_push(kv->pc, b);
    else
        kv->free_list[kv->n_free++] = b;
}

int32_t eng_kv_block_refs(const eng_kv_cache_t *kv, int32_t b)
{
    INF_ASSERT(b >= 0 && b < kv->n_blocks);
    return kv->ref[b];
}

/* ---- prefix cache ---------------------------------------------------------------------- */
static uint64_t mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

uint64_t eng_kv_block_hash(uint64_t parent, const int32_t *ids)
{
    uint64_t h = mix64(parent ^ 0x9e3779b97f4a7c15ull);
    for (int32_t i = 0; i < ENG_KV_BLOCK; i += 2) {
        uint64_t w = (uint64_t)(uint32_t)ids[i] | (uint64_t)(uint32_t)ids[i + 1] << 32;
        h = (h ^ w) * 0xff51afd7ed558ccdull;
        h ^= h >> 32;
    }
    return mix64(h);
}

inf_status_t eng_kv_cache_enable_prefix(eng_kv_cache_t *kv, uint64_t salt, eng_kv_hash_fn fn,
                                        struct inf_err *err)
{
    if (kv->pc || kv->n_free != kv->n_blocks)
        return inf_err_set(err, INF_E_INVALID,
                           "the prefix cache is turned on only on an empty KV cache");
    size_t n = (size_t)kv->n_blocks, nb = 1;
    while (nb < n)
        nb *= 2;
    struct prefix *pc = calloc(1, sizeof *pc);
    if (!pc)
        return inf_err_set(err, INF_E_NOMEM, "out of memory for the prefix cache");
    pc->hash = calloc(n, sizeof *pc->hash);
    pc->ids = calloc(n * ENG_KV_BLOCK, sizeof *pc->ids);
    pc->parent = malloc(n * sizeof *pc->parent);
    pc->parent_gen = calloc(n, sizeof *pc->parent_gen);
    pc->gen = calloc(n, sizeof *pc->gen);
    pc->cached = calloc(n, 1);
    pc->chain = malloc(n * sizeof *pc->chain);
    pc->bucket = malloc(nb * sizeof *pc->bucket);
    pc->prev = malloc(n * sizeof *pc->prev);
    pc->next = malloc(n * sizeof *pc->next);
    if (!pc->hash || !pc->ids || !pc->parent || !pc->parent_gen || !pc->gen || !pc->cached ||
        !pc->chain || !pc->bucket || !pc->prev || !pc->next) {
        prefix_free(pc);
        return inf_err_set(err, INF_E_NOMEM, "out of memory for the prefix cache");
    }
    for (size_t i = 0; i < n; i++)
        pc->parent[i] = pc->chain[i] = pc->prev[i] = pc->next[i] = -1;
    for (size_t i = 0; i < nb; i++)
        pc->bucket[i] = -1;
    pc->mask = nb - 1;
    pc->head = pc->tail = -1;
    pc->salt = salt;
    pc->hash_fn = fn ? fn : eng_kv_block_hash;
    kv->pc = pc;
    return INF_OK;
}

bool eng_kv_cache_prefix_on(const eng_kv_cache_t *kv)
{
    return kv->pc != NULL;
}

int32_t eng_kv_cache_cached_blocks(const eng_kv_cache_t *kv)
{
    return kv->pc ? kv->pc->n_cached : 0;
}

bool eng_kv_block_cached(const eng_kv_cache_t *kv, int32_t b)
{
    INF_ASSERT(b >= 0 && b < kv->n_blocks);
    return kv->pc && kv->pc->cached[b];
}

/* The chain hash of ids after parent. */
static uint64_t chain_hash(const struct prefix *pc, int32_t parent, const int32_t *ids)
{
    return pc->hash_fn(parent < 0 ? pc->salt : pc->hash[parent], ids);
}

/* The committed block with hash h that holds ids after parent, or -1: the
 * hash only finds candidates; the ids and the parent's identity decide. */
static int32_t find(const struct prefix *pc, uint64_t h, int32_t parent, const int32_t *ids)
{
    for (int32_t b = pc->bucket[h & pc->mask]; b >= 0; b = pc->chain[b]) {
        if (pc->hash[b] != h || pc->parent[b] != parent)
            continue;
        if (parent >= 0 && pc->parent_gen[b] != pc->gen[parent])
            continue;
        if (memcmp(pc->ids + (size_t)b * ENG_KV_BLOCK, ids, ENG_KV_BLOCK * sizeof *ids) == 0)
            return b;
    }
    return -1;
}

int32_t eng_kv_prefix_find(const eng_kv_cache_t *kv, int32_t parent, const int32_t *ids)
{
    const struct prefix *pc = kv->pc;
    if (!pc)
        return -1;
    INF_ASSERT(parent < 0 || (parent < kv->n_blocks && pc->cached[parent]));
    return find(pc, chain_hash(pc, parent, ids), parent, ids);
}

int32_t eng_kv_prefix_commit(eng_kv_cache_t *kv, int32_t b, int32_t parent, const int32_t *ids)
{
    struct prefix *pc = kv->pc;
    if (!pc)
        return b;
    INF_ASSERT(b >= 0 && b < kv->n_blocks && kv->ref[b] > 0 && !pc->cached[b]);
    INF_ASSERT(parent < 0 || (parent < kv->n_blocks && pc->cached[parent]));
    uint64_t h = chain_hash(pc, parent, ids);
    int32_t c = find(pc, h, parent, ids);
    if (c >= 0) {
        /* The same content is cached already (computed by another sequence
         * at the same time): hold that one, so the cache keeps one copy. */
        eng_kv_block_ref(kv, c);
        eng_kv_block_unref(kv, b);
        return c;
    }
    pc->hash[b] = h;
    memcpy(pc->ids + (size_t)b * ENG_KV_BLOCK, ids, ENG_KV_BLOCK * sizeof *ids);
    pc->parent[b] = parent;
    pc->parent_gen[b] = parent >= 0 ? pc->gen[parent] : 0;
    pc->cached[b] = 1;
    int32_t *head = &pc->bucket[h & pc->mask];
    pc->chain[b] = *head;
    *head = b;
    pc->n_cached++;
    return b;
}

int32_t eng_kv_seq_blocks_needed(const eng_kv_cache_t *kv, int32_t slot, int32_t n_tokens)
{
    if (slot < 0 || slot >= kv->n_slots || n_tokens <= 0)
        return 0;
    int32_t want = (int32_t)(((int64_t)n_tokens + ENG_KV_BLOCK - 1) / ENG_KV_BLOCK);
    return want > kv->count[slot] ? want - kv->count[slot] : 0;
}

inf_status_t eng_kv_seq_reserve(eng_kv_cache_t *kv, int32_t slot, int32_t n_tokens,
                                struct inf_err *err)
{
    if (slot < 0 || slot >= kv->n_slots || n_tokens < 0)
        return inf_err_set(err, INF_E_INVALID, "KV slot %d or length %d out of range", slot,
                           n_tokens);
    int32_t want = (int32_t)(((int64_t)n_tokens + ENG_KV_BLOCK - 1) / ENG_KV_BLOCK);
    if (want > kv->max_blocks)
        return inf_err_set(err, INF_E_CONTEXT, "%d tokens need %d KV blocks, at most %d", n_tokens,
                           want, kv->max_blocks);
    int32_t need = want - kv->count[slot];
    if (need <= 0)
        return INF_OK;
    if (need > kv->n_free)
        return inf_err_set(err, INF_E_BUSY, "%d KV blocks needed, %d free", need, kv->n_free);
    int32_t *row = kv->table + (int64_t)slot * kv->max_blocks;
    while (kv->count[slot] < want)
        row[kv->count[slot]++] = eng_kv_block_alloc(kv);
    return INF_OK;
}

void eng_kv_seq_free(eng_kv_cache_t *kv, int32_t slot)
{
    if (slot < 0 || slot >= kv->n_slots)
        return;
    int32_t *row = kv->table + (int64_t)slot * kv->max_blocks;
    while (kv->count[slot] > 0) {
        eng_kv_block_unref(kv, row[--kv->count[slot]]);
        row[kv->count[slot]] = -1;
    }
}

int32_t eng_kv_seq_n_blocks(const eng_kv_cache_t *kv, int32_t slot)
{
    return slot < 0 || slot >= kv->n_slots ? 0 : kv->count[slot];
}

const int32_t *eng_kv_cache_block_table(const eng_kv_cache_t *kv)
{
    return kv->table;
}
