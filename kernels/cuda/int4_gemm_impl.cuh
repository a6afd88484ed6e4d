#pragma once
/* int4_gemm_impl.cuh — pieces shared by the INT4 GEMM's kernel families (the
 * mma.sync kernel in int4_gemm_sm80.cu, the Turing fallback in
 * int4_gemm_sm75.cu, the stream kernel in int4_gemm_stream.cu, the wgmma
 * kernel in sm90/int4_gemm_sm90.cu) and their launcher (int4_gemm.cu), and
 * each family's entry points. Private to kernels/cuda. */
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda_device.h"
#include "kernels/int4_gemm.h"
#include "kernels/int4_gemm_policy.h"
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace int4gemm
{

/* Everything a kernel needs, passed by value (flash-attention's params idea). */
struct Params {
    const uint4 *q;      /* [n_pad/64][k_pad/16][32] repacked codes, one uint4 per lane */
    const uint4 *scales; /* [n_pad/64][groups][8] uint4 = 64 permuted fp16 scales */
    const uint4 *zeros;  /* same as scales, or nullptr when symmetric */
    const half *a;       /* [m][k] activations */
    const half *bias;    /* [n] or nullptr */
    half *c;             /* [m][n] output */
    float *partials;     /* split-K partial tiles (workspace) */
    int *counters;       /* arrival counters of shared tiles (workspace, zeroed) */
    int m, n, k;         /* logical sizes */
    int k_pad, n_pad;
    int gsteps; /* k16 steps per scale group */
    int gshift; /* log2(gsteps) for 2..16; 30 for a single group */
    int groups; /* scale rows per 64-column tile */
    int c_vec;  /* 1: C rows 4-byte aligned (n even): half2 stores */
    int m_tiles, n_tiles, k_tiles;
    int units;     /* m_tiles * n_tiles * k_tiles (<= 2^30) */
    int slot_rows; /* rows stored per partial tile: min(BM, m) */
};
/* At most 128 bytes. nvcc loads the fields of a by-value kernel argument
 * of up to 128 bytes once (15 ld.param in the PTX of the 128-token wgmma
 * kernel), but those of a larger one again at most uses (538 at 144 bytes):
 * with two more fields every wgmma kernel ran 5-10 % slower at M = 32-256
 * and the mma.sync kernel about 3 % at M = 1 on the H200. Add a field only
 * in place of another, or as a kernel's separate argument (AccParams). */
static_assert(sizeof(Params) <= 128, "Params must stay within 128 bytes (see above)");

/* KRN_INT4_GEMM_ACC64 (the sm_80 kernel's second argument): the fixed-point
 * sums (acc64.cuh) and the words of another launch to zero after the wait. */
struct AccParams {
    long long *acc;       /* [m][n] */
    long long *acc_clear; /* acc_clear_n words, or nullptr */
    long long acc_clear_n;
};

/* (a & b) | c in one LOP3: mask out two nibbles and OR in the exponent of
 * 1024.0 (0x6400), giving the fp16 pair (1024 + lo, 1024 + hi) — or
 * (1024 + 16 lo, 1024 + 16 hi) for the nibbles at bits 4-7 / 20-23. */
template <uint32_t MASK> __device__ __forceinline__ uint32_t lop3_mask_or_magic(uint32_t a)
{
    uint32_t r;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;\n" : "=r"(r) : "r"(a), "n"(MASK), "n"(0x64006400u));
    return r;
}

__device__ __forceinline__ half2 as_h2(uint32_t x)
{
    return *reinterpret_cast<half2 *>(&x);
}

__device__ __forceinline__ uint32_t as_u32(half2 x)
{
    return *reinterpret_cast<uint32_t *>(&x);
}

/* Units striped over a grid of G blocks: the first unit of block b,
 * floor(b * U / G). */
__device__ __forceinline__ int unit_start(int b, int units, int grid)
{
    return (int)((long long)b * units / grid);
}

/* The block whose stripe holds unit u: the largest b with start(b) <= u,
 * i.e. ceil((u + 1) * G / U) - 1. */
__device__ __forceinline__ int unit_block(int u, int units, int grid)
{
    return (int)((((long long)u + 1) * grid + units - 1) / units - 1);
}

/* ---- mma.sync m16n8k16 (sm_80+) and the magic-number codes --------------- */

__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* d = a b (the accumulator input is zero: the first k step of a chunk). */
__device__ __forceinline__ void mma_16816_z(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                            uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};\n"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(0.0f));
}

