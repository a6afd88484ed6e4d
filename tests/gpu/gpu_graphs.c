/* GPU test: decode steps replayed from CUDA graphs (engine/model.c's decode
 * buckets on the CUDA backend's graph slots).
 *
 * Three models of the same checkpoint, each on its own
 * CUDA backend: graphs on (recorded on first use, then replayed), the same
 * padded bucket shapes run eagerly, and graphs off (unpadded). For batches
 * of 1, 3, 8, 13, 24 and 40 sequences (buckets 1, 4, 8, 16, 24, 48; the
 * single sequence has a 600-token prompt, so its keys are split and
 * combined in the fixed-shape list), every model prefills the same prompts,
 * then runs 5 decode steps fed with the graph model's greedy tokens.
 * Pass: the replayed logits are bit-identical to the eager padded ones at
 * every step (replays 2..5 of each bucket read new tables and KV through the
 * recorded work); against the unpadded eager model they agree within 2e-2
 * relative (fp16, other split counts) with the same greedy token in at
 * least 90% of the rows; the device sampler on the replayed step gives the
 * greedy token of the same logits.
 * Checkpoints, each through all of the above: the tiny preset, and a
 * two-layer one of hidden 2048 whose o and down projections leave their
 * split-K sums to the RMSNorm after them at M <= 16 (fixed-point sums,
 * KRN_INT4_GEMM_ACC64): replays then also check that a recorded step
 * leaves those words as it found them. Made by int4serve-mkmodel ($INT4SERVE_MKMODEL or
 * $INT4SERVE_BUILD_DIR/tools/mkmodel). The wide checkpoint runs once more
 * on the sm_75 paths (engine.cuda_kernels = "sm75", what a T4 runs: no
 * PDL in the recorded graphs, no fixed-point sums). Fresh seed each run, printed;
 * INT4SERVE_TEST_SEED replays one. Prints "SKIPPED: no GPU" without one. */
#include "common/inf.h"
#include "engine/backend.h"
#include "engine/batch.h"
#include "engine/model.h"

#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_SEQ 48
#define MAX_BLOCKS 40 /* 640 positions */
#define STEPS 5

static uint64_t g_rng;
static int g_fail, g_checks;

static uint64_t rnd(void)
{
    uint64_t z = (g_rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        g_checks++;                                                                                \
        if (!(cond)) {                                                                             \
            g_fail++;                                                                              \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);                                            \
            printf(__VA_ARGS__);                                                                   \
            printf("\n");                                                                          \
        }                                                                                          \
    } while (0)

static void must(inf_status_t st, const struct inf_err *err, const char *what)
{
    if (st != INF_OK) {
        fprintf(stderr, "FATAL %s: %s\n", what, err->msg);
        exit(2);
    }
}

static int32_t argmax(const float *v, int32_t n)
{
    int32_t b = 0;
    for (int32_t i = 1; i < n; i++)
        if (v[i] > v[b])
            b = i;
    return b;
}

struct batch_buf {
    int32_t tok[MAX_SEQ * 640], pos[MAX_SEQ * 640], slot[MAX_SEQ * 640];
    uint8_t want[MAX_SEQ * 640];
    int32_t bt[MAX_SEQ * MAX_BLOCKS];
};

static int run_checkpoint(const char *mk, const char *tmp, const char *name, const char *args);

static bool g_sm75; /* the backends take the sm_75 paths */

