/* engine/cpu/backend_cpu.c — the CPU backend: the reference every other backend
 * is tested against. fp32 activations and KV; buffers are plain host memory;
 * ops are split over a thread pool owned by the backend (engine/par.h; one
 * thread per core by default), the calling thread included.
 *
 * Work split: linear layers over output columns (each thread a contiguous
 * range, so it streams its own slice of the weight), row ops over rows,
 * attention over (sequence or token, head) pairs. Every output element is
 * computed by the same code in the same order whatever the split, so
 * results do not depend on the thread count or on the batch. */
#define INF_LOG_MODULE "eng"
#include "engine/backend.h"
#include "engine/tp/comm.h"
#include "engine/batch.h"
#include "engine/par.h"
#include "kernels/activation.h"
#include "kernels/attention.h"
#include "kernels/embedding.h"
#include "kernels/linear.h"
#include "kernels/norm.h"
#include "kernels/rope.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- tasks on the engine's thread pool -------------------------------------
 * pool_run(par, fn, ctx, n) calls fn(ctx, i) for every i < n across the
 * pool's threads and the caller (engine/par.h), and returns when all are
 * done; tasks are handed out one at a time. */
typedef void (*task_fn)(void *ctx, int32_t i);

struct task_job {
    task_fn fn;
    void *ctx;
};

static void task_range(void *arg, int64_t i0, int64_t i1)
{
    const struct task_job *j = arg;
    for (int64_t i = i0; i < i1; i++)
        j->fn(j->ctx, (int32_t)i);
}

static void pool_run(eng_par_t *par, task_fn fn, void *ctx, int32_t n_tasks)
{
    struct task_job j = {.fn = fn, .ctx = ctx};
    eng_par_run(par, n_tasks, 1, task_range, &j);
}

/* ---- backend state -------------------------------------------------------- */
struct cpu_ctx {
    struct eng_comm *comm; /* a tensor-parallel rank's, or NULL */
    eng_par_t *par;
    int32_t n_threads; /* the pool's threads, the caller included */
    float *scratch;      /* attention scores: [4 * n_threads][scratch_len] */
    int64_t scratch_len; /* floats per task */
    int32_t *rows;       /* attention row lists: [2][rows_cap] */
    int32_t rows_cap;
    float *gather; /* x of a weight with a column order, per linear task:
                      [n_threads][GATHER_ROWS][gather_k] */
    int32_t gather_k;
};

/* Rows of x gathered at a time by a linear task of a weight with a column
 * order: a multiple of the kernel's tile of 8 rows, small enough that the
 * buffer stays in cache while the task's columns of W stream past it. */
#define GATHER_ROWS 16

struct cpu_q4 {
    struct krn_cpu_q4 w;
    void *mem;
    int32_t *perm; /* [k] input column of each stored column, or NULL */
};

static struct cpu_ctx *ctx_of(struct eng_backend *be)
{
    return be->ctx;
}

static float *fptr(struct eng_mat v)
{
    return (float *)v.buf->ptr + v.off;
}

/* Split [0, n) into `parts` near-equal ranges; range i. */
static void split(int32_t n, int32_t parts, int32_t i, int32_t *a, int32_t *b)
{
    *a = (int32_t)((int64_t)n * i / parts);
    *b = (int32_t)((int64_t)n * (i + 1) / parts);
}

static int32_t parts_for(struct cpu_ctx *c, int32_t n)
{
    return n < c->n_threads ? n : c->n_threads;
}

/* ---- buffers ------------------------------------------------------------- */
static inf_status_t cpu_buf_alloc(struct eng_backend *be, size_t bytes, struct eng_buf **out,
                                  struct inf_err *err)
{
    (void)be;
    struct eng_buf *b = calloc(1, sizeof *b);
    size_t rounded = (bytes + 63) / 64 * 64;
    void *p = NULL;
    if (!b || posix_memalign(&p, 64, rounded) != 0) {
        free(b);
        return inf_err_set(err, INF_E_NOMEM, "out of memory for a %zu-byte buffer", bytes);
    }
    memset(p, 0, rounded);
    b->ptr = p;
    b->size = bytes;
    *out = b;
    return INF_OK;
}

static void cpu_buf_free(struct eng_backend *be, struct eng_buf *buf)
{
    (void)be;
    free(buf->ptr);
    free(buf);
}

