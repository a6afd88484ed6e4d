/*
 * attn_decode.cu — paged attention for decode steps on tensor cores
 * (kernels/attn_cuda.h), head_dim <= 128. Decode reads every K/V byte of
 * the batch once for very little arithmetic, so the kernel is built to
 * keep the memory system busy: many 16-byte copies in flight per SM and
 * little instruction overhead per key.
 * Work     one block per item: up to 16 query rows sharing one KV head (a
 *          whole GQA group; MHA uses one row of the 16) over keys [k0, k1)
 *          of one sequence. With a sliding window the list starts k0 at the
 *          block of the window's first key, so the blocks before it are
 *          never read, and the keys of that block before the window are
 *          masked.
 * Mapping  NW warps; the item's keys are cut into tiles of 16 and warp w
 *          takes tiles w, w + NW, ... with its own online-softmax state, so
 *          the main loop has no block-wide barrier. Each warp owns an
 *          S-stage ring in shared memory (K tile, V tile: 16 rows of HDP
 *          halves each) filled by cp.async.cg (16 bytes, L1 bypassed; rows
 *          past k1 and dims past head_dim are zero-filled by a source size
 *          of 0), S - 1 tiles in flight while one is computed:
 *            S = Q K^T  mma.sync m16n8k16; Q's A fragments stay in registers
 *                       for the whole item, K's B fragments come from
 *                       ldmatrix.x4 (rows = keys, 16-byte chunks swizzled by
 *                       chunk ^ (key & 7) so the 8 rows of a matrix hit 8
 *                       different bank groups);
 *            softmax    scores in log2 units (scale * log2 e), each row's
 *                       max over the quad of lanes that holds it (two xor
 *                       shuffles), the sum kept per lane and reduced once at
 *                       the end; the O rescale is skipped when no row's max
 *                       moved;
 *            O += P V   P rounded to fp16 in place as the A fragment, V's B
 *                       fragments from ldmatrix.x4.trans.
 *          At the end the warps' (max, sum, O) meet in shared memory (over
 *          the rings) and the block writes out, or its partial. Split items
 *          then count themselves in the group's arrival counter (one
 *          acq_rel atomic a block); the last one combines the group's
 *          partials (each thread loads every split's max, sum and float4 of
 *          accumulators at once, eight splits a round, so one L2 round trip
 *          for up to eight) and resets the counter, so a split step is still
 *          one launch. A partial slot here is acc [16][head_dim], then
 *          max [16], then sum [16] (fp32, log2 units for the max).
 * RoPE     optional (p.rope_inv_freq, a decode step whose q/k rows are not
 *          rotated yet): each item rotates its query rows in registers, the
 *          copies zero-fill the token's own key (so every tile is requested
 *          before the wait), and the warp whose tile holds that key rotates
 *          the token's k head, writes it and the v head into the pools and
 *          over the zeros in its tile (kernels/cuda/rope.cuh: the values of
 *          krn_cuda_rope_kv, bit for bit).
 * Words    optional with the RoPE (p.q_words): the q/k/v rows are the INT4
 *          GEMM's fixed-point sums, not fp16 (the projection then has no
 *          split-K tail). After the wait every thread of the block loads its
 *          share of the item's query rows and, in the item holding the
 *          token's position, of its k and v heads (16-byte loads, all
 *          issued at once: one L2 round trip), converts them as
 *          krn_int4_gemm_acc_reduce does and stores them in shared memory;
 *          the fragments and the token's k/v come from there. (Converted
 *          per lane straight into the fragments, 32 16-byte loads a lane,
 *          the 32-layer decode step was 24 us slower than from fp16 rows;
 *          staged, 64 us faster; docs/CUDA.md.)
 * Numerics fp16 inputs, fp32 scores, softmax and accumulation (exp2f on
 *          log2-scaled scores), P rounded to fp16 for P.V, one rounding to
 *          fp16 at the output.
 * Arch     sm_80+ (cp.async, ldmatrix, mma.sync m16n8k16); the dynamic
 *          shared memory (up to 128 KB) is raised per device before use.
 *          The sm_75 path (T75, krncuda::sm75_paths()) is the same kernel
 *          with its copies as 16-byte loads into registers and stores
 *          (every load of a tile issued before its stores) and each
 *          m16n8k16 as two m16n8k8: ldmatrix and m16n8k8 are sm_75's.
 */
#include "kernels/cuda/acc64.cuh"
#include "kernels/cuda/attn_decode.cuh"
#include "kernels/cuda/fp8.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/rope.cuh"

#include <math.h>

