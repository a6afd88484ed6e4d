/*
 * int4_gemm_sm90.cu — the Hopper (sm_90a) path of the INT4 GEMM:
 *     C[M,N] = A[M,K] · dequant(W)[N,K]ᵀ (+ bias), A and C fp16 row-major.
 *
 * Swapped operands. wgmma's M side is 64 rows per warpgroup and its N side 8 to
 *          256, so the kernel computes Cᵀ = W · Aᵀ: the weights are wgmma's A
 *          operand (64 output columns per warpgroup) and the tokens its N side
 *          (tiles of 8, 16, 32, 64 or 128 tokens). Small batches then waste no
 *          tensor-core rows (M = 1 runs m64n8k16), and the weights can come from
 *          registers: wgmma takes its A operand in registers with the fragment
 *          layout of mma.sync m16n8k16, which is what the repacked layout gives
 *          each lane (kernels/int4_gemm.h: word j of lane l holds the B
 *          fragments of n8 tiles 2j and 2j+1, i.e. the A fragment of rows
 *          16j..16j+15, so warp j of a warpgroup dequantizes word j).
 * Layout   unchanged: the sm_80 kernel's repacked buffer is used as is.
 * Mapping  persistent grid (#SMs x resident blocks). Block = WG (2) consumer
 *          warpgroups (64 output columns each: a 128-column tile) + 1 producer
 *          warp. Units (token tile, 128-column tile, 128-k tile) are striped
 *          over the blocks exactly as in int4_gemm_sm80.cu: every block gets
 *          the same number of k tiles (±1) whatever the shape; a tile split
 *          between blocks is reduced through the workspace by its last
 *          arriver, in block order (deterministic), each partial kept in
 *          thread order so that its stores and loads are whole float4 runs
 *          (tile_epilogue: written per element in tile order, this
 *          reduction took a third of the warps' time at M = 128).
 * Pipeline STAGES-deep shared-memory ring, one mbarrier pair (full, empty) per
 *          stage. The producer warp streams the weights with cp.async.bulk (TMA
 *          bulk copies: a 128 x 128 W tile is two contiguous 4 KiB runs, so one
 *          instruction per 4 KiB, no address math in the consumers, completion
 *          counted in bytes on the stage's mbarrier), the scales and zeros of
 *          the stage's groups the same way, and the token tile with 16-byte
 *          cp.async (zero-filled past M and K) into wgmma's no-swizzle K-major
 *          layout, signalled with cp.async.mbarrier.arrive. Consumers wait on
 *          the full barrier, dequantize the 8 k16 steps of the stage into
 *          registers (LOP3 magic-number trick of int4_gemm_impl.cuh: exactly the
 *          CPU reference's fp16 values), issue 8 async wgmma and commit; the
 *          next stage's dequantization overlaps those wgmma, and a stage is
 *          handed back (every consumer thread arrives on its empty barrier) once
 *          wgmma.wait_group says its group is done. No block-wide barrier in
 *          the main loop.
 * Launch   programmatic dependent launch: the producer issues the weight copies
 *          of the first stages (they do not depend on the previous kernel),
 *          then every thread waits on griddepcontrol.wait before touching A, C
 *          or the workspace; the kernel lets its own dependents launch at once.
 *          In a CUDA graph of back-to-back layers the weight stream of one GEMM
 *          starts while the previous kernel drains.
 * Limits   sm_90a only; needs k % 8 == 0 and a 16-byte aligned A (16-byte
 *          cp.async of whole 8-element pieces); the launcher sends other cases
 *          to the sm_80 kernel.
 */
#include "kernels/cuda/int4_gemm_impl.cuh"
#include "kernels/cuda/launch.cuh"

#include <cuda.h> /* CUtensorMap (the type only; the encoder is fetched at run time) */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define I4G_SM90_DEVICE 1
#else
#define I4G_SM90_DEVICE 0
#endif

