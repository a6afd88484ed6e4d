#pragma once
/* kernels/linear.h — linear layers y[m][n] = x[m][k] . W[n][k]^T (+ bias[n]).
 *
 * CPU launchers compute output columns [n0, n1) for all m rows, so a caller
 * splits N over threads. Each output element is accumulated in the same
 * order whatever m, n0, n1 are (32 fp32 lanes across k, reduced in a fixed
 * order at the end), so results do not depend on the batch or the split.
 * Kernels never allocate, log or synchronize. */
#include "kernels/q4.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* CPU layout of an INT4 weight (made once, at load, by krn_cpu_q4_repack).
 * Rows are split into blocks of 32 columns (kr = kp rounded up to 32); in
 * block b of row r, byte j < 16 holds column 32b + j in its low nibble and
 * column 32b + 16 + j in its high nibble, so the unpack writes two
 * contiguous runs of 16 floats. Each block has its group's scale and
 * -zero * scale as fp32 ([n][kr / 32], repeated per block so the inner loop
 * needs no division). */
struct krn_cpu_q4 {
    int32_t n, k, kr;
    uint8_t *q;   /* [n][kr / 2] */
    float *scale; /* [n][kr / 32] */
    float *mzs;   /* [n][kr / 32] = -zero * scale */
};

/* Bytes of one block of memory that holds a repacked weight. */
size_t krn_cpu_q4_bytes(const struct krn_q4_weight *src);
/* Repack src into mem (krn_cpu_q4_bytes bytes, 64-byte aligned) and describe
 * it in *dst. */
void krn_cpu_q4_repack(const struct krn_q4_weight *src, void *mem, struct krn_cpu_q4 *dst);

/* Use the INT4 kernel's SIMD path where the CPU has it (default true); false
 * forces the portable loop (tests compare the two). Not thread-safe: set it
 * before any kernel runs. */
void krn_cpu_simd(bool on);

/* INT4: y rows have stride ldy, x rows ldx; bias fp32 [n] or NULL. */
void krn_cpu_linear_q4(const struct krn_cpu_q4 *w, const float *bias, const float *x, int64_t ldx,
                       float *y, int64_t ldy, int32_t m, int32_t n0, int32_t n1);
/* xg[r][i] = x[r][perm[i]] for r < m, i < k: the activations of a weight
 * whose stored columns follow perm (kernels/q4.h), gathered into a scratch
 * buffer (row stride ldg) before krn_cpu_linear_q4 runs on it. */
void krn_cpu_gather_cols(const float *x, int64_t ldx, const int32_t *perm, int32_t k, float *xg,
                         int64_t ldg, int32_t m);
/* fp32 weight W [n][k]. */
void krn_cpu_linear_f32(const float *w, int32_t k, const float *bias, const float *x, int64_t ldx,
                        float *y, int64_t ldy, int32_t m, int32_t n0, int32_t n1);
/* fp16 weight W [n][k] (IEEE bit patterns), converted on the fly. */
void krn_cpu_linear_f16(const uint16_t *w, int32_t k, const float *bias, const float *x,
                        int64_t ldx, float *y, int64_t ldy, int32_t m, int32_t n0, int32_t n1);

/* fp16 bits -> fp32, exact, branch-free (vectorizes). */
static inline float krn_half_to_float(uint16_t h)
{
    union {
        uint32_t u;
        float f;
    } o, inf_nan;
    uint32_t exp = (uint32_t)(h & 0x7c00u);
    o.u = (uint32_t)(h & 0x7fffu) << 13;
    o.f *= 0x1p112f; /* rebias the exponent; handles subnormals */
    inf_nan.u = o.u | (255u << 23);
    o.u = exp == 0x7c00u ? inf_nan.u : o.u;
    o.u |= (uint32_t)(h & 0x8000u) << 16;
    return o.f;
}

#ifdef __cplusplus
}
#endif
