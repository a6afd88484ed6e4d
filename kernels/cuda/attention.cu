/*
 * attention.cu — paged attention for prefill chunks and decode steps
 * (kernels/attn_cuda.h), flash-decoding style.
 * Work     one block per item of the caller's list: up to R query rows that
 *          share a KV head (a decode token's whole query group, or a few
 *          prefill tokens times their group), over keys [k0, k1) of one
 *          sequence. Long contexts are split into several items whose
 *          partials (unnormalized acc, running max, running sum) a second
 *          kernel combines, one block per row set.
 * Mapping  NT threads (128 decode, 256 prefill); R = NT * 8 / HDP rows, so
 *          each thread owns 8 (row, dim) accumulators in registers. Keys are
 *          walked in tiles of TILE positions:
 *            1. K and V tiles -> shared memory with 16-byte loads (the block
 *               table is looked up per row of the tile);
 *            2. scores S[r][p] = q_r . k_p (q pre-scaled), causal mask per
 *               row: lanes of a warp take consecutive p, so the K reads walk
 *               rows whose stride (HDP + 8 halves = an odd number of 16-byte
 *               units) keeps them free of bank conflicts;
 *            3. online softmax, one warp per row: new max, rescale factor,
 *               probabilities written back over S;
 *            4. acc = acc * rescale + P . V, lanes on consecutive dims.
 * Numerics fp16 inputs, fp32 scores, softmax and accumulation (precise expf);
 *          one rounding to fp16 at the output. SIMT only in this version:
 *          tensor cores for the prefill tiles are the next step.
 * Arch     any (sm_75+; static shared memory under 48 KB per block).
 */
#include "kernels/attn_cuda.h"
#include "kernels/cuda/launch.cuh"

#include <math.h>

namespace {

constexpr int kAcc = 8; /* accumulators per thread */

template <int HDP> struct tile_of {
    static constexpr int value = HDP > 128 ? 32 : 64;
};

template <int HDP, int NT>
__global__ void __launch_bounds__(NT) attn_kernel(const krn_cuda_attn_params p)
{
    constexpr int R = NT * kAcc / HDP;   /* query rows per block */
    constexpr int TILE = tile_of<HDP>::value;
    constexpr int KS = HDP + 8;          /* shared row stride (halves) */
    constexpr int NW = NT / 32;
    __shared__ __align__(16) __half k_s[TILE][KS];
    __shared__ __align__(16) __half v_s[TILE][KS];
    __shared__ __align__(16) float q_s[R][HDP];
    __shared__ float s_s[R][TILE];
    __shared__ float m_s[R], l_s[R], c_s[R];

    const krn_cuda_attn_item it = p.items[blockIdx.x];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int hd = p.head_dim;
    const int G = p.n_heads / p.n_kv_heads;
    const int64_t kv_row = (int64_t)p.n_kv_heads * hd;
    const int32_t *bt = p.block_table + (int64_t)it.slot * p.max_blocks;
    const __half *qg = reinterpret_cast<const __half *>(p.q);

    for (int e = tid; e < R * HDP; e += NT) {
        int r = e / HDP, d = e % HDP;
        float v = 0.0f;
        if (r < it.nrows && d < hd) {
            int rr = it.row0 + r;
            int64_t t = it.t_first + rr / G;
            int h = it.kvh * G + rr % G;
            v = __half2float(qg[t * p.ldq + (int64_t)h * hd + d]) * p.scale;
        }
        q_s[r][d] = v;
    }
    if (tid < R) {
        m_s[tid] = -INFINITY;
        l_s[tid] = 0.0f;
    }
    float acc[kAcc];
#pragma unroll
    for (int i = 0; i < kAcc; i++)
        acc[i] = 0.0f;

    const int cpr = hd / 8; /* 16-byte chunks per K/V row */
    for (int kt = it.k0; kt < it.k1; kt += TILE) {
        const int nk = min(TILE, it.k1 - kt);
        __syncthreads(); /* the previous tile's readers are done; q_s, m_s ready */
        for (int c = tid; c < nk * cpr; c += NT) {
            int pr = c / cpr, cc = c % cpr;
            int kp = kt + pr;
            int64_t blk = bt[kp / p.block];
            int64_t off = (blk * p.block + kp % p.block) * kv_row + (int64_t)it.kvh * hd + cc * 8;
            *reinterpret_cast<uint4 *>(&k_s[pr][cc * 8]) =
                *reinterpret_cast<const uint4 *>(p.k_pool + off);
            *reinterpret_cast<uint4 *>(&v_s[pr][cc * 8]) =
                *reinterpret_cast<const uint4 *>(p.v_pool + off);
        }
        __syncthreads();
        for (int e = tid; e < R * TILE; e += NT) {
            int r = e / TILE, pp = e % TILE;
            float s = -INFINITY;
            int lim = it.p_first + (it.row0 + r) / G + 1;
            if (r < it.nrows && pp < nk && kt + pp < lim) {
                s = 0.0f;
                for (int d = 0; d < hd; d += 8) {
                    float kf[8];
                    krncuda::unpack8(*reinterpret_cast<const uint4 *>(&k_s[pp][d]), kf);
                    const float4 qa = *reinterpret_cast<const float4 *>(&q_s[r][d]);
                    const float4 qb = *reinterpret_cast<const float4 *>(&q_s[r][d + 4]);
                    s += qa.x * kf[0] + qa.y * kf[1] + qa.z * kf[2] + qa.w * kf[3] +
                         qb.x * kf[4] + qb.y * kf[5] + qb.z * kf[6] + qb.w * kf[7];
                }
            }
            s_s[r][pp] = s;
        }
        __syncthreads();
        for (int r = warp; r < R; r += NW) {
            float mx = -INFINITY;
            for (int pp = lane; pp < TILE; pp += 32)
                mx = fmaxf(mx, s_s[r][pp]);
#pragma unroll
            for (int o = 16; o > 0; o >>= 1)
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
            const float m_old = m_s[r];
            const float m_new = fmaxf(m_old, mx);
            float sum = 0.0f, corr = 1.0f;
            if (m_new == -INFINITY) {
                for (int pp = lane; pp < TILE; pp += 32)
                    s_s[r][pp] = 0.0f;
            } else {
                corr = m_old == -INFINITY ? 0.0f : expf(m_old - m_new);
                for (int pp = lane; pp < TILE; pp += 32) {
                    float s = s_s[r][pp];
                    float e = s == -INFINITY ? 0.0f : expf(s - m_new);
                    s_s[r][pp] = e;
                    sum += e;
                }
            }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1)
                sum += __shfl_xor_sync(0xffffffffu, sum, o);
            __syncwarp();
            if (lane == 0) {
                m_s[r] = m_new;
                l_s[r] = l_s[r] * corr + sum;
                c_s[r] = corr;
            }
        }
        __syncthreads();
#pragma unroll
        for (int i = 0; i < kAcc; i++) {
            const int e = tid + i * NT;
            const int r = e / HDP, d = e % HDP;
            float a = acc[i] * c_s[r];
            if (d < hd)
                for (int pp = 0; pp < nk; pp++)
                    a += s_s[r][pp] * __half2float(v_s[pp][d]);
            acc[i] = a;
        }
    }
    __syncthreads();
    __half *og = reinterpret_cast<__half *>(p.out);
#pragma unroll
    for (int i = 0; i < kAcc; i++) {
        const int e = tid + i * NT;
        const int r = e / HDP, d = e % HDP;
        if (r >= it.nrows || d >= hd)
            continue;
        if (it.part < 0) {
            int rr = it.row0 + r;
            int64_t t = it.t_first + rr / G;
            int h = it.kvh * G + rr % G;
            og[t * p.ldo + (int64_t)h * hd + d] = __float2half_rn(acc[i] / l_s[r]);
        } else {
            float *slot = p.partials + ((int64_t)it.part * R + r) * (hd + 2);
            slot[d] = acc[i];
            if (d == 0) {
                slot[hd] = m_s[r];
                slot[hd + 1] = l_s[r];
            }
        }
    }
}

