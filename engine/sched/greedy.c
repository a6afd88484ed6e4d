/* engine/sched/greedy.c — greedy generation straight through the model
 * (engine/sched/greedy.h). */
#define INF_LOG_MODULE "eng"
#include "engine/sched/greedy.h"
#include "engine/batch.h"
#include "engine/sched/kv_cache.h"

#include <stdlib.h>

/* Blocks one sequence needs for its prompt and n_new ids (the last id is
 * never fed back, so it takes no position). */
static int32_t seq_blocks(int32_t n_prompt, int32_t n_new)
{
    int64_t positions = (int64_t)n_prompt + n_new - 1;
    return (int32_t)((positions + ENG_KV_BLOCK - 1) / ENG_KV_BLOCK);
}

void eng_greedy_size(struct eng_model_opts *opts, int32_t n_seq, int32_t max_prompt, int32_t n_new)
{
    int32_t prefill = n_seq * max_prompt;
    opts->max_tokens = prefill > 64 ? prefill : 64;
    opts->n_kv_blocks = n_seq * seq_blocks(max_prompt, n_new);
}

static int32_t argmax(const float *l, int32_t n)
{
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (l[i] > l[best])
            best = i;
    return best;
}

inf_status_t eng_greedy_run(eng_model_t *m, const struct eng_greedy *g, int32_t *out,
                            struct inf_err *err)
{
    if (g->n_seq < 1 || g->n_new < 1)
        return inf_err_set(err, INF_E_INVALID, "greedy run needs sequences and ids to generate");
    int32_t max_prompt = 0, n_pre = 0;
    for (int32_t s = 0; s < g->n_seq; s++) {
        if (g->n_prompt[s] < 1)
            return inf_err_set(err, INF_E_INVALID, "prompt %d is empty", s);
        if (g->n_prompt[s] > max_prompt)
            max_prompt = g->n_prompt[s];
        n_pre += g->n_prompt[s];
    }
    int32_t V = eng_model_config(m)->vocab;
    int32_t max_blocks = seq_blocks(max_prompt, g->n_new);
    /* The prefill is the largest step: every prompt, and its logits rows. */
    size_t cap = (size_t)n_pre, rows = (size_t)g->n_seq + (g->all_logits0 ? g->n_prompt[0] : 0);
    eng_kv_cache_t *kv = NULL;
    int32_t *tok = malloc(sizeof *tok * cap), *pos = malloc(sizeof *pos * cap),
            *slot = malloc(sizeof *slot * cap);
    uint8_t *want = malloc(cap);
    float *logits = malloc(sizeof *logits * rows * (size_t)V);
    inf_status_t st;
    if (!tok || !pos || !slot || !want || !logits) {
        st = inf_err_set(err, INF_E_NOMEM, "out of memory for a greedy run");
        goto out;
    }
    st = eng_kv_cache_create(eng_model_n_kv_blocks(m), g->n_seq, max_blocks, &kv, err);
    if (st != INF_OK)
        goto out;
    for (int32_t step = 0; step < g->n_new; step++) {
        int32_t n = 0, nl = 0;
        for (int32_t s = 0; s < g->n_seq; s++) {
            int32_t np = g->n_prompt[s];
            int32_t from = step == 0 ? 0 : np + step - 1, to = np + step;
            st = eng_kv_seq_reserve(kv, s, to, err);
            if (st != INF_OK)
                goto out;
            for (int32_t p = from; p < to; p++) {
                tok[n] = p < np ? g->prompts[s][p] : out[(size_t)s * g->n_new + (p - np)];
                pos[n] = p;
                slot[n] = s;
                want[n] = p == to - 1 || (g->all_logits0 && s == 0);
                nl += want[n];
                n++;
            }
        }
        struct eng_batch b = {.n_tokens = n,
                              .tokens = tok,
                              .pos = pos,
                              .slot = slot,
                              .want_logits = want,
                              .n_logits = nl,
                              .block_table = eng_kv_cache_block_table(kv),
                              .n_slots = g->n_seq,
                              .max_blocks = max_blocks};
        uint64_t t0 = inf_now_ns();
        st = eng_model_forward(m, &b, logits, err);
        if (st != INF_OK)
            goto out;
        uint64_t ns = inf_now_ns() - t0;
        /* Each sequence's last wanted row is its next id. */
        int32_t row = 0;
        for (int32_t s = 0; s < g->n_seq; s++) {
            row += s == 0 && g->all_logits0 && step == 0 ? g->n_prompt[0] : 1;
            out[(size_t)s * g->n_new + step] = argmax(logits + (size_t)(row - 1) * V, V);
        }
        if (g->on_step)
            g->on_step(g->user, step, logits, ns);
    }
out:
    eng_kv_cache_destroy(kv);
    free(tok), free(pos), free(slot), free(want), free(logits);
    return st;
}
