/*
 * norm.cu — RMSNorm with the fused residual add (kernels/norm_cuda.h).
 * Mapping  one block of 256 threads per row; threads stride over the row.
 *          Pass 1 adds delta, stores the fp16 residual and accumulates the
 *          sum of squares of the stored values; a warp-shuffle then shared
 *          reduction gives the row's scale; pass 2 re-reads the row (now in
 *          L1/L2) and writes the normalized output.
 * Numerics fp32 accumulation; the CPU reference accumulates in double, both
 *          agree to fp16 output rounding.
 * Arch     any.
 */
#include "kernels/cuda/launch.cuh"
#include "kernels/norm_cuda.h"

namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads)
    rmsnorm_add_kernel(__half *x,            /* [m] rows of stride ldx, updated in place */
                       int64_t ldx,
                       const __half *delta,  /* [m] rows of stride ldd, or NULL */
                       int64_t ldd,
                       const float *w,       /* [dim] norm weight */
                       float eps,
                       __half *out,          /* [m] rows of stride ldo */
                       int64_t ldo, int32_t dim)
{
    __shared__ float part[kThreads / 32];
    const int64_t r = blockIdx.x;
    __half *xr = x + r * ldx;
    float ss = 0.0f;
    for (int32_t i = threadIdx.x; i < dim; i += kThreads) {
        __half h = xr[i];
        if (delta) {
            h = __float2half_rn(__half2float(h) + __half2float(delta[r * ldd + i]));
            xr[i] = h;
        }
        float v = __half2float(h);
        ss += v * v;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if ((threadIdx.x & 31) == 0)
        part[threadIdx.x >> 5] = ss;
    __syncthreads();
    float tot = 0.0f;
#pragma unroll
    for (int i = 0; i < kThreads / 32; i++)
        tot += part[i];
    const float inv = 1.0f / sqrtf(tot / (float)dim + eps);
    __half *orow = out + r * ldo;
    for (int32_t i = threadIdx.x; i < dim; i += kThreads)
        orow[i] = __float2half_rn(__half2float(xr[i]) * inv * w[i]);
}

} // namespace

extern "C" inf_status_t krn_cuda_rmsnorm_add(uint16_t *x, int64_t ldx, const uint16_t *delta,
                                             int64_t ldd, const float *w, float eps,
                                             uint16_t *out, int64_t ldo, int32_t dim, int32_t m,
                                             void *stream, struct inf_err *err)
{
    if (m < 0 || dim <= 0)
        return inf_err_set(err, INF_E_INVALID, "rmsnorm: m=%d dim=%d", m, dim);
    if (m == 0)
        return INF_OK;
    if (m > 0x7fffffff / 2)
        return inf_err_set(err, INF_E_UNSUPPORTED, "rmsnorm: m=%d too large", m);
    rmsnorm_add_kernel<<<(unsigned)m, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        reinterpret_cast<__half *>(x), ldx, reinterpret_cast<const __half *>(delta), ldd, w, eps,
        reinterpret_cast<__half *>(out), ldo, dim);
    return krncuda::launched("rmsnorm", err);
}
