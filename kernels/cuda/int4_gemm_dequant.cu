/*
 * int4_gemm_dequant.cu — krn_int4_dequant_f16 (kernels/int4_gemm.h): a
 *          repacked INT4 weight to fp16 [n][ldw], the GEMM's dequantization
 *          bit for bit, for a cuBLAS fp16 GEMM when M is large.
 */
#include "kernels/cuda/int4_gemm_impl.cuh"
#include "kernels/int4_gemm.h"
#include "kernels/int4_gemm_policy.h"

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace int4gemm
{
namespace
{

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

} // namespace
} // namespace int4gemm

using namespace int4gemm;

extern "C" inf_status_t krn_int4_dequant_f16(const struct krn_int4_gemm_layout *lay, const void *b,
                                             uint16_t *w, int64_t ldw, void *stream,
                                             struct inf_err *err)
{
    if (!lay || !b || !w)
        return inf_err_set(err, INF_E_INVALID, "int4 dequant: NULL argument");
    if (!krn_int4_gemm_layout_ok(lay) || ldw < lay->k || (uintptr_t)b % 16 || (uintptr_t)w % 2)
        return inf_err_set(err, INF_E_UNSUPPORTED, "int4 dequant: layout, ldw=%lld or alignment",
                           (long long)ldw);
    Params p = params_of(lay, b);
    const int vec = ldw % 8 == 0 && (uintptr_t)w % 16 == 0; /* 16-byte row pieces */
    const int64_t units = (int64_t)(lay->n_pad / 64) * (lay->k_pad / 128);
    /* persistent: as many blocks as fit at once (the loop strides by the grid) */
    static int resident_cache[16][2]; /* blocks per SM; racing writers agree */
    int dev = 0, sms = 0, per_sm = 0;
    const int zp = lay->symmetric ? 0 : 1;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess)
        e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (e == cudaSuccess && dev >= 0 && dev < 16)
        per_sm = resident_cache[dev][zp];
    if (e == cudaSuccess && per_sm <= 0) {
        e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(
            &per_sm, zp ? int4_dequant_kernel<true> : int4_dequant_kernel<false>, kDqThreads, 0);
        if (e == cudaSuccess && dev >= 0 && dev < 16)
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
