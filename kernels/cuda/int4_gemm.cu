/*
 * int4_gemm.cu — C[M,N] = A[M,K] · dequant(W)[N,K]ᵀ (+ bias); A, C fp16 row-major.
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
 *          (launch_grid), so that each stripe lies inside one tile.
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
 *          weights (tiny_weight), which keep one arithmetic at every M.
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
 * Arch     sm_80+ (mma.sync m16n8k16, cp.async, ldmatrix) — runs on Hopper;
 *          int4_gemm_sm75.cu is the Turing fallback; sm90/int4_gemm_sm90.cu is
 *          the Hopper wgmma kernel, which krn_int4_gemm() picks by shape
 *          (sm90_auto_choice) where it is faster; int4_gemm_stream.cu is
 *          the one-round stream kernel it picks up to 4 rows where one wave
 *          of its blocks holds the weight (stream_choice).
 */
#include "kernels/cuda/acc64.cuh"
#include "kernels/cuda/int4_gemm_impl.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/int4_gemm.h"

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

/* 16-byte async copy; src_bytes 0 fills the destination with zeros (rows past
 * M, columns past K) without touching global memory. */
__device__ __forceinline__ void cp_async16_zfill(void *dst, const void *src, bool pred)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
                 "r"(pred ? 16 : 0));
}

/* The weights are read exactly once per launch. An L2 evict-first policy on
 * their copies (cp.async ... L2::cache_hint with createpolicy) was the first
 * design, but ptxas 13.0 encoded the constant policy descriptor of the
 * in-loop copy as an odd uniform-register pair (desc[UR1]), which faults
 * with "illegal instruction" on the H200 (docs/gemm-notes.md). The copies
 * are plain cp.async.cg (L1 bypassed); the weights still pass through L2
 * once, and the rotation in bench/gemm keeps them from being L2 hits. */
__device__ __forceinline__ void cp_async16(void *dst, const void *src)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(dst)), "l"(src));
}

__device__ __forceinline__ void cp_async_commit()
{
    asm volatile("cp.async.commit_group;\n" ::);
}

template <int N> __device__ __forceinline__ void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

__device__ __forceinline__ void ldsm_x2(uint32_t (&r)[2], const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(smem_addr(p)));
}

/* Workspace slot of block b's partial of tile t: each block has at most two
 * shared tiles, the one its stripe starts in (slot 2b) and the one it ends in
 * (slot 2b + 1). */
__device__ __forceinline__ int partial_slot(int b, int t, const Params &p, int grid)
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
__device__ __forceinline__ void finish_tile(const Params &p, const AccParams &x,
                                            float (&acc)[MB][NF][4], float4 *red,
                                            volatile int *flag, int m_tile, int n_tile, int b,
                                            int grid)
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
                                sacc[j][e] = scale_chunk(gacc[j][e], osacc[e & 1],
                                                         osacc[2 + (e & 1)], zc[e >> 1],
                                                         sc[e >> 1], sacc[j][e]);
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
            finish_tile<MB, NWN, NF, KPW, STAGES, GLU, ACC>(p, x, acc, red, flag, c_m, c_n, b, grid);
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

/* ---- dequantization to fp16 ---------------------------------------------- */

/* W[n][k] = fp16((code - zero) * scale) for n < N, k < K, from the repacked
 * layout, the same dequantization as the GEMM (bit for bit the CPU
 * reference's values). Used before a cuBLAS fp16 GEMM when M is large enough
 * that dequantizing once beats dequantizing per token tile. It moves 2.5
 * bytes per weight (0.5 read, 2 written), so it is written as a copy whose
 * stores are what matters:
 *   - a block takes a unit of 64 columns x 128 k (eight 512-byte chunks,
 *     16 KiB of fp16 out); warp j dequantizes chunk j (a lane holds the k
 *     pairs 2c, 2c + 8 of eight rows) into the unit's row-major tile in
 *     shared memory (rows padded to 68 words: the 32 lanes' 4-byte stores
 *     hit 32 banks, rows stay 16-byte aligned);
 *   - after a barrier every thread writes 16 bytes: a warp store is two
 *     whole 256-byte row pieces, as a copy kernel's would be;
 *   - each warp requests its chunk (and scales) of the next unit before
 *     working on the current one.
 * vec: 1 when ldw % 8 == 0 and w is 16-byte aligned (16-byte stores), else
 * element stores. Columns >= k are never written. */
constexpr int kDqThreads = 256; /* 8 warps: one per chunk of a unit */
constexpr int kDqRowWords = 68;

