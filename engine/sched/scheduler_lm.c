/* engine/sched/scheduler_lm.c — the real model and tokenizer behind the scheduler's
 * interfaces: struct eng_lm over engine/model.h on a backend, and struct
 * eng_detok_ops over tokenizer/tokenizer.h's streaming detokenizer. */
#define INF_LOG_MODULE "eng"
#include "engine/backend.h"
#include "engine/model.h"
#include "engine/sched/scheduler_lm.h"
#include "tokenizer/tokenizer.h"

#include <stdlib.h>
#include <string.h>

struct model_lm {
    struct eng_backend *be;
    eng_model_t *m;
    struct eng_lm_keep keep; /* alive as long as the model */
};

void eng_lm_keep_fini(struct eng_lm_keep *k)
{
    for (int32_t i = 0; i < k->n; i++)
        free(k->p[i]);
    free(k->p);
    k->p = NULL;
    k->n = 0;
}

/* The configuration names layers by substring ("lm_head"); the model matches
 * fnmatch(3) patterns over full tensor names. A name without glob characters
 * becomes "*name*"; a pattern is kept as it is. */
static inf_status_t make_keep(struct eng_lm_keep *k, const char *const *names, int32_t n)
{
    k->p = calloc((size_t)n, sizeof *k->p);
    if (!k->p)
        return INF_E_NOMEM;
    for (int32_t i = 0; i < n; i++) {
        size_t len = strlen(names[i]);
        char *p = malloc(len + 3);
        if (!p)
            return INF_E_NOMEM;
        if (strpbrk(names[i], "*?["))
            memcpy(p, names[i], len + 1);
        else {
            p[0] = '*';
            memcpy(p + 1, names[i], len);
            p[len + 1] = '*';
            p[len + 2] = '\0';
        }
        k->p[k->n++] = p;
    }
    return INF_OK;
}

static inf_status_t model_kv_reserve(void *self, int32_t n_blocks, struct inf_err *err)
{
    struct model_lm *x = self;
    /* Pools taken at load are kept when they are the size asked; otherwise
     * (none at load, or another size) they are taken now. */
    if (n_blocks == eng_model_n_kv_blocks(x->m))
        return INF_OK;
    return eng_model_kv_reserve(x->m, n_blocks, err);
}

static inf_status_t model_forward(void *self, const struct eng_batch *b, float *logits,
                                  struct inf_err *err)
{
    struct model_lm *x = self;
    return eng_model_forward(x->m, b, logits, err);
}

static inf_status_t model_forward_sample(void *self, const struct eng_batch *b,
                                         const struct eng_sample_row *rows, int32_t n_rows,
                                         struct eng_sample_out *out, struct inf_err *err)
{
    struct model_lm *x = self;
    return eng_model_forward_sample(x->m, b, rows, n_rows, out, err);
}

static inf_status_t model_submit(void *self, const struct eng_batch *b,
                                 const struct eng_sample_row *rows, int32_t n_rows,
                                 struct inf_err *err)
{
    struct model_lm *x = self;
    return eng_model_sample_submit(x->m, b, rows, n_rows, err);
}

static inf_status_t model_collect(void *self, struct eng_sample_out *out, struct inf_err *err)
{
    struct model_lm *x = self;
    return eng_model_sample_collect(x->m, out, err);
}

static inf_status_t model_warm_up(void *self, int32_t max_rows, int32_t prompt_tokens,
                                  int32_t *n_graphs, int32_t *n_prompt, struct inf_err *err)
{
    struct model_lm *x = self;
    return eng_model_warm_up(x->m, max_rows, prompt_tokens, n_graphs, n_prompt, err);
}

static void model_destroy(void *self)
{
    struct model_lm *x = self;
    if (!x)
        return;
    eng_model_destroy(x->m);
    eng_backend_destroy(x->be);
    eng_lm_keep_fini(&x->keep);
    free(x);
}

/* ---- the identity of the KV content ---------------------------------------------------- */
static uint64_t id_mix(uint64_t h, uint64_t v)
{
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h ^= h >> 31;
    h *= 0xbf58476d1ce4e5b9ull;
    return h ^ (h >> 29);
}

static uint64_t id_float(uint64_t h, float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return id_mix(h, u);
}

/* What the KV blocks' content depends on besides the token ids: the
 * checkpoint (its folder and shapes), how its weights are quantized, and
 * the dtypes the backend computes and keeps KV in (struct eng_lm kv_id). */
