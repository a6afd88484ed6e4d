#pragma once
/* kernels/cpu/linear_impl.h — kernels-internal: what kernels/cpu/linear.c
 * (repack, dispatch, the portable reference) shares with the x86-64 paths
 * in kernels/cpu/linear_x86.c. The arithmetic every path follows is the
 * one kernels/linear.h states. */
#include "kernels/linear.h"

#define LIN_MT 4 /* rows of x that share one pass over a weight row */

#if defined(__x86_64__) && defined(__GNUC__)
#define LIN_HAVE_X86 1
void lin_q4_avx512(const struct krn_cpu_q4 *w, const float *bias, const float *x, int64_t ldx,
                   float *y, int64_t ldy, int32_t m, int32_t n0, int32_t n1);
void lin_f32_avx512(const float *w, int32_t k, const float *bias, const float *x, int64_t ldx,
                    float *y, int64_t ldy, int32_t m, int32_t n0, int32_t n1);
void lin_f16_avx512(const uint16_t *w, int32_t k, const float *bias, const float *x, int64_t ldx,
                    float *y, int64_t ldy, int32_t m, int32_t n0, int32_t n1);
void lin_q4_avx2(const struct krn_cpu_q4 *w, const float *bias, const float *x, int64_t ldx,
                 float *y, int64_t ldy, int32_t m, int32_t n0, int32_t n1);
void lin_f32_avx2(const float *w, int32_t k, const float *bias, const float *x, int64_t ldx,
                  float *y, int64_t ldy, int32_t m, int32_t n0, int32_t n1);
void lin_f16_avx2(const uint16_t *w, int32_t k, const float *bias, const float *x, int64_t ldx,
                  float *y, int64_t ldy, int32_t m, int32_t n0, int32_t n1);
#endif
