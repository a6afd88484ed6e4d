/* bench_handoff — what handing data from one kernel to the next costs in a
 * decode step's graph, and what the usual ways of avoiding a small kernel
 * between two GEMMs would save.
 *
 *   bench_handoff [--pairs N] [--replays R]
 *
 * Two stand-ins, in graphs of N pairs (default 64), median of R replays
 * (default 21):
 *   G  a GEMM-like launch: 264 blocks of 256 threads, each loads 32 KB of
 *      "weights" (16-byte non-coherent loads, issued before its wait; 16
 *      copies rotated, more than the L2), then reads the 8 KB fp16 row the
 *      kernel before wrote and adds one float a thread into a 4096-float
 *      row with an atomic (the fixed-point sums' traffic);
 *   R  a row kernel: one block of 256 threads reads the 4096-float row,
 *      takes its sum of squares, writes the 8 KB fp16 row and zeroes the
 *      floats (an RMSNorm reading GEMM sums).
 * Hand-offs:
 *   pdl       every kernel launched with programmatic dependent launch,
 *             letting the next begin at once and waiting with
 *             griddepcontrol.wait (as the backend's kernels do);
 *   flag      the same launches, but each kernel waits by spinning on a
 *             counter the kernel before raises when its blocks are done
 *             (release / acquire), never on griddepcontrol.wait;
 *   plain     launches without the attribute;
 *   G+R fused the row kernel's work done by the GEMM's last block to
 *             arrive (a counter), one launch a pair;
 *   prologue  no row kernel: every block of the next GEMM reads the sums
 *             (8-byte words, as the fixed-point sums) and the residual,
 *             takes the sum of squares itself and uses the normalized row;
 *             block 0 writes the residual, block 1 zeroes the words of the
 *             launch before (three word buffers in turn).
 * Prints µs per graph and per kernel (or per pair). Timing only: the
 * values computed are not checked. Needs a GPU of compute capability 9.0
 * or newer (griddepcontrol). */
#include "bench/common/graph_timer.cuh"
#include "kernels/cuda/launch.cuh"

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

namespace
{

constexpr int kThreads = 256, kBlocks = 264, kRot = 16, kRow = 4096;
constexpr int kMaxPairs = 1000;
constexpr size_t kFlagBytes = (2 * kMaxPairs + 1) * sizeof(int); /* a counter a kernel */
constexpr size_t kBlockWords = kThreads * 8; /* 16-byte words a block: 32 KB */

enum Mode { kPdl = 0, kFlag = 1, kPlain = 2 };

__device__ __forceinline__ int load_acquire(const int *p)
{
    int v;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

/* Wait for the kernel before: griddepcontrol.wait, or its counter. */
template <int MODE> __device__ __forceinline__ void wait_before(const int *flag, int target)
{
    if (MODE == kFlag) {
        if (threadIdx.x == 0)
            while (load_acquire(flag) < target) {
            }
        __syncthreads();
    } else {
        krncuda::pdl_wait();
    }
}

template <int MODE> __device__ __forceinline__ void arrive(int *flag)
{
    if (MODE != kFlag)
        return;
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        atomicAdd(flag, 1);
    }
}

/* The weight words of this block, before the wait. */
__device__ __forceinline__ void load_weights(const uint4 *w, uint4 (&r)[8])
{
    const uint4 *p = w + (size_t)blockIdx.x * kBlockWords + threadIdx.x;
#pragma unroll
    for (int i = 0; i < 8; i++)
        r[i] = krncuda::ld_stream(p + i * kThreads);
}

__device__ __forceinline__ float fold(const uint4 (&r)[8])
{
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < 8; i++)
        s += (float)(r[i].x & 0xff) * 1e-6f + (float)(r[i].w & 0xff) * 1e-6f;
    return s;
}

/* Sum of squares of 16 values a thread over the block (256 threads). */
__device__ float block_sumsq(const float (&v)[16])
{
    __shared__ float red[kThreads / 32];
    float ss = 0.f;
#pragma unroll
    for (int i = 0; i < 16; i++)
        ss += v[i] * v[i];
    for (int o = 16; o; o >>= 1)
        ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if ((threadIdx.x & 31) == 0)
        red[threadIdx.x >> 5] = ss;
    __syncthreads();
    float t = 0.f;
    for (int i = 0; i < kThreads / 32; i++)
        t += red[i];
    return t;
}

/* The row kernel's work: read the sums, normalize, write, zero the sums. */
__device__ void row_work(float *acc, __half *out)
{
    float v[16];
#pragma unroll
    for (int i = 0; i < 16; i++)
        v[i] = __ldcg(acc + threadIdx.x + i * kThreads);
    const float inv = rsqrtf(block_sumsq(v) / kRow + 1e-5f);
#pragma unroll
    for (int i = 0; i < 16; i++) {
        out[threadIdx.x + i * kThreads] = __float2half(v[i] * inv);
        acc[threadIdx.x + i * kThreads] = 0.f;
    }
}

