/* engine/cuda/attention.c — paged attention on the CUDA backend: the work
 * lists built on the host from the uploaded tables (validated as the CPU
 * backend validates them), the K/V write and the attention kernels of
 * kernels/attn_cuda.h, and the decode attention of a fixed-shape step with
 * its rows' RoPE and K/V write inside (reading the q/k/v linear's
 * fixed-point words where the block hands them over). */
#define INF_LOG_MODULE "eng"
#include "engine/backend.h"

#ifdef INT4SERVE_HAVE_CUDA

#include "engine/batch.h"
#include "engine/cuda/cuda_impl.h"
#include "kernels/attn_cuda.h"
#include "kernels/rope_cuda.h"

#include <stdlib.h>
#include <string.h>

/* Grow the host list buffer to at least bytes. */
static bool h_list_reserve(struct cu_ctx *c, size_t bytes)
{
    if (bytes <= c->h_list_cap)
        return true;
    size_t cap = c->h_list_cap ? c->h_list_cap : 4096;
    while (cap < bytes)
        cap *= 2;
    uint8_t *p = realloc(c->h_list, cap);
    if (!p)
        return false;
    c->h_list = p;
    c->h_list_cap = cap;
    return true;
}

static size_t align16(size_t x)
{
    return (x + 15) / 16 * 16;
}

/* Validate p as the CPU backend does, build its work list and upload it
 * (skipped when the same bytes are there already: every layer of a step has
 * the same list). fixed > 0: the fixed shape of a decode bucket of `fixed`
 * sequences: every K/V entry, item and group of the bucket is present
 * (padding does nothing), each row set owning the same number of split
 * slots, so one recorded grid serves every step of the bucket. *lay
 * receives the layout; lay->n_kv == 0 when there is nothing to do. */
inf_status_t eng_cuda_attn_list(struct cu_ctx *c, const struct eng_attn_params *p, bool decode,
                                int32_t fixed, struct cu_upload_batch *batch,
                                struct attn_layout *lay, struct inf_err *err)
{
    memset(lay, 0, sizeof *lay);
    const int32_t *seqs = shadow_of(p->seqs), *pos = shadow_of(p->pos),
                  *bt = shadow_of(p->block_table);
    if (!seqs || !pos || !bt)
        return inf_err_set(err, INF_E_UNSUPPORTED,
                           "attention: positions and tables must be filled with buf_upload");
    const int32_t hd = p->head_dim, G = p->n_heads / p->n_kv_heads;
    /* decode: a token a sequence; a fixed shape is its bucket's */
    const int32_t impl = krn_cuda_attn_impl_for_kv(hd, decode, fixed ? fixed : p->n_seqs,
                                                   p->n_heads, p->n_kv_heads, c->kv_fp8);
    struct krn_cuda_attn_config cfg;
    inf_status_t st = krn_cuda_attn_config_kv(hd, decode, impl, c->kv_fp8, &cfg, err);
    if (st != INF_OK)
        return st;
    const int32_t R = cfg.rows, tile = cfg.tile;
    /* Validate the tables from their host copies, as every backend does. */
    int32_t n_tok = 0;
    st = eng_attn_tables_check(p, pos, (int64_t)(p->pos->size / 4), seqs, bt, fixed != 0, &n_tok,
                               NULL, err);
    if (st != INF_OK)
        return st;
    int64_t n_chunks = 0;
    for (int32_t s = 0; s < p->n_seqs; s++)
        n_chunks += (int64_t)p->n_kv_heads * (((int64_t)seqs[3 * s + 1] * G + R - 1) / R);
    if (fixed) {
        /* the bucket's shape, whatever the sequences */
        n_tok = fixed;
        n_chunks = (int64_t)fixed * p->n_kv_heads * ((G + R - 1) / R);
    }
    if (n_tok == 0)
        return INF_OK;
    /* Split long key ranges when the row sets alone would leave resident
     * blocks unused: up to one wave of them in all. */
    const size_t slot_bytes = (size_t)R * (size_t)(hd + 2) * sizeof(float);
    const int64_t part_cap = (int64_t)(c->scratch_bytes / slot_bytes);
    int64_t max_splits = krn_cuda_attn_splits_cap(n_chunks, c->sms, &cfg);
    if (fixed && max_splits * n_chunks > part_cap)
        max_splits = part_cap / n_chunks > 1 ? part_cap / n_chunks : 1;
    /* A fused combine counts arrivals per group: every group needs a counter. */
    if (fixed && cfg.fused_combine && n_chunks > ATTN_COUNTERS)
        max_splits = 1;

