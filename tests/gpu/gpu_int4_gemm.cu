/* GPU test of the INT4 GEMM (kernels/int4_gemm.h) against a reference: the
 * canonical weights are dequantized on the host to fp16 exactly as q4.h
 * defines them, and a naive GPU kernel accumulates A · Wᵀ in fp64 (one
 * thread per output, nothing clever). Pass: relative Frobenius error <= 2e-3,
 * every output written (C is poisoned with NaN before each launch), the same
 * bits when a launch is repeated, and errors for unsupported arguments.
 * Fresh random inputs each run; the seed is printed (INT4SERVE_TEST_SEED
 * replays one). INT4SERVE_GEMM_TEST_QUICK=1 runs a reduced list (for
 * compute-sanitizer). Prints "SKIPPED: no GPU" where there is none. */
#include "common/inf.h"
#include "kernels/activation_cuda.h"
#include "kernels/int4_gemm.h"
#include "kernels/norm_cuda.h"
#include "tests/gpu/glu_bound.h"

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));    \
            exit(2);                                                                               \
        }                                                                                          \
    } while (0)

static int g_failures, g_checks;
static uint64_t g_seed;

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* ---- reference and helpers on the GPU ---------------------------------- */

__global__ void fill_random_half(half *x, int64_t n, uint64_t seed, float lo, float hi)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        uint64_t z = seed + (uint64_t)i * 0x9e3779b97f4a7c15ull;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        float u = (float)(z >> 40) / (float)(1u << 24);
        x[i] = __float2half(lo + (hi - lo) * u);
    }
}

/* ref[m][n] = bias[n] + sum_k A[m][k] * W[n][k], fp64 accumulation. A block
 * is 32 columns x 8 rows so the 32 W rows a warp walks stay in L1. */
__global__ void reference_gemm(const half *a, const half *w, const half *bias, double *ref, int m,
                               int n, int k)
{
    int col = blockIdx.x * 32 + threadIdx.x;
    int row = blockIdx.y * 8 + threadIdx.y;
    if (row >= m || col >= n)
        return;
    double acc = 0.0;
    for (int j = 0; j < k; j++)
        acc += (double)__half2float(a[(int64_t)row * k + j]) *
               (double)__half2float(w[(int64_t)col * k + j]);
    if (bias)
        acc += (double)__half2float(bias[col]);
    ref[(int64_t)row * n + col] = acc;
}

/* sums[0] += (c - ref)^2, sums[1] += ref^2, sums[2] += #non-finite c */
__global__ void compare(const half *c, const double *ref, int64_t count, double *sums)
{
    double d2 = 0, r2 = 0, bad = 0;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < count;
         i += (int64_t)gridDim.x * blockDim.x) {
        float v = __half2float(c[i]);
        if (!isfinite(v)) {
            bad += 1;
            continue;
        }
        double d = (double)v - ref[i];
        d2 += d * d;
        r2 += ref[i] * ref[i];
    }
    atomicAdd(&sums[0], d2);
    atomicAdd(&sums[1], r2);
    atomicAdd(&sums[2], bad);
}

/* ---- one weight on the device ------------------------------------------ */

/* The device the plans are made for (krn_cuda_device_describe, once). */
static struct krn_cuda_device g_gpu;

struct dev_weight {
    struct krn_int4_gemm_layout lay;
    struct krn_int4_gemm_plan plan;
    void *packed; /* repacked buffer */
    half *dq;     /* [n][k] reference fp16 weights */
    half *bias;   /* [n] */
    void *ws;
    size_t ws_bytes;
};

/* glu: the weight is made as [gate; up] and its rows put in the GLU column
 * order (krn_q4_glu_interleave) before everything else, so dq, bias and the
 * plain GEMM's output are in that order too. */
static void weight_make(struct dev_weight *dw, int32_t n, int32_t k, int32_t group, bool sym,
                        int32_t max_m, uint64_t *rng, bool glu = false)
{
    struct krn_q4_weight w;
    memset(&w, 0, sizeof w);
    w.n = n;
    w.k = k;
    bool per_channel = group == 0;
    w.group = per_channel ? k : group;
    w.kp = per_channel ? k : (k + group - 1) / group * group;
    w.symmetric = sym;
    int32_t ng = w.kp / w.group;
    w.q = (uint8_t *)calloc((size_t)n * (size_t)(w.kp / 2), 1);
    w.scale = (uint16_t *)malloc(sizeof(uint16_t) * (size_t)n * ng);
    w.zero = (uint16_t *)malloc(sizeof(uint16_t) * (size_t)n * ng);
    if (!w.q || !w.scale || !w.zero) {
        fprintf(stderr, "out of host memory\n");
        exit(2);
    }
    for (int64_t i = 0; i < (int64_t)n * ng; i++) {
        uint64_t r = splitmix(rng);
        /* scales spread over two decades so large and small groups mix */
        w.scale[i] = inf_f32_to_f16((float)(0.002 + 0.02 * (double)(r % 1000) / 1000.0));
        w.zero[i] = inf_f32_to_f16(sym ? 8.0f : (float)((r >> 20) % 16));
    }
    for (int32_t r = 0; r < n; r++) {
        uint8_t *row = w.q + (int64_t)r * (w.kp / 2);
        uint64_t bits = 0;
        for (int32_t j = 0; j < w.kp; j++) {
            if (j % 16 == 0)
                bits = splitmix(rng);
            unsigned code = j < k ? (unsigned)(bits >> (4 * (j % 16))) & 0xf
                                  : (unsigned)inf_f16_to_f32(w.zero[r * ng + j / w.group]);
            row[j / 2] |= (uint8_t)((j & 1) ? code << 4 : code);
        }
    }
    struct inf_err err;
    if (glu) {
        struct krn_q4_weight t = w;
        t.q = (uint8_t *)malloc((size_t)n * (size_t)(w.kp / 2));
        t.scale = (uint16_t *)malloc(sizeof(uint16_t) * (size_t)n * ng);
        t.zero = (uint16_t *)malloc(sizeof(uint16_t) * (size_t)n * ng);
        if (!t.q || !t.scale || !t.zero || krn_q4_glu_interleave(&w, &t, &err) != INF_OK) {
            fprintf(stderr, "glu interleave failed\n");
            exit(2);
        }
        free(w.q);
        free(w.scale);
        free(w.zero);
        w = t;
    }
    if (krn_int4_gemm_layout_make(&w, &dw->lay, &err) != INF_OK ||
        krn_int4_gemm_plan_make(&g_gpu, &dw->lay, &dw->plan, &err) != INF_OK) {
        fprintf(stderr, "layout and plan: %s\n", err.msg);
        exit(2);
    }
    void *host = malloc(dw->lay.bytes);
    if (krn_int4_gemm_repack(&w, &dw->lay, host, dw->lay.bytes, &err) != INF_OK) {
        fprintf(stderr, "repack: %s\n", err.msg);
        exit(2);
    }
    CK(cudaMalloc(&dw->packed, dw->lay.bytes));
    CK(cudaMemcpy(dw->packed, host, dw->lay.bytes, cudaMemcpyHostToDevice));
    free(host);
    /* reference weights: fp16((code - zero) * scale) */
    uint16_t *dq = (uint16_t *)malloc(sizeof(uint16_t) * (size_t)n * k);
    for (int32_t r = 0; r < n; r++)
        for (int32_t j = 0; j < k; j++) {
            int32_t g = j / w.group;
            float s = inf_f16_to_f32(w.scale[r * ng + g]);
            float z = inf_f16_to_f32(w.zero[r * ng + g]);
            dq[(int64_t)r * k + j] = inf_f32_to_f16(((float)krn_q4_code(&w, r, j) - z) * s);
        }
    CK(cudaMalloc((void **)&dw->dq, sizeof(half) * (size_t)n * k));
    CK(cudaMemcpy(dw->dq, dq, sizeof(half) * (size_t)n * k, cudaMemcpyHostToDevice));
    free(dq);
    CK(cudaMalloc((void **)&dw->bias, sizeof(half) * (size_t)n));
    fill_random_half<<<64, 256>>>(dw->bias, n, splitmix(rng), -0.5f, 0.5f);
    CK(cudaGetLastError());
    dw->ws_bytes = krn_int4_gemm_workspace_size(&dw->plan, max_m);
    if (dw->ws_bytes == 0) {
        fprintf(stderr, "workspace size query failed\n");
        exit(2);
    }
    CK(cudaMalloc(&dw->ws, dw->ws_bytes));
    CK(cudaMemset(dw->ws, 0, dw->ws_bytes));
    free(w.q);
    free(w.scale);
    free(w.zero);
}

