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
#include "engine/quant.h"
#include "engine/safetensors.h"

#include <fnmatch.h>
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

/* Upload (or quantize and repack) the f32 weight w[n][k] as linear `name`. */
static inf_status_t make_linear(struct eng_model *m, const char *name, const float *w, int32_t n,
                                int32_t k, const float *bias, bool keep, struct lin *l,
                                struct inf_err *err)
{
    inf_status_t s;
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
        struct krn_q4_weight q;
        s = eng_q4_quantize(w, n, k, m->opts.group_size, m->opts.symmetric, &q, err);
        if (s != INF_OK)
            return s;
        s = eng_weight_q4_create(m->be, &q, &l->q4, err);
        inf->quantized = true;
        inf->kp = q.kp;
        inf->group = q.group;
        eng_q4_free(&q);
        if (s != INF_OK)
            return s;
    } else {
        size_t cnt = (size_t)n * (size_t)k;
        l->wdt = m->opts.quant == ENG_QUANT_INT4 ? ENG_W_F16 : ENG_W_F32;
        inf->fp_dtype = l->wdt;
        inf->kp = k;
        if (l->wdt == ENG_W_F32) {
            s = eng_buf_from_host(m->be, w, cnt * 4, &l->w, err);
        } else {
            uint16_t *h = malloc(cnt * 2);
            if (!h)
                return inf_err_set(err, INF_E_NOMEM, "out of memory converting %s", name);
            for (size_t i = 0; i < cnt; i++)
                h[i] = inf_f32_to_f16(w[i]);
            s = eng_buf_from_host(m->be, h, cnt * 2, &l->w, err);
            free(h);
        }
        if (s != INF_OK)
            return s;
    }
    if (bias)
        return eng_buf_from_host(m->be, bias, (size_t)n * 4, &l->bias, err);
    return INF_OK;
}

/* Load the parts (suffixes like "q_proj") of module prefix, each [n_i][k],
 * as one fused linear (fused) or one linear each into l[0..np). */
