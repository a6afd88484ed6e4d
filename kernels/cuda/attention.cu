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
 *               row (and p.window's): lanes of a warp take consecutive p, so the K reads walk
 *               rows whose stride (HDP + 8 halves = an odd number of 16-byte
 *               units) keeps them free of bank conflicts;
 *            3. online softmax, one warp per row: new max, rescale factor,
 *               probabilities written back over S;
 *            4. acc = acc * rescale + P . V, lanes on consecutive dims.
 *          Prefill with head_dim <= 128 runs the tensor-core kernel below
 *          instead (64 rows per block, mma.sync m16n8k16), and decode with
 *          head_dim <= 128 the tensor-core decode kernel of attn_decode.cu
 *          (16 rows per block, its splits combined in the same launch).
 * Numerics fp16 inputs, fp32 scores, softmax and accumulation (precise expf);
 *          the tensor-core kernel rounds the probabilities to fp16 for P.V;
 *          one rounding to fp16 at the output.
 * Arch     sm_80+ (mma.sync m16n8k16; static shared memory under 48 KB);
 *          on the sm_75 paths (krncuda::sm75_paths()) the tensor-core
 *          kernels do each m16n8k16 as two m16n8k8 (krncuda::mma_k16), and
 *          the SIMT kernel is sm_75 code as it is.
 */
#include "kernels/attn_cuda.h"
#include "kernels/cuda/attn_decode.cuh"
#include "kernels/cuda/fp8.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/rope_cuda.h"

#include <limits.h>
#include <math.h>

namespace
{

constexpr int kAcc = 8; /* accumulators per thread */

/* Eight K or V elements at element offset off of a pool as fp16: the
 * halves themselves, or (E4M3) the codes decoded to value / unit. */
__device__ __forceinline__ uint4 load8(const uint16_t *pool, int64_t off, bool f8)
{
    if (f8)
        return krnfp8::h8(
            *reinterpret_cast<const uint2 *>(reinterpret_cast<const uint8_t *>(pool) + off));
    return *reinterpret_cast<const uint4 *>(pool + off);
}

/* The factors an E4M3 pool's decoded halves take: K's into the scores,
 * V's into the output (1 for fp16 pools). */
__device__ __forceinline__ float k_factor(const krn_cuda_attn_params &p)
{
    return p.kv_fp8 ? p.k_scale * krnfp8::unit() : 1.0f;
}
__device__ __forceinline__ float v_factor(const krn_cuda_attn_params &p)
{
    return p.kv_fp8 ? p.v_scale * krnfp8::unit() : 1.0f;
}

template <int HDP> struct tile_of {
    static constexpr int value = HDP > 128 ? 32 : 64;
};

template <int HDP, int NT>
__global__ void __launch_bounds__(NT) attn_kernel(const krn_cuda_attn_params p)
{
    constexpr int R = NT * kAcc / HDP; /* query rows per block */
    constexpr int TILE = tile_of<HDP>::value;
    constexpr int KS = HDP + 8; /* shared row stride (halves) */
    constexpr int NW = NT / 32;
    __shared__ __align__(16) __half k_s[TILE][KS];
    __shared__ __align__(16) __half v_s[TILE][KS];
    __shared__ __align__(16) float q_s[R][HDP];
    __shared__ float s_s[R][TILE];
    __shared__ float m_s[R], l_s[R], c_s[R];

    const krn_cuda_attn_item it = p.items[blockIdx.x];
    if (it.nrows <= 0)
        return; /* a padding item of a fixed-shape list: the whole block leaves */
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
            v = __half2float(qg[t * p.ldq + (int64_t)h * hd + d]) * (p.scale * k_factor(p));
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
            *reinterpret_cast<uint4 *>(&k_s[pr][cc * 8]) = load8(p.k_pool, off, p.kv_fp8);
            *reinterpret_cast<uint4 *>(&v_s[pr][cc * 8]) = load8(p.v_pool, off, p.kv_fp8);
        }
        __syncthreads();
        for (int e = tid; e < R * TILE; e += NT) {
            int r = e / TILE, pp = e % TILE;
            float s = -INFINITY;
            int lim = it.p_first + (it.row0 + r) / G + 1;
            /* causal, and with a window keys from lim - window on */
            if (r < it.nrows && pp < nk && kt + pp < lim &&
                (p.window <= 0 || kt + pp >= lim - p.window)) {
                s = 0.0f;
                for (int d = 0; d < hd; d += 8) {
                    float kf[8];
                    krncuda::unpack8(*reinterpret_cast<const uint4 *>(&k_s[pp][d]), kf);
                    const float4 qa = *reinterpret_cast<const float4 *>(&q_s[r][d]);
                    const float4 qb = *reinterpret_cast<const float4 *>(&q_s[r][d + 4]);
                    s += qa.x * kf[0] + qa.y * kf[1] + qa.z * kf[2] + qa.w * kf[3] + qb.x * kf[4] +
                         qb.y * kf[5] + qb.z * kf[6] + qb.w * kf[7];
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
    const float vf = v_factor(p);
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
            og[t * p.ldo + (int64_t)h * hd + d] = __float2half_rn(acc[i] * vf / l_s[r]);
        } else {
            float *slot = p.partials + ((int64_t)it.part * R + r) * (hd + 2);
            slot[d] = acc[i] * vf;
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
    if (g.n_splits <= 0)
        return; /* a padding group */
    const krn_cuda_attn_item it = p.items[g.item];
    const int hd = p.head_dim, G = p.n_heads / p.n_kv_heads;
    __half *og = reinterpret_cast<__half *>(p.out);
    for (int e = threadIdx.x; e < it.nrows * hd; e += blockDim.x) {
        const int r = e / hd, d = e % hd;
        float M = -INFINITY;
        for (int j = 0; j < g.n_splits; j++) {
            const float *slot = p.partials + ((int64_t)p.items[g.item + j].part * R + r) * (hd + 2);
            M = fmaxf(M, slot[hd]);
        }
        float num = 0.0f, den = 0.0f;
        for (int j = 0; j < g.n_splits; j++) {
            const float *slot = p.partials + ((int64_t)p.items[g.item + j].part * R + r) * (hd + 2);
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

/* ---- tensor-core prefill ------------------------------------------------
 * One block of 4 warps per item of up to 64 query rows (each warp owns 16
 * rows), HDP <= 128. Per tile of 64 keys (K, V in shared memory, rows past
 * the range and dims past head_dim zero-filled):
 *   S = Q K^T   mma.sync m16n8k16, Q fragments held in registers for the
 *               whole item, K read as B fragments with 32-bit shared loads
 *               (row stride HDP + 8 halves: the 8 rows x 4 words of a
 *               fragment land in 32 different banks);
 *   online softmax on the S accumulators (each row lives in one quad of
 *               lanes: max and sum are two xor-shuffles), P rounded to fp16
 *               and reused in place as the A fragments of
 *   O += P V    mma.sync, V's B fragments assembled from 16-bit shared loads
 *               (the two keys of a register are consecutive rows).
 * Accumulators: S 8x4 and O (HDP/8)x4 fp32 registers per thread. */
using krncuda::mma_k16;
using krncuda::pack_half2;
using krncuda::pack_halves;

template <int HDP, bool T75>
__global__ void __launch_bounds__(128) attn_tc_kernel(const krn_cuda_attn_params p)
{
    constexpr int TILE = 64, KS = HDP + 8, KSTEPS = HDP / 16, NT_O = HDP / 8;
    __shared__ __align__(16) __half k_s[TILE][KS];
    __shared__ __align__(16) __half v_s[TILE][KS];

    const krn_cuda_attn_item it = p.items[blockIdx.x];
    if (it.nrows <= 0)
        return; /* a padding item */
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int hd = p.head_dim, G = p.n_heads / p.n_kv_heads;
    const int64_t kv_row = (int64_t)p.n_kv_heads * hd;
    const int32_t *bt = p.block_table + (int64_t)it.slot * p.max_blocks;
    const __half *qg = reinterpret_cast<const __half *>(p.q);
    const __half zero = __float2half_rn(0.0f);

    /* This thread's two rows (h = 0: row g, h = 1: row g + 8 of the warp). */
    int lim[2], lo[2]; /* this row's keys: [lo, lim) */
    int64_t qoff[2];
    bool live[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        int r = warp * 16 + g + 8 * h;
        int rr = it.row0 + r;
        live[h] = r < it.nrows;
        lim[h] = it.p_first + rr / G + 1;
        lo[h] = p.window > 0 ? lim[h] - p.window : INT_MIN;
        qoff[h] = (int64_t)(it.t_first + rr / G) * p.ldq + (int64_t)(it.kvh * G + rr % G) * hd;
    }
    uint32_t qa[KSTEPS][4];
#pragma unroll
    for (int ks = 0; ks < KSTEPS; ks++) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int h = i & 1, d = ks * 16 + 2 * t + (i >> 1) * 8;
            __half lo = zero, hi = zero;
            if (live[h] && d < hd) { /* hd % 8 == 0: d + 1 < hd too */
                lo = qg[qoff[h] + d];
                hi = qg[qoff[h] + d + 1];
            }
            qa[ks][i] = pack_halves(lo, hi);
        }
    }
    float o[NT_O][4];
#pragma unroll
    for (int n = 0; n < NT_O; n++)
        o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
    const float sk = p.scale * k_factor(p), vf = v_factor(p);

    const int cpr = HDP / 8; /* 16-byte chunks per shared row */
    for (int kt = it.k0; kt < it.k1; kt += TILE) {
        const int nk = min(TILE, it.k1 - kt);
        __syncthreads(); /* the previous tile's readers are done */
        for (int c = tid; c < TILE * cpr; c += 128) {
            const int pr = c / cpr, cc = c % cpr;
            uint4 kv = make_uint4(0, 0, 0, 0), vv = make_uint4(0, 0, 0, 0);
            if (pr < nk && cc * 8 < hd) {
                const int kp = kt + pr;
                const int64_t blk = bt[kp / p.block];
                const int64_t off =
                    (blk * p.block + kp % p.block) * kv_row + (int64_t)it.kvh * hd + cc * 8;
                kv = load8(p.k_pool, off, p.kv_fp8);
                vv = load8(p.v_pool, off, p.kv_fp8);
            }
            *reinterpret_cast<uint4 *>(&k_s[pr][cc * 8]) = kv;
            *reinterpret_cast<uint4 *>(&v_s[pr][cc * 8]) = vv;
        }
        __syncthreads();

        float sc[8][4];
#pragma unroll
        for (int j = 0; j < 8; j++) {
            sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.0f;
#pragma unroll
            for (int ks = 0; ks < KSTEPS; ks++) {
                const __half *kr = &k_s[j * 8 + g][ks * 16 + 2 * t];
                mma_k16<T75>(sc[j], qa[ks], *reinterpret_cast<const uint32_t *>(kr),
                             *reinterpret_cast<const uint32_t *>(kr + 8));
            }
        }
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int h = e >> 1, col = j * 8 + 2 * t + (e & 1), kp = kt + col;
                const float v =
                    (col < nk && kp < lim[h] && kp >= lo[h]) ? sc[j][e] * sk : -INFINITY;
                sc[j][e] = v;
                mx[h] = fmaxf(mx[h], v);
            }
        float corr[2], m_new[2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
            mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
            m_new[h] = fmaxf(m_run[h], mx[h]);
            corr[h] = m_new[h] == -INFINITY   ? 1.0f
                      : m_run[h] == -INFINITY ? 0.0f
                                              : expf(m_run[h] - m_new[h]);
        }
        float sum[2] = {0.0f, 0.0f};
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int h = e >> 1;
                const float v = sc[j][e] == -INFINITY ? 0.0f : expf(sc[j][e] - m_new[h]);
                sc[j][e] = v;
                sum[h] += v;
            }
#pragma unroll
        for (int h = 0; h < 2; h++) {
            sum[h] += __shfl_xor_sync(0xffffffffu, sum[h], 1);
            sum[h] += __shfl_xor_sync(0xffffffffu, sum[h], 2);
            l_run[h] = l_run[h] * corr[h] + sum[h];
            m_run[h] = m_new[h];
        }
#pragma unroll
        for (int n = 0; n < NT_O; n++) {
            o[n][0] *= corr[0];
            o[n][1] *= corr[0];
            o[n][2] *= corr[1];
            o[n][3] *= corr[1];
        }
#pragma unroll
        for (int kk = 0; kk < TILE / 16; kk++) {
            uint32_t pa[4] = {pack_half2(sc[2 * kk][0], sc[2 * kk][1]),
                              pack_half2(sc[2 * kk][2], sc[2 * kk][3]),
                              pack_half2(sc[2 * kk + 1][0], sc[2 * kk + 1][1]),
                              pack_half2(sc[2 * kk + 1][2], sc[2 * kk + 1][3])};
            const int k0r = kk * 16 + 2 * t;
#pragma unroll
            for (int n = 0; n < NT_O; n++) {
                const int d = n * 8 + g;
                uint32_t b0 = pack_halves(v_s[k0r][d], v_s[k0r + 1][d]);
                uint32_t b1 = pack_halves(v_s[k0r + 8][d], v_s[k0r + 9][d]);
                mma_k16<T75>(o[n], pa, b0, b1);
            }
        }
    }

    __half *og = reinterpret_cast<__half *>(p.out);
    constexpr int R = 64;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        if (!live[h])
            continue;
        const int r = warp * 16 + g + 8 * h;
        if (it.part < 0) {
            const int rr = it.row0 + r;
            const int64_t ooff =
                (int64_t)(it.t_first + rr / G) * p.ldo + (int64_t)(it.kvh * G + rr % G) * hd;
            const float inv = vf / l_run[h];
#pragma unroll
            for (int n = 0; n < NT_O; n++) {
                const int d = n * 8 + 2 * t;
                if (d < hd) {
                    og[ooff + d] = __float2half_rn(o[n][2 * h] * inv);
                    og[ooff + d + 1] = __float2half_rn(o[n][2 * h + 1] * inv);
                }
            }
        } else {
            float *slot = p.partials + ((int64_t)it.part * R + r) * (hd + 2);
#pragma unroll
            for (int n = 0; n < NT_O; n++) {
                const int d = n * 8 + 2 * t;
                if (d < hd) {
                    slot[d] = o[n][2 * h] * vf;
                    slot[d + 1] = o[n][2 * h + 1] * vf;
                }
            }
            if (t == 0) {
                slot[hd] = m_run[h];
                slot[hd + 1] = l_run[h];
            }
        }
    }
}

template <bool VEC>
__global__ void kv_write_kernel(const __half *k, int64_t ldk, /* batch rows */
                                const __half *v, int64_t ldv, __half *k_pool,
                                __half *v_pool, /* [rows][row_elems] */
                                int32_t row_elems,
                                const int32_t *dst) /* [n][2]: batch token, pool row */
{
    const int64_t t = dst[2 * blockIdx.x], row = dst[2 * blockIdx.x + 1];
    if (row < 0)
        return; /* a padding entry */
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

/* kv_write_kernel into E4M3 pools: eight elements a step (VEC), else one. */
template <bool VEC>
__global__ void kv_write_e4m3_kernel(const __half *k, int64_t ldk, /* batch rows */
                                     const __half *v, int64_t ldv, uint8_t *k_pool,
                                     uint8_t *v_pool, /* [rows][row_elems] */
                                     int32_t row_elems, float k_scale, float v_scale,
                                     const int32_t *dst) /* [n][2]: batch token, pool row */
{
    const int64_t t = dst[2 * blockIdx.x], row = dst[2 * blockIdx.x + 1];
    if (row < 0)
        return; /* a padding entry */
    const __half *ks = k + t * ldk, *vs = v + t * ldv;
    uint8_t *kd = k_pool + row * row_elems, *vd = v_pool + row * row_elems;
    if (VEC) {
        for (int i = threadIdx.x; i < row_elems / 8; i += blockDim.x) {
            reinterpret_cast<uint2 *>(kd)[i] =
                krnfp8::encode8(reinterpret_cast<const uint4 *>(ks)[i], k_scale);
            reinterpret_cast<uint2 *>(vd)[i] =
                krnfp8::encode8(reinterpret_cast<const uint4 *>(vs)[i], v_scale);
        }
    } else {
        for (int i = threadIdx.x; i < row_elems; i += blockDim.x) {
            kd[i] = (uint8_t)krnfp8::encode1(__half2float(ks[i]) / k_scale);
            vd[i] = (uint8_t)krnfp8::encode1(__half2float(vs[i]) / v_scale);
        }
    }
}

/* Implementations. Automatic: decode with head_dim <= 128 on the
 * tensor-core decode kernel (attn_decode.cu), prefill with head_dim <= 128
 * on the tensor-core prefill kernel, the rest (head_dim 256) on the SIMT
 * kernel: 128 threads for decode, 256 for prefill. KRN_ATTN_SIMT forces the
 * SIMT kernel; impl >= 2 one decode configuration (impl - 2). */
constexpr int kFirstDecodeImpl = 2;

/* The decode configuration impl selects for hdp, or -1 for none. */
int decode_variant_of(int hdp, bool decode, int32_t impl, bool fp8, int32_t head_dim)
{
    /* E4M3 rows are copied in 16-element chunks: a head_dim not a multiple
     * of 16 decodes on the SIMT kernel */
    if (!decode || hdp > 128 || impl == KRN_ATTN_SIMT || (fp8 && head_dim % 16))
        return -1;
    return impl == KRN_ATTN_AUTO ? krnattn::decode_variant_auto(hdp, 0, fp8)
                                 : impl - kFirstDecodeImpl;
}

/* Rows per item of the SIMT and tensor-core prefill kernels. */
int rows_legacy(int hdp, bool decode, int32_t impl)
{
    if (!decode && hdp <= 128 && impl != KRN_ATTN_SIMT)
        return 64;
    return (decode ? 128 : 256) * kAcc / hdp;
}

template <int HDP> cudaError_t launch(const krn_cuda_attn_params &p, cudaStream_t s)
{
    const int dv = decode_variant_of(HDP, p.decode, p.impl, p.kv_fp8, p.head_dim);
    if (dv >= 0)
        return krnattn::decode_launch(p, HDP, dv, s); /* combines its own splits */
    if (p.decode)
        attn_kernel<HDP, 128><<<(unsigned)p.n_items, 128, 0, s>>>(p);
    else if (HDP <= 128 && p.impl != KRN_ATTN_SIMT && krncuda::sm75_paths())
        attn_tc_kernel<HDP <= 128 ? HDP : 128, true><<<(unsigned)p.n_items, 128, 0, s>>>(p);
    else if (HDP <= 128 && p.impl != KRN_ATTN_SIMT)
        attn_tc_kernel<HDP <= 128 ? HDP : 128, false><<<(unsigned)p.n_items, 128, 0, s>>>(p);
    else
        attn_kernel<HDP, 256><<<(unsigned)p.n_items, 256, 0, s>>>(p);
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess && p.n_groups > 0)
        combine_kernel<<<(unsigned)p.n_groups, 128, 0, s>>>(p, rows_legacy(HDP, p.decode, p.impl));
    return e;
}

int hdp_of(int32_t head_dim)
{
    if (head_dim <= 0 || head_dim % 8 || head_dim > 256)
        return 0;
    return head_dim <= 64 ? 64 : head_dim <= 128 ? 128 : 256;
}

} // namespace

extern "C" int32_t krn_cuda_attn_impl_count(void)
{
    return kFirstDecodeImpl + krnattn::decode_variant_count();
}

extern "C" const char *krn_cuda_attn_impl_name(int32_t impl)
{
    if (impl == KRN_ATTN_AUTO)
        return "auto";
    if (impl == KRN_ATTN_SIMT)
        return "simt";
    return krnattn::decode_variant_name(impl - kFirstDecodeImpl);
}

extern "C" int32_t krn_cuda_attn_impl_for(int32_t head_dim, bool decode, int32_t rows,
                                          int32_t n_heads, int32_t n_kv_heads)
{
    return krn_cuda_attn_impl_for_kv(head_dim, decode, rows, n_heads, n_kv_heads, false);
}

extern "C" int32_t krn_cuda_attn_impl_for_kv(int32_t head_dim, bool decode, int32_t rows,
                                             int32_t n_heads, int32_t n_kv_heads, bool kv_fp8)
{
    const int hdp = hdp_of(head_dim);
    if (!hdp || !decode || hdp > 128 || rows <= 0 || n_kv_heads <= 0 || n_heads % n_kv_heads)
        return KRN_ATTN_AUTO;
    const int G = n_heads / n_kv_heads;
    const long long row_sets =
        (long long)rows * n_kv_heads * ((G + krnattn::kDecodeRows - 1) / krnattn::kDecodeRows);
    const int v = krnattn::decode_variant_auto(hdp, row_sets, kv_fp8);
    return v == krnattn::decode_variant_auto(hdp, 0, kv_fp8) ? KRN_ATTN_AUTO : kFirstDecodeImpl + v;
}

extern "C" inf_status_t krn_cuda_attn_config(int32_t head_dim, bool decode, int32_t impl,
                                             struct krn_cuda_attn_config *out, struct inf_err *err)
{
    return krn_cuda_attn_config_kv(head_dim, decode, impl, false, out, err);
}

extern "C" inf_status_t krn_cuda_attn_config_kv(int32_t head_dim, bool decode, int32_t impl,
                                                bool kv_fp8, struct krn_cuda_attn_config *out,
                                                struct inf_err *err)
{
    const int hdp = hdp_of(head_dim);
    if (!hdp)
        return inf_err_set(err, INF_E_UNSUPPORTED,
                           "attention: head_dim %d (the CUDA kernels take multiples of 8 up to "
                           "256)",
                           head_dim);
    if (impl < 0 || impl >= krn_cuda_attn_impl_count())
        return inf_err_set(err, INF_E_INVALID, "attention: implementation %d", impl);
    if (impl >= kFirstDecodeImpl && (!decode || hdp > 128))
        return inf_err_set(err, INF_E_UNSUPPORTED,
                           "attention: %s takes decode with head_dim <= 128 only",
                           krn_cuda_attn_impl_name(impl));
    if (impl >= kFirstDecodeImpl && !krnattn::decode_variant_runs(impl - kFirstDecodeImpl))
        return inf_err_set(err, INF_E_UNSUPPORTED, "attention: %s needs the sm_80 kernels",
                           krn_cuda_attn_impl_name(impl));
    const int dv = decode_variant_of(hdp, decode, impl, kv_fp8, head_dim);
    if (dv >= 0) {
        int ctas = 0;
        cudaError_t e = krnattn::decode_ctas_per_sm(hdp, dv, kv_fp8, &ctas);
        if (e != cudaSuccess)
            return inf_err_set(err, INF_E_DEVICE, "attention: %s", cudaGetErrorString(e));
        *out = (struct krn_cuda_attn_config){.rows = krnattn::kDecodeRows,
                                             .tile = krnattn::kDecodeTile,
                                             .split_keys = krnattn::decode_split_keys(dv),
                                             .max_splits = krnattn::kDecodeMaxSplits,
                                             .ctas_per_sm = ctas,
                                             .fused_combine = true};
        return INF_OK;
    }
    *out = (struct krn_cuda_attn_config){.rows = rows_legacy(hdp, decode, impl),
                                         .tile = hdp > 128 ? 32 : 64,
                                         .split_keys = 256,
                                         .max_splits = 1 << 20,
                                         .ctas_per_sm = 2,
                                         .fused_combine = false};
    return INF_OK;
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
        p->n_heads % p->n_kv_heads || p->block <= 0 || p->window < 0 || p->impl < 0 ||
        p->impl >= krn_cuda_attn_impl_count())
        return inf_err_set(err, INF_E_INVALID, "attention: bad counts");
    if (p->n_items == 0)
        return INF_OK;
    if (p->n_items > 0x7fffffff / 2 || ((uintptr_t)p->k_pool | (uintptr_t)p->v_pool) % 16)
        return inf_err_set(err, INF_E_UNSUPPORTED, "attention: %d items or unaligned pools",
                           p->n_items);
    if (p->impl >= kFirstDecodeImpl && (!p->decode || hdp > 128))
        return inf_err_set(err, INF_E_UNSUPPORTED,
                           "attention: %s takes decode with head_dim <= 128 only",
                           krn_cuda_attn_impl_name(p->impl));
    if (p->impl >= kFirstDecodeImpl && !krnattn::decode_variant_runs(p->impl - kFirstDecodeImpl))
        return inf_err_set(err, INF_E_UNSUPPORTED, "attention: %s needs the sm_80 kernels",
                           krn_cuda_attn_impl_name(p->impl));
    if (p->kv_fp8 && !(p->k_scale > 0.0f && p->v_scale > 0.0f))
        return inf_err_set(err, INF_E_INVALID, "attention: fp8 KV scales %g and %g",
                           (double)p->k_scale, (double)p->v_scale);
    if (decode_variant_of(hdp, p->decode, p->impl, p->kv_fp8, p->head_dim) >= 0 &&
        ((p->block & (p->block - 1)) || (p->n_groups > 0 && !p->group_done)))
        return inf_err_set(err, INF_E_UNSUPPORTED,
                           "attention: the decode kernel needs a power-of-2 block (got %d) and "
                           "arrival counters for its groups",
                           p->block);
    if (p->rope_inv_freq &&
        (decode_variant_of(hdp, p->decode, p->impl, p->kv_fp8, p->head_dim) < 0 ||
         p->head_dim != hdp || !p->rope_pos || !p->kv_map ||
         !krn_cuda_rope_kv_ok(p->q, p->ldq, p->n_heads, p->n_kv_heads, p->head_dim, p->v_new,
                              p->ldv, p->k_pool, p->v_pool)))
        return inf_err_set(err, INF_E_UNSUPPORTED,
                           "attention: RoPE fused only into the decode kernel (head_dim 64 or "
                           "128, aligned rows)");
    if ((p->q_words || p->v_words) &&
        (!p->rope_inv_freq || !p->q_words || !p->v_words || p->ldw < 1 || p->ldw % 2 ||
         ((uintptr_t)p->q_words | (uintptr_t)p->v_words) % 16))
        return inf_err_set(err, INF_E_UNSUPPORTED,
                           "attention: q/k/v words need the fused RoPE, 16-byte aligned rows "
                           "and an even stride");
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    cudaError_t e = hdp == 64    ? launch<64>(*p, s)
                    : hdp == 128 ? launch<128>(*p, s)
                                 : launch<256>(*p, s);
    if (e != cudaSuccess)
        return inf_err_set(err, INF_E_DEVICE, "attention: %s", cudaGetErrorString(e));
    return krncuda::launched("attention", err);
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
    const bool vec =
        row_elems % 8 == 0 && ldk % 8 == 0 && ldv % 8 == 0 &&
        ((uintptr_t)k | (uintptr_t)v | (uintptr_t)k_pool | (uintptr_t)v_pool) % 16 == 0;
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    const __half *kh = reinterpret_cast<const __half *>(k),
                 *vh = reinterpret_cast<const __half *>(v);
    __half *kp = reinterpret_cast<__half *>(k_pool), *vp = reinterpret_cast<__half *>(v_pool);
    if (vec)
        kv_write_kernel<true><<<(unsigned)n, 128, 0, s>>>(kh, ldk, vh, ldv, kp, vp, row_elems, dst);
    else
        kv_write_kernel<false>
            <<<(unsigned)n, 128, 0, s>>>(kh, ldk, vh, ldv, kp, vp, row_elems, dst);
    return krncuda::launched("kv_write", err);
}

