#pragma once
/* kernels/fp8.h — FP8 E4M3 (the OCP 8-bit format NVIDIA calls e4m3fn): the
 * encode and decode every path that writes or reads an fp8 KV cache uses,
 * the CPU reference and the tests alike.
 *
 * Format  1 sign, 4 exponent (bias 7), 3 mantissa bits. No infinities; the
 *         one NaN pattern a sign is S.1111.111 (0x7f / 0xff); the largest
 *         finite magnitude is S.1111.110 = 448; exponent 0 holds the
 *         subnormals m x 2^-9 (m = 1..7) and the signed zeros.
 * Encode  round to nearest, ties to even, then saturate: a finite value
 *         beyond 448 (and an infinity) becomes +-448, as CUDA's
 *         __NV_SATFINITE conversion does; NaN stays NaN (0x7f with its sign).
 * A KV cache stores x / scale (a per-layer scale for K and one for V): a
 * value is decoded as decode(code) * scale. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define KRN_FP8_FN __host__ __device__ static inline
#else
#define KRN_FP8_FN static inline
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define KRN_E4M3_MAX 448.0f

KRN_FP8_FN float krn_e4m3_decode(uint8_t c)
{
    const int e = (c >> 3) & 15, m = c & 7;
    float v;
    if (e == 15 && m == 7)
        v = NAN;
    else if (e == 0)
        v = ldexpf((float)m, -9);
    else
        v = ldexpf((float)(8 + m), e - 10);
    return (c & 0x80) ? -v : v;
}

/* krn_e4m3_decode for every code but the two NaNs (which come out as
 * +-480 here): the code's bits placed in a float's exponent and mantissa,
 * then one exact multiply by 2^120 (the bias difference), so the hot loops
 * that read an fp8 cache vectorize. */
KRN_FP8_FN float krn_e4m3_decode_finite(uint8_t c)
{
    const uint32_t bits = ((uint32_t)(c & 0x80) << 24) | ((uint32_t)(c & 0x7f) << 20);
    float f;
    memcpy(&f, &bits, sizeof f);
    return f * 0x1p120f;
}

KRN_FP8_FN uint8_t krn_e4m3_encode(float x)
{
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    const uint8_t sign = (uint8_t)((bits >> 31) << 7);
    if (x != x)
        return sign | 0x7f;
    const float a = fabsf(x);
    if (a >= KRN_E4M3_MAX)
        return sign | 0x7e;
    if (a < 0x1p-6f) /* subnormal range: steps of 2^-9; 8 steps is the smallest normal */
        return sign | (uint8_t)(int)rintf(a * 512.0f);
    int e2;
    (void)frexpf(a, &e2);
    int e = e2 - 1;                       /* a in [2^e, 2^(e+1)), e in [-6, 8] */
    int q = (int)rintf(ldexpf(a, 3 - e)); /* 8..16: the mantissa with its leading 1 */
    if (q == 16) {
        e++;
        q = 8;
    }
    return sign | (uint8_t)(((e + 7) << 3) | (q - 8));
}

#ifdef __cplusplus
}
#endif
