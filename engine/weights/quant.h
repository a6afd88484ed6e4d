#pragma once
/* engine/weights/quant.h — engine-internal: round-to-nearest INT4 quantization of a
 * float matrix into the canonical form of kernels/q4.h, and the matching
 * dequantization (tests, reference paths).
 *
 * Asymmetric (default), per group of `group` columns of a row:
 *     lo = min(0, min w), hi = max(0, max w)    (0 is always representable)
 *     scale = fp16((hi - lo) / 15), zero = clamp(round(-lo / scale), 0, 15)
 * Symmetric:
 *     scale = fp16(absmax / 7), zero = 8, so codes are 8 + [-7, 7] and the
 *     largest magnitude is hit exactly (absmax / 8 would clip +absmax to
 *     7/8 of itself, an error of scale, twice the round-to-nearest bound).
 * Codes are computed from the fp16-rounded scale (and integer zero):
 *     code = clamp(round(w / scale) + zero, 0, 15)
 * so |dequant(code) - w| <= scale / 2 plus the fp16 rounding of scale
 * (at most 15 * scale * 2^-11 at the ends of the range). A group whose
 * values are all 0 gets scale 0.
 *
 * Padding: kp = k rounded up to a multiple of group; padded columns hold the
 * code equal to the group's zero point, so they dequantize to exactly 0.
 * Per-channel (group 0 in the call): one group per row, group = kp = k
 * rounded up to even (the packed nibbles need an even row length).
 * Thread: any (pure functions over caller data). */
#include "common/inf.h"
#include "engine/par.h"
#include "kernels/int4_gemm.h"
#include "kernels/q4.h"

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Group sizes accepted by eng_q4_quantize; 0 means per-channel. */
bool eng_q4_group_valid(int32_t group);

/* kp for a row of k columns at this group size (0 = per-channel). */
int32_t eng_q4_padded_k(int32_t k, int32_t group);

/* Quantize w[n][k] (row-major fp32) into *out, whose q/scale/zero are
 * allocated here (malloc) and released by eng_q4_free. On error *out is left
 * zeroed. Errors: INF_E_INVALID (shape, group), INF_E_RANGE (a value that is
 * not finite, or a scale beyond fp16), INF_E_NOMEM. */
inf_status_t eng_q4_quantize(const float *w, int32_t n, int32_t k, int32_t group, bool symmetric,
                             struct krn_q4_weight *out, struct inf_err *err);

/* Quantize rows [r0, r0 + rows) of out from w[rows][k] (row-major fp32, row
 * r0 first): the bytes eng_q4_quantize writes for those rows of the whole
 * matrix. out was allocated by eng_q4_alloc with the shape eng_q4_quantize
 * makes (kp = eng_q4_padded_k(k, group); stored group, kp when
 * per-channel) and its k, kp, group and symmetric are used. Rows are
 * independent: disjoint ranges of one out may be quantized on several
 * threads at once. On error the rows are partly written.
 * Errors: INF_E_INVALID (rows outside out), INF_E_RANGE (a value that is not
 * finite, naming its row r0 + i, or a scale beyond fp16). */
inf_status_t eng_q4_quantize_rows(const float *w, int32_t r0, int32_t rows,
                                  struct krn_q4_weight *out, struct inf_err *err);

/* krn_int4_gemm_repack on the threads of par (NULL: the caller's alone),
 * 64-column tiles at a time (krn_int4_gemm_repack_tiles): the same bytes
 * whatever the thread count. Errors: those of krn_int4_gemm_repack. */
inf_status_t eng_q4_gemm_repack(const struct krn_q4_weight *w,
                                const struct krn_int4_gemm_layout *lay, void *dst, size_t dst_bytes,
                                eng_par_t *par, struct inf_err *err);

/* Allocate a zeroed canonical weight of the given shape (q, scale, zero
 * zero-filled); for loaders that fill it from an AWQ/GPTQ source and for
 * tests. group is the stored group (kp for per-channel). Errors: INF_E_INVALID,
 * INF_E_NOMEM. */
inf_status_t eng_q4_alloc(int32_t n, int32_t k, int32_t kp, int32_t group, bool symmetric,
                          struct krn_q4_weight *out, struct inf_err *err);

/* Release what eng_q4_quantize / eng_q4_alloc allocated (and w->perm, which
 * a weight owns like its codes) and zero *w. NULL and an already-freed
 * weight are no-ops. */
void eng_q4_free(struct krn_q4_weight *w);

/* True when a and b read their input columns in the same order (both NULL,
 * or the same k values). */
bool eng_q4_perm_equal(const int32_t *a, const int32_t *b, int32_t k);

/* Stack parts[0..np) (each [n_i][k], the same k, kp, group and perm) along
 * N into *out, allocated here: the rows of a fused q/k/v or gate/up linear.
 * out is symmetric when every part is; it gets its own copy of the perm.
 * Errors: INF_E_INVALID (the parts differ in k, kp, group or perm),
 * INF_E_NOMEM. */
inf_status_t eng_q4_concat(const struct krn_q4_weight *parts, int32_t np, struct krn_q4_weight *out,
                           struct inf_err *err);

/* W[row][col] as stored: (code - zero) * scale, in fp32, 0 <= col < kp. */
float eng_q4_dequant_at(const struct krn_q4_weight *w, int32_t row, int32_t col);

/* Dequantize the logical matrix into out[n][k] (the padding is dropped),
 * in the caller's column order: stored column i of a weight with a perm
 * lands in column perm[i]. */
void eng_q4_dequantize(const struct krn_q4_weight *w, float *out);

/* Bytes of host memory held by the canonical form. */
size_t eng_q4_bytes(const struct krn_q4_weight *w);

#ifdef __cplusplus
}
#endif
