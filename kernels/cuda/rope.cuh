#pragma once
/* kernels/cuda/rope.cuh — the rotation of one RoPE pair, shared by the RoPE
 * kernels (rope.cu) and the decode attention that rotates its own queries and
 * the step's K (attn_decode.cu), so every path rounds the same values the
 * same way (kernels/rope_cuda.h: (a, b) -> (a cos - b sin, b cos + a sin) in
 * fp32, rounded once). Internal to kernels/cuda. */
#include <cuda_fp16.h>
#include <stdint.h>

namespace krnrope {

__device__ __forceinline__ void rotate_pair(__half &a, __half &b, float c, float s)
{
    const float fa = __half2float(a), fb = __half2float(b);
    a = __float2half_rn(fa * c - fb * s);
    b = __float2half_rn(fb * c + fa * s);
}

/* Rotates the 2 pairs (i, i + 1 with the same in b) packed as fp16 halves in
 * a and b (low half first). */
__device__ __forceinline__ void rotate2(uint32_t &a, uint32_t &b, const float *cs, const float *sn,
                                       int32_t i)
{
    __half a0 = __ushort_as_half((unsigned short)(a & 0xffffu)),
           a1 = __ushort_as_half((unsigned short)(a >> 16));
    __half b0 = __ushort_as_half((unsigned short)(b & 0xffffu)),
           b1 = __ushort_as_half((unsigned short)(b >> 16));
    rotate_pair(a0, b0, cs[i], sn[i]);
    rotate_pair(a1, b1, cs[i + 1], sn[i + 1]);
    a = (uint32_t)__half_as_ushort(a0) | ((uint32_t)__half_as_ushort(a1) << 16);
    b = (uint32_t)__half_as_ushort(b0) | ((uint32_t)__half_as_ushort(b1) << 16);
}

/* Rotates 8 pairs (i0 .. i0 + 7 with i0 + half ..) held in a and b. */
__device__ __forceinline__ void rotate8(uint4 &a, uint4 &b, const float *cs, const float *sn,
                                        int32_t i0)
{
    rotate2(a.x, b.x, cs, sn, i0);
    rotate2(a.y, b.y, cs, sn, i0 + 2);
    rotate2(a.z, b.z, cs, sn, i0 + 4);
    rotate2(a.w, b.w, cs, sn, i0 + 6);
}

/* The cos/sin of position p for the first `half` frequencies into cs, sn,
 * strided over the block's threads (precise sinf/cosf; no barrier). */
__device__ __forceinline__ void angles(float p, const float *inv_freq, int32_t half, float *cs,
                                       float *sn)
{
    for (int32_t i = threadIdx.x; i < half; i += blockDim.x) {
        const float a = p * inv_freq[i];
        cs[i] = cosf(a);
        sn[i] = sinf(a);
    }
}

} // namespace krnrope