    /* Host list: [kv destinations (int32 pairs)] [items] [groups]. Sized for
     * the worst case, then filled. */
    int64_t max_items = n_chunks * max_splits;
    size_t kv_bytes = align16((size_t)n_tok * 2 * sizeof(int32_t));
    size_t items_bytes = align16((size_t)max_items * sizeof(struct krn_cuda_attn_item));
    size_t need = kv_bytes + items_bytes + (size_t)n_chunks * sizeof(struct krn_cuda_attn_group);
    if (!h_list_reserve(c, need))
        return inf_err_set(err, INF_E_NOMEM, "out of memory for an attention work list");
    int32_t *kvdst = (int32_t *)c->h_list;
    struct krn_cuda_attn_item *items = (struct krn_cuda_attn_item *)(c->h_list + kv_bytes);
    int32_t n_kv = 0, n_items = 0, n_groups = 0;
    int64_t n_parts = 0;
    for (int32_t s = 0; s < p->n_seqs; s++) {
        int32_t t0 = seqs[3 * s], nt = seqs[3 * s + 1], slot = seqs[3 * s + 2];
        const int32_t *blocks = bt + (int64_t)slot * p->max_blocks;
        for (int32_t t = t0; t < t0 + nt; t++) {
            kvdst[2 * n_kv] = t;
            kvdst[2 * n_kv + 1] =
                blocks[pos[t] / ENG_KV_BLOCK] * ENG_KV_BLOCK + pos[t] % ENG_KV_BLOCK;
            n_kv++;
        }
    }
    for (; n_kv < n_tok; n_kv++) { /* fixed shape: padding entries */
        kvdst[2 * n_kv] = 0;
        kvdst[2 * n_kv + 1] = -1;
    }
    /* Groups are written after the items; keep them in a second pass. */
    struct krn_cuda_attn_group *groups =
        (struct krn_cuda_attn_group *)(c->h_list + kv_bytes + items_bytes);
    for (int32_t s = 0; s < p->n_seqs; s++) {
        int32_t t0 = seqs[3 * s], nt = seqs[3 * s + 1], slot = seqs[3 * s + 2];
        int32_t total_rows = nt * G;
        for (int32_t kvh = 0; kvh < p->n_kv_heads; kvh++) {
            for (int32_t row0 = 0; row0 < total_rows; row0 += R) {
                int32_t nr = total_rows - row0 < R ? total_rows - row0 : R;
                int32_t ctx = pos[t0] + (row0 + nr - 1) / G + 1;
                /* Keys [lo, ctx): with a sliding window from the block of
                 * the first row's first key (the kernels mask the rest of
                 * each row's window), so the blocks before it are neither
                 * read nor split over, and a long context costs its window. */
                const int32_t lo =
                    eng_attn_first_key(p->window, pos[t0] + row0 / G) / ENG_KV_BLOCK * ENG_KV_BLOCK;
                const int32_t span = ctx - lo;
                int64_t splits = (span + cfg.split_keys - 1) / cfg.split_keys;
                if (splits > max_splits)
                    splits = max_splits;
                int32_t len = span;
                if (splits > 1) {
                    len = (int32_t)((span + splits - 1) / splits);
                    len = (len + tile - 1) / tile * tile;
                    splits = (span + len - 1) / len;
                }
                if (!fixed && splits > 1 &&
                    (n_parts + splits > part_cap ||
                     (cfg.fused_combine && n_groups >= ATTN_COUNTERS))) {
                    splits = 1; /* the partials or counters would not fit: one pass */
                    len = span;
                }
                const int32_t group = n_groups;
                int32_t first = n_items;
                if (fixed)
                    groups[n_groups++] = (struct krn_cuda_attn_group){
                        .item = first, .n_splits = splits > 1 ? (int32_t)splits : 0};
                else if (splits > 1)
                    groups[n_groups++] =
                        (struct krn_cuda_attn_group){.item = first, .n_splits = (int32_t)splits};
                for (int32_t j = 0; j < splits; j++) {
                    struct krn_cuda_attn_item *it = &items[n_items++];
                    memset(it, 0, sizeof *it);
                    it->t_first = t0;
                    it->p_first = pos[t0];
                    it->slot = slot;
                    it->kvh = kvh;
                    it->row0 = row0;
                    it->nrows = nr;
                    it->k0 = lo + j * len;
                    it->k1 = lo + (j + 1) * len < ctx ? lo + (j + 1) * len : ctx;
                    /* fixed: each row set owns the partial slots of its items */
                    it->part = splits > 1 ? (fixed ? first + j : (int32_t)n_parts++) : -1;
                    it->group = splits > 1 ? group : 0;
                }
                if (fixed) /* the rest of the row set's split slots: padding */
                    for (; n_items < first + max_splits; n_items++)
                        memset(&items[n_items], 0, sizeof items[n_items]);
            }
        }
    }
    if (fixed) {
        for (; n_groups < n_chunks; n_groups++) {
            groups[n_groups] = (struct krn_cuda_attn_group){.item = n_items, .n_splits = 0};
            for (int64_t j = 0; j < max_splits; j++, n_items++)
                memset(&items[n_items], 0, sizeof items[n_items]);
        }
        for (int32_t g = 0; g < n_groups; g++)
            if (groups[g].item >= n_items)
                groups[g].item = 0;
    }
    /* Pack the groups right after the items actually made. */
    size_t items_used = align16((size_t)n_items * sizeof(struct krn_cuda_attn_item));
    if (items_used != items_bytes)
        memmove(c->h_list + kv_bytes + items_used, groups,
                (size_t)n_groups * sizeof(struct krn_cuda_attn_group));
    size_t list_bytes =
        kv_bytes + items_used + (size_t)n_groups * sizeof(struct krn_cuda_attn_group);
    size_t map_off = 0;
    if (fixed) {
        /* each row's pool row, for the fused RoPE + KV write */
        map_off = align16(list_bytes);
        size_t map_end = map_off + (size_t)fixed * sizeof(int32_t);
        if (!h_list_reserve(c, map_end))
            return inf_err_set(err, INF_E_NOMEM, "out of memory for an attention work list");
        int32_t *map = (int32_t *)(c->h_list + map_off);
        const int32_t *kd = (const int32_t *)c->h_list;
        memset(c->h_list + list_bytes, 0, map_off - list_bytes);
        for (int32_t t = 0; t < fixed; t++)
            map[t] = -1;
        for (int32_t i = 0; i < n_kv; i++)
            if (kd[2 * i + 1] >= 0 && kd[2 * i] >= 0 && kd[2 * i] < fixed)
                map[kd[2 * i]] = kd[2 * i + 1];
        list_bytes = map_end;
    }
    struct list_cache *lc = &c->lists[decode ? 0 : 1];
    if (list_bytes > c->list_bytes)
        return inf_err_set(err, INF_E_NOMEM,
                           "attention work list of %zu bytes exceeds the workspace's %zu",
                           list_bytes, c->list_bytes);
    if (lc->bytes != list_bytes || memcmp(lc->host, c->h_list, list_bytes) != 0) {
        /* graph_prepare's list joins the step's table copies */
        st = batch ? eng_cuda_batch_add(c, batch, lc->dev, c->h_list, list_bytes, err)
                   : eng_cuda_stage_upload(c, lc->dev, c->h_list, list_bytes, err);
        if (st != INF_OK)
            return st;
        memcpy(lc->host, c->h_list, list_bytes);
        lc->bytes = list_bytes;
    }
    *lay = (struct attn_layout){.n_kv = n_kv,
                                .n_items = n_items,
                                .n_groups = n_groups,
                                .impl = impl,
                                .kv_bytes = kv_bytes,
                                .items_bytes = items_used,
                                .bytes = list_bytes,
                                .map_off = map_off};
    return INF_OK;
}

