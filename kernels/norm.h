#pragma once
/* kernels/norm.h — RMSNorm fused with the residual add.
 * For each row r in [r0, r1): if delta, x[r] += delta[r]; then
 * out[r][i] = x[r][c] / sqrt(mean_i(x[r]^2) + eps) * w[i]   (i < dim),
 * c = perm[i] when perm is given (the output in a consumer's column order,
 * an act-order linear's: w is given in that order too), else c = i.
 * The mean is accumulated in double. out may alias neither x nor delta.
 * Kernels never allocate, log or synchronize. */
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

void krn_cpu_rmsnorm_add(float *x, int64_t ldx, const float *delta, int64_t ldd, const float *w,
                         const int32_t *perm, float eps, float *out, int64_t ldo, int32_t dim,
                         int32_t r0, int32_t r1);

#ifdef __cplusplus
}
#endif
