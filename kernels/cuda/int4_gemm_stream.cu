/*
 * int4_gemm_stream.cu — the INT4 GEMM for M <= 8 as one round of loads a
 *          block (krn_int4_gemm picks it; kernels/int4_gemm.h).
 * Why      At M <= 8 the GEMM is a weight stream. The persistent mma.sync
 *          kernel (int4_gemm_sm80.cu) streams at about the rate of a kernel
 *          that only reads, but pays a fixed latency a launch: its
 *          pipeline's prologue after the wait, the last unit's arithmetic
 *          and the split-K tail behind its last bytes. krn_cuda_gemv_f16
 *          (gemv.cu) showed the other way to stream: blocks whose whole
 *          work is one round of 16-byte loads, many of them resident an SM,
 *          so that one block's prologue and epilogue hide behind the
 *          others' loads.
 * Mapping  block = WARPS warps on one 64-column chunk of the repacked weight
 *          (int4_repack.c) and WARPS x 8 consecutive k16 steps of it
 *          (WARPS = 8: 1024 k, 32 KiB of codes); warp w takes 8 steps, each
 *          lane one 16-byte word a step: 8 loads a lane, all issued at once
 *          (ld.global.nc, no L1 allocation) before griddepcontrol.wait — the
 *          weights and their scales do not depend on the kernel before. The
 *          grid is (n_pad / 64) x ceil(k_pad / (WARPS x 128)) blocks, in
 *          weight order; no persistent loop, no shared-memory ring, no
 *          barrier until the block's sum. Variants (kStreamVariants): 16
 *          warps (one block an SM at 128 registers), 8 (three at 80), 4
 *          (six at 80); forced configurations run up to 8 rows.
 * Tokens   after the wait each lane reads its B fragments straight from
 *          global memory (L2): tokens 0-7 as the n8 B operand of the
 *          swapped mma (the weights are the A operand, 16 columns an mma),
 *          k 2c, 2c+1 and, over 16, 2c+8, 2c+9 of token g (lane = 4g + c).
 * Codes    as the mma.sync kernel's swapped path: magic fp16 halves (1024 +
 *          q, 1024 + 16 q) straight from a LOP3, the chunk's offset sums O
 *          and S from one more mma against constant rows, and at the end of
 *          each chunk (a warp's steps inside one scale group: 8, 4 or 2)
 *          acc += scale (g - O - zero S) in fp32 (int4_gemm_sm80.cu, "Codes").
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
 * When     the plan takes it up to 4 rows where one wave of a variant's
 *          blocks holds the whole weight and fills at least 3/4 of the SMs
 *          (kernels/int4_gemm_policy.c): every load is then issued at the
 *          start. H200, M = 1: the 4096 x 4096 o projection 5.08 us against
 *          6.48 for the persistent kernel, Llama-3's q/k/v 6.88 against
 *          8.20; on weights that take several waves it is slower (Llama-2
 *          gate/up 18.4 against 15.9: each new block starts its stream from
 *          nothing) and from 4 rows on its per-row atomics catch up with
 *          the gain.
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

/* Tokens 0-7 as the swapped mma's B fragments for the 8 k16 steps from
 * ks0 (lane = 4 g + c: k 2c, 2c+1 and 2c+8, 2c+9 of token g), zero past M,
 * past k and for a warp without steps (live false). [[maybe_unused]] here
 * and below: the sm_75 pass of this file compiles the kernel body out. */
[[maybe_unused]] __device__ __forceinline__ void load_tokens(const Params &p, int ks0, bool live,
                                                             uint32_t (&tb)[kSteps][2])
{
    const int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const bool tok = live && g < p.m;
    const int k0 = ks0 * 16 + 2 * c;
    const half *ar = p.a + (int64_t)(tok ? g : 0) * p.k + k0;
#pragma unroll
    for (int s = 0; s < kSteps; s++) {
        tb[s][0] = tok && k0 + 16 * s < p.k ? ld_pair(ar + 16 * s) : 0u;
        tb[s][1] = tok && k0 + 16 * s + 8 < p.k ? ld_pair(ar + 16 * s + 8) : 0u;
    }
}

/* One warp's 8 k16 steps of a 64-column chunk added into sacc: w the lane's
 * code words, tb the tokens, sv / zv the lane's scales and zeros of the NGW
 * groups the steps span. Element e of sacc[jj] is column 16 jj + g + 8 (e >>
 * 1), token 2c + (e & 1). */