static inf_status_t cpu_buf_upload(struct eng_backend *be, struct eng_buf *dst, size_t off,
                                   const void *src, size_t bytes, struct inf_err *err)
{
    (void)be;
    (void)err;
    memcpy((char *)dst->ptr + off, src, bytes);
    return INF_OK;
}

static inf_status_t cpu_buf_download(struct eng_backend *be, const struct eng_buf *src, size_t off,
                                     void *dst, size_t bytes, struct inf_err *err)
{
    (void)be;
    (void)err;
    memcpy(dst, (const char *)src->ptr + off, bytes);
    return INF_OK;
}

/* ---- weights --------------------------------------------------------------- */
static inf_status_t cpu_weight_q4_create(struct eng_backend *be, const struct krn_q4_weight *w,
                                         struct eng_q4w **out, struct inf_err *err)
{
    struct cpu_ctx *x = ctx_of(be);
    struct eng_q4w *h = calloc(1, sizeof *h);
    struct cpu_q4 *c = calloc(1, sizeof *c);
    size_t bytes = krn_cpu_q4_bytes(w);
    if (!h || !c || posix_memalign(&c->mem, 64, bytes) != 0)
        goto fail_mem;
    if (w->perm) {
        /* the weight's own copy of its column order, and gather room for
         * its k in every task (load time only) */
        if (!(c->perm = malloc((size_t)w->k * sizeof *c->perm)))
            goto fail_mem;
        memcpy(c->perm, w->perm, (size_t)w->k * sizeof *c->perm);
        if (w->k > x->gather_k) {
            float *g = realloc(x->gather,
                               (size_t)x->n_threads * GATHER_ROWS * (size_t)w->k * sizeof(float));
            if (!g)
                goto fail_mem;
            x->gather = g;
            x->gather_k = w->k;
        }
    }
    krn_cpu_q4_repack(w, c->mem, &c->w);
    h->n = w->n;
    h->k = w->k;
    h->impl = c;
    *out = h;
    return INF_OK;
fail_mem:
    if (c) {
        free(c->mem);
        free(c->perm);
    }
    free(h);
    free(c);
    return inf_err_set(err, INF_E_NOMEM, "out of memory repacking a %dx%d INT4 weight", w->n,
                       w->kp);
}

static void cpu_weight_q4_destroy(struct eng_backend *be, struct eng_q4w *w)
{
    (void)be;
    struct cpu_q4 *c = w->impl;
    free(c->mem);
    free(c->perm);
    free(c);
    free(w);
}

/* ---- linear ---------------------------------------------------------------- */
struct linear_job {
    int32_t kind; /* 0 q4, 1 f32, 2 f16 */
    const struct krn_cpu_q4 *q4;
    const int32_t *perm; /* q4's column order, or NULL */
    float *gather;       /* [parts][GATHER_ROWS][q4->k] when perm */
    const void *w;
    int32_t n, k, m, parts;
    const float *bias, *x;
    float *y;
    int64_t ldx, ldy;
};

static void linear_task(void *ctx, int32_t i)
{
    struct linear_job *j = ctx;
    int32_t n0, n1;
    split(j->n, j->parts, i, &n0, &n1);
    if (j->kind == 0 && j->perm) {
        /* x[:, perm] a few rows at a time into this task's buffer; each
         * output is accumulated as without the split (kernels/linear.h) */
        float *xg = j->gather + (int64_t)i * GATHER_ROWS * j->k;
        for (int32_t r0 = 0; r0 < j->m; r0 += GATHER_ROWS) {
            int32_t rows = j->m - r0 < GATHER_ROWS ? j->m - r0 : GATHER_ROWS;
            krn_cpu_gather_cols(j->x + r0 * j->ldx, j->ldx, j->perm, j->k, xg, j->k, rows);
            krn_cpu_linear_q4(j->q4, j->bias, xg, j->k, j->y + r0 * j->ldy, j->ldy, rows, n0, n1);
        }
    } else if (j->kind == 0)
        krn_cpu_linear_q4(j->q4, j->bias, j->x, j->ldx, j->y, j->ldy, j->m, n0, n1);
    else if (j->kind == 1)
        krn_cpu_linear_f32(j->w, j->k, j->bias, j->x, j->ldx, j->y, j->ldy, j->m, n0, n1);
    else
        krn_cpu_linear_f16(j->w, j->k, j->bias, j->x, j->ldx, j->y, j->ldy, j->m, n0, n1);
}

