/* engine/backend.c — the public wrappers of the backend table: argument
 * checks shared by every backend, then one call through the slot. */
#define INF_LOG_MODULE "eng"
#include "engine/backend.h"
#include "engine/batch.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

size_t eng_act_size(enum eng_act_dtype dt)
{
    return dt == ENG_ACT_E4M3 ? 1 : dt == ENG_ACT_F16 ? 2 : 4;
}

const char *eng_kv_dtype_name(enum eng_act_dtype dt)
{
    return dt == ENG_ACT_E4M3 ? "fp8 e4m3" : dt == ENG_ACT_F16 ? "fp16" : "fp32";
}

size_t eng_w_size(enum eng_wdtype dt)
{
    return dt == ENG_W_F16 ? 2 : 4;
}

void eng_backend_destroy(struct eng_backend *be)
{
    if (be)
        be->iface->destroy(be);
}

const char *eng_backend_name(const struct eng_backend *be)
{
    return be->iface->name;
}

/* Does the view hold rows x cols elements of size esz? */
static bool mat_ok(const struct eng_mat *v, int64_t rows, int64_t cols, size_t esz)
{
    if (!v->buf || v->off < 0 || cols < 0 || rows < 0 || (rows > 1 && v->ld < cols))
        return false;
    if (rows == 0 || cols == 0)
        return true;
    int64_t last = v->off + (rows - 1) * v->ld + cols;
    return (uint64_t)last * esz <= v->buf->size;
}

static bool buf_holds(const struct eng_buf *b, int64_t n, size_t esz)
{
    return b && n >= 0 && (uint64_t)n * esz <= b->size;
}

#define CHECK_MAT(v, rows, cols, esz, what)                                                        \
    do {                                                                                           \
        if (!mat_ok(&(v), rows, cols, esz))                                                        \
            return inf_err_set(err, INF_E_INVALID, "%s: view of %lld x %lld out of its buffer",    \
                               what, (long long)(rows), (long long)(cols));                        \
    } while (0)

inf_status_t eng_buf_alloc(struct eng_backend *be, size_t bytes, struct eng_buf **out,
                           struct inf_err *err)
{
    *out = NULL;
    if (bytes == 0)
        bytes = 1;
    return be->iface->buf_alloc(be, bytes, out, err);
}

void eng_buf_free(struct eng_backend *be, struct eng_buf *buf)
{
    if (buf)
        be->iface->buf_free(be, buf);
}

inf_status_t eng_buf_upload(struct eng_backend *be, struct eng_buf *dst, size_t off,
                            const void *src, size_t bytes, struct inf_err *err)
{
    if (!dst || off > dst->size || bytes > dst->size - off)
        return inf_err_set(err, INF_E_INVALID, "upload of %zu bytes at %zu out of the buffer",
                           bytes, off);
    if (bytes == 0)
        return INF_OK;
    return be->iface->buf_upload(be, dst, off, src, bytes, err);
}

/* Every copy of ups[0..n) lies inside its buffer. */
static inf_status_t uploads_check(const struct eng_upload *ups, int32_t n, struct inf_err *err)
{
    if (n < 0 || (n > 0 && !ups))
        return inf_err_set(err, INF_E_INVALID, "%d uploads", n);
    for (int32_t i = 0; i < n; i++) {
        const struct eng_upload *u = &ups[i];
        if (!u->dst || u->off > u->dst->size || u->bytes > u->dst->size - u->off ||
            (u->bytes && !u->src))
            return inf_err_set(err, INF_E_INVALID,
                               "upload %d of %zu bytes at %zu out of the buffer", i, u->bytes,
                               u->off);
    }
    return INF_OK;
}

inf_status_t eng_buf_upload_many(struct eng_backend *be, const struct eng_upload *ups, int32_t n,
                                 struct inf_err *err)
{
    inf_status_t st = uploads_check(ups, n, err);
    if (st != INF_OK)
        return st;
    if (be->iface->buf_upload_many)
        return n ? be->iface->buf_upload_many(be, ups, n, err) : INF_OK;
    for (int32_t i = 0; i < n; i++)
        if (ups[i].bytes && (st = be->iface->buf_upload(be, ups[i].dst, ups[i].off, ups[i].src,
                                                        ups[i].bytes, err)) != INF_OK)
            return st;
    return INF_OK;
}

