#pragma once
/* kernels/attention.h — paged attention over a KV pool.
 *
 * Pool layout (one layer, K and V alike): [n_blocks][block][n_kv_heads]
 * [head_dim] fp32, or E4M3 codes (struct krn_kv_pools); position p of a sequence lives in block
 * blocks[p / block], row p % block. Kernels never allocate, log or
 * synchronize. */
#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Write one token's K and V rows (n_kv_heads * head_dim each) at position
 * pos of the sequence whose block list is blocks. */
void krn_cpu_kv_write(float *k_pool, float *v_pool, const int32_t *blocks, int32_t block,
                      int32_t n_kv_heads, int32_t head_dim, int32_t pos, const float *k,
                      const float *v);

/* krn_cpu_kv_write into E4M3 pools (kernels/fp8.h): element x of k is
 * stored as krn_e4m3_encode(x / k_scale), of v as krn_e4m3_encode(x /
 * v_scale). */
void krn_cpu_kv_write_e4m3(uint8_t *k_pool, uint8_t *v_pool, const int32_t *blocks, int32_t block,
                           int32_t n_kv_heads, int32_t head_dim, int32_t pos, const float *k,
                           const float *v, float k_scale, float v_scale);

/* The pools krn_cpu_attn_chunk and krn_cpu_attn_heads read: fp32 rows (k,
 * v), or E4M3 codes (k8, v8; k and v NULL) whose value is
 * krn_e4m3_decode(code) * k_scale (v_scale for V): the same arithmetic on
 * the decoded values. */
struct krn_kv_pools {
    const float *k, *v;
    const uint8_t *k8, *v8;
    float k_scale, v_scale;
};

/* Attention of one query token over its context, head h using KV head
 * h / (n_heads / n_kv_heads), in chunks of KRN_ATTN_CHUNK positions: chunk
 * c (positions [64c, 64c + 64) cut to the context) gives each head a
 * record {o[0..head_dim), m, l}: with s_p = q[h] . K[p] * scale (a dot
 * product in 16 lanes, reduced in a fixed tree), m = max s_p,
 * e_p = exp(s_p - m), l = sum e_p and o = sum e_p V[p], in position order;
 * the head's output combines the records in chunk order:
 * M = max m_c, out = (sum e^(m_c - M) o_c) * (1 / sum e^(m_c - M) l_c).
 * The chunks are fixed by position, so the result is the same however
 * chunks and heads are shared out (a context of one chunk is the plain
 * softmax). q and out hold the token's n_heads heads of head_dim. */
#define KRN_ATTN_CHUNK 64
/* The largest head_dim the CPU kernels take (the model's bound). */
#define KRN_ATTN_MAX_HEAD_DIM 512

static inline int32_t krn_attn_chunks(int32_t n_ctx)
{
    return (n_ctx + KRN_ATTN_CHUNK - 1) / KRN_ATTN_CHUNK;
}

/* Chunks of a context of positions [k_lo, n_ctx) (a sliding window starts
 * at k_lo): chunk k_lo / KRN_ATTN_CHUNK, the first, cut at k_lo, and on. */
static inline int32_t krn_attn_chunks_from(int32_t k_lo, int32_t n_ctx)
{
    return krn_attn_chunks(n_ctx) - k_lo / KRN_ATTN_CHUNK;
}

/* Heads [h0, h1) over positions [p0, p1) of one chunk: their records,
 * head h at rec + (h - h0) * rec_stride (rec_stride >= head_dim + 2).
 * scores: scratch of (h1 - h0) * KRN_ATTN_CHUNK floats. Each pool row is
 * read once for all the heads. */
void krn_cpu_attn_chunk(const float *q, const struct krn_kv_pools *kv, const int32_t *blocks,
                        int32_t block, int32_t n_heads, int32_t n_kv_heads, int32_t head_dim,
                        int32_t h0, int32_t h1, int32_t p0, int32_t p1, float scale, float *scores,
                        float *rec, int64_t rec_stride);

/* One head's output from its n_chunks records, chunk c's at
 * rec + c * chunk_stride. */
void krn_cpu_attn_combine(const float *rec, int64_t chunk_stride, int32_t n_chunks,
                          int32_t head_dim, float *out);

/* Heads [h0, h1) over positions k_lo..n_ctx-1 (0 <= k_lo < n_ctx; k_lo > 0
 * for a sliding window: blocks wholly before k_lo are not read): every
 * chunk, then the combine. scratch: (h1 - h0) * (KRN_ATTN_CHUNK +
 * krn_attn_chunks_from(k_lo, n_ctx) * (head_dim + 2)) floats. */
void krn_cpu_attn_heads(const float *q, const struct krn_kv_pools *kv, const int32_t *blocks,
                        int32_t block, int32_t n_heads, int32_t n_kv_heads, int32_t head_dim,
                        int32_t h0, int32_t h1, int32_t k_lo, int32_t n_ctx, float scale,
                        float *scratch, float *out);

#ifdef __cplusplus
}
#endif
