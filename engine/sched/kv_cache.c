/* engine/sched/kv_cache.c — paged KV block allocator (engine/sched/kv_cache.h). */
#define INF_LOG_MODULE "eng"
#include "engine/sched/kv_cache.h"
#include "engine/batch.h"

#include <stdlib.h>

struct eng_kv_cache {
    int32_t n_blocks, n_slots, max_blocks;
    int32_t *free_list; /* stack of free block ids, [n_blocks] */
    int32_t n_free;
    int32_t *ref;   /* [n_blocks] holders of each block, 0 when free */
    int32_t *table; /* [n_slots][max_blocks] */
    int32_t *count; /* [n_slots] blocks held */
};

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
    free(kv);
}

int32_t eng_kv_cache_free_blocks(const eng_kv_cache_t *kv)
{
    return kv->n_free;
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

int32_t eng_kv_block_alloc(eng_kv_cache_t *kv)
{
    if (kv->n_free == 0)
        return -1;
    int32_t b = kv->free_list[--kv->n_free];
    INF_ASSERT(kv->ref[b] == 0);
    kv->ref[b] = 1;
    return b;
}

void eng_kv_block_ref(eng_kv_cache_t *kv, int32_t b)
{
    INF_ASSERT(b >= 0 && b < kv->n_blocks && kv->ref[b] > 0);
    kv->ref[b]++;
}

void eng_kv_block_unref(eng_kv_cache_t *kv, int32_t b)
{
    INF_ASSERT(b >= 0 && b < kv->n_blocks && kv->ref[b] > 0);
    if (--kv->ref[b] == 0)
        kv->free_list[kv->n_free++] = b;
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
