/*
 * int4_gemm_words.cu — the readers of an INT4 GEMM's fixed-point sums
 *          (KRN_INT4_GEMM_ACC64, kernels/int4_gemm.h): C, or the GLU output,
 *          from the int64 words a launch that took them left (acc64.cuh),
 *          zeroing them for the next one. One thread per output (C) or per
 *          two outputs (GLU: one 16-byte load of two gate words, one of
 *          their up words).
 */
#include "kernels/cuda/acc64.cuh"
#include "kernels/cuda/int4_gemm_impl.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/int4_gemm.h"

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

using namespace int4gemm;

/* C from the fixed-point sums of an ACC64 launch, which are zeroed. One
 * thread per output. */
__global__ void acc_reduce_kernel(long long *acc, half *c, int64_t ldc, int m, int n)
{
    krncuda::pdl_enter(false);
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t)m * n)
        return;
    const int64_t r = i / n, col = i % n;
    c[r * ldc + col] = __float2half_rn(krncuda::acc64_value(__ldcg(acc + i)));
    acc[i] = 0;
}

extern "C" inf_status_t krn_int4_gemm_acc_reduce(int64_t *acc, uint16_t *c, int64_t ldc, int32_t m,
                                                 int32_t n, void *stream, struct inf_err *err)
{
    if (!acc || !c || m < 1 || n < 1 || ldc < n)
        return inf_err_set(err, INF_E_INVALID, "int4 gemm acc reduce: arguments");
    const int64_t total = (int64_t)m * n;
    const cudaError_t e =
        krncuda::launch_pdl(acc_reduce_kernel, dim3((unsigned)((total + 255) / 256)), dim3(256), 0,
                            static_cast<cudaStream_t>(stream), reinterpret_cast<long long *>(acc),
                            reinterpret_cast<half *>(c), ldc, (int)m, (int)n);
    if (e != cudaSuccess)
        return inf_err_set(err, INF_E_DEVICE, "int4 gemm acc reduce: %s", cudaGetErrorString(e));
    return krncuda::launched("int4 gemm acc reduce", err);
}

/* SiLU(g) u from the fixed-point sums of a GLU weight's ACC64 launch, two
 * outputs a thread: gate columns 16 (j / 8) + j % 8 and + 1 (one 16-byte
 * load), their up columns eight on; the words are zeroed. */
__global__ void acc_reduce_glu_kernel(long long *acc, half *c, int64_t ldc, int m, int n)
{
    krncuda::pdl_enter(krncuda::pdl_early(m));
    const int half_n = n / 2;
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t)m * (half_n / 2))
        return;
    const int64_t r = i / (half_n / 2);
    const int j = 2 * (int)(i % (half_n / 2)), col = (j / 8) * 16 + j % 8;
    longlong2 *gp = reinterpret_cast<longlong2 *>(acc + r * n + col);
    longlong2 *up = reinterpret_cast<longlong2 *>(acc + r * n + col + 8);
    const longlong2 g = __ldcg(gp), u = __ldcg(up);
    *reinterpret_cast<half2 *>(c + r * ldc + j) =
        __floats2half2_rn(glu_one(krncuda::acc64_value(g.x), krncuda::acc64_value(u.x)),
                          glu_one(krncuda::acc64_value(g.y), krncuda::acc64_value(u.y)));
    *gp = make_longlong2(0, 0);
    *up = make_longlong2(0, 0);
}

extern "C" inf_status_t krn_int4_gemm_acc_reduce_glu(int64_t *acc, uint16_t *c, int64_t ldc,
                                                     int32_t m, int32_t n, void *stream,
                                                     struct inf_err *err)
{
    if (!acc || !c || m < 1 || n < 16 || n % 16 || ldc < n / 2 || ldc % 2 || (uintptr_t)acc % 16 ||
        (uintptr_t)c % 4)
        return inf_err_set(err, INF_E_INVALID, "int4 gemm acc reduce (GLU): arguments");
    const int64_t total = (int64_t)m * (n / 4);
    const cudaError_t e = krncuda::launch_pdl(
        acc_reduce_glu_kernel, dim3((unsigned)((total + 255) / 256)), dim3(256), 0,
        static_cast<cudaStream_t>(stream), reinterpret_cast<long long *>(acc),
        reinterpret_cast<half *>(c), ldc, (int)m, (int)n);
    if (e != cudaSuccess)
        return inf_err_set(err, INF_E_DEVICE, "int4 gemm acc reduce (GLU): %s",
                           cudaGetErrorString(e));
    return krncuda::launched("int4 gemm acc reduce (GLU)", err);
}
