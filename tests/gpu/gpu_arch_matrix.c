/* Every architecture the loader takes (tests/engine/arch_matrix.h) on the
 * CUDA backend, x {fused, unfused q/k/v and gate/up} x {fp16, INT4 group 32}
 * x {one token, a batch of 16 sequences of mixed lengths}, each logit row
 * compared by its relative error (|a - b| / |b| over the row):
 *   fused against unfused: within 1e-3;
 *   the batch against each sequence alone: within 2e-3 (a launch's kernel
 *     and cuBLAS's algorithm go by its rows: fp16 weights measured up to
 *     9.0e-4 on the H200, INT4 2e-7);
 *   the GPU against the CPU backend's fused run (fp32 activations, fp32 or
 *     the same INT4 weights): within 1e-2, and the same argmax wherever the
 *     CPU's top two differ by more than 0.05.
 * All of it twice: on the device's own kernels, then on the sm_75 paths
 * (engine.cuda_kernels = "sm75": what a T4 runs; rows marked /75).
 * Prints "SKIPPED: no GPU" and exits 77 without a GPU. */
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static int g_fails, g_checks;

#define AM_REQUIRE(cond, ...)                                                                      \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "FATAL: ");                                                            \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            exit(2);                                                                               \
        }                                                                                          \
    } while (0)
#include "kernels/cuda_device.h"
#include "tests/engine/arch_matrix.h"

#define SELF_TOL 1e-3
#define BATCH_TOL 2e-3
#define CPU_TOL 1e-2

/* The largest relative error of rows [0, n) of a against b. */
static double worst_rel(const float *a, const float *b, int n, int V)
{
    double w = 0;
    for (int r = 0; r < n; r++) {
        double d2 = 0, b2 = 0;
        for (int i = 0; i < V; i++) {
            double d = (double)a[r * V + i] - b[r * V + i];
            d2 += d * d;
            b2 += (double)b[r * V + i] * b[r * V + i];
            if (!isfinite(a[r * V + i]))
                return INFINITY;
        }
        w = fmax(w, sqrt(d2 / (b2 > 0 ? b2 : 1)));
    }
    return w;
}

static void check(const char *arch, const char *q, const char *what, const float *a, const float *b,
                  int n, int V, double tol)
{
    double w = worst_rel(a, b, n, V);
    bool ok = w <= tol;
    g_checks++;
    g_fails += !ok;
    printf("%-4s %-8s %-5s %-34s rel %.3e (tol %.0e)\n", ok ? "ok" : "FAIL", arch, q, what, w, tol);
}

static int argmax(const float *x, int V, float *margin)
{
    int b = 0, s = -1;
    for (int i = 1; i < V; i++)
        if (x[i] > x[b])
            b = i;
    for (int i = 0; i < V; i++)
        if (i != b && (s < 0 || x[i] > x[s]))
            s = i;
    *margin = x[b] - x[s];
    return b;
}

/* The GPU's argmax equals the CPU's on rows whose top two are apart. */
static void check_argmax(const char *arch, const char *q, const float *gpu, const float *cpu, int n,
                         int V)
{
    int same = 0, clear = 0;
    for (int r = 0; r < n; r++) {
        float mc, mg;
        int ac = argmax(cpu + r * V, V, &mc), ag = argmax(gpu + r * V, V, &mg);
        if (mc > 0.05f) {
            clear++;
            same += ac == ag;
        }
    }
    g_checks++;
    g_fails += same != clear;
    printf("%-4s %-8s %-5s GPU argmax == CPU argmax: %d of %d clear rows\n",
           same == clear ? "ok" : "FAIL", arch, q, same, clear);
}

static eng_model_t *load(const char *dir, struct eng_backend *be, enum eng_quant q, bool fuse)
{
    struct eng_model_opts o;
    eng_model_opts_default(&o);
    o.quant = q;
    o.group_size = 32;
    o.fuse_qkv = fuse;
    o.max_tokens = 512;
    o.n_kv_blocks = 64;
    eng_model_t *m = NULL;
    struct inf_err err = {0};
    AM_REQUIRE(eng_model_load(dir, be, &o, &m, &err) == INF_OK, "load %s on %s: %s", dir,
               eng_backend_name(be), err.msg);
    return m;
}