static void weight_free(struct dev_weight *dw)
{
    cudaFree(dw->packed);
    cudaFree(dw->dq);
    cudaFree(dw->bias);
    cudaFree(dw->ws);
}

/* krn_int4_dequant_f16 into a NaN-poisoned [n][ldw] buffer, ldw = k + 8 (16-byte
 * row pieces when k % 8 == 0) and k + 3 (element stores): every element k < K
 * equals the reference dequantization bit for bit, the columns past K keep
 * the poison. */
static void check_dequant(const struct dev_weight *dw)
{
    const int32_t n = dw->lay.n, k = dw->lay.k;
    const size_t max_elems = (size_t)n * (size_t)(k + 8);
    uint16_t *dev = NULL;
    CK(cudaMalloc((void **)&dev, max_elems * 2));
    uint16_t *host = (uint16_t *)malloc(max_elems * 2),
             *ref = (uint16_t *)malloc((size_t)n * k * 2);
    if (!host || !ref) {
        fprintf(stderr, "out of host memory\n");
        exit(2);
    }
    CK(cudaMemcpy(ref, dw->dq, (size_t)n * k * 2, cudaMemcpyDeviceToHost));
    struct inf_err err;
    static const int pads[] = {8, 3};
    for (int pi = 0; pi < 2; pi++) {
        const int64_t ldw = (int64_t)k + pads[pi];
        const size_t elems = (size_t)n * (size_t)ldw;
        for (size_t i = 0; i < elems; i++)
            host[i] = 0x7e00; /* NaN */
        CK(cudaMemcpy(dev, host, elems * 2, cudaMemcpyHostToDevice));
        g_checks++;
        if (krn_int4_dequant_f16(&dw->lay, dw->packed, dev, ldw, NULL, &err) != INF_OK) {
            printf("FAIL dequant n=%d k=%d ldw=%lld: %s\n", n, k, (long long)ldw, err.msg);
            g_failures++;
            continue;
        }
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(host, dev, elems * 2, cudaMemcpyDeviceToHost));
        long long bad = 0, first = -1;
        for (int32_t r = 0; r < n; r++)
            for (int64_t j = 0; j < ldw; j++) {
                uint16_t want = j < k ? ref[(int64_t)r * k + j] : 0x7e00;
                if (host[(int64_t)r * ldw + j] != want && bad++ == 0)
                    first = (long long)r * ldw + j;
            }
        if (bad) {
            printf("FAIL dequant n=%d k=%d ldw=%lld group=%d: %lld elements differ (first at "
                   "%lld)\n",
                   n, k, (long long)ldw, dw->lay.group, bad, first);
            g_failures++;
        }
    }
    /* an ldw below k is refused */
    g_checks++;
    if (krn_int4_dequant_f16(&dw->lay, dw->packed, dev, k - 1, NULL, &err) != INF_E_UNSUPPORTED) {
        printf("FAIL dequant accepted ldw < k\n");
        g_failures++;
    }
    cudaFree(dev);
    free(host);
    free(ref);
}

/* ---- one check ------------------------------------------------------------ */

struct bufs {
    half *a, *c, *c2;
    double *ref, *sums;
    size_t a_elems, c_elems;
};

static void bufs_make(struct bufs *b, size_t a_elems, size_t c_elems)
{
    b->a_elems = a_elems;
    b->c_elems = c_elems;
    CK(cudaMalloc((void **)&b->a, sizeof(half) * (a_elems + 16)));
    CK(cudaMalloc((void **)&b->c, sizeof(half) * c_elems));
    CK(cudaMalloc((void **)&b->c2, sizeof(half) * c_elems));
    CK(cudaMalloc((void **)&b->ref, sizeof(double) * c_elems));
    CK(cudaMalloc((void **)&b->sums, sizeof(double) * 3));
}

static void bufs_free(struct bufs *b)
{
    cudaFree(b->a);
    cudaFree(b->c);
    cudaFree(b->c2);
    cudaFree(b->ref);
    cudaFree(b->sums);
}

/* Run one GEMM (config KRN_INT4_GEMM_CFG_AUTO or one to force, flags) and
 * compare with the reference.
 * a_shift offsets A by that many elements (exercises the unaligned path). */
static void check_case(struct dev_weight *dw, struct bufs *b, int m, int config, uint32_t flags,
                       bool use_bias, int a_shift, uint64_t *rng, const char *label)
{
    const int n = dw->lay.n, k = dw->lay.k;
    half *a = b->a + a_shift;
    fill_random_half<<<256, 256>>>(a, (int64_t)m * k, splitmix(rng), -1.0f, 1.0f);
    CK(cudaGetLastError());
    CK(cudaMemset(b->c, 0xff, sizeof(half) * (size_t)m * n)); /* NaN poison */
    struct krn_int4_gemm_args args;
    memset(&args, 0, sizeof args);
    args.lay = &dw->lay;
    args.plan = &dw->plan;
    args.b = dw->packed;
    args.a = (const uint16_t *)a;
    args.bias = use_bias ? (const uint16_t *)dw->bias : NULL;
    args.c = (uint16_t *)b->c;
    args.m = m;
    args.workspace = dw->ws;
    args.workspace_bytes = dw->ws_bytes;
    args.stream = NULL;
    args.flags = flags;
    args.config = config;
    struct inf_err err;
    inf_err_clear(&err);
    g_checks++;
    inf_status_t st = krn_int4_gemm(&args, &err);
    if (st != INF_OK) {
        printf("FAIL %s m=%d n=%d k=%d cfg=%d: launcher returned %s (%s)\n", label, m, n, k, config,
               inf_status_name(st), err.msg);
        g_failures++;
        return;
    }
    CK(cudaDeviceSynchronize());
    /* the same launch again must give the same bits (no race, fixed order) */
    CK(cudaMemset(b->c2, 0xff, sizeof(half) * (size_t)m * n));
    args.c = (uint16_t *)b->c2;
    st = krn_int4_gemm(&args, &err);
    CK(cudaDeviceSynchronize());
    dim3 rb(32, 8), rg((n + 31) / 32, (m + 7) / 8);
    reference_gemm<<<rg, rb>>>(a, dw->dq, use_bias ? dw->bias : NULL, b->ref, m, n, k);
    CK(cudaGetLastError());
    CK(cudaMemset(b->sums, 0, sizeof(double) * 3));
    compare<<<256, 256>>>(b->c, b->ref, (int64_t)m * n, b->sums);
    CK(cudaGetLastError());
    double sums[3];
    CK(cudaMemcpy(sums, b->sums, sizeof sums, cudaMemcpyDeviceToHost));
    int same = 1;
    {
        size_t bytes = sizeof(half) * (size_t)m * n;
        unsigned char *h1 = (unsigned char *)malloc(bytes), *h2 = (unsigned char *)malloc(bytes);
        CK(cudaMemcpy(h1, b->c, bytes, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(h2, b->c2, bytes, cudaMemcpyDeviceToHost));
        same = st == INF_OK && memcmp(h1, h2, bytes) == 0;
        free(h1);
        free(h2);
    }
    double rel = sqrt(sums[0]) / (sqrt(sums[1]) + 1e-300);
    bool ok = sums[2] == 0 && rel <= 2e-3 && same;
    if (!ok) {
        printf("FAIL %s m=%d n=%d k=%d group=%d sym=%d cfg=%d flags=%u bias=%d shift=%d: rel=%.3e "
               "unwritten=%.0f repeat_same=%d\n",
               label, m, n, k, dw->lay.group, dw->lay.symmetric, config, flags, use_bias, a_shift,
               rel, sums[2], same);
        g_failures++;
    } else if (getenv("INT4SERVE_GEMM_TEST_VERBOSE")) {
        printf("ok   %s m=%d n=%d k=%d group=%d sym=%d cfg=%d rel=%.3e\n", label, m, n, k,
               dw->lay.group, dw->lay.symmetric, config, rel);
    }
}

/* ---- GLU output --------------------------------------------------------------- */

/* The reference GLU output from the plain GEMM's C [m][n] in the GLU column
 * order: out[r][j] = fp16(SiLU(g) * u), g and u the fp16 values of gate
 * column 16 (j / 8) + j % 8 and its up column eight on, in fp32 with expf. */
__global__ void glu_reference(const half *c, int n, int m, half *out)
{
    const int dim = n / 2;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (int64_t)m * dim;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / dim;
        const int j = (int)(i % dim), col = (j / 8) * 16 + j % 8;
        const float g = __half2float(c[r * n + col]), u = __half2float(c[r * n + col + 8]);
        out[i] = __float2half_rn(g / (1.0f + expf(-g)) * u);
    }
}

