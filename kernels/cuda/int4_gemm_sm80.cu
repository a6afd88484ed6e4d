/*
 * int4_gemm_sm80.cu — the INT4 GEMM's mma.sync family (sm_80 and newer):
 *          C[M,N] = A[M,K] · dequant(W)[N,K]ᵀ (+ bias); A, C fp16 row-major.
 * Layout   W repacked by krn_int4_gemm_repack(): 512-byte chunks of (64 columns,
 *          16 k); lane l's 16-byte word holds the 32 codes of its eight
 *          m16n8k16 B fragments, so one LDS.128 feeds eight mma (see
 *          int4_repack.c for the nibble order).
 * Shapes   any M >= 1 (tiles of 16/32/64 rows), any N, K (padded at repack to
 *          256 / 128; A is read as zero past K, C written only inside N).
 * Mapping  grid = #SMs x resident blocks (persistent), block = 256 threads =
 *          NWN warps along N x KW warps along K; a warp owns 16/32/64 columns
 *          (NF n8 fragments: all or part of a lane's 16-byte W word) and KPW
 *          consecutive k16 steps of each k tile. The work is the list of units
 *          (m tile, n tile, k tile) in the order n tile, m tile, k tile; block b
 *          takes the contiguous stripe [b*U/G, (b+1)*U/G), so every block gets
 *          the same number of k tiles (±1) whatever the shape: all 132 SMs stay
 *          busy for every N, M and K, small N included. With fewer output
 *          tiles than resident blocks the grid is tiles x s instead
 *          (launch_grid in kernels/int4_gemm_policy.c), so that each stripe
 *          lies inside one tile.
 * Reduce   A tile finished inside one block is written straight to C. A tile
 *          shared by several blocks (a stripe boundary falls inside it) is
 *          split-K: each writes its fp32 partial to the workspace, the last
 *          to arrive (one acq_rel atomic per block) sums them in block order —
 *          deterministic, loads eight contributors at a time — adds the bias,
 *          writes C and resets the counter for the next launch.
 * Pipeline STAGES-deep cp.async ring of (W tile, A tile, scales, zeros), all
 *          16-byte cp.async.cg (no L1 allocation); A is staged
 *          in shared memory once per k tile and reused by every warp along N.
 *          The dequantization of a k step is plain ALU work that the
 *          scheduler interleaves with the tensor-core mma of the step
 *          before: the KPW k steps of a warp are unrolled together.
 * Small M  a 16-row tile holding at most 8 rows (M <= 8) swaps the mma
 *          operands: the weights are the A fragment (16 columns) and the
 *          tokens the n8 B fragment, half the mma (SW below). Not for tiny
 *          weights (the policy's TINY_TILES), which keep one arithmetic at
 *          every M.
 * Codes    Usual order: each fp16 pair is (code - zero) * scale exactly as
 *          the CPU reference rounds it: a LOP3 that ORs two nibbles into the
 *          mantissa of 1024.0, an exact subtraction (or FMA with 1/16 for the
 *          nibbles at bits 4-7), a multiply by the scale (dequant_pair: 13
 *          instructions per eight codes).
 *          Swapped (M <= 8): no fp16 weight is formed. The LOP3 alone gives
 *          the exact fp16 1024 + q (nibbles at bits 0-3 of a half: the k 2c,
 *          2c+1 pair of a fragment) or 1024 + 16 q (bits 4-7: the k 2c+8,
 *          2c+9 pair), 5 instructions per eight codes; the activations of
 *          the second pair are multiplied by 1/16 (exact) as they are
 *          loaded, so an mma over a chunk of k steps (a warp's steps inside
 *          one scale group) sums
 *              g = sum_k a_k q_k + O,  O = 1024 sum_{k%16<8} a_k
 *                                        + 1024 sum_{k%16>=8} a_k / 16
 *          where a_k is the activation as the mma sees it (times 16 again
 *          for the second pair). One more mma per k step, against constant
 *          rows (kOffsetRowsA), gives O and S = sum_k a_k for every token.
 *          At the end of the chunk each output takes
 *          acc += scale * (g - O - zero * S), three fp32 operations, so the
 *          result is scale * sum_k a_k (q_k - zero) with exact products. The
 *          chunk sums start from the first mma's zero accumulator input
 *          (mma_16816_z).
 * GLU      KRN_INT4_GEMM_GLU (kernel template GLU, the automatic
 *          configurations only): a thread's n8 fragments 2j and 2j + 1 are a
 *          gate and an up column of the same output (the weight's rows come
 *          in runs of 8 + 8), so the stores write SiLU(g) * u of the pair
 *          (store_frags_glu; the split-K sum takes a gate quad with the up
 *          quad two on). Every other kernel is compiled exactly as without.
 * ACC64    KRN_INT4_GEMM_ACC64 (kernel template ACC, the automatic 16-row
 *          configurations only): finish_tile adds every block's sums into
 *          int64 fixed-point words (acc64.cuh) instead of the split-K
 *          partials, arrival and last arriver; the reader of C converts
 *          them (krn_int4_gemm_acc_reduce, the RMSNorm's form), and the
 *          next such launch zeroes them (acc_clear) after its wait. With
 *          GLU too the same kernel runs (the words are the gate and up
 *          sums); krn_int4_gemm_acc_reduce_glu writes SiLU(g) u and zeroes
 *          them.
 * Numerics fp32 accumulate; relative error ~1e-4 (fp16 output rounding).
 *          The usual order uses the CPU reference's fp16 weights; the
 *          swapped path exact products scaled in fp32 per chunk, which
 *          differ from them by that rounding.
 * Launch   programmatic dependent launch on sm_90: the first weight stages
 *          are issued before griddepcontrol.wait, so in a stream (or graph) of
 *          kernels the weight stream starts while the previous kernel drains.
 * Configs  the list KRN_INT4_GEMM_SM80_CONFIGS (kernels/int4_gemm_configs.h),
 *          instantiated below in its order; which one a launch takes is the
 *          plan's (kernels/int4_gemm_policy.c), launched by krn_int4_gemm
 *          (int4_gemm.cu).
 * Arch     sm_80+ (mma.sync m16n8k16, cp.async, ldmatrix) — runs on Hopper;
 *          int4_gemm_sm75.cu is the Turing fallback, sm90/int4_gemm_sm90.cu
 *          the Hopper wgmma kernel, int4_gemm_stream.cu the one-round stream
 *          kernel.
 */