template <bool ZP>
__global__ void __launch_bounds__(kDqThreads)
    int4_dequant_kernel(const Params p, half *w, int64_t ldw, int vec)
{
    __shared__ __align__(16) uint32_t tile_s[64 * kDqRowWords];
    const int tid = threadIdx.x, lane = tid & 31, j = tid >> 5;
    const int kunits = p.k_pad / 128;
    const int64_t units = (int64_t)(p.n_pad / 64) * kunits;
    const int g8 = lane >> 2, c4 = lane & 3;
    /* this warp's chunk, scales and zeros of unit u (chunk past k: zeros) */
    auto fetch = [&](int64_t u, uint4 &q, uint4 &sv, uint4 &zv) {
        const int tile = (int)(u / kunits), ks = (int)(u % kunits) * 8 + j;
        const bool live = tile * 64 < p.n && ks * 16 < p.k;
        const int64_t s_at = ((int64_t)tile * p.groups + (ks >> p.gshift)) * 8 + g8;
        q = live ? __ldg(p.q + (u * 8 + j) * 32 + lane) : make_uint4(0, 0, 0, 0);
        sv = live ? __ldg(p.scales + s_at) : make_uint4(0, 0, 0, 0);
        zv = live && ZP ? __ldg(p.zeros + s_at) : make_uint4(0, 0, 0, 0);
    };
    int64_t u = blockIdx.x;
    uint4 q, sv, zv;
    if (u < units)
        fetch(u, q, sv, zv);
    for (; u < units; u += gridDim.x) {
        const int tile = (int)(u / kunits), ks0 = (int)(u % kunits) * 8;
        const uint4 qc = q, sc = sv, zc = zv;
        if (u + gridDim.x < units)
            fetch(u + gridDim.x, q, sv, zv);
        if (tile * 64 >= p.n || ks0 * 16 >= p.k)
            continue; /* padding only (the same for the whole block) */
        GroupConsts gc;
        group_consts<ZP>(sc, zc, gc);
        uint32_t b[8][2];
        dequant_word(qc, gc, b);
#pragma unroll
        for (int f = 0; f < 8; f++)
#pragma unroll
            for (int h = 0; h < 2; h++)
                tile_s[(8 * f + g8) * kDqRowWords + 8 * j + c4 + 4 * h] = b[f][h];
        __syncthreads();
#pragma unroll
        for (int it = 0; it < 4; it++) {
            const int idx = tid + kDqThreads * it, r = idx >> 4, piece = idx & 15;
            const int n = tile * 64 + r, k0 = ks0 * 16 + 8 * piece;
            const uint4 v = *reinterpret_cast<const uint4 *>(tile_s + r * kDqRowWords + 4 * piece);
            if (n >= p.n || k0 >= p.k)
                continue;
            half *dst = w + (int64_t)n * ldw + k0;
            if (vec && k0 + 8 <= p.k) {
                *reinterpret_cast<uint4 *>(dst) = v;
            } else {
                const half *hv = reinterpret_cast<const half *>(&v);
                for (int e = 0; e < 8 && k0 + e < p.k; e++)
                    dst[e] = hv[e];
            }
        }
        __syncthreads(); /* the tile is rewritten by the next unit */
    }
}

/* ---- explicit configuration list ---------------------------------------- */

typedef void (*KernelFn)(const Params, const AccParams);