static inf_status_t load_group(struct eng_model *m, const eng_st_t *st, const char *prefix,
                               const char *const *parts, const int32_t *rows, int32_t np, int32_t k,
                               bool with_bias, const char *fused_name, struct lin *l,
                               struct inf_err *err)
{
    int64_t total = 0;
    for (int32_t i = 0; i < np; i++)
        total += rows[i];
    float *w = malloc((size_t)total * (size_t)k * sizeof(float));
    float *b = with_bias ? malloc((size_t)total * sizeof(float)) : NULL;
    inf_status_t s = INF_OK;
    char names[3][256];
    const char *name_ptrs[4];
    if (!w || (with_bias && !b)) {
        s = inf_err_set(err, INF_E_NOMEM, "out of memory loading %s", prefix);
        goto done;
    }
    int64_t r0 = 0;
    for (int32_t i = 0; i < np; i++) {
        char bn[256];
        snprintf(names[i], sizeof names[i], "%s.%s.weight", prefix, parts[i]);
        name_ptrs[i] = names[i];
        s = read_tensor(st, names[i], rows[i], k, w + r0 * k, err);
        if (s != INF_OK)
            goto done;
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
        s = make_linear(m, lname, w, (int32_t)total, k, b, keep_fp(m, name_ptrs, np + 1), &l[0],
                        err);
    } else {
        r0 = 0;
        for (int32_t i = 0; i < np && s == INF_OK; i++) {
            char lname[320];
            snprintf(lname, sizeof lname, "%s.%s", prefix, parts[i]);
            s = make_linear(m, lname, w + r0 * k, rows[i], k, b ? b + r0 : NULL,
                            keep_fp(m, &name_ptrs[i], 1), &l[i], err);
            r0 += rows[i];
        }
    }
done:
    free(w);
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
    inf_status_t s = load_group(m, st, base, parts, &n, 1, k, false, NULL, l, err);
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

static inf_status_t load_embed_and_head(struct eng_model *m, const eng_st_t *st,
                                        struct inf_err *err)
{
    int32_t V = m->cfg.vocab, H = m->cfg.hidden;
    size_t cnt = (size_t)V * (size_t)H;
    float *w = malloc(cnt * sizeof(float));
    if (!w)
        return inf_err_set(err, INF_E_NOMEM, "out of memory loading the embeddings");
    inf_status_t s = read_tensor(st, "model.embed_tokens.weight", V, H, w, err);
    if (s != INF_OK)
        goto done;
    m->embed_dt = m->opts.quant == ENG_QUANT_INT4 ? ENG_W_F16 : ENG_W_F32;
    if (m->embed_dt == ENG_W_F32) {
        s = eng_buf_from_host(m->be, w, cnt * 4, &m->embed, err);
    } else {
        uint16_t *h = malloc(cnt * 2);
        if (!h) {
            s = inf_err_set(err, INF_E_NOMEM, "out of memory converting the embeddings");
            goto done;
        }
        for (size_t i = 0; i < cnt; i++)
            h[i] = inf_f32_to_f16(w[i]);
        s = eng_buf_from_host(m->be, h, cnt * 2, &m->embed, err);
        free(h);
    }
    if (s != INF_OK)
        goto done;
    const char *hn[1] = {"lm_head.weight"};
    bool keep = keep_fp(m, hn, 1);
    if (m->cfg.tie_embeddings && (keep || m->opts.quant == ENG_QUANT_NONE)) {
        /* The tied head reads the embedding table as is. */
        struct eng_layer_info *inf = add_info(m);
        if (!inf) {
            s = inf_err_set(err, INF_E_NOMEM, "out of memory for layer records");
            goto done;
        }
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
    } else if (m->cfg.tie_embeddings) {
        s = make_linear(m, "lm_head (tied)", w, V, H, NULL, false, &m->lm_head, err);
    } else {
        s = read_tensor(st, "lm_head.weight", V, H, w, err);
        if (s == INF_OK)
            s = make_linear(m, "lm_head", w, V, H, NULL, keep, &m->lm_head, err);
    }
done:
    free(w);
    return s;
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

static inf_status_t alloc_work(struct eng_model *m, struct inf_err *err)
{
    const struct eng_model_config *c = &m->cfg;
    int64_t T = m->opts.max_tokens;
    size_t es = eng_act_size(m->be->act_dtype);
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
        (s = alloc_act(m, &m->lo, (int64_t)LOGIT_ROWS * c->vocab, 4, err)) ||
        (s = alloc_act(m, &m->tok, T, 4, err)) || (s = alloc_act(m, &m->pos, T, 4, err)) ||
        (s = alloc_act(m, &m->seq_dec, T * 3, 4, err)) ||
        (s = alloc_act(m, &m->seq_pre, T * 3, 4, err)) || (s = alloc_act(m, &m->lrows, T, 4, err)))
        return s;
    m->host_seq_dec = malloc((size_t)T * 3 * sizeof(int32_t));
    m->host_seq_pre = malloc((size_t)T * 3 * sizeof(int32_t));
    m->host_lrows = malloc((size_t)T * sizeof(int32_t));
    if (!m->host_seq_dec || !m->host_seq_pre || !m->host_lrows)
        return inf_err_set(err, INF_E_NOMEM, "out of memory for batch tables");
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
    if (o.max_tokens <= 0 || o.n_kv_blocks < 0 || o.n_keep_fp16 < 0)
        return inf_err_set(err, INF_E_INVALID, "max_tokens must be > 0 and n_kv_blocks >= 0");
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
        if ((s = load_group(m, st, pre, qkv_parts, qkv_rows, 3, H, c->qkv_bias, "qkv_proj", L->qkv,
                            err)))
            goto fail;
        snprintf(nm, sizeof nm, "%s.o_proj", pre);
        if ((s = load_single(m, st, nm, H, qd, &L->o, err)))
            goto fail;
        snprintf(pre, sizeof pre, "model.layers.%d.mlp", l);
        if ((s = load_group(m, st, pre, gu_parts, gu_rows, 2, H, false, "gate_up_proj", L->gu,
                            err)))
            goto fail;
        snprintf(nm, sizeof nm, "%s.down_proj", pre);
        if ((s = load_single(m, st, nm, H, I, &L->down, err)))
            goto fail;
    }
    if ((s = load_norm(m, st, "model.norm.weight", &m->final_norm, err)) ||
        (s = load_embed_and_head(m, st, err)) || (s = alloc_work(m, err)))
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
    struct eng_buf *bufs[] = {m->x,  m->xn,  m->d,   m->qkv,     m->att,     m->gu,    m->h, m->lx,
                              m->lo, m->tok, m->pos, m->seq_dec, m->seq_pre, m->lrows, m->bt};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        eng_buf_free(be, bufs[i]);
    free(m->host_seq_dec);
    free(m->host_seq_pre);
    free(m->host_lrows);
    free(m->layers);
    free(m->info);
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

inf_status_t eng_model_forward(eng_model_t *m, const struct eng_batch *b, float *logits,
                               struct inf_err *err)
{
    const struct eng_model_config *c = &m->cfg;
    struct eng_backend *be = m->be;
    int32_t n_dec = 0, n_pre = 0, n_lr = 0;
    if (m->opts.n_kv_blocks == 0)
        return inf_err_set(err, INF_E_INVALID, "the KV cache is not reserved");
    inf_status_t s = plan(m, b, &n_dec, &n_pre, &n_lr, err);
    if (s != INF_OK)
        return s;
    int32_t T = b->n_tokens, H = c->hidden, I = c->intermediate, hd = c->head_dim;
    int32_t qd = c->n_heads * hd, kvd = c->n_kv_heads * hd, qkvw = qd + 2 * kvd;
    size_t bt_bytes = (size_t)b->n_slots * (size_t)b->max_blocks * sizeof(int32_t);
    if (!m->bt || m->bt->size < bt_bytes) {
        eng_buf_free(be, m->bt);
        m->bt = NULL;
        if ((s = eng_buf_alloc(be, bt_bytes, &m->bt, err)))
            return s;
    }
    if ((s = eng_buf_upload(be, m->tok, 0, b->tokens, (size_t)T * 4, err)) ||
        (s = eng_buf_upload(be, m->pos, 0, b->pos, (size_t)T * 4, err)) ||
        (s = eng_buf_upload(be, m->seq_dec, 0, m->host_seq_dec, (size_t)n_dec * 12, err)) ||
        (s = eng_buf_upload(be, m->seq_pre, 0, m->host_seq_pre, (size_t)n_pre * 12, err)) ||
        (s = eng_buf_upload(be, m->bt, 0, b->block_table, bt_bytes, err)))
        return s;