#include "kernels/cuda/acc64.cuh"
#include "kernels/cuda/int4_gemm_impl.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda_device.h"
#include "kernels/int4_gemm_configs.h"

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace int4gemm
{
namespace
{

constexpr int kThreads = 256;

__device__ __forceinline__ uint32_t smem_addr(const void *p)
{
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

/* The device helpers here are [[maybe_unused]]: the sm_75 pass of this file
 * compiles the kernel bodies out (they run on sm_80 and newer only). */

/* 16-byte async copy; src_bytes 0 fills the destination with zeros (rows past
 * M, columns past K) without touching global memory. */
[[maybe_unused]] __device__ __forceinline__ void cp_async16_zfill(void *dst, const void *src,
                                                                  bool pred)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
                 "r"(pred ? 16 : 0));
}

/* The weights are read exactly once per launch. They are copied with plain
 * cp.async.cg (L1 bypassed), without an L2 evict-first policy
 * (cp.async ... L2::cache_hint with createpolicy): ptxas 13.0 encodes the
 * constant policy descriptor of the in-loop copy as an odd uniform-register
 * pair (desc[UR1]), which faults with "illegal instruction" on the H200. The
 * weights still pass through L2 once, and the rotation in bench/gemm keeps
 * them from being L2 hits. */
[[maybe_unused]] __device__ __forceinline__ void cp_async16(void *dst, const void *src)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(dst)), "l"(src));
}

[[maybe_unused]] __device__ __forceinline__ void cp_async_commit()
{
    asm volatile("cp.async.commit_group;\n" ::);
}

template <int N> __device__ __forceinline__ void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

[[maybe_unused]] __device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

[[maybe_unused]] __device__ __forceinline__ void ldsm_x2(uint32_t (&r)[2], const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(smem_addr(p)));
}

/* Workspace slot of block b's partial of tile t: each block has at most two
 * shared tiles, the one its stripe starts in (slot 2b) and the one it ends in
 * (slot 2b + 1). */
[[maybe_unused]] __device__ __forceinline__ int partial_slot(int b, int t, const Params &p,
                                                             int grid)
{
    const int first_tile = unit_start(b, p.units, grid) / p.k_tiles;
    return t == first_tile ? 2 * b : 2 * b + 1;
}

/* Tile geometry of one configuration, shared by the kernel and the host.
 *   MB   16-row m blocks per tile (BM = 16 MB)
 *   NWN  warps along N; the other KW = 8 / NWN warps split the k tile
 *   NF   n8 fragments per warp (a warp owns 8 NF columns: 64, 32 or 16)
 *   KPW  consecutive k16 steps per warp per k tile
 * A 64-column chunk of the repacked weights is shared by 8 / NF warps, each
 * taking NF / 2 of the four words of a lane's 16-byte piece. */
template <int MB, int NWN, int NF, int KPW, int STAGES> struct Tile {
    static constexpr int KW = 8 / NWN;
    static constexpr int BM = 16 * MB;
    static constexpr int BN = 8 * NF * NWN;
    static constexpr int NCH = BN / 64; /* 64-column chunks */
    static constexpr int KSTEPS = KPW * KW;
    static constexpr int BK = 16 * KSTEPS;
    static constexpr int B_BYTES = KSTEPS * NCH * 512;
    static constexpr int W_ITERS = B_BYTES / (16 * kThreads);
    static constexpr int A_BYTES = BM * BK * 2;
    static constexpr int S_BYTES = (KSTEPS / 2) * NCH * 128; /* <= KSTEPS/2 groups */
    static constexpr int STAGE_BYTES = B_BYTES + A_BYTES + 2 * S_BYTES;
    static constexpr int RED_BYTES = (KW - 1) * NWN * MB * NF * 32 * 16;
    static constexpr int SMEM = STAGES * STAGE_BYTES + RED_BYTES + 16;
    static_assert(NWN * KW == 8 && BN % 64 == 0, "8 warps, whole chunks");
    static_assert(W_ITERS >= 1 && B_BYTES % (16 * kThreads) == 0, "whole W copies");
    static_assert(BK == 64 || BK == 128, "k_pad is a multiple of 128");
    static_assert((KSTEPS / 2) * NCH * 8 <= kThreads, "one scale copy per thread");
    static_assert(KPW % 2 == 0, "step pairs never straddle a group");
};

/* Load NW consecutive 32-bit words from shared memory (one 4/8/16-byte LDS). */
template <int NW> __device__ __forceinline__ void lds_words(const uint32_t *p, uint32_t (&w)[NW])
{
    if (NW == 4) {
        const uint4 v = *reinterpret_cast<const uint4 *>(p);
        w[0] = v.x;
        w[1] = v.y;
        w[2] = v.z;
        w[3] = v.w;
    } else if (NW == 2) {
        const uint2 v = *reinterpret_cast<const uint2 *>(p);
        w[0] = v.x;
        w[1] = v.y;
    } else {
        w[0] = p[0];
    }
}