template <int NGW, bool ZP>
__device__ __forceinline__ void warp_steps(const uint4 (&w)[kSteps],
                                           const uint32_t (&tb)[kSteps][2], const uint4 (&sv)[NGW],
                                           const uint4 (&zv)[NGW], float (&sacc)[4][4])
{
    constexpr int CL = kSteps / NGW; /* steps a chunk (one scale group's share) */
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
                    sacc[jj][e] = scale_chunk(gacc[jj][e], os[e & 1], os[2 + (e & 1)], zc[e >> 1],
                                              sc[e >> 1], sacc[jj][e]);
            }
        }
    }
}

/* The block's sums of chunk j (every warp's sacc, summed in warp order
 * through red: WARPS x 512 floats) added into the words: the caller's
 * (ACC) or the workspace's. Called by every thread; begins with a barrier
 * after the red stores, so red may be reused after the next barrier. */
template <int WARPS, int OUT>
__device__ __forceinline__ void add_words(const Params &p, const AccParams &x, int j,
                                          const float (&sacc)[4][4], float *red)
{
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
#pragma unroll
    for (int jj = 0; jj < 4; jj++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            red[(warp * 16 + jj * 4 + e) * 32 + lane] = sacc[jj][e];
    __syncthreads();
    long long *const words = reinterpret_cast<long long *>(p.partials);
    for (int t = tid; t < 64 * p.m; t += WARPS * 32) {
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
}

/* C and GLU outputs, after add_words: count this block's arrival on chunk
 * j's counter (the barrier orders every thread's adds before thread 0's
 * release); the last of the `arrivals` blocks converts the chunk's words,
 * zeroes them and the counter, and writes C (+ bias) or SiLU(g) u of its
 * four runs of 8 gate + 8 up columns. Called by every thread. */
template <int WARPS, int OUT>
__device__ __forceinline__ void finish_chunk(const Params &p, int j, int arrivals, int *last_flag)
{
    const int tid = threadIdx.x;
    long long *const words = reinterpret_cast<long long *>(p.partials);
    __syncthreads();
    if (tid == 0) {
        const int old = krncuda::arrive_acq_rel(p.counters + j);
        const bool last = old == arrivals - 1;
        if (last)
            p.counters[j] = 0; /* ready for the next launch */
        *last_flag = last;
    }
    __syncthreads();
    if (!*last_flag)
        return;
    if constexpr (OUT == kStreamOutGlu) {
        for (int t = tid; t < 32 * p.m; t += WARPS * 32) {
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
        for (int t = tid; t < 64 * p.m; t += WARPS * 32) {
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

/* ACC: zero another launch's words (already read), spread over the grid. */
[[maybe_unused]] __device__ __forceinline__ void clear_words(const AccParams &x)
{
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < x.acc_clear_n;
         idx += stride)
        x.acc_clear[idx] = 0;
}

typedef void (*StreamFn)(const Params, const AccParams);

/*
 * The one-round kernel. WARPS warps a block, registers capped so that MINB
 * blocks fit an SM (groups of 128 k or more; smaller groups hold more
 * scales and are not capped); NGW scale groups a warp's 8 steps span (1:
 * groups of 128 k or more, 2: 64, 4: 32); ZP asymmetric weights; OUT the
 * output (kStreamOutC, kStreamOutGlu, kStreamOutAcc). p.k_tiles is the
 * number of blocks along k; p.partials holds the C and GLU outputs' words
 * ([m][n_pad] int64) and p.counters their arrival counters (one a chunk).
 */
template <int WARPS, int MINB, int NGW, bool ZP, int OUT>
__global__ void __launch_bounds__(WARPS * 32, NGW == 1 ? MINB : 1)
    int4_stream_kernel(const Params p, const AccParams x)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    __shared__ float red[WARPS * 16 * 32];
    __shared__ int last_flag;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2;
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

    /* ---- the tokens (L2), another launch's words, the warp's steps ---- */
    uint32_t tb[kSteps][2];
    load_tokens(p, ks0, live, tb);
    if constexpr (OUT == kStreamOutAcc)
        clear_words(x);
    float sacc[4][4];
#pragma unroll
    for (int jj = 0; jj < 4; jj++)
        zero4(sacc[jj]);
    if (live)
        warp_steps<NGW, ZP>(w, tb, sv, zv, sacc);

    /* ---- the block's sum of each output (warp order), into the words ---- */
    add_words<WARPS, OUT>(p, x, j, sacc, red);
    if constexpr (OUT != kStreamOutAcc)
        finish_chunk<WARPS, OUT>(p, j, p.k_tiles, &last_flag);
#else
    __trap(); /* never launched: the dispatcher takes it on sm_80 and newer only */
#endif
}

/* The kernels of one variant by (NGW, ZP, OUT). */
template <int WARPS, int MINB> struct OneRound {
    template <int NGW, bool ZP, int OUT>
    static constexpr StreamFn fn = int4_stream_kernel<WARPS, MINB, NGW, ZP, OUT>;
};
#define I4S_OUTS(K, NGW, ZP)                                                                       \
    {                                                                                              \
        K::template fn<NGW, ZP, 0>, K::template fn<NGW, ZP, 1>, K::template fn<NGW, ZP, 2>         \
    }
#define I4S_NGW(K, NGW)                                                                            \
    {                                                                                              \
        I4S_OUTS(K, NGW, false), I4S_OUTS(K, NGW, true)                                            \
    }
/* [NGW 1/2/4][zp][out] of variant K. */
template <class K> StreamFn pick(int ngw_i, int zp, int out)
{
    static const StreamFn fns[3][2][3] = {I4S_NGW(K, 1), I4S_NGW(K, 2), I4S_NGW(K, 4)};
    return fns[ngw_i][zp][out];
}
#undef I4S_NGW
#undef I4S_OUTS
static_assert(kStreamOutC == 0 && kStreamOutGlu == 1 && kStreamOutAcc == 2, "table order");

/* The variants: KRN_INT4_GEMM_STREAM_CONFIGS (kernels/int4_gemm_configs.h)
 * instantiated in its order. */
struct StreamVariant {
    int warps; /* k a block = warps x 128 */
    StreamFn (*get)(int ngw_i, int zp, int out);
};
#define I4S_VARIANT(ID, NAME, WARPS, MINB) {WARPS, pick<OneRound<WARPS, MINB>>},
const StreamVariant kStreamVariants[] = {KRN_INT4_GEMM_STREAM_CONFIGS(I4S_VARIANT)};
#undef I4S_VARIANT
constexpr int kStreamCount = (int)(sizeof kStreamVariants / sizeof kStreamVariants[0]);
static_assert(kStreamCount == KRN_INT4_GEMM_STREAM_COUNT, "one variant per listed configuration");

/* The NGW table index of p's scale groups: 1 group a warp's 8 steps (groups
 * of 128 k or more), 2 (64) or 4 (32). */
int ngw_index(const Params &p)
{
    return p.gshift >= 3 ? 0 : p.gshift == 2 ? 1 : 2;
}

} // namespace

/* Residency of every kernel (no dynamic shared memory to raise). */
cudaError_t stream_prepare(krn_cuda_device *d)
{
    for (int vi = 0; vi < kStreamCount; vi++)
        for (int g = 0; g < 3; g++)
            for (int zp = 0; zp < 2; zp++)
                for (int out = 0; out < 3; out++) {
                    int n = 0;
                    const cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                        &n, kStreamVariants[vi].get(g, zp, out), kStreamVariants[vi].warps * 32, 0);
                    if (e != cudaSuccess)
                        return e;
                    d->int4_gemm.stream[vi][g][zp][out] = (uint8_t)(n > 255 ? 255 : n);
                }
    return cudaSuccess;
}

/* p.n_tiles (64-column chunks) and p.k_tiles (blocks along k) are the
 * choice's: the grid is both, in weight order. */
cudaError_t launch_stream(const Params &p, const AccParams &x, int vi, int out, bool pdl,
                          cudaStream_t stream)
{
    const int warps = kStreamVariants[vi].warps;
    const long long grid = (long long)p.n_tiles * p.k_tiles;
    return krncuda::launch_ex(pdl, kStreamVariants[vi].get(ngw_index(p), p.zeros ? 1 : 0, out),
                              dim3((unsigned)grid), dim3(warps * 32), 0, stream, p, x);
}

} // namespace int4gemm