struct Config {
    const char *name;
    int bm, bn, bk;
    int max_blocks_per_sm;  /* resident blocks the grid is sized for (at most) */
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

#define INT4GEMM_V(ZP, AVEC, SW, GLU, ACC, ON)                                                     \
    variant<MB, NWN, NF, KPW, STAGES, BPS, ZP, AVEC, SW, GLU, ACC, ON>()
#define INT4GEMM_CONFIG(NAME, MB_, NWN_, NF_, KPW_, STAGES_, BPS_, WITH_GLU)                       \
    []() {                                                                                         \
        constexpr int MB = MB_, NWN = NWN_, NF = NF_, KPW = KPW_, STAGES = STAGES_, BPS = BPS_;    \
        constexpr bool WITH_ACC = WITH_GLU && MB == 1;                                             \
        using T = Tile<MB, NWN, NF, KPW, STAGES>;                                                  \
        return Config{NAME,                                                                        \
                      T::BM,                                                                       \
                      T::BN,                                                                       \
                      T::BK,                                                                       \
                      BPS,                                                                         \
                      T::SMEM,                                                                     \
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
    }()

/* Indexes 0-2 and 10 are what the automatic choice uses (auto_config); the
 * rest are alternatives kept compiled for benchmarking (args->config).
 * Names: rows, columns, k per tile, k steps per warp (w), stages. The last
 * argument: GLU variants compiled (the automatic choice's only), and with it
 * the ACC64 variants of the 16-row ones. */
const Config kConfigs[] = {
    INT4GEMM_CONFIG("sm80 m16 n128 k128 w4 s4", 1, 4, 4, 4, 4, 2, true),
    INT4GEMM_CONFIG("sm80 m32 n128 k128 w4 s4", 2, 4, 4, 4, 4, 2, true),
    INT4GEMM_CONFIG("sm80 m64 n128 k128 w4 s4", 4, 4, 4, 4, 4, 1, true),
    INT4GEMM_CONFIG("sm80 m64 n256 k128 w8 s3", 4, 8, 4, 8, 3, 1, false),
    INT4GEMM_CONFIG("sm80 m16 n256 k128 w4 s4", 1, 4, 8, 4, 4, 2, false),
    INT4GEMM_CONFIG("sm80 m32 n256 k128 w4 s4", 2, 4, 8, 4, 4, 1, false),
    INT4GEMM_CONFIG("sm80 m16 n128 k128 w2 s4", 1, 2, 8, 2, 4, 2, false),
    INT4GEMM_CONFIG("sm80 m64 n128 k128 w8 s4", 4, 8, 2, 8, 4, 2, false),
    INT4GEMM_CONFIG("sm80 m128 n128 k128 w8 s3", 8, 8, 2, 8, 3, 1, false),
    INT4GEMM_CONFIG("sm80 m32 n256 k128 w8 s4", 2, 8, 4, 8, 4, 2, false),
    INT4GEMM_CONFIG("sm80 m16 n256 k128 w8 s4", 1, 8, 4, 8, 4, 2, true),
    INT4GEMM_CONFIG("sm80 m16 n128 k128 w8 s4", 1, 8, 2, 8, 4, 2, false),
};
constexpr int kNumConfigs = (int)(sizeof kConfigs / sizeof kConfigs[0]);
constexpr int kSm75Config = kNumConfigs; /* the fallback's index */

/* Automatic choice by M and weight width, from the H200 sweeps
 * (docs/gemm-notes.md, versions 7, 12 and 26): the 16-row tile up to M = 16
 * — 256 columns with all eight warps along N, each taking the whole k tile
 * (index 10), on wide weights (n >= 8192 up to M = 8, n >= 16384 up to
 * M = 16), where each block's stripe is long enough for the larger tile
 * (and up to M = 8 a warp's chunk is a whole group of 128); else 128
 * columns (index 0) — the 32-row tile up to 32, the 64-row tile beyond (two
 * or more m tiles, each dequantizing the weights again). */
constexpr int kWideSmallM = 10;
int auto_config(int m, const krn_int4_gemm_layout *lay)
{
    if (m <= 16) {
        const int wide_from = m <= 8 ? 8192 : 16384;
        return lay->n_pad >= wide_from ? kWideSmallM : 0;
    }
    if (m <= 32)
        return 1;
    return 2;
}

/* Weights of fewer than 256 tiles of 128 x 128 (the tiny and small presets'):
 * a few microseconds either way, so they take one arithmetic at every M
 * (the usual operand order, fp16 weights), and a row's result does not
 * depend on the batch it runs in (docs/gemm-notes.md, versions 13 and 26). */
bool tiny_weight(const krn_int4_gemm_layout *lay)
{
    return (long long)(lay->n_pad / 128) * (lay->k_pad / 128) < 256;
}

/* Per device and kernel: resident blocks per SM once the shared-memory limit
 * was raised (0: not yet known). Racing writers store the same value. */
constexpr int kMaxDevices = 16;
int g_occupancy[kMaxDevices][kNumConfigs][2][2][2][3];

/* Resident blocks per SM of fn, kConfigs[ci]'s [zp][av] kernel, swapped
 * (sw) or not, with plain (out 0), GLU (1) or fixed-point (2) output, once
 * its shared-memory limit is raised. */
cudaError_t occupancy(int dev, int ci, int zp, int av, int sw, int out_mode, KernelFn fn, int *out)
{
    if (dev >= 0 && dev < kMaxDevices && g_occupancy[dev][ci][zp][av][sw][out_mode] > 0) {
        *out = g_occupancy[dev][ci][zp][av][sw][out_mode];
        return cudaSuccess;
    }
    const Config &c = kConfigs[ci];
    cudaError_t e = cudaFuncSetAttribute(reinterpret_cast<const void *>(fn),
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, c.smem);
    if (e != cudaSuccess)
        return e;
    int n = 0;
    e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, fn, kThreads, c.smem);
    if (e != cudaSuccess)
        return e;
    if (n < 1)
        return cudaErrorInvalidConfiguration;
    if (dev >= 0 && dev < kMaxDevices)
        g_occupancy[dev][ci][zp][av][sw][out_mode] = n;
    *out = n;
    return cudaSuccess;
}

int ceil_div(long long a, long long b)
{
    return (int)((a + b - 1) / b);
}

/* Workspace: a fixed region of arrival counters (one per possible shared
 * tile: two per block, so 2 * kMaxGrid; the stream kernel's, one per
 * 64-column chunk, are the same zeroed ints), then the stream kernel's
 * fixed-point words (kStreamWordBytes: m x n_pad int64, zero at rest), then
 * the fp32 partial tiles. Fixed, so that no launch's partials land where
 * another configuration or M keeps its counters or words. */
constexpr int kMaxGrid = 2048;
constexpr size_t kCounterBytes = 2 * kMaxGrid * sizeof(int);
constexpr size_t kStreamWordBytes = (size_t)1 << 21;
constexpr size_t kFixedBytes = kCounterBytes + kStreamWordBytes;

/* Workspace bytes for config ci, m rows, `grid` blocks. */
size_t workspace_need(const krn_int4_gemm_layout *, int ci, int m, long long grid)
{
    const Config &c = kConfigs[ci];
    size_t slot_rows = (size_t)(m < c.bm ? m : c.bm);
    return kFixedBytes + 2 * (size_t)grid * slot_rows * (size_t)c.bn * sizeof(float);
}

bool layout_ok(const krn_int4_gemm_layout *l)
{
    return l->n >= 1 && l->k >= 1 && l->n_pad >= l->n && l->k_pad >= l->k &&
           l->n_pad % KRN_INT4_GEMM_N_ALIGN == 0 && l->k_pad % KRN_INT4_GEMM_K_ALIGN == 0 &&
           l->group_steps >= 2 && l->groups >= 1 &&
           (l->groups == 1
                ? l->group_steps * 16 >= l->k_pad
                : (l->group_steps & (l->group_steps - 1)) == 0 && l->group_steps <= 16) &&
           (long long)l->groups * l->group_steps * 16 >= l->k_pad && l->q_offset % 16 == 0 &&
           l->scale_offset % 16 == 0 && l->zero_offset % 16 == 0;
}

/* The weight's part of the kernel parameters: section pointers into the
 * repacked buffer b, sizes, and the scale-group step as a shift. */
Params params_of(const krn_int4_gemm_layout *lay, const void *b)
{
    Params p = {};
    const unsigned char *wb = static_cast<const unsigned char *>(b);
    p.q = reinterpret_cast<const uint4 *>(wb + lay->q_offset);
    p.scales = reinterpret_cast<const uint4 *>(wb + lay->scale_offset);
    p.zeros = lay->symmetric ? nullptr : reinterpret_cast<const uint4 *>(wb + lay->zero_offset);
    p.n = lay->n;
    p.k = lay->k;
    p.k_pad = lay->k_pad;
    p.n_pad = lay->n_pad;
    p.gsteps = lay->group_steps;
    p.groups = lay->groups;
    /* group_steps is 2..16 (a power of two) or covers the whole k_pad */
    p.gshift = 30;
    if (lay->groups > 1)
        for (int sh = 1; sh <= 4; sh++)
            if (lay->group_steps == (1 << sh))
                p.gshift = sh;
    return p;
}

/* Blocks of a persistent launch with `slots` resident blocks. Units are
 * striped over the grid in (tile, k tile) order, so with G blocks a tile
 * is shared by the blocks whose stripes cross it. When there are fewer tiles
 * than slots, G = tiles x s (s = slots / tiles, at most k_tiles) puts the
 * start of block t*s on the first k tile of tile t: every block's stripe
 * then lies inside one tile and every tile has exactly s contributors (one
 * partial and one arrival per block instead of up to two, all tiles
 * finishing together). Taken when it keeps at least 7/8 of the slots;
 * KRN_INT4_GEMM_GRID_STRIPED keeps all of them. */
long long launch_grid(long long slots, const Params &p, uint32_t flags)
{
    const long long tiles = (long long)p.m_tiles * p.n_tiles;
    long long grid = slots;
    if (!(flags & KRN_INT4_GEMM_GRID_STRIPED) && tiles < slots) {
        long long s = slots / tiles;
        if (s > p.k_tiles)
            s = p.k_tiles;
        if (tiles * s * 8 >= slots * 7)
            grid = tiles * s;
    }
    if (grid > p.units)
        grid = p.units;
    if (grid > kMaxGrid)
        grid = kMaxGrid;
    return grid;
}

/* The caller's fixed-point words and the words to zero (KRN_INT4_GEMM_ACC64). */
AccParams acc_params_of(const krn_int4_gemm_args *args)
{
    AccParams x = {};
    x.acc = reinterpret_cast<long long *>(args->acc);
    x.acc_clear = reinterpret_cast<long long *>(args->acc_clear);
    x.acc_clear_n = args->acc_clear ? args->acc_clear_words : 0;
    return x;
}

/* Point p's counters and partials into the caller's workspace, which must
 * hold `need` bytes (the counter and word regions first). */
inf_status_t bind_workspace(Params &p, const krn_int4_gemm_args *args, size_t need,
                            struct inf_err *err)
{
    if (args->workspace_bytes < need)
        return inf_err_set(err, INF_E_INVALID, "int4 gemm: workspace %zu bytes, need %zu",
                           args->workspace_bytes, need);
    unsigned char *ws = static_cast<unsigned char *>(args->workspace);
    p.counters = reinterpret_cast<int *>(ws);
    p.partials = reinterpret_cast<float *>(ws + kFixedBytes);
    return INF_OK;
}

} // namespace
} // namespace int4gemm