/* Enough columns per task that the pool's hand-off is amortized. */
static int32_t linear_parts(struct cpu_ctx *c, int32_t n, int32_t m, int32_t k)
{
    int64_t work = (int64_t)n * m * k;
    if (work < 65536)
        return 1;
    return parts_for(c, n);
}

/* Activations are fp32 here: y_f32 asks for what every output already is. */
static inf_status_t cpu_linear_q4(struct eng_backend *be, const struct eng_q4w *w,
                                  const struct eng_buf *bias, struct eng_mat x, struct eng_mat y,
                                  bool y_f32, int32_t m, struct inf_err *err)
{
    (void)err;
    (void)y_f32;
    struct cpu_ctx *c = ctx_of(be);
    const struct cpu_q4 *q = w->impl;
    struct linear_job j = {.kind = 0,
                           .q4 = &q->w,
                           .perm = q->perm,
                           .gather = c->gather,
                           .n = w->n,
                           .k = w->k,
                           .m = m,
                           .bias = bias ? bias->ptr : NULL,
                           .x = fptr(x),
                           .y = fptr(y),
                           .ldx = x.ld,
                           .ldy = y.ld};
    j.parts = linear_parts(c, w->n, m, w->k);
    pool_run(c->par, linear_task, &j, j.parts);
    return INF_OK;
}

static inf_status_t cpu_linear_fp(struct eng_backend *be, const struct eng_buf *w,
                                  enum eng_wdtype wdt, int32_t n, int32_t k,
                                  const struct eng_buf *bias, struct eng_mat x, struct eng_mat y,
                                  bool y_f32, int32_t m, struct inf_err *err)
{
    (void)err;
    (void)y_f32; /* activations are fp32 here: both outputs are the same */
    struct cpu_ctx *c = ctx_of(be);
    struct linear_job j = {.kind = wdt == ENG_W_F16 ? 2 : 1,
                           .w = w->ptr,
                           .n = n,
                           .k = k,
                           .m = m,
                           .bias = bias ? bias->ptr : NULL,
                           .x = fptr(x),
                           .y = fptr(y),
                           .ldx = x.ld,
                           .ldy = y.ld};
    j.parts = linear_parts(c, n, m, k);
    pool_run(c->par, linear_task, &j, j.parts);
    return INF_OK;
}

/* ---- embedding, norm, rope, silu, gather: row-parallel ------------------- */
struct rows_job {
    int32_t op, m, parts, dim, n_heads;
    const void *table;
    enum eng_wdtype wdt;
    const int32_t *ids;
    float *x, *out;
    const float *delta, *w, *inv_freq, *up;
    int64_t ldx, ldd, ldo, ldu;
    float eps;
};

enum { OP_EMBED, OP_NORM, OP_ROPE, OP_SILU, OP_GATHER };

static void rows_task(void *ctx, int32_t i)
{
    struct rows_job *j = ctx;
    int32_t r0, r1;
    split(j->m, j->parts, i, &r0, &r1);
    switch (j->op) {
    case OP_EMBED:
        if (j->wdt == ENG_W_F16)
            krn_cpu_embed_f16(j->table, j->dim, j->ids, j->out, j->ldo, r0, r1);
        else
            krn_cpu_embed_f32(j->table, j->dim, j->ids, j->out, j->ldo, r0, r1);
        break;
    case OP_NORM:
        krn_cpu_rmsnorm_add(j->x, j->ldx, j->delta, j->ldd, j->w, j->eps, j->out, j->ldo, j->dim,
                            r0, r1);
        break;
    case OP_ROPE:
        krn_cpu_rope(j->x, j->ldx, j->n_heads, j->dim, j->ids, j->inv_freq, r0, r1);
        break;
    case OP_SILU:
        krn_cpu_silu_mul(j->x, j->ldx, j->up, j->ldu, j->out, j->ldo, j->dim, r0, r1);
        break;
    case OP_GATHER:
        krn_cpu_rows_gather(j->x, j->ldx, j->ids, j->out, j->ldo, j->dim, r0, r1);
        break;
    }
}

static void rows_run(struct cpu_ctx *c, struct rows_job *j)
{
    /* Small row ops are not worth waking the pool for. */
    j->parts = (int64_t)j->m * j->dim < 16384 ? 1 : parts_for(c, j->m);
    pool_run(c->par, rows_task, j, j->parts);
}

