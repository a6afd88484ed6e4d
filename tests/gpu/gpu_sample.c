/* GPU test: sampling on the device (the CUDA backend's sample slot) against
 * the host sampler (engine/sched/sampler.c), the reference.
 *
 * Each case builds two samplers with the same settings, seed and history:
 * the host one samples the (banned) logits row with eng_sampler_sample; the
 * other fills a device row (eng_sampler_fill_row, which draws from the same
 * generator) and the GPU samples it. Several steps run one after the other,
 * each side accepting its own token, so the generators must stay in step.
 * Pass: identical tokens (greedy and seeded), identical top-n ids, logprobs
 * within 1e-4, the same refusals (-1 on the device where the host answers
 * INF_E_INVALID).
 * Cases: vocabulary 128256 with random logits (N(0, 3^2)) over 40 rows (two
 * launches of 32) and mixed settings (greedy, logprobs 20, temperature only,
 * top_k, top_p, min_p, all three, penalties with prompt and output history,
 * logit_bias with a repeated id, EOS banned); edge cases on vocabulary 1000:
 * all -inf but one, all -inf, every logit equal (ties: lowest id first),
 * top_p tiny, ties at the top_k boundary, a ban that leaves one token;
 * launches of plain greedy rows only (their own kernel): vocabularies
 * 128256, 32000, 1001 and 4097, rows in reverse order, ties within and
 * across blocks, one finite value, all -inf, all equal.
 * Timing (information): 128 rows of 128256, greedy and with top_p.
 * Fresh seed each run, printed; INT4SERVE_TEST_SEED replays one.
 * Prints "SKIPPED: no GPU" and exits 77 (ctest: skipped) without a GPU. */
#include "common/inf.h"
#include "engine/backend.h"
#include "engine/sched/sampler.h"

#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_ROWS 128
#define STEPS 3

static int g_fail, g_checks, g_tokens, g_drawn;
static uint64_t g_rng;
static struct eng_backend *g_gpu;
static struct eng_buf *g_logits, *g_out;

