/* kernels/cpu/activation.c — SiLU(gate) * up (kernels/activation.h). */
#include "kernels/activation.h"

#include <math.h>

void krn_cpu_silu_mul(const float *gate, int64_t ldg, const float *up, int64_t ldu, float *out,
                      int64_t ldo, int32_t dim, int32_t r0, int32_t r1)
{
    for (int32_t r = r0; r < r1; r++) {
        const float *g = gate + r * ldg, *u = up + r * ldu;
        float *o = out + r * ldo;
        for (int32_t i = 0; i < dim; i++)
            o[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    }
}
