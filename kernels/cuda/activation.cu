/*
 * activation.cu — SiLU·mul, fp16/fp32 conversions, bias adds and the column
 * gather of act-order activations (kernels/activation_cuda.h).
 * Mapping  grid-stride loops over (row, column) pairs, consecutive threads on
 *          consecutive columns (coalesced for any row stride; the gather's
 *          reads follow perm, its writes are coalesced).
 *          SiLU·mul and the gather are launched with programmatic dependent
 *          launch (sm_90).
 * Numerics fp32 arithmetic, precise expf, one rounding to fp16 at the end.
 * Arch     any.
 */
#include "kernels/activation_cuda.h"
#include "kernels/cuda/launch.cuh"

namespace {

constexpr int kThreads = 256;

/* GLU: gate and up in one matrix in the GLU column order of the INT4 GEMM
 * (kernels/int4_gemm.h, KRN_INT4_GEMM_GLU): gate j at column
 * 16 (j / 8) + j % 8 of gate's rows, up j at the same column of up's (the
 * caller passes up = gate + 8). */
template <bool GLU>
__global__ void silu_mul_kernel(const __half *gate, int64_t ldg, /* [m][dim] */
                                const __half *up, int64_t ldu,   /* [m][dim] */
                                __half *out, int64_t ldo,        /* [m][dim] */
                                int32_t dim, int32_t m)
{
    krncuda::pdl_enter(krncuda::pdl_early(m));
    const int64_t n = (int64_t)m * dim;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i / dim, c = i % dim, cin = GLU ? (c / 8) * 16 + c % 8 : c;
        float g = __half2float(gate[r * ldg + cin]), u = __half2float(up[r * ldu + cin]);
        out[r * ldo + c] = __float2half_rn(krncuda::silu_mul(g, u));
    }
}

/* The gather runs between a row kernel and the INT4 GEMM it feeds, so it
 * enters as the row kernels do (kernels/cuda/launch.cuh): the GEMM behind
 * it may launch and load its first weight stages while it runs. */
__global__ void gather_cols_kernel(const __half *x, int64_t ldx, /* [m][>= k] */
                                   const int32_t *perm,          /* [k], values < k */
                                   int32_t k,                    /* columns */
                                   __half *out, int64_t ldo,     /* [m][k] */
                                   int32_t m)
{
    krncuda::pdl_enter(krncuda::pdl_early(m));
    const int64_t n = (int64_t)m * k;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i / k, c = i % k;
        out[r * ldo + c] = x[r * ldx + perm[c]];
    }
}

__global__ void f16_to_f32_kernel(const __half *src, int64_t lds, float *dst, int64_t ldd,
                                  int32_t cols, int32_t rows)
{
    const int64_t n = (int64_t)rows * cols;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i / cols, c = i % cols;
        dst[r * ldd + c] = __half2float(src[r * lds + c]);
    }
}

__global__ void f32_to_f16_kernel(const float *src, int64_t lds, const float *bias, __half *dst,
                                  int64_t ldd, int32_t cols, int32_t rows)
{
    const int64_t n = (int64_t)rows * cols;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i / cols, c = i % cols;
        float v = src[r * lds + c];
        if (bias)
            v += bias[c];
        dst[r * ldd + c] = __float2half_rn(v);
    }
}

template <typename T>
__global__ void bias_add_kernel(T *y, int64_t ldy, const float *bias, int32_t cols, int32_t rows)
{
    const int64_t n = (int64_t)rows * cols;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i / cols, c = i % cols;
        if constexpr (sizeof(T) == 4)
            y[r * ldy + c] += bias[c];
        else
            y[r * ldy + c] = __float2half_rn(__half2float(y[r * ldy + c]) + bias[c]);
    }
}

} // namespace

#define KRN_CHECK_2D(op, cols, rows)                                                             \
    do {                                                                                         \
        if ((cols) < 0 || (rows) < 0)                                                            \
            return inf_err_set(err, INF_E_INVALID, op ": %d x %d", (int)(rows), (int)(cols));    \
        if ((cols) == 0 || (rows) == 0)                                                          \
            return INF_OK;                                                                       \
    } while (0)

template <bool GLU>
static inf_status_t silu_mul_launch(const uint16_t *gate, int64_t ldg, const uint16_t *up,
                                    int64_t ldu, uint16_t *out, int64_t ldo, int32_t dim,
                                    int32_t m, void *stream, struct inf_err *err)
{
    cudaError_t e = krncuda::launch_pdl(
        silu_mul_kernel<GLU>, dim3(krncuda::grid_for((int64_t)m * dim, kThreads)), dim3(kThreads),
        0, static_cast<cudaStream_t>(stream), reinterpret_cast<const __half *>(gate), ldg,
        reinterpret_cast<const __half *>(up), ldu, reinterpret_cast<__half *>(out), ldo, dim, m);
    if (e != cudaSuccess)
        return inf_err_set(err, INF_E_DEVICE, "silu_mul: %s", cudaGetErrorString(e));
    return krncuda::launched("silu_mul", err);
}