/* One block per group: out = sum_j w_j acc_j / sum_j w_j l_j, w_j = exp(m_j - M). */
__global__ void combine_kernel(const krn_cuda_attn_params p, int R)
{
    const krn_cuda_attn_group g = p.groups[blockIdx.x];
    const krn_cuda_attn_item it = p.items[g.item];
    const int hd = p.head_dim, G = p.n_heads / p.n_kv_heads;
    __half *og = reinterpret_cast<__half *>(p.out);
    for (int e = threadIdx.x; e < it.nrows * hd; e += blockDim.x) {
        const int r = e / hd, d = e % hd;
        float M = -INFINITY;
        for (int j = 0; j < g.n_splits; j++) {
            const float *slot =
                p.partials + ((int64_t)p.items[g.item + j].part * R + r) * (hd + 2);
            M = fmaxf(M, slot[hd]);
        }
        float num = 0.0f, den = 0.0f;
        for (int j = 0; j < g.n_splits; j++) {
            const float *slot =
                p.partials + ((int64_t)p.items[g.item + j].part * R + r) * (hd + 2);
            float m = slot[hd];
            if (m == -INFINITY)
                continue;
            float w = expf(m - M);
            num += w * slot[d];
            den += w * slot[hd + 1];
        }
        int rr = it.row0 + r;
        int64_t t = it.t_first + rr / G;
        int h = it.kvh * G + rr % G;
        og[t * p.ldo + (int64_t)h * hd + d] = __float2half_rn(num / den);
    }
}