/* End of a block's part of output tile (m_tile, n_tile): sum the KW warps
 * sharing each column slice (shared memory, warp order), then either write C
 * (the block did the whole k range) or publish an fp32 partial and, if last
 * to arrive, reduce every contributor's partial in block order into C; with
 * ACC (KRN_INT4_GEMM_ACC64) add the block's sums into x.acc instead, with no
 * arrival. Leaves acc zeroed. Called by all threads of the block. */
template <int MB, int NWN, int NF, int KPW, int STAGES, bool GLU, bool ACC>
__device__ __forceinline__ void
finish_tile(const Params &p, const AccParams &x, float (&acc)[MB][NF][4], float4 *red,
            volatile int *flag, int m_tile, int n_tile, int b, int grid)
{
    using T = Tile<MB, NWN, NF, KPW, STAGES>;
    constexpr int BM = T::BM, BN = T::BN, KW = T::KW;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int nw = warp % NWN, kw = warp / NWN;
    if (KW > 1) {
        if (kw > 0) {
#pragma unroll
            for (int mb = 0; mb < MB; mb++)
#pragma unroll
                for (int f = 0; f < NF; f++)
                    red[((((kw - 1) * NWN + nw) * MB + mb) * NF + f) * 32 + lane] =
                        make_float4(acc[mb][f][0], acc[mb][f][1], acc[mb][f][2], acc[mb][f][3]);
        }
        __syncthreads();
        if (kw == 0) {
#pragma unroll 1
            for (int w2 = 1; w2 < KW; w2++)
#pragma unroll
                for (int mb = 0; mb < MB; mb++)
#pragma unroll
                    for (int f = 0; f < NF; f++) {
                        const float4 v =
                            red[((((w2 - 1) * NWN + nw) * MB + mb) * NF + f) * 32 + lane];
                        acc[mb][f][0] += v.x;
                        acc[mb][f][1] += v.y;
                        acc[mb][f][2] += v.z;
                        acc[mb][f][3] += v.w;
                    }
        }
    }
    const int t = n_tile * p.m_tiles + m_tile;
    const int rows = min(BM, p.m - m_tile * BM);
    const int cf = unit_block(t * p.k_tiles, p.units, grid);
    const int cl = unit_block((t + 1) * p.k_tiles - 1, p.units, grid);
    const int g8 = lane >> 2, c2 = (lane & 3) * 2;
    const int col0 = nw * NF * 8 + c2;
    if constexpr (ACC) {
        /* Fixed-point sums: every contributor adds its part, in any order,
         * and the reader of C converts them (no arrival, no last arriver). */
        if (kw == 0) {
#pragma unroll
            for (int mb = 0; mb < MB; mb++)
#pragma unroll
                for (int f = 0; f < NF; f++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const int r = mb * 16 + g8 + 8 * h;
                        const int col = n_tile * BN + col0 + f * 8;
                        long long *dst = x.acc + (int64_t)(m_tile * BM + r) * p.n + col;
                        if (r < rows && col < p.n)
                            krncuda::acc64_add(dst, acc[mb][f][2 * h]);
                        if (r < rows && col + 1 < p.n)
                            krncuda::acc64_add(dst + 1, acc[mb][f][2 * h + 1]);
                    }
        }
    } else if (cf == cl) {
        /* The whole k range was ours: straight to C. */
        if (kw == 0 && GLU) {
#pragma unroll
            for (int mb = 0; mb < MB; mb++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int r = mb * 16 + g8 + 8 * h;
                    if (r < rows)
                        store_frags_glu<NF>(p, m_tile * BM + r, n_tile * BN + col0, acc[mb], h);
                }
        } else if (kw == 0) {
#pragma unroll
            for (int mb = 0; mb < MB; mb++)
#pragma unroll
                for (int f = 0; f < NF; f++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const int r = mb * 16 + g8 + 8 * h;
                        if (r < rows)
                            store_pair(p, m_tile * BM + r, n_tile * BN + col0 + f * 8,
                                       acc[mb][f][2 * h], acc[mb][f][2 * h + 1]);
                    }
        }
    } else {
        const int64_t tile_elems = (int64_t)p.slot_rows * BN;
        if (kw == 0) {
            float *dst = p.partials + partial_slot(b, t, p, grid) * tile_elems;
#pragma unroll
            for (int mb = 0; mb < MB; mb++)
#pragma unroll
                for (int f = 0; f < NF; f++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const int r = mb * 16 + g8 + 8 * h;
                        if (r < rows)
                            __stcg(reinterpret_cast<float2 *>(dst + r * BN + col0 + f * 8),
                                   make_float2(acc[mb][f][2 * h], acc[mb][f][2 * h + 1]));
                    }
        }
        /* Publish the partial, then count the arrival. The counter of a shared
         * tile lives at its first contributor's slot index, so the counter
         * region is small and fixed whatever M and the configuration. */
        __syncthreads();
        if (tid == 0) {
            int *counter = p.counters + partial_slot(cf, t, p, grid);
            const int old = krncuda::arrive_acq_rel(counter);
            const bool last = old == cl - cf;
            if (last)
                *counter = 0; /* ready for the next launch */
            *flag = last;
        }
        __syncthreads();
        if (*flag) {
            /* Sum every contributor's partial in block order: the result does
             * not depend on which block arrived last. Contributor bb > cf
             * starts its stripe inside tile t, so its partial is in its first
             * slot (2 bb); only cf's slot needs computing. The loads go out
             * eight at a time (independent), then are added in order: a tile
             * split over many blocks must not cost one L2 round trip each. */
            const float4 *base_cf = reinterpret_cast<const float4 *>(
                p.partials + partial_slot(cf, t, p, grid) * tile_elems);
            const int64_t stride4 = 2 * tile_elems / 4; /* slot 2bb to 2bb + 2 */
            const float4 *base_next =
                reinterpret_cast<const float4 *>(p.partials + 2 * (int64_t)(cf + 1) * tile_elems);
            const int quads = rows * BN / 4;
            auto sum_quad = [&](int q) {
                float4 sum = __ldcg(base_cf + q);
                const int more = cl - cf;
                for (int bb = 0; bb < more; bb += 8) {
                    /* past the last contributor: + 0, which changes nothing */
                    float4 v[8];
#pragma unroll
                    for (int u = 0; u < 8; u++)
                        v[u] = bb + u < more ? __ldcg(base_next + (bb + u) * stride4 + q)
                                             : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
                    for (int u = 0; u < 8; u++) {
                        sum.x += v[u].x;
                        sum.y += v[u].y;
                        sum.z += v[u].z;
                        sum.w += v[u].w;
                    }
                }
                return sum;
            };
            for (int q = tid; q < quads; q += kThreads) {
                const int r = q * 4 / BN, col = q * 4 % BN;
                const int grow = m_tile * BM + r, gcol = n_tile * BN + col;
                if constexpr (GLU) {
                    /* a gate quad (col % 16 < 8) takes its up quad, two
                     * quads on; the up quads are done with it */
                    if (q & 2)
                        continue;
                    const float4 g = sum_quad(q), u = sum_quad(q + 2);
                    store_glu(p, grow, gcol, g.x, g.y, u.x, u.y);
                    store_glu(p, grow, gcol + 2, g.z, g.w, u.z, u.w);
                } else {
                    const float4 sum = sum_quad(q);
                    store_pair(p, grow, gcol, sum.x, sum.y);
                    store_pair(p, grow, gcol + 2, sum.z, sum.w);
                }
            }
        }
    }
#pragma unroll
    for (int mb = 0; mb < MB; mb++)
#pragma unroll
        for (int f = 0; f < NF; f++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                acc[mb][f][e] = 0.0f;
}

/* Swapped operands (SW, M <= 8): the warp's NW = NF / 2 accumulators of
 * W (16 columns) x tokens (8): element e of word j holds column 16 j + g +
 * 8 (e >> 1), token 2 c + (e & 1) (lane = 4 g + c). Rewritten into the
 * usual layout (fragment f: token g, columns 8 f + 2 c, + 1 in elements 0
 * and 1; tokens 8-15 in elements 2 and 3, which do not exist when M <= 8
 * and are zero): the value for (token g, column 8 f + 2 c + e) sits in
 * lane 4 (2 c + e) + g / 2, element 2 (f & 1) + (g & 1). Once per tile. */
template <int NF>
__device__ __forceinline__ void unswap_acc(const float (&sa)[NF / 2][4], float (&acc)[1][NF][4])
{
    const int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
#pragma unroll
    for (int f = 0; f < NF; f++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int src = 4 * (2 * c + e) + (g >> 1);
            const float v0 = __shfl_sync(0xffffffffu, sa[f >> 1][2 * (f & 1)], src);
            const float v1 = __shfl_sync(0xffffffffu, sa[f >> 1][2 * (f & 1) + 1], src);
            acc[0][f][e] = (g & 1) ? v1 : v0;
            acc[0][f][2 + e] = 0.0f;
        }
}

/*
 * The kernel. Template parameters: MB, NWN, NF, KPW (see Tile), and
 *   STAGES  depth of the cp.async ring
 *   BPS     blocks per SM the register allocation is capped for
 *   ZP      asymmetric weights (zero points read from the zero section)
 *   AVEC    rows of A are 16-byte aligned: cp.async for A, else element loads
 *   SW      swapped operands, for one 16-row tile holding at most 8 rows
 *           (MB == 1, M <= 8): the weights are the mma A operand (a lane's
 *           word j is the A fragment of columns 16 j .. 16 j + 15, as in the
 *           sm_90a kernel) and the tokens the n8 B operand, so one m16n8k16
 *           covers 16 columns instead of 8: half the mma of the usual order,
 *           whose 16-row A tile is at most half used there; and the codes
 *           as magic halves with the scale applied per chunk (see Codes)
 * Each warp owns BM x 8 NF outputs and KPW consecutive k16 steps of every k
 * tile; the KW warps sharing a column range split the k tile and are summed
 * through shared memory when a tile ends. The scale-group constants (usual
 * order) and the chunk scaling (SW) come once per warp per k tile, again at
 * a group boundary inside the warp's steps (groups of 32 only), so larger
 * KPW amortizes them and the per-tile bookkeeping over more weights.
 */
template <int MB, int NWN, int NF, int KPW, int STAGES, int BPS, bool ZP, bool AVEC, bool SW,
          bool GLU, bool ACC>
__global__ void __launch_bounds__(kThreads, BPS)
    int4_gemm_kernel(const Params p, const AccParams x) /* by value: sizes, pointers, tiling */
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    static_assert(!SW || MB == 1, "swapped operands: one 16-row tile");
    using T = Tile<MB, NWN, NF, KPW, STAGES>;
    constexpr int BM = T::BM, KSTEPS = T::KSTEPS, BK = T::BK, NCH = T::NCH;
    constexpr int B_BYTES = T::B_BYTES, A_BYTES = T::A_BYTES, S_BYTES = T::S_BYTES;
    constexpr int STAGE_BYTES = T::STAGE_BYTES;
    constexpr int NW = NF / 2;            /* 32-bit words of a lane's W piece per warp */
    constexpr int A_CHUNKS = BM * BK / 8; /* 16-byte chunks of the A tile */
    constexpr int A_ROW_CHUNKS = BK / 8;
    constexpr int A_ITERS = (A_CHUNKS + kThreads - 1) / kThreads;

    extern __shared__ __align__(16) unsigned char smem[];
    float4 *red = reinterpret_cast<float4 *>(smem + STAGES * STAGE_BYTES);
    volatile int *flag =
        reinterpret_cast<volatile int *>(smem + STAGES * STAGE_BYTES + T::RED_BYTES);

    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int nw = warp % NWN; /* column slice of the tile */
    const int kw = warp / NWN; /* run of KPW k steps of the k tile */
    const int grid = gridDim.x;
    const int b = blockIdx.x;
    const int u_begin = unit_start(b, p.units, grid);
    const int n_units = unit_start(b + 1, p.units, grid) - u_begin;
    const int ksteps_total = p.k_pad / 16;

    /* Per-thread constants of the copies, computed once; every unit then costs
     * a pointer increment and a few adds (the copies are issued by all eight
     * warps, so their bookkeeping counts eight times per tile).
     * W: piece i of this thread is chunk (tid / 32 + 8 i) = (ks, j) with
     * j = chunk % NCH, ks = chunk / NCH; since 8 % NCH == 0, j is the same
     * for every i and ks grows by 8 / NCH: fixed offsets from one pointer. */
    static_assert(8 % NCH == 0, "W pieces at fixed offsets");
    const int chunk0 = tid >> 5;
    const int w_off0 = ((chunk0 % NCH) * ksteps_total + chunk0 / NCH) * 32 + (tid & 31);
    /* Scale groups: gsteps is a power of two 2..16 (gshift) or the whole k
     * (gshift large, one group). A k tile holds max(1, KSTEPS >> gshift) groups. */
    const int ng = max(1, KSTEPS >> p.gshift);
    const bool s_copy = tid < ng * NCH * 8;
    const int s_off = ((tid / 8) % NCH) * p.groups * 8 + (tid / (NCH * 8)) * 8 + (tid % 8);
    /* A: this thread's chunks (row r, 16-byte column kc), their offsets in
     * the rows of A (r * k + 8 kc < 2^31: BM <= 128, k <= 2^24) and their
     * swizzled places in the tile; the same for every unit. */
    int a_r[A_ITERS], a_kc8[A_ITERS], a_soff[A_ITERS];
    uint32_t a_goff[A_ITERS];
#pragma unroll
    for (int i = 0; i < A_ITERS; i++) {
        const int idx = tid + i * kThreads;
        a_r[i] = idx / A_ROW_CHUNKS;
        const int kc = idx % A_ROW_CHUNKS;
        a_kc8[i] = kc * 8;
        a_goff[i] = (uint32_t)a_r[i] * (uint32_t)p.k + (uint32_t)(kc * 8);
        a_soff[i] = B_BYTES + (a_r[i] * BK + ((kc ^ (a_r[i] & 7)) * 8)) * 2;
    }

    /* Load cursor: coordinates of the next unit to fetch, and the pointers
     * that follow it (advanced per unit, recomputed when a tile ends). */
    int l_kk, l_m, l_n;
    {
        const int t0 = u_begin / p.k_tiles;
        l_kk = u_begin - t0 * p.k_tiles;
        l_n = t0 / p.m_tiles;
        l_m = t0 - l_n * p.m_tiles;
    }
    int c_kk = l_kk, c_m = l_m, c_n = l_n; /* compute cursor */
    const uint4 *w_ptr;                    /* this thread's first W piece of the unit */
    const uint4 *s_ptr;                    /* this thread's scale piece of the n tile's group 0 */
    const uint4 *z_ptr;                    /* same for the zeros */
    const half *a_ptr;                     /* row 0 of the m tile, column 0 of the unit */
    int a_rows;                            /* rows of the m tile that exist */
    auto cursor_pointers = [&]() {
        w_ptr = p.q + ((int64_t)l_n * NCH * ksteps_total + l_kk * KSTEPS) * 32 + w_off0;
        const int64_t s_n = (int64_t)l_n * NCH * p.groups * 8 + s_off;
        s_ptr = p.scales + s_n;
        z_ptr = ZP ? p.zeros + s_n : p.scales;
        a_ptr = p.a + (int64_t)l_m * BM * p.k + l_kk * BK;
        a_rows = min(BM, p.m - l_m * BM);
    };
    cursor_pointers();

    /* Issue the copies of the load cursor's unit into ring slot s, then
     * advance the cursor. what: kLoadW (weights, scales, zeros), kLoadA (the
     * activations) or both. */
    constexpr int kLoadW = 1, kLoadA = 2;
    auto load_stage = [&](int s, int what) {
        unsigned char *st = smem + s * STAGE_BYTES;
        /* W: 512-byte chunks; a warp copies one whole chunk (coalesced). */
        if (what & kLoadW) {
#pragma unroll
            for (int i = 0; i < T::W_ITERS; i++)
                cp_async16(st + (tid + i * kThreads) * 16, w_ptr + i * (8 / NCH) * 32);
        }
        /* Scales (and zeros) of the groups this k tile touches. */
        if ((what & kLoadW) && s_copy) {
            const int goff = ((l_kk * KSTEPS) >> p.gshift) * 8;
            cp_async16(st + B_BYTES + A_BYTES + tid * 16, s_ptr + goff);
            if (ZP)
                cp_async16(st + B_BYTES + A_BYTES + S_BYTES + tid * 16, z_ptr + goff);
        }
        /* A: BM x BK fp16. The 16-byte chunk index is XOR-swizzled with the row
         * so that ldmatrix's eight row addresses hit eight different bank
         * groups (rows are 128 or 256 bytes apart, which would all map to the
         * same banks). */
        if (!(what & kLoadA)) {
            /* weights only (the prologue, before the previous kernel is done) */
        } else if (AVEC) {
            /* Only the rows that exist are copied (M = 1 moves one row, not
             * 16); the rows past M keep whatever they hold — zeros from the
             * start or another tile's rows — and only feed outputs that are
             * never stored, since row r of C depends on row r of A alone. */
#pragma unroll
            for (int i = 0; i < A_ITERS; i++) {
                if (a_r[i] < a_rows) {
                    const bool ok = l_kk * BK + a_kc8[i] < p.k;
                    cp_async16_zfill(st + a_soff[i], ok ? a_ptr + a_goff[i] : p.a, ok);
                }
            }
        } else {
            /* Rows of A not 16-byte aligned (k % 8 != 0 or an offset pointer):
             * element loads. Only odd shapes take this path; correct, not fast. */
            half *sa = reinterpret_cast<half *>(st + B_BYTES);
            const int row0 = l_m * BM;
            for (int idx = tid; idx < BM * BK; idx += kThreads) {
                const int r = idx / BK, kx = idx % BK;
                const int gr = row0 + r, gk = l_kk * BK + kx;
                half v = __float2half(0.0f);
                if (gr < p.m && gk < p.k)
                    v = p.a[(int64_t)gr * p.k + gk];
                sa[r * BK + (((kx >> 3) ^ (r & 7)) << 3) + (kx & 7)] = v;
            }
        }
        if (++l_kk == p.k_tiles) {
            l_kk = 0;
            if (++l_m == p.m_tiles) {
                l_m = 0;
                l_n++;
            }
            cursor_pointers();
        } else {
            w_ptr += KSTEPS * 32;
            a_ptr += BK;
        }
    };

    float acc[MB][NF][4];
#pragma unroll
    for (int mb = 0; mb < MB; mb++)
#pragma unroll
        for (int f = 0; f < NF; f++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                acc[mb][f][e] = 0.0f;
    float sacc[SW ? NW : 1][4]; /* SW: the swapped accumulators */
    /* SW: the sums of the current chunk (a run of k steps inside one scale
     * group) before its scale, over the magic codes, and the chunk's offset
     * sums O and S (see the top) */
    float gacc[SW ? NW : 1][4], osacc[4];
#pragma unroll
    for (int j = 0; j < (SW ? NW : 1); j++) {
        zero4(sacc[j]);
        zero4(gacc[j]);
    }
    zero4(osacc);

    /* Prologue: STAGES - 1 units in flight before the first mma. The weights
     * do not depend on the kernel before this one in the stream, so with
     * programmatic dependent launch their copies are issued first, while
     * that kernel drains; A, C and the workspace are touched only after
     * griddepcontrol.wait. The weight copies join the first commit group,
     * so the in-loop accounting is unchanged. */
    {
        const int c_kk0 = l_kk, c_m0 = l_m, c_n0 = l_n;
#pragma unroll
        for (int s = 0; s < STAGES - 1; s++)
            if (s < n_units)
                load_stage(s, kLoadW);
        l_kk = c_kk0;
        l_m = c_m0;
        l_n = c_n0;
        cursor_pointers();
    }

    /* Zero the A tiles once, so rows past M are finite zeros: after the
     * weight copies are on their way (a different part of each stage), and
     * before any A copy or element store (the barrier). */
    for (int s = 0; s < STAGES; s++)
        for (int idx = tid; idx < A_BYTES / 16; idx += kThreads)
            reinterpret_cast<uint4 *>(smem + s * STAGE_BYTES + B_BYTES)[idx] =
                make_uint4(0, 0, 0, 0);
    __syncthreads();
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < n_units)
            load_stage(s, kLoadA);
        cp_async_commit();
    }
    /* ACC: zero the words another launch left for its (finished) reader,
     * spread over the grid, once the kernel before is done. */
    if constexpr (ACC)
        for (long long idx = (long long)blockIdx.x * kThreads + tid; idx < x.acc_clear_n;
             idx += (long long)gridDim.x * kThreads)
            x.acc_clear[idx] = 0;

    /* This warp's k steps and word range inside the tile. */
    const int ks0 = KPW * kw;
    const int ch = (nw * NF) >> 3;                         /* 64-column chunk */
    const int wbase = ((nw * NF) & 7) >> 1;                /* first word of the lane's piece */
    const int gmask = (1 << p.gshift) - 1;                 /* k steps per group - 1 */
    const int q_word = (ch * 32 + lane) * 4 + wbase;       /* + ks * NCH * 128 */
    const int s_word = (ch * 8 + (lane >> 2)) * 4 + wbase; /* + group * NCH * 32 */
    /* SW: the offset sums as one more mma per k step, against an A operand
     * whose rows 0-7 are 1024 (O) and rows 8-15 are 1 and 16 (S). */
    const uint32_t kOffsetRowsA[4] = {kMagic1024, kOne, kMagic1024, kSixteen};

    for (int i = 0; i < n_units; i++) {
        /* Unit i has landed once at most STAGES - 2 younger groups are pending. */
        cp_async_wait<STAGES - 2>();
        __syncthreads(); /* also: every warp is done with slot (i - 1) % STAGES */
        if (i + STAGES - 1 < n_units)
            load_stage((i + STAGES - 1) % STAGES, kLoadW | kLoadA);
        cp_async_commit();
        /* The copies are predicated per thread (rows past M, scale groups):
         * reconverge the warp before ldmatrix / mma, whose .sync.aligned forms
         * must be executed by the whole warp together. */
        __syncwarp();

        const unsigned char *st = smem + (i % STAGES) * STAGE_BYTES;

        /* ---- this warp's KPW k16 steps of the tile ---- */
        {
            const uint32_t *sq = reinterpret_cast<const uint32_t *>(st);
            const uint32_t *ss = reinterpret_cast<const uint32_t *>(st + B_BYTES + A_BYTES);
            uint32_t qw[KPW][NW];
#pragma unroll
            for (int s = 0; s < KPW; s++)
                lds_words<NW>(sq + (ks0 + s) * NCH * 128 + q_word, qw[s]);
            const half *sa = reinterpret_cast<const half *>(st + B_BYTES);
            if constexpr (SW) {
#pragma unroll
                for (int s = 0; s < KPW; s++) {
                    const int ks = ks0 + s;
                    /* tokens 0-7 as the B fragment: k 2c, 2c+1 and, over 16
                     * (see the top), 2c+8, 2c+9 of token g (lanes 0-15
                     * address the two 8 x 8 matrices) */
                    uint32_t tb[2];
                    const int r = lane & 7;
                    const int kc = ks * 2 + ((lane >> 3) & 1);
                    ldsm_x2(tb, sa + r * BK + ((kc ^ (r & 7)) * 8));
                    tb[1] = sixteenth(tb[1]);
                    /* a chunk starts at the warp's first step of the k tile
                     * (the _z mma) and where a group starts inside its steps
                     * (groups of 32: zeroed when the chunk before ended) */
#pragma unroll
                    for (int j = 0; j < NW; j++) {
                        uint32_t bf[2][2];
                        magic_pair(qw[s][j], bf);
                        const uint32_t wa[4] = {bf[0][0], bf[1][0], bf[0][1], bf[1][1]};
                        mma_chunk(gacc[j], wa, tb[0], tb[1], s == 0);
                    }
                    mma_chunk(osacc, kOffsetRowsA, tb[0], tb[1], s == 0);
                    /* the chunk ends at the warp's last step and before a
                     * group starts: scale its sums into sacc. Element e of
                     * word j: column 16 j + g + 8 (e >> 1), token 2c +
                     * (e & 1); osacc: O of tokens 2c, 2c + 1 in elements 0,
                     * 1, S in 2, 3. */
                    if (s == KPW - 1 || (s % 2 == 1 && ((ks + 1) & gmask) == 0)) {
                        const int off = (ks >> p.gshift) * NCH * 32 + s_word;
                        uint32_t sw[NW], zw[NW] = {};
                        lds_words<NW>(ss + off, sw);
                        if (ZP)
                            lds_words<NW>(ss + S_BYTES / 4 + off, zw);
#pragma unroll
                        for (int j = 0; j < NW; j++) {
                            float sc[2], zc[2];
                            word_to_floats<ZP>(sw[j], zw[j], sc, zc);
#pragma unroll
                            for (int e = 0; e < 4; e++)
                                sacc[j][e] =
                                    scale_chunk(gacc[j][e], osacc[e & 1], osacc[2 + (e & 1)],
                                                zc[e >> 1], sc[e >> 1], sacc[j][e]);
                        }
                        if (s < KPW - 1) {
                            zero4(osacc);
#pragma unroll
                            for (int j = 0; j < NW; j++)
                                zero4(gacc[j]);
                        }
                    }
                }
            } else {
                GroupConstsT<NF> g;
#pragma unroll
                for (int s = 0; s < KPW; s++) {
                    const int ks = ks0 + s;
                    /* group constants at the first step, and again where a
                     * group starts inside the warp's steps (groups of 32
                     * with KPW 4) */
                    if (s == 0 || (s % 2 == 0 && (ks & gmask) == 0)) {
                        const int gl = ks >> p.gshift;
                        uint32_t sw[NW], zw[NW];
                        lds_words<NW>(ss + gl * NCH * 32 + s_word, sw);
                        if (ZP)
                            lds_words<NW>(ss + S_BYTES / 4 + gl * NCH * 32 + s_word, zw);
                        else
#pragma unroll
                            for (int j = 0; j < NW; j++)
                                zw[j] = 0;
                        group_consts_w<ZP, NW>(sw, zw, g);
                    }
                    uint32_t af[MB][4];
#pragma unroll
                    for (int mb = 0; mb < MB; mb++) {
                        const int r = mb * 16 + (lane & 15);
                        const int kc = ks * 2 + (lane >> 4);
                        ldsm_x4(af[mb], sa + r * BK + ((kc ^ (r & 7)) * 8));
                    }
#pragma unroll
                    for (int j = 0; j < NW; j++) {
                        uint32_t bf[2][2];
                        dequant_pair<NF>(qw[s][j], g, j, bf);
#pragma unroll
                        for (int h = 0; h < 2; h++)
#pragma unroll
                            for (int mb = 0; mb < MB; mb++)
                                mma_16816(acc[mb][2 * j + h], af[mb], bf[h][0], bf[h][1]);
                    }
                }
            }
        }

        /* ---- end of this block's part of tile t: reduce and write ---- */
        if (c_kk == p.k_tiles - 1 || i == n_units - 1) {
            if constexpr (SW) {
                unswap_acc<NF>(sacc, acc);
#pragma unroll
                for (int j = 0; j < NW; j++)
                    zero4(sacc[j]);
            }
            finish_tile<MB, NWN, NF, KPW, STAGES, GLU, ACC>(p, x, acc, red, flag, c_m, c_n, b,
                                                            grid);
        }
        if (++c_kk == p.k_tiles) {
            c_kk = 0;
            if (++c_m == p.m_tiles) {
                c_m = 0;
                c_n++;
            }
        }
    }
    cp_async_wait<0>();
