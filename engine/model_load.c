/* engine/model_load.c — a Llama-family checkpoint onto a backend: each
 * linear quantized to INT4, repacked from an INT4 checkpoint's own tensors
 * (engine/weights/packed.h) or kept in fp16/fp32, then repacked by the
 * backend; the norms, embedding and lm_head, the activation and index
 * buffers of the forward step (engine/model.c) and the KV pools. */
#define INF_LOG_MODULE "eng"
#include "engine/model_impl.h"
#include "engine/par.h"
#include "engine/weights/kv_scale.h"
#include "engine/weights/packed.h"
#include "engine/weights/quant.h"
#include "engine/weights/safetensors.h"

#include <fnmatch.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const default_keep[] = {"model.embed_tokens.*", "lm_head.*"};

void eng_model_opts_default(struct eng_model_opts *o)
{
    memset(o, 0, sizeof *o);
    o->quant = ENG_QUANT_AUTO;
    o->group_size = 128;
    o->symmetric = false;
    o->fuse_qkv = true;
    o->keep_fp16 = NULL;
    o->n_keep_fp16 = 0;
    o->max_tokens = 512;
    o->n_kv_blocks = 256;
    o->max_slots = 0;
    o->max_seq_blocks = 0;
    o->decode_graphs = ENG_GRAPHS_ON;
    o->load_threads = 0;
}

/* ---- loading -------------------------------------------------------------- */

/* Read tensor name of shape [rows][cols] (cols 0 for 1-D) into dst as f32. */
static inf_status_t read_tensor(const eng_st_t *st, const char *name, int64_t rows, int64_t cols,
                                float *dst, struct inf_err *err)
{
    int64_t shape[2] = {rows, cols};
    const struct eng_st_tensor *t;
    inf_status_t s = eng_st_require(st, name, cols ? 2 : 1, shape, &t, err);
    if (s != INF_OK)
        return s;
    return eng_st_read_f32(t, 0, t->numel, dst, err);
}

static bool keep_fp(const struct eng_model *m, const char *const *names, int32_t n_names)
{
    const char *const *pat = m->opts.keep_fp16 ? m->opts.keep_fp16 : default_keep;
    int32_t np = m->opts.keep_fp16 ? m->opts.n_keep_fp16 : 2;
    for (int32_t i = 0; i < np; i++)
        for (int32_t j = 0; j < n_names; j++)
            if (fnmatch(pat[i], names[j], 0) == 0)
                return true;
    return false;
}

/* A new zeroed layer record, or NULL on out of memory. */
static struct eng_layer_info *add_info(struct eng_model *m)
{
    if (m->n_info == m->cap_info) {
        int32_t cap = m->cap_info ? 2 * m->cap_info : 16;
        struct eng_layer_info *p = realloc(m->info, (size_t)cap * sizeof *p);
        if (!p)
            return NULL;
        m->info = p;
        m->cap_info = cap;
    }
    struct eng_layer_info *r = &m->info[m->n_info++];
    memset(r, 0, sizeof *r);
    return r;
}

/* fp weights are rounded to fp16 under INT4 (the layers kept, and those an
 * INT4 checkpoint stores in floating point) and on backends with fp16
 * activations (a GPU serving quantization none), else kept in fp32. */
static bool fp_round16(const struct eng_model *m)
{
    return m->mode != LOAD_FP || m->be->act_dtype == ENG_ACT_F16;
}

/* Their dtype on the backend: fp16 where rounded, except that a backend
 * that reads fp16 slowly (be->f16_as_f32) gets the same fp16 values as
 * fp32, converted here once. */
static enum eng_wdtype fp_wdt(const struct eng_model *m)
{
    if (m->be->act_dtype == ENG_ACT_F16)
        return ENG_W_F16;
    return fp_round16(m) && !m->be->f16_as_f32 ? ENG_W_F16 : ENG_W_F32;
}

/* The rows of one linear layer as they lie in the checkpoint: the parts'
 * float tensors ([rows[i]][k] each) stacked in order (q | k | v when
 * fused), or (q4 set) the layer already in the canonical INT4 form, as an
 * INT4 checkpoint stores it. */
struct src {
    const struct eng_st_tensor *t[3];
    int32_t rows[3];
    int64_t row0[3]; /* the first row of tensor t[i] taken (a rank's rows) */
    int32_t np;
    int32_t k;
    int32_t ld, c0; /* the tensors' columns (0: k) and the first one taken */
    const struct krn_q4_weight *q4;
};

/* The tensor holding row r of s, and the element offset of that row in it. */
static const struct eng_st_tensor *src_row(const struct src *s, int64_t r, int64_t *first)
{
    int32_t i = 0;
    while (i < s->np - 1 && r >= s->rows[i])
        r -= s->rows[i++];
    *first = (s->row0[i] + r) * (s->ld ? s->ld : s->k) + s->c0;
    return s->t[i];
}

/* What a rank takes of one linear (engine/tp/shard.h): rows of each part
 * (column-parallel), or columns [c0, c1) (row-parallel); NULL: all of it. */
struct shard {
    bool cols;
    struct eng_rows rows[3];
    int32_t c0, c1;
};

/* Work shared by the load threads over the rows of one weight: convert each
 * row from the checkpoint and quantize it (q set) or store it as fp16 / fp32
 * (host set). Errors keep the one of the lowest row, whatever the threads. */
struct rows_job {
    const struct src *src;
    struct krn_q4_weight *q;
    void *host;
    enum eng_wdtype wdt;
    bool round16; /* fp32 host rows holding fp16-rounded values */
    pthread_mutex_t mu;
    int64_t err_row;
    inf_status_t st;
    struct inf_err err;
};

static void rows_fail(struct rows_job *j, int64_t r, inf_status_t st, const struct inf_err *e)
{
    pthread_mutex_lock(&j->mu);
    if (j->st == INF_OK || r < j->err_row) {
        j->st = st;
        j->err = *e;
        j->err_row = r;
    }
    pthread_mutex_unlock(&j->mu);
}

