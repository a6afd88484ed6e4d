/*
 * int4_gemm_stream.cu — the INT4 GEMM for M <= 8 as one round of loads a
 *          block (krn_int4_gemm picks it; kernels/int4_gemm.h).
 * Why      At M <= 8 the GEMM is a weight stream. The persistent mma.sync
 *          kernel (int4_gemm.cu) streams at about the rate of a kernel that
 *          only reads, but pays a fixed latency a launch: its pipeline's
 *          prologue after the wait, the last unit's arithmetic and the
 *          split-K tail behind its last bytes (docs/gemm-notes.md, versions
 *          27, 41). krn_cuda_gemv_f16 (gemv.cu) showed the other way to
 *          stream: blocks whose whole work is one round of 16-byte loads,
 *          many of them resident an SM, so that one block's prologue and
 *          epilogue hide behind the others' loads.
 * Mapping  block = WARPS warps on one 64-column chunk of the repacked weight
 *          (int4_repack.c) and WARPS x 8 consecutive k16 steps of it
 *          (WARPS = 8: 1024 k, 32 KiB of codes); warp w takes 8 steps, each
 *          lane one 16-byte word a step: 8 loads a lane, all issued at once
 *          (ld.global.nc, no L1 allocation) before griddepcontrol.wait — the
 *          weights and their scales do not depend on the kernel before. The
 *          grid is (n_pad / 64) x ceil(k_pad / (WARPS x 128)) blocks, in
 *          weight order; no persistent loop, no shared-memory ring, no
 *          barrier until the block's sum.
 * Tokens   after the wait each lane reads its B fragments straight from
 *          global memory (L2): tokens 0-7 as the n8 B operand of the
 *          swapped mma (the weights are the A operand, 16 columns an mma),
 *          k 2c, 2c+1 and, over 16, 2c+8, 2c+9 of token g (lane = 4g + c).
 * Codes    as the mma.sync kernel's swapped path: magic fp16 halves (1024 +
 *          q, 1024 + 16 q) straight from a LOP3, the chunk's offset sums O
 *          and S from one more mma against constant rows, and at the end of
 *          each chunk (a warp's steps inside one scale group: 8, 4 or 2)
 *          acc += scale (g - O - zero S) in fp32 (int4_gemm.cu, "Codes").
 * Reduce   the block's warps meet once in shared memory; each output's sum
 *          over the warps is added into an int64 fixed-point word
 *          (acc64.cuh) with an integer atomic, so the k split sums in any
 *          order to the same bits. Three outputs:
 *            ACC  the words are the caller's (KRN_INT4_GEMM_ACC64): the
 *                 reader of C converts them; the launch zeroes another
 *                 launch's words after its wait, as the mma.sync kernel's.
 *            C    the words are the workspace's; the last block of a chunk
 *                 to arrive (one acq_rel atomic a block) converts its 64
 *                 columns, adds the bias, writes C and zeroes the words and
 *                 the counter for the next launch.
 *            GLU  the same, writing SiLU(g) u of the chunk's four runs of
 *                 8 gate + 8 up columns.
 * When     krn_int4_gemm takes it up to 4 rows where one wave of a
 *          variant's blocks holds the whole weight and fills at least 3/4
 *          of the SMs (stream_auto_variant): every load is then issued at
 *          the start. H200 (docs/gemm-notes.md, version 48), M = 1: the
 *          4096 x 4096 o projection 5.08 us against 6.48 for the persistent
 *          kernel, Llama-3's q/k/v 6.88 against 8.20; on weights that take
 *          several waves it is slower (Llama-2 gate/up 18.4 against 15.9:
 *          each new block starts its stream from nothing) and from 4 rows
 *          on its per-row atomics catch up with the gain.
 * Arch     sm_80+ (mma.sync m16n8k16); programmatic dependent launch on
 *          sm_90.
 */