using namespace int4gemm;

/* Configuration indexes: the sm_80 list, the sm_75 fallback, then the sm_90a
 * list (absent when the build does not target sm_90). */
static int sm90_count(void)
{
#ifdef INT4SERVE_GEMM_SM90
    return sm90_config_count();
#else
    return 0;
#endif
}

constexpr int kSm90First = kSm75Config + 1;
/* the stream kernel's variants follow the sm_90a list */
static int stream_first(void)
{
    return kSm90First + sm90_count();
}
/* The automatic choice on Hopper, from the H200 sweep over the Llama-2-7B
 * and Llama-3-8B shapes (docs/gemm-notes.md, version 13): the mma.sync
 * kernel up to M = 16 (where the weight stream is all there is); above it the
 * wgmma kernel with the token tile that covers M in as few tiles as the
 * weight allows — 32 tokens up to M = 32, then 64 and 128 — one step smaller
 * on small weights above M = 32 (fewer than 1536 tiles of 128 x 128, where a
 * larger token tile leaves too few units per block). Up to version 26 the
 * small weights took the mma.sync kernel up to M = 32; with its chunk
 * scaling the 32-token wgmma tile is faster there (Llama-2 o at M = 32:
 * 11.39 against 12.85 us).
 * Tiny weights (fewer than 256 tiles: a few microseconds either way) stay
 * on the mma.sync kernel at every M: its 16-, 32- and 64-row tiles split k
 * the same way, and while every block holds at most one unit (units <= the
 * grid, 264 blocks on the H200) a tile's k sum is the same whatever M, so a
 * row's result does not depend on the batch it runs in (the engine's batch
 * tests on the small presets rely on it). Groups of 32 k stay on the mma.sync kernel too: their
 * wgmma variant is tested but not yet timed. Returns an sm_90a configuration
 * or -1 for the sm_80 kernel. */
static int sm90_auto_choice(int m, const krn_int4_gemm_layout *lay)
{
#ifdef INT4SERVE_GEMM_SM90
    const long long tiles = (long long)(lay->n_pad / 128) * (lay->k_pad / 128);
    if (m <= 16 || tiny_weight(lay) || (lay->groups > 1 && lay->group_steps < 4))
        return -1;
    const bool small = tiles < 1536;
    int tn;
    if (m <= 32)
        tn = 32;
    else if (m <= 64)
        tn = small ? 32 : 64;
    else if (m <= 128)
        tn = small ? 64 : 128;
    else
        tn = 128;
    for (int i = 0; i < sm90_config_count(); i++)
        if (sm90_config_tn(i) == tn)
            return i;
#else
    (void)m;
    (void)lay;
#endif
    return -1;
}

