#pragma once
/* kernels/attention.h — paged attention over a KV pool.
 *
 * Pool layout (one layer, K and V alike): [n_blocks][block][n_kv_heads]
 * [head_dim] fp32; position p of a sequence lives in block
 * blocks[p / block], row p % block. Kernels never allocate, log or
 * synchronize. */
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Write one token's K and V rows (n_kv_heads * head_dim each) at position
 * pos of the sequence whose block list is blocks. */
void krn_cpu_kv_write(float *k_pool, float *v_pool, const int32_t *blocks, int32_t block,
                      int32_t n_kv_heads, int32_t head_dim, int32_t pos, const float *k,
                      const float *v);

/* Query heads [h0, h1) of one token over positions 0..n_ctx-1 of its
 * sequence: for head h (KV head h / (n_heads / n_kv_heads)),
 * out[h][d] = sum_p softmax_p(scale * q[h] . K[p]) V[p][d]. q and out hold
 * the token's n_heads heads of head_dim; scores is scratch of
 * (h1 - h0) * n_ctx floats. The positions are walked once for all the
 * heads, reading each pool row's heads in one sweep; every head's result is
 * the same whatever range it is computed in. */
void krn_cpu_attn_heads(const float *q, const float *k_pool, const float *v_pool,
                        const int32_t *blocks, int32_t block, int32_t n_heads, int32_t n_kv_heads,
                        int32_t head_dim, int32_t h0, int32_t h1, int32_t n_ctx, float scale,
                        float *scores, float *out);

#ifdef __cplusplus
}
#endif