inf_status_t eng_buf_download(struct eng_backend *be, const struct eng_buf *src, size_t off,
                              void *dst, size_t bytes, struct inf_err *err)
{
    if (!src || off > src->size || bytes > src->size - off)
        return inf_err_set(err, INF_E_INVALID, "download of %zu bytes at %zu out of the buffer",
                           bytes, off);
    if (bytes == 0)
        return INF_OK;
    return be->iface->buf_download(be, src, off, dst, bytes, err);
}

bool eng_backend_can_feed(const struct eng_backend *be)
{
    return be->iface->token_feed && be->iface->download_start && be->iface->download_wait;
}

inf_status_t eng_op_token_feed(struct eng_backend *be, struct eng_buf *tok,
                               const struct eng_buf *feed, const struct eng_buf *samples, int32_t n,
                               struct inf_err *err)
{
    if (!eng_backend_can_feed(be))
        return inf_err_set(err, INF_E_UNSUPPORTED, "backend %s does not feed tokens",
                           be->iface->name);
    if (n < 0 || !tok || !feed || !samples || (size_t)n * 4 > tok->size ||
        (size_t)n * 4 > feed->size)
        return inf_err_set(err, INF_E_INVALID, "token_feed: %d tokens exceed the buffers", n);
    if (n == 0)
        return INF_OK;
    return be->iface->token_feed(be, tok, feed, samples, n, err);
}

inf_status_t eng_buf_download_start(struct eng_backend *be, const struct eng_buf *src, size_t off,
                                    size_t bytes, int slot, struct inf_err *err)
{
    if (!eng_backend_can_feed(be))
        return inf_err_set(err, INF_E_UNSUPPORTED, "backend %s has no queued downloads",
                           be->iface->name);
    if (!src || off > src->size || bytes > src->size - off || (slot != 0 && slot != 1))
        return inf_err_set(err, INF_E_INVALID,
                           "queued download of %zu bytes at %zu (slot %d) out of range", bytes, off,
                           slot);
    return be->iface->download_start(be, src, off, bytes, slot, err);
}

inf_status_t eng_buf_download_wait(struct eng_backend *be, int slot, void *dst, struct inf_err *err)
{
    if (!eng_backend_can_feed(be))
        return inf_err_set(err, INF_E_UNSUPPORTED, "backend %s has no queued downloads",
                           be->iface->name);
    if (slot != 0 && slot != 1)
        return inf_err_set(err, INF_E_INVALID, "queued download slot %d", slot);
    return be->iface->download_wait(be, slot, dst, err);
}

inf_status_t eng_buf_from_host(struct eng_backend *be, const void *src, size_t bytes,
                               struct eng_buf **out, struct inf_err *err)
{
    inf_status_t st = eng_buf_alloc(be, bytes, out, err);
    if (st != INF_OK)
        return st;
    st = eng_buf_upload(be, *out, 0, src, bytes, err);
    if (st != INF_OK) {
        eng_buf_free(be, *out);
        *out = NULL;
    }
    return st;
}

static inf_status_t q4_check(const struct krn_q4_weight *w, struct inf_err *err)
{
    if (w->n <= 0 || w->k <= 0 || w->kp < w->k || w->group <= 0 || w->kp % w->group || !w->q ||
        !w->scale || !w->zero)
        return inf_err_set(err, INF_E_INVALID, "bad INT4 weight n=%d k=%d kp=%d group=%d", w->n,
                           w->k, w->kp, w->group);
    if (!w->perm)
        return INF_OK;
    /* a backend gathers x[perm[i]]: every column once, none outside k */
    uint8_t *seen = calloc((size_t)w->k, 1);
    if (!seen)
        return inf_err_set(err, INF_E_NOMEM, "out of memory checking a column order");
    int32_t bad = -1;
    for (int32_t i = 0; i < w->k && bad < 0; i++) {
        int32_t c = w->perm[i];
        if (c < 0 || c >= w->k || seen[c])
            bad = i;
        else
            seen[c] = 1;
    }
    free(seen);
    if (bad >= 0)
        return inf_err_set(err, INF_E_INVALID,
                           "INT4 weight column order: perm[%d] = %d is not a new column below %d",
                           bad, w->perm[bad], w->k);
    return INF_OK;
}

