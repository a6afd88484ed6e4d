/* int4serve-bench-cpu-decode — greedy decode throughput of the CPU backend
 * and where a step's time goes.
 *
 *   int4serve-bench-cpu-decode --model NAME=DIR [--model NAME=DIR ...]
 *       [--weights fp32,int4,int4-lmhead] [--threads 1,2,0] [--batches 1]
 *       [--prompt P] [--tokens N] [--repeat R] [--profile] [--print-ids]
 *
 * For each model, thread count (0: one per usable core), weights and batch
 * B: the checkpoint is loaded (fp32: quantization none; int4: group 128,
 * asymmetric, fused q/k/v and gate/up, embedding and lm_head kept 16-bit;
 * int4-lmhead: the lm_head quantized too), then R times B sequences of a
 * P-token prompt (ids 1..P) are prefilled in one step and N decode steps of
 * B tokens each run greedily. A decode step is timed from the end of the
 * last one to its own end: its batch, its forward (the download of the
 * logits included) and the argmax of every row, which is how llama2.c's
 * run.c counts its tokens. Reported per run (the median of R): decode
 * tokens/s (B x N / time), ms per step, of which the forward and the rest
 * (sampling, the batch), and the context switches per step.
 *
 * --profile adds, per run, each backend op's share of the step (calls and
 * microseconds per step, the hand-off to the pool included), the pool's
 * hand-offs per step and the time the calling thread waited for the other
 * threads after its own share. --print-ids prints sequence 0's N + 1
 * generated ids of every run (bench/cpu_decode/vs_llama2c.sh compares them with
 * run.c's). Checkpoints come from int4serve-mkmodel (presets tiny, small,
 * stories15m, stories110m). */
#include "common/inf.h"
#include "engine/backend.h"
#include "engine/model.h"
#include "engine/sched/greedy.h"
#include "kernels/linear.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#define MAX_MODELS 8
#define MAX_LIST 8
#define MAX_REPEAT 32

enum weights { W_FP32, W_INT4, W_INT4_HEAD };
static const char *const weight_names[] = {"fp32", "int4", "int4-lmhead"};

struct step_clock {
    uint64_t last;    /* end of the previous step */
    uint64_t total;   /* decode steps, end to end */
    uint64_t forward; /* their forwards */
};

static void on_step(void *user, int32_t step, const float *logits, uint64_t ns)
{
    (void)logits;
    struct step_clock *c = user;
    uint64_t now = inf_now_ns();
    if (step > 0) {
        c->total += now - c->last;
        c->forward += ns;
    }
    c->last = now;
}

struct result {
    double tps, ms_step, ms_fwd, ms_host, csw_step;
    struct eng_cpu_prof prof;
};

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static long csw_now(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_nvcsw + ru.ru_nivcsw;
}

/* Load dir with weights w on be, then run the greedy decode `repeat` times;
 * *res is the run of median time. ids (may be NULL): sequence 0's ids. */
static int run_config(struct eng_backend *be, const char *dir, enum weights w, int batch,
                      int prompt, int tokens, int repeat, bool profile, int32_t *ids,
                      struct result *res)
{
    static const char *const keep_embed[] = {"model.embed_tokens.*"};
    struct eng_model_opts o;
    eng_model_opts_default(&o);
    o.quant = w == W_FP32 ? ENG_QUANT_NONE : ENG_QUANT_INT4;
    if (w == W_INT4_HEAD) {
        o.keep_fp16 = keep_embed;
        o.n_keep_fp16 = 1;
    }
    /* tokens decode steps follow the prefill: tokens + 1 ids per sequence */
    eng_greedy_size(&o, batch, prompt, tokens + 1);
    struct inf_err err = {0};
    eng_model_t *m = NULL;
    int rc = -1;
    int32_t *pids = malloc(sizeof(int32_t) * (size_t)prompt), *lens = NULL, *gen = NULL;
    const int32_t **prompts = NULL;
    struct result runs[MAX_REPEAT];
    double times[MAX_REPEAT];
    if (!pids)
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
        pids[p] = (1 + p) % V;
    for (int s = 0; s < batch; s++) {
        prompts[s] = pids;
        lens[s] = prompt;
    }
    for (int r = 0; r < repeat; r++) {
        struct step_clock clk = {0};
        struct eng_greedy g = {.n_seq = batch,
                               .prompts = prompts,
                               .n_prompt = lens,
                               .n_new = tokens + 1,
                               .on_step = on_step,
                               .user = &clk};
        if (profile)
            eng_backend_cpu_profile(be, true);
        long csw0 = csw_now();
        if (eng_greedy_run(m, &g, gen, &err) != INF_OK) {
            fprintf(stderr, "bench: %s\n", err.msg);
            goto out;
        }
        long csw = csw_now() - csw0;
        struct result *x = &runs[r];
        memset(x, 0, sizeof *x);
        if (profile) {
            eng_backend_cpu_profile_read(be, &x->prof);
            eng_backend_cpu_profile(be, false);
        }
        x->tps = (double)batch * tokens / ((double)clk.total / 1e9);
        x->ms_step = (double)clk.total / 1e6 / tokens;
        x->ms_fwd = (double)clk.forward / 1e6 / tokens;
        x->ms_host = x->ms_step - x->ms_fwd;
        x->csw_step = (double)csw / (tokens + 1);
        times[r] = x->ms_step;
    }
    double sorted[MAX_REPEAT];
    memcpy(sorted, times, sizeof(double) * (size_t)repeat);
    qsort(sorted, (size_t)repeat, sizeof(double), cmp_double);
    for (int r = 0; r < repeat; r++)
        if (times[r] == sorted[repeat / 2]) {
            *res = runs[r];
            break;
        }
    if (ids)
        memcpy(ids, gen, sizeof(int32_t) * (size_t)(tokens + 1));
    rc = 0;
out:
    free(pids), free(prompts), free(lens), free(gen);
    eng_model_destroy(m);
    return rc;
}