static void rows_run(void *arg, int64_t r0, int64_t r1)
{
    struct rows_job *j = arg;
    const int32_t k = j->src->k;
    struct inf_err e = {0};
    float *row = NULL;
    if ((j->q || j->round16) && !(row = malloc((size_t)k * sizeof(float)))) {
        inf_err_set(&e, INF_E_NOMEM, "out of memory converting a weight");
        rows_fail(j, r0, INF_E_NOMEM, &e);
        return;
    }
    for (int64_t r = r0; r < r1; r++) {
        int64_t first;
        const struct eng_st_tensor *t = src_row(j->src, r, &first);
        inf_status_t s;
        if (j->q) {
            s = eng_st_read_f32(t, first, k, row, &e);
            if (s == INF_OK)
                s = eng_q4_quantize_rows(row, (int32_t)r, 1, j->q, &e);
        } else if (j->wdt == ENG_W_F16) {
            s = eng_st_read_f16(t, first, k, (uint16_t *)j->host + r * k, &e);
        } else if (j->round16) {
            uint16_t *h = (uint16_t *)row; /* k halves fit in k floats */
            float *dst = (float *)j->host + r * k;
            s = eng_st_read_f16(t, first, k, h, &e);
            for (int32_t i = 0; s == INF_OK && i < k; i++)
                dst[i] = inf_f16_to_f32(h[i]);
        } else {
            s = eng_st_read_f32(t, first, k, (float *)j->host + r * k, &e);
        }
        if (s != INF_OK) {
            rows_fail(j, r, s, &e);
            break;
        }
    }
    free(row);
}

/* Rows of one weight on the load threads, 16 to a chunk. */
static inf_status_t rows_convert(struct eng_model *m, struct rows_job *j, int32_t n,
                                 struct inf_err *err)
{
    j->st = INF_OK;
    pthread_mutex_init(&j->mu, NULL);
    eng_par_run(m->par, n, 16, rows_run, j);
    pthread_mutex_destroy(&j->mu);
    if (j->st != INF_OK)
        return inf_err_set(err, j->st, "%s", j->err.msg);
    return INF_OK;
}

static double secs_since(uint64_t t0)
{
    return (double)(inf_now_ns() - t0) * 1e-9;
}

/* The rows of src converted to an fp buffer of dtype dt on the backend. */
static inf_status_t upload_fp(struct eng_model *m, const struct src *src, int32_t n,
                              enum eng_wdtype dt, struct eng_buf **out, struct inf_err *err)
{
    size_t bytes = (size_t)n * (size_t)src->k * eng_w_size(dt);
    uint64_t t0 = inf_now_ns();
    if (bytes > m->stage_bytes) {
        /* One host buffer for every fp weight of the load, grown to the
         * largest: its pages are faulted in once, not once per weight. */
        free(m->stage);
        m->stage_bytes = 0;
        if (!(m->stage = malloc(bytes)))
            return inf_err_set(err, INF_E_NOMEM, "out of memory converting a %dx%d weight", n,
                               src->k);
        m->stage_bytes = bytes;
    }
    struct rows_job j = {
        .src = src, .wdt = dt, .host = m->stage, .round16 = dt == ENG_W_F32 && fp_round16(m)};
    inf_status_t s = rows_convert(m, &j, n, err);
    m->t_convert += secs_since(t0);
    t0 = inf_now_ns();
    if (s == INF_OK)
        s = eng_buf_from_host(m->be, j.host, bytes, out, err);
    m->t_upload += secs_since(t0);
    return s;
}

/* An fp copy of an INT4 checkpoint's layer q (a layer keep_fp16 names):
 * its dequantized values, [n][k] in the caller's column order, as dtype dt
 * on the backend. */
static inf_status_t upload_dequantized(struct eng_model *m, const struct krn_q4_weight *q,
                                       enum eng_wdtype dt, struct eng_buf **out,
                                       struct inf_err *err)
{
    size_t count = (size_t)q->n * (size_t)q->k;
    float *w = malloc(count * sizeof *w);
    uint16_t *h = dt == ENG_W_F16 ? malloc(count * sizeof *h) : NULL;
    inf_status_t s;
    if (!w || (dt == ENG_W_F16 && !h)) {
        s = inf_err_set(err, INF_E_NOMEM, "out of memory dequantizing a %dx%d weight", q->n, q->k);
    } else {
        eng_q4_dequantize(q, w);
        for (size_t i = 0; h && i < count; i++)
            h[i] = inf_f32_to_f16(w[i]);
        s = eng_buf_from_host(m->be, h ? (void *)h : (void *)w, count * eng_w_size(dt), out, err);
    }
    free(w);
    free(h);
    return s;
}

/* The canonical weight q onto the backend as linear l: a gate/up pair the
 * backend can fuse with its SiLU·mul as one GLU weight (where it declines,
 * INF_E_UNSUPPORTED, a plain one). */
static inf_status_t q4_to_backend(struct eng_model *m, const struct krn_q4_weight *q,
                                  const float *bias, struct lin *l, struct inf_err *err)
{
    inf_status_t s = INF_OK;
    uint64_t t0 = inf_now_ns();
    if (l->lin.glu && !bias && q->n % 16 == 0 && eng_backend_has_glu(m->be)) {
        s = eng_weight_q4_create_glu(m->be, q, &l->lin.q4, err);
        if (s == INF_E_UNSUPPORTED) {
            inf_err_clear(err);
            s = INF_OK;
        }
    }
    l->lin.glu = l->lin.q4 != NULL;
    if (s == INF_OK && !l->lin.q4)
        s = eng_weight_q4_create(m->be, q, &l->lin.q4, err);
    m->t_q4_backend += secs_since(t0);
    return s;
}

/* Quantize and repack (or upload as fp) the rows of src, [n][k], as linear
 * `name`; a src already INT4 (src->q4) is repacked as it is. */
/* A row-parallel rank's columns [sh->c0, sh->c1) of the canonical weight
 * *q, in place (its lead recorded in l); q unchanged without sh. */
static inf_status_t q4_take_cols(const struct shard *sh, struct krn_q4_weight *q, struct lin *l,
                                 struct inf_err *err)
{
    if (!sh || !sh->cols)
        return INF_OK;
    struct krn_q4_weight part;
    inf_status_t s = eng_q4_take_cols(q, sh->c0, sh->c1, &part, &l->lead, err);
    if (s != INF_OK)
        return s;
    eng_q4_free(q);
    *q = part;
    return INF_OK;
}

/* A row-parallel rank's columns of q into *out: cut to them (after lead
 * zero columns), or for an act-order q, whose columns of one range are
 * spread over every group, the whole layer with the other columns reading
 * 0 and the rank's input placed among zeros (lead before, trail after). */
static inf_status_t q4_cut_cols(const struct krn_q4_weight *q, const struct shard *sh,
                                struct krn_q4_weight *out, struct lin *l, struct inf_err *err)
{
    if (!q->perm)
        return eng_q4_take_cols(q, sh->c0, sh->c1, out, &l->lead, err);
    l->lead = sh->c0;
    l->trail = q->k - sh->c1;
    return eng_q4_mask_cols(q, sh->c0, sh->c1, out, err);
}

