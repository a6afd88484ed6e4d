/* Paged KV block allocator: reserve/free, all-or-nothing, limits, tables. */
#include "engine/batch.h"
#include "engine/sched/kv_cache.h"

#include <check.h>
#include <stdlib.h>
#include <string.h>

START_TEST(reserve_and_free)
{
    eng_kv_cache_t *kv;
    struct inf_err err;
    ck_assert_int_eq(eng_kv_cache_create(10, 3, 4, &kv, &err), INF_OK);
    ck_assert_int_eq(eng_kv_cache_free_blocks(kv), 10);
    ck_assert_int_eq(eng_kv_seq_blocks_needed(kv, 0, 17), 2);
    ck_assert_int_eq(eng_kv_seq_reserve(kv, 0, 17, &err), INF_OK);
    ck_assert_int_eq(eng_kv_seq_n_blocks(kv, 0), 2);
    ck_assert_int_eq(eng_kv_seq_reserve(kv, 0, 32, &err), INF_OK); /* still 2 */
    ck_assert_int_eq(eng_kv_seq_n_blocks(kv, 0), 2);
    ck_assert_int_eq(eng_kv_seq_reserve(kv, 1, 64, &err), INF_OK);
    ck_assert_int_eq(eng_kv_cache_free_blocks(kv), 4);
    const int32_t *bt = eng_kv_cache_block_table(kv);
    /* lowest ids first, every block used once, unused entries -1 */
    ck_assert_int_eq(bt[0], 0);
    ck_assert_int_eq(bt[1], 1);
    ck_assert_int_eq(bt[2], -1);
    int used[10] = {0};
    for (int i = 0; i < 3 * 4; i++)
        if (bt[i] >= 0)
            used[bt[i]]++;
    for (int i = 0; i < 6; i++)
        ck_assert_int_eq(used[i], 1);
    /* all or nothing */
    ck_assert_int_eq(eng_kv_seq_reserve(kv, 2, 16 * 5, &err), INF_E_CONTEXT);
    ck_assert_int_eq(eng_kv_seq_reserve(kv, 0, 16 * 4, &err), INF_OK);
    ck_assert_int_eq(eng_kv_seq_reserve(kv, 2, 16 * 3, &err), INF_E_BUSY);
    ck_assert_int_eq(eng_kv_seq_n_blocks(kv, 2), 0);
    ck_assert_int_eq(eng_kv_cache_free_blocks(kv), 2);
    /* freeing returns blocks; the last freed is reused first */
    int32_t first = bt[1 * 4 + 0];
    eng_kv_seq_free(kv, 1);
    ck_assert_int_eq(eng_kv_cache_free_blocks(kv), 6);
    ck_assert_int_eq(bt[4], -1);
    ck_assert_int_eq(eng_kv_seq_reserve(kv, 2, 1, &err), INF_OK);
    ck_assert_int_eq(bt[2 * 4], first); /* slot 1's first block went back last */
    ck_assert_int_eq(eng_kv_seq_reserve(kv, 3, 1, &err), INF_E_INVALID);
    eng_kv_seq_free(kv, 7); /* out of range: no-op */
    eng_kv_cache_destroy(kv);
    eng_kv_cache_destroy(NULL);
    ck_assert_int_eq(eng_kv_cache_create(0, 1, 1, &kv, &err), INF_E_INVALID);
}
END_TEST

START_TEST(lifo_reuse)
{
    eng_kv_cache_t *kv;
    ck_assert_int_eq(eng_kv_cache_create(8, 2, 8, &kv, NULL), INF_OK);
    ck_assert_int_eq(eng_kv_seq_reserve(kv, 0, 3 * ENG_KV_BLOCK, NULL), INF_OK);
    const int32_t *bt = eng_kv_cache_block_table(kv);
    int32_t b2 = bt[2];
    ck_assert_int_eq(b2, 2);
    eng_kv_seq_free(kv, 0);
    ck_assert_int_eq(eng_kv_seq_reserve(kv, 1, 1, NULL), INF_OK);
    /* blocks were pushed back last-to-first, so block 0 is on top */
    ck_assert_int_eq(bt[8], 0);
    ck_assert_int_eq(eng_kv_cache_n_blocks(kv), 8);
    ck_assert_int_eq(eng_kv_cache_n_slots(kv), 2);
    ck_assert_int_eq(eng_kv_cache_max_blocks(kv), 8);
    eng_kv_cache_destroy(kv);
}
END_TEST