template <int MODE>
__global__ void __launch_bounds__(kThreads)
    gemm_like(const uint4 *w, const __half *a, float *acc, int *flags, int me, int target)
{
    krncuda::pdl_trigger();
    uint4 r[8];
    load_weights(w, r);
    wait_before<MODE>(flags + me - 1, target);
    float s = fold(r);
    for (int i = threadIdx.x; i < kRow; i += kThreads)
        s += __half2float(a[i]);
    atomicAdd(acc + ((blockIdx.x * kThreads + threadIdx.x) & (kRow - 1)), s * 1e-3f);
    arrive<MODE>(flags + me);
}

template <int MODE>
__global__ void __launch_bounds__(kThreads)
    row_like(float *acc, __half *out, int *flags, int me, int target)
{
    krncuda::pdl_trigger();
    wait_before<MODE>(flags + me - 1, target);
    row_work(acc, out);
    arrive<MODE>(flags + me);
}

/* G with R's work in its last block to arrive. */
__global__ void __launch_bounds__(kThreads)
    gemm_fused(const uint4 *w, const __half *a, float *acc, __half *out, int *counter)
{
    krncuda::pdl_trigger();
    uint4 r[8];
    load_weights(w, r);
    krncuda::pdl_wait();
    float s = fold(r);
    for (int i = threadIdx.x; i < kRow; i += kThreads)
        s += __half2float(a[i]);
    atomicAdd(acc + ((blockIdx.x * kThreads + threadIdx.x) & (kRow - 1)), s * 1e-3f);
    __shared__ int last;
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        last = atomicAdd(counter, 1) == (int)gridDim.x - 1;
    }
    __syncthreads();
    if (!last)
        return;
    __threadfence();
    row_work(acc, out);
    if (threadIdx.x == 0)
        *counter = 0;
}

/* G that normalizes the sums of the launch before itself (launch i reads
 * buffer i % 3, adds into (i + 1) % 3, zeroes (i + 2) % 3). */
__global__ void __launch_bounds__(kThreads)
    gemm_prologue(const uint4 *w, double *words, __half *resid, int i)
{
    krncuda::pdl_trigger();
    uint4 r[8];
    load_weights(w, r);
    krncuda::pdl_wait();
    const double *in = words + (size_t)(i % 3) * kRow;
    double *out = words + (size_t)((i + 1) % 3) * kRow, *clr = words + (size_t)((i + 2) % 3) * kRow;
    float v[16];
#pragma unroll
    for (int j = 0; j < 16; j++)
        v[j] = (float)__ldcg(in + threadIdx.x + j * kThreads) +
               __half2float(resid[threadIdx.x + j * kThreads]);
    const float inv = rsqrtf(block_sumsq(v) / kRow + 1e-5f);
    float s = fold(r);
#pragma unroll
    for (int j = 0; j < 16; j++)
        s += v[j] * inv;
    if (blockIdx.x == 0)
#pragma unroll
        for (int j = 0; j < 16; j++)
            resid[threadIdx.x + j * kThreads] = __float2half(v[j]);
    if (blockIdx.x == 1)
#pragma unroll
        for (int j = 0; j < 16; j++)
            clr[threadIdx.x + j * kThreads] = 0.0;
    atomicAdd(out + ((blockIdx.x * kThreads + threadIdx.x) & (kRow - 1)), (double)s * 1e-9);
}

/* pdl: with programmatic dependent launch (krncuda::launch_pdl, as the
 * backend's kernels), else a plain launch. */
template <typename... KArgs, typename... Args>
void launch(void (*k)(KArgs...), int grid, bool pdl, cudaStream_t s, Args... args)
{
    if (pdl)
        CK(krncuda::launch_pdl(k, dim3(grid), dim3(kThreads), 0, s, args...));
    else
        k<<<grid, kThreads, 0, s>>>(static_cast<KArgs>(args)...);
    CK(cudaGetLastError());
}

struct Bufs {
    uint4 *w;
    float *acc;
    __half *a, *a2, *resid;
    double *words;
    int *flags;
};

const uint4 *weights(const Bufs &b, int i)
{
    return b.w + (size_t)(i % kRot) * kBlocks * kBlockWords;
}

/* What a graph holds. */
enum Shape { kGR, kG, kR, kFused, kPrologue };