namespace krnattn
{
namespace
{

constexpr int R = kDecodeRows, TK = kDecodeTile;

__device__ __forceinline__ uint32_t smem_u32(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* 16 bytes global -> shared, L1 bypassed; src_bytes 0 writes zeros. The
 * cp.async helpers trap where the code is built for sm_75, whose kernels
 * never take them (T75 below). */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#define KRN_NO_CP_ASYNC 1
#endif
__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, int src_bytes)
{
#ifdef KRN_NO_CP_ASYNC
    __trap();
#else
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(src_bytes)
                 : "memory");
#endif
}

__device__ __forceinline__ void cp_async_commit()
{
#ifdef KRN_NO_CP_ASYNC
    __trap();
#else
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

template <int N> __device__ __forceinline__ void cp_async_wait()
{
#ifdef KRN_NO_CP_ASYNC
    __trap();
#else
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

/* The sm_75 paths (T75) have no cp.async: the copies are loads into
 * registers, all of a tile's issued before its stores, so commit and wait
 * do nothing there. */
template <bool T75> __device__ __forceinline__ void ring_commit()
{
    if (!T75)
        cp_async_commit();
}

template <bool T75, int N> __device__ __forceinline__ void ring_wait()
{
    if (!T75)
        cp_async_wait<N>();
}

__device__ __forceinline__ void sts128(uint32_t a, uint4 v)
{
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(a), "r"(v.x), "r"(v.y),
                 "r"(v.z), "r"(v.w));
}

__device__ __forceinline__ void ldsm_x4(uint32_t *r, uint32_t addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}

__device__ __forceinline__ void ldsm_x4_trans(uint32_t *r, uint32_t addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}

using krncuda::mma_k16;
using krncuda::pack_half2;
using krncuda::pack_halves;

/* p.q_words: the item's query rows (R rows of QS pairs) and, for the item
 * whose keys hold its token's position, that token's k and v heads (HDP / 2
 * pairs each, after the rows) from the words into shared memory, every
 * thread's loads issued at once (one L2 round trip), then a barrier. */
template <int HDP, int NT, int QS>
__device__ __forceinline__ void stage_words(const krn_cuda_attn_params &p,
                                            const krn_cuda_attn_item &it, uint32_t *s)
{
    constexpr int PR = HDP / 2;                /* pairs a row */
    constexpr int QU = (R * PR + NT - 1) / NT; /* query pairs a thread, at most */
    constexpr int KU = (HDP + NT - 1) / NT;    /* k and v pairs a thread, at most */
    const int tid = threadIdx.x, hd = p.head_dim, G = p.n_heads / p.n_kv_heads;
    const int nq = it.nrows * PR;
    const bool own = it.k0 <= it.p_first && it.p_first < it.k1;
    longlong2 qv[QU], kv[KU];
#pragma unroll
    for (int u = 0; u < QU; u++) {
        const int e = tid + u * NT, r = e / PR, d = (e - r * PR) * 2, rr = it.row0 + r;
        qv[u] = make_longlong2(0, 0);
        if (e < nq && d < hd)
            qv[u] = __ldcg(reinterpret_cast<const longlong2 *>(
                p.q_words + (int64_t)(it.t_first + rr / G) * p.ldw +
                (int64_t)(it.kvh * G + rr % G) * hd + d));
    }
#pragma unroll
    for (int u = 0; u < KU; u++) {
        const int e = tid + u * NT, d = (e % PR) * 2;
        kv[u] = make_longlong2(0, 0);
        if (own && e < HDP && d < hd)
            kv[u] = __ldcg(reinterpret_cast<const longlong2 *>(
                (e < PR ? p.q_words + (int64_t)(p.n_heads + it.kvh) * hd
                        : p.v_words + (int64_t)it.kvh * hd) +
                (int64_t)it.t_first * p.ldw + d));
    }
#pragma unroll
    for (int u = 0; u < QU; u++) {
        const int e = tid + u * NT, r = e / PR;
        if (e < nq)
            s[r * QS + (e - r * PR)] =
                pack_half2(krncuda::acc64_value(qv[u].x), krncuda::acc64_value(qv[u].y));
    }
#pragma unroll
    for (int u = 0; u < KU; u++) {
        const int e = tid + u * NT;
        if (own && e < HDP)
            s[R * QS + e] =
                pack_half2(krncuda::acc64_value(kv[u].x), krncuda::acc64_value(kv[u].y));
    }
    __syncthreads();
}

/* Shared-memory byte offset of 16-byte chunk ch of row `key` in a tile of
 * HDP halves per row, swizzled. */
template <int HDP> __device__ __forceinline__ uint32_t swz(int key, int ch)
{
    return (uint32_t)((key * HDP + ((ch ^ (key & 7)) * 8)) * 2);
}

/* The same in a tile of E4M3 rows (HDP bytes). The lanes read whole pieces
 * of rows themselves (no ldmatrix for 8-bit elements before sm_100), so
 * the swizzle is chosen for those reads: for HDP 128 a quarter warp's K
 * loads take rows 2i, 2i + 1 and chunks 0-3 (or 4-7), its V loads rows 2t
 * (or 2t + 1) of four t and two chunks, and key & 6 ^ (key & 1) << 2 puts
 * both on 32 different banks; for HDP 64 (rows of 4 chunks, 64-bit reads)
 * key & 2 keeps the K reads apart, the V reads conflict two ways. */
template <int HDP> __device__ __forceinline__ uint32_t swz8(int key, int ch)
{
    const int f = HDP == 128 ? ((key & 6) ^ ((key & 1) << 2)) : (key & 2);
    return (uint32_t)(key * HDP + ((ch ^ f) * 16));
}

template <int HDP, bool F8> __device__ __forceinline__ uint32_t tile_off(int key, int ch)
{
    return F8 ? swz8<HDP>(key, ch) : swz<HDP>(key, ch);
}

/* A stage's ring: S stages of a K and a V tile; at least the warp's final
 * (O, max, sum) exchange. */
template <int HDP, int S, bool F8> __host__ __device__ constexpr int ring_bytes()
{
    return S * 2 * TK * HDP * (F8 ? 1 : 2) > R * (HDP + 4) * 4 + 2 * R * 4
               ? S * 2 * TK * HDP * (F8 ? 1 : 2)
               : R * (HDP + 4) * 4 + 2 * R * 4;
}

__device__ __forceinline__ uint4 lds128(uint32_t a)
{
    uint4 v;
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "r"(a));
    return v;
}

__device__ __forceinline__ uint2 lds64(uint32_t a)
{
    uint2 v;
    asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "r"(a));
    return v;
}

__device__ __forceinline__ void sts64(uint32_t a, uint2 v)
{
    asm volatile("st.shared.v2.b32 [%0], {%1, %2};\n" ::"r"(a), "r"(v.x), "r"(v.y) : "memory");
}

/* The dims of E4M3 tiles are permuted for the lanes' own reads (the dot
 * products and P.V do not care in which order they sum): in Q K^T, lane
 * t's four k values of k-step ks are four consecutive dims, the k-steps of
 * one half of the head taking a lane's HDP / 8 consecutive dims
 * (pairing d with d + HDP / 2 as the RoPE does); in P V, n-tile n column g
 * is dim g * (HDP / 8) + n, so a lane reads HDP / 8 consecutive bytes of
 * each of its four keys. The dim of A fragment register i of k-step ks: */
template <int HDP, bool F8> __device__ __forceinline__ int qdim(int ks, int i, int t)
{
    constexpr int KS2 = HDP / 32; /* k-steps a half */
    return F8 ? (ks / KS2) * (HDP / 2) + t * (HDP / 8) + (ks % KS2) * 4 + (i >> 1) * 2
              : ks * 16 + 2 * t + (i >> 1) * 8;
}