int main(void)
{
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("SKIPPED: no GPU\n");
        return 77; /* ctest: skipped (SKIP_RETURN_CODE, tests/CMakeLists.txt) */
    }
    const char *se = getenv("INT4SERVE_TEST_SEED");
    g_rng = se ? strtoull(se, NULL, 10) : (uint64_t)time(NULL);
    printf("seed %llu\n", (unsigned long long)g_rng);
    char tmp[] = "/tmp/int4serve-gpu-graphs-XXXXXX";
    if (!mkdtemp(tmp))
        return 2;
    char mkpath[512];
    const char *mk = getenv("INT4SERVE_MKMODEL");
    if (!mk) {
        const char *bd = getenv("INT4SERVE_BUILD_DIR");
        snprintf(mkpath, sizeof mkpath, "%s/tools/mkmodel/int4serve-mkmodel", bd ? bd : ".");
        mk = mkpath;
    }
    /* the tiny preset, and two layers wide enough that the INT4 GEMM at
     * M <= 16 leaves the o and down projections' sums to the RMSNorm
     * (weights of 256 tiles of 128 x 128 and more) */
    int rc = run_checkpoint(mk, tmp, "tiny", "--preset tiny");
    if (rc == 0)
        rc = run_checkpoint(mk, tmp, "wide",
                            "--preset tiny --hidden 2048 --intermediate 5632 --layers 2 "
                            "--heads 16 --kv-heads 16");
    g_sm75 = true;
    if (rc == 0)
        rc = run_checkpoint(mk, tmp, "wide-sm75",
                            "--preset tiny --hidden 2048 --intermediate 5632 --layers 2 "
                            "--heads 16 --kv-heads 16");
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    if (system(cmd) != 0)
        fprintf(stderr, "warning: could not remove %s\n", tmp);
    if (rc)
        return rc;
    printf("%s: %d of %d checks failed\n", g_fail ? "FAILED" : "PASSED", g_fail, g_checks);
    return g_fail ? 1 : 0;
}