static inf_status_t make_linear(struct eng_model *m, const char *name, const struct src *src,
                                int32_t n, const float *bias, bool keep, const struct shard *sh,
                                struct lin *l, struct inf_err *err)
{
    inf_status_t s;
    int32_t k = src->k;
    const bool split_k = sh && sh->cols;
    struct eng_layer_info *inf = add_info(m);
    if (!inf)
        return inf_err_set(err, INF_E_NOMEM, "out of memory for layer records");
    l->info = m->n_info - 1;
    l->lin.n = n;
    l->lin.k = k;
    snprintf(inf->name, sizeof inf->name, "%s", name);
    inf->n = n;
    inf->k = k;
    if (src->q4 && !keep) {
        /* a row-parallel shard of an INT4 checkpoint's layer: src->q4 is
         * the caller's, so the columns are cut from a copy */
        struct krn_q4_weight cut;
        memset(&cut, 0, sizeof cut);
        const struct krn_q4_weight *q = src->q4;
        if (split_k) {
            if ((s = q4_cut_cols(q, sh, &cut, l, err)))
                return s;
            q = &cut;
        }
        s = q4_to_backend(m, q, bias, l, err);
        inf->quantized = true;
        inf->from_ckpt = true;
        inf->act_order = q->perm != NULL;
        inf->k = l->lin.k = q->k;
        inf->kp = q->kp;
        inf->group = q->group;
        eng_q4_free(&cut);
        if (s != INF_OK)
            return s;
    } else if (m->mode == LOAD_RTN && !src->q4 && !keep) {
        /* quantized whole (a row-parallel rank's rows span all of K), then
         * the rank's columns taken: every tp computes tp 1's model */
        int32_t group = m->opts.group_size, kp = eng_q4_padded_k(k, group);
        struct krn_q4_weight q;
        if ((s = eng_q4_alloc(n, k, kp, group == 0 ? kp : group, m->opts.symmetric, &q, err)))
            return s;
        uint64_t t0 = inf_now_ns();
        struct rows_job j = {.src = src, .q = &q};
        s = rows_convert(m, &j, n, err);
        m->t_quantize += secs_since(t0);
        if (s == INF_OK)
            s = q4_take_cols(sh, &q, l, err);
        if (s == INF_OK)
            s = q4_to_backend(m, &q, bias, l, err);
        inf->quantized = true;
        inf->k = l->lin.k = q.k;
        inf->kp = q.kp;
        inf->group = q.group;
        eng_q4_free(&q);
        if (s != INF_OK)
            return s;
    } else {
        l->lin.glu = false;
        l->lin.wdt = fp_wdt(m);
        inf->fp_dtype = l->lin.wdt;
        uint64_t t0 = inf_now_ns();
        if (src->q4) {
            /* a row-parallel shard keeps its lead zero columns: the
             * dequantized lead is 0 as the INT4 one would be */
            struct krn_q4_weight cut;
            memset(&cut, 0, sizeof cut);
            const struct krn_q4_weight *q = src->q4;
            if (split_k && (s = q4_cut_cols(q, sh, &cut, l, err)))
                return s;
            if (split_k)
                q = &cut;
            inf->k = l->lin.k = q->k;
            s = upload_dequantized(m, q, l->lin.wdt, &l->lin.w, err);
            eng_q4_free(&cut);
            m->t_upload += secs_since(t0);
        } else {
            /* a row-parallel rank's columns, straight from the checkpoint */
            struct src cut = *src;
            if (split_k) {
                cut.ld = src->ld ? src->ld : src->k;
                cut.c0 = src->c0 + sh->c0;
                cut.k = sh->c1 - sh->c0;
            }
            inf->k = l->lin.k = cut.k;
            s = upload_fp(m, &cut, n, l->lin.wdt, &l->lin.w, err);
        }
        inf->kp = inf->k;
        if (s != INF_OK)
            return s;
    }
    if (bias)
        return eng_buf_from_host(m->be, bias, (size_t)n * 4, &l->lin.bias, err);
    return INF_OK;
}

/* Whether the INT4 parts q[0..np) can be stacked into one linear: the
 * same group and padding, and (act-order) the same column order, since one
 * gathered x feeds them all. */
static bool can_stack(const struct krn_q4_weight *q, int32_t np)
{
    for (int32_t i = 1; i < np; i++)
        if (q[i].group != q[0].group || q[i].kp != q[0].kp ||
            !eng_q4_perm_equal(q[i].perm, q[0].perm, q[0].k))
            return false;
    return true;
}

/* Load the parts (suffixes like "q_proj") of module prefix, each [n_i][k],
 * as one fused linear (fused) or one linear each into l[0..np). glu: the
 * parts are a gated MLP's gate and up, which a fused INT4 linear may serve
 * as one GLU op (struct lin, glu). Parts an INT4 checkpoint stores packed
 * are converted to the canonical form first; they are fused only when all
 * are packed alike (can_stack), else kept apart. */
/* What load_group takes besides the checkpoint (NULL: nothing): given, part
 * 0 already in the canonical form (load_group owns it from then on);
 * row_order, the order every packed part's rows are put in before a rank
 * takes its own: row i becomes the checkpoint's row row_order[i];
 * col_order, where an act-order group's column order goes instead of into
 * its linears when every part is packed with the same one (the caller's
 * RMSNorm then writes their input in that order, so no linear of the group
 * gathers; *col_order stays NULL otherwise, and the caller frees it). */
struct group_extra {
    struct krn_q4_weight *given;
    const int32_t *row_order;
    int32_t **col_order;
};

/* The column order shared by the packed parts q[0..np), taken out of them
 * into *order (ownership passes), when every part has the same one. */
static void take_col_order(struct krn_q4_weight *q, int32_t np, int32_t **order)
{
    for (int32_t i = 0; i < np; i++)
        if (!q[i].perm || !eng_q4_perm_equal(q[i].perm, q[0].perm, q[0].k))
            return;
    *order = q[0].perm;
    q[0].perm = NULL;
    for (int32_t i = 1; i < np; i++) {
        free(q[i].perm);
        q[i].perm = NULL;
    }
}