namespace int4gemm
{
namespace
{

constexpr int kKS = 128;                  /* k per stage (one k tile) */
constexpr int kSteps = kKS / 16;          /* k16 steps per stage */
constexpr int kChunkBytes = 64 * kKS / 2; /* one warpgroup's 4 KiB of codes per stage */

/* TN tokens x WG consumer warpgroups (64 output columns each). */
template <int TN, int WG> struct Cfg90 {
    static constexpr int BN = 64 * WG;             /* output columns per tile */
    static constexpr int THREADS = WG * 128 + 32;  /* + one producer warp */
    static constexpr int W_BYTES = BN * kKS / 2;   /* codes per stage */
    static constexpr int S_BYTES = WG * 4 * 128;   /* up to 4 scale rows of 64 fp16 per warpgroup */
    static constexpr int A_BYTES = TN * kKS * 2;
    static constexpr int STAGE = W_BYTES + A_BYTES + 2 * S_BYTES;
    /* resident blocks per SM: with two warpgroups, two blocks up to 64
     * tokens (four warpgroups to take turns on the tensor cores), one for
     * 128 (its stages need the room); with four, one block */
    static constexpr int BPS = WG == 2 && TN <= 64 ? 2 : 1;
    static constexpr int STAGES = WG == 2 ? (TN <= 32 ? 6 : TN == 64 ? 4 : 5) : (TN <= 32 ? 6 : 5);
    static constexpr int SMEM = STAGES * STAGE + 1024; /* + alignment slack */
};

__device__ __forceinline__ uint32_t s_addr(const void *p)
{
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

/* ---- mbarriers, bulk copies, grid dependency control --------------------- */

__device__ __forceinline__ void mbar_init(uint64_t *b, int count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(s_addr(b)), "r"(count));
}

__device__ __forceinline__ void mbar_arrive(uint64_t *b)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(s_addr(b)) : "memory");
}

__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t *b, uint32_t bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(s_addr(b)),
                 "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ void mbar_wait(uint64_t *b, uint32_t parity)
{
    asm volatile("{\n"
                 ".reg .pred P1;\n"
                 "WAIT:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
                 "@P1 bra DONE;\n"
                 "bra WAIT;\n"
                 "DONE:\n"
                 "}\n" ::"r"(s_addr(b)),
                 "r"(parity)
                 : "memory");
}

/* One contiguous global -> shared copy by the TMA unit, counted on mbar. */
__device__ __forceinline__ void bulk_copy(void *dst, const void *src, uint32_t bytes, uint64_t *mbar)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, "
                 "[%3];\n" ::"r"(s_addr(dst)),
                 "l"(src), "r"(bytes), "r"(s_addr(mbar))
                 : "memory");
}

/* A 2-D box of the tensor map at (c0 innermost, c1), counted on mbar;
 * elements outside the tensor arrive as zeros. */
__device__ __forceinline__ void tensor_copy_2d(void *dst, const CUtensorMap *map, int c0, int c1,
                                               uint64_t *mbar)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
                 "[%0], [%1, {%2, %3}], [%4];\n" ::"r"(s_addr(dst)),
                 "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(s_addr(mbar))
                 : "memory");
}

__device__ __forceinline__ void griddep_wait()
{
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
}

__device__ __forceinline__ void griddep_launch()
{
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}

/* bar.sync over the NT consumer threads only (the producer may be gone). */
template <int NT> __device__ __forceinline__ void consumer_sync()
{
    asm volatile("bar.sync 1, %0;\n" ::"n"(NT) : "memory");
}

/* ---- wgmma --------------------------------------------------------------- */

/* Shared-memory matrix descriptor of a K-major operand in the 128-byte
 * swizzle layout: rows of 64 fp16 (128 bytes) in 8-row, 1024-byte atoms, the
 * 16-byte chunks of row r XOR-permuted by r % 8 (what TMA writes with
 * CU_TENSOR_MAP_SWIZZLE_128B). Start address in 16-byte units (a k16 step
 * inside the 128-byte row is +32 bytes; the hardware applies the swizzle to
 * the final address, so atoms must be 1024-byte aligned), leading byte offset
 * unused for this layout (1), stride byte offset 1024 (next 8 rows), layout
 * type 1 (128B swizzle) in bits 62-63. */
__device__ __forceinline__ uint64_t smem_desc_sw128(uint32_t addr)
{
    return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) |
           ((uint64_t)1 << 62);
}