#else
    __trap(); /* never launched: the dispatcher sends sm < 80 to the fallback */
#endif
}

/* ---- the configurations: KRN_INT4_GEMM_SM80_CONFIGS instantiated ------------ */

typedef void (*KernelFn)(const Params, const AccParams);

struct Config {
    int smem;               /* dynamic shared memory bytes */
    KernelFn kernel[2][2];  /* [asymmetric][A rows 16-byte aligned] */
    KernelFn swapped[2][2]; /* the same with SW (M <= 8), 16-row tiles only; else null */
    KernelFn glu[2][2];     /* [asymmetric][SW]: GLU output, A rows aligned; the
                               configurations of the automatic choice only */
    KernelFn acc[2][2];     /* [asymmetric][SW]: fixed-point sums (ACC64), A rows
                               aligned; the automatic 16-row configurations only */
};

/* The kernel of a variant where ON, else null: SW exists for 16-row tiles
 * only. */
template <int MB, int NWN, int NF, int KPW, int STAGES, int BPS, bool ZP, bool AVEC, bool SW,
          bool GLU, bool ACC, bool ON>
constexpr KernelFn variant()
{
    if constexpr (ON && (MB == 1 || !SW))
        return int4_gemm_kernel<MB, NWN, NF, KPW, STAGES, BPS, ZP, AVEC, SW, GLU, ACC>;
    else
        return nullptr;
}