START_TEST(shared_blocks)
{
    eng_kv_cache_t *kv;
    struct inf_err err;
    /* block calls only: no slots */
    ck_assert_int_eq(eng_kv_cache_create(3, 0, 0, &kv, &err), INF_OK);
    ck_assert_int_eq(eng_kv_cache_n_slots(kv), 0);
    ck_assert_int_eq(eng_kv_seq_reserve(kv, 0, 1, &err), INF_E_INVALID);
    ck_assert_int_eq(eng_kv_block_alloc(kv), 0);
    ck_assert_int_eq(eng_kv_block_alloc(kv), 1);
    ck_assert_int_eq(eng_kv_cache_free_blocks(kv), 1);
    /* block 0 held twice: the first release keeps it */
    eng_kv_block_ref(kv, 0);
    eng_kv_block_unref(kv, 0);
    ck_assert_int_eq(eng_kv_cache_free_blocks(kv), 1);
    eng_kv_block_unref(kv, 0);
    ck_assert_int_eq(eng_kv_cache_free_blocks(kv), 2);
    ck_assert_int_eq(eng_kv_block_alloc(kv), 0); /* last freed, first reused */
    ck_assert_int_eq(eng_kv_block_alloc(kv), 2);
    ck_assert_int_eq(eng_kv_block_alloc(kv), -1);
    ck_assert_int_eq(eng_kv_cache_free_blocks(kv), 0);
    eng_kv_cache_destroy(kv);
    ck_assert_int_eq(eng_kv_cache_create(3, -1, 1, &kv, &err), INF_E_INVALID);
}
END_TEST

START_TEST(slot_shares_block)
{
    /* a block a slot holds and another holder shares outlives the slot */
    eng_kv_cache_t *kv;
    ck_assert_int_eq(eng_kv_cache_create(4, 1, 4, &kv, NULL), INF_OK);
    ck_assert_int_eq(eng_kv_seq_reserve(kv, 0, 2 * ENG_KV_BLOCK, NULL), INF_OK);
    const int32_t *bt = eng_kv_cache_block_table(kv);
    int32_t b0 = bt[0];
    eng_kv_block_ref(kv, b0);
    eng_kv_seq_free(kv, 0);
    ck_assert_int_eq(eng_kv_cache_free_blocks(kv), 3);
    eng_kv_block_unref(kv, b0);
    ck_assert_int_eq(eng_kv_cache_free_blocks(kv), 4);
    ck_assert_int_eq(eng_kv_block_alloc(kv), b0);
    eng_kv_cache_destroy(kv);
}
END_TEST

/* ---- prefix cache ------------------------------------------------------------------------ */
static void fill_ids(int32_t *ids, int32_t v)
{
    for (int i = 0; i < ENG_KV_BLOCK; i++)
        ids[i] = v * 100 + i;
}

static uint64_t collide_all(uint64_t parent, const int32_t *ids)
{
    (void)parent;
    (void)ids;
    return 42;
}

