/*
 * int4_gemm_sm75.cu — the Turing fallback of the INT4 GEMM (int4_gemm_sm80.cu
 * has the contract). Same repacked weights, same dequantization (bit-exact), but
 * only what sm_75 has: mma.sync m16n8k8 (a k16 fragment is two of them), no
 * cp.async, no L2 hints. Simple and correct rather than fast.
 * Mapping  grid = (n_pad / 64, ceil(m / 16)), block = 8 warps; each warp
 *          takes every 8th k16 step of the 16 x 64 output tile; the eight
 *          partial tiles are summed in shared memory in warp order and warp 0
 *          writes C. Weights: one coalesced 16-byte load per lane per k step;
 *          activations: bounds-checked element loads straight from global.
 * Arch     sm_75+ (chosen for compute capability 7.5, or forced by
 *          KRN_INT4_GEMM_FORCE_SM75 for testing on newer GPUs).
 */
#include "kernels/cuda/int4_gemm_impl.cuh"

namespace int4gemm
{
namespace
{

constexpr int kWarps = 8;

__device__ __forceinline__ void mma_1688(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t b0)
{
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(b0));
}

/* Two consecutive activations (row, k), (row, k+1) as an fp16 pair; zero
 * outside the matrix. */
__device__ __forceinline__ uint32_t load_a2(const Params &p, int row, int k)
{
    half lo = __float2half(0.0f), hi = __float2half(0.0f);
    if (row < p.m) {
        const half *src = p.a + (int64_t)row * p.k;
        if (k < p.k)
            lo = src[k];
        if (k + 1 < p.k)
            hi = src[k + 1];
    }
    return as_u32(__halves2half2(lo, hi));
}

template <bool ZP, bool GLU>
__global__ void __launch_bounds__(kWarps * 32)
    int4_gemm_sm75_kernel(const Params p) /* by value: sizes, pointers */
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 750
    __shared__ float4 red[kWarps - 1][8][32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int n64 = blockIdx.x; /* 64-column tile */
    const int row0 = blockIdx.y * 16;
    const int g8 = lane >> 2, c2 = (lane & 3) * 2;
    const int ksteps = p.k_pad / 16;

    float acc[8][4];
#pragma unroll
    for (int f = 0; f < 8; f++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            acc[f][e] = 0.0f;

    int cur_group = -1;
    GroupConsts g;
    for (int ks = warp; ks < ksteps; ks += kWarps) {
        const int group = ks / p.gsteps;
        if (group != cur_group) {
            const int64_t off = ((int64_t)n64 * p.groups + group) * 8 + (lane >> 2);
            const uint4 sv = p.scales[off];
            const uint4 zv = ZP ? p.zeros[off] : make_uint4(0, 0, 0, 0);
            group_consts<ZP>(sv, zv, g);
            cur_group = group;
        }
        const uint4 qv = p.q[((int64_t)n64 * ksteps + ks) * 32 + lane];
        uint32_t bf[8][2];
        dequant_word(qv, g, bf);
        const int k0 = ks * 16 + c2;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const uint32_t a0 = load_a2(p, row0 + g8, k0 + 8 * h);
            const uint32_t a1 = load_a2(p, row0 + g8 + 8, k0 + 8 * h);
#pragma unroll
            for (int f = 0; f < 8; f++)
                mma_1688(acc[f], a0, a1, bf[f][h]);
        }
    }

    if (warp > 0)
#pragma unroll
        for (int f = 0; f < 8; f++)
            red[warp - 1][f][lane] = make_float4(acc[f][0], acc[f][1], acc[f][2], acc[f][3]);
    __syncthreads();
    if (warp == 0) {
        for (int w = 1; w < kWarps; w++)
#pragma unroll
            for (int f = 0; f < 8; f++) {
                const float4 v = red[w - 1][f][lane];
                acc[f][0] += v.x;
                acc[f][1] += v.y;
                acc[f][2] += v.z;
                acc[f][3] += v.w;
            }
        if constexpr (GLU) {
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int row = row0 + g8 + 8 * h;
                if (row < p.m)
                    store_frags_glu<8>(p, row, n64 * 64 + c2, acc, h);
            }
        } else {
#pragma unroll
            for (int f = 0; f < 8; f++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int row = row0 + g8 + 8 * h;
                    if (row < p.m)
                        store_pair(p, row, n64 * 64 + f * 8 + c2, acc[f][2 * h],
                                   acc[f][2 * h + 1]);
                }
        }
    }
#else
    __trap();
#endif
}

} // namespace

cudaError_t launch_sm75(const Params &p, bool glu, cudaStream_t stream)
{
    const dim3 grid((unsigned)p.n_tiles, (unsigned)p.m_tiles);
    void (*const k[2][2])(const Params) = {
        {int4_gemm_sm75_kernel<false, false>, int4_gemm_sm75_kernel<false, true>},
        {int4_gemm_sm75_kernel<true, false>, int4_gemm_sm75_kernel<true, true>}};
    k[p.zeros ? 1 : 0][glu ? 1 : 0]<<<grid, kWarps * 32, 0, stream>>>(p);
    return cudaGetLastError();
}

} // namespace int4gemm
