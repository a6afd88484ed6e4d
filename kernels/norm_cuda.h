#pragma once
/* kernels/norm_cuda.h — RMSNorm fused with the residual add, fp16 rows.
 * For each row r < m: if delta, x[r] += delta[r] (the sum rounded to fp16 and
 * stored back: x is the residual stream); then
 * out[r][i] = fp16(x[r][i] / sqrt(mean_i(x[r]^2) + eps) * w[i]), i < dim,
 * the mean accumulated in fp32 over the stored fp16 values. w is fp32.
 * With perm (int32 [dim], a permutation of 0..dim-1, or NULL) the output is
 * in a consumer's column order, an act-order linear's: out[r][i] is the
 * normalized x[r][perm[i]] times w[i] (w given in that order too).
 * out may alias neither x nor delta. Device pointers; launched on stream,
 * with programmatic dependent launch on sm_90 (it waits for the kernel
 * before it on the stream before touching memory).
 * Errors: INF_E_INVALID (sizes), INF_E_DEVICE (launch failure). */
#include "common/inf.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

inf_status_t krn_cuda_rmsnorm_add(uint16_t *x, int64_t ldx, const uint16_t *delta, int64_t ldd,
                                  const float *w, const int32_t *perm, float eps, uint16_t *out,
                                  int64_t ldo, int32_t dim, int32_t m, void *stream,
                                  struct inf_err *err);

/* The same with delta the fixed-point sums of an INT4 GEMM launched with
 * KRN_INT4_GEMM_ACC64 that took them (kernels/int4_gemm.h; acc [m][dim],
 * row stride dim): each is rounded to fp16 as krn_int4_gemm_acc_reduce
 * would write it, so x and out are bit for bit that reduce followed by
 * krn_cuda_rmsnorm_add; the words are left as they are (a later ACC64
 * launch's acc_clear zeroes them). Needs dim % 8 == 0 and 16-byte aligned
 * rows (else INF_E_UNSUPPORTED). */
inf_status_t krn_cuda_rmsnorm_add_acc(uint16_t *x, int64_t ldx, const int64_t *acc, const float *w,
                                      const int32_t *perm, float eps, uint16_t *out, int64_t ldo,
                                      int32_t dim, int32_t m, void *stream, struct inf_err *err);

#ifdef __cplusplus
}
#endif