static inf_status_t load_group(struct eng_model *m, const eng_st_t *st, const char *prefix,
                               const char *const *parts, const int32_t *rows, int32_t np, int32_t k,
                               bool with_bias, const char *fused_name, bool glu,
                               const struct shard *sh, const struct group_extra *ex, struct lin *l,
                               int32_t *n_lin, struct inf_err *err)
{
    /* a column-parallel rank's rows of each part (all of them otherwise) */
    struct eng_rows take[3];
    int64_t total = 0, full = 0;
    for (int32_t i = 0; i < np; i++) {
        take[i] = sh && !sh->cols ? sh->rows[i] : (struct eng_rows){0, rows[i]};
        total += take[i].count;
        full += rows[i];
    }
    const struct shard *cols = sh && sh->cols ? sh : NULL;
    float *b = with_bias ? malloc((size_t)full * sizeof(float)) : NULL;
    inf_status_t s = INF_OK;
    char names[3][256];
    const char *name_ptrs[4];
    struct src all = {.np = np, .k = k};
    struct krn_q4_weight q[3];
    struct eng_qlayer lq;
    int32_t n_packed = 0;
    bool packed[3] = {false, false, false};
    memset(q, 0, sizeof q);
    if (with_bias && !b)
        return inf_err_set(err, INF_E_NOMEM, "out of memory loading %s", prefix);
    int64_t r0 = 0;
    for (int32_t i = 0; i < np; i++) {
        char bn[256], mod[240];
        int64_t shape[2] = {rows[i], k};
        snprintf(mod, sizeof mod, "%s.%s", prefix, parts[i]);
        snprintf(names[i], sizeof names[i], "%s.weight", mod);
        name_ptrs[i] = names[i];
        packed[i] = (i == 0 && ex && ex->given) ||
                    (m->mode == LOAD_PACKED && eng_qcfg_layer(&m->qcfg, mod, &lq));
        if (packed[i]) {
            uint64_t t0 = inf_now_ns();
            if (i == 0 && ex && ex->given) {
                q[0] = *ex->given;
                memset(ex->given, 0, sizeof *ex->given);
            } else {
                s = eng_q4_from_checkpoint(st, mod, &lq, rows[i], k, m->par, &q[i], err);
            }
            if (s == INF_OK && ex && ex->row_order)
                s = eng_q4_order_rows(&q[i], ex->row_order, err);
            if (s == INF_OK && take[i].count != rows[i]) {
                struct krn_q4_weight part;
                s = eng_q4_take_rows(&q[i], &take[i], 1, &part, err);
                eng_q4_free(&q[i]);
                q[i] = part;
            }
            m->t_quantize += secs_since(t0);
            if (s != INF_OK)
                goto done;
            n_packed++;
        } else {
            if ((s = eng_st_require(st, names[i], 2, shape, &all.t[i], err)))
                goto done;
            if ((s = eng_st_read_f32(all.t[i], 0, 0, NULL, err))) /* a float dtype */
                goto done;
        }
        all.rows[i] = take[i].count;
        all.row0[i] = take[i].first;
        if (with_bias) {
            snprintf(bn, sizeof bn, "%s.%s.bias", prefix, parts[i]);
            s = read_tensor(st, bn, rows[i], 0, b + r0, err);
            if (s != INF_OK)
                goto done;
            /* the rank's rows, packed after the parts before it */
            memmove(b + r0, b + r0 + take[i].first, (size_t)take[i].count * sizeof *b);
        }
        r0 += take[i].count;
    }
    if (ex && ex->col_order && n_packed == np)
        take_col_order(q, np, ex->col_order);
    bool fuse = m->fused && np > 1;
    if (fuse && n_packed > 0 && (n_packed < np || !can_stack(q, np))) {
        fuse = false;
        if (m->n_apart++ == 0)
            snprintf(m->apart, sizeof m->apart, "%s", prefix);
    }
    if (n_lin)
        *n_lin = fuse ? 1 : np;
    if (fuse || np == 1) {
        char fname[320], lname[320];
        const char *fn = np == 1 ? parts[0] : fused_name ? fused_name : "fused";
        snprintf(fname, sizeof fname, "%s.%s.weight", prefix, fn);
        snprintf(lname, sizeof lname, "%s.%s", prefix, fn);
        name_ptrs[np] = fname;
        l[0].lin.glu = glu && np > 1;
        struct krn_q4_weight fq;
        memset(&fq, 0, sizeof fq);
        struct src one = {.k = k};
        if (n_packed > 0 && (s = np == 1 ? INF_OK : eng_q4_concat(q, np, &fq, err)))
            goto done;
        if (n_packed > 0)
            one.q4 = np == 1 ? &q[0] : &fq;
        s = make_linear(m, lname, n_packed > 0 ? &one : &all, (int32_t)total, b,
                        keep_fp(m, name_ptrs, np + 1), cols, &l[0], err);
        eng_q4_free(&fq);
    } else {
        r0 = 0;
        for (int32_t i = 0; i < np && s == INF_OK; i++) {
            char lname[320];
            struct src one = {
                .t = {all.t[i]}, .rows = {take[i].count}, .row0 = {take[i].first}, .np = 1, .k = k};
            if (packed[i])
                one = (struct src){.k = k, .q4 = &q[i]};
            snprintf(lname, sizeof lname, "%s.%s", prefix, parts[i]);
            s = make_linear(m, lname, &one, take[i].count, b ? b + r0 : NULL,
                            keep_fp(m, &name_ptrs[i], 1), cols, &l[i], err);
            r0 += take[i].count;
        }
    }
    /* the layer records say act-order though the norm does the gathering */
    for (int32_t i = 0;
         s == INF_OK && ex && ex->col_order && *ex->col_order && i < (fuse || np == 1 ? 1 : np);
         i++)
        m->info[l[i].info].act_order = m->info[l[i].info].norm_ordered = true;
done:
    for (int32_t i = 0; i < np; i++)
        eng_q4_free(&q[i]);
    free(b);
    return s;
}

static inf_status_t load_single(struct eng_model *m, const eng_st_t *st, const char *prefix,
                                int32_t n, int32_t k, const struct shard *sh,
                                struct krn_q4_weight *given, struct lin *l, struct inf_err *err)
{
    const char *parts[1] = {""};
    char base[128], last[64];
    /* prefix "a.b.o_proj": split into module "a.b" and part "o_proj" */
    const char *dot = strrchr(prefix, '.');
    snprintf(base, sizeof base, "%.*s", (int)(dot - prefix), prefix);
    snprintf(last, sizeof last, "%s", dot + 1);
    parts[0] = last;
    const struct group_extra ex = {.given = given};
    return load_group(m, st, base, parts, &n, 1, k, false, NULL, false, sh, given ? &ex : NULL, l,
                      NULL, err);
}

/* An act-order down_proj reads the MLP's hidden state through its own
 * column order. When gate_proj and up_proj are INT4 in the checkpoint as
 * well, their rows are put in that order at load instead (row i of both
 * becomes row perm[i]; a row's codes, scales and zeros move with it, so the
 * model is the same), the hidden state comes out in down's stored order,
 * and down needs no gather: one fewer op per layer, and under tensor
 * parallelism down's columns split as any layer's do. *down gets the layer
 * (zeroed when there is nothing to fold) and *order its former perm, for
 * the caller to free. */
