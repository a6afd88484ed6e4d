#pragma once
/* kernels/q4.h — the canonical quantized form of one linear layer.
 *
 * Every source (a float checkpoint quantized on load, AutoAWQ, GPTQ) ends up in
 * this one form; each backend repacks it once, at load, into its own kernel
 * layout. The layer computes y[n] = sum_k x[k] * W[n][k] (+ bias[n]) with
 *
 *     W[n][k] = (code(n, k) - zero[n][k / group]) * scale[n][k / group]
 *
 * Shapes
 *   n       output features (rows of W)
 *   k       input features as the caller sees them
 *   kp      k rounded up to a multiple of group; columns k..kp-1 hold code
 *           equal to the group's zero point rounded (so they dequantize to 0)
 *           and callers never see them: activations are zero-padded to kp
 *   group   group size along k: 32, 64, 128 or 256; per-channel is group == kp
 *           (one scale per row, no padding)
 * Storage (host memory, row-major)
 *   q       uint8_t [n][kp / 2]; column j lives in byte j / 2, the low nibble
 *           for even j and the high nibble for odd j; codes are 0..15
 *   scale   uint16_t [n][kp / group], IEEE fp16 bit patterns, > 0 or 0 for an
 *           all-zero group
 *   zero    uint16_t [n][kp / group], IEEE fp16 bit patterns; 8.0 everywhere
 *           when symmetric; asymmetric zeros are integers in [0, 15]
 *
 *   perm    int32_t [k] or NULL: the input column each stored column reads
 *           (act-order checkpoints). With perm the layer computes
 *           y[n] = sum_i x[perm[i]] * W[n][i], i < k: the stored matrix is
 *           W_orig[:, perm], its groups contiguous, and callers keep passing
 *           x in its own order; backends gather x's columns before the dot
 *           products. perm is a permutation of 0..k-1; NULL is the identity.
 *
 * Zero points are fp16 rather than 4-bit so that AWQ/GPTQ integer zeros and
 * our own round-to-nearest zeros share one form.
 */
#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct krn_q4_weight {
    int32_t n;       /* output features */
    int32_t k;       /* input features (logical) */
    int32_t kp;      /* k padded to a multiple of group */
    int32_t group;   /* 32, 64, 128, 256, or kp for per-channel */
    bool symmetric;  /* zero == 8 everywhere */
    uint8_t *q;      /* [n][kp/2] packed codes */
    uint16_t *scale; /* [n][kp/group] fp16 */
    uint16_t *zero;  /* [n][kp/group] fp16 */
    int32_t *perm;   /* [k] input column of each stored column, or NULL */
};

/* Number of groups per row. */
static inline int32_t krn_q4_groups(const struct krn_q4_weight *w)
{
    return w->kp / w->group;
}

/* The 4-bit code of W[row][col], 0 <= col < kp. */
static inline int krn_q4_code(const struct krn_q4_weight *w, int32_t row, int32_t col)
{
    uint8_t b = w->q[(int64_t)row * (w->kp / 2) + col / 2];
    return (col & 1) ? (b >> 4) : (b & 0xf);
}

#ifdef __cplusplus
}
#endif
