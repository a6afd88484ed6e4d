#pragma once
/* kernels/rope.h — rotary position embedding, Hugging Face rotate_half
 * convention (element i of a head pairs with i + head_dim / 2).
 * Kernels never allocate, log or synchronize. */
#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* inv_freq[i] = theta^(-2i / head_dim), i < head_dim / 2, rescaled as
 * Hugging Face's "llama3" rope_type when llama3 is set (wavelengths above
 * orig_max_pos / low_freq divided by factor, below orig_max_pos / high_freq
 * kept, smoothly interpolated between). */
void krn_rope_inv_freq(float theta, bool llama3, float factor, float low_freq, float high_freq,
                       int32_t orig_max_pos, int32_t head_dim, float *inv_freq);

/* Rotate n_heads heads of head_dim in place in rows [r0, r1) of x (stride
 * ldx), row r at position pos[r]: angle = (float)pos * inv_freq[i] in fp32,
 * (a, b) -> (a cos - b sin, b cos + a sin). */
void krn_cpu_rope(float *x, int64_t ldx, int32_t n_heads, int32_t head_dim, const int32_t *pos,
                  const float *inv_freq, int32_t r0, int32_t r1);

#ifdef __cplusplus
}
#endif
