/*
 * rope.cu — rotary position embedding in place (kernels/rope_cuda.h), and
 * the same rotation fused with the write of the rotated K and of V into the
 * paged KV pools.
 * Mapping  one block per row. The first head_dim/2 threads (strided) compute
 *          the row's cos/sin once into shared memory. Rows of 16-byte aligned
 *          fp16 with head_dim/2 a multiple of 8 (every Llama shape): each
 *          thread rotates 8 consecutive pairs of one head with 16-byte loads
 *          and stores (up to 1024 threads; a batch-1 Llama-2-7B q+k row is
 *          512 of them); other rows: 128 threads, one pair at a time.
 *          Launched with programmatic dependent launch (sm_90).
 * Numerics fp32 angle and rotation exactly as the CPU reference; sinf/cosf
 *          are the precise versions (no fast-math), so large positions keep
 *          their full range reduction. fp16 pools receive the same fp16
 *          values as the rotated row; E4M3 pools their codes of value /
 *          scale (kernels/cuda/fp8.cuh).
 * Arch     any.
 */
#include "kernels/cuda/fp8.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/rope.cuh"
#include "kernels/rope_cuda.h"

namespace {

constexpr int kThreads = 128;
constexpr int kMaxThreads = 1024;

/* The row's cos/sin into shared memory. Both kernels compute them between
 * the two halves of krncuda::pdl_enter, before the wait: the positions, the
 * pool rows and inv_freq are uploaded before the step and no kernel of it
 * writes them, so only the rows of x (and v) wait for the kernel before. */
__device__ __forceinline__ void row_angles(float p, const float *inv_freq, int32_t half, float *cs,
                                           float *sn)
{
    krnrope::angles(p, inv_freq, half, cs, sn);
    __syncthreads();
}

__global__ void __launch_bounds__(kThreads)
    rope_kernel(__half *x,              /* [m] rows of stride ldx, n_heads * head_dim used */
                int64_t ldx, int32_t n_heads, int32_t head_dim,
                const int32_t *pos,     /* [m] positions */
                const float *inv_freq)  /* [head_dim / 2] */
{
    __shared__ float cs[256], sn[256];
    const bool early = krncuda::pdl_early(gridDim.x); /* a block a row */
    krncuda::pdl_enter_start(early);
    const int64_t r = blockIdx.x;
    const int32_t half = head_dim / 2;
    row_angles((float)pos[r], inv_freq, half, cs, sn); /* before the wait (row_angles) */
    krncuda::pdl_enter_wait(early);
    __half *xr = x + r * ldx;
    const int32_t n = n_heads * half;
    for (int32_t j = threadIdx.x; j < n; j += kThreads) {
        int32_t h = j / half, i = j % half;
        __half *hp = xr + (int64_t)h * head_dim;
        krnrope::rotate_pair(hp[i], hp[i + half], cs[i], sn[i]);
    }
}

/* KV: false, rotate heads [0, n_heads) of each row in place. KV: true, also
 * write heads [n_q, n_heads) (K, rotated) and the row's V into the pools at
 * pool row kv_row[r] (none when negative): fp16 values, or with F8 their
 * E4M3 codes of value / k_scale (v_scale), the pools then being bytes. */
template <bool KV, bool F8>
__global__ void __launch_bounds__(kMaxThreads)
    rope_vec_kernel(__half *__restrict__ x, int64_t ldx, int32_t n_heads, int32_t head_dim,
                    const int32_t *__restrict__ pos, const float *__restrict__ inv_freq,
                    int32_t n_q, const __half *__restrict__ v, int64_t ldv,
                    void *__restrict__ k_pool, void *__restrict__ v_pool, int32_t kv_elems,
                    const int32_t *__restrict__ kv_row, float k_scale, float v_scale)
{
    __shared__ float cs[256], sn[256];
    const bool early = krncuda::pdl_early(gridDim.x); /* a block a row */
    krncuda::pdl_enter_start(early);
    const int64_t r = blockIdx.x;
    const int32_t half = head_dim / 2, per_head = half / 8;
    const int32_t units = n_heads * per_head;
    int64_t prow = -1;
    if (KV)
        prow = kv_row[r];
    row_angles((float)pos[r], inv_freq, half, cs, sn); /* before the wait (row_angles) */
    krncuda::pdl_enter_wait(early);
    const int32_t u0 = threadIdx.x;
    __half *xr = x + r * ldx;
    uint4 a = {}, b = {};
    int32_t h = 0, i0 = 0;
    if (u0 < units) {
        h = u0 / per_head;
        i0 = (u0 % per_head) * 8;
        a = *reinterpret_cast<const uint4 *>(xr + (int64_t)h * head_dim + i0);
        b = *reinterpret_cast<const uint4 *>(xr + (int64_t)h * head_dim + i0 + half);
    }
    for (int32_t u = u0; u < units; u += blockDim.x) {
        if (u != u0) {
            h = u / per_head;
            i0 = (u % per_head) * 8;
            a = *reinterpret_cast<const uint4 *>(xr + (int64_t)h * head_dim + i0);
            b = *reinterpret_cast<const uint4 *>(xr + (int64_t)h * head_dim + i0 + half);
        }
        krnrope::rotate8(a, b, cs, sn, i0);
        *reinterpret_cast<uint4 *>(xr + (int64_t)h * head_dim + i0) = a;
        *reinterpret_cast<uint4 *>(xr + (int64_t)h * head_dim + i0 + half) = b;
        if (KV && prow >= 0 && h >= n_q) {
            const int64_t at = prow * kv_elems + (int64_t)(h - n_q) * head_dim;
            if (F8) {
                uint8_t *kd = static_cast<uint8_t *>(k_pool) + at;
                *reinterpret_cast<uint2 *>(kd + i0) = krnfp8::encode8(a, k_scale);
                *reinterpret_cast<uint2 *>(kd + i0 + half) = krnfp8::encode8(b, k_scale);
            } else {
                __half *kd = static_cast<__half *>(k_pool) + at;
                *reinterpret_cast<uint4 *>(kd + i0) = a;
                *reinterpret_cast<uint4 *>(kd + i0 + half) = b;
            }
        }
    }
    if (KV && prow >= 0) {
        const uint4 *vs = reinterpret_cast<const uint4 *>(v + r * ldv);
        for (int32_t i = threadIdx.x; i < kv_elems / 8; i += blockDim.x) {
            if (F8)
                reinterpret_cast<uint2 *>(static_cast<uint8_t *>(v_pool) + prow * kv_elems)[i] =
                    krnfp8::encode8(vs[i], v_scale);
            else
                reinterpret_cast<uint4 *>(static_cast<__half *>(v_pool) + prow * kv_elems)[i] =
                    vs[i];
        }
    }
}

bool aligned16(const void *p)
{
    return (uintptr_t)p % 16 == 0;
}

int vec_threads(int32_t n_heads, int32_t head_dim)
{
    int32_t units = n_heads * (head_dim / 16);
    int32_t t = units < kMaxThreads ? units : kMaxThreads;
    t = (t + 31) / 32 * 32;
    return t < head_dim / 2 ? (head_dim / 2 + 31) / 32 * 32 : t;
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
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    __half *xh = reinterpret_cast<__half *>(x);
    cudaError_t e;
    if (head_dim % 16 == 0 && ldx % 8 == 0 && aligned16(x))
        e = krncuda::launch_pdl(rope_vec_kernel<false, false>, dim3((unsigned)m),
                                dim3(vec_threads(n_heads, head_dim)), 0, s, xh, ldx, n_heads,
                                head_dim, pos, inv_freq, n_heads, (const __half *)nullptr,
                                (int64_t)0, (void *)nullptr, (void *)nullptr, (int32_t)0,
                                (const int32_t *)nullptr, 1.0f, 1.0f);
    else
        e = krncuda::launch_pdl(rope_kernel, dim3((unsigned)m), dim3(kThreads), 0, s, xh, ldx,
                                n_heads, head_dim, pos, inv_freq);
    if (e != cudaSuccess)
        return inf_err_set(err, INF_E_DEVICE, "rope: %s", cudaGetErrorString(e));
    return krncuda::launched("rope", err);
}

extern "C" bool krn_cuda_rope_kv_ok(const uint16_t *x, int64_t ldx, int32_t n_q_heads,
                                    int32_t n_kv_heads, int32_t head_dim, const uint16_t *v,
                                    int64_t ldv, const uint16_t *k_pool, const uint16_t *v_pool)
{
    return n_q_heads > 0 && n_kv_heads > 0 && head_dim > 0 && head_dim <= 512 &&
           head_dim % 16 == 0 && ldx % 8 == 0 && ldv % 8 == 0 && aligned16(x) && aligned16(v) &&
           aligned16(k_pool) && aligned16(v_pool);
}

extern "C" inf_status_t krn_cuda_rope_kv(uint16_t *x, int64_t ldx, int32_t n_q_heads,
                                         int32_t n_kv_heads, int32_t head_dim, const int32_t *pos,
                                         const float *inv_freq, const uint16_t *v, int64_t ldv,
                                         uint16_t *k_pool, uint16_t *v_pool,
                                         const int32_t *kv_row, int32_t m, void *stream,
                                         struct inf_err *err)
{
    if (m < 0 ||
        !krn_cuda_rope_kv_ok(x, ldx, n_q_heads, n_kv_heads, head_dim, v, ldv, k_pool, v_pool))
        return inf_err_set(err, INF_E_INVALID, "rope_kv: m=%d heads=%d/%d head_dim=%d", m,
                           n_q_heads, n_kv_heads, head_dim);
    if (m == 0)
        return INF_OK;
    const int32_t n = n_q_heads + n_kv_heads;
    cudaError_t e = krncuda::launch_pdl(
        rope_vec_kernel<true, false>, dim3((unsigned)m), dim3(vec_threads(n, head_dim)), 0,
        static_cast<cudaStream_t>(stream), reinterpret_cast<__half *>(x), ldx, n, head_dim, pos,
        inv_freq, n_q_heads, reinterpret_cast<const __half *>(v), ldv, static_cast<void *>(k_pool),
        static_cast<void *>(v_pool), n_kv_heads * head_dim, kv_row, 1.0f, 1.0f);
    if (e != cudaSuccess)
        return inf_err_set(err, INF_E_DEVICE, "rope_kv: %s", cudaGetErrorString(e));
    return krncuda::launched("rope_kv", err);
}

extern "C" inf_status_t krn_cuda_rope_kv_e4m3(uint16_t *x, int64_t ldx, int32_t n_q_heads,
                                              int32_t n_kv_heads, int32_t head_dim,
                                              const int32_t *pos, const float *inv_freq,
                                              const uint16_t *v, int64_t ldv, uint8_t *k_pool,
                                              uint8_t *v_pool, float k_scale, float v_scale,
                                              const int32_t *kv_row, int32_t m, void *stream,
                                              struct inf_err *err)
{
    if (m < 0 ||
        !krn_cuda_rope_kv_ok(x, ldx, n_q_heads, n_kv_heads, head_dim, v, ldv,
                             reinterpret_cast<const uint16_t *>(k_pool),
                             reinterpret_cast<const uint16_t *>(v_pool)) ||
        !(k_scale > 0.0f) || !(v_scale > 0.0f))
        return inf_err_set(err, INF_E_INVALID, "rope_kv: m=%d heads=%d/%d head_dim=%d scales %g %g",
                           m, n_q_heads, n_kv_heads, head_dim, (double)k_scale, (double)v_scale);
    if (m == 0)
        return INF_OK;
    const int32_t n = n_q_heads + n_kv_heads;
    cudaError_t e = krncuda::launch_pdl(
        rope_vec_kernel<true, true>, dim3((unsigned)m), dim3(vec_threads(n, head_dim)), 0,
        static_cast<cudaStream_t>(stream), reinterpret_cast<__half *>(x), ldx, n, head_dim, pos,
        inv_freq, n_q_heads, reinterpret_cast<const __half *>(v), ldv, static_cast<void *>(k_pool),
        static_cast<void *>(v_pool), n_kv_heads * head_dim, kv_row, k_scale, v_scale);
    if (e != cudaSuccess)
        return inf_err_set(err, INF_E_DEVICE, "rope_kv: %s", cudaGetErrorString(e));
    return krncuda::launched("rope_kv", err);
}
