/* engine/cpu/backend_cpu.c — the CPU backend: the reference every other backend
 * is tested against. fp32 activations and KV; buffers are plain host memory;
 * ops are split over a thread pool owned by the backend (engine/par.h; one
 * thread per core by default), the calling thread included.
 *
 * Work split: static, one contiguous share per thread (eng_par_each):
 * linear layers over output columns (so each thread streams its own slice
 * of the weight, and the same slice at every step, which then stays in its
 * core's cache), row ops over rows, attention over tokens or, when there
 * are few, over ranges of heads. An op too small to pay for a hand-off runs on the calling
 * thread alone. Every output element is computed by the same code in the
 * same order whatever the split, so results do not depend on the thread
 * count or on the batch. */
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

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- work on the backend's thread pool ------------------------------------
 * run_each(c, par, fn, ctx) calls fn(ctx, id, n) on each of the pool's n
 * threads (id 0 the caller) when par, else fn(ctx, 0, 1) on the caller;
 * it returns when all are done. */
typedef void (*each_fn)(void *ctx, int32_t id, int32_t n);

struct each_job {
    each_fn fn;
    void *ctx;
};

static void each_tramp(void *arg, int64_t id, int64_t n)
{
    const struct each_job *j = arg;
    j->fn(j->ctx, (int32_t)id, (int32_t)n);
}