static inf_status_t cpu_embedding(struct eng_backend *be, const struct eng_buf *table,
                                  enum eng_wdtype wdt, int32_t vocab, int32_t dim,
                                  const struct eng_buf *ids, struct eng_mat out, int32_t m,
                                  struct inf_err *err)
{
    const int32_t *id = ids->ptr;
    for (int32_t t = 0; t < m; t++)
        if (id[t] < 0 || id[t] >= vocab)
            return inf_err_set(err, INF_E_INVALID, "token id %d outside the vocabulary (%d)", id[t],
                               vocab);
    struct rows_job j = {.op = OP_EMBED,
                         .m = m,
                         .dim = dim,
                         .table = table->ptr,
                         .wdt = wdt,
                         .ids = id,
                         .out = fptr(out),
                         .ldo = out.ld};
    rows_run(ctx_of(be), &j);
    return INF_OK;
}

static inf_status_t cpu_rmsnorm_add(struct eng_backend *be, struct eng_mat x,
                                    const struct eng_mat *delta, const struct eng_buf *w, float eps,
                                    struct eng_mat out, int32_t dim, int32_t m, struct inf_err *err)
{
    (void)err;
    struct rows_job j = {.op = OP_NORM,
                         .m = m,
                         .dim = dim,
                         .x = fptr(x),
                         .ldx = x.ld,
                         .delta = delta ? fptr(*delta) : NULL,
                         .ldd = delta ? delta->ld : 0,
                         .w = w->ptr,
                         .eps = eps,
                         .out = fptr(out),
                         .ldo = out.ld};
    rows_run(ctx_of(be), &j);
    return INF_OK;
}

static inf_status_t cpu_rope(struct eng_backend *be, struct eng_mat x, int32_t n_heads,
                             int32_t head_dim, const struct eng_buf *pos,
                             const struct eng_rope_params *p, int32_t m, struct inf_err *err)
{
    (void)err;
    float inv_freq[256];
    krn_rope_inv_freq(p->theta, p->llama3, p->factor, p->low_freq, p->high_freq, p->orig_max_pos,
                      head_dim, inv_freq);
    struct rows_job j = {.op = OP_ROPE,
                         .m = m,
                         .dim = head_dim,
                         .n_heads = n_heads,
                         .x = fptr(x),
                         .ldx = x.ld,
                         .ids = pos->ptr,
                         .inv_freq = inv_freq};
    rows_run(ctx_of(be), &j);
    return INF_OK;
}

static inf_status_t cpu_silu_mul(struct eng_backend *be, struct eng_mat gate, struct eng_mat up,
                                 struct eng_mat out, int32_t dim, int32_t m, struct inf_err *err)
{
    (void)err;
    struct rows_job j = {.op = OP_SILU,
                         .m = m,
                         .dim = dim,
                         .x = fptr(gate),
                         .ldx = gate.ld,
                         .up = fptr(up),
                         .ldu = up.ld,
                         .out = fptr(out),
                         .ldo = out.ld};
    rows_run(ctx_of(be), &j);
    return INF_OK;
}

static inf_status_t cpu_rows_gather(struct eng_backend *be, struct eng_mat x,
                                    const struct eng_buf *idx, struct eng_mat out, int32_t dim,
                                    int32_t m, struct inf_err *err)
{
    const int32_t *id = idx->ptr;
    for (int32_t r = 0; r < m; r++) {
        int64_t end = x.off + (int64_t)id[r] * x.ld + dim;
        if (id[r] < 0 || (uint64_t)end * sizeof(float) > x.buf->size)
            return inf_err_set(err, INF_E_INVALID, "rows_gather: row %d out of the buffer", id[r]);
    }
    struct rows_job j = {.op = OP_GATHER,
                         .m = m,
                         .dim = dim,
                         .x = fptr(x),
                         .ldx = x.ld,
                         .ids = id,
                         .out = fptr(out),
                         .ldo = out.ld};
    rows_run(ctx_of(be), &j);
    return INF_OK;
}

