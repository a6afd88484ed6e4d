/* kernels/cpu/norm.c — RMSNorm with fused residual add (kernels/norm.h). */
#include "kernels/norm.h"

#include <math.h>

void krn_cpu_rmsnorm_add(float *x, int64_t ldx, const float *delta, int64_t ldd, const float *w,
                         const int32_t *perm, float eps, float *out, int64_t ldo, int32_t dim,
                         int32_t r0, int32_t r1)
{
    for (int32_t r = r0; r < r1; r++) {
        float *xr = x + r * ldx;
        if (delta) {
            const float *dr = delta + r * ldd;
            for (int32_t i = 0; i < dim; i++)
                xr[i] += dr[i];
        }
        double ss = 0.0;
        for (int32_t i = 0; i < dim; i++)
            ss += (double)xr[i] * xr[i];
        float inv = (float)(1.0 / sqrt(ss / dim + (double)eps));
        float *orow = out + r * ldo;
        if (perm)
            for (int32_t i = 0; i < dim; i++)
                orow[i] = xr[perm[i]] * inv * w[i];
        else
            for (int32_t i = 0; i < dim; i++)
                orow[i] = xr[i] * inv * w[i];
    }
}
