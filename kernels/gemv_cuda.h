#pragma once
/* kernels/gemv_cuda.h — y[m][n] = x[m][k] · W[n][k]ᵀ for a row of fp16
 * activations against fp16 weights (a batch-1 decode step's fp16 linears:
 * the lm_head, every linear of an unquantized model), fp32 accumulation,
 * y fp32 or fp16. Streams W once with 16-byte loads, several in flight a
 * lane, the first issued before the programmatic-dependent-launch wait
 * (sm_90). Needs 1 <= m <= KRN_GEMV_MAX_M, k % 8 == 0, and W and x with
 * 16-byte aligned rows (ldx % 8 == 0); otherwise INF_E_UNSUPPORTED and
 * nothing is queued (the caller uses cuBLAS). Device pointers; queued on
 * stream; deterministic (a fixed summation order). Errors: INF_E_INVALID
 * (sizes), INF_E_UNSUPPORTED (above), INF_E_DEVICE (launch failure). */
#include "common/inf.h"

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KRN_GEMV_MAX_M 1

inf_status_t krn_cuda_gemv_f16(const uint16_t *w, int32_t n, int32_t k, const uint16_t *x,
                               int64_t ldx, void *y, bool y_f32, int64_t ldy, int32_t m,
                               void *stream, struct inf_err *err);

#ifdef __cplusplus
}
#endif