inf_status_t eng_weight_q4_create(struct eng_backend *be, const struct krn_q4_weight *w,
                                  struct eng_q4w **out, struct inf_err *err)
{
    *out = NULL;
    inf_status_t st = q4_check(w, err);
    return st != INF_OK ? st : be->iface->weight_q4_create(be, w, out, err);
}

bool eng_backend_has_glu(const struct eng_backend *be)
{
    return be->iface->weight_q4_create_glu && be->iface->linear_q4_glu;
}

inf_status_t eng_weight_q4_create_glu(struct eng_backend *be, const struct krn_q4_weight *w,
                                      struct eng_q4w **out, struct inf_err *err)
{
    *out = NULL;
    if (!eng_backend_has_glu(be))
        return inf_err_set(err, INF_E_UNSUPPORTED, "backend %s has no GLU linear", be->iface->name);
    inf_status_t st = q4_check(w, err);
    if (st == INF_OK && w->n % 16 != 0)
        st = inf_err_set(err, INF_E_INVALID, "GLU weight: n=%d not a multiple of 16", w->n);
    return st != INF_OK ? st : be->iface->weight_q4_create_glu(be, w, out, err);
}

void eng_weight_q4_destroy(struct eng_backend *be, struct eng_q4w *w)
{
    if (w)
        be->iface->weight_q4_destroy(be, w);
}

inf_status_t eng_op_linear_q4(struct eng_backend *be, const struct eng_q4w *w,
                              const struct eng_buf *bias, struct eng_mat x, struct eng_mat y,
                              bool y_f32, int32_t m, struct inf_err *err)
{
    size_t es = eng_act_size(be->act_dtype);
    if (m < 0 || !w)
        return inf_err_set(err, INF_E_INVALID, "linear_q4: bad arguments (m=%d)", m);
    if (m == 0)
        return INF_OK;
    CHECK_MAT(x, m, w->k, es, "linear_q4 x");
    CHECK_MAT(y, m, w->n, y_f32 ? 4 : es, "linear_q4 y");
    if (bias && !buf_holds(bias, w->n, 4))
        return inf_err_set(err, INF_E_INVALID, "linear_q4: bias shorter than n=%d", w->n);
    return be->iface->linear_q4(be, w, bias, x, y, y_f32, m, err);
}

inf_status_t eng_op_linear(struct eng_backend *be, const struct eng_linear *l, struct eng_mat x,
                           struct eng_mat y, bool y_f32, int32_t m, struct inf_err *err)
{
    if (l->glu)
        return inf_err_set(err, INF_E_INVALID, "linear: a GLU weight (use linear_q4_glu)");
    if (l->q4)
        return eng_op_linear_q4(be, l->q4, l->bias, x, y, y_f32, m, err);
    return eng_op_linear_fp(be, l->w, l->wdt, l->n, l->k, l->bias, x, y, y_f32, m, err);
}

inf_status_t eng_op_linear_q4_glu(struct eng_backend *be, const struct eng_q4w *w, struct eng_mat x,
                                  struct eng_mat tmp, struct eng_mat out, int32_t m,
                                  struct inf_err *err)
{
    size_t es = eng_act_size(be->act_dtype);
    if (m < 0 || !w || !eng_backend_has_glu(be))
        return inf_err_set(err, INF_E_INVALID, "linear_q4_glu: bad arguments (m=%d)", m);
    if (m == 0)
        return INF_OK;
    CHECK_MAT(x, m, w->k, es, "linear_q4_glu x");
    CHECK_MAT(tmp, m, w->n, es, "linear_q4_glu tmp");
    CHECK_MAT(out, m, w->n / 2, es, "linear_q4_glu out");
    return be->iface->linear_q4_glu(be, w, x, tmp, out, m, err);
}