START_TEST(prefix_commit_and_find)
{
    eng_kv_cache_t *kv;
    struct inf_err err;
    ck_assert_int_eq(eng_kv_cache_create(6, 0, 0, &kv, &err), INF_OK);
    ck_assert(!eng_kv_cache_prefix_on(kv));
    int32_t a[ENG_KV_BLOCK], b[ENG_KV_BLOCK], c[ENG_KV_BLOCK];
    fill_ids(a, 1);
    fill_ids(b, 2);
    fill_ids(c, 3);
    /* off: commits are no-ops, nothing is found */
    int32_t x = eng_kv_block_alloc(kv);
    ck_assert_int_eq(eng_kv_prefix_commit(kv, x, -1, a), x);
    ck_assert_int_eq(eng_kv_prefix_find(kv, -1, a), -1);
    /* turned on only while the cache is empty */
    ck_assert_int_eq(eng_kv_cache_enable_prefix(kv, 7, NULL, &err), INF_E_INVALID);
    eng_kv_block_unref(kv, x);
    ck_assert_int_eq(eng_kv_cache_enable_prefix(kv, 7, NULL, &err), INF_OK);
    ck_assert(eng_kv_cache_prefix_on(kv));

    /* a chain a -> b */
    int32_t ba = eng_kv_block_alloc(kv), bb = eng_kv_block_alloc(kv);
    ck_assert_int_eq(eng_kv_prefix_find(kv, -1, a), -1);
    ck_assert_int_eq(eng_kv_prefix_commit(kv, ba, -1, a), ba);
    ck_assert_int_eq(eng_kv_prefix_commit(kv, bb, ba, b), bb);
    ck_assert_int_eq(eng_kv_cache_cached_blocks(kv), 2);
    ck_assert(eng_kv_block_cached(kv, ba));
    ck_assert_int_eq(eng_kv_prefix_find(kv, -1, a), ba);
    ck_assert_int_eq(eng_kv_prefix_find(kv, ba, b), bb);
    /* the same ids after another parent, or other ids, are misses */
    ck_assert_int_eq(eng_kv_prefix_find(kv, -1, b), -1);
    ck_assert_int_eq(eng_kv_prefix_find(kv, bb, b), -1);
    ck_assert_int_eq(eng_kv_prefix_find(kv, ba, c), -1);
    int32_t a2[ENG_KV_BLOCK];
    memcpy(a2, a, sizeof a2);
    a2[ENG_KV_BLOCK - 1]++; /* one id differs */
    ck_assert_int_eq(eng_kv_prefix_find(kv, -1, a2), -1);

    /* the same content committed twice: the second holder gets the first copy */
    int32_t dup = eng_kv_block_alloc(kv);
    ck_assert_int_eq(eng_kv_block_refs(kv, ba), 1);
    ck_assert_int_eq(eng_kv_prefix_commit(kv, dup, -1, a), ba);
    ck_assert_int_eq(eng_kv_block_refs(kv, ba), 2);
    ck_assert_int_eq(eng_kv_block_refs(kv, dup), 0);
    ck_assert(!eng_kv_block_cached(kv, dup));
    ck_assert_int_eq(eng_kv_cache_free_blocks(kv), 4);

    /* freed committed blocks stay findable and count as free */
    eng_kv_block_unref(kv, bb);
    eng_kv_block_unref(kv, ba);
    eng_kv_block_unref(kv, ba);
    ck_assert_int_eq(eng_kv_cache_free_blocks(kv), 6);
    ck_assert_int_eq(eng_kv_cache_cached_blocks(kv), 2);
    ck_assert_int_eq(eng_kv_prefix_find(kv, -1, a), ba);
    /* a hit takes a cached block nobody holds off the eviction list */
    eng_kv_block_ref(kv, ba);
    ck_assert_int_eq(eng_kv_block_refs(kv, ba), 1);
    ck_assert_int_eq(eng_kv_cache_free_blocks(kv), 5);
    eng_kv_block_unref(kv, ba);
    eng_kv_cache_destroy(kv);
}
END_TEST