/* The kernel parameters of p on list lay (its region lc). */
static struct krn_cuda_attn_params attn_kparams(const struct cu_ctx *c,
                                                const struct eng_attn_params *p, bool decode,
                                                const struct attn_layout *lay,
                                                const struct list_cache *lc)
{
    return (struct krn_cuda_attn_params){
        .q = dptr(p->q, 2),
        .ldq = p->q.ld,
        .out = dptr(p->out, 2),
        .ldo = p->out.ld,
        .k_pool = p->k_cache->ptr,
        .v_pool = p->v_cache->ptr,
        .kv_fp8 = c->kv_fp8,
        .k_scale = c->kv_fp8 ? p->k_scale : 1.0f,
        .v_scale = c->kv_fp8 ? p->v_scale : 1.0f,
        .block_table = p->block_table->ptr,
        .max_blocks = p->max_blocks,
        .block = ENG_KV_BLOCK,
        .n_heads = p->n_heads,
        .n_kv_heads = p->n_kv_heads,
        .head_dim = p->head_dim,
        .scale = p->scale,
        .window = p->window,
        .items = (const struct krn_cuda_attn_item *)(lc->dev + lay->kv_bytes),
        .n_items = lay->n_items,
        .groups = (const struct krn_cuda_attn_group *)(lc->dev + lay->kv_bytes + lay->items_bytes),
        .n_groups = lay->n_groups,
        .partials = (float *)c->scratch,
        .group_done = c->d_group_done,
        .decode = decode,
        .impl = lay->impl,
        .rows = decode ? p->n_seqs : 0 /* a token a sequence */};
}