template <int HDP, int NW, int S, bool F8, bool T75>
__global__ void __launch_bounds__(NW * 32) decode_kernel(const krn_cuda_attn_params p)
{
    constexpr int EB = F8 ? 1 : 2;         /* bytes an element */
    constexpr int RB = HDP * EB;           /* bytes a K/V row of a tile */
    constexpr int CH = RB / 16;            /* 16-byte chunks per K/V row */
    constexpr int CE = 16 / EB;            /* elements a chunk */
    constexpr int KSTEPS = HDP / 16;       /* mma k-steps of Q K^T */
    constexpr int KS2 = KSTEPS / 2;        /* of one half of the head */
    constexpr int NT_O = HDP / 8;          /* mma n-tiles of O */
    constexpr int KEYS_PER_PASS = 32 / CH; /* rows one warp-wide copy covers */
    constexpr int PASSES = TK / KEYS_PER_PASS;
    constexpr int RING = ring_bytes<HDP, S, F8>();
    constexpr int OS = HDP + 4; /* row stride (floats) of O in the final exchange */
    constexpr int NT = NW * 32;
    static_assert(R * OS * 4 + 2 * R * 4 <= RING, "a warp's ring holds its final state");
    extern __shared__ __align__(128) unsigned char smem[];
    __shared__ int s_last;
    __shared__ float s_cos[HDP / 2], s_sin[HDP / 2]; /* the fused RoPE's angles */
    /* p.q_words: the item's query rows, then the token's k and v heads, as
     * fp16 pairs (query row stride QS: the 8 rows of a fragment load fall
     * in different banks) */
    constexpr int QS = HDP / 2 + 4;
    __shared__ __align__(16) uint32_t s_qkv[R * QS + HDP];
    /* Launched with programmatic dependent launch (krncuda::pdl_enter in
     * its two halves): the kernel before writes Q and the K/V of this step's
     * positions (>= it.p_first); the work list, the block table and the K/V
     * of earlier positions were in place before the step, so they may be
     * read before the wait. */
    const bool early = krncuda::pdl_early(p.rows);
    krncuda::pdl_enter_start(early);

    const krn_cuda_attn_item it = p.items[blockIdx.x];
    if (it.nrows <= 0)
        return; /* a padding item of a fixed-shape list: the whole block leaves */
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int hd = p.head_dim, G = p.n_heads / p.n_kv_heads;
    const int64_t kv_row = (int64_t)p.n_kv_heads * hd;
    const int32_t *bt = p.block_table + (int64_t)it.slot * p.max_blocks;
    const int bshift = __ffs(p.block) - 1, bmask = p.block - 1; /* block: a power of 2 */
    const uint32_t ring = smem_u32(smem) + (uint32_t)(warp * RING);

    const int n_tiles = (it.k1 - it.k0 + TK - 1) / TK;
    const int mine = n_tiles > warp ? (n_tiles - warp + NW - 1) / NW : 0;

    /* This lane's copies: chunk lc of rows lk, lk + KEYS_PER_PASS, ... */
    const int lc = lane % CH, lk = lane / CH;
    const bool chunk_ok = lc * CE < hd;
    const int64_t col = (int64_t)it.kvh * hd + lc * CE;
    const unsigned char *kb = reinterpret_cast<const unsigned char *>(p.k_pool);
    const unsigned char *vb = reinterpret_cast<const unsigned char *>(p.v_pool);
    /* The fused RoPE (p.rope_inv_freq, a decode step): the token's own
     * position (p_first) is not in the pools yet. Its row of the tile is
     * zero-filled by the copies, which therefore need not wait for the
     * kernel before, and the warp whose tile holds it puts the rotated K
     * and the V there itself (and into the pools), see below. */
    const bool rope = p.rope_inv_freq != nullptr;
    const int own_key = rope ? it.p_first : -1;
    /* The warp's i-th tile into stage i % S. */
    auto issue = [&](int i) {
        const int kt = it.k0 + (warp + i * NW) * TK;
        const uint32_t st = ring + (uint32_t)((i % S) * (RING / S));
        uint4 kr[T75 ? PASSES : 1], vr[T75 ? PASSES : 1];
#pragma unroll
        for (int u = 0; u < PASSES; u++) {
            const int key = lk + u * KEYS_PER_PASS, kp = kt + key;
            const bool ok = chunk_ok && kp < it.k1 && kp != own_key;
            int64_t off = 0;
            if (ok)
                off = (((int64_t)bt[kp >> bshift] << bshift) + (kp & bmask)) * kv_row + col;
            if (T75) {
                const uint4 z = make_uint4(0, 0, 0, 0);
                kr[T75 ? u : 0] = ok ? __ldcg(reinterpret_cast<const uint4 *>(kb + off * EB)) : z;
                vr[T75 ? u : 0] = ok ? __ldcg(reinterpret_cast<const uint4 *>(vb + off * EB)) : z;
                continue;
            }
            const uint32_t dst = st + tile_off<HDP, F8>(key, lc);
            cp_async16(dst, kb + off * EB, ok ? 16 : 0);
            cp_async16(dst + TK * RB, vb + off * EB, ok ? 16 : 0);
        }
        if (T75) {
#pragma unroll
            for (int u = 0; u < PASSES; u++) {
                const uint32_t dst = st + tile_off<HDP, F8>(lk + u * KEYS_PER_PASS, lc);
                sts128(dst, kr[T75 ? u : 0]);
                sts128(dst + TK * RB, vr[T75 ? u : 0]);
            }
        }
    };
    /* Start the ring before anything else, so Q's loads overlap it: the
     * stages whose keys all precede this step's positions while the kernel
     * before finishes, the rest after the wait (in order: stage s is
     * commit group s). */
    int pre = 0;
    for (; pre < S - 1; pre++) {
        if (pre < mine && !rope && it.k0 + (warp + pre * NW + 1) * TK > it.p_first)
            break;
        if (pre < mine)
            issue(pre);
        ring_commit<T75>();
    }
    /* The fused RoPE: the angles of the item's token before the wait
     * (positions and frequencies are in place before the step); after it,
     * the warp whose tile holds the token's position loads the token's k
     * head (rotated here) and v head: lane j < HDP / 16 a 16-byte piece of
     * pairs (pieces j and j + HDP / 16), the next HDP / 8 lanes a piece of
     * V each, loaded with the queries. They go into the pools at once and
     * into the tile once its copies have landed. */
    int own_i = -1, own_row = 0;
    uint4 nk0 = {}, nk1 = {}, nv = {};
    constexpr int NKP = HDP / 16, NVP = HDP / 8; /* pieces a lane holds: K pairs, V */
    if (rope) {
        krnrope::angles((float)p.rope_pos[it.t_first], p.rope_inv_freq, HDP / 2, s_cos, s_sin);
        __syncthreads();
        const int j = (it.p_first - it.k0) / TK;
        if (it.k0 <= it.p_first && it.p_first < it.k1 && j % NW == warp) {
            own_i = j / NW;
            own_row = (it.p_first - it.k0) % TK;
        }
    }
    krncuda::pdl_enter_wait(early);
    for (int s = pre; s < S - 1; s++) {
        if (s < mine)
            issue(s);
        ring_commit<T75>();
    }

    /* This lane's two rows (h = 0: row g, h = 1: row g + 8); rows past
     * nrows have zero queries and no causal limit (their output is never
     * written). */
    const __half *qg = reinterpret_cast<const __half *>(p.q);
    const __half zero = __float2half_rn(0.0f);
    const bool words = p.q_words != nullptr; /* with rope only */
    if (words)
        stage_words<HDP, NT, QS>(p, it, s_qkv);
    int lim[2], lo[2]; /* this row's keys: [lo, lim) */
    int64_t qoff[2];
    bool live[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int r = g + 8 * h, rr = it.row0 + r;
        live[h] = r < it.nrows;
        lim[h] = live[h] ? it.p_first + rr / G + 1 : 0x7fffffff;
        /* a sliding window: the list starts k0 at the block of the first
         * key, so only the keys of that block before it are masked */
        lo[h] = live[h] && p.window > 0 ? lim[h] - p.window : -0x7fffffff;
        qoff[h] = (int64_t)(it.t_first + rr / G) * p.ldq + (int64_t)(it.kvh * G + rr % G) * hd;
    }
    uint32_t qa[KSTEPS][4];
#pragma unroll
    for (int ks = 0; ks < KSTEPS; ks++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int h = i & 1, d = qdim<HDP, F8>(ks, i, t);
            __half lo = zero, hi = zero;
            if (live[h] && d < hd && words) { /* hd % 8 == 0: d + 1 < hd too */
                qa[ks][i] = s_qkv[(g + 8 * h) * QS + d / 2];
                continue;
            }
            if (live[h] && d < hd) {
                lo = qg[qoff[h] + d];
                hi = qg[qoff[h] + d + 1];
            }
            qa[ks][i] = pack_halves(lo, hi);
        }
    if (own_i >= 0 && lane < NKP + NVP) {
        const int64_t prow = p.kv_map[it.t_first];
        if (lane < NKP) {
            const int64_t kc = (int64_t)(p.n_heads + it.kvh) * HDP + lane * 8;
            if (words) {
                const uint4 *ks4 = reinterpret_cast<const uint4 *>(s_qkv + R * QS);
                nk0 = ks4[lane];
                nk1 = ks4[lane + HDP / 16];
            } else {
                const __half *kx =
                    reinterpret_cast<const __half *>(p.q) + (int64_t)it.t_first * p.ldq + kc;
                nk0 = *reinterpret_cast<const uint4 *>(kx);
                nk1 = *reinterpret_cast<const uint4 *>(kx + HDP / 2);
            }
            krnrope::rotate8(nk0, nk1, s_cos, s_sin, lane * 8);
            if (F8) { /* the codes go into the pool and the tile */
                const uint2 e0 = krnfp8::encode8(nk0, p.k_scale),
                            e1 = krnfp8::encode8(nk1, p.k_scale);
                nk0 = make_uint4(e0.x, e0.y, 0, 0);
                nk1 = make_uint4(e1.x, e1.y, 0, 0);
                if (prow >= 0) {
                    unsigned char *kd =
                        const_cast<unsigned char *>(kb) + prow * kv_row + (int64_t)it.kvh * HDP;
                    *reinterpret_cast<uint2 *>(kd + lane * 8) = e0;
                    *reinterpret_cast<uint2 *>(kd + lane * 8 + HDP / 2) = e1;
                }
            } else if (prow >= 0) {
                __half *kd = reinterpret_cast<__half *>(const_cast<uint16_t *>(p.k_pool)) +
                             prow * kv_row + (int64_t)it.kvh * HDP;
                *reinterpret_cast<uint4 *>(kd + lane * 8) = nk0;
                *reinterpret_cast<uint4 *>(kd + lane * 8 + HDP / 2) = nk1;
            }
        } else {
            const int c = lane - NKP;
            const int64_t vc = (int64_t)it.kvh * HDP + c * 8;
            nv = words
                     ? reinterpret_cast<const uint4 *>(s_qkv + R * QS + HDP / 2)[c]
                     : *reinterpret_cast<const uint4 *>(reinterpret_cast<const __half *>(p.v_new) +
                                                        (int64_t)it.t_first * p.ldv + vc);
            if (F8) {
                const uint2 e = krnfp8::encode8(nv, p.v_scale);
                nv = make_uint4(e.x, e.y, 0, 0);
                if (prow >= 0)
                    *reinterpret_cast<uint2 *>(const_cast<unsigned char *>(vb) + prow * kv_row +
                                               (int64_t)it.kvh * HDP + c * 8) = e;
            } else if (prow >= 0)
                *reinterpret_cast<uint4 *>(
                    reinterpret_cast<__half *>(const_cast<uint16_t *>(p.v_pool)) + prow * kv_row +
                    (int64_t)it.kvh * HDP + c * 8) = nv;
        }
    }
    if (rope) { /* element d of a lane's A fragments pairs with d + HDP / 2, KSTEPS / 2 on */
#pragma unroll
        for (int ks = 0; ks < KSTEPS / 2; ks++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                krnrope::rotate2(qa[ks][i], qa[ks + KSTEPS / 2][i], s_cos, s_sin,
                                 qdim<HDP, F8>(ks, i, t));
            }
    }

    /* scores in log2 units; an E4M3 tile's halves are value / unit */
    const float sl2 = p.scale * 1.4426950408889634f * (F8 ? p.k_scale * krnfp8::unit() : 1.0f);
    float o[NT_O][4];
#pragma unroll
    for (int n = 0; n < NT_O; n++)
        o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
    const int vkey = (lane & 7) + ((lane >> 3) & 1) * 8; /* ldmatrix.trans row of V */

    for (int i = 0; i < mine; i++) {
        __syncwarp(); /* every lane is done reading the stage refilled next */
        if (i + S - 1 < mine)
            issue(i + S - 1);
        ring_commit<T75>();
        ring_wait<T75, S - 1>(); /* this lane's copies of tile i landed */
        __syncwarp();            /* ... and every lane's */
        const int kt = it.k0 + (warp + i * NW) * TK;
        const uint32_t ks_s = ring + (uint32_t)((i % S) * (RING / S));
        const uint32_t vs_s = ks_s + TK * RB;
        if (F8 && i == own_i) { /* the token's own codes, over the zeros its copy left */
            if (lane < NKP) {
                sts64(ks_s + swz8<HDP>(own_row, lane / 2) + (lane & 1) * 8,
                      make_uint2(nk0.x, nk0.y));
                sts64(ks_s + swz8<HDP>(own_row, HDP / 32 + lane / 2) + (lane & 1) * 8,
                      make_uint2(nk1.x, nk1.y));
            } else if (lane < NKP + NVP) {
                const int c = lane - NKP;
                sts64(vs_s + swz8<HDP>(own_row, c / 2) + (c & 1) * 8, make_uint2(nv.x, nv.y));
            }
            __syncwarp();
        } else if (i == own_i) { /* the token's own key, over the zeros its copy left */
            if (lane < NKP) {
                asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(
                                 ks_s + swz<HDP>(own_row, lane)),
                             "r"(nk0.x), "r"(nk0.y), "r"(nk0.z), "r"(nk0.w)
                             : "memory");
                asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(
                                 ks_s + swz<HDP>(own_row, lane + NKP)),
                             "r"(nk1.x), "r"(nk1.y), "r"(nk1.z), "r"(nk1.w)
                             : "memory");
            } else if (lane < NKP + NVP) {
                asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(
                                 vs_s + swz<HDP>(own_row, lane - NKP)),
                             "r"(nv.x), "r"(nv.y), "r"(nv.z), "r"(nv.w)
                             : "memory");
            }
            __syncwarp();
        }

        float sc[2][4];