START_TEST(prefix_eviction_order)
{
    /* 4 blocks: blocks that cache nothing are taken before any cached one;
     * cached ones are evicted freed-longest-ago first */
    eng_kv_cache_t *kv;
    ck_assert_int_eq(eng_kv_cache_create(4, 0, 0, &kv, NULL), INF_OK);
    ck_assert_int_eq(eng_kv_cache_enable_prefix(kv, 0, NULL, NULL), INF_OK);
    int32_t ids[3][ENG_KV_BLOCK];
    int32_t blk[3];
    for (int i = 0; i < 3; i++) {
        fill_ids(ids[i], 10 + i);
        blk[i] = eng_kv_block_alloc(kv);
        ck_assert_int_eq(eng_kv_prefix_commit(kv, blk[i], i ? blk[i - 1] : -1, ids[i]), blk[i]);
    }
    /* released last to first, as a sequence releases: the chain's tail is
     * freed first, so it is evicted first */
    for (int i = 2; i >= 0; i--)
        eng_kv_block_unref(kv, blk[i]);
    ck_assert_int_eq(eng_kv_cache_free_blocks(kv), 4);
    int32_t fresh = eng_kv_block_alloc(kv);
    ck_assert_int_eq(fresh, 3); /* the never-used block first */
    ck_assert_int_eq(eng_kv_cache_cached_blocks(kv), 3);
    ck_assert_int_eq(eng_kv_block_alloc(kv), blk[2]); /* then the chain's tail */
    ck_assert_int_eq(eng_kv_cache_cached_blocks(kv), 2);
    ck_assert_int_eq(eng_kv_prefix_find(kv, blk[1], ids[2]), -1);
    ck_assert_int_eq(eng_kv_prefix_find(kv, blk[0], ids[1]), blk[1]);
    /* a hit refreshes: blk[0] held and freed again is evicted after blk[1] */
    eng_kv_block_ref(kv, blk[0]);
    eng_kv_block_unref(kv, blk[0]);
    ck_assert_int_eq(eng_kv_block_alloc(kv), blk[1]);
    ck_assert_int_eq(eng_kv_block_alloc(kv), blk[0]);
    ck_assert_int_eq(eng_kv_cache_cached_blocks(kv), 0);
    ck_assert_int_eq(eng_kv_prefix_find(kv, -1, ids[0]), -1);
    ck_assert_int_eq(eng_kv_block_alloc(kv), -1);
    ck_assert_int_eq(eng_kv_cache_free_blocks(kv), 0);
    eng_kv_cache_destroy(kv);
}
END_TEST

START_TEST(prefix_collisions_never_alias)
{
    /* every block hashes alike: the ids and the parents alone tell them apart */
    eng_kv_cache_t *kv;
    ck_assert_int_eq(eng_kv_cache_create(8, 0, 0, &kv, NULL), INF_OK);
    ck_assert_int_eq(eng_kv_cache_enable_prefix(kv, 0, collide_all, NULL), INF_OK);
    int32_t a[ENG_KV_BLOCK], b[ENG_KV_BLOCK];
    fill_ids(a, 1);
    fill_ids(b, 2);
    int32_t p0 = eng_kv_block_alloc(kv), p1 = eng_kv_block_alloc(kv);
    int32_t q0 = eng_kv_block_alloc(kv), q1 = eng_kv_block_alloc(kv);
    /* chains a -> b and b -> b */
    ck_assert_int_eq(eng_kv_prefix_commit(kv, p0, -1, a), p0);
    ck_assert_int_eq(eng_kv_prefix_commit(kv, p1, p0, b), p1);
    ck_assert_int_eq(eng_kv_prefix_commit(kv, q0, -1, b), q0);
    ck_assert_int_eq(eng_kv_prefix_commit(kv, q1, q0, b), q1);
    ck_assert_int_eq(eng_kv_cache_cached_blocks(kv), 4);
    ck_assert_int_eq(eng_kv_prefix_find(kv, -1, a), p0);
    ck_assert_int_eq(eng_kv_prefix_find(kv, -1, b), q0);
    ck_assert_int_eq(eng_kv_prefix_find(kv, p0, b), p1);
    ck_assert_int_eq(eng_kv_prefix_find(kv, q0, b), q1);
    ck_assert_int_eq(eng_kv_prefix_find(kv, p0, a), -1);
    ck_assert_int_eq(eng_kv_prefix_find(kv, p1, b), -1);

    /* a parent evicted and its block id reused for other content: its old
     * child, still cached, does not pass for the new block's child */
    eng_kv_block_unref(kv, p0); /* freed first: evicted first */
    eng_kv_block_unref(kv, p1);
    for (int i = 0; i < 4; i++)
        ck_assert_int_ge(eng_kv_block_alloc(kv), 0); /* the four free ones */
    int32_t r = eng_kv_block_alloc(kv);
    ck_assert_int_eq(r, p0);
    ck_assert_int_eq(eng_kv_prefix_find(kv, -1, a), -1);
    int32_t c[ENG_KV_BLOCK];
    fill_ids(c, 3);
    ck_assert_int_eq(eng_kv_prefix_commit(kv, r, -1, c), r);
    ck_assert(eng_kv_block_cached(kv, p1));             /* p1 is still in the table, */
    ck_assert_int_eq(eng_kv_prefix_find(kv, r, b), -1); /* but not r's child */
    /* the old content again, in another block: p1 is not its child either */
    eng_kv_block_unref(kv, q1);
    int32_t r2 = eng_kv_block_alloc(kv); /* evicts p1 (freed before q1) */
    ck_assert_int_eq(r2, p1);
    ck_assert_int_eq(eng_kv_prefix_commit(kv, r2, -1, a), r2);
    ck_assert_int_eq(eng_kv_prefix_find(kv, r2, b), -1);
    ck_assert_int_eq(eng_kv_prefix_find(kv, q0, b), q1);
    eng_kv_cache_destroy(kv);
}
END_TEST