__device__ __forceinline__ void wgmma_fence()
{
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void wgmma_commit()
{
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

template <int N> __device__ __forceinline__ void wgmma_wait()
{
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

/* Pin a register so the compiler keeps reads and writes of it on their side
 * of the wgmma fence / wait around it. */
__device__ __forceinline__ void reg_fence(float &x)
{
    asm volatile("" : "+f"(x)::"memory");
}

/* D[64 x TN] = A[64 x 16] (registers, mma.sync A-fragment layout per warp) *
 * B[16 x TN] (shared memory, K-major, described by desc) (+ D if accumulate). */
template <int TN>
__device__ __forceinline__ void wgmma_rs(float (&d)[TN / 2], const uint32_t (&a)[4], uint64_t desc, int accumulate);

template <> __device__ __forceinline__ void wgmma_rs<8>(float (&d)[4], const uint32_t (&a)[4], uint64_t desc, int accumulate)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16 "
                 "{"
                 "%0,%1,%2,%3"
                 "}, {%4,%5,%6,%7}, %8, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(accumulate));
}

template <> __device__ __forceinline__ void wgmma_rs<16>(float (&d)[8], const uint32_t (&a)[4], uint64_t desc, int accumulate)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 "
                 "{"
                 "%0,%1,%2,%3,%4,%5,%6,%7"
                 "}, {%8,%9,%10,%11}, %12, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(accumulate));
}

template <> __device__ __forceinline__ void wgmma_rs<32>(float (&d)[16], const uint32_t (&a)[4], uint64_t desc, int accumulate)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 "
                 "{"
                 "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15"
                 "}, {%16,%17,%18,%19}, %20, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(accumulate));
}

template <> __device__ __forceinline__ void wgmma_rs<64>(float (&d)[32], const uint32_t (&a)[4], uint64_t desc, int accumulate)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
                 "{"
                 "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
                 "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
                 "}, {%32,%33,%34,%35}, %36, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(accumulate));
}

template <> __device__ __forceinline__ void wgmma_rs<128>(float (&d)[64], const uint32_t (&a)[4], uint64_t desc, int accumulate)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
                 "{"
                 "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
                 "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
                 "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
                 "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63"
                 "}, {%64,%65,%66,%67}, %68, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
                   "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
                   "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
                   "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
                   "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(accumulate));
}

/* ---- the kernel ---------------------------------------------------------- */

/* Tile t's partial of block bb lives in slot 2 bb when t is the first tile of
 * bb's stripe, else 2 bb + 1 (a block shares at most those two tiles). */
__device__ __forceinline__ int slot_of(int bb, int t, const Params &p, int grid)
{
    const int first = (int)((long long)bb * p.units / grid) / p.k_tiles;
    return t == first ? 2 * bb : 2 * bb + 1;
}

__device__ __forceinline__ void store_c(const Params &p, int row, int col, float v)
{
    if (row < p.m && col < p.n) {
        if (p.bias)
            v += __half2float(p.bias[col]);
        p.c[(int64_t)row * p.n + col] = __float2half_rn(v);
    }
}

/* A thread's NV values of tile (mt, nt) to C. With GLU (int4_gemm_impl.cuh,
 * store_glu1) value e of a gate column (pos: column cl + 8 for e with bit 1
 * set, the same token) pairs with value e + 2, its up partner. */
template <int NV, int BN, bool GLU, class Pos>
__device__ __forceinline__ void store_values(const Params &p, const float (&v)[NV], Pos pos,
                                             int tn, int mt, int nt)
{
#pragma unroll
    for (int e = 0; e < NV; e++) {
        int r, cl;
        pos(e, r, cl);
        if constexpr (!GLU)
            store_c(p, mt * tn + r, nt * BN + cl, v[e]);
        else if (!(e & 2) && mt * tn + r < p.m)
            store_glu1(p, mt * tn + r, nt * BN + cl, v[e], v[e + 2 < NV ? e + 2 : e]);
    }
}

