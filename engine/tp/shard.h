#pragma once
/* engine/tp/shard.h — engine-internal: a rank's shard of a linear layer in
 * the canonical INT4 form (kernels/q4.h), cut from the weight quantized
 * whole, so that every tensor-parallel size computes the model of one rank.
 *
 *   column-parallel (q/k/v by heads, gate/up by intermediate rows): some
 *     rows of W, every group as it was;
 *   row-parallel (o and down, each rank a range of K): a range of columns.
 *     A range may start or end inside a group: the shard keeps that group's
 *     scale and zero, and starts with `lead` columns (the part of the group
 *     before the range) whose codes are the zero point, so they dequantize
 *     to exactly 0 and the shard's groups line up with W's. The caller puts
 *     `lead` zero columns before the shard's activations; K is padded at the
 *     end as any K is.
 * Thread: any (pure functions over caller data). */
#include "common/inf.h"
#include "kernels/q4.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ENG_TP_MAX 16 /* ranks of one group */

/* What one rank of a tensor-parallel group holds of a model: query heads
 * [h0, h0 + n_heads), KV heads [kv0, kv0 + n_kv_heads) (one head shared by
 * several ranks when the model has fewer KV heads than ranks), MLP rows
 * [i0, i0 + inter). */
struct eng_tp_shape {
    int32_t rank, size;
    int32_t n_heads, h0;
    int32_t n_kv_heads, kv0;
    int32_t inter, i0;
};

/* The shape of rank `rank` of `size` for a model of n_heads query heads,
 * n_kv_heads KV heads and an MLP of inter rows. size must divide n_heads
 * and inter, and either divide n_kv_heads or be a multiple of it.
 * Errors: INF_E_INVALID naming the count that does not divide. */
inf_status_t eng_tp_shape_of(int32_t n_heads, int32_t n_kv_heads, int32_t inter, int32_t rank,
                             int32_t size, struct eng_tp_shape *out, struct inf_err *err);

/* A run of rows: first, count. */
struct eng_rows {
    int32_t first, count;
};

/* out = the rows of w named by ranges[0..n), in that order (with w's column
 * order, perm, when it has one). out is allocated here (eng_q4_free).
 * Errors: INF_E_INVALID (a range outside w, no rows), INF_E_NOMEM. */
inf_status_t eng_q4_take_rows(const struct krn_q4_weight *w, const struct eng_rows *ranges,
                              int32_t n, struct krn_q4_weight *out, struct inf_err *err);

/* out = columns [c0, c1) of w after *lead zero columns (c0 % group; 0 for a
 * per-channel w, whose one group a row spans any range). Errors:
 * INF_E_INVALID (0 <= c0 < c1 <= w->k does not hold), INF_E_UNSUPPORTED (an
 * act-order w: its stored columns are not contiguous in the input's),
 * INF_E_NOMEM. */
inf_status_t eng_q4_take_cols(const struct krn_q4_weight *w, int32_t c0, int32_t c1,
                              struct krn_q4_weight *out, int32_t *lead, struct inf_err *err);

/* *w's rows put in order, in place: row i becomes w's row order[i] (order
 * a permutation of 0..n-1; a row's codes, scales and zeros move with it).
 * Errors: INF_E_INVALID (an order entry outside w), INF_E_NOMEM; *w is
 * unchanged on error. */
inf_status_t eng_q4_order_rows(struct krn_q4_weight *w, const int32_t *order, struct inf_err *err);

/* out = w with every stored column whose input column (perm[i], or i) lies
 * outside [c0, c1) reading 0 (its codes set to its group's zero point), all
 * w->k input columns kept: a row-parallel rank's shard of an act-order w,
 * whose stored columns of one input range are spread over every group, so
 * that no group is cut. The rank feeds zeros outside its columns. Errors:
 * INF_E_INVALID (0 <= c0 < c1 <= w->k does not hold), INF_E_NOMEM. */
inf_status_t eng_q4_mask_cols(const struct krn_q4_weight *w, int32_t c0, int32_t c1,
                              struct krn_q4_weight *out, struct inf_err *err);

#ifdef __cplusplus
}
#endif
