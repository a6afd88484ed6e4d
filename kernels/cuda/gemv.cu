/*
 * gemv.cu — y[n] = x[k] · W[n][k]ᵀ, one row of fp16 activations against
 *          fp16 weights (kernels/gemv_cuda.h).
 * Mapping  one block of 256 threads per R consecutive weight rows (outputs);
 *          its 8 warps split k: thread t takes the 16-byte chunks t, t + 256,
 *          ... of each of the R rows, so a warp's loads are 512 contiguous
 *          bytes of a row. A thread issues the loads of B chunk columns at
 *          once (R x B 16-byte weight loads, the activations' chunks from
 *          L1), then their products: with k = 4096 a thread's whole share
 *          (2 chunk columns) is one batch. The first batch is requested
 *          before the programmatic-dependent-launch wait: the weights do not
 *          depend on the kernel before, so a block resident during that
 *          kernel's tail streams meanwhile.
 * Reduce   fp32 products summed per thread in chunk order, then across the
 *          warp (xor shuffles) and across the 8 warps in warp order through
 *          shared memory: a fixed order, so results are deterministic.
 * Why      cuBLAS's fp16 GEMM of one row reads a 32000 x 4096 lm_head at
 *          about 3.97 TB/s (66 us on the H200). H200, 05:58-06:00 UTC, the
 *          32-layer Llama-2-7B decode step's replay with this kernel
 *          against cuBLAS (INT4SERVE_CUDA_GEMV=0): INT4 model (its lm_head)
 *          1.793 / 1.792 against 1.802 / 1.801 ms; fp16 model (every
 *          linear) 3.494 against 4.132 ms. The kernel is templated on the
 *          rows (M) but only M = 1 is used: at 2 and 4 rows it lost to
 *          cuBLAS on the INT4 model's lm_head (2.073 against 2.062 ms, 2.266
 *          against 2.234) and at 4 rows on the fp16 model (5.279 against
 *          4.575 ms).
 * Arch     any (plain loads, fp32 FMA).
 */
#include "kernels/cuda/launch.cuh"
#include "kernels/gemv_cuda.h"

#include <cuda_fp16.h>

namespace
{

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
/* Rows a block and chunk columns a batch: 4 x 2 was the fastest of 4 x 2,
 * 8 x 1, 2 x 4 and 8 x 2 for the Llama-2 lm_head (INT4 model) and every
 * linear of the fp16 model at batch 1 (H200, 05:52-05:54 UTC). */
constexpr int kRows = 4, kBatch = 2;

/* the eight fp16 values of a chunk as fp32 */
__device__ __forceinline__ void to_f32(uint4 a, float (&f)[8])
{
    const __half2 *h = reinterpret_cast<const __half2 *>(&a);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float2 v = __half22float2(h[i]);
        f[2 * i] = v.x;
        f[2 * i + 1] = v.y;
    }
}

/* R weight rows (outputs) a block, B chunk columns a thread requested at
 * once, M activation rows */