static inf_status_t mlp_fold(struct eng_model *m, const eng_st_t *st, const char *pre, int32_t H,
                             int32_t I, struct krn_q4_weight *down, int32_t **order,
                             struct inf_err *err)
{
    char mod[3][128];
    struct eng_qlayer lq[3];
    memset(down, 0, sizeof *down);
    *order = NULL;
    if (m->mode != LOAD_PACKED)
        return INF_OK;
    static const char *const names[3] = {"down_proj", "gate_proj", "up_proj"};
    for (int i = 0; i < 3; i++) {
        snprintf(mod[i], sizeof mod[i], "%s.%s", pre, names[i]);
        if (!eng_qcfg_layer(&m->qcfg, mod[i], &lq[i]))
            return INF_OK;
    }
    inf_status_t s = eng_q4_from_checkpoint(st, mod[0], &lq[0], H, I, m->par, down, err);
    if (s == INF_OK) {
        *order = down->perm;
        down->perm = NULL;
    }
    return s;
}

/* A norm weight; with order (the column order of the linears it feeds,
 * take_col_order) the weight put in that order and the order uploaded too
 * (*out_order), for the norm to write its output in it. */
static inf_status_t load_norm(struct eng_model *m, const eng_st_t *st, const char *name,
                              const int32_t *order, struct eng_buf **out,
                              struct eng_buf **out_order, struct inf_err *err)
{
    int32_t H = m->cfg.hidden;
    float *w = malloc((size_t)H * 2 * sizeof(float));
    if (!w)
        return inf_err_set(err, INF_E_NOMEM, "out of memory loading %s", name);
    inf_status_t s = read_tensor(st, name, H, 0, w, err);
    const float *up = w;
    if (s == INF_OK && order) {
        for (int32_t i = 0; i < H; i++)
            w[H + i] = w[order[i]];
        up = w + H;
        s = eng_buf_from_host(m->be, order, (size_t)H * 4, out_order, err);
    }
    if (s == INF_OK)
        s = eng_buf_from_host(m->be, up, (size_t)H * 4, out, err);
    free(w);
    return s;
}

/* Start reading the weights of layer l from the disk in the background. */
static void prefetch_layer(const struct eng_model *m, const eng_st_t *st, int32_t l)
{
    static const char *const parts[] = {
        "input_layernorm.weight",  "self_attn.q_proj.weight", "self_attn.k_proj.weight",
        "self_attn.v_proj.weight", "self_attn.o_proj.weight", "post_attention_layernorm.weight",
        "mlp.gate_proj.weight",    "mlp.up_proj.weight",      "mlp.down_proj.weight"};
    char nm[128];
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        snprintf(nm, sizeof nm, "model.layers.%d.%s", l, parts[i]);
        struct eng_qlayer lq;
        size_t len = strlen(nm) - strlen(".weight");
        if (m->mode == LOAD_PACKED && strstr(parts[i], "_proj")) {
            nm[len] = '\0';
            if (eng_qcfg_layer(&m->qcfg, nm, &lq)) {
                eng_q4_checkpoint_prefetch(st, nm, &lq);
                continue;
            }
            nm[len] = '.';
        }
        eng_st_prefetch(eng_st_find(st, nm));
    }
}

static inf_status_t load_embed_and_head(struct eng_model *m, const eng_st_t *st,
                                        struct inf_err *err)
{
    int32_t V = m->cfg.vocab, H = m->cfg.hidden;
    int64_t shape[2] = {V, H};
    struct src emb = {.rows = {V}, .np = 1, .k = H};
    inf_status_t s = eng_st_require(st, "model.embed_tokens.weight", 2, shape, &emb.t[0], err);
    if (s != INF_OK)
        return s;
    m->embed_dt = fp_wdt(m);
    if ((s = upload_fp(m, &emb, V, m->embed_dt, &m->embed, err)))
        return s;
    const char *hn[1] = {"lm_head.weight"};
    bool keep = keep_fp(m, hn, 1);
    if (m->cfg.tie_embeddings && (keep || m->mode != LOAD_RTN)) {
        /* The tied head reads the embedding table as is. */
        struct eng_layer_info *inf = add_info(m);
        if (!inf)
            return inf_err_set(err, INF_E_NOMEM, "out of memory for layer records");
        snprintf(inf->name, sizeof inf->name, "lm_head (tied)");
        inf->n = V;
        inf->k = H;
        inf->kp = H;
        inf->fp_dtype = m->embed_dt;
        m->lm_head = (struct lin){.lin = {.n = V, .k = H, .w = m->embed, .wdt = m->embed_dt},
                                  .info = m->n_info - 1,
                                  .w_borrowed = true};
        return INF_OK;
    }
    if (m->cfg.tie_embeddings)
        return make_linear(m, "lm_head (tied)", &emb, V, NULL, false, NULL, &m->lm_head, err);
    struct eng_qlayer lq;
    if (m->mode == LOAD_PACKED && eng_qcfg_layer(&m->qcfg, "lm_head", &lq)) {
        /* a GPTQ lm_head (GPTQModel's lm_head = true): INT4 as stored, or
         * dequantized to fp16 where keep_fp16 names it (the default) */
        struct krn_q4_weight q;
        if ((s = eng_q4_from_checkpoint(st, "lm_head", &lq, V, H, m->par, &q, err)))
            return s;
        struct src packed = {.k = H, .q4 = &q};
        s = make_linear(m, "lm_head", &packed, V, NULL, keep, NULL, &m->lm_head, err);
        eng_q4_free(&q);
        return s;
    }
    struct src head = {.rows = {V}, .np = 1, .k = H};
    if ((s = eng_st_require(st, "lm_head.weight", 2, shape, &head.t[0], err)))
        return s;
    eng_st_prefetch(head.t[0]);
    return make_linear(m, "lm_head", &head, V, NULL, keep, NULL, &m->lm_head, err);
}

/* The load mode for opts.quant and the checkpoint's declared quantization;
 * an explicit choice that contradicts the checkpoint is refused, naming
 * both. */