#pragma unroll
        for (int j = 0; j < 2; j++) {
            sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.0f;
            if constexpr (F8) { /* key j * 8 + g: each half's HDP / 8 bytes at t * HDP / 8 */
                const int key = j * 8 + g;
#pragma unroll
                for (int hh = 0; hh < 2; hh++) {
                    uint32_t w[4];
                    if constexpr (HDP == 128) {
                        const uint4 v = lds128(ks_s + swz8<HDP>(key, hh * 4 + t));
                        w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
                    } else {
                        const uint2 v =
                            lds64(ks_s + swz8<HDP>(key, hh * 2 + (t >> 1)) + (t & 1) * 8);
                        w[0] = v.x, w[1] = v.y, w[2] = w[3] = 0;
                    }
#pragma unroll
                    for (int kl = 0; kl < KS2; kl++)
                        mma_k16<T75>(sc[j], qa[hh * KS2 + kl], krnfp8::h2(w[kl]),
                                     krnfp8::h2(w[kl] >> 16));
                }
            } else {
                const int key = j * 8 + (lane & 7);
#pragma unroll
                for (int k2 = 0; k2 < KSTEPS / 2; k2++) {
                    uint32_t b[4];
                    ldsm_x4(b, ks_s + swz<HDP>(key, 4 * k2 + (lane >> 3)));
                    mma_k16<T75>(sc[j], qa[2 * k2], b[0], b[1]);
                    mma_k16<T75>(sc[j], qa[2 * k2 + 1], b[2], b[3]);
                }
            }
        }
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int j = 0; j < 2; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int h = e >> 1, kp = kt + j * 8 + 2 * t + (e & 1);
                const float v =
                    (kp < it.k1 && kp < lim[h] && kp >= lo[h]) ? sc[j][e] * sl2 : -INFINITY;
                sc[j][e] = v;
                mx[h] = fmaxf(mx[h], v);
            }
        float corr[2], m_use[2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
            mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
            const float m_new = fmaxf(m_run[h], mx[h]);
            /* a row with no valid key yet keeps max -inf; 0 stands in so
             * that exp2 gives 0 rather than NaN */
            m_use[h] = m_new == -INFINITY ? 0.0f : m_new;
            corr[h] = exp2f(m_run[h] - m_use[h]);
            m_run[h] = m_new;
        }
        float sum[2] = {0.0f, 0.0f};