inf_status_t eng_op_linear_fp(struct eng_backend *be, const struct eng_buf *w, enum eng_wdtype wdt,
                              int32_t n, int32_t k, const struct eng_buf *bias, struct eng_mat x,
                              struct eng_mat y, bool y_f32, int32_t m, struct inf_err *err)
{
    size_t es = eng_act_size(be->act_dtype);
    if (m < 0 || n <= 0 || k <= 0 || !buf_holds(w, (int64_t)n * k, eng_w_size(wdt)))
        return inf_err_set(err, INF_E_INVALID, "linear_fp: bad weight %dx%d or m=%d", n, k, m);
    if (m == 0)
        return INF_OK;
    CHECK_MAT(x, m, k, es, "linear_fp x");
    CHECK_MAT(y, m, n, y_f32 ? 4 : es, "linear_fp y");
    if (bias && !buf_holds(bias, n, 4))
        return inf_err_set(err, INF_E_INVALID, "linear_fp: bias shorter than n=%d", n);
    return be->iface->linear_fp(be, w, wdt, n, k, bias, x, y, y_f32, m, err);
}

inf_status_t eng_op_embedding(struct eng_backend *be, const struct eng_buf *table,
                              enum eng_wdtype wdt, int32_t vocab, int32_t dim,
                              const struct eng_buf *ids, struct eng_mat out, int32_t m,
                              struct inf_err *err)
{
    if (m < 0 || vocab <= 0 || dim <= 0 ||
        !buf_holds(table, (int64_t)vocab * dim, eng_w_size(wdt)) || !buf_holds(ids, m, 4))
        return inf_err_set(err, INF_E_INVALID, "embedding: bad table %dx%d or ids", vocab, dim);
    if (m == 0)
        return INF_OK;
    CHECK_MAT(out, m, dim, eng_act_size(be->act_dtype), "embedding out");
    return be->iface->embedding(be, table, wdt, vocab, dim, ids, out, m, err);
}

inf_status_t eng_op_rmsnorm_add(struct eng_backend *be, struct eng_mat x,
                                const struct eng_mat *delta, const struct eng_buf *w,
                                const struct eng_buf *perm, float eps, struct eng_mat out,
                                int32_t dim, int32_t m, struct inf_err *err)
{
    size_t es = eng_act_size(be->act_dtype);
    if (m < 0 || dim <= 0 || !buf_holds(w, dim, 4) || (perm && !buf_holds(perm, dim, 4)))
        return inf_err_set(err, INF_E_INVALID, "rmsnorm: bad dim %d, weight or column order", dim);
    if (m == 0)
        return INF_OK;
    CHECK_MAT(x, m, dim, es, "rmsnorm x");
    CHECK_MAT(out, m, dim, es, "rmsnorm out");
    if (delta)
        CHECK_MAT(*delta, m, dim, es, "rmsnorm delta");
    return be->iface->rmsnorm_add(be, x, delta, w, perm, eps, out, dim, m, err);
}

inf_status_t eng_op_rope(struct eng_backend *be, struct eng_mat x, int32_t n_heads,
                         int32_t head_dim, const struct eng_buf *pos,
                         const struct eng_rope_params *p, int32_t m, struct inf_err *err)
{
    if (m < 0 || n_heads <= 0 || head_dim <= 0 || (head_dim & 1) || head_dim > 512 ||
        !buf_holds(pos, m, 4))
        return inf_err_set(err, INF_E_INVALID, "rope: bad head_dim %d or positions", head_dim);
    if (m == 0)
        return INF_OK;
    CHECK_MAT(x, m, (int64_t)n_heads * head_dim, eng_act_size(be->act_dtype), "rope x");
    return be->iface->rope(be, x, n_heads, head_dim, pos, p, m, err);
}