/* mma_16816, or mma_16816_z at a warp's first step of a k tile (a
 * compile-time constant once the steps are unrolled). */
__device__ __forceinline__ void mma_chunk(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1, bool first)
{
    if (first)
        mma_16816_z(d, a, b0, b1);
    else
        mma_16816(d, a, b0, b1);
}

/* fp16 pairs: (1024, 1024), (1, 1), (16, 16). */
constexpr uint32_t kMagic1024 = 0x64006400u, kOne = 0x3C003C00u, kSixteen = 0x4C004C00u;

template <typename T, int N> __device__ __forceinline__ void zero4(T (&v)[N])
{
#pragma unroll
    for (int e = 0; e < N; e++)
        v[e] = 0.0f;
}

/* A pair of activations over 16: exact (a power of two) for normal values. */
__device__ __forceinline__ uint32_t sixteenth(uint32_t x)
{
    return as_u32(__hmul2(as_h2(x), __float2half2_rn(0.0625f)));
}

/* The two scales (and zeros: 8 when symmetric) of a word as fp32. */
template <bool ZP>
__device__ __forceinline__ void word_to_floats(uint32_t sw, uint32_t zw, float (&s)[2],
                                               float (&z)[2])
{
    const float2 sf = __half22float2(as_h2(sw));
    s[0] = sf.x;
    s[1] = sf.y;
    if (ZP) {
        const float2 zf = __half22float2(as_h2(zw));
        z[0] = zf.x;
        z[1] = zf.y;
    } else {
        z[0] = z[1] = 8.0f;
    }
}

/* acc + scale * (sum over the chunk of a (code - zero)), from the magic sum g
 * and the chunk's offset sums o (O) and sum (S) of the token. */
__device__ __forceinline__ float scale_chunk(float g, float o, float sum, float z, float s,
                                             float acc)
{
    return fmaf(s, fmaf(-z, sum, g - o), acc);
}

/* Per-fragment constants of one scale group, in registers, for NF n8
 * fragments: the scale as a broadcast pair, 1024 + zero (for the low-nibble
 * pairs) and -(64 + zero) (for the high-nibble pairs, which carry 16 * code). */
template <int NF> struct GroupConstsT {
    half2 s[NF], zlo[NF], zhin[NF];
};
typedef GroupConstsT<8> GroupConsts;

/* sw / zw: the lane's NF / 2 words of scales and zeros (two fragments per
 * word). PRMT broadcasts each half into both halves of a pair. */
template <bool ZP, int NW>
__device__ __forceinline__ void group_consts_w(const uint32_t (&sw)[NW], const uint32_t (&zw)[NW],
                                               GroupConstsT<2 * NW> &g)
{
#pragma unroll
    for (int i = 0; i < NW; i++) {
        g.s[2 * i] = as_h2(__byte_perm(sw[i], 0, 0x1010));
        g.s[2 * i + 1] = as_h2(__byte_perm(sw[i], 0, 0x3232));
        if (ZP) {
            /* both zeros of the word at once, then broadcast each */
            const uint32_t lo = as_u32(__hadd2(as_h2(zw[i]), __float2half2_rn(1024.0f)));
            const uint32_t hin =
                as_u32(__hfma2(as_h2(zw[i]), __float2half2_rn(-1.0f), __float2half2_rn(-64.0f)));
            g.zlo[2 * i] = as_h2(__byte_perm(lo, 0, 0x1010));
            g.zlo[2 * i + 1] = as_h2(__byte_perm(lo, 0, 0x3232));
            g.zhin[2 * i] = as_h2(__byte_perm(hin, 0, 0x1010));
            g.zhin[2 * i + 1] = as_h2(__byte_perm(hin, 0, 0x3232));
        } else {
            g.zlo[2 * i] = g.zlo[2 * i + 1] = __float2half2_rn(1032.0f);
            g.zhin[2 * i] = g.zhin[2 * i + 1] = __float2half2_rn(-72.0f);
        }
    }
}