/* A naive model of the prefix cache over random traffic: every block that
 * find answers holds exactly the ids asked from position 0 (the blocks'
 * whole token prefixes are kept here, not their hashes), a chain just
 * committed is found whole, and the free count is the blocks nobody holds.
 * Two ids per position and a two-valued hash make hits and collisions
 * common. */
enum { RB = 24, RMAX = 6, RCHAINS = 6 };
static int32_t r_prefix[RB][RMAX * ENG_KV_BLOCK]; /* a committed block's ids from position 0 */
static int32_t r_depth[RB];                       /* its index in its chain + 1; 0: not committed */

static uint64_t collide_two(uint64_t parent, const int32_t *ids)
{
    (void)parent;
    return (uint64_t)(ids[0] & 1);
}

/* Build the chain of n blocks of ids toks into held[c] for each of the
 * chains cs[0..nc) at once, as sequences admitted in the same step do: each
 * walks the cache, then their missing blocks are taken and committed in
 * lockstep, so the second and later copies of a block meet the first. */
static void r_build(eng_kv_cache_t *kv, const int *cs, int nc, const int32_t *toks, int n,
                    int32_t held[][RMAX], int32_t *n_held, int *hits, int *swaps)
{
    int32_t parent[RCHAINS];
    int k0 = 0;
    for (int j = 0; j < nc; j++) {
        int c = cs[j], k = 0;
        parent[j] = -1;
        for (; k < n; k++) {
            int32_t b = eng_kv_prefix_find(kv, parent[j], toks + k * ENG_KV_BLOCK);
            if (b < 0)
                break;
            ck_assert_int_eq(r_depth[b], k + 1);
            ck_assert(memcmp(r_prefix[b], toks, sizeof *toks * (size_t)(k + 1) * ENG_KV_BLOCK) ==
                      0);
            eng_kv_block_ref(kv, b);
            held[c][n_held[c]++] = parent[j] = b;
            (*hits)++;
        }
        ck_assert(j == 0 || k == k0); /* the same walk for the same ids */
        k0 = k;
    }
    for (int k = k0; k < n; k++) {
        int32_t mine[RCHAINS];
        int ok = 0;
        for (int j = 0; j < nc; j++) {
            mine[j] = eng_kv_block_alloc(kv);
            if (mine[j] >= 0) {
                r_depth[mine[j]] = 0; /* taken: whatever it cached is gone */
                ok++;
            }
        }
        if (ok < nc) { /* the pool is held: the chains stop here */
            for (int j = 0; j < nc; j++)
                if (mine[j] >= 0)
                    eng_kv_block_unref(kv, mine[j]);
            return;
        }
        for (int j = 0; j < nc; j++) {
            int c = cs[j];
            int32_t got = eng_kv_prefix_commit(kv, mine[j], parent[j], toks + k * ENG_KV_BLOCK);
            if (got != mine[j]) {
                (*swaps)++;
                ck_assert_int_eq(r_depth[got], k + 1);
                ck_assert(memcmp(r_prefix[got], toks,
                                 sizeof *toks * (size_t)(k + 1) * ENG_KV_BLOCK) == 0);
            } else {
                memcpy(r_prefix[got], toks, sizeof *toks * (size_t)(k + 1) * ENG_KV_BLOCK);
                r_depth[got] = k + 1;
            }
            held[c][n_held[c]++] = parent[j] = got;
        }
    }
}