static inf_status_t attn_check(struct eng_backend *be, const struct eng_attn_params *p,
                               struct inf_err *err)
{
    size_t es = eng_act_size(be->act_dtype);
    if (p->n_heads <= 0 || p->n_kv_heads <= 0 || p->n_heads % p->n_kv_heads || p->head_dim <= 0 ||
        p->n_seqs < 0 || p->n_slots <= 0 || p->max_blocks <= 0 || p->n_blocks <= 0)
        return inf_err_set(err, INF_E_INVALID, "attention: bad heads %d/%d or tables", p->n_heads,
                           p->n_kv_heads);
    int64_t pool = (int64_t)p->n_blocks * ENG_KV_BLOCK * p->n_kv_heads * p->head_dim;
    size_t ks = eng_act_size(be->kv_dtype);
    if (!buf_holds(p->k_cache, pool, ks) || !buf_holds(p->v_cache, pool, ks) ||
        !buf_holds(p->seqs, (int64_t)p->n_seqs * 3, 4) ||
        !buf_holds(p->block_table, (int64_t)p->n_slots * p->max_blocks, 4) || !p->pos)
        return inf_err_set(err, INF_E_INVALID, "attention: cache or tables too small");
    if (be->kv_dtype == ENG_ACT_E4M3 &&
        !(p->k_scale > 0.0f && p->k_scale < INFINITY && p->v_scale > 0.0f && p->v_scale < INFINITY))
        return inf_err_set(err, INF_E_INVALID,
                           "attention: fp8 KV scales must be finite and > 0, got %g and %g",
                           (double)p->k_scale, (double)p->v_scale);
    /* Rows: the caller's batch; the views must hold as many rows as the
     * positions buffer describes. */
    int64_t rows = (int64_t)(p->pos->size / 4);
    CHECK_MAT(p->q, rows, (int64_t)p->n_heads * p->head_dim, es, "attention q");
    CHECK_MAT(p->k, rows, (int64_t)p->n_kv_heads * p->head_dim, es, "attention k");
    CHECK_MAT(p->v, rows, (int64_t)p->n_kv_heads * p->head_dim, es, "attention v");
    CHECK_MAT(p->out, rows, (int64_t)p->n_heads * p->head_dim, es, "attention out");
    return INF_OK;
}

inf_status_t eng_op_attn_prefill(struct eng_backend *be, const struct eng_attn_params *p,
                                 struct inf_err *err)
{
    inf_status_t st = attn_check(be, p, err);
    if (st != INF_OK || p->n_seqs == 0)
        return st;
    return be->iface->attn_prefill(be, p, err);
}

inf_status_t eng_attn_tables_check(const struct eng_attn_params *p, const int32_t *pos,
                                   int64_t rows, const int32_t *seqs, const int32_t *bt,
                                   bool single_token, int32_t *n_tok, int32_t *max_ctx,
                                   struct inf_err *err)
{
    int32_t tok = 0, ctx = 0;
    if (p->window < 0)
        return inf_err_set(err, INF_E_INVALID, "attention: window %d", p->window);
    for (int32_t s = 0; s < p->n_seqs; s++) {
        int32_t t0 = seqs[3 * s], nt = seqs[3 * s + 1], slot = seqs[3 * s + 2];
        if (t0 < 0 || nt <= 0 || t0 + (int64_t)nt > rows || slot < 0 || slot >= p->n_slots ||
            (single_token && nt != 1))
            return inf_err_set(err, INF_E_INVALID, "attention: bad sequence %d", s);
        for (int32_t t = t0; t < t0 + nt; t++)
            if (pos[t] < 0 || pos[t] >= p->max_blocks * ENG_KV_BLOCK ||
                (t > t0 && pos[t] != pos[t - 1] + 1))
                return inf_err_set(err, INF_E_INVALID, "attention: bad position %d", pos[t]);
        int32_t last = pos[t0 + nt - 1];
        /* blocks before the first token's window are not read (freed) */
        for (int32_t b = eng_attn_first_key(p->window, pos[t0]) / ENG_KV_BLOCK;
             b <= last / ENG_KV_BLOCK; b++) {
            int32_t blk = bt[(int64_t)slot * p->max_blocks + b];
            if (blk < 0 || blk >= p->n_blocks)
                return inf_err_set(err, INF_E_INVALID,
                                   "attention: slot %d has no block for position %d", slot,
                                   b * ENG_KV_BLOCK);
        }
        tok += nt;
        ctx = last + 1 > ctx ? last + 1 : ctx;
    }
    if (n_tok)
        *n_tok = tok;
    if (max_ctx)
        *max_ctx = ctx;
    return INF_OK;
}