/* sv: the lane's eight scales (fragments 0..7), zv its eight zeros. */
template <bool ZP>
__device__ __forceinline__ void group_consts(const uint4 &sv, const uint4 &zv, GroupConsts &g)
{
    const uint32_t sw[4] = {sv.x, sv.y, sv.z, sv.w};
    const uint32_t zw[4] = {zv.x, zv.y, zv.z, zv.w};
    group_consts_w<ZP, 4>(sw, zw, g);
}

/* One code word as the magic fp16 pairs of two fragments: b[i][0] =
 * 1024 + code (k 2c, 2c+1), b[i][1] = 1024 + 16 code (k 2c+8, 2c+9) of
 * fragment i. One shift and four LOP3 for eight codes. */
__device__ __forceinline__ void magic_pair(uint32_t w, uint32_t (&b)[2][2])
{
    const uint32_t w8 = w >> 8;
    b[0][0] = lop3_mask_or_magic<0x000f000fu>(w);
    b[0][1] = lop3_mask_or_magic<0x00f000f0u>(w);
    b[1][0] = lop3_mask_or_magic<0x000f000fu>(w8);
    b[1][1] = lop3_mask_or_magic<0x00f000f0u>(w8);
}

/* Dequantize word j of one lane's W piece: the B fragments of the n8 tiles
 * f0 = 2j and f1 = 2j + 1 (fragment indexes into g); b[i][0] holds k = 2c,
 * 2c+1 and b[i][1] k = 2c+8, 2c+9 (c = lane % 4). Each fp16 pair costs one
 * LOP3 (plus one shift per two pairs), one exact subtraction (or FMA with
 * 1/16) and one multiply by the scale, so the result is fp16((code - zero) *
 * scale), bit for bit the CPU reference's value. */
template <int NF>
__device__ __forceinline__ void dequant_pair(uint32_t w, const GroupConstsT<NF> &g, int j,
                                             uint32_t (&b)[2][2])
{
    const half2 sixteenth = __float2half2_rn(0.0625f);
    uint32_t m[2][2];
    magic_pair(w, m);
    const int f0 = 2 * j, f1 = 2 * j + 1;
    b[0][0] = as_u32(__hmul2(__hsub2(as_h2(m[0][0]), g.zlo[f0]), g.s[f0]));
    b[0][1] = as_u32(__hmul2(__hfma2(as_h2(m[0][1]), sixteenth, g.zhin[f0]), g.s[f0]));
    b[1][0] = as_u32(__hmul2(__hsub2(as_h2(m[1][0]), g.zlo[f1]), g.s[f1]));
    b[1][1] = as_u32(__hmul2(__hfma2(as_h2(m[1][1]), sixteenth, g.zhin[f1]), g.s[f1]));
}

/* All four words: the B fragments of the eight n8 tiles. */
__device__ __forceinline__ void dequant_word(const uint4 &qv, const GroupConsts &g,
                                             uint32_t (&b)[8][2])
{
    const uint32_t qw[4] = {qv.x, qv.y, qv.z, qv.w};
#pragma unroll
    for (int j = 0; j < 4; j++) {
        uint32_t t[2][2];
        dequant_pair(qw[j], g, j, t);
        b[2 * j][0] = t[0][0];
        b[2 * j][1] = t[0][1];
        b[2 * j + 1][0] = t[1][0];
        b[2 * j + 1][1] = t[1][1];
    }
}

/* Store two adjacent outputs (row, col), (row, col+1), each only if inside. */
__device__ __forceinline__ void store_pair(const Params &p, int row, int col, float v0, float v1)
{
    if (p.bias) {
        if (col < p.n)
            v0 += __half2float(p.bias[col]);
        if (col + 1 < p.n)
            v1 += __half2float(p.bias[col + 1]);
    }
    half *dst = p.c + (int64_t)row * p.n + col;
    if (p.c_vec && col + 1 < p.n) {
        *reinterpret_cast<half2 *>(dst) = __floats2half2_rn(v0, v1);
    } else {
        if (col < p.n)
            dst[0] = __float2half_rn(v0);
        if (col + 1 < p.n)
            dst[1] = __float2half_rn(v1);
    }
}

/* KRN_INT4_GEMM_GLU: the weight's columns come in runs of 8 gate columns
 * then their 8 up columns, so gate column j of the output is column
 * 16 (j / 8) + j % 8 and its up partner 8 further. Output j gets
 * SiLU(g) * u of the two sums rounded to fp16 first, in fp32 with one
 * rounding at the end: bit for bit what C followed by krn_cuda_silu_mul
 * gives. */