/* The end of block b's part of tile (mt, nt), tn tokens x BN columns. When
 * the block computed the whole tile it writes C (+ bias) directly; otherwise
 * it stores its fp32 partial in its slot, and the last of the tile's
 * contributors to arrive (one acq_rel atomic per block) sums all partials in
 * block order (deterministic), writes C and resets the counter. Value e of
 * out sits at token row / tile column pos(e); threads with has == false store
 * nothing but take part in the barriers (all NT consumer threads call it).
 * A partial is kept in thread order, not tile order: float4 j of consumer
 * thread tid at j * NT + tid (the summing thread holds the same positions in
 * every contributor), so each store and load of a warp is 512 contiguous
 * bytes. A last arriver that is also the tile's first contributor starts
 * the sum from its own registers. */
template <int NV, int BN, int NT, bool GLU, class Pos>
__device__ __forceinline__ void tile_epilogue(const Params &p, const float (&out)[NV], bool has,
                                              Pos pos, int tn, int mt, int nt, int b, int grid,
                                              int tid, int *s_last)
{
    const int t = nt * p.m_tiles + mt;
    const int b_first = unit_block(t * p.k_tiles, p.units, grid);
    const int b_last = unit_block(t * p.k_tiles + p.k_tiles - 1, p.units, grid);
    if (b_first == b_last) {
        if (has)
            store_values<NV, BN, GLU>(p, out, pos, tn, mt, nt);
        consumer_sync<NT>(); /* the caller's shared scratch is free again */
        return;
    }
    /* NT threads x NV values = TN x BN: a partial fills its slot exactly */
    static_assert(NV % 4 == 0, "whole float4 runs");
    if (has) {
        float4 *part =
            reinterpret_cast<float4 *>(p.partials + (size_t)slot_of(b, t, p, grid) * tn * BN);
#pragma unroll
        for (int j = 0; j < NV / 4; j++)
            __stcg(part + j * NT + tid,
                   make_float4(out[4 * j], out[4 * j + 1], out[4 * j + 2], out[4 * j + 3]));
    }
    consumer_sync<NT>();
    if (tid == 0) {
        const int old = krncuda::arrive_acq_rel(p.counters + b_first);
        *s_last = old == b_last - b_first;
    }
    consumer_sync<NT>();
    if (*s_last && has) {
        /* The sum in block order. When this block is the tile's first
         * contributor (the usual case: the last to arrive is the block whose
         * stripe ends inside the tile), it starts from its own registers;
         * otherwise from zero, reading its own partial back like the others
         * (so only v and one partial's loads are live at a time). */
        const bool own_first = b == b_first;
        float v[NV];
#pragma unroll
        for (int e = 0; e < NV; e++)
            v[e] = own_first ? out[e] : 0.0f;
        for (int bb = b_first + (own_first ? 1 : 0); bb <= b_last; bb++) {
            const float4 *q = reinterpret_cast<const float4 *>(
                p.partials + (size_t)slot_of(bb, t, p, grid) * tn * BN);
            float4 w[NV / 4];
#pragma unroll
            for (int j = 0; j < NV / 4; j++)
                w[j] = __ldcg(q + j * NT + tid);
#pragma unroll
            for (int j = 0; j < NV / 4; j++) {
                v[4 * j] += w[j].x;
                v[4 * j + 1] += w[j].y;
                v[4 * j + 2] += w[j].z;
                v[4 * j + 3] += w[j].w;
            }
        }
        store_values<NV, BN, GLU>(p, v, pos, tn, mt, nt);
    }
    if (*s_last && tid == 0)
        p.counters[b_first] = 0; /* ready for the next launch */
    /* s_last is rewritten by the next tile's arrival: everyone has read it */
    consumer_sync<NT>();
}

/* GS: k16 steps per scale group inside one stage (2, 4 or 8; 8 also stands
 * for groups longer than a stage and for per-channel scales). */