/* The profile of one run: ops by their share of the step. */
static void print_profile(const struct result *r, int tokens, int prompt, int batch)
{
    const struct eng_cpu_prof *p = &r->prof;
    /* the prefill's ops are in the profile too: a decode step's share is
     * estimated by the calls of each op per step and the decode ops only */
    const double steps = tokens + 1;
    double us_step = r->ms_step * 1e3, sum = 0;
    int order[ENG_CPU_PROF_OPS];
    for (int i = 0; i < p->n_ops; i++)
        order[i] = i;
    for (int i = 1; i < p->n_ops; i++)
        for (int j = i; j > 0 && p->ops[order[j]].ns > p->ops[order[j - 1]].ns; j--) {
            int t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    printf("  | op | n x k | calls/step | us/step | share |\n");
    printf("  | --- | --- | ---: | ---: | ---: |\n");
    for (int oi = 0; oi < p->n_ops; oi++) {
        const struct eng_cpu_prof_op *o = &p->ops[order[oi]];
        double us = (double)o->ns / 1e3 / steps;
        sum += us;
        char shape[32] = "";
        if (o->n > 0)
            snprintf(shape, sizeof shape, "%d x %d", o->n, o->k);
        printf("  | %s | %s | %.1f | %.1f | %.1f%% |\n", o->name, shape, (double)o->calls / steps,
               us, 100.0 * us / us_step);
    }
    double fwd_other = r->ms_fwd * 1e3 - sum;
    printf("  | rest of the forward (uploads, logits download, model) | | | %.1f | %.1f%% |\n",
           fwd_other, 100.0 * fwd_other / us_step);
    printf("  | sampling (argmax) and the next batch | | | %.1f | %.1f%% |\n", r->ms_host * 1e3,
           100.0 * r->ms_host * 1e3 / us_step);
    printf("  hand-offs: %.1f per step; the caller waited %.1f us per step for the other "
           "threads; %.1f context switches per step (prompt %d, batch %d; the prefill is "
           "counted in every per-step figure above)\n",
           (double)p->handoffs / steps, (double)p->handoff_wait_ns / 1e3 / steps, r->csw_step,
           prompt, batch);
}

static int parse_list(const char *arg, int *out, int lo, int hi)
{
    int64_t v[MAX_LIST];
    long n = inf_int_list_parse(arg, v, MAX_LIST);
    if (n < 1 || n > MAX_LIST)
        return -1;
    for (long i = 0; i < n; i++) {
        if (v[i] < lo || v[i] > hi)
            return -1;
        out[i] = (int)v[i];
    }
    return (int)n;
}

static int parse_weights(char *arg, enum weights *out)
{
    int n = 0;
    for (char *tok = strtok(arg, ","); tok; tok = strtok(NULL, ",")) {
        int w = -1;
        for (int i = 0; i < 3; i++)
            if (strcmp(tok, weight_names[i]) == 0)
                w = i;
        if (w < 0 || n == MAX_LIST)
            return -1;
        out[n++] = (enum weights)w;
    }
    return n ? n : -1;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: int4serve-bench-cpu-decode --model NAME=DIR ... [--weights "
               "fp32,int4,int4-lmhead]\n"
               "       [--threads 1,2,0] [--batches 1] [--prompt P] [--tokens N] [--repeat R]\n"
               "       [--profile] [--print-ids]\n");
}

int main(int argc, char **argv)
{
    const char *names[MAX_MODELS], *dirs[MAX_MODELS];
    int n_models = 0, prompt = 16, tokens = 128, repeat = 1;
    int threads[MAX_LIST] = {1, 2, 0}, n_threads = 3;
    int batches[MAX_LIST] = {1}, n_batches = 1;
    enum weights weights[MAX_LIST] = {W_FP32, W_INT4, W_INT4_HEAD};
    int n_weights = 3;
    bool profile = false, print_ids = false;
    enum {
        O_MODEL = 256,
        O_PROMPT,
        O_TOKENS,
        O_THREADS,
        O_BATCHES,
        O_WEIGHTS,
        O_REPEAT,
        O_PROF,
        O_IDS
    };
    static const struct option lo[] = {
        {"model", required_argument, 0, O_MODEL},     {"prompt", required_argument, 0, O_PROMPT},
        {"tokens", required_argument, 0, O_TOKENS},   {"threads", required_argument, 0, O_THREADS},
        {"batches", required_argument, 0, O_BATCHES}, {"weights", required_argument, 0, O_WEIGHTS},
        {"repeat", required_argument, 0, O_REPEAT},   {"profile", no_argument, 0, O_PROF},
        {"print-ids", no_argument, 0, O_IDS},         {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (c) {
        case O_MODEL: {
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
        case O_PROMPT:
            prompt = atoi(optarg);
            break;
        case O_TOKENS:
            tokens = atoi(optarg);
            break;
        case O_REPEAT:
            repeat = atoi(optarg);
            break;
        case O_THREADS:
            if ((n_threads = parse_list(optarg, threads, 0, 1024)) < 0) {
                fprintf(stderr, "bench: --threads takes up to %d counts in [0, 1024]\n", MAX_LIST);
                return 2;
            }
            break;
        case O_BATCHES:
            if ((n_batches = parse_list(optarg, batches, 1, 256)) < 0) {
                fprintf(stderr, "bench: --batches takes up to %d sizes in [1, 256]\n", MAX_LIST);
                return 2;
            }
            break;
        case O_WEIGHTS:
            if ((n_weights = parse_weights(optarg, weights)) < 0) {
                fprintf(stderr, "bench: --weights takes fp32, int4 and int4-lmhead\n");
                return 2;
            }
            break;
        case O_PROF:
            profile = true;
            break;
        case O_IDS:
            print_ids = true;
            break;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (n_models == 0 || prompt < 1 || tokens < 1 || repeat < 1 || repeat > MAX_REPEAT) {
        usage(stderr);
        fprintf(stderr, "bench: give at least one --model NAME=DIR; --repeat in [1, %d]\n",
                MAX_REPEAT);
        return 2;
    }
    inf_log_set_level(INF_LOG_WARN);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(tokens + 1));
    if (!ids)
        return 1;
    printf("CPU decode: prompt %d, %d decode steps, median of %d; kernels %s\n", prompt, tokens,
           repeat, krn_cpu_isa_name(krn_cpu_isa_get()));
    printf("| model | threads | weights | batch | tok/s | ms/step | forward ms | sampling+batch "
           "ms | context switches/step |\n");
    printf("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    int rc = 0;
    for (int ti = 0; ti < n_threads; ti++) {
        struct eng_backend_cpu_opts bo = {.n_threads = threads[ti]};
        struct eng_backend *be;
        struct inf_err err;
        if (eng_backend_cpu_create(&bo, &be, &err) != INF_OK) {
            fprintf(stderr, "bench: %s\n", err.msg);
            free(ids);
            return 1;
        }
        int nt = eng_backend_cpu_threads(be);
        for (int mi = 0; mi < n_models; mi++)
            for (int wi = 0; wi < n_weights; wi++)
                for (int bi = 0; bi < n_batches; bi++) {
                    struct result r;
                    if (run_config(be, dirs[mi], weights[wi], batches[bi], prompt, tokens, repeat,
                                   profile, ids, &r)) {
                        rc = 1;
                        continue;
                    }
                    printf("| %s | %d | %s | %d | %.1f | %.3f | %.3f | %.3f | %.1f |\n", names[mi],
                           nt, weight_names[weights[wi]], batches[bi], r.tps, r.ms_step, r.ms_fwd,
                           r.ms_host, r.csw_step);
                    if (profile)
                        print_profile(&r, tokens, prompt, batches[bi]);
                    if (print_ids) {
                        printf("ids %s %d %s:", names[mi], nt, weight_names[weights[wi]]);
                        for (int i = 0; i <= tokens; i++)
                            printf(" %d", ids[i]);
                        printf("\n");
                    }
                    fflush(stdout);
                }
        eng_backend_destroy(be);
    }
    free(ids);
    return rc;
}
