/* kernels/cpu/embedding.c — row gathers (kernels/embedding.h). */
#include "kernels/embedding.h"
#include "kernels/linear.h"

#include <string.h>

void krn_cpu_embed_f32(const float *table, int32_t dim, const int32_t *ids, float *out, int64_t ldo,
                       int32_t r0, int32_t r1)
{
    for (int32_t r = r0; r < r1; r++)
        memcpy(out + r * ldo, table + (int64_t)ids[r] * dim, (size_t)dim * sizeof(float));
}

void krn_cpu_embed_f16(const uint16_t *table, int32_t dim, const int32_t *ids, float *out,
                       int64_t ldo, int32_t r0, int32_t r1)
{
    for (int32_t r = r0; r < r1; r++) {
        const uint16_t *t = table + (int64_t)ids[r] * dim;
        float *o = out + r * ldo;
        for (int32_t i = 0; i < dim; i++)
            o[i] = krn_half_to_float(t[i]);
    }
}

void krn_cpu_rows_gather(const float *x, int64_t ldx, const int32_t *idx, float *out, int64_t ldo,
                         int32_t dim, int32_t r0, int32_t r1)
{
    for (int32_t r = r0; r < r1; r++)
        memcpy(out + r * ldo, x + (int64_t)idx[r] * ldx, (size_t)dim * sizeof(float));
}
