/* bench_gemm — the INT4 GEMM (kernels/int4_gemm.h) against cuBLAS fp16 in the
 * same run, on the Llama-2-7B and Llama-3-8B linear-layer shapes.
 *
 *   bench_gemm OUT.json [--sym] [--group G] [--ms 1,2,4] [--shapes llama2|all]
 *              [--shape NAME] [--config C] [--map C16,C32,C64,CBIG] [--sweep] [--striped]
 *              [--resident] [--noswap] [--between] [--acc] [--replays R]
 *
 * Method: weight buffers (ours and cuBLAS's) are rotated over more than 4x
 * the L2 size, so every launch reads its weights from HBM; each measurement
 * is a CUDA graph of many launches (cycling the copies), replayed several
 * times after a warm-up; the per-launch time is the median replay over the
 * launches in it. cuBLAS: cublasGemmEx, fp16 A/B/C, CUBLAS_COMPUTE_32F (fp32
 * accumulation, tensor ops), default algorithm. Ceilings measured in the same
 * run: bandwidth from a 1 GiB device-to-device copy (bytes read + written),
 * peak from an 8192^3 cuBLAS fp16 GEMM. Roofline floor of a case = max(bytes /
 * bandwidth, flops / peak) with bytes = packed weights + scales (+ zeros) +
 * A + C. The acceptance sums add the four Llama-2-7B shapes per M. Also
 * timed per shape: krn_int4_dequant_f16 (the weight to fp16 once), so the
 * sums show dequantize + cuBLAS, the CUDA backend's path for large M. And
 * per shape a launch that does nothing but read the weight's bytes (the
 * same rotated buffers, best of a few grids), plain and with programmatic
 * dependent launch: what one launch per linear costs before any arithmetic
 * (the "read" sums bound what any one-launch-per-linear kernel can reach).
 * --striped also times our kernel with KRN_INT4_GEMM_GRID_STRIPED.
 * --noswap also times our kernel with KRN_INT4_GEMM_NO_SWAP (M <= 8).
 * --between also times each GEMM behind a small row kernel that writes its A
 * (as the model's norms, attention and SiLU·mul do; launched with
 * programmatic dependent launch like them): a graph of (row kernel, GEMM)
 * pairs minus a graph of the row kernel alone, against the GEMMs back to back;
 * twice: the row kernel letting the GEMM launch after its own wait
 * ("behind_row") and before it ("row_first", what the model's row kernels do
 * up to krncuda::kPdlEarlyRows rows).
 * --acc also times our kernel at M <= 16 with KRN_INT4_GEMM_ACC64, the
 * decode step's form (the sums left as fixed-point words for their reader,
 * no split-K tail and no C; each launch zeroes the words of the one before,
 * as the model's linears do): the reader's conversion is not included.
 * --resident uses one copy of each weight instead of the rotation, so
 * weights that fit the L2 are read from it (what prefetching a weight into
 * the L2 ahead of its GEMM could give; not the acceptance method).
 * --config forces one configuration, C its name as krn_int4_gemm_config_name
 * gives it (kernels/int4_gemm_configs.h), quoted: --config "sm80 m16 n128
 * k128 w4 s4". --map times a candidate automatic choice: configuration C16
 * for M <= 16, C32 for M <= 32, C64 for M <= 64, CBIG beyond, names
 * separated by commas (the weight's plan is used when neither --config nor
 * --map is given). */
#include "bench/common/graph_timer.cuh"
#include "common/inf.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/int4_gemm.h"

#include <algorithm>
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <string>
#include <vector>

#define CB(x)                                                                                      \
    do {                                                                                           \
        cublasStatus_t s_ = (x);                                                                   \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                         \
            fprintf(stderr, "%s:%d: %s: cublas status %d\n", __FILE__, __LINE__, #x, (int)s_);     \
            exit(2);                                                                               \
        }                                                                                          \
    } while (0)

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

/* Device-to-device copy with 16-byte loads and stores: the bandwidth ceiling
 * an SM-driven streaming kernel can reach (a graph memcpy node may run on a
 * copy engine instead). */
__global__ void copy_kernel(const uint4 *__restrict__ src, uint4 *__restrict__ dst, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = src[i];
}