inf_status_t eng_op_attn_decode(struct eng_backend *be, const struct eng_attn_params *p,
                                struct inf_err *err)
{
    inf_status_t st = attn_check(be, p, err);
    if (st != INF_OK || p->n_seqs == 0)
        return st;
    return be->iface->attn_decode(be, p, err);
}

inf_status_t eng_op_silu_mul(struct eng_backend *be, struct eng_mat gate, struct eng_mat up,
                             struct eng_mat out, int32_t dim, int32_t m, struct inf_err *err)
{
    size_t es = eng_act_size(be->act_dtype);
    if (m < 0 || dim <= 0)
        return inf_err_set(err, INF_E_INVALID, "silu_mul: bad dim %d", dim);
    if (m == 0)
        return INF_OK;
    CHECK_MAT(gate, m, dim, es, "silu_mul gate");
    CHECK_MAT(up, m, dim, es, "silu_mul up");
    CHECK_MAT(out, m, dim, es, "silu_mul out");
    return be->iface->silu_mul(be, gate, up, out, dim, m, err);
}

inf_status_t eng_op_rows_gather(struct eng_backend *be, struct eng_mat x, const struct eng_buf *idx,
                                struct eng_mat out, int32_t dim, int32_t m, struct inf_err *err)
{
    size_t es = eng_act_size(be->act_dtype);
    if (m < 0 || dim <= 0 || !buf_holds(idx, m, 4))
        return inf_err_set(err, INF_E_INVALID, "rows_gather: bad dim %d or indices", dim);
    if (m == 0)
        return INF_OK;
    CHECK_MAT(out, m, dim, es, "rows_gather out");
    return be->iface->rows_gather(be, x, idx, out, dim, m, err);
}

inf_status_t eng_op_all_reduce(struct eng_backend *be, struct eng_mat x, int32_t dim, int32_t m,
                               struct inf_err *err)
{
    if (!be->iface->all_reduce)
        return inf_err_set(err, INF_E_UNSUPPORTED, "backend %s has no all_reduce", be->iface->name);
    CHECK_MAT(x, m, dim, eng_act_size(be->act_dtype), "all_reduce x");
    return be->iface->all_reduce(be, x, dim, m, err);
}

inf_status_t eng_backend_mem_info(struct eng_backend *be, size_t *free_bytes, size_t *total_bytes,
                                  struct inf_err *err)
{
    if (!be->iface->mem_info)
        return inf_err_set(err, INF_E_UNSUPPORTED, "backend %s has no device memory to report",
                           be->iface->name);
    return be->iface->mem_info(be, free_bytes, total_bytes, err);
}

bool eng_backend_can_sample(const struct eng_backend *be)
{
    return be->iface->sample && be->iface->sample_reserve;
}

inf_status_t eng_backend_sample_reserve(struct eng_backend *be, int32_t vocab, struct inf_err *err)
{
    if (!eng_backend_can_sample(be))
        return inf_err_set(err, INF_E_UNSUPPORTED, "backend %s does not sample", be->iface->name);
    if (vocab <= 0)
        return inf_err_set(err, INF_E_INVALID, "sample: vocabulary of %d", vocab);
    return be->iface->sample_reserve(be, vocab, err);
}