int main(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        printf("SKIPPED: no GPU\n");
        return 77; /* ctest: skipped (SKIP_RETURN_CODE, tests/CMakeLists.txt) */
    }
    struct inf_err err = {0};
    struct eng_backend *cpu = NULL, *gpu = NULL;
    struct eng_backend_cpu_opts co = {.n_threads = 0};
    AM_REQUIRE(eng_backend_cpu_create(&co, &cpu, &err) == INF_OK, "cpu: %s", err.msg);
    static struct am_run c, f, u;
    const enum eng_quant quants[2] = {ENG_QUANT_NONE, ENG_QUANT_INT4};
    const char *const qnames[2] = {"fp", "int4"};
    for (int run = 0; run < 2 * (int)(sizeof ARCHS / sizeof ARCHS[0]); run++) {
        const int a = run % (int)(sizeof ARCHS / sizeof ARCHS[0]);
        const bool sm75 = run >= (int)(sizeof ARCHS / sizeof ARCHS[0]);
        if (a == 0) { /* a backend for each kernel set */
            if (gpu)
                eng_backend_destroy(gpu);
            struct eng_backend_cuda_opts go = {.device = 0, .sm75 = sm75};
            AM_REQUIRE(eng_backend_cuda_create(&go, &gpu, &err) == INF_OK, "cuda: %s", err.msg);
            g_checks++;
            const bool ok = !sm75 || krn_cuda_kernels_cc(0) == 75;
            g_fails += !ok;
            printf("%-4s kernels chosen for compute capability %d\n", ok ? "ok" : "FAIL",
                   (int)krn_cuda_kernels_cc(0));
        }
        const struct tm_spec *sp = &ARCHS[a];
        char arch[32];
        snprintf(arch, sizeof arch, "%s%s", ARCH_NAMES[a], sm75 ? "/75" : "");
        const int V = sp->vocab;
        char dir[] = "/tmp/int4serve-gpu-arch-XXXXXX";
        AM_REQUIRE(mkdtemp(dir) != NULL, "mkdtemp");
        AM_REQUIRE(tm_write(dir, sp) == 0, "writing %s", dir);
        am_prompts(sp);
        for (int qi = 0; qi < 2; qi++) {
            const char *q = qnames[qi];
            eng_model_t *mc = load(dir, cpu, quants[qi], true);
            eng_model_t *mf = load(dir, gpu, quants[qi], true);
            eng_model_t *mu = load(dir, gpu, quants[qi], false);
            g_checks++;
            if (eng_model_layer_count(mf) >= eng_model_layer_count(mu)) {
                g_fails++;
                printf("FAIL %s %s: fused %d linears, unfused %d\n", arch, q,
                       eng_model_layer_count(mf), eng_model_layer_count(mu));
            }
            am_run_model(mc, V, &c);
            am_run_model(mf, V, &f);
            am_run_model(mu, V, &u);
            check(arch, q, "one token, fused vs unfused", f.one, u.one, 1, V, SELF_TOL);
            check(arch, q, "batch prefill, fused vs unfused", f.pre, u.pre, N_SEQ, V, SELF_TOL);
            check(arch, q, "batch decode, fused vs unfused", f.dec, u.dec, N_SEQ, V, SELF_TOL);
            check(arch, q, "prefill, batch vs alone", f.pre, f.alone_pre, N_SEQ, V, BATCH_TOL);
            check(arch, q, "decode, batch vs alone", f.dec, f.alone_dec, N_SEQ, V, BATCH_TOL);
            check(arch, q, "unfused decode, batch vs alone", u.dec, u.alone_dec, N_SEQ, V,
                  BATCH_TOL);
            check(arch, q, "one token, GPU vs CPU", f.one, c.one, 1, V, CPU_TOL);
            check(arch, q, "batch prefill, GPU vs CPU", f.pre, c.pre, N_SEQ, V, CPU_TOL);
            check(arch, q, "batch decode, GPU vs CPU", f.dec, c.dec, N_SEQ, V, CPU_TOL);
            check_argmax(arch, q, f.dec, c.dec, N_SEQ, V);
            eng_model_destroy(mc);
            eng_model_destroy(mf);
            eng_model_destroy(mu);
        }
        tm_rmdir(dir);
    }
    eng_backend_destroy(gpu);
    eng_backend_destroy(cpu);
    printf("%s: %d of %d checks failed\n", g_fails ? "FAILED" : "PASSED", g_fails, g_checks);
    return g_fails ? 1 : 0;
}