/* A launch that only reads n 16-byte words (four loads in flight per thread
 * per iteration, L1 not allocated) and folds them into one word, stored only
 * if it equals a value random data does not give: the time a launch of the
 * linear's weight bytes takes with nothing else to do. pdl: launched with
 * programmatic dependent launch, reading before griddepcontrol.wait (as the
 * GEMM prefetches its first stages), so consecutive launches may overlap. */
__global__ void read_kernel(const uint4 *__restrict__ src, int64_t n, uint32_t *sink, int pdl)
{
    if (pdl)
        krncuda::pdl_trigger();
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    uint32_t x = 0;
    for (; i + 3 * stride < n; i += 4 * stride) {
        const uint4 a = krncuda::ld_stream(src + i), b = krncuda::ld_stream(src + i + stride);
        const uint4 c = krncuda::ld_stream(src + i + 2 * stride),
                    d = krncuda::ld_stream(src + i + 3 * stride);
        x ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^
             d.z ^ d.w;
    }
    for (; i < n; i += stride) {
        const uint4 a = krncuda::ld_stream(src + i);
        x ^= a.x ^ a.y ^ a.z ^ a.w;
    }
    if (pdl)
        krncuda::pdl_wait();
    if (x == 0x5eed1e55u)
        sink[blockIdx.x] = x;
}

static void launch_read(const void *src, size_t bytes, uint32_t *sink, int blocks, int threads,
                        bool pdl, cudaStream_t stream)
{
    const uint4 *p = (const uint4 *)src;
    const int64_t n = (int64_t)(bytes / 16);
    if (pdl)
        CK(krncuda::launch_pdl(read_kernel, dim3((unsigned)blocks), dim3((unsigned)threads), 0,
                               stream, p, n, sink, 1));
    else
        read_kernel<<<blocks, threads, 0, stream>>>(p, n, sink, 0);
}

/* The small kernel of --between: one block per row of x [m][k], y = x scaled,
 * 16 bytes a thread per step; waits for the kernel before it (the GEMM that
 * read y); `early` = 0 lets the next one launch only after that wait, 1
 * before it (krncuda::pdl_enter: the model's row kernels take 1 up to
 * krncuda::kPdlEarlyRows rows). */
__global__ void row_kernel(const uint4 *__restrict__ x, uint4 *__restrict__ y, int k8, int early)
{
    krncuda::pdl_enter(early);
    const int64_t row = blockIdx.x;
    for (int i = threadIdx.x; i < k8; i += blockDim.x) {
        uint4 v = x[row * k8 + i];
        __half2 *h = reinterpret_cast<__half2 *>(&v);
#pragma unroll
        for (int j = 0; j < 4; j++)
            h[j] = __hmul2(h[j], __float2half2_rn(1.0f));
        y[row * k8 + i] = v;
    }
}

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

struct shape {
    const char *name;
    int k, n;
    bool llama2;
};

static const shape kShapes[] = {
    {"l2-qkv", 4096, 12288, true},    {"l2-o", 4096, 4096, true},
    {"l2-gateup", 4096, 22016, true}, {"l2-down", 11008, 4096, true},
    {"l3-qkv", 4096, 6144, false},    {"l3-gateup", 4096, 28672, false},
    {"l3-down", 14336, 4096, false},
};

struct result {
    const char *name;
    int k, n, m, config;
    bool llama2;
    double ours_us, cublas_us, bytes, flops, floor_us;
    double dequant_us; /* the weight dequantized to fp16 once (the backend's large-M path) */
    double read_us, read_pdl_us; /* a launch that only reads the weight's bytes (best grid) */
    double striped_us;           /* ours with KRN_INT4_GEMM_GRID_STRIPED (--striped), or 0 */
    double noswap_us;            /* ours with KRN_INT4_GEMM_NO_SWAP (--noswap, M <= 8), or 0 */
    double between_us;           /* ours behind a row kernel (--between), or 0 */
    double between_early_us;     /* the same, the row kernel triggering before it waits */
    double acc_us;               /* ours with KRN_INT4_GEMM_ACC64 (--acc, M <= 16), or 0 */
};

static cudaStream_t g_stream;

/* Configurations by name, separated by commas; -2 for a name none has. */
static void parse_configs(const char *s, std::vector<int> &out)
{
    out.clear();
    for (;;) {
        const char *c = strchr(s, ',');
        const std::string name = c ? std::string(s, c - s) : std::string(s);
        const int i = krn_int4_gemm_config_find(name.c_str());
        if (i < 0)
            fprintf(stderr, "no configuration \"%s\"\n", name.c_str());
        out.push_back(i < 0 ? -2 : i);
        if (!c)
            break;
        s = c + 1;
    }
}