static uint64_t kv_identity(const struct eng_lm_model_opts *o, const struct eng_model_config *c,
                            const struct eng_backend *be)
{
    uint64_t h = 0x6b765f6964ull; /* "kv_id" */
    for (const char *p = o->dir; p && *p; p++)
        h = id_mix(h, (unsigned char)*p);
    const int64_t shape[] = {c->arch,    c->hidden,      c->intermediate,      c->n_layers,
                             c->n_heads, c->n_kv_heads,  c->head_dim,          c->vocab,
                             c->max_pos, c->rope_llama3, c->rope_orig_max_pos, c->tie_embeddings,
                             c->qkv_bias};
    for (size_t i = 0; i < sizeof shape / sizeof shape[0]; i++)
        h = id_mix(h, (uint64_t)shape[i]);
    if (c->sliding_window > 0) /* mixed in only where set: other models keep their ids */
        h = id_mix(h, (uint64_t)c->sliding_window);
    h = id_float(h, c->rms_eps);
    h = id_float(h, c->rope_theta);
    h = id_float(h, c->rope_factor);
    h = id_float(h, c->rope_low_freq);
    h = id_float(h, c->rope_high_freq);
    h = id_mix(h, (uint64_t)o->quantization << 40 | (uint64_t)o->symmetric << 32 |
                      (uint32_t)o->group_size);
    for (int32_t i = 0; i < o->n_keep_fp16; i++)
        for (const char *p = o->keep_fp16[i]; *p; p++)
            h = id_mix(h, (unsigned char)*p);
    h = id_mix(h, (uint64_t)o->fuse_qkv);
    h = id_mix(h, (uint64_t)be->act_dtype << 8 | (uint64_t)be->kv_dtype);
    return h ? h : 1;
}

void eng_lm_model_opts_from_config(const struct eng_config *cfg, struct eng_lm_model_opts *o)
{
    *o = (struct eng_lm_model_opts){
        .dir = cfg->model_dir,
        .quantization = cfg->quantization,
        .group_size = cfg->group_size,
        .symmetric = cfg->symmetric,
        .fuse_qkv = cfg->fuse_qkv,
        .keep_fp16 = cfg->keep_fp16,
        .n_keep_fp16 = cfg->n_keep_fp16,
        .max_tokens = cfg->max_batched_tokens,
        .kv_blocks = (int32_t)(cfg->kv_cache_tokens / ENG_KV_BLOCK),
        .max_batch = cfg->max_batch,
        .max_model_len = cfg->max_model_len,
        .eager = cfg->enforce_eager,
    };
}

inf_status_t eng_lm_model_load(const struct eng_lm_model_opts *o, struct eng_backend *be,
                               int32_t tp_rank, int32_t tp_size, struct eng_lm_keep *keep,
                               eng_model_t **out, struct inf_err *err)
{
    *out = NULL;
    struct eng_model_opts mo;
    eng_model_opts_default(&mo);
    switch (o->quantization) {
    case ENG_QUANTIZATION_AUTO:
        mo.quant = ENG_QUANT_AUTO;
        break;
    case ENG_QUANTIZATION_INT4:
        mo.quant = ENG_QUANT_INT4;
        break;
    case ENG_QUANTIZATION_AWQ:
        mo.quant = ENG_QUANT_AWQ;
        break;
    case ENG_QUANTIZATION_GPTQ:
        mo.quant = ENG_QUANT_GPTQ;
        break;
    case ENG_QUANTIZATION_CT:
        mo.quant = ENG_QUANT_CT;
        break;
    default:
        mo.quant = ENG_QUANT_NONE;
        break;
    }
    if (o->group_size)
        mo.group_size = o->group_size < 0 ? 0 : o->group_size;
    mo.symmetric = o->symmetric;
    mo.fuse_qkv = o->fuse_qkv;
    if (o->n_keep_fp16 > 0) {
        if (make_keep(keep, o->keep_fp16, o->n_keep_fp16) != INF_OK) {
            eng_lm_keep_fini(keep);
            return inf_err_set(err, INF_E_NOMEM, "out of memory");
        }
        mo.keep_fp16 = (const char *const *)keep->p;
        mo.n_keep_fp16 = keep->n;
    }
    mo.max_tokens = o->max_tokens;
    mo.n_kv_blocks = o->kv_blocks;
    if (o->eager)
        mo.decode_graphs = ENG_GRAPHS_OFF;
    if (o->max_batch > 0 && o->max_model_len > 0) {
        mo.max_slots = o->max_batch;
        mo.max_seq_blocks = (o->max_model_len + ENG_KV_BLOCK - 1) / ENG_KV_BLOCK;
    }
    mo.tp_rank = tp_rank;
    mo.tp_size = tp_size;
    mo.no_logits = tp_rank > 0;
    inf_status_t st = eng_model_load(o->dir, be, &mo, out, err);
    if (st != INF_OK)
        eng_lm_keep_fini(keep);
    return st;
}

