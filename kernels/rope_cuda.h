#pragma once
/* kernels/rope_cuda.h — rotary position embedding on fp16 rows, Hugging Face
 * rotate_half convention (element i of a head pairs with i + head_dim / 2).
 * inv_freq [head_dim / 2] fp32 on the device, computed on the host by
 * krn_rope_inv_freq (kernels/rope.h) so both backends share its math. Row r
 * is at position pos[r]: angle = (float)pos * inv_freq[i] in fp32, precise
 * sinf/cosf, (a, b) -> (a cos - b sin, b cos + a sin) in fp32, rounded once.
 * Device pointers; launched on stream. Errors: INF_E_INVALID (head_dim odd or
 * above 512), INF_E_DEVICE. */
#include "common/inf.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

inf_status_t krn_cuda_rope(uint16_t *x, int64_t ldx, int32_t n_heads, int32_t head_dim,
                           const int32_t *pos, const float *inv_freq, int32_t m, void *stream,
                           struct inf_err *err);

#ifdef __cplusplus
}
#endif