/* The plain op: the K/V of the listed tokens written, then the attention.
 * A decode inside a fixed-shape step uses the step's list. */
static inf_status_t cu_attn(struct eng_backend *be, const struct eng_attn_params *p, bool decode,
                            struct inf_err *err)
{
    struct cu_ctx *c = ctx_of(be);
    ENTER(c);
    struct attn_layout lay;
    if (decode && c->step.active) {
        lay = c->step.lay; /* prepared for the step by graph_prepare */
    } else {
        inf_status_t st = eng_cuda_attn_list(c, p, decode, 0, NULL, &lay, err);
        if (st != INF_OK)
            return st;
    }
    if (lay.n_kv == 0)
        return INF_OK;
    const struct list_cache *lc = &c->lists[decode ? 0 : 1];
    const int64_t kv_row = (int64_t)p->n_kv_heads * p->head_dim;
    if (c->kv_fp8)
        KRN(c,
            krn_cuda_kv_write_e4m3(dptr(p->k, 2), p->k.ld, dptr(p->v, 2), p->v.ld, p->k_cache->ptr,
                                   p->v_cache->ptr, (int32_t)kv_row, p->k_scale, p->v_scale,
                                   (const int32_t *)lc->dev, lay.n_kv, c->stream, lep_));
    else
        KRN(c, krn_cuda_kv_write(dptr(p->k, 2), p->k.ld, dptr(p->v, 2), p->v.ld, p->k_cache->ptr,
                                 p->v_cache->ptr, (int32_t)kv_row, (const int32_t *)lc->dev,
                                 lay.n_kv, c->stream, lep_));
    const struct krn_cuda_attn_params kp = attn_kparams(c, p, decode, &lay, lc);
    KRN(c, krn_cuda_attention(&kp, c->stream, lep_));
    eng_cuda_written(p->out.buf);
    eng_cuda_written(p->k_cache);
    eng_cuda_written(p->v_cache);
    return INF_OK;
}

inf_status_t eng_cuda_attn_prefill(struct eng_backend *be, const struct eng_attn_params *p,
                                   struct inf_err *err)
{
    return cu_attn(be, p, false, err);
}