/* The stream kernel's variant for this launch, or -1: M <= kStreamMaxM on a
 * weight that is not tiny (whose rows keep one arithmetic at every M), A
 * 4-byte aligned with k even (pairs of activations), no flag asking for the
 * mma.sync kernel's own options, each word summing at most kAcc64MaxParts
 * blocks, and (C and GLU outputs) the words within the workspace's region.
 * *out: the fixed-point words where ACC64 asks for them and no bias is
 * added, else C or the GLU output. The automatic choice takes it up to
 * kStreamAutoMaxM rows where a variant's grid is one wave that fills the GPU
 * (stream_auto_variant): on the H200 that is the 4096 x 4096 projections
 * (docs/gemm-notes.md, version 48); INT4SERVE_GEMM_STREAM=0 in the
 * environment turns it off (read once). */
constexpr int kStreamAutoMaxM = 4;
static int stream_choice(const krn_int4_gemm_args *args, const Params &p, bool glu, int dev,
                         int sms, int *out)
{
    static int off = -1;
    if (off < 0) {
        const char *env = getenv("INT4SERVE_GEMM_STREAM");
        off = env && env[0] == '0' && env[1] == '\0' ? 1 : 0;
    }
    const int forced = args->config - stream_first();
    const bool is_forced = forced >= 0 && forced < stream_config_count();
    if (!(args->config == -1 ? !off && p.m <= kStreamAutoMaxM : is_forced))
        return -1;
    const krn_int4_gemm_layout *lay = args->lay;
    const uint32_t own = KRN_INT4_GEMM_NO_SWAP | KRN_INT4_GEMM_GRID_STRIPED;
    if (p.m > kStreamMaxM || tiny_weight(lay) || (args->flags & own) || p.k % 2 ||
        (uintptr_t)args->a % 4 || p.n_pad / 64 > 2 * kMaxGrid)
        return -1;
    if ((args->flags & KRN_INT4_GEMM_ACC64) && !p.bias) {
        *out = kStreamOutAcc;
    } else {
        if ((size_t)p.m * p.n_pad * sizeof(long long) > kStreamWordBytes ||
            args->workspace_bytes < kFixedBytes)
            return -1;
        *out = glu ? kStreamOutGlu : kStreamOutC;
    }
    const int vi = is_forced ? forced : stream_auto_variant(p, *out, dev, sms);
    if (vi < 0 || stream_k_blocks(vi, p) > krncuda::kAcc64MaxParts)
        return -1;
    return vi;
}

extern "C" int krn_int4_gemm_config_count(void)
{
    return kNumConfigs + 1 + sm90_count() + stream_config_count();
}

extern "C" const char *krn_int4_gemm_config_name(int index)
{
    if (index >= 0 && index < kNumConfigs)
        return kConfigs[index].name;
    if (index == kSm75Config)
        return "sm75 fallback m16 n64";
#ifdef INT4SERVE_GEMM_SM90
    if (index >= kSm90First && index < kSm90First + sm90_count())
        return sm90_config_name(index - kSm90First);
#endif
    if (index >= stream_first() && index < stream_first() + stream_config_count())
        return stream_config_name(index - stream_first());
    return NULL;
}

extern "C" size_t krn_int4_gemm_workspace_size(const struct krn_int4_gemm_layout *lay,
                                               int32_t max_m)
{
    if (!lay || max_m < 1 || !layout_ok(lay))
        return 0;
    int dev = 0, sms = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
        return 0;
    size_t need = 256;
    for (int ci = 0; ci < kNumConfigs; ci++) {
        size_t w = workspace_need(lay, ci, max_m, (long long)sms * kConfigs[ci].max_blocks_per_sm);
        if (w > need)
            need = w;
    }
#ifdef INT4SERVE_GEMM_SM90
    /* at most 2 resident blocks per SM for every sm_90a configuration */
    for (int ci = 0; ci < sm90_config_count(); ci++) {
        size_t w = kFixedBytes + sm90_workspace(ci, 2LL * sms);
        if (w > need)
            need = w;
    }
#endif
    return need;
}

