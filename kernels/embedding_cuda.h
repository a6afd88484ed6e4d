#pragma once
/* kernels/embedding_cuda.h — row gathers on the GPU into fp16 activations:
 * token embeddings (fp32 or fp16 table) and activation rows. All pointers
 * are device pointers; launches go on `stream` (a cudaStream_t, NULL for
 * the default stream). Kernels never allocate, log or synchronize.
 * Out-of-range indices are never followed: the row is written as zeros and
 * bit 0x1 (ids) or 0x2 (rows) is OR-ed into *bad (device int32, may be
 * NULL) for the caller to report at its next synchronization.
 * Errors: INF_E_INVALID (negative sizes), INF_E_DEVICE (launch failure). */
#include "common/inf.h"

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KRN_CUDA_BAD_ID 0x1
#define KRN_CUDA_BAD_ROW 0x2
#define KRN_CUDA_BAD_TABLE 0x4

/* out[r][0..dim) = fp16(table[ids[r]][0..dim)) for r < m; table [vocab][dim]
 * fp16 when table_f16, else fp32 (rounded to nearest). */
inf_status_t krn_cuda_embed(const void *table, bool table_f16, int32_t vocab, int32_t dim,
                            const int32_t *ids, uint16_t *out, int64_t ldo, int32_t m, int32_t *bad,
                            void *stream, struct inf_err *err);

/* out[r] = x[idx[r]] (dim fp16 elements) for r < m; x has x_rows rows of
 * stride ldx. */
inf_status_t krn_cuda_rows_gather(const uint16_t *x, int64_t ldx, int64_t x_rows,
                                  const int32_t *idx, uint16_t *out, int64_t ldo, int32_t dim,
                                  int32_t m, int32_t *bad, void *stream, struct inf_err *err);

/* The next step's token ids from this step's sampled ones, on the device:
 * for i < n with feed[i] >= 0, tok[i] = src[feed[i] * stride] (the token of
 * sampled row feed[i] of n_src; 0 where it is -1, no token). A feed past
 * n_src writes 0 and sets KRN_CUDA_BAD_ROW. */
inf_status_t krn_cuda_token_feed(int32_t *tok, const int32_t *feed, const int32_t *src,
                                 int64_t stride, int32_t n_src, int32_t n, int32_t *bad,
                                 void *stream, struct inf_err *err);

#ifdef __cplusplus
}
#endif
