/* int4serve-bench-cpu-decode — greedy decode throughput of the CPU backend,
 * fp32 (quantization none) against INT4 (group 128, asymmetric, fused), in
 * one run, at batch 1 and 16 (or --batches).
 *
 *   int4serve-bench-cpu-decode --model NAME=DIR [--model NAME=DIR ...]
 *       [--prompt P] [--tokens N] [--threads T] [--batches 1,16]
 *
 * For each model, quantization and batch B: B sequences of a P-token prompt
 * (ids 1..P) are prefilled in one step, then N decode steps of B tokens each
 * are timed. Reported: decode tokens/s (B x N / time), ms per step, and the
 * weight bytes the backend holds. Checkpoints come from int4serve-mkmodel
 * (presets tiny and small). */
#include "common/inf.h"
#include "engine/backend.h"
#include "engine/sched/greedy.h"
#include "engine/model.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_MODELS 8
#define MAX_BATCHES 8

/* Nanoseconds of the decode steps (every step after the prefill). */
static void on_step(void *user, int32_t step, const float *logits, uint64_t ns)
{
    (void)logits;
    if (step > 0)
        *(uint64_t *)user += ns;
}

static int run_one(struct eng_backend *be, const char *dir, enum eng_quant q, int batch, int prompt,
                   int tokens, double *tps, double *ms_step)
{
    /* tokens decode steps follow the prefill: tokens + 1 ids per sequence */
    struct eng_model_opts o;
    eng_model_opts_default(&o);
    o.quant = q;
    eng_greedy_size(&o, batch, prompt, tokens + 1);
    struct inf_err err = {0};
    eng_model_t *m = NULL;
    int rc = -1;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)prompt), *lens = NULL, *gen = NULL;
    const int32_t **prompts = NULL;
    if (!ids)
        goto out;
    if (eng_model_load(dir, be, &o, &m, &err) != INF_OK) {
        fprintf(stderr, "bench: %s\n", err.msg);
        goto out;
    }
    int V = eng_model_config(m)->vocab;
    prompts = malloc(sizeof *prompts * (size_t)batch);
    lens = malloc(sizeof *lens * (size_t)batch);
    gen = malloc(sizeof *gen * (size_t)batch * (size_t)(tokens + 1));
    if (!prompts || !lens || !gen)
        goto out;
    for (int p = 0; p < prompt; p++)
        ids[p] = (1 + p) % V;
    for (int s = 0; s < batch; s++) {
        prompts[s] = ids;
        lens[s] = prompt;
    }
    uint64_t t_dec = 0;
    struct eng_greedy g = {.n_seq = batch,
                           .prompts = prompts,
                           .n_prompt = lens,
                           .n_new = tokens + 1,
                           .on_step = on_step,
                           .user = &t_dec};
    if (eng_greedy_run(m, &g, gen, &err) != INF_OK) {
        fprintf(stderr, "bench: %s\n", err.msg);
        goto out;
    }
    *tps = (double)batch * tokens / ((double)t_dec / 1e9);
    *ms_step = (double)t_dec / 1e6 / tokens;
    rc = 0;
out:
    free(ids), free(prompts), free(lens), free(gen);
    eng_model_destroy(m);
    return rc;
}

int main(int argc, char **argv)
{
    const char *names[MAX_MODELS], *dirs[MAX_MODELS];
    int n_models = 0, prompt = 16, tokens = 64, threads = 0;
    int batches[MAX_BATCHES] = {1, 16}, n_batches = 2;
    static const struct option lo[] = {
        {"model", required_argument, 0, 'm'},   {"prompt", required_argument, 0, 'p'},
        {"tokens", required_argument, 0, 'n'},  {"threads", required_argument, 0, 't'},
        {"batches", required_argument, 0, 'b'}, {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (c) {
        case 'm': {
            char *eq = strchr(optarg, '=');
            if (!eq || n_models == MAX_MODELS) {
                fprintf(stderr, "bench: --model NAME=DIR (at most %d)\n", MAX_MODELS);
                return 2;
            }
            *eq = '\0';
            names[n_models] = optarg;
            dirs[n_models++] = eq + 1;
            break;
        }
        case 'p':
            prompt = atoi(optarg);
            break;
        case 'n':
            tokens = atoi(optarg);
            break;
        case 't':
            threads = atoi(optarg);
            break;
        case 'b': {
            int64_t v[MAX_BATCHES];
            long nb = inf_int_list_parse(optarg, v, MAX_BATCHES);
            if (nb < 1 || nb > MAX_BATCHES) {
                fprintf(stderr, "bench: --batches takes 1 to %d sizes such as 1,16\n", MAX_BATCHES);
                return 2;
            }
            n_batches = (int)nb;
            for (int i = 0; i < n_batches; i++)
                batches[i] = v[i] < 1 || v[i] > 256 ? 0 : (int)v[i]; /* 0: refused below */
            break;
        }
        default:
            fprintf(stderr, "usage: int4serve-bench-cpu-decode --model NAME=DIR ... [--prompt P] "
                            "[--tokens N] [--threads T] [--batches 1,16]\n");
            return 2;
        }
    }
    if (n_models == 0 || prompt < 1 || tokens < 1 || threads < 0) {
        fprintf(stderr, "bench: give at least one --model NAME=DIR\n");
        return 2;
    }
    for (int i = 0; i < n_batches; i++)
        if (batches[i] < 1 || batches[i] > 256) {
            fprintf(stderr, "bench: batch sizes must be in [1, 256]\n");
            return 2;
        }
    inf_log_set_level(INF_LOG_WARN);
    struct eng_backend_cpu_opts bo = {.n_threads = threads};
    struct eng_backend *be;
    struct inf_err err;
    if (eng_backend_cpu_create(&bo, &be, &err) != INF_OK) {
        fprintf(stderr, "bench: %s\n", err.msg);
        return 1;
    }
    printf("CPU decode, %d threads, prompt %d, %d decode steps\n", eng_backend_cpu_threads(be),
           prompt, tokens);
    printf("| model | batch | fp32 tok/s | fp32 ms/step | INT4 tok/s | INT4 ms/step | INT4 / fp32 "
           "|\n");
    printf("| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    int rc = 0;
    for (int mi = 0; mi < n_models; mi++)
        for (int bi = 0; bi < n_batches; bi++) {
            double tf, mf, tq, mq;
            if (run_one(be, dirs[mi], ENG_QUANT_NONE, batches[bi], prompt, tokens, &tf, &mf) ||
                run_one(be, dirs[mi], ENG_QUANT_INT4, batches[bi], prompt, tokens, &tq, &mq)) {
                rc = 1;
                continue;
            }
            printf("| %s | %d | %.1f | %.2f | %.1f | %.2f | %.2fx |\n", names[mi], batches[bi], tf,
                   mf, tq, mq, tq / tf);
            fflush(stdout);
        }
    eng_backend_destroy(be);
    return rc;
}