inf_status_t eng_op_sample(struct eng_backend *be, const struct eng_buf *logits,
                           int32_t n_logit_rows, int32_t vocab, const struct eng_sample_row *rows,
                           int32_t n, struct eng_buf *out, int32_t out_first, struct inf_err *err)
{
    if (!eng_backend_can_sample(be))
        return inf_err_set(err, INF_E_UNSUPPORTED, "backend %s does not sample", be->iface->name);
    if (n < 0 || out_first < 0 || vocab <= 0 || n_logit_rows < 0 || !logits || !out)
        return inf_err_set(err, INF_E_INVALID, "sample: bad sizes");
    if (n == 0)
        return INF_OK;
    if ((size_t)n_logit_rows * (size_t)vocab * 4 > logits->size)
        return inf_err_set(err, INF_E_INVALID, "sample: %d rows of %d exceed the logits buffer",
                           n_logit_rows, vocab);
    if (((size_t)out_first + (size_t)n) * sizeof(struct eng_sample_out) > out->size)
        return inf_err_set(err, INF_E_INVALID, "sample: %d results exceed the output buffer",
                           out_first + n);
    for (int32_t i = 0; i < n; i++) {
        const struct eng_sample_row *r = &rows[i];
        if (r->logit_row < 0 || r->logit_row >= n_logit_rows)
            return inf_err_set(err, INF_E_INVALID, "sample: row %d reads logits row %d of %d", i,
                               r->logit_row, n_logit_rows);
        if (!(r->temperature >= 0.0f) || !(r->top_p > 0.0f && r->top_p <= 1.0f) ||
            !(r->min_p >= 0.0f && r->min_p <= 1.0f) || !(r->repetition_penalty > 0.0f) ||
            !(r->u >= 0.0 && r->u < 1.0) || r->n_logprobs < 0 || r->n_logprobs > ENG_SAMPLE_TOP ||
            r->n_ban < 0 || r->n_bias < 0 || r->n_hist < 0 || (r->n_ban && !r->ban) ||
            (r->n_bias && (!r->bias_ids || !r->bias_vals)) || (r->n_hist && !r->hist))
            return inf_err_set(err, INF_E_INVALID, "sample: row %d has bad settings", i);
        for (int32_t j = 0; j < r->n_bias; j++)
            if (r->bias_ids[j] < 0 || r->bias_ids[j] >= vocab)
                return inf_err_set(err, INF_E_INVALID, "sample: bias id %d outside [0, %d)",
                                   r->bias_ids[j], vocab);
        for (int32_t j = 0; j < r->n_hist; j++)
            if (r->hist[j].token < 0 || r->hist[j].token >= vocab)
                return inf_err_set(err, INF_E_INVALID, "sample: history id %d outside [0, %d)",
                                   r->hist[j].token, vocab);
    }
    return be->iface->sample(be, logits, n_logit_rows, vocab, rows, n, out, out_first, err);
}

bool eng_backend_has_graphs(const struct eng_backend *be)
{
    const struct eng_backend_iface *i = be->iface;
    return i->graph_prepare && i->graph_record && i->graph_launch && i->graph_finish;
}

inf_status_t eng_graph_prepare(struct eng_backend *be, const struct eng_attn_params *p,
                               int32_t bucket, const struct eng_upload *ups, int32_t n_ups,
                               bool *have, struct inf_err *err)
{
    *have = false;
    if (!eng_backend_has_graphs(be))
        return inf_err_set(err, INF_E_UNSUPPORTED, "backend %s records no graphs", be->iface->name);
    if (bucket <= 0 || p->n_seqs < 0 || p->n_seqs > bucket)
        return inf_err_set(err, INF_E_INVALID, "graph: %d sequences in a bucket of %d", p->n_seqs,
                           bucket);
    inf_status_t st = uploads_check(ups, n_ups, err);
    if (st != INF_OK)
        return st;
    return be->iface->graph_prepare(be, p, bucket, ups, n_ups, have, err);
}

inf_status_t eng_graph_record(struct eng_backend *be, int32_t bucket, bool begin,
                              struct inf_err *err)
{
    if (!eng_backend_has_graphs(be))
        return inf_err_set(err, INF_E_UNSUPPORTED, "backend %s records no graphs", be->iface->name);
    return be->iface->graph_record(be, bucket, begin, err);
}

inf_status_t eng_graph_launch(struct eng_backend *be, int32_t bucket, struct inf_err *err)
{
    if (!eng_backend_has_graphs(be))
        return inf_err_set(err, INF_E_UNSUPPORTED, "backend %s records no graphs", be->iface->name);
    return be->iface->graph_launch(be, bucket, err);
}

void eng_graph_finish(struct eng_backend *be)
{
    if (eng_backend_has_graphs(be))
        be->iface->graph_finish(be);
}