/* One checkpoint (mkmodel's arguments args) through every batch size. */
static int run_checkpoint(const char *mk, const char *tmp, const char *name, const char *args)
{
    char dir[600], cmd[1400];
    snprintf(dir, sizeof dir, "%s/%s", tmp, name);
    snprintf(cmd, sizeof cmd, "'%s' %s --max-pos 1024 --seed 9 --out '%s' >/dev/null", mk, args,
             dir);
    if (system(cmd) != 0) {
        fprintf(stderr, "FATAL: %s failed\n", cmd);
        return 2;
    }
    printf("checkpoint %s (%s)\n", name, args);
    struct inf_err err = {0};
    enum eng_graphs modes[3] = {ENG_GRAPHS_ON, ENG_GRAPHS_EAGER, ENG_GRAPHS_OFF};
    struct eng_backend *be[3];
    eng_model_t *m[3];
    for (int i = 0; i < 3; i++) {
        const struct eng_backend_cuda_opts bo = {.device = 0, .sm75 = g_sm75};
        must(eng_backend_cuda_create(&bo, &be[i], &err), &err, "backend");
        struct eng_model_opts o;
        eng_model_opts_default(&o);
        o.max_tokens = 1024;
        o.n_kv_blocks = 1024;
        o.max_slots = MAX_SEQ;
        o.max_seq_blocks = MAX_BLOCKS;
        o.decode_graphs = modes[i];
        must(eng_model_load(dir, be[i], &o, &m[i], &err), &err, "model");
    }
    const int32_t V = eng_model_config(m[0])->vocab;
    static struct batch_buf bb;
    float *lg[3];
    for (int i = 0; i < 3; i++)
        lg[i] = malloc((size_t)MAX_SEQ * V * sizeof(float));
    static const int32_t sizes[] = {1, 3, 8, 13, 24, 40};
    int32_t next_block = 0;
    long rows_close = 0, rows_total = 0;
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        const int32_t n = sizes[si];
        int32_t len[MAX_SEQ], last[MAX_SEQ];
        /* fresh blocks for every batch: no KV of an earlier batch is read */
        memset(bb.bt, 0xff, sizeof bb.bt);
        int32_t nt = 0;
        for (int32_t s = 0; s < n; s++) {
            len[s] = n == 1 ? 600 : 5 + (int32_t)(rnd() % (n >= 24 ? 20 : 40));
            int32_t nb = (len[s] + STEPS + 15) / 16;
            if (next_block + nb > 1024)
                next_block = 0;
            for (int32_t j = 0; j < nb; j++)
                bb.bt[s * MAX_BLOCKS + j] = next_block++;
            for (int32_t t = 0; t < len[s]; t++, nt++) {
                bb.tok[nt] = (int32_t)(rnd() % 256);
                bb.pos[nt] = t;
                bb.slot[nt] = s;
                bb.want[nt] = t == len[s] - 1;
            }
        }
        struct eng_batch b = {.n_tokens = nt,
                              .tokens = bb.tok,
                              .pos = bb.pos,
                              .slot = bb.slot,
                              .want_logits = bb.want,
                              .n_logits = n,
                              .block_table = bb.bt,
                              .n_slots = n,
                              .max_blocks = MAX_BLOCKS};
        for (int i = 0; i < 3; i++)
            must(eng_model_forward(m[i], &b, lg[i], &err), &err, "prefill");
        for (int32_t s = 0; s < n; s++)
            last[s] = argmax(lg[0] + (int64_t)s * V, V);
        for (int step = 0; step < STEPS; step++) {
            for (int32_t s = 0; s < n; s++) {
                bb.tok[s] = last[s];
                bb.pos[s] = len[s] + step;
                bb.slot[s] = s;
                bb.want[s] = 1;
            }
            b.n_tokens = n;
            for (int i = 0; i < 3; i++)
                must(eng_model_forward(m[i], &b, lg[i], &err), &err, "decode");
            size_t bytes = (size_t)n * V * sizeof(float);
            CHECK(memcmp(lg[0], lg[1], bytes) == 0,
                  "%d sequences, step %d: replayed logits differ from the eager padded ones", n,
                  step);
            double num = 0, den = 0;
            for (int64_t j = 0; j < (int64_t)n * V; j++) {
                double d = (double)lg[0][j] - lg[2][j];
                num += d * d;
                den += (double)lg[2][j] * lg[2][j];
            }
            double rel = sqrt(num / (den > 0 ? den : 1));
            CHECK(rel <= 2e-2, "%d sequences, step %d: %.3g from the unpadded eager logits", n,
                  step, rel);
            for (int32_t s = 0; s < n; s++) {
                int32_t a = argmax(lg[0] + (int64_t)s * V, V);
                rows_close += a == argmax(lg[2] + (int64_t)s * V, V);
                rows_total++;
                last[s] = a;
            }
            /* the device sampler on the same (replayed) step: greedy ids */
            struct eng_sample_row rows[MAX_SEQ];
            struct eng_sample_out out[MAX_SEQ];
            memset(rows, 0, sizeof rows);
            for (int32_t s = 0; s < n; s++) {
                rows[s].logit_row = s;
                rows[s].top_p = 1.0f;
                rows[s].repetition_penalty = 1.0f;
                rows[s].n_logprobs = 1;
            }
            must(eng_model_forward_sample(m[0], &b, rows, n, out, &err), &err, "sample");
            for (int32_t s = 0; s < n; s++)
                CHECK(out[s].token == last[s] && out[s].top_ids[0] == last[s],
                      "%d sequences, step %d, row %d: sampled %d, greedy %d", n, step, s,
                      out[s].token, last[s]);
        }
        printf("ok   %2d sequences (bucket of %s): %d replayed steps checked\n", n,
               n == 1    ? "1"
               : n <= 4  ? "4"
               : n <= 8  ? "8"
               : n <= 16 ? "16"
               : n <= 24 ? "24"
                         : "48",
               STEPS);
    }
    printf("info greedy agreement with the unpadded eager model: %ld of %ld rows\n", rows_close,
           rows_total);
    CHECK(rows_close * 10 >= rows_total * 9, "greedy agreement %ld of %ld", rows_close, rows_total);
    for (int i = 0; i < 3; i++) {
        eng_model_destroy(m[i]);
        eng_backend_destroy(be[i]);
        free(lg[i]);
    }
    return 0;
}