template <int M, int R, int B, bool F32>
__global__ void __launch_bounds__(kThreads)
    gemv_kernel(const uint4 *__restrict__ w, /* [n][kc] chunks of 8 fp16 */
                int32_t n, int32_t kc,       /* chunks a row: k / 8 */
                const uint4 *__restrict__ x, /* [M] rows of ldxc chunks */
                int64_t ldxc, void *__restrict__ y, int64_t ldy)
{
    __shared__ float red[kWarps][M * R];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int row0 = blockIdx.x * R;
    /* rows past n read row n - 1 (never stored): no predicate in the loop */
    const uint4 *wr[R];
#pragma unroll
    for (int r = 0; r < R; r++)
        wr[r] = w + (int64_t)min(row0 + r, n - 1) * kc;
    float acc[M][R];
#pragma unroll
    for (int m = 0; m < M; m++)
#pragma unroll
        for (int r = 0; r < R; r++)
            acc[m][r] = 0.0f;
    uint4 wv[B][R];
    auto load = [&](int c0) {
#pragma unroll
        for (int b = 0; b < B; b++) {
            const int c = c0 + b * kThreads;
#pragma unroll
            for (int r = 0; r < R; r++)
                wv[b][r] = c < kc ? krncuda::ld_stream(wr[r] + c) : make_uint4(0, 0, 0, 0);
        }
    };
    load(tid);
    krncuda::pdl_wait(); /* x is the kernel before's output */
    krncuda::pdl_trigger();
    for (int c0 = tid;;) {
#pragma unroll
        for (int b = 0; b < B; b++) {
            const int c = c0 + b * kThreads;
            if (c < kc) {
                float wf[R][8];
#pragma unroll
                for (int r = 0; r < R; r++)
                    to_f32(wv[b][r], wf[r]);
#pragma unroll
                for (int m = 0; m < M; m++) {
                    float xf[8];
                    to_f32(__ldg(x + m * ldxc + c), xf);
#pragma unroll
                    for (int r = 0; r < R; r++)
#pragma unroll
                        for (int e = 0; e < 8; e++)
                            acc[m][r] = fmaf(wf[r][e], xf[e], acc[m][r]);
                }
            }
        }
        c0 += B * kThreads;
        if (c0 >= kc)
            break;
        load(c0);
    }
#pragma unroll
    for (int m = 0; m < M; m++)
#pragma unroll
        for (int r = 0; r < R; r++) {
            float v = acc[m][r];
#pragma unroll
            for (int o = 16; o > 0; o >>= 1)
                v += __shfl_xor_sync(0xffffffffu, v, o);
            if (lane == 0)
                red[warp][m * R + r] = v;
        }
    __syncthreads();
    if (tid < M * R) {
        const int m = tid / R, r = tid % R;
        if (row0 + r < n) {
            float s = 0.0f;
#pragma unroll
            for (int i = 0; i < kWarps; i++)
                s += red[i][tid];
            if (F32)
                static_cast<float *>(y)[m * ldy + row0 + r] = s;
            else
                static_cast<__half *>(y)[m * ldy + row0 + r] = __float2half_rn(s);
        }
    }
}

template <int M, int R, int B, bool F32>
cudaError_t launch(const uint16_t *w, int32_t n, int32_t k, const uint16_t *x, int64_t ldx, void *y,
                   int64_t ldy, cudaStream_t st)
{
    return krncuda::launch_pdl(gemv_kernel<M, R, B, F32>, dim3((unsigned)((n + R - 1) / R)),
                               dim3(kThreads), 0, st, reinterpret_cast<const uint4 *>(w), n, k / 8,
                               reinterpret_cast<const uint4 *>(x), ldx / 8, y, ldy);
}

} // namespace

extern "C" inf_status_t krn_cuda_gemv_f16(const uint16_t *w, int32_t n, int32_t k,
                                          const uint16_t *x, int64_t ldx, void *y, bool y_f32,
                                          int64_t ldy, int32_t m, void *stream, struct inf_err *err)
{
    if (n <= 0 || k <= 0 || m <= 0 || ldx < k || ldy < n)
        return inf_err_set(err, INF_E_INVALID, "gemv: m=%d n=%d k=%d ldx=%lld ldy=%lld", m, n, k,
                           (long long)ldx, (long long)ldy);
    if (m > KRN_GEMV_MAX_M || k % 8 || ldx % 8 || (uintptr_t)w % 16 || (uintptr_t)x % 16)
        return inf_err_set(err, INF_E_UNSUPPORTED,
                           "gemv: %d rows, k=%d, ldx=%lld (at most %d rows, 16-byte rows)", m, k,
                           (long long)ldx, KRN_GEMV_MAX_M);
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    const cudaError_t e = y_f32 ? launch<1, kRows, kBatch, true>(w, n, k, x, ldx, y, ldy, st)
                                : launch<1, kRows, kBatch, false>(w, n, k, x, ldx, y, ldy, st);
    if (e != cudaSuccess)
        return inf_err_set(err, INF_E_DEVICE, "gemv: %s", cudaGetErrorString(e));
    return krncuda::launched("gemv", err);
}