void eng_lm_describe(struct eng_lm *lm, const struct eng_lm_model_opts *o, const eng_model_t *m,
                     const struct eng_backend *be, int32_t tp_size)
{
    const struct eng_model_config *c = eng_model_config(m);
    lm->name = eng_backend_name(be);
    lm->vocab = c->vocab;
    lm->max_len = c->max_pos;
    lm->window = c->sliding_window;
    lm->bos_id = c->bos_id;
    lm->n_eos = 0;
    for (int32_t i = 0; i < c->n_eos && lm->n_eos < ENG_LM_MAX_EOS; i++)
        if (c->eos_ids[i] >= 0 && c->eos_ids[i] < c->vocab)
            lm->eos_ids[lm->n_eos++] = c->eos_ids[i];
    /* a group's sums are taken in another order than one rank's */
    lm->kv_id = id_mix(kv_identity(o, c, be), (uint64_t)(tp_size > 1 ? tp_size : 1));
}

inf_status_t eng_lm_model_create(const struct eng_lm_model_opts *o, struct eng_backend *be,
                                 struct eng_lm *lm, struct inf_err *err)
{
    struct model_lm *x = calloc(1, sizeof *x);
    if (!x)
        return inf_err_set(err, INF_E_NOMEM, "out of memory");
    x->be = be;
    inf_status_t st = eng_lm_model_load(o, be, 0, 1, &x->keep, &x->m, err);
    if (st != INF_OK) {
        free(x);
        return st;
    }
    memset(lm, 0, sizeof *lm);
    lm->self = x;
    eng_lm_describe(lm, o, x->m, be, 1);
    lm->kv_reserve = model_kv_reserve;
    lm->forward = model_forward;
    /* Backends that sample on the device return only token ids and logprobs. */
    lm->forward_sample = eng_model_can_sample(x->m) ? model_forward_sample : NULL;
    lm->warm_up = eng_model_can_sample(x->m) ? model_warm_up : NULL;
    if (eng_model_can_submit(x->m)) {
        lm->submit = model_submit;
        lm->collect = model_collect;
    }
    lm->destroy = model_destroy;
    return INF_OK;
}

const struct eng_model *eng_lm_model(const struct eng_lm *lm)
{
    const struct model_lm *x = lm->self;
    return x->m;
}

/* ---- detokenizer ------------------------------------------------------------------------ */
static void *tok_open(void *self, const int32_t *prompt, int32_t n_prompt)
{
    (void)prompt;
    (void)n_prompt;
    /* Completions continue the prompt: no start-of-text rules (a leading
     * space of the first generated token is kept). Special tokens give no
     * text. */
    struct tok_stream_opts so = {.skip_special = true, .continuation = true};
    tok_stream_t *s = NULL;
    if (tok_stream_create(self, &so, &s, NULL) != INF_OK)
        return NULL;
    return s;
}

static inf_status_t tok_push(void *st, int32_t tok, struct eng_strbuf *out)
{
    const char *d;
    size_t n;
    inf_status_t s = tok_stream_push(st, tok, &d, &n, NULL);
    if (s == INF_E_RANGE)
        return INF_OK; /* an id the tokenizer lacks (model vocab padding): no text */
    if (s != INF_OK)
        return s;
    return eng_strbuf_append(out, d, n);
}

static inf_status_t tok_flush(void *st, struct eng_strbuf *out)
{
    const char *d;
    size_t n;
    inf_status_t s = tok_stream_finish(st, &d, &n, NULL);
    if (s != INF_OK)
        return s;
    return eng_strbuf_append(out, d, n);
}

static void tok_close(void *st)
{
    tok_stream_destroy(st);
}

void eng_lm_detok_ops(tok_tokenizer_t *tok, struct eng_detok_ops *ops)
{
    ops->self = tok;
    ops->open = tok_open;
    ops->push = tok_push;
    ops->flush = tok_flush;
    ops->close = tok_close;
}
