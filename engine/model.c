/* engine/model.c — Llama-family model: loading (quantize or keep each weight)
 * and the forward step, written once against the backend table.
 *
 * Activation buffers, each [max_tokens rows] of act_dtype:
 *   x    [T][H]            residual stream
 *   xn   [T][H]            normalized input of the next projection
 *   d    [T][H]            output of o_proj / down_proj (the residual delta)
 *   qkv  [T][(nh+2nkv)hd]  q | k | v heads side by side (fused or not)
 *   att  [T][nh*hd]        attention output
 *   gu   [T][2I]           gate | up
 *   h    [T][I]            silu(gate) * up
 *   lx   [LR][H]           normalized rows that want logits (chunk)
 *   lo   [LR][V] fp32      their logits (chunk)
 * Index buffers (int32): tokens [T], pos [T], two sequence lists [T][3]
 * (decode and prefill runs), logit rows [T], block table (grows). */
#define INF_LOG_MODULE "eng"
#include "engine/model.h"
#include "engine/par.h"
#include "engine/weights/quant.h"
#include "engine/weights/safetensors.h"

#include <fnmatch.h>
#include <pthread.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LOGIT_ROWS 32 /* rows of logits computed per lm_head call */

struct lin {
    int32_t info; /* index into m->info */
    int32_t n, k;
    struct eng_q4w *q4; /* quantized, or */
    struct eng_buf *w;  /* fp weights [n][k] */
    enum eng_wdtype wdt;
    bool w_borrowed;      /* tied lm_head: w is the embedding table */
    struct eng_buf *bias; /* fp32 [n] or NULL */
    bool glu;             /* q4 is a gate/up pair for eng_op_linear_q4_glu */
};

struct layer {
    struct eng_buf *attn_norm, *mlp_norm;
    struct lin qkv[3]; /* fused: qkv[0] only */
    struct lin o;
    struct lin gu[2]; /* fused: gu[0] only */
    struct lin down;
    struct eng_buf *k_cache, *v_cache;
};

struct eng_model {
    struct eng_model_config cfg;
    struct eng_model_opts opts;
    struct eng_backend *be;
    bool fused;
    struct eng_buf *embed;
    enum eng_wdtype embed_dt;
    struct eng_buf *final_norm;
    struct lin lm_head;
    struct layer *layers;
    struct eng_layer_info *info;
    int32_t n_info, cap_info;
    struct eng_rope_params rope;
    /* activations and indices */
    struct eng_buf *x, *xn, *d, *qkv, *att, *gu, *h, *lx, *lo;
    struct eng_buf *tok, *pos, *seq_dec, *seq_pre, *lrows, *bt;
    int32_t *host_seq_dec, *host_seq_pre, *host_lrows;
    /* sampling on the device: results [cap_samples] and a host copy of one
     * chunk's rows */
    struct eng_buf *samples;
    struct eng_sample_row *host_rows;
    int32_t cap_samples;
    /* steps in two halves (eng_model_sample_submit): the batch's feed on the
     * device and its host copy, padded; the download slot the next submit
     * takes, and how many are submitted and not collected */
    struct eng_buf *feed;
    int32_t *host_feed;
    int sub_next, n_sub;
    /* decode graphs: rows of the largest bucket (0: none), padded tables,
     * buckets whose recording failed */
    int32_t graph_rows;
    int32_t *pad_tok, *pad_pos, *pad_bt;
    bool graph_failed[16];
    /* while loading: the threads, the host buffer of fp conversions, and
     * seconds spent per phase */
    eng_par_t *par;
    void *stage;
    size_t stage_bytes;
    double t_quantize;   /* converting and quantizing INT4 layers */
    double t_q4_backend; /* the backend's repack and upload of them */
    double t_convert;    /* converting fp weights to their dtype */
    double t_upload;     /* uploading fp weights */
};

static const char *const default_keep[] = {"model.embed_tokens.*", "lm_head.*"};

