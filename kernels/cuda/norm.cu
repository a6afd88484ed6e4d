/*
 * norm.cu — RMSNorm with the fused residual add (kernels/norm_cuda.h).
 * Mapping  one block per row. Rows of 16-byte aligned fp16 with dim a
 *          multiple of 8 (every Llama shape): each thread owns up to 4
 *          vectors of 8 halves, loads x and delta at once, keeps the summed
 *          row in registers, and writes the normalized vectors after one
 *          block reduction (a batch-1 row of 4096 is one vector a thread,
 *          512 threads). Other rows: 256 threads striding over the row, two
 *          passes. Launched with programmatic dependent launch (sm_90); the
 *          vector kernel loads its share of the norm weight before the wait.
 *          With a column order (perm, an act-order consumer's) the output
 *          vectors gather the summed row back from global memory after the
 *          block reduction (whose barrier orders the row's stores before
 *          them); the order's indices are loaded with the weight.
 * Numerics fp32 accumulation of the stored fp16 residual values; the CPU
 *          reference accumulates in double, both agree to fp16 output
 *          rounding.
 * Arch     any.
 */
#include "kernels/cuda/acc64.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/norm_cuda.h"

namespace
{

constexpr int kThreads = 256;
constexpr int kMaxThreads = 1024;

/* Sum of v over the block (blockDim.x a multiple of 32, at most 1024), the
 * same value in every thread, summed in a fixed order. */
__device__ __forceinline__ float block_sum(float v)
{
    __shared__ float part[32];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0)
        part[threadIdx.x >> 5] = v;
    __syncthreads();
    float tot = 0.0f;
    const int nw = (int)(blockDim.x >> 5);
    for (int i = 0; i < nw; i++)
        tot += part[i];
    return tot;
}

/* Eight fixed-point sums (kernels/cuda/acc64.cuh) as eight fp16. The words
 * are left as they are: zeroing them here cost 0.85 us a norm at batch 1 on
 * the H200; the next ACC64 launch zeroes them while it runs instead. */
__device__ __forceinline__ uint4 acc64_take8(const long long *a)
{
    const longlong2 *a2 = reinterpret_cast<const longlong2 *>(a);
    longlong2 q[4];
#pragma unroll
    for (int u = 0; u < 4; u++)
        q[u] = __ldcg(a2 + u);
    uint4 o;
    __half2 *h = reinterpret_cast<__half2 *>(&o);
#pragma unroll
    for (int u = 0; u < 4; u++)
        h[u] = __floats2half2_rn(krncuda::acc64_value(q[u].x), krncuda::acc64_value(q[u].y));
    return o;
}

/* ACC: delta is a KRN_INT4_GEMM_ACC64 launch's sums (acc, row stride dim);
 * PERM: the output in perm's column order. Separate instantiations, so that
 * the usual kernel's code is untouched. */