static void parse_list(const char *s, std::vector<int> &out)
{
    out.clear();
    while (*s) {
        out.push_back(atoi(s));
        const char *c = strchr(s, ',');
        if (!c)
            break;
        s = c + 1;
    }
}

int main(int argc, char **argv)
{
    const char *json_path = NULL;
    bool sym = false, sweep = false, all_shapes = true, striped = false, resident = false;
    bool noswap = false, between = false, acc = false;
    const char *only_shape = NULL;
    int group = 128, force_config = -1, replays = 9;
    std::vector<int> ms = {1, 2, 4, 8, 16, 32, 64, 128, 256};
    std::vector<int> cfg_map;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--sym"))
            sym = true;
        else if (!strcmp(argv[i], "--sweep"))
            sweep = true;
        else if (!strcmp(argv[i], "--striped"))
            striped = true;
        else if (!strcmp(argv[i], "--resident"))
            resident = true;
        else if (!strcmp(argv[i], "--noswap"))
            noswap = true;
        else if (!strcmp(argv[i], "--between"))
            between = true;
        else if (!strcmp(argv[i], "--acc"))
            acc = true;
        else if (!strcmp(argv[i], "--group") && i + 1 < argc)
            group = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--config") && i + 1 < argc) {
            force_config = krn_int4_gemm_config_find(argv[++i]);
            if (force_config < 0) {
                fprintf(stderr, "no configuration \"%s\"\n", argv[i]);
                return 2;
            }
        } else if (!strcmp(argv[i], "--replays") && i + 1 < argc)
            replays = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--map") && i + 1 < argc) {
            parse_configs(argv[++i], cfg_map);
            if (cfg_map.size() != 4 || std::count(cfg_map.begin(), cfg_map.end(), -2)) {
                fprintf(stderr, "--map wants four configuration names\n");
                return 2;
            }
        } else if (!strcmp(argv[i], "--ms") && i + 1 < argc)
            parse_list(argv[++i], ms);
        else if (!strcmp(argv[i], "--shapes") && i + 1 < argc)
            all_shapes = strcmp(argv[++i], "llama2") != 0;
        else if (!strcmp(argv[i], "--shape") && i + 1 < argc)
            only_shape = argv[++i];
        else if (argv[i][0] != '-')
            json_path = argv[i];
        else {
            fprintf(stderr,
                    "usage: %s OUT.json [--sym] [--group G] [--ms 1,2] [--shapes llama2|all] "
                    "[--shape NAME] [--config C] [--map C16,C32,C64,CBIG] [--sweep] [--striped] "
                    "[--resident] [--noswap] [--between] [--acc] [--replays R]\n",
                    argv[0]);
            return 2;
        }
    }
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("SKIPPED: no GPU\n");
        return 0;
    }
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    struct krn_cuda_device gpu; /* what the GEMM's plans are made for */
    {
        struct inf_err err;
        if (krn_cuda_device_describe(0, &gpu, &err) != INF_OK) {
            fprintf(stderr, "describe: %s\n", err.msg);
            return 1;
        }
    }
    CK(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
    cublasHandle_t cb;
    CB(cublasCreate(&cb));
    CB(cublasSetStream(cb, g_stream));
    void *cb_ws;
    const size_t cb_ws_bytes = 64u << 20;
    CK(cudaMalloc(&cb_ws, cb_ws_bytes));
    CB(cublasSetWorkspace(cb, cb_ws, cb_ws_bytes));
    const double l2 = (double)prop.l2CacheSize;
    printf("device %s, %d SMs, L2 %.0f MB, group %d, %s%s\n", prop.name, prop.multiProcessorCount,
           l2 / 1e6, group, sym ? "symmetric" : "asymmetric",
           resident ? ", weights L2-resident where they fit (--resident)" : "");

    /* ---- ceilings ---- */
    double bw_gbs, peak_tflops;
    {
        const size_t bytes = 1u << 30;
        void *src, *dst;
        CK(cudaMalloc(&src, bytes));
        CK(cudaMalloc(&dst, bytes));
        CK(cudaMemset(src, 1, bytes));
        double us = time_graph(g_stream, 4, replays, [&](int) {
            CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, g_stream));
        });
        const double bw_memcpy = 2.0 * bytes / (us * 1e-6) / 1e9;
        us = time_graph(g_stream, 4, replays, [&](int) {
            copy_kernel<<<prop.multiProcessorCount * 8, 512, 0, g_stream>>>(
                (const uint4 *)src, (uint4 *)dst, (int64_t)(bytes / 16));
        });
        const double bw_kernel = 2.0 * bytes / (us * 1e-6) / 1e9;
        uint32_t *sink1;
        CK(cudaMalloc((void **)&sink1, 4096 * sizeof(uint32_t)));
        us = time_graph(g_stream, 4, replays, [&](int) {
            launch_read(src, bytes, sink1, prop.multiProcessorCount * 4, 512, false, g_stream);
        });
        CK(cudaFree(sink1));
        printf("read bandwidth (read kernel, 1 GiB): %.0f GB/s\n", bytes / (us * 1e-6) / 1e9);
        printf("copy bandwidth: cudaMemcpyAsync %.0f GB/s, copy kernel %.0f GB/s (the larger is "
               "the ceiling)\n",
               bw_memcpy, bw_kernel);
        bw_gbs = std::max(bw_memcpy, bw_kernel);
        CK(cudaFree(src));
        CK(cudaFree(dst));
        const int s = 8192;
        half *a, *b, *c;
        CK(cudaMalloc((void **)&a, sizeof(half) * s * s));
        CK(cudaMalloc((void **)&b, sizeof(half) * s * s));
        CK(cudaMalloc((void **)&c, sizeof(half) * s * s));
        fill_random_half<<<1024, 256>>>(a, (int64_t)s * s, 1, -1, 1);
        fill_random_half<<<1024, 256>>>(b, (int64_t)s * s, 2, -1, 1);
        CK(cudaDeviceSynchronize());
        const float alpha = 1.0f, beta = 0.0f;
        us = time_graph(g_stream, 4, replays, [&](int) {
            CB(cublasGemmEx(cb, CUBLAS_OP_T, CUBLAS_OP_N, s, s, s, &alpha, b, CUDA_R_16F, s, a,
                            CUDA_R_16F, s, &beta, c, CUDA_R_16F, s, CUBLAS_COMPUTE_32F,
                            CUBLAS_GEMM_DEFAULT));
        });
        peak_tflops = 2.0 * s * s * (double)s / (us * 1e-6) / 1e12;
        CK(cudaFree(a));
        CK(cudaFree(b));
        CK(cudaFree(c));
    }
    printf("measured: copy bandwidth %.0f GB/s, cuBLAS fp16 peak %.0f TFLOP/s\n", bw_gbs,
           peak_tflops);

    std::vector<result> results;
    const int max_m = *std::max_element(ms.begin(), ms.end());
    uint64_t rng = 12345;
    const int n_cfg = krn_int4_gemm_config_count();

    printf("%-10s %6s %6s %5s | %9s %9s %7s | %7s %8s %6s | %7s %7s | %8s %8s | %s\n", "shape", "K",
           "N", "M", "ours_us", "cublas_us", "speedup", "GB/s", "floor_us", "%floor", "read_us",
           "rd_pdl", "striped", "noswap", "config");
    for (const shape &sh : kShapes) {
        if ((!all_shapes && !sh.llama2) || (only_shape && strcmp(only_shape, sh.name)))
            continue;
        /* one random canonical weight, repacked, then copied nrot times */
        struct krn_q4_weight w;
        memset(&w, 0, sizeof w);
        w.n = sh.n;
        w.k = sh.k;
        w.group = group;
        w.kp = (sh.k + group - 1) / group * group;
        w.symmetric = sym;
        const int ng = w.kp / group;
        std::vector<uint8_t> q((size_t)sh.n * (w.kp / 2));
        std::vector<uint16_t> sc((size_t)sh.n * ng), zr((size_t)sh.n * ng);
        for (size_t i = 0; i < q.size(); i++)
            q[i] = (uint8_t)splitmix(&rng);
        for (size_t i = 0; i < sc.size(); i++) {
            uint64_t r = splitmix(&rng);
            sc[i] = inf_f32_to_f16((float)(0.001 + 0.01 * (double)(r % 1000) / 1000.0));
            zr[i] = inf_f32_to_f16(sym ? 8.0f : (float)((r >> 20) % 16));
        }
        w.q = q.data();
        w.scale = sc.data();
        w.zero = zr.data();
        struct krn_int4_gemm_layout lay;
        struct inf_err err;
        struct krn_int4_gemm_plan plan;
        if (krn_int4_gemm_layout_make(&w, &lay, &err) != INF_OK ||
            krn_int4_gemm_plan_make(&gpu, &lay, &plan, &err) != INF_OK) {
            fprintf(stderr, "layout and plan: %s\n", err.msg);
            return 1;
        }
        std::vector<uint8_t> packed(lay.bytes);
        if (krn_int4_gemm_repack(&w, &lay, packed.data(), packed.size(), &err) != INF_OK) {
            fprintf(stderr, "repack: %s\n", err.msg);
            return 1;
        }
        const int nrot = resident ? 1 : std::max(2, (int)ceil(4.5 * l2 / (double)lay.bytes));
        std::vector<void *> wq(nrot);
        for (int i = 0; i < nrot; i++) {
            CK(cudaMalloc(&wq[i], lay.bytes));
            CK(cudaMemcpy(wq[i], packed.data(), lay.bytes, cudaMemcpyHostToDevice));
        }
        const size_t wf_bytes = sizeof(half) * (size_t)sh.n * sh.k;
        const int nrot_f = resident ? 1 : std::max(2, (int)ceil(4.5 * l2 / (double)wf_bytes));
        std::vector<half *> wf(nrot_f);
        for (int i = 0; i < nrot_f; i++) {
            CK(cudaMalloc((void **)&wf[i], wf_bytes));
            fill_random_half<<<1024, 256>>>(wf[i], (int64_t)sh.n * sh.k, splitmix(&rng), -0.05f,
                                            0.05f);
        }
        half *a, *c;
        CK(cudaMalloc((void **)&a, sizeof(half) * (size_t)max_m * sh.k));
        CK(cudaMalloc((void **)&c, sizeof(half) * (size_t)max_m * sh.n));
        fill_random_half<<<1024, 256>>>(a, (int64_t)max_m * sh.k, splitmix(&rng), -1, 1);
        half *x_rows = nullptr; /* --between: the row kernel's input */
        if (between) {
            CK(cudaMalloc((void **)&x_rows, sizeof(half) * (size_t)max_m * sh.k));
            CK(cudaMemcpy(x_rows, a, sizeof(half) * (size_t)max_m * sh.k,
                          cudaMemcpyDeviceToDevice));
        }
        int64_t *acc_w[2] = {nullptr, nullptr}; /* --acc: the words, two launches' */
        const int64_t acc_words = (int64_t)std::min(max_m, 16) * sh.n;
        if (acc)
            for (int64_t *&w : acc_w) {
                CK(cudaMalloc((void **)&w, sizeof(int64_t) * (size_t)acc_words));
                CK(cudaMemset(w, 0, sizeof(int64_t) * (size_t)acc_words));
            }
        size_t ws_bytes = krn_int4_gemm_workspace_size(&plan, max_m);
        void *ws;
        CK(cudaMalloc(&ws, ws_bytes));
        CK(cudaMemset(ws, 0, ws_bytes));
        CK(cudaDeviceSynchronize());

        /* The backend's path for large M: dequantize the weight to fp16 once
         * (krn_int4_dequant_f16), then cuBLAS. Its cost does not depend on M. */
        const double t_dq = time_graph(g_stream, std::max(nrot, 24), replays, [&](int i) {
            struct inf_err e2;
            if (krn_int4_dequant_f16(&lay, wq[i % nrot], (uint16_t *)wf[i % nrot_f], sh.k, g_stream,
                                     &e2) != INF_OK) {
                fprintf(stderr, "krn_int4_dequant_f16: %s\n", e2.msg);
                exit(1);
            }
        });

        /* the weight's bytes read and nothing else, best of a few grids */
        uint32_t *sink;
        CK(cudaMalloc((void **)&sink, 4096 * sizeof(uint32_t)));
        double t_read[2] = {1e30, 1e30};
        for (int pdl = 0; pdl < 2; pdl++)
            for (int bps : {2, 4, 8})
                for (int threads : {256, 512}) {
                    const double t = time_graph(g_stream, std::max(nrot, 24), replays, [&](int i) {
                        launch_read(wq[i % nrot], lay.bytes, sink, prop.multiProcessorCount * bps,
                                    threads, pdl != 0, g_stream);
                    });
                    t_read[pdl] = std::min(t_read[pdl], t);
                }
        CK(cudaFree(sink));

        for (int m : ms) {
            const int launches = std::max(nrot, 24);
            /* launch i of a graph: our GEMM on weight copy i % nrot */
            int32_t acc_taken = 0;
            auto gemm = [&](int i, int config, uint32_t flags) {
                struct krn_int4_gemm_args args;
                memset(&args, 0, sizeof args);
                if (flags & KRN_INT4_GEMM_ACC64) {
                    args.acc = acc_w[i & 1];
                    args.acc_clear = acc_w[(i + 1) & 1];
                    args.acc_clear_words = (int64_t)m * sh.n;
                    args.acc_taken = &acc_taken;
                }
                args.lay = &lay;
                args.plan = &plan;
                args.b = wq[i % nrot];
                args.a = (const uint16_t *)a;
                args.c = (uint16_t *)c;
                args.m = m;
                args.workspace = ws;
                args.workspace_bytes = ws_bytes;
                args.stream = g_stream;
                args.config = config;
                args.flags = flags;
                struct inf_err e2;
                if (krn_int4_gemm(&args, &e2) != INF_OK) {
                    fprintf(stderr, "krn_int4_gemm: %s\n", e2.msg);
                    exit(1);
                }
            };
            auto ours = [&](int config, uint32_t flags = 0) {
                return time_graph(g_stream, launches, replays,
                                  [&](int i) { gemm(i, config, flags); });
            };
            int best_cfg = force_config;
            if (best_cfg < 0 && !cfg_map.empty())
                best_cfg = cfg_map[m <= 16 ? 0 : m <= 32 ? 1 : m <= 64 ? 2 : 3];
            double t_ours = ours(best_cfg);
            if (sweep) {
                for (int ci = 0; ci < n_cfg; ci++) {
                    if (strstr(krn_int4_gemm_config_name(ci), "sm75"))
                        continue; /* the fallback, slow by design */
                    double t = ours(ci);
                    printf("    sweep %-10s M=%-4d %-24s %8.2f us\n", sh.name, m,
                           krn_int4_gemm_config_name(ci), t);
                    if (t < t_ours) {
                        t_ours = t;
                        best_cfg = ci;
                    }
                }
            }
            const float alpha = 1.0f, beta = 0.0f;
            double t_cb = time_graph(g_stream, std::max(nrot_f, 24), replays, [&](int i) {
                CB(cublasGemmEx(cb, CUBLAS_OP_T, CUBLAS_OP_N, sh.n, m, sh.k, &alpha, wf[i % nrot_f],
                                CUDA_R_16F, sh.k, a, CUDA_R_16F, sh.k, &beta, c, CUDA_R_16F, sh.n,
                                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
            });
            result r = {};
            r.name = sh.name;
            r.k = sh.k;
            r.n = sh.n;
            r.m = m;
            r.config = best_cfg;
            r.llama2 = sh.llama2;
            r.ours_us = t_ours;
            r.cublas_us = t_cb;
            r.dequant_us = t_dq;
            r.read_us = t_read[0];
            r.read_pdl_us = t_read[1];
            r.striped_us = striped ? ours(best_cfg, KRN_INT4_GEMM_GRID_STRIPED) : 0;
            r.noswap_us = noswap && m <= 8 ? ours(best_cfg, KRN_INT4_GEMM_NO_SWAP) : 0;
            if (acc && m <= 16) {
                r.acc_us = ours(best_cfg, KRN_INT4_GEMM_ACC64);
                printf("    acc %-10s M=%-4d fixed-point words %8.2f us (C %.2f)%s\n", sh.name, m,
                       r.acc_us, t_ours, acc_taken ? "" : ", not taken: C written");
            }
            if (between && sh.k % 8 == 0) {
                /* x -> a by the row kernel, then the GEMM reads a */
                const int k8 = sh.k / 8;
                int early = 0;
                auto row = [&]() {
                    CK(krncuda::launch_pdl(row_kernel, dim3((unsigned)m), dim3(256), 0, g_stream,
                                           (const uint4 *)x_rows, (uint4 *)a, k8, early));
                };
                auto pair = [&](int i) {
                    row();
                    gemm(i, best_cfg, 0);
                };
                const double t_pair = time_graph(g_stream, launches, replays, pair);
                const double t_row = time_graph(g_stream, launches, replays, [&](int) { row(); });
                early = 1; /* the row kernel lets the GEMM launch before it waits */
                const double t_pair_e = time_graph(g_stream, launches, replays, pair);
                const double t_row_e = time_graph(g_stream, launches, replays, [&](int) { row(); });
                printf("    between %-10s M=%-4d GEMM behind a row kernel %8.2f us (pair %.2f, row "
                       "kernel alone %.2f; back to back %.2f); row kernel triggering first %8.2f "
                       "us (pair %.2f, alone %.2f)\n",
                       sh.name, m, t_pair - t_row, t_pair, t_row, t_ours, t_pair_e - t_row_e,
                       t_pair_e, t_row_e);
                r.between_us = t_pair - t_row;
                r.between_early_us = t_pair_e - t_row_e;
            }
            r.bytes = (double)lay.bytes - (double)(lay.n_pad - lay.n) * lay.k_pad / 2 +
                      2.0 * m * sh.k + 2.0 * m * sh.n;
            r.flops = 2.0 * m * (double)sh.n * sh.k;
            r.floor_us = std::max(r.bytes / (bw_gbs * 1e3), r.flops / (peak_tflops * 1e6));
            results.push_back(r);
            printf("%-10s %6d %6d %5d | %9.2f %9.2f %6.2fx | %7.0f %8.2f %5.0f%% | %7.2f %7.2f | "
                   "%8.2f %8.2f | %s\n",
                   sh.name, sh.k, sh.n, m, t_ours, t_cb, t_cb / t_ours, r.bytes / (t_ours * 1e3),
                   r.floor_us, 100.0 * r.floor_us / t_ours, r.read_us, r.read_pdl_us, r.striped_us,
                   r.noswap_us, best_cfg < 0 ? "auto" : krn_int4_gemm_config_name(best_cfg));
            fflush(stdout);
        }
        for (void *p : wq)
            CK(cudaFree(p));
        for (half *p : wf)
            CK(cudaFree(p));
        CK(cudaFree(a));
        CK(cudaFree(c));
        if (x_rows)
            CK(cudaFree(x_rows));
        for (int64_t *w : acc_w)
            if (w)
                CK(cudaFree(w));
        CK(cudaFree(ws));
    }

    /* ---- acceptance sums over the four Llama-2-7B shapes ---- */
    printf("\nLlama-2-7B sums (q/k/v + o + gate/up + down), same run:\n");
    printf("%5s | %9s %9s %8s %9s | %17s | %17s | %8s %8s | %8s %8s\n", "M", "ours_us", "cublas_us",
           "speedup", "floor_us", "dequant+cublas_us", "min shape speedup", "read_us", "rd_pdl",
           "striped", "noswap");
    struct sum {
        int m;
        double ours, cb, floor, min_ratio, dq, rd, rd_pdl, striped, noswap;
    };
    std::vector<sum> sums;
    for (int m : ms) {
        sum s = {m, 0, 0, 0, 1e30, 0, 0, 0, 0, 0};
        for (const result &r : results)
            if (r.llama2 && r.m == m) {
                s.ours += r.ours_us;
                s.cb += r.cublas_us;
                s.floor += r.floor_us;
                s.dq += r.dequant_us;
                s.rd += r.read_us;
                s.rd_pdl += r.read_pdl_us;
                s.striped += r.striped_us;
                s.noswap += r.noswap_us;
            }
        for (const result &r : results)
            if (r.m == m)
                s.min_ratio = std::min(s.min_ratio, r.cublas_us / r.ours_us);
        if (s.ours > 0) {
            sums.push_back(s);
            printf(
                "%5d | %9.2f %9.2f %7.2fx %9.2f | %17.2f | %16.2fx | %8.2f %8.2f | %8.2f %8.2f\n",
                m, s.ours, s.cb, s.cb / s.ours, s.floor, s.dq + s.cb, s.min_ratio, s.rd, s.rd_pdl,
                s.striped, s.noswap);
        }
    }

    /* one field of the results summed over the four Llama-2 shapes at m */
    auto llama2_sum = [&](int m, double result::*field) {
        double t = 0;
        for (const result &r : results)
            if (r.llama2 && r.m == m)
                t += r.*field;
        return t;
    };
    if (between) {
        printf("\nLlama-2-7B sums, each GEMM behind a row kernel (--between), same run:\n");
        printf("%5s | %9s %14s %14s\n", "M", "ours_us", "behind_row_us", "row_first_us");
        for (int m : ms)
            if (llama2_sum(m, &result::ours_us) > 0)
                printf("%5d | %9.2f %14.2f %14.2f\n", m, llama2_sum(m, &result::ours_us),
                       llama2_sum(m, &result::between_us),
                       llama2_sum(m, &result::between_early_us));
    }
    if (acc) {
        printf("\nLlama-2-7B sums with fixed-point words (--acc), same run:\n");
        printf("%5s | %9s %9s %9s\n", "M", "ours_us", "acc_us", "cublas_us");
        for (int m : ms)
            if (llama2_sum(m, &result::acc_us) > 0)
                printf("%5d | %9.2f %9.2f %9.2f\n", m, llama2_sum(m, &result::ours_us),
                       llama2_sum(m, &result::acc_us), llama2_sum(m, &result::cublas_us));
    }

    if (json_path) {
        FILE *f = fopen(json_path, "w");
        if (!f) {
            perror(json_path);
            return 1;
        }
        fprintf(f,
                "{\n  \"device\": \"%s\",\n  \"sms\": %d,\n  \"l2_bytes\": %d,\n  \"group\": %d,\n"
                "  \"symmetric\": %s,\n  \"cublas\": \"cublasGemmEx fp16 in/out, "
                "CUBLAS_COMPUTE_32F\",\n  \"bandwidth_GBps\": %.1f,\n  \"peak_TFLOPs\": %.1f,\n"
                "  \"results\": [\n",
                prop.name, prop.multiProcessorCount, prop.l2CacheSize, group,
                sym ? "true" : "false", bw_gbs, peak_tflops);
        for (size_t i = 0; i < results.size(); i++) {
            const result &r = results[i];
            fprintf(f,
                    "    {\"shape\": \"%s\", \"k\": %d, \"n\": %d, \"m\": %d, \"config\": \"%s\", "
                    "\"ours_us\": %.3f, \"cublas_us\": %.3f, \"speedup\": %.3f, \"GBps\": %.1f, "
                    "\"floor_us\": %.3f, \"pct_floor\": %.1f, \"dequant_us\": %.3f, "
                    "\"read_us\": %.3f, \"read_pdl_us\": %.3f, \"striped_us\": %.3f, "
                    "\"noswap_us\": %.3f, \"acc_us\": %.3f}%s\n",
                    r.name, r.k, r.n, r.m,
                    r.config < 0 ? "auto" : krn_int4_gemm_config_name(r.config), r.ours_us,
                    r.cublas_us, r.cublas_us / r.ours_us, r.bytes / (r.ours_us * 1e3), r.floor_us,
                    100.0 * r.floor_us / r.ours_us, r.dequant_us, r.read_us, r.read_pdl_us,
                    r.striped_us, r.noswap_us, r.acc_us, i + 1 < results.size() ? "," : "");
        }
        fprintf(f, "  ],\n  \"llama2_sums\": [\n");
        for (size_t i = 0; i < sums.size(); i++)
            fprintf(f,
                    "    {\"m\": %d, \"ours_us\": %.3f, \"cublas_us\": %.3f, \"speedup\": %.3f, "
                    "\"floor_us\": %.3f, \"min_shape_speedup\": %.3f, "
                    "\"dequant_plus_cublas_us\": %.3f, \"read_us\": %.3f, \"read_pdl_us\": %.3f, "
                    "\"striped_us\": %.3f, \"noswap_us\": %.3f}%s\n",
                    sums[i].m, sums[i].ours, sums[i].cb, sums[i].cb / sums[i].ours, sums[i].floor,
                    sums[i].min_ratio, sums[i].dq + sums[i].cb, sums[i].rd, sums[i].rd_pdl,
                    sums[i].striped, sums[i].noswap, i + 1 < sums.size() ? "," : "");
        fprintf(f, "  ]\n}\n");
        fclose(f);
        printf("wrote %s\n", json_path);
    }
    CB(cublasDestroy(cb));
    CK(cudaFree(cb_ws));
    return 0;
}
