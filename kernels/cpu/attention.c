/* kernels/cpu/attention.c — paged attention, a range of query heads of one
 * token at a time (kernels/attention.h). Scores are fp32 dot products; the
 * softmax subtracts the maximum and normalizes once at the end. */
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

/* Built for three instruction sets (x86-64-v4, -v3 and the baseline),
 * picked once at load time; each is deterministic and the same code runs
 * for a head whatever the batch, so results do not depend on it. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define HOT __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define HOT
#endif

#define LANES 16

/* q . k over head_dim in LANES partial sums (vectorizable), reduced in a
 * fixed tree. */
static inline float dot(const float *q, const float *k, int32_t n)
{
    float acc[LANES] = {0};
    int32_t d = 0;
    for (; d + LANES <= n; d += LANES)
        for (int l = 0; l < LANES; l++)
            acc[l] += q[d + l] * k[d + l];
    for (int l = 0; d + l < n; l++)
        acc[l] += q[d + l] * k[d + l];
    for (int l = 0; l < LANES / 2; l++)
        acc[l] += acc[l + LANES / 2];
    for (int l = 0; l < LANES / 4; l++)
        acc[l] += acc[l + LANES / 4];
    return (acc[0] + acc[2]) + (acc[1] + acc[3]);
}

HOT void krn_cpu_attn_heads(const float *q, const float *k_pool, const float *v_pool,
                            const int32_t *blocks, int32_t block, int32_t n_heads,
                            int32_t n_kv_heads, int32_t head_dim, int32_t h0, int32_t h1,
                            int32_t n_ctx, float scale, float *scores, float *out)
{
    const int64_t row = (int64_t)n_kv_heads * head_dim;
    const int32_t group = n_heads / n_kv_heads, nh = h1 - h0;
    for (int32_t p0 = 0; p0 < n_ctx; p0 += block) {
        const float *kb = k_pool + (int64_t)blocks[p0 / block] * block * row;
        const int32_t np = n_ctx - p0 < block ? n_ctx - p0 : block;
        for (int32_t i = 0; i < np; i++)
            for (int32_t h = h0; h < h1; h++)
                scores[(int64_t)(h - h0) * n_ctx + p0 + i] =
                    dot(q + (int64_t)h * head_dim, kb + i * row + (int64_t)(h / group) * head_dim,
                        head_dim) *
                    scale;
    }
    for (int32_t h = 0; h < nh; h++) {
        float *sc = scores + (int64_t)h * n_ctx, mx = -INFINITY;
        for (int32_t p = 0; p < n_ctx; p++)
            mx = sc[p] > mx ? sc[p] : mx;
        for (int32_t p = 0; p < n_ctx; p++)
            sc[p] = expf(sc[p] - mx);
        float *o = out + (int64_t)(h0 + h) * head_dim;
        for (int32_t d = 0; d < head_dim; d++)
            o[d] = 0.0f;
    }
    for (int32_t p0 = 0; p0 < n_ctx; p0 += block) {
        const float *vb = v_pool + (int64_t)blocks[p0 / block] * block * row;
        const int32_t np = n_ctx - p0 < block ? n_ctx - p0 : block;
        for (int32_t i = 0; i < np; i++)
            for (int32_t h = h0; h < h1; h++) {
                const float *vp = vb + i * row + (int64_t)(h / group) * head_dim;
                const float a = scores[(int64_t)(h - h0) * n_ctx + p0 + i];
                float *o = out + (int64_t)h * head_dim;
                for (int32_t d = 0; d < head_dim; d++)
                    o[d] += a * vp[d];
            }
    }
    /* each head's weights are normalized once, on its output */
    for (int32_t h = h0; h < h1; h++) {
        const float *sc = scores + (int64_t)(h - h0) * n_ctx;
        float sum = 0.0f;
        for (int32_t p = 0; p < n_ctx; p++)
            sum += sc[p];
        float inv = 1.0f / sum, *o = out + (int64_t)h * head_dim;
        for (int32_t d = 0; d < head_dim; d++)
            o[d] *= inv;
    }
}