/* A list entry (kernels/int4_gemm_configs.h): its kernels, GLU variants for
 * the automatic choice's configurations (AUTO) and, with them, the ACC64
 * variants of the 16-row ones. */
#define INT4GEMM_V(ZP, AVEC, SW, GLU, ACC, ON)                                                     \
    variant<MB, NWN, NF, KPW, STAGES, BPS, ZP, AVEC, SW, GLU, ACC, ON>()
#define INT4GEMM_CONFIG(ID, NAME, MB_, NWN_, NF_, KPW_, STAGES_, BPS_, AUTO)                       \
    []() {                                                                                         \
        constexpr int MB = MB_, NWN = NWN_, NF = NF_, KPW = KPW_, STAGES = STAGES_, BPS = BPS_;    \
        constexpr bool WITH_GLU = AUTO != 0;                                                       \
        constexpr bool WITH_ACC = WITH_GLU && MB == 1;                                             \
        using T = Tile<MB, NWN, NF, KPW, STAGES>;                                                  \
        static_assert(T::BK == 128 && NWN == KPW, "the list's k tile is 128 = 16 KPW (8 / NWN)");  \
        return Config{T::SMEM,                                                                     \
                      {{INT4GEMM_V(false, false, false, false, false, true),                       \
                        INT4GEMM_V(false, true, false, false, false, true)},                       \
                       {INT4GEMM_V(true, false, false, false, false, true),                        \
                        INT4GEMM_V(true, true, false, false, false, true)}},                       \
                      {{INT4GEMM_V(false, false, true, false, false, true),                        \
                        INT4GEMM_V(false, true, true, false, false, true)},                        \
                       {INT4GEMM_V(true, false, true, false, false, true),                         \
                        INT4GEMM_V(true, true, true, false, false, true)}},                        \
                      {{INT4GEMM_V(false, true, false, true, false, WITH_GLU),                     \
                        INT4GEMM_V(false, true, true, true, false, WITH_GLU)},                     \
                       {INT4GEMM_V(true, true, false, true, false, WITH_GLU),                      \
                        INT4GEMM_V(true, true, true, true, false, WITH_GLU)}},                     \
                      {{INT4GEMM_V(false, true, false, false, true, WITH_ACC),                     \
                        INT4GEMM_V(false, true, true, false, true, WITH_ACC)},                     \
                       {INT4GEMM_V(true, true, false, false, true, WITH_ACC),                      \
                        INT4GEMM_V(true, true, true, false, true, WITH_ACC)}}};                    \
    }(),