/* ---- attention --------------------------------------------------------------- */
struct attn_job {
    const struct eng_attn_params *p;
    struct cpu_ctx *c;
    const int32_t *seqs, *pos, *bt;
    int32_t n_items;                  /* (token or sequence) x heads */
    int32_t n_rows;                   /* tokens covered */
    const int32_t *row_tok, *row_seq; /* per row: batch token and its sequence */
};

/* Validate the tables (they are caller data) and count the tokens. */
static inf_status_t attn_tables(const struct eng_attn_params *p, int32_t *n_tok, int32_t *max_ctx,
                                struct inf_err *err)
{
    return eng_attn_tables_check(p, p->pos->ptr, (int64_t)(p->pos->size / 4), p->seqs->ptr,
                                 p->block_table->ptr, false, n_tok, max_ctx, err);
}

static void kv_write_task(void *ctx, int32_t s)
{
    struct attn_job *j = ctx;
    const struct eng_attn_params *p = j->p;
    int32_t t0 = j->seqs[3 * s], nt = j->seqs[3 * s + 1], slot = j->seqs[3 * s + 2];
    const int32_t *blocks = j->bt + (int64_t)slot * p->max_blocks;
    for (int32_t t = t0; t < t0 + nt; t++)
        krn_cpu_kv_write(p->k_cache->ptr, p->v_cache->ptr, blocks, ENG_KV_BLOCK, p->n_kv_heads,
                         p->head_dim, j->pos[t], fptr(p->k) + (int64_t)t * p->k.ld,
                         fptr(p->v) + (int64_t)t * p->v.ld);
}

/* Item i: token row i / n_heads of the flattened list, head i % n_heads.
 * Task `task` owns scratch row `task` (at most ATTN_TASKS_PER_THREAD tasks
 * per thread). */
#define ATTN_TASKS_PER_THREAD 4

struct attn_task_ctx {
    struct attn_job *j;
    int32_t per_task;
};

static void attn_task(void *ctx, int32_t task)
{
    struct attn_task_ctx *tc = ctx;
    struct attn_job *j = tc->j;
    const struct eng_attn_params *p = j->p;
    float *scores = j->c->scratch + (int64_t)task * j->c->scratch_len;
    int32_t group = p->n_heads / p->n_kv_heads;
    int32_t i0 = task * tc->per_task;
    int32_t i1 = i0 + tc->per_task < j->n_items ? i0 + tc->per_task : j->n_items;
    for (int32_t i = i0; i < i1; i++) {
        int32_t row = i / p->n_heads, h = i % p->n_heads;
        int32_t t = j->row_tok[row], s = j->row_seq[row];
        int32_t slot = j->seqs[3 * s + 2];
        const float *q = fptr(p->q) + (int64_t)t * p->q.ld + (int64_t)h * p->head_dim;
        float *o = fptr(p->out) + (int64_t)t * p->out.ld + (int64_t)h * p->head_dim;
        krn_cpu_attn_head(q, p->k_cache->ptr, p->v_cache->ptr,
                          j->bt + (int64_t)slot * p->max_blocks, ENG_KV_BLOCK, p->n_kv_heads,
                          p->head_dim, h / group, j->pos[t] + 1, p->scale, scores, o);
    }
}

static inf_status_t cpu_attn(struct eng_backend *be, const struct eng_attn_params *p,
                             struct inf_err *err)
{
    struct cpu_ctx *c = ctx_of(be);
    int32_t n_tok, max_ctx;
    inf_status_t st = attn_tables(p, &n_tok, &max_ctx, err);
    if (st != INF_OK)
        return st;
    /* Scratch grows with the longest context and largest batch seen, then
     * stays: steady-state steps allocate nothing. */
    if (max_ctx > c->scratch_len) {
        float *s = realloc(c->scratch, (size_t)max_ctx * (size_t)c->n_threads *
                                           ATTN_TASKS_PER_THREAD * sizeof(float));
        if (!s)
            return inf_err_set(err, INF_E_NOMEM, "out of memory for attention scratch");
        c->scratch = s;
        c->scratch_len = max_ctx;
    }
    if (n_tok > c->rows_cap) {
        int32_t *r = realloc(c->rows, (size_t)n_tok * 2 * sizeof(int32_t));
        if (!r)
            return inf_err_set(err, INF_E_NOMEM, "out of memory for attention rows");
        c->rows = r;
        c->rows_cap = n_tok;
    }
    int32_t *rows = c->rows;
    struct attn_job j = {.p = p,
                         .c = c,
                         .seqs = p->seqs->ptr,
                         .pos = p->pos->ptr,
                         .bt = p->block_table->ptr,
                         .n_rows = n_tok,
                         .row_tok = rows,
                         .row_seq = rows + n_tok};
    int32_t r = 0;
    for (int32_t s = 0; s < p->n_seqs; s++)
        for (int32_t t = j.seqs[3 * s]; t < j.seqs[3 * s] + j.seqs[3 * s + 1]; t++) {
            rows[r] = t;
            rows[n_tok + r] = s;
            r++;
        }
    j.n_items = n_tok * p->n_heads;
    pool_run(c->par, kv_write_task, &j, p->n_seqs);
    struct attn_task_ctx tc = {.j = &j};
    int32_t tasks = c->n_threads * ATTN_TASKS_PER_THREAD;
    tasks = tasks < j.n_items ? tasks : j.n_items;
    tc.per_task = (j.n_items + tasks - 1) / tasks;
    tasks = (j.n_items + tc.per_task - 1) / tc.per_task;
    pool_run(c->par, attn_task, &tc, tasks);
    return INF_OK;
}