/* ---- backend state -------------------------------------------------------- */
struct cpu_ctx {
    struct eng_comm *comm; /* a tensor-parallel rank's, or NULL */
    eng_par_t *par;
    int32_t n_threads; /* the pool's threads, the caller included */
    bool profile;
    struct eng_cpu_prof prof;
    float *scratch;         /* attention scratch (cpu_attn) */
    int64_t scratch_floats; /* its size */
    int32_t *rows;          /* attention row lists: [3][rows_cap] */
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

static void run_each(struct cpu_ctx *c, bool par, each_fn fn, void *ctx)
{
    if (!par || c->n_threads == 1) {
        fn(ctx, 0, 1);
        return;
    }
    struct each_job j = {.fn = fn, .ctx = ctx};
    eng_par_each(c->par, each_tramp, &j);
}

/* ---- profile ----------------------------------------------------------------
 * With the profile on, every op's wall time (the hand-off included) goes to
 * the entry of its name and weight shape. */
static uint64_t prof_begin(const struct cpu_ctx *c)
{
    return c->profile ? inf_now_ns() : 0;
}

static void prof_end(struct cpu_ctx *c, uint64_t t0, const char *op, int32_t n, int32_t k)
{
    if (!c->profile)
        return;
    uint64_t dt = inf_now_ns() - t0;
    struct eng_cpu_prof *p = &c->prof;
    int32_t i = 0;
    while (i < p->n_ops && !(p->ops[i].n == n && p->ops[i].k == k && !strcmp(p->ops[i].name, op)))
        i++;
    if (i == p->n_ops) {
        if (i == ENG_CPU_PROF_OPS)
            return;
        p->n_ops++;
        snprintf(p->ops[i].name, sizeof p->ops[i].name, "%s", op);
        p->ops[i].n = n;
        p->ops[i].k = k;
    }
    p->ops[i].calls++;
    p->ops[i].ns += dt;
}

static float *fptr(struct eng_mat v)
{
    return (float *)v.buf->ptr + v.off;
}

/* Split [0, n) into `parts` near-equal ranges, their bounds multiples of
 * `align` (but the last); range i. */
static void split(int32_t n, int32_t parts, int32_t i, int32_t align, int32_t *a, int32_t *b)
{
    int64_t units = ((int64_t)n + align - 1) / align;
    int64_t u0 = units * i / parts, u1 = units * (i + 1) / parts;
    *a = (int32_t)(u0 * align < n ? u0 * align : n);
    *b = (int32_t)(u1 * align < n ? u1 * align : n);
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
enum lin_kind { LIN_Q4, LIN_F32, LIN_F16 };

struct linear_job {
    enum lin_kind kind;
    const struct krn_cpu_q4 *q4;
    const int32_t *perm; /* q4's column order, or NULL */
    float *gather;       /* [parts][GATHER_ROWS][q4->k] when perm */
    const void *w;
    int32_t n, k, m;
    const float *bias, *x;
    float *y;
    int64_t ldx, ldy;
};

/* Output columns [n0, n1) of j. */
static void linear_cols(const struct linear_job *j, int32_t n0, int32_t n1)
{
    if (j->kind == LIN_Q4)
        krn_cpu_linear_q4(j->q4, j->bias, j->x, j->ldx, j->y, j->ldy, j->m, n0, n1);
    else if (j->kind == LIN_F32)
        krn_cpu_linear_f32(j->w, j->k, j->bias, j->x, j->ldx, j->y, j->ldy, j->m, n0, n1);
    else
        krn_cpu_linear_f16(j->w, j->k, j->bias, j->x, j->ldx, j->y, j->ldy, j->m, n0, n1);
}

/* Thread id's columns: bounds on multiples of 16 outputs, so no two threads
 * write into one cache line of y. */
static void linear_task(void *ctx, int32_t id, int32_t n_threads)
{
    const struct linear_job *j = ctx;
    int32_t n0, n1;
    split(j->n, n_threads, id, 16, &n0, &n1);
    if (n0 < n1)
        linear_cols(j, n0, n1);
}

/* Below this many multiply-adds a linear runs on the calling thread alone:
 * a hand-off costs about a microsecond, this work a few. */
#define LINEAR_PAR_MIN 32768

static bool linear_par(const struct linear_job *j)
{
    return (int64_t)j->n * j->m * j->k >= LINEAR_PAR_MIN && j->n >= 32;
}

static void linear_run(struct cpu_ctx *c, struct linear_job *j)
{
    static const char *const names[] = {"linear_q4", "linear_f32", "linear_f16"};
    uint64_t t0 = prof_begin(c);
    run_each(c, linear_par(j), linear_task, j);
    prof_end(c, t0, names[j->kind], j->n, j->k);
}

/* The job of INT4 weight w from x into y: every INT4 linear of the backend
 * (cpu_linear_q4, the MLP slot) is built here. The rows the kernel reads
 * are x's own; a weight whose columns were reordered when it was quantized
 * would gather x's columns into scratch here and point the job at it. */
static struct linear_job q4_job(const struct eng_q4w *w, const struct eng_buf *bias,
                                struct eng_mat x, struct eng_mat y, int32_t m)
{
    return (struct linear_job){.kind = LIN_Q4,
                               .q4 = &((const struct cpu_q4 *)w->impl)->w,
                               .n = w->n,
                               .k = w->k,
                               .m = m,
                               .bias = bias ? bias->ptr : NULL,
                               .x = fptr(x),
                               .y = fptr(y),
                               .ldx = x.ld,
                               .ldy = y.ld};
}

/* Activations are fp32 here: y_f32 asks for what every output already is. */
static inf_status_t cpu_linear_q4(struct eng_backend *be, const struct eng_q4w *w,
                                  const struct eng_buf *bias, struct eng_mat x, struct eng_mat y,
                                  bool y_f32, int32_t m, struct inf_err *err)
{
    (void)err;
    (void)y_f32;
    struct cpu_ctx *c = ctx_of(be);
    struct linear_job j = q4_job(w, bias, x, y, m);
    const int32_t *perm = ((const struct cpu_q4 *)w->impl)->perm;
    if (!perm) {
        linear_run(c, &j);
        return INF_OK;
    }
    /* x[:, perm] a chunk of rows at a time on this thread, then the chunk's
     * linear on every thread; each output is accumulated as without the
     * chunks (kernels/linear.h) */
    const int32_t chunk = GATHER_ROWS * c->n_threads;
    for (int32_t r0 = 0; r0 < m; r0 += chunk) {
        struct linear_job part = j;
        part.m = m - r0 < chunk ? m - r0 : chunk;
        krn_cpu_gather_cols(j.x + r0 * j.ldx, j.ldx, perm, j.k, c->gather, j.k, part.m);
        part.x = c->gather;
        part.ldx = j.k;
        part.y = j.y + r0 * j.ldy;
        linear_run(c, &part);
    }
    return INF_OK;
}

/* The job of linear l (INT4 or fp) from x into y. */
static struct linear_job linear_job_of(const struct eng_linear *l, struct eng_mat x,
                                       struct eng_mat y, int32_t m)
{
    if (l->q4)
        return q4_job(l->q4, l->bias, x, y, m);
    return (struct linear_job){.kind = l->wdt == ENG_W_F16 ? LIN_F16 : LIN_F32,
                               .w = l->w->ptr,
                               .n = l->n,
                               .k = l->k,
                               .m = m,
                               .bias = l->bias ? l->bias->ptr : NULL,
                               .x = fptr(x),
                               .y = fptr(y),
                               .ldx = x.ld,
                               .ldy = y.ld};
}

static inf_status_t cpu_linear_fp(struct eng_backend *be, const struct eng_buf *w,
                                  enum eng_wdtype wdt, int32_t n, int32_t k,
                                  const struct eng_buf *bias, struct eng_mat x, struct eng_mat y,
                                  bool y_f32, int32_t m, struct inf_err *err)
{
    (void)err;
    (void)y_f32; /* activations are fp32 here: both outputs are the same */
    /* the job reads the weight and bias, never writes them */
    const struct eng_linear l = {
        .n = n, .k = k, .w = (struct eng_buf *)w, .wdt = wdt, .bias = (struct eng_buf *)bias};
    struct linear_job j = linear_job_of(&l, x, y, m);
    linear_run(ctx_of(be), &j);
    return INF_OK;
}

/* ---- embedding, norm, rope, silu, gather: row-parallel ------------------- */
struct rows_job {
    int32_t op, m, dim, n_heads;
    const void *table;
    enum eng_wdtype wdt;
    const int32_t *ids;
    float *x, *out;
    const float *delta, *w, *inv_freq, *up;
    int64_t ldx, ldd, ldo, ldu;
    float eps;
};

enum { OP_EMBED, OP_NORM, OP_ROPE, OP_SILU, OP_GATHER };

static void rows_task(void *ctx, int32_t id, int32_t n_threads)
{
    const struct rows_job *j = ctx;
    int32_t r0, r1;
    split(j->m, n_threads, id, 1, &r0, &r1);
    if (r0 >= r1)
        return;
    switch (j->op) {
    case OP_EMBED:
        if (j->wdt == ENG_W_F16)
            krn_cpu_embed_f16(j->table, j->dim, j->ids, j->out, j->ldo, r0, r1);
        else
            krn_cpu_embed_f32(j->table, j->dim, j->ids, j->out, j->ldo, r0, r1);
        break;
    case OP_NORM:
        krn_cpu_rmsnorm_add(j->x, j->ldx, j->delta, j->ldd, j->w, j->ids, j->eps, j->out, j->ldo,
                            j->dim, r0, r1);
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
    static const char *const names[] = {"embedding", "rmsnorm_add", "rope", "silu_mul",
                                        "rows_gather"};
    uint64_t t0 = prof_begin(c);
    /* Small row ops are not worth a hand-off. */
    run_each(c, (int64_t)j->m * j->dim >= 16384 && j->m > 1, rows_task, j);
    prof_end(c, t0, names[j->op], 0, 0);
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
                                    const struct eng_mat *delta, const struct eng_buf *w,
                                    const struct eng_buf *perm, float eps, struct eng_mat out,
                                    int32_t dim, int32_t m, struct inf_err *err)
{
    (void)err;
    struct rows_job j = {.op = OP_NORM,
                         .ids = perm ? perm->ptr : NULL, /* the output's column order */
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

/* ---- attention ---------------------------------------------------------------
 * Attention is computed in chunks of KRN_ATTN_CHUNK positions and their
 * combine (kernels/attention.h), which fixes the arithmetic whatever the
 * split. With many tokens, thread id takes token rows id, id + n, ...
 * with all their heads and chunks (causal prefill rows cost more as they
 * go; interleaving evens that out). With few (a decode step), the rows'
 * chunks are shared out as contiguous runs, each with all the heads, so a
 * thread reads whole pool rows of its own positions: split by heads
 * instead, two threads would each read every other piece of every row,
 * which from memory ran at half the speed of one thread alone (12 heads,
 * 200 positions: 1608-1669 us against 858-938 us for 12 layers). Their
 * records are combined once all are in. Heads are split as well only when
 * there are fewer chunks than threads. */
struct attn_job {
    const struct eng_attn_params *p;
    struct cpu_ctx *c;
    const int32_t *seqs, *pos, *bt;
    int32_t n_rows;                   /* tokens covered */
    const int32_t *row_tok, *row_seq; /* per row: batch token and its sequence */
    int32_t nch;                      /* chunks of the longest context (its window) */
    int32_t n_items, groups;          /* few rows: (row, chunk, head group) items */
    const int32_t *row_item;          /* few rows: each row's first item, [n_rows + 1] */
    float *rec;                       /* few rows: records [row][chunk][head][head_dim + 2] */
    struct krn_kv_pools kv;           /* the layer's pools: fp32, or E4M3 with its scales */
};

/* Validate the tables (they are caller data) and count the tokens. */
static inf_status_t attn_tables(const struct eng_attn_params *p, int32_t *n_tok, int32_t *max_ctx,
                                struct inf_err *err)
{
    return eng_attn_tables_check(p, p->pos->ptr, (int64_t)(p->pos->size / 4), p->seqs->ptr,
                                 p->block_table->ptr, false, n_tok, max_ctx, err);
}

/* Thread id's sequences: their K/V rows into the pools. */
static void kv_write_task(void *ctx, int32_t id, int32_t n_threads)
{
    const struct attn_job *j = ctx;
    const struct eng_attn_params *p = j->p;
    int32_t s0, s1;
    split(p->n_seqs, n_threads, id, 1, &s0, &s1);
    for (int32_t s = s0; s < s1; s++) {
        int32_t t0 = j->seqs[3 * s], nt = j->seqs[3 * s + 1], slot = j->seqs[3 * s + 2];
        const int32_t *blocks = j->bt + (int64_t)slot * p->max_blocks;
        for (int32_t t = t0; t < t0 + nt; t++) {
            const float *k = fptr(p->k) + (int64_t)t * p->k.ld,
                        *v = fptr(p->v) + (int64_t)t * p->v.ld;
            if (j->kv.k8)
                krn_cpu_kv_write_e4m3(p->k_cache->ptr, p->v_cache->ptr, blocks, ENG_KV_BLOCK,
                                      p->n_kv_heads, p->head_dim, j->pos[t], k, v, p->k_scale,
                                      p->v_scale);
            else
                krn_cpu_kv_write(p->k_cache->ptr, p->v_cache->ptr, blocks, ENG_KV_BLOCK,
                                 p->n_kv_heads, p->head_dim, j->pos[t], k, v);
        }
    }
}

static const int32_t *row_blocks(const struct attn_job *j, int32_t r)
{
    return j->bt + (int64_t)j->seqs[3 * j->row_seq[r] + 2] * j->p->max_blocks;
}

/* Floats of one thread's scratch: scores, then a row's records. */
static int64_t attn_thread_floats(const struct eng_attn_params *p, int32_t nch)
{
    return (int64_t)p->n_heads * (KRN_ATTN_CHUNK + (int64_t)nch * (p->head_dim + 2));
}

static void attn_task(void *ctx, int32_t id, int32_t n_threads)
{
    const struct attn_job *j = ctx;
    const struct eng_attn_params *p = j->p;
    const int32_t H = p->n_heads, hd = p->head_dim;
    float *scratch = j->c->scratch + (int64_t)id * attn_thread_floats(p, j->nch);
    if (!j->rec) {
        for (int32_t r = id; r < j->n_rows; r += n_threads) {
            int32_t t = j->row_tok[r];
            krn_cpu_attn_heads(fptr(p->q) + (int64_t)t * p->q.ld, &j->kv, row_blocks(j, r),
                               ENG_KV_BLOCK, H, p->n_kv_heads, hd, 0, H,
                               eng_attn_first_key(p->window, j->pos[t]), j->pos[t] + 1, p->scale,
                               scratch, fptr(p->out) + (int64_t)t * p->out.ld);
        }
        return;
    }
    int32_t i0, i1, r = 0;
    split(j->n_items, n_threads, id, 1, &i0, &i1);
    for (int32_t i = i0; i < i1; i++) {
        while (i >= j->row_item[r + 1])
            r++;
        const int32_t t = j->row_tok[r], n_ctx = j->pos[t] + 1, k = i - j->row_item[r];
        const int32_t c = k / j->groups, g = k % j->groups;
        const int32_t h0 = (int32_t)((int64_t)H * g / j->groups);
        const int32_t h1 = (int32_t)((int64_t)H * (g + 1) / j->groups);
        /* chunk c of the row's window: fixed by position, the first cut at
         * its first key */
        const int32_t lo = eng_attn_first_key(p->window, j->pos[t]);
        int32_t p0 = (lo / KRN_ATTN_CHUNK + c) * KRN_ATTN_CHUNK;
        const int32_t p1 = n_ctx - p0 < KRN_ATTN_CHUNK ? n_ctx : p0 + KRN_ATTN_CHUNK;
        p0 = p0 < lo ? lo : p0;
        float *rec = j->rec + (((int64_t)r * j->nch + c) * H + h0) * (hd + 2);
        krn_cpu_attn_chunk(fptr(p->q) + (int64_t)t * p->q.ld, &j->kv, row_blocks(j, r),
                           ENG_KV_BLOCK, H, p->n_kv_heads, hd, h0, h1, p0, p1, p->scale, scratch,
                           rec, hd + 2);
    }
}

/* Below this many (head, position) pairs attention runs on the calling
 * thread alone. */
#define ATTN_PAR_MIN 256

static inf_status_t cpu_attn(struct eng_backend *be, const struct eng_attn_params *p,
                             struct inf_err *err)
{
    struct cpu_ctx *c = ctx_of(be);
    uint64_t t0 = prof_begin(c);
    int32_t n_tok;
    inf_status_t st = attn_tables(p, &n_tok, NULL, err);
    if (st != INF_OK)
        return st;
    if (be->kv_dtype == ENG_ACT_E4M3 && p->head_dim > KRN_ATTN_MAX_HEAD_DIM)
        return inf_err_set(err, INF_E_UNSUPPORTED, "attention: fp8 KV takes head_dim <= %d, got %d",
                           KRN_ATTN_MAX_HEAD_DIM, p->head_dim);
    const int32_t *pos = p->pos->ptr, *seqs = p->seqs->ptr;
    int32_t nch = 0; /* chunks of the longest context, within its window */
    for (int32_t s = 0; s < p->n_seqs; s++)
        for (int32_t t = seqs[3 * s]; t < seqs[3 * s] + seqs[3 * s + 1]; t++) {
            int32_t n = krn_attn_chunks_from(eng_attn_first_key(p->window, pos[t]), pos[t] + 1);
            nch = n > nch ? n : nch;
        }
    const int32_t T = c->n_threads, H = p->n_heads;
    const bool few = n_tok < 2 * T;
    /* Scratch (every thread's, then the records of a few rows) and the row
     * lists grow with the longest context and largest batch seen, at least
     * doubling (a decode's context grows by one position a step), then
     * stay: steady-state steps allocate nothing. */
    int64_t need =
        T * attn_thread_floats(p, nch) + (few ? (int64_t)n_tok * nch * H * (p->head_dim + 2) : 0);
    if (need > c->scratch_floats) {
        int64_t cap = need > 2 * c->scratch_floats ? need : 2 * c->scratch_floats;
        float *s = realloc(c->scratch, (size_t)cap * sizeof(float));
        if (!s)
            return inf_err_set(err, INF_E_NOMEM, "out of memory for attention scratch");
        c->scratch = s;
        c->scratch_floats = cap;
    }
    if (n_tok + 1 > c->rows_cap) {
        int32_t cap = n_tok + 1 > 2 * c->rows_cap ? n_tok + 1 : 2 * c->rows_cap;
        int32_t *r = realloc(c->rows, (size_t)cap * 3 * sizeof(int32_t));
        if (!r)
            return inf_err_set(err, INF_E_NOMEM, "out of memory for attention rows");
        c->rows = r;
        c->rows_cap = cap;
    }
    int32_t *rows = c->rows;
    struct attn_job j = {.p = p,
                         .c = c,
                         .seqs = p->seqs->ptr,
                         .pos = p->pos->ptr,
                         .bt = p->block_table->ptr,
                         .n_rows = n_tok,
                         .row_tok = rows,
                         .row_seq = rows + c->rows_cap,
                         .nch = nch};
    if (be->kv_dtype == ENG_ACT_E4M3)
        j.kv = (struct krn_kv_pools){.k8 = p->k_cache->ptr,
                                     .v8 = p->v_cache->ptr,
                                     .k_scale = p->k_scale,
                                     .v_scale = p->v_scale};
    else
        j.kv = (struct krn_kv_pools){.k = p->k_cache->ptr, .v = p->v_cache->ptr};
    int32_t *row_item = rows + 2 * c->rows_cap;
    int32_t r = 0, chunks = 0;
    int64_t work = 0;
    for (int32_t s = 0; s < p->n_seqs; s++)
        for (int32_t t = j.seqs[3 * s]; t < j.seqs[3 * s] + j.seqs[3 * s + 1]; t++) {
            rows[r] = t;
            rows[c->rows_cap + r] = s;
            const int32_t lo = eng_attn_first_key(p->window, j.pos[t]);
            work += j.pos[t] + 1 - lo;
            chunks += krn_attn_chunks_from(lo, j.pos[t] + 1);
            r++;
        }
    const bool par = work * H >= ATTN_PAR_MIN && (n_tok > 1 || H > 1);
    if (few) {
        j.groups = par && chunks < T ? (T + chunks - 1) / chunks : 1;
        j.groups = j.groups < H ? j.groups : H;
        for (r = 0, row_item[0] = 0; r < n_tok; r++)
            row_item[r + 1] =
                row_item[r] + krn_attn_chunks_from(eng_attn_first_key(p->window, j.pos[rows[r]]),
                                                   j.pos[rows[r]] + 1) *
                                  j.groups;
        j.n_items = row_item[n_tok];
        j.row_item = row_item;
        j.rec = c->scratch + T * attn_thread_floats(p, nch);
    }
    /* every token's K/V is in place before any token attends */
    run_each(c, n_tok > 64, kv_write_task, &j);
    run_each(c, par, attn_task, &j);
    for (r = 0; few && r < n_tok; r++) {
        const int32_t t = rows[r], n = krn_attn_chunks_from(eng_attn_first_key(p->window, j.pos[t]),
                                                            j.pos[t] + 1);
        for (int32_t h = 0; h < H; h++)
            krn_cpu_attn_combine(j.rec + ((int64_t)r * nch * H + h) * (p->head_dim + 2),
                                 (int64_t)H * (p->head_dim + 2), n, p->head_dim,
                                 fptr(p->out) + (int64_t)t * p->out.ld + (int64_t)h * p->head_dim);
    }
    prof_end(c, t0, n_tok == p->n_seqs ? "attn_decode" : "attn_prefill", 0, 0);
    return INF_OK;
}

/* Sum over the rank's group (engine/tp/comm.h), in rank order: every rank
 * holds the same bits; a backend of no group is a group of one. */
static inf_status_t cpu_all_reduce(struct eng_backend *be, struct eng_mat x, int32_t dim, int32_t m,
                                   struct inf_err *err)
{
    struct cpu_ctx *c = be->ctx;
    if (!c->comm)
        return INF_OK;
    return eng_comm_all_reduce_f32(c->comm, fptr(x), x.ld, m, dim, err);
}

/* ---- the MLP half of a layer ------------------------------------------------
 * Gate/up and SiLU*mul as one job: each thread computes gate columns
 * [a, b) and the matching up columns [I + a, I + b) of the fused weight,
 * then h[:, a:b] from them, so SiLU*mul runs on every thread, on outputs
 * still in the cache of the core that made them (the plain ops give one
 * thread all the gate columns and the other all the up columns, and SiLU*mul
 * then pulls half of them across). Down, the all-reduce and the norm are the
 * composition's (eng_mlp_block_tail). Every output of the kernels and of
 * SiLU*mul is the same whatever range it is computed in, so the result is
 * the composition's, bit for bit. */
struct glu_job {
    struct linear_job lin; /* the fused [gate; up], into gu_out */
    int32_t inter;
    float *h;
    int64_t ldh;
};

static void glu_task(void *ctx, int32_t id, int32_t n_threads)
{
    const struct glu_job *j = ctx;
    int32_t a, b;
    split(j->inter, n_threads, id, 16, &a, &b);
    if (a >= b)
        return;
    linear_cols(&j->lin, a, b);
    linear_cols(&j->lin, j->inter + a, j->inter + b);
    krn_cpu_silu_mul(j->lin.y + a, j->lin.ldy, j->lin.y + j->inter + a, j->lin.ldy, j->h + a,
                     j->ldh, b - a, 0, j->lin.m);
}

static inf_status_t cpu_mlp_block(struct eng_backend *be, const struct eng_mlp_block *p,
                                  struct inf_err *err)
{
    const struct eng_linear *gu = p->gu[0];
    /* an act-order gate/up gathers its x first: the plain ops do that */
    if (p->n_gu != 1 || gu->glu || (gu->q4 && ((const struct cpu_q4 *)gu->q4->impl)->perm))
        return eng_mlp_block_compose(be, p, err);
    struct cpu_ctx *c = ctx_of(be);
    uint64_t t0 = prof_begin(c);
    struct glu_job j = {.lin = linear_job_of(gu, p->xn, p->gu_out, p->m),
                        .inter = p->inter,
                        .h = fptr(p->h),
                        .ldh = p->h.ld};
    run_each(c, linear_par(&j.lin), glu_task, &j);
    prof_end(c, t0, "gate_up_silu", j.lin.n, j.lin.k);
    return eng_mlp_block_tail(be, p, err);
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
    .mlp_block = cpu_mlp_block,
    .all_reduce = cpu_all_reduce,
};

inf_status_t eng_backend_cpu_create(const struct eng_backend_cpu_opts *opts,
                                    struct eng_backend **out, struct inf_err *err)
{
    *out = NULL;
    int32_t n = opts ? opts->n_threads : 0;
    if (n < 0 || n > 1024)
        return inf_err_set(err, INF_E_INVALID, "threads must be in [0, 1024], got %d", n);
    /* 0: one thread per core this process may run on, which measures
     * fastest for decode (docs/PERF.md, "CPU decode") */
    if (n == 0)
        n = eng_par_threads(0);
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
    be->kv_dtype = opts && opts->kv_fp8 ? ENG_ACT_E4M3 : ENG_ACT_F32;
    /* the x86-64 kernels widen fp16 weights as they load them, which costs
     * nothing next to reading twice the bytes; the portable loop converts
     * each one in software, so it gets them as fp32 */
    be->f16_as_f32 = krn_cpu_isa_get() == KRN_ISA_PORTABLE;
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

void eng_backend_cpu_profile(struct eng_backend *be, bool on)
{
    struct cpu_ctx *c = be->ctx;
    memset(&c->prof, 0, sizeof c->prof);
    c->profile = on;
    eng_par_profile(c->par, on);
}

void eng_backend_cpu_profile_read(const struct eng_backend *be, struct eng_cpu_prof *out)
{
    const struct cpu_ctx *c = be->ctx;
    *out = c->prof;
    eng_par_stats(c->par, &out->handoffs, &out->handoff_wait_ns);
}