template <int TN, int WG, int GS, bool GLU>
__global__ void __launch_bounds__(Cfg90<TN, WG>::THREADS, Cfg90<TN, WG>::BPS)
    int4_gemm_sm90(const Params p, const __grid_constant__ CUtensorMap a_map)
{
#if I4G_SM90_DEVICE
    typedef Cfg90<TN, WG> C;
    constexpr int kWG = WG, kBN = C::BN, kWBytes = C::W_BYTES, kSBytes = C::S_BYTES;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    /* swizzled tiles need 1024-byte aligned atoms: align by hand (SMEM has
     * 1 KiB of slack for it) */
    unsigned char *smem = smem_raw + ((1024 - (s_addr(smem_raw) & 1023)) & 1023);
    __shared__ __align__(8) uint64_t full[C::STAGES];
    __shared__ __align__(8) uint64_t empty[C::STAGES];
    __shared__ int s_last;

    const int tid = threadIdx.x, lane = tid & 31;
    /* broadcast from lane 0 so the compiler sees a warp-uniform value: the
     * role branch below is then not divergent, which wgmma needs to stay
     * asynchronous */
    const int warp = __shfl_sync(0xffffffffu, tid >> 5, 0);
    const int grid = gridDim.x, b = blockIdx.x;
    const int u_begin = unit_start(b, p.units, grid);
    const int n_units = unit_start(b + 1, p.units, grid) - u_begin;
    const bool zp = p.zeros != nullptr;

    if (tid == 0) {
        for (int s = 0; s < C::STAGES; s++) {
            mbar_init(&full[s], 1); /* the producer's expect_tx; the rest is bytes */
            mbar_init(&empty[s], kWG * 128); /* one per consumer thread */
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (warp == kWG * 4) {
        /* ================= producer warp ================= */
        const int ksteps_total = p.k_pad / 16;
        auto coords = [&](int i, int &nt, int &mt, int &kt) {
            const int u = u_begin + i;
            kt = u % p.k_tiles;
            const int r = u / p.k_tiles;
            mt = r % p.m_tiles;
            nt = r / p.m_tiles;
        };
        /* Unit i's weights, scales and zeros: bulk copies by lane 0, counted
         * on the stage's full barrier with the token tile's bytes (a_bytes,
         * 0 while the tile cannot be loaded yet, see below). */
        auto issue_w = [&](int i, uint32_t a_bytes) {
            int nt, mt, kt;
            coords(i, nt, mt, kt);
            const int s = i % C::STAGES;
            unsigned char *st = smem + s * C::STAGE;
            const int g0 = (kt * kSteps) >> p.gshift;
            int g1 = (kt * kSteps + kSteps - 1) >> p.gshift;
            if (g1 > p.groups - 1)
                g1 = p.groups - 1;
            const uint32_t sbytes = (uint32_t)(g1 - g0 + 1) * 128;
            mbar_arrive_expect_tx(&full[s], kWBytes + kWG * sbytes * (zp ? 2 : 1) + a_bytes);
#pragma unroll
            for (int wg = 0; wg < kWG; wg++) {
                const int tile = nt * kWG + wg; /* 64-column chunk tile */
                bulk_copy(st + wg * kChunkBytes,
                          reinterpret_cast<const unsigned char *>(p.q) +
                              ((int64_t)tile * ksteps_total + (int64_t)kt * kSteps) * 512,
                          kChunkBytes, &full[s]);
                const int64_t srow = ((int64_t)tile * p.groups + g0) * 128;
                bulk_copy(st + kWBytes + C::A_BYTES + wg * 512,
                          reinterpret_cast<const unsigned char *>(p.scales) + srow, sbytes,
                          &full[s]);
                if (zp)
                    bulk_copy(st + kWBytes + C::A_BYTES + kSBytes + wg * 512,
                              reinterpret_cast<const unsigned char *>(p.zeros) + srow, sbytes,
                              &full[s]);
            }
        };
        /* Unit i's token tile: two TMA boxes of 64 k x TN rows, written in the
         * 128-byte swizzle layout wgmma reads (smem_desc_sw128); rows past M
         * and columns past K arrive as zeros. */
        auto issue_a = [&](int i) {
            int nt, mt, kt;
            coords(i, nt, mt, kt);
            const int s = i % C::STAGES;
            unsigned char *sa = smem + s * C::STAGE + kWBytes;
            tensor_copy_2d(sa, &a_map, kt * kKS, mt * TN, &full[s]);
            tensor_copy_2d(sa + TN * 128, &a_map, kt * kKS + 64, mt * TN, &full[s]);
        };
        if (lane != 0)
            return;
        asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&a_map))
                     : "memory");
        const int pro = n_units < C::STAGES ? n_units : C::STAGES;
        for (int i = 0; i < pro; i++)
            issue_w(i, C::A_BYTES); /* independent of the previous kernel */
        griddep_wait();
        griddep_launch();
        for (int i = 0; i < pro; i++)
            issue_a(i);
        for (int i = pro; i < n_units; i++) {
            const int s = i % C::STAGES;
            mbar_wait(&empty[s], ((i / C::STAGES) - 1) & 1);
            issue_w(i, C::A_BYTES);
            issue_a(i);
        }
        return;
    }

    /* ================= consumer warpgroups ================= */
    griddep_wait();
    griddep_launch();
    const int wg = warp >> 2, wl = warp & 3, g = lane >> 2, c4 = lane & 3;
    int kt, mt, nt;
    {
        kt = u_begin % p.k_tiles;
        const int r = u_begin / p.k_tiles;
        mt = r % p.m_tiles;
        nt = r / p.m_tiles;
    }
    float acc[TN / 2];

    /* Stage i: wait for its data; dequantize its 8 k16 steps into af and
     * issue their 8 wgmma (accumulating; a tile starts from zeroed
     * accumulators, so between tiles they hold nothing the epilogue has to
     * keep alive next to its own registers) in two committed halves, so the second half's dequantization overlaps the
     * first half's tensor-core work; wait for both and hand the stage back.
     * Keeping more wgmma in flight across stages needs more registers than
     * ptxas will give the pipeline (it then serializes every wgmma); the
     * overlap across stages comes from the other warps (16 per SM for small
     * token tiles). */
    auto stage = [&](int i, uint32_t(&af)[kSteps][4]) {
        const int s = i % C::STAGES;
        mbar_wait(&full[s], (i / C::STAGES) & 1);
        const unsigned char *st = smem + s * C::STAGE;
        const uint32_t *wq =
            reinterpret_cast<const uint32_t *>(st + wg * kChunkBytes) + lane * 4 + wl;
        const uint32_t *sq =
            reinterpret_cast<const uint32_t *>(st + kWBytes + C::A_BYTES + wg * 512) + g * 4 + wl;
        const uint32_t *zq = sq + kSBytes / 4;
        GroupConstsT<2> gc;
        const uint32_t a_base = s_addr(st + kWBytes);
        /* two halves of four k16 steps: the second half's dequantization
         * overlaps the first half's wgmma */
#pragma unroll
        for (int h = 0; h < 2; h++) {
#pragma unroll
            for (int kk = 0; kk < kSteps / 2; kk++) {
                const int ks = h * (kSteps / 2) + kk;
                if (ks % GS == 0) {
                    const uint32_t sw[1] = {sq[(ks / GS) * 32]};
                    if (zp) {
                        const uint32_t zw[1] = {zq[(ks / GS) * 32]};
                        group_consts_w<true, 1>(sw, zw, gc);
                    } else {
                        const uint32_t zw[1] = {0u};
                        group_consts_w<false, 1>(sw, zw, gc);
                    }
                }
                uint32_t bq[2][2];
                dequant_pair<2>(wq[ks * 128], gc, 0, bq);
                af[ks][0] = bq[0][0]; /* rows g,     k 2c..2c+1 */
                af[ks][1] = bq[1][0]; /* rows g + 8, k 2c..2c+1 */
                af[ks][2] = bq[0][1]; /* rows g,     k 2c+8..2c+9 */
                af[ks][3] = bq[1][1]; /* rows g + 8, k 2c+8..2c+9 */
            }
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < kSteps / 2; kk++) {
                const int ks = h * (kSteps / 2) + kk;
                wgmma_rs<TN>(acc, af[ks],
                             smem_desc_sw128(a_base + (ks / 4) * TN * 128 + (ks % 4) * 32),
                             1);
            }
            wgmma_commit();
        }
        /* This thread's reads of the stage are done (its LDS fed the wgmma
         * just waited for). Every consumer thread arrives: an arrive
         * releases the arriving thread's own accesses only, so one arrive a
         * warp would leave the other lanes' reads unordered before the
         * producer's next bulk copy into the stage (compute-sanitizer
         * racecheck reports exactly that race). */
        wgmma_wait<0>();
        mbar_arrive(&empty[s]);
    };

    uint32_t af[kSteps][4];
    int i = 0;
    while (i < n_units) {
        /* the stages of this block's part of tile (mt, nt) */
        int run = p.k_tiles - kt;
        if (run > n_units - i)
            run = n_units - i;
#pragma unroll
        for (int j = 0; j < TN / 2; j++)
            acc[j] = 0.0f;
        for (int j = 0; j < run; j++, i++)
            stage(i, af);
        float out[TN / 2];
#pragma unroll
        for (int j = 0; j < TN / 2; j++) {
            reg_fence(acc[j]);
            /* a real instruction (x + 0 is not folded: -0 + 0 = +0), so the
             * divergent stores below depend on it, not on the wgmma */
            asm volatile("add.rn.f32 %0, %1, 0f00000000;\n" : "=f"(out[j]) : "f"(acc[j]));
        }

        /* ---- this block's part of tile (mt, nt) is done ---- */
        const int colw = wg * 64 + wl * 16 + g; /* column inside the 128-wide tile */
        tile_epilogue<TN / 2, kBN, kWG * 128, GLU>(
            p, out, true,
            [&](int e, int &r, int &cl) {
                r = 2 * c4 + 8 * (e >> 2) + (e & 1);
                cl = colw + ((e >> 1) & 1) * 8;
            },
            TN, mt, nt, b, grid, tid, &s_last);
        /* next tile */
        kt = 0;
        if (++mt == p.m_tiles) {
            mt = 0;
            nt++;
        }
    }
