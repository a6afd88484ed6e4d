#pragma once
/* kernels/embedding.h — row gathers: token embeddings (fp32 or fp16 table)
 * and activation rows. Kernels never allocate, log or synchronize. */
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* out[r][0..dim) = table[ids[r]] for rows [r0, r1); ids already checked. */
void krn_cpu_embed_f32(const float *table, int32_t dim, const int32_t *ids, float *out, int64_t ldo,
                       int32_t r0, int32_t r1);
void krn_cpu_embed_f16(const uint16_t *table, int32_t dim, const int32_t *ids, float *out,
                       int64_t ldo, int32_t r0, int32_t r1);
/* out[r] = x[idx[r]] for rows [r0, r1). */
void krn_cpu_rows_gather(const float *x, int64_t ldx, const int32_t *idx, float *out, int64_t ldo,
                         int32_t dim, int32_t r0, int32_t r1);

#ifdef __cplusplus
}
#endif