/* Sum over the rank's group (engine/tp/comm.h), in rank order: every rank
 * holds the same bits; a backend of no group is a group of one. */
static inf_status_t cpu_all_reduce(struct eng_backend *be, struct eng_mat x, int32_t dim,
                                   int32_t m, struct inf_err *err)
{
    struct cpu_ctx *c = be->ctx;
    if (!c->comm)
        return INF_OK;
    return eng_comm_all_reduce_f32(c->comm, fptr(x), x.ld, m, dim, err);
}

/* ---- table ------------------------------------------------------------------ */
static void cpu_destroy(struct eng_backend *be)
{
    struct cpu_ctx *c = be->ctx;
    eng_par_destroy(c->par);
    free(c->scratch);
    free(c->rows);
    free(c->gather);
    free(c);
    free(be);
}

static const struct eng_backend_iface cpu_iface = {
    .name = "cpu",
    .destroy = cpu_destroy,
    .buf_alloc = cpu_buf_alloc,
    .buf_free = cpu_buf_free,
    .buf_upload = cpu_buf_upload,
    .buf_download = cpu_buf_download,
    .weight_q4_create = cpu_weight_q4_create,
    .weight_q4_destroy = cpu_weight_q4_destroy,
    .linear_q4 = cpu_linear_q4,
    .linear_fp = cpu_linear_fp,
    .embedding = cpu_embedding,
    .rmsnorm_add = cpu_rmsnorm_add,
    .rope = cpu_rope,
    .attn_prefill = cpu_attn,
    .attn_decode = cpu_attn,
    .silu_mul = cpu_silu_mul,
    .rows_gather = cpu_rows_gather,
    .all_reduce = cpu_all_reduce,
};

inf_status_t eng_backend_cpu_create(const struct eng_backend_cpu_opts *opts,
                                    struct eng_backend **out, struct inf_err *err)
{
    *out = NULL;
    int32_t n = opts ? opts->n_threads : 0;
    if (n < 0 || n > 1024)
        return inf_err_set(err, INF_E_INVALID, "threads must be in [0, 1024], got %d", n);
    if (n == 0) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        n = cores > 0 ? (int32_t)(cores < 1024 ? cores : 1024) : 1;
    }
    struct eng_backend *be = calloc(1, sizeof *be);
    struct cpu_ctx *c = calloc(1, sizeof *c);
    if (!be || !c)
        goto fail_mem;
    if (eng_par_create(n, &c->par, err) != INF_OK) {
        free(c);
        free(be);
        return INF_E_NOMEM;
    }
    /* a thread that could not be started leaves the pool smaller */
    c->n_threads = eng_par_size(c->par);
    c->comm = opts ? opts->comm : NULL;
    be->iface = &cpu_iface;
    be->act_dtype = ENG_ACT_F32;
    be->kv_dtype = ENG_ACT_F32;
    be->ctx = c;
    *out = be;
    return INF_OK;
fail_mem:
    free(c);
    free(be);
    return inf_err_set(err, INF_E_NOMEM, "out of memory creating the CPU backend");
}

int32_t eng_backend_cpu_threads(const struct eng_backend *be)
{
    const struct cpu_ctx *c = be->ctx;
    return c->n_threads;
}