#else
    __trap(); /* never launched: the dispatcher checks for sm_90 */
#endif
}

/* ---- configurations and the launcher ------------------------------------ */

typedef void (*Kernel90)(const Params, const CUtensorMap);

struct Config90 {
    int tn, bn, threads, bps, smem;
    Kernel90 kernel[3]; /* GS = 2, 4, 8 */
    Kernel90 glu[3];    /* the same with GLU output; null where not compiled */
};

/* GLU variants where KRN_INT4_GEMM_SM90_HAS_GLU: the token tiles and groups
 * the policy picks (32 tokens and more, groups of 64 k and longer). */
template <int TN, int WG, int GS> constexpr Kernel90 glu90()
{
    if constexpr (KRN_INT4_GEMM_SM90_HAS_GLU(TN, GS))
        return int4_gemm_sm90<TN, WG, GS, true>;
    else
        return nullptr;
}

/* KRN_INT4_GEMM_SM90_CONFIGS (kernels/int4_gemm_configs.h) in its order. */
#define I4G_SM90_CONFIG(ID, NAME, TN, WG, BPS_)                                                    \
    {TN,                                                                                           \
     Cfg90<TN, WG>::BN,                                                                            \
     Cfg90<TN, WG>::THREADS,                                                                       \
     Cfg90<TN, WG>::BPS,                                                                           \
     Cfg90<TN, WG>::SMEM,                                                                          \
     {int4_gemm_sm90<TN, WG, 2, false>, int4_gemm_sm90<TN, WG, 4, false>,                          \
      int4_gemm_sm90<TN, WG, 8, false>},                                                           \
     {glu90<TN, WG, 2>(), glu90<TN, WG, 4>(), glu90<TN, WG, 8>()}},
