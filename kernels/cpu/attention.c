/* kernels/cpu/attention.c — paged attention, one query head at a time
 * (kernels/attention.h). Scores are fp32 dot products; the softmax subtracts
 * the maximum and normalizes once at the end. */
#include "kernels/attention.h"

#include <math.h>
#include <string.h>

void krn_cpu_kv_write(float *k_pool, float *v_pool, const int32_t *blocks, int32_t block,
                      int32_t n_kv_heads, int32_t head_dim, int32_t pos, const float *k,
                      const float *v)
{
    int64_t row = (int64_t)n_kv_heads * head_dim;
    int64_t at = ((int64_t)blocks[pos / block] * block + pos % block) * row;
    memcpy(k_pool + at, k, (size_t)row * sizeof(float));
    memcpy(v_pool + at, v, (size_t)row * sizeof(float));
}

void krn_cpu_attn_head(const float *q, const float *k_pool, const float *v_pool,
                       const int32_t *blocks, int32_t block, int32_t n_kv_heads, int32_t head_dim,
                       int32_t kvh, int32_t n_ctx, float scale, float *scores, float *out)
{
    int64_t row = (int64_t)n_kv_heads * head_dim;
    float mx = -INFINITY;
    for (int32_t p = 0; p < n_ctx; p++) {
        const float *kp =
            k_pool + ((int64_t)blocks[p / block] * block + p % block) * row + kvh * head_dim;
        float s = 0.0f;
        for (int32_t d = 0; d < head_dim; d++)
            s += q[d] * kp[d];
        s *= scale;
        scores[p] = s;
        mx = s > mx ? s : mx;
    }
    float sum = 0.0f;
    for (int32_t p = 0; p < n_ctx; p++) {
        scores[p] = expf(scores[p] - mx);
        sum += scores[p];
    }
    for (int32_t d = 0; d < head_dim; d++)
        out[d] = 0.0f;
    for (int32_t p = 0; p < n_ctx; p++) {
        const float *vp =
            v_pool + ((int64_t)blocks[p / block] * block + p % block) * row + kvh * head_dim;
        float a = scores[p];
        for (int32_t d = 0; d < head_dim; d++)
            out[d] += a * vp[d];
    }
    float inv = 1.0f / sum;
    for (int32_t d = 0; d < head_dim; d++)
        out[d] *= inv;
}
