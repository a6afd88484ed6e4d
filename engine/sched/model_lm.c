/* engine/sched/model_lm.c — the CPU model as the scheduler's language model
 * (struct eng_lm of engine/sched/scheduler_impl.h) from an engine configuration
 * alone: a CPU backend under engine/sched/scheduler_lm.c's adapter, with the KV
 * pools sized by the scheduler's kv_reserve. */
#define INF_LOG_MODULE "eng"
#include "engine/backend.h"
#include "engine/eng.h"
#include "engine/model.h"
#include "engine/sched/scheduler_lm.h"

inf_status_t eng_model_lm_create(const struct eng_config *cfg, struct eng_lm *lm,
                                 struct inf_err *err)
{
    if (cfg->backend != ENG_BACKEND_CPU)
        return inf_err_set(err, INF_E_UNSUPPORTED, "backend: only cpu loads a model here");
    struct eng_backend *be = NULL;
    struct eng_backend_cpu_opts bo = {.n_threads = cfg->threads};
    inf_status_t st = eng_backend_cpu_create(&bo, &be, err);
    if (st != INF_OK)
        return st;
    struct eng_lm_model_opts lo;
    eng_lm_model_opts_from_config(cfg, &lo);
    if (lo.max_tokens <= 0)
        lo.max_tokens = 2048;
    lo.kv_blocks = 0; /* sized by kv_reserve */
    st = eng_lm_model_create(&lo, be, lm, err);
    if (st != INF_OK) {
        eng_backend_destroy(be);
        return st;
    }
    if (cfg->max_model_len > 0 && cfg->max_model_len < lm->max_len)
        lm->max_len = cfg->max_model_len;
    return INF_OK;
}