#pragma unroll
        for (int j = 0; j < 2; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float v = exp2f(sc[j][e] - m_use[e >> 1]);
                sc[j][e] = v;
                sum[e >> 1] += v;
            }
        l_run[0] = l_run[0] * corr[0] + sum[0];
        l_run[1] = l_run[1] * corr[1] + sum[1];
        if (__any_sync(0xffffffffu, corr[0] != 1.0f || corr[1] != 1.0f)) {
#pragma unroll
            for (int n = 0; n < NT_O; n++) {
                o[n][0] *= corr[0];
                o[n][1] *= corr[0];
                o[n][2] *= corr[1];
                o[n][3] *= corr[1];
            }
        }
        const uint32_t pa[4] = {pack_half2(sc[0][0], sc[0][1]), pack_half2(sc[0][2], sc[0][3]),
                                pack_half2(sc[1][0], sc[1][1]), pack_half2(sc[1][2], sc[1][3])};
        if constexpr (F8) { /* keys 2t, 2t + 1, 2t + 8, 2t + 9: HDP / 8 bytes each at g * HDP / 8 */
            constexpr int NWD = HDP / 32; /* words a key */
            uint32_t va[4][4];
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const int key = 2 * t + (q & 1) + (q >> 1) * 8;
                if constexpr (HDP == 128) {
                    const uint4 v = lds128(vs_s + swz8<HDP>(key, g));
                    va[q][0] = v.x, va[q][1] = v.y, va[q][2] = v.z, va[q][3] = v.w;
                } else {
                    const uint2 v = lds64(vs_s + swz8<HDP>(key, g >> 1) + (g & 1) * 8);
                    va[q][0] = v.x, va[q][1] = v.y, va[q][2] = va[q][3] = 0;
                }
            }
