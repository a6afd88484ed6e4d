/* GPU test: the engine (scheduler, engine thread, real model) with
 * backend = cuda. Six random prompts of 3 to 90 tokens are generated greedily
 * (16 tokens, EOS ignored) one at a time, then all at once with
 * max_batch 8 and a step budget of 64 tokens (so long prompts are prefilled
 * in chunks next to running decodes). Pass: every request gives the same
 * tokens alone and batched; engine info names the cuda backend. The same
 * requests on the CPU backend are run too and their agreement with the GPU
 * is printed (information: near-ties may differ between fp32 and fp16
 * activations). Checkpoint: argv[1], else made by int4serve-mkmodel
 * ($INT4SERVE_MKMODEL or $INT4SERVE_BUILD_DIR/tools/mkmodel; tiny preset).
 * Prints "SKIPPED: no GPU" without a GPU. */
#include "common/inf.h"
#include "engine/eng.h"

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define N_REQ 6
#define GEN 16

static int32_t toks[N_REQ + 1][GEN];
static int32_t n_toks[N_REQ + 1];
static int ended[N_REQ + 1], errors;

static void on_notify(void *user)
{
    (void)user;
}

static void take(eng_engine_t *eng)
{
    struct eng_event *ev = eng_events_take(eng);
    while (ev) {
        struct eng_event *next = (struct eng_event *)(void *)ev->node.next;
        if (ev->req_id >= 1 && ev->req_id <= N_REQ) {
            uint64_t id = ev->req_id;
            if (ev->kind == ENG_EV_DELTA) {
                for (int i = 0; i < ev->n_tokens && n_toks[id] < GEN; i++)
                    toks[id][n_toks[id]++] = ev->tokens[i].id;
            } else {
                ended[id] = 1;
                if (ev->kind == ENG_EV_ERROR) {
                    errors++;
                    fprintf(stderr, "request %llu failed: %s\n", (unsigned long long)id, ev->msg);
                }
            }
        }
        eng_event_destroy(ev);
        ev = next;
    }
}

static int32_t prompts[N_REQ][96];
static const int32_t prompt_len[N_REQ] = {5, 90, 3, 33, 64, 17};

static void submit(eng_engine_t *eng, int r)
{
    struct eng_request *q = eng_request_create();
    q->id = (uint64_t)r + 1;
    q->n_prompt = prompt_len[r];
    q->prompt = malloc(sizeof(int32_t) * (size_t)prompt_len[r]);
    memcpy(q->prompt, prompts[r], sizeof(int32_t) * (size_t)prompt_len[r]);
    q->max_tokens = GEN;
    q->sampling.temperature = 0.0f;
    q->sampling.ignore_eos = true;
    struct inf_err err = {0};
    if (eng_request_submit(eng, q, &err) != INF_OK) {
        fprintf(stderr, "FATAL submit: %s\n", err.msg);
        exit(2);
    }
}

