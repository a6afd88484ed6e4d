#pragma once
/* kernels/cuda/fp8.cuh — FP8 E4M3 on the device, for the kernels that write
 * and read an fp8 KV cache (rope.cu, attention.cu, attn_decode.cu). The
 * values are kernels/fp8.h's, bit for bit: encode rounds to nearest even and
 * saturates at +-448, decode is exact. Internal to kernels/cuda.
 *
 * Decode gives fp16 halves holding the code's value divided by
 * kE4m3Unit(): on sm_89 and newer `cvt.rn.f16x2.e4m3x2` (two codes an
 * instruction) gives the value itself; on sm_80 the code's exponent and
 * mantissa bits are moved into an fp16's (a byte permute, a shift and a
 * logic op for two codes), which is the value times 2^-8 for every finite
 * code, subnormals included (e4m3's exponent bias is 7, fp16's 15). The
 * kernels fold the unit into their scales (a power of 2: exact). */
#include "kernels/fp8.h"

#include <cuda_fp16.h>
#include <stdint.h>

namespace krnfp8
{

/* The factor from the decoded halves to the codes' values. */
__device__ __forceinline__ constexpr float unit()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    return 1.0f;
#else
    return 256.0f;
#endif
}

/* The codes in bytes 1 and 3 of r (bytes 0 and 2 are not read) as an fp16
 * pair (byte 1's in the low half), each value / 256, on the integer units:
 * each code's sign goes to its half's sign bit and its exponent and mantissa
 * one bit lower, into the half's exponent and mantissa. (Taking V this way
 * on sm_90 too, to share the conversions between two pipes, made the decode
 * attention slower: bench_attn Llama-2 128 x 512 181 -> 191 us.) */
__device__ __forceinline__ uint32_t h2_int(uint32_t r)
{
    return (r & 0x80008000u) | ((r >> 1) & 0x3f803f80u);
}

/* Two codes in the low 16 bits of x (the first in the low byte) as an fp16
 * pair (the first in the low half), each value / unit(). */
__device__ __forceinline__ uint32_t h2(uint32_t x)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    uint32_t r;
    asm("{\n .reg .b16 lo, hi;\n mov.b32 {lo, hi}, %1;\n cvt.rn.f16x2.e4m3x2 %0, lo;\n}\n"
        : "=r"(r)
        : "r"(x));
    return r;
#else
    return h2_int(__byte_perm(x, 0u, 0x1404)); /* [0, c0, 0, c1] */
#endif
}

/* Eight codes (the first in the low byte of c.x) as eight fp16 halves,
 * each value / unit(). */
__device__ __forceinline__ uint4 h8(uint2 c)
{
    return make_uint4(h2(c.x), h2(c.x >> 16), h2(c.y), h2(c.y >> 16));
}

/* One code of x / scale (round to nearest even, saturating). */
__device__ __forceinline__ uint32_t encode1(float x)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    uint16_t r;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(r) : "f"(0.0f), "f"(x));
    return r & 0xffu;
#else
    return krn_e4m3_encode(x);
#endif
}

/* Four values as four codes, the first in the low byte. */
__device__ __forceinline__ uint32_t encode4(float a, float b, float c, float d)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    uint16_t lo, hi;
    /* cvt puts its first source in the upper byte */
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(lo) : "f"(b), "f"(a));
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(hi) : "f"(d), "f"(c));
    return (uint32_t)lo | ((uint32_t)hi << 16);
#else
    return encode1(a) | (encode1(b) << 8) | (encode1(c) << 16) | (encode1(d) << 24);
#endif
}

/* Eight fp16 values (a 16-byte piece) divided by scale, as eight codes. */
__device__ __forceinline__ uint2 encode8(uint4 v, float scale)
{
    const __half2 *h = reinterpret_cast<const __half2 *>(&v);
    float f[8];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float2 t = __half22float2(h[i]);
        f[2 * i] = t.x / scale;
        f[2 * i + 1] = t.y / scale;
    }
    return make_uint2(encode4(f[0], f[1], f[2], f[3]), encode4(f[4], f[5], f[6], f[7]));
}

} // namespace krnfp8
