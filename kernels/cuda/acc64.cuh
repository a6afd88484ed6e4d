#pragma once
/* kernels/cuda/acc64.cuh — the fixed-point sums of an INT4 GEMM launched with
 * KRN_INT4_GEMM_ACC64 (kernels/int4_gemm.h): each block adds its fp32
 * partial of an output into a signed 64-bit word with an integer atomic, so
 * the sum is exact and does not depend on the order the blocks arrive in;
 * whoever reads C (krn_int4_gemm_acc_reduce, the RMSNorm's accumulator form)
 * converts each word back with acc64_value and zeroes it. Private to
 * kernels/cuda.
 *
 * Encoding: v -> round(v * 2^30), v clamped to [-2^20, 2^20] (an infinity
 * becomes a bound, which still rounds to an infinite fp16); a NaN adds
 * kAcc64Nan = 2^57. With at most kAcc64MaxParts contributions per word, the
 * finite sums stay within [-2^56, 2^56], and any sum holding a NaN lands
 * outside that range (k NaNs add k 2^57, modulo 2^64), so the decoding
 * knows one. Resolution 2^-30: below a thousandth of fp16's finest step
 * (2^-24) and far below its relative step at normal values. */
#include <cuda_fp16.h>
#include <stdint.h>

namespace krncuda
{

constexpr int kAcc64MaxParts = 64;
constexpr long long kAcc64Nan = 1LL << 57;

__device__ __forceinline__ long long acc64_of(float v)
{
    if (v != v)
        return kAcc64Nan;
    v = fminf(fmaxf(v, -1048576.0f), 1048576.0f);
    return __float2ll_rn(v * 1073741824.0f); /* exact scaling by 2^30 */
}

/* Add v to the word at dst (a reduction: nothing comes back). */
__device__ __forceinline__ void acc64_add(long long *dst, float v)
{
    atomicAdd(reinterpret_cast<unsigned long long *>(dst),
              static_cast<unsigned long long>(acc64_of(v)));
}

__device__ __forceinline__ float acc64_value(long long q)
{
    const unsigned long long u = static_cast<unsigned long long>(q) + (1ULL << 56);
    if (u > (1ULL << 57))
        return __int_as_float(0x7fc00000); /* a NaN was added */
    return (float)q * 9.31322574615478515625e-10f; /* 2^-30, exact */
}

} // namespace krncuda