static inf_status_t resolve_mode(struct eng_model *m, const char *dir, struct inf_err *err)
{
    static const char *const names[] = {
        [ENG_QUANT_NONE] = "none", [ENG_QUANT_INT4] = "int4",
        [ENG_QUANT_AUTO] = "auto", [ENG_QUANT_AWQ] = "awq",
        [ENG_QUANT_GPTQ] = "gptq", [ENG_QUANT_CT] = "compressed-tensors"};
    inf_status_t s = eng_qcfg_load(dir, &m->qcfg, err);
    if (s != INF_OK)
        return s;
    const enum eng_quant want = m->opts.quant;
    const enum eng_qmethod have = m->qcfg.method;
    const char *wn = names[want];
    if (have == ENG_QM_NONE) {
        if (want != ENG_QUANT_NONE && want != ENG_QUANT_INT4 && want != ENG_QUANT_AUTO)
            return inf_err_set(err, INF_E_INVALID,
                               "model.quantization '%s', but config.json declares no "
                               "quantization_config (a 16-bit checkpoint: use auto, int4 or "
                               "none)",
                               wn);
        m->mode = want == ENG_QUANT_NONE ? LOAD_FP : LOAD_RTN;
        return INF_OK;
    }
    const enum eng_qmethod asked = want == ENG_QUANT_AWQ    ? ENG_QM_AWQ
                                   : want == ENG_QUANT_GPTQ ? ENG_QM_GPTQ
                                   : want == ENG_QUANT_CT   ? ENG_QM_CT
                                                            : ENG_QM_NONE;
    if (want != ENG_QUANT_AUTO && asked != have)
        return inf_err_set(err, INF_E_INVALID,
                           "model.quantization '%s' contradicts %s: quant_method '%s' (an INT4 "
                           "checkpoint: use auto or %s)",
                           wn, m->qcfg.file, eng_qmethod_name(have), eng_qmethod_name(have));
    m->mode = LOAD_PACKED;
    return INF_OK;
}

static inf_status_t alloc_act(struct eng_model *m, struct eng_buf **b, int64_t elems, size_t esz,
                              struct inf_err *err)
{
    return eng_buf_alloc(m->be, (size_t)elems * esz, b, err);
}

/* Decode graphs need a backend that records them, planned block tables,
 * and not being turned off; their largest bucket is max_slots rows, at most
 * 128 (and max_tokens). */
static void plan_graphs(struct eng_model *m)
{
    int32_t r = m->opts.max_slots < m->opts.max_tokens ? m->opts.max_slots : m->opts.max_tokens;
    bool on = m->opts.decode_graphs != ENG_GRAPHS_OFF && eng_backend_has_graphs(m->be) &&
              m->opts.max_slots > 0 && m->opts.max_seq_blocks > 0;
    m->graph_rows = on ? (r < 128 ? r : 128) : 0;
}

/* Rows of the logits buffer: a chunk, or a whole decode bucket. */
static int32_t lo_rows(const struct eng_model *m)
{
    return m->graph_rows > LOGIT_ROWS ? m->graph_rows : LOGIT_ROWS;
}

/* The columns around a row-parallel shard's input are read as zeros and
 * never written: zero the buffer once (when it has such columns). */
static inf_status_t zero_leads(struct eng_model *m, struct eng_buf *b, int64_t bytes, int32_t lead,
                               struct inf_err *err)
{
    if (lead == 0)
        return INF_OK;
    void *z = calloc(1, (size_t)bytes);
    if (!z)
        return inf_err_set(err, INF_E_NOMEM, "out of memory zeroing an activation buffer");
    inf_status_t s = eng_buf_upload(m->be, b, 0, z, (size_t)bytes, err);
    free(z);
    return s;
}

static inf_status_t alloc_work(struct eng_model *m, struct inf_err *err)
{
    const struct eng_model_config *c = &m->cfg;
    int64_t T = m->opts.max_tokens;
    size_t es = eng_act_size(m->be->act_dtype);
    plan_graphs(m);
    if (m->graph_rows > T)
        T = m->graph_rows; /* a padded bucket needs its rows */
    const struct eng_tp_shape *tp = &m->tp;
    int64_t qkvw = (int64_t)(tp->n_heads + 2 * tp->n_kv_heads) * c->head_dim;
    int64_t attw = m->att_lead + (int64_t)tp->n_heads * c->head_dim + m->att_trail,
            hw = m->h_lead + tp->inter + m->h_trail;
    inf_status_t s;
    if ((s = alloc_act(m, &m->x, T * c->hidden, es, err)) ||
        (s = alloc_act(m, &m->xn, T * c->hidden, es, err)) ||
        (s = alloc_act(m, &m->d, T * c->hidden, es, err)) ||
        (s = alloc_act(m, &m->qkv, T * qkvw, es, err)) ||
        (s = alloc_act(m, &m->att, T * attw, es, err)) ||
        (s = alloc_act(m, &m->gu, T * 2 * tp->inter, es, err)) ||
        (s = alloc_act(m, &m->h, T * hw, es, err)) ||
        (s = zero_leads(m, m->att, T * attw * (int64_t)es, m->att_lead + m->att_trail, err)) ||
        (s = zero_leads(m, m->h, T * hw * (int64_t)es, m->h_lead + m->h_trail, err)) ||
        (s = alloc_act(m, &m->lx, (int64_t)LOGIT_ROWS * c->hidden, es, err)) ||
        (s = alloc_act(m, &m->lo, (int64_t)lo_rows(m) * c->vocab, 4, err)) ||
        (s = alloc_act(m, &m->tok, T, 4, err)) || (s = alloc_act(m, &m->pos, T, 4, err)) ||
        (s = alloc_act(m, &m->seq_dec, T * 3, 4, err)) ||
        (s = alloc_act(m, &m->seq_pre, T * 3, 4, err)) || (s = alloc_act(m, &m->lrows, T, 4, err)))
        return s;
    m->host_seq_dec = malloc((size_t)T * 3 * sizeof(int32_t));
    m->host_seq_pre = malloc((size_t)T * 3 * sizeof(int32_t));
    m->host_lrows = malloc((size_t)T * sizeof(int32_t));
    if (!m->host_seq_dec || !m->host_seq_pre || !m->host_lrows)
        return inf_err_set(err, INF_E_NOMEM, "out of memory for batch tables");
    if (m->graph_rows > 0) {
        m->pad_tok = malloc((size_t)m->graph_rows * sizeof(int32_t));
        m->pad_pos = malloc((size_t)m->graph_rows * sizeof(int32_t));
        m->pad_bt =
            malloc((size_t)m->opts.max_slots * (size_t)m->opts.max_seq_blocks * sizeof(int32_t));
        if (!m->pad_tok || !m->pad_pos || !m->pad_bt)
            return inf_err_set(err, INF_E_NOMEM, "out of memory for decode tables");
    }
    if (eng_backend_can_sample(m->be)) {
        m->cap_samples = m->opts.max_slots > 0 ? m->opts.max_slots : m->opts.max_tokens;
        if ((s = eng_backend_sample_reserve(m->be, c->vocab, err)) ||
            (s = alloc_act(m, &m->samples, m->cap_samples, sizeof(struct eng_sample_out), err)))
            return s;
        m->host_rows = malloc((size_t)m->cap_samples * sizeof *m->host_rows);
        if (!m->host_rows)
            return inf_err_set(err, INF_E_NOMEM, "out of memory for sampling rows");
        if (eng_backend_can_feed(m->be)) {
            if ((s = alloc_act(m, &m->feed, T, 4, err)))
                return s;
            m->host_feed = malloc((size_t)T * sizeof(int32_t));
            if (!m->host_feed)
                return inf_err_set(err, INF_E_NOMEM, "out of memory for the token feed");
        }
    }
    if (m->opts.max_slots > 0 && m->opts.max_seq_blocks > 0 &&
        (s = alloc_act(m, &m->bt, (int64_t)m->opts.max_slots * m->opts.max_seq_blocks, 4, err)))
        return s;
    int32_t nb = m->opts.n_kv_blocks;
    m->opts.n_kv_blocks = 0;
    return nb > 0 ? eng_model_kv_reserve(m, nb, err) : INF_OK;
}

