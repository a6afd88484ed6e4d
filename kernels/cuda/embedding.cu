/*
 * embedding.cu — token embedding and activation row gathers (kernels/embedding_cuda.h).
 * Mapping  grid-stride over (row, element) pairs: one thread per output
 *          element, consecutive threads on consecutive elements of a row, so
 *          the table row and the output row are read and written coalesced.
 * Numerics fp16 table: copied bit for bit; fp32 table: __float2half_rn.
 * Arch     any (plain loads and stores).
 */
#include "kernels/cuda/launch.cuh"
#include "kernels/embedding_cuda.h"

namespace {

template <bool F16>
__global__ void embed_kernel(const void *table, /* [vocab][dim] fp16 or fp32 */
                             int32_t vocab, int32_t dim,
                             const int32_t *ids, /* [m] token ids */
                             __half *out,        /* [m] rows of stride ldo */
                             int64_t ldo, int32_t m, int32_t *bad)
{
    const int64_t n = (int64_t)m * dim;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        int32_t r = (int32_t)(i / dim), c = (int32_t)(i % dim);
        int32_t id = ids[r];
        __half v = __float2half_rn(0.0f);
        if (id >= 0 && id < vocab) {
            if (F16)
                v = static_cast<const __half *>(table)[(int64_t)id * dim + c];
            else
                v = __float2half_rn(static_cast<const float *>(table)[(int64_t)id * dim + c]);
        } else if (bad && c == 0) {
            atomicOr(bad, KRN_CUDA_BAD_ID);
        }
        out[r * ldo + c] = v;
    }
}

__global__ void gather_kernel(const __half *x, /* [x_rows] rows of stride ldx */
                              int64_t ldx, int64_t x_rows,
                              const int32_t *idx, /* [m] source rows */
                              __half *out, int64_t ldo, int32_t dim, int32_t m, int32_t *bad)
{
    const int64_t n = (int64_t)m * dim;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        int32_t r = (int32_t)(i / dim), c = (int32_t)(i % dim);
        int32_t s = idx[r];
        __half v = __float2half_rn(0.0f);
        if (s >= 0 && s < x_rows)
            v = x[s * ldx + c];
        else if (bad && c == 0)
            atomicOr(bad, KRN_CUDA_BAD_ROW);
        out[r * ldo + c] = v;
    }
}

__global__ void feed_kernel(int32_t *tok, const int32_t *feed, const int32_t *src, int64_t stride,
                            int32_t n_src, int32_t n, int32_t *bad)
{
    const int32_t i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    const int32_t f = feed[i];
    if (f < 0)
        return;
    int32_t t = 0;
    if (f < n_src)
        t = src[f * stride];
    else if (bad)
        atomicOr(bad, KRN_CUDA_BAD_ROW);
    tok[i] = t >= 0 ? t : 0;
}
} // namespace

extern "C" inf_status_t krn_cuda_token_feed(int32_t *tok, const int32_t *feed, const int32_t *src,
                                            int64_t stride, int32_t n_src, int32_t n, int32_t *bad,
                                            void *stream, struct inf_err *err)
{
    if (n < 0 || n_src < 0 || stride < 1)
        return inf_err_set(err, INF_E_INVALID, "token_feed: n=%d n_src=%d stride=%lld", n, n_src,
                           (long long)stride);
    if (n == 0)
        return INF_OK;
    const int threads = 128;
    feed_kernel<<<(unsigned)((n + threads - 1) / threads), threads, 0,
                  static_cast<cudaStream_t>(stream)>>>(tok, feed, src, stride, n_src, n, bad);
    return krncuda::launched("token_feed", err);
}

extern "C" inf_status_t krn_cuda_embed(const void *table, bool table_f16, int32_t vocab,
                                       int32_t dim, const int32_t *ids, uint16_t *out,
                                       int64_t ldo, int32_t m, int32_t *bad, void *stream,
                                       struct inf_err *err)
{
    if (m < 0 || dim < 0 || vocab < 0 || ldo < dim)
        return inf_err_set(err, INF_E_INVALID, "embed: m=%d dim=%d ldo=%lld", m, dim,
                           (long long)ldo);
    if (m == 0 || dim == 0)
        return INF_OK;
    const int threads = 256;
    unsigned grid = krncuda::grid_for((int64_t)m * dim, threads);
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    if (table_f16)
        embed_kernel<true><<<grid, threads, 0, s>>>(table, vocab, dim, ids,
                                                    reinterpret_cast<__half *>(out), ldo, m, bad);
    else
        embed_kernel<false><<<grid, threads, 0, s>>>(table, vocab, dim, ids,
                                                     reinterpret_cast<__half *>(out), ldo, m, bad);
    return krncuda::launched("embed", err);
}

extern "C" inf_status_t krn_cuda_rows_gather(const uint16_t *x, int64_t ldx, int64_t x_rows,
                                             const int32_t *idx, uint16_t *out, int64_t ldo,
                                             int32_t dim, int32_t m, int32_t *bad, void *stream,
                                             struct inf_err *err)
{
    if (m < 0 || dim < 0 || ldo < dim || x_rows < 0)
        return inf_err_set(err, INF_E_INVALID, "rows_gather: m=%d dim=%d", m, dim);
    if (m == 0 || dim == 0)
        return INF_OK;
    const int threads = 256;
    gather_kernel<<<krncuda::grid_for((int64_t)m * dim, threads), threads, 0,
                    static_cast<cudaStream_t>(stream)>>>(
        reinterpret_cast<const __half *>(x), ldx, x_rows, idx, reinterpret_cast<__half *>(out),
        ldo, dim, m, bad);
    return krncuda::launched("rows_gather", err);
}