static bool same_halves(const half *x, const half *y, size_t count)
{
    const size_t bytes = count * sizeof(half);
    unsigned char *h1 = (unsigned char *)malloc(bytes), *h2 = (unsigned char *)malloc(bytes);
    CK(cudaMemcpy(h1, x, bytes, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(h2, y, bytes, cudaMemcpyDeviceToHost));
    const bool same = memcmp(h1, h2, bytes) == 0;
    free(h1);
    free(h2);
    return same;
}

/* A weight made with glu: the plain launch (checked against the CPU
 * reference as every case), the reference GLU of its output, then the
 * launch with KRN_INT4_GEMM_GLU and krn_cuda_silu_mul_glu on the plain
 * output, both into poisoned buffers and both bit for bit the reference. */
static void check_glu(struct dev_weight *dw, struct bufs *b, int m, int config, uint32_t flags,
                      bool use_bias, uint64_t *rng, const char *label)
{
    const int n = dw->lay.n, k = dw->lay.k;
    check_case(dw, b, m, config, flags, use_bias, 0, rng, label); /* plain C in b->c */
    half *ref = reinterpret_cast<half *>(b->ref);
    glu_reference<<<256, 256>>>(b->c, n, m, ref);
    CK(cudaGetLastError());
    CK(cudaMemset(b->c2, 0xff, sizeof(half) * (size_t)m * n / 2));
    struct krn_int4_gemm_args args;
    memset(&args, 0, sizeof args);
    args.lay = &dw->lay;
    args.plan = &dw->plan;
    args.b = dw->packed;
    args.a = (const uint16_t *)b->a;
    args.bias = use_bias ? (const uint16_t *)dw->bias : NULL;
    args.c = (uint16_t *)b->c2;
    args.m = m;
    args.workspace = dw->ws;
    args.workspace_bytes = dw->ws_bytes;
    args.flags = flags | KRN_INT4_GEMM_GLU;
    args.config = config;
    struct inf_err err;
    inf_err_clear(&err);
    g_checks++;
    inf_status_t st = krn_int4_gemm(&args, &err);
    CK(cudaDeviceSynchronize());
    bool ok = st == INF_OK && same_halves(b->c2, ref, (size_t)m * n / 2);
    if (!ok) {
        printf("FAIL glu %s m=%d n=%d k=%d cfg=%d flags=%u bias=%d: %s\n", label, m, n, k, config,
               flags, use_bias, st == INF_OK ? "differs from the reference" : err.msg);
        g_failures++;
    }
    g_checks++;
    CK(cudaMemset(b->c2, 0xff, sizeof(half) * (size_t)m * n / 2));
    st = krn_cuda_silu_mul_glu((const uint16_t *)b->c, n, (uint16_t *)b->c2, n / 2, n / 2, m, NULL,
                               &err);
    CK(cudaDeviceSynchronize());
    if (st != INF_OK || !same_halves(b->c2, ref, (size_t)m * n / 2)) {
        printf("FAIL silu_mul_glu m=%d n=%d: %s\n", m, n,
               st == INF_OK ? "differs from the reference" : err.msg);
        g_failures++;
    }
}

/* ---- fixed-point sums (KRN_INT4_GEMM_ACC64) ---------------------------------- */

static void halves_to_host(const half *d, float *h, size_t count)
{
    half *t = (half *)malloc(count * sizeof(half));
    CK(cudaMemcpy(t, d, count * sizeof(half), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < count; i++)
        h[i] = __half2float(t[i]);
    free(t);
}

static bool all_zero_words(const int64_t *d, size_t count)
{
    int64_t *h = (int64_t *)malloc(count * sizeof(int64_t));
    CK(cudaMemcpy(h, d, count * sizeof(int64_t), cudaMemcpyDeviceToHost));
    bool z = true;
    for (size_t i = 0; i < count && z; i++)
        z = h[i] == 0;
    free(h);
    return z;
}

/* fp16 x against y: both NaN, or equal within one unit in the last place of
 * the larger plus floor: two roundings of sums that differ by the fixed
 * point's 2^-30 steps and by the plain launch's fp32 additions of partials,
 * whose rounding (about 6e-8 of the partials' size, i.e. of C's) shows on
 * outputs near zero — floor is 1e-6 of C's root mean square. */
static bool close_half(float x, float y, float floor, float ulps = 1.0f)
{
    if (isnan(x) || isnan(y))
        return isnan(x) && isnan(y);
    const float big = fmaxf(fabsf(x), fabsf(y));
    int e = 0;
    frexpf(big < 6.1035e-5f ? 6.1035e-5f : big, &e);
    return fabsf(x - y) <= ulps * ldexpf(1.0f, e - 11) + floor;
}

/* Arguments of an automatic-configuration launch of dw on b's A, m rows. */
static struct krn_int4_gemm_args auto_args(struct dev_weight *dw, struct bufs *b, int m,
                                           uint32_t flags)
{
    struct krn_int4_gemm_args args;
    memset(&args, 0, sizeof args);
    args.lay = &dw->lay;
    args.plan = &dw->plan;
    args.b = dw->packed;
    args.a = (const uint16_t *)b->a;
    args.m = m;
    args.workspace = dw->ws;
    args.workspace_bytes = dw->ws_bytes;
    args.flags = flags;
    args.config = KRN_INT4_GEMM_CFG_AUTO;
    return args;
}

/* An ACC64 launch of args (flags with KRN_INT4_GEMM_ACC64, args->acc the
 * zeroed words, `words` of them; C args->c of c_count values, poisoned
 * here) and what must hold before its words are read: the launch
 * succeeded, *taken is 0 or 1, and 1 where want_taken; taken, C untouched;
 * not taken, C equal to plain and the words untouched. Returns what went
 * wrong, or NULL. */
static const char *acc_launch(struct krn_int4_gemm_args *args, int32_t *taken, int want_taken,
                              const half *plain, size_t c_count, size_t words, struct inf_err *err)
{
    *taken = -1;
    args->acc_taken = taken;
    CK(cudaMemset(args->c, 0xff, c_count * sizeof(half)));
    g_checks++;
    const inf_status_t st = krn_int4_gemm(args, err);
    CK(cudaDeviceSynchronize());
    const half *c = reinterpret_cast<const half *>(args->c);
    if (st != INF_OK)
        return err->msg;
    if (*taken != 0 && *taken != 1)
        return "acc_taken not written";
    if (want_taken && !*taken)
        return "the sums were not taken where they should be";
    if (!*taken && !same_halves(c, plain, c_count))
        return "not taken, and C differs from the plain launch";
    if (!*taken && !all_zero_words(args->acc, words))
        return "not taken, and the words were written";
    const char *why = NULL;
    if (*taken) {
        float *h = (float *)malloc(c_count * sizeof(float));
        halves_to_host(c, h, c_count);
        for (size_t i = 0; i < c_count && !why; i++)
            if (!isnan(h[i]))
                why = "C written by a launch that took the sums";
        free(h);
    }
    return why;
}

/* A GLU weight launched with KRN_INT4_GEMM_GLU | KRN_INT4_GEMM_ACC64 after
 * check_glu (b->ref: the reference GLU output of the plain C). Where it
 * takes the sums (want_taken: it must) C stays untouched,
 * krn_int4_gemm_acc_reduce_glu gives the GLU output within what a step of g
 * and of u can change (its g and u are the fixed-point sums, which the fp16
 * rounding before SiLU can move by a step each: glu_step_bound, from the
 * plain C's g and u) and zeroes the words,
 * and a second launch gives the same bits; elsewhere C is the reference bit
 * for bit and the words stay zero. */
static void check_glu_acc(struct dev_weight *dw, struct bufs *b, int m, int want_taken)
{
    const int n = dw->lay.n, k = dw->lay.k;
    const size_t cn = (size_t)m * n, on = cn / 2;
    int64_t *acc = NULL;
    half *c3 = NULL;
    CK(cudaMalloc((void **)&acc, cn * sizeof(int64_t)));
    CK(cudaMemset(acc, 0, cn * sizeof(int64_t)));
    CK(cudaMalloc((void **)&c3, on * sizeof(half)));
    struct krn_int4_gemm_args args = auto_args(dw, b, m, KRN_INT4_GEMM_GLU | KRN_INT4_GEMM_ACC64);
    args.acc = acc;
    args.c = (uint16_t *)b->c2;
    struct inf_err err;
    inf_err_clear(&err);
    int32_t taken = -1;
    const half *ref = reinterpret_cast<const half *>(b->ref);
    const char *why = acc_launch(&args, &taken, want_taken, ref, on, cn, &err);
    inf_status_t st = INF_OK;
    float *hp = (float *)malloc(on * sizeof(float)), *hq = (float *)malloc(on * sizeof(float));
    if (!why && taken) {
        st = krn_int4_gemm_acc_reduce_glu(acc, (uint16_t *)b->c2, n / 2, m, n, NULL, &err);
        CK(cudaDeviceSynchronize());
        if (!why && st != INF_OK)
            why = err.msg;
        if (!why && !all_zero_words(acc, cn))
            why = "words not zero after the GLU reduce";
        if (!why) {
            halves_to_host(b->c2, hp, on);
            halves_to_host(ref, hq, on);
            float *hc = (float *)malloc(cn * sizeof(float)); /* the plain C: g and u */
            halves_to_host(b->c, hc, cn);
            double ss = 0;
            for (size_t i = 0; i < on; i++)
                ss += (double)hq[i] * hq[i];
            const float floor = (float)(1e-6 * sqrt(ss / (double)on));
            for (size_t i = 0; i < on && !why; i++) {
                const size_t r = i / (size_t)(n / 2), j = i % (size_t)(n / 2);
                const size_t col = r * (size_t)n + (j / 8) * 16 + j % 8;
                const float g = hc[col], u = hc[col + 8];
                if (fabsf(hp[i] - hq[i]) > glu_step_bound(g, u, hq[i]) + floor ||
                    !isfinite(hp[i])) {
                    printf("  element %zu: acc %.8g reference %.8g (g %.8g u %.8g)\n", i, hp[i],
                           hq[i], g, u);
                    why = "GLU output from the words beyond a step of g and u from the reference";
                }
            }
            free(hc);
        }
        if (!why) { /* again: the same bits */
            args.c = (uint16_t *)c3;
            st = krn_int4_gemm(&args, &err);
            if (st == INF_OK)
                st = krn_int4_gemm_acc_reduce_glu(acc, (uint16_t *)c3, n / 2, m, n, NULL, &err);
            CK(cudaDeviceSynchronize());
            if (st != INF_OK)
                why = err.msg;
            else if (!same_halves(c3, b->c2, on))
                why = "a second launch gave other bits";
        }
    }
    if (why) {
        printf("FAIL glu acc m=%d n=%d k=%d taken=%d: %s\n", m, n, k, taken, why);
        g_failures++;
    } else if (getenv("INT4SERVE_GEMM_TEST_VERBOSE")) {
        printf("ok   glu acc m=%d n=%d k=%d taken=%d\n", m, n, k, taken);
    }
    free(hp);
    free(hq);
    cudaFree(acc);
    cudaFree(c3);
}

/* One ACC64 launch: the plain launch (checked against the reference, C in
 * b->c), then the launch with the flag into zeroed words and a poisoned C.
 * Where it takes the sums (want_taken: it must), C stays untouched,
 * krn_int4_gemm_acc_reduce gives C within an ulp of the plain C and leaves
 * the words zero, a second launch gives the same bits (exact integer sums,
 * any arrival order), and krn_cuda_rmsnorm_add_acc gives x and out bit for
 * bit the reduce followed by krn_cuda_rmsnorm_add. Elsewhere C is the plain
 * launch's, bit for bit. nan_row >= 0 puts a NaN in that row of A: that row
 * of C is NaN, the others finite. */
static void check_acc(struct dev_weight *dw, struct bufs *b, int m, uint32_t flags, int want_taken,
                      int nan_row, uint64_t *rng, const char *label)
{
    const int n = dw->lay.n, k = dw->lay.k;
    const size_t cn = (size_t)m * n;
    check_case(dw, b, m, -1, flags, false, 0, rng, label); /* plain C in b->c */
    if (nan_row >= 0) {
        const half nan_h = __ushort_as_half((unsigned short)0x7e00);
        CK(cudaMemcpy(b->a + (size_t)nan_row * k + k / 3, &nan_h, sizeof nan_h,
                      cudaMemcpyHostToDevice));
    }
    int64_t *acc = NULL;
    half *c3 = NULL, *x1 = NULL, *x2 = NULL, *o1 = NULL, *o2 = NULL;
    float *wn = NULL;
    CK(cudaMalloc((void **)&acc, cn * sizeof(int64_t)));
    CK(cudaMemset(acc, 0, cn * sizeof(int64_t)));
    CK(cudaMalloc((void **)&c3, cn * sizeof(half)));
    struct krn_int4_gemm_args args = auto_args(dw, b, m, flags);
    struct inf_err err;
    inf_err_clear(&err);
    if (nan_row >= 0) { /* the plain C of the NaN-holding A */
        args.c = (uint16_t *)b->c;
        CK(cudaMemset(b->c, 0xff, cn * sizeof(half)));
        if (krn_int4_gemm(&args, &err) != INF_OK) {
            printf("FAIL acc %s: plain launch %s\n", label, err.msg);
            g_failures++;
        }
    }
    args.flags = flags | KRN_INT4_GEMM_ACC64;
    args.acc = acc;
    args.c = (uint16_t *)b->c2;
    int32_t taken = -1;
    const char *why = acc_launch(&args, &taken, want_taken, b->c, cn, cn, &err);
    inf_status_t st = INF_OK;
    float *hp = (float *)malloc(cn * sizeof(float)), *hq = (float *)malloc(cn * sizeof(float));
    if (!why && taken) {
        st = krn_int4_gemm_acc_reduce(acc, (uint16_t *)b->c2, n, m, n, NULL, &err);
        CK(cudaDeviceSynchronize());
        if (!why && st != INF_OK)
            why = err.msg;
        if (!why && !all_zero_words(acc, cn))
            why = "words not zero after the reduce";
        if (!why) {
            halves_to_host(b->c2, hp, cn);
            halves_to_host(b->c, hq, cn);
            double ss = 0;
            size_t nf = 0;
            for (size_t i = 0; i < cn; i++)
                if (isfinite(hq[i])) {
                    ss += (double)hq[i] * hq[i];
                    nf++;
                }
            const float floor = (float)(1e-6 * sqrt(ss / (double)(nf ? nf : 1)));
            for (size_t i = 0; i < cn && !why; i++) {
                const bool row_nan = nan_row >= 0 && (int)(i / n) == nan_row;
                if (!close_half(hp[i], hq[i], floor) || (row_nan && !isnan(hp[i])) ||
                    (!row_nan && !isfinite(hp[i]))) {
                    printf("  element %zu: acc %.8g plain %.8g\n", i, hp[i], hq[i]);
                    why = "reduced C not within an ulp of the plain C";
                }
            }
        }
        /* again: the same bits */
        if (!why) {
            args.c = (uint16_t *)c3;
            st = krn_int4_gemm(&args, &err);
            if (st == INF_OK)
                st = krn_int4_gemm_acc_reduce(acc, (uint16_t *)c3, n, m, n, NULL, &err);
            CK(cudaDeviceSynchronize());
            if (st != INF_OK)
                why = err.msg;
            else if (!same_halves(c3, b->c2, cn))
                why = "a second launch gave other bits";
        }
        /* the RMSNorm reading the words, against reduce + RMSNorm */
        if (!why && n % 8 == 0 && nan_row < 0) {
            CK(cudaMalloc((void **)&x1, cn * sizeof(half)));
            CK(cudaMalloc((void **)&x2, cn * sizeof(half)));
            CK(cudaMalloc((void **)&o1, cn * sizeof(half)));
            CK(cudaMalloc((void **)&o2, cn * sizeof(half)));
            CK(cudaMalloc((void **)&wn, (size_t)n * sizeof(float)));
            fill_random_half<<<256, 256>>>(x1, (int64_t)cn, splitmix(rng), -2.0f, 2.0f);
            CK(cudaGetLastError());
            CK(cudaMemcpy(x2, x1, cn * sizeof(half), cudaMemcpyDeviceToDevice));
            float *hw = (float *)malloc((size_t)n * sizeof(float));
            for (int i = 0; i < n; i++)
                hw[i] = 0.5f + (float)(splitmix(rng) >> 40) / (float)(1u << 24);
            CK(cudaMemcpy(wn, hw, (size_t)n * sizeof(float), cudaMemcpyHostToDevice));
            free(hw);
            args.c = (uint16_t *)c3;
            st = krn_int4_gemm(&args, &err);
            if (st == INF_OK)
                st = krn_cuda_rmsnorm_add_acc((uint16_t *)x1, n, acc, wn, nullptr, 1e-5f,
                                              (uint16_t *)o1, n, n, m, NULL, &err);
            if (st == INF_OK)
                st = krn_cuda_rmsnorm_add((uint16_t *)x2, n, (const uint16_t *)b->c2, n, wn,
                                          nullptr, 1e-5f, (uint16_t *)o2, n, n, m, NULL, &err);
            CK(cudaDeviceSynchronize());
            if (st != INF_OK)
                why = err.msg;
            else if (!same_halves(x1, x2, cn) || !same_halves(o1, o2, cn))
                why = "the RMSNorm over the words differs from reduce + RMSNorm";
            else if (all_zero_words(acc, cn))
                why = "the RMSNorm zeroed the words (they are left for acc_clear)";
        }
        /* a launch into other words zeroes these (acc_clear) and gives the
         * same bits */
        if (!why) {
            int64_t *acc2 = NULL;
            CK(cudaMalloc((void **)&acc2, cn * sizeof(int64_t)));
            CK(cudaMemset(acc2, 0, cn * sizeof(int64_t)));
            if (all_zero_words(acc, cn)) { /* the RMSNorm part did not run: words to clear */
                args.c = (uint16_t *)c3;
                if (krn_int4_gemm(&args, &err) != INF_OK)
                    why = err.msg;
            }
            args.acc = acc2;
            args.acc_clear = acc;
            args.acc_clear_words = (int64_t)cn;
            args.c = (uint16_t *)c3;
            st = why ? INF_OK : krn_int4_gemm(&args, &err);
            if (st == INF_OK && !why)
                st = krn_int4_gemm_acc_reduce(acc2, (uint16_t *)c3, n, m, n, NULL, &err);
            CK(cudaDeviceSynchronize());
            if (!why && st != INF_OK)
                why = err.msg;
            else if (!why && !all_zero_words(acc, cn))
                why = "acc_clear's words not zeroed";
            else if (!why && !same_halves(c3, b->c2, cn))
                why = "the launch that cleared other words gave other bits";
            cudaFree(acc2);
            args.acc = acc;
            args.acc_clear = NULL;
            args.acc_clear_words = 0;
        }
    }
    if (why) {
        printf("FAIL acc %s m=%d n=%d k=%d flags=%u taken=%d nan_row=%d: %s\n", label, m, n, k,
               flags, taken, nan_row, why);
        g_failures++;
    } else if (getenv("INT4SERVE_GEMM_TEST_VERBOSE")) {
        printf("ok   acc %s m=%d n=%d k=%d taken=%d\n", label, m, n, k, taken);
    }
    free(hp);
    free(hq);
    cudaFree(acc);
    cudaFree(c3);
    cudaFree(x1);
    cudaFree(x2);
    cudaFree(o1);
    cudaFree(o2);
    cudaFree(wn);
}

/* ---- batch invariance ------------------------------------------------------ */

/* Weights of fewer than 256 tiles of 128 x 128 take one arithmetic at every M
 * (kernels/int4_gemm_policy.c, TINY_TILES), so the rows a batch shares with a
 * larger one come out with the same bits: the engine's batch tests on the
 * small presets rely on it. One random A of max_m rows; every M of ms runs on
 * its first rows and is compared bit for bit with the max_m launch. */
static void check_batch_invariance(struct dev_weight *dw, struct bufs *b, const int *ms, int n_ms,
                                   uint64_t *rng)
{
    const int n = dw->lay.n, k = dw->lay.k;
    int max_m = 0;
    for (int i = 0; i < n_ms; i++)
        max_m = ms[i] > max_m ? ms[i] : max_m;
    fill_random_half<<<256, 256>>>(b->a, (int64_t)max_m * k, splitmix(rng), -1.0f, 1.0f);
    CK(cudaGetLastError());
    const size_t bytes = sizeof(half) * (size_t)max_m * n;
    unsigned char *want = (unsigned char *)malloc(bytes), *got = (unsigned char *)malloc(bytes);
    if (!want || !got) {
        fprintf(stderr, "out of host memory\n");
        exit(2);
    }
    struct krn_int4_gemm_args args;
    memset(&args, 0, sizeof args);
    args.lay = &dw->lay;
    args.plan = &dw->plan;
    args.b = dw->packed;
    args.a = (const uint16_t *)b->a;
    args.workspace = dw->ws;
    args.workspace_bytes = dw->ws_bytes;
    args.config = KRN_INT4_GEMM_CFG_AUTO;
    struct inf_err err;
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < n_ms; i++) {
            const int m = pass == 0 ? max_m : ms[i];
            CK(cudaMemset(b->c, 0xff, bytes));
            args.c = (uint16_t *)b->c;
            args.m = m;
            g_checks++;
            if (krn_int4_gemm(&args, &err) != INF_OK) {
                printf("FAIL batch invariance m=%d: %s\n", m, err.msg);
                g_failures++;
                continue;
            }
            CK(cudaDeviceSynchronize());
            const size_t rows = sizeof(half) * (size_t)m * n;
            CK(cudaMemcpy(pass == 0 ? want : got, b->c, rows, cudaMemcpyDeviceToHost));
            if (pass == 0)
                break;
            if (memcmp(want, got, rows) != 0) {
                printf("FAIL batch invariance n=%d k=%d: the first %d rows differ from the "
                       "same rows at m=%d\n",
                       n, k, m, max_m);
                g_failures++;
            }
        }
    free(want);
    free(got);
}

/* ---- argument checks ----------------------------------------------------- */

static void expect_status(inf_status_t got, inf_status_t want, const char *what)
{
    g_checks++;
    if (got != want) {
        printf("FAIL args: %s returned %s, want %s\n", what, inf_status_name(got),
               inf_status_name(want));
        g_failures++;
    }
}

static void check_arguments(struct dev_weight *dw, struct bufs *b)
{
    struct krn_int4_gemm_args args;
    memset(&args, 0, sizeof args);
    args.lay = &dw->lay;
    args.plan = &dw->plan;
    args.b = dw->packed;
    args.a = (const uint16_t *)b->a;
    args.c = (uint16_t *)b->c;
    args.m = 4;
    args.workspace = dw->ws;
    args.workspace_bytes = dw->ws_bytes;
    args.config = KRN_INT4_GEMM_CFG_AUTO;
    struct krn_int4_gemm_args x;
    x = args;
    x.m = -1;
    expect_status(krn_int4_gemm(&x, NULL), INF_E_INVALID, "m = -1");
    x = args;
    x.flags = KRN_INT4_GEMM_GLU;
    x.c = (uint16_t *)b->c + 1;
    expect_status(krn_int4_gemm(&x, NULL), INF_E_UNSUPPORTED, "GLU output not 4-byte aligned");
    x = args;
    x.c = NULL;
    expect_status(krn_int4_gemm(&x, NULL), INF_E_INVALID, "c = NULL");
    x = args;
    x.workspace_bytes = 16;
    expect_status(krn_int4_gemm(&x, NULL), INF_E_INVALID, "workspace too small");
    x = args;
    x.a = (const uint16_t *)((const char *)b->a + 1);
    expect_status(krn_int4_gemm(&x, NULL), INF_E_UNSUPPORTED, "odd A address");
    x = args;
    x.b = (const char *)dw->packed + 8;
    expect_status(krn_int4_gemm(&x, NULL), INF_E_UNSUPPORTED, "weights not 16-byte aligned");
    x = args;
    x.config = 1000;
    expect_status(krn_int4_gemm(&x, NULL), INF_E_UNSUPPORTED, "config 1000");
    x = args;
    x.plan = NULL;
    expect_status(krn_int4_gemm(&x, NULL), INF_E_INVALID, "no plan");
    struct krn_int4_gemm_plan other = dw->plan;
    other.k_pad += KRN_INT4_GEMM_K_ALIGN;
    x = args;
    x.plan = &other;
    expect_status(krn_int4_gemm(&x, NULL), INF_E_INVALID, "another layout's plan");
    struct krn_int4_gemm_layout bad = dw->lay;
    bad.k_pad += 8;
    x = args;
    x.lay = &bad;
    expect_status(krn_int4_gemm(&x, NULL), INF_E_UNSUPPORTED, "k_pad not a multiple of 128");
    /* m = 0 is a no-op that leaves C alone */
    CK(cudaMemset(b->c, 0x3c, 16));
    x = args;
    x.m = 0;
    expect_status(krn_int4_gemm(&x, NULL), INF_OK, "m = 0");
    unsigned char h[16];
    CK(cudaMemcpy(h, b->c, 16, cudaMemcpyDeviceToHost));
    g_checks++;
    for (int i = 0; i < 16; i++)
        if (h[i] != 0x3c) {
            printf("FAIL args: m = 0 wrote C\n");
            g_failures++;
            break;
        }
    g_checks++;
    if (krn_int4_gemm_config_count() != KRN_INT4_GEMM_CFG_COUNT || !krn_int4_gemm_config_name(0) ||
        krn_int4_gemm_config_name(krn_int4_gemm_config_count())) {
        printf("FAIL config names\n");
        g_failures++;
    }
}

/* ---- the device description -------------------------------------------- */

/* On an H200 (sm_90, 132 SMs) or an A100 (sm_80, 108 SMs): the residency
 * the occupancy calculator gives this build's kernels is the one
 * tests/kernels/test_int4_gemm_policy.c assumes for the device, so the plans
 * it checks on the CPU are this device's (mma.sync and wgmma up to their
 * blocks-per-SM caps, which is all the policy reads of them; the stream
 * kernel's for groups of 128 k exactly). */
static void check_device_description(void)
{
    static const uint8_t bps80[KRN_INT4_GEMM_SM80_COUNT] = {2, 2, 1, 1, 2, 1, 2, 2, 1, 2, 2, 2};
    static const uint8_t h200_80[KRN_INT4_GEMM_SM80_COUNT] = {2, 2, 1, 1, 2, 1, 2, 2, 1, 2, 2, 2};
    static const uint8_t a100_80[KRN_INT4_GEMM_SM80_COUNT] = {2, 1, 1, 1, 1, 1, 2, 1, 1, 1, 1, 2};
    static const uint8_t h200_90[KRN_INT4_GEMM_SM90_COUNT] = {2, 2, 2, 2, 1};
    static const uint8_t bps90[KRN_INT4_GEMM_SM90_COUNT] = {2, 2, 2, 2, 1};
    static const uint8_t stream128[KRN_INT4_GEMM_STREAM_COUNT] = {1, 3, 6};
    const bool h200 = g_gpu.cc == 90 && g_gpu.sms == 132;
    const bool a100 = g_gpu.cc == 80 && g_gpu.sms == 108;
    printf("device: compute capability %d, %d SMs, %d bytes of shared memory a block%s\n",
           (int)g_gpu.cc, (int)g_gpu.sms, (int)g_gpu.smem_per_block,
           h200 || a100 ? "" : " (not the policy test's H200 or A100: residency not compared)");
    if (!h200 && !a100)
        return;
    for (int c = 0; c < KRN_INT4_GEMM_SM80_COUNT; c++) {
        const int got = g_gpu.int4_gemm.sm80[c] < bps80[c] ? g_gpu.int4_gemm.sm80[c] : bps80[c];
        g_checks++;
        if (got != (h200 ? h200_80 : a100_80)[c]) {
            printf("FAIL residency %s: %d blocks an SM, the policy test assumes %d\n",
                   krn_int4_gemm_config_name(KRN_INT4_GEMM_SM80_FIRST + c), got,
                   (h200 ? h200_80 : a100_80)[c]);
            g_failures++;
        }
    }
    for (int c = 0; h200 && c < KRN_INT4_GEMM_SM90_COUNT; c++) {
        const int r = g_gpu.int4_gemm.sm90[c][2], got = r < bps90[c] ? r : bps90[c];
        g_checks++;
        if (!g_gpu.sm90a || got != h200_90[c]) {
            printf("FAIL residency %s: %d blocks an SM (sm_90a %d), the policy test assumes %d\n",
                   krn_int4_gemm_config_name(KRN_INT4_GEMM_SM90_FIRST + c), got, (int)g_gpu.sm90a,
                   h200_90[c]);
            g_failures++;
        }
    }
    for (int v = 0; v < KRN_INT4_GEMM_STREAM_COUNT; v++)
        for (int zp = 0; zp < 2; zp++)
            for (int out = 0; out < 3; out++) {
                g_checks++;
                if (g_gpu.int4_gemm.stream[v][0][zp][out] != stream128[v]) {
                    printf("FAIL residency %s (zero points %d, output %d): %d blocks an SM, the "
                           "policy test assumes %d\n",
                           krn_int4_gemm_config_name(KRN_INT4_GEMM_STREAM_FIRST + v), zp, out,
                           (int)g_gpu.int4_gemm.stream[v][0][zp][out], stream128[v]);
                    g_failures++;
                }
            }
}

/* ---- the case list ---------------------------------------------------- */

struct wcase {
    int32_t k, n, group; /* group 0 = per-channel */
    bool sym;
    const int *ms;
    int n_ms;
    bool sweep; /* also every compiled configuration and the fallback */
};

static const int M_ALL[] = {1, 2, 3, 7, 8, 15, 16, 17, 31, 32, 33, 64, 100, 128, 129, 256, 1000};
static const int M_SOME[] = {1, 3, 16, 33, 129};
static const int M_BIG[] = {1, 8, 17, 64, 128, 256, 1000};
static const int M_QUICK[] = {1, 17, 64, 129};
static const int M_DEEP[] = {1, 17};
/* batch invariance of tiny weights: every configuration M picks (16-, 32-
 * and 64-row tiles), up to 64 rows, where each block of these weights still
 * holds at most one unit (at 129 rows the 64-row tile's 132 blocks do not
 * cover 4096 x 11's 192 units, and a block summing two k tiles in its
 * registers changes the order of the additions) */
static const int M_INV[] = {1, 3, 8, 16, 17, 33, 64};
static const int M_GLU[] = {1, 3, 8, 16, 17, 33, 64, 129};
static const int M_ACC[] = {1, 2, 4, 8, 9, 16, 17, 64};
#define LEN(x) ((int)(sizeof(x) / sizeof((x)[0])))

/* ---- case lists: a weight per case, a function per M ------------------------ */

typedef void (*m_fn)(struct dev_weight *dw, struct bufs *b, int m, int i, uint64_t *rng);

/* Checks of a whole case, after its M values (ci: its index in the list). */
typedef void (*case_fn)(struct dev_weight *dw, struct bufs *b, const struct wcase *wc, int ci,
                        int max_m, uint64_t *rng);

/* For each case: its weight (in the GLU column order with glu) and buffers,
 * fn for each of its M values, then after (if any), a line per case. */
static void run_cases(const struct wcase *cases, int n_cases, bool glu, const char *what, m_fn fn,
                      case_fn after, uint64_t *rng)
{
    for (int ci = 0; ci < n_cases; ci++) {
        const struct wcase *wc = &cases[ci];
        int max_m = 0;
        for (int i = 0; i < wc->n_ms; i++)
            max_m = wc->ms[i] > max_m ? wc->ms[i] : max_m;
        struct dev_weight dw;
        weight_make(&dw, wc->n, wc->k, wc->group, wc->sym, max_m, rng, glu);
        struct bufs b;
        bufs_make(&b, (size_t)max_m * wc->k, (size_t)max_m * wc->n);
        int f0 = g_failures;
        for (int i = 0; i < wc->n_ms; i++)
            fn(&dw, &b, wc->ms[i], i, rng);
        if (after)
            after(&dw, &b, wc, ci, max_m, rng);
        printf("%s %s k=%d n=%d group=%d %s: %d M values\n", g_failures == f0 ? "ok  " : "FAIL",
               what, wc->k, wc->n, wc->group, wc->sym ? "sym" : "asym", wc->n_ms);
        fflush(stdout);
        bufs_free(&b);
        weight_free(&dw);
    }
}

/* The plain launch at M value i of a case: automatic choice, and in turn the
 * forced sm_75 fallback, A one element off, the striped grid, unswapped
 * operands; up to 8 rows every stream-kernel variant (the automatic choice
 * takes them up to 4 rows on some weights only). */
static void plain_ms(struct dev_weight *dw, struct bufs *b, int m, int i, uint64_t *rng)
{
    check_case(dw, b, m, -1, 0, i % 2 == 0, 0, rng, "auto");
    for (int c = KRN_INT4_GEMM_STREAM_FIRST;
         m <= 8 && c < KRN_INT4_GEMM_STREAM_FIRST + KRN_INT4_GEMM_STREAM_COUNT; c++)
        check_case(dw, b, m, c, 0, (i + c) % 2 == 0, 0, rng, krn_int4_gemm_config_name(c));
    if (i % 3 == 0)
        check_case(dw, b, m, -1, KRN_INT4_GEMM_FORCE_SM75, true, 0, rng, "sm75");
    if (i % 4 == 1)
        check_case(dw, b, m, -1, 0, true, 1, rng, "a+1");
    /* the grid over every resident block, where the default takes whole
     * split-K shares per tile */
    if (i % 4 == 3)
        check_case(dw, b, m, -1, KRN_INT4_GEMM_GRID_STRIPED, i % 8 == 3, 0, rng, "striped");
    /* tokens as the mma A operand, where the default swaps them */
    if (m <= 8 && i % 2 == 1)
        check_case(dw, b, m, -1, KRN_INT4_GEMM_NO_SWAP, true, i % 4 == 1, rng, "no swap");
}

/* The plain cases' whole-case checks: the dequantization, every
 * configuration at a few M on sweep cases, argument errors (first case),
 * batch invariance on tiny weights. */
static void plain_case(struct dev_weight *dw, struct bufs *b, const struct wcase *wc, int ci,
                       int max_m, uint64_t *rng)
{
    check_dequant(dw);
    const int n_cfg = krn_int4_gemm_config_count();
    for (int i = 0; wc->sweep && i < wc->n_ms; i++) {
        const int m = wc->ms[i];
        if (m != 1 && m != 17 && m != 64 && m != 129 && m != 1000)
            continue;
        for (int c = 0; c < n_cfg; c++) {
            check_case(dw, b, m, c, 0, true, 0, rng, krn_int4_gemm_config_name(c));
            if (m == 1 || m == 64)
                check_case(dw, b, m, c, KRN_INT4_GEMM_GRID_STRIPED, false, 0, rng,
                           krn_int4_gemm_config_name(c));
            if (m == 1)
                check_case(dw, b, m, c, KRN_INT4_GEMM_NO_SWAP, true, 0, rng,
                           krn_int4_gemm_config_name(c));
        }
    }
    if (ci == 0)
        check_arguments(dw, b);
    if ((int64_t)(dw->lay.n_pad / 128) * (dw->lay.k_pad / 128) < 256 && max_m >= 64)
        check_batch_invariance(dw, b, M_INV, LEN(M_INV), rng);
}

static int g_major; /* the device's compute capability major */

static void glu_ms(struct dev_weight *dw, struct bufs *b, int m, int i, uint64_t *rng)
{
    check_glu(dw, b, m, -1, 0, i % 2 == 1, rng, "auto");
    if (i % 2 == 0) { /* no bias: the fixed-point sums take none */
        const bool tiny = (int64_t)(dw->lay.n_pad / 128) * (dw->lay.k_pad / 128) < 256;
        /* against the automatic launch's C and reference GLU just made */
        check_glu_acc(dw, b, m, g_major >= 8 && m <= 16 && !tiny);
    }
    for (int c = KRN_INT4_GEMM_STREAM_FIRST;
         m <= 8 && c < KRN_INT4_GEMM_STREAM_FIRST + KRN_INT4_GEMM_STREAM_COUNT; c++)
        check_glu(dw, b, m, c, 0, (i + c) % 2 == 1, rng, krn_int4_gemm_config_name(c));
    if (i % 3 == 0)
        check_glu(dw, b, m, -1, KRN_INT4_GEMM_FORCE_SM75, true, rng, "sm75");
    if (i % 3 == 1)
        check_glu(dw, b, m, -1, KRN_INT4_GEMM_GRID_STRIPED, false, rng, "striped");
    if (m <= 8 && i % 2 == 0)
        check_glu(dw, b, m, -1, KRN_INT4_GEMM_NO_SWAP, false, rng, "no swap");
}

/* want: the launch must take the sums (M <= 16, not tiny, the sm_80 kernel). */
static void acc_ms(struct dev_weight *dw, struct bufs *b, int m, int i, uint64_t *rng)
{
    const bool tiny = (int64_t)(dw->lay.n_pad / 128) * (dw->lay.k_pad / 128) < 256;
    const int want = g_major >= 8 && m <= 16 && !tiny;
    check_acc(dw, b, m, 0, want, -1, rng, "auto");
    if (i % 2 == 0)
        check_acc(dw, b, m, 0, want, m / 2, rng, "nan");
    if (i % 3 == 1)
        check_acc(dw, b, m, KRN_INT4_GEMM_GRID_STRIPED, 0, -1, rng, "striped");
    if (m <= 8 && i % 2 == 1)
        check_acc(dw, b, m, KRN_INT4_GEMM_NO_SWAP, want, -1, rng, "no swap");
    if (i % 4 == 0)
        check_acc(dw, b, m, KRN_INT4_GEMM_FORCE_SM75, 0, -1, rng, "sm75");
}

int main(void)
{
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("SKIPPED: no GPU\n");
        return 77; /* ctest: skipped (SKIP_RETURN_CODE, tests/CMakeLists.txt) */
    }
    const char *seed_env = getenv("INT4SERVE_TEST_SEED");
    g_seed = seed_env ? strtoull(seed_env, NULL, 0) : (uint64_t)time(NULL) * 2654435761ull;
    printf("seed %llu (INT4SERVE_TEST_SEED replays it)\n", (unsigned long long)g_seed);
    uint64_t rng = g_seed;
    bool quick = getenv("INT4SERVE_GEMM_TEST_QUICK") != NULL;
    struct inf_err derr;
    if (krn_cuda_device_describe(0, &g_gpu, &derr) != INF_OK) {
        printf("FAIL describe: %s\n", derr.msg);
        return 1;
    }
    check_device_description();

    static const struct wcase full[] = {
        {4096, 4096, 128, false, M_ALL, LEN(M_ALL), true},
        {4096, 4096, 128, true, M_ALL, LEN(M_ALL), false},
        {4096, 4096, 32, false, M_SOME, LEN(M_SOME), true},
        {4096, 4096, 64, true, M_SOME, LEN(M_SOME), false},
        {4096, 4096, 256, false, M_SOME, LEN(M_SOME), false},
        {4096, 4096, 0, false, M_SOME, LEN(M_SOME), true},
        {4096, 4096, 0, true, M_SOME, LEN(M_SOME), false},
        {4096, 12288, 128, false, M_BIG, LEN(M_BIG), false},
        {11008, 4096, 128, true, M_BIG, LEN(M_BIG), false},
        {11008, 4096, 64, false, M_SOME, LEN(M_SOME), false},
        {288, 288, 256, false, M_ALL, LEN(M_ALL), true},
        {288, 288, 256, true, M_SOME, LEN(M_SOME), false},
        {4096, 11, 128, false, M_ALL, LEN(M_ALL), true},
        {4096, 11, 32, true, M_SOME, LEN(M_SOME), false},
        {100, 4096, 32, false, M_ALL, LEN(M_ALL), true},
        {100, 4096, 32, true, M_SOME, LEN(M_SOME), false},
        {14336, 4096, 128, false, M_BIG, LEN(M_BIG), false},
        /* k neither a multiple of the group nor of 16 (the stream kernel's
         * last activation pairs past k) */
        {1000, 4096, 128, true, M_ACC, LEN(M_ACC), false},
    };
    static const struct wcase small[] = {
        {288, 288, 256, false, M_QUICK, LEN(M_QUICK), true},
        {512, 300, 32, true, M_QUICK, LEN(M_QUICK), true},
        {100, 520, 32, false, M_QUICK, LEN(M_QUICK), false},
        {1024, 11, 0, false, M_QUICK, LEN(M_QUICK), false},
        /* the swapped operands' chunk scaling with a group boundary inside
         * a warp's k steps (groups of 32; 256 tiles, not tiny) */
        {4096, 1024, 32, false, M_QUICK, LEN(M_QUICK), true},
        /* blocks with more units than pipeline stages, so the in-loop
         * prefetch and the split-K reduction run too */
        {16384, 1024, 128, false, M_DEEP, LEN(M_DEEP), false},
        /* the stream kernel at M <= 8: groups of 64 (two a warp), zeros, k
         * past the last full k16 step */
        {1000, 4096, 64, true, M_ACC, LEN(M_ACC), false},
    };
    const struct wcase *cases = quick ? small : full;
    int n_cases = quick ? LEN(small) : LEN(full);
    run_cases(cases, n_cases, false, "plain", plain_ms, plain_case, &rng);
    /* GLU output: weights made as [gate; up] in the GLU column order */
    static const struct wcase glu_full[] = {
        {4096, 22016, 128, false, M_GLU, LEN(M_GLU), false},
        {4096, 4096, 128, true, M_GLU, LEN(M_GLU), false},
        {4096, 2048, 32, false, M_GLU, LEN(M_GLU), false},
        {11008, 4096, 64, true, M_GLU, LEN(M_GLU), false},
        {288, 512, 256, true, M_GLU, LEN(M_GLU), false},
    };
    static const struct wcase glu_small[] = {
        {4096, 2048, 128, false, M_QUICK, LEN(M_QUICK), false},
        {288, 512, 32, true, M_QUICK, LEN(M_QUICK), false},
    };
    CK(cudaDeviceGetAttribute(&g_major, cudaDevAttrComputeCapabilityMajor, 0));
    run_cases(quick ? glu_small : glu_full, quick ? LEN(glu_small) : LEN(glu_full), true, "glu",
              glu_ms, NULL, &rng);
    /* Fixed-point sums: the decode step's o and down shapes and others. */
    static const struct wcase acc_full[] = {
        {4096, 4096, 128, false, M_ACC, LEN(M_ACC), false},
        {11008, 4096, 128, true, M_ACC, LEN(M_ACC), false},
        {4096, 12288, 64, false, M_ACC, LEN(M_ACC), false},
        {14336, 4096, 32, false, M_ACC, LEN(M_ACC), false},
        {4096, 1000, 128, false, M_ACC, LEN(M_ACC), false},
        {288, 288, 256, false, M_ACC, LEN(M_ACC), false}, /* tiny: never taken */
    };
    static const struct wcase acc_small[] = {
        {4096, 1024, 128, false, M_QUICK, LEN(M_QUICK), false},
        {288, 512, 32, true, M_QUICK, LEN(M_QUICK), false},
    };
    run_cases(quick ? acc_small : acc_full, quick ? LEN(acc_small) : LEN(acc_full), false, "acc",
              acc_ms, NULL, &rng);

    printf("%s: %d checks, %d failures (seed %llu)\n", g_failures ? "FAILED" : "PASSED", g_checks,
           g_failures, (unsigned long long)g_seed);
    return g_failures ? 1 : 0;
}