void eng_model_opts_default(struct eng_model_opts *o)
{
    memset(o, 0, sizeof *o);
    o->quant = ENG_QUANT_INT4;
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

/* dtype of fp weights: fp16 under INT4 (the layers kept) and on backends
 * with fp16 activations (a GPU serving quantization none); fp32 otherwise. */
static enum eng_wdtype fp_wdt(const struct eng_model *m)
{
    return m->opts.quant == ENG_QUANT_INT4 || m->be->act_dtype == ENG_ACT_F16 ? ENG_W_F16
                                                                              : ENG_W_F32;
}

/* The rows of one linear layer as they lie in the checkpoint: the parts'
 * tensors ([rows[i]][k] each) stacked in order (q | k | v when fused). */
struct src {
    const struct eng_st_tensor *t[3];
    int32_t rows[3];
    int32_t np;
    int32_t k;
};

/* The tensor holding row r of s, and the element offset of that row in it. */
static const struct eng_st_tensor *src_row(const struct src *s, int64_t r, int64_t *first)
{
    int32_t i = 0;
    while (i < s->np - 1 && r >= s->rows[i])
        r -= s->rows[i++];
    *first = r * s->k;
    return s->t[i];
}

/* Work shared by the load threads over the rows of one weight: convert each
 * row from the checkpoint and quantize it (q set) or store it as fp16 / fp32
 * (host set). Errors keep the one of the lowest row, whatever the threads. */
struct rows_job {
    const struct src *src;
    struct krn_q4_weight *q;
    void *host;
    enum eng_wdtype wdt;
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
    if (j->q && !(row = malloc((size_t)k * sizeof(float)))) {
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
    struct rows_job j = {.src = src, .wdt = dt, .host = m->stage};
    inf_status_t s = rows_convert(m, &j, n, err);
    m->t_convert += secs_since(t0);
    t0 = inf_now_ns();
    if (s == INF_OK)
        s = eng_buf_from_host(m->be, j.host, bytes, out, err);
    m->t_upload += secs_since(t0);
    return s;
}

/* Quantize and repack (or upload as fp) the rows of src, [n][k], as linear
 * `name`. */
static inf_status_t make_linear(struct eng_model *m, const char *name, const struct src *src,
                                int32_t n, const float *bias, bool keep, struct lin *l,
                                struct inf_err *err)
{
    inf_status_t s;
    int32_t k = src->k;
    struct eng_layer_info *inf = add_info(m);
    if (!inf)
        return inf_err_set(err, INF_E_NOMEM, "out of memory for layer records");
    l->info = m->n_info - 1;
    l->n = n;
    l->k = k;
    snprintf(inf->name, sizeof inf->name, "%s", name);
    inf->n = n;
    inf->k = k;
    if (m->opts.quant == ENG_QUANT_INT4 && !keep) {
        int32_t group = m->opts.group_size, kp = eng_q4_padded_k(k, group);
        struct krn_q4_weight q;
        if ((s = eng_q4_alloc(n, k, kp, group == 0 ? kp : group, m->opts.symmetric, &q, err)))
            return s;
        uint64_t t0 = inf_now_ns();
        struct rows_job j = {.src = src, .q = &q};
        s = rows_convert(m, &j, n, err);
        m->t_quantize += secs_since(t0);
        t0 = inf_now_ns();
        /* a gate/up pair the backend can fuse with its SiLU·mul; where it
         * declines (INF_E_UNSUPPORTED), a plain weight */
        if (s == INF_OK && l->glu && !bias && n % 16 == 0 && eng_backend_has_glu(m->be)) {
            s = eng_weight_q4_create_glu(m->be, &q, &l->q4, err);
            if (s == INF_E_UNSUPPORTED) {
                inf_err_clear(err);
                s = INF_OK;
            }
        }
        l->glu = l->q4 != NULL;
        if (s == INF_OK && !l->q4)
            s = eng_weight_q4_create(m->be, &q, &l->q4, err);
        m->t_q4_backend += secs_since(t0);
        inf->quantized = true;
        inf->kp = q.kp;
        inf->group = q.group;
        eng_q4_free(&q);
        if (s != INF_OK)
            return s;
    } else {
        l->glu = false;
        l->wdt = fp_wdt(m);
        inf->fp_dtype = l->wdt;
        inf->kp = k;
        if ((s = upload_fp(m, src, n, l->wdt, &l->w, err)))
            return s;
    }
    if (bias)
        return eng_buf_from_host(m->be, bias, (size_t)n * 4, &l->bias, err);
    return INF_OK;
}

/* Load the parts (suffixes like "q_proj") of module prefix, each [n_i][k],
 * as one fused linear (fused) or one linear each into l[0..np). glu: the
 * parts are a gated MLP's gate and up, which a fused INT4 linear may serve
 * as one GLU op (struct lin, glu). */
static inf_status_t load_group(struct eng_model *m, const eng_st_t *st, const char *prefix,
                               const char *const *parts, const int32_t *rows, int32_t np, int32_t k,
                               bool with_bias, const char *fused_name, bool glu, struct lin *l,
                               struct inf_err *err)
{
    int64_t total = 0;
    for (int32_t i = 0; i < np; i++)
        total += rows[i];
    float *b = with_bias ? malloc((size_t)total * sizeof(float)) : NULL;
    inf_status_t s = INF_OK;
    char names[3][256];
    const char *name_ptrs[4];
    struct src all = {.np = np, .k = k};
    if (with_bias && !b)
        return inf_err_set(err, INF_E_NOMEM, "out of memory loading %s", prefix);
    int64_t r0 = 0;
    for (int32_t i = 0; i < np; i++) {
        char bn[256];
        int64_t shape[2] = {rows[i], k};
        snprintf(names[i], sizeof names[i], "%s.%s.weight", prefix, parts[i]);
        name_ptrs[i] = names[i];
        if ((s = eng_st_require(st, names[i], 2, shape, &all.t[i], err)))
            goto done;
        if ((s = eng_st_read_f32(all.t[i], 0, 0, NULL, err))) /* a float dtype */
            goto done;
        all.rows[i] = rows[i];
        if (with_bias) {
            snprintf(bn, sizeof bn, "%s.%s.bias", prefix, parts[i]);
            s = read_tensor(st, bn, rows[i], 0, b + r0, err);
            if (s != INF_OK)
                goto done;
        }
        r0 += rows[i];
    }
    if (m->fused) {
        char fname[320], lname[320];
        const char *fn = fused_name ? fused_name : "fused";
        snprintf(fname, sizeof fname, "%s.%s.weight", prefix, fn);
        snprintf(lname, sizeof lname, "%s.%s", prefix, fn);
        name_ptrs[np] = fname;
        l[0].glu = glu;
        s = make_linear(m, lname, &all, (int32_t)total, b, keep_fp(m, name_ptrs, np + 1), &l[0],
                        err);
    } else {
        r0 = 0;
        for (int32_t i = 0; i < np && s == INF_OK; i++) {
            char lname[320];
            struct src one = {.t = {all.t[i]}, .rows = {rows[i]}, .np = 1, .k = k};
            snprintf(lname, sizeof lname, "%s.%s", prefix, parts[i]);
            s = make_linear(m, lname, &one, rows[i], b ? b + r0 : NULL,
                            keep_fp(m, &name_ptrs[i], 1), &l[i], err);
            r0 += rows[i];
        }
    }
done:
    free(b);
    return s;
}

static inf_status_t load_single(struct eng_model *m, const eng_st_t *st, const char *prefix,
                                int32_t n, int32_t k, struct lin *l, struct inf_err *err)
{
    const char *parts[1] = {""};
    char base[128], last[64];
    /* prefix "a.b.o_proj": split into module "a.b" and part "o_proj" */
    const char *dot = strrchr(prefix, '.');
    snprintf(base, sizeof base, "%.*s", (int)(dot - prefix), prefix);
    snprintf(last, sizeof last, "%s", dot + 1);
    parts[0] = last;
    bool fused = m->fused;
    m->fused = false;
    inf_status_t s = load_group(m, st, base, parts, &n, 1, k, false, NULL, false, l, err);
    m->fused = fused;
    return s;
}

static inf_status_t load_norm(struct eng_model *m, const eng_st_t *st, const char *name,
                              struct eng_buf **out, struct inf_err *err)
{
    int32_t H = m->cfg.hidden;
    float *w = malloc((size_t)H * sizeof(float));
    if (!w)
        return inf_err_set(err, INF_E_NOMEM, "out of memory loading %s", name);
    inf_status_t s = read_tensor(st, name, H, 0, w, err);
    if (s == INF_OK)
        s = eng_buf_from_host(m->be, w, (size_t)H * 4, out, err);
    free(w);
    return s;
}

/* Start reading the weights of layer l from the disk in the background. */
static void prefetch_layer(const eng_st_t *st, int32_t l)
{
    static const char *const parts[] = {
        "input_layernorm.weight",  "self_attn.q_proj.weight", "self_attn.k_proj.weight",
        "self_attn.v_proj.weight", "self_attn.o_proj.weight", "post_attention_layernorm.weight",
        "mlp.gate_proj.weight",    "mlp.up_proj.weight",      "mlp.down_proj.weight"};
    char nm[128];
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        snprintf(nm, sizeof nm, "model.layers.%d.%s", l, parts[i]);
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
    if (m->cfg.tie_embeddings && (keep || m->opts.quant == ENG_QUANT_NONE)) {
        /* The tied head reads the embedding table as is. */
        struct eng_layer_info *inf = add_info(m);
        if (!inf)
            return inf_err_set(err, INF_E_NOMEM, "out of memory for layer records");
        snprintf(inf->name, sizeof inf->name, "lm_head (tied)");
        inf->n = V;
        inf->k = H;
        inf->kp = H;
        inf->fp_dtype = m->embed_dt;
        m->lm_head = (struct lin){.info = m->n_info - 1,
                                  .n = V,
                                  .k = H,
                                  .w = m->embed,
                                  .wdt = m->embed_dt,
                                  .w_borrowed = true};
        return INF_OK;
    }
    if (m->cfg.tie_embeddings)
        return make_linear(m, "lm_head (tied)", &emb, V, NULL, false, &m->lm_head, err);
    struct src head = {.rows = {V}, .np = 1, .k = H};
    if ((s = eng_st_require(st, "lm_head.weight", 2, shape, &head.t[0], err)))
        return s;
    eng_st_prefetch(head.t[0]);
    return make_linear(m, "lm_head", &head, V, NULL, keep, &m->lm_head, err);
}

static void log_padding(const struct eng_model *m)
{
    char buf[512] = "";
    size_t used = 0;
    int32_t n_pad = 0, n_q = 0;
    for (int32_t i = 0; i < m->n_info; i++) {
        const struct eng_layer_info *l = &m->info[i];
        if (!l->quantized)
            continue;
        n_q++;
        if (l->kp == l->k)
            continue;
        n_pad++;
        /* One entry per distinct part name (after the layer index). */
        const char *part = strstr(l->name, "layers.");
        part = part ? strchr(part + 7, '.') : NULL;
        part = part ? part + 1 : l->name;
        char item[96];
        snprintf(item, sizeof item, "%s %d->%d", part, l->k, l->kp);
        if (!strstr(buf, item) && used + strlen(item) + 3 < sizeof buf)
            used += (size_t)snprintf(buf + used, sizeof buf - used, "%s%s", used ? ", " : "", item);
    }
    char grp[32];
    if (m->opts.group_size > 0)
        snprintf(grp, sizeof grp, "group %d", m->opts.group_size);
    else
        snprintf(grp, sizeof grp, "per-channel");
    if (n_pad > 0)
        inf_log(INFO, "INT4 %s: %d of %d quantized layers padded along K (%s)", grp, n_pad, n_q,
                buf);
    else if (n_q > 0)
        inf_log(INFO, "INT4 %s: %d layers quantized, none padded", grp, n_q);
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

static inf_status_t alloc_work(struct eng_model *m, struct inf_err *err)
{
    const struct eng_model_config *c = &m->cfg;
    int64_t T = m->opts.max_tokens;
    size_t es = eng_act_size(m->be->act_dtype);
    plan_graphs(m);
    if (m->graph_rows > T)
        T = m->graph_rows; /* a padded bucket needs its rows */
    int64_t qkvw = (int64_t)(c->n_heads + 2 * c->n_kv_heads) * c->head_dim;
    inf_status_t s;
    if ((s = alloc_act(m, &m->x, T * c->hidden, es, err)) ||
        (s = alloc_act(m, &m->xn, T * c->hidden, es, err)) ||
        (s = alloc_act(m, &m->d, T * c->hidden, es, err)) ||
        (s = alloc_act(m, &m->qkv, T * qkvw, es, err)) ||
        (s = alloc_act(m, &m->att, T * c->n_heads * c->head_dim, es, err)) ||
        (s = alloc_act(m, &m->gu, T * 2 * c->intermediate, es, err)) ||
        (s = alloc_act(m, &m->h, T * c->intermediate, es, err)) ||
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
    size_t pool = (size_t)n_blocks * ENG_KV_BLOCK * (size_t)c->n_kv_heads * (size_t)c->head_dim *
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
    if (o.quant == ENG_QUANT_INT4 && !eng_q4_group_valid(o.group_size))
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
    if (s != INF_OK)
        goto fail;
    const struct eng_model_config *c = &m->cfg;
    if (c->head_dim > 512 || (c->head_dim & 1)) {
        s = inf_err_set(err, INF_E_UNSUPPORTED, "head_dim %d is not supported", c->head_dim);
        goto fail;
    }
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
    prefetch_layer(st, 0);
    m->layers = calloc((size_t)c->n_layers, sizeof *m->layers);
    if (!m->layers) {
        s = inf_err_set(err, INF_E_NOMEM, "out of memory for layers");
        goto fail;
    }
    int32_t H = c->hidden, I = c->intermediate, qd = c->n_heads * c->head_dim,
            kvd = c->n_kv_heads * c->head_dim;
    for (int32_t l = 0; l < c->n_layers; l++) {
        struct layer *L = &m->layers[l];
        char pre[96], nm[128];
        if (l + 1 < c->n_layers)
            prefetch_layer(st, l + 1);
        static const char *const qkv_parts[3] = {"q_proj", "k_proj", "v_proj"};
        static const char *const gu_parts[2] = {"gate_proj", "up_proj"};
        int32_t qkv_rows[3] = {qd, kvd, kvd}, gu_rows[2] = {I, I};
        snprintf(nm, sizeof nm, "model.layers.%d.input_layernorm.weight", l);
        if ((s = load_norm(m, st, nm, &L->attn_norm, err)))
            goto fail;
        snprintf(nm, sizeof nm, "model.layers.%d.post_attention_layernorm.weight", l);
        if ((s = load_norm(m, st, nm, &L->mlp_norm, err)))
            goto fail;
        snprintf(pre, sizeof pre, "model.layers.%d.self_attn", l);
        if ((s = load_group(m, st, pre, qkv_parts, qkv_rows, 3, H, c->qkv_bias, "qkv_proj", false,
                            L->qkv, err)))
            goto fail;
        snprintf(nm, sizeof nm, "%s.o_proj", pre);
        if ((s = load_single(m, st, nm, H, qd, &L->o, err)))
            goto fail;
        snprintf(pre, sizeof pre, "model.layers.%d.mlp", l);
        if ((s = load_group(m, st, pre, gu_parts, gu_rows, 2, H, false, "gate_up_proj", true,
                            L->gu, err)))
            goto fail;
        snprintf(nm, sizeof nm, "%s.down_proj", pre);
        if ((s = load_single(m, st, nm, H, I, &L->down, err)))
            goto fail;
    }
    if ((s = load_norm(m, st, "model.norm.weight", &m->final_norm, err)) ||
        (s = load_embed_and_head(m, st, err)))
        goto fail;
    inf_log(INFO,
            "weights loaded in %.2f s on %d threads: INT4 convert+quantize %.2f s, repack+upload "
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
    log_padding(m);
    *out = m;
    return INF_OK;
fail:
    eng_st_close(st);
    eng_model_destroy(m);
    return s;
}

static void lin_free(struct eng_backend *be, struct lin *l)
{
    eng_weight_q4_destroy(be, l->q4);
    if (!l->w_borrowed)
        eng_buf_free(be, l->w);
    eng_buf_free(be, l->bias);
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
    free(m);
}

const struct eng_model_config *eng_model_config(const eng_model_t *m)
{
    return &m->cfg;
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

/* ---- forward --------------------------------------------------------------- */

static struct eng_mat mat(struct eng_buf *b, int64_t off, int64_t ld)
{
    return (struct eng_mat){.buf = b, .off = off, .ld = ld};
}

static inf_status_t linear(struct eng_model *m, const struct lin *l, struct eng_mat x,
                           struct eng_mat y, bool y_f32, int32_t rows, struct inf_err *err)
{
    if (l->q4)
        return eng_op_linear_q4(m->be, l->q4, l->bias, x, y, rows, err);
    return eng_op_linear_fp(m->be, l->w, l->wdt, l->n, l->k, l->bias, x, y, y_f32, rows, err);
}

/* Check the batch and build the sequence runs. */
static inf_status_t plan(struct eng_model *m, const struct eng_batch *b, int32_t *n_dec,
                         int32_t *n_pre, int32_t *n_lrows, struct inf_err *err)
{
    if (b->n_tokens <= 0)
        return inf_err_set(err, INF_E_INVALID, "a batch needs at least one token");
    if (b->n_tokens > m->opts.max_tokens)
        return inf_err_set(err, INF_E_TOOBIG, "%d tokens in a step, at most %d", b->n_tokens,
                           m->opts.max_tokens);
    if (b->n_slots <= 0 || b->max_blocks <= 0 || !b->block_table)
        return inf_err_set(err, INF_E_INVALID, "a batch needs block tables");
    *n_dec = *n_pre = *n_lrows = 0;
    int32_t t = 0;
    while (t < b->n_tokens) {
        int32_t slot = b->slot[t], t0 = t;
        if (slot < 0 || slot >= b->n_slots)
            return inf_err_set(err, INF_E_INVALID, "token %d: slot %d out of range", t, slot);
        for (int32_t u = 0; u < t0; u++)
            if (b->slot[u] == slot)
                return inf_err_set(err, INF_E_INVALID,
                                   "tokens of slot %d are not contiguous in the batch", slot);
        while (t < b->n_tokens && b->slot[t] == slot) {
            if (b->pos[t] < 0 || (t > t0 && b->pos[t] != b->pos[t - 1] + 1))
                return inf_err_set(err, INF_E_INVALID,
                                   "token %d: positions of slot %d are not consecutive", t, slot);
            t++;
        }
        int32_t *dst =
            t - t0 == 1 ? &m->host_seq_dec[3 * (*n_dec)++] : &m->host_seq_pre[3 * (*n_pre)++];
        dst[0] = t0;
        dst[1] = t - t0;
        dst[2] = slot;
    }
    for (t = 0; t < b->n_tokens; t++)
        if (b->want_logits[t])
            m->host_lrows[(*n_lrows)++] = t;
    if (*n_lrows != b->n_logits)
        return inf_err_set(err, INF_E_INVALID, "n_logits is %d but %d tokens want logits",
                           b->n_logits, *n_lrows);
    return INF_OK;
}

/* The attention parameters of a step (pools and sequences set per call). */
static struct eng_attn_params attn_params(eng_model_t *m, int32_t n_slots, int32_t max_blocks)
{
    const struct eng_model_config *c = &m->cfg;
    int32_t hd = c->head_dim, qd = c->n_heads * hd, kvd = c->n_kv_heads * hd, qkvw = qd + 2 * kvd;
    return (struct eng_attn_params){.n_heads = c->n_heads,
                                    .n_kv_heads = c->n_kv_heads,
                                    .head_dim = hd,
                                    .scale = 1.0f / sqrtf((float)hd),
                                    .q = mat(m->qkv, 0, qkvw),
                                    .k = mat(m->qkv, qd, qkvw),
                                    .v = mat(m->qkv, qd + kvd, qkvw),
                                    .out = mat(m->att, 0, qd),
                                    .pos = m->pos,
                                    .block_table = m->bt,
                                    .n_slots = n_slots,
                                    .max_blocks = max_blocks,
                                    .k_cache = m->layers[0].k_cache,
                                    .v_cache = m->layers[0].v_cache,
                                    .n_blocks = m->opts.n_kv_blocks};
}

/* The device work of a step over T rows whose tables are uploaded:
 * embedding, the layers (decode runs, then prefill runs; none of either
 * skips its op), the final norm into xn. */
static inf_status_t body(eng_model_t *m, struct eng_attn_params *ap, int32_t T, int32_t n_dec,
                         int32_t n_pre, struct inf_err *err)
{
    const struct eng_model_config *c = &m->cfg;
    struct eng_backend *be = m->be;
    int32_t H = c->hidden, I = c->intermediate, hd = c->head_dim;
    inf_status_t s;
    struct eng_mat x = mat(m->x, 0, H), xn = mat(m->xn, 0, H), d = mat(m->d, 0, H);
    if ((s = eng_op_embedding(be, m->embed, m->embed_dt, c->vocab, H, m->tok, x, T, err)))
        return s;
    for (int32_t l = 0; l < c->n_layers; l++) {
        struct layer *L = &m->layers[l];
        if ((s = eng_op_rmsnorm_add(be, x, l ? &d : NULL, L->attn_norm, c->rms_eps, xn, H, T, err)))
            return s;
        if (m->fused) {
            s = linear(m, &L->qkv[0], xn, ap->q, false, T, err);
        } else if (!(s = linear(m, &L->qkv[0], xn, ap->q, false, T, err)) &&
                   !(s = linear(m, &L->qkv[1], xn, ap->k, false, T, err))) {
            s = linear(m, &L->qkv[2], xn, ap->v, false, T, err);
        }
        if (s)
            return s;
        /* q and k heads are adjacent in a qkv row: one rotation covers both. */
        if ((s = eng_op_rope(be, ap->q, c->n_heads + c->n_kv_heads, hd, m->pos, &m->rope, T, err)))
            return s;
        ap->k_cache = L->k_cache;
        ap->v_cache = L->v_cache;
        if (n_dec > 0) {
            ap->seqs = m->seq_dec;
            ap->n_seqs = n_dec;
            if ((s = eng_op_attn_decode(be, ap, err)))
                return s;
        }
        if (n_pre > 0) {
            ap->seqs = m->seq_pre;
            ap->n_seqs = n_pre;
            if ((s = eng_op_attn_prefill(be, ap, err)))
                return s;
        }
        if ((s = linear(m, &L->o, ap->out, d, false, T, err)) ||
            (s = eng_op_rmsnorm_add(be, x, &d, L->mlp_norm, c->rms_eps, xn, H, T, err)))
            return s;
        struct eng_mat g = mat(m->gu, 0, 2 * I), u = mat(m->gu, I, 2 * I);
        struct eng_mat hm = mat(m->h, 0, I);
        if (L->gu[0].glu) {
            s = eng_op_linear_q4_glu(be, L->gu[0].q4, xn, g, hm, T, err);
        } else {
            if (m->fused) {
                s = linear(m, &L->gu[0], xn, g, false, T, err);
            } else if (!(s = linear(m, &L->gu[0], xn, g, false, T, err))) {
                s = linear(m, &L->gu[1], xn, u, false, T, err);
            }
            if (!s)
                s = eng_op_silu_mul(be, g, u, hm, I, T, err);
        }
        if (s || (s = linear(m, &L->down, hm, d, false, T, err)))
            return s;
    }
    return eng_op_rmsnorm_add(be, x, &d, m->final_norm, c->rms_eps, xn, H, T, err);
}

/* Decode batches padded to these row counts replay one graph each. */
static const int32_t k_buckets[] = {1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128};
#define N_BUCKETS ((int32_t)(sizeof k_buckets / sizeof k_buckets[0]))

int32_t eng_model_graph_bucket(int32_t rows)
{
    for (int32_t i = 0; i < N_BUCKETS; i++)
        if (rows <= k_buckets[i])
            return rows < 1 ? -1 : k_buckets[i];
    return -1;
}

/* The bucket of a decode batch of T tokens, or -1. */
static int32_t bucket_of(const eng_model_t *m, int32_t T)
{
    for (int32_t i = 0; i < N_BUCKETS; i++)
        if (T <= k_buckets[i])
            return k_buckets[i] <= m->graph_rows ? i : -1;
    return -1;
}

/* A decode-only step, every token wanting logits, padded to bucket rows
 * (token 0 at position 0; those rows are computed and never read): the
 * tables in their planned shapes, the attention list in the backend's fixed
 * shape, then the recorded graph of the bucket replayed (recorded on its
 * first use), or the ops run as they come (graphs off, or a recording that
 * failed). Leaves the logits of every row in lo. */
/* b's feed (engine/batch.h), after its tokens went up to m->tok: the fed
 * ones are overwritten on the device from the last step's samples. n: the
 * tokens uploaded (b's, padded). */
static inf_status_t apply_feed(eng_model_t *m, const struct eng_batch *b, int32_t n,
                               struct inf_err *err)
{
    if (!b->feed)
        return INF_OK;
    if (!m->feed)
        return inf_err_set(err, INF_E_UNSUPPORTED, "backend %s does not feed tokens",
                           eng_backend_name(m->be));
    for (int32_t t = 0; t < n; t++)
        m->host_feed[t] = t < b->n_tokens ? b->feed[t] : -1;
    inf_status_t s = eng_buf_upload(m->be, m->feed, 0, m->host_feed, (size_t)n * 4, err);
    return s != INF_OK ? s : eng_op_token_feed(m->be, m->tok, m->feed, m->samples, n, err);
}

static inf_status_t decode_graph(eng_model_t *m, const struct eng_batch *b, int32_t bi,
                                 int32_t n_dec, struct inf_err *err)
{
    const struct eng_model_config *c = &m->cfg;
    struct eng_backend *be = m->be;
    const int32_t T = b->n_tokens, B = k_buckets[bi], S = m->opts.max_seq_blocks;
    for (int32_t t = 0; t < B; t++) {
        m->pad_tok[t] = t < T ? b->tokens[t] : 0;
        m->pad_pos[t] = t < T ? b->pos[t] : 0;
    }
    for (int32_t k = 0; k < b->n_slots; k++)
        for (int32_t j = 0; j < S; j++)
            m->pad_bt[(int64_t)k * S + j] =
                j < b->max_blocks ? b->block_table[(int64_t)k * b->max_blocks + j] : -1;
    inf_status_t s;
    if ((s = eng_buf_upload(be, m->tok, 0, m->pad_tok, (size_t)B * 4, err)) ||
        (s = eng_buf_upload(be, m->pos, 0, m->pad_pos, (size_t)B * 4, err)) ||
        (s = eng_buf_upload(be, m->seq_dec, 0, m->host_seq_dec, (size_t)n_dec * 12, err)) ||
        (s = eng_buf_upload(be, m->bt, 0, m->pad_bt, (size_t)b->n_slots * (size_t)S * 4, err)))
        return s;
    struct eng_attn_params ap = attn_params(m, b->n_slots, S);
    ap.seqs = m->seq_dec;
    ap.n_seqs = n_dec;
    bool have = false;
    /* the feed after the tables and the work list: a backend that holds a
     * step's copies issues them together (engine/cuda/backend_cuda.c up_flush) */
    if ((s = eng_graph_prepare(be, &ap, B, &have, err)) || (s = apply_feed(m, b, B, err)))
        return s;
    if (have && m->opts.decode_graphs == ENG_GRAPHS_ON) {
        s = eng_graph_launch(be, B, err);
        eng_graph_finish(be);
        return s;
    }
    bool record = m->opts.decode_graphs == ENG_GRAPHS_ON && !m->graph_failed[bi];
    const struct eng_mat lx = mat(m->xn, 0, c->hidden), lo = mat(m->lo, 0, c->vocab);
    struct inf_err e2 = {0};
    for (;;) {
        if (record && (s = eng_graph_record(be, B, true, &e2)))
            break;
        s = body(m, &ap, B, n_dec, 0, &e2);
        if (s == INF_OK)
            s = linear(m, &m->lm_head, lx, lo, true, B, &e2);
        if (!record)
            break;
        if (s == INF_OK) {
            s = eng_graph_record(be, B, false, &e2); /* ends it; launches it if kept */
            if (s != INF_E_UNSUPPORTED)
                break;
        } else {
            eng_graph_finish(be); /* abandons the recording */
            if (s != INF_E_UNSUPPORTED)
                break;
            struct inf_err e3 = {0};
            if ((s = eng_graph_prepare(be, &ap, B, &have, &e3))) {
                e2 = e3;
                break;
            }
        }
        /* Something on the path cannot be recorded: this bucket runs its
         * ops as they come from now on. */
        inf_log(WARN, "decode graph of %d rows not recorded (%s); running it eagerly", B, e2.msg);
        m->graph_failed[bi] = true;
        record = false;
    }
    if (s != INF_OK)
        inf_err_set(err, s, "%s", e2.msg);
    eng_graph_finish(be);
    return s;
}

/* Everything up to the final norm: xn holds the normalized rows; *n_lr of
 * them want logits (their indices in host_lrows). A decode step that went
 * through decode_graph has its logits in lo already (*in_lo). */
static inf_status_t forward_hidden(eng_model_t *m, const struct eng_batch *b, int32_t *n_lr_out,
                                   bool *in_lo, struct inf_err *err)
{
    struct eng_backend *be = m->be;
    int32_t n_dec = 0, n_pre = 0, n_lr = 0;
    *in_lo = false;
    if (m->opts.n_kv_blocks == 0)
        return inf_err_set(err, INF_E_INVALID, "the KV cache is not reserved");
    inf_status_t s = plan(m, b, &n_dec, &n_pre, &n_lr, err);
    if (s != INF_OK)
        return s;
    *n_lr_out = n_lr;
    int32_t T = b->n_tokens;
    size_t bt_bytes = (size_t)b->n_slots * (size_t)b->max_blocks * sizeof(int32_t);
    if (!m->bt || m->bt->size < bt_bytes) {
        if (m->opts.max_slots > 0 && m->opts.max_seq_blocks > 0)
            return inf_err_set(err, INF_E_TOOBIG,
                               "a block table of %d x %d exceeds the planned %d x %d", b->n_slots,
                               b->max_blocks, m->opts.max_slots, m->opts.max_seq_blocks);
        eng_buf_free(be, m->bt);
        m->bt = NULL;
        if ((s = eng_buf_alloc(be, bt_bytes, &m->bt, err)))
            return s;
    }
    int32_t bi = n_pre == 0 && n_lr == T && m->graph_rows > 0 ? bucket_of(m, T) : -1;
    if (bi >= 0 && b->n_slots <= m->opts.max_slots && b->max_blocks <= m->opts.max_seq_blocks) {
        *in_lo = true;
        return decode_graph(m, b, bi, n_dec, err);
    }
    if ((s = eng_buf_upload(be, m->tok, 0, b->tokens, (size_t)T * 4, err)) ||
        (s = apply_feed(m, b, T, err)) ||
        (s = eng_buf_upload(be, m->pos, 0, b->pos, (size_t)T * 4, err)) ||
        (s = eng_buf_upload(be, m->seq_dec, 0, m->host_seq_dec, (size_t)n_dec * 12, err)) ||
        (s = eng_buf_upload(be, m->seq_pre, 0, m->host_seq_pre, (size_t)n_pre * 12, err)) ||
        (s = eng_buf_upload(be, m->bt, 0, b->block_table, bt_bytes, err)))
        return s;
    struct eng_attn_params ap = attn_params(m, b->n_slots, b->max_blocks);
    return body(m, &ap, T, n_dec, n_pre, err);
}

/* The logits of rows [r0, r0 + nr) of those wanting them, into lo. */
static inf_status_t logits_chunk(eng_model_t *m, int32_t r0, int32_t nr, struct inf_err *err)
{
    const struct eng_model_config *c = &m->cfg;
    struct eng_backend *be = m->be;
    int32_t H = c->hidden;
    inf_status_t s;
    /* This chunk's row indices go to the front of the index buffer. */
    if ((s = eng_buf_upload(be, m->lrows, 0, m->host_lrows + r0, (size_t)nr * 4, err)) ||
        (s = eng_op_rows_gather(be, mat(m->xn, 0, H), m->lrows, mat(m->lx, 0, H), H, nr, err)))
        return s;
    return linear(m, &m->lm_head, mat(m->lx, 0, H), mat(m->lo, 0, c->vocab), true, nr, err);
}

inf_status_t eng_model_forward(eng_model_t *m, const struct eng_batch *b, float *logits,
                               struct inf_err *err)
{
    const struct eng_model_config *c = &m->cfg;
    int32_t n_lr = 0;
    bool in_lo = false;
    inf_status_t s = forward_hidden(m, b, &n_lr, &in_lo, err);
    if (s != INF_OK)
        return s;
    if (in_lo)
        return eng_buf_download(m->be, m->lo, 0, logits, (size_t)n_lr * (size_t)c->vocab * 4, err);
    for (int32_t r0 = 0; r0 < n_lr; r0 += LOGIT_ROWS) {
        int32_t nr = n_lr - r0 < LOGIT_ROWS ? n_lr - r0 : LOGIT_ROWS;
        if ((s = logits_chunk(m, r0, nr, err)) ||
            (s = eng_buf_download(m->be, m->lo, 0, logits + (int64_t)r0 * c->vocab,
                                  (size_t)nr * (size_t)c->vocab * 4, err)))
            return s;
    }
    return INF_OK;
}

bool eng_model_can_sample(const eng_model_t *m)
{
    return m->samples != NULL;
}

/* One greedy step of b, its n_rows sampled rows wanting nothing else. */
static inf_status_t warm_step(eng_model_t *m, const struct eng_batch *b, int32_t n_rows,
                              struct eng_sample_row *rows, struct eng_sample_out *out,
                              struct inf_err *err)
{
    for (int32_t i = 0; i < n_rows; i++)
        rows[i] = (struct eng_sample_row){
            .logit_row = i, .top_p = 1.0f, .repetition_penalty = 1.0f};
    return eng_model_forward_sample(m, b, rows, n_rows, out, err);
}

inf_status_t eng_model_warm_up(eng_model_t *m, int32_t max_rows, int32_t prompt_tokens,
                               int32_t *n_graphs, int32_t *n_prompt, struct inf_err *err)
{
    *n_graphs = 0;
    *n_prompt = 0;
    if (!m->samples)
        return inf_err_set(err, INF_E_UNSUPPORTED, "backend %s does not sample",
                           eng_backend_name(m->be));
    const int32_t n_blocks = m->opts.n_kv_blocks;
    /* the prompt: within the step budget, the positions, the planned block
     * table and the pool */
    int32_t p = prompt_tokens;
    if (p > m->opts.max_tokens)
        p = m->opts.max_tokens;
    if (p > m->cfg.max_pos)
        p = m->cfg.max_pos;
    if (m->opts.max_seq_blocks > 0 && p > m->opts.max_seq_blocks * ENG_KV_BLOCK)
        p = m->opts.max_seq_blocks * ENG_KV_BLOCK;
    if ((int64_t)p > (int64_t)n_blocks * ENG_KV_BLOCK)
        p = n_blocks * ENG_KV_BLOCK;
    const int32_t n = p > k_buckets[N_BUCKETS - 1] ? p : k_buckets[N_BUCKETS - 1];
    int32_t *tok = calloc((size_t)n, sizeof *tok), *pos = calloc((size_t)n, sizeof *pos),
            *slot = calloc((size_t)n, sizeof *slot), *bt = calloc((size_t)n, sizeof *bt);
    uint8_t *want = calloc((size_t)n, 1);
    struct eng_sample_row *rows = calloc(k_buckets[N_BUCKETS - 1], sizeof *rows);
    struct eng_sample_out *out = calloc(k_buckets[N_BUCKETS - 1], sizeof *out);
    inf_status_t s = INF_OK;
    if (!tok || !pos || !slot || !bt || !want || !rows || !out) {
        s = inf_err_set(err, INF_E_NOMEM, "out of memory for the warm-up");
        goto done;
    }
    /* Prefills first: one sequence of 128 tokens (or fewer), then of p. They
     * run eagerly, so whatever an op sets up on its first call is in place
     * before the decode steps record their graphs. */
    for (int32_t k = 0; k < 2 && p > 0; k++) {
        const int32_t P = k == 0 && p > 128 ? 128 : p;
        for (int32_t t = 0; t < P; t++) {
            pos[t] = t;
            slot[t] = 0;
            want[t] = t == P - 1;
        }
        const int32_t nb = (P + ENG_KV_BLOCK - 1) / ENG_KV_BLOCK;
        for (int32_t j = 0; j < nb; j++)
            bt[j] = j;
        const struct eng_batch b = {.n_tokens = P, .tokens = tok, .pos = pos, .slot = slot,
                                    .want_logits = want, .n_logits = 1, .block_table = bt,
                                    .n_slots = 1, .max_blocks = nb};
        if ((s = warm_step(m, &b, 1, rows, out, err)))
            goto done;
        *n_prompt = P;
        if (P == p)
            break;
    }
    /* Decode steps: B sequences of one token at position 0, sequence k in
     * block k; each bucket records its graph and replays it (*n_graphs
     * counts the recorded ones: a bucket whose recording failed runs eagerly
     * from then on, logged by decode_graph). */
    for (int32_t i = 0; i < N_BUCKETS && m->graph_rows > 0; i++) {
        const int32_t B = k_buckets[i];
        if (B > max_rows || B > m->graph_rows || B > n_blocks || B > m->cap_samples)
            break;
        for (int32_t t = 0; t < B; t++) {
            pos[t] = 0;
            slot[t] = t;
            bt[t] = t;
            want[t] = 1;
        }
        const struct eng_batch b = {.n_tokens = B, .tokens = tok, .pos = pos, .slot = slot,
                                    .want_logits = want, .n_logits = B, .block_table = bt,
                                    .n_slots = B, .max_blocks = 1};
        if ((s = warm_step(m, &b, B, rows, out, err)))
            goto done;
        *n_graphs += !m->graph_failed[i];
    }
done:
    free(tok);
    free(pos);
    free(slot);
    free(bt);
    free(want);
    free(rows);
    free(out);
    return s;
}

/* A step and its sampling, queued: the results in m->samples. */
static inf_status_t sample_queue(eng_model_t *m, const struct eng_batch *b,
                                 const struct eng_sample_row *rows, int32_t n_rows,
                                 struct inf_err *err)
{
    const struct eng_model_config *c = &m->cfg;
    if (!m->samples)
        return inf_err_set(err, INF_E_UNSUPPORTED, "backend %s does not sample",
                           eng_backend_name(m->be));
    if (n_rows < 0 || n_rows > m->cap_samples)
        return inf_err_set(err, INF_E_TOOBIG, "%d sampled rows in a step, at most %d", n_rows,
                           m->cap_samples);
    for (int32_t i = 0; i < n_rows; i++)
        if (rows[i].logit_row < 0 || rows[i].logit_row >= b->n_logits ||
            (i > 0 && rows[i].logit_row < rows[i - 1].logit_row))
            return inf_err_set(err, INF_E_INVALID,
                               "sampled row %d: logits row %d (rows must be in order, < %d)", i,
                               rows[i].logit_row, b->n_logits);
    int32_t n_lr = 0;
    bool in_lo = false;
    inf_status_t s = forward_hidden(m, b, &n_lr, &in_lo, err);
    if (s != INF_OK)
        return s;
    if (in_lo)
        return eng_op_sample(m->be, m->lo, n_lr, c->vocab, rows, n_rows, m->samples, 0, err);
    int32_t i0 = 0;
    for (int32_t r0 = 0; r0 < n_lr && i0 < n_rows; r0 += LOGIT_ROWS) {
        int32_t nr = n_lr - r0 < LOGIT_ROWS ? n_lr - r0 : LOGIT_ROWS;
        int32_t i1 = i0;
        while (i1 < n_rows && rows[i1].logit_row < r0 + nr) {
            m->host_rows[i1 - i0] = rows[i1];
            m->host_rows[i1 - i0].logit_row -= r0;
            i1++;
        }
        if (i1 == i0)
            continue;
        if ((s = logits_chunk(m, r0, nr, err)) ||
            (s = eng_op_sample(m->be, m->lo, nr, c->vocab, m->host_rows, i1 - i0, m->samples, i0,
                               err)))
            return s;
        i0 = i1;
    }
    return INF_OK;
}

inf_status_t eng_model_forward_sample(eng_model_t *m, const struct eng_batch *b,
                                      const struct eng_sample_row *rows, int32_t n_rows,
                                      struct eng_sample_out *out, struct inf_err *err)
{
    if (m->n_sub > 0)
        return inf_err_set(err, INF_E_INVALID, "a step submitted is not collected yet");
    inf_status_t s = sample_queue(m, b, rows, n_rows, err);
    /* the step's one synchronization */
    return s != INF_OK
               ? s
               : eng_buf_download(m->be, m->samples, 0, out, (size_t)n_rows * sizeof *out, err);
}

bool eng_model_can_submit(const eng_model_t *m)
{
    return m->feed != NULL;
}

inf_status_t eng_model_sample_submit(eng_model_t *m, const struct eng_batch *b,
                                     const struct eng_sample_row *rows, int32_t n_rows,
                                     struct inf_err *err)
{
    if (!m->feed)
        return inf_err_set(err, INF_E_UNSUPPORTED, "backend %s does not submit steps",
                           eng_backend_name(m->be));
    if (m->n_sub == 2)
        return inf_err_set(err, INF_E_INVALID, "two steps submitted are not collected yet");
    inf_status_t s = sample_queue(m, b, rows, n_rows, err);
    if (s == INF_OK)
        s = eng_buf_download_start(
            m->be, m->samples, 0, (size_t)n_rows * sizeof(struct eng_sample_out), m->sub_next, err);
    if (s != INF_OK)
        return s;
    m->sub_next ^= 1;
    m->n_sub++;
    return INF_OK;
}

inf_status_t eng_model_sample_collect(eng_model_t *m, struct eng_sample_out *out,
                                      struct inf_err *err)
{
    if (m->n_sub == 0)
        return inf_err_set(err, INF_E_INVALID, "no step submitted");
    /* the oldest: with two in flight the slot the next submit would take */
    int slot = m->n_sub == 2 ? m->sub_next : m->sub_next ^ 1;
    m->n_sub--;
    return eng_buf_download_wait(m->be, slot, out, err);
}
