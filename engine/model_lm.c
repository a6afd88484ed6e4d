/* engine/model_lm.c — the CPU model as the scheduler's language model
 * (struct eng_lm of engine/scheduler_impl.h): a CPU backend and a model
 * loaded per the engine configuration, with the KV pools sized by the
 * scheduler's kv_reserve. */
#define INF_LOG_MODULE "eng"
#include "engine/eng.h"
#include "engine/model.h"
#include "engine/scheduler_impl.h"

#include <stdlib.h>

struct model_lm {
    struct eng_backend *be;
    eng_model_t *model;
};

static inf_status_t lm_kv_reserve(void *self, int32_t n_blocks, struct inf_err *err)
{
    struct model_lm *l = self;
    return eng_model_kv_reserve(l->model, n_blocks, err);
}

static inf_status_t lm_forward(void *self, const struct eng_batch *b, float *logits,
                               struct inf_err *err)
{
    struct model_lm *l = self;
    return eng_model_forward(l->model, b, logits, err);
}

static void lm_destroy(void *self)
{
    struct model_lm *l = self;
    if (!l)
        return;
    eng_model_destroy(l->model);
    eng_backend_destroy(l->be);
    free(l);
}

inf_status_t eng_model_lm_create(const struct eng_config *cfg, struct eng_lm *lm,
                                 struct inf_err *err)
{
    if (cfg->backend != ENG_BACKEND_CPU)
        return inf_err_set(err, INF_E_UNSUPPORTED, "backend: only cpu loads a model here");
    struct model_lm *l = calloc(1, sizeof *l);
    if (!l)
        return inf_err_set(err, INF_E_NOMEM, "out of memory for a model");
    struct eng_backend_cpu_opts bo = {.n_threads = cfg->threads};
    inf_status_t s = eng_backend_cpu_create(&bo, &l->be, err);
    if (s != INF_OK)
        goto fail;
    struct eng_model_opts mo;
    eng_model_opts_default(&mo);
    mo.quant = cfg->quantize ? ENG_QUANT_INT4 : ENG_QUANT_NONE;
    mo.group_size = cfg->group_size < 0 ? 0 : cfg->group_size;
    mo.symmetric = cfg->symmetric;
    mo.fuse_qkv = cfg->fuse_qkv;
    if (cfg->keep_fp16) {
        mo.keep_fp16 = cfg->keep_fp16;
        mo.n_keep_fp16 = cfg->n_keep_fp16;
    }
    mo.max_tokens = cfg->max_batched_tokens > 0 ? cfg->max_batched_tokens : 2048;
    mo.n_kv_blocks = 0; /* sized by kv_reserve */
    s = eng_model_load(cfg->model_dir, l->be, &mo, &l->model, err);
    if (s != INF_OK)
        goto fail;
    const struct eng_model_config *mc = eng_model_config(l->model);
    *lm = (struct eng_lm){.self = l,
                          .name = "cpu",
                          .vocab = mc->vocab,
                          .max_len = cfg->max_model_len > 0 && cfg->max_model_len < mc->max_pos
                                         ? cfg->max_model_len
                                         : mc->max_pos,
                          .bos_id = mc->bos_id,
                          .n_eos = mc->n_eos < ENG_LM_MAX_EOS ? mc->n_eos : ENG_LM_MAX_EOS,
                          .kv_reserve = lm_kv_reserve,
                          .forward = lm_forward,
                          .destroy = lm_destroy};
    for (int32_t i = 0; i < lm->n_eos; i++)
        lm->eos_ids[i] = mc->eos_ids[i];
    return INF_OK;
fail:
    lm_destroy(l);
    return s;
}