static void kv_free(struct eng_model *m)
{
    for (int32_t l = 0; l < m->cfg.n_layers; l++) {
        eng_buf_free(m->be, m->layers[l].k_cache);
        eng_buf_free(m->be, m->layers[l].v_cache);
        m->layers[l].k_cache = m->layers[l].v_cache = NULL;
    }
    m->opts.n_kv_blocks = 0;
}

inf_status_t eng_model_kv_reserve(eng_model_t *m, int32_t n_blocks, struct inf_err *err)
{
    const struct eng_model_config *c = &m->cfg;
    if (n_blocks <= 0)
        return inf_err_set(err, INF_E_INVALID, "KV blocks must be > 0, got %d", n_blocks);
    kv_free(m);
    size_t pool = (size_t)n_blocks * ENG_KV_BLOCK * (size_t)m->tp.n_kv_heads * (size_t)c->head_dim *
                  eng_act_size(m->be->kv_dtype);
    for (int32_t l = 0; l < c->n_layers; l++) {
        inf_status_t s;
        if ((s = eng_buf_alloc(m->be, pool, &m->layers[l].k_cache, err)) ||
            (s = eng_buf_alloc(m->be, pool, &m->layers[l].v_cache, err))) {
            kv_free(m);
            return s;
        }
    }
    m->opts.n_kv_blocks = n_blocks;
    return INF_OK;
}

inf_status_t eng_model_load(const char *dir, struct eng_backend *be,
                            const struct eng_model_opts *opts, eng_model_t **out,
                            struct inf_err *err)
{
    *out = NULL;
    struct eng_model_opts o;
    if (opts)
        o = *opts;
    else
        eng_model_opts_default(&o);
    if ((int)o.quant < (int)ENG_QUANT_NONE || (int)o.quant > (int)ENG_QUANT_CT)
        return inf_err_set(err, INF_E_INVALID, "quant %d is not a quantization", (int)o.quant);
    if ((o.quant == ENG_QUANT_INT4 || o.quant == ENG_QUANT_AUTO) &&
        !eng_q4_group_valid(o.group_size))
        return inf_err_set(err, INF_E_INVALID,
                           "group_size must be 32, 64, 128, 256 or 0 (per-channel), got %d",
                           o.group_size);
    if (o.max_tokens <= 0 || o.n_kv_blocks < 0 || o.n_keep_fp16 < 0 || o.max_slots < 0 ||
        o.max_seq_blocks < 0 || o.load_threads < 0)
        return inf_err_set(err, INF_E_INVALID,
                           "max_tokens must be > 0; n_kv_blocks, max_slots, max_seq_blocks and "
                           "load_threads >= 0");
    eng_st_t *st = NULL;
    struct eng_model *m = calloc(1, sizeof *m);
    if (!m)
        return inf_err_set(err, INF_E_NOMEM, "out of memory for a model");
    m->be = be;
    m->opts = o;
    m->fused = o.fuse_qkv;
    inf_status_t s = eng_model_config_load(dir, &m->cfg, err);
    if (s == INF_OK)
        s = resolve_mode(m, dir, err);
    if (s != INF_OK)
        goto fail;
    const struct eng_model_config *c = &m->cfg;
    if (c->head_dim > 512 || (c->head_dim & 1)) {
        s = inf_err_set(err, INF_E_UNSUPPORTED, "head_dim %d is not supported", c->head_dim);
        goto fail;
    }
    if ((s = eng_tp_shape_of(c->n_heads, c->n_kv_heads, c->intermediate, o.tp_rank,
                             o.tp_size > 0 ? o.tp_size : 1, &m->tp, err)))
        goto fail;
    m->rope = (struct eng_rope_params){.theta = c->rope_theta,
                                       .llama3 = c->rope_llama3,
                                       .factor = c->rope_factor,
                                       .low_freq = c->rope_low_freq,
                                       .high_freq = c->rope_high_freq,
                                       .orig_max_pos = c->rope_orig_max_pos};
    s = eng_st_open(dir, &st, err);
    if (s != INF_OK)
        goto fail;
    uint64_t t_load = inf_now_ns();
    if ((s = eng_par_create(o.load_threads, &m->par, err)))
        goto fail;
    prefetch_layer(m, st, 0);
    m->layers = calloc((size_t)c->n_layers, sizeof *m->layers);
    if (!m->layers) {
        s = inf_err_set(err, INF_E_NOMEM, "out of memory for layers");
        goto fail;
    }
    int32_t H = c->hidden, I = c->intermediate, hd = c->head_dim, qd = c->n_heads * hd,
            kvd = c->n_kv_heads * hd;
    /* a rank's part of each linear (engine/tp/shard.h): q/k/v by heads,
     * gate/up by rows, o and down by the columns those make */
    const struct eng_tp_shape *tp = &m->tp;
    const bool split = tp->size > 1;
    const struct shard sh_qkv = {.rows = {{tp->h0 * hd, tp->n_heads * hd},
                                          {tp->kv0 * hd, tp->n_kv_heads * hd},
                                          {tp->kv0 * hd, tp->n_kv_heads * hd}}},
                       sh_o = {.cols = true, .c0 = tp->h0 * hd, .c1 = (tp->h0 + tp->n_heads) * hd},
                       sh_gu = {.rows = {{tp->i0, tp->inter}, {tp->i0, tp->inter}}},
                       sh_down = {.cols = true, .c0 = tp->i0, .c1 = tp->i0 + tp->inter};
    int32_t n_kv_scaled = 0; /* layers whose KV scales the checkpoint gives */
    for (int32_t l = 0; l < c->n_layers; l++) {
        struct layer *L = &m->layers[l];
        char pre[96], nm[128];
        if (l + 1 < c->n_layers)
            prefetch_layer(m, st, l + 1);
        static const char *const qkv_parts[3] = {"q_proj", "k_proj", "v_proj"};
        static const char *const gu_parts[2] = {"gate_proj", "up_proj"};
        int32_t qkv_rows[3] = {qd, kvd, kvd}, gu_rows[2] = {I, I};
        /* act-order q/k/v and gate/up: their norms write x in their order */
        int32_t *qkv_order = NULL, *gu_order = NULL;
        snprintf(pre, sizeof pre, "model.layers.%d.self_attn", l);
        const struct group_extra qx = {.col_order = &qkv_order};
        s = load_group(m, st, pre, qkv_parts, qkv_rows, 3, H, c->qkv_bias, "qkv_proj", false,
                       split ? &sh_qkv : NULL, &qx, L->qkv, &L->n_qkv, err);
        snprintf(nm, sizeof nm, "model.layers.%d.input_layernorm.weight", l);
        if (s == INF_OK)
            s = load_norm(m, st, nm, qkv_order, &L->attn_norm, &L->attn_perm, err);
        free(qkv_order);
        if (s != INF_OK)
            goto fail;
        snprintf(nm, sizeof nm, "%s.o_proj", pre);
        if ((s = load_single(m, st, nm, H, qd, split ? &sh_o : NULL, NULL, &L->o, err)))
            goto fail;
        snprintf(pre, sizeof pre, "model.layers.%d.mlp", l);
        struct krn_q4_weight down;
        int32_t *order = NULL;
        if ((s = mlp_fold(m, st, pre, H, I, &down, &order, err)))
            goto fail;
        const struct group_extra gx = {.row_order = order, .col_order = &gu_order};
        s = load_group(m, st, pre, gu_parts, gu_rows, 2, H, false, "gate_up_proj", true,
                       split ? &sh_gu : NULL, &gx, L->gu, &L->n_gu, err);
        free(order);
        snprintf(nm, sizeof nm, "model.layers.%d.post_attention_layernorm.weight", l);
        if (s == INF_OK)
            s = load_norm(m, st, nm, gu_order, &L->mlp_norm, &L->mlp_perm, err);
        free(gu_order);
        snprintf(nm, sizeof nm, "%s.down_proj", pre);
        if (s == INF_OK)
            s = load_single(m, st, nm, H, I, split ? &sh_down : NULL, down.q ? &down : NULL,
                            &L->down, err);
        eng_q4_free(&down);
        if (s != INF_OK)
            goto fail;
        bool have = false;
        if ((s = eng_kv_scale_read(st, l, &L->k_scale, &L->v_scale, &have, err)))
            goto fail;
        n_kv_scaled += have;
        m->att_lead = L->o.lead > m->att_lead ? L->o.lead : m->att_lead;
        m->h_lead = L->down.lead > m->h_lead ? L->down.lead : m->h_lead;
        m->att_trail = L->o.trail > m->att_trail ? L->o.trail : m->att_trail;
        m->h_trail = L->down.trail > m->h_trail ? L->down.trail : m->h_trail;
    }
    if ((s = load_norm(m, st, "model.norm.weight", NULL, &m->final_norm, NULL, err)) ||
        (s = load_embed_and_head(m, st, err)))
        goto fail;
    inf_log(INFO,
            "weights loaded in %.2f s on %d threads: INT4 convert+quantize (or unpack) %.2f s, "
            "repack+upload "
            "%.2f s; fp convert %.2f s, upload %.2f s",
            secs_since(t_load), eng_par_size(m->par), m->t_quantize, m->t_q4_backend, m->t_convert,
            m->t_upload);
    eng_par_destroy(m->par);
    m->par = NULL;
    free(m->stage);
    m->stage = NULL;
    m->stage_bytes = 0;
    if ((s = alloc_work(m, err)))
        goto fail;
    eng_st_close(st);
    eng_model_log_load(m, n_kv_scaled);
    *out = m;
    return INF_OK;
fail:
    eng_st_close(st);
    eng_model_destroy(m);
    return s;
}

