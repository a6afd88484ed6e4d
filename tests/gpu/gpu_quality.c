/* GPU test: the demo model's held-out perplexity through the CUDA backend
 * (int4serve-perplexity --backend cuda), on the windows and against the
 * transformers figure tests/tools/test_demo_model.c uses on the CPU
 * (tests/tools/quality.h):
 * - fp16 weights and activations within QUALITY_FP16_TOL of transformers'
 *   fp32 perplexity;
 * - every INT4 setting (group 128, 64, 32, per-channel; asymmetric and
 *   symmetric) within its CPU bound plus GPU_QUALITY_MARGIN, and within
 *   GPU_CPU_TOL of what the CPU backend gives for the same setting (the same
 *   INT4 weights; only the activations' precision differs);
 * - INT4 with an FP8 KV cache within QUALITY_FP8_KV_BOUND of the fp16 cache.
 * Needs $INT4SERVE_SOURCE_DIR and $INT4SERVE_BUILD_DIR (ctest sets both).
 * Prints "SKIPPED: no GPU" without a GPU. */
#include "tests/tools/quality.h"

#include <cuda_runtime.h>
#include <math.h>

#define GPU_QUALITY_MARGIN 0.002
#define GPU_CPU_TOL 0.001

static int g_fail, g_checks;

static void check(bool ok, const char *what, double got, double want)
{
    g_checks++;
    if (!ok) {
        g_fail++;
        printf("FAIL %s: %.6f (want %.6f)\n", what, got, want);
    }
}

int main(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        printf("SKIPPED: no GPU\n");
        return 77; /* ctest: skipped (SKIP_RETURN_CODE, tests/CMakeLists.txt) */
    }
    const char *sd = getenv("INT4SERVE_SOURCE_DIR"), *bd = getenv("INT4SERVE_BUILD_DIR");
    json_t *ref = sd ? quality_reference(sd) : NULL;
    if (!sd || !bd || !ref) {
        printf("FAIL: INT4SERVE_SOURCE_DIR/INT4SERVE_BUILD_DIR unset or no reference.json\n");
        return 1;
    }
    const double want = quality_ref_ppl(ref);
    struct quality_run r;
    bool ok = quality_run_tool(bd, sd, "--backend cuda --quantization none", &r);
    check(ok, "fp16 run", 0, 0);
    if (ok) {
        printf("fp16: ppl %.5f, transformers fp32 %.5f (%+.3f%%)\n", r.ppl, want,
               100 * (r.ppl / want - 1));
        check(fabs(r.ppl / want - 1) <= QUALITY_FP16_TOL, "fp16 ppl", r.ppl, want);
    }
    /* an FP8 KV cache on the GPU: within its bound of the fp16 cache */
    struct quality_run k16, k8;
    bool ok8 =
        quality_run_tool(bd, sd, "--backend cuda --quantization int4", &k16) &&
        quality_run_tool(bd, sd, "--backend cuda --quantization int4 --kv-cache-dtype fp8", &k8);
    check(ok8, "fp8 KV run", 0, 0);
    if (ok8) {
        printf("int4 with fp8 KV: gpu ppl %.5f (%+.2f%% over the fp16 cache)\n", k8.ppl,
               100 * (k8.ppl / k16.ppl - 1));
        check(k8.ppl / k16.ppl - 1 <= QUALITY_FP8_KV_BOUND, "fp8 KV ppl", k8.ppl, k16.ppl);
    }
    for (int c = 0; c < QUALITY_N_CASES; c++) {
        const struct quality_case *q = &quality_cases[c];
        char flags[160], what[96];
        snprintf(flags, sizeof flags, "--quantization int4 --group-size %d%s", q->group,
                 q->symmetric ? " --symmetric" : "");
        snprintf(what, sizeof what, "int4 group %d %s", q->group,
                 q->symmetric ? "symmetric" : "asymmetric");
        struct quality_run cpu, gpu;
        char gflags[200];
        snprintf(gflags, sizeof gflags, "--backend cuda %s", flags);
        bool okc = quality_run_tool(bd, sd, flags, &cpu),
             okg = quality_run_tool(bd, sd, gflags, &gpu);
        check(okc && okg, what, 0, 0);
        if (!okc || !okg)
            continue;
        printf("%s: gpu ppl %.5f (%+.2f%%), cpu %.5f (%+.2f%%)\n", what, gpu.ppl,
               100 * (gpu.ppl / want - 1), cpu.ppl, 100 * (cpu.ppl / want - 1));
        check(gpu.ppl / want - 1 <= q->bound + GPU_QUALITY_MARGIN, what, gpu.ppl,
              want * (1 + q->bound + GPU_QUALITY_MARGIN));
        check(fabs(gpu.ppl / cpu.ppl - 1) <= GPU_CPU_TOL, what, gpu.ppl, cpu.ppl);
    }
    json_decref(ref);
    printf("%d checks, %d failed\n%s\n", g_checks, g_fail, g_fail ? "FAILED" : "PASSED");
    return g_fail ? 1 : 0;
}
