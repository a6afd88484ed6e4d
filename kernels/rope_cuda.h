#pragma once
/* kernels/rope_cuda.h — rotary position embedding on fp16 rows, Hugging Face
 * rotate_half convention (element i of a head pairs with i + head_dim / 2).
 * inv_freq [head_dim / 2] fp32 on the device, computed on the host by
 * krn_rope_inv_freq (kernels/rope.h) so both backends share its math. Row r
 * is at position pos[r]: angle = (float)pos * inv_freq[i] in fp32, precise
 * sinf/cosf, (a, b) -> (a cos - b sin, b cos + a sin) in fp32, rounded once.
 * Device pointers; launched on stream, with programmatic dependent launch on
 * sm_90 (it waits for the kernel before it on the stream before touching
 * memory). Errors: INF_E_INVALID (head_dim odd or above 512), INF_E_DEVICE. */
#include "common/inf.h"

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

inf_status_t krn_cuda_rope(uint16_t *x, int64_t ldx, int32_t n_heads, int32_t head_dim,
                           const int32_t *pos, const float *inv_freq, int32_t m, void *stream,
                           struct inf_err *err);

/* The rotation of krn_cuda_rope over the n_q_heads + n_kv_heads heads of each
 * row r < m of x (the q heads, then the k heads), fused with the KV write of
 * a decode step: when kv_row[r] >= 0, the rotated k heads of row r go to
 * k_pool row kv_row[r] and row r of v (n_kv_heads * head_dim halves) to
 * v_pool row kv_row[r] (pool rows of n_kv_heads * head_dim halves); the pools
 * receive exactly the values the rotated row holds. kv_row entries are not
 * range-checked: the caller validated them. Needs what krn_cuda_rope_kv_ok
 * checks (head_dim a multiple of 16, 16-byte aligned rows and pools).
 * Device pointers; launched on stream. Errors: INF_E_INVALID, INF_E_DEVICE. */
bool krn_cuda_rope_kv_ok(const uint16_t *x, int64_t ldx, int32_t n_q_heads, int32_t n_kv_heads,
                         int32_t head_dim, const uint16_t *v, int64_t ldv, const uint16_t *k_pool,
                         const uint16_t *v_pool);
inf_status_t krn_cuda_rope_kv(uint16_t *x, int64_t ldx, int32_t n_q_heads, int32_t n_kv_heads,
                              int32_t head_dim, const int32_t *pos, const float *inv_freq,
                              const uint16_t *v, int64_t ldv, uint16_t *k_pool, uint16_t *v_pool,
                              const int32_t *kv_row, int32_t m, void *stream, struct inf_err *err);
/* krn_cuda_rope_kv into E4M3 pools (pool rows of n_kv_heads * head_dim
 * bytes): the rotated fp16 k of a row is stored as e4m3(k / k_scale), v as
 * e4m3(v / v_scale) (kernels/fp8.h's encode of the fp16 values made fp32,
 * bit for bit); x is rotated in place as krn_cuda_rope_kv rotates it. The
 * same conditions, the pools 16-byte aligned. */
inf_status_t krn_cuda_rope_kv_e4m3(uint16_t *x, int64_t ldx, int32_t n_q_heads, int32_t n_kv_heads,
                                   int32_t head_dim, const int32_t *pos, const float *inv_freq,
                                   const uint16_t *v, int64_t ldv, uint8_t *k_pool, uint8_t *v_pool,
                                   float k_scale, float v_scale, const int32_t *kv_row, int32_t m,
                                   void *stream, struct inf_err *err);

#ifdef __cplusplus
}
#endif