static uint64_t rnd(void)
{
    uint64_t z = (g_rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double urand(void)
{
    return (double)(rnd() >> 11) * 0x1p-53;
}

static float nrand(void)
{
    double u1 = urand(), u2 = urand();
    if (u1 < 1e-300)
        u1 = 1e-300;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        g_checks++;                                                                                \
        if (!(cond)) {                                                                             \
            g_fail++;                                                                              \
            if (g_fail < 30) {                                                                     \
                printf("FAIL %s:%d: ", __FILE__, __LINE__);                                        \
                printf(__VA_ARGS__);                                                               \
                printf("\n");                                                                      \
            }                                                                                      \
        }                                                                                          \
    } while (0)

static void must(inf_status_t st, const struct inf_err *err, const char *what)
{
    if (st != INF_OK) {
        fprintf(stderr, "FATAL %s: %s\n", what, err->msg);
        exit(2);
    }
}

/* One case: a row's settings, its history and its banned ids. */
struct tcase {
    const char *name;
    struct eng_sampler_params p;
    struct eng_logit_bias bias[4];
    int32_t n_prompt, n_out; /* random history */
    int32_t ban[2], n_ban;
};

struct pair {
    eng_sampler_t *host, *dev;
};

static void make_pair(const struct tcase *tc, int32_t vocab, uint64_t seed, struct pair *pr)
{
    struct eng_sampler_params p = tc->p;
    p.seed = seed;
    p.logit_bias = tc->bias;
    struct inf_err err = {0};
    must(eng_sampler_create(&p, vocab, &pr->host, &err), &err, "sampler");
    must(eng_sampler_create(&p, vocab, &pr->dev, &err), &err, "sampler");
    for (int32_t i = 0; i < tc->n_prompt; i++) {
        int32_t t = (int32_t)(rnd() % (uint64_t)vocab);
        eng_sampler_add_prompt(pr->host, &t, 1);
        eng_sampler_add_prompt(pr->dev, &t, 1);
    }
    for (int32_t i = 0; i < tc->n_out; i++) {
        int32_t t = (int32_t)(rnd() % 64); /* repeats: counts above 1 */
        eng_sampler_accept(pr->host, t);
        eng_sampler_accept(pr->dev, t);
    }
}

/* Sample n rows (logits [n][vocab], already uploaded) on both sides and
 * compare; each side accepts its own token. Row i samples logits row
 * perm[i] (i without perm). */
static void run_rows(const struct tcase *const *tcs, struct pair *prs, int32_t n, int32_t vocab,
                     const float *logits, const int32_t *perm)
{
    static struct eng_sample_row rows[MAX_ROWS];
    static struct eng_sample_out out[MAX_ROWS];
    struct eng_sample_hist *hist[MAX_ROWS];
    float *row = malloc((size_t)vocab * sizeof(float));
    for (int32_t i = 0; i < n; i++) {
        hist[i] = malloc(((size_t)eng_sampler_hist_len(prs[i].dev) + 1) * sizeof *hist[i]);
        memset(&rows[i], 0, sizeof rows[i]);
        eng_sampler_fill_row(prs[i].dev, &rows[i], hist[i]);
        rows[i].logit_row = perm ? perm[i] : i;
        rows[i].ban = tcs[i]->ban;
        rows[i].n_ban = tcs[i]->n_ban;
    }
    struct inf_err err = {0};
    memset(out, 0x7f, sizeof out);
    must(eng_op_sample(g_gpu, g_logits, n, vocab, rows, n, g_out, 0, &err), &err, "sample");
    must(eng_buf_download(g_gpu, g_out, 0, out, (size_t)n * sizeof *out, &err), &err, "download");
    for (int32_t i = 0; i < n; i++) {
        const struct tcase *tc = tcs[i];
        memcpy(row, logits + (int64_t)(perm ? perm[i] : i) * vocab, (size_t)vocab * sizeof(float));
        for (int32_t j = 0; j < tc->n_ban; j++)
            row[tc->ban[j]] = -INFINITY;
        struct eng_sample h;
        inf_status_t st = eng_sampler_sample(prs[i].host, row, &h, NULL);
        if (st != INF_OK) {
            CHECK(out[i].token == -1, "%s row %d: host refuses, device gave %d", tc->name, i,
                  out[i].token);
            free(hist[i]);
            continue;
        }
        g_tokens++;
        g_drawn += tc->p.temperature > 0.0f;
        CHECK(out[i].token == h.token, "%s row %d: token %d on the device, %d on the host",
              tc->name, i, out[i].token, h.token);
        CHECK(fabsf(out[i].logprob - h.logprob) <= 1e-4f, "%s row %d: logprob %g vs %g", tc->name,
              i, (double)out[i].logprob, (double)h.logprob);
        CHECK(out[i].n_top == h.n_top, "%s row %d: n_top %d vs %d", tc->name, i, out[i].n_top,
              h.n_top);
        for (int32_t j = 0; j < h.n_top && j < out[i].n_top; j++) {
            CHECK(out[i].top_ids[j] == h.top_ids[j], "%s row %d: top %d id %d vs %d", tc->name, i,
                  j, out[i].top_ids[j], h.top_ids[j]);
            CHECK(fabsf(out[i].top_logprobs[j] - h.top_logprobs[j]) <= 1e-4f,
                  "%s row %d: top %d logprob %g vs %g", tc->name, i, j,
                  (double)out[i].top_logprobs[j], (double)h.top_logprobs[j]);
        }
        eng_sampler_accept(prs[i].host, h.token);
        if (out[i].token >= 0)
            eng_sampler_accept(prs[i].dev, out[i].token);
        free(hist[i]);
    }
    free(row);
}

static void upload(const float *logits, int32_t n, int32_t vocab)
{
    struct inf_err err = {0};
    must(eng_buf_upload(g_gpu, g_logits, 0, logits, (size_t)n * (size_t)vocab * 4, &err), &err,
         "upload");
}

static struct eng_sampler_params params(float t, int32_t k, float top_p, float min_p)
{
    struct eng_sampler_params p;
    eng_sampler_params_default(&p);
    p.temperature = t;
    p.top_k = k;
    p.top_p = top_p;
    p.min_p = min_p;
    return p;
}

/* Random logits over the big vocabulary, every kind of setting. */
static void test_random(void)
{
    const int32_t V = 128256, N = 40;
    static struct tcase tcs[8];
    tcs[0] = (struct tcase){.name = "greedy", .p = params(0, 0, 1, 0)};
    tcs[1] = (struct tcase){.name = "greedy+logprobs", .p = params(0, 0, 1, 0)};
    tcs[1].p.n_logprobs = 20;
    tcs[2] = (struct tcase){.name = "temperature", .p = params(0.7f, 0, 1, 0)};
    tcs[2].p.n_logprobs = 5;
    tcs[3] = (struct tcase){.name = "top_k", .p = params(1.0f, 50, 1, 0)};
    tcs[4] = (struct tcase){.name = "top_p", .p = params(0.8f, 0, 0.9f, 0)};
    tcs[5] = (struct tcase){.name = "min_p", .p = params(1.3f, 0, 1, 0.05f)};
    tcs[6] = (struct tcase){.name = "k+p+min_p", .p = params(0.9f, 200, 0.7f, 0.01f)};
    tcs[7] = (struct tcase){.name = "penalties+bias+ban",
                            .p = params(0.6f, 0, 0.95f, 0),
                            .n_prompt = 300,
                            .n_out = 200,
                            .ban = {2, 128000},
                            .n_ban = 2};
    tcs[7].p.repetition_penalty = 1.3f;
    tcs[7].p.presence_penalty = 0.5f;
    tcs[7].p.frequency_penalty = 0.25f;
    tcs[7].p.n_logprobs = 3;
    tcs[7].bias[0] = (struct eng_logit_bias){5, 4.0f};
    tcs[7].bias[1] = (struct eng_logit_bias){77, -3.0f};
    tcs[7].bias[2] = (struct eng_logit_bias){5, 1.5f};
    tcs[7].p.n_logit_bias = 3;
    const struct tcase *per[MAX_ROWS];
    struct pair prs[MAX_ROWS];
    for (int32_t i = 0; i < N; i++) {
        per[i] = &tcs[i % 8];
        make_pair(per[i], V, rnd(), &prs[i]);
    }
    float *lg = malloc((size_t)N * V * sizeof(float));
    for (int step = 0; step < STEPS; step++) {
        for (int64_t j = 0; j < (int64_t)N * V; j++)
            lg[j] = 3.0f * nrand();
        upload(lg, N, V);
        run_rows(per, prs, N, V, lg, NULL);
    }
    for (int32_t i = 0; i < N; i++) {
        eng_sampler_destroy(prs[i].host);
        eng_sampler_destroy(prs[i].dev);
    }
    free(lg);
}

/* Edge cases on a small vocabulary, several seeds each. */
static void test_edges(void)
{
    const int32_t V = 1000;
    static struct tcase tcs[12];
    int nt = 0;
    tcs[nt++] = (struct tcase){.name = "one finite, greedy", .p = params(0, 0, 1, 0)};
    tcs[nt++] = (struct tcase){.name = "one finite, sampled", .p = params(1, 0, 1, 0)};
    tcs[nt++] = (struct tcase){.name = "one finite, top_p", .p = params(1, 0, 0.5f, 0)};
    tcs[nt++] = (struct tcase){.name = "all -inf, greedy", .p = params(0, 0, 1, 0)};
    tcs[nt++] = (struct tcase){.name = "all -inf, sampled", .p = params(1, 10, 1, 0)};
    tcs[nt++] = (struct tcase){.name = "ties, greedy", .p = params(0, 0, 1, 0)};
    tcs[nt - 1].p.n_logprobs = 20;
    tcs[nt++] = (struct tcase){.name = "ties, top_k", .p = params(1, 5, 1, 0)};
    tcs[nt++] = (struct tcase){.name = "ties, sampled", .p = params(1, 0, 1, 0)};
    tcs[nt++] = (struct tcase){.name = "top_p tiny", .p = params(1, 0, 1e-6f, 0)};
    tcs[nt++] = (struct tcase){.name = "tie at top_k", .p = params(1, 3, 1, 0)};
    tcs[nt++] = (struct tcase){
        .name = "ban leaves one", .p = params(1, 0, 1, 0), .ban = {7, 9}, .n_ban = 2};
    tcs[nt++] = (struct tcase){.name = "min_p 1", .p = params(1, 0, 1, 1.0f)};
    float *lg = malloc((size_t)MAX_ROWS * V * sizeof(float));
    const struct tcase *per[MAX_ROWS];
    struct pair prs[MAX_ROWS];
    const int reps = 8; /* seeds per case */
    int32_t n = nt * reps;
    for (int32_t i = 0; i < n; i++) {
        per[i] = &tcs[i / reps];
        make_pair(per[i], V, rnd(), &prs[i]);
    }
    for (int step = 0; step < STEPS; step++) {
        for (int32_t i = 0; i < n; i++) {
            float *r = lg + (int64_t)i * V;
            const char *nm = per[i]->name;
            for (int32_t t = 0; t < V; t++)
                r[t] = nrand();
            if (strncmp(nm, "one finite", 10) == 0) {
                for (int32_t t = 0; t < V; t++)
                    r[t] = -INFINITY;
                r[(int32_t)(rnd() % (uint64_t)V)] = 2.5f;
            } else if (strncmp(nm, "all -inf", 8) == 0) {
                for (int32_t t = 0; t < V; t++)
                    r[t] = -INFINITY;
            } else if (strncmp(nm, "ties", 4) == 0) {
                for (int32_t t = 0; t < V; t++)
                    r[t] = 1.25f;
            } else if (strcmp(nm, "tie at top_k") == 0) {
                /* ids 10, 20 on top, then 5 ids tied at the third place */
                for (int32_t t = 0; t < V; t++)
                    r[t] = -5.0f + 0.001f * (float)(t % 7);
                r[10] = 4.0f;
                r[20] = 3.0f;
                for (int32_t t = 100; t < 600; t += 100)
                    r[t] = 2.0f;
            } else if (strcmp(nm, "ban leaves one") == 0) {
                for (int32_t t = 0; t < V; t++)
                    r[t] = -INFINITY;
                r[7] = 1.0f;
                r[9] = 2.0f;
                r[11] = 0.5f;
            }
        }
        upload(lg, n, V);
        run_rows(per, prs, n, V, lg, NULL);
    }
    for (int32_t i = 0; i < n; i++) {
        eng_sampler_destroy(prs[i].host);
        eng_sampler_destroy(prs[i].dev);
    }
    free(lg);
}

/* Launches whose rows are all plain greedy (krn_cuda_sample_greedy: many
 * blocks a row): vocabularies a multiple of 4 (16-byte loads) and not
 * (1001), more rows than one launch takes, logits rows in reverse order,
 * ties inside a block and across blocks (lowest id), one finite value in
 * the last block, all -inf, every value equal. */
static void test_greedy(void)
{
    static const int32_t vocabs[] = {128256, 32000, 1001, 4097};
    static struct tcase tc = {.name = "greedy launch"};
    tc.p = params(0, 0, 1, 0);
    const struct tcase *per[MAX_ROWS];
    struct pair prs[MAX_ROWS];
    int32_t perm[MAX_ROWS];
    for (size_t vi = 0; vi < sizeof vocabs / sizeof vocabs[0]; vi++) {
        const int32_t V = vocabs[vi], N = V > 100000 ? 40 : 70;
        float *lg = malloc((size_t)N * V * sizeof(float));
        for (int32_t i = 0; i < N; i++) {
            per[i] = &tc;
            perm[i] = N - 1 - i;
            make_pair(per[i], V, rnd(), &prs[i]);
        }
        for (int step = 0; step < STEPS; step++) {
            for (int32_t i = 0; i < N; i++) {
                float *r = lg + (int64_t)i * V;
                for (int32_t t = 0; t < V; t++)
                    r[t] = 3.0f * nrand();
                const int32_t a = (int32_t)(rnd() % (uint64_t)V),
                              b = (int32_t)(rnd() % (uint64_t)V);
                switch (i % 6) {
                case 1: /* a tie at the top, maybe in two blocks */
                    r[a] = 30.0f;
                    r[b] = 30.0f;
                    break;
                case 2: /* one finite value, in the last block */
                    for (int32_t t = 0; t < V; t++)
                        r[t] = -INFINITY;
                    r[V - 1 - (a % 7)] = -2.0f;
                    break;
                case 3:
                    for (int32_t t = 0; t < V; t++)
                        r[t] = -INFINITY;
                    break;
                case 4:
                    for (int32_t t = 0; t < V; t++)
                        r[t] = 0.5f;
                    break;
                default:
                    break;
                }
            }
            upload(lg, N, V);
            run_rows(per, prs, N, V, lg, step == 1 ? perm : NULL);
        }
        for (int32_t i = 0; i < N; i++) {
            eng_sampler_destroy(prs[i].host);
            eng_sampler_destroy(prs[i].dev);
        }
        free(lg);
    }
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Information: wall time of 128 rows of 128256 (one download included). */
static void timing(void)
{
    const int32_t V = 128256, N = 128;
    float *lg = malloc((size_t)N * V * sizeof(float));
    for (int64_t j = 0; j < (int64_t)N * V; j++)
        lg[j] = 3.0f * nrand();
    upload(lg, N, V);
    static struct eng_sample_row rows[MAX_ROWS];
    static struct eng_sample_out out[MAX_ROWS];
    for (int mode = 0; mode < 2; mode++) {
        for (int32_t i = 0; i < N; i++) {
            memset(&rows[i], 0, sizeof rows[i]);
            rows[i].logit_row = i;
            rows[i].temperature = mode ? 0.8f : 0.0f;
            rows[i].top_p = mode ? 0.9f : 1.0f;
            rows[i].repetition_penalty = 1.0f;
            rows[i].u = urand();
        }
        struct inf_err err = {0};
        double best = 1e9;
        for (int rep = 0; rep < 6; rep++) {
            double t0 = now_ms();
            must(eng_op_sample(g_gpu, g_logits, N, V, rows, N, g_out, 0, &err), &err, "sample");
            must(eng_buf_download(g_gpu, g_out, 0, out, (size_t)N * sizeof *out, &err), &err,
                 "download");
            double t = now_ms() - t0;
            best = t < best ? t : best;
        }
        printf("timing: %d rows of %d, %s: %.3f ms\n", N, V, mode ? "top_p 0.9" : "greedy", best);
    }
    {
        struct inf_err err = {0};
        double best = 1e9;
        for (int rep = 0; rep < 20; rep++) {
            double t0 = now_ms();
            rows[0].temperature = 0.0f;
            rows[0].top_p = 1.0f;
            must(eng_op_sample(g_gpu, g_logits, 1, 32000, rows, 1, g_out, 0, &err), &err, "sample");
            must(eng_buf_download(g_gpu, g_out, 0, out, sizeof *out, &err), &err, "download");
            double t = now_ms() - t0;
            best = t < best ? t : best;
        }
        printf("timing: 1 row of 32000, greedy: %.3f ms\n", best);
    }
    free(lg);
}

int main(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        printf("SKIPPED: no GPU\n");
        return 77; /* ctest: skipped (SKIP_RETURN_CODE, tests/CMakeLists.txt) */
    }
    const char *se = getenv("INT4SERVE_TEST_SEED");
    g_rng = se ? strtoull(se, NULL, 10) : (uint64_t)time(NULL);
    printf("seed %llu\n", (unsigned long long)g_rng);
    struct inf_err err = {0};
    must(eng_backend_cuda_create(NULL, &g_gpu, &err), &err, "cuda backend");
    must(eng_backend_sample_reserve(g_gpu, 128256, &err), &err, "sample reserve");
    must(eng_buf_alloc(g_gpu, (size_t)MAX_ROWS * 128256 * 4, &g_logits, &err), &err, "alloc");
    must(eng_buf_alloc(g_gpu, MAX_ROWS * sizeof(struct eng_sample_out), &g_out, &err), &err,
         "alloc");
    /* a row reading past the logits is refused before any work */
    struct eng_sample_row bad = {.logit_row = 3, .top_p = 1, .repetition_penalty = 1};
    CHECK(eng_op_sample(g_gpu, g_logits, 3, 1000, &bad, 1, g_out, 0, &err) == INF_E_INVALID,
          "a logits row out of range is refused");
    test_random();
    test_edges();
    test_greedy();
    timing();
    printf("%d tokens compared (%d drawn at temperature > 0), %d checks, %d failures\n", g_tokens,
           g_drawn, g_checks, g_fail);
    eng_buf_free(g_gpu, g_logits);
    eng_buf_free(g_gpu, g_out);
    eng_backend_destroy(g_gpu);
    printf(g_fail ? "FAILED\n" : "PASSED\n");
    return g_fail ? 1 : 0;
}
