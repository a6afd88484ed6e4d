#pragma once
/* Test helper (header only): the architecture table of
 * tests/engine/test_arch_matrix.c (CPU) and tests/gpu/gpu_arch_matrix.c
 * (CUDA) and the runs both make of a model: Llama 2 (multi-head), Llama 3
 * (its RoPE scaling, grouped KV, bf16), Mistral (a sliding window of 8
 * keys), Qwen2 (q/k/v bias) and a
 * tied-embedding Llama. A run (am_run_model) gives
 *   one token   the logits after a 9-token prompt;
 *   batch       16 prompts of 1 to 29 tokens prefilled in one step, then one
 *               decode step of all 16: each sequence's last logits;
 *   alone       each sequence the same way in a KV cache of its own.
 * The includer defines AM_REQUIRE(cond, fmt, ...), its way to fail. */
#include "engine/backend.h"
#include "engine/model.h"
#include "engine/sched/kv_cache.h"
#include "test_model_util.h"

#include <stdint.h>
#include <string.h>

#define N_SEQ 16
#define MAX_LEN 32 /* a prompt and its decoded token */

static const struct tm_spec ARCHS[] = {
    {.arch = "llama", /* Llama 2: one KV head per query head */
     .hidden = 64,
     .intermediate = 160,
     .layers = 2,
     .heads = 4,
     .kv_heads = 4,
     .vocab = 96,
     .rope_theta = 10000.0f,
     .dtype = ENG_DT_F16,
     .seed = 31},
    {.arch = "llama", /* Llama 3: rope_scaling llama3, 8 query heads on 2 */
     .hidden = 64,
     .intermediate = 128,
     .layers = 2,
     .heads = 8,
     .kv_heads = 2,
     .vocab = 88,
     .llama3 = 1,
     .rope_theta = 500000.0f,
     .dtype = ENG_DT_BF16,
     .seed = 32},
    {.arch = "mistral", /* Mistral-7B-v0.1's sliding window, scaled to the prompts of 1 to
                         * 29 tokens: shorter, as long and longer than the window */
     .hidden = 64,
     .intermediate = 96,
     .layers = 2,
     .heads = 8,
     .kv_heads = 2,
     .vocab = 64,
     .rope_theta = 1000000.0f,
     .dtype = ENG_DT_F16,
     .seed = 33,
     .sliding_window = 8},
    {.arch = "qwen2", /* q/k/v biases: the fused split must carry them */
     .hidden = 64,
     .intermediate = 128,
     .layers = 2,
     .heads = 4,
     .kv_heads = 2,
     .vocab = 72,
     .rope_theta = 1000000.0f,
     .dtype = ENG_DT_F32,
     .seed = 34},
    {.arch = "llama", /* the lm_head is the embedding */
     .hidden = 64,
     .intermediate = 192,
     .layers = 3,
     .heads = 4,
     .kv_heads = 2,
     .vocab = 80,
     .tie = 1,
     .rope_theta = 10000.0f,
     .dtype = ENG_DT_F32,
     .seed = 35},
};
static const char *const ARCH_NAMES[] = {"llama2", "llama3", "mistral", "qwen2", "tied"};

/* One forward step over seqs [0, n): sequence s (in KV slot slot0 + s) adds
 * its tokens [start[s], start[s] + len[s]); the logits of each sequence's
 * last token go to out[s][vocab]. */
static void am_step(eng_model_t *m, eng_kv_cache_t *kv, int slot0, int n, int32_t (*tk)[MAX_LEN],
                    const int *start, const int *len, float *out)
{
    int32_t tok[N_SEQ * MAX_LEN], pos[N_SEQ * MAX_LEN], slot[N_SEQ * MAX_LEN];
    uint8_t want[N_SEQ * MAX_LEN];
    int t = 0;
    struct inf_err err = {0};
    for (int s = 0; s < n; s++) {
        AM_REQUIRE(eng_kv_seq_reserve(kv, slot0 + s, start[s] + len[s], &err) == INF_OK,
                   "reserve: %s", err.msg);
        for (int i = 0; i < len[s]; i++, t++) {
            tok[t] = tk[s][start[s] + i];
            pos[t] = start[s] + i;
            slot[t] = slot0 + s;
            want[t] = i == len[s] - 1;
        }
    }
    struct eng_batch b = {.n_tokens = t,
                          .tokens = tok,
                          .pos = pos,
                          .slot = slot,
                          .want_logits = want,
                          .n_logits = n,
                          .block_table = eng_kv_cache_block_table(kv),
                          .n_slots = eng_kv_cache_n_slots(kv),
                          .max_blocks = eng_kv_cache_max_blocks(kv)};
    inf_status_t s = eng_model_forward(m, &b, out, &err);
    AM_REQUIRE(s == INF_OK, "forward: %s", err.msg);
}

/* Logits, [sequence][vocab] rows (vocab at most 128) */
struct am_run {
    float one[128];               /* one token: after the 9-token prompt */
    float pre[N_SEQ * 128];       /* batch: after each prompt */
    float dec[N_SEQ * 128];       /* batch: after the decode step */
    float alone_pre[N_SEQ * 128]; /* each sequence alone */
    float alone_dec[N_SEQ * 128];
};

/* The prompts: sequence s has plen[s] tokens, then one more for the decode
 * step (the same id in every run, so the runs compare). */
static int32_t toks[N_SEQ][MAX_LEN];
static int plen[N_SEQ];

/* The prompts of spec sp's runs. */
static void am_prompts(const struct tm_spec *sp)
{
    uint64_t seed = sp->seed * 977;
    for (int s = 0; s < N_SEQ; s++) {
        plen[s] = 1 + (s * 7) % 29; /* 1 to 29, mixed */
        for (int i = 0; i < MAX_LEN; i++)
            toks[s][i] = (int32_t)(tm_rng_next(&seed) % (uint64_t)sp->vocab);
    }
}

static void am_run_model(eng_model_t *m, int V, struct am_run *r)
{
    eng_kv_cache_t *kv;
    struct inf_err err = {0};
    const int zero[N_SEQ] = {0}, nine[1] = {9},
              one[N_SEQ] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    AM_REQUIRE(eng_kv_cache_create(64, 1, 4, &kv, &err) == INF_OK, "kv: %s", err.msg);
    am_step(m, kv, 0, 1, toks, zero, nine, r->one);
    eng_kv_cache_destroy(kv);

    AM_REQUIRE(eng_kv_cache_create(64, N_SEQ, 4, &kv, &err) == INF_OK, "kv: %s", err.msg);
    am_step(m, kv, 0, N_SEQ, toks, zero, plen, r->pre);
    am_step(m, kv, 0, N_SEQ, toks, plen, one, r->dec);
    eng_kv_cache_destroy(kv);

    for (int s = 0; s < N_SEQ; s++) {
        AM_REQUIRE(eng_kv_cache_create(64, 1, 4, &kv, &err) == INF_OK, "kv: %s", err.msg);
        am_step(m, kv, 0, 1, &toks[s], zero, &plen[s], r->alone_pre + s * V);
        am_step(m, kv, 0, 1, &toks[s], &plen[s], one, r->alone_dec + s * V);
        eng_kv_cache_destroy(kv);
    }
}