const Config kConfigs[] = {KRN_INT4_GEMM_SM80_CONFIGS(INT4GEMM_CONFIG)};
#undef INT4GEMM_CONFIG
#undef INT4GEMM_V
static_assert(sizeof kConfigs / sizeof kConfigs[0] == KRN_INT4_GEMM_SM80_COUNT,
              "one kernel table entry per listed configuration");

} // namespace

/* Raise every kernel's shared-memory limit to its configuration's and take
 * the residency of each configuration: the least over its variants (the
 * same shared memory for all, and launch bounds that leave registers for
 * its BPS blocks, so they agree up to that cap). A configuration whose
 * shared memory exceeds the device's gets 0 and is never launched. */
cudaError_t sm80_prepare(krn_cuda_device *d)
{
    for (int ci = 0; ci < KRN_INT4_GEMM_SM80_COUNT; ci++) {
        const Config &c = kConfigs[ci];
        d->int4_gemm.sm80[ci] = 0;
        if (c.smem > d->smem_per_block)
            continue;
        const KernelFn *fns = &c.kernel[0][0];
        int least = 255;
        for (int i = 0; i < 16; i++) { /* kernel, swapped, glu, acc: 4 x [2][2] */
            const KernelFn fn = fns[i];
            if (!fn)
                continue;
            cudaError_t e =
                cudaFuncSetAttribute(reinterpret_cast<const void *>(fn),
                                     cudaFuncAttributeMaxDynamicSharedMemorySize, c.smem);
            int n = 0;
            if (e == cudaSuccess)
                e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, fn, kThreads, c.smem);
            if (e != cudaSuccess)
                return e;
            least = n < least ? n : least;
        }
        d->int4_gemm.sm80[ci] = (uint8_t)least;
    }
    return cudaSuccess;
}

cudaError_t launch_sm80(const Params &p, const AccParams &x, int ci, bool a_rows16, bool sw,
                        bool glu, bool words, int grid, bool pdl, cudaStream_t stream)
{
    const Config &c = kConfigs[ci];
    const int zp = p.zeros ? 1 : 0, av = a_rows16 ? 1 : 0, s = sw ? 1 : 0;
    const KernelFn fn = words ? c.acc[zp][s]
                        : glu ? (av ? c.glu[zp][s] : nullptr)
                        : sw  ? c.swapped[zp][av]
                              : c.kernel[zp][av];
    if (!fn)
        return cudaErrorInvalidDeviceFunction; /* the policy checked the variant exists */
    /* Programmatic dependent launch: the kernel may start while the previous
     * one in the stream drains; it waits (griddepcontrol.wait) before it
     * reads A or writes anything. Also inside stream capture. */
    return krncuda::launch_ex(pdl, fn, dim3((unsigned)grid), dim3(kThreads), (size_t)c.smem, stream,
                              p, x);
}

} // namespace int4gemm