static void lin_free(struct eng_backend *be, struct lin *l)
{
    eng_weight_q4_destroy(be, l->lin.q4);
    if (!l->w_borrowed)
        eng_buf_free(be, l->lin.w);
    eng_buf_free(be, l->lin.bias);
    memset(l, 0, sizeof *l);
}

void eng_model_destroy(eng_model_t *m)
{
    if (!m)
        return;
    struct eng_backend *be = m->be;
    if (m->layers) {
        kv_free(m);
        for (int32_t l = 0; l < m->cfg.n_layers; l++) {
            struct layer *L = &m->layers[l];
            eng_buf_free(be, L->attn_norm);
            eng_buf_free(be, L->mlp_norm);
            eng_buf_free(be, L->attn_perm);
            eng_buf_free(be, L->mlp_perm);
            for (int i = 0; i < 3; i++)
                lin_free(be, &L->qkv[i]);
            lin_free(be, &L->o);
            lin_free(be, &L->gu[0]);
            lin_free(be, &L->gu[1]);
            lin_free(be, &L->down);
        }
    }
    lin_free(be, &m->lm_head);
    eng_buf_free(be, m->embed);
    eng_buf_free(be, m->final_norm);
    struct eng_buf *bufs[] = {m->x,       m->xn,    m->d,  m->qkv,     m->att, m->gu,
                              m->h,       m->lx,    m->lo, m->tok,     m->pos, m->seq_dec,
                              m->seq_pre, m->lrows, m->bt, m->samples, m->feed};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        eng_buf_free(be, bufs[i]);
    free(m->host_seq_dec);
    free(m->host_seq_pre);
    free(m->host_lrows);
    free(m->host_rows);
    free(m->host_feed);
    free(m->pad_tok);
    free(m->pad_pos);
    free(m->pad_bt);
    free(m->layers);
    free(m->info);
    eng_par_destroy(m->par);
    free(m->stage);
    eng_qcfg_free(&m->qcfg);
    free(m);
}

const struct eng_model_config *eng_model_config(const eng_model_t *m)
{
    return &m->cfg;
}

const struct eng_tp_shape *eng_model_tp_shape(const eng_model_t *m)
{
    return &m->tp;
}

int32_t eng_model_max_tokens(const eng_model_t *m)
{
    return m->opts.max_tokens;
}

int32_t eng_model_n_kv_blocks(const eng_model_t *m)
{
    return m->opts.n_kv_blocks;
}

int32_t eng_model_layer_count(const eng_model_t *m)
{
    return m->n_info;
}

const struct eng_layer_info *eng_model_layer_info(const eng_model_t *m, int32_t i)
{
    return i >= 0 && i < m->n_info ? &m->info[i] : NULL;
}