const Config90 kConfigs90[] = {KRN_INT4_GEMM_SM90_CONFIGS(I4G_SM90_CONFIG)};
#undef I4G_SM90_CONFIG
constexpr int kNumConfigs90 = (int)(sizeof kConfigs90 / sizeof kConfigs90[0]);
static_assert(kNumConfigs90 == KRN_INT4_GEMM_SM90_COUNT, "one entry per listed configuration");
#define I4G_SM90_CHECK(ID, NAME, TN, WG, BPS_)                                                     \
    static_assert(Cfg90<TN, WG>::BPS == BPS_ && Cfg90<TN, WG>::BN == 64 * WG,                      \
                  "the list's blocks per SM and columns are the kernel's");
KRN_INT4_GEMM_SM90_CONFIGS(I4G_SM90_CHECK)
#undef I4G_SM90_CHECK

/* The driver's tensor-map encoder, fetched once through the runtime (no
 * link against libcuda). */
typedef CUresult (*EncodeTiledFn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *,
                                  const cuuint64_t *, const cuuint64_t *, const cuuint32_t *,
                                  const cuuint32_t *, CUtensorMapInterleave, CUtensorMapSwizzle,
                                  CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
/* Set by sm90_prepare; racing writers store the same pointer. */
EncodeTiledFn g_encode = nullptr;

cudaError_t a_tensor_map(CUtensorMap *map, const Params &p, int tn)
{
    if (!g_encode)
        return cudaErrorInitializationError; /* the device was not described */
    /* A [m][k], boxes of 64 elements (128 bytes) x tn rows, 128-byte swizzle */
    const cuuint64_t dims[2] = {(cuuint64_t)p.k, (cuuint64_t)p.m};
    const cuuint64_t strides[1] = {(cuuint64_t)p.k * 2};
    const cuuint32_t box[2] = {64, (cuuint32_t)tn};
    const cuuint32_t estr[2] = {1, 1};
    CUresult r =
        g_encode(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, const_cast<half *>(p.a), dims, strides,
                 box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                 CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

/* Index of p's scale-group run: 2, 4 or 8 k16 steps (a stage's 8 steps hold
 * whole groups of 16 and more, and one group of a per-channel weight). */
int gs_index(const Params &p)
{
    const int gs = p.groups > 1 && p.gsteps < kSteps ? p.gsteps : kSteps;
    return gs == 2 ? 0 : gs == 4 ? 1 : 2;
}

} // namespace

/* Raise the kernels' shared-memory limits, take their residency (the GLU
 * variant has the same resources), fetch the tensor-map encoder. */
cudaError_t sm90_prepare(krn_cuda_device *d)
{
    if (!g_encode) {
        void *fn = nullptr;
        cudaDriverEntryPointQueryResult q;
        cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000,
                                                         cudaEnableDefault, &q);
        if (e != cudaSuccess)
            return e;
        if (q != cudaDriverEntryPointSuccess || !fn)
            return cudaErrorNotSupported;
        g_encode = reinterpret_cast<EncodeTiledFn>(fn);
    }
    for (int ci = 0; ci < kNumConfigs90; ci++) {
        const Config90 &c = kConfigs90[ci];
        for (int gi = 0; gi < 3; gi++) {
            d->int4_gemm.sm90[ci][gi] = 0;
            if (c.smem > d->smem_per_block)
                continue;
            cudaError_t e =
                cudaFuncSetAttribute(reinterpret_cast<const void *>(c.kernel[gi]),
                                     cudaFuncAttributeMaxDynamicSharedMemorySize, c.smem);
            if (e == cudaSuccess && c.glu[gi])
                e = cudaFuncSetAttribute(reinterpret_cast<const void *>(c.glu[gi]),
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, c.smem);
            int occ = 0;
            if (e == cudaSuccess)
                e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, c.kernel[gi], c.threads,
                                                                  c.smem);
            if (e != cudaSuccess)
                return e;
            d->int4_gemm.sm90[ci][gi] = (uint8_t)(occ > 255 ? 255 : occ);
        }
    }
    return cudaSuccess;
}

/* p: sizes, pointers and the choice's tiling; grid from the choice (the
 * plan's slots, capped by the units and the counter region). */
cudaError_t launch_sm90(const Params &p, int ci, int grid, bool glu, bool pdl, cudaStream_t stream)
{
    const Config90 &c = kConfigs90[ci];
    const Kernel90 fn = glu ? c.glu[gs_index(p)] : c.kernel[gs_index(p)];
    if (!fn)
        return cudaErrorNotSupported;
    CUtensorMap map;
    cudaError_t e = a_tensor_map(&map, p, c.tn);
    if (e != cudaSuccess)
        return e;
    return krncuda::launch_ex(pdl, fn, dim3((unsigned)grid), dim3(c.threads), (size_t)c.smem,
                              stream, p, map);
}

} // namespace int4gemm