#pragma unroll
            for (int wd = 0; wd < NWD; wd++) {
                /* bytes 0, 1 and 2, 3 of keys 2t / 2t + 1 (lo) and 2t + 8 / 2t + 9 (hi),
                 * paired: each 16-bit half is one n-tile's pair of keys */
                const uint32_t lo01 = __byte_perm(va[0][wd], va[1][wd], 0x5140);
                const uint32_t lo23 = __byte_perm(va[0][wd], va[1][wd], 0x7362);
                const uint32_t hi01 = __byte_perm(va[2][wd], va[3][wd], 0x5140);
                const uint32_t hi23 = __byte_perm(va[2][wd], va[3][wd], 0x7362);
                mma_k16<T75>(o[4 * wd], pa, krnfp8::h2(lo01), krnfp8::h2(hi01));
                mma_k16<T75>(o[4 * wd + 1], pa, krnfp8::h2(lo01 >> 16), krnfp8::h2(hi01 >> 16));
                mma_k16<T75>(o[4 * wd + 2], pa, krnfp8::h2(lo23), krnfp8::h2(hi23));
                mma_k16<T75>(o[4 * wd + 3], pa, krnfp8::h2(lo23 >> 16), krnfp8::h2(hi23 >> 16));
            }
        } else {
#pragma unroll
            for (int n2 = 0; n2 < NT_O / 2; n2++) {
                uint32_t b[4];
                ldsm_x4_trans(b, vs_s + swz<HDP>(vkey, 2 * n2 + (lane >> 4)));
                mma_k16<T75>(o[2 * n2], pa, b[0], b[1]);
                mma_k16<T75>(o[2 * n2 + 1], pa, b[2], b[3]);
            }
        }
    }
    if (F8) { /* the V halves were value / unit */
        const float vf = p.v_scale * krnfp8::unit();
#pragma unroll
        for (int n = 0; n < NT_O; n++)
            o[n][0] *= vf, o[n][1] *= vf, o[n][2] *= vf, o[n][3] *= vf;
    }
    ring_wait<T75, 0>(); /* only empty groups can be left; the ring is free */
#pragma unroll
    for (int h = 0; h < 2; h++) { /* each lane summed its own columns */
        l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 1);
        l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 2);
    }

    /* The warps' states meet in shared memory, each over its own ring:
     * O [R][OS], then max [R], then sum [R] (fp32). */
    {
        __syncwarp();
        float *wf = reinterpret_cast<float *>(smem + warp * RING);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int r = g + 8 * h;
            if (r >= it.nrows)
                continue;
#pragma unroll
            for (int n = 0; n < NT_O; n++) { /* E4M3: column c of n-tile n is dim c * NT_O + n */
                wf[r * OS + (F8 ? 2 * t * NT_O + n : n * 8 + 2 * t)] = o[n][2 * h];
                wf[r * OS + (F8 ? (2 * t + 1) * NT_O + n : n * 8 + 2 * t + 1)] = o[n][2 * h + 1];
            }
            if (t == 0) {
                wf[R * OS + r] = m_run[h];
                wf[R * OS + R + r] = l_run[h];
            }
        }
    }
    __syncthreads();
    __half *og = reinterpret_cast<__half *>(p.out);
    for (int e = tid; e < it.nrows * hd; e += NT) {
        const int r = e / hd, d = e - r * hd;
        float M = -INFINITY;
#pragma unroll
        for (int w = 0; w < NW; w++)
            M = fmaxf(M, reinterpret_cast<const float *>(smem + w * RING)[R * OS + r]);
        float num = 0.0f, den = 0.0f;
#pragma unroll
        for (int w = 0; w < NW; w++) {
            const float *wf = reinterpret_cast<const float *>(smem + w * RING);
            const float m = wf[R * OS + r];
            if (m == -INFINITY)
                continue; /* a warp that saw no valid key (or none at all) */
            const float f = exp2f(m - M);
            num += f * wf[r * OS + d];
            den += f * wf[R * OS + R + r];
        }
        if (it.part < 0) {
            const int rr = it.row0 + r;
            og[(int64_t)(it.t_first + rr / G) * p.ldo + (int64_t)(it.kvh * G + rr % G) * hd + d] =
                __float2half_rn(num / den);
        } else { /* slot: acc [R][hd], then max [R], then sum [R] */
            float *slot = p.partials + (int64_t)it.part * R * (hd + 2);
            slot[r * hd + d] = num;
            if (d == 0) {
                slot[R * hd + r] = M;
                slot[R * hd + R + r] = den;
            }
        }
    }
    if (it.part < 0)
        return;

    /* A split: the group's last item to arrive combines. The block's
     * partial stores are ordered before its arrival by the barrier and the
     * arrival's release; the last arriver's acquire orders its loads of the
     * others' partials after theirs (the pattern of a split-K semaphore). */
    __syncthreads();
    const krn_cuda_attn_group grp = p.groups[it.group];
    if (tid == 0) {
        const int prev = krncuda::arrive_acq_rel(p.group_done + it.group);
        s_last = prev == grp.n_splits - 1;
        if (s_last)
            p.group_done[it.group] = 0; /* every item counted: ready for the next launch */
    }
    __syncthreads();
    if (!s_last)
        return;
    /* The group's items hold consecutive partial slots: this item is number
     * blockIdx.x - grp.item of them. A thread takes four output values of a
     * row and loads every split's max, sum and four accumulators of them at
     * once, eight splits a round (one L2 round trip for up to eight), merging
     * the rounds online: with at most eight splits the weights and sums are
     * those of one pass over all of them, in split order. */
    const int ns = grp.n_splits;
    const float *part0 =
        p.partials + (int64_t)(it.part - (int)(blockIdx.x - grp.item)) * R * (hd + 2);
    const int64_t sstride = (int64_t)R * (hd + 2);          /* floats per slot */
    constexpr int CW = 8;                                   /* splits a round */
    for (int e = tid * 4; e < it.nrows * hd; e += NT * 4) { /* hd % 8 == 0: one row */
        const int r = e / hd, d = e - r * hd;
        float M = -INFINITY, den = 0.0f;
        float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        for (int j0 = 0; j0 < ns; j0 += CW) {
            float mj[CW], lj[CW];
            float4 vj[CW];
#pragma unroll
            for (int u = 0; u < CW; u++) {
                mj[u] = -INFINITY;
                lj[u] = 0.0f;
                vj[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                if (j0 + u < ns) {
                    const float *sp = part0 + (j0 + u) * sstride;
                    mj[u] = __ldcg(sp + R * hd + r);
                    lj[u] = __ldcg(sp + R * hd + R + r);
                    vj[u] = __ldcg(reinterpret_cast<const float4 *>(sp + r * hd + d));
                }
            }
            float cm = M;
#pragma unroll
            for (int u = 0; u < CW; u++)
                cm = fmaxf(cm, mj[u]);
            if (cm == -INFINITY)
                continue;                    /* no split so far saw a valid key */
            if (M != -INFINITY && M != cm) { /* an earlier round's terms, rescaled */
                const float f = exp2f(M - cm);
                den *= f;
                acc.x *= f;
                acc.y *= f;
                acc.z *= f;
                acc.w *= f;
            }
            M = cm;
#pragma unroll
            for (int u = 0; u < CW; u++) {
                if (mj[u] == -INFINITY)
                    continue; /* a split that saw no valid key */
                const float w = exp2f(mj[u] - M);
                den += w * lj[u];
                acc.x += w * vj[u].x;
                acc.y += w * vj[u].y;
                acc.z += w * vj[u].z;
                acc.w += w * vj[u].w;
            }
        }
        const float inv = 1.0f / den;
        const int rr = it.row0 + r;
        __half *o4 =
            og + (int64_t)(it.t_first + rr / G) * p.ldo + (int64_t)(it.kvh * G + rr % G) * hd + d;
        o4[0] = __float2half_rn(acc.x * inv);
        o4[1] = __float2half_rn(acc.y * inv);
        o4[2] = __float2half_rn(acc.z * inv);
        o4[3] = __float2half_rn(acc.w * inv);
    }
}

