#pragma once
/* kernels/activation_cuda.h — SwiGLU's SiLU(gate) * up on fp16 rows, the
 * fp16/fp32 conversions and bias adds the CUDA backend needs around cuBLAS,
 * and the column gather of the activations of an act-order INT4 weight.
 * Device pointers; launched on stream; never allocate or synchronize.
 * Errors: INF_E_INVALID (sizes), INF_E_DEVICE (launch failure). */
#include "common/inf.h"

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* out[r][i] = fp16(g / (1 + exp(-g)) * u), g = gate[r][i], u = up[r][i] in
 * fp32, i < dim, r < m. Launched with programmatic dependent launch on
 * sm_90 (kernels/cuda/launch.cuh): it may start while the kernel before it
 * on the stream finishes, and waits for it before reading. */
inf_status_t krn_cuda_silu_mul(const uint16_t *gate, int64_t ldg, const uint16_t *up, int64_t ldu,
                               uint16_t *out, int64_t ldo, int32_t dim, int32_t m, void *stream,
                               struct inf_err *err);

/* The same with gate and up in one matrix in the GLU column order of the
 * INT4 GEMM (kernels/int4_gemm.h, KRN_INT4_GEMM_GLU): in [m][2 dim] (row
 * stride ldi), gate j at column 16 (j / 8) + j % 8, up j eight columns on;
 * out [m][dim]. dim a multiple of 8. The large-M path of a GLU linear
 * (dequantized weight, cuBLAS), bit for bit the GEMM's GLU output. */
inf_status_t krn_cuda_silu_mul_glu(const uint16_t *in, int64_t ldi, uint16_t *out, int64_t ldo,
                                   int32_t dim, int32_t m, void *stream, struct inf_err *err);

/* out[r][i] = x[r][perm[i]] for r < m, i < k (fp16 rows; perm int32 [k],
 * values in [0, k), on the device): the activations of a weight whose
 * stored columns follow perm (kernels/q4.h), for the GEMM after it.
 * Launched with programmatic dependent launch as krn_cuda_silu_mul is, so
 * the GEMM after it may launch early; safe to capture in a graph. */
inf_status_t krn_cuda_gather_cols(const uint16_t *x, int64_t ldx, const int32_t *perm, int32_t k,
                                  uint16_t *out, int64_t ldo, int32_t m, void *stream,
                                  struct inf_err *err);

/* Strided fp16 -> fp32: dst[r][c] = src[r][c], r < rows, c < cols. */
inf_status_t krn_cuda_f16_to_f32(const uint16_t *src, int64_t lds, float *dst, int64_t ldd,
                                 int32_t cols, int32_t rows, void *stream, struct inf_err *err);

/* Strided fp32 -> fp16 with an optional fp32 bias per column:
 * dst[r][c] = fp16(src[r][c] + bias[c]). */
inf_status_t krn_cuda_f32_to_f16(const float *src, int64_t lds, const float *bias, uint16_t *dst,
                                 int64_t ldd, int32_t cols, int32_t rows, void *stream,
                                 struct inf_err *err);

/* In place: y[r][c] += bias[c]; y fp32 (y_f32) or fp16 (sum in fp32, rounded
 * once). */
inf_status_t krn_cuda_bias_add(void *y, bool y_f32, int64_t ldy, const float *bias, int32_t cols,
                               int32_t rows, void *stream, struct inf_err *err);

#ifdef __cplusplus
}
#endif