template <bool VEC>
__global__ void kv_write_kernel(const __half *k, int64_t ldk, /* batch rows */
                                const __half *v, int64_t ldv,
                                __half *k_pool, __half *v_pool, /* [rows][row_elems] */
                                int32_t row_elems,
                                const int32_t *dst) /* [n][2]: batch token, pool row */
{
    const int64_t t = dst[2 * blockIdx.x], row = dst[2 * blockIdx.x + 1];
    const __half *ks = k + t * ldk, *vs = v + t * ldv;
    __half *kd = k_pool + row * row_elems, *vd = v_pool + row * row_elems;
    if (VEC) {
        for (int i = threadIdx.x; i < row_elems / 8; i += blockDim.x) {
            reinterpret_cast<uint4 *>(kd)[i] = reinterpret_cast<const uint4 *>(ks)[i];
            reinterpret_cast<uint4 *>(vd)[i] = reinterpret_cast<const uint4 *>(vs)[i];
        }
    } else {
        for (int i = threadIdx.x; i < row_elems; i += blockDim.x) {
            kd[i] = ks[i];
            vd[i] = vs[i];
        }
    }
}

template <int HDP>
cudaError_t launch(const krn_cuda_attn_params &p, cudaStream_t s)
{
    if (p.decode)
        attn_kernel<HDP, 128><<<(unsigned)p.n_items, 128, 0, s>>>(p);
    else
        attn_kernel<HDP, 256><<<(unsigned)p.n_items, 256, 0, s>>>(p);
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess && p.n_groups > 0)
        combine_kernel<<<(unsigned)p.n_groups, 128, 0, s>>>(
            p, (p.decode ? 128 : 256) * kAcc / HDP);
    return e;
}

int hdp_of(int32_t head_dim)
{
    if (head_dim <= 0 || head_dim % 8 || head_dim > 256)
        return 0;
    return head_dim <= 64 ? 64 : head_dim <= 128 ? 128 : 256;
}

} // namespace

extern "C" int32_t krn_cuda_attn_rows(int32_t head_dim, bool decode)
{
    int hdp = hdp_of(head_dim);
    return hdp ? (decode ? 128 : 256) * kAcc / hdp : 0;
}

extern "C" int32_t krn_cuda_attn_tile(int32_t head_dim)
{
    int hdp = hdp_of(head_dim);
    return hdp == 0 ? 0 : hdp > 128 ? 32 : 64;
}

extern "C" inf_status_t krn_cuda_attention(const struct krn_cuda_attn_params *p, void *stream,
                                           struct inf_err *err)
{
    int hdp = hdp_of(p->head_dim);
    if (!hdp)
        return inf_err_set(err, INF_E_UNSUPPORTED,
                           "attention: head_dim %d (the CUDA kernels take multiples of 8 up to "
                           "256)",
                           p->head_dim);
    if (p->n_items < 0 || p->n_groups < 0 || p->n_heads <= 0 || p->n_kv_heads <= 0 ||
        p->n_heads % p->n_kv_heads || p->block <= 0)
        return inf_err_set(err, INF_E_INVALID, "attention: bad counts");
    if (p->n_items == 0)
        return INF_OK;
    if (p->n_items > 0x7fffffff / 2 || ((uintptr_t)p->k_pool | (uintptr_t)p->v_pool) % 16)
        return inf_err_set(err, INF_E_UNSUPPORTED, "attention: %d items or unaligned pools",
                           p->n_items);
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    cudaError_t e = hdp == 64 ? launch<64>(*p, s) : hdp == 128 ? launch<128>(*p, s)
                                                               : launch<256>(*p, s);
    if (e != cudaSuccess)
        return inf_err_set(err, INF_E_DEVICE, "attention: %s", cudaGetErrorString(e));
    return krncuda::launched("attention combine", err);
}

extern "C" inf_status_t krn_cuda_kv_write(const uint16_t *k, int64_t ldk, const uint16_t *v,
                                          int64_t ldv, uint16_t *k_pool, uint16_t *v_pool,
                                          int32_t row_elems, const int32_t *dst, int32_t n,
                                          void *stream, struct inf_err *err)
{
    if (n < 0 || row_elems <= 0)
        return inf_err_set(err, INF_E_INVALID, "kv_write: n=%d row=%d", n, row_elems);
    if (n == 0)
        return INF_OK;
    const bool vec = row_elems % 8 == 0 && ldk % 8 == 0 && ldv % 8 == 0 &&
                     ((uintptr_t)k | (uintptr_t)v | (uintptr_t)k_pool | (uintptr_t)v_pool) % 16 ==
                         0;
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    const __half *kh = reinterpret_cast<const __half *>(k), *vh = reinterpret_cast<const __half *>(v);
    __half *kp = reinterpret_cast<__half *>(k_pool), *vp = reinterpret_cast<__half *>(v_pool);
    if (vec)
        kv_write_kernel<true><<<(unsigned)n, 128, 0, s>>>(kh, ldk, vh, ldv, kp, vp, row_elems, dst);
    else
        kv_write_kernel<false><<<(unsigned)n, 128, 0, s>>>(kh, ldk, vh, ldv, kp, vp, row_elems,
                                                           dst);
    return krncuda::launched("kv_write", err);
}