extern "C" inf_status_t krn_int4_gemm(const struct krn_int4_gemm_args *args, struct inf_err *err)
{
    if (!args || !args->lay)
        return inf_err_set(err, INF_E_INVALID, "int4 gemm: NULL arguments");
    const krn_int4_gemm_layout *lay = args->lay;
    if (args->m < 0)
        return inf_err_set(err, INF_E_INVALID, "int4 gemm: m=%d", (int)args->m);
    if (args->acc_taken)
        *args->acc_taken = 0; /* C written, unless the sm_80 launch below takes acc */
    if ((args->flags & KRN_INT4_GEMM_ACC64) &&
        (!args->acc || (uintptr_t)args->acc % 8 || (uintptr_t)args->acc_clear % 8 ||
         args->acc_clear_words < 0))
        return inf_err_set(err, INF_E_INVALID,
                           "int4 gemm: KRN_INT4_GEMM_ACC64 needs 8-byte aligned acc and acc_clear");
    if (args->m == 0)
        return INF_OK;
    if (!args->a || !args->b || !args->c || !args->workspace)
        return inf_err_set(err, INF_E_INVALID, "int4 gemm: NULL device pointer");
    if ((uintptr_t)args->workspace % 16)
        return inf_err_set(err, INF_E_UNSUPPORTED, "int4 gemm: workspace not 16-byte aligned");
    if (!layout_ok(lay))
        return inf_err_set(err, INF_E_UNSUPPORTED,
                           "int4 gemm: layout n=%d k=%d n_pad=%d k_pad=%d group_steps=%d not "
                           "supported by this build",
                           (int)lay->n, (int)lay->k, (int)lay->n_pad, (int)lay->k_pad,
                           (int)lay->group_steps);
    if ((uintptr_t)args->b % 16 || (uintptr_t)args->a % 2 || (uintptr_t)args->c % 2 ||
        (uintptr_t)args->bias % 2)
        return inf_err_set(err, INF_E_UNSUPPORTED,
                           "int4 gemm: misaligned pointer (weights need 16 bytes, fp16 2)");
    if (args->m > (1 << 24))
        return inf_err_set(err, INF_E_UNSUPPORTED, "int4 gemm: m=%d too large", (int)args->m);
    if (args->config < -1 || args->config >= krn_int4_gemm_config_count())
        return inf_err_set(err, INF_E_UNSUPPORTED, "int4 gemm: no configuration %d",
                           (int)args->config);

    int dev = 0, major = 0, sms = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess)
        e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    if (e == cudaSuccess)
        e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (e != cudaSuccess)
        return inf_err_set(err, INF_E_DEVICE, "int4 gemm: %s", cudaGetErrorString(e));

    if ((args->flags & KRN_INT4_GEMM_GLU) && (lay->n % 16 || (uintptr_t)args->c % 4))
        return inf_err_set(err, INF_E_UNSUPPORTED,
                           "int4 gemm: GLU output needs n %% 16 == 0 (n=%d) and C 4-byte aligned",
                           (int)lay->n);
    const bool glu = (args->flags & KRN_INT4_GEMM_GLU) != 0;
    Params p = params_of(lay, args->b);
    p.a = reinterpret_cast<const half *>(args->a);
    p.bias = reinterpret_cast<const half *>(args->bias);
    p.c = reinterpret_cast<half *>(args->c);
    p.m = args->m;
    const int av = lay->k % 8 == 0 && (uintptr_t)args->a % 16 == 0;
    p.c_vec = lay->n % 2 == 0 && (uintptr_t)args->c % 4 == 0;
    cudaStream_t stream = static_cast<cudaStream_t>(args->stream);

    /* Dispatch: Turing (or a forced fallback) takes the sm_75 kernel; Hopper
     * the sm_90a wgmma kernel (below) where it applies; sm_80 and newer the
     * mma.sync m16n8k16 pipeline. */
    const bool fallback =
        (args->flags & KRN_INT4_GEMM_FORCE_SM75) || major < 8 || args->config == kSm75Config;
    if (fallback) {
        p.m_tiles = ceil_div(p.m, 16);
        p.n_tiles = p.n_pad / 64;
        if (p.m_tiles > 65535)
            return inf_err_set(err, INF_E_UNSUPPORTED, "int4 gemm (sm75): m=%d too large",
                               (int)p.m);
        e = launch_sm75(p, glu, stream);
        if (e == cudaSuccess)
            e = cudaGetLastError();
        if (e != cudaSuccess)
            return inf_err_set(err, INF_E_DEVICE, "int4 gemm (sm75): %s", cudaGetErrorString(e));
        return INF_OK;
    }

    /* M <= 8: the one-round stream kernel (int4_gemm_stream.cu), where it
     * can run (stream_choice); a forced stream configuration it cannot run
     * takes the automatic choice. */
    {
        int out = kStreamOutC;
        const int vi = stream_choice(args, p, glu, dev, sms, &out);
        if (vi >= 0) {
            AccParams x = {};
            if (out == kStreamOutAcc) {
                x = acc_params_of(args);
            } else { /* the workspace's counters and words (stream_choice checked its size) */
                unsigned char *ws = static_cast<unsigned char *>(args->workspace);
                p.counters = reinterpret_cast<int *>(ws);
                p.partials = reinterpret_cast<float *>(ws + kCounterBytes);
            }
            e = launch_stream(p, x, vi, out, stream);
            if (e == cudaSuccess)
                e = cudaGetLastError();
            if (e != cudaSuccess)
                return inf_err_set(err, INF_E_DEVICE, "int4 gemm (stream): %s",
                                   cudaGetErrorString(e));
            if (args->acc_taken)
                *args->acc_taken = out == kStreamOutAcc;
            return INF_OK;
        }
    }

#ifdef INT4SERVE_GEMM_SM90
    /* Hopper: the wgmma kernel where the H200 sweep found it faster
     * (sm90_auto_choice), when it can run these operands (k % 8 == 0, A
     * 16-byte aligned); a forced sm_90a configuration it cannot run takes the
     * automatic sm_80 choice below. */
    const int auto90 = args->config == -1 ? sm90_auto_choice(p.m, lay) : -1;
    const bool forced90 = args->config >= kSm90First && args->config < stream_first();
    const bool want90 = auto90 >= 0 || forced90;
    if (major == 9 && want90 && sm90_supported(p) &&
        (!glu || sm90_glu_available(forced90 ? args->config - kSm90First : auto90, p))) {
        const int c9 = forced90 ? args->config - kSm90First : auto90;
        sm90_tiling(p, c9);
        const long long units9 = (long long)p.m_tiles * p.n_tiles * p.k_tiles;
        if (units9 > (1LL << 30))
            return inf_err_set(err, INF_E_UNSUPPORTED, "int4 gemm: m=%d n=%d k=%d too large",
                               (int)p.m, (int)p.n, (int)p.k);
        p.units = (int)units9;
        const long long slots9 = sm90_grid(dev, sms, c9, p, &e);
        if (e != cudaSuccess)
            return inf_err_set(err, INF_E_DEVICE, "int4 gemm (sm90): %s", cudaGetErrorString(e));
        const long long grid9 = launch_grid(slots9, p, args->flags);
        const inf_status_t st =
            bind_workspace(p, args, kFixedBytes + sm90_workspace(c9, grid9), err);
        if (st != INF_OK)
            return st;
        e = launch_sm90(p, c9, grid9, glu, stream);
        if (e == cudaSuccess)
            e = cudaGetLastError();
        if (e != cudaSuccess)
            return inf_err_set(err, INF_E_DEVICE, "int4 gemm (sm90): %s", cudaGetErrorString(e));
        return INF_OK;
    }
