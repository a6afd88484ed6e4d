/* kernels/cpu/attention.c — paged attention in chunks of positions, a range
 * of query heads of one token at a time (kernels/attention.h). */
#include "kernels/attention.h"
#include "kernels/fp8.h"

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

void krn_cpu_kv_write_e4m3(uint8_t *k_pool, uint8_t *v_pool, const int32_t *blocks, int32_t block,
                           int32_t n_kv_heads, int32_t head_dim, int32_t pos, const float *k,
                           const float *v, float k_scale, float v_scale)
{
    int64_t row = (int64_t)n_kv_heads * head_dim;
    int64_t at = ((int64_t)blocks[pos / block] * block + pos % block) * row;
    for (int64_t i = 0; i < row; i++) {
        k_pool[at + i] = krn_e4m3_encode(k[i] / k_scale);
        v_pool[at + i] = krn_e4m3_encode(v[i] / v_scale);
    }
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

/* Position p's row of a pool of `row` elements of size es. */
static inline const void *pool_row(const void *pool, size_t es, const int32_t *blocks,
                                   int32_t block, int64_t row, int32_t p)
{
    return (const char *)pool +
           (size_t)(((int64_t)blocks[p / block] * block + p % block) * row) * es;
}

/* KV head kvh of a pool row as fp32: the row itself, or its E4M3 codes
 * decoded and scaled into buf. */
static inline const float *head_of(const void *row, bool e4m3, float scale, int32_t kvh,
                                   int32_t head_dim, float *buf)
{
    if (!e4m3)
        return (const float *)row + (int64_t)kvh * head_dim;
    const uint8_t *c = (const uint8_t *)row + (int64_t)kvh * head_dim;
    for (int32_t d = 0; d < head_dim; d++)
        buf[d] = krn_e4m3_decode_finite(c[d]) * scale;
    return buf;
}

HOT void krn_cpu_attn_chunk(const float *q, const struct krn_kv_pools *kv, const int32_t *blocks,
                            int32_t block, int32_t n_heads, int32_t n_kv_heads, int32_t head_dim,
                            int32_t h0, int32_t h1, int32_t p0, int32_t p1, float scale,
                            float *scores, float *rec, int64_t rec_stride)
{
    const int64_t row = (int64_t)n_kv_heads * head_dim;
    const int32_t group = n_heads / n_kv_heads, np = p1 - p0;
    const bool e4m3 = kv->k == NULL;
    const void *kp = e4m3 ? (const void *)kv->k8 : (const void *)kv->k;
    const void *vp = e4m3 ? (const void *)kv->v8 : (const void *)kv->v;
    const size_t es = e4m3 ? 1 : sizeof(float);
    const int32_t g0 = h0 / group, g1 = (h1 - 1) / group; /* the KV heads read */
    float buf[KRN_ATTN_MAX_HEAD_DIM];
    /* the scores of every head, each pool row read once for all of them */
    for (int32_t i = 0; i < np; i++) {
        const void *kr = pool_row(kp, es, blocks, block, row, p0 + i);
        for (int32_t g = g0; g <= g1; g++) {
            const float *kh = head_of(kr, e4m3, kv->k_scale, g, head_dim, buf);
            const int32_t a = g * group > h0 ? g * group : h0;
            const int32_t b = (g + 1) * group < h1 ? (g + 1) * group : h1;
            for (int32_t h = a; h < b; h++)
                scores[(int64_t)(h - h0) * KRN_ATTN_CHUNK + i] =
                    dot(q + (int64_t)h * head_dim, kh, head_dim) * scale;
        }
    }
    for (int32_t h = h0; h < h1; h++) {
        float *sc = scores + (int64_t)(h - h0) * KRN_ATTN_CHUNK, mx = -INFINITY, l = 0.0f;
        for (int32_t i = 0; i < np; i++)
            mx = sc[i] > mx ? sc[i] : mx;
        for (int32_t i = 0; i < np; i++) {
            sc[i] = expf(sc[i] - mx);
            l += sc[i];
        }
        float *r = rec + (int64_t)(h - h0) * rec_stride;
        for (int32_t d = 0; d < head_dim; d++)
            r[d] = 0.0f;
        r[head_dim] = mx;
        r[head_dim + 1] = l;
    }
    for (int32_t i = 0; i < np; i++) {
        const void *vr = pool_row(vp, es, blocks, block, row, p0 + i);
        for (int32_t g = g0; g <= g1; g++) {
            const float *vh = head_of(vr, e4m3, kv->v_scale, g, head_dim, buf);
            const int32_t a = g * group > h0 ? g * group : h0;
            const int32_t b = (g + 1) * group < h1 ? (g + 1) * group : h1;
            for (int32_t h = a; h < b; h++) {
                const float w = scores[(int64_t)(h - h0) * KRN_ATTN_CHUNK + i];
                float *o = rec + (int64_t)(h - h0) * rec_stride;
                for (int32_t d = 0; d < head_dim; d++)
                    o[d] += w * vh[d];
            }
        }
    }
}

HOT void krn_cpu_attn_combine(const float *rec, int64_t chunk_stride, int32_t n_chunks,
                              int32_t head_dim, float *out)
{
    float mx = -INFINITY, l = 0.0f;
    for (int32_t c = 0; c < n_chunks; c++) {
        float m = rec[c * chunk_stride + head_dim];
        mx = m > mx ? m : mx;
    }
    for (int32_t d = 0; d < head_dim; d++)
        out[d] = 0.0f;
    for (int32_t c = 0; c < n_chunks; c++) {
        const float *r = rec + c * chunk_stride;
        const float f = expf(r[head_dim] - mx); /* 1 for the chunk of the maximum */
        l += f * r[head_dim + 1];
        for (int32_t d = 0; d < head_dim; d++)
            out[d] += f * r[d];
    }
    const float inv = 1.0f / l;
    for (int32_t d = 0; d < head_dim; d++)
        out[d] *= inv;
}

void krn_cpu_attn_heads(const float *q, const struct krn_kv_pools *kv, const int32_t *blocks,
                        int32_t block, int32_t n_heads, int32_t n_kv_heads, int32_t head_dim,
                        int32_t h0, int32_t h1, int32_t k_lo, int32_t n_ctx, float scale,
                        float *scratch, float *out)
{
    const int32_t nh = h1 - h0, c0 = k_lo / KRN_ATTN_CHUNK, nch = krn_attn_chunks_from(k_lo, n_ctx);
    const int64_t rs = head_dim + 2; /* a record */
    float *scores = scratch, *rec = scratch + (int64_t)nh * KRN_ATTN_CHUNK;
    /* records [chunk][head]; the chunks stay those fixed by position, the
     * first cut at k_lo */
    for (int32_t c = 0; c < nch; c++) {
        int32_t p0 = (c0 + c) * KRN_ATTN_CHUNK;
        const int32_t p1 = n_ctx - p0 < KRN_ATTN_CHUNK ? n_ctx : p0 + KRN_ATTN_CHUNK;
        p0 = p0 < k_lo ? k_lo : p0;
        krn_cpu_attn_chunk(q, kv, blocks, block, n_heads, n_kv_heads, head_dim, h0, h1, p0, p1,
                           scale, scores, rec + (int64_t)c * nh * rs, rs);
    }
    for (int32_t h = 0; h < nh; h++)
        krn_cpu_attn_combine(rec + h * rs, nh * rs, nch, head_dim,
                             out + (int64_t)(h0 + h) * head_dim);
}