    struct eng_mat x = mat(m->x, 0, H), xn = mat(m->xn, 0, H), d = mat(m->d, 0, H);
    if ((s = eng_op_embedding(be, m->embed, m->embed_dt, c->vocab, H, m->tok, x, T, err)))
        return s;
    struct eng_attn_params ap = {.n_heads = c->n_heads,
                                 .n_kv_heads = c->n_kv_heads,
                                 .head_dim = hd,
                                 .scale = 1.0f / sqrtf((float)hd),
                                 .q = mat(m->qkv, 0, qkvw),
                                 .k = mat(m->qkv, qd, qkvw),
                                 .v = mat(m->qkv, qd + kvd, qkvw),
                                 .out = mat(m->att, 0, qd),
                                 .pos = m->pos,
                                 .block_table = m->bt,
                                 .n_slots = b->n_slots,
                                 .max_blocks = b->max_blocks,
                                 .n_blocks = m->opts.n_kv_blocks};
    for (int32_t l = 0; l < c->n_layers; l++) {
        struct layer *L = &m->layers[l];
        if ((s = eng_op_rmsnorm_add(be, x, l ? &d : NULL, L->attn_norm, c->rms_eps, xn, H, T, err)))
            return s;
        if (m->fused) {
            s = linear(m, &L->qkv[0], xn, ap.q, false, T, err);
        } else if (!(s = linear(m, &L->qkv[0], xn, ap.q, false, T, err)) &&
                   !(s = linear(m, &L->qkv[1], xn, ap.k, false, T, err))) {
            s = linear(m, &L->qkv[2], xn, ap.v, false, T, err);
        }
        if (s)
            return s;
        /* q and k heads are adjacent in a qkv row: one rotation covers both. */
        if ((s = eng_op_rope(be, ap.q, c->n_heads + c->n_kv_heads, hd, m->pos, &m->rope, T, err)))
            return s;
        ap.k_cache = L->k_cache;
        ap.v_cache = L->v_cache;
        ap.seqs = m->seq_dec;
        ap.n_seqs = n_dec;
        if ((s = eng_op_attn_decode(be, &ap, err)))
            return s;
        ap.seqs = m->seq_pre;
        ap.n_seqs = n_pre;
        if ((s = eng_op_attn_prefill(be, &ap, err)))
            return s;
        if ((s = linear(m, &L->o, ap.out, d, false, T, err)) ||
            (s = eng_op_rmsnorm_add(be, x, &d, L->mlp_norm, c->rms_eps, xn, H, T, err)))
            return s;
        struct eng_mat g = mat(m->gu, 0, 2 * I), u = mat(m->gu, I, 2 * I);
        if (m->fused) {
            s = linear(m, &L->gu[0], xn, g, false, T, err);
        } else if (!(s = linear(m, &L->gu[0], xn, g, false, T, err))) {
            s = linear(m, &L->gu[1], xn, u, false, T, err);
        }
        if (s)
            return s;
        struct eng_mat hm = mat(m->h, 0, I);
        if ((s = eng_op_silu_mul(be, g, u, hm, I, T, err)) ||
            (s = linear(m, &L->down, hm, d, false, T, err)))
            return s;
    }
    if ((s = eng_op_rmsnorm_add(be, x, &d, m->final_norm, c->rms_eps, xn, H, T, err)))
        return s;
    for (int32_t r0 = 0; r0 < n_lr; r0 += LOGIT_ROWS) {
        int32_t nr = n_lr - r0 < LOGIT_ROWS ? n_lr - r0 : LOGIT_ROWS;
        /* This chunk's row indices go to the front of the index buffer. */
        if ((s = eng_buf_upload(be, m->lrows, 0, m->host_lrows + r0, (size_t)nr * 4, err)) ||
            (s = eng_op_rows_gather(be, xn, m->lrows, mat(m->lx, 0, H), H, nr, err)) ||
            (s = linear(m, &m->lm_head, mat(m->lx, 0, H), mat(m->lo, 0, c->vocab), true, nr,
                        err)) ||
            (s = eng_buf_download(be, m->lo, 0, logits + (int64_t)r0 * c->vocab,
                                  (size_t)nr * (size_t)c->vocab * 4, err)))
            return s;
    }
    return INF_OK;
}