template <int NV, bool ACC, bool PERM>
__global__ void __launch_bounds__(kMaxThreads)
    rmsnorm_vec_kernel(__half *__restrict__ x, /* [m] rows of stride ldx, updated in place */
                       int64_t ldx,
                       const __half *__restrict__ delta, /* [m] rows of stride ldd, or NULL */
                       int64_t ldd, const float *__restrict__ w, /* [dim] norm weight */
                       float eps, __half *__restrict__ out,      /* [m] rows of stride ldo */
                       int64_t ldo, int32_t dim,
                       const long long *__restrict__ acc, /* ACC: [m][dim] sums */
                       const int32_t *__restrict__ perm)  /* PERM: [dim] column order */
{
    /* The norm weight is the model's and no kernel writes it: this thread's
     * share is loaded before the programmatic-dependent-launch wait, so the
     * scaling after the row's sum does not wait on an L2 round trip
     * (between the two halves of krncuda::pdl_enter). */
    const bool early = krncuda::pdl_early(gridDim.x); /* a block a row */
    krncuda::pdl_enter_start(early);
    const int32_t nvec = dim / 8;
    const float4 *w4 = reinterpret_cast<const float4 *>(w);
    float4 wa[NV], wb[NV];
    int4 pa[PERM ? NV : 1], pb[PERM ? NV : 1];
#pragma unroll
    for (int j = 0; j < NV; j++) {
        const int32_t i = threadIdx.x + j * blockDim.x;
        if (i < nvec) {
            wa[j] = w4[2 * i];
            wb[j] = w4[2 * i + 1];
            if (PERM) {
                pa[PERM ? j : 0] = reinterpret_cast<const int4 *>(perm)[2 * i];
                pb[PERM ? j : 0] = reinterpret_cast<const int4 *>(perm)[2 * i + 1];
            }
        }
    }
    krncuda::pdl_enter_wait(early);
    const int64_t r = blockIdx.x;
    uint4 *xr = reinterpret_cast<uint4 *>(x + r * ldx);
    const uint4 *dr = delta ? reinterpret_cast<const uint4 *>(delta + r * ldd) : nullptr;
    uint4 xv[NV], dv[NV];
#pragma unroll
    for (int j = 0; j < NV; j++) {
        const int32_t i = threadIdx.x + j * blockDim.x;
        if (i < nvec) {
            xv[j] = xr[i];
            if (ACC)
                dv[j] = acc64_take8(acc + r * dim + 8 * i);
            else if (dr)
                dv[j] = dr[i];
        }
    }
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < NV; j++) {
        const int32_t i = threadIdx.x + j * blockDim.x;
        if (i < nvec) {
            __half2 *h = reinterpret_cast<__half2 *>(&xv[j]);
            if (ACC || dr) {
                const __half2 *d = reinterpret_cast<const __half2 *>(&dv[j]);
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float2 a = __half22float2(h[e]), b = __half22float2(d[e]);
                    h[e] = __halves2half2(__float2half_rn(a.x + b.x), __float2half_rn(a.y + b.y));
                }
                xr[i] = xv[j];
            }
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float2 a = __half22float2(h[e]);
                ss += a.x * a.x;
                ss += a.y * a.y;
            }
        }
    }
    const float tot = block_sum(ss);
    const float inv = 1.0f / sqrtf(tot / (float)dim + eps);
    uint4 *orow = reinterpret_cast<uint4 *>(out + r * ldo);
#pragma unroll
    for (int j = 0; j < NV; j++) {
        const int32_t i = threadIdx.x + j * blockDim.x;
        if (i < nvec) {
            const float wf[8] = {wa[j].x, wa[j].y, wa[j].z, wa[j].w,
                                 wb[j].x, wb[j].y, wb[j].z, wb[j].w};
            if (PERM) { /* the summed row's columns perm[8i..8i+7] (stored above) */
                const __half *xs = x + r * ldx;
                const int4 a = pa[PERM ? j : 0], b = pb[PERM ? j : 0];
                const int32_t c[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
                __half2 *g = reinterpret_cast<__half2 *>(&xv[j]);
#pragma unroll
                for (int e = 0; e < 4; e++)
                    g[e] = __halves2half2(xs[c[2 * e]], xs[c[2 * e + 1]]);
            }
            const __half2 *h = reinterpret_cast<const __half2 *>(&xv[j]);
            uint4 o;
            __half2 *oh = reinterpret_cast<__half2 *>(&o);
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float2 a = __half22float2(h[e]);
                oh[e] = __halves2half2(__float2half_rn(a.x * inv * wf[2 * e]),
                                       __float2half_rn(a.y * inv * wf[2 * e + 1]));
            }
            orow[i] = o;
        }
    }
}

__global__ void __launch_bounds__(kThreads)
    rmsnorm_add_kernel(__half *x, /* [m] rows of stride ldx, updated in place */
                       int64_t ldx, const __half *delta, /* [m] rows of stride ldd, or NULL */
                       int64_t ldd, const float *w,      /* [dim] norm weight */
                       float eps, __half *out,           /* [m] rows of stride ldo */
                       int64_t ldo, int32_t dim,
                       const int32_t *perm) /* [dim] column order of out, or NULL */
{
    krncuda::pdl_enter(krncuda::pdl_early(gridDim.x)); /* a block a row */
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
    const float tot = block_sum(ss);
    const float inv = 1.0f / sqrtf(tot / (float)dim + eps);
    __half *orow = out + r * ldo;
    for (int32_t i = threadIdx.x; i < dim; i += kThreads)
        orow[i] = __float2half_rn(__half2float(xr[perm ? perm[i] : i]) * inv * w[i]);
}

} // namespace

/* The launch of both forms: delta fp16 rows, or (acc) the fixed-point sums
 * of an ACC64 GEMM, which need the vector kernel. */