#endif
    const int ci =
        args->config >= 0 && args->config < kNumConfigs ? args->config : auto_config(p.m, lay);
    const Config &c = kConfigs[ci];
    const int zp = lay->symmetric ? 0 : 1;
    /* a 16-row tile: swapped operands, one token half up to M = 8 (half the
     * mma), two up to 16 (see the top) */
    const int sw = p.m <= 8 && c.swapped[zp][av] && !tiny_weight(lay) &&
                           !(args->flags & KRN_INT4_GEMM_NO_SWAP)
                       ? 1
                       : 0;
    const KernelFn plain = glu ? (av ? c.glu[zp][sw] : nullptr) : sw ? c.swapped[zp][av] : c.kernel[zp][av];
    if (!plain)
        return inf_err_set(err, INF_E_UNSUPPORTED,
                           "int4 gemm: no GLU variant of %s%s (the automatic choice's "
                           "configurations, A rows 16-byte aligned)",
                           c.name, av ? "" : " for these A rows");
    const int bk = c.bk;
    p.m_tiles = ceil_div(p.m, c.bm);
    p.n_tiles = p.n_pad / c.bn;
    p.k_tiles = p.k_pad / bk;
    const long long units = (long long)p.m_tiles * p.n_tiles * p.k_tiles;
    if (units > (1LL << 30))
        return inf_err_set(err, INF_E_UNSUPPORTED, "int4 gemm: m=%d n=%d k=%d too large", (int)p.m,
                           (int)p.n, (int)p.k);
    p.units = (int)units;
    p.slot_rows = p.m < c.bm ? p.m : c.bm;
    /* The grid of kernel fn (output mode out_mode) at its occupancy. */
    auto grid_of = [&](KernelFn fn, int out_mode, long long *g) {
        int occ = 0;
        const cudaError_t oe = occupancy(dev, ci, zp, av, sw, out_mode, fn, &occ);
        if (oe == cudaSuccess)
            *g = launch_grid((long long)sms * (occ < c.max_blocks_per_sm ? occ : c.max_blocks_per_sm),
                             p, args->flags);
        return oe;
    };
    /* Fixed-point sums where asked and compiled, not on tiny weights (whose
     * rows keep the same bits at every M), and while no output word takes
     * more than kAcc64MaxParts contributions (blocks hold units / grid or one
     * more, in stripes). */
    KernelFn fn = plain;
    AccParams x = {};
    long long grid = 0;
    /* With GLU the words are the gate and up sums in the weight's column
     * order (krn_int4_gemm_acc_reduce_glu finishes them). */
    bool use_acc = (args->flags & KRN_INT4_GEMM_ACC64) && !p.bias && av && c.acc[zp][sw] &&
                   !tiny_weight(lay);
    if (use_acc) {
        e = grid_of(c.acc[zp][sw], 2, &grid);
        if (e != cudaSuccess)
            return inf_err_set(err, INF_E_DEVICE, "int4 gemm: %s", cudaGetErrorString(e));
        const long long per_block = p.units / grid;
        use_acc = (p.k_tiles + per_block - 1) / per_block + 1 <= krncuda::kAcc64MaxParts;
        if (use_acc) {
            fn = c.acc[zp][sw];
            x = acc_params_of(args);
        }
    }
    if (!use_acc) {
        e = grid_of(plain, glu ? 1 : 0, &grid);
        if (e != cudaSuccess)
            return inf_err_set(err, INF_E_DEVICE, "int4 gemm: %s", cudaGetErrorString(e));
    }
    const inf_status_t st = bind_workspace(p, args, workspace_need(lay, ci, p.m, grid), err);
    if (st != INF_OK)
        return st;

    /* Programmatic dependent launch: the kernel may start while the previous
     * one in the stream drains; it waits (griddepcontrol.wait) before it
     * reads A or writes anything. Also inside stream capture. */
    e = krncuda::launch_pdl(fn, dim3((unsigned)grid), dim3(kThreads), (size_t)c.smem, stream, p, x);
    if (e == cudaSuccess)
        e = cudaGetLastError();
    if (e != cudaSuccess)
        return inf_err_set(err, INF_E_DEVICE, "int4 gemm: %s", cudaGetErrorString(e));
    if (args->acc_taken)
        *args->acc_taken = use_acc;
    return INF_OK;
}

/* C from the fixed-point sums of an ACC64 launch, which are zeroed. One
 * thread per output. */
__global__ void acc_reduce_kernel(long long *acc, half *c, int64_t ldc, int m, int n)
{
    krncuda::pdl_enter(false);
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t)m * n)
        return;
    const int64_t r = i / n, col = i % n;
    c[r * ldc + col] = __float2half_rn(krncuda::acc64_value(__ldcg(acc + i)));
    acc[i] = 0;
}

