#pragma once
/* kernels/linear.h — linear layers y[m][n] = x[m][k] . W[n][k]^T (+ bias[n]).
 *
 * CPU launchers compute output columns [n0, n1) for all m rows, so a caller
 * splits N over threads. Every kernel computes each output element with
 * the same arithmetic, whatever m, n0, n1 are and whichever instruction set
 * runs it (the portable C loop, AVX2 + FMA or AVX-512), so results are
 * bit-identical across batch sizes, thread splits and CPUs:
 *
 *   the k columns are taken in slices of 16 (slice s: columns 16s..16s+15,
 *   the last one cut at k); 64 partial sums p[a][l] (a < 4, l < 16) start
 *   at +0 and slice s adds W[n][16s + l] * x[16s + l] to p[s % 4][l] with
 *   one rounding (a fused multiply-add: fmaf in the portable loop);
 *   then t[l] = (p[0][l] + p[1][l]) + (p[2][l] + p[3][l]), the 16 lanes are
 *   summed pairwise (l + 8, then + 4, + 2, + 1) and the bias is added.
 *
 * INT4 weights are dequantized exactly: code * scale - zero * scale with
 * fp16 scales and zeros is representable in fp32, so every path multiplies
 * by the same weight value. Kernels never allocate, log or synchronize. */
#include "kernels/q4.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* CPU layout of an INT4 weight (made once, at load, by krn_cpu_q4_repack).
 * Each row is cut into chunks of 128 columns (kc = k rounded up to 128); a
 * chunk is 64 bytes, 16 little-endian 32-bit words, and column 16j + l of
 * the chunk (j < 8, l < 16) is nibble j (bits 4j..4j+3) of word l. One
 * 64-byte load thus holds eight slices of 16 columns, and slice j's codes
 * are the words shifted right by 4j: the lane order of x itself. Each chunk
 * carries the scale and zero * scale (fp32) of the groups it covers: one
 * pair, or one per group when groups are narrower (64 columns: 2, 32: 4),
 * slice j using pair j * tpc / 8; they follow the codes in the order the
 * kernel reads them. */
struct krn_cpu_q4 {
    int32_t n, k;
    int32_t kc;  /* k rounded up to 128: columns each row holds */
    int32_t tpc; /* scale pairs per chunk: 1, 2 or 4 */
    uint8_t *q;  /* [n][kc / 2] */
    float *sz;   /* [n][kc / 128][tpc][2]: scale, zero * scale */
};

#define KRN_CPU_Q4_CHUNK 128 /* columns per 64-byte chunk */

/* Bytes of one block of memory that holds a repacked weight. */
size_t krn_cpu_q4_bytes(const struct krn_q4_weight *src);
/* Repack src into mem (krn_cpu_q4_bytes bytes, 64-byte aligned) and describe
 * it in *dst. The group size must be a multiple of 16 (32, 64, 128, 256) or
 * cover the row (per-channel). */
void krn_cpu_q4_repack(const struct krn_q4_weight *src, void *mem, struct krn_cpu_q4 *dst);

/* Instruction sets of the CPU kernels, best last. */
enum krn_cpu_isa {
    KRN_ISA_PORTABLE, /* C, the reference */
    KRN_ISA_AVX2,     /* AVX2 + FMA + F16C */
    KRN_ISA_AVX512,   /* AVX-512 F/BW/DQ/VL */
};

/* Run the kernels of `isa` or, when the CPU lacks it, of the best set it has
 * below it (default: the best set of the CPU); returns the set now in use.
 * Tests use it to compare the paths. Not thread-safe: set it before any
 * kernel runs. */
enum krn_cpu_isa krn_cpu_isa_set(enum krn_cpu_isa isa);
/* The set in use, and its name ("portable", "avx2", "avx512"). Thread: any. */
enum krn_cpu_isa krn_cpu_isa_get(void);
const char *krn_cpu_isa_name(enum krn_cpu_isa isa);

/* INT4: y rows have stride ldy, x rows ldx; bias fp32 [n] or NULL. x is
 * read in columns [0, k) only. */
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
/* fp16 weight W [n][k] (IEEE bit patterns), converted exactly as it is read
 * (F16C or AVX-512 conversions on x86-64). */
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