extern "C" inf_status_t krn_cuda_silu_mul(const uint16_t *gate, int64_t ldg, const uint16_t *up,
                                          int64_t ldu, uint16_t *out, int64_t ldo, int32_t dim,
                                          int32_t m, void *stream, struct inf_err *err)
{
    KRN_CHECK_2D("silu_mul", dim, m);
    return silu_mul_launch<false>(gate, ldg, up, ldu, out, ldo, dim, m, stream, err);
}

extern "C" inf_status_t krn_cuda_silu_mul_glu(const uint16_t *in, int64_t ldi, uint16_t *out,
                                              int64_t ldo, int32_t dim, int32_t m, void *stream,
                                              struct inf_err *err)
{
    KRN_CHECK_2D("silu_mul_glu", dim, m);
    if (dim % 8)
        return inf_err_set(err, INF_E_INVALID, "silu_mul_glu: dim %d not a multiple of 8", dim);
    return silu_mul_launch<true>(in, ldi, in + 8, ldi, out, ldo, dim, m, stream, err);
}

extern "C" inf_status_t krn_cuda_gather_cols(const uint16_t *x, int64_t ldx, const int32_t *perm,
                                             int32_t k, uint16_t *out, int64_t ldo, int32_t m,
                                             void *stream, struct inf_err *err)
{
    KRN_CHECK_2D("gather_cols", k, m);
    if (!x || !perm || !out || ldx < k || ldo < k)
        return inf_err_set(err, INF_E_INVALID, "gather_cols: k %d, ldx %lld, ldo %lld", (int)k,
                           (long long)ldx, (long long)ldo);
    cudaError_t e = krncuda::launch_pdl(
        gather_cols_kernel, dim3(krncuda::grid_for((int64_t)m * k, kThreads)), dim3(kThreads), 0,
        static_cast<cudaStream_t>(stream), reinterpret_cast<const __half *>(x), ldx, perm, k,
        reinterpret_cast<__half *>(out), ldo, m);
    if (e != cudaSuccess)
        return inf_err_set(err, INF_E_DEVICE, "gather_cols: %s", cudaGetErrorString(e));
    return krncuda::launched("gather_cols", err);
}

extern "C" inf_status_t krn_cuda_f16_to_f32(const uint16_t *src, int64_t lds, float *dst,
                                            int64_t ldd, int32_t cols, int32_t rows,
                                            void *stream, struct inf_err *err)
{
    KRN_CHECK_2D("f16_to_f32", cols, rows);
    f16_to_f32_kernel<<<krncuda::grid_for((int64_t)rows * cols, kThreads), kThreads, 0,
                        static_cast<cudaStream_t>(stream)>>>(
        reinterpret_cast<const __half *>(src), lds, dst, ldd, cols, rows);
    return krncuda::launched("f16_to_f32", err);
}

extern "C" inf_status_t krn_cuda_f32_to_f16(const float *src, int64_t lds, const float *bias,
                                            uint16_t *dst, int64_t ldd, int32_t cols,
                                            int32_t rows, void *stream, struct inf_err *err)
{
    KRN_CHECK_2D("f32_to_f16", cols, rows);
    f32_to_f16_kernel<<<krncuda::grid_for((int64_t)rows * cols, kThreads), kThreads, 0,
                        static_cast<cudaStream_t>(stream)>>>(
        src, lds, bias, reinterpret_cast<__half *>(dst), ldd, cols, rows);
    return krncuda::launched("f32_to_f16", err);
}

extern "C" inf_status_t krn_cuda_bias_add(void *y, bool y_f32, int64_t ldy, const float *bias,
                                          int32_t cols, int32_t rows, void *stream,
                                          struct inf_err *err)
{
    KRN_CHECK_2D("bias_add", cols, rows);
    unsigned grid = krncuda::grid_for((int64_t)rows * cols, kThreads);
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    if (y_f32)
        bias_add_kernel<float><<<grid, kThreads, 0, s>>>(static_cast<float *>(y), ldy, bias, cols,
                                                         rows);
    else
        bias_add_kernel<__half><<<grid, kThreads, 0, s>>>(static_cast<__half *>(y), ldy, bias,
                                                          cols, rows);
    return krncuda::launched("bias_add", err);
}