/* ---- configurations ------------------------------------------------------
 * Warps per block x stages per warp. Shared memory per block for HDP 128:
 * w4 s3 96 KB (2 blocks per SM), w4 s2 64 KB (3), w8 s2 128 KB (1), w4 s4
 * 128 KB (1), w2 s4 64 KB (3); half of that for HDP 64. The sm_75 path
 * (T75) is one stage a warp: its copies are synchronous, so more stages
 * would only take shared memory, which a T4 has 64 KB of an SM; w4 s1 is
 * 34 KB (fp16, HDP 128) and stays under the 48 KB a block may have
 * without opting in. */
struct Variant {
    int nw, s;
    bool t75;
    const char *name;
    const void *kernel[2][2]; /* [fp16, E4M3][HDP 64, 128] */
    int smem[2][2];
};

template <int NW, int S, bool T75 = false> Variant variant(const char *name)
{
    static_assert(!T75 || NW * ring_bytes<128, S, false>() + 8 * 1024 <= 48 * 1024,
                  "an sm_75 variant fits a T4 block without opting in");
    return {NW,
            S,
            T75,
            name,
            {{reinterpret_cast<const void *>(decode_kernel<64, NW, S, false, T75>),
              reinterpret_cast<const void *>(decode_kernel<128, NW, S, false, T75>)},
             {reinterpret_cast<const void *>(decode_kernel<64, NW, S, true, T75>),
              reinterpret_cast<const void *>(decode_kernel<128, NW, S, true, T75>)}},
            {{NW * ring_bytes<64, S, false>(), NW * ring_bytes<128, S, false>()},
             {NW * ring_bytes<64, S, true>(), NW * ring_bytes<128, S, true>()}}};
}

/* Index order is the impl order of kernels/attn_cuda.h (impl - 2). */
const Variant kVariants[] = {
    variant<4, 3>("tc-decode w4 s3"), variant<4, 2>("tc-decode w4 s2"),
    variant<8, 2>("tc-decode w8 s2"), variant<4, 4>("tc-decode w4 s4"),
    variant<2, 4>("tc-decode w2 s4"), variant<4, 1, true>("tc-decode sm75 w4 s1"),
};
constexpr int kNumVariants = (int)(sizeof kVariants / sizeof kVariants[0]);
constexpr int kSm75Variant = kNumVariants - 1;

/* Per device, variant and HDP: resident blocks per SM once the limit was
 * raised (0: not yet). Racing writers store the same value. */
constexpr int kMaxDevices = 16;
int g_ctas[kMaxDevices][kNumVariants][2][2];

cudaError_t prepare(int hdp, int v, bool fp8, int *ctas)
{
    const int hi = hdp == 64 ? 0 : 1, f = fp8 ? 1 : 0;
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess)
        return e;
    if (dev >= 0 && dev < kMaxDevices && g_ctas[dev][v][f][hi] > 0) {
        *ctas = g_ctas[dev][v][f][hi];
        return cudaSuccess;
    }
    const Variant &c = kVariants[v];
    e = cudaFuncSetAttribute(c.kernel[f][hi], cudaFuncAttributeMaxDynamicSharedMemorySize,
                             c.smem[f][hi]);
    if (e != cudaSuccess)
        return e;
    int n = 0;
    e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, c.kernel[f][hi], c.nw * 32,
                                                      (size_t)c.smem[f][hi]);
    if (e != cudaSuccess)
        return e;
    if (n < 1)
        return cudaErrorInvalidConfiguration;
    if (dev >= 0 && dev < kMaxDevices)
        g_ctas[dev][v][f][hi] = n;
    *ctas = n;
    return cudaSuccess;
}