void record(const Bufs &b, Shape shape, Mode mode, int pairs, cudaStream_t s)
{
    CK(cudaMemsetAsync(b.flags, 0, kFlagBytes, s));
    const bool pdl = mode != kPlain;
    int k = 1, prev_blocks = 0; /* kernel k waits for flags[k - 1] */
    for (int i = 0; i < pairs; i++) {
        if (shape == kFused) {
            launch(gemm_fused, kBlocks, true, s, weights(b, i), b.a, b.acc, b.a2, b.flags);
            continue;
        }
        if (shape == kPrologue) {
            launch(gemm_prologue, kBlocks, true, s, weights(b, 2 * i), b.words, b.resid, 2 * i);
            launch(gemm_prologue, kBlocks, true, s, weights(b, 2 * i + 1), b.words, b.resid,
                   2 * i + 1);
            continue;
        }
        if (shape != kR) {
            if (mode == kFlag)
                launch(gemm_like<kFlag>, kBlocks, pdl, s, weights(b, i), b.a, b.acc, b.flags, k,
                       prev_blocks);
            else
                launch(gemm_like<kPdl>, kBlocks, pdl, s, weights(b, i), b.a, b.acc, b.flags, k,
                       prev_blocks);
            k++;
            prev_blocks = kBlocks;
        }
        if (shape != kG) {
            if (mode == kFlag)
                launch(row_like<kFlag>, 1, pdl, s, b.acc, b.a, b.flags, k, prev_blocks);
            else
                launch(row_like<kPdl>, 1, pdl, s, b.acc, b.a, b.flags, k, prev_blocks);
            k++;
            prev_blocks = 1;
        }
    }
}

/* Median µs of one replay of the graph of `shape`. */
double graph_us(const Bufs &b, Shape shape, Mode mode, int pairs, int replays, cudaStream_t s)
{
    return time_graph(s, 1, replays, [&](int) { record(b, shape, mode, pairs, s); });
}

} // namespace

int main(int argc, char **argv)
{
    int pairs = 64, replays = 21;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--pairs") && i + 1 < argc)
            pairs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--replays") && i + 1 < argc)
            replays = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_handoff [--pairs N (1..%d)] [--replays R]\n", kMaxPairs);
            return 2;
        }
    }
    if (pairs < 1 || pairs > kMaxPairs || replays < 1) {
        fprintf(stderr, "bench_handoff: --pairs 1..%d, --replays >= 1\n", kMaxPairs);
        return 2;
    }
    int dev = 0, major = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    if (major < 9) {
        printf("SKIPPED: needs compute capability 9.0 or newer\n");
        return 0;
    }
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, dev));
    Bufs b;
    const size_t wbytes = (size_t)kRot * kBlocks * kBlockWords * 16;
    CK(cudaMalloc(&b.w, wbytes));
    CK(cudaMemset(b.w, 1, wbytes));
    CK(cudaMalloc(&b.acc, kRow * 4));
    CK(cudaMalloc(&b.a, kRow * 2));
    CK(cudaMalloc(&b.a2, kRow * 2));
    CK(cudaMalloc(&b.resid, kRow * 2));
    CK(cudaMalloc(&b.words, 3 * kRow * 8));
    CK(cudaMalloc(&b.flags, kFlagBytes));
    CK(cudaMemset(b.acc, 0, kRow * 4));
    CK(cudaMemset(b.a, 0, kRow * 2));
    CK(cudaMemset(b.a2, 0, kRow * 2));
    CK(cudaMemset(b.resid, 0, kRow * 2));
    CK(cudaMemset(b.words, 0, 3 * kRow * 8));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    printf("%s, %d SMs; %d pairs a graph, median of %d replays\n", prop.name,
           prop.multiProcessorCount, pairs, replays);
    printf("| graph | hand-off | kernels | µs a graph | µs a kernel | µs a pair (G + R) |\n");
    printf("| --- | --- | ---: | ---: | ---: | ---: |\n");
    static const char *mode_names[] = {"pdl", "flag", "plain"};
    static const char *shape_names[] = {"G, R, G, R ...", "G, G ...", "R, R ..."};
    for (int shape = kGR; shape <= kR; shape++)
        for (int mode = kPdl; mode <= kPlain; mode++) {
            const double us = graph_us(b, (Shape)shape, (Mode)mode, pairs, replays, s);
            const int n = shape == kGR ? 2 * pairs : pairs;
            char pair[32] = "-";
            if (shape == kGR)
                snprintf(pair, sizeof pair, "%.3f", us / pairs);
            printf("| %s | %s | %d | %.2f | %.3f | %s |\n", shape_names[shape], mode_names[mode], n,
                   us, us / n, pair);
        }
    const double fused = graph_us(b, kFused, kPdl, pairs, replays, s);
    printf("| G with R in its last block | pdl | %d | %.2f | %.3f | %.3f |\n", pairs, fused,
           fused / pairs, fused / pairs);
    const double pro = graph_us(b, kPrologue, kPdl, pairs, replays, s);
    printf("| G normalizing in its prologue | pdl | %d | %.2f | %.3f | %.3f |\n", 2 * pairs, pro,
           pro / (2 * pairs), pro / (2 * pairs));
    return 0;
}