__device__ __forceinline__ float glu_one(float g, float u)
{
    const float gh = __half2float(__float2half_rn(g)), uh = __half2float(__float2half_rn(u));
    return krncuda::silu_mul(gh, uh);
}

/* Output element of (row, col), col a gate column (col % 16 < 8), sums g and
 * u (the up sum of column col + 8). n is a multiple of 16. */
__device__ __forceinline__ void store_glu1(const Params &p, int row, int col, float g, float u)
{
    if (col >= p.n)
        return;
    if (p.bias) {
        g += __half2float(p.bias[col]);
        u += __half2float(p.bias[col + 8]);
    }
    p.c[(int64_t)row * (p.n / 2) + (col >> 4) * 8 + (col & 7)] = __float2half_rn(glu_one(g, u));
}

/* The same for gate columns col, col + 1 (col even): one 4-byte store (the
 * launcher requires C 4-byte aligned with GLU). */
__device__ __forceinline__ void store_glu(const Params &p, int row, int col, float g0, float g1,
                                          float u0, float u1)
{
    if (col >= p.n)
        return;
    if (p.bias) {
        g0 += __half2float(p.bias[col]);
        g1 += __half2float(p.bias[col + 1]);
        u0 += __half2float(p.bias[col + 8]);
        u1 += __half2float(p.bias[col + 9]);
    }
    *reinterpret_cast<half2 *>(p.c + (int64_t)row * (p.n / 2) + (col >> 4) * 8 + (col & 7)) =
        __floats2half2_rn(glu_one(g0, u0), glu_one(g1, u1));
}

/* With GLU, row `row`'s values of one thread's NF n8 fragments (accumulator
 * elements 2h, 2h + 1 of each: columns col + 8 f, col + 8 f + 1; col % 16 <
 * 8): each even fragment's gate pair with the odd one's up pair. */
template <int NF>
__device__ __forceinline__ void store_frags_glu(const Params &p, int row, int col,
                                                const float (&acc)[NF][4], int h)
{
#pragma unroll
    for (int f = 0; f < NF; f += 2)
        store_glu(p, row, col + f * 8, acc[f][2 * h], acc[f][2 * h + 1], acc[f + 1][2 * h],
                  acc[f + 1][2 * h + 1]);
}

/* The weight's part of the kernel parameters: section pointers into the
 * repacked buffer b, sizes, and the scale-group step as a shift. */
inline Params params_of(const krn_int4_gemm_layout *lay, const void *b)
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

/* Outputs of the stream kernel (enum krn_int4_gemm_out): C and GLU C through
 * the workspace's words (p.partials) and counters, or the caller's
 * fixed-point words (ACC64). */
constexpr int kStreamOutC = KRN_INT4_GEMM_OUT_C, kStreamOutGlu = KRN_INT4_GEMM_OUT_GLU,
              kStreamOutAcc = KRN_INT4_GEMM_OUT_WORDS;

/* Each family: prepare (at krn_cuda_device_describe: raise the kernels'
 * shared-memory limits, fill the device's residency table) and launch (the
 * configuration and grid krn_int4_gemm_choose gave, p's tiling set from it;
 * pdl: with programmatic dependent launch). Configuration indexes count
 * from the family's first. */
cudaError_t sm80_prepare(krn_cuda_device *d);
cudaError_t launch_sm80(const Params &p, const AccParams &x, int ci, bool a_rows16, bool sw,
                        bool glu, bool words, int grid, bool pdl, cudaStream_t stream);
cudaError_t stream_prepare(krn_cuda_device *d);
cudaError_t launch_stream(const Params &p, const AccParams &x, int vi, int out, bool pdl,
                          cudaStream_t stream);
cudaError_t launch_sm75(const Params &p, bool glu, cudaStream_t stream);
/* The sm_90a path (sm90/int4_gemm_sm90.cu; compiled when the build targets
 * sm_90, INT4SERVE_GEMM_SM90). */
cudaError_t sm90_prepare(krn_cuda_device *d);
cudaError_t launch_sm90(const Params &p, int ci, int grid, bool glu, bool pdl, cudaStream_t stream);

} // namespace int4gemm