static void wait_all(eng_engine_t *eng, int want)
{
    for (int spins = 0; spins < 60000; spins++) {
        take(eng);
        int n = 0;
        for (int i = 1; i <= N_REQ; i++)
            n += ended[i];
        if (n >= want)
            return;
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    fprintf(stderr, "FATAL: timed out\n");
    exit(2);
}

static void reset(void)
{
    memset(toks, 0, sizeof toks);
    memset(n_toks, 0, sizeof n_toks);
    memset(ended, 0, sizeof ended);
}

static eng_engine_t *open_engine(const char *dir, enum eng_backend_kind kind)
{
    struct eng_config cfg = {0};
    cfg.backend = kind;
    cfg.model_dir = dir;
    cfg.max_batch = 8;
    cfg.max_batched_tokens = 64;
    cfg.max_model_len = 160;
    cfg.quantize = true;
    cfg.group_size = 128;
    cfg.fuse_qkv = true;
    cfg.max_queue = 64;
    eng_engine_t *eng = NULL;
    struct inf_err err = {0};
    if (eng_engine_create(&cfg, on_notify, NULL, &eng, &err) != INF_OK) {
        fprintf(stderr, "FATAL engine create: %s\n", err.msg);
        exit(2);
    }
    return eng;
}

int main(int argc, char **argv)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        printf("SKIPPED: no GPU\n");
        return 0;
    }
    char tmp[] = "/tmp/int4serve-gpu-engine-XXXXXX";
    char dir[600];
    if (argc > 1) {
        snprintf(dir, sizeof dir, "%s", argv[1]);
    } else {
        const char *mk = getenv("INT4SERVE_MKMODEL");
        char mkpath[512];
        if (!mk) {
            const char *bd = getenv("INT4SERVE_BUILD_DIR");
            snprintf(mkpath, sizeof mkpath, "%s/tools/mkmodel/int4serve-mkmodel", bd ? bd : ".");
            mk = mkpath;
        }
        if (!mkdtemp(tmp))
            return 2;
        snprintf(dir, sizeof dir, "%s/m", tmp);
        char cmd[1400];
        snprintf(cmd, sizeof cmd, "'%s' --preset tiny --max-pos 512 --seed 5 --out '%s' >/dev/null",
                 mk, dir);
        if (system(cmd) != 0) {
            fprintf(stderr, "FATAL: %s failed\n", cmd);
            return 2;
        }
    }
    uint64_t s = 777;
    for (int r = 0; r < N_REQ; r++)
        for (int i = 0; i < prompt_len[r]; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            prompts[r][i] = (int32_t)((s >> 33) % 256); /* byte tokens: in every vocab */
        }
    int fails = 0, checks = 0;
    static int32_t alone[N_REQ + 1][GEN], cpu[N_REQ + 1][GEN];

    eng_engine_t *eng = open_engine(dir, ENG_BACKEND_CUDA);
    struct eng_info info;
    eng_engine_info(eng, &info);
    checks++;
    if (strcmp(info.backend_name, "cuda") != 0) {
        fails++;
        printf("FAIL engine backend is %s, not cuda\n", info.backend_name);
    }
    for (int r = 0; r < N_REQ; r++) {
        reset();
        submit(eng, r);
        wait_all(eng, 1);
        memcpy(alone[r + 1], toks[r + 1], sizeof alone[r + 1]);
    }
    reset();
    for (int r = 0; r < N_REQ; r++)
        submit(eng, r);
    wait_all(eng, N_REQ);
    for (int r = 1; r <= N_REQ; r++) {
        checks++;
        bool ok = n_toks[r] == GEN && memcmp(toks[r], alone[r], sizeof alone[r]) == 0;
        fails += !ok;
        printf("%-4s request %d (prompt %2d): batched == alone (%d tokens)\n", ok ? "ok" : "FAIL",
               r, prompt_len[r - 1], n_toks[r]);
    }
    eng_engine_destroy(eng);
    checks++;
    if (errors) {
        fails++;
        printf("FAIL %d requests ended with an error\n", errors);
    }

    eng = open_engine(dir, ENG_BACKEND_CPU);
    reset();
    for (int r = 0; r < N_REQ; r++)
        submit(eng, r);
    wait_all(eng, N_REQ);
    memcpy(cpu, toks, sizeof cpu);
    eng_engine_destroy(eng);
    int same = 0, total = 0;
    for (int r = 1; r <= N_REQ; r++)
        for (int i = 0; i < GEN; i++) {
            /* count the prefix that agrees: after a first difference the
             * sequences diverge by construction */
            if (cpu[r][i] != alone[r][i])
                break;
            same++;
        }
    total = N_REQ * GEN;
    printf("info GPU vs CPU greedy: %d of %d tokens agree before the first difference\n", same,
           total);
    if (argc <= 1) {
        char cmd[700];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
        if (system(cmd) != 0)
            fprintf(stderr, "warning: could not remove %s\n", tmp);
    }
    printf("%s: %d of %d checks failed\n", fails ? "FAILED" : "PASSED", fails, checks);
    return fails ? 1 : 0;
}