START_TEST(prefix_random_against_naive)
{
    eng_kv_cache_t *kv;
    ck_assert_int_eq(eng_kv_cache_create(RB, 0, 0, &kv, NULL), INF_OK);
    ck_assert_int_eq(eng_kv_cache_enable_prefix(kv, 3, collide_two, NULL), INF_OK);
    memset(r_depth, 0, sizeof r_depth);
    int32_t held[RCHAINS][RMAX], n_held[RCHAINS] = {0};
    uint32_t x = 99;
#define RND(m) ((x = x * 1103515245u + 12345u), (int32_t)((x >> 16) % (uint32_t)(m)))
    int hits = 0, swaps = 0;
    for (int it = 0; it < 20000; it++) {
        int c = RND(RCHAINS);
        if (n_held[c] > 0) { /* release chain c, last block first */
            while (n_held[c] > 0)
                eng_kv_block_unref(kv, held[c][--n_held[c]]);
            continue;
        }
        /* a chain of up to RMAX blocks, each of ids from two choices */
        int32_t toks[RMAX * ENG_KV_BLOCK];
        int n = 1 + RND(RMAX);
        for (int i = 0; i < n * ENG_KV_BLOCK; i++)
            toks[i] = (i % ENG_KV_BLOCK == 0 || i % 7 == 3) ? RND(2) : i % 5;
        /* sometimes a second chain, free too, with the same ids at once */
        int cs[2] = {c, (c + 1) % RCHAINS}, nc = n_held[cs[1]] == 0 && RND(3) == 0 ? 2 : 1;
        r_build(kv, cs, nc, toks, n, held, n_held, &hits, &swaps);
        /* each chain as held is found whole */
        for (int j = 0; j < nc; j++) {
            int32_t parent = -1;
            for (int i = 0; i < n_held[cs[j]]; i++) {
                ck_assert_int_eq(eng_kv_prefix_find(kv, parent, toks + i * ENG_KV_BLOCK),
                                 held[cs[j]][i]);
                parent = held[cs[j]][i];
            }
        }
        int used = 0;
        for (int i = 0; i < RCHAINS; i++)
            used += n_held[i];
        int distinct = 0;
        for (int32_t b = 0; b < RB; b++)
            distinct += eng_kv_block_refs(kv, b) > 0;
        ck_assert_int_le(distinct, used);
        ck_assert_int_eq(eng_kv_cache_free_blocks(kv), RB - distinct);
        ck_assert_int_le(eng_kv_cache_cached_blocks(kv), RB);
    }
#undef RND
    for (int c = 0; c < RCHAINS; c++)
        while (n_held[c] > 0)
            eng_kv_block_unref(kv, held[c][--n_held[c]]);
    ck_assert_int_eq(eng_kv_cache_free_blocks(kv), RB);
    ck_assert_int_gt(hits, 1000);
    ck_assert_int_gt(swaps, 100);
    eng_kv_cache_destroy(kv);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("kv_cache");
    TCase *t = tcase_create("blocks");
    tcase_add_test(t, reserve_and_free);
    tcase_add_test(t, lifo_reuse);
    suite_add_tcase(s, t);
    TCase *sh = tcase_create("sharing");
    tcase_add_test(sh, shared_blocks);
    tcase_add_test(sh, slot_shares_block);
    suite_add_tcase(s, sh);
    TCase *pc = tcase_create("prefix");
    tcase_add_test(pc, prefix_commit_and_find);
    tcase_add_test(pc, prefix_eviction_order);
    tcase_add_test(pc, prefix_collisions_never_alias);
    tcase_add_test(pc, prefix_random_against_naive);
    suite_add_tcase(s, pc);
    SRunner *r = srunner_create(s);
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