template <int NW, int S, bool F8, bool T75>
void launch_f(const krn_cuda_attn_params &p, int hdp, int smem, cudaStream_t s)
{
    if (hdp == 64)
        krncuda::launch_pdl(decode_kernel<64, NW, S, F8, T75>, dim3((unsigned)p.n_items),
                            dim3(NW * 32), (size_t)smem, s, p);
    else
        krncuda::launch_pdl(decode_kernel<128, NW, S, F8, T75>, dim3((unsigned)p.n_items),
                            dim3(NW * 32), (size_t)smem, s, p);
}

template <int NW, int S, bool T75 = false>
void launch_one(const krn_cuda_attn_params &p, int hdp, int smem, cudaStream_t s)
{
    if (p.kv_fp8)
        launch_f<NW, S, true, T75>(p, hdp, smem, s);
    else
        launch_f<NW, S, false, T75>(p, hdp, smem, s);
}

} // namespace

int decode_variant_count()
{
    return kNumVariants;
}

const char *decode_variant_name(int v)
{
    return v >= 0 && v < kNumVariants ? kVariants[v].name : "?";
}

bool decode_variant_runs(int v)
{
    return v >= 0 && v < kNumVariants && (kVariants[v].t75 || !krncuda::sm75_paths());
}

/* From bench_attn and the 32-layer decode step on an H200 (docs/CUDA.md,
 * "Decode attention"): w4 s3 for head_dim 128, w8 s2 (fewer, longer items)
 * for 64 up to 264 row sets. For head_dim 128, w4 s2 (three blocks an SM
 * instead of two: 396 resident against 264 on the H200) where its waves
 * come out ahead:
 *  - 768 row sets or more (2.9 waves of w4 s3, 1.94 of w4 s2; Llama-2-7B
 *    from 24 rows, Llama-3-8B from 96): Llama-2 128 x 512 301 -> 266 us,
 *    Llama-3 128 x 512 87 -> 81 us, the Llama-2-7B replay of 24 / 32 / 64 /
 *    128 rows 4.46 / 5.10 / 7.96 / 13.85 -> 4.24 / 4.93 / 7.62 / 12.80 ms,
 *    Llama-3-8B's of 96 / 128 rows 7.05 / 7.83 -> 6.86 / 7.68 ms (at 32
 *    rows of 2048 keys the attention alone is 4 % slower: 255 -> 264 us);
 *  - 265 to 396 row sets (one wave of w4 s2, two of w4 s3): Llama-3-8B's
 *    replay of 48 rows 4.76 -> 4.41 ms.
 * Between, 512 row sets are 1.94 waves of w4 s3 but 1.29 of w4 s2, and lost
 * at Llama-2's 16 rows (replay 3.43 -> 3.60 ms) and Llama-3's 64 x 2048
 * (133 -> 158 us); up to 264 each row set is split to fill one wave of
 * either, and w4 s3 is the faster at batch 1.
 * Head_dim 64 takes w4 s3 instead of w8 s2 above 264 row sets: the 16-layer
 * replay of a Llama-3.2-1B-shaped model (8 KV heads of 4, one row set a KV
 * head a row) at 48 / 64 / 96 / 128 rows 1.372 / 1.428 / 1.960 / 2.167 ->
 * 1.276 / 1.375 / 1.923 / 2.003 ms; at 32 rows (256 row sets) w4 s3 lost
 * (1.190 -> 1.238 ms), at 1 row too (0.577 -> 0.587), at 8 it gained 1 %
 * (0.772 -> 0.763; left on w8 s2). */
int decode_variant_auto(int hdp, long long row_sets, bool fp8)
{
    if (krncuda::sm75_paths())
        return kSm75Variant;
    /* row sets one wave holds on the H200: w4 s3 (two blocks an SM), w4 s2 (three) */
    constexpr long long kWaveW4S3 = 264, kWaveW4S2 = 396;
    /* E4M3 tiles are half the bytes: w4 s4 (three blocks an SM, three tiles
     * a warp in flight) was the fastest or within 3 % of it on every
     * bench_attn case (Llama-3 64 x 2048 98.3 -> 91.5 us against w4 s3,
     * Llama-2 128 x 512 181.4 -> 180.8 (w2 s4 176.5), 1 x 32768 76.6 ->
     * 75.5); head_dim 64 keeps the fp16 rule. */
    if (fp8)
        return hdp == 64 ? (row_sets > kWaveW4S3 ? 0 : 2) : 3;
    if (hdp == 64)
        return row_sets > kWaveW4S3 ? 0 : 2;
    return row_sets >= 768 || (row_sets > kWaveW4S3 && row_sets <= kWaveW4S2) ? 1 : 0;
}

/* One tile a warp. Since the combine takes one round of loads for up to
 * eight splits, shorter splits pay at batch 1 (H200, bench_attn Llama-2
 * 1 x 384: 5.73 us at 128 keys, 5.27 at 64; the 32-layer decode replay
 * 1.880 -> 1.860 ms); at 32 keys half the warps of a w4 block idle (5.63
 * us, replay 2.030 ms). Head_dim 64 (w8 s2) keeps 128. */
int decode_split_keys(int v)
{
    return kVariants[v].nw * TK;
}

cudaError_t decode_ctas_per_sm(int hdp, int v, bool fp8, int *out)
{
    return prepare(hdp, v, fp8, out);
}

cudaError_t decode_launch(const krn_cuda_attn_params &p, int hdp, int v, cudaStream_t s)
{
    int ctas = 0;
    cudaError_t e = prepare(hdp, v, p.kv_fp8, &ctas);
    if (e != cudaSuccess)
        return e;
    const int smem = kVariants[v].smem[p.kv_fp8 ? 1 : 0][hdp == 64 ? 0 : 1];
    switch (v) {
    case 0:
        launch_one<4, 3>(p, hdp, smem, s);
        break;
    case 1:
        launch_one<4, 2>(p, hdp, smem, s);
        break;
    case 2:
        launch_one<8, 2>(p, hdp, smem, s);
        break;
    case 3:
        launch_one<4, 4>(p, hdp, smem, s);
        break;
    case 4:
        launch_one<2, 4>(p, hdp, smem, s);
        break;
    default:
        launch_one<4, 1, true>(p, hdp, smem, s);
        break;
    }
    return cudaGetLastError();
}

} // namespace krnattn