#include "kernels/cuda/acc64.cuh"
#include "kernels/cuda/int4_gemm_impl.cuh"
#include "kernels/cuda/launch.cuh"

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace int4gemm
{
namespace
{

constexpr int kSteps = 8; /* k16 steps a warp: one 16-byte word a lane each */

/* Two fp16 activations (4-byte aligned) from global memory; read-only for
 * the kernel's lifetime (written by the kernel before, which is done). */
__device__ __forceinline__ uint32_t ld_pair(const half *p)
{
    return __ldg(reinterpret_cast<const unsigned int *>(p));
}

/*
 * The kernel. WARPS warps a block, registers capped so that MINB blocks
 * fit an SM (groups of 128 k or more; smaller groups hold more scales and
 * are not capped); NGW scale groups a warp's 8 steps span
 * (1: groups of 128 k or more, 2: 64, 4: 32); ZP asymmetric weights; OUT the
 * output (kStreamOutC, kStreamOutGlu, kStreamOutAcc). p.k_tiles is the
 * number of blocks along k; p.partials holds the C and GLU outputs' words
 * ([m][n_pad] int64) and p.counters their arrival counters (one a chunk).
 */
template <int WARPS, int MINB, int NGW, bool ZP, int OUT>
__global__ void __launch_bounds__(WARPS * 32, NGW == 1 ? MINB : 1)
    int4_stream_kernel(const Params p, const AccParams x)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    constexpr int kThreadsB = WARPS * 32;
    constexpr int CL = kSteps / NGW; /* steps a chunk (one scale group's share) */
    __shared__ float red[WARPS * 16 * 32];
    __shared__ int last_flag;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, c = lane & 3;
    const int j = blockIdx.x / p.k_tiles, kb = blockIdx.x - j * p.k_tiles;
    const int ksteps = p.k_pad >> 4;
    const int ks0 = (kb * WARPS + warp) * kSteps;
    /* k_pad is a multiple of 128: a warp's 8 steps are all there or none */
    const bool live = ks0 < ksteps;

    /* ---- the weights and scales: one round of loads, before the wait ---- */
    uint4 w[kSteps], sv[NGW], zv[NGW];
    if (live) {
        const uint4 *q = p.q + ((int64_t)j * ksteps + ks0) * 32 + lane;
#pragma unroll
        for (int s = 0; s < kSteps; s++)
            w[s] = krncuda::ld_stream(q + s * 32);
        const int64_t s_at = ((int64_t)j * p.groups + (ks0 >> p.gshift)) * 8 + g;
#pragma unroll
        for (int i = 0; i < NGW; i++) {
            sv[i] = __ldg(p.scales + s_at + i * 8);
            if (ZP)
                zv[i] = __ldg(p.zeros + s_at + i * 8);
        }
    }
    krncuda::pdl_wait();
    krncuda::pdl_trigger();

    /* ---- the tokens' B fragments (L2), then another launch's words ---- */
    uint32_t tb[kSteps][2];
    {
        const bool tok = live && g < p.m;
        const int k0 = ks0 * 16 + 2 * c;
        const half *ar = p.a + (int64_t)(tok ? g : 0) * p.k + k0;
#pragma unroll
        for (int s = 0; s < kSteps; s++) {
            tb[s][0] = tok && k0 + 16 * s < p.k ? ld_pair(ar + 16 * s) : 0u;
            tb[s][1] = tok && k0 + 16 * s + 8 < p.k ? ld_pair(ar + 16 * s + 8) : 0u;
        }
    }
    if constexpr (OUT == kStreamOutAcc)
        for (long long idx = (long long)blockIdx.x * kThreadsB + tid; idx < x.acc_clear_n;
             idx += (long long)gridDim.x * kThreadsB)
            x.acc_clear[idx] = 0;

    /* ---- the warp's 8 steps: element e of sacc[jj] is column 16 jj + g +
     * 8 (e >> 1), token 2c + (e & 1) ---- */
    float sacc[4][4];
#pragma unroll
    for (int jj = 0; jj < 4; jj++)
        zero4(sacc[jj]);
    if (live) {
        const uint32_t kOffsetRowsA[4] = {kMagic1024, kOne, kMagic1024, kSixteen};
        float gacc[4][4], os[4];
#pragma unroll
        for (int s = 0; s < kSteps; s++) {
            const bool first = s % CL == 0;
            const uint32_t b0 = tb[s][0], b1 = sixteenth(tb[s][1]);
            const uint32_t qw[4] = {w[s].x, w[s].y, w[s].z, w[s].w};
#pragma unroll
            for (int jj = 0; jj < 4; jj++) {
                uint32_t bf[2][2];
                magic_pair(qw[jj], bf);
                const uint32_t wa[4] = {bf[0][0], bf[1][0], bf[0][1], bf[1][1]};
                mma_chunk(gacc[jj], wa, b0, b1, first);
            }
            mma_chunk(os, kOffsetRowsA, b0, b1, first);
            if (s % CL == CL - 1) {
                const int gi = s / CL;
                const uint32_t sw[4] = {sv[gi].x, sv[gi].y, sv[gi].z, sv[gi].w};
                uint32_t zw[4] = {0u, 0u, 0u, 0u};
                if (ZP) {
                    zw[0] = zv[gi].x;
                    zw[1] = zv[gi].y;
                    zw[2] = zv[gi].z;
                    zw[3] = zv[gi].w;
                }
#pragma unroll
                for (int jj = 0; jj < 4; jj++) {
                    float sc[2], zc[2];
                    word_to_floats<ZP>(sw[jj], zw[jj], sc, zc);
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        sacc[jj][e] = scale_chunk(gacc[jj][e], os[e & 1], os[2 + (e & 1)],
                                                  zc[e >> 1], sc[e >> 1], sacc[jj][e]);
                }
            }
        }
    }

    /* ---- the block's sum of each output (warp order), into the words ---- */
#pragma unroll
    for (int jj = 0; jj < 4; jj++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            red[(warp * 16 + jj * 4 + e) * 32 + lane] = sacc[jj][e];
    __syncthreads();
    long long *const words = reinterpret_cast<long long *>(p.partials);
    for (int t = tid; t < 64 * p.m; t += kThreadsB) {
        const int tok = t >> 6, col = t & 63, r = col & 15;
        const int at = ((col >> 4) * 4 + 2 * (r >> 3) + (tok & 1)) * 32 + 4 * (r & 7) + (tok >> 1);
        float v = 0.0f;
#pragma unroll
        for (int ww = 0; ww < WARPS; ww++)
            v += red[ww * 16 * 32 + at];
        const int gcol = j * 64 + col;
        if constexpr (OUT == kStreamOutAcc) {
            if (gcol < p.n)
                krncuda::acc64_add(x.acc + (int64_t)tok * p.n + gcol, v);
        } else {
            krncuda::acc64_add(words + (int64_t)tok * p.n_pad + gcol, v);
        }
    }
    if constexpr (OUT != kStreamOutAcc) {
        /* Count the arrival (the barrier orders every thread's adds before
         * thread 0's release); the last block of the chunk finishes it. */
        __syncthreads();
        if (tid == 0) {
            const int old = krncuda::arrive_acq_rel(p.counters + j);
            const bool last = old == p.k_tiles - 1;
            if (last)
                p.counters[j] = 0; /* ready for the next launch */
            last_flag = last;
        }
        __syncthreads();
        if (!last_flag)
            return;
        if constexpr (OUT == kStreamOutGlu) {
            /* 4 runs of 8 gate columns, each followed by its 8 up columns */
            for (int t = tid; t < 32 * p.m; t += kThreadsB) {
                const int tok = t >> 5, o = t & 31;
                const int gcol = j * 64 + (o >> 3) * 16 + (o & 7);
                long long *wg = words + (int64_t)tok * p.n_pad + gcol;
                const float gv = krncuda::acc64_value(__ldcg(wg));
                const float uv = krncuda::acc64_value(__ldcg(wg + 8));
                wg[0] = 0;
                wg[8] = 0;
                store_glu1(p, tok, gcol, gv, uv);
            }
        } else {
            for (int t = tid; t < 64 * p.m; t += kThreadsB) {
                const int tok = t >> 6, gcol = j * 64 + (t & 63);
                long long *wd = words + (int64_t)tok * p.n_pad + gcol;
                float v = krncuda::acc64_value(__ldcg(wd));
                *wd = 0;
                if (gcol < p.n) {
                    if (p.bias)
                        v += __half2float(p.bias[gcol]);
                    p.c[(int64_t)tok * p.n + gcol] = __float2half_rn(v);
                }
            }
        }
    }
#else
    __trap(); /* never launched: the dispatcher takes it on sm_80 and newer only */
#endif
}

typedef void (*StreamFn)(const Params, const AccParams);

/* [NGW 1/2/4][zp][out] of one WARPS, MINB. */
template <int WARPS, int MINB> struct StreamSet {
    static StreamFn get(int ngw_i, int zp, int out)
    {
        static const StreamFn fns[3][2][3] = {{{int4_stream_kernel<WARPS, MINB, 1, false, 0>,
                                                int4_stream_kernel<WARPS, MINB, 1, false, 1>,
                                                int4_stream_kernel<WARPS, MINB, 1, false, 2>},
                                               {int4_stream_kernel<WARPS, MINB, 1, true, 0>,
                                                int4_stream_kernel<WARPS, MINB, 1, true, 1>,
                                                int4_stream_kernel<WARPS, MINB, 1, true, 2>}},
                                              {{int4_stream_kernel<WARPS, MINB, 2, false, 0>,
                                                int4_stream_kernel<WARPS, MINB, 2, false, 1>,
                                                int4_stream_kernel<WARPS, MINB, 2, false, 2>},
                                               {int4_stream_kernel<WARPS, MINB, 2, true, 0>,
                                                int4_stream_kernel<WARPS, MINB, 2, true, 1>,
                                                int4_stream_kernel<WARPS, MINB, 2, true, 2>}},
                                              {{int4_stream_kernel<WARPS, MINB, 4, false, 0>,
                                                int4_stream_kernel<WARPS, MINB, 4, false, 1>,
                                                int4_stream_kernel<WARPS, MINB, 4, false, 2>},
                                               {int4_stream_kernel<WARPS, MINB, 4, true, 0>,
                                                int4_stream_kernel<WARPS, MINB, 4, true, 1>,
                                                int4_stream_kernel<WARPS, MINB, 4, true, 2>}}};
        return fns[ngw_i][zp][out];
    }
};
static_assert(kStreamOutC == 0 && kStreamOutGlu == 1 && kStreamOutAcc == 2, "table order");

struct StreamVariant {
    const char *name;
    int warps; /* k a block = warps x 128 */
    StreamFn (*get)(int ngw_i, int zp, int out);
};
/* The compiled variants, largest block first (the automatic choice's
 * order). */
const StreamVariant kStreamVariants[] = {
    {"stream w16 k2048 b1", 16, StreamSet<16, 1>::get},
    {"stream w8 k1024 b3", 8, StreamSet<8, 3>::get},
    {"stream w4 k512 b6", 4, StreamSet<4, 6>::get},
};
constexpr int kStreamCount = (int)(sizeof kStreamVariants / sizeof kStreamVariants[0]);

} // namespace

int stream_config_count()
{
    return kStreamCount;
}

const char *stream_config_name(int i)
{
    return i >= 0 && i < kStreamCount ? kStreamVariants[i].name : nullptr;
}

int stream_k_blocks(int vi, const Params &p)
{
    const int per = kStreamVariants[vi].warps * kSteps;
    return (p.k_pad / 16 + per - 1) / per;
}

static StreamFn stream_fn(const Params &p, int vi, int out)
{
    const int ngw_i = p.gshift >= 3 ? 0 : p.gshift == 2 ? 1 : 2;
    return kStreamVariants[vi].get(ngw_i, p.zeros ? 1 : 0, out);
}

int stream_auto_variant(const Params &p, int out, int dev, int sms)
{
    static int occ_cache[16][kStreamCount][3][2][3]; /* racing writers agree */
    const int ngw_i = p.gshift >= 3 ? 0 : p.gshift == 2 ? 1 : 2;
    const int zp = p.zeros ? 1 : 0;
    const long long chunks = p.n_pad / 64;
    for (int vi = 0; vi < kStreamCount; vi++) {
        const long long blocks = chunks * stream_k_blocks(vi, p);
        int per_sm = dev >= 0 && dev < 16 ? occ_cache[dev][vi][ngw_i][zp][out] : 0;
        if (per_sm <= 0) {
            if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, stream_fn(p, vi, out),
                                                              kStreamVariants[vi].warps * 32,
                                                              0) != cudaSuccess ||
                per_sm < 1)
                return -1;
            if (dev >= 0 && dev < 16)
                occ_cache[dev][vi][ngw_i][zp][out] = per_sm;
        }
        if (blocks * 4 >= 3LL * sms && blocks <= (long long)sms * per_sm)
            return vi;
    }
    return -1;
}

cudaError_t launch_stream(Params p, const AccParams &x, int vi, int out, cudaStream_t stream)
{
    const int warps = kStreamVariants[vi].warps;
    p.k_tiles = stream_k_blocks(vi, p);
    p.n_tiles = p.n_pad / 64;
    const StreamFn fn = stream_fn(p, vi, out);
    const long long grid = (long long)p.n_tiles * p.k_tiles;
    return krncuda::launch_pdl(fn, dim3((unsigned)grid), dim3(warps * 32), 0, stream, p, x);
}

} // namespace int4gemm