extern "C" inf_status_t krn_int4_gemm_acc_reduce(int64_t *acc, uint16_t *c, int64_t ldc,
                                                 int32_t m, int32_t n, void *stream,
                                                 struct inf_err *err)
{
    if (!acc || !c || m < 1 || n < 1 || ldc < n)
        return inf_err_set(err, INF_E_INVALID, "int4 gemm acc reduce: arguments");
    const int64_t total = (int64_t)m * n;
    const cudaError_t e = krncuda::launch_pdl(
        acc_reduce_kernel, dim3((unsigned)((total + 255) / 256)), dim3(256), 0,
        static_cast<cudaStream_t>(stream), reinterpret_cast<long long *>(acc),
        reinterpret_cast<half *>(c), ldc, (int)m, (int)n);
    if (e != cudaSuccess)
        return inf_err_set(err, INF_E_DEVICE, "int4 gemm acc reduce: %s", cudaGetErrorString(e));
    return krncuda::launched("int4 gemm acc reduce", err);
}

/* SiLU(g) u from the fixed-point sums of a GLU weight's ACC64 launch, two
 * outputs a thread: gate columns 16 (j / 8) + j % 8 and + 1 (one 16-byte
 * load), their up columns eight on; the words are zeroed. */
__global__ void acc_reduce_glu_kernel(long long *acc, half *c, int64_t ldc, int m, int n)
{
    krncuda::pdl_enter(krncuda::pdl_early(m));
    const int half_n = n / 2;
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t)m * (half_n / 2))
        return;
    const int64_t r = i / (half_n / 2);
    const int j = 2 * (int)(i % (half_n / 2)), col = (j / 8) * 16 + j % 8;
    longlong2 *gp = reinterpret_cast<longlong2 *>(acc + r * n + col);
    longlong2 *up = reinterpret_cast<longlong2 *>(acc + r * n + col + 8);
    const longlong2 g = __ldcg(gp), u = __ldcg(up);
    *reinterpret_cast<half2 *>(c + r * ldc + j) = __floats2half2_rn(
        glu_one(krncuda::acc64_value(g.x), krncuda::acc64_value(u.x)),
        glu_one(krncuda::acc64_value(g.y), krncuda::acc64_value(u.y)));
    *gp = make_longlong2(0, 0);
    *up = make_longlong2(0, 0);
}

extern "C" inf_status_t krn_int4_gemm_acc_reduce_glu(int64_t *acc, uint16_t *c, int64_t ldc,
                                                     int32_t m, int32_t n, void *stream,
                                                     struct inf_err *err)
{
    if (!acc || !c || m < 1 || n < 16 || n % 16 || ldc < n / 2 || ldc % 2 ||
        (uintptr_t)acc % 16 || (uintptr_t)c % 4)
        return inf_err_set(err, INF_E_INVALID, "int4 gemm acc reduce (GLU): arguments");
    const int64_t total = (int64_t)m * (n / 4);
    const cudaError_t e = krncuda::launch_pdl(
        acc_reduce_glu_kernel, dim3((unsigned)((total + 255) / 256)), dim3(256), 0,
        static_cast<cudaStream_t>(stream), reinterpret_cast<long long *>(acc),
        reinterpret_cast<half *>(c), ldc, (int)m, (int)n);
    if (e != cudaSuccess)
        return inf_err_set(err, INF_E_DEVICE, "int4 gemm acc reduce (GLU): %s",
                           cudaGetErrorString(e));
    return krncuda::launched("int4 gemm acc reduce (GLU)", err);
}

extern "C" inf_status_t krn_int4_dequant_f16(const struct krn_int4_gemm_layout *lay, const void *b,
                                             uint16_t *w, int64_t ldw, void *stream,
                                             struct inf_err *err)
{
    if (!lay || !b || !w)
        return inf_err_set(err, INF_E_INVALID, "int4 dequant: NULL argument");
    if (!layout_ok(lay) || ldw < lay->k || (uintptr_t)b % 16 || (uintptr_t)w % 2)
        return inf_err_set(err, INF_E_UNSUPPORTED, "int4 dequant: layout, ldw=%lld or alignment",
                           (long long)ldw);
    Params p = params_of(lay, b);
    const int vec = ldw % 8 == 0 && (uintptr_t)w % 16 == 0; /* 16-byte row pieces */
    const int64_t units = (int64_t)(lay->n_pad / 64) * (lay->k_pad / 128);
    /* persistent: as many blocks as fit at once (the loop strides by the grid) */
    static int resident_cache[kMaxDevices][2]; /* blocks per SM; racing writers agree */
    int dev = 0, sms = 0, per_sm = 0;
    const int zp = lay->symmetric ? 0 : 1;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess)
        e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (e == cudaSuccess && dev >= 0 && dev < kMaxDevices)
        per_sm = resident_cache[dev][zp];
    if (e == cudaSuccess && per_sm <= 0) {
        e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(
            &per_sm, zp ? int4_dequant_kernel<true> : int4_dequant_kernel<false>, kDqThreads, 0);
        if (e == cudaSuccess && dev >= 0 && dev < kMaxDevices)
            resident_cache[dev][zp] = per_sm;
    }
    if (e != cudaSuccess)
        return inf_err_set(err, INF_E_DEVICE, "int4 dequant: %s", cudaGetErrorString(e));
    const int64_t resident = (int64_t)sms * (per_sm > 0 ? per_sm : 1);
    const unsigned grid = (unsigned)(units < resident ? units : resident);
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    half *wh = reinterpret_cast<half *>(w);
    if (lay->symmetric)
        int4_dequant_kernel<false><<<grid, kDqThreads, 0, s>>>(p, wh, ldw, vec);
    else
        int4_dequant_kernel<true><<<grid, kDqThreads, 0, s>>>(p, wh, ldw, vec);
    e = cudaGetLastError();
    if (e != cudaSuccess)
        return inf_err_set(err, INF_E_DEVICE, "int4 dequant: %s", cudaGetErrorString(e));
    return INF_OK;
}
