/*
 * rope.cu — rotary position embedding in place (kernels/rope_cuda.h).
 * Mapping  one block of 128 threads per row: the first head_dim/2 threads
 *          (strided) compute the row's cos/sin once into shared memory, then
 *          all threads rotate the (head, i) pairs of the row.
 * Numerics fp32 angle and rotation exactly as the CPU reference; sinf/cosf
 *          are the precise versions (no fast-math), so large positions keep
 *          their full range reduction.
 * Arch     any.
 */
#include "kernels/cuda/launch.cuh"
#include "kernels/rope_cuda.h"

namespace {

constexpr int kThreads = 128;

__global__ void __launch_bounds__(kThreads)
    rope_kernel(__half *x,              /* [m] rows of stride ldx, n_heads * head_dim used */
                int64_t ldx, int32_t n_heads, int32_t head_dim,
                const int32_t *pos,     /* [m] positions */
                const float *inv_freq)  /* [head_dim / 2] */
{
    __shared__ float cs[256], sn[256];
    const int64_t r = blockIdx.x;
    const int32_t half = head_dim / 2;
    const float p = (float)pos[r];
    for (int32_t i = threadIdx.x; i < half; i += kThreads) {
        float a = p * inv_freq[i];
        cs[i] = cosf(a);
        sn[i] = sinf(a);
    }
    __syncthreads();
    __half *xr = x + r * ldx;
    const int32_t n = n_heads * half;
    for (int32_t j = threadIdx.x; j < n; j += kThreads) {
        int32_t h = j / half, i = j % half;
        __half *hp = xr + (int64_t)h * head_dim;
        float a = __half2float(hp[i]), b = __half2float(hp[i + half]);
        hp[i] = __float2half_rn(a * cs[i] - b * sn[i]);
        hp[i + half] = __float2half_rn(b * cs[i] + a * sn[i]);
    }
}

} // namespace

extern "C" inf_status_t krn_cuda_rope(uint16_t *x, int64_t ldx, int32_t n_heads, int32_t head_dim,
                                      const int32_t *pos, const float *inv_freq, int32_t m,
                                      void *stream, struct inf_err *err)
{
    if (m < 0 || n_heads <= 0 || head_dim <= 0 || (head_dim & 1) || head_dim > 512)
        return inf_err_set(err, INF_E_INVALID, "rope: m=%d heads=%d head_dim=%d", m, n_heads,
                           head_dim);
    if (m == 0)
        return INF_OK;
    rope_kernel<<<(unsigned)m, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        reinterpret_cast<__half *>(x), ldx, n_heads, head_dim, pos, inv_freq);
    return krncuda::launched("rope", err);
}
