#pragma once
/* kernels/norm.h — RMSNorm fused with the residual add.
 * For each row r in [r0, r1): if delta, x[r] += delta[r]; then
 * out[r][i] = x[r][i] / sqrt(mean_i(x[r]^2) + eps) * w[i]   (i < dim).
 * The mean is accumulated in double. out may alias neither x nor delta.
 * Kernels never allocate, log or synchronize. */
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

void krn_cpu_rmsnorm_add(float *x, int64_t ldx, const float *delta, int64_t ldd, const float *w,
                         float eps, float *out, int64_t ldo, int32_t dim, int32_t r0, int32_t r1);

#ifdef __cplusplus
}
#endif