extern "C" inf_status_t krn_cuda_kv_write_e4m3(const uint16_t *k, int64_t ldk, const uint16_t *v,
                                               int64_t ldv, uint8_t *k_pool, uint8_t *v_pool,
                                               int32_t row_elems, float k_scale, float v_scale,
                                               const int32_t *dst, int32_t n, void *stream,
                                               struct inf_err *err)
{
    if (n < 0 || row_elems <= 0 || !(k_scale > 0.0f) || !(v_scale > 0.0f))
        return inf_err_set(err, INF_E_INVALID, "kv_write: n=%d row=%d scales %g %g", n, row_elems,
                           (double)k_scale, (double)v_scale);
    if (n == 0)
        return INF_OK;
    const bool vec = row_elems % 8 == 0 && ldk % 8 == 0 && ldv % 8 == 0 &&
                     ((uintptr_t)k | (uintptr_t)v) % 16 == 0 &&
                     ((uintptr_t)k_pool | (uintptr_t)v_pool) % 8 == 0;
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    const __half *kh = reinterpret_cast<const __half *>(k),
                 *vh = reinterpret_cast<const __half *>(v);
    if (vec)
        kv_write_e4m3_kernel<true><<<(unsigned)n, 128, 0, s>>>(kh, ldk, vh, ldv, k_pool, v_pool,
                                                               row_elems, k_scale, v_scale, dst);
    else
        kv_write_e4m3_kernel<false><<<(unsigned)n, 128, 0, s>>>(kh, ldk, vh, ldv, k_pool, v_pool,
                                                                row_elems, k_scale, v_scale, dst);
    return krncuda::launched("kv_write", err);
}
