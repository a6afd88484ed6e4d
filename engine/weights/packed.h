#pragma once
/* engine/weights/packed.h — engine-internal: one linear layer of an INT4
 * checkpoint into the canonical form of kernels/q4.h, without
 * requantization: the codes, scales and zero points exactly as the format
 * defines them.
 *
 * Layouts (W[n][k] = (code - zero) * scale, n output and k input features):
 *   AutoAWQ gemm   qweight I32 [k][n/8]: nibble i of word (r, c) is column
 *                  8c + [0, 2, 4, 6, 1, 3, 5, 7][i] of input row r;
 *                  qzeros I32 [G][n/8] packed the same way; scales [G][n]
 *   GPTQ           qweight I32 [k/8][n]: nibble i of word (r, c) is input
 *                  row 8r + i of column c; qzeros I32 [G][n/8], nibble i of
 *                  word (g, c) column 8c + i, holding zero - 1 under
 *                  checkpoint_format "gptq" and the zero under "gptq_v2";
 *                  scales [G][n]; g_idx I32 [k], the group of each input row
 *   compressed-tensors pack-quantized
 *                  weight_packed I32 [n][ceil(k/8)]: nibble i of word (r, c)
 *                  is input column 8c + i, holding the signed code + 8;
 *                  weight_scale [n][G]; weight_zero_point I32
 *                  [ceil(n/8)][G] (asymmetric; nibble i of word (p, g) is
 *                  row 8p + i, signed zero + 8), symmetric zero 8;
 *                  weight_shape I32 or I64 [2] = {n, k}; weight_g_idx [k]
 * with G = ceil(k / group) (1 per channel). Scales may be F16, BF16 or F32
 * and must be exact in fp16.
 *
 * A g_idx that is not row / group (GPTQ desc_act) is act-order: the rows of
 * K are sorted by group once, here (stably, so each group keeps its rows in
 * order), the canonical weight is W[:, perm] with contiguous groups, and
 * out->perm carries perm for the backends to gather x with. Each group must
 * then hold as many rows as without the permutation (group rows, the last
 * group the rest), as GPTQ's own g_idx does. Thread: any. */
#include "common/inf.h"
#include "engine/par.h"
#include "engine/weights/qconfig.h"
#include "engine/weights/safetensors.h"
#include "kernels/q4.h"

/* Convert linear `layer` (its module name; the tensors are layer + ".qweight"
 * and so on), n output by k input features, stored as lq says, into *out,
 * allocated here (eng_q4_free releases it, perm included). The codes are
 * unpacked on the threads of par (NULL: the caller's); the result does not
 * depend on their count. On error *out is zeroed. Errors: INF_E_NOTFOUND (a
 * tensor the format needs is missing), INF_E_FORMAT (a shape or dtype that
 * does not match, a g_idx out of range or whose groups do not hold group
 * rows, a zero point outside 0..15 or not 8 in a symmetric checkpoint, a
 * scale that is negative, not finite or not exact in fp16), INF_E_NOMEM;
 * every message names the file and the tensor. */
inf_status_t eng_q4_from_checkpoint(const eng_st_t *st, const char *layer,
                                    const struct eng_qlayer *lq, int32_t n, int32_t k,
                                    eng_par_t *par, struct krn_q4_weight *out, struct inf_err *err);

/* Ask the kernel to start reading layer's packed tensors (a hint). */
void eng_q4_checkpoint_prefetch(const eng_st_t *st, const char *layer, const struct eng_qlayer *lq);