inf_status_t eng_cuda_attn_decode(struct eng_backend *be, const struct eng_attn_params *p,
                                  struct inf_err *err)
{
    return cu_attn(be, p, true, err);
}

inf_status_t eng_cuda_attn_fused(struct cu_ctx *c, const struct eng_attn_params *p,
                                 int32_t qkv_words, int32_t qkv_n, bool *done, struct inf_err *err)
{
    *done = false;
    const struct attn_layout lay = c->step.lay;
    const struct list_cache *lc = &c->lists[0];
    const int32_t hd = p->head_dim;
    uint16_t *q = dptr(p->q, 2), *v = dptr(p->v, 2);
    /* the list carries the rows' pool rows, and the kernels take the views */
    if (lay.map_off == 0 || !krn_cuda_rope_kv_ok(q, p->q.ld, p->n_heads, p->n_kv_heads, hd, v,
                                                 p->v.ld, p->k_cache->ptr, p->v_cache->ptr))
        return INF_OK;
    *done = true;
    /* the words of q's first column and of v's: rows of qkv_n words, q, k
     * and v where the rows of their views lie */
    const int64_t *qw = NULL, *vw = NULL;
    if (qkv_words >= 0 && p->q.ld == qkv_n && p->v.ld == qkv_n && v >= q &&
        v - q + (int64_t)p->n_kv_heads * hd <= qkv_n && (v - q) % 2 == 0) {
        qw = cu_acc_buf(c, qkv_words);
        vw = qw + (v - q);
    } else if (qkv_words >= 0) { /* the kernels read fp16 rows then */
        inf_status_t st = eng_cuda_words_reduce(c, qkv_words, p->q, c->step.rows, qkv_n, err);
        if (st != INF_OK)
            return st;
        qkv_words = -1;
    }
    const int32_t *map = (const int32_t *)(lc->dev + lay.map_off);
    const int32_t *pos = p->pos->ptr;
    struct krn_cuda_attn_params kp = attn_kparams(c, p, true, &lay, lc);
    inf_status_t st = INF_E_UNSUPPORTED;
    if (lay.n_items > 0) {
        /* RoPE and the K/V write inside the attention kernel */
        struct krn_cuda_attn_params rp = kp;
        rp.rope_inv_freq = c->d_inv_freq;
        rp.rope_pos = pos;
        rp.kv_map = map;
        rp.v_new = v;
        rp.ldv = p->v.ld;
        rp.q_words = qw;
        rp.v_words = vw;
        rp.ldw = qw ? qkv_n : 0;
        struct inf_err le = {0};
        st = krn_cuda_attention(&rp, c->stream, &le);
        if (st != INF_OK && st != INF_E_UNSUPPORTED)
            return eng_cuda_kst(c, st, &le, err);
    }
    eng_cuda_written(p->k_cache);
    eng_cuda_written(p->v_cache);
    if (st == INF_OK) {
        eng_cuda_written(p->out.buf);
        return INF_OK;
    }
    /* the RoPE + K/V kernel first, then the attention, from fp16 q/k/v */
    if (qkv_words >= 0 &&
        (st = eng_cuda_words_reduce(c, qkv_words, p->q, c->step.rows, qkv_n, err)))
        return st;
    if (c->kv_fp8)
        KRN(c, krn_cuda_rope_kv_e4m3(q, p->q.ld, p->n_heads, p->n_kv_heads, hd, pos, c->d_inv_freq,
                                     v, p->v.ld, p->k_cache->ptr, p->v_cache->ptr, p->k_scale,
                                     p->v_scale, map, c->step.rows, c->stream, lep_));
    else
        KRN(c, krn_cuda_rope_kv(q, p->q.ld, p->n_heads, p->n_kv_heads, hd, pos, c->d_inv_freq, v,
                                p->v.ld, p->k_cache->ptr, p->v_cache->ptr, map, c->step.rows,
                                c->stream, lep_));
    if (lay.n_kv == 0)
        return INF_OK;
    KRN(c, krn_cuda_attention(&kp, c->stream, lep_));
    eng_cuda_written(p->out.buf);
    return INF_OK;
}

#endif
