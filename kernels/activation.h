#pragma once
/* kernels/activation.h — SwiGLU's SiLU(gate) * up.
 * out[r][i] = gate[r][i] / (1 + exp(-gate[r][i])) * up[r][i] for rows
 * [r0, r1), i < dim. Kernels never allocate, log or synchronize. */
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

void krn_cpu_silu_mul(const float *gate, int64_t ldg, const float *up, int64_t ldu, float *out,
                      int64_t ldo, int32_t dim, int32_t r0, int32_t r1);

#ifdef __cplusplus
}
#endif
