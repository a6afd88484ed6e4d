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

/* Small copies gathered into one launch: segment i copies bytes[i] bytes
 * from src[i] to dst[i]. src may be pinned host memory mapped into the
 * device's address space (a zero-copy read), dst is device memory; the
 * segments must not overlap. Each block copies one 4 KiB chunk of one
 * segment (16-byte accesses when a segment's pointers and size allow). */
#define KRN_CUDA_COPY_SEGS 16
#define KRN_CUDA_COPY_MAX_BYTES 16384 /* per segment */
struct krn_cuda_copy_batch {
    int32_t n;
    uint32_t bytes[KRN_CUDA_COPY_SEGS];
    const void *src[KRN_CUDA_COPY_SEGS];
    void *dst[KRN_CUDA_COPY_SEGS];
};
/* Launch the copies of *b (0 < b->n <= KRN_CUDA_COPY_SEGS, every size at
 * most KRN_CUDA_COPY_MAX_BYTES); *b is passed by value and may be reused at
 * once. Errors: INF_E_INVALID (counts or sizes), INF_E_DEVICE. */
inf_status_t krn_cuda_copy_batch(const struct krn_cuda_copy_batch *b, void *stream,
                                 struct inf_err *err);

#ifdef __cplusplus
}
#endif