static inf_status_t rmsnorm_launch(uint16_t *x, int64_t ldx, const uint16_t *delta, int64_t ldd,
                                   const int64_t *acc, const float *w, const int32_t *perm,
                                   float eps, uint16_t *out, int64_t ldo, int32_t dim, int32_t m,
                                   void *stream, struct inf_err *err)
{
    if (m < 0 || dim <= 0)
        return inf_err_set(err, INF_E_INVALID, "rmsnorm: m=%d dim=%d", m, dim);
    if (m == 0)
        return INF_OK;
    if (m > 0x7fffffff / 2)
        return inf_err_set(err, INF_E_UNSUPPORTED, "rmsnorm: m=%d too large", m);
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    __half *xh = reinterpret_cast<__half *>(x), *oh = reinterpret_cast<__half *>(out);
    const __half *dh = reinterpret_cast<const __half *>(delta);
    const long long *ah = reinterpret_cast<const long long *>(acc);
    const bool vec = dim % 8 == 0 && dim <= 8 * 4 * kMaxThreads && ldx % 8 == 0 &&
                     (!delta || ldd % 8 == 0) && ldo % 8 == 0 &&
                     ((uintptr_t)x | (uintptr_t)delta | (uintptr_t)out | (uintptr_t)w |
                      (uintptr_t)acc | (uintptr_t)perm) %
                             16 ==
                         0;
    if (acc && !vec)
        return inf_err_set(err, INF_E_UNSUPPORTED,
                           "rmsnorm: GEMM sums need dim %% 8 == 0 and 16-byte aligned rows");
    cudaError_t e;
    if (vec) {
        const int32_t nvec = dim / 8;
        const int nv = nvec <= kMaxThreads ? 1 : nvec <= 2 * kMaxThreads ? 2 : 4;
        int threads = (nvec + nv - 1) / nv;
        threads = (threads + 31) / 32 * 32;
        const bool a = acc != nullptr, p = perm != nullptr;
        /* [nv - 1 of 1, 2, 4][acc][perm] */
        using K = void (*)(__half *, int64_t, const __half *, int64_t, const float *, float,
                           __half *, int64_t, int32_t, const long long *, const int32_t *);
        static const K kernels[3][2][2] = {
            {{rmsnorm_vec_kernel<1, false, false>, rmsnorm_vec_kernel<1, false, true>},
             {rmsnorm_vec_kernel<1, true, false>, rmsnorm_vec_kernel<1, true, true>}},
            {{rmsnorm_vec_kernel<2, false, false>, rmsnorm_vec_kernel<2, false, true>},
             {rmsnorm_vec_kernel<2, true, false>, rmsnorm_vec_kernel<2, true, true>}},
            {{rmsnorm_vec_kernel<4, false, false>, rmsnorm_vec_kernel<4, false, true>},
             {rmsnorm_vec_kernel<4, true, false>, rmsnorm_vec_kernel<4, true, true>}}};
        e = krncuda::launch_pdl(kernels[nv == 1   ? 0
                                        : nv == 2 ? 1
                                                  : 2][a][p],
                                dim3((unsigned)m), dim3(threads), 0, s, xh, ldx, dh, ldd, w, eps,
                                oh, ldo, dim, ah, perm);
    } else {
        e = krncuda::launch_pdl(rmsnorm_add_kernel, dim3((unsigned)m), dim3(kThreads), 0, s, xh,
                                ldx, dh, ldd, w, eps, oh, ldo, dim, perm);
    }
    if (e != cudaSuccess)
        return inf_err_set(err, INF_E_DEVICE, "rmsnorm: %s", cudaGetErrorString(e));
    return krncuda::launched("rmsnorm", err);
}

extern "C" inf_status_t krn_cuda_rmsnorm_add(uint16_t *x, int64_t ldx, const uint16_t *delta,
                                             int64_t ldd, const float *w, const int32_t *perm,
                                             float eps, uint16_t *out, int64_t ldo, int32_t dim,
                                             int32_t m, void *stream, struct inf_err *err)
{
    return rmsnorm_launch(x, ldx, delta, ldd, NULL, w, perm, eps, out, ldo, dim, m, stream, err);
}

extern "C" inf_status_t krn_cuda_rmsnorm_add_acc(uint16_t *x, int64_t ldx, const int64_t *acc,
                                                 const float *w, const int32_t *perm, float eps,
                                                 uint16_t *out, int64_t ldo, int32_t dim, int32_t m,
                                                 void *stream, struct inf_err *err)
{
    if (!acc)
        return inf_err_set(err, INF_E_INVALID, "rmsnorm: no GEMM sums");
    return rmsnorm_launch(x, ldx, NULL, 0, acc, w, perm, eps, out, ldo, dim, m, stream, err);
}
